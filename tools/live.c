/* SPDX-License-Identifier: MIT */
/*
 * Following traces while they grow (live.h). Each trace is a tail (tracereader.h) whose events
 * go straight into an incremental summary (analysis.h's summarize_event), the replay `report`
 * does, so the figures are report's figures for the events so far. A refresh reads what was
 * appended, draws one table (every trace, the one holding the most first, ended ones last),
 * and waits: on a terminal for a key (q quits) or the interval, on a pipe for the interval.
 * The terminal is put back as it was on every way out (q, Ctrl-C, SIGTERM, SIGHUP, the end).
 */
#include "live.h"

#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "analysis.h"
#include "event.h"
#include "symbolize.h"
#include "tracereader.h"

#define NR_SITES_NAMED 64 /* sites named per GPU each refresh, largest first */

struct followed {
    struct cuheap_trace_tail tail;
    struct trace_summary sum;
    uint64_t driver_free[CUHEAP_TRACE_NR_MAX_DEVICES]; /* by ordinal: the latest the trace said */
    bool has_free[CUHEAP_TRACE_NR_MAX_DEVICES];
    uint64_t nr_events;
    size_t nr_symbolized; /* stacks named as report names them */
    bool failed;          /* err says why; never read again */
    char err[600];
};

struct follower {
    struct followed **traces;
    size_t nr, cap;
    const struct live_options *o;
    char **patterns;
    size_t nr_patterns;
};

static volatile sig_atomic_t quit_signal;

static void on_signal(int sig)
{
    quit_signal = sig;
}

/* ---- the terminal ---- */

static struct termios saved_termios;
static bool raw_mode;

static void restore_terminal(void)
{
    if (!raw_mode)
        return;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_termios);
    raw_mode = false;
    static const char show_cursor[] = "\x1b[?25h";
    ssize_t w = write(STDOUT_FILENO, show_cursor, sizeof(show_cursor) - 1);
    (void)w;
}

/* Keys one at a time, unechoed; Ctrl-C still a signal (ISIG stays), handled as a quit. */
static void enter_raw_mode(void)
{
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_termios))
        return;
    struct termios raw = saved_termios;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw))
        return;
    raw_mode = true;
    atexit(restore_terminal);
}

/* ---- traces ---- */

static struct followed *find(struct follower *fw, const char *path)
{
    for (size_t i = 0; i < fw->nr; i++)
        if (!strcmp(fw->traces[i]->tail.t.path, path))
            return fw->traces[i];
    return NULL;
}

static void add_trace(struct follower *fw, const char *path)
{
    if (find(fw, path))
        return;
    if (fw->o->since_s) { /* run --live: only what this run writes */
        struct stat st;
        if (stat(path, &st) || st.st_mtime < fw->o->since_s)
            return;
    }
    if (fw->nr == fw->cap) {
        size_t cap = fw->cap ? fw->cap * 2 : 8;
        struct followed **grown = realloc(fw->traces, cap * sizeof(*grown));
        if (!grown)
            return;
        fw->traces = grown;
        fw->cap = cap;
    }
    struct followed *f = calloc(1, sizeof(*f));
    if (!f)
        return;
    if (cuheap_trace_tail_open(path, &f->tail)) {
        free(f);
        return;
    }
    summarize_begin(&f->sum);
    fw->traces[fw->nr++] = f;
}

static bool has_glob(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

/* The patterns looked up again: a rank that started since joins. A plain path is followed
 * whether or not it is there yet. */
static void lookup(struct follower *fw)
{
    for (size_t i = 0; i < fw->nr_patterns; i++) {
        const char *p = fw->patterns[i];
        struct stat st;
        if (!has_glob(p) || !stat(p, &st)) {
            if (!fw->o->since_s || !stat(p, &st))
                add_trace(fw, p);
            continue;
        }
        glob_t g;
        if (glob(p, 0, NULL, &g) == 0)
            for (size_t k = 0; k < g.gl_pathc; k++)
                add_trace(fw, g.gl_pathv[k]);
        globfree(&g);
    }
}

static void visit(const struct cuheap_trace_event *e, void *ctx)
{
    struct followed *f = ctx;
    f->nr_events++;
    summarize_event(&f->sum, e);
    if ((e->type == CUHEAP_EV_OOM || e->type == CUHEAP_EV_LIMIT) && e->device >= 0 &&
        e->device < CUHEAP_TRACE_NR_MAX_DEVICES) {
        f->driver_free[e->device] = e->aux;
        f->has_free[e->device] = true;
    }
}

/* Read what every trace appended; true when anything changed. */
static bool poll_all(struct follower *fw)
{
    bool changed = false;
    for (size_t i = 0; i < fw->nr; i++) {
        struct followed *f = fw->traces[i];
        if (f->failed)
            continue;
        int r = cuheap_trace_tail_poll(&f->tail, visit, f, f->err, sizeof(f->err));
        if (r < 0)
            f->failed = true;
        changed |= r != 0;
        for (; f->nr_symbolized < f->tail.t.nr_stacks; f->nr_symbolized++)
            symbolize_stack(&f->tail.t.stacks[f->nr_symbolized]);
    }
    return changed;
}

/* ---- the table ---- */

static uint64_t live_of(const struct followed *f)
{
    uint64_t n = 0;
    for (unsigned d = 0; d < f->sum.nr_dev; d++)
        n += f->sum.dev[d].live;
    return n;
}

/* Running traces holding the most first, then the ended, then those that could not be read. */
static int rank_order(const struct followed *f)
{
    return f->failed ? 2 : f->tail.ended ? 1 : 0;
}

static int cmp_followed(const void *a, const void *b)
{
    const struct followed *x = *(struct followed *const *)a, *y = *(struct followed *const *)b;
    if (rank_order(x) != rank_order(y))
        return rank_order(x) - rank_order(y);
    uint64_t lx = live_of(x), ly = live_of(y);
    if (lx != ly)
        return lx > ly ? -1 : 1;
    if (x->tail.t.rank != y->tail.t.rank)
        return x->tail.t.rank < y->tail.t.rank ? -1 : 1;
    return strcmp(x->tail.t.path, y->tail.t.path);
}

struct named {
    char name[700];
    uint64_t bytes, count;
};

static int cmp_site_live(const void *a, const void *b)
{
    const struct site_acc *x = *(struct site_acc *const *)a, *y = *(struct site_acc *const *)b;
    if (x->live != y->live)
        return x->live > y->live ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static int cmp_named(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The call sites of a device holding the most now, named as `report` names them; sites
 * ending in the same line are one row. */
static void print_sites_now(FILE *out, struct followed *f, int device, size_t limit)
{
    const struct trace_summary *s = &f->sum;
    const struct site_acc **live = malloc(s->nr_sites * sizeof(*live) + 1);
    struct named *rows = calloc(NR_SITES_NAMED, sizeof(*rows));
    size_t nr = 0, nr_rows = 0;
    for (size_t i = 0; live && i < s->nr_sites; i++)
        if (s->sites[i].device == device && s->sites[i].live)
            live[nr++] = &s->sites[i];
    if (live && rows && nr) {
        qsort(live, nr, sizeof(*live), cmp_site_live);
        for (size_t i = 0; i < nr && i < NR_SITES_NAMED; i++) {
            char name[700];
            cuheap_trace_site(&f->tail.t, live[i]->stack, name, sizeof(name));
            size_t k = 0;
            while (k < nr_rows && strcmp(rows[k].name, name))
                k++;
            if (k == nr_rows)
                snprintf(rows[nr_rows++].name, sizeof(rows[0].name), "%s", name);
            rows[k].bytes += live[i]->live;
            rows[k].count += live[i]->nr_live;
        }
        qsort(rows, nr_rows, sizeof(*rows), cmp_named);
    }
    for (size_t i = 0; i < nr_rows && i < limit; i++) {
        char b[32];
        fprintf(out, "    %10s  %6" PRIu64 " %s  %s\n", human_bytes(rows[i].bytes, b, sizeof(b)),
                rows[i].count, rows[i].count == 1 ? "block " : "blocks", rows[i].name);
    }
    if (!nr_rows)
        fprintf(out, "    (nothing live)\n");
    free(live);
    free(rows);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* "rank 3", "pid 1234", or with column: only the rank's number ("-" without one) */
static void who(const struct followed *f, bool column, char *buf, size_t size)
{
    if (f->tail.t.rank >= 0)
        snprintf(buf, size, column ? "%ld" : "rank %ld", f->tail.t.rank);
    else if (f->tail.t.pid && !column)
        snprintf(buf, size, "pid %ld", f->tail.t.pid);
    else
        snprintf(buf, size, "-");
}

static void draw(struct follower *fw, FILE *out, double elapsed, const char *end_note)
{
    qsort(fw->traces, fw->nr, sizeof(*fw->traces), cmp_followed);
    time_t now = time(NULL);
    struct tm tm;
    char clock[16] = "";
    if (localtime_r(&now, &tm))
        strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
    size_t nr_running = 0;
    for (size_t i = 0; i < fw->nr; i++)
        nr_running += rank_order(fw->traces[i]) == 0 && fw->traces[i]->tail.fd >= 0;
    fprintf(out, "cuheap top --follow  %s  %.0f s  %zu trace%s, %zu being written%s%s\n", clock,
            elapsed, fw->nr, fw->nr == 1 ? "" : "s", nr_running, end_note ? "  " : "",
            end_note ? end_note : "");
    fprintf(out, "%-5s %-8s %3s %10s %10s %11s %10s %5s  %s\n", "RANK", "PID", "GPU", "LIVE",
            "HELD", "DRIVER FREE", "PEAK", "OOM", "TRACE");
    for (size_t i = 0; i < fw->nr; i++) {
        struct followed *f = fw->traces[i];
        char w[32], b1[32], b2[32], b3[32], b4[32];
        who(f, true, w, sizeof(w));
        const char *state = f->failed         ? ""
                            : f->tail.ended   ? "  (ended)"
                            : f->tail.fd < 0  ? "  (not there yet)"
                            : !f->tail.lineno ? "  (empty so far)"
                                              : "";
        if (f->failed) {
            fprintf(out, "%-5s %s\n", "-", f->err);
            continue;
        }
        if (!f->sum.nr_dev)
            fprintf(out, "%-5s %-8ld %3s %10s %10s %11s %10s %5s  %s%s\n", w, f->tail.t.pid, "-",
                    "-", "-", "-", "-", "-", base_name(f->tail.t.path), state);
        for (unsigned d = 0; d < f->sum.nr_dev; d++) {
            const struct device_summary *ds = &f->sum.dev[d];
            bool known = ds->device >= 0 && ds->device < CUHEAP_TRACE_NR_MAX_DEVICES &&
                         f->has_free[ds->device];
            uint64_t rec = cuheap_trace_recovered(&f->tail.t, ds->device);
            uint64_t real = ds->nr_ooms + ds->nr_limit;
            real -= rec < real ? rec : real;
            char ooms[32];
            if (rec)
                snprintf(ooms, sizeof(ooms), "%" PRIu64 "+%" PRIu64 "r", real, rec);
            else
                snprintf(ooms, sizeof(ooms), "%" PRIu64, real);
            fprintf(out, "%-5s %-8ld %3d %10s %10s %11s %10s %5s  %s%s\n", d ? "" : w,
                    f->tail.t.pid, ds->device, human_bytes(ds->live, b1, sizeof(b1)),
                    human_bytes(ds->reserved, b2, sizeof(b2)),
                    known ? human_bytes(f->driver_free[ds->device], b3, sizeof(b3)) : "-",
                    human_bytes(ds->peak_live, b4, sizeof(b4)), ooms, base_name(f->tail.t.path),
                    state);
        }
    }
    for (size_t i = 0; i < fw->nr; i++) {
        struct followed *f = fw->traces[i];
        if (f->failed)
            continue;
        char w[32];
        who(f, false, w, sizeof(w));
        for (unsigned d = 0; d < f->sum.nr_dev; d++) {
            fprintf(out, "\n%s GPU %d%s, live now by call site:\n", w, f->sum.dev[d].device,
                    f->tail.ended ? " (ended)" : "");
            print_sites_now(out, f, f->sum.dev[d].device, fw->o->nr_sites);
        }
    }
    if (!fw->nr)
        fprintf(out, "(no trace yet)\n");
}

/* On a terminal: the table cut to the window, so that a redraw never scrolls. */
static void show(const char *text, size_t len, bool tty)
{
    if (!tty) {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        return;
    }
    struct winsize ws = {0};
    unsigned rows = 24, cols = 80;
    if (!ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) && ws.ws_row && ws.ws_col) {
        rows = ws.ws_row;
        cols = ws.ws_col;
    }
    fputs("\x1b[?25l\x1b[H\x1b[2J", stdout);
    unsigned row = 0;
    const char *p = text, *end = text + len;
    while (p < end && row + 1 < rows) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        fwrite(p, 1, n < cols ? n : cols, stdout);
        fputs("\r\n", stdout);
        row++;
        p = nl ? nl + 1 : end;
    }
    fputs(p < end ? "... (more below: a larger window shows it)  q quits" : "q quits", stdout);
    fflush(stdout);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wait for the interval, or a key on a terminal. Returns true to quit. */
static bool wait_for(double seconds, bool tty)
{
    double until = now_s() + seconds;
    for (;;) {
        if (quit_signal)
            return true;
        double left = until - now_s();
        if (left <= 0)
            return false;
        /* keys only from a terminal in raw mode: stdin from /dev/null or a pipe is not one */
        bool keys = tty && raw_mode;
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        int r = poll(&p, keys ? 1 : 0, (int)(left * 1000) + 1);
        if (r > 0 && keys) {
            char c;
            ssize_t n = read(STDIN_FILENO, &c, 1);
            if (n == 1 && (c == 'q' || c == 'Q' || c == 3))
                return true;
            if (n == 0) /* the terminal went away */
                return true;
        }
    }
}

static void free_follower(struct follower *fw)
{
    for (size_t i = 0; i < fw->nr; i++) {
        summarize_end(&fw->traces[i]->sum);
        summary_free(&fw->traces[i]->sum);
        cuheap_trace_tail_close(&fw->traces[i]->tail);
        free(fw->traces[i]);
    }
    free(fw->traces);
}

int live_follow(char **patterns, size_t nr_patterns, const struct live_options *o, int *ret_status)
{
    struct follower fw = {.o = o, .patterns = patterns, .nr_patterns = nr_patterns};
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term, old_hup;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    if (o->tty)
        enter_raw_mode();
    double start = now_s();
    bool child_done = !o->child, drawn = false;
    int status = 0;
    char *text = NULL;
    size_t len = 0;
    for (long round = 0;; round++) {
        if (!child_done && waitpid(o->child, &status, WNOHANG) == o->child)
            child_done = true; /* its traces are whole: this read takes their ends */
        lookup(&fw);
        bool changed = poll_all(&fw);
        bool all_ended = fw.nr > 0;
        for (size_t i = 0; i < fw.nr; i++)
            all_ended &= fw.traces[i]->failed || fw.traces[i]->tail.ended;
        bool last =
            (o->count && round + 1 >= o->count) || (!o->tty && (o->child ? child_done : all_ended));
        const char *note = o->child && child_done ? "(the program ended)"
                           : all_ended            ? "(every trace ended)"
                                                  : NULL;
        if (changed || !drawn || last || o->tty) {
            FILE *m = open_memstream(&text, &len);
            if (m) {
                draw(&fw, m, now_s() - start, note);
                fclose(m);
                show(text, len, o->tty);
                free(text);
                text = NULL;
                drawn = true;
            }
        }
        if (last)
            break;
        if (wait_for(o->interval_s, o->tty))
            break;
    }
    int rc = 0;
    for (size_t i = 0; i < fw.nr; i++)
        rc = fw.traces[i]->failed ? 2 : rc;
    if (o->tty) {
        restore_terminal();
        fputs("\n", stdout);
        fflush(stdout);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    if (o->child && !child_done) {
        if (quit_signal == SIGTERM || quit_signal == SIGHUP)
            kill(o->child, quit_signal);
        else if (!quit_signal) /* q; a Ctrl-C reached the program too */
            fprintf(stderr, "cuheap: the view closed; the program runs on (pid %ld)\n",
                    (long)o->child);
        signal(SIGINT, SIG_IGN); /* the program has it too: its end is ours */
        while (waitpid(o->child, &status, 0) < 0 && errno == EINTR)
            ;
    }
    if (ret_status)
        *ret_status = status;
    free_follower(&fw);
    return rc;
}
