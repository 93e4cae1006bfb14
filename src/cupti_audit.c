/* SPDX-License-Identifier: MIT */
/*
 * The CUPTI side of CUHEAP_AUDIT (see cupti_audit.h): finds and opens libcupti.so at run time
 * (never a NEEDED entry), subscribes, enables CUPTI_ACTIVITY_KIND_MEMORY2 and feeds its
 * records to the matcher in audit.c; cuheap_record() feeds the hooks' side through a
 * lock-free queue.
 *
 * Threads and locks: hooks only push into the queue. CUPTI's callbacks on the driver's memory
 * functions run on the program's threads inside those driver calls (cuheap's own included, with
 * the pool lock held): they only store into a lock-free table. The matcher runs under
 * match_lock, taken only in CUPTI's buffer-completed callback (a CUPTI thread, or whichever
 * thread flushes) and at exit; nothing holding it calls the driver, and no hook ever waits for
 * it. Misses go into the trace through cuheap_record(), which is lock-free.
 */
#include "cupti_audit.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "driver.h"
#include "event.h"
#include "log.h"
#include "guard.h"

atomic_bool cuheap_auditing;

#if __has_include(<cupti_activity.h>)
#include <cupti.h>

/* Slots for hooked operations between two CUPTI buffers (40 bytes each, mapped lazily): a
 * buffer holds about 70,000 memory records, so the queue outlasts it many times over. */
#define QUEUE_SLOTS   (1u << 20)
#define BUFFER_BYTES  (8u << 20)
#define FLUSH_MS      1000 /* CUPTI hands over a buffer at least this often */
#define SUMMARY_LISTS 4    /* misses named in the exit line; the trace has all */

#define CUPTI_FUNCS(X)                                                                             \
    X(cuptiSubscribe, CUptiResult, (CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *))         \
    X(cuptiUnsubscribe, CUptiResult, (CUpti_SubscriberHandle))                                     \
    X(cuptiActivityRegisterCallbacks, CUptiResult,                                                 \
      (CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc))                       \
    X(cuptiActivityEnable, CUptiResult, (CUpti_ActivityKind))                                      \
    X(cuptiActivityDisable, CUptiResult, (CUpti_ActivityKind))                                     \
    X(cuptiActivityFlushAll, CUptiResult, (uint32_t))                                              \
    X(cuptiActivityGetNextRecord, CUptiResult, (uint8_t *, size_t, CUpti_Activity **))             \
    X(cuptiActivityGetNumDroppedRecords, CUptiResult, (CUcontext, uint32_t, size_t *))             \
    X(cuptiGetResultString, CUptiResult, (CUptiResult, const char **))

static struct {
#define CUPTI_PTR(name, ret, args) ret(CUPTIAPI *name) args;
    CUPTI_FUNCS(CUPTI_PTR)
#undef CUPTI_PTR
    CUptiResult(CUPTIAPI *cuptiActivityFlushPeriod)(uint32_t); /* optional: CUDA 11.1 on */
    /* optional: the API call behind each record (correlation id -> function name) */
    CUptiResult(CUPTIAPI *cuptiEnableCallback)(uint32_t, CUpti_SubscriberHandle,
                                               CUpti_CallbackDomain, CUpti_CallbackId);
    CUptiResult(CUPTIAPI *cuptiGetCallbackName)(CUpti_CallbackDomain, uint32_t, const char **);
} cupti;

static void *cupti_handle;
static char cupti_path[CUHEAP_PATH_MAX];
static CUpti_SubscriberHandle subscriber;
static struct cuheap_audit_queue queue;
static pthread_mutex_t match_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cuheap_audit matcher; /* guarded by match_lock */
static uint64_t nr_cupti_dropped;   /* guarded by match_lock */
static bool matcher_failed;         /* guarded by match_lock: out of memory once */
static bool stopped;                /* guarded by match_lock */
static bool verbose;                /* CUHEAP_VERBOSE: how the two sides matched, at exit */

static const char *result_string(CUptiResult r)
{
    const char *s = NULL;
    if (cupti.cuptiGetResultString && cupti.cuptiGetResultString(r, &s) == CUPTI_SUCCESS && s)
        return s;
    return "unknown CUPTI error";
}

/* ---- finding libcupti.so ---- */

struct loaded_search {
    const char *needle;
    char path[CUHEAP_PATH_MAX];
};

static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct loaded_search *s = arg;
    const char *base = strrchr(info->dlpi_name, '/');
    if (base && strstr(base + 1, s->needle) == base + 1) {
        snprintf(s->path, sizeof(s->path), "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

/* The path of a loaded object whose file name starts with needle, or "". */
static const char *loaded(const char *needle, struct loaded_search *s)
{
    s->needle = needle;
    s->path[0] = 0;
    dl_iterate_phdr(find_loaded, s);
    return s->path;
}

/* Open the first file the pattern matches (highest version last in glob's order). */
static void *open_glob(const char *pattern)
{
    glob_t g;
    void *h = NULL;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = g.gl_pathc; i-- > 0 && !h;) {
            h = dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_LOCAL);
            if (h)
                snprintf(cupti_path, sizeof(cupti_path), "%s", g.gl_pathv[i]);
        }
        globfree(&g);
    }
    return h;
}

static void *open_in(const char *dir, const char *sub)
{
    char pattern[CUHEAP_PATH_MAX + 64];
    snprintf(pattern, sizeof(pattern), "%s/%s/libcupti.so*", dir, sub);
    return open_glob(pattern);
}

/* Where CUPTI is looked for, first found wins:
 *   - a copy the process has loaded already (a framework's profiler): two copies of CUPTI in
 *     one process would both attach to the driver;
 *   - next to the CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda);
 *   - a framework's own copy: PyTorch's wheels bring one in nvidia/cuda_cupti or nvidia/cu13
 *     beside torch/lib, or in torch/lib itself;
 *   - the library path. */
static void *open_cupti(const char *given, char *why, size_t why_size)
{
    if (given[0]) {
        void *h = dlopen(given, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(why, why_size, "cannot open %s (%s)", given, dlerror());
        else
            snprintf(cupti_path, sizeof(cupti_path), "%s", given);
        return h;
    }
    struct loaded_search s;
    void *h = NULL;
    if (loaded("libcupti.so", &s)[0] && (h = dlopen(s.path, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(cupti_path, sizeof(cupti_path), "%s", s.path);
        return h;
    }
    const char *roots[] = {secure_getenv("CUDA_HOME"), secure_getenv("CUDA_PATH"),
                           "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]) && !h; i++)
        if (roots[i] && roots[i][0])
            h = (h = open_in(roots[i], "extras/CUPTI/lib64")) ? h : open_in(roots[i], "lib64");
    const char *torch = loaded("libtorch_cuda.so", &s)[0] ? s.path : loaded("libc10_cuda.so", &s);
    if (!h && torch[0]) {
        char dir[CUHEAP_PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", torch);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        h = open_in(dir, ".");
        if (!h)
            h = open_in(dir, "../../nvidia/cuda_cupti/lib");
        if (!h)
            h = open_in(dir, "../../nvidia/cu13/lib");
    }
    static const char *const names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !h; i++)
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)))
            snprintf(cupti_path, sizeof(cupti_path), "%s", names[i]);
    if (!h)
        snprintf(why, why_size,
                 "no libcupti.so found (next to the CUDA toolkit, a framework's copy or on the "
                 "library path; CUHEAP_AUDIT=/path/libcupti.so names one)");
    return h;
}

static int resolve(char *why, size_t why_size)
{
    cuheap_dlsym_fn sym = cuheap_real_dlsym();
#define CUPTI_RESOLVE(name, ret, args)                                                             \
    if (!(*(void **)&cupti.name = sym(cupti_handle, #name))) {                                     \
        snprintf(why, why_size, "%s has no %s", cupti_path, #name);                                \
        return -ENOENT;                                                                            \
    }
    CUPTI_FUNCS(CUPTI_RESOLVE)
#undef CUPTI_RESOLVE
    *(void **)&cupti.cuptiActivityFlushPeriod = sym(cupti_handle, "cuptiActivityFlushPeriod");
    *(void **)&cupti.cuptiEnableCallback = sym(cupti_handle, "cuptiEnableCallback");
    *(void **)&cupti.cuptiGetCallbackName = sym(cupti_handle, "cuptiGetCallbackName");
    return 0;
}

/* ---- naming the API call behind a record ---- */

/* The driver's memory functions each call came through, by correlation id: filled on the
 * calling thread inside the driver call, read when CUPTI hands over the record. Lock-free; a
 * slot is reused every NR_NAMES memory calls, long after its record was handed over. */
#define NR_NAMES (1u << 16)
static struct api_name {
    _Atomic uint32_t correlation; /* 0 while being written */
    _Atomic(const char *) name;   /* CUPTI's own string */
} api_names[NR_NAMES];

static void CUPTIAPI on_callback(void *arg, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                                 const void *data)
{
    (void)arg;
    (void)id;
    const CUpti_CallbackData *d = data;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || d->callbackSite != CUPTI_API_ENTER)
        return;
    struct api_name *n = &api_names[d->correlationId % NR_NAMES];
    atomic_store_explicit(&n->correlation, 0, memory_order_relaxed);
    atomic_store_explicit(&n->name, d->functionName, memory_order_release);
    atomic_store_explicit(&n->correlation, d->correlationId, memory_order_release);
}

static const char *api_of(uint32_t correlation)
{
    struct api_name *n = &api_names[correlation % NR_NAMES];
    if (!correlation || atomic_load_explicit(&n->correlation, memory_order_acquire) != correlation)
        return NULL;
    const char *name = atomic_load_explicit(&n->name, memory_order_acquire);
    return atomic_load_explicit(&n->correlation, memory_order_acquire) == correlation ? name : NULL;
}

/* Driver functions that allocate, map or free memory: the callbacks that name a record's
 * API call. Chosen by name, so a newer CUPTI's ids need no table here. */
static bool memory_function(const char *name)
{
    static const char *const verbs[] = {"Alloc", "Free",    "Create",       "Release",       "Map",
                                        "Unmap", "Destroy", "HostRegister", "HostUnregister"};
    if (strncmp(name, "cuMem", 5) && strncmp(name, "cuArray", 7) &&
        strncmp(name, "cuMipmappedArray", 16))
        return false;
    if (!strncmp(name, "cuMemcpy", 8) || !strncmp(name, "cuMemset", 8))
        return false;
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        if (strstr(name, verbs[i]))
            return true;
    return false;
}

static void enable_name_callbacks(void)
{
    if (!cupti.cuptiEnableCallback || !cupti.cuptiGetCallbackName)
        return;
    for (uint32_t id = 1; id < CUPTI_DRIVER_TRACE_CBID_SIZE; id++) {
        const char *name = NULL;
        if (cupti.cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) == CUPTI_SUCCESS &&
            name && memory_function(name))
            cupti.cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
    }
}

/* ---- the two sides ---- */

static void record_miss(const struct cuheap_audit_miss *m, void *arg)
{
    (void)arg;
    char text[CUHEAP_LABEL_MAX];
    struct cuheap_rec r = {.type = CUHEAP_EV_AUDIT,
                           .device = (int16_t)m->op.device,
                           .ptr = m->op.addr,
                           .size = m->op.bytes,
                           .actual = m->op.bytes,
                           .aux = m->op.correlation,
                           .aux2 = m->count,
                           .label = cuheap_audit_describe(&m->op, text, sizeof(text))};
    cuheap_record(&r);
}

static void feed_locked(int r)
{
    if (r)
        matcher_failed = true;
}

static void drain_queue_locked(void)
{
    struct cuheap_audit_seen s;
    while (cuheap_audit_queue_pop(&queue, &s))
        feed_locked(cuheap_audit_feed_seen(&matcher, &s));
}

static void memory_record_locked(const CUpti_ActivityMemory4 *m)
{
    /* Read only what CUpti_ActivityMemory3 (CUPTI 12) shares with CUpti_ActivityMemory4, so
     * a framework's older copy of CUPTI reads the same. */
    struct cuheap_audit_driver_op d = {
        .op = m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
                  ? CUHEAP_AUDIT_ALLOC
              : m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE
                  ? CUHEAP_AUDIT_RELEASE
                  : 0,
        .memory = (unsigned)m->memoryKind < CUHEAP_AUDIT_NR_MEMORY ? (uint8_t)m->memoryKind : 0,
        .async = m->isAsync != 0,
        .correlation = m->correlationId,
        .device = m->deviceId,
        .stream = m->streamId,
        .addr = m->address,
        .bytes = m->bytes,
        .pool = m->memoryPoolConfig.memoryPoolType != CUPTI_ACTIVITY_MEMORY_POOL_TYPE_INVALID
                    ? m->memoryPoolConfig.address
                    : 0,
        .api = api_of(m->correlationId),
    };
    feed_locked(cuheap_audit_feed_driver(&matcher, &d));
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    /* CUPTI wants 8-byte aligned buffers; without one it drops records (and says so). */
    void *p = NULL;
    *buffer = posix_memalign(&p, 8, BUFFER_BYTES) ? NULL : p;
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)size;
    pthread_mutex_lock(&match_lock);
    if (!stopped) {
        /* hooked operations first: they happened before the records CUPTI hands over now */
        drain_queue_locked();
        CUpti_Activity *rec = NULL;
        while (valid && cupti.cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
            if (rec->kind == CUPTI_ACTIVITY_KIND_MEMORY2)
                memory_record_locked((const CUpti_ActivityMemory4 *)rec);
        size_t dropped = 0;
        if (cupti.cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
            nr_cupti_dropped += dropped;
        drain_queue_locked();
        /* into the trace as the run goes: what stayed unmatched for a whole buffer */
        cuheap_audit_age(&matcher, false, record_miss, NULL);
    }
    pthread_mutex_unlock(&match_lock);
    free(buffer);
}

void cuheap_audit_note(const struct cuheap_rec *r)
{
    if (!atomic_load_explicit(&cuheap_auditing, memory_order_relaxed))
        return;
    struct cuheap_audit_seen s = {.op = CUHEAP_AUDIT_ALLOC,
                                  .device = r->device,
                                  .addr = r->ptr,
                                  .size = r->size,
                                  .size_max = r->actual};
    switch (r->type) {
    case CUHEAP_EV_FREE:
        s.op = CUHEAP_AUDIT_RELEASE;
        /* fall through */
    case CUHEAP_EV_ALLOC:
        if (r->flags & CUHEAP_EVF_POOLED)
            return; /* a block of the pool: the driver never heard of it */
        switch (r->api) {
        case CUHEAP_API_ASYNC:
        case CUHEAP_API_POOL_ASYNC:
            s.door = CUHEAP_AUDIT_ASYNC;
            break;
        case CUHEAP_API_VMM_CREATE:
            s.door = CUHEAP_AUDIT_VMM_CREATE;
            s.addr = 0; /* the event holds the handle; physical memory has no address */
            break;
        case CUHEAP_API_VMM_MAP:
            s.door = CUHEAP_AUDIT_VMM_MAP;
            break;
        default:
            s.door = CUHEAP_AUDIT_PASSTHRU;
            break;
        }
        break;
    case CUHEAP_EV_ARENA_RELEASE:
        s.op = CUHEAP_AUDIT_RELEASE;
        /* fall through */
    case CUHEAP_EV_ARENA_GROW:
        s.door = CUHEAP_AUDIT_POOL;
        break;
    default:
        return;
    }
    cuheap_audit_queue_push(&queue, &s);
}

static void give_up(const char *what, CUptiResult r)
{
    atomic_store(&cuheap_auditing, false);
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        cuheap_log("audit: CUPTI is held by another subscriber (a profiler such as Nsight "
                   "Systems or the framework's own); cuheap goes on without the audit");
    else
        cuheap_log("audit: %s failed (%s); cuheap goes on without the audit", what,
                   result_string(r));
    if (subscriber)
        cupti.cuptiUnsubscribe(subscriber);
    subscriber = NULL;
    pthread_mutex_lock(&match_lock);
    stopped = true; /* a buffer CUPTI might still hand back finds nothing to feed */
    cuheap_audit_queue_destroy(&queue);
    cuheap_audit_destroy(&matcher);
    pthread_mutex_unlock(&match_lock);
}

static void audit_at_exit(void)
{
    cuheap_audit_stop();
}

void cuheap_audit_start(const struct cuheap_config *cfg)
{
    if (!cfg->audit)
        return;
    if (!cfg->record) {
        cuheap_log("audit: needs CUHEAP_RECORD=1 (the recorded events are what it checks); "
                   "cuheap goes on without the audit");
        return;
    }
    char why[CUHEAP_PATH_MAX + 128];
    /* CUPTI's set-up may call into the driver: those calls must not find cuheap half started
     * (the thread is inside start-up), so they go straight to the driver. */
    int was_busy = cuheap_busy;
    cuheap_busy = 1;
    cupti_handle = open_cupti(cfg->audit_cupti, why, sizeof(why));
    if (!cupti_handle || resolve(why, sizeof(why))) {
        cuheap_log("audit: %s; cuheap goes on without the audit", why);
        goto out;
    }
    if (cuheap_audit_queue_init(&queue, QUEUE_SLOTS) || cuheap_audit_init(&matcher)) {
        cuheap_log("audit: no memory for the audit's tables; cuheap goes on without it");
        goto out;
    }
    CUptiResult r = cupti.cuptiSubscribe(&subscriber, on_callback, NULL);
    if (r != CUPTI_SUCCESS) {
        subscriber = NULL;
        give_up("cuptiSubscribe", r);
        goto out;
    }
    r = cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        give_up("cuptiActivityRegisterCallbacks", r);
        goto out;
    }
    /* Hooks report before the driver's records are on: an operation seen by a hook but made
     * before CUPTI listened is only unreported; the other way round it would be a false miss. */
    atomic_store(&cuheap_auditing, true);
    r = cupti.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2);
    if (r != CUPTI_SUCCESS) {
        give_up("cuptiActivityEnable(MEMORY2)", r);
        goto out;
    }
    if (cupti.cuptiActivityFlushPeriod)
        cupti.cuptiActivityFlushPeriod(FLUSH_MS);
    enable_name_callbacks();
    /* CUPTI registers exit handlers of its own while it starts; after them its calls crash
     * (a CUDA program segfaulted at exit on the H200). Handlers run last-registered first, so
     * this one, registered after CUPTI's, flushes and reports while CUPTI still works. */
    atexit(audit_at_exit);
    verbose = cfg->verbose;
    if (verbose)
        cuheap_log("audit: on, CUPTI from %s", cupti_path);
out:
    cuheap_busy = was_busy;
}

void cuheap_audit_stop(void)
{
    if (!atomic_load(&cuheap_auditing))
        return;
    int was_busy = cuheap_busy;
    cuheap_busy = 1;
    /* CUPTI hands over what it holds (buffer_completed runs, on this thread or its own) */
    cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cupti.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    atomic_store(&cuheap_auditing, false);
    cuheap_busy = was_busy;
    pthread_mutex_lock(&match_lock);
    drain_queue_locked();
    cuheap_audit_age(&matcher, true, record_miss, NULL);
    stopped = true;
    char line[1024];
    cuheap_audit_summary(&matcher, SUMMARY_LISTS, line, sizeof(line));
    struct cuheap_audit_counts c;
    cuheap_audit_get_counts(&matcher, &c);
    struct cuheap_rec r = {.type = CUHEAP_EV_AUDIT,
                           .flags = CUHEAP_EVF_SUMMARY,
                           .device = -1,
                           .aux = c.nr_driver,
                           .aux2 = c.nr_missed,
                           .label = line};
    cuheap_record(&r);
    uint64_t lost = atomic_load(&queue.nr_dropped);
    pthread_mutex_unlock(&match_lock);
    cuheap_log_always("%s", line);
    if (lost || nr_cupti_dropped || matcher_failed)
        cuheap_log_always("audit: incomplete: %" PRIu64 " hooked operations not queued, %" PRIu64
                          " CUPTI records dropped%s; misses may be false",
                          lost, (uint64_t)nr_cupti_dropped,
                          matcher_failed ? ", the matcher ran out of memory" : "");
    if (!verbose)
        return;
    /* What a GPU run needs to see how CUPTI reports each door (VMM above all). */
    cuheap_log_always("audit: matched by door: pass-through %" PRIu64 ", pool %" PRIu64
                      ", vmm create %" PRIu64 ", vmm map %" PRIu64 ", async pool %" PRIu64
                      "; module statics %" PRIu64 "; hooked operations the driver did not "
                      "report %" PRIu64,
                      c.nr_by_door[CUHEAP_AUDIT_PASSTHRU], c.nr_by_door[CUHEAP_AUDIT_POOL],
                      c.nr_by_door[CUHEAP_AUDIT_VMM_CREATE], c.nr_by_door[CUHEAP_AUDIT_VMM_MAP],
                      c.nr_by_door[CUHEAP_AUDIT_ASYNC], c.nr_static, c.nr_unreported);
    if (c.nr_size_differs)
        cuheap_log_always("audit: %" PRIu64 " operations matched by address with another byte "
                          "count than the hook saw (first: driver %" PRIu64 ", hook %" PRIu64 ")",
                          c.nr_size_differs, matcher.differs_example.bytes,
                          matcher.differs_seen_size);
}

void cuheap_audit_atfork_child(void)
{
    atomic_store(&cuheap_auditing, false);
    pthread_mutex_init(&match_lock, NULL);
    stopped = true;
}

#else /* no CUPTI headers at build time */

void cuheap_audit_start(const struct cuheap_config *cfg)
{
    if (cfg->audit)
        cuheap_log("audit: this cuheap was built without CUPTI's headers; cuheap goes on "
                   "without the audit");
}

void cuheap_audit_note(const struct cuheap_rec *r)
{
    (void)r;
}

void cuheap_audit_stop(void)
{
}

void cuheap_audit_atfork_child(void)
{
}

#endif
