/* SPDX-License-Identifier: MIT */
/*
 * fakecuda: a simulated CUDA driver (libcuda.so.1) for tests on machines without a GPU.
 *
 * Host memory stands in for device memory: each device is one large MAP_NORESERVE mapping
 * carved by a first-fit allocator, so "device pointers" are real addresses a test can read.
 * Streams really run asynchronously: every stream has a worker thread that executes queued
 * work (host functions standing in for kernels, copies, memsets, event records, async frees)
 * in order. The legacy default stream orders with every blocking stream of its device, as the
 * real driver does, and cuMemFree_v2 waits for all streams of the device before freeing.
 * Errors follow the driver: bad or double frees give CUDA_ERROR_INVALID_VALUE, freeing while
 * a stream captures gives CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, exhaustion gives
 * CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Settings: FAKECUDA_DEVICE_COUNT (default 1), FAKECUDA_DEVICE_MEM (bytes per device,
 * K/M/G suffixes, default 4G), FAKECUDA_ALLOC_US / FAKECUDA_FREE_US (simulated cost of
 * cuMemAlloc_v2 / cuMemFree_v2 in microseconds, default 0), FAKECUDA_VMM_US (the same for
 * each VMM call: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease; on a GPU
 * they take 1 to 30 us, which widens every window where cuheap's pool lock is dropped),
 * FAKECUDA_FAIL (fault injection, below).
 *
 * One global mutex guards all state: this is a test double, clarity beats speed.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define FAKECUDA_BUILDING 1
#include "fakecuda.h"

#undef cuGetProcAddress
#define FAKE_EXPORT      __attribute__((visibility("default")))
#define NR_MAX_DEVICES   8
#define NR_MAX_STREAMS   4096
#define FAKE_VMM_GRANULE (2u << 20)

enum alloc_kind { KIND_DEVICE, KIND_ASYNC, KIND_MANAGED, KIND_HOST, KIND_VMM_PHYS };

struct fake_alloc {
    uintptr_t ptr;    /* start of the range */
    size_t size;      /* bytes reserved (rounded) */
    size_t requested; /* bytes asked for */
    enum alloc_kind kind;
    unsigned long long buffer_id;
    bool free_pending; /* cuMemFreeAsync queued, not yet executed */
};

struct fake_ctx {
    unsigned magic;
    int device;
};

struct fake_device {
    uintptr_t base; /* start of the simulated device memory's addresses */
    size_t size;    /* bytes of simulated device memory */
    size_t range;   /* bytes of addresses at base: several times size, so that, like the real
                       driver, which maps its pages anywhere, a request that fits the free
                       bytes is never refused for want of one free stretch of them */
    size_t used;    /* bytes handed out, VMM physical memory included */
    struct fake_ctx ctx;
    struct fake_stream *legacy;
    unsigned nr_busy_ordered; /* the legacy and blocking streams with queued work */
};

enum work_kind {
    WORK_NOP,
    WORK_HOSTFN,
    WORK_MEMCPY,
    WORK_MEMSET,
    WORK_EVENT,
    WORK_WAIT,
    WORK_FREE
};

struct fake_event {
    unsigned magic;
    unsigned long long recorded; /* generation of the last record */
    unsigned long long done;     /* generation that has completed */
};

struct dep {
    struct fake_stream *stream;
    unsigned long long count; /* wait until stream->completed reaches this */
};

struct work {
    struct work *next;
    enum work_kind kind;
    CUhostFn fn;
    void *arg;
    void *dst;
    const void *src;
    size_t n;
    unsigned char value;
    struct fake_event *event;
    unsigned long long gen;
    int nr_deps;
    struct dep deps[64]; /* ordering with the legacy stream */
};

struct fake_stream {
    unsigned magic;
    int device;
    unsigned flags;
    bool legacy;
    bool stop;
    int capturing; /* CUstreamCaptureMode + 1 while capturing, else 0 */
    pthread_t thread;
    struct work *head, *tail;
    unsigned long long submitted, completed;
    struct fake_stream *dead_next; /* on g_dead_streams once destroyed */
};

#define CTX_MAGIC    0xC0C0C0C0u
#define STREAM_MAGIC 0x57EA57EAu
#define EVENT_MAGIC  0xE7E7E7E7u

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_progress = PTHREAD_COND_INITIALIZER;
static bool g_initialized;
static int g_nr_devices;
static bool g_peer[NR_MAX_DEVICES][NR_MAX_DEVICES]; /* [a][b]: device a may access b's memory */
static struct fake_device g_devices[NR_MAX_DEVICES];
static struct fake_alloc *g_allocs; /* sorted by ptr; guarded by g_lock */
static size_t g_nr_allocs, g_cap_allocs;
static struct fake_stream *g_streams[NR_MAX_STREAMS];
static struct fake_stream *g_dead_streams; /* destroyed, kept for dependencies on them */
static unsigned long long g_next_buffer_id = 1;
static unsigned g_alloc_us, g_free_us, g_vmm_us;
static _Thread_local struct fake_ctx *tls_ctx;
static atomic_ulong g_calls[FAKECUDA_NR_COUNTERS];

static size_t parse_size(const char *s, size_t dflt)
{
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K':
    case 'k':
        v <<= 10;
        break;
    case 'M':
    case 'm':
        v <<= 20;
        break;
    case 'G':
    case 'g':
        v <<= 30;
        break;
    default:
        break;
    }
    return v ? (size_t)v : dflt;
}

static void spin_us(unsigned us)
{
    if (!us)
        return;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- fault injection (FAKECUDA_FAIL) ----
 *
 * FAKECUDA_FAIL=RULE,RULE,...,seed=N makes chosen entry points fail, as a driver under memory
 * pressure or with a broken context would, without doing anything. A RULE is NAME:WHEN[=ERROR]:
 *   NAME   an entry point's base name (cuMemCreate, cuEventRecord; the _ptsz twins and the
 *          wrappers that call it count as it) or a prefix ending in '*' (cuMem*, *);
 *   WHEN   a chance per call (0.05), the Nth matching call (@3), or that call and every later
 *          one (@3+);
 *   ERROR  the CUresult to give, by name (CUDA_ERROR_LAUNCH_FAILED, or LAUNCH_FAILED) or
 *          number; by default the one the real driver gives for that failure: out of memory
 *          for allocations, VMM calls, event and stream creation, a launch failure for the
 *          rest.
 *   !NAME  (no WHEN) spares the entry points NAME matches from every rule after it.
 * The random draws come from seed (default 1) and a call counter, so a single-threaded run is
 * repeated exactly. Only faultable entry points (those with FAULT() at their top) ever fail.
 * At exit the fake prints "fakecuda: N faults injected in M calls (NAME n, ...)" on stderr
 * when FAKECUDA_FAIL was set; fakecuda_faults_injected() gives N to tests.
 * FAKECUDA_FAIL_VERBOSE=1 adds a line per fault (the entry point, its call number, the error).
 *
 * A failed call has no effect. This layer is one function (fault()) called first by each
 * faultable entry point: it touches nothing else here. */
#define NR_MAX_FAULT_RULES 32

struct fault_rule {
    char name[48];          /* entry point, or a prefix when it ends in '*' */
    double chance;          /* per matching call, 0 = none */
    unsigned long nth;      /* fail the nth matching call (1-based), 0 = none */
    bool from_nth;          /* and every one after it */
    CUresult error;         /* 0: the call's own default */
    atomic_ulong nr_calls;  /* matching calls so far */
    atomic_ulong nr_faults; /* faults this rule injected */
};

static struct fault_rule g_rules[NR_MAX_FAULT_RULES];
static int g_nr_rules;
static unsigned long long g_fault_seed = 1;
static atomic_ullong g_fault_draws;
static atomic_ulong g_nr_faults, g_nr_faultable;
static pthread_once_t g_fault_once = PTHREAD_ONCE_INIT;
static bool g_fault_verbose; /* FAKECUDA_FAIL_VERBOSE=1: a line on stderr per fault */
/* faults injected on this thread, and the entry point and error of the last NR_FAULTS_KEPT */
#define NR_FAULTS_KEPT 64
static _Thread_local unsigned long tls_nr_faults;
static _Thread_local struct {
    const char *name;
    CUresult error;
} tls_faults[NR_FAULTS_KEPT];

static const struct {
    const char *name;
    CUresult value;
} g_error_names[] = {
    {"CUDA_SUCCESS", CUDA_SUCCESS},
    {"CUDA_ERROR_OUT_OF_MEMORY", CUDA_ERROR_OUT_OF_MEMORY},
    {"CUDA_ERROR_INVALID_VALUE", CUDA_ERROR_INVALID_VALUE},
    {"CUDA_ERROR_INVALID_CONTEXT", CUDA_ERROR_INVALID_CONTEXT},
    {"CUDA_ERROR_INVALID_DEVICE", CUDA_ERROR_INVALID_DEVICE},
    {"CUDA_ERROR_INVALID_HANDLE", CUDA_ERROR_INVALID_HANDLE},
    {"CUDA_ERROR_NOT_FOUND", CUDA_ERROR_NOT_FOUND},
    {"CUDA_ERROR_LAUNCH_FAILED", CUDA_ERROR_LAUNCH_FAILED},
    {"CUDA_ERROR_ILLEGAL_ADDRESS", CUDA_ERROR_ILLEGAL_ADDRESS},
    {"CUDA_ERROR_NOT_READY", CUDA_ERROR_NOT_READY},
    {"CUDA_ERROR_NOT_INITIALIZED", CUDA_ERROR_NOT_INITIALIZED},
    {"CUDA_ERROR_NOT_PERMITTED", CUDA_ERROR_NOT_PERMITTED},
    {"CUDA_ERROR_NOT_SUPPORTED", CUDA_ERROR_NOT_SUPPORTED},
    {"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
    {"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", CUDA_ERROR_STREAM_CAPTURE_INVALIDATED},
    {"CUDA_ERROR_STREAM_CAPTURE_MERGE", CUDA_ERROR_STREAM_CAPTURE_MERGE},
    {"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", CUDA_ERROR_STREAM_CAPTURE_UNMATCHED},
    {"CUDA_ERROR_STREAM_CAPTURE_UNJOINED", CUDA_ERROR_STREAM_CAPTURE_UNJOINED},
    {"CUDA_ERROR_STREAM_CAPTURE_ISOLATION", CUDA_ERROR_STREAM_CAPTURE_ISOLATION},
    {"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
    {"CUDA_ERROR_CAPTURED_EVENT", CUDA_ERROR_CAPTURED_EVENT},
    {"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD},
    {"CUDA_ERROR_UNKNOWN", CUDA_ERROR_UNKNOWN},
};

static CUresult parse_error(const char *s)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end != s && !*end)
        return (CUresult)v;
    for (size_t i = 0; i < sizeof(g_error_names) / sizeof(g_error_names[0]); i++)
        if (!strcmp(s, g_error_names[i].name) || !strcmp(s, g_error_names[i].name + 11))
            return g_error_names[i].value;
    return 0;
}

static void fault_summary(void)
{
    char line[1024];
    int n = snprintf(line, sizeof(line), "fakecuda: %lu faults injected in %lu calls",
                     atomic_load(&g_nr_faults), atomic_load(&g_nr_faultable));
    for (int i = 0; i < g_nr_rules && n > 0 && (size_t)n < sizeof(line) - 64; i++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, "%s%s %lu", i ? ", " : " (",
                      g_rules[i].name, atomic_load(&g_rules[i].nr_faults));
    if (n > 0 && (size_t)n < sizeof(line) - 2)
        n += snprintf(line + n, sizeof(line) - (size_t)n, "%s\n", g_nr_rules ? ")" : "");
    if (n > 0)
        (void)!write(2, line, strlen(line));
}

static void fault_parse(void)
{
    const char *env = getenv("FAKECUDA_FAIL"), *verbose = getenv("FAKECUDA_FAIL_VERBOSE");
    if (!env || !*env)
        return;
    g_fault_verbose = verbose && strcmp(verbose, "0");
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strncmp(tok, "seed=", 5)) {
            g_fault_seed = strtoull(tok + 5, NULL, 0);
            continue;
        }
        char *colon = strchr(tok, ':');
        if (tok[0] == '!' && !colon && g_nr_rules < NR_MAX_FAULT_RULES &&
            strlen(tok) < sizeof(g_rules[0].name)) {
            snprintf(g_rules[g_nr_rules++].name, sizeof(g_rules[0].name), "%s", tok);
            continue;
        }
        if (!colon || g_nr_rules == NR_MAX_FAULT_RULES ||
            (size_t)(colon - tok) >= sizeof(g_rules[0].name)) {
            fprintf(stderr, "fakecuda: FAKECUDA_FAIL: cannot use '%s'\n", tok);
            continue;
        }
        struct fault_rule *r = &g_rules[g_nr_rules];
        memcpy(r->name, tok, (size_t)(colon - tok));
        r->name[colon - tok] = '\0';
        size_t len = strlen(r->name); /* cuMemAlloc_v2 is cuMemAlloc */
        if (len > 3 && !strcmp(r->name + len - 3, "_v2"))
            r->name[len - 3] = '\0';
        char *when = colon + 1, *eq = strchr(when, '=');
        if (eq) {
            *eq = '\0';
            r->error = parse_error(eq + 1);
        }
        if (*when == '@') {
            r->nth = strtoul(when + 1, NULL, 10);
            r->from_nth = strchr(when, '+') != NULL;
        } else {
            r->chance = strtod(when, NULL);
        }
        if ((r->nth || r->chance > 0) && (!eq || r->error))
            g_nr_rules++;
        else
            fprintf(stderr, "fakecuda: FAKECUDA_FAIL: cannot use '%s'\n", tok);
    }
    atexit(fault_summary);
}

static bool rule_matches(const struct fault_rule *r, const char *name)
{
    const char *rn = r->name[0] == '!' ? r->name + 1 : r->name;
    size_t n = strlen(rn);
    if (n && rn[n - 1] == '*')
        return !strncmp(rn, name, n - 1);
    return !strcmp(rn, name);
}

/* A uniform draw in [0, 1): splitmix64 of the seed and a global call counter. */
static double fault_draw(void)
{
    unsigned long long z =
        g_fault_seed + 0x9E3779B97F4A7C15ull * (atomic_fetch_add(&g_fault_draws, 1) + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

/* Called first by every faultable entry point: CUDA_SUCCESS to go on, else the error the
 * call must return at once (dflt unless the rule names one). */
static CUresult fault(const char *name, CUresult dflt)
{
    pthread_once(&g_fault_once, fault_parse);
    if (!g_nr_rules)
        return CUDA_SUCCESS;
    atomic_fetch_add(&g_nr_faultable, 1);
    for (int i = 0; i < g_nr_rules; i++) {
        struct fault_rule *r = &g_rules[i];
        if (!rule_matches(r, name))
            continue;
        if (r->name[0] == '!')
            return CUDA_SUCCESS; /* spared */
        unsigned long call = atomic_fetch_add(&r->nr_calls, 1) + 1;
        bool hit =
            r->nth ? call == r->nth || (r->from_nth && call > r->nth) : fault_draw() < r->chance;
        if (hit) {
            atomic_fetch_add(&r->nr_faults, 1);
            atomic_fetch_add(&g_nr_faults, 1);
            CUresult e = r->error ? r->error : dflt;
            tls_faults[tls_nr_faults++ % NR_FAULTS_KEPT].name = name;
            tls_faults[(tls_nr_faults - 1) % NR_FAULTS_KEPT].error = e;
            if (g_fault_verbose) {
                char line[160];
                snprintf(line, sizeof(line), "fakecuda: %s call %lu fails with %d (rule %s)\n",
                         name, call, (int)e, r->name);
                (void)!write(2, line, strlen(line));
            }
            return e;
        }
    }
    return CUDA_SUCCESS;
}

#define FAULT(name, dflt)                                                                          \
    do {                                                                                           \
        CUresult fault_ = fault(name, dflt);                                                       \
        if (fault_ != CUDA_SUCCESS)                                                                \
            return fault_;                                                                         \
    } while (0)

FAKE_EXPORT unsigned long fakecuda_faults_injected(void)
{
    return atomic_load(&g_nr_faults);
}

FAKE_EXPORT unsigned long fakecuda_thread_faults(void)
{
    return tls_nr_faults;
}

FAKE_EXPORT int fakecuda_thread_fault(unsigned long nth, const char **ret_name, int *ret_error)
{
    if (!nth || nth > tls_nr_faults || tls_nr_faults - nth >= NR_FAULTS_KEPT)
        return -1;
    *ret_name = tls_faults[(nth - 1) % NR_FAULTS_KEPT].name;
    *ret_error = (int)tls_faults[(nth - 1) % NR_FAULTS_KEPT].error;
    return 0;
}

/* ---- allocations (g_lock held) ---- */

static struct fake_alloc *find_alloc_locked(uintptr_t p)
{
    size_t lo = 0, hi = g_nr_allocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid].ptr + g_allocs[mid].size <= p)
            lo = mid + 1;
        else if (g_allocs[mid].ptr > p)
            hi = mid;
        else
            return &g_allocs[mid];
    }
    return NULL;
}

/* A CUPTI stand-in (tests/fakecupti) listening, as CUPTI's memory records listen to the real
 * driver: told of every allocation and release the fake makes, whichever call made it. */
static _Atomic(fakecuda_memop_fn) g_memop_observer;
static _Thread_local const char *tls_api; /* the entry point this thread is in, if it says */
static int device_of_ptr(uintptr_t p);

FAKE_EXPORT void fakecuda_set_memory_observer(fakecuda_memop_fn fn)
{
    atomic_store(&g_memop_observer, fn);
}

static void tell_observer(const struct fake_alloc *a, bool release)
{
    fakecuda_memop_fn fn = atomic_load(&g_memop_observer);
    if (!fn || a->kind == KIND_VMM_PHYS)
        return;
    int dev = device_of_ptr(a->ptr);
    struct fakecuda_memop op = {
        .release = release,
        .kind = a->kind == KIND_HOST      ? FAKECUDA_MEM_HOST
                : a->kind == KIND_MANAGED ? FAKECUDA_MEM_MANAGED
                : a->kind == KIND_ASYNC   ? FAKECUDA_MEM_ASYNC
                                          : FAKECUDA_MEM_DEVICE,
        .device = dev,
        .ptr = a->ptr,
        .bytes = a->requested,
        .pool = a->kind == KIND_ASYNC && dev >= 0 ? g_devices[dev].base : 0,
        .api = tls_api,
    };
    fn(&op);
}

static int insert_alloc_locked(struct fake_alloc a)
{
    if (g_nr_allocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? g_cap_allocs * 2 : 1024;
        struct fake_alloc *n = realloc(g_allocs, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        g_allocs = n;
        g_cap_allocs = cap;
    }
    size_t i = 0;
    while (i < g_nr_allocs && g_allocs[i].ptr < a.ptr)
        i++;
    memmove(&g_allocs[i + 1], &g_allocs[i], (g_nr_allocs - i) * sizeof(*g_allocs));
    g_allocs[i] = a;
    g_nr_allocs++;
    tell_observer(&a, false);
    return 0;
}

static void remove_alloc_locked(struct fake_alloc *a)
{
    tell_observer(a, true);
    size_t i = (size_t)(a - g_allocs);
    memmove(&g_allocs[i], &g_allocs[i + 1], (g_nr_allocs - i - 1) * sizeof(*g_allocs));
    g_nr_allocs--;
}

static size_t round_alloc(size_t n)
{
    /* The driver hands out 512-byte aligned blocks and reserves 2 MiB pages for large ones.
     * Sizes the rounding would wrap cannot be had: SIZE_MAX, which no device holds. */
    if (n > SIZE_MAX - FAKE_VMM_GRANULE)
        return SIZE_MAX;
    if (n >= FAKE_VMM_GRANULE)
        return (n + FAKE_VMM_GRANULE - 1) & ~(size_t)(FAKE_VMM_GRANULE - 1);
    return (n + 511) & ~(size_t)511;
}

/* First fit inside the device's addresses; 2 MiB aligned for large blocks like the driver.
 * Returns whether the device has size bytes free and a place for them was found. */
static bool device_place_locked(int dev, size_t size, uintptr_t *ret)
{
    struct fake_device *d = &g_devices[dev];
    size_t align = size >= FAKE_VMM_GRANULE ? FAKE_VMM_GRANULE : 512;
    if (size > d->size - d->used)
        return false;
    uintptr_t cur = d->base, end = d->base + d->range;
    for (size_t i = 0; i <= g_nr_allocs; i++) {
        uintptr_t next = end;
        if (i < g_nr_allocs) {
            if (g_allocs[i].ptr < d->base || g_allocs[i].ptr >= end)
                continue;
            next = g_allocs[i].ptr;
        }
        uintptr_t start = (cur + align - 1) & ~(uintptr_t)(align - 1);
        if (start + size <= next) {
            *ret = start;
            return true;
        }
        if (i < g_nr_allocs)
            cur = g_allocs[i].ptr + g_allocs[i].size;
    }
    return false;
}

static CUresult device_alloc_locked(int dev, size_t n, enum alloc_kind kind, uintptr_t *ret)
{
    struct fake_device *d = &g_devices[dev];
    size_t size = round_alloc(n ? n : 1);
    uintptr_t start;
    if (!device_place_locked(dev, size, &start))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_alloc a = {
        .ptr = start, .size = size, .requested = n, .kind = kind, .buffer_id = g_next_buffer_id++};
    if (insert_alloc_locked(a))
        return CUDA_ERROR_OUT_OF_MEMORY;
    d->used += size;
    *ret = start;
    return CUDA_SUCCESS;
}

static int device_of_ptr(uintptr_t p)
{
    for (int i = 0; i < g_nr_devices; i++)
        if (p >= g_devices[i].base && p < g_devices[i].base + g_devices[i].range)
            return i;
    return -1;
}

/* ---- streams ---- */

static bool deps_done_locked(const struct work *w)
{
    for (int i = 0; i < w->nr_deps; i++)
        if (w->deps[i].stream->completed < w->deps[i].count)
            return false;
    if (w->kind == WORK_WAIT && w->event->done < w->gen)
        return false;
    return true;
}

static void free_range_locked(uintptr_t p);

/* Legacy and blocking streams are ordered with each other. */
static bool ordered_with_legacy(const struct fake_stream *s)
{
    return s->legacy || !(s->flags & CU_STREAM_NON_BLOCKING);
}

static void *stream_worker(void *arg)
{
    struct fake_stream *s = arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!s->stop && !(s->head && deps_done_locked(s->head)))
            pthread_cond_wait(&g_progress, &g_lock);
        if (!s->head && s->stop)
            break;
        if (!s->head)
            continue;
        struct work *w = s->head;
        pthread_mutex_unlock(&g_lock);
        switch (w->kind) {
        case WORK_HOSTFN:
            w->fn(w->arg);
            break;
        case WORK_MEMCPY:
            memmove(w->dst, w->src, w->n);
            break;
        case WORK_MEMSET:
            memset(w->dst, w->value, w->n);
            break;
        default:
            break;
        }
        pthread_mutex_lock(&g_lock);
        if (w->kind == WORK_EVENT && w->event->done < w->gen)
            w->event->done = w->gen;
        if (w->kind == WORK_FREE)
            free_range_locked((uintptr_t)w->dst);
        s->head = w->next;
        if (!s->head) {
            s->tail = NULL;
            if (ordered_with_legacy(s))
                g_devices[s->device].nr_busy_ordered--;
        }
        s->completed++;
        free(w);
        pthread_cond_broadcast(&g_progress);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

static struct fake_stream *stream_new_locked(int dev, unsigned flags, bool legacy)
{
    int slot = -1;
    for (int i = 0; i < NR_MAX_STREAMS; i++)
        if (!g_streams[i]) {
            slot = i;
            break;
        }
    if (slot < 0)
        return NULL;
    struct fake_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->magic = STREAM_MAGIC;
    s->device = dev;
    s->flags = flags;
    s->legacy = legacy;
    /* Detached from the start: nobody joins a worker, and one detached only when its stream
     * was destroyed crashed there now and then (pthread_detach on a descriptor already gone,
     * stress fork-streams under MALLOC_PERTURB_). */
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&s->thread, &detached, stream_worker, s);
    pthread_attr_destroy(&detached);
    if (failed) {
        free(s);
        return NULL;
    }
    g_streams[slot] = s;
    return s;
}

static struct fake_ctx *current_ctx(void)
{
    return tls_ctx;
}

/* Each thread's per-thread default stream, per device, created on first use. Like the
 * driver's, it is a blocking stream: ordered with the legacy stream both ways, not with
 * non-blocking streams. Never destroyed (the driver keeps it for the thread's lifetime). */
static _Thread_local struct fake_stream *tls_per_thread[NR_MAX_DEVICES];

/* Resolve a CUstream handle: NULL and CU_STREAM_LEGACY mean the legacy stream of the current
 * device, CU_STREAM_PER_THREAD the calling thread's per-thread default stream (the _ptsz
 * entry points turn NULL into CU_STREAM_PER_THREAD before they get here). */
static CUresult resolve_stream_locked(CUstream h, struct fake_stream **ret)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct fake_ctx *c = current_ctx();
        if (!c)
            return CUDA_ERROR_INVALID_CONTEXT;
        if (h != CU_STREAM_PER_THREAD) {
            *ret = g_devices[c->device].legacy;
            return CUDA_SUCCESS;
        }
        struct fake_stream **pt = &tls_per_thread[c->device];
        bool alive = false;
        for (int i = 0; *pt && i < NR_MAX_STREAMS && !alive; i++)
            alive = g_streams[i] == *pt; /* a device reset may have taken it */
        if (!alive)
            *pt = stream_new_locked(c->device, 0, false);
        if (!*pt)
            return CUDA_ERROR_OUT_OF_MEMORY;
        *ret = *pt;
        return CUDA_SUCCESS;
    }
    struct fake_stream *s = (struct fake_stream *)h;
    for (int i = 0; i < NR_MAX_STREAMS; i++)
        if (g_streams[i] == s && s->magic == STREAM_MAGIC) {
            *ret = s;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_HANDLE;
}

/* What a _ptsz entry point means by the default stream: the per-thread one. */
static CUstream per_thread(CUstream h)
{
    return h ? h : CU_STREAM_PER_THREAD;
}

static bool any_capture_locked(void)
{
    for (int i = 0; i < NR_MAX_STREAMS; i++)
        if (g_streams[i] && g_streams[i]->capturing)
            return true;
    return false;
}

/* Queue w on s, adding the implicit ordering of the legacy stream: work on the legacy
 * stream waits for all blocking streams of the device, and work on a blocking stream waits
 * for the legacy stream. Takes ownership of w. */
static void enqueue_locked(struct fake_stream *s, struct work *w)
{
    w->nr_deps = 0;
    if (s->legacy) {
        for (int i = 0; i < NR_MAX_STREAMS && w->nr_deps < 64; i++) {
            struct fake_stream *o = g_streams[i];
            if (o && o != s && o->device == s->device && !(o->flags & CU_STREAM_NON_BLOCKING))
                w->deps[w->nr_deps++] = (struct dep){o, o->submitted};
        }
        for (struct fake_stream *o = g_dead_streams; o && w->nr_deps < 64; o = o->dead_next)
            if (o->device == s->device && !(o->flags & CU_STREAM_NON_BLOCKING) &&
                o->completed < o->submitted)
                w->deps[w->nr_deps++] = (struct dep){o, o->submitted};
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        struct fake_stream *l = g_devices[s->device].legacy;
        w->deps[w->nr_deps++] = (struct dep){l, l->submitted};
    }
    w->next = NULL;
    if (s->tail) {
        s->tail->next = w;
    } else {
        s->head = w;
        if (ordered_with_legacy(s))
            g_devices[s->device].nr_busy_ordered++;
    }
    s->tail = w;
    s->submitted++;
    pthread_cond_broadcast(&g_progress);
}

/* Whether work queued on s now would have nothing to wait for: s is empty, and so are the
 * streams the legacy stream orders it behind. An event recorded there completes at once, as
 * on a real idle GPU (within microseconds). */
static bool idle_for_record_locked(const struct fake_stream *s)
{
    if (s->head)
        return false;
    if (s->legacy)
        return g_devices[s->device].nr_busy_ordered == 0;
    if (s->flags & CU_STREAM_NON_BLOCKING)
        return true;
    return !g_devices[s->device].legacy->head;
}

static void wait_stream_locked(struct fake_stream *s, unsigned long long upto)
{
    while (s->completed < upto)
        pthread_cond_wait(&g_progress, &g_lock);
}

/* Synchronous operations on the legacy stream: queue and wait. */
static CUresult submit_sync_locked(struct fake_stream *s, struct work *w)
{
    enqueue_locked(s, w);
    wait_stream_locked(s, s->submitted);
    return CUDA_SUCCESS;
}

static void device_sync_locked(int dev)
{
    for (int i = 0; i < NR_MAX_STREAMS; i++) {
        struct fake_stream *s = g_streams[i];
        if (s && s->device == dev)
            wait_stream_locked(s, s->submitted);
    }
    /* work of destroyed streams still runs, and the device waits for it */
    for (struct fake_stream *s = g_dead_streams; s; s = s->dead_next)
        if (s->device == dev)
            wait_stream_locked(s, s->submitted);
}

/* ---- fork ----
 * The simulated driver survives fork (the real one refuses a child of a parent that used it;
 * tests want to see what cuheap does there). The lock is taken around fork so no thread holds
 * it in the child, and the child, which has no threads but its own, gets a worker again for
 * every stream that has one in the parent, destroyed streams still draining included. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

static void fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    pthread_cond_init(&g_progress, NULL);
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < NR_MAX_STREAMS; i++)
        if (g_streams[i] &&
            pthread_create(&g_streams[i]->thread, &detached, stream_worker, g_streams[i]))
            g_streams[i]->stop = true;
    for (struct fake_stream *s = g_dead_streams; s; s = s->dead_next)
        if (s->completed < s->submitted)
            pthread_create(&s->thread, &detached, stream_worker, s);
    pthread_attr_destroy(&detached);
}

/* ---- init, devices, contexts ---- */

FAKE_EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (!g_initialized) {
        /* every physical VMM allocation is a memfd: allow as many as the system lets us */
        struct rlimit nofile;
        if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
            nofile.rlim_cur = nofile.rlim_max;
            setrlimit(RLIMIT_NOFILE, &nofile);
        }
        const char *n = getenv("FAKECUDA_DEVICE_COUNT");
        g_nr_devices = n ? atoi(n) : 1;
        if (g_nr_devices < 0 || g_nr_devices > NR_MAX_DEVICES)
            g_nr_devices = 1;
        size_t mem = parse_size(getenv("FAKECUDA_DEVICE_MEM"), (size_t)4 << 30);
        const char *a = getenv("FAKECUDA_ALLOC_US"), *f = getenv("FAKECUDA_FREE_US");
        g_alloc_us = a ? (unsigned)atoi(a) : 0;
        g_free_us = f ? (unsigned)atoi(f) : 0;
        const char *v = getenv("FAKECUDA_VMM_US");
        g_vmm_us = v ? (unsigned)atoi(v) : 0;
        size_t range = mem <= (size_t)1 << 40 ? 4 * mem : mem;
        for (int i = 0; i < g_nr_devices; i++) {
            void *p = mmap(NULL, range, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                pthread_mutex_unlock(&g_lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            g_devices[i].base = (uintptr_t)p;
            g_devices[i].size = mem;
            g_devices[i].range = range;
            g_devices[i].ctx = (struct fake_ctx){CTX_MAGIC, i};
            g_devices[i].legacy = stream_new_locked(i, 0, true);
        }
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        g_initialized = true;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

#define CHECK_INIT()                                                                               \
    do {                                                                                           \
        if (!g_initialized)                                                                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

#define CHECK_CTX()                                                                                \
    do {                                                                                           \
        CHECK_INIT();                                                                              \
        if (!current_ctx())                                                                        \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

FAKE_EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int *n)
{
    CHECK_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = g_nr_devices;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    CHECK_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CHECK_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "fakecuda simulated device %d", dev);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CHECK_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_devices[dev].size;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FAULT("cuDevicePrimaryCtxRetain", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)&g_devices[dev].ctx;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CHECK_INIT();
    return dev >= 0 && dev < g_nr_devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CHECK_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = 1; /* the fake's primary contexts live as long as the driver */
    return CUDA_SUCCESS;
}

/* Like the driver: every allocation of the device is freed at once. */
static void reset_device_locked(int dev)
{
    device_sync_locked(dev);
    for (size_t i = 0; i < g_nr_allocs;) {
        if (device_of_ptr(g_allocs[i].ptr) == dev && g_allocs[i].kind != KIND_HOST) {
            g_devices[dev].used -= g_allocs[i].size;
            remove_alloc_locked(&g_allocs[i]);
            continue;
        }
        i++;
    }
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK_INIT();
    if (dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    reset_device_locked(dev);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* The current context's device may access memory of the peer's device from now on. */
FAKE_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    CHECK_CTX();
    struct fake_ctx *c = (struct fake_ctx *)peer;
    if (flags || !c || c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    int a = current_ctx()->device, b = c->device;
    if (a == b)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    CUresult r = g_peer[a][b] ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
    g_peer[a][b] = true;
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (!c || c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* the fake has primary contexts only: destroying one resets its device */
    pthread_mutex_lock(&g_lock);
    reset_device_locked(c->device);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FAULT("cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (c && c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    tls_ctx = c;
    return CUDA_SUCCESS;
}

static _Thread_local struct fake_ctx *tls_stack[8];
static _Thread_local int tls_depth;

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FAULT("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (!c || c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == 8)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = tls_ctx;
    tls_ctx = c;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FAULT("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_INIT();
    if (!tls_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = (CUcontext)tls_ctx;
    tls_ctx = tls_depth ? tls_stack[--tls_depth] : NULL;
    return CUDA_SUCCESS;
}

/* Run by each cuCtxGetCurrent on the calling thread, outside the fake's locks: a test's way
 * in while a caller (cuheap's hooks ask on every call) is in the middle of its work. */
static _Atomic(fakecuda_call_fn) g_ctx_query_hook;

FAKE_EXPORT void fakecuda_set_ctx_query_hook(fakecuda_call_fn fn)
{
    atomic_store(&g_ctx_query_hook, fn);
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FAULT("cuCtxGetCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_INIT();
    fakecuda_call_fn hook = atomic_load(&g_ctx_query_hook);
    if (hook)
        hook();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)tls_ctx;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    FAULT("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CTX();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = current_ctx()->device;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_SYNC], 1);
    FAULT("cuCtxSynchronize", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    device_sync_locked(current_ctx()->device);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(g_error_names) / sizeof(g_error_names[0]); i++)
        if (g_error_names[i].value == e) {
            *s = g_error_names[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL; /* as the driver: an error it does not know has no name */
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
    return cuGetErrorName(e, s);
}

/* ---- memory ---- */

static CUresult alloc_current(CUdeviceptr *dptr, size_t n, enum alloc_kind kind)
{
    CHECK_CTX();
    if (!dptr || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    uintptr_t p = 0;
    CUresult r = device_alloc_locked(current_ctx()->device, n, kind, &p);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return r;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    FAULT("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_MEM_ALLOC], 1);
    spin_us(g_alloc_us);
    tls_api = "cuMemAlloc_v2";
    CUresult r = alloc_current(dptr, n, KIND_DEVICE);
    tls_api = NULL;
    return r;
}

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    FAULT("cuMemAllocPitch", CUDA_ERROR_OUT_OF_MEMORY);
    if (!pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX - 511 || height > SIZE_MAX / ((width + 511) & ~(size_t)511))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t p = (width + 511) & ~(size_t)511;
    CUresult r = alloc_current(dptr, p * height, KIND_DEVICE);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags)
{
    FAULT("cuMemAllocManaged", CUDA_ERROR_OUT_OF_MEMORY);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_current(dptr, n, KIND_MANAGED);
}

static void free_range_locked(uintptr_t p)
{
    struct fake_alloc *a = find_alloc_locked(p);
    if (!a)
        return;
    int dev = device_of_ptr(a->ptr);
    if (dev >= 0)
        g_devices[dev].used -= a->size;
    remove_alloc_locked(a);
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FAULT("cuMemFree", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_MEM_FREE], 1);
    spin_us(g_free_us);
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct fake_alloc *a = find_alloc_locked((uintptr_t)dptr);
    if (!a || a->ptr != (uintptr_t)dptr || a->free_pending ||
        (a->kind != KIND_DEVICE && a->kind != KIND_ASYNC && a->kind != KIND_MANAGED)) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (any_capture_locked()) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    /* Like the real driver: the free waits for all work on the device. */
    device_sync_locked(device_of_ptr(a->ptr));
    tls_api = "cuMemFree_v2";
    free_range_locked((uintptr_t)dptr);
    tls_api = NULL;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream h)
{
    FAULT("cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    pthread_mutex_unlock(&g_lock);
    if (r != CUDA_SUCCESS)
        return r;
    return alloc_current(dptr, n, KIND_ASYNC);
}

FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream h)
{
    return cuMemAllocAsync(dptr, n, per_thread(h));
}

/* The fake has one stream-ordered pool per device: its handle only has to be non-NULL. */
FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_INIT();
    if (!pool || dev < 0 || dev >= g_nr_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&g_devices[dev];
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool,
                                             CUstream h)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAllocAsync(dptr, n, h);
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool,
                                                  CUstream h)
{
    return cuMemAllocFromPoolAsync(dptr, n, pool, per_thread(h));
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
    FAULT("cuMemFreeAsync", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    struct fake_alloc *a = find_alloc_locked((uintptr_t)dptr);
    if (r == CUDA_SUCCESS && (!a || a->ptr != (uintptr_t)dptr || a->free_pending ||
                              (a->kind != KIND_DEVICE && a->kind != KIND_ASYNC)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct work *w = calloc(1, sizeof(*w));
        if (!w) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            a->free_pending = true;
            w->kind = WORK_FREE;
            w->dst = (void *)dptr;
            if (s->capturing)
                free(w); /* captured: becomes a graph node, nothing runs now */
            else
                enqueue_locked(s, w);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h)
{
    return cuMemFreeAsync(dptr, per_thread(h));
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FAULT("cuMemGetInfo", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct fake_device *d = &g_devices[current_ctx()->device];
    *free_bytes = d->size - d->used;
    *total = d->size;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_alloc *a = find_alloc_locked((uintptr_t)dptr);
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (a && a->kind != KIND_HOST) {
        if (base)
            *base = (CUdeviceptr)a->ptr;
        if (size)
            *size = a->requested;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t n)
{
    FAULT("cuMemAllocHost", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CTX();
    if (!pp || !n)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct fake_alloc a = {.ptr = (uintptr_t)p,
                           .size = n,
                           .requested = n,
                           .kind = KIND_HOST,
                           .buffer_id = g_next_buffer_id++};
    int e = insert_alloc_locked(a);
    pthread_mutex_unlock(&g_lock);
    if (e) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags)
{
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAllocHost_v2(pp, n);
}

FAKE_EXPORT CUresult cuMemFreeHost(void *p)
{
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_alloc *a = find_alloc_locked((uintptr_t)p);
    if (!a || a->ptr != (uintptr_t)p || a->kind != KIND_HOST) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    remove_alloc_locked(a);
    pthread_mutex_unlock(&g_lock);
    free(p);
    return CUDA_SUCCESS;
}

/* ---- pointer attributes and IPC ---- */

struct fake_map;
static CUresult vmm_pointer_attr_locked(void *data, CUpointer_attribute attr, uintptr_t p);

static CUresult pointer_attr_locked(void *data, CUpointer_attribute attr, uintptr_t p)
{
    struct fake_alloc *a = find_alloc_locked(p);
    if (!a)
        return vmm_pointer_attr_locked(data, attr, p);
    int dev = device_of_ptr(a->ptr);
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = dev >= 0 ? (CUcontext)&g_devices[dev].ctx : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = a->kind == KIND_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = (CUdeviceptr)p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->ptr;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->requested;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->buffer_id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = a->kind == KIND_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = dev;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    CHECK_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult r = pointer_attr_locked(data, attr, (uintptr_t)p);
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                            CUdeviceptr p)
{
    CHECK_INIT();
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < n; i++) {
        /* Unlike the singular call, unknown pointers give zeroed values and success. */
        if (pointer_attr_locked(data[i], attrs[i], (uintptr_t)p) != CUDA_SUCCESS)
            memset(data[i], 0, attrs[i] == CU_POINTER_ATTRIBUTE_CONTEXT ? sizeof(void *) : 8);
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

struct fake_ipc {
    unsigned magic;
    int pid;
    unsigned long long base;
    unsigned long long size;
};

FAKE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    CHECK_CTX();
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct fake_alloc *a = find_alloc_locked((uintptr_t)p);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (a && a->kind == KIND_DEVICE) {
        /* Legacy IPC exports the whole driver allocation that contains p. */
        struct fake_ipc f = {0xFA4EC0DEu, (int)getpid(), a->ptr, a->size};
        memset(h, 0, sizeof(*h));
        memcpy(h->reserved, &f, sizeof(f));
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT unsigned long long fakecuda_ipc_handle_base(const CUipcMemHandle *h)
{
    struct fake_ipc f;
    memcpy(&f, h->reserved, sizeof(f));
    return f.magic == 0xFA4EC0DEu ? f.base : 0;
}

FAKE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    (void)flags;
    CHECK_CTX();
    struct fake_ipc f;
    memcpy(&f, h.reserved, sizeof(f));
    if (!p || f.magic != 0xFA4EC0DEu)
        return CUDA_ERROR_INVALID_VALUE;
    if (f.pid == (int)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses to open in the exporter */
    return CUDA_ERROR_NOT_SUPPORTED;       /* separate processes do not share fake memory */
}

FAKE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    (void)p;
    CHECK_CTX();
    return CUDA_ERROR_INVALID_VALUE; /* nothing was ever opened (see above) */
}

/* ---- VMM ---- */

struct fake_phys {
    int fd;
    size_t size;
    int device;
    int mapped; /* number of live mappings */
    bool released;
    bool imported; /* another process's memory (cuMemImportFromShareableHandle) */
};

static void phys_put_locked(struct fake_phys *ph)
{
    if (ph->released && ph->mapped == 0) {
        close(ph->fd);
        if (!ph->imported)
            g_devices[ph->device].used -= ph->size;
        free(ph);
    }
}

/* POSIX file descriptor handles: the physical memory's memfd, so that another process that
 * imports it maps the same bytes (as the driver's shareable handles do). */
FAKE_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
                                                  CUmemAllocationHandleType type,
                                                  unsigned long long flags)
{
    CHECK_INIT();
    FAULT("cuMemExportToShareableHandle", CUDA_ERROR_INVALID_VALUE);
    struct fake_phys *ph = (struct fake_phys *)(uintptr_t)h;
    if (!shareable || !ph || ph->released || flags ||
        type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(ph->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *osHandle,
                                                    CUmemAllocationHandleType type)
{
    CHECK_CTX();
    FAULT("cuMemImportFromShareableHandle", CUDA_ERROR_INVALID_VALUE);
    struct stat st;
    int fd = (int)(intptr_t)osHandle;
    if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) ||
        st.st_size <= 0 || st.st_size % FAKE_VMM_GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_phys *ph = calloc(1, sizeof(*ph));
    int own = ph ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (own < 0) {
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* the exporter's memory: this process's device use does not grow */
    *ph = (struct fake_phys){
        .fd = own, .size = (size_t)st.st_size, .device = current_ctx()->device, .imported = true};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

/* Mapped ranges: which handle backs [va, va+size). */
struct fake_map {
    uintptr_t va;
    size_t size;
    struct fake_phys *ph;
    unsigned access; /* devices that may read and write it (cuMemSetAccess), one bit each */
};
static struct fake_map g_maps[4096];

/* A pointer into mapped VMM memory: like the driver, the range is the one mapping. */
static CUresult vmm_pointer_attr_locked(void *data, CUpointer_attribute attr, uintptr_t p)
{
    const struct fake_map *m = NULL;
    for (int i = 0; i < 4096 && !m; i++)
        if (g_maps[i].va && p >= g_maps[i].va && p < g_maps[i].va + g_maps[i].size)
            m = &g_maps[i];
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = m->ph->device;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)&g_devices[dev].ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = (CUdeviceptr)p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)m->va;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = m->size;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = dev;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags opt)
{
    (void)opt;
    CHECK_INIT();
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = FAKE_VMM_GRANULE;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
                                         CUdeviceptr addr, unsigned long long flags)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY);
    (void)align;
    (void)addr;
    (void)flags;
    CHECK_INIT();
    if (!ptr || !size || size % FAKE_VMM_GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemAddressFree", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_INIT();
    if (!ptr || munmap((void *)ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_INIT();
    spin_us(g_vmm_us);
    if (!h || !prop || flags || !size || size % FAKE_VMM_GRANULE || prop->location.id < 0 ||
        prop->location.id >= g_nr_devices)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    pthread_mutex_lock(&g_lock);
    if (g_devices[dev].used + size > g_devices[dev].size) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fake_phys *ph = calloc(1, sizeof(*ph));
    int fd = ph ? memfd_create("fakecuda-phys", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size)) {
        if (fd >= 0)
            close(fd);
        free(ph);
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ph = (struct fake_phys){.fd = fd, .size = size, .device = dev};
    g_devices[dev].used += size;
    pthread_mutex_unlock(&g_lock);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemRelease", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_INIT();
    spin_us(g_vmm_us);
    struct fake_phys *ph = (struct fake_phys *)(uintptr_t)h;
    if (!ph || ph->released)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    ph->released = true;
    phys_put_locked(ph);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle h, unsigned long long flags)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_INIT();
    spin_us(g_vmm_us);
    struct fake_phys *ph = (struct fake_phys *)(uintptr_t)h;
    if (!ptr || !ph || flags || ph->released || offset + size > ph->size)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset) /* as on the H200's driver (bench/probe-vmm.c): a handle maps whole or not */
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < 4096; i++)
        if (g_maps[i].va && g_maps[i].va < ptr + size && ptr < g_maps[i].va + g_maps[i].size) {
            /* as the real driver: nothing is mapped over a mapping */
            pthread_mutex_unlock(&g_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
    for (int i = 0; i < 4096; i++)
        if (!g_maps[i].va) {
            slot = i;
            break;
        }
    void *p = slot < 0 ? MAP_FAILED
                       : mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd,
                              (off_t)offset);
    if (p == MAP_FAILED) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_maps[slot] = (struct fake_map){ptr, size, ph, 0};
    ph->mapped++;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                    size_t count)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemSetAccess", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_INIT();
    spin_us(g_vmm_us);
    if (!ptr || !desc || !count)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g_nr_devices)
            return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    bool any = false;
    for (int m = 0; m < 4096; m++) {
        struct fake_map *fm = &g_maps[m];
        if (!fm->va || fm->va < ptr || fm->va + fm->size > ptr + size)
            continue;
        any = true;
        for (size_t i = 0; i < count; i++) {
            unsigned bit = 1u << desc[i].location.id;
            fm->access = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE ? fm->access & ~bit
                                                                        : fm->access | bit;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!any)
        return CUDA_ERROR_INVALID_VALUE;
    return mprotect((void *)ptr, size, PROT_READ | PROT_WRITE) ? CUDA_ERROR_INVALID_VALUE
                                                               : CUDA_SUCCESS;
}

/* Whether a device may read and write ptr: for mapped VMM memory, what cuMemSetAccess
 * granted; for cuMemAlloc memory (which the real driver does not answer for here), its own
 * device, and devices given peer access to it: so a test asks one question whatever the
 * memory is. */
FAKE_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                    CUdeviceptr ptr)
{
    CHECK_INIT();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || location->id < 0 ||
        location->id >= g_nr_devices)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned bit = 1u << location->id;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (int m = 0; m < 4096; m++)
        if (g_maps[m].va && ptr >= g_maps[m].va && ptr < g_maps[m].va + g_maps[m].size) {
            *flags = g_maps[m].access & bit ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                            : CU_MEM_ACCESS_FLAGS_PROT_NONE;
            r = CUDA_SUCCESS;
        }
    for (int dev = 0; r != CUDA_SUCCESS && dev < g_nr_devices; dev++)
        if (ptr >= g_devices[dev].base && ptr < g_devices[dev].base + g_devices[dev].range &&
            find_alloc_locked(ptr)) {
            *flags = dev == location->id || g_peer[location->id][dev]
                         ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                         : CU_MEM_ACCESS_FLAGS_PROT_NONE;
            r = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_VMM], 1);
    FAULT("cuMemUnmap", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_INIT();
    spin_us(g_vmm_us);
    pthread_mutex_lock(&g_lock);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 4096; i++)
        if (g_maps[i].va == ptr && g_maps[i].size == size) {
            mmap((void *)ptr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            struct fake_phys *ph = g_maps[i].ph;
            g_maps[i] = (struct fake_map){0};
            ph->mapped--;
            phys_put_locked(ph);
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ---- streams and events ---- */

FAKE_EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    FAULT("cuStreamCreate", CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CTX();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s = stream_new_locked(current_ctx()->device, flags, false);
    pthread_mutex_unlock(&g_lock);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int prio)
{
    (void)prio;
    return cuStreamCreate(ph, flags);
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r == CUDA_SUCCESS && s->legacy)
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_lock);
        return r;
    }
    /* Like the driver, the handle dies now and the call returns at once; work queued before
     * still runs to its end (the worker drains the queue, then exits on its own). */
    s->stop = true;
    s->magic = 0;
    for (int i = 0; i < NR_MAX_STREAMS; i++)
        if (g_streams[i] == s)
            g_streams[i] = NULL;
    pthread_cond_broadcast(&g_progress);
    /* Not freed but kept on a list: work queued earlier on other streams (the legacy stream's,
     * say) may still name this stream among its dependencies, and reads its completed count.
     * Freeing it made such work wait on freed memory, forever under MALLOC_PERTURB_ (a hang
     * of the integration tests, 1 run in ~40). The worker runs on, detached. */
    s->dead_next = g_dead_streams;
    g_dead_streams = s;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

static CUresult enqueue_on(CUstream h, struct work *w)
{
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_lock);
        free(w);
        return r;
    }
    if (s->capturing)
        free(w); /* recorded into the graph, not run */
    else
        enqueue_locked(s, w);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *arg)
{
    FAULT("cuLaunchHostFunc", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct work *w = calloc(1, sizeof(*w));
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    w->kind = WORK_HOSTFN;
    w->fn = fn;
    w->arg = arg;
    return enqueue_on(h, w);
}

FAKE_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *arg)
{
    return cuLaunchHostFunc(per_thread(h), fn, arg);
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_SYNC], 1);
    FAULT("cuStreamSynchronize", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    struct work *w = calloc(1, sizeof(*w));
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r == CUDA_SUCCESS)
        submit_sync_locked(s, w);
    else
        free(w);
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream h)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_QUERY], 1);
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    /* the legacy stream answers for the streams ordered with it too (blocking and per-thread
     * default streams, destroyed ones with work left included), as the driver's did on an
     * H200 (bench/probe-fence.c) */
    if (r == CUDA_SUCCESS &&
        (s->completed < s->submitted || (s->legacy && g_devices[s->device].nr_busy_ordered)))
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    FAULT("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
    (void)flags;
    CHECK_CTX();
    if (!ph)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent h)
{
    CHECK_INIT();
    struct fake_event *e = (struct fake_event *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    /* Keep it simple: wait until the pending record has run so no worker touches it. */
    while (e->done < e->recorded)
        pthread_cond_wait(&g_progress, &g_lock);
    e->magic = 0;
    pthread_mutex_unlock(&g_lock);
    free(e);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent h, CUstream st)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_EVENT_RECORD], 1);
    FAULT("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_CTX();
    struct fake_event *e = (struct fake_event *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct work *w = calloc(1, sizeof(*w));
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(st, &s);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_lock);
        free(w);
        return r;
    }
    if (s->capturing) {
        pthread_mutex_unlock(&g_lock);
        free(w);
        return CUDA_SUCCESS;
    }
    w->kind = WORK_EVENT;
    w->event = e;
    w->gen = ++e->recorded;
    if (idle_for_record_locked(s)) {
        e->done = w->gen;
        pthread_mutex_unlock(&g_lock);
        free(w);
        return CUDA_SUCCESS;
    }
    enqueue_locked(s, w);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent h, CUstream st)
{
    return cuEventRecord(h, per_thread(st));
}

FAKE_EXPORT CUresult cuEventQuery(CUevent h)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_QUERY], 1);
    FAULT("cuEventQuery", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_INIT();
    struct fake_event *e = (struct fake_event *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    CUresult r = e->done >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent h)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_SYNC], 1);
    FAULT("cuEventSynchronize", CUDA_ERROR_LAUNCH_FAILED);
    CHECK_INIT();
    struct fake_event *e = (struct fake_event *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    while (e->done < e->recorded)
        pthread_cond_wait(&g_progress, &g_lock);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream st, CUevent h, unsigned int flags)
{
    (void)flags;
    CHECK_CTX();
    struct fake_event *e = (struct fake_event *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct work *w = calloc(1, sizeof(*w));
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    w->kind = WORK_WAIT;
    w->event = e;
    pthread_mutex_lock(&g_lock);
    w->gen = e->recorded;
    pthread_mutex_unlock(&g_lock);
    return enqueue_on(st, w);
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r == CUDA_SUCCESS && (s->legacy || s->capturing))
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (r == CUDA_SUCCESS)
        s->capturing = (int)mode + 1;
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    return cuStreamBeginCapture_v2(per_thread(h), mode);
}

static char g_fake_graph;

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *g)
{
    CHECK_CTX();
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r == CUDA_SUCCESS && !s->capturing)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        s->capturing = 0;
        *g = (CUgraph)&g_fake_graph;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g)
{
    return cuStreamEndCapture(per_thread(h), g);
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    CHECK_CTX();
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    if (r == CUDA_SUCCESS)
        *st = s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ---- copies and memsets ---- */

static bool range_ok_locked(uintptr_t p, size_t n)
{
    struct fake_alloc *a = find_alloc_locked(p);
    if (a)
        return p + n <= a->ptr + a->size;
    /* VMM: the range may cross from one mapping into the next (a block over several granules
     * mapped one by one), as long as every byte of it is mapped */
    uintptr_t end = p + n;
    for (bool found = true; found && p < end;) {
        found = false;
        for (int i = 0; i < 4096 && !found; i++)
            if (g_maps[i].va && p >= g_maps[i].va && p < g_maps[i].va + g_maps[i].size) {
                p = g_maps[i].va + g_maps[i].size;
                found = true;
            }
        if (!found)
            return false;
    }
    return true;
}

static CUresult copy_or_set(CUstream h, bool sync, enum work_kind kind, void *dst, const void *src,
                            size_t n, unsigned char v, uintptr_t devptr)
{
    CHECK_CTX();
    pthread_mutex_lock(&g_lock);
    if (!range_ok_locked(devptr, n)) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_stream *s;
    CUresult r = resolve_stream_locked(h, &s);
    struct work *w = r == CUDA_SUCCESS ? calloc(1, sizeof(*w)) : NULL;
    if (r == CUDA_SUCCESS && !w)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        w->kind = kind;
        w->dst = dst;
        w->src = src;
        w->n = n;
        w->value = v;
        if (s->capturing)
            free(w);
        else if (sync)
            submit_sync_locked(s, w);
        else
            enqueue_locked(s, w);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    return copy_or_set(NULL, true, WORK_MEMSET, (void *)d, NULL, n, v, d);
}

FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h)
{
    return copy_or_set(h, false, WORK_MEMSET, (void *)d, NULL, n, v, d);
}

FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *src, size_t n)
{
    return copy_or_set(NULL, true, WORK_MEMCPY, (void *)d, src, n, 0, d);
}

FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr s, size_t n)
{
    return copy_or_set(NULL, true, WORK_MEMCPY, dst, (const void *)s, n, 0, s);
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *src, size_t n, CUstream h)
{
    return copy_or_set(h, false, WORK_MEMCPY, (void *)d, src, n, 0, d);
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr s, size_t n, CUstream h)
{
    return copy_or_set(h, false, WORK_MEMCPY, dst, (const void *)s, n, 0, s);
}

/* ---- entry point lookup ---- */

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *st);
FAKE_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags);

typedef void (*any_fn)(void);

struct proc_entry {
    const char *name; /* base name, as the runtime asks for it */
    any_fn fn;        /* the current ABI */
    any_fn ptsz;      /* per-thread default stream twin, if any */
};

#define P(n, f)                                                                                    \
    {                                                                                              \
        n, (any_fn)(f), NULL                                                                       \
    }
#define PZ(n, f, z)                                                                                \
    {                                                                                              \
        n, (any_fn)(f), (any_fn)(z)                                                                \
    }

static void *as_ptr(any_fn f)
{
    void *p;
    memcpy(&p, &f, sizeof(p));
    return p;
}
static const struct proc_entry g_procs[] = {
    P("cuInit", cuInit),
    P("cuDriverGetVersion", cuDriverGetVersion),
    P("cuDeviceGet", cuDeviceGet),
    P("cuDeviceGetCount", cuDeviceGetCount),
    P("cuDeviceGetName", cuDeviceGetName),
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState),
    P("cuCtxDestroy", cuCtxDestroy_v2),
    P("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess),
    P("cuMemGetAccess", cuMemGetAccess),
    P("cuCtxSetCurrent", cuCtxSetCurrent),
    P("cuCtxGetCurrent", cuCtxGetCurrent),
    P("cuCtxPushCurrent", cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", cuCtxGetDevice),
    P("cuCtxSynchronize", cuCtxSynchronize),
    P("cuGetErrorName", cuGetErrorName),
    P("cuGetErrorString", cuGetErrorString),
    P("cuMemAlloc", cuMemAlloc_v2),
    P("cuMemAllocPitch", cuMemAllocPitch_v2),
    P("cuMemAllocManaged", cuMemAllocManaged),
    P("cuMemFree", cuMemFree_v2),
    PZ("cuMemAllocAsync", cuMemAllocAsync, cuMemAllocAsync_ptsz),
    P("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool),
    PZ("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    PZ("cuMemFreeAsync", cuMemFreeAsync, cuMemFreeAsync_ptsz),
    P("cuMemGetInfo", cuMemGetInfo_v2),
    P("cuMemGetAddressRange", cuMemGetAddressRange_v2),
    P("cuMemAllocHost", cuMemAllocHost_v2),
    P("cuMemHostAlloc", cuMemHostAlloc),
    P("cuMemFreeHost", cuMemFreeHost),
    P("cuPointerGetAttribute", cuPointerGetAttribute),
    P("cuPointerGetAttributes", cuPointerGetAttributes),
    P("cuIpcGetMemHandle", cuIpcGetMemHandle),
    P("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", cuIpcCloseMemHandle),
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle),
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity),
    P("cuMemAddressReserve", cuMemAddressReserve),
    P("cuMemAddressFree", cuMemAddressFree),
    P("cuMemCreate", cuMemCreate),
    P("cuMemRelease", cuMemRelease),
    P("cuMemMap", cuMemMap),
    P("cuMemUnmap", cuMemUnmap),
    P("cuMemSetAccess", cuMemSetAccess),
    P("cuStreamCreate", cuStreamCreate),
    P("cuStreamCreateWithPriority", cuStreamCreateWithPriority),
    P("cuStreamDestroy", cuStreamDestroy_v2),
    P("cuStreamSynchronize", cuStreamSynchronize),
    P("cuStreamQuery", cuStreamQuery),
    P("cuStreamWaitEvent", cuStreamWaitEvent),
    PZ("cuStreamBeginCapture", cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    PZ("cuStreamEndCapture", cuStreamEndCapture, cuStreamEndCapture_ptsz),
    P("cuStreamIsCapturing", cuStreamIsCapturing),
    P("cuEventCreate", cuEventCreate),
    P("cuEventDestroy", cuEventDestroy_v2),
    PZ("cuEventRecord", cuEventRecord, cuEventRecord_ptsz),
    P("cuEventQuery", cuEventQuery),
    P("cuEventSynchronize", cuEventSynchronize),
    PZ("cuLaunchHostFunc", cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    P("cuMemsetD8", cuMemsetD8_v2),
    P("cuMemsetD8Async", cuMemsetD8Async),
    P("cuMemcpyHtoD", cuMemcpyHtoD_v2),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2),
    P("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2),
    P("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2),
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *st)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        *pfn = as_ptr(version >= 12000 ? (any_fn)cuGetProcAddress_v2 : (any_fn)cuGetProcAddress);
    } else {
        for (size_t i = 0; i < sizeof(g_procs) / sizeof(g_procs[0]); i++)
            if (strcmp(g_procs[i].name, symbol) == 0) {
                bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
                *pfn = as_ptr(per_thread && g_procs[i].ptsz ? g_procs[i].ptsz : g_procs[i].fn);
                break;
            }
    }
    if (st)
        *st = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_GET_PROC_ADDRESS], 1);
    return lookup(symbol, pfn, version, flags, st);
}

FAKE_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    atomic_fetch_add(&g_calls[FAKECUDA_CALL_GET_PROC_ADDRESS], 1);
    return lookup(symbol, pfn, version, flags, NULL);
}

FAKE_EXPORT unsigned long fakecuda_calls(enum fakecuda_counter c)
{
    return c < FAKECUDA_NR_COUNTERS ? atomic_load(&g_calls[c]) : 0;
}

FAKE_EXPORT size_t fakecuda_live_allocations(void)
{
    pthread_mutex_lock(&g_lock);
    size_t n = 0;
    for (size_t i = 0; i < g_nr_allocs; i++)
        n += g_allocs[i].kind != KIND_HOST;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Whether cuMemAlloc_v2 of n bytes on device dev would find room now (no fault drawn). */
FAKE_EXPORT int fakecuda_device_fits(int dev, size_t n)
{
    pthread_mutex_lock(&g_lock);
    uintptr_t start;
    bool fits =
        dev >= 0 && dev < g_nr_devices && device_place_locked(dev, round_alloc(n ? n : 1), &start);
    pthread_mutex_unlock(&g_lock);
    return fits;
}

/* Bytes the simulated device has handed out (rounded allocations and VMM physical memory),
 * for tests that compare it with what cuheap says it holds; 0 for a device that is not there. */
FAKE_EXPORT size_t fakecuda_device_used(int dev)
{
    pthread_mutex_lock(&g_lock);
    size_t n = dev >= 0 && dev < g_nr_devices ? g_devices[dev].used : 0;
    pthread_mutex_unlock(&g_lock);
    return n;
}
