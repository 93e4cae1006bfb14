/* SPDX-License-Identifier: MIT */
/*
 * Memory held against memory used, and mapping operations, for allocation patterns a recorded
 * job does not show (issue 31): each workload drives cuMemAlloc/cuMemFree from seeded random
 * numbers, so a run repeats, and queues "kernels" (host functions that keep the stream busy)
 * on non-blocking streams, as a GPU program does.
 *
 *   bench-churn [--threads N] [--allocs N] [--steps N] [--work-us N] [--depth N] [--seed N]
 *               WORKLOAD
 *
 * WORKLOAD:
 *   streams      --threads (4) threads, each with its own non-blocking stream, keep up to 16
 *                blocks of 256 B to 16 MiB (log-uniform); each replaces a random one of its
 *                blocks --allocs (3000) times: free it without synchronizing (the work it
 *                queued may still use it), allocate, queue work on its stream. A step is 16
 *                allocations per thread.
 *   alternate    a training-shaped loop whose sizes alternate step by step: 8 blocks of 4 MiB
 *                kept throughout, then per step 32 activations (256 KiB to 8 MiB, the same
 *                sizes each step, 1.5x as large every other step) allocated in order, each
 *                with a gradient of its size allocated and freed in reverse order, the
 *                activations freed as the gradients go; the host waits for the stream at each
 *                step's end. --steps (60) steps, one thread per stream.
 *   grow-shrink  a working set that grows from 4 to 96 blocks (64 KiB to 16 MiB) over 20 steps
 *                and shrinks back over 20, a quarter of it replaced every step; four times
 *                over (--steps 160); the host waits for the stream at each step's end.
 *   shapes       alternate's loop with the shapes of a job whose batches vary in length (text
 *                of every length, not padded to a few): each step's activations are their
 *                sizes at a sequence length drawn from 64 to 512 in steps of 8, so nearly every
 *                step asks for sizes the one before did not. --steps (200).
 *
 * Host and streams: after each allocation a kernel of --work-us (20) microseconds is queued on
 * the thread's stream; the host runs ahead of its stream by at most --depth (1024) kernels, as the
 * driver's launch queue makes a host that is too far ahead wait (without a synchronization: no free
 * is proven done by it). The default is the driver's queue, about a thousand launches; a shallower
 * one (a host that does more work per kernel) lets fences pass sooner.
 *
 * Run it on the simulated driver alone (held: what cuMemGetInfo says is used, sampled after
 * every call) or with libcuheap.so preloaded (held: cuheap's peak reserved bytes).
 * Output: one line, "churn=NAME threads=T allocs=N peak_live=B peak_held=B held_over_live=R",
 * with " map_ops=N warm_ops_per_step=X" under cuheap: the vmm pool's chunks taken from the
 * driver, moved and given back over the whole run, and those of the run's second half (the
 * warm part) over its steps.
 */
#include <cuheap/cuheap.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DOOR_PROCADDR 1
#include "../tests/programs/driver_api.h"

#define KIB      (1024ull)
#define MIB      (1024ull * 1024ull)
#define NR_SLOTS 16 /* streams: blocks a thread keeps */

static struct driver_api cu;
static int (*get_stats)(struct cuheap_stats *, size_t);
static unsigned work_us = 20, depth = 1024;
static uint64_t used0; /* driver alone: device bytes in use before the run */

static _Atomic uint64_t live, peak_live, peak_held;

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench-churn: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* log-uniform in [lo, hi] */
static size_t log_uniform(uint64_t *s, size_t lo, size_t hi)
{
    double u = (double)(splitmix(s) >> 11) / (double)(1ull << 53);
    return (size_t)exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
}

static void atomic_max(_Atomic uint64_t *m, uint64_t v)
{
    uint64_t cur = atomic_load(m);
    while (v > cur && !atomic_compare_exchange_weak(m, &cur, v))
        ;
}

static uint64_t map_ops(void)
{
    struct cuheap_stats s = {0}; /* an older cuheap leaves the newer fields zero */
    if (!get_stats)
        return 0;
    get_stats(&s, sizeof(s));
    return s.nr_chunks_created + s.nr_chunks_moved + s.nr_chunks_released;
}

static void sample_held(void)
{
    if (get_stats) {
        struct cuheap_stats s;
        get_stats(&s, sizeof(s));
        atomic_max(&peak_held, s.reserved_bytes);
        return;
    }
    size_t f, t;
    check(cu.cuMemGetInfo_v2(&f, &t), "cuMemGetInfo");
    atomic_max(&peak_held, (uint64_t)(t - f) - used0);
}

/* A stream and the kernels queued on it that have not run yet. */
struct lane {
    CUstream s;
    _Atomic unsigned queued;
};

static void kernel(void *arg)
{
    struct lane *l = arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do /* busy, as a kernel keeps its SM busy */
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < (long)work_us * 1000);
    atomic_fetch_sub(&l->queued, 1);
}

static void launch(struct lane *l)
{
    if (!work_us)
        return;
    while (atomic_load(&l->queued) >= depth) /* the launch queue is full: the host waits */
        sched_yield();
    atomic_fetch_add(&l->queued, 1);
    check(cu.cuLaunchHostFunc(l->s, kernel, l), "cuLaunchHostFunc");
}

static CUdeviceptr alloc(struct lane *l, size_t n)
{
    CUdeviceptr p;
    check(cu.cuMemAlloc_v2(&p, n), "cuMemAlloc");
    atomic_max(&peak_live, atomic_fetch_add(&live, n) + n);
    sample_held();
    launch(l);
    return p;
}

static void release(CUdeviceptr p, size_t n)
{
    atomic_fetch_sub(&live, n); /* before the call: the program has let it go */
    check(cu.cuMemFree_v2(p), "cuMemFree");
    sample_held();
}

static _Atomic uint64_t nr_allocs;
static _Atomic uint64_t half_ops; /* map_ops() when the run was half done, + 1 */
static uint64_t total_allocs;

static void count_alloc(void)
{
    uint64_t k = atomic_fetch_add(&nr_allocs, 1) + 1;
    if (k == total_allocs / 2)
        atomic_store(&half_ops, map_ops() + 1);
}

/* ---- streams ---- */

struct worker {
    unsigned id;
    uint64_t seed;
    unsigned n; /* allocations */
    CUcontext ctx;
};

static void *streams_worker(void *arg)
{
    struct worker *w = arg;
    check(cu.cuCtxSetCurrent(w->ctx), "cuCtxSetCurrent");
    struct lane l = {0};
    check(cu.cuStreamCreate(&l.s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CUdeviceptr p[NR_SLOTS] = {0};
    size_t sz[NR_SLOTS] = {0};
    uint64_t s = w->seed;
    for (unsigned i = 0; i < w->n; i++) {
        unsigned k = (unsigned)(splitmix(&s) % NR_SLOTS);
        if (p[k]) /* no synchronization: its work may still be queued */
            release(p[k], sz[k]);
        sz[k] = log_uniform(&s, 256, 16 * MIB);
        p[k] = alloc(&l, sz[k]);
        count_alloc();
    }
    check(cu.cuStreamSynchronize(l.s), "cuStreamSynchronize");
    for (unsigned k = 0; k < NR_SLOTS; k++)
        if (p[k])
            release(p[k], sz[k]);
    check(cu.cuStreamDestroy_v2(l.s), "cuStreamDestroy");
    return NULL;
}

/* ---- alternate, shapes ---- */

#define NR_ACTS 32

/* A training-shaped loop: 8 blocks kept, then per step NR_ACTS activations allocated in order,
 * each with a gradient of its size allocated and freed in reverse. alternate: 1.5x as large every
 * other step; shapes (lengths): at a sequence length drawn each step from 64 to 512, the sizes
 * given being those at 512. */
static unsigned training_loop(uint64_t seed, unsigned steps, bool lengths, unsigned *ret_warm_from)
{
    struct lane l = {0};
    check(cu.cuStreamCreate(&l.s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    uint64_t s = seed;
    CUdeviceptr model[8];
    for (unsigned i = 0; i < 8; i++)
        model[i] = alloc(&l, 4 * MIB);
    size_t base[NR_ACTS];
    for (unsigned i = 0; i < NR_ACTS; i++)
        base[i] = log_uniform(&s, 256 * KIB, 8 * MIB);
    *ret_warm_from = steps / 2;
    for (unsigned step = 0; step < steps; step++) {
        if (step == *ret_warm_from)
            atomic_store(&half_ops, map_ops() + 1);
        size_t len = lengths ? 64 + 8 * (size_t)(splitmix(&s) % 57) : 0;
        CUdeviceptr act[NR_ACTS];
        size_t n[NR_ACTS];
        for (unsigned i = 0; i < NR_ACTS; i++) { /* forward */
            n[i] = lengths ? base[i] * len / 512 : step % 2 ? base[i] + base[i] / 2 : base[i];
            act[i] = alloc(&l, n[i]);
        }
        for (unsigned i = NR_ACTS; i-- > 0;) { /* backward */
            CUdeviceptr g = alloc(&l, n[i]);
            release(g, n[i]);
            release(act[i], n[i]);
        }
        check(cu.cuStreamSynchronize(l.s), "step end");
    }
    for (unsigned i = 0; i < 8; i++)
        release(model[i], 4 * MIB);
    check(cu.cuStreamDestroy_v2(l.s), "cuStreamDestroy");
    return 8 + steps * 2 * NR_ACTS;
}

/* ---- grow-shrink ---- */

#define NR_GROW_MAX 96

static unsigned grow_shrink(uint64_t seed, unsigned steps, unsigned *ret_warm_from)
{
    struct lane l = {0};
    check(cu.cuStreamCreate(&l.s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    uint64_t s = seed;
    CUdeviceptr p[NR_GROW_MAX];
    size_t sz[NR_GROW_MAX];
    unsigned nr = 0, nr_allocs_made = 0;
    *ret_warm_from = steps / 2;
    for (unsigned step = 0; step < steps; step++) {
        if (step == *ret_warm_from)
            atomic_store(&half_ops, map_ops() + 1);
        unsigned t = step % 40, target = 4 + (t < 20 ? t : 40 - t) * (NR_GROW_MAX - 4) / 20;
        for (unsigned i = 0; i < nr / 4; i++) { /* a quarter replaced */
            unsigned k = (unsigned)(splitmix(&s) % nr);
            release(p[k], sz[k]);
            sz[k] = log_uniform(&s, 64 * KIB, 16 * MIB);
            p[k] = alloc(&l, sz[k]);
            nr_allocs_made++;
        }
        while (nr > target) { /* shrink: random ones go */
            unsigned k = (unsigned)(splitmix(&s) % nr);
            release(p[k], sz[k]);
            p[k] = p[--nr];
            sz[k] = sz[nr];
        }
        while (nr < target) {
            sz[nr] = log_uniform(&s, 64 * KIB, 16 * MIB);
            p[nr] = alloc(&l, sz[nr]);
            nr++;
            nr_allocs_made++;
        }
        check(cu.cuStreamSynchronize(l.s), "step end");
    }
    while (nr > 0) {
        nr--;
        release(p[nr], sz[nr]);
    }
    check(cu.cuStreamDestroy_v2(l.s), "cuStreamDestroy");
    return nr_allocs_made;
}

int main(int argc, char **argv)
{
    unsigned threads = 4, allocs = 3000, steps = 0;
    uint64_t seed = 1;
    int a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        unsigned v = (unsigned)strtoul(argv[a + 1], NULL, 10);
        if (!strcmp(argv[a], "--threads"))
            threads = v;
        else if (!strcmp(argv[a], "--allocs"))
            allocs = v;
        else if (!strcmp(argv[a], "--steps"))
            steps = v;
        else if (!strcmp(argv[a], "--work-us"))
            work_us = v;
        else if (!strcmp(argv[a], "--depth"))
            depth = v;
        else if (!strcmp(argv[a], "--seed"))
            seed = strtoull(argv[a + 1], NULL, 10);
        else
            break;
    }
    const char *name = a == argc - 1 ? argv[a] : "";
    bool streams = !strcmp(name, "streams"), alt = !strcmp(name, "alternate"),
         grow = !strcmp(name, "grow-shrink"), shape = !strcmp(name, "shapes");
    if ((!streams && !alt && !grow && !shape) || !threads || threads > 64 || !depth) {
        fprintf(stderr, "usage: bench-churn [--threads N] [--allocs N] [--steps N] "
                        "[--work-us N] [--depth N] [--seed N] "
                        "streams|alternate|grow-shrink|shapes\n");
        return 2;
    }
    if (driver_api_start(&cu, 0))
        return 1;
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    size_t f0, t0;
    check(cu.cuMemGetInfo_v2(&f0, &t0), "cuMemGetInfo");
    used0 = get_stats ? 0 : (uint64_t)(t0 - f0);
    uint64_t warm_steps = 0;
    unsigned nr_threads = 1;
    if (streams) {
        nr_threads = threads;
        CUcontext ctx;
        check(cu.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
        pthread_t th[64];
        struct worker w[64];
        total_allocs = (uint64_t)threads * allocs;
        for (unsigned i = 0; i < threads; i++) {
            w[i] = (struct worker){i, seed * 1000003u + i, allocs, ctx};
            pthread_create(&th[i], NULL, streams_worker, &w[i]);
        }
        for (unsigned i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        warm_steps = (total_allocs - total_allocs / 2) / ((uint64_t)NR_SLOTS * threads);
    } else {
        unsigned warm_from, n = alt     ? training_loop(seed, steps ? steps : 60, false, &warm_from)
                                : shape ? training_loop(seed, steps ? steps : 200, true, &warm_from)
                                        : grow_shrink(seed, steps ? steps : 160, &warm_from);
        atomic_store(&nr_allocs, n);
        warm_steps = (steps ? steps : alt ? 60 : shape ? 200 : 160) - warm_from;
    }
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
    uint64_t held = atomic_load(&peak_held), pl = atomic_load(&peak_live);
    if (get_stats) { /* cuheap keeps its own peak, which sees between our samples too */
        struct cuheap_stats st;
        get_stats(&st, sizeof(st));
        held = st.peak_reserved_bytes;
    }
    printf("churn=%s threads=%u allocs=%llu peak_live=%llu peak_held=%llu held_over_live=%.3f",
           name, nr_threads, (unsigned long long)atomic_load(&nr_allocs), (unsigned long long)pl,
           (unsigned long long)held, pl ? (double)held / (double)pl : 0.0);
    if (get_stats) {
        uint64_t ops = map_ops(), half = atomic_load(&half_ops);
        uint64_t warm = half ? ops - (half - 1) : ops;
        printf(" map_ops=%llu warm_ops_per_step=%.1f", (unsigned long long)ops,
               warm_steps ? (double)warm / (double)warm_steps : 0.0);
    }
    printf("\n");
    return 0;
}
