/* SPDX-License-Identifier: MIT */
/*
 * An out-of-memory, told right: a short block on stderr for the first one the program does
 * not recover from (the request and device, what is live and what cuheap holds, the largest
 * free piece in the pool, and the three call sites holding the most at that moment with their
 * innermost program frame), then only a count, at the 2nd, 4th, 8th, ... one, and the same
 * facts as an `oom_report` line in the trace; one the program recovers from (its thread asks
 * again for the same bytes and gets them, as a caching allocator does after emptying its
 * cache) is one line and an `oom_recovered` line. The block is built when the out-of-memory
 * is seen and held until that is known (the deferred part below). The call sites come from
 * the live set the writer thread keeps from the events it writes (liveset.h), so the block is
 * built there, off the hook's path; an out-of-memory the writer will never see (recording off
 * or paused, a full ring, recording stopped at exit) is told from the hook at once with what
 * the hook knows, and says why the call sites are missing. Either way the program's answer is
 * the driver's, unchanged.
 *
 * Locking: the live set, the held blocks and the site names are the writer's (io_lock held);
 * the hook side touches only nr_told (atomic) and its own stack buffer, and writes with one
 * write(2).
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elfsym.h"
#include "liveset.h"
#include "pyframes.h"
#include "recorder.h"
#include "recorder_internal.h"

#define NR_TOP_SITES 3
#define NR_NAME_MAX  512 /* bytes of a site's name */

static _Atomic uint64_t nr_told; /* out-of-memory answers told so far, either side */
static struct cuheap_liveset live;

/* The block, built on the teller's stack and written at once: lines from other threads never
 * land inside it. */
struct text {
    char buf[2048];
    size_t n;
};

static void __attribute__((format(printf, 2, 3))) add(struct text *t, const char *fmt, ...)
{
    if (t->n >= sizeof(t->buf) - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(t->buf + t->n, sizeof(t->buf) - t->n, fmt, ap);
    va_end(ap);
    if (m > 0)
        t->n += (size_t)m < sizeof(t->buf) - t->n ? (size_t)m : sizeof(t->buf) - 1 - t->n;
}

static void emit(const struct text *t)
{
    ssize_t w = write(STDERR_FILENO, t->buf, t->n);
    (void)w;
}

/* What a hook knew at the out-of-memory, in the event's fields (event.h). */
struct facts {
    int type, api, device;
    uint64_t size, live, held, largest, driver_free, total_or_limit;
};

/* A byte count as the trace writes them: an integer below 2^63, a hex string from there on. */
static json_t *bytes_json(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)v);
    char hex[24];
    snprintf(hex, sizeof(hex), "0x%" PRIx64, v);
    return json_string(hex);
}

static bool power_of_two(uint64_t n)
{
    return (n & (n - 1)) == 0;
}

/* The count line for every out-of-memory after the first that reaches a power of two. */
static void tell_again(const struct facts *f, uint64_t n)
{
    char sz[32];
    struct text t = {.n = 0};
    add(&t,
        "cuheap: out of memory again on GPU %d (%s of %s): %" PRIu64 " in all so far; the "
        "first is described above\n",
        f->device, cuheap_api_name((unsigned)f->api), cuheap_format_size(f->size, sz, sizeof(sz)),
        n);
    emit(&t);
}

/* The first lines of the block: the request (asked at that call site, when known), the
 * device's bytes, the largest free piece. */
static void head(struct text *t, const struct facts *f, const char *asked)
{
    char a[32], b[32], c[32], d[32];
    const char *api = cuheap_api_name((unsigned)f->api);
    cuheap_format_size(f->size, a, sizeof(a));
    if (f->device < 0)
        add(t, "cuheap: out of memory for pinned host memory: %s of %s\n", api, a);
    else if (f->type == CUHEAP_EV_LIMIT)
        add(t, "cuheap: out of memory on GPU %d: %s of %s refused by CUHEAP_LIMIT (%s)\n",
            f->device, api, a, cuheap_format_size(f->total_or_limit, b, sizeof(b)));
    else
        add(t,
            "cuheap: out of memory on GPU %d: %s of %s, CUDA_ERROR_OUT_OF_MEMORY from the "
            "driver\n",
            f->device, api, a);
    if (asked)
        add(t, "cuheap:   asked for at %s\n", asked);
    if (f->device < 0) /* pinned host memory: no device record, no pool */
        return;
    add(t, "cuheap:   live %s; cuheap holds %s; the driver says %s free",
        cuheap_format_size(f->live, a, sizeof(a)), cuheap_format_size(f->held, b, sizeof(b)),
        cuheap_format_size(f->driver_free, c, sizeof(c)));
    if (f->type == CUHEAP_EV_OOM)
        add(t, " of %s", cuheap_format_size(f->total_or_limit, d, sizeof(d)));
    add(t, "\n");
    if (f->largest == CUHEAP_OOM_NO_POOL) {
        add(t, "cuheap:   largest free piece in the pool: none, no pool (CUHEAP_POOL=0)\n");
        return;
    }
    uint64_t spare = f->held > f->live ? f->held - f->live : 0;
    cuheap_format_size(f->largest, a, sizeof(a));
    cuheap_format_size(spare, b, sizeof(b));
    if (f->largest >= f->size)
        add(t,
            "cuheap:   largest free piece in the pool: %s, as large as the request (which was "
            "the driver's to serve)\n",
            a);
    else if (spare >= f->size)
        add(t,
            "cuheap:   largest free piece in the pool: %s: fragmentation (%s held and not "
            "live, in no piece as large as the request)\n",
            a, b);
    else
        add(t,
            "cuheap:   largest free piece in the pool: %s; not fragmentation (only %s held "
            "and not live)\n",
            a, b);
}

static const char later[] = "cuheap:   later out-of-memory answers are only counted here";

void cuheap_recorder_oom_unseen(const struct cuheap_rec *r, const char *why)
{
    uint64_t n = atomic_fetch_add_explicit(&nr_told, 1, memory_order_relaxed) + 1;
    struct facts f = {r->type,   r->api,    r->device, r->size, r->ptr,
                      r->actual, r->stream, r->aux,    r->aux2};
    if (n > 1) {
        if (power_of_two(n))
            tell_again(&f, n);
        return;
    }
    struct text t = {.n = 0};
    head(&t, &f, NULL);
    add(&t, "cuheap:   call sites holding the most: not known, %s\n", why);
    add(&t, "%s\n", later);
    emit(&t);
}

/* ---- the writer's side (io_lock held) ---- */

static bool is_plumbing(const char *mod)
{
    static const char *const skip[] = {"libcuheap",   "libcuda.", "libcudart",
                                       "libc10_cuda", "libcuda-", "libc.so",
                                       "libcupy",     "libxla",   NULL};
    for (int i = 0; skip[i]; i++)
        if (!strncmp(mod, skip[i], strlen(skip[i])))
            return true;
    return false;
}

static bool user_python(const char *file)
{
    return !strstr(file, "/site-packages/") && !strstr(file, "/dist-packages/") &&
           !strstr(file, "/lib/python3") && file[0] != '<';
}

/* One native frame as "module!function" or "module+0xoffset"; false inside the CUDA
 * libraries, cuheap and libc (plumbing) or where dladdr knows nothing. */
static bool native_name(uint64_t ip, bool skip_plumbing, char *buf, size_t size)
{
    Dl_info info;
    if (!dladdr((void *)(uintptr_t)(ip - 1), &info) || !info.dli_fname)
        return false;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    if (!*base && cuheap_recorder.exe_path[0]) { /* the program itself, as dladdr says */
        base = strrchr(cuheap_recorder.exe_path, '/');
        base = base ? base + 1 : cuheap_recorder.exe_path;
    }
    if (skip_plumbing && is_plumbing(base))
        return false;
    /* static functions, and a program's own without -rdynamic: from the file's .symtab */
    const char *file = info.dli_fname[0] ? info.dli_fname : cuheap_recorder.exe_path;
    char fn[160];
    if (info.dli_sname)
        snprintf(buf, size, "%.100s!%.140s", base, info.dli_sname);
    else if (file[0] &&
             cuheap_elfsym_name(file, (uint64_t)(uintptr_t)info.dli_fbase, ip - 1, fn, sizeof(fn)))
        snprintf(buf, size, "%.100s!%.140s", base, fn);
    else
        snprintf(buf, size, "%.100s+0x%" PRIx64, base, ip - (uint64_t)(uintptr_t)info.dli_fbase);
    return true;
}

/* A stack's innermost frame of the program, as the tool names it (tracereader.h,
 * cuheap_trace_site): the innermost Python frame of the user's code ("train.py:42 in
 * forward"), else the innermost native frame outside the CUDA libraries ("prog!fn"); with
 * `outer`, that many of its callers after it (" < ..."), to tell apart sites that share it. */
static void site_name(const struct cuheap_stack *s, unsigned outer, char *buf, size_t size)
{
    snprintf(buf, size, s ? "(no frame of the program)" : "(no stack recorded)");
    if (!s)
        return;
    size_t n = 0;
    if (s->nr_py) {
        unsigned pick = 0;
        for (unsigned i = 0; i < s->nr_py; i++) {
            const char *file = "?", *fn = "?";
            cuheap_py_code(s->py[i].code, &file, &fn);
            if (user_python(file)) {
                pick = i;
                break;
            }
        }
        for (unsigned i = pick; i < s->nr_py && i <= pick + outer && n + 1 < size; i++) {
            const char *file = "?", *fn = "?";
            cuheap_py_code(s->py[i].code, &file, &fn);
            const char *base = strrchr(file, '/'); /* callers: the file's name is enough */
            base = i > pick && base ? base + 1 : file;
            int m = snprintf(buf + n, size - n, "%s%s:%u in %s", i > pick ? " < " : "", base,
                             s->py[i].line, fn);
            n += m > 0 ? (size_t)m : 0;
        }
        return;
    }
    for (unsigned i = 0; i < s->nr_frames; i++) {
        if (!native_name(s->frames[i], true, buf, size))
            continue;
        n = strlen(buf);
        for (unsigned k = i + 1; k < s->nr_frames && k <= i + outer && n + 4 < size; k++) {
            memcpy(buf + n, " < ", 4);
            if (native_name(s->frames[k], false, buf + n + 3, size - n - 3))
                n = strlen(buf);
            else
                buf[n] = 0;
        }
        return;
    }
}

/* The top sites' names, each with as many callers as it takes to tell it from the others. */
static void site_names(const struct cuheap_live_site *top, unsigned nr, char (*names)[NR_NAME_MAX])
{
    unsigned outer[NR_TOP_SITES] = {0};
    for (unsigned i = 0; i < nr; i++)
        site_name(cuheap_stacktab_get(&cuheap_recorder.stacks, top[i].stack), 0, names[i],
                  NR_NAME_MAX);
    for (unsigned round = 0; round < 4; round++) {
        bool shared[NR_TOP_SITES] = {false}, again = false;
        for (unsigned i = 0; i < nr; i++)
            for (unsigned j = i + 1; j < nr; j++)
                if (!strcmp(names[i], names[j]))
                    shared[i] = shared[j] = again = true;
        if (!again)
            return;
        for (unsigned i = 0; i < nr; i++)
            outer[i] += shared[i];
        for (unsigned i = 0; i < nr; i++)
            site_name(cuheap_stacktab_get(&cuheap_recorder.stacks, top[i].stack), outer[i],
                      names[i], NR_NAME_MAX);
    }
}

/* ---- deferred: an out-of-memory told once the program's next step says what it was ----
 *
 * A caching allocator (PyTorch's) answers an out-of-memory by freeing its cache and asking
 * again for the same bytes; the program never sees the error. So the block is built when the
 * out-of-memory is seen (the call sites then) and held until the same thread allocates again:
 * the same size on the same device is the retry, and if it succeeds the out-of-memory was
 * recovered from (one line); another allocation, a wait past RETRY_WAIT_NS or the end of
 * recording means the program did not recover, and the block is told. */

#define NR_PENDING    16 /* threads with an out-of-memory awaiting their next step */
#define RETRY_WAIT_NS (1000ull * 1000 * 1000)

struct pending {
    bool used;
    uint32_t tid;
    int16_t device;
    uint64_t size;
    uint64_t seen_ns; /* when the writer saw it (cuheap_recorder_now) */
    uint64_t live_at; /* bytes live on the device then, as the events say */
    unsigned tries;   /* out-of-memory answers to this request so far */
    struct facts f;
    json_t *report;    /* the oom_report line, without its count */
    struct text block; /* the block, without its last line */
};

static struct pending pending[NR_PENDING];
static unsigned nr_pending;
static uint64_t nr_recoveries; /* requests refused, then answered */
static uint64_t nr_recovered;  /* out-of-memory answers those requests got before */

static void drop(struct pending *p)
{
    json_decref(p->report);
    p->report = NULL;
    p->used = false;
    nr_pending--;
}

/* Not recovered from: each of its tries is an answer the program got. The block for the
 * first answer told, a count line at the 2nd, 4th, 8th, ..., and the oom_report line. */
static void tell_real(struct pending *p)
{
    for (unsigned k = 0; k < p->tries; k++) {
        uint64_t n = atomic_fetch_add_explicit(&nr_told, 1, memory_order_relaxed) + 1;
        if (n == 1) {
            if (p->report) {
                json_object_set_new(p->report, "ooms", json_integer((json_int_t)n));
                cuheap_recorder_put_line(json_incref(p->report));
            }
            emit(&p->block);
        } else if (power_of_two(n)) {
            tell_again(&p->f, n);
        }
    }
    drop(p);
}

/* Recovered: one line for the first (then at the 2nd, 4th, 8th, ...), and a line in the trace
 * for each, which `cuheap report` counts apart from real out-of-memory answers. */
static void tell_recovered(struct pending *p, const struct cuheap_event *retry)
{
    uint64_t now_live = cuheap_liveset_bytes(&live, p->device);
    uint64_t released = p->live_at > now_live ? p->live_at - now_live : 0;
    uint64_t n = ++nr_recoveries;
    nr_recovered += p->tries;
    if (n == 1 || power_of_two(n)) {
        char a[32], b[32];
        struct text t = {.n = 0};
        cuheap_format_size(p->size, a, sizeof(a));
        cuheap_format_size(released, b, sizeof(b));
        if (n == 1)
            add(&t,
                "cuheap: out of memory on GPU %d for %s, recovered after the program released "
                "%s\n",
                p->device, a, b);
        else
            add(&t, "cuheap: out of memory on GPU %d for %s, recovered (%" PRIu64 " in all)\n",
                p->device, a, n);
        emit(&t);
    }
    if (cuheap_recorder.out && !cuheap_recorder.write_failed &&
        cuheap_recorder.cfg->format == CUHEAP_FORMAT_JSONL && p->report) {
        json_t *o = json_pack(
            "{s:s, s:O, s:I, s:i, s:o, s:o, s:I, s:I}", "type", "oom_recovered", "event_seq",
            json_object_get(p->report, "event_seq"), "retry_seq", (json_int_t)retry->seq, "device",
            (int)p->device, "size", bytes_json(p->size), "released", bytes_json(released), "tries",
            (json_int_t)p->tries, "t", (json_int_t)(retry->time_ns - cuheap_recorder.t0_ns));
        cuheap_recorder_put_line(o);
    }
    drop(p);
}

static struct pending *pending_of(uint32_t tid)
{
    for (unsigned i = 0; nr_pending && i < NR_PENDING; i++)
        if (pending[i].used && pending[i].tid == tid)
            return &pending[i];
    return NULL;
}

/* An allocation's event (or another out-of-memory) of a thread with one pending: the retry,
 * answered or refused again, or the program's next step without one. */
static void next_step(const struct cuheap_event *ev)
{
    struct pending *p = pending_of(ev->tid);
    if (!p || ev->device < 0 || ev->api == CUHEAP_API_HOST || ev->api == CUHEAP_API_VMM_MAP)
        return;
    bool same = ev->device == p->device && ev->size == p->size;
    if (same && ev->type == CUHEAP_EV_ALLOC)
        tell_recovered(p, ev);
    else if (same) /* refused again: the newer block replaces it (cuheap_recorder_oom_seen) */
        return;
    else
        tell_real(p);
}

void cuheap_recorder_oom_track(const struct cuheap_event *ev, uint32_t stack_id)
{
    if (nr_pending &&
        (ev->type == CUHEAP_EV_ALLOC || ev->type == CUHEAP_EV_OOM || ev->type == CUHEAP_EV_LIMIT))
        next_step(ev);
    /* what the report counts as the device's memory (tools/analysis.c) */
    if (ev->device < 0 || ev->api == CUHEAP_API_HOST || ev->api == CUHEAP_API_VMM_MAP)
        return;
    if (ev->type == CUHEAP_EV_ALLOC)
        cuheap_liveset_alloc(&live, ev->ptr, ev->device, ev->size, stack_id);
    else if (ev->type == CUHEAP_EV_FREE)
        cuheap_liveset_free(&live, ev->ptr);
}

void cuheap_recorder_oom_tick(void)
{
    if (!nr_pending)
        return;
    uint64_t now = cuheap_recorder_now();
    for (unsigned i = 0; i < NR_PENDING; i++)
        if (pending[i].used && now - pending[i].seen_ns >= RETRY_WAIT_NS)
            tell_real(&pending[i]);
}

void cuheap_recorder_oom_flush(void)
{
    for (unsigned i = 0; nr_pending && i < NR_PENDING; i++)
        if (pending[i].used)
            tell_real(&pending[i]);
}

uint64_t cuheap_recorder_oom_recovered(void)
{
    return nr_recovered;
}

/* Whether an environment variable is set to something other than off ("" or "0"). */
static bool set_on(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v && strcmp(v, "0") != 0;
}

/* Whether a caching allocator sits between the program and cuheap: its live bytes are its
 * segments, cache included. A library loaded with its cache turned off (PyTorch's
 * PYTORCH_NO_CUDA_MEMORY_CACHING: each tensor one cudaMalloc) counts as none. */
static bool caching_allocator(int api)
{
    if (api == CUHEAP_API_TORCH) /* cuheap is PyTorch's allocator: live bytes are tensors */
        return false;
    static const struct {
        const char *lib, *cache_off;
    } cachers[] = {{"libc10_cuda.so", "PYTORCH_NO_CUDA_MEMORY_CACHING"},
                   {"libcupy_backends", NULL}};
    for (size_t i = 0; i < sizeof(cachers) / sizeof(cachers[0]); i++) {
        if (set_on(cachers[i].cache_off))
            continue;
        void *h = dlopen(cachers[i].lib, RTLD_NOLOAD | RTLD_LAZY);
        if (h) {
            dlclose(h);
            return true;
        }
    }
    return false;
}

void cuheap_recorder_oom_seen(const struct cuheap_event *ev, uint32_t stack_id)
{
    struct facts f = {ev->type,   ev->api,    ev->device, ev->size, ev->ptr,
                      ev->actual, ev->stream, ev->aux,    ev->aux2};
    unsigned tries = 1;
    struct pending *p = pending_of(ev->tid);
    if (p) { /* refused again (next_step kept it): this newer picture replaces it */
        tries += p->tries;
        drop(p);
    }
    if (nr_pending == NR_PENDING) /* many threads refused at once: the oldest is told */
        for (unsigned i = 0; i < NR_PENDING && nr_pending == NR_PENDING; i++)
            tell_real(&pending[i]);
    for (p = pending; p->used; p++)
        ;
    memset(p, 0, sizeof(*p));
    p->used = true;
    nr_pending++;
    p->tid = ev->tid;
    p->device = ev->device;
    p->size = ev->size;
    p->seen_ns = cuheap_recorder_now();
    p->live_at = ev->device >= 0 ? cuheap_liveset_bytes(&live, ev->device) : 0;
    p->tries = tries;
    p->f = f;
    struct cuheap_live_site top[NR_TOP_SITES];
    unsigned nr = cuheap_liveset_top(&live, ev->device, top, NR_TOP_SITES);
    uint64_t lost = atomic_load(&cuheap_recorder.ring.nr_dropped);
    bool paused = atomic_load(&cuheap_recorder.was_paused);
    bool complete = !lost && !paused && !live.incomplete;
    bool caching = ev->device >= 0 && caching_allocator(ev->api);
    char names[NR_TOP_SITES][NR_NAME_MAX], asked[NR_NAME_MAX];
    site_names(top, nr, names);
    const struct cuheap_stack *own = cuheap_stacktab_get(&cuheap_recorder.stacks, stack_id);
    if (own)
        site_name(own, 0, asked, sizeof(asked));
    if (cuheap_recorder.out && !cuheap_recorder.write_failed &&
        cuheap_recorder.cfg->format == CUHEAP_FORMAT_JSONL) {
        json_t *sites = json_array();
        for (unsigned i = 0; i < nr; i++)
            json_array_append_new(
                sites, json_pack("{s:I, s:o, s:I, s:o}", "stack", (json_int_t)top[i].stack, "bytes",
                                 bytes_json(top[i].bytes), "blocks", (json_int_t)top[i].nr_blocks,
                                 "frame", cuheap_recorder_json_text(names[i])));
        json_t *o = json_pack(
            "{s:s, s:I, s:I, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "type",
            "oom_report", "event_seq", (json_int_t)ev->seq, "t",
            (json_int_t)(ev->time_ns - cuheap_recorder.t0_ns), "kind",
            cuheap_event_type_name(ev->type), "api", cuheap_api_name(ev->api), "device",
            (int)ev->device, "size", bytes_json(f.size), "live", bytes_json(f.live), "held",
            bytes_json(f.held), "largest_free",
            bytes_json(f.largest == CUHEAP_OOM_NO_POOL ? 0 : f.largest), "driver_free",
            bytes_json(f.driver_free), ev->type == CUHEAP_EV_LIMIT ? "limit" : "driver_total",
            bytes_json(f.total_or_limit), "sites", sites, "complete", complete);
        if (o && own)
            json_object_set_new(o, "at", cuheap_recorder_json_text(asked));
        if (o && f.largest == CUHEAP_OOM_NO_POOL)
            json_object_set_new(o, "pool", json_false());
        if (o && caching)
            json_object_set_new(o, "caching_allocator", json_true());
        p->report = o;
    }
    struct text *t = &p->block;
    head(t, &f, own ? asked : NULL);
    if (caching)
        add(t, "cuheap:   (a caching allocator (PyTorch's) holds this memory: the bytes called "
               "live are its segments, its cache included)\n");
    if (f.device < 0)
        add(t, "cuheap:   call sites holding the most: not kept for host memory\n");
    else if (!nr)
        add(t, "cuheap:   call sites holding the most: none recorded on GPU %d\n", f.device);
    else
        add(t, "cuheap:   call sites holding the most:\n");
    for (unsigned i = 0; i < nr; i++) {
        char b[32];
        add(t, "cuheap:     %10s in %" PRIu64 " block%s  %s\n",
            cuheap_format_size(top[i].bytes, b, sizeof(b)), top[i].nr_blocks,
            top[i].nr_blocks == 1 ? " " : "s", names[i]);
    }
    if (lost)
        add(t,
            "cuheap:   (%" PRIu64 " events were lost to a full ring: the call sites may be "
            "wrong; raise CUHEAP_RING)\n",
            lost);
    if (paused)
        add(t, "cuheap:   (recording was paused at times: the call sites count only what was "
               "recorded)\n");
    if (live.incomplete)
        add(t, "cuheap:   (some allocations went untracked for want of host memory)\n");
    add(t, "%s; `cuheap report %s` lists them\n", later, cuheap_recorder.out_path);
    if (f.device < 0) /* pinned host memory: no caching allocator retries it */
        tell_real(p);
}

void cuheap_recorder_oom_atfork_child(void)
{
    atomic_store(&nr_told, 0);
    for (unsigned i = 0; i < NR_PENDING; i++)
        if (pending[i].used) /* the parent's: it tells them */
            drop(&pending[i]);
    nr_recoveries = nr_recovered = 0;
    cuheap_liveset_destroy(&live);
    cuheap_liveset_init(&live);
}

bool cuheap_recorder_live_figures(int device, uint64_t *ret_peak, uint64_t *ret_live)
{
    if (live.incomplete)
        return false;
    *ret_peak = cuheap_liveset_peak(&live, device);
    *ret_live = cuheap_liveset_bytes(&live, device);
    return true;
}
