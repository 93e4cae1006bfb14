/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the settings parsers (src/config.c) with a fuzzed environment. The input
 * is "NAME=value" lines; cuheap_config_parse() reads them through its getenv callback. The
 * checks are the promises docs/settings.md's table makes: every bad value costs exactly one
 * warning and keeps the default, every accepted setting is within its documented range, and
 * the effective settings CUHEAP_VERBOSE prints parse back to the same settings. The size
 * parser and the path expansion get the same values directly.
 */
#include <string.h>

#include "config.h"
#include "fuzz.h"

#define NR_MAX_VARS 32

struct env {
    char *names[NR_MAX_VARS];
    char *values[NR_MAX_VARS];
    int nr;
    int nr_warnings;
    int nr_ignored; /* warnings "ignoring NAME=..." (the others say what was adjusted) */
};

static const char *get(const char *name, void *arg)
{
    const struct env *e = arg;
    for (int i = e->nr - 1; i >= 0; i--) /* the last one wins, as in a shell */
        if (!strcmp(e->names[i], name))
            return e->values[i];
    return NULL;
}

static void warn(const char *line, void *arg)
{
    struct env *e = arg;
    fuzz_check(strlen(line) < 1024);
    e->nr_warnings++;
    if (strncmp(line, "ignoring ", 9))
        return;
    e->nr_ignored++;
    /* the warning names a variable that was set */
    bool named = false;
    for (int i = 0; i < e->nr; i++) {
        size_t n = strlen(e->names[i]);
        named |= !strncmp(line + 9, e->names[i], n) && line[9 + n] == '=';
    }
    fuzz_check(named);
}

static bool same_config(const struct cuheap_config *a, const struct cuheap_config *b)
{
    /* field by field: memcmp would compare padding */
    return a->pool == b->pool && a->pool_init == b->pool_init && a->arena_size == b->arena_size &&
           a->min_block == b->min_block && a->pool_max == b->pool_max && a->release == b->release &&
           a->reuse == b->reuse && a->fence_batch == b->fence_batch &&
           a->limit_bytes == b->limit_bytes && a->limit_permille == b->limit_permille &&
           a->record == b->record && a->stack_depth == b->stack_depth &&
           a->stack_depth_set == b->stack_depth_set && a->python == b->python &&
           a->ring_slots == b->ring_slots && !strcmp(a->output, b->output) &&
           a->format == b->format && a->summary == b->summary && a->verbose == b->verbose &&
           a->flush_ms == b->flush_ms;
}

/* The dump names only the settings in force (a part that does not run has none): those it left
 * out are taken from what was parsed, as cuheap_config_dump() decides. */
static void not_in_force(struct cuheap_config *again, const struct cuheap_config *c)
{
    bool pool = c->pool, vmm = pool && c->backing == CUHEAP_BACKING_VMM;
    if (!pool) {
        again->pool_init = c->pool_init;
        again->min_block = c->min_block;
        again->pool_max = c->pool_max;
        again->release = c->release;
        again->reuse = c->reuse;
    }
    if (!pool || vmm)
        again->arena_size = c->arena_size;
    if (!pool || c->reuse != CUHEAP_REUSE_FENCE)
        again->fence_batch = c->fence_batch;
    if (!c->record) {
        again->stack_depth = c->stack_depth;
        again->python = c->python;
        again->ring_slots = c->ring_slots;
        again->format = c->format;
        again->flush_ms = c->flush_ms;
        memcpy(again->output, c->output, sizeof(again->output));
    }
}

/* Split "NAME=value\n..." in place (buf is a NUL-terminated copy of the input). */
static void split(char *buf, struct env *e)
{
    e->nr = 0;
    for (char *line = buf; line && e->nr < NR_MAX_VARS;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        char *eq = strchr(line, '=');
        if (eq) {
            *eq = 0;
            e->names[e->nr] = line;
            e->values[e->nr++] = eq + 1;
        }
        line = next;
    }
}

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* The documented ranges (docs/settings.md's table). */
static void check_ranges(const struct cuheap_config *c)
{
    fuzz_check(is_pow2(c->arena_size) && c->arena_size >= (2ull << 20) &&
               c->arena_size <= (64ull << 30));
    fuzz_check(is_pow2(c->min_block) && c->min_block >= 256 && c->min_block <= c->arena_size);
    fuzz_check(c->pool_max >= 1 && c->pool_max <= c->arena_size);
    fuzz_check(c->pool_init <= (64ull << 40));
    fuzz_check(c->reuse <= CUHEAP_REUSE_IMMEDIATE && c->release <= CUHEAP_RELEASE_NEVER);
    fuzz_check(c->format <= CUHEAP_FORMAT_CHROME);
    fuzz_check(c->fence_batch >= 1 && c->fence_batch <= (1u << 20));
    fuzz_check(c->limit_permille <= 1000 && !(c->limit_permille && c->limit_bytes));
    fuzz_check(c->stack_depth <= CUHEAP_MAX_STACK_DEPTH);
    fuzz_check(is_pow2(c->ring_slots) && c->ring_slots >= 64 && c->ring_slots <= (1u << 22));
    fuzz_check(c->flush_ms >= 1 && c->flush_ms <= 60000);
    size_t n = strnlen(c->output, sizeof(c->output));
    fuzz_check(n > 0 && n < sizeof(c->output));
}

/* CUHEAP_VERBOSE's lines, collected as an environment to parse again. */
struct dump {
    char lines[32][CUHEAP_PATH_MAX + 64];
    struct env env;
};

static void collect(const char *line, void *arg)
{
    struct dump *d = arg;
    fuzz_check(d->env.nr < 32);
    char *l = d->lines[d->env.nr];
    snprintf(l, sizeof(d->lines[0]), "%s", line);
    char *eq = strchr(l, '=');
    fuzz_check(eq != NULL);
    *eq = 0;
    d->env.names[d->env.nr] = l;
    d->env.values[d->env.nr++] = eq + 1;
}

static void check_size_parser(const char *v)
{
    uint64_t bytes = 12345;
    unsigned permille = 678;
    if (cuheap_parse_size(v, true, &bytes, &permille) == 0)
        fuzz_check(permille <= 1000 && (!permille || !bytes));
    bytes = 12345;
    permille = 678;
    if (cuheap_parse_size(v, false, &bytes, &permille) == 0) {
        fuzz_check(permille == 0);
        char buf[32];
        cuheap_format_size(bytes, buf, sizeof(buf));
        fuzz_check(strlen(buf) < sizeof(buf));
    } else {
        fuzz_check(bytes == 12345 && permille == 678); /* untouched on failure */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    fuzz_check(buf != NULL);
    memcpy(buf, data, size);
    buf[size] = 0;
    struct env e = {0};
    split(buf, &e);

    struct cuheap_config c;
    int nr = cuheap_config_parse(&c, get, warn, &e);
    fuzz_check(nr == e.nr_warnings && e.nr_ignored <= e.nr);
    check_ranges(&c);

    /* each variable alone: a bad value warns once and leaves the defaults as they were */
    struct cuheap_config dflt;
    struct env none = {0};
    fuzz_check(cuheap_config_parse(&dflt, get, warn, &none) == 0);
    for (int i = 0; i < e.nr; i++) {
        struct env one = {.names = {e.names[i]}, .values = {e.values[i]}, .nr = 1};
        struct cuheap_config c1;
        int w = cuheap_config_parse(&c1, get, warn, &one);
        fuzz_check(w == one.nr_warnings && one.nr_ignored <= 1);
        check_ranges(&c1);
        if (one.nr_ignored)
            fuzz_check(same_config(&c1, &dflt));
        check_size_parser(e.values[i]);
        char out[CUHEAP_PATH_MAX];
        memset(out, 'x', sizeof(out));
        cuheap_expand_path(e.values[i], out, sizeof(out), 4242, e.values[e.nr - 1 - i],
                           e.values[i]);
        fuzz_check(memchr(out, 0, sizeof(out)) != NULL);
        cuheap_expand_path(e.values[i], out, 1, -1, NULL, NULL);
        fuzz_check(out[0] == 0);
    }

    /* what CUHEAP_VERBOSE prints is a valid environment for the same settings */
    struct dump *d = calloc(1, sizeof(*d));
    fuzz_check(d != NULL);
    cuheap_config_dump(&c, collect, d);
    struct cuheap_config again;
    fuzz_check(cuheap_config_parse(&again, get, warn, &d->env) == 0);
    again.stack_depth_set = c.stack_depth_set; /* the dump always names the depth */
    again.verbose = c.verbose;                 /* and never CUHEAP_VERBOSE itself */
    not_in_force(&again, &c);
    fuzz_check(same_config(&again, &c));
    free(d);
    free(buf);
    return 0;
}
