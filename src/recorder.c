/* SPDX-License-Identifier: MIT */
/*
 * The recorder (see recorder.h). Hook side: claim a ring slot, fill it, commit. Writer side:
 * a thread that owns the trace file, the stack table and the symbol lookups.
 *
 * Event lines are formatted with snprintf: they hold only numbers and fixed names, and the
 * writer must keep up with millions of events a second. Everything that carries outside
 * strings (header, stacks, marks, footer) goes through jansson, which escapes it correctly.
 *
 * Locking: io_lock is held by the writer thread while it touches the file or the stack table;
 * capture_lock is read-held by a hooked thread while it takes a stack. Fork takes both (and
 * child_start_lock) so the child inherits them, the unwinder and the trace consistent.
 */
#include "recorder.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "chrome.h"
#include "cupti_audit.h"
#include "log.h"
#include "pyframes.h"
#include "ring.h"
#include "stacktab.h"
#include "tracefile.h"
#include "unwind.h"

#define TRACE_FORMAT_VERSION 1
#define NR_MAX_DEVICES       64
#define CHROME_STACK_FRAMES  16

struct device_info {
    _Atomic int state; /* 0 unknown, 1 filled (to announce), 2 announced */
    char name[128];
    uint64_t total;
};

static const struct cuheap_config *cfg;
static struct cuheap_ring ring;
atomic_bool cuheap_recorder_on;
/* Events go into the ring. Cleared at stop while cuheap_recorder_on stays set, so what threads
 * still running at exit record is counted (nr_late) instead of vanishing unseen. */
static atomic_bool accepting;
/* cuheap_set_recording(0): events other than marks stop at the door, before their stacks. */
static atomic_bool paused;
static _Atomic uint64_t nr_late;     /* events made after recording stopped */
static _Atomic uint64_t nr_consumed; /* events the writer took from the ring */
static atomic_bool stopping;
static bool writer_running;
static pthread_t writer;
static pthread_mutex_t io_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static char out_path[CUHEAP_PATH_MAX];
static struct cuheap_trace_refusal refused; /* what stood at the trace's name, if anything */
static bool name_too_long;                  /* CUHEAP_OUTPUT expanded past CUHEAP_PATH_MAX */
static char out_buf[1 << 20]; /* the trace's stdio buffer: written out every CUHEAP_FLUSH_MS */
static bool write_failed;     /* writing stopped on an error (trace_errno) */
static bool open_failed;      /* the trace could not be created (trace_errno) */
static bool header_written;   /* the header reached the file: there is a trace to read */
static int trace_errno;
static struct cuheap_stacktab stacks;
static struct cuheap_chrome chrome;
static uint64_t t0_ns;
static enum cuheap_unwinder unwinder;
static unsigned stack_depth; /* native frames per event in this process */
static bool python;
static struct device_info devices[NR_MAX_DEVICES];
static _Atomic uint64_t nr_events;
static uint64_t nr_written;
static __thread pid_t tls_tid __attribute__((tls_model("initial-exec")));

/* CUHEAP_RECORD_TIMING: where an event's time goes. Hook side: all threads add to these
 * (relaxed atomics, so only when timing). Writer side: the writer thread alone. */
static bool timing;
static struct {
    _Atomic uint64_t nr_events;    /* events timed on the hook side */
    _Atomic uint64_t ring_ns;      /* claiming, filling and committing a slot */
    _Atomic uint64_t nr_native;    /* events with a native stack walked */
    _Atomic uint64_t unwind_ns;    /* in cuheap_unwind_capture() */
    _Atomic uint64_t nr_frames;    /* native frames kept */
    _Atomic uint64_t nr_slow;      /* walks over 2 us (the unwinder's slow path?) */
    _Atomic uint64_t nr_python;    /* events whose Python frames were looked for */
    _Atomic uint64_t python_ns;    /* in cuheap_py_capture() */
    _Atomic uint64_t nr_py_frames; /* Python frames kept */
    uint64_t nr_written;           /* writer: events taken from the ring */
    uint64_t intern_ns;            /* writer: cuheap_stacktab_intern() */
    uint64_t write_ns;             /* writer: the rest of write_event() */
    uint64_t writer_cpu_ns;        /* writer thread's CPU time, read when it ends */
    uint64_t wall_ns;              /* recording's wall time, at stop */
    uint64_t clock_ns;             /* one clock read, measured at start: taken off each interval */
} tm;

static void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pid_t current_tid(void)
{
    if (!tls_tid)
        tls_tid = (pid_t)syscall(SYS_gettid);
    return tls_tid;
}

/* ---- hook side ---- */

/* A child after fork opens its trace with its first event, not at fork: DataLoader-style
 * workers that never use CUDA leave no file. */
static atomic_bool child_pending;
static pthread_mutex_t child_start_lock = PTHREAD_MUTEX_INITIALIZER;

/* Stacks are taken on the hooked threads, inside libunwind (or libgcc) and the Python frame
 * tables, whose locks nothing resets at fork: a child forked while another thread was in
 * the middle of a walk inherited libunwind's cache lock held and hung at its own first
 * stack (stress fork-streams: 1 child in a few thousand). A walk holds capture_lock to read;
 * fork's prepare handler takes it to write, so no walk is in progress when the child is
 * made. Writers first, or walks on many threads could keep a fork waiting for good; a
 * thread never walks twice at once (a hook reached from a signal handler inside a hook goes
 * straight to the driver, cuheap_busy), so a walk never waits for itself. */
static pthread_rwlock_t capture_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static bool start_writer(void);
static void open_trace(void);
static void close_trace(void);

static void child_start(void)
{
    /* Reached from a hook, a mark or an NVTX callback (cuheap_busy set): a signal handler's
     * hook on this thread goes to the driver and never waits for child_start_lock. */
    pthread_mutex_lock(&child_start_lock);
    /* not once recording stopped at exit: the process's end would cut the trace short */
    if (atomic_load(&child_pending) && atomic_load(&accepting)) {
        open_trace();
        if (!start_writer()) {
            atomic_store(&cuheap_recorder_on, false);
            close_trace();
        }
        atomic_store(&child_pending, false);
    }
    pthread_mutex_unlock(&child_start_lock);
}

bool cuheap_recorder_idle_child(void)
{
    return atomic_load(&child_pending);
}

void cuheap_record(const struct cuheap_rec *r)
{
    /* the audit's view of the hooks: every event, before the ring can drop it */
    if (atomic_load_explicit(&cuheap_auditing, memory_order_relaxed))
        cuheap_audit_note(r);
    if (!atomic_load_explicit(&cuheap_recorder_on, memory_order_relaxed))
        return;
    if (atomic_load_explicit(&paused, memory_order_relaxed) && r->type != CUHEAP_EV_MARK)
        return;
    if (!atomic_load_explicit(&accepting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&nr_events, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&nr_late, 1, memory_order_relaxed);
        return;
    }
    if (atomic_load_explicit(&child_pending, memory_order_relaxed))
        child_start();
    uint64_t t_start = timing ? now_ns() : 0, t_stacks = 0, t_native = 0, t_python = 0;
    struct cuheap_event *ev = cuheap_ring_claim(&ring);
    atomic_fetch_add_explicit(&nr_events, 1, memory_order_relaxed);
    if (!ev)
        return;
    ev->seq = r->seq ? r->seq : cuheap_seq_next();
    ev->time_ns = now_ns();
    ev->ptr = r->ptr;
    ev->size = r->size;
    ev->actual = r->actual;
    ev->stream = r->stream;
    ev->aux = r->aux;
    ev->aux2 = r->aux2;
    ev->tid = (uint32_t)current_tid();
    ev->result = r->result;
    ev->device = r->device;
    ev->type = r->type;
    ev->api = r->api;
    ev->flags = r->flags;
    ev->unwinder = (uint8_t)unwinder;
    ev->nr_frames = 0;
    ev->nr_py = 0;
    if (r->type == CUHEAP_EV_MARK || r->type == CUHEAP_EV_AUDIT) {
        /* cut at the limit between characters, so a long label keeps its text */
        const char *l = r->label ? r->label : "";
        size_t n = strnlen(l, sizeof(ev->label));
        if (n == sizeof(ev->label))
            n = cuheap_utf8_cut(l, sizeof(ev->label) - 1);
        memcpy(ev->label, l, n);
        ev->label[n] = 0;
    } else if (r->type == CUHEAP_EV_ALLOC || r->type == CUHEAP_EV_OOM ||
               r->type == CUHEAP_EV_LIMIT) {
        /* Allocation sites are what users ask about; frees carry no stack to halve the cost. */
        t_stacks = timing ? now_ns() : 0;
        bool walk = stack_depth || python;
        if (walk)
            pthread_rwlock_rdlock(&capture_lock);
        if (stack_depth)
            ev->nr_frames = (uint8_t)cuheap_unwind_capture(ev->frames, stack_depth);
        t_native = timing ? now_ns() : 0;
        if (python)
            ev->nr_py = (uint8_t)cuheap_py_capture(ev->py, CUHEAP_MAX_PY_DEPTH);
        if (walk)
            pthread_rwlock_unlock(&capture_lock);
        t_python = timing ? now_ns() : 0;
    }
    unsigned nr_frames = ev->nr_frames,
             nr_py = ev->nr_py; /* the slot is the writer's after commit */
    cuheap_ring_commit(&ring, ev);
    if (timing) {
        uint64_t t_end = now_ns();
        add(&tm.nr_events, 1);
        add(&tm.ring_ns, t_end - t_start - (t_python - t_stacks));
        if (t_stacks && stack_depth) {
            add(&tm.nr_native, 1);
            add(&tm.unwind_ns, t_native - t_stacks);
            add(&tm.nr_frames, nr_frames);
            if (t_native - t_stacks > 2000)
                add(&tm.nr_slow, 1);
        }
        if (t_stacks && python) {
            add(&tm.nr_python, 1);
            add(&tm.python_ns, t_python - t_native);
            add(&tm.nr_py_frames, nr_py);
        }
    }
}

void cuheap_recorder_device(int ordinal, const char *name, uint64_t total)
{
    if (ordinal < 0 || ordinal >= NR_MAX_DEVICES)
        return;
    struct device_info *d = &devices[ordinal];
    int expected = 0;
    if (!atomic_compare_exchange_strong(&d->state, &expected, -1))
        return;
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->total = total;
    atomic_store(&d->state, 1);
}

/* ---- writer side (io_lock held) ---- */

static void put_line(json_t *obj)
{
    if (out && !write_failed) {
        json_dumpf(obj, out, JSON_COMPACT);
        fputc('\n', out);
    }
    json_decref(obj);
}

/* A JSON string of text from outside (a path, the command line, a label, a host name):
 * jansson refuses bytes that are not UTF-8, and a refused string used to empty a label or
 * lose the whole header, so those bytes become U+FFFD. Never NULL but on exhaustion. */
static json_t *json_text(const char *s)
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

/* The main program's path: dladdr reports it as it was started ("./a.out"), and the tool
 * needs a path that still works after the program changed directory. */
static char exe_path[1024];
static uintptr_t exe_base;

static int find_exe_base(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    exe_base = info->dlpi_addr; /* the first object reported is the program */
    return 1;
}

static const char *module_path(const Dl_info *info)
{
    if (info->dli_fname[0] != '/' && exe_path[0] && (uintptr_t)info->dli_fbase == exe_base)
        return exe_path;
    return info->dli_fname;
}

static json_t *frame_json(uint64_t ip)
{
    Dl_info info;
    char buf[32];
    snprintf(buf, sizeof(buf), "0x%" PRIx64, ip);
    json_t *f = json_pack("{s:s}", "ip", buf);
    /* ip is a return address: look up ip - 1 so a call at a function's end stays in it. */
    if (dladdr((void *)(uintptr_t)(ip - 1), &info) && info.dli_fname) {
        json_object_set_new(f, "module", json_text(module_path(&info)));
        snprintf(buf, sizeof(buf), "0x%" PRIx64, ip - (uint64_t)(uintptr_t)info.dli_fbase);
        json_object_set_new(f, "offset", json_string(buf));
        if (info.dli_sname)
            json_object_set_new(f, "function", json_text(info.dli_sname));
    }
    return f;
}

/* Frames repeat across stacks: each return address is looked up (dladdr) and turned into
 * JSON once. Writer thread only. */
struct sym_slot {
    uint64_t ip;
    json_t *frame;
};

static struct sym_slot *syms;
static size_t nr_sym_slots, nr_syms;

static json_t *frame_cached(uint64_t ip)
{
    if ((nr_syms + 1) * 2 > nr_sym_slots) {
        size_t n = nr_sym_slots ? nr_sym_slots * 2 : 4096;
        struct sym_slot *t = calloc(n, sizeof(*t));
        if (!t)
            return frame_json(ip);
        for (size_t i = 0; i < nr_sym_slots; i++)
            if (syms[i].frame) {
                size_t j = (size_t)(syms[i].ip * 0x9e3779b97f4a7c15ull >> 20) & (n - 1);
                while (t[j].frame)
                    j = (j + 1) & (n - 1);
                t[j] = syms[i];
            }
        free(syms);
        syms = t;
        nr_sym_slots = n;
    }
    size_t j = (size_t)(ip * 0x9e3779b97f4a7c15ull >> 20) & (nr_sym_slots - 1);
    while (syms[j].frame && syms[j].ip != ip)
        j = (j + 1) & (nr_sym_slots - 1);
    if (!syms[j].frame) {
        syms[j] = (struct sym_slot){ip, frame_json(ip)};
        nr_syms++;
    }
    return json_incref(syms[j].frame);
}

static json_t *py_frame_json(const struct cuheap_py_frame *pf)
{
    const char *file = "?", *fn = "?";
    cuheap_py_code(pf->code, &file, &fn);
    return json_pack("{s:o, s:i, s:o}", "file", json_text(file), "line", (int)pf->line, "function",
                     json_text(fn));
}

/* A short, readable form of a stack for Chrome args: Python frames, then native. */
static json_t *stack_strings(const struct cuheap_stack *s)
{
    json_t *a = json_array();
    for (unsigned i = 0; i < s->nr_py && json_array_size(a) < CHROME_STACK_FRAMES; i++) {
        const char *file = "?", *fn = "?";
        cuheap_py_code(s->py[i].code, &file, &fn);
        char buf[600];
        snprintf(buf, sizeof(buf), "%s:%u in %s", file, s->py[i].line, fn);
        json_array_append_new(a, json_text(buf));
    }
    for (unsigned i = 0; i < s->nr_frames && json_array_size(a) < CHROME_STACK_FRAMES; i++) {
        Dl_info info;
        char buf[600];
        uint64_t ip = s->frames[i];
        if (dladdr((void *)(uintptr_t)(ip - 1), &info) && info.dli_fname) {
            const char *base = strrchr(info.dli_fname, '/');
            base = base ? base + 1 : info.dli_fname;
            if (info.dli_sname)
                snprintf(buf, sizeof(buf), "%s (%s)", info.dli_sname, base);
            else
                snprintf(buf, sizeof(buf), "%s+0x%" PRIx64, base,
                         ip - (uint64_t)(uintptr_t)info.dli_fbase);
        } else {
            snprintf(buf, sizeof(buf), "0x%" PRIx64, ip);
        }
        json_array_append_new(a, json_text(buf));
    }
    return a;
}

static void write_stack(const struct cuheap_stack *s)
{
    if (cfg->format != CUHEAP_FORMAT_JSONL)
        return;
    json_t *frames = json_array(), *py = json_array();
    for (unsigned i = 0; i < s->nr_frames; i++)
        json_array_append_new(frames, frame_cached(s->frames[i]));
    for (unsigned i = 0; i < s->nr_py; i++)
        json_array_append_new(py, py_frame_json(&s->py[i]));
    put_line(json_pack("{s:s, s:I, s:o, s:o}", "type", "stack", "id", (json_int_t)s->id, "frames",
                       frames, "python", py));
}

static void announce_devices(void)
{
    for (int i = 0; i < NR_MAX_DEVICES; i++) {
        struct device_info *d = &devices[i];
        if (atomic_load(&d->state) != 1)
            continue;
        if (cfg->format == CUHEAP_FORMAT_JSONL)
            put_line(json_pack("{s:s, s:i, s:o, s:I}", "type", "device", "device", i, "name",
                               json_text(d->name), "total", (json_int_t)d->total));
        atomic_store(&d->state, 2);
    }
}

/* An event's line is built by hand: snprintf was most of the writer's time (4.5 calls an
 * event at about 1,400 instructions each), and the writer must keep up with many producers.
 * The output is byte for byte what the format strings made. */
struct line {
    char buf[512];
    size_t n; /* the longest event line is under 400 bytes */
};

static void put_str(struct line *l, const char *s)
{
    size_t k = strlen(s);
    if (k > sizeof(l->buf) - l->n)
        k = sizeof(l->buf) - l->n;
    memcpy(l->buf + l->n, s, k);
    l->n += k;
}

static void put_u64(struct line *l, uint64_t v)
{
    char d[20];
    unsigned k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k && l->n < sizeof(l->buf))
        l->buf[l->n++] = d[--k];
}

static void put_i64(struct line *l, int64_t v)
{
    if (v < 0) {
        put_str(l, "-");
        put_u64(l, 0 - (uint64_t)v);
        return;
    }
    put_u64(l, (uint64_t)v);
}

/* "0x" and lowercase hex digits, as "0x%" PRIx64 */
static void put_hex(struct line *l, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char d[16];
    unsigned k = 0;
    do {
        d[k++] = digits[v & 15];
        v >>= 4;
    } while (v);
    put_str(l, "0x");
    while (k && l->n < sizeof(l->buf))
        l->buf[l->n++] = d[--k];
}

/* ",\"key\":v" for a byte count. Below 2^63 a JSON number; from 2^63 on a hex string
 * ("0x8000000000000000"), because jansson and most JSON readers hold integers in int64 and
 * would refuse the whole line (an out-of-memory for SIZE_MAX vanished from the report). */
static void put_bytes(struct line *l, const char *key, uint64_t v)
{
    put_str(l, ",\"");
    put_str(l, key);
    put_str(l, "\":");
    if (v <= (uint64_t)INT64_MAX) {
        put_u64(l, v);
        return;
    }
    put_str(l, "\"");
    put_hex(l, v);
    put_str(l, "\"");
}

static void write_event_jsonl(const struct cuheap_event *ev, uint32_t stack_id)
{
    struct line l = {.n = 0};
    put_str(&l, "{\"type\":\"event\",\"seq\":");
    put_u64(&l, ev->seq);
    put_str(&l, ",\"t\":");
    put_u64(&l, ev->time_ns - t0_ns);
    put_str(&l, ",\"event\":\"");
    put_str(&l, cuheap_event_type_name(ev->type));
    put_str(&l, "\",\"api\":\"");
    put_str(&l, cuheap_api_name(ev->api));
    put_str(&l, "\",\"device\":");
    put_i64(&l, ev->device);
    put_str(&l, ",\"tid\":");
    put_u64(&l, ev->tid);
    put_str(&l, ",\"ptr\":\"");
    put_hex(&l, ev->ptr);
    put_str(&l, "\"");
    put_bytes(&l, "size", ev->size);
    put_bytes(&l, "actual", ev->actual);
    put_str(&l, (ev->flags & CUHEAP_EVF_POOLED) ? ",\"pooled\":true" : ",\"pooled\":false");
    if (ev->stream) {
        put_str(&l, ",\"stream\":\"");
        put_hex(&l, ev->stream);
        put_str(&l, "\"");
    }
    if (ev->flags & CUHEAP_EVF_CAPTURE)
        put_str(&l, ",\"capture\":true");
    if (stack_id) {
        put_str(&l, ",\"stack\":");
        put_u64(&l, stack_id);
    }
    switch (ev->type) {
    case CUHEAP_EV_OOM:
    case CUHEAP_EV_LIMIT:
        put_str(&l, ",\"result\":");
        put_i64(&l, ev->result);
        put_bytes(&l, "driver_free", ev->aux);
        put_bytes(&l, "driver_total", ev->aux2);
        put_bytes(&l, "limit", ev->type == CUHEAP_EV_LIMIT ? ev->aux2 : (uint64_t)0);
        break;
    case CUHEAP_EV_FENCE:
        put_bytes(&l, "blocks", ev->aux);
        put_bytes(&l, "bytes", ev->aux2);
        break;
    case CUHEAP_EV_ARENA_GROW:
    case CUHEAP_EV_ARENA_RELEASE:
        put_bytes(&l, "reserved", ev->aux);
        break;
    case CUHEAP_EV_AUDIT:
        if (ev->flags & CUHEAP_EVF_SUMMARY) {
            put_bytes(&l, "operations", ev->aux);
            put_bytes(&l, "missed", ev->aux2);
        } else {
            put_bytes(&l, "correlation", ev->aux);
            put_bytes(&l, "count", ev->aux2);
        }
        break;
    default:
        break;
    }
    if (ev->type == CUHEAP_EV_MARK || ev->type == CUHEAP_EV_AUDIT) {
        json_t *j = json_text(ev->label);
        char *label = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        fprintf(out, "%.*s,\"label\":%s}\n", (int)l.n, l.buf, label ? label : "\"\"");
        free(label);
        return;
    }
    put_str(&l, "}\n");
    fwrite(l.buf, 1, l.n, out);
}

static void write_event(const struct cuheap_event *ev)
{
    uint32_t stack_id = 0;
    bool is_new = false;
    unsigned nr_frames = ev->nr_frames, nr_py = ev->nr_py;
    if (ev->type == CUHEAP_EV_MARK || ev->type == CUHEAP_EV_AUDIT)
        nr_frames = nr_py = 0; /* the frames union holds the label */
    uint64_t t0 = timing ? now_ns() : 0;
    int r =
        cuheap_stacktab_intern(&stacks, ev->frames, nr_frames, ev->py, nr_py, &stack_id, &is_new);
    if (timing)
        tm.intern_ns += now_ns() - t0;
    if (r == 0 && is_new)
        write_stack(cuheap_stacktab_get(&stacks, stack_id));
    if (!out || write_failed)
        return;
    nr_written++;
    if (cfg->format == CUHEAP_FORMAT_JSONL) {
        write_event_jsonl(ev, stack_id);
        return;
    }
    const struct cuheap_stack *s = cuheap_stacktab_get(&stacks, stack_id);
    char label[3 * CUHEAP_LABEL_MAX + 1];
    json_t *strs = s && ev->type == CUHEAP_EV_ALLOC ? stack_strings(s) : NULL;
    struct cuheap_chrome_ev ce = {
        .type = ev->type,
        .api = ev->api,
        .pooled = ev->flags & CUHEAP_EVF_POOLED,
        .device = ev->device,
        .ptr = ev->ptr,
        .size = ev->size,
        .actual = ev->actual,
        .aux = ev->aux,
        .aux2 = ev->aux2,
        .ts_us = (double)(ev->time_ns - t0_ns) / 1000.0,
        .tid = ev->tid,
        .stack_id = stack_id,
        .stack = strs,
        .label = ev->type == CUHEAP_EV_MARK ? cuheap_utf8_clean(ev->label, label) : NULL,
    };
    cuheap_chrome_event(&chrome, &ce);
    json_decref(strs);
}

/* The ring's pages are made resident 4 MiB ahead of the producers (io_lock held), until all
 * of it is: a producer that found its slot's page absent took two page faults. */
static bool ring_populating;

static void populate_ahead(void)
{
    if (ring_populating)
        ring_populating = cuheap_ring_populate(&ring, 4u << 20);
}

static unsigned drain(void)
{
    unsigned n = 0;
    announce_devices();
    populate_ahead();
    struct cuheap_event *ev;
    while ((ev = cuheap_ring_peek(&ring))) {
        if (n % 1024 == 1023)
            populate_ahead();
        uint64_t t0 = timing ? now_ns() : 0;
        write_event(ev);
        if (timing) {
            tm.write_ns += now_ns() - t0;
            tm.nr_written++;
        }
        cuheap_ring_consume(&ring);
        atomic_fetch_add_explicit(&nr_consumed, 1, memory_order_relaxed);
        n++;
    }
    return n;
}

static void check_write_error(void)
{
    if (!out || write_failed)
        return;
    if (fflush(out) != 0 || ferror(out)) {
        write_failed = true;
        trace_errno = errno;
        cuheap_log("cannot write trace %s (%s); the program goes on, events are counted but "
                   "no longer written",
                   out_path, strerror(errno));
        return;
    }
    header_written = true;
}

static void *writer_main(void *arg)
{
    (void)arg;
    uint64_t last_flush = now_ns();
    ring_populating = true; /* a new writer (a child's too) starts over */
    while (!atomic_load(&stopping)) {
        pthread_mutex_lock(&io_lock);
        unsigned n = drain();
        uint64_t now = now_ns();
        if (now - last_flush >= (uint64_t)cfg->flush_ms * 1000000ull) {
            check_write_error();
            last_flush = now;
        }
        pthread_mutex_unlock(&io_lock);
        if (n == 0) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    struct timespec cpu;
    if (timing && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
        tm.writer_cpu_ns = (uint64_t)cpu.tv_sec * 1000000000ull + (uint64_t)cpu.tv_nsec;
    return NULL;
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
        json_array_append_new(a, json_text(buf + i));
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
        json_object_set_new(arg, key, json_text(eq + 1));
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
    ssize_t n = readlink("/proc/self/exe", exe_path, sizeof(exe_path) - 1);
    exe_path[n > 0 ? n : 0] = 0;
    dl_iterate_phdr(find_exe_base, NULL);
    json_t *conf = json_object();
    cuheap_config_dump(cfg, config_item, conf);
    json_t *h =
        json_pack("{s:s, s:s, s:i, s:I, s:I, s:o, s:o, s:o, s:I, s:s, s:s, s:b, s:o}", "type",
                  "header", "format", "cuheap-trace", "version", TRACE_FORMAT_VERSION, "pid",
                  (json_int_t)getpid(), "ppid", (json_int_t)getppid(), "host", json_text(host),
                  "exe", json_text(exe_path), "cmdline", cmdline_json(), "start_unix_ns",
                  (json_int_t)((uint64_t)real->tv_sec * 1000000000ull + (uint64_t)real->tv_nsec),
                  "clock", "CLOCK_MONOTONIC, t in ns since start", "unwinder",
                  cuheap_unwinder_name(unwinder), "python", python, "config", conf);
    if (h && rank)
        json_object_set_new(h, "rank", json_integer(atoll(rank)));
    if (h)
        json_object_set_new(h, "stack_depth", json_integer(stack_depth));
    return h;
}

/* The default name: the rank's when there is one, the extension of the format. */
static const char *default_name(bool ranked)
{
    bool as_chrome = cfg->format == CUHEAP_FORMAT_CHROME;
    if (ranked)
        return as_chrome ? "cuheap-r%r-%p.trace.json" : "cuheap-r%r-%p.jsonl";
    return as_chrome ? "cuheap-%p.trace.json" : "cuheap-%p.jsonl";
}

/* Open the trace for this process and write its header (io_lock held or single-threaded).
 * The header is built first and written the moment the file exists: a process killed in
 * between leaves an empty file, which `cuheap check` cannot call a trace (CI's stress run saw
 * one, killed 60 ms in on a loaded machine, while the header was being put together). */
static void open_trace(void)
{
    char host[128] = "", host_part[128], rank_part[64];
    gethostname(host, sizeof(host) - 1);
    const char *rank = rank_env();
    name_part(host, host_part, sizeof(host_part));
    if (rank)
        name_part(rank, rank_part, sizeof(rank_part));
    const char *tmpl = cfg->output;
    if (!strcmp(tmpl, "cuheap-%p.jsonl"))
        tmpl = default_name(rank != NULL);
    name_too_long = cuheap_expand_path(tmpl, out_path, sizeof(out_path), (long)getpid(),
                                       rank ? rank_part : NULL, host_part) != 0;
    if (name_too_long) {
        tmpl = default_name(rank != NULL);
        cuheap_expand_path(tmpl, out_path, sizeof(out_path), (long)getpid(),
                           rank ? rank_part : NULL, host_part);
        cuheap_log("CUHEAP_OUTPUT=\"%s\" expands to more than %d bytes; the trace goes to %s "
                   "instead",
                   cfg->output, CUHEAP_PATH_MAX - 1, out_path);
    }
    write_failed = open_failed = header_written = false;
    trace_errno = 0;
    nr_written = 0;
    t0_ns = now_ns();
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    json_t *header = cfg->format == CUHEAP_FORMAT_CHROME ? NULL : trace_header(host, rank, &real);
    int fd = cuheap_tracefile_create(out_path, sizeof(out_path), cfg->output_mode, &refused);
    if (fd >= 0 && refused.path[0])
        cuheap_log("%s is %s; the trace goes to %s", refused.path, refused.why, out_path);
    if (fd < 0)
        errno = -fd;
    out = fd >= 0 ? cuheap_tracefile_stream(fd) : NULL;
    if (fd >= 0 && !out)
        close(fd);
    if (!out) {
        open_failed = true;
        trace_errno = errno;
        json_decref(header);
        cuheap_log("cannot open trace %s: %s; the program goes on without a trace file "
                   "(set CUHEAP_OUTPUT to a writable path)",
                   out_path, strerror(errno));
        return;
    }
    /* A buffer of our own: given NULL, glibc ignores the size and uses 4 KiB, which turns
     * the writer's batches into a write(2) every few events. Static, so the hook path that
     * opens a child's trace does not allocate it. */
    setvbuf(out, out_buf, _IOFBF, sizeof(out_buf));
    if (cfg->format == CUHEAP_FORMAT_CHROME) {
        char name[160];
        snprintf(name, sizeof(name), "cuheap pid %ld%s%s", (long)getpid(), rank ? " rank " : "",
                 rank ? rank_part : "");
        cuheap_chrome_begin(&chrome, out, (long)getpid(), name);
        check_write_error();
        return;
    }
    put_line(header);
    check_write_error(); /* the header on disk: a trace exists from here on */
}

/* Events that will never be written: a full ring, made after recording stopped, or left in
 * the ring by a producer that raced with the last drain. */
static uint64_t nr_dropped_now(void)
{
    uint64_t n = atomic_load(&ring.nr_dropped) + atomic_load(&nr_late);
    if (!atomic_load(&accepting))
        n += atomic_load(&ring.nr_pushed) - atomic_load(&nr_consumed);
    return n;
}

static void close_trace(void)
{
    if (!out)
        return;
    if (cfg->format == CUHEAP_FORMAT_CHROME) {
        cuheap_chrome_end(&chrome);
    } else {
        put_line(json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "type", "footer", "events",
                           (json_int_t)atomic_load(&nr_events), "written", (json_int_t)nr_written,
                           "dropped", (json_int_t)nr_dropped_now(), "stacks",
                           (json_int_t)stacks.nr_stacks, "t", (json_int_t)(now_ns() - t0_ns)));
    }
    check_write_error();
    fclose(out);
    out = NULL;
}

static bool start_writer(void)
{
    atomic_store(&stopping, false);
    sigset_t all, old;
    sigfillset(&all);
    /* The writer must never take the program's signals. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&writer, NULL, writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r) {
        cuheap_log("cannot start the trace writer thread (%s); recording is off", strerror(r));
        return false;
    }
    writer_running = true;
    return true;
}

void cuheap_recorder_start(const struct cuheap_config *config)
{
    cfg = config;
    if (!cfg->record)
        return;
    if (cuheap_ring_init(&ring, cfg->ring_slots)) {
        cuheap_log("cannot map an event ring of %u slots; recording is off", cfg->ring_slots);
        return;
    }
    python = cfg->python && cuheap_py_init();
    timing = cfg->record_timing;
    if (timing) {
        uint64_t t = now_ns();
        for (int i = 0; i < 1000; i++)
            now_ns();
        tm.clock_ns = (now_ns() - t) / 1001;
    }
    cuheap_unwind_set_cache(cfg->stack_cache);
    cuheap_py_set_memo(cfg->stack_cache);
    stack_depth = cfg->stack_depth;
    if (python && !cfg->stack_depth_set && stack_depth > CUHEAP_PYTHON_STACK_DEPTH)
        stack_depth = CUHEAP_PYTHON_STACK_DEPTH;
    unwinder = stack_depth ? cuheap_unwind_init() : CUHEAP_UNWIND_NONE;
    cuheap_stacktab_init(&stacks);
    open_trace();
    if (!start_writer()) {
        close_trace();
        return;
    }
    atomic_store(&accepting, true);
    atomic_store(&cuheap_recorder_on, true);
}

bool cuheap_recorder_pause(bool pause)
{
    return atomic_exchange(&paused, pause);
}

void cuheap_recorder_stop(void)
{
    if (!atomic_load(&cuheap_recorder_on) || !atomic_exchange(&accepting, false))
        return;
    /* A child's trace that another thread is opening is waited for, header and writer; none
     * opens after this (child_start looks at accepting). */
    pthread_mutex_lock(&child_start_lock);
    bool idle_child = atomic_load(&child_pending);
    pthread_mutex_unlock(&child_start_lock);
    if (idle_child) {
        /* a child that recorded nothing: no writer, no file, and none opened later */
        atomic_store(&cuheap_recorder_on, false);
        return;
    }
    if (writer_running) {
        atomic_store(&stopping, true);
        pthread_join(writer, NULL);
        writer_running = false;
    }
    pthread_mutex_lock(&io_lock);
    drain();
    tm.wall_ns = now_ns() - t0_ns;
    close_trace();
    pthread_mutex_unlock(&io_lock);
}

/* Every lock, whether recording is on or not: the locks cost nothing to take here, and a
 * handler that looked at cuheap_recorder_on could see it change between prepare and child
 * (a child's first event turning recording off when its writer cannot start). */
void cuheap_recorder_atfork_prepare(void)
{
    pthread_rwlock_wrlock(&capture_lock);
    pthread_mutex_lock(&child_start_lock);
    pthread_mutex_lock(&io_lock);
    if (out)
        fflush(out); /* an empty buffer cannot be written twice by parent and child */
}

void cuheap_recorder_atfork_parent(void)
{
    pthread_mutex_unlock(&io_lock);
    pthread_mutex_unlock(&child_start_lock);
    pthread_rwlock_unlock(&capture_lock);
}

void cuheap_recorder_atfork_child(void)
{
    tls_tid = 0;
    pthread_mutex_init(&io_lock, NULL);
    pthread_mutex_init(&child_start_lock, NULL);
    /* held by this thread for writing: made anew, as the static one (writers first) */
    capture_lock = (pthread_rwlock_t)PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    if (!atomic_load(&cuheap_recorder_on))
        return;
    /* The parent's writer thread does not exist here. Start over with our own file. */
    writer_running = false;
    if (out) {
        fclose(out); /* buffer was flushed in prepare */
        out = NULL;
    }
    cuheap_ring_reset(&ring);
    atomic_store(&nr_events, 0);
    atomic_store(&nr_late, 0);
    atomic_store(&nr_consumed, 0);
    atomic_store(&ring.nr_dropped, 0);
    atomic_store(&ring.nr_pushed, 0);
    cuheap_stacktab_destroy(&stacks);
    cuheap_stacktab_init(&stacks);
    for (int i = 0; i < NR_MAX_DEVICES; i++)
        if (atomic_load(&devices[i].state) == 2)
            atomic_store(&devices[i].state, 1);
    atomic_store(&child_pending, true); /* the trace opens with the child's first event */
}

void cuheap_recorder_get_stats(struct cuheap_recorder_stats *ret)
{
    ret->nr_events = atomic_load(&nr_events);
    ret->nr_dropped = ring.slots ? nr_dropped_now() : 0;
    ret->nr_full = ring.slots ? atomic_load(&ring.nr_dropped) : 0;
    if (open_failed)
        ret->state = CUHEAP_TRACE_NOT_CREATED;
    else if (write_failed)
        ret->state = header_written ? CUHEAP_TRACE_PARTIAL : CUHEAP_TRACE_LOST;
    else
        ret->state = out_path[0] ? CUHEAP_TRACE_WRITTEN : CUHEAP_TRACE_NONE;
    ret->error = trace_errno;
    ret->path = out_path[0] ? out_path : NULL;
    ret->refused = refused.path[0] ? refused.path : NULL;
    ret->refused_why = refused.why;
    ret->name_too_long = name_too_long;
    ret->unwinder = cuheap_unwinder_name(unwinder);
}

void cuheap_recorder_get_timing(struct cuheap_recorder_timing *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (!timing)
        return;
    ret->on = true;
#define PER(num, den) ((den) ? (double)(num) / (double)(den) : 0.0)
    uint64_t nr = atomic_load(&tm.nr_events), nr_native = atomic_load(&tm.nr_native),
             nr_python = atomic_load(&tm.nr_python);
    ret->clock_ns = (double)tm.clock_ns;
    ret->nr_events = nr;
    ret->ring_ns = PER(atomic_load(&tm.ring_ns), nr) - (double)tm.clock_ns;
    ret->nr_native = nr_native;
    ret->unwind_ns = PER(atomic_load(&tm.unwind_ns), nr_native) - (double)tm.clock_ns;
    ret->frames = PER(atomic_load(&tm.nr_frames), nr_native);
    ret->nr_slow = atomic_load(&tm.nr_slow);
    ret->nr_rewalks = cuheap_unwind_nr_rewalks();
    ret->nr_python = nr_python;
    ret->python_ns = PER(atomic_load(&tm.python_ns), nr_python) - (double)tm.clock_ns;
    ret->py_frames = PER(atomic_load(&tm.nr_py_frames), nr_python);
    ret->nr_written = tm.nr_written;
    ret->intern_ns = PER(tm.intern_ns, tm.nr_written) - (double)tm.clock_ns;
    ret->write_ns = PER(tm.write_ns - tm.intern_ns, tm.nr_written) - 2.0 * (double)tm.clock_ns;
    ret->writer_cpu_s = (double)tm.writer_cpu_ns / 1e9;
    ret->wall_s = (double)tm.wall_ns / 1e9;
#undef PER
}
