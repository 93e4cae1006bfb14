/* SPDX-License-Identifier: MIT */
/*
 * Process-wide state (see runtime.h), the public API of include/cuheap/cuheap.h, the exit
 * summary and fork handling. Start-up is lazy: the first hooked call runs boot() (once,
 * under boot_lock); the library's constructor only registers a fork handler that takes
 * boot_lock, and its destructor only stops what an exit racing with start-up left running, so
 * a process that never touches CUDA runs exactly as without cuheap.
 */
#include "runtime.h"

#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cupti_audit.h"
#include "event.h"
#include "log.h"
#include "pyframes.h"
#include "recorder.h"

struct cuheap_config cuheap_cfg;
struct cuheap_addrmap cuheap_passthru;
_Atomic uint64_t cuheap_nr_passthrough, cuheap_nr_ooms;
atomic_bool cuheap_booted;

_Static_assert(CUHEAP_NR_MAX_DEVICES == CUHEAP_NR_COUNTED_DEVICES,
               "each device record has its pending-live counter");

/* Start-up and fork. boot() runs under boot_lock, and every fork takes boot_lock before the
 * child is made, so a fork on one thread while another starts cuheap waits for the start to
 * end: a child made halfway through inherited the trace writer's lock held by a writer it
 * does not have, or the loader or libunwind half updated, and hung or aborted (stress
 * fork-boot). Two sets of handlers take it:
 *  - fork_prepare & co., registered at the first boot, before boot_lock is taken (an older
 *    glibc holds its own lock through every prepare handler, and pthread_atfork waits for
 *    it): they run before the driver's (registered earlier, at cuInit), which matters for the
 *    pool locks (runtime.h), and they take boot_lock first;
 *  - a fork that was already under way when those were registered does not run them (glibc
 *    runs the handlers it saw when the fork began), so boot_guard_* are registered by the
 *    constructor, run last of all prepare handlers, and take boot_lock when fork_prepare did
 *    not. A child of such a fork that finds cuheap started cannot trust its locks (no handler
 *    of cuheap's saw them) and runs without cuheap: every hook goes to the driver.
 * Not pthread_once for boot itself: glibc runs a once again in a child forked while it was
 * in progress. */
static pthread_mutex_t boot_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static atomic_bool boot_tried; /* boot() ran, whatever its outcome; set under boot_lock */
/* per forking thread: two threads may be between prepare and parent handlers at once
 * (glibc lets a second fork in while a handler runs); boot_lock orders the rest */
static __thread unsigned fork_depth __attribute__((tls_model("initial-exec")));
static __thread bool fork_guarded __attribute__((tls_model("initial-exec")));
static struct cuheap_device devices[CUHEAP_NR_MAX_DEVICES];
static _Atomic unsigned nr_devices;
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int nr_capturing;
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream capturing_streams[64]; /* guarded by capture_lock */

static const char *env(const char *name, void *arg)
{
    (void)arg;
    return secure_getenv(name);
}

static void warn_line(const char *line, void *arg)
{
    (void)arg;
    cuheap_log_always("%s", line);
}

static void summary(void);

/* Exit stops cuheap once: the audit, the trace's footer, then the summary. An exit on one
 * thread while another starts cuheap must not end the process halfway through start-up (an
 * empty trace, a torn header, no footer and no summary: stress exit-race), so both ways in
 * wait for a start-up in progress (boot_lock) and close the door to a later one, which the
 * process's end would cut short. The wait is bounded: a start-up that does not end must not
 * hang the program's exit.
 *  - at_exit, registered first thing in start-up: it runs among the program's exit handlers
 *    in the usual order, before those registered earlier (the driver's among them);
 *  - the destructor, after every exit handler: for an exit whose handlers had all run before
 *    start-up registered at_exit. */
#define CUHEAP_EXIT_WAIT_S 10
static atomic_bool exit_began; /* set under boot_lock */

static void exit_stop(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += CUHEAP_EXIT_WAIT_S;
    if (pthread_mutex_timedlock(&boot_lock, &until))
        return;
    bool first = !atomic_exchange(&exit_began, true);
    atomic_store(&boot_tried, true);
    pthread_mutex_unlock(&boot_lock);
    if (!first || !atomic_load(&cuheap_booted))
        return;
    cuheap_audit_stop(); /* its misses and verdict go into the trace before it closes */
    cuheap_recorder_set_tap(NULL);
    cuheap_recorder_stop();
    /* after the stop, which waits for a child's trace being opened on another thread */
    if (cuheap_cfg.summary && !cuheap_recorder_idle_child())
        summary();
}

static void at_exit(void)
{
    exit_stop();
}

__attribute__((destructor)) static void exit_last(void)
{
    exit_stop();
}

pthread_mutex_t cuheap_streams_gate = PTHREAD_MUTEX_INITIALIZER;

void cuheap_streams_changed(CUcontext ctx, CUstream s, bool added)
{
    pthread_mutex_lock(&cuheap_streams_gate);
    if (added)
        cuheap_streams_add(ctx, s);
    else
        cuheap_streams_remove(s);
    pthread_mutex_unlock(&cuheap_streams_gate);
}

/* Around fork: nobody may be inside the known-stream list's lock (runtime.h), so the gate and
 * every pool lock are held, in that order (a pool lock is never held while waiting for the
 * gate), after boot_lock (a start-up in progress ends first). Devices are only ever appended,
 * so the count read here stays valid. */
static unsigned forking_devices; /* boot_lock held */
static bool forking_booted;      /* boot_lock held: whether the handlers do more than it */
/* fork_depth: the handlers run once per fork even when registered twice (a child forked while
 * fork_once was in progress, after pthread_atfork, registers them again). */

static void fork_prepare(void)
{
    if (fork_depth++)
        return;
    pthread_mutex_lock(&boot_lock);
    forking_booted = atomic_load(&cuheap_booted);
    if (!forking_booted)
        return;
    pthread_mutex_lock(&cuheap_streams_gate);
    forking_devices = atomic_load(&nr_devices);
    for (unsigned i = 0; i < forking_devices; i++)
        cuheap_pool_atfork_prepare(devices[i].pool);
    cuheap_streams_atfork_prepare();
    cuheap_recorder_atfork_prepare();
}

static void fork_parent(void)
{
    if (--fork_depth)
        return;
    if (forking_booted) {
        cuheap_recorder_atfork_parent();
        cuheap_streams_atfork_parent();
        for (unsigned i = forking_devices; i-- > 0;)
            cuheap_pool_atfork_parent(devices[i].pool);
        pthread_mutex_unlock(&cuheap_streams_gate);
    }
    pthread_mutex_unlock(&boot_lock);
}

/* cuheap_set_recording: two threads pausing and resuming at once make each change and its
 * mark together, so that the trace's marks follow the changes in order. */
static pthread_mutex_t set_recording_lock = PTHREAD_MUTEX_INITIALIZER;

/* The child cannot use the parent's device memory (CUDA does not survive fork): forget the
 * pools without touching the driver; the child's own CUDA use starts fresh. */
static void fork_child(void)
{
    if (--fork_depth)
        return;
    pthread_mutex_init(&boot_lock, NULL);
    if (!forking_booted)
        return;
    cuheap_pool_atfork_child();
    cuheap_py_atfork_child();
    pthread_mutex_init(&set_recording_lock, NULL); /* a parent's thread inside it is gone */
    unsigned n = atomic_load(&nr_devices);
    for (unsigned i = 0; i < n; i++) {
        cuheap_pool_forget(devices[i].pool);
        memset(devices[i].cuda.fences, 0, sizeof(devices[i].cuda.fences));
        atomic_store(&devices[i].reserved, 0);
        atomic_store(&devices[i].live, 0);
        atomic_store(&devices[i].peak_live, 0);
        atomic_store(&devices[i].peak_reserved, 0);
    }
    pthread_mutex_init(&devices_lock, NULL);
    pthread_mutex_init(&capture_lock, NULL);
    pthread_mutex_init(&cuheap_streams_gate, NULL); /* pool locks: cuheap_pool_forget() */
    cuheap_streams_atfork_child();
    pthread_mutex_init(&cuheap_passthru.lock, NULL);
    /* the allocation and free counts, every thread's pending live bytes and cuheap's own time
     * and driver calls start over */
    cuheap_counters_atfork_child(CUHEAP_CTR_ALLOCS, CUHEAP_CTR_CALLS - CUHEAP_CTR_ALLOCS);
    atomic_store(&cuheap_nr_passthrough, 0);
    atomic_store(&cuheap_nr_ooms, 0);
    cuheap_audit_atfork_child();
    cuheap_recorder_atfork_child();
    cuheap_defer_atfork_child();
}

static void register_fork(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Last of the prepare handlers: boot_lock, unless fork_prepare has it for this fork. */
static void boot_guard_prepare(void)
{
    if (fork_depth)
        return;
    pthread_mutex_lock(&boot_lock);
    fork_guarded = true;
}

static void boot_guard_parent(void)
{
    if (!fork_guarded)
        return;
    fork_guarded = false;
    pthread_mutex_unlock(&boot_lock);
}

/* First of the child handlers; fork_child did not run and will not. */
static void boot_guard_child(void)
{
    if (!fork_guarded)
        return;
    fork_guarded = false;
    pthread_mutex_init(&boot_lock, NULL);
    if (atomic_load(&cuheap_booted)) {
        atomic_store(&cuheap_booted, false); /* boot_tried stays: never started again here */
        cuheap_log("forked while cuheap started on another thread: this child runs without "
                   "cuheap");
    }
}

/* The one thing the constructor does (see boot_lock). */
__attribute__((constructor)) static void boot_guard_register(void)
{
    pthread_atfork(boot_guard_prepare, boot_guard_parent, boot_guard_child);
}

/* boot_lock held */
static void boot(void)
{
    atexit(at_exit);
    cuheap_clock_start(); /* own time's clock: its rate is measured from here */
    if (cuheap_driver_load() != 0)
        return;
    cuheap_config_parse(&cuheap_cfg, env, warn_line, NULL);
    if (cuheap_cfg.verbose)
        cuheap_config_dump(&cuheap_cfg, warn_line, NULL);
    if (cuheap_addrmap_init(&cuheap_passthru, 1u << 20)) {
        cuheap_log("cannot map the allocation table; cuheap stays out of the way");
        return;
    }
    cuheap_recorder_start(&cuheap_cfg);
    atomic_store(&cuheap_booted, true);
}

/* fn() with every signal blocked: a handler that calls into cuheap cannot run on this thread
 * while fn holds a lock (pthread_once included) that the handler's call would wait for. */
static void *unsignalled(void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    void *r = fn(arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

static void *boot_once_now(void *arg)
{
    (void)arg;
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&boot_lock);
    bool now = !atomic_load(&boot_tried);
    if (now) {
        boot();
        atomic_store(&boot_tried, true);
    }
    pthread_mutex_unlock(&boot_lock);
    /* After booted and outside boot_lock: CUPTI's set-up may start threads that reach a hook
     * (they must find cuheap started, not wait for it), and may register fork handlers of
     * its own (pthread_atfork under boot_lock could wait for a fork waiting for boot_lock). */
    if (now && atomic_load(&cuheap_booted) && !atomic_load(&exit_began)) {
        cuheap_recorder_set_tap(cuheap_audit_note); /* the hooks' events, as they are recorded */
        cuheap_audit_start(&cuheap_cfg);
    }
    return NULL;
}

bool cuheap_boot_slow(void)
{
    if (cuheap_busy)
        return false;
    if (!atomic_load(&boot_tried))
        unsignalled(boot_once_now, NULL);
    return atomic_load(&cuheap_booted) && !cuheap_busy;
}

static void *cuda_is_loaded(void *arg)
{
    (void)arg;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h;
}

bool cuheap_boot_if_cuda(void)
{
    if (atomic_load_explicit(&cuheap_booted, memory_order_acquire))
        return true;
    /* unsignalled: the loader takes malloc's lock, and a handler that allocates device memory
     * boots cuheap, whose own dlopen would wait for that lock forever */
    if (!unsignalled(cuda_is_loaded, NULL))
        return false;
    return cuheap_boot();
}

static void raise_peak(_Atomic uint64_t *peak, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed))
        ;
}

void cuheap_note_reserved_peak(struct cuheap_device *d)
{
    if (d)
        raise_peak(&d->peak_reserved, atomic_load_explicit(&d->reserved, memory_order_relaxed));
}

static void pool_note(struct cuheap_pool *p, const struct cuheap_pool_note *n)
{
    struct cuheap_rec r = {
        .type = (uint8_t)n->type,
        .api = CUHEAP_API_NONE,
        .flags = CUHEAP_EVF_POOLED,
        .device = (int16_t)((struct cuheap_device *)n->owner)->ordinal,
        .ptr = n->ptr,
        .size = n->size,
        .actual = n->size,
        .aux = n->aux,
        .aux2 = n->aux2,
    };
    if (n->type == CUHEAP_EV_OOM || n->type == CUHEAP_EV_LIMIT)
        return; /* the hook records these with the program's stack */
    cuheap_record(&r);
    if (n->type == CUHEAP_EV_ARENA_GROW) {
        struct cuheap_device *d = n->owner;
        /* d->reserved was moved by the pool itself; only the peak needs a look */
        cuheap_note_reserved_peak(d);
    }
}

static struct cuheap_device *create_device_locked(CUcontext ctx)
{
    unsigned n = atomic_load(&nr_devices);
    if (n == CUHEAP_NR_MAX_DEVICES)
        return NULL;
    struct cuheap_device *d = &devices[n];
    if (!d->pool && !(d->pool = cuheap_pool_create()))
        return NULL;
    CUdevice dev = 0;
    if (cuheap_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    size_t total = 0;
    cuheap_drv.cuDeviceTotalMem_v2(&total, dev);
    char name[128] = "unknown";
    if (cuheap_drv.cuDeviceGetName)
        cuheap_drv.cuDeviceGetName(name, sizeof(name), dev);
    d->ordinal = (int)dev;
    d->index = n;
    d->total = total;
    d->limit = cuheap_cfg.limit_permille ? (uint64_t)total / 1000 * cuheap_cfg.limit_permille
                                         : cuheap_cfg.limit_bytes;
    struct cuheap_backend be;
    cuheap_backend_cuda_init(&d->cuda, ctx, d->ordinal, &be);
    cuheap_pool_init(d->pool, &cuheap_cfg, &be, d->ordinal, d->limit, &d->reserved, pool_note, d);
    cuheap_pool_set_capturing(d->pool, (unsigned)atomic_load(&nr_capturing));
    atomic_store_explicit(&d->ctx, ctx, memory_order_release);
    atomic_store_explicit(&nr_devices, n + 1, memory_order_release);
    cuheap_recorder_device(d->ordinal, name, total);
    return d;
}

/* The calling thread's last answer: the driver is still asked for the current context on
 * every call (programs switch contexts behind our back), the table only when it changed. A
 * retired record's ctx is NULL, so it never matches again. */
static __thread CUcontext last_ctx __attribute__((tls_model("initial-exec")));
static __thread struct cuheap_device *last_device __attribute__((tls_model("initial-exec")));

static struct cuheap_device *device_lookup(CUcontext ctx)
{
    unsigned n = atomic_load_explicit(&nr_devices, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (atomic_load_explicit(&devices[i].ctx, memory_order_relaxed) == ctx)
            return &devices[i];
    pthread_mutex_lock(&devices_lock);
    struct cuheap_device *d = NULL;
    n = atomic_load(&nr_devices);
    for (unsigned i = 0; i < n && !d; i++)
        if (atomic_load(&devices[i].ctx) == ctx)
            d = &devices[i];
    bool fresh = false;
    if (!d) {
        d = create_device_locked(ctx);
        fresh = d != NULL;
    }
    pthread_mutex_unlock(&devices_lock);
    int r = fresh && cuheap_cfg.pool && cuheap_cfg.pool_init
                ? cuheap_pool_reserve(d->pool, cuheap_cfg.pool_init)
                : 0;
    if (r == -EIO) { /* said, not left for the user to find out from a pool that stays empty */
        struct cuheap_pool_stats ps;
        cuheap_pool_get_stats(d->pool, &ps);
        cuheap_log("CUHEAP_POOL_INIT: nothing reserved on device %d: every request goes to the "
                   "driver (%s)",
                   d->ordinal,
                   ps.vmm_refused == CUHEAP_VMM_ABSENT ? "the device has no vmm"
                                                       : "the driver refused the vmm backing");
    } else if (r)
        cuheap_log("CUHEAP_POOL_INIT: could only reserve %" PRIu64 " bytes on device %d",
                   (uint64_t)atomic_load(&d->reserved), d->ordinal);
    return d;
}

/* cuheap_device_current() when the thread's context changed: look it up and remember it. */
static __attribute__((noinline)) struct cuheap_device *device_changed(CUcontext ctx)
{
    struct cuheap_device *d = device_lookup(ctx);
    if (d) {
        last_ctx = ctx;
        last_device = d;
    }
    return d;
}

struct cuheap_device *cuheap_device_current(void)
{
    CUcontext ctx = NULL;
    if (cuheap_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    struct cuheap_device *d = last_device;
    if (__builtin_expect(ctx == last_ctx && d, 1) &&
        atomic_load_explicit(&d->ctx, memory_order_acquire) == ctx)
        return d;
    return device_changed(ctx);
}

struct cuheap_device *cuheap_device_by_ctx(CUcontext ctx)
{
    unsigned n = atomic_load_explicit(&nr_devices, memory_order_acquire);
    for (unsigned i = 0; ctx && i < n; i++)
        if (atomic_load(&devices[i].ctx) == ctx)
            return &devices[i];
    return NULL;
}

void cuheap_device_gone(struct cuheap_device *d, bool dead)
{
    uint64_t pooled_live = cuheap_pool_abandon(d->pool);
    uint64_t size = 0, actual = 0;
    cuheap_addrmap_drop_device(&cuheap_passthru, d->ordinal, &size, &actual);
    cuheap_account(d, -(int64_t)(pooled_live + size), -(int64_t)actual);
    char label[96];
    snprintf(label, sizeof(label), "GPU %d context %s: %s of live allocations went with it",
             d->ordinal, dead ? "destroyed" : "reset", "all");
    cuheap_record_mark(d->ordinal, label);
    if (dead)
        atomic_store(&d->ctx, NULL); /* a new context at this address gets a new record */
}

struct cuheap_device *cuheap_device_by_ordinal(int ordinal)
{
    unsigned n = atomic_load_explicit(&nr_devices, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (devices[i].ordinal == ordinal && atomic_load(&devices[i].ctx))
            return &devices[i];
    return NULL;
}

void cuheap_account_now(struct cuheap_device *d, int64_t live, int64_t reserved)
{
    if (!d)
        return;
    uint64_t l =
        atomic_fetch_add_explicit(&d->live, (uint64_t)live, memory_order_relaxed) + (uint64_t)live;
    if (live > 0 && (int64_t)l > 0) /* below 0: frees added before their allocations */
        raise_peak(&d->peak_live, l);
    /* a pooled pair of 2 MiB or more comes here with no reserved bytes: adding 0 took the line
     * from every other thread, a large share of contending threads' time */
    if (!reserved)
        return;
    uint64_t r = atomic_fetch_add_explicit(&d->reserved, (uint64_t)reserved, memory_order_relaxed) +
                 (uint64_t)reserved;
    raise_peak(&d->peak_reserved, r);
}

uint64_t cuheap_device_live(struct cuheap_device *d)
{
    int64_t live = (int64_t)atomic_load_explicit(&d->live, memory_order_relaxed) +
                   cuheap_counters_sum(CUHEAP_CTR_LIVE + d->index);
    return live > 0 ? (uint64_t)live : 0;
}

/* The peak live of d, at least what is live now (which a thread may still hold back). */
static uint64_t device_peak_live(struct cuheap_device *d)
{
    uint64_t peak = atomic_load(&d->peak_live), live = cuheap_device_live(d);
    return live > peak ? live : peak;
}

bool cuheap_capture_changed(CUstream s, bool begin)
{
    if (!s)
        return false; /* the legacy stream cannot capture; NULL marks an empty slot below */
    pthread_mutex_lock(&capture_lock);
    int slot = -1;
    for (int i = 0; i < 64; i++)
        if (capturing_streams[i] == s) {
            slot = i;
            break;
        }
    bool changed = false;
    if (begin && slot < 0) {
        for (int i = 0; i < 64; i++)
            if (!capturing_streams[i]) {
                capturing_streams[i] = s;
                changed = true;
                break;
            }
    } else if (!begin && slot >= 0) {
        capturing_streams[slot] = NULL;
        changed = true;
    }
    if (changed) {
        atomic_fetch_add(&nr_capturing, begin ? 1 : -1);
        unsigned n = atomic_load(&nr_devices);
        for (unsigned i = 0; i < n; i++)
            cuheap_pool_capture(devices[i].pool, begin ? 1 : -1);
    }
    pthread_mutex_unlock(&capture_lock);
    return changed;
}

bool cuheap_capturing(void)
{
    return atomic_load_explicit(&nr_capturing, memory_order_relaxed) > 0;
}

/* ---- public API ---- */

/* The time in driver calls of a kind: those measured, scaled to all (record and query are
 * measured only inside a timed call). */
static uint64_t driver_ns(unsigned kind, uint64_t *ret_calls)
{
    int64_t calls = cuheap_counters_sum(CUHEAP_CTR_DRV_CALLS + kind);
    int64_t timed = cuheap_counters_sum(CUHEAP_CTR_DRV_TIMED + kind);
    uint64_t ns = cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_DRV_TICKS + kind));
    *ret_calls = calls > 0 ? (uint64_t)calls : 0;
    return timed > 0 && calls > timed ? (uint64_t)((double)ns * (double)calls / (double)timed) : ns;
}

/* cuheap's own time and its driver calls by kind, summed over threads. */
static void own_time(struct cuheap_stats *s)
{
    s->own_alloc_ns = cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_ALLOC));
    s->own_free_ns = cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_FREE));
    s->nr_own_timed = (uint64_t)cuheap_counters_sum(CUHEAP_CTR_OWN_TIMED);
    s->program_ns = driver_ns(CUHEAP_DRV_PROGRAM, &s->nr_program_calls);
    s->map_calls_ns = driver_ns(CUHEAP_DRV_MAP, &s->nr_map_calls);
    s->record_ns = driver_ns(CUHEAP_DRV_RECORD, &s->nr_record_calls);
    s->query_ns = driver_ns(CUHEAP_DRV_QUERY, &s->nr_query_calls);
    s->sync_ns = driver_ns(CUHEAP_DRV_SYNC, &s->nr_sync_calls);
    s->other_ns = driver_ns(CUHEAP_DRV_OTHER, &s->nr_other_calls);
}

CUHEAP_API int cuheap_get_stats(struct cuheap_stats *ret, size_t size)
{
    if (!ret || size == 0)
        return -EINVAL;
    struct cuheap_stats s = {0};
    unsigned n = atomic_load(&nr_devices);
    for (unsigned i = 0; i < n; i++) {
        struct cuheap_device *d = &devices[i];
        struct cuheap_pool_stats ps;
        cuheap_pool_get_stats(d->pool, &ps);
        s.live_bytes += cuheap_device_live(d);
        s.peak_live_bytes += device_peak_live(d);
        s.reserved_bytes += atomic_load(&d->reserved);
        s.peak_reserved_bytes += atomic_load(&d->peak_reserved);
        s.nr_pool_hits += ps.nr_hits;
        s.nr_pool_misses += ps.nr_misses;
        s.nr_arenas += ps.nr_arenas;
        s.nr_chunks_created += ps.nr_creates;
        s.nr_chunks_moved += ps.nr_moves;
        s.nr_chunks_released += ps.nr_releases;
        s.map_ns += ps.map_ns;
    }
    s.nr_allocs = (uint64_t)cuheap_counters_sum(CUHEAP_CTR_ALLOCS);
    s.nr_frees = (uint64_t)cuheap_counters_sum(CUHEAP_CTR_FREES);
    s.nr_passthrough = atomic_load(&cuheap_nr_passthrough);
    s.nr_ooms = atomic_load(&cuheap_nr_ooms);
    struct cuheap_recorder_stats rs;
    cuheap_recorder_get_stats(&rs);
    s.nr_events = rs.nr_events;
    s.nr_dropped = rs.nr_dropped;
    own_time(&s);
    memcpy(ret, &s, size < sizeof(s) ? size : sizeof(s));
    return 0;
}

CUHEAP_API int cuheap_set_recording(int on)
{
    /* CUHEAP_RECORD=0, or a recorder that could not start (no ring, no writer) */
    if (cuheap_busy || !cuheap_boot() || !cuheap_recording())
        return -1;
    cuheap_busy = 1; /* as in cuheap_mark */
    pthread_mutex_lock(&set_recording_lock);
    bool was_paused = cuheap_recorder_pause(!on);
    if (was_paused == (on != 0)) { /* a change: marks go in paused or not */
        struct cuheap_device *d = cuheap_device_current();
        cuheap_record_mark(d ? d->ordinal : -1,
                           on ? "cuheap: recording resumed" : "cuheap: recording paused");
    }
    pthread_mutex_unlock(&set_recording_lock);
    cuheap_unbusy();
    return !was_paused;
}

CUHEAP_API void cuheap_mark(const char *label)
{
    if (cuheap_busy || !cuheap_boot())
        return;
    /* The re-entry guard (runtime.h): while this thread may hold devices_lock (a new
     * context's record) or a child's child_start_lock, a hook that a signal handler reaches
     * goes to the driver instead of waiting for them. */
    cuheap_busy = 1;
    struct cuheap_device *d = cuheap_device_current();
    cuheap_record_mark(d ? d->ordinal : -1, label ? label : "");
    cuheap_unbusy();
}

/* A driver error's name, as the driver gives it, else its number. */
static const char *error_name(int code, char *buf, size_t size)
{
    const char *s = NULL;
    if (cuheap_drv.cuGetErrorName &&
        cuheap_drv.cuGetErrorName((CUresult)code, &s) == CUDA_SUCCESS && s)
        return s;
    snprintf(buf, size, "CUDA error %d", code);
    return buf;
}

/* Peak live as the hooks count it, for where the trace's figure cannot be had (recording off
 * or paused): each thread adds its live bytes to the device's record CUHEAP_LIVE_BATCH at a
 * time (the shared block adds at once), so the recorded peak can be off by less than that per
 * thread: a program of small allocations never adds any ("peak live 0 B"). Live bytes never
 * exceed reserved ones. Where the bound is more than 1% above the recorded peak, both are
 * said ("A to B"), rather than a figure that may be far too low. Returns whether it did. */
static bool hooks_peak_live(struct cuheap_device *d, uint64_t peak_res, char *ret, size_t size)
{
    uint64_t peak = device_peak_live(d);
    uint64_t most = peak + (uint64_t)(cuheap_counters_nr_blocks() - 1) * CUHEAP_LIVE_BATCH;
    bool by_res = most >= peak_res; /* "at most" reserved; else "under" the batches' bound */
    most = by_res ? (peak_res > peak ? peak_res : peak) : most;
    char a[32], b[32];
    cuheap_format_size(peak, a, sizeof(a));
    cuheap_format_size(most, b, sizeof(b));
    if (most <= peak + peak / 100)
        snprintf(ret, size, "%s", a);
    else if (peak)
        snprintf(ret, size, "%s to %s", a, b);
    else
        snprintf(ret, size, "%s %s", by_res ? "at most" : "under", b);
    return most > peak + peak / 100;
}

#define CUHEAP_LIVE_WHY "threads count live bytes 1 MiB at a time"

/* Where the trace is, or why there is none, as the end of the summary's line: "" when the
 * line after it says what went wrong. */
static const char *trace_words(const struct cuheap_recorder_stats *rs, char *buf, size_t size)
{
    if (rs->state == CUHEAP_TRACE_WRITTEN)
        snprintf(buf, size, "; trace: %s", rs->path);
    else if (rs->state == CUHEAP_TRACE_NONE)
        snprintf(buf, size, "; no trace written");
    else
        buf[0] = 0;
    return buf;
}

static void summary_details(const struct cuheap_stats *s, const struct cuheap_recorder_stats *rs);

/* At exit, by default one line per GPU with the figures `cuheap report` prints for its trace:
 * peak live, peak reserved, what was never freed, the out-of-memory errors the program got
 * (process-wide: on the line of the only GPU, else a line of their own) and where the trace
 * is. Then only what went wrong (events lost, a trace not written, the driver refusing VMM or
 * fences); CUHEAP_VERBOSE=1 adds the pool's and the recorder's own figures. */
static void summary(void)
{
    struct cuheap_stats s;
    cuheap_get_stats(&s, sizeof(s));
    struct cuheap_recorder_stats rs;
    cuheap_recorder_get_stats(&rs);
    unsigned n = atomic_load(&nr_devices);
    char tw[CUHEAP_PATH_MAX + 32], oom[64];
    trace_words(&rs, tw, sizeof(tw));
    uint64_t recovered = cuheap_recorder_oom_recovered();
    snprintf(oom, sizeof(oom), "%" PRIu64 " out-of-memory error%s%s", s.nr_ooms,
             s.nr_ooms == 1 ? "" : "s", recovered ? " (recovered from: " : "");
    if (recovered)
        snprintf(oom + strlen(oom), sizeof(oom) - strlen(oom), "%" PRIu64 ")", recovered);
    /* the writer's count of the events is the trace's, unless it saw none */
    bool traced = cuheap_cfg.record && rs.state != CUHEAP_TRACE_NONE;
    for (unsigned i = 0; i < n; i++) {
        struct cuheap_device *d = &devices[i];
        char pl[192], pr[32], nf[32];
        uint64_t peak_res = atomic_load(&d->peak_reserved), peak = 0, left = 0;
        /* the trace's figure, unless it holds less than the hooks saw for sure (recording
         * paused, events lost): then the hooks' */
        uint64_t slack = (uint64_t)cuheap_counters_nr_blocks() * CUHEAP_LIVE_BATCH;
        if (traced && cuheap_recorder_live_figures(d->ordinal, &peak, &left) &&
            peak + slack >= device_peak_live(d)) {
            cuheap_format_size(peak, pl, sizeof(pl));
        } else {
            char h[96];
            bool range = hooks_peak_live(d, peak_res, h, sizeof(h));
            snprintf(pl, sizeof(pl), "%s (%s%s%s)", h,
                     traced ? "the trace holds less" : "not recorded", range ? ": " : "",
                     range ? CUHEAP_LIVE_WHY : "");
            left = cuheap_device_live(d);
        }
        cuheap_format_size(peak_res, pr, sizeof(pr));
        cuheap_format_size(left, nf, sizeof(nf));
        cuheap_log_always("GPU %d: peak live %s, peak reserved %s, %s never freed%s%s%s",
                          d->ordinal, pl, pr, nf, n == 1 ? ", " : "", n == 1 ? oom : "",
                          n == 1 ? tw : "");
    }
    if (n != 1)
        cuheap_log_always("%s%s", n ? oom : "no device memory allocated", tw);
    /* what went wrong, whatever the verbosity */
    for (unsigned i = 0; i < n; i++) {
        struct cuheap_device *d = &devices[i];
        struct cuheap_pool_stats ps;
        cuheap_pool_get_stats(d->pool, &ps);
        if (ps.vmm_refused == CUHEAP_VMM_ABSENT)
            cuheap_log_always("GPU %d: no VMM on this device or driver: requests go to the driver "
                              "(CUHEAP_BACKING=legacy for a pool of cuMemAlloc arenas)",
                              d->ordinal);
        else if (ps.vmm_refused) {
            int code = atomic_load_explicit(&d->cuda.vmm_failed_code, memory_order_relaxed);
            const char *call = atomic_load_explicit(&d->cuda.vmm_failed_call, memory_order_relaxed);
            char name[48];
            /* once the pool held nothing, every request; before, its memory was still used */
            cuheap_log_always("GPU %d: vmm refused by the driver (%s: %s): %s (CUHEAP_BACKING="
                              "legacy for a pool of cuMemAlloc arenas)",
                              d->ordinal, call ? call : "a VMM call",
                              error_name(code, name, sizeof(name)),
                              ps.to_driver ? "every request goes to the driver"
                                           : "requests for new memory go to the driver, what "
                                             "the pool holds still serves the rest");
        }
        if (ps.fences_refused) {
            char name[48];
            int code = atomic_load_explicit(&d->cuda.query_refused_code, memory_order_relaxed);
            cuheap_log_always("GPU %d: fence queries refused by the driver (cuEventQuery: %s) "
                              "outside any capture: freed blocks wait for a device sync",
                              d->ordinal, error_name(code, name, sizeof(name)));
        }
    }
    if (rs.nr_full)
        cuheap_log_always("%" PRIu64 " events were dropped: raise CUHEAP_RING (now %u) or lower "
                          "CUHEAP_STACK_DEPTH",
                          rs.nr_full, cuheap_cfg.ring_slots);
    if (rs.nr_dropped > rs.nr_full)
        cuheap_log_always("%" PRIu64 " events came after recording stopped at exit (threads "
                          "still running) and are not in the trace",
                          rs.nr_dropped - rs.nr_full);
    if (cuheap_cfg.verbose)
        summary_details(&s, &rs);
    if (!cuheap_cfg.record)
        return;
    struct cuheap_recorder_timing t;
    cuheap_recorder_get_timing(&t);
    if (t.on) {
        cuheap_log_always("recording cost (CUHEAP_RECORD_TIMING): %" PRIu64
                          " events, %.0f ns each in the ring; %" PRIu64
                          " native walks, %.0f ns each for %.1f frames (%" PRIu64
                          " over 2 us, %" PRIu64 " walked again in full); %" PRIu64
                          " Python captures, %.0f ns each for %.1f frames (clock reads of "
                          "%.0f ns taken off)",
                          t.nr_events, t.ring_ns, t.nr_native, t.unwind_ns, t.frames, t.nr_slow,
                          t.nr_rewalks, t.nr_python, t.python_ns, t.py_frames, t.clock_ns);
        cuheap_log_always("recording cost (CUHEAP_RECORD_TIMING): writer %" PRIu64
                          " events, %.0f ns each in the stack table, %.0f ns writing; writer "
                          "CPU %.3f s of %.3f s (%.1f%% of one core, %.0f ns an event)",
                          t.nr_written, t.intern_ns, t.write_ns, t.writer_cpu_s, t.wall_s,
                          t.wall_s > 0 ? 100.0 * t.writer_cpu_s / t.wall_s : 0.0,
                          t.nr_written ? t.writer_cpu_s * 1e9 / (double)t.nr_written : 0.0);
    }
    if (rs.name_too_long)
        cuheap_log_always("refused CUHEAP_OUTPUT as the trace's name: it expands to more than %d "
                          "bytes (the default name was used)",
                          CUHEAP_PATH_MAX - 1);
    if (rs.refused)
        cuheap_log_always("refused %s as the trace: %s", rs.refused, rs.refused_why);
    /* Name a file only when there is one to read (a written one is on the lines above). */
    switch (rs.state) {
    case CUHEAP_TRACE_WRITTEN:
    case CUHEAP_TRACE_NONE:
        break;
    case CUHEAP_TRACE_PARTIAL:
        cuheap_log_always("trace: %s is partial: writing stopped (%s); the events before that "
                          "point are readable",
                          rs.path, strerror(rs.error));
        break;
    case CUHEAP_TRACE_NOT_CREATED:
        cuheap_log_always("no trace written: %s could not be created (%s)", rs.path,
                          strerror(rs.error));
        break;
    case CUHEAP_TRACE_LOST:
        cuheap_log_always("no trace written: %s could not be written (%s)", rs.path,
                          strerror(rs.error));
        break;
    }
}

/* CUHEAP_VERBOSE=1: per GPU the pool's figures (hits, fences, mapping work),
 * then the process's counts and how stacks were taken; one line each, labelled, so that a
 * part of the pool with figures of its own adds a line here. */
static void summary_details(const struct cuheap_stats *s, const struct cuheap_recorder_stats *rs)
{
    unsigned n = atomic_load(&nr_devices);
    for (unsigned i = 0; i < n; i++) {
        struct cuheap_device *d = &devices[i];
        struct cuheap_pool_stats ps;
        cuheap_pool_get_stats(d->pool, &ps);
        uint64_t tries = ps.nr_hits + ps.nr_misses;
        char live[96];
        bool range = hooks_peak_live(d, atomic_load(&d->peak_reserved), live, sizeof(live));
        cuheap_log_always("GPU %d: pool: hit rate %.1f%% (%" PRIu64 " of %" PRIu64
                          "); the hooks' count of peak live %s%s%s%s",
                          d->ordinal, tries ? 100.0 * (double)ps.nr_hits / (double)tries : 0.0,
                          ps.nr_hits, tries, live, range ? " (" : "", range ? CUHEAP_LIVE_WHY : "",
                          range ? ")" : "");
        if (ps.nr_fences || ps.nr_idle)
            cuheap_log_always("GPU %d: fences: %" PRIu64 " recorded; %" PRIu64
                              " times every stream was idle and none was needed "
                              "(CUHEAP_IDLE_CHECK)",
                              d->ordinal, ps.nr_fences, ps.nr_idle);
        if (cuheap_pool_is_vmm(d->pool))
            cuheap_log_always("GPU %d: vmm: %" PRIu64 " chunks taken from the driver, %" PRIu64
                              " moved, %" PRIu64 " given back to make room, %" PRIu64
                              " fence waits, %.1f ms polling and waiting for fences, %.1f ms "
                              "in mapping calls",
                              d->ordinal, ps.nr_creates, ps.nr_moves, ps.nr_releases, ps.nr_waits,
                              (double)ps.fence_ns / 1e6, (double)ps.map_ns / 1e6);
    }
    cuheap_log_always("own time: %.3f ms in allocations, %.3f ms in frees, the driver's calls "
                      "left out (%" PRIu64 " calls timed; those the pool served one in %d a "
                      "thread, scaled); the program's calls passed to the driver: %" PRIu64
                      ", %.3f ms",
                      (double)s->own_alloc_ns / 1e6, (double)s->own_free_ns / 1e6, s->nr_own_timed,
                      CUHEAP_OWN_EVERY, s->nr_program_calls, (double)s->program_ns / 1e6);
    cuheap_log_always("the pool's driver calls: mapping %" PRIu64
                      " (%.3f ms), event record %" PRIu64 " (%.3f ms), query %" PRIu64
                      " (%.3f ms), synchronize %" PRIu64 " (%.3f ms), other %" PRIu64 " (%.3f ms)",
                      s->nr_map_calls, (double)s->map_calls_ns / 1e6, s->nr_record_calls,
                      (double)s->record_ns / 1e6, s->nr_query_calls, (double)s->query_ns / 1e6,
                      s->nr_sync_calls, (double)s->sync_ns / 1e6, s->nr_other_calls,
                      (double)s->other_ns / 1e6);
    cuheap_log_always("counts: %" PRIu64 " allocations, %" PRIu64 " frees, %" PRIu64
                      " passed to the driver, %" PRIu64 " out-of-memory; %" PRIu64
                      " events, %" PRIu64 " dropped; stacks: %s",
                      s->nr_allocs, s->nr_frees, s->nr_passthrough, s->nr_ooms, rs->nr_events,
                      rs->nr_dropped, rs->unwinder ? rs->unwinder : "none");
}
