/* SPDX-License-Identifier: MIT */
/*
 * The recorder's trace file: its name (CUHEAP_OUTPUT with pid, rank and host put in, never a
 * FIFO or another's file: tracefile.c), its header line (process, clock, settings), flushing
 * and noticing write errors, and the footer that closes it. A trace that cannot be created or
 * written is said once on stderr; the program goes on and events are counted.
 *
 * Locking: io_lock held, or no writer thread yet (start, or a forked child's first event under
 * child_start_lock, recorder.c); nothing here is reached from a hook otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "recorder_internal.h"
#include "unwind.h"

/* The recorder's state, shared by its parts (recorder_internal.h): defined here, at the bottom
 * of the recorder, which the other parts call into and which calls into none of them. */
struct cuheap_recorder_state cuheap_recorder = {.io_lock = PTHREAD_MUTEX_INITIALIZER};

uint64_t cuheap_recorder_nr_dropped(void)
{
    uint64_t n =
        atomic_load(&cuheap_recorder.ring.nr_dropped) + atomic_load(&cuheap_recorder.nr_late);
    if (!atomic_load(&cuheap_recorder.accepting))
        n += cuheap_ring_nr_pushed(&cuheap_recorder.ring) -
             atomic_load(&cuheap_recorder.nr_consumed);
    return n;
}

uint64_t cuheap_recorder_nr_events(void)
{
    return atomic_load(&cuheap_recorder.nr_late) + cuheap_ring_nr_pushed(&cuheap_recorder.ring) +
           atomic_load(&cuheap_recorder.ring.nr_dropped);
}

void cuheap_recorder_put_line(json_t *obj)
{
    if (cuheap_recorder.out && !cuheap_recorder.write_failed) {
        json_dumpf(obj, cuheap_recorder.out, JSON_COMPACT);
        fputc('\n', cuheap_recorder.out);
    }
    json_decref(obj);
}

/* A JSON string of text from outside (a path, the command line, a label, a host name):
 * jansson refuses bytes that are not UTF-8, and a refused string used to empty a label or
 * lose the whole header, so those bytes become U+FFFD. Never NULL but on exhaustion. */
json_t *cuheap_recorder_json_text(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    char *clean = malloc(3 * strlen(s) + 1);
    if (!clean)
        return json_string("?");
    j = json_string(cuheap_utf8_clean(s, clean));
    free(clean);
    return j;
}

#define TRACE_FORMAT_VERSION 1

static char out_buf[1 << 20]; /* the trace's stdio buffer: written out every CUHEAP_FLUSH_MS */

static int find_exe_base(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    cuheap_recorder.exe_base = info->dlpi_addr; /* the first object reported is the program */
    return 1;
}

void cuheap_recorder_check_write(void)
{
    if (!cuheap_recorder.out || cuheap_recorder.write_failed)
        return;
    if (fflush(cuheap_recorder.out) != 0 || ferror(cuheap_recorder.out)) {
        cuheap_recorder.write_failed = true;
        cuheap_recorder.trace_errno = errno;
        cuheap_log("cannot write trace %s (%s); the program goes on, events are counted but "
                   "no longer written",
                   cuheap_recorder.out_path, strerror(errno));
        return;
    }
    cuheap_recorder.header_written = true;
}

static json_t *cmdline_json(void)
{
    json_t *a = json_array();
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (!f)
        return a;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n;) {
        json_array_append_new(a, cuheap_recorder_json_text(buf + i));
        i += strlen(buf + i) + 1;
    }
    return a;
}

static void config_item(const char *line, void *arg)
{
    const char *eq = strchr(line, '=');
    if (eq) {
        char key[64];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - line), line);
        json_object_set_new(arg, key, cuheap_recorder_json_text(eq + 1));
    }
}

/* secure_getenv: in a setuid program the environment belongs to whoever started it. */
static const char *rank_env(void)
{
    const char *r = secure_getenv("RANK");
    if (!r || !*r)
        r = secure_getenv("LOCAL_RANK");
    if (!r || !*r)
        r = secure_getenv("OMPI_COMM_WORLD_RANK");
    if (!r || !*r)
        r = secure_getenv("SLURM_PROCID");
    return r && *r ? r : NULL;
}

/* A value from the environment (rank, host name) as a piece of a file name: anything but
 * [A-Za-z0-9._-] becomes '_', and "." or ".." becomes "_", so RANK=../../x cannot move the
 * trace to another folder. */
static void name_part(const char *v, char *ret, size_t size)
{
    size_t n = 0;
    bool dots = true;
    for (; v[n] && n + 1 < size; n++) {
        char c = v[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        ret[n] = ok ? c : '_';
        dots = dots && c == '.';
    }
    ret[n] = 0;
    if (dots && n > 0 && n <= 2)
        snprintf(ret, size, "_");
}

/* The JSONL header line (format, process, clock, settings), built before the file exists. */
static json_t *trace_header(const char *host, const char *rank, const struct timespec *real)
{
    ssize_t n =
        readlink("/proc/self/exe", cuheap_recorder.exe_path, sizeof(cuheap_recorder.exe_path) - 1);
    cuheap_recorder.exe_path[n > 0 ? n : 0] = 0;
    dl_iterate_phdr(find_exe_base, NULL);
    json_t *conf = json_object();
    cuheap_config_dump(cuheap_recorder.cfg, config_item, conf);
    json_t *h = json_pack(
        "{s:s, s:s, s:i, s:I, s:I, s:o, s:o, s:o, s:I, s:s, s:s, s:b, s:o}", "type", "header",
        "format", "cuheap-trace", "version", TRACE_FORMAT_VERSION, "pid", (json_int_t)getpid(),
        "ppid", (json_int_t)getppid(), "host", cuheap_recorder_json_text(host), "exe",
        cuheap_recorder_json_text(cuheap_recorder.exe_path), "cmdline", cmdline_json(),
        "start_unix_ns",
        (json_int_t)((uint64_t)real->tv_sec * 1000000000ull + (uint64_t)real->tv_nsec), "clock",
        "CLOCK_MONOTONIC, t in ns since start", "unwinder",
        cuheap_unwinder_name(cuheap_recorder.unwinder), "python", cuheap_recorder.python, "config",
        conf);
    if (h && rank)
        json_object_set_new(h, "rank", json_integer(atoll(rank)));
    if (h)
        json_object_set_new(h, "stack_depth", json_integer(cuheap_recorder.stack_depth));
    return h;
}

/* The default name: the rank's when there is one, the extension of the format. */
static const char *default_name(bool ranked)
{
    bool as_chrome = cuheap_recorder.cfg->format == CUHEAP_FORMAT_CHROME;
    if (ranked)
        return as_chrome ? "cuheap-r%r-%p.trace.json" : "cuheap-r%r-%p.jsonl";
    return as_chrome ? "cuheap-%p.trace.json" : "cuheap-%p.jsonl";
}

/* Open the trace for this process and write its header (io_lock held or single-threaded).
 * The header is built first and written the moment the file exists: a process killed in
 * between leaves an empty file, which `cuheap check` cannot call a trace (CI's stress run saw
 * one, killed 60 ms in on a loaded machine, while the header was being put together). */
void cuheap_recorder_open_trace(void)
{
    char host[128] = "", host_part[128], rank_part[64];
    gethostname(host, sizeof(host) - 1);
    const char *rank = rank_env();
    name_part(host, host_part, sizeof(host_part));
    if (rank)
        name_part(rank, rank_part, sizeof(rank_part));
    const char *tmpl = cuheap_recorder.cfg->output;
    if (!strcmp(tmpl, "cuheap-%p.jsonl"))
        tmpl = default_name(rank != NULL);
    cuheap_recorder.name_too_long =
        cuheap_expand_path(tmpl, cuheap_recorder.out_path, sizeof(cuheap_recorder.out_path),
                           (long)getpid(), rank ? rank_part : NULL, host_part) != 0;
    if (cuheap_recorder.name_too_long) {
        tmpl = default_name(rank != NULL);
        cuheap_expand_path(tmpl, cuheap_recorder.out_path, sizeof(cuheap_recorder.out_path),
                           (long)getpid(), rank ? rank_part : NULL, host_part);
        cuheap_log("CUHEAP_OUTPUT=\"%s\" expands to more than %d bytes; the trace goes to %s "
                   "instead",
                   cuheap_recorder.cfg->output, CUHEAP_PATH_MAX - 1, cuheap_recorder.out_path);
    }
    cuheap_recorder.write_failed = cuheap_recorder.open_failed = cuheap_recorder.header_written =
        false;
    cuheap_recorder.trace_errno = 0;
    cuheap_recorder.nr_written = 0;
    cuheap_recorder.t0_ns = cuheap_recorder_now();
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    json_t *header = cuheap_recorder.cfg->format == CUHEAP_FORMAT_CHROME
                         ? NULL
                         : trace_header(host, rank, &real);
    int fd = cuheap_tracefile_create(cuheap_recorder.out_path, sizeof(cuheap_recorder.out_path),
                                     cuheap_recorder.cfg->output_mode, &cuheap_recorder.refused);
    if (fd >= 0 && cuheap_recorder.refused.path[0])
        cuheap_log("%s is %s; the trace goes to %s", cuheap_recorder.refused.path,
                   cuheap_recorder.refused.why, cuheap_recorder.out_path);
    if (fd < 0)
        errno = -fd;
    cuheap_recorder.out = fd >= 0 ? cuheap_tracefile_stream(fd) : NULL;
    if (fd >= 0 && !cuheap_recorder.out)
        close(fd);
    if (!cuheap_recorder.out) {
        cuheap_recorder.open_failed = true;
        cuheap_recorder.trace_errno = errno;
        json_decref(header);
        if (fd < 0 && cuheap_recorder.refused.path[0])
            cuheap_log("%s is %s; the program goes on without a trace file (set CUHEAP_OUTPUT "
                       "to a new file's path)",
                       cuheap_recorder.refused.path, cuheap_recorder.refused.why);
        else
            cuheap_log("cannot open trace %s: %s; the program goes on without a trace file "
                       "(set CUHEAP_OUTPUT to a writable path)",
                       cuheap_recorder.out_path, strerror(errno));
        return;
    }
    /* A buffer of our own: given NULL, glibc ignores the size and uses 4 KiB, which turns
     * the writer's batches into a write(2) every few events. Static, so the hook path that
     * opens a child's trace does not allocate it. */
    setvbuf(cuheap_recorder.out, out_buf, _IOFBF, sizeof(out_buf));
    if (cuheap_recorder.cfg->format == CUHEAP_FORMAT_CHROME) {
        char name[160];
        snprintf(name, sizeof(name), "cuheap pid %ld%s%s", (long)getpid(), rank ? " rank " : "",
                 rank ? rank_part : "");
        cuheap_chrome_begin(&cuheap_recorder.chrome, cuheap_recorder.out, (long)getpid(), name);
        cuheap_recorder_check_write();
        return;
    }
    cuheap_recorder_put_line(header);
    cuheap_recorder_check_write(); /* the header on disk: a trace exists from here on */
}

void cuheap_recorder_close_trace(void)
{
    if (!cuheap_recorder.out)
        return;
    if (cuheap_recorder.cfg->format == CUHEAP_FORMAT_CHROME) {
        cuheap_chrome_end(&cuheap_recorder.chrome);
    } else {
        cuheap_recorder_put_line(
            json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "type", "footer", "events",
                      (json_int_t)cuheap_recorder_nr_events(), "written",
                      (json_int_t)cuheap_recorder.nr_written, "dropped",
                      (json_int_t)cuheap_recorder_nr_dropped(), "stacks",
                      (json_int_t)cuheap_recorder.stacks.nr_stacks, "t",
                      (json_int_t)(cuheap_recorder_now() - cuheap_recorder.t0_ns)));
    }
    cuheap_recorder_check_write();
    fclose(cuheap_recorder.out);
    cuheap_recorder.out = NULL;
}
