/* SPDX-License-Identifier: MIT */
/*
 * The cuheap command: run a program under the shim, and turn its traces into answers
 * (report, top, leaks) or into files other viewers open (chrome, folded, memviz).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis.h"
#include "config.h"
#include "event.h"
#include "export.h"
#include "symbolize.h"
#include "tracereader.h"

#define TOOL "cuheap"

static void usage(FILE *f)
{
    fprintf(f, "usage: cuheap COMMAND [OPTIONS] ...\n"
               "\n"
               "  run [OPTIONS] [--] PROGRAM [ARGS]   run PROGRAM with libcuheap.so preloaded\n"
               "      -o, --output PATH     trace path (%%p pid, %%r rank, %%h host)\n"
               "      -f, --format FMT      jsonl (default) or chrome\n"
               "      --no-pool             record only; every allocation goes to the driver\n"
               "      --reuse POLICY        fence (default), sync or immediate\n"
               "      --limit SIZE          per-device limit, bytes (K/M/G) or a percentage\n"
               "      --stack-depth N       native frames per event (0 = none)\n"
               "      --audit               check coverage with CUPTI\n"
               "  report TRACE...          peak, fragmentation, APIs, top sites, leaks\n"
               "  top [-n N] [--by peak|total] TRACE   call sites by bytes live at the peak\n"
               "                                       or allocated over the run\n"
               "  leaks [-n N] TRACE        allocations never freed, by call site\n"
               "  chrome [-o OUT] TRACE...  one Chrome/Perfetto timeline (ranks merged)\n"
               "  folded [--by peak|total] TRACE   folded stacks for flamegraph.pl/speedscope\n"
               "  memviz [-o OUT] TRACE     PyTorch memory_viz snapshot (pickle)\n"
               "  html [-o OUT] TRACE       self-contained HTML report with charts\n"
               "  check TRACE...            read and validate traces\n"
               "  help                      this text\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, TOOL ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static int load(const char *path, struct cuheap_trace *t)
{
    char err[600];
    if (cuheap_trace_read(path, t, err, sizeof(err)))
        return fail("%s", err), -1;
    if (t->nr_bad_lines)
        fprintf(stderr, TOOL ": %s: skipped %zu malformed lines (first at line %zu)\n", path,
                t->nr_bad_lines, t->first_bad_line);
    if (t->truncated)
        fprintf(stderr,
                TOOL ": %s: the run did not finish writing this trace (killed or "
                     "still running); reading what is there\n",
                path);
    symbolize_trace(t);
    return 0;
}

/* ---- run ---- */

static int find_library(char *out, size_t size)
{
    const char *env = getenv("CUHEAP_LIBRARY");
    if (env && *env) {
        if (access(env, R_OK))
            return fail("CUHEAP_LIBRARY=%s: %s", env, strerror(errno));
        snprintf(out, size, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return fail("cannot find where cuheap is installed; set CUHEAP_LIBRARY");
    exe[n] = 0;
    const char *dir = dirname(exe);
    static const char *const rel[] = {"libcuheap.so",
                                      "../src/libcuheap.so",
                                      "../lib/libcuheap.so",
                                      "../lib64/libcuheap.so",
                                      "../lib/x86_64-linux-gnu/libcuheap.so",
                                      NULL};
    for (int i = 0; rel[i]; i++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof(cand), "%s/%s", dir, rel[i]);
        char *real = realpath(cand, NULL);
        if (real) {
            snprintf(out, size, "%s", real);
            free(real);
            return 0;
        }
    }
    return fail("libcuheap.so not found next to %s; set CUHEAP_LIBRARY to its path", dir);
}

static int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'},
        {"no-pool", no_argument, NULL, 'P'},
        {"reuse", required_argument, NULL, 'R'},
        {"limit", required_argument, NULL, 'L'},
        {"stack-depth", required_argument, NULL, 'D'},
        {"audit", no_argument, NULL, 'A'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+o:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            setenv("CUHEAP_OUTPUT", optarg, 1);
            break;
        case 'f':
            if (strcmp(optarg, "jsonl") && strcmp(optarg, "chrome"))
                return fail("run: --format %s: expected jsonl or chrome", optarg);
            setenv("CUHEAP_FORMAT", optarg, 1);
            break;
        case 'P':
            setenv("CUHEAP_POOL", "0", 1);
            break;
        case 'R':
            if (strcmp(optarg, "fence") && strcmp(optarg, "sync") && strcmp(optarg, "immediate"))
                return fail("run: --reuse %s: expected fence, sync or immediate", optarg);
            setenv("CUHEAP_REUSE", optarg, 1);
            break;
        case 'L': {
            uint64_t b;
            unsigned pm;
            if (cuheap_parse_size(optarg, true, &b, &pm))
                return fail("run: --limit %s: expected bytes with K/M/G or a percentage", optarg);
            setenv("CUHEAP_LIMIT", optarg, 1);
            break;
        }
        case 'D': {
            char *end;
            long d = strtol(optarg, &end, 10);
            if (*end || d < 0 || d > 64)
                return fail("run: --stack-depth %s: expected 0 to 64", optarg);
            setenv("CUHEAP_STACK_DEPTH", optarg, 1);
            break;
        }
        case 'A':
            setenv("CUHEAP_AUDIT", "1", 0); /* a CUHEAP_AUDIT=/path/libcupti.so given stays */
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return fail("run: see 'cuheap help'");
        }
    }
    if (optind >= argc)
        return fail("run: no program given (cuheap run [OPTIONS] -- PROGRAM [ARGS])");
    char lib[PATH_MAX];
    if (find_library(lib, sizeof(lib)))
        return 2;
    const char *old = getenv("LD_PRELOAD");
    char *preload;
    if (asprintf(&preload, "%s%s%s", lib, old && *old ? ":" : "", old ? old : "") < 0)
        return fail("out of memory");
    setenv("LD_PRELOAD", preload, 1);
    free(preload);
    /* NVTX ranges the program emits become trace markers (cuheap is an NVTX injection) */
    setenv("NVTX_INJECTION64_PATH", lib, 0);
    execvp(argv[optind], argv + optind);
    return fail("run: cannot execute %s: %s", argv[optind], strerror(errno)) == 2 ? 127 : 127;
}

/* ---- report, top, leaks ---- */

static const char *jstr(json_t *obj, const char *key, const char *dflt)
{
    const char *v = json_string_value(json_object_get(obj, key));
    return v ? v : dflt;
}

/* Sites are grouped by stack; several stacks can end in the same line of the program (called
 * from different places): those are shown as one row, largest first. */
static void print_sites(const struct cuheap_trace *t, struct site *sites, size_t nr, size_t limit,
                        const char *what)
{
    char b1[32];
    if (!nr) {
        printf("  (none)\n");
        return;
    }
    struct row {
        char name[700];
        uint64_t bytes, count;
    } *rows = calloc(nr, sizeof(*rows));
    size_t nr_rows = 0;
    for (size_t i = 0; i < nr; i++) {
        char name[700];
        cuheap_trace_site(t, sites[i].stack, name, sizeof(name));
        size_t k = 0;
        while (k < nr_rows && strcmp(rows[k].name, name))
            k++;
        if (k == nr_rows)
            snprintf(rows[nr_rows++].name, sizeof(rows[k].name), "%s", name);
        rows[k].bytes += sites[i].bytes;
        rows[k].count += sites[i].count;
    }
    /* keep the order by bytes after merging */
    for (size_t i = 1; i < nr_rows; i++)
        for (size_t k = i; k > 0 && rows[k].bytes > rows[k - 1].bytes; k--) {
            struct row tmp = rows[k];
            rows[k] = rows[k - 1];
            rows[k - 1] = tmp;
        }
    for (size_t i = 0; i < nr_rows && i < limit; i++)
        printf("  %10s  %6" PRIu64 " %s  %s\n", human_bytes(rows[i].bytes, b1, sizeof(b1)),
               rows[i].count, what, rows[i].name);
    free(rows);
}

static void report_one(const struct cuheap_trace *t)
{
    struct trace_summary s;
    summarize(t, &s);
    char b1[32], b2[32], b3[32];
    const char *exe = json_string_value(json_object_get(t->header, "exe"));
    printf("== %s: pid %ld, %s, %.3f s, %zu events\n", t->path, t->pid, exe ? exe : "?",
           (double)s.duration_ns / 1e9, t->nr_events);
    if (t->rank >= 0)
        printf("   rank %ld\n", t->rank);
    const char *unw = json_string_value(json_object_get(t->header, "unwinder"));
    json_t *conf = json_object_get(t->header, "config");
    printf("   pool %s, reuse %s, stacks by %s\n",
           strcmp(jstr(conf, "CUHEAP_POOL", "1"), "1") ? "off" : "on",
           jstr(conf, "CUHEAP_REUSE", "?"), unw ? unw : "?");
    if (t->footer) {
        json_int_t dropped = json_integer_value(json_object_get(t->footer, "dropped"));
        if (dropped)
            printf("   WARNING: %lld events were dropped (ring full): figures below undercount\n",
                   (long long)dropped);
    }
    for (unsigned i = 0; i < s.nr_dev; i++) {
        struct device_summary *d = &s.dev[i];
        const char *name = "?";
        uint64_t total = 0;
        for (unsigned k = 0; k < t->nr_devices; k++)
            if (t->devices[k].ordinal == d->device) {
                name = t->devices[k].name;
                total = t->devices[k].total;
            }
        printf("\nGPU %d (%s, %s)\n", d->device, name, human_bytes(total, b1, sizeof(b1)));
        printf("  peak live      %s at %.3f s\n", human_bytes(d->peak_live, b1, sizeof(b1)),
               (double)d->peak_live_t / 1e9);
        printf("  peak reserved  %s   fragmentation %.2f (peak reserved / peak live)\n",
               human_bytes(d->peak_reserved, b2, sizeof(b2)),
               d->peak_live ? (double)d->peak_reserved / (double)d->peak_live : 0.0);
        printf("  allocations    %" PRIu64 " (%" PRIu64 " from the pool), frees %" PRIu64
               ", %s allocated in all\n",
               d->nr_allocs, d->nr_pooled, d->nr_frees,
               human_bytes(d->bytes_allocated, b3, sizeof(b3)));
        if (d->nr_ooms || d->nr_limit)
            printf("  OUT OF MEMORY  %" PRIu64 " times, %" PRIu64 " refused by CUHEAP_LIMIT\n",
                   d->nr_ooms, d->nr_limit);
        printf("  still live at the end: %s\n", human_bytes(d->live, b1, sizeof(b1)));
        struct site *sites;
        size_t nr = collect_sites(t, &s, SITES_AT_PEAK, d->device, &sites);
        printf("\n  live at the peak, by call site:\n");
        print_sites(t, sites, nr, 10, "blocks");
        free(sites);
    }
    printf("\nby API:");
    for (int a = 1; a < CUHEAP_NR_APIS; a++)
        if (s.api_count[a])
            printf(" %s %" PRIu64, cuheap_api_name((unsigned)a), s.api_count[a]);
    printf("\n");
    if (s.nr_host_allocs)
        printf("pinned host memory: %" PRIu64 " allocations, %s\n", s.nr_host_allocs,
               human_bytes(s.host_bytes, b1, sizeof(b1)));
    struct site *leaks;
    size_t nr = collect_sites(t, &s, SITES_LEAKED, -1, &leaks);
    uint64_t leaked = 0;
    for (size_t i = 0; i < nr; i++)
        leaked += leaks[i].bytes;
    printf("never freed: %s at %zu sites%s\n", human_bytes(leaked, b1, sizeof(b1)), nr,
           nr ? " (cuheap leaks for the list)" : "");
    free(leaks);
}

static int parse_n(const char *s, size_t *ret)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v <= 0)
        return fail("-n %s: expected a positive number", s);
    *ret = (size_t)v;
    return 0;
}

static int parse_by(const char *s, enum site_measure *ret)
{
    if (!strcmp(s, "peak"))
        *ret = SITES_AT_PEAK;
    else if (!strcmp(s, "total"))
        *ret = SITES_TOTAL;
    else
        return fail("--by %s: expected peak or total", s);
    return 0;
}

static int cmd_sites(int argc, char **argv, bool leaks)
{
    static const struct option opts[] = {{"by", required_argument, NULL, 'b'}, {NULL, 0, NULL, 0}};
    size_t n = 20;
    enum site_measure m = leaks ? SITES_LEAKED : SITES_AT_PEAK;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
        if (c == 'n' && !parse_n(optarg, &n))
            continue;
        if (c == 'b' && !leaks && !parse_by(optarg, &m))
            continue;
        return c == '?' ? fail("%s: see 'cuheap help'", argv[0]) : 2;
    }
    if (optind != argc - 1)
        return fail("%s: expected one trace file", argv[0]);
    struct cuheap_trace t;
    if (load(argv[optind], &t))
        return 2;
    struct trace_summary s;
    summarize(&t, &s);
    struct site *sites;
    size_t nr = collect_sites(&t, &s, m, -1, &sites);
    printf("%s\n", leaks                ? "never freed, by call site:"
                   : m == SITES_AT_PEAK ? "live at each device's peak, by call site:"
                                        : "allocated over the run, by call site:");
    print_sites(&t, sites, nr, n, leaks ? "blocks" : "allocs");
    if (nr)
        for (size_t i = 0; i < nr && i < 3; i++) {
            const struct cuheap_trace_stack *st = cuheap_trace_stack(&t, sites[i].stack);
            if (!st)
                continue;
            char buf[700];
            printf("\n#%zu full stack:\n", i + 1);
            for (size_t k = 0; k < 24 && cuheap_trace_frame(st, k, buf, sizeof(buf)); k++)
                printf("    %s\n", buf);
        }
    free(sites);
    cuheap_trace_free(&t);
    return 0;
}

/* CUHEAP_AUDIT's verdict and the driver operations no hook saw (src/cupti_audit.c). */
static void report_audit(const struct cuheap_trace *t)
{
    const struct cuheap_trace_event *verdict = NULL;
    size_t nr_missed = 0;
    for (size_t i = 0; i < t->nr_events; i++)
        if (t->events[i].type == CUHEAP_EV_AUDIT && t->events[i].verdict)
            verdict = &t->events[i];
    if (verdict && !verdict->aux2)
        printf("\naudit: %" PRIu64 " driver operations, all seen\n", verdict->aux);
    else if (verdict)
        printf("\naudit: %" PRIu64 " driver operations, %" PRIu64 " not seen by cuheap:\n",
               verdict->aux, verdict->aux2);
    for (size_t i = 0; i < t->nr_events; i++) {
        const struct cuheap_trace_event *e = &t->events[i];
        if (e->type != CUHEAP_EV_AUDIT || e->verdict)
            continue;
        if (nr_missed++ == 0 && !verdict)
            printf("\naudit (no verdict: the run did not reach its exit):\n");
        if (nr_missed > 20)
            continue;
        printf("  %s", e->label ? e->label : "?");
        if (e->aux2 > 1)
            printf(" x%" PRIu64, e->aux2);
        printf("\n");
    }
    if (nr_missed > 20)
        printf("  ... and %zu more in the trace\n", nr_missed - 20);
}

static int cmd_report(int argc, char **argv)
{
    if (argc < 2)
        return fail("report: expected one or more trace files");
    for (int i = 1; i < argc; i++) {
        struct cuheap_trace t;
        if (load(argv[i], &t))
            return 2;
        report_one(&t);
        report_audit(&t);
        cuheap_trace_free(&t);
        if (i + 1 < argc)
            printf("\n");
    }
    return 0;
}

static FILE *open_out(const char *path)
{
    if (!path || !strcmp(path, "-"))
        return stdout;
    FILE *f = fopen(path, "we");
    if (!f)
        fail("cannot write %s: %s", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path)
{
    if (f == stdout)
        return fflush(f) ? fail("writing stdout: %s", strerror(errno)) : 0;
    if (fclose(f))
        return fail("writing %s: %s", path, strerror(errno));
    return 0;
}

static int cmd_chrome(int argc, char **argv)
{
    const char *out_path = NULL;
    int c;
    optind = 1;
    while ((c = getopt(argc, argv, "o:")) != -1) {
        if (c != 'o')
            return fail("chrome: see 'cuheap help'");
        out_path = optarg;
    }
    if (optind >= argc)
        return fail("chrome: expected one or more trace files");
    size_t nr = (size_t)(argc - optind);
    struct cuheap_trace *ts = calloc(nr, sizeof(*ts));
    for (size_t i = 0; i < nr; i++)
        if (load(argv[optind + (int)i], &ts[i]))
            return 2;
    FILE *f = open_out(out_path);
    if (!f)
        return 2;
    int r = export_chrome(ts, nr, f);
    for (size_t i = 0; i < nr; i++)
        cuheap_trace_free(&ts[i]);
    free(ts);
    if (r)
        return fail("chrome: out of memory");
    return close_out(f, out_path);
}

static int cmd_folded(int argc, char **argv)
{
    static const struct option opts[] = {{"by", required_argument, NULL, 'b'}, {NULL, 0, NULL, 0}};
    enum site_measure m = SITES_AT_PEAK;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if (c != 'b' || parse_by(optarg, &m))
            return c == 'b' ? 2 : fail("folded: see 'cuheap help'");
    if (optind != argc - 1)
        return fail("folded: expected one trace file");
    struct cuheap_trace t;
    if (load(argv[optind], &t))
        return 2;
    export_folded(&t, m, stdout);
    cuheap_trace_free(&t);
    return close_out(stdout, "-");
}

/* `NAME [-o OUT] TRACE`: one trace in, one file out (stdout unless -o). */
static int cmd_export_one(int argc, char **argv, bool binary,
                          int (*export)(const struct cuheap_trace *t, FILE *f))
{
    const char *name = argv[0], *out_path = NULL;
    int c;
    optind = 1;
    while ((c = getopt(argc, argv, "o:")) != -1) {
        if (c != 'o')
            return fail("%s: see 'cuheap help'", name);
        out_path = optarg;
    }
    if (optind != argc - 1)
        return fail("%s: expected one trace file", name);
    if (binary && !out_path && isatty(STDOUT_FILENO))
        return fail("%s: the output is binary; give -o FILE", name);
    struct cuheap_trace t;
    if (load(argv[optind], &t))
        return 2;
    FILE *f = open_out(out_path);
    if (!f) {
        cuheap_trace_free(&t);
        return 2;
    }
    export(&t, f);
    cuheap_trace_free(&t);
    return close_out(f, out_path);
}

static int cmd_check(int argc, char **argv)
{
    if (argc < 2)
        return fail("check: expected one or more trace files");
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        struct cuheap_trace t;
        if (load(argv[i], &t)) {
            bad = 1;
            continue;
        }
        printf("%s: ok, %zu events, %zu stacks, %u devices%s\n", argv[i], t.nr_events, t.nr_stacks,
               t.nr_devices, t.truncated ? ", incomplete" : "");
        cuheap_trace_free(&t);
    }
    return bad ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    argc--;
    argv++;
    if (!strcmp(cmd, "run"))
        return cmd_run(argc, argv);
    if (!strcmp(cmd, "report"))
        return cmd_report(argc, argv);
    if (!strcmp(cmd, "top"))
        return cmd_sites(argc, argv, false);
    if (!strcmp(cmd, "leaks"))
        return cmd_sites(argc, argv, true);
    if (!strcmp(cmd, "chrome"))
        return cmd_chrome(argc, argv);
    if (!strcmp(cmd, "folded"))
        return cmd_folded(argc, argv);
    if (!strcmp(cmd, "memviz"))
        return cmd_export_one(argc, argv, true, export_memviz);
    if (!strcmp(cmd, "check"))
        return cmd_check(argc, argv);
    if (!strcmp(cmd, "html"))
        return cmd_export_one(argc, argv, false, export_html);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fail("unknown command '%s' (commands: run report top leaks chrome folded memviz html check "
         "help)",
         cmd);
    return 2;
}
