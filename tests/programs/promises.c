/* SPDX-License-Identifier: MIT */
/*
 * The pool's two promises, checked from outside while several threads allocate, as a user's
 * job would break them:
 *   no overlap     no allocation returns bytes that a block still live holds;
 *   no early reuse no block's bytes reach a new owner before the work queued on a stream
 *                  before its free has run.
 * The main thread repeats a training step (STEP_LEN allocations of 64 KiB to 64 MiB on three
 * non-blocking streams, each freed without a sync after a life of a few allocations, some
 * kept into the next step), changes shape every few steps (an evaluation: other sizes, each
 * freed as the next comes, the last kept until the next evaluation; or a step missing an
 * allocation), and forks once; a second thread allocates sizes of its own, sometimes the
 * step's, on its own stream; a third takes and gives blocks through the pluggable entry
 * points (cuheap_torch_alloc/_free) on a stream, as PyTorch's allocator would.
 *
 * Every block gets its owner's tag written over it (at every 512 B- or 4 KiB-aligned address
 * it covers: a block of another owner sharing its bytes shares one of them). A free first
 * queues a "kernel" on the block's stream that waits a little and then reads the tag back:
 * a new owner that got the bytes before that kernel ran has written its own tag there. An
 * allocation is compared with every block live at that moment.
 *
 *   promises SECONDS [SEED]
 *
 * Prints one line ("promises: ok: ..." or each broken promise, then "promises: N broken")
 * and exits 0 when both held, 1 when not, 2 when the driver failed a call. Linked with
 * libcuheap.so ahead of the simulated driver, like test-hooks, so that sanitizer builds see it.
 */
#include <cuda.h>
#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STEP_LEN   30
#define NR_STREAMS 3
#define MAX_LIVE   4096
#define NR_KEPT    16 /* a random thread's blocks live at once, at most */
#define NR_OTHERS  3  /* threads besides the main one: the step's replica, random ones */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static CUcontext ctx;
static double t_start;

/* The other threads allocate in the last cycle_busy seconds of every cycle seconds
 * (PROMISES_CYCLE=S,B): in the rest the main thread's step is seen alone, long enough for a
 * pool to learn it. */
static double cycle = 2.0, cycle_busy = 0.6;

static bool others_wait(void)
{
    double t = now() - t_start;
    return t - cycle * (double)(long)(t / cycle) < cycle - cycle_busy;
}
static _Atomic unsigned long broken, checked, allocs;
static _Atomic bool stop;
static _Atomic int driver_error;
static void *(*torch_alloc)(ssize_t, int, void *);
static void (*torch_free)(void *, ssize_t, int, void *);

/* ---- the live table: every block handed out and not yet given back ---- */

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t ptr, size;
} live[MAX_LIVE];
static unsigned nr_live;

static void report(const char *fmt, unsigned long long a, unsigned long long b,
                   unsigned long long c, unsigned long long d)
{
    if (atomic_fetch_add(&broken, 1) < 8) {
        fprintf(stderr, "[%d] ", (int)getpid());
        fprintf(stderr, fmt, a, b, c, d);
        fputc('\n', stderr);
    }
}

/* A block just handed out: it must share no byte with any block live now. */
static void live_add(uint64_t ptr, uint64_t size)
{
    pthread_mutex_lock(&live_lock);
    for (unsigned i = 0; i < nr_live; i++)
        if (ptr < live[i].ptr + live[i].size && live[i].ptr < ptr + size)
            report("promises: OVERLAP: new %#llx+%llu over live %#llx+%llu", ptr, size, live[i].ptr,
                   live[i].size);
    if (nr_live < MAX_LIVE)
        live[nr_live].ptr = ptr, live[nr_live++].size = size;
    pthread_mutex_unlock(&live_lock);
    atomic_fetch_add(&allocs, 1);
}

/* Taken out before the free, so that a block handed out right after it is not counted. */
static void live_remove(uint64_t ptr)
{
    pthread_mutex_lock(&live_lock);
    for (unsigned i = 0; i < nr_live; i++)
        if (live[i].ptr == ptr) {
            live[i] = live[--nr_live];
            break;
        }
    pthread_mutex_unlock(&live_lock);
}

/* ---- tags ---- */

static uint64_t stride_of(uint64_t size)
{
    return size <= (1u << 20) ? 512 : 4096;
}

/* Apply fn to every stride-aligned address of the block, and its start. */
#define FOR_EACH_MARK(ptr, size, a)                                                                \
    for (uint64_t a = (ptr), step_ = stride_of(size); a + 8 <= (ptr) + (size);                     \
         a = a == (ptr) ? ((ptr) / step_ + 1) * step_ : a + step_)

static void write_tag(uint64_t ptr, uint64_t size, uint64_t tag)
{
    FOR_EACH_MARK(ptr, size, a)
    *(volatile uint64_t *)(uintptr_t)a = tag;
}

struct check {
    uint64_t ptr, size, tag;
    unsigned delay_us;
    pid_t pid; /* whose work it is: a forked child's driver runs the parent's queued work too */
};

/* The work queued before a free: waits, then finds the owner's tag everywhere. */
static void check_kernel(void *arg)
{
    struct check *c = arg;
    struct timespec ts = {0, (long)c->delay_us * 1000};
    nanosleep(&ts, NULL);
    if (c->pid != getpid())
        return; /* the parent's, queued before the fork (the simulated driver's child runs it
                   too, perhaps twice): not the child's bytes, nor its to free */
    FOR_EACH_MARK(c->ptr, c->size, a)
    {
        uint64_t v = *(volatile uint64_t *)(uintptr_t)a;
        if (v != c->tag) {
            report("promises: EARLY REUSE: %#llx+%llu (tag %#llx) found %#llx before its queued "
                   "work ran",
                   c->ptr, c->size, c->tag, v);
            break;
        }
    }
    atomic_fetch_add(&checked, 1);
    free(c);
}

static void tag_kernel(void *arg)
{
    struct check *c = arg;
    if (c->pid != getpid())
        return; /* the parent's (check_kernel says why) */
    write_tag(c->ptr, c->size, c->tag);
    free(c);
}

static _Atomic uint64_t next_tag = 1;

static bool ok(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return true;
    if (!atomic_exchange(&driver_error, 1))
        fprintf(stderr, "promises: %s failed (%d)\n", what, (int)r);
    atomic_store(&stop, true);
    return false;
}

/* ---- a block: taken, tagged, freed behind its check ---- */

struct block {
    uint64_t ptr, size, tag;
    CUstream stream;
    bool pluggable;
};

static bool take(struct block *b, uint64_t size, CUstream s, bool pluggable)
{
    b->size = size, b->stream = s, b->pluggable = pluggable && torch_alloc;
    b->tag = atomic_fetch_add(&next_tag, 1) * 0x9E3779B97F4A7C15ull | 1;
    if (b->pluggable) {
        b->ptr = (uint64_t)(uintptr_t)torch_alloc((ssize_t)size, 0, s);
        if (!b->ptr)
            return ok(CUDA_ERROR_OUT_OF_MEMORY, "cuheap_torch_alloc");
    } else {
        CUdeviceptr p;
        if (!ok(cuMemAlloc_v2(&p, size), "cuMemAlloc"))
            return false;
        b->ptr = p;
    }
    live_add(b->ptr, size);
    if (b->pluggable) { /* its first writes are the stream's, ordered after what came before */
        struct check *c = malloc(sizeof(*c));
        *c = (struct check){b->ptr, size, b->tag, 0, getpid()};
        return ok(cuLaunchHostFunc(s, tag_kernel, c), "cuLaunchHostFunc");
    }
    write_tag(b->ptr, size, b->tag); /* cuMemAlloc's bytes are the program's at once */
    return true;
}

static void give(struct block *b, unsigned *seed)
{
    if (!b->ptr)
        return;
    struct check *c = malloc(sizeof(*c));
    *c = (struct check){b->ptr, b->size, b->tag, (unsigned)rand_r(seed) % 400, getpid()};
    ok(cuLaunchHostFunc(b->stream, check_kernel, c), "cuLaunchHostFunc");
    live_remove(b->ptr);
    if (b->pluggable)
        torch_free((void *)(uintptr_t)b->ptr, (ssize_t)b->size, 0, b->stream);
    else
        ok(cuMemFree_v2(b->ptr), "cuMemFree");
    b->ptr = 0;
}

static uint64_t log_uniform(unsigned *seed, uint64_t lo, uint64_t hi)
{
    double x = (double)rand_r(seed) / RAND_MAX;
    uint64_t v = (uint64_t)((double)lo * pow((double)hi / (double)lo, x));
    return (v + 255) & ~255ull;
}

/* ---- the step, its shapes ---- */

static uint64_t step_size[STEP_LEN];
static unsigned step_life[STEP_LEN]; /* allocations until its free; STEP_LEN+: into the next step */

/* Steps until `until`: the step, and while the other threads allocate, one in eight an
 * evaluation (other sizes, each freed as the next comes, the last kept until the next one),
 * one in sixteen with an allocation missing. With idle_ms, every step is followed by a pause: a
 * second thread's steps come now and then, between which the first one's step is seen alone. */
static void steps(double until, unsigned seed, CUstream *streams, unsigned idle_ms)
{
    struct block held[STEP_LEN] = {{0}}, kept[STEP_LEN] = {{0}}, eval_out = {0};
    unsigned free_at[STEP_LEN];
    for (unsigned n = 0; !atomic_load(&stop) && now() < until; n++) {
        /* drawn, not every n-th: a shape that came back at a fixed count would be a longer step */
        unsigned r = (unsigned)rand_r(&seed) % 16;
        unsigned shape = r < 13 || others_wait() ? 0 : r < 15 ? 11 : 13;
        if (idle_ms) {
            struct timespec ts = {0, (long)(rand_r(&seed) % idle_ms) * 1000000L};
            nanosleep(&ts, NULL);
            if (others_wait())
                continue;
        }
        if (shape == 11 || shape == 12) {
            struct block prev = {0};
            for (unsigned k = 0; k < STEP_LEN / 2 && !atomic_load(&stop); k++) {
                struct block b;
                if (!take(&b, step_size[k] / 2 + 4096, streams[k % NR_STREAMS], false))
                    break;
                give(&prev, &seed);
                prev = b;
            }
            give(&eval_out, &seed);
            eval_out = prev; /* kept until the next evaluation */
            cuStreamSynchronize(streams[0]);
            continue;
        }
        for (unsigned k = 0; k < STEP_LEN && !atomic_load(&stop); k++) {
            if (shape == 13 && k == 7)
                continue;
            for (unsigned j = 0; j < STEP_LEN; j++)
                if (held[j].ptr && free_at[j] == k)
                    give(&held[j], &seed);
            give(&kept[k], &seed); /* the last step's block of this allocation, kept a step */
            struct block b;
            bool plug = k % 4 == 1;
            if (!take(&b, step_size[k], streams[k % NR_STREAMS], plug))
                break;
            if (step_life[k] >= STEP_LEN) {
                kept[k] = b;
            } else {
                held[k] = b;
                free_at[k] = k + step_life[k];
            }
        }
        for (unsigned j = 0; j < STEP_LEN; j++)
            give(&held[j], &seed);
        if (n % 3 == 0)
            cuStreamSynchronize(streams[n % NR_STREAMS]); /* a loss.item(): one stream waited */
    }
    for (unsigned j = 0; j < STEP_LEN; j++)
        give(&held[j], &seed), give(&kept[j], &seed);
    give(&eval_out, &seed);
}

/* ---- the other threads ---- */

struct other {
    double until;
    unsigned seed;
    bool pluggable;
};

static bool thread_streams(CUstream *streams, unsigned n)
{
    if (!ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
        return false;
    for (unsigned i = 0; i < n; i++)
        if (!ok(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate"))
            return false;
    return true;
}

static void drop_streams(CUstream *streams, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        cuStreamSynchronize(streams[i]);
        cuStreamDestroy_v2(streams[i]);
    }
}

/* Blocks of its own sizes, now and then one of the step's, kept a while. */
static void *random_thread(void *arg)
{
    struct other *o = arg;
    unsigned seed = o->seed;
    CUstream s;
    if (!thread_streams(&s, 1))
        return NULL;
    struct block kept[NR_KEPT] = {{0}};
    unsigned next_k = 0;
    while (!atomic_load(&stop) && now() < o->until) {
        if (others_wait()) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
            continue;
        }
        unsigned i = (unsigned)rand_r(&seed) % NR_KEPT;
        give(&kept[i], &seed);
        uint64_t size;
        switch (rand_r(&seed) % 4) {
        case 0: /* the step's sizes, in its order for a while: a pool that follows the step's
                   phase sees it come and go */
            size = step_size[next_k++ % STEP_LEN];
            if (rand_r(&seed) % 16 == 0)
                next_k = (unsigned)rand_r(&seed);
            break;
        case 1:
            size = log_uniform(&seed, 512, 128 << 10);
            break;
        default:
            size = log_uniform(&seed, 64 << 10, 16 << 20);
        }
        if (!take(&kept[i], size, s, o->pluggable))
            break;
        if (rand_r(&seed) % 8 == 0) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    for (unsigned i = 0; i < NR_KEPT; i++)
        give(&kept[i], &seed);
    drop_streams(&s, 1);
    return NULL;
}

/* The step on streams of its own, with pauses: a second replica of the job in the process. */
static void *step_thread(void *arg)
{
    struct other *o = arg;
    CUstream streams[NR_STREAMS];
    if (!thread_streams(streams, NR_STREAMS))
        return NULL;
    steps(o->until, o->seed, streams,
          getenv("PROMISES_IDLE_MS") ? (unsigned)atoi(getenv("PROMISES_IDLE_MS")) : 20);
    drop_streams(streams, NR_STREAMS);
    return NULL;
}

static int run(double seconds, unsigned seed, bool with_fork)
{
    CUstream streams[NR_STREAMS];
    for (unsigned i = 0; i < NR_STREAMS; i++)
        if (!ok(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate"))
            return 2;
    double t0 = t_start = now();
    /* the step's replica, then threads of their own sizes, every other one pluggable */
    struct other o[NR_OTHERS];
    pthread_t th[NR_OTHERS];
    for (unsigned i = 0; i < NR_OTHERS; i++) {
        o[i] = (struct other){t0 + seconds, seed * 7 + 13 * i + 1, i % 2 == 0};
        pthread_create(&th[i], NULL, i ? random_thread : step_thread, &o[i]);
    }
    pid_t child = -1;
    if (with_fork) {
        steps(t0 + seconds / 2, seed, streams, 0);
        child = fork();
        if (child == 0) { /* the child: the step alone, on streams of its own */
            atomic_store(&stop, false);
            nr_live = 0; /* the parent's blocks are not the child's to check */
            for (unsigned i = 0; i < NR_STREAMS; i++)
                if (!ok(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate"))
                    _exit(2);
            steps(now() + (seconds / 4 < 2 ? seconds / 4 : 2), seed + 1, streams, 0);
            cuCtxSynchronize();
            _exit(atomic_load(&driver_error) ? 2 : atomic_load(&broken) ? 1 : 0);
        }
    }
    steps(t0 + seconds, seed, streams, 0);
    for (unsigned i = 0; i < NR_OTHERS; i++)
        pthread_join(th[i], NULL);
    cuCtxSynchronize();
    int status = 0;
    if (child > 0 &&
        (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) == 2)) {
        fprintf(stderr, "promises: the forked child failed (status %#x)\n", status);
        return 2;
    }
    if (child > 0 && WEXITSTATUS(status) == 1)
        atomic_fetch_add(&broken, 1);
    return 0;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 0) : (unsigned)time(NULL);
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "promises: no device\n");
        return 2;
    }
    if (getenv("PROMISES_CYCLE"))
        sscanf(getenv("PROMISES_CYCLE"), "%lf,%lf", &cycle, &cycle_busy);
    *(void **)&torch_alloc = dlsym(RTLD_DEFAULT, "cuheap_torch_alloc");
    *(void **)&torch_free = dlsym(RTLD_DEFAULT, "cuheap_torch_free");
    unsigned s = seed;
    for (unsigned k = 0; k < STEP_LEN; k++) {
        step_size[k] = log_uniform(&s, 64 << 10, 64 << 20);
        unsigned r = (unsigned)rand_r(&s) % 10;
        step_life[k] = r == 0 ? STEP_LEN : 1 + (unsigned)rand_r(&s) % (r < 5 ? 4 : STEP_LEN / 2);
    }
    int r = run(seconds, seed, getenv("PROMISES_NO_FORK") == NULL);
    unsigned long b = atomic_load(&broken);
    if (r == 2 || atomic_load(&driver_error)) {
        printf("promises: driver error (seed %u)\n", seed);
        return 2;
    }
    if (b) {
        printf("promises: %lu broken (seed %u, %lu allocations, %lu checks)\n", b, seed,
               atomic_load(&allocs), atomic_load(&checked));
        return 1;
    }
    printf("promises: ok: %lu allocations, %lu frees checked after their queued work (seed %u)\n",
           atomic_load(&allocs), atomic_load(&checked), seed);
    return 0;
}
