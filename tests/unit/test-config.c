/* SPDX-License-Identifier: MIT */
/* Settings: defaults, every value form, and one clear warning per bad value. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "config.h"
#include "log.h"

struct fake_env {
    const char *vars[16][2];
    char warnings[16][CUHEAP_LOG_MAX_LINE + 1];
    int nr_warnings;
};

static const char *get(const char *name, void *arg)
{
    struct fake_env *e = arg;
    for (int i = 0; i < 16 && e->vars[i][0]; i++)
        if (!strcmp(e->vars[i][0], name))
            return e->vars[i][1];
    return NULL;
}

static void warn(const char *line, void *arg)
{
    struct fake_env *e = arg;
    if (e->nr_warnings < 16)
        snprintf(e->warnings[e->nr_warnings], sizeof(e->warnings[0]), "%s", line);
    e->nr_warnings++;
}

static bool warned(const struct fake_env *e, const char *what)
{
    for (int i = 0; i < e->nr_warnings && i < 16; i++)
        if (strstr(e->warnings[i], what))
            return true;
    return false;
}

static void test_defaults(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_true(c.pool);
    assert_int_equal(c.arena_size, 256ull << 20);
    assert_int_equal(c.min_block, 512);
    assert_int_equal(c.pool_max, 64ull << 20);
    assert_int_equal(c.vmm_chunk, 8ull << 20);
    assert_int_equal(c.vmm_cushion, 2ull << 20);
    assert_int_equal(c.vmm_layout, CUHEAP_VMM_TIGHT);
    assert_int_equal(c.vmm_idle_fit, 125);
    assert_int_equal(c.reuse, CUHEAP_REUSE_FENCE);
    assert_int_equal(c.release, CUHEAP_RELEASE_OOM);
    assert_int_equal(c.limit_bytes, 0);
    assert_int_equal(c.stack_depth, 32);
    assert_true(c.stack_cache);
    assert_false(c.record_timing);
    assert_string_equal(c.output, "cuheap-%p.jsonl");
    assert_int_equal(c.format, CUHEAP_FORMAT_JSONL);
}

static void test_values(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_POOL", "off"},
                                  {"CUHEAP_ARENA_SIZE", "1G"},
                                  {"CUHEAP_POOL_MAX", "128MiB"},
                                  {"CUHEAP_VMM_CHUNK", "64M"},
                                  {"CUHEAP_VMM_CUSHION", "0"},
                                  {"CUHEAP_VMM_LAYOUT", "aligned"},
                                  {"CUHEAP_VMM_IDLE_FIT", "300"},
                                  {"CUHEAP_REUSE", "immediate"},
                                  {"CUHEAP_RELEASE", "empty"},
                                  {"CUHEAP_LIMIT", "1536M"},
                                  {"CUHEAP_STACK_DEPTH", "0"},
                                  {"CUHEAP_STACK_CACHE", "0"},
                                  {"CUHEAP_RECORD_TIMING", "1"},
                                  {"CUHEAP_FORMAT", "chrome"},
                                  {"CUHEAP_OUTPUT", "/tmp/x-%p-%r.json"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_false(c.pool);
    assert_int_equal(c.arena_size, 1ull << 30);
    assert_int_equal(c.pool_max, 128ull << 20);
    assert_int_equal(c.vmm_chunk, 64ull << 20);
    assert_int_equal(c.vmm_cushion, 0);
    assert_int_equal(c.vmm_layout, CUHEAP_VMM_ALIGNED);
    assert_int_equal(c.vmm_idle_fit, 300);
    assert_int_equal(c.reuse, CUHEAP_REUSE_IMMEDIATE);
    assert_int_equal(c.release, CUHEAP_RELEASE_EMPTY);
    assert_int_equal(c.limit_bytes, 1536ull << 20);
    assert_int_equal(c.stack_depth, 0);
    assert_false(c.stack_cache);
    assert_true(c.record_timing);
    assert_int_equal(c.format, CUHEAP_FORMAT_CHROME);
    assert_string_equal(c.output, "/tmp/x-%p-%r.json");
}

static void test_percent_limit(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_LIMIT", "80%"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_int_equal(c.limit_permille, 800);
    assert_int_equal(c.limit_bytes, 0);
}

static void test_bad_values_warn_and_keep_defaults(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_ARENA_SIZE", "3M"}, /* not a power of two */
                                  {"CUHEAP_REUSE", "sometimes"},
                                  {"CUHEAP_LIMIT", "150%"},
                                  {"CUHEAP_STACK_DEPTH", "-1"},
                                  {"CUHEAP_POOL", "maybe"},
                                  {"CUHEAP_RING", "1000"},
                                  {"CUHEAP_VMM_IDLE_FIT", "99"}}}; /* below 100 percent */
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 7);
    assert_int_equal(c.arena_size, 256ull << 20);
    assert_int_equal(c.reuse, CUHEAP_REUSE_FENCE);
    assert_int_equal(c.limit_bytes, 0);
    assert_int_equal(c.limit_permille, 0);
    assert_int_equal(c.stack_depth, 32);
    assert_true(c.pool);
    assert_int_equal(c.ring_slots, 65536);
    assert_int_equal(c.vmm_idle_fit, 125);
    /* each warning names the variable and the value */
    assert_true(warned(&e, "CUHEAP_ARENA_SIZE=\"3M\""));
    assert_true(warned(&e, "CUHEAP_REUSE=\"sometimes\""));
    assert_true(warned(&e, "CUHEAP_LIMIT=\"150%\""));
    assert_true(warned(&e, "CUHEAP_STACK_DEPTH=\"-1\""));
    assert_true(warned(&e, "CUHEAP_POOL=\"maybe\""));
    assert_true(warned(&e, "CUHEAP_RING=\"1000\""));
    assert_true(warned(&e, "CUHEAP_VMM_IDLE_FIT=\"99\""));
    for (int i = 0; i < 7; i++)
        assert_null(strchr(e.warnings[i], '\n'));
}

static void test_pool_max_capped_by_arena(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_ARENA_SIZE", "32M"}, {"CUHEAP_POOL_MAX", "64M"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
    assert_int_equal(c.pool_max, 32ull << 20);
}

/* First fit needs the tight layout: asked for with the aligned one, it says so and the pool
 * places by the scored buddy, and the settings report says what is in force. */
static void test_first_fit_needs_tight_layout(void **state)
{
    (void)state;
    struct fake_env e = {
        .vars = {{"CUHEAP_VMM_PLACEMENT", "first-fit"}, {"CUHEAP_VMM_LAYOUT", "aligned"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
    assert_true(warned(&e, "CUHEAP_VMM_PLACEMENT=first-fit needs CUHEAP_VMM_LAYOUT=tight"));
    assert_int_equal(c.vmm_placement, CUHEAP_PLACE_SCORED);
    struct fake_env t = {.vars = {{"CUHEAP_VMM_PLACEMENT", "first-fit"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &t), 0);
    assert_int_equal(c.vmm_placement, CUHEAP_PLACE_FIRST);
}

static void test_sizes_and_paths(void **state)
{
    (void)state;
    uint64_t b;
    unsigned pm;
    assert_int_equal(cuheap_parse_size("512", false, &b, &pm), 0);
    assert_int_equal(b, 512);
    assert_int_equal(cuheap_parse_size("64k", false, &b, &pm), 0);
    assert_int_equal(b, 65536);
    assert_int_equal(cuheap_parse_size("2GB", false, &b, &pm), 0);
    assert_int_equal(b, 2ull << 30);
    assert_int_equal(cuheap_parse_size("12 apples", false, &b, &pm), -22);
    assert_int_equal(cuheap_parse_size("", false, &b, &pm), -22);
    assert_int_equal(cuheap_parse_size("50%", false, &b, &pm), -22);
    char out[128];
    cuheap_expand_path("t-%p-r%r-%h-%%.jsonl", out, sizeof(out), 42, "3", "node1");
    assert_string_equal(out, "t-42-r3-node1-%.jsonl");
    cuheap_expand_path("t-%r", out, sizeof(out), 42, NULL, NULL);
    assert_string_equal(out, "t-0");
}

static void test_output_mode(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    cuheap_config_parse(&c, get, warn, &e);
    assert_int_equal(c.output_mode, 0600); /* the trace holds the command line */
    struct fake_env wide = {.vars = {{"CUHEAP_OUTPUT_MODE", "644"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &wide), 0);
    assert_int_equal(c.output_mode, 0644);
    static const char *const good[] = {"0600", "640", "0666", "000600"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct fake_env g = {.vars = {{"CUHEAP_OUTPUT_MODE", good[i]}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &g), 0);
    }
    /* not octal, executable, beyond the permission bits, one the owner could not read (0 and
     * 0200 leave a trace its owner cannot open), blanks and signs */
    static const char *const bad[] = {"0689", "0755", "01600", "-600", "rw",
                                      "",     "0",    "0200",  "0400", "044",
                                      "0066", " 600", "+600",  "600 ", "0x180"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct fake_env b = {.vars = {{"CUHEAP_OUTPUT_MODE", bad[i]}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &b), 1);
        assert_int_equal(c.output_mode, 0600);
        assert_true(warned(&b, "CUHEAP_OUTPUT_MODE"));
    }
}

/* Sizes are whole numbers with K, M, G or T, or percentages where allowed: nothing else,
 * or "1.5" is one byte and "0x10" sixteen, without a word. */
static void test_sizes_are_whole_numbers(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t bytes;
    } good[] = {
        {"0", 0},
        {"512", 512},
        {"007", 7},
        {"64k", 64 << 10},
        {"64KiB", 64 << 10},
        {"2GB", 2ull << 30},
        {"3t", 3ull << 40},
        {"18446744073709551615", UINT64_MAX},
        {"17179869183G", 17179869183ull << 30},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t b = 1;
        unsigned pm = 1;
        if (cuheap_parse_size(good[i].s, false, &b, &pm) || b != good[i].bytes || pm)
            fail_msg("\"%s\" read as %llu bytes", good[i].s, (unsigned long long)b);
    }
    static const char *const bad[] = {
        "1.5",       "1.5G",         "0.5K", "1,5K", "0x10",  "0X10",
        "10Q",       "12 apples",    " 5",   "5 ",   "+5",    "-5",
        "",          "5e3",          "K",    "5KK",  "5KiBx", "18446744073709551616",
        "16777216T", "17179869184G", "50%",  "inf",  "nan",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t b = 12345;
        unsigned pm = 678;
        if (cuheap_parse_size(bad[i], false, &b, &pm) != -EINVAL || b != 12345 || pm != 678)
            fail_msg("\"%s\" taken for a size (%llu bytes)", bad[i], (unsigned long long)b);
    }
    /* a percentage: above 0, at most 100, one decimal at most (the permille it is held in) */
    static const struct {
        const char *s;
        unsigned permille;
    } pct[] = {{"80%", 800}, {"12.5%", 125}, {"0.1%", 1}, {"100%", 1000}, {"100.0%", 1000}};
    for (size_t i = 0; i < sizeof(pct) / sizeof(pct[0]); i++) {
        uint64_t b = 1;
        unsigned pm = 0;
        if (cuheap_parse_size(pct[i].s, true, &b, &pm) || b || pm != pct[i].permille)
            fail_msg("\"%s\" read as %u permille", pct[i].s, pm);
    }
    static const char *const bad_pct[] = {"0%",   "0.0%", "100.1%", "101%", "12.55%", "%",   "80%x",
                                          "80 %", "-5%",  ".5%",    "12.%", "1e1%",   "80%%"};
    for (size_t i = 0; i < sizeof(bad_pct) / sizeof(bad_pct[0]); i++) {
        uint64_t b = 12345;
        unsigned pm = 678;
        if (cuheap_parse_size(bad_pct[i], true, &b, &pm) != -EINVAL || b != 12345 || pm != 678)
            fail_msg("\"%s\" taken for a percentage (%u permille)", bad_pct[i], pm);
    }
}

/* Every parser refuses what it does not read whole, says what is wrong in one line naming the
 * variable and keeps the default. */
static void test_loose_values_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *name, *value, *why;
    } cases[] = {
        {"CUHEAP_LIMIT", "1.5", "a fraction"},
        {"CUHEAP_LIMIT", "0x10", "hexadecimal"},
        {"CUHEAP_LIMIT", "64M of it", "text after the number"},
        {"CUHEAP_LIMIT", "99999999999999999999", "too large"},
        {"CUHEAP_LIMIT", "-1G", "negative"},
        {"CUHEAP_LIMIT", "", "empty"},
        {"CUHEAP_LIMIT", "0K", "zero bytes"},
        {"CUHEAP_POOL_INIT", "1.5G", "a fraction"},
        {"CUHEAP_POOL_INIT", "50%", "a percentage, which this setting does not take"},
        {"CUHEAP_POOL_MAX", "0", "out of range (1 B to 64.00 GiB)"},
        {"CUHEAP_ARENA_SIZE", "3M", "not a power of two"},
        {"CUHEAP_FENCE_BATCH", " 64", "not a number"},
        {"CUHEAP_FENCE_BATCH", "+64", "not a number"},
        {"CUHEAP_FENCE_BATCH", "64x", "text after the number"},
        {"CUHEAP_FENCE_BATCH", "0x40", "hexadecimal"},
        {"CUHEAP_FENCE_BATCH", "1.0", "text after the number"},
        {"CUHEAP_FENCE_BATCH", "99999999999999999999", "too large"},
        {"CUHEAP_FENCE_BATCH", "4294967360", "out of range (1 to 1048576)"},
        {"CUHEAP_STACK_DEPTH", "12 ", "text after the number"},
        {"CUHEAP_RING", "0x10000", "hexadecimal"},
        {"CUHEAP_RING", "1000", "not a power of two"},
        {"CUHEAP_FLUSH_MS", "", "empty"},
        {"CUHEAP_REUSE", "sometimes", "not one of fence, sync, immediate"},
        {"CUHEAP_POOL", "2", "not 1, 0, on, off, yes, no, true or false"},
        {"CUHEAP_OUTPUT", "t\n.jsonl", "a control character"},
        {"CUHEAP_OUTPUT", "", "empty"},
        {"CUHEAP_OUTPUT_MODE", "0200", "the owner could not read and write"},
        {"CUHEAP_AUDIT", "/opt/cupti\t.so", "a control character"},
        {"CUHEAP_AUDIT", "libcupti.so", "an absolute path"},
    };
    struct fake_env none = {0};
    struct cuheap_config dflt, c;
    cuheap_config_parse(&dflt, get, warn, &none);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fake_env e = {.vars = {{cases[i].name, cases[i].value}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
        char want[160];
        snprintf(want, sizeof(want), "ignoring %s=", cases[i].name);
        const char *w = e.warnings[0];
        if (strncmp(w, want, strlen(want)) || !strstr(w, cases[i].why) || strchr(w, '\n') ||
            !strstr(w, "; keeping "))
            fail_msg("%s=\"%s\": %s", cases[i].name, cases[i].value, w);
        /* the defaults kept */
        assert_int_equal(c.limit_bytes, dflt.limit_bytes);
        assert_int_equal(c.limit_permille, dflt.limit_permille);
        assert_int_equal(c.fence_batch, dflt.fence_batch);
        assert_int_equal(c.pool_init, dflt.pool_init);
        assert_int_equal(c.pool_max, dflt.pool_max);
        assert_int_equal(c.arena_size, dflt.arena_size);
        assert_int_equal(c.stack_depth, dflt.stack_depth);
        assert_int_equal(c.ring_slots, dflt.ring_slots);
        assert_int_equal(c.flush_ms, dflt.flush_ms);
        assert_int_equal(c.reuse, dflt.reuse);
        assert_int_equal(c.pool, dflt.pool);
        assert_int_equal(c.output_mode, dflt.output_mode);
        assert_string_equal(c.output, dflt.output);
        assert_int_equal(c.audit, dflt.audit);
    }
}

static void last_name(const char *line, void *arg)
{
    char(*names)[64] = arg;
    int i = 0;
    while (names[i][0])
        i++;
    snprintf(names[i], 64, "%.*s", (int)strcspn(line, "="), line);
}

/* A warning is one line whatever the value holds: control characters shown escaped, a long
 * value cut where a marker says so, and the longest warning of every setting fits a log line
 * (log.c cut lines past it). */
static void test_warnings_are_one_whole_line(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_REUSE", "a\nb\"\\\x1b[2J\xc3\xa9"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
    if (!strstr(e.warnings[0], "CUHEAP_REUSE=\"a\\nb\\\"\\\\\\x1b[2J\\xc3\\xa9\": not one of"))
        fail_msg("%s", e.warnings[0]);
    char long_value[1001];
    memset(long_value, 'x', 1000);
    long_value[1000] = 0;
    struct fake_env l = {.vars = {{"CUHEAP_OUTPUT", long_value}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &l), 1);
    char want[128];
    snprintf(want, sizeof(want), "CUHEAP_OUTPUT=\"%.64s\"... (1000 bytes): longer than 511 bytes",
             long_value);
    if (!strstr(l.warnings[0], want))
        fail_msg("%s", l.warnings[0]);
    /* every setting with the value that makes its warning longest */
    char names[64][64] = {{0}};
    cuheap_config_dump(&c, last_name, names);
    char worst[600];
    memset(worst, 0x01, sizeof(worst) - 1);
    worst[sizeof(worst) - 1] = 0;
    for (int i = 0; names[i][0]; i++) {
        struct fake_env w = {.vars = {{names[i], worst}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &w), 1);
        size_t n = strlen(w.warnings[0]);
        if (n + strlen("cuheap: \n") > CUHEAP_LOG_MAX_LINE || strchr(w.warnings[0], '\n'))
            fail_msg("%s: a warning of %zu bytes", names[i], n);
    }
}

/* A size with no unit too small to mean bytes ("2" for a cushion or a cache: 2 bytes, surely
 * meant 2M) is refused, the default kept; 0 (none) and settings counted in bytes (a block of
 * 512) are not. */
static void test_bare_small_sizes_refused(void **state)
{
    (void)state;
    const char *bad[][2] = {{"CUHEAP_VMM_CUSHION", "2"},
                            {"CUHEAP_THREAD_CACHE", "2"},
                            {"CUHEAP_POOL_MAX", "64"},
                            {"CUHEAP_POOL_INIT", "512"},
                            {"CUHEAP_LIMIT", "80"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct fake_env e = {.vars = {{bad[i][0], bad[i][1]}}};
        struct cuheap_config c, d;
        assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
        if (!strstr(e.warnings[0], bad[i][0]) || !strstr(e.warnings[0], "give a unit"))
            fail_msg("%s=%s: %s", bad[i][0], bad[i][1], e.warnings[0]);
        struct fake_env none = {.vars = {{NULL, NULL}}};
        assert_int_equal(cuheap_config_parse(&d, get, warn, &none), 0);
        assert_memory_equal(&c, &d, sizeof(c)); /* the defaults kept */
    }
    struct fake_env ok = {.vars = {{"CUHEAP_VMM_CUSHION", "0"},
                                   {"CUHEAP_THREAD_CACHE", "0"},
                                   {"CUHEAP_MIN_BLOCK", "512"},
                                   {"CUHEAP_POOL_MAX", "2M"},
                                   {"CUHEAP_LIMIT", "0"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &ok), 0);
    assert_int_equal(c.vmm_cushion, 0);
    assert_int_equal(c.thread_cache, 0);
    assert_int_equal(c.min_block, 512);
}

/* CUHEAP_VERBOSE lists the settings in force only: no vmm settings under the legacy backing,
 * no pool settings with the pool off, no trace settings without recording. */
static void test_dump_shows_what_is_in_force(void **state)
{
    (void)state;
    struct {
        const char *var, *value, *absent, *present;
    } cases[] = {
        {"CUHEAP_BACKING", "legacy", "CUHEAP_VMM_CHUNK", "CUHEAP_ARENA_SIZE"},
        {"CUHEAP_BACKING", "vmm", "CUHEAP_ARENA_SIZE", "CUHEAP_VMM_CHUNK"},
        {"CUHEAP_POOL", "0", "CUHEAP_THREAD_CACHE", "CUHEAP_RECORD"},
        {"CUHEAP_RECORD", "0", "CUHEAP_OUTPUT", "CUHEAP_POOL_MAX"},
        {"CUHEAP_REUSE", "sync", "CUHEAP_IDLE_CHECK", "CUHEAP_REUSE"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fake_env e = {.vars = {{cases[i].var, cases[i].value}}};
        struct cuheap_config c;
        assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
        char names[64][64] = {{0}};
        cuheap_config_dump(&c, last_name, names);
        bool absent = true, present = false;
        for (int n = 0; names[n][0]; n++) {
            absent &= strcmp(names[n], cases[i].absent) != 0;
            present |= strcmp(names[n], cases[i].present) == 0;
        }
        if (!absent || !present)
            fail_msg("%s=%s: %s listed %d, %s listed %d", cases[i].var, cases[i].value,
                     cases[i].absent, !absent, cases[i].present, present);
    }
}

/* A setting of a part that was taken out (CUHEAP_STEP_PLAN): an old script that turns it on
 * gets one warning naming it and why, and the settings it would have had without it; turned
 * off, nothing. CUHEAP_VERBOSE does not list it. */
static void test_removed_setting_warns_once(void **state)
{
    (void)state;
    struct fake_env none = {0};
    struct cuheap_config dflt, c;
    assert_int_equal(cuheap_config_parse(&dflt, get, warn, &none), 0);
    const char *on[] = {"1", "on", "yes", "TRUE", "2"};
    for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        struct fake_env e = {.vars = {{"CUHEAP_STEP_PLAN", on[i]}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
        assert_int_equal(e.nr_warnings, 1);
        char want[64];
        snprintf(want, sizeof(want), "ignoring CUHEAP_STEP_PLAN=\"%s\": ", on[i]);
        if (strncmp(e.warnings[0], want, strlen(want)) ||
            !strstr(e.warnings[0], "the step plan was removed") || strchr(e.warnings[0], '\n'))
            fail_msg("CUHEAP_STEP_PLAN=%s: %s", on[i], e.warnings[0]);
        assert_memory_equal(&c, &dflt, sizeof(c));
    }
    const char *off[] = {"0", "off", "no", "False"};
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++) {
        struct fake_env e = {.vars = {{"CUHEAP_STEP_PLAN", off[i]}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
        assert_int_equal(e.nr_warnings, 0);
        assert_memory_equal(&c, &dflt, sizeof(c));
    }
    /* beside other settings, good and bad: still one warning of its own */
    struct fake_env mixed = {.vars = {{"CUHEAP_STEP_PLAN", "1"},
                                      {"CUHEAP_FENCE_BATCH", "32"},
                                      {"CUHEAP_REUSE", "sometimes"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &mixed), 2);
    assert_int_equal(c.fence_batch, 32);
    int named = 0;
    for (int i = 0; i < mixed.nr_warnings; i++)
        named += strstr(mixed.warnings[i], "CUHEAP_STEP_PLAN") != NULL;
    assert_int_equal(named, 1);
    struct fake_env verbose = {.vars = {{"CUHEAP_STEP_PLAN", "1"}, {"CUHEAP_VERBOSE", "1"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &verbose), 1);
    char names[64][64] = {{0}};
    cuheap_config_dump(&c, last_name, names);
    for (int n = 0; names[n][0]; n++)
        assert_string_not_equal(names[n], "CUHEAP_STEP_PLAN");
}

/* A name that does not fit is refused whole: cut, it names another file (…-11404.js). */
static void test_expanded_name_never_cut(void **state)
{
    (void)state;
    char out[16];
    assert_int_equal(cuheap_expand_path("abcdefghijklmno", out, sizeof(out), 1, NULL, NULL), 0);
    assert_string_equal(out, "abcdefghijklmno");
    assert_int_equal(cuheap_expand_path("abcdefghijklmnop", out, sizeof(out), 1, NULL, NULL),
                     -ENAMETOOLONG);
    assert_string_equal(out, "");
    assert_int_equal(cuheap_expand_path("t-%p.jsonl", out, sizeof(out), 12345, NULL, NULL), 0);
    assert_string_equal(out, "t-12345.jsonl");
    assert_int_equal(cuheap_expand_path("t-%p%p.jsonl", out, sizeof(out), 12345, NULL, NULL),
                     -ENAMETOOLONG);
    assert_int_equal(cuheap_expand_path("%r-%h.x", out, sizeof(out), 1, "0123456789", "host"),
                     -ENAMETOOLONG);
    assert_string_equal(out, "");
    assert_int_equal(cuheap_expand_path("", out, 1, 1, NULL, NULL), 0);
    assert_int_equal(cuheap_expand_path("x", out, 1, 1, NULL, NULL), -ENAMETOOLONG);
}

static void audit_line(const char *line, void *arg)
{
    if (!strncmp(line, "CUHEAP_AUDIT=", 13))
        snprintf(arg, 600, "%s", line);
}

/* The audit is opt-in; a path names the CUPTI to use and turns it on; the effective setting
 * shows in the dump the trace header holds. */
static void test_audit(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    cuheap_config_parse(&c, get, warn, &e);
    assert_false(c.audit);
    assert_string_equal(c.audit_cupti, "");
    struct fake_env on = {.vars = {{"CUHEAP_AUDIT", "1"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &on), 0);
    assert_true(c.audit);
    assert_string_equal(c.audit_cupti, "");
    struct fake_env path = {.vars = {{"CUHEAP_AUDIT", "/opt/cuda/lib64/libcupti.so.13"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &path), 0);
    assert_true(c.audit);
    assert_string_equal(c.audit_cupti, "/opt/cuda/lib64/libcupti.so.13");
    char line[600] = "";
    cuheap_config_dump(&c, audit_line, line);
    assert_string_equal(line, "CUHEAP_AUDIT=/opt/cuda/lib64/libcupti.so.13");
    /* a relative name would be looked up who knows where: warned, the default kept */
    struct fake_env bad = {.vars = {{"CUHEAP_AUDIT", "libcupti.so"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &bad), 1);
    assert_true(warned(&bad, "CUHEAP_AUDIT"));
    assert_false(c.audit);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_percent_limit),
        cmocka_unit_test(test_bad_values_warn_and_keep_defaults),
        cmocka_unit_test(test_pool_max_capped_by_arena),
        cmocka_unit_test(test_first_fit_needs_tight_layout),
        cmocka_unit_test(test_sizes_and_paths),
        cmocka_unit_test(test_output_mode),
        cmocka_unit_test(test_audit),
        cmocka_unit_test(test_sizes_are_whole_numbers),
        cmocka_unit_test(test_loose_values_are_refused),
        cmocka_unit_test(test_warnings_are_one_whole_line),
        cmocka_unit_test(test_removed_setting_warns_once),
        cmocka_unit_test(test_expanded_name_never_cut),
        cmocka_unit_test(test_bare_small_sizes_refused),
        cmocka_unit_test(test_dump_shows_what_is_in_force),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
