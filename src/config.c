/* SPDX-License-Identifier: MIT */
/*
 * The option table and its parsers. Each entry is one environment variable: its default,
 * the line the README shows, and the parser that fills struct cuheap_config.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Why a value was refused, for the warning ("a fraction: sizes are whole numbers ..."). */
#define WHY_MAX 160

struct option;
/* 0, or -EINVAL with why (WHY_MAX bytes) saying what is wrong with the value. */
typedef int (*parse_fn)(const struct option *opt, const char *value, struct cuheap_config *cfg,
                        char *why);

struct option {
    const char *name;
    const char *dflt;
    const char *doc;
    parse_fn parse;
    size_t offset;              /* field in struct cuheap_config */
    uint64_t min, max;          /* inclusive bounds for numbers */
    const char *const *choices; /* for enums, NULL-terminated, index = enum value */
    uint64_t min_bare;          /* sizes: a number with no unit below this (but 0) is refused, since
                                   "2" for a cushion or a cache is 2 bytes, and surely meant 2M */
};

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int refuse(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int refuse(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, WHY_MAX, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* A whole decimal number and nothing else: strtoull also takes leading blanks, a '+' and,
 * negated, a '-'. Returns a pointer past the digits, or NULL with why set. */
static const char *whole_number(const char *s, uint64_t *ret, char *why)
{
    if (!*s) {
        refuse(why, "empty");
        return NULL;
    }
    if (*s == '-') {
        refuse(why, "negative");
        return NULL;
    }
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        refuse(why, "hexadecimal (numbers here are decimal)");
        return NULL;
    }
    if (!is_digit(*s)) {
        refuse(why, "not a number");
        return NULL;
    }
    uint64_t n = 0;
    for (; is_digit(*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (n > (UINT64_MAX - d) / 10) {
            refuse(why, "too large");
            return NULL;
        }
        n = n * 10 + d;
    }
    *ret = n;
    return s;
}

/* Sizes are whole numbers of bytes, with K, M, G or T (each may be followed by "i" and "B",
 * "64KiB"), or where allowed a percentage with at most one decimal ("12.5%" is 125 permille
 * exactly). Nothing else: a fraction of a byte would be cut ("1.5" to one) and hex read as
 * another number, both without a word. */
static int size_of(const char *s, bool allow_percent, uint64_t *ret_bytes, unsigned *ret_permille,
                   char *why)
{
    uint64_t n = 0;
    const char *p = whole_number(s, &n, why);
    if (!p)
        return -EINVAL;
    unsigned tenth = 0;
    if (*p == '.' && allow_percent && is_digit(p[1]) && p[2] == '%') {
        tenth = (unsigned)(p[1] - '0');
        p += 2;
    } else if (*p == '.' || *p == ',') {
        return refuse(why, "a fraction (sizes are whole numbers of bytes, K, M, G or T)");
    }
    if (*p == '%') {
        if (!allow_percent)
            return refuse(why, "a percentage, which this setting does not take");
        if (p[1])
            return refuse(why, "text after the percentage");
        if (n > 100 || (n == 100 && tenth) || (!n && !tenth))
            return refuse(why, "a percentage above 0 and at most 100 is expected");
        *ret_bytes = 0;
        *ret_permille = (unsigned)n * 10 + tenth;
        return 0;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    }
    if (shift) {
        p++;
        if (*p == 'i' || *p == 'I')
            p++;
        if (*p == 'B' || *p == 'b')
            p++;
    }
    if (*p)
        return refuse(why, "text after the number (sizes are whole numbers with K, M, G or T)");
    if (n > (UINT64_MAX >> shift))
        return refuse(why, "too large");
    *ret_bytes = n << shift;
    *ret_permille = 0;
    return 0;
}

int cuheap_parse_size(const char *s, bool allow_percent, uint64_t *ret_bytes,
                      unsigned *ret_permille)
{
    char why[WHY_MAX];
    uint64_t n = 0;
    unsigned pm = 0;
    if (!s || size_of(s, allow_percent, &n, &pm, why))
        return -EINVAL;
    *ret_bytes = n;
    if (ret_permille)
        *ret_permille = pm;
    return 0;
}

static int parse_bool(const struct option *opt, const char *v, struct cuheap_config *cfg, char *why)
{
    bool *field = (bool *)((char *)cfg + opt->offset);
    if (!strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"))
        *field = true;
    else if (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "false"))
        *field = false;
    else
        return refuse(why, "not 1, 0, on, off, yes, no, true or false");
    return 0;
}

static int parse_uint(const struct option *opt, const char *v, struct cuheap_config *cfg, char *why)
{
    uint64_t n = 0;
    const char *end = whole_number(v, &n, why);
    if (!end)
        return -EINVAL;
    if (*end)
        return refuse(why, "text after the number (a whole number is expected)");
    if (n < opt->min || n > opt->max)
        return refuse(why, "out of range (%" PRIu64 " to %" PRIu64 ")", opt->min, opt->max);
    *(unsigned *)((char *)cfg + opt->offset) = (unsigned)n;
    return 0;
}

static int bytes_in_range(const struct option *opt, uint64_t n, char *why)
{
    if (n >= opt->min && n <= opt->max)
        return 0;
    char lo[32], hi[32];
    return refuse(why, "out of range (%s to %s)", cuheap_format_size(opt->min, lo, sizeof(lo)),
                  cuheap_format_size(opt->max, hi, sizeof(hi)));
}

/* A size with no unit too small to mean bytes (opt->min_bare): refused, naming the unit. */
static int bare_too_small(const struct option *opt, const char *v, uint64_t n, char *why)
{
    size_t len = strlen(v);
    if (!n || n >= opt->min_bare || !len || v[len - 1] < '0' || v[len - 1] > '9')
        return 0;
    return refuse(why, "%" PRIu64 " bytes, too small to mean bytes: give a unit (%sM)", n, v);
}

static int parse_bytes(const struct option *opt, const char *v, struct cuheap_config *cfg,
                       char *why)
{
    uint64_t n = 0;
    unsigned pm = 0;
    if (size_of(v, false, &n, &pm, why) || bare_too_small(opt, v, n, why) ||
        bytes_in_range(opt, n, why))
        return -EINVAL;
    *(uint64_t *)((char *)cfg + opt->offset) = n;
    return 0;
}

static int parse_pow2_bytes(const struct option *opt, const char *v, struct cuheap_config *cfg,
                            char *why)
{
    uint64_t n = 0;
    unsigned pm = 0;
    if (size_of(v, false, &n, &pm, why))
        return -EINVAL;
    if (!is_pow2(n))
        return refuse(why, "not a power of two");
    if (bytes_in_range(opt, n, why))
        return -EINVAL;
    *(uint64_t *)((char *)cfg + opt->offset) = n;
    return 0;
}

static int parse_pow2_uint(const struct option *opt, const char *v, struct cuheap_config *cfg,
                           char *why)
{
    struct cuheap_config trial = *cfg;
    if (parse_uint(opt, v, &trial, why))
        return -EINVAL;
    if (!is_pow2(*(unsigned *)((char *)&trial + opt->offset)))
        return refuse(why, "not a power of two");
    *cfg = trial;
    return 0;
}

static int parse_limit(const struct option *opt, const char *v, struct cuheap_config *cfg,
                       char *why)
{
    uint64_t n = 0;
    unsigned pm = 0;
    if (!strcasecmp(v, "none") || !strcmp(v, "0")) {
        cfg->limit_bytes = 0;
        cfg->limit_permille = 0;
        return 0;
    }
    if (size_of(v, true, &n, &pm, why) || bare_too_small(opt, v, n, why))
        return -EINVAL;
    if (!n && !pm)
        return refuse(why, "zero bytes (no limit is none or 0)");
    cfg->limit_bytes = n;
    cfg->limit_permille = pm;
    return 0;
}

static int parse_enum(const struct option *opt, const char *v, struct cuheap_config *cfg, char *why)
{
    for (int i = 0; opt->choices[i]; i++)
        if (!strcasecmp(v, opt->choices[i])) {
            *(int *)((char *)cfg + opt->offset) = i;
            return 0;
        }
    size_t n = (size_t)snprintf(why, WHY_MAX, "not one of");
    for (int i = 0; opt->choices[i] && n < WHY_MAX; i++)
        n += (size_t)snprintf(why + n, WHY_MAX - n, "%s %s", i ? "," : "", opt->choices[i]);
    return -EINVAL;
}

/* A path to write or load: a control character in it (a newline) is a mistake, and would
 * break the lines that name the path in two. */
static int path_why(const char *v, size_t size, char *why)
{
    if (!*v)
        return refuse(why, "empty");
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return refuse(why, "a control character in the path");
    if (strlen(v) >= size)
        return refuse(why, "longer than %zu bytes", size - 1);
    return 0;
}

static int parse_path(const struct option *opt, const char *v, struct cuheap_config *cfg, char *why)
{
    if (path_why(v, CUHEAP_PATH_MAX, why))
        return -EINVAL;
    memcpy((char *)cfg + opt->offset, v, strlen(v) + 1);
    return 0;
}

/* File permission bits in octal ("0600", "644"); read and write bits only, a trace is never
 * executable; and the owner reads and writes it, or the user could not open the trace the
 * run leaves (0200 makes one only root reads). */
static int parse_mode(const struct option *opt, const char *v, struct cuheap_config *cfg, char *why)
{
    if (!*v)
        return refuse(why, "empty");
    unsigned n = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '7')
            return refuse(why, "not octal permission bits");
        n = n * 8 + (unsigned)(*p - '0');
        if (n > 07777)
            return refuse(why, "beyond the permission bits (at most 0666)");
    }
    if (n & 0111)
        return refuse(why, "execute bits (a trace is never executable)");
    if (n > 0666)
        return refuse(why, "beyond the read and write bits (at most 0666)");
    if ((n & 0600) != 0600)
        return refuse(why, "the owner could not read and write the trace (0600 at least)");
    *(unsigned *)((char *)cfg + opt->offset) = n;
    return 0;
}

/* CUHEAP_AUDIT: on/off like a boolean, or the path of the libcupti.so to use (which turns the
 * audit on): a machine can hold several CUDA versions, and the copy the program already uses
 * is the one to take. */
static int parse_audit(const struct option *opt, const char *v, struct cuheap_config *cfg,
                       char *why)
{
    if (v[0] == '/') {
        if (path_why(v, sizeof(cfg->audit_cupti), why))
            return -EINVAL;
        memcpy(cfg->audit_cupti, v, strlen(v) + 1);
        cfg->audit = true;
        return 0;
    }
    if (parse_bool(opt, v, cfg, why))
        return refuse(why, "neither 1, 0, on, off, yes, no, true, false nor an absolute path");
    cfg->audit_cupti[0] = 0;
    return 0;
}

static const char *const reuse_names[] = {"fence", "sync", "immediate", NULL};
static const char *const release_names[] = {"oom", "empty", "never", NULL};
static const char *const format_names[] = {"jsonl", "chrome", NULL};
static const char *const backing_names[] = {"legacy", "vmm", NULL};
static const char *const vmm_layout_names[] = {"tight", "aligned", NULL};
static const char *const vmm_placement_names[] = {"scored", "first-fit", NULL};

#define FIELD(f) offsetof(struct cuheap_config, f)
#define KIB      1024ull
#define MIB      (1024ull * KIB)
#define GIB      (1024ull * MIB)
#define TIB      (1024ull * GIB)

static const struct option options[] = {
    {"CUHEAP_POOL", "1", "serve cuMemAlloc/cudaMalloc from cuheap's pool (0: record only)",
     parse_bool, FIELD(pool), 0, 0, NULL, 0},
    {"CUHEAP_POOL_INIT", "0", "bytes reserved per device at first use", parse_bytes,
     FIELD(pool_init), 0, 64 * TIB, NULL, 64 * KIB},
    {"CUHEAP_ARENA_SIZE", "256M",
     "legacy: largest arena taken from the driver (power of two; the pool starts at an eighth "
     "and grows by a sixteenth of what it holds)",
     parse_pow2_bytes, FIELD(arena_size), 2 * MIB, 64 * GIB, NULL, 0},
    {"CUHEAP_MIN_BLOCK", "512", "smallest pool block (power of two)", parse_pow2_bytes,
     FIELD(min_block), 256, 2 * MIB, NULL, 0},
    {"CUHEAP_POOL_MAX", "64M", "largest request served from the pool; larger go to the driver",
     parse_bytes, FIELD(pool_max), 1, 64 * GIB, NULL, 4 * KIB},
    {"CUHEAP_RELEASE", "oom", "when empty arenas go back to the driver: oom, empty, never",
     parse_enum, FIELD(release), 0, 0, release_names, 0},
    {"CUHEAP_REUSE", "fence", "when a freed block may be reused: fence, sync, immediate",
     parse_enum, FIELD(reuse), 0, 0, reuse_names, 0},
    {"CUHEAP_BACKING", "vmm",
     "pool memory: vmm (physical memory mapped under blocks in use) or legacy (cuMemAlloc arenas)",
     parse_enum, FIELD(backing), 0, 0, backing_names, 0},
    {"CUHEAP_VMM_CHUNK", "8M",
     "vmm: most physical memory mapped in one piece (fewer driver calls, but held whole)",
     parse_bytes, FIELD(vmm_chunk), 2 * MIB, 1 * GIB, NULL, 0},
    {"CUHEAP_VMM_CUSHION", "2M",
     "vmm: idle memory kept mapped beyond the most the job's blocks have used at once (less "
     "memory held, more driver calls)",
     parse_bytes, FIELD(vmm_cushion), 0, 64 * GIB, NULL, 64 * KIB},
    {"CUHEAP_VMM_LAYOUT", "tight",
     "vmm: tight (memory only under the bytes blocks use) or aligned (whole CUHEAP_VMM_CHUNK "
     "pieces at aligned addresses, shared by smaller blocks: about half the driver calls, a few "
     "percent more memory)",
     parse_enum, FIELD(vmm_layout), 0, 0, vmm_layout_names, 0},
    {"CUHEAP_VMM_PLACEMENT", "scored",
     "vmm, tight layout: scored (power-of-two blocks where memory is mapped) or first-fit (blocks "
     "over a thread cache's largest, 128 KiB on 2 MiB granules, exact to CUHEAP_MIN_BLOCK, at "
     "the lowest address that holds them)",
     parse_enum, FIELD(vmm_placement), 0, 0, vmm_placement_names, 0},
    {"CUHEAP_VMM_IDLE_FIT", "125",
     "vmm, tight layout: a block goes into an idle chunk of up to this percentage of the "
     "granules it needs (100 to 10000) rather than have memory mapped for it (higher: fewer "
     "driver calls, more memory held)",
     parse_uint, FIELD(vmm_idle_fit), 100, 10000, NULL, 0},
    {"CUHEAP_THREAD_CACHE", "16M",
     "per thread and device: bytes of ready blocks kept for that thread alone, served without a "
     "lock (0: every allocation takes the pool's lock)",
     parse_bytes, FIELD(thread_cache), 0, 1 * GIB, NULL, 4 * KIB},
    {"CUHEAP_FENCE_BATCH", "64", "frees collected before a fence is recorded", parse_uint,
     FIELD(fence_batch), 1, 1u << 20, NULL, 0},
    {"CUHEAP_IDLE_CHECK", "1",
     "fence policy: before recording a fence, ask whether every stream is idle, and if so give "
     "the freed blocks back at once (0: always a fence)",
     parse_bool, FIELD(idle_check), 0, 0, NULL, 0},
    {"CUHEAP_LIMIT", "none", "per-device limit: bytes (K/M/G) or a percentage of the device",
     parse_limit, 0, 0, 0, NULL, 64 * KIB},
    {"CUHEAP_RECORD", "1", "record events into the trace", parse_bool, FIELD(record), 0, 0, NULL,
     0},
    {"CUHEAP_STACK_DEPTH", "32",
     "native frames recorded per event (0: no stacks, at most 64; Python processes: 12 unless set)",
     parse_uint, FIELD(stack_depth), 0, CUHEAP_MAX_STACK_DEPTH, NULL, 0},
    {"CUHEAP_PYTHON", "1", "add Python frames when the allocating thread runs Python", parse_bool,
     FIELD(python), 0, 0, NULL, 0},
    {"CUHEAP_STACK_CACHE", "1",
     "per-thread shortcuts for stacks (0: every stack walked in full; the stacks are the same)",
     parse_bool, FIELD(stack_cache), 0, 0, NULL, 0},
    {"CUHEAP_RECORD_TIMING", "0",
     "time the recorder's parts per event and print them at exit (costs about 100 ns an event)",
     parse_bool, FIELD(record_timing), 0, 0, NULL, 0},
    {"CUHEAP_RING", "65536", "event ring slots (power of two)", parse_pow2_uint, FIELD(ring_slots),
     64, 1u << 22, NULL, 0},
    {"CUHEAP_OUTPUT", "cuheap-%p.jsonl",
     "trace path; %p pid, %r rank (RANK/LOCAL_RANK), %h host; with a rank the default is "
     "cuheap-r%r-%p.jsonl; an existing file is never replaced (.1, .2, ... added)",
     parse_path, FIELD(output), 0, 0, NULL, 0},
    {"CUHEAP_OUTPUT_MODE", "0600",
     "permissions a new trace is created with (octal, read/write bits; the umask applies)",
     parse_mode, FIELD(output_mode), 0, 0, NULL, 0},
    {"CUHEAP_FORMAT", "jsonl", "trace format: jsonl (cuheap) or chrome (Perfetto)", parse_enum,
     FIELD(format), 0, 0, format_names, 0},
    {"CUHEAP_SUMMARY", "1", "print a summary on stderr at exit", parse_bool, FIELD(summary), 0, 0,
     NULL, 0},
    {"CUHEAP_VERBOSE", "0", "print the effective settings at start", parse_bool, FIELD(verbose), 0,
     0, NULL, 0},
    {"CUHEAP_FLUSH_MS", "200", "how often the trace is flushed to disk", parse_uint,
     FIELD(flush_ms), 1, 60000, NULL, 0},
    {"CUHEAP_AUDIT", "0",
     "check coverage: match the driver's memory operations (CUPTI) against what the hooks saw; "
     "1, or the path of the libcupti.so to use",
     parse_audit, FIELD(audit), 0, 0, NULL, 0},
};

#define NR_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Settings of parts that were taken out: still read, so that an old script keeps running; set
 * to anything but off, each costs one warning that says why its part went. */
static const struct {
    const char *name, *why;
} removed[] = {
    {"CUHEAP_STEP_PLAN", "the step plan was removed (it held more than the pool alone on every "
                         "recorded job it served)"},
};

static bool is_off(const char *v)
{
    return !strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
           !strcasecmp(v, "false");
}

static void set_defaults(struct cuheap_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    char why[WHY_MAX];
    for (size_t i = 0; i < NR_OPTIONS; i++) {
        int r = options[i].parse(&options[i], options[i].dflt, cfg, why);
        (void)r; /* defaults are valid by construction; test-config checks it */
    }
}

/* Bytes of a value a warning shows. */
#define NR_SHOWN 64

/* The value as a warning shows it, in quotes: control characters, quotes, backslashes and
 * bytes beyond ASCII escaped ("\n", "\x1b"), so that the warning stays one line whatever the
 * variable holds; past NR_SHOWN bytes the quote closes on the cut and what follows it says
 * so, with the whole length: "aaa"... (4096 bytes). */
static void show_value(const char *v, char *out, size_t size)
{
    size_t o = 0, len = strlen(v), n = len < NR_SHOWN ? len : NR_SHOWN;
    out[o++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        const char *esc = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\n' ? "\\n"
                          : c == '\t' ? "\\t"
                          : c == '\r' ? "\\r"
                                      : NULL;
        if (esc)
            o += (size_t)snprintf(out + o, size - o, "%s", esc);
        else if (c < 0x20 || c >= 0x7f)
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    if (len > n)
        snprintf(out + o, size - o, "\"... (%zu bytes)", len);
    else
        snprintf(out + o, size - o, "\"");
}

int cuheap_config_parse(struct cuheap_config *cfg, cuheap_getenv_fn get, cuheap_warn_fn warn,
                        void *arg)
{
    int nr_warnings = 0;
    set_defaults(cfg);
    for (size_t i = 0; i < NR_OPTIONS; i++) {
        const char *v = get(options[i].name, arg);
        if (!v)
            continue;
        struct cuheap_config trial = *cfg;
        char why[WHY_MAX];
        if (options[i].parse(&options[i], v, &trial, why) == 0) {
            *cfg = trial;
            if (options[i].offset == FIELD(stack_depth) && options[i].parse == parse_uint)
                cfg->stack_depth_set = true;
            continue;
        }
        /* sized for the longest: test-config checks every option's worst value fits */
        char shown[4 * NR_SHOWN + 32], line[CUHEAP_LOG_MAX_LINE];
        show_value(v, shown, sizeof(shown));
        snprintf(line, sizeof(line), "ignoring %s=%s: %s; expected %s; keeping %s", options[i].name,
                 shown, why, options[i].doc, options[i].dflt);
        warn(line, arg);
        nr_warnings++;
    }
    for (size_t i = 0; i < sizeof(removed) / sizeof(removed[0]); i++) {
        const char *v = get(removed[i].name, arg);
        if (!v || is_off(v))
            continue;
        char shown[4 * NR_SHOWN + 32], line[CUHEAP_LOG_MAX_LINE];
        show_value(v, shown, sizeof(shown));
        snprintf(line, sizeof(line), "ignoring %s=%s: %s", removed[i].name, shown, removed[i].why);
        warn(line, arg);
        nr_warnings++;
    }
    if (cfg->pool_max > cfg->arena_size) {
        char line[160];
        snprintf(line, sizeof(line),
                 "CUHEAP_POOL_MAX is larger than CUHEAP_ARENA_SIZE; using %" PRIu64,
                 cfg->arena_size);
        warn(line, arg);
        cfg->pool_max = cfg->arena_size;
        nr_warnings++;
    }
    if (cfg->min_block > cfg->arena_size)
        cfg->min_block = cfg->arena_size;
    if (cfg->vmm_placement == CUHEAP_PLACE_FIRST && cfg->vmm_layout == CUHEAP_VMM_ALIGNED) {
        warn("CUHEAP_VMM_PLACEMENT=first-fit needs CUHEAP_VMM_LAYOUT=tight (aligned pieces need "
             "the buddy's places); using scored",
             arg);
        cfg->vmm_placement = CUHEAP_PLACE_SCORED;
        nr_warnings++;
    }
    return nr_warnings;
}

void cuheap_config_dump(const struct cuheap_config *cfg, cuheap_warn_fn emit, void *arg)
{
    char line[CUHEAP_PATH_MAX + 64];
#define EMIT(...)                                                                                  \
    do {                                                                                           \
        snprintf(line, sizeof(line), __VA_ARGS__);                                                 \
        emit(line, arg);                                                                           \
    } while (0)
    /* only what is in force: a setting of a part that does not run is left out */
    bool pool = cfg->pool, vmm = pool && cfg->backing == CUHEAP_BACKING_VMM;
    bool fence = pool && cfg->reuse == CUHEAP_REUSE_FENCE, rec = cfg->record;
    EMIT("CUHEAP_POOL=%d", cfg->pool);
    if (pool) {
        EMIT("CUHEAP_POOL_INIT=%" PRIu64, cfg->pool_init);
        if (!vmm)
            EMIT("CUHEAP_ARENA_SIZE=%" PRIu64, cfg->arena_size);
        EMIT("CUHEAP_MIN_BLOCK=%" PRIu64, cfg->min_block);
        EMIT("CUHEAP_POOL_MAX=%" PRIu64, cfg->pool_max);
        EMIT("CUHEAP_RELEASE=%s", release_names[cfg->release]);
        EMIT("CUHEAP_REUSE=%s", reuse_names[cfg->reuse]);
        EMIT("CUHEAP_BACKING=%s", backing_names[cfg->backing]);
    }
    if (vmm) {
        EMIT("CUHEAP_VMM_CHUNK=%" PRIu64, cfg->vmm_chunk);
        EMIT("CUHEAP_VMM_CUSHION=%" PRIu64, cfg->vmm_cushion);
        EMIT("CUHEAP_VMM_LAYOUT=%s", vmm_layout_names[cfg->vmm_layout]);
        if (cfg->vmm_layout == CUHEAP_VMM_TIGHT) /* aligned pieces need the buddy's places */
            EMIT("CUHEAP_VMM_PLACEMENT=%s", vmm_placement_names[cfg->vmm_placement]);
        if (cfg->vmm_layout == CUHEAP_VMM_TIGHT && cfg->vmm_placement == CUHEAP_PLACE_SCORED)
            EMIT("CUHEAP_VMM_IDLE_FIT=%u", cfg->vmm_idle_fit);
    }
    if (pool && cfg->release != CUHEAP_RELEASE_EMPTY)
        EMIT("CUHEAP_THREAD_CACHE=%" PRIu64, cfg->thread_cache);
    if (fence) {
        EMIT("CUHEAP_FENCE_BATCH=%u", cfg->fence_batch);
        EMIT("CUHEAP_IDLE_CHECK=%d", cfg->idle_check);
    }
    if (cfg->limit_permille)
        EMIT("CUHEAP_LIMIT=%u.%u%%", cfg->limit_permille / 10, cfg->limit_permille % 10);
    else
        EMIT("CUHEAP_LIMIT=%" PRIu64, cfg->limit_bytes);
    EMIT("CUHEAP_RECORD=%d", cfg->record);
    if (rec) {
        EMIT("CUHEAP_STACK_DEPTH=%u", cfg->stack_depth);
        EMIT("CUHEAP_PYTHON=%d", cfg->python);
        EMIT("CUHEAP_STACK_CACHE=%d", cfg->stack_cache);
        EMIT("CUHEAP_RECORD_TIMING=%d", cfg->record_timing);
        EMIT("CUHEAP_RING=%u", cfg->ring_slots);
    }
    if (rec) {
        EMIT("CUHEAP_OUTPUT=%s", cfg->output);
        EMIT("CUHEAP_OUTPUT_MODE=%04o", cfg->output_mode);
        EMIT("CUHEAP_FORMAT=%s", format_names[cfg->format]);
        EMIT("CUHEAP_FLUSH_MS=%u", cfg->flush_ms);
    }
    EMIT("CUHEAP_SUMMARY=%d", cfg->summary);
    EMIT("CUHEAP_AUDIT=%s", cfg->audit_cupti[0] ? cfg->audit_cupti : cfg->audit ? "1" : "0");
#undef EMIT
}

const char *cuheap_backing_name(enum cuheap_backing b)
{
    return backing_names[b];
}

const char *cuheap_reuse_name(enum cuheap_reuse r)
{
    return reuse_names[r];
}

const char *cuheap_format_size(uint64_t v, char *buf, size_t size)
{
    if (v >= (1ull << 30))
        snprintf(buf, size, "%.2f GiB", (double)v / (double)(1ull << 30));
    else if (v >= (1ull << 20))
        snprintf(buf, size, "%.2f MiB", (double)v / (double)(1ull << 20));
    else if (v >= 1024)
        snprintf(buf, size, "%.2f KiB", (double)v / 1024.0);
    else
        snprintf(buf, size, "%" PRIu64 " B", v);
    return buf;
}

int cuheap_expand_path(const char *tmpl, char *out, size_t size, long pid, const char *rank,
                       const char *host)
{
    if (!size)
        return -ENAMETOOLONG;
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        char tmp[64];
        const char *ins = tmp;
        tmp[0] = *p;
        tmp[1] = 0;
        if (*p == '%' && p[1]) {
            p++;
            switch (*p) {
            case 'p':
                snprintf(tmp, sizeof(tmp), "%ld", pid);
                break;
            case 'r':
                ins = rank && *rank ? rank : "0";
                break;
            case 'h':
                ins = host && *host ? host : "localhost";
                break;
            case '%':
                ins = "%";
                break;
            default:
                tmp[0] = '%';
                tmp[1] = *p;
                tmp[2] = 0;
                break;
            }
        }
        size_t k = strlen(ins);
        if (k >= size - o) {
            out[0] = 0; /* a name cut short is another file's name */
            return -ENAMETOOLONG;
        }
        memcpy(out + o, ins, k);
        o += k;
    }
    out[o] = 0;
    return 0;
}
