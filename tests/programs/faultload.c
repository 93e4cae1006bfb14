/* SPDX-License-Identifier: MIT */
/*
 * The fault-injection workload (scripts/fault-runs.sh, the `faults` test): threads allocate,
 * fill, check and free memory through every allocation door cuheap serves (cuMemAlloc, pitch,
 * managed, stream-ordered, pinned host, the program's own VMM) on the simulated devices, with
 * slow "kernels" still reading blocks the program has freed, while FAKECUDA_FAIL makes the
 * driver fail. It judges what a user would see:
 *   - every call ends in success or in an error the driver itself gives for that call (its own
 *     errors, or the one FAKECUDA_FAIL made that very entry point return, whatever its code);
 *   - an allocation the driver alone grants is granted: with one thread, cuMemAlloc (pitch,
 *     managed, stream-ordered) answers out of memory only when the simulated device had no
 *     room for it before the call, or the driver was made to fail that entry point itself;
 *   - every block holds what the program wrote into it (no two live blocks share bytes), and a
 *     kernel reading a freed block sees it unchanged until it is done (FAULTLOAD_READERS=1);
 *   - once everything is freed, cuheap counts no live bytes and holds exactly what the
 *     simulated devices still have handed out (nothing leaked, nothing counted twice).
 * Exit 0: all held; 1: the driver refused the start (an injected fault, passed through);
 * 2: usage; 10: a broken promise, each named on stderr ("faultload: VIOLATION: ...").
 *   faultload SEED [OPS [THREADS]]
 * FAULTLOAD_READERS=0 leaves out the kernels that read freed blocks: for runs whose faults hit
 * cuEventQuery or cuEventSynchronize, where a failing query means the context is broken and
 * nothing more runs on it (cuheap then counts the fence as passed).
 */
#include <cuda.h>
#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

#define NR_MAX_DEVICES 8
#define NR_MAX_BLOCKS  192
#define NR_MAX_THREADS 16
#define NR_STREAMS     3
#define NR_RETRIES     200

enum kind { K_ALLOC, K_PITCH, K_MANAGED, K_ASYNC, K_HOST, K_VMM, NR_KINDS };
static const char *const kind_names[NR_KINDS] = {"cuMemAlloc",        "cuMemAllocPitch",
                                                 "cuMemAllocManaged", "cuMemAllocAsync",
                                                 "cuMemAllocHost",    "vmm"};

struct block {
    CUdeviceptr ptr; /* device address, or the host pointer for K_HOST */
    size_t size;     /* bytes the program may use (pitch * height for K_PITCH) */
    size_t counted;  /* bytes cuheap counts as live for it */
    enum kind kind;
    int dev;
    unsigned char pat;
    CUstream stream;                /* K_ASYNC: the stream it was allocated on */
    CUmemGenericAllocationHandle h; /* K_VMM */
    size_t vsize;                   /* K_VMM: reserved and mapped bytes */
    bool mapped;                    /* K_VMM: h is mapped at ptr */
    bool broken;                    /* K_VMM: half made; only freeing it is left */
};

struct reader {
    const unsigned char *p;
    size_t n;
    unsigned char pat;
    int delay_us;
    atomic_bool done;
    atomic_bool changed;
    struct reader *next;
};

struct worker {
    int id;
    uint64_t rng;
    int dev;
    struct block blocks[NR_MAX_BLOCKS];
    int nr;
    CUstream streams[NR_MAX_DEVICES][NR_STREAMS];
    long nr_allocs, nr_alloc_failed, nr_frees, nr_free_failed, nr_readers, nr_other_failed;
    int left; /* blocks the driver would not free */
    uint64_t left_counted;
};

static int nr_devices;
static CUcontext ctxs[NR_MAX_DEVICES];
static long nr_ops = 600;
static int nr_threads = 1;
static bool use_readers = true;
static atomic_int nr_violations;
static bool judge_room; /* one thread: nothing else takes device memory during a call */
static pthread_mutex_t readers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct reader *readers; /* guarded by readers_lock */
static size_t granule = 2u << 20;

static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "faultload: VIOLATION: %s\n", line);
    atomic_fetch_add(&nr_violations, 1);
}

static const char *err_name(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        s = "?";
    return s;
}

/* Faults the simulated driver injected on this thread up to the last call judged. */
static _Thread_local unsigned long judged_faults;

/* Whether a fault injected on this thread since the last call judged was error r made at the
 * entry point `what` itself (FAKECUDA_FAIL's name, e.g. cuMemAlloc): what the driver alone
 * would have answered the program, whatever the code. (cuheap's own calls meanwhile may fail
 * too: those are not the program's answer.) */
static bool injected(const char *what, CUresult r)
{
    for (unsigned long n = fakecuda_thread_faults(); n > judged_faults; n--) {
        const char *name;
        int err;
        if (fakecuda_thread_fault(n, &name, &err))
            return true; /* not kept: too many to tell, give the benefit of the doubt */
        if (!strcmp(name, what) && (CUresult)err == r)
            return true;
    }
    return false;
}

/* The call returned r: success, one of the errors the driver gives for it (a 0-ended list), or
 * the one injected into that entry point. Anything else is a violation. */
static bool expect(const char *what, CUresult r, ...)
{
    bool made = r != CUDA_SUCCESS && injected(what, r);
    judged_faults = fakecuda_thread_faults();
    if (r == CUDA_SUCCESS)
        return true;
    if (made)
        return false;
    va_list ap;
    va_start(ap, r);
    for (int e = va_arg(ap, int); e; e = va_arg(ap, int))
        if ((CUresult)e == r) {
            va_end(ap);
            return false;
        }
    va_end(ap);
    violation("%s returned %s (%d), which the driver does not give for it", what, err_name(r),
              (int)r);
    return false;
}

#define OOM  CUDA_ERROR_OUT_OF_MEMORY
#define LF   CUDA_ERROR_LAUNCH_FAILED
#define ICTX CUDA_ERROR_INVALID_CONTEXT

static uint64_t next(struct worker *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static size_t pick_size(struct worker *w)
{
    unsigned r = (unsigned)(next(w) % 100);
    if (r < 65)
        return 256 + next(w) % (64 << 10);
    if (r < 92)
        return (64 << 10) + next(w) % (2 << 20);
    if (r < 99)
        return (2 << 20) + next(w) % (14 << 20);
    return (65 << 20) + next(w) % (8 << 20); /* beyond CUHEAP_POOL_MAX: the driver's */
}

static bool set_current(int dev)
{
    for (int i = 0; i < NR_RETRIES; i++) {
        CUresult r = cuCtxSetCurrent(ctxs[dev]);
        if (expect("cuCtxSetCurrent", r, ICTX, 0))
            return true;
    }
    return false;
}

/* Parts of a block the checks read: both ends and a few places between. */
static bool holds(const struct block *b)
{
    if (b->broken)
        return true;
    static _Thread_local unsigned char buf[4096];
    size_t places[6] = {
        0,          b->size > 4096 ? b->size - 4096 : 0, b->size / 2, b->size / 3, b->size / 5 * 4,
        b->size / 7};
    for (int i = 0; i < 6; i++) {
        size_t off = places[i], n = b->size - off < sizeof(buf) ? b->size - off : sizeof(buf);
        if (b->kind == K_HOST) {
            memcpy(buf, (const void *)(uintptr_t)(b->ptr + off), n);
        } else {
            CUresult r = cuMemcpyDtoH(buf, b->ptr + off, n);
            if (r != CUDA_SUCCESS) {
                violation("cuMemcpyDtoH from a live %s block %#llx+%zu of %zu bytes: %s",
                          kind_names[b->kind], (unsigned long long)b->ptr, off, b->size,
                          err_name(r));
                return false;
            }
        }
        for (size_t j = 0; j < n; j++)
            if (buf[j] != b->pat) {
                violation("%s block %#llx (%zu bytes, device %d) changed under the program at "
                          "byte %zu: %#x, not %#x",
                          kind_names[b->kind], (unsigned long long)b->ptr, b->size, b->dev, off + j,
                          buf[j], b->pat);
                return false;
            }
    }
    return true;
}

static bool fill(struct block *b)
{
    if (b->kind == K_HOST) {
        memset((void *)(uintptr_t)b->ptr, b->pat, b->size);
        return true;
    }
    CUresult r = cuMemsetD8(b->ptr, b->pat, b->size);
    if (r != CUDA_SUCCESS)
        violation("cuMemsetD8 on a new %s block %#llx of %zu bytes: %s", kind_names[b->kind],
                  (unsigned long long)b->ptr, b->size, err_name(r));
    return r == CUDA_SUCCESS;
}

static CUstream stream_of(struct worker *w)
{
    int i = (int)(next(w) % (NR_STREAMS + 1));
    if (i == NR_STREAMS)
        return NULL; /* the legacy default stream */
    CUstream *s = &w->streams[w->dev][i];
    if (!*s) {
        CUresult r = cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
        if (!expect("cuStreamCreate", r, OOM, 0))
            *s = NULL;
    }
    return *s;
}

/* The program's own virtual memory: reserve, create, map, allow. On a failure what was done
 * stays in b (mapped, h) for free_block() to undo, as a program would. */
static CUresult vmm_alloc(struct worker *w, struct block *b, size_t size)
{
    b->vsize = (size + granule - 1) / granule * granule;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = w->dev;
    CUresult r = cuMemAddressReserve(&b->ptr, b->vsize, 0, 0, 0);
    if (!expect("cuMemAddressReserve", r, OOM, 0)) {
        b->ptr = 0;
        return r;
    }
    r = cuMemCreate(&b->h, b->vsize, &prop, 0);
    if (!expect("cuMemCreate", r, OOM, 0)) {
        b->h = 0;
        return r;
    }
    b->counted = b->vsize; /* cuheap counts the cuMemCreate, as pass-through */
    r = cuMemMap(b->ptr, b->vsize, 0, b->h, 0);
    if (!expect("cuMemMap", r, OOM, 0))
        return r;
    b->mapped = true;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof(a));
    a.location = prop.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemSetAccess(b->ptr, b->vsize, &a, 1);
    expect("cuMemSetAccess", r, OOM, 0);
    return r;
}

static bool free_block(struct worker *w, struct block *b, bool through_stream);

static void do_alloc(struct worker *w)
{
    if (w->nr == NR_MAX_BLOCKS)
        return;
    struct block *b = &w->blocks[w->nr];
    memset(b, 0, sizeof(*b));
    b->kind = (enum kind)(next(w) % NR_KINDS);
    b->dev = w->dev;
    b->pat = (unsigned char)(1 + next(w) % 255);
    size_t size = pick_size(w);
    if (b->kind == K_HOST || b->kind == K_VMM)
        size = size % (8 << 20) + 1;
    CUresult r = CUDA_SUCCESS;
    const char *what = kind_names[b->kind];
    b->size = b->counted = size;
    size_t pitch = 0, width = 1 + size % 5000, height = 1 + size / width % 512;
    /* room the device had before the call, as the driver alone would see it (less what cuheap
     * holds: a lower bound) */
    size_t need = b->kind == K_PITCH ? ((width + 511) & ~(size_t)511) * height : size;
    bool room = judge_room && b->kind <= K_ASYNC && fakecuda_device_fits(w->dev, need);
    switch (b->kind) {
    case K_ALLOC:
        r = cuMemAlloc(&b->ptr, size);
        break;
    case K_PITCH:
        r = cuMemAllocPitch(&b->ptr, &pitch, width, height, 4);
        b->size = b->counted = pitch * height;
        break;
    case K_MANAGED:
        r = cuMemAllocManaged(&b->ptr, size, CU_MEM_ATTACH_GLOBAL);
        break;
    case K_ASYNC:
        b->stream = stream_of(w);
        r = cuMemAllocAsync(&b->ptr, size, b->stream);
        break;
    case K_HOST: {
        void *p = NULL;
        r = cuMemAllocHost(&p, size);
        b->ptr = (CUdeviceptr)(uintptr_t)p;
        b->counted = 0; /* host memory is not the device's */
        break;
    }
    case K_VMM:
        b->counted = 0;
        r = vmm_alloc(w, b, size);
        b->size = b->vsize;
        if (r != CUDA_SUCCESS && b->ptr && !free_block(w, b, false)) {
            b->broken = true; /* half made, and the driver would not undo it yet */
            w->nr++;
        }
        break;
    default:
        break;
    }
    if (r == OOM && room && !injected(what, OOM))
        violation("%s of %zu bytes on device %d: out of memory while the device had room for it "
                  "(the driver alone grants it)",
                  what, need, w->dev);
    if (b->kind != K_VMM && !expect(what, r, OOM, 0)) {
        w->nr_alloc_failed++;
        return;
    }
    if (r != CUDA_SUCCESS) { /* vmm: each step judged already */
        w->nr_alloc_failed++;
        return;
    }
    w->nr_allocs++;
    if (b->kind == K_ASYNC) {
        /* stream-ordered: usable on its stream; the program waits for it once */
        CUresult s = cuStreamSynchronize(b->stream);
        expect("cuStreamSynchronize", s, LF, 0);
    }
    if (fill(b))
        w->nr++;
}

/* Free a block, retrying what the driver fails; false when it would not. */
static bool free_block(struct worker *w, struct block *b, bool through_stream)
{
    for (int i = 0; i < NR_RETRIES; i++) {
        CUresult r = CUDA_SUCCESS;
        switch (b->kind) {
        case K_HOST:
            r = cuMemFreeHost((void *)(uintptr_t)b->ptr);
            if (r != CUDA_SUCCESS)
                violation("cuMemFreeHost of a live block: %s", err_name(r));
            return r == CUDA_SUCCESS;
        case K_VMM:
            if (b->mapped) {
                r = cuMemUnmap(b->ptr, b->vsize);
                if (!expect("cuMemUnmap", r, LF, 0))
                    continue;
                b->mapped = false;
                b->broken = true; /* no longer usable, whatever happens next */
            }
            if (b->h) {
                r = cuMemRelease(b->h);
                if (!expect("cuMemRelease", r, LF, 0))
                    continue;
                b->h = 0;
                b->counted = 0;
            }
            r = cuMemAddressFree(b->ptr, b->vsize);
            if (!expect("cuMemAddressFree", r, LF, 0))
                continue;
            return true;
        case K_ASYNC:
            if (through_stream) {
                r = cuMemFreeAsync(b->ptr, b->stream);
                if (expect("cuMemFreeAsync", r, LF, 0))
                    return true;
                continue;
            }
            r = cuMemFree(b->ptr); /* cuMemFree frees stream-ordered memory too */
            if (expect("cuMemFree", r, LF, 0))
                return true;
            break;
        default:
            r = cuMemFree(b->ptr);
            if (expect("cuMemFree", r, LF, 0))
                return true;
        }
    }
    w->nr_free_failed++;
    return false;
}

static void drop(struct worker *w, int i)
{
    w->blocks[i] = w->blocks[--w->nr];
}

static void do_free(struct worker *w)
{
    if (!w->nr)
        return;
    int i = (int)(next(w) % (uint64_t)w->nr);
    struct block *b = &w->blocks[i];
    holds(b);
    if (free_block(w, b, next(w) % 2)) {
        w->nr_frees++;
        drop(w, i);
    }
}

static void reader_run(void *arg)
{
    struct reader *r = arg;
    struct timespec ts = {0, (long)r->delay_us * 1000};
    nanosleep(&ts, NULL);
    for (size_t i = 0; i < r->n; i += 61)
        if (r->p[i] != r->pat)
            atomic_store(&r->changed, true);
    if (r->p[r->n - 1] != r->pat)
        atomic_store(&r->changed, true);
    atomic_store(&r->done, true);
}

/* A slow kernel reads a block the program then frees at once: nothing may change under it. */
static void do_reader(struct worker *w)
{
    if (!w->nr || !use_readers)
        return;
    int i = (int)(next(w) % (uint64_t)w->nr);
    struct block *b = &w->blocks[i];
    /* a kernel on another device is not ordered with this device's work, by cuMemFree
     * either: the driver frees under it too */
    if (b->kind == K_HOST || b->kind == K_VMM || b->dev != w->dev)
        return;
    struct reader *r = calloc(1, sizeof(*r));
    if (!r)
        return;
    *r = (struct reader){.p = (const unsigned char *)(uintptr_t)b->ptr,
                         .n = b->size,
                         .pat = b->pat,
                         .delay_us = (int)(500 + next(w) % 8000)};
    CUstream s = b->kind == K_ASYNC ? b->stream : stream_of(w);
    CUresult lr = cuLaunchHostFunc(s, reader_run, r);
    if (!expect("cuLaunchHostFunc", lr, LF, 0)) {
        free(r);
        return;
    }
    pthread_mutex_lock(&readers_lock);
    r->next = readers;
    readers = r;
    pthread_mutex_unlock(&readers_lock);
    w->nr_readers++;
    if (free_block(w, b, b->kind == K_ASYNC)) {
        w->nr_frees++;
        drop(w, i);
    }
}

static void do_other(struct worker *w)
{
    switch (next(w) % 6) {
    case 0: /* another device */
        if (nr_devices > 1) {
            int dev = (int)(next(w) % (uint64_t)nr_devices);
            if (set_current(dev))
                w->dev = dev;
        }
        break;
    case 1: { /* a stream comes and goes */
        CUstream *s = &w->streams[w->dev][next(w) % NR_STREAMS];
        bool used = false;
        for (int i = 0; i < w->nr; i++)
            used |= w->blocks[i].stream == *s && *s;
        if (*s && !used) {
            CUresult r = cuStreamDestroy(*s);
            if (r != CUDA_SUCCESS)
                violation("cuStreamDestroy of a live stream: %s", err_name(r));
            *s = NULL;
        }
        break;
    }
    case 2: {
        size_t f = 0, t = 0;
        if (!expect("cuMemGetInfo", cuMemGetInfo(&f, &t), LF, 0))
            w->nr_other_failed++;
        else if (f > t)
            violation("cuMemGetInfo: %zu free of %zu", f, t);
        break;
    }
    case 3: { /* range queries answer the block */
        if (!w->nr)
            break;
        struct block *b = &w->blocks[next(w) % (uint64_t)w->nr];
        if (b->kind == K_HOST || b->kind == K_VMM || b->kind == K_PITCH)
            break;
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult r = cuMemGetAddressRange(&base, &size, b->ptr + b->size / 2);
        if (r != CUDA_SUCCESS || base != b->ptr || size != b->size)
            violation("cuMemGetAddressRange inside a live %s block %#llx of %zu bytes: %s, "
                      "%#llx, %zu bytes",
                      kind_names[b->kind], (unsigned long long)b->ptr, b->size, err_name(r),
                      (unsigned long long)base, size);
        break;
    }
    case 4:
        if (!expect("cuCtxSynchronize", cuCtxSynchronize(), LF, 0))
            w->nr_other_failed++;
        break;
    default: /* every block still holds what was written */
        for (int i = 0; i < w->nr; i++)
            holds(&w->blocks[i]);
        break;
    }
}

static void *work(void *arg)
{
    struct worker *w = arg;
    w->dev = w->id % nr_devices;
    if (!set_current(w->dev))
        return NULL;
    for (long op = 0; op < nr_ops; op++) {
        unsigned r = (unsigned)(next(w) % 100);
        if (r < 45)
            do_alloc(w);
        else if (r < 80)
            do_free(w);
        else if (r < 90)
            do_reader(w);
        else
            do_other(w);
    }
    /* the end: everything goes back */
    for (int i = w->nr - 1; i >= 0; i--) {
        struct block *b = &w->blocks[i];
        if (b->dev != w->dev && set_current(b->dev))
            w->dev = b->dev;
        holds(b);
        if (free_block(w, b, false)) {
            w->nr_frees++;
        } else {
            w->left++;
            w->left_counted += b->counted;
        }
    }
    w->nr = 0;
    for (int d = 0; d < nr_devices; d++)
        for (int i = 0; i < NR_STREAMS; i++)
            if (w->streams[d][i] && set_current(d))
                cuStreamDestroy(w->streams[d][i]);
    return NULL;
}

static void wait_readers(void)
{
    struct timespec ms = {0, 1000000};
    for (struct reader *r = readers, *n; r; r = n) {
        n = r->next;
        for (int i = 0; i < 20000 && !atomic_load(&r->done); i++)
            nanosleep(&ms, NULL);
        if (!atomic_load(&r->done))
            violation("a kernel reading a freed block never ran");
        else if (atomic_load(&r->changed))
            violation("a freed block was handed out again while a kernel still read it");
        free(r);
    }
    readers = NULL;
}

static int start(void)
{
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&nr_devices);
    if (r != CUDA_SUCCESS || nr_devices < 1)
        return 1;
    if (nr_devices > NR_MAX_DEVICES)
        nr_devices = NR_MAX_DEVICES;
    for (int d = 0; d < nr_devices; d++) {
        CUdevice dev;
        if (cuDeviceGet(&dev, d) != CUDA_SUCCESS)
            return 1;
        int i = 0;
        while (i < NR_RETRIES &&
               !expect("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctxs[d], dev), OOM, 0))
            i++;
        if (i == NR_RETRIES) {
            fprintf(stderr, "faultload: the driver refused the start\n");
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: faultload SEED [OPS [THREADS]]\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 0);
    if (argc > 2)
        nr_ops = atol(argv[2]);
    if (argc > 3)
        nr_threads = atoi(argv[3]);
    if (nr_threads < 1 || nr_threads > NR_MAX_THREADS)
        nr_threads = 1;
    const char *rd = getenv("FAULTLOAD_READERS");
    use_readers = !rd || strcmp(rd, "0");
    judge_room = nr_threads == 1;
    if (start())
        return 1;
    static struct worker ws[NR_MAX_THREADS];
    pthread_t th[NR_MAX_THREADS];
    for (int i = 0; i < nr_threads; i++) {
        ws[i].id = i;
        ws[i].rng = (seed + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
        ws[i].rng |= 1;
        if (pthread_create(&th[i], NULL, work, &ws[i]))
            return 2;
    }
    for (int i = 0; i < nr_threads; i++)
        pthread_join(th[i], NULL);
    wait_readers();

    long allocs = 0, failed = 0, frees = 0, free_failed = 0, nr_readers = 0, left = 0;
    uint64_t left_counted = 0;
    for (int i = 0; i < nr_threads; i++) {
        allocs += ws[i].nr_allocs;
        failed += ws[i].nr_alloc_failed;
        frees += ws[i].nr_frees;
        free_failed += ws[i].nr_free_failed;
        nr_readers += ws[i].nr_readers;
        left += ws[i].left;
        left_counted += ws[i].left_counted;
    }
    /* cuheap's own figures, when it is there */
    int (*stats)(struct cuheap_stats *, size_t);
    *(void **)&stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    if (stats) {
        struct cuheap_stats s;
        stats(&s, sizeof(s));
        if (s.live_bytes != left_counted)
            violation("cuheap counts %llu live bytes once the program freed all it could "
                      "(%llu bytes the driver would not free)",
                      (unsigned long long)s.live_bytes, (unsigned long long)left_counted);
        size_t used = 0;
        for (int d = 0; d < nr_devices; d++)
            used += fakecuda_device_used(d);
        if (!left && used != s.reserved_bytes)
            violation("the devices have %zu bytes handed out, cuheap says it holds %llu: %s", used,
                      (unsigned long long)s.reserved_bytes,
                      used > s.reserved_bytes ? "driver memory leaked" : "counted twice");
    }
    printf("faultload: %s: %ld allocations (%ld failed), %ld frees (%ld failed), %ld kernels on "
           "freed blocks, %ld blocks left, %lu faults injected\n",
           atomic_load(&nr_violations) ? "FAILED" : "ok", allocs, failed, frees, free_failed,
           nr_readers, left, fakecuda_faults_injected());
    return atomic_load(&nr_violations) ? 10 : 0;
}
