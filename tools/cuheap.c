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
#include <signal.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "analysis.h"
#include "config.h"
#include "diff.h"
#include "event.h"
#include "export.h"
#include "live.h"
#include "ranks.h"
#include "symbolize.h"
#include "tracereader.h"

#define TOOL "cuheap"

/* One row per command: the synopsis is README's command table, word for word (a test
 * compares them). */
struct command {
    const char *name;
    const char *synopsis;
    const char *help; /* what it does, and its options */
};

static const struct command commands[] = {
    {"run",
     "cuheap run [-o PATH] [-f jsonl|chrome] [--torch] [--no-pool] [--reuse P] [--limit SIZE] "
     "[--stack-depth N] [--audit] [--live] [--] PROGRAM [ARGS]",
     "Run PROGRAM with libcuheap.so preloaded (found next to the tool, or CUHEAP_LIBRARY).\n"
     "  -o, --output PATH     trace path (%p pid, %r rank, %h host); CUHEAP_OUTPUT\n"
     "  -f, --format FMT      jsonl (default) or chrome; CUHEAP_FORMAT\n"
     "  --torch               make cuheap PyTorch's allocator in every Python process of the\n"
     "                        run, before its first CUDA tensor, so the trace has each tensor\n"
     "                        with its stream (a script that picks its own allocator keeps it)\n"
     "  --no-pool             record only: every allocation goes to the driver; CUHEAP_POOL=0\n"
     "  --reuse P             fence (default), sync or immediate; CUHEAP_REUSE\n"
     "  --limit SIZE          per-device limit, bytes (K/M/G/T) or a percentage; CUHEAP_LIMIT\n"
     "  --stack-depth N       native frames per event, 0 to 64; CUHEAP_STACK_DEPTH\n"
     "  --audit               check with CUPTI that every driver memory operation was seen;\n"
     "                        CUHEAP_AUDIT=1 (a CUHEAP_AUDIT=/path/libcupti.so given stays)\n"
     "  --live                follow the run's traces while it runs, as `top --follow` does\n"
     "                        (every rank's; CUHEAP_LIVE_INTERVAL seconds between refreshes,\n"
     "                        1); the exit status is the program's\n"},
    {"report", "cuheap report TRACE...",
     "Per process and GPU: peak live and when, peak reserved, fragmentation, counts by API,\n"
     "OOMs, the call sites live at the peak, what was never freed.\n"},
    {"top", "cuheap top [-n N] [--by peak|total] [--follow [--interval S]] TRACE...",
     "Call sites by bytes live at each GPU's peak (--by peak, the default) or allocated over\n"
     "the run (--by total), N rows (20), with the full stacks of the first three.\n"
     "  --follow              follow traces being written (paths or quoted glob patterns,\n"
     "                        looked up again as ranks start): per rank and GPU live, held by\n"
     "                        cuheap, the driver's free memory when known, peak so far, OOMs\n"
     "                        (+Nr: recovered from), and the N call sites (5) holding the most\n"
     "                        now; the rank holding the most first. On a terminal it redraws\n"
     "                        in place (q or Ctrl-C quits); on a pipe it prints a table when\n"
     "                        something changed and stops when every trace has ended\n"
     "  --interval S          seconds between refreshes (1)\n"
     "  --count N             stop after N refreshes\n"},
    {"leaks", "cuheap leaks [-n N] TRACE",
     "Allocations never freed, by call site, N rows (20), with the full stacks of the first\n"
     "three.\n"},
    {"chrome", "cuheap chrome [-o OUT] [--from S] [--to S] TRACE...",
     "One Chrome Trace Event file for Perfetto (stdout unless -o); several ranks' traces merge\n"
     "into one timeline, clocks aligned, each process under its command line and rank.\n"
     "  --from S, --to S      only seconds S.. of the merged timeline (what was held at S\n"
     "                        starts there): a long run's file stays small enough to open\n"},
    {"folded", "cuheap folded [--by peak|total] TRACE",
     "Folded stacks (outer;...;inner BYTES) for flamegraph.pl or speedscope, by bytes live at\n"
     "the peak (default) or allocated over the run.\n"},
    {"memviz", "cuheap memviz -o OUT.pickle [--max-entries N] [--pool-view] TRACE",
     "A snapshot shaped like torch.cuda.memory._snapshot() for https://pytorch.org/memory_viz:\n"
     "the segments held at the end and per GPU the newest N actions (100000; 0: all). The\n"
     "actions tell what the program held (the report's figures); --pool-view: what the pool\n"
     "set aside (block sizes, frees completed at their fence).\n"},
    {"html", "cuheap html [-o OUT.html] TRACE...",
     "A self-contained HTML report (stdout unless -o; opens offline in any browser): per\n"
     "process and GPU, memory over time (live, reserved, the largest call sites, markers,\n"
     "out-of-memory events; hover, drag to zoom), the call sites at the peak with their\n"
     "stacks, leaks, out-of-memory events. Several traces (ranks) share one time axis.\n"},
    {"diff", "cuheap diff [-n N] A B",
     "What changed from run A to run B: per GPU peak live and reserved bytes, fragmentation,\n"
     "allocations, OOMs; the call sites whose bytes at the peak changed, largest change first\n"
     "(N rows, 20); leaks that appeared or went away. Call sites are matched by name.\n"},
    {"check", "cuheap check TRACE...",
     "Read and validate traces. Exit 0 when every trace is complete and clean, 1 when one is\n"
     "incomplete (a killed run) or has lines or fields that could not be read, 2 when one is\n"
     "not a readable trace.\n"},
    {"help", "cuheap help [COMMAND]", "This text, or one command's.\n"},
};

#define NR_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < NR_COMMANDS; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: cuheap COMMAND [OPTIONS] ...\n\n");
    for (size_t i = 0; i < NR_COMMANDS; i++)
        fprintf(f, "  %s\n", commands[i].synopsis);
    fprintf(f, "\n'cuheap help COMMAND' or 'cuheap COMMAND --help' says more; 'cuheap --version' "
               "the version.\n");
}

static int command_help(const struct command *c)
{
    printf("usage: %s\n\n%s", c->synopsis, c->help);
    return 0;
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

/* A progress line on a terminal for reads that take more than a second (CUHEAP_PROGRESS_MS),
 * rewritten in place and wiped when done; nothing when stderr is not a terminal. */
static void show_progress(const char *path, uint64_t done, uint64_t total, size_t events,
                          bool finished)
{
    static struct timespec start;
    static bool shown, tty_checked, tty;
    static long after_ms = -1;
    if (!tty_checked) {
        tty_checked = true;
        tty = isatty(STDERR_FILENO);
        const char *env = getenv("CUHEAP_PROGRESS_MS");
        char *end = NULL;
        after_ms = env && *env ? strtol(env, &end, 10) : 1000;
        if (env && *env && (*end || after_ms < 0)) {
            fprintf(stderr,
                    "cuheap: CUHEAP_PROGRESS_MS=%s is not a number of milliseconds; "
                    "using 1000\n",
                    env);
            after_ms = 1000;
        }
    }
    if (!tty)
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!start.tv_sec && !start.tv_nsec)
        start = now;
    double secs = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9;
    if (finished) {
        if (shown)
            fputs("\r\033[K", stderr);
        shown = false;
        start = (struct timespec){0, 0};
        return;
    }
    if (secs * 1000 < (double)after_ms)
        return;
    char b1[32], b2[32], b3[32];
    fprintf(stderr, "\r\033[K" TOOL ": reading %s: %s of %s (%.0f%%), %zu events, %s/s", path,
            human_bytes(done, b1, sizeof(b1)), human_bytes(total, b2, sizeof(b2)),
            total ? 100.0 * (double)done / (double)total : 0.0, events,
            human_bytes(secs > 0 ? (uint64_t)((double)done / secs) : 0, b3, sizeof(b3)));
    shown = true;
}

/* What the reader had to skip or guess, as one sentence ("" when nothing): every command
 * says it, check turns it into its exit status. */
static const char *damage(const struct cuheap_trace *t, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    if (t->nr_bad_lines)
        n += (size_t)snprintf(buf + n, size - n, "%s%zu of %zu lines skipped (first: line %zu, %s)",
                              n ? "; " : "", t->nr_bad_lines, t->nr_lines, t->first_bad_line,
                              t->bad_line_why);
    if (t->nr_bad_fields && n < size)
        n += (size_t)snprintf(
            buf + n, size - n, "%s%zu malformed %s read as 0 (first: line %zu, \"%s\")",
            n ? "; " : "", t->nr_bad_fields, t->nr_bad_fields == 1 ? "field" : "fields",
            t->first_bad_field_line, t->bad_field);
    if (t->nr_unknown_events && n < size)
        n += (size_t)snprintf(buf + n, size - n,
                              "%s%zu events of kinds this tool does not know skipped (a newer "
                              "cuheap wrote them)",
                              n ? "; " : "", t->nr_unknown_events);
    json_int_t written = json_integer_value(json_object_get(t->footer, "written"));
    size_t read = t->nr_events + t->nr_unknown_events;
    if (t->footer && json_object_get(t->footer, "written") && (size_t)written != read && n < size)
        n += (size_t)snprintf(buf + n, size - n, "%sthe footer counts %lld events, %zu read",
                              n ? "; " : "", (long long)written, read);
    return buf;
}

static void visit_summary(const struct cuheap_trace_event *e, void *ctx)
{
    summarize_event(ctx, e);
}

/* Read a trace; with s, summarize it during the same read where the trace streams (one
 * pass), else afterwards. Says in one line each what the reader had to skip. */
static int load_visiting(const char *path, struct cuheap_trace *t, struct trace_summary *s,
                         cuheap_trace_visit_fn visit, void *ctx, bool *ret_visited)
{
    char err[600];
    bool visited = false;
    if (s)
        summarize_begin(s);
    if (s && !visit) {
        visit = visit_summary;
        ctx = s;
    }
    int r = cuheap_trace_open_visit(path, t, err, sizeof(err), visit, ctx, &visited);
    if (ret_visited)
        *ret_visited = visited;
    if (s) {
        summarize_end(s);
        if (r || !visited) /* read into memory: what the visitor saw does not count */
            summary_free(s);
        if (!r && !visited)
            summarize(t, s);
    }
    if (r)
        return fail("%s", err), -1;
    char why[600];
    if (*damage(t, why, sizeof(why)))
        fprintf(stderr, TOOL ": %s: %s\n", path, why);
    if (t->truncated)
        fprintf(stderr,
                TOOL ": %s: the run did not finish writing this trace (killed or "
                     "still running); reading what is there\n",
                path);
    symbolize_trace(t);
    return 0;
}

static int load_summarized(const char *path, struct cuheap_trace *t, struct trace_summary *s)
{
    return load_visiting(path, t, s, NULL, NULL, NULL);
}

static int load(const char *path, struct cuheap_trace *t)
{
    return load_summarized(path, t, NULL);
}

/* getopt's own message is off (opterr = 0): one line, ours, naming what was wrong. */
static int bad_option(const char *cmd, char **argv)
{
    const char *arg = argv[optind - 1];
    if (strncmp(arg, "--", 2) && optopt) /* a short option, maybe among others ("-qn") */
        return fail("%s: bad option -%c, or its value is missing (see 'cuheap help %s')", cmd,
                    optopt, cmd);
    return fail("%s: bad option %s, or its value is missing (see 'cuheap help %s')", cmd, arg, cmd);
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

/* ld.so splits LD_PRELOAD at spaces and colons and expands "$ORIGIN", "$LIB" and the like in
 * it: a library whose path holds one would be preloaded as pieces that do not exist, and the
 * program would run without cuheap, saying so only in a line of ld.so's. */
static bool preload_safe(const char *path)
{
    return !strpbrk(path, " \t\n:$");
}

/* A private folder (mkdtemp: mode 0700, ours, so nobody can swap what is in it) holding a link
 * named libcuheap.so to the library: a path ld.so reads whole. It goes under $XDG_RUNTIME_DIR,
 * else $TMPDIR, else /tmp, the first whose own path is safe and where one can be made. The
 * loader opens the same file through the link and through lib (NVTX's dlopen): one copy. */
static int preload_link(const char *lib, char *ret_dir, size_t dir_size, char *ret_link,
                        size_t link_size)
{
    char *target = realpath(lib, NULL);
    if (!target)
        return -errno;
    const char *bases[] = {getenv("XDG_RUNTIME_DIR"), getenv("TMPDIR"), "/tmp"};
    int err = -ENOENT;
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        if (!bases[i] || bases[i][0] != '/' || !preload_safe(bases[i]))
            continue;
        char dir[PATH_MAX], link[PATH_MAX + 16];
        if ((size_t)snprintf(dir, sizeof(dir), "%s/cuheap-run-XXXXXX", bases[i]) >= sizeof(dir))
            continue;
        if (!mkdtemp(dir)) {
            err = -errno;
            continue;
        }
        snprintf(link, sizeof(link), "%s/libcuheap.so", dir);
        if (symlink(target, link)) {
            err = -errno;
            rmdir(dir);
            continue;
        }
        snprintf(ret_dir, dir_size, "%s", dir);
        snprintf(ret_link, link_size, "%s", link);
        free(target);
        return 0;
    }
    free(target);
    return err;
}

/* --torch: Python runs a sitecustomize module from the first folder on PYTHONPATH that has
 * one, in every interpreter the run starts (ddtrace-run and opentelemetry-instrument inject
 * themselves so). Ours, _bootstrap/sitecustomize.py of the cuheap Python package, waits for the
 * program's `import torch`, makes cuheap PyTorch's allocator then through the library named in
 * CUHEAP_TORCH (this run's), and runs the sitecustomize it stood in front of. */

/* dir/cuheap/_bootstrap when it holds the bootstrap, into out. */
static bool bootstrap_in(const char *dir, char *out, size_t size)
{
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof(cand), "%s/cuheap/_bootstrap/sitecustomize.py", dir);
    if (access(cand, R_OK))
        return false;
    snprintf(cand, sizeof(cand), "%s/cuheap/_bootstrap", dir);
    char *real = realpath(cand, NULL);
    if (real)
        snprintf(out, size, "%s", real);
    free(real);
    return real != NULL;
}

/* The package is looked for on PYTHONPATH, where pip and meson install it beside the tool
 * (bin/ and lib/pythonX.Y/site-packages/ or dist-packages/), and in the source tree of a
 * build tree's or gpu-bundle's tool. */
static int find_bootstrap(char *out, size_t size)
{
    const char *pp = getenv("PYTHONPATH");
    char *copy = strdup(pp ? pp : ""), *save = NULL;
    bool found = false;
    for (char *p = copy ? strtok_r(copy, ":", &save) : NULL; p && !found;
         p = strtok_r(NULL, ":", &save))
        found = *p && bootstrap_in(p, out, size);
    free(copy);
    if (found)
        return 0;
    char exe[PATH_MAX], here[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return fail("run --torch: cannot find where cuheap is installed; put the cuheap Python "
                    "package's folder on PYTHONPATH");
    exe[n] = 0;
    const char *dir = dirname(exe);
    static const char *const rel[] = {"../python", "../../python", NULL};
    for (int i = 0; rel[i]; i++) {
        snprintf(here, sizeof(here), "%s/%s", dir, rel[i]);
        if (bootstrap_in(here, out, size))
            return 0;
    }
    snprintf(here, sizeof(here), "%s/../lib", dir);
    DIR *d = opendir(here);
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        if (strncmp(e->d_name, "python3", 7))
            continue;
        static const char *const sub[] = {"site-packages", "dist-packages"};
        for (int i = 0; i < 2 && !found; i++) {
            char cand[PATH_MAX + 600];
            snprintf(cand, sizeof(cand), "%s/%s/%s", here, e->d_name, sub[i]);
            found = bootstrap_in(cand, out, size);
        }
    }
    if (d)
        closedir(d);
    if (found)
        return 0;
    return fail("run --torch: the cuheap Python package is not installed beside %s (pip install "
                "cuheap there, or put the folder holding the package on PYTHONPATH)",
                dir);
}

static int torch_bootstrap(const char *lib)
{
    char boot[PATH_MAX];
    if (find_bootstrap(boot, sizeof(boot)))
        return -1;
    const char *old = getenv("PYTHONPATH");
    char *path;
    if (asprintf(&path, "%s%s%s", boot, old && *old ? ":" : "", old ? old : "") < 0)
        return fail("out of memory");
    setenv("PYTHONPATH", path, 1);
    free(path);
    setenv("CUHEAP_TORCH", lib, 1);
    return 0;
}

static volatile sig_atomic_t run_child_pid;

static void pass_on(int sig)
{
    if (run_child_pid > 0)
        kill((pid_t)run_child_pid, sig);
}

/* The program as our child, so that the link's folder goes once it is done: its exit status
 * becomes ours, and a signal that ended it ends us. SIGINT and SIGQUIT from a terminal reach
 * the whole group, the child included, so they are the child's alone to act on; SIGTERM and
 * SIGHUP sent to us are passed on. */
static int run_child(char **argv, const char *dir, const char *link)
{
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { /* the program keeps the dispositions and mask it would have had */
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(argv[0], argv);
        fail("run: cannot execute %s: %s", argv[0], strerror(errno));
        _exit(127);
    }
    int err = errno;
    if (pid > 0) {
        run_child_pid = pid;
        struct sigaction ign = {.sa_handler = SIG_IGN}, fwd = {.sa_handler = pass_on},
                         dfl = {.sa_handler = SIG_DFL};
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGQUIT, &ign, NULL);
        sigaction(SIGTERM, &fwd, NULL);
        sigaction(SIGHUP, &fwd, NULL);
        sigaction(SIGCHLD, &dfl, NULL); /* an ignored SIGCHLD would leave nothing to wait for */
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    int st = 0;
    pid_t w = pid;
    while (pid > 0 && (w = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
        ;
    if (w < 0)
        err = errno;
    unlink(link);
    rmdir(dir);
    if (pid < 0 || w < 0)
        return fail("run: %s %s: %s", pid < 0 ? "cannot start" : "lost", argv[0], strerror(err));
    if (!WIFSIGNALED(st))
        return WEXITSTATUS(st);
    int sig = WTERMSIG(st);
    struct rlimit no_core = {0, 0}; /* the program left its core, if any: none of ours */
    setrlimit(RLIMIT_CORE, &no_core);
    signal(sig, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig;
}

/* The trace names a run's processes will write, as a glob pattern: every %-field of the
 * output setting matched by anything (a rank's default name included). */
static void trace_pattern(char *buf, size_t size)
{
    const char *out = getenv("CUHEAP_OUTPUT");
    if (!out || !*out)
        out = "cuheap-*.jsonl";
    size_t n = 0;
    for (const char *p = out; *p && n + 2 < size; p++) {
        if (*p == '%' && p[1]) {
            p++;
            if (*p != '%') {
                if (!n || buf[n - 1] != '*')
                    buf[n++] = '*';
                continue;
            }
        }
        buf[n++] = *p;
    }
    buf[n] = 0;
}

/* `run --live`: the program started as run_child() starts it, its traces followed meanwhile;
 * the exit status is the program's. */
static int run_live(char **argv, const char *dir, const char *link)
{
    const char *fmt = getenv("CUHEAP_FORMAT");
    if (fmt && !strcmp(fmt, "chrome"))
        return fail("run: --live follows JSON Lines traces; leave out -f chrome");
    char pattern[PATH_MAX];
    trace_pattern(pattern, sizeof(pattern));
    struct live_options o = {.interval_s = 1.0,
                             .nr_sites = 5,
                             .tty = isatty(STDOUT_FILENO),
                             .since_s = (long)time(NULL) - 1};
    const char *iv = getenv("CUHEAP_LIVE_INTERVAL");
    if (iv && atof(iv) > 0)
        o.interval_s = atof(iv);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[0], argv);
        fail("run: cannot execute %s: %s", argv[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0)
        return fail("run: cannot start %s: %s", argv[0], strerror(errno));
    o.child = pid;
    char *patterns[] = {pattern};
    int st = 0;
    live_follow(patterns, 1, &o, &st);
    if (*dir) {
        unlink(link);
        rmdir(dir);
    }
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int cmd_run(int argc, char **argv)
{
    /* one option a line, so that each added option is a line of its own */
    /* clang-format off */
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'},
        {"no-pool", no_argument, NULL, 'P'},
        {"reuse", required_argument, NULL, 'R'},
        {"limit", required_argument, NULL, 'L'},
        {"stack-depth", required_argument, NULL, 'D'},
        {"audit", no_argument, NULL, 'A'},
        {"torch", no_argument, NULL, 'T'},
        {"live", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* clang-format on */
    int c;
    bool torch = false, live = false;
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
        case 'T':
            torch = true;
            break;
        case 'V':
            live = true;
            break;
        case 'h':
            return command_help(find_command("run"));
        default:
            return bad_option("run", argv);
        }
    }
    if (optind >= argc)
        return fail("run: no program given (cuheap run [OPTIONS] -- PROGRAM [ARGS])");
    char lib[PATH_MAX];
    if (find_library(lib, sizeof(lib)))
        return 2;
    char dir[PATH_MAX] = "", link[PATH_MAX + 16];
    const char *pre = lib;
    if (!preload_safe(lib)) {
        int r = preload_link(lib, dir, sizeof(dir), link, sizeof(link));
        if (r)
            return fail("run: cannot preload %s: ld.so splits LD_PRELOAD at spaces and colons, and "
                        "no private folder for a link to it could be made (%s); set "
                        "CUHEAP_LIBRARY to a copy whose path has no space, ':' or '$'",
                        lib, strerror(-r));
        pre = link;
    }
    const char *old = getenv("LD_PRELOAD");
    char *preload;
    if (asprintf(&preload, "%s%s%s", pre, old && *old ? ":" : "", old ? old : "") < 0)
        return fail("out of memory");
    setenv("LD_PRELOAD", preload, 1);
    free(preload);
    /* NVTX ranges the program emits become trace markers (cuheap is an NVTX injection); NVTX
     * opens it with dlopen, which takes any path */
    setenv("NVTX_INJECTION64_PATH", lib, 0);
    if (torch && torch_bootstrap(lib))
        return 2;
    if (live)
        return run_live(argv + optind, dir, link);
    if (*dir)
        return run_child(argv + optind, dir, link);
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
#define NR_FULL_STACKS 3

/* Prints at most limit rows; returns how many, with the stack of each of the first
 * NR_FULL_STACKS rows' largest site in ret_stacks. */
struct row {
    char name[700];
    uint64_t bytes, count;
    uint32_t stack; /* its largest site's */
    size_t first;   /* index of its first (largest) site */
};

static int cmp_row_name(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->first < y->first ? -1 : x->first > y->first);
}

static int cmp_row_bytes(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* Prints at most limit rows; returns how many, with the stack of each of the first
 * NR_FULL_STACKS rows' largest site in ret_stacks. Sites whose stacks end in the same line
 * are one row (merged by sorting on the name: there can be tens of thousands). */
static size_t print_sites(const struct cuheap_trace *t, struct site *sites, size_t nr, size_t limit,
                          uint32_t ret_stacks[NR_FULL_STACKS])
{
    char b1[32];
    if (!nr) {
        printf("  (none)\n");
        return 0;
    }
    struct row *rows = calloc(nr, sizeof(*rows));
    if (!rows)
        return 0;
    for (size_t i = 0; i < nr; i++) { /* sites come largest first */
        cuheap_trace_site(t, sites[i].stack, rows[i].name, sizeof(rows[i].name));
        rows[i].bytes = sites[i].bytes;
        rows[i].count = sites[i].count;
        rows[i].stack = sites[i].stack;
        rows[i].first = i;
    }
    qsort(rows, nr, sizeof(*rows), cmp_row_name);
    size_t nr_rows = 0;
    for (size_t i = 0; i < nr; i++) {
        if (nr_rows && !strcmp(rows[nr_rows - 1].name, rows[i].name)) {
            rows[nr_rows - 1].bytes += rows[i].bytes;
            rows[nr_rows - 1].count += rows[i].count;
        } else {
            rows[nr_rows++] = rows[i];
        }
    }
    qsort(rows, nr_rows, sizeof(*rows), cmp_row_bytes);
    size_t shown = 0;
    for (; shown < nr_rows && shown < limit; shown++) {
        printf("  %10s  %6" PRIu64 " %s  %s\n", human_bytes(rows[shown].bytes, b1, sizeof(b1)),
               rows[shown].count, rows[shown].count == 1 ? "block " : "blocks", rows[shown].name);
        if (ret_stacks && shown < NR_FULL_STACKS)
            ret_stacks[shown] = rows[shown].stack;
    }
    free(rows);
    return shown;
}

static void report_one(const struct cuheap_trace *t, const struct trace_summary *sum)
{
    struct trace_summary s = *sum; /* freed by the caller */
    char b1[32], b2[32], b3[32], w[64];
    const char *exe = json_string_value(json_object_get(t->header, "exe"));
    printf("== %s: pid %ld, %s, %.3f s, %s\n", t->path, t->pid, exe ? exe : "?",
           (double)s.duration_ns / 1e9, count_of(t->nr_events, "event", "events", w, sizeof(w)));
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
            printf("   WARNING: %s dropped (ring full): figures below undercount\n",
                   count_of((uint64_t)dropped, "event was", "events were", w, sizeof(w)));
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
        struct step_estimate st;
        if (estimate_step(t, d->device, &st) && st.period && !st.nr_planned)
            printf("  steps          repeat every %zu allocations\n", st.period);
        else if (st.period)
            printf("  steps          repeat every %zu allocations; one step's blocks placed once "
                   "take %s\n                 beside %s of longer-lived blocks: %.3f of the step's "
                   "peak "
                   "live %s\n",
                   st.period, human_bytes(st.region, b1, sizeof(b1)),
                   human_bytes(st.outside, b2, sizeof(b2)),
                   st.peak_live ? (double)(st.region + st.outside) / (double)st.peak_live : 0.0,
                   human_bytes(st.peak_live, b3, sizeof(b3)));
        /* answers the program recovered from (a caching allocator freed and asked again)
         * are counted apart: the program never saw them */
        uint64_t rec = cuheap_trace_recovered(t, d->device), ooms = d->nr_ooms, lim = d->nr_limit;
        uint64_t from_ooms = rec < ooms ? rec : ooms;
        ooms -= from_ooms;
        lim -= rec - from_ooms < lim ? rec - from_ooms : lim;
        if (ooms || lim)
            printf("  OUT OF MEMORY  %s, %" PRIu64 " refused by CUHEAP_LIMIT\n",
                   count_of(ooms, "time", "times", w, sizeof(w)), lim);
        if (rec)
            printf("  recovered      %s the program recovered from (it freed and the same "
                   "request was answered): not out of memory\n",
                   count_of(rec, "out-of-memory answer", "out-of-memory answers", w, sizeof(w)));
        print_oom_report(t, d->device); /* what the shim told then */
        printf("  still live at the end: %s\n", human_bytes(d->live, b1, sizeof(b1)));
        struct site *sites;
        size_t nr = collect_sites(t, &s, SITES_AT_PEAK, d->device, &sites);
        printf("\n  live at the peak, by call site:\n");
        print_sites(t, sites, nr, 10, NULL);
        free(sites);
    }
    printf("\nby API:");
    for (int a = 1; a < CUHEAP_NR_APIS; a++)
        if (s.api_count[a])
            printf(" %s %" PRIu64, cuheap_api_name((unsigned)a), s.api_count[a]);
    printf("\n");
    if (s.nr_host_allocs)
        printf("pinned host memory: %s, %s\n",
               count_of(s.nr_host_allocs, "block", "blocks", w, sizeof(w)),
               human_bytes(s.host_bytes, b1, sizeof(b1)));
    struct site *leaks;
    size_t nr = collect_sites(t, &s, SITES_LEAKED, -1, &leaks);
    uint64_t leaked = 0;
    for (size_t i = 0; i < nr; i++)
        leaked += leaks[i].bytes;
    printf("never freed: %s at %s%s\n", human_bytes(leaked, b1, sizeof(b1)),
           count_of(nr, "site", "sites", w, sizeof(w)), nr ? " (cuheap leaks for the list)" : "");
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
        return c == '?' ? bad_option(argv[0], argv) : 2;
    }
    if (optind != argc - 1)
        return fail("%s: expected one trace file", argv[0]);
    struct cuheap_trace t;
    struct trace_summary s;
    if (load_summarized(argv[optind], &t, &s))
        return 2;
    struct site *sites;
    size_t nr = collect_sites(&t, &s, m, -1, &sites);
    printf("%s\n", leaks                ? "never freed, by call site:"
                   : m == SITES_AT_PEAK ? "live at each device's peak, by call site:"
                                        : "allocated over the run, by call site:");
    uint32_t stacks[NR_FULL_STACKS];
    size_t shown = print_sites(&t, sites, nr, n, stacks);
    /* the full stacks of the rows shown, never more */
    for (size_t i = 0; i < shown && i < NR_FULL_STACKS; i++) {
        const struct cuheap_trace_stack *st = cuheap_trace_stack(&t, stacks[i]);
        if (!st)
            continue;
        char buf[700];
        printf("\n#%zu full stack:\n", i + 1);
        for (size_t k = 0; k < 24 && cuheap_trace_frame(st, k, buf, sizeof(buf)); k++)
            printf("    %s\n", buf);
    }
    free(sites);
    summary_free(&s);
    cuheap_trace_free(&t);
    return 0;
}

/* `top --follow [--interval S] [-n N] [--count N] TRACE...` */
static int cmd_follow(int argc, char **argv)
{
    static const struct option opts[] = {{"follow", no_argument, NULL, 'F'},
                                         {"interval", required_argument, NULL, 'i'},
                                         {"count", required_argument, NULL, 'c'},
                                         {NULL, 0, NULL, 0}};
    struct live_options o = {.interval_s = 1.0, .nr_sites = 5, .tty = isatty(STDOUT_FILENO)};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'F':
            break;
        case 'n':
            if (parse_n(optarg, &o.nr_sites))
                return 2;
            break;
        case 'i':
            o.interval_s = strtod(optarg, &end);
            if (*end || !(o.interval_s >= 0.01 && o.interval_s <= 3600))
                return fail("top: --interval %s: expected seconds, 0.01 to 3600", optarg);
            break;
        case 'c':
            o.count = strtol(optarg, &end, 10);
            if (*end || o.count <= 0)
                return fail("top: --count %s: expected a positive number", optarg);
            break;
        default:
            return bad_option("top", argv);
        }
    }
    if (optind >= argc)
        return fail("top: --follow expects one or more traces (paths or quoted glob patterns)");
    return live_follow(argv + optind, (size_t)(argc - optind), &o, NULL);
}

/* CUHEAP_AUDIT's verdict and the driver operations no hook saw (src/cupti_audit.c), from a
 * second pass over the events: only for traces of audited runs, so a large ordinary trace is
 * read once. */
static void report_audit(const struct cuheap_trace *t)
{
    const char *audit =
        json_string_value(json_object_get(json_object_get(t->header, "config"), "CUHEAP_AUDIT"));
    if (!audit || !strcmp(audit, "0"))
        return;
    enum { NR_LISTED = 20 };
    char *listed[NR_LISTED];
    uint64_t counts[NR_LISTED], operations = 0, missed = 0;
    size_t nr_missed = 0;
    bool verdict = false;
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it)) {
        if (e->type != CUHEAP_EV_AUDIT)
            continue;
        if (e->verdict) {
            verdict = true;
            operations = e->aux;
            missed = e->aux2;
        } else if (nr_missed < NR_LISTED) {
            listed[nr_missed] = strdup(e->label ? e->label : "?");
            counts[nr_missed++] = e->aux2;
        } else {
            nr_missed++;
        }
    }
    cuheap_trace_iter_end(&it);
    if (verdict && !missed)
        printf("\naudit: %" PRIu64 " driver operations, all seen\n", operations);
    else if (verdict)
        printf("\naudit: %" PRIu64 " driver operations, %" PRIu64 " not seen by cuheap:\n",
               operations, missed);
    else
        printf("\naudit: no verdict (the run did not reach its exit)%s\n",
               nr_missed ? "; not seen by cuheap so far:" : "");
    for (size_t i = 0; i < nr_missed && i < NR_LISTED; i++) {
        printf("  %s", listed[i] ? listed[i] : "?");
        if (counts[i] > 1)
            printf(" x%" PRIu64, counts[i]);
        printf("\n");
        free(listed[i]);
    }
    if (nr_missed > NR_LISTED)
        printf("  ... and %zu more in the trace\n", nr_missed - NR_LISTED);
}

/* For the commands that take no option: an argument that looks like one is named as an
 * unknown option, not opened as a trace ("--" ends the options, for a file named "-x").
 * Returns the index of the first trace, or -1 after saying what was wrong. */
static int no_options(const char *cmd, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            return i + 1;
        if (argv[i][0] == '-' && argv[i][1])
            return fail("%s: unknown option %s (see 'cuheap help %s')", cmd, argv[i], cmd), -1;
    }
    return 1;
}

static int cmd_report(int argc, char **argv)
{
    int first = no_options("report", argc, argv);
    if (first < 0)
        return 2;
    if (first >= argc)
        return fail("report: expected one or more trace files");
    struct ranks rk = {0};
    for (int i = first; i < argc; i++) {
        struct cuheap_trace t;
        struct trace_summary s;
        if (load_summarized(argv[i], &t, &s)) {
            ranks_free(&rk);
            return 2;
        }
        report_one(&t, &s);
        report_audit(&t);
        ranks_add(&rk, &t, &s);
        summary_free(&s);
        cuheap_trace_free(&t);
        if (i + 1 < argc)
            printf("\n");
    }
    ranks_print(stdout, &rk); /* several ranks: which stands out, and where */
    ranks_free(&rk);
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

/* Load every trace named from argv[first] on; on failure, frees what was loaded and returns
 * NULL (the reason already said). */
static struct cuheap_trace *load_all(char **argv, int first, int argc, const char *name)
{
    size_t nr = (size_t)(argc - first);
    struct cuheap_trace *ts = calloc(nr, sizeof(*ts));
    if (!ts)
        return fail("%s: out of memory", name), NULL;
    for (size_t i = 0; i < nr; i++)
        if (load(argv[first + (int)i], &ts[i])) {
            while (i-- > 0)
                cuheap_trace_free(&ts[i]);
            free(ts);
            return NULL;
        }
    return ts;
}

static void free_all(struct cuheap_trace *ts, size_t nr)
{
    for (size_t i = 0; i < nr; i++)
        cuheap_trace_free(&ts[i]);
    free(ts);
}

/* Before a trace is read: its start (header) and, from its footer, the time of its end and
 * whether it holds events. False when the footer is not there (a run that did not finish)
 * or the file is not readable (the read says why). */
static bool peek_span(const char *path, uint64_t *ret_start, uint64_t *ret_last, bool *ret_any)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char *line = NULL, tail[4096];
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, f);
    json_t *h = n > 0 ? json_loadb(line, (size_t)n, 0, NULL) : NULL;
    free(line);
    json_t *foot = NULL;
    struct stat st;
    if (h && !fstat(fileno(f), &st) && st.st_size > 0) {
        off_t from =
            st.st_size > (off_t)sizeof(tail) - 1 ? st.st_size - (off_t)sizeof(tail) + 1 : 0;
        size_t got = fseeko(f, from, SEEK_SET) ? 0 : fread(tail, 1, sizeof(tail) - 1, f);
        while (got && tail[got - 1] == '\n')
            got--;
        tail[got] = 0;
        char *nl = strrchr(tail, '\n');
        if (nl)
            foot = json_loads(nl + 1, 0, NULL);
    }
    fclose(f);
    const char *type = json_string_value(json_object_get(foot, "type"));
    bool ok = json_is_integer(json_object_get(h, "start_unix_ns")) && type &&
              !strcmp(type, "footer") && json_is_integer(json_object_get(foot, "t"));
    if (ok) {
        *ret_start = (uint64_t)json_integer_value(json_object_get(h, "start_unix_ns"));
        *ret_last = (uint64_t)json_integer_value(json_object_get(foot, "t"));
        *ret_any = json_integer_value(json_object_get(foot, "events")) > 0;
    }
    json_decref(h);
    json_decref(foot);
    return ok;
}

/* `html [-o OUT] TRACE...`: several traces (ranks) into one file, stdout unless -o. */
static int cmd_html(int argc, char **argv)
{
    const char *out_path = NULL;
    int c;
    optind = 1;
    while ((c = getopt(argc, argv, "o:")) != -1) {
        if (c != 'o')
            return bad_option("html", argv);
        out_path = optarg;
    }
    if (optind >= argc)
        return fail("html: expected one or more trace files");
    size_t nr = (size_t)(argc - optind), loaded = 0;
    struct cuheap_trace *ts = calloc(nr, sizeof(*ts));
    struct trace_summary *sums = calloc(nr, sizeof(*sums));
    struct html_chart **charts = calloc(nr, sizeof(*charts));
    uint64_t *start = calloc(nr, sizeof(*start)), *last = calloc(nr, sizeof(*last));
    uint64_t *offsets = calloc(nr, sizeof(*offsets)), *est_offsets = calloc(nr, sizeof(*offsets));
    bool *any = calloc(nr, sizeof(*any)), *visited = calloc(nr, sizeof(*visited));
    int r = 0;
    if (!ts || !sums || !charts || !start || !last || !offsets || !est_offsets || !any ||
        !visited) {
        r = fail("html: out of memory");
        goto out;
    }
    /* The charts are drawn during the one read of each trace, on a time axis taken from
     * the footers; where that axis turns out wrong (no footer, an event past it), or a trace
     * could not be charted in one read, it is charted again in a second read. */
    bool est_ok = true, est_apart = false;
    uint64_t est_end = 1;
    for (size_t i = 0; i < nr && est_ok; i++)
        est_ok = peek_span(argv[optind + (int)i], &start[i], &last[i], &any[i]);
    if (est_ok)
        est_apart = html_axis(nr, start, last, any, est_offsets, &est_end);
    for (; loaded < nr; loaded++) {
        charts[loaded] =
            est_ok ? html_chart_begin(&sums[loaded], est_offsets[loaded], est_end) : NULL;
        if (load_visiting(argv[optind + (int)loaded], &ts[loaded], &sums[loaded],
                          charts[loaded] ? html_chart_event : NULL, charts[loaded],
                          &visited[loaded]))
            break;
    }
    if (loaded < nr) {
        r = 2;
        goto out;
    }
    for (size_t i = 0; i < nr; i++) {
        start[i] = (uint64_t)json_integer_value(json_object_get(ts[i].header, "start_unix_ns"));
        last[i] = ts[i].max_t;
        any[i] = ts[i].nr_events > 0;
    }
    uint64_t end;
    bool apart = html_axis(nr, start, last, any, offsets, &end);
    bool same_axis = est_ok && apart == est_apart && end <= est_end;
    for (size_t i = 0; i < nr && same_axis; i++)
        same_axis = offsets[i] == est_offsets[i];
    if (same_axis)
        end = est_end; /* the footer's time: the run went on a little after its last event */
    for (size_t i = 0; i < nr; i++) {
        if (same_axis && visited[i] && charts[i] && !html_chart_end(charts[i]))
            continue;
        html_chart_free(charts[i]);
        charts[i] = html_chart_again(&ts[i], &sums[i], offsets[i], end);
        if (!charts[i]) {
            r = fail("html: out of memory");
            goto out;
        }
    }
    FILE *f = open_out(out_path);
    if (!f) {
        r = 2;
        goto out;
    }
    r = export_html(ts, sums, charts, nr, end, apart, f);
    int closed = close_out(f, out_path);
    r = r ? fail("html: out of memory") : closed;
out:
    for (size_t i = 0; i < loaded; i++) {
        summary_free(&sums[i]);
        cuheap_trace_free(&ts[i]);
    }
    for (size_t i = 0; charts && i < nr; i++)
        html_chart_free(charts[i]);
    free(charts);
    free(start);
    free(last);
    free(offsets);
    free(est_offsets);
    free(any);
    free(visited);
    free(sums);
    free(ts);
    return r;
}

static int parse_seconds(const char *s, const char *what, uint64_t *ret)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0) || v > 1e9)
        return fail("chrome: %s %s: expected seconds (0 or more)", what, s);
    *ret = (uint64_t)(v * 1e9);
    return 0;
}

/* The latest event of any of the traces, on the time axis export_chrome() puts them on (from
 * the earliest start). */
static uint64_t traces_end(const struct cuheap_trace *ts, size_t nr)
{
    uint64_t t0 = UINT64_MAX, end = 0;
    for (size_t i = 0; i < nr; i++) {
        uint64_t s = (uint64_t)json_integer_value(json_object_get(ts[i].header, "start_unix_ns"));
        t0 = s < t0 ? s : t0;
    }
    for (size_t i = 0; i < nr; i++) {
        uint64_t s = (uint64_t)json_integer_value(json_object_get(ts[i].header, "start_unix_ns"));
        end = s - t0 + ts[i].max_t > end ? s - t0 + ts[i].max_t : end;
    }
    return end;
}

/* The value given to a long option, as the user wrote it ("--from 100" or "--from=100"). */
static const char *argv_value(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    const char *v = "?";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name) && i + 1 < argc)
            v = argv[i + 1];
        else if (!strncmp(argv[i], name, n) && argv[i][n] == '=')
            v = argv[i] + n + 1;
    return v;
}

static int cmd_chrome(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"from", required_argument, NULL, 'F'},
                                         {"to", required_argument, NULL, 'T'},
                                         {NULL, 0, NULL, 0}};
    const char *out_path = NULL;
    uint64_t from = 0, to = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        if (c == 'o')
            out_path = optarg;
        else if (c == 'F' && parse_seconds(optarg, "--from", &from))
            return 2;
        else if (c == 'T' && parse_seconds(optarg, "--to", &to))
            return 2;
        else if (c != 'F' && c != 'T')
            return bad_option("chrome", argv);
    }
    if (optind >= argc)
        return fail("chrome: expected one or more trace files");
    if (to && to <= from)
        return fail("chrome: --to must come after --from");
    size_t nr = (size_t)(argc - optind);
    struct cuheap_trace *ts = load_all(argv, optind, argc, "chrome");
    if (ts && from && from > traces_end(ts, nr)) {
        fail("chrome: --from %s s is past the end of the trace%s (%.6f s): the window holds "
             "nothing",
             argv_value(argc, argv, "--from"), nr > 1 ? "s" : "", (double)traces_end(ts, nr) / 1e9);
        free_all(ts, nr);
        return 2;
    }
    FILE *f = ts ? open_out(out_path) : NULL;
    int r = f ? export_chrome(ts, nr, from, to, f) : 0;
    if (ts)
        free_all(ts, nr);
    if (!f)
        return 2;
    int closed = close_out(f, out_path);
    return r ? fail("chrome: out of memory") : closed;
}

static int cmd_folded(int argc, char **argv)
{
    static const struct option opts[] = {{"by", required_argument, NULL, 'b'}, {NULL, 0, NULL, 0}};
    enum site_measure m = SITES_AT_PEAK;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if (c != 'b' || parse_by(optarg, &m))
            return c == 'b' ? 2 : bad_option("folded", argv);
    if (optind != argc - 1)
        return fail("folded: expected one trace file");
    struct cuheap_trace t;
    struct trace_summary s;
    if (load_summarized(argv[optind], &t, &s))
        return 2;
    export_folded(&t, &s, m, stdout);
    summary_free(&s);
    cuheap_trace_free(&t);
    return close_out(stdout, "-");
}

static int cmd_memviz(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"max-entries", required_argument, NULL, 'm'},
                                         {"pool-view", no_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    const char *out_path = NULL;
    bool pool_view = false;
    size_t max_entries = 100000; /* PyTorch's default for _record_memory_history */
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        if (c == 'o') {
            out_path = optarg;
        } else if (c == 'm') {
            char *end;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (*end || !*optarg || optarg[0] == '-')
                return fail("memviz: --max-entries %s: expected a number (0: all)", optarg);
            max_entries = (size_t)v;
        } else if (c == 'p') {
            pool_view = true;
        } else {
            return bad_option("memviz", argv);
        }
    }
    if (optind != argc - 1)
        return fail("memviz: expected one trace file");
    if (!out_path && isatty(STDOUT_FILENO))
        return fail("memviz: the output is binary; give -o FILE");
    struct cuheap_trace t;
    if (load(argv[optind], &t))
        return 2;
    FILE *f = open_out(out_path);
    if (!f) {
        cuheap_trace_free(&t);
        return 2;
    }
    export_memviz(&t, max_entries, pool_view, f);
    cuheap_trace_free(&t);
    return close_out(f, out_path);
}

static int cmd_diff(int argc, char **argv)
{
    size_t n = 20;
    int c;
    optind = 1;
    while ((c = getopt(argc, argv, "n:")) != -1)
        if (c != 'n' || parse_n(optarg, &n))
            return c == 'n' ? 2 : bad_option("diff", argv);
    if (argc - optind != 2)
        return fail("diff: expected two trace files (cuheap diff A B)");
    struct cuheap_trace a, b;
    struct trace_summary s[2]; /* taken while each trace is read */
    if (load_summarized(argv[optind], &a, &s[0]))
        return 2;
    if (load_summarized(argv[optind + 1], &b, &s[1])) {
        summary_free(&s[0]);
        cuheap_trace_free(&a);
        return 2;
    }
    diff_traces(&a, &b, s, n);
    cuheap_trace_free(&a);
    cuheap_trace_free(&b);
    return close_out(stdout, "-");
}

static int cmd_check(int argc, char **argv)
{
    int first = no_options("check", argc, argv);
    if (first < 0)
        return 2;
    if (first >= argc)
        return fail("check: expected one or more trace files");
    int status = 0;
    for (int i = first; i < argc; i++) {
        struct cuheap_trace t;
        char err[600], why[600];
        if (cuheap_trace_open(argv[i], &t, err, sizeof(err))) {
            fail("%s", err);
            status = 2;
            continue;
        }
        /* one line a trace: its verdict first, what was read, then what was wrong */
        damage(&t, why, sizeof(why));
        const char *verdict = *why ? "damaged" : t.truncated ? "incomplete" : "ok";
        char w1[64], w2[64], w3[64];
        printf("%s: %s, %s, %s, %s", argv[i], verdict,
               count_of(t.nr_events, "event", "events", w1, sizeof(w1)),
               count_of(t.nr_stacks, "stack", "stacks", w2, sizeof(w2)),
               count_of(t.nr_devices, "device", "devices", w3, sizeof(w3)));
        if (*why)
            printf("; %s", why);
        if (t.truncated)
            printf("; %s", t.footer ? "the last line is cut off"
                                    : "no footer: the run was killed or is still running");
        printf("\n");
        if ((*why || t.truncated) && status == 0)
            status = 1;
        cuheap_trace_free(&t);
    }
    return status;
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
    opterr = 0;
    cuheap_trace_set_progress(show_progress);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("cuheap %s\n", CUHEAP_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        if (argc < 2) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
            return command_help(find_command("help"));
        const struct command *c = find_command(argv[1]);
        if (!c || argc > 2)
            return fail("help %s: no such command (commands: run report top leaks chrome "
                        "folded memviz html diff check help)",
                        argv[1]);
        return command_help(c);
    }
    const struct command *c = find_command(cmd);
    if (!c)
        return fail("unknown command '%s' (commands: run report top leaks chrome folded memviz "
                    "html diff check help)",
                    cmd);
    /* COMMAND --help everywhere; run reads its own options only up to PROGRAM */
    if (strcmp(cmd, "run"))
        for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
                return command_help(c);
    if (!strcmp(cmd, "run"))
        return cmd_run(argc, argv);
    if (!strcmp(cmd, "report"))
        return cmd_report(argc, argv);
    if (!strcmp(cmd, "top")) {
        for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
            if (!strcmp(argv[i], "--follow"))
                return cmd_follow(argc, argv);
        return cmd_sites(argc, argv, false);
    }
    if (!strcmp(cmd, "leaks"))
        return cmd_sites(argc, argv, true);
    if (!strcmp(cmd, "chrome"))
        return cmd_chrome(argc, argv);
    if (!strcmp(cmd, "folded"))
        return cmd_folded(argc, argv);
    if (!strcmp(cmd, "memviz"))
        return cmd_memviz(argc, argv);
    if (!strcmp(cmd, "check"))
        return cmd_check(argc, argv);
    if (!strcmp(cmd, "diff"))
        return cmd_diff(argc, argv);
    return cmd_html(argc, argv);
}
