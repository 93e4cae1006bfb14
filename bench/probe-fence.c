/* SPDX-License-Identifier: MIT */
/*
 * What it costs, on the machine it runs on, to prove that a freed block may be used again when
 * the free was not ordered on a stream (cudaFree/cuMemFree): the floor under any pool that
 * serves them, cuheap's included, next to the stream-ordered pool CUDA ships, in one run.
 *
 * 1. The driver calls of a fence on an idle GPU, with the streams bench-alloc has (the legacy
 *    stream and one non-blocking stream): an event recorded on each, and asked about until
 *    both have passed. The calls' cost is what the allocating thread pays per fence; the round
 *    trip (record to passed) is how long a freed block waits.
 * 2. cuMemAllocAsync + cuMemFreeAsync from a warm pool, same sizes as bench-alloc.
 * 3. What a pair within a tenth of that would need: how many pairs one fence must serve (its
 *    calls' cost over the time a pair may take), and how many blocks are freed but not yet
 *    reusable at any moment (the round trip over that time), so the memory a thread would
 *    hold for them at each size.
 * 4. Whether asking the legacy stream whether it is idle (cuStreamQuery, no event) sees work on
 *    other streams: if it did, a fence would need no round trip.
 *
 * Build: gcc -O2 probe-fence.c -lcuda -lpthread (no cuheap; the driver API only).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe.h"

enum { FENCES = 20000, ASYNC_PAIRS = 20000, ASYNC_RUNS = 5 };

struct fence_costs {
    double calls_ns; /* record on both streams and the first query: the allocating thread's */
    double trip_ns;  /* record to both passed, median */
    double trip_p90_ns;
    double queries; /* queries until passed, mean */
    double stream_query_ns;
};

static struct fence_costs probe_fences(CUstream nb)
{
    static double calls[FENCES], trip[FENCES], sq[FENCES];
    CUevent ev[2];
    CHECK(cuEventCreate(&ev[0], CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&ev[1], CU_EVENT_DISABLE_TIMING));
    long nr_queries = 0;
    for (int i = 0; i < FENCES; i++) {
        double t0 = now_ns();
        CHECK(cuEventRecord(ev[0], CU_STREAM_LEGACY));
        CHECK(cuEventRecord(ev[1], nb));
        CUresult q = cuEventQuery(ev[1]);
        calls[i] = now_ns() - t0;
        nr_queries++;
        for (; q == CUDA_ERROR_NOT_READY; nr_queries++)
            q = cuEventQuery(ev[1]);
        CHECK(q);
        for (nr_queries++; (q = cuEventQuery(ev[0])) == CUDA_ERROR_NOT_READY; nr_queries++)
            ;
        CHECK(q);
        trip[i] = now_ns() - t0;
        double t1 = now_ns();
        CHECK(cuStreamQuery(CU_STREAM_LEGACY));
        sq[i] = now_ns() - t1;
    }
    CHECK(cuEventDestroy(ev[0]));
    CHECK(cuEventDestroy(ev[1]));
    struct fence_costs c = {quantile(calls, FENCES, 0.5), quantile(trip, FENCES, 0.5),
                            quantile(trip, FENCES, 0.9), (double)nr_queries / FENCES,
                            quantile(sq, FENCES, 0.5)};
    return c;
}

/* ns per cuMemAllocAsync + cuMemFreeAsync pair on stream s, median of ASYNC_RUNS runs. */
static double async_pair_ns(CUstream s, size_t size)
{
    double runs[ASYNC_RUNS];
    for (int r = 0; r < ASYNC_RUNS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < ASYNC_PAIRS; i++) {
            CUdeviceptr p;
            CHECK(cuMemAllocAsync(&p, size, s));
            CHECK(cuMemFreeAsync(p, s));
        }
        runs[r] = (now_ns() - t0) / ASYNC_PAIRS;
    }
    return quantile(runs, ASYNC_RUNS, 0.5);
}

/* What cuStreamQuery on the legacy stream answers while a 20 ms kernel runs on stream s. */
static const char *legacy_query_during(CUfunction f, CUstream s)
{
    CHECK(cuCtxSynchronize());
    spin(f, s, 20000000);
    for (double w = now_ns(); now_ns() - w < 1e6;) /* 1 ms for the kernel to start */
        ;
    CUresult q = cuStreamQuery(CU_STREAM_LEGACY);
    CHECK(cuCtxSynchronize());
    return q == CUDA_SUCCESS           ? "idle (does not see it)"
           : q == CUDA_ERROR_NOT_READY ? "busy (sees it)"
                                       : "error";
}

struct ptds_arg {
    CUcontext ctx;
    CUfunction f;
    CUstream s;
};

static void *spin_on_ptds(void *arg)
{
    struct ptds_arg *a = arg;
    CHECK(cuCtxSetCurrent(a->ctx));
    spin(a->f, a->s, 20000000);
    return NULL;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CUfunction f;
    CHECK(cuModuleLoadData(&mod, SPIN_PTX));
    CHECK(cuModuleGetFunction(&f, mod, "spin"));
    CUstream nb, blocking;
    CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    CUmemoryPool pool;
    cuuint64_t threshold = UINT64_MAX; /* a warm pool, as bench-alloc's */
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));

    struct fence_costs c = probe_fences(nb);
    printf("fence (legacy + 1 non-blocking stream, idle GPU, %d fences):\n", FENCES);
    printf("  calls the allocating thread makes (2 records + 1 query): %.0f ns\n", c.calls_ns);
    printf("  round trip, record to both passed: median %.0f ns, p90 %.0f ns, %.1f queries\n",
           c.trip_ns, c.trip_p90_ns, c.queries);
    printf("  cuStreamQuery(legacy), idle: %.0f ns\n", c.stream_query_ns);

    const size_t sizes[] = {512, 2 * MiB, 20 * MiB};
    printf("%-10s %16s %14s %18s %20s %18s\n", "size", "async pair ns", "tenth ns",
           "pairs per fence", "blocks not reusable", "held by a thread");
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(*sizes); i++) {
        double a = async_pair_ns(nb, sizes[i]), tenth = a / 10;
        double per_fence = c.calls_ns / tenth, waiting = c.trip_ns / tenth + 1;
        double held = (waiting + per_fence) * (double)sizes[i] / MiB;
        printf("%-10zu %16.0f %14.0f %18.0f %20.0f %15.1f MiB\n", sizes[i], a, tenth, per_fence,
               waiting, held);
    }

    printf("cuStreamQuery(legacy) while a 20 ms kernel runs on\n");
    printf("  the legacy stream: %s\n", legacy_query_during(f, CU_STREAM_LEGACY));
    printf("  a blocking stream: %s\n", legacy_query_during(f, blocking));
    printf("  a non-blocking stream: %s\n", legacy_query_during(f, nb));
    CHECK(cuCtxSynchronize());
    pthread_t t;
    struct ptds_arg pa = {ctx, f, CU_STREAM_PER_THREAD};
    pthread_create(&t, NULL, spin_on_ptds, &pa);
    pthread_join(t, NULL);
    for (double w = now_ns(); now_ns() - w < 1e6;)
        ;
    CUresult q = cuStreamQuery(CU_STREAM_LEGACY);
    printf("  another thread's per-thread stream: %s\n",
           q == CUDA_SUCCESS           ? "idle (does not see it)"
           : q == CUDA_ERROR_NOT_READY ? "busy (sees it)"
                                       : "error");
    CHECK(cuCtxSynchronize());
    return 0;
}
