/* SPDX-License-Identifier: MIT */
/*
 * A long run in little time, for cuheap's own host memory (test `rss`, tests/meson.build):
 * allocations of random sizes and lifetimes, so blocks land all over the pool's arenas and
 * the driver hands out ever new addresses; pass-through allocations (managed memory) beside
 * them; a mark every 64 operations; short-lived threads that allocate now and then. Memory
 * that cuheap touches once and never gives back shows here as growth a real job would make
 * over hours.
 *
 *   soak N [RSS_KIB [MALLOC_KIB]]
 *
 * N operations (each a free and an allocation in one of the live sets). It samples the
 * process's anonymous resident memory and the bytes malloc has handed out (mallinfo2: exact,
 * no noise) NR_SAMPLES times, and prints their growth from the samples after 30% of the run
 * (warm: the event ring all touched, the live sets full) to those at the end. Exits 1 when resident
 * memory grew by more than RSS_KIB (default 2048) in that round and in a second one run only to
 * tell noise from growth, or malloc's bytes by more than MALLOC_KIB (default 256: a string lost
 * per mark is about 1 MiB over a million operations).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NR_POOLED  256 /* live device allocations, 512 B to 8 MiB */
#define NR_MANAGED 32  /* live pass-through allocations, 4 KiB to 1 MiB */
#define NR_SAMPLES                                                                                 \
    60                /* the pool gives pages back every so many merges: more samples, less of     \
                          their phase in a mean */
#define NR_THREADS 40 /* short-lived threads over the run */

static CUcontext ctx;
static CUstream stream;

/* A kernel that keeps the stream busy for a while: freed blocks wait for their fences, and
 * the pool places new blocks elsewhere meanwhile, as in a training step. */
static void kernel(void *arg)
{
    (void)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 20000);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* log-uniform from 2^lo to 2^hi bytes, in 256-byte steps */
static size_t random_size(unsigned lo, unsigned hi)
{
    unsigned o = lo + (unsigned)(next_random() % (hi - lo));
    size_t s = ((size_t)1 << o) + (size_t)(next_random() % ((size_t)1 << o));
    return s & ~(size_t)255;
}

static long status_kib(const char *field)
{
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n) && line[n] == ':')
            v = atol(line + n + 1);
    fclose(f);
    return v;
}

static long malloc_kib(void)
{
    struct mallinfo2 mi = mallinfo2();
    return (long)((mi.uordblks + mi.hblkhd) / 1024);
}

/* A thread that lives briefly: its per-thread state (counters, caches, unwinder) must go
 * with it. */
static void *short_thread(void *arg)
{
    (void)arg;
    if (cuCtxSetCurrent(ctx))
        return (void *)1;
    for (int i = 0; i < 64; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 512 + (size_t)i * 4096) || cuMemFree(p))
            return (void *)1;
    }
    return NULL;
}

static CUdeviceptr pooled[NR_POOLED], managed[NR_MANAGED];

/* One round of n operations, sampled NR_SAMPLES times. Returns 0 with the growths of resident
 * memory and malloc's bytes (KiB), from the mean of a fifth of the samples from 30% of the round
 * to that of the last fifth; 1 when a call failed. */
static int soak_round(long n, void (*mark)(const char *), long *ret_grown, long *ret_heap_grown)
{
    long rss[NR_SAMPLES], heap[NR_SAMPLES];
    long step = n / NR_SAMPLES, thread_step = n / NR_THREADS;
    for (long i = 0; i < n; i++) {
        bool pass_through = next_random() % 8 == 0;
        CUdeviceptr *slot = pass_through ? &managed[next_random() % NR_MANAGED]
                                         : &pooled[next_random() % NR_POOLED];
        if (*slot && cuMemFree(*slot)) {
            fprintf(stderr, "soak: cuMemFree failed\n");
            return 1;
        }
        *slot = 0;
        CUresult r = pass_through
                         ? cuMemAllocManaged(slot, random_size(12, 20), CU_MEM_ATTACH_GLOBAL)
                         : cuMemAlloc(slot, random_size(9, 23));
        if (r) {
            fprintf(stderr, "soak: allocation failed (%d)\n", (int)r);
            return 1;
        }
        if (i % 16 == 0 && cuLaunchHostFunc(stream, kernel, NULL))
            return 1;
        if (i % 1024 == 1023 && cuStreamSynchronize(stream))
            return 1;
        if (mark && i % 64 == 0)
            mark(i % 128 ? "soak step" : "soak step \xff"); /* one label needs cleaning */
        if (i % (thread_step + 1) == thread_step / 2) {
            pthread_t t;
            void *ret = NULL;
            if (pthread_create(&t, NULL, short_thread, NULL) || pthread_join(t, &ret) || ret)
                return 1;
        }
        if (i % step == step - 1 && i / step < NR_SAMPLES) {
            rss[i / step] = status_kib("RssAnon");
            heap[i / step] = malloc_kib();
        }
    }
    printf("rss KiB:");
    for (int k = 0; k < NR_SAMPLES; k++)
        printf(" %ld", rss[k]);
    printf("\nmalloc KiB:");
    for (int k = 0; k < NR_SAMPLES; k++)
        printf(" %ld", heap[k]);
    printf("\n");
    /* means over a fifth of the run, from 30% and at the end: the pool gives pages back every
     * so many merges, and a mean spans a few of those periods */
    long early = 0, late = 0, heap_early = 0, heap_late = 0;
    for (int k = 0; k < NR_SAMPLES / 5; k++) {
        early += rss[3 * NR_SAMPLES / 10 + k];
        late += rss[NR_SAMPLES - 1 - k];
        heap_early += heap[3 * NR_SAMPLES / 10 + k];
        heap_late += heap[NR_SAMPLES - 1 - k];
    }
    *ret_grown = (late - early) / (NR_SAMPLES / 5);
    *ret_heap_grown = (heap_late - heap_early) / (NR_SAMPLES / 5);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4 || atol(argv[1]) < NR_SAMPLES) {
        fprintf(stderr, "usage: soak N [RSS_KIB [MALLOC_KIB]]\n");
        return 2;
    }
    long n = atol(argv[1]), bound = argc > 2 ? atol(argv[2]) : 2048,
         heap_bound = argc > 3 ? atol(argv[3]) : 256;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING))
        return 1;
    void (*mark)(const char *);
    *(void **)&mark = dlsym(RTLD_DEFAULT, "cuheap_mark");
    /* Resident memory moves by up to 2 MiB between samples (malloc's arenas trimmed or not, the
     * pool's pages given back every so many merges), so a round's growth over the bound is
     * looked at again: a second round of the same length, from where the first left off, must
     * grow by no more. Memory that cuheap keeps touching and never gives back grows in both;
     * malloc's bytes, counted exactly, are judged on the first. */
    long grown, heap_grown, again = 0, heap_again;
    if (soak_round(n, mark, &grown, &heap_grown))
        return 1;
    printf("rss: growth %ld KiB (at most %ld), malloc: growth %ld KiB (at most %ld)\n", grown,
           bound, heap_grown, heap_bound);
    if (grown > bound) {
        if (soak_round(n, mark, &again, &heap_again))
            return 1;
        printf("rss: growth %ld KiB over a second round (at most %ld)\n", again, bound);
    }
    for (int k = 0; k < NR_POOLED; k++)
        if (pooled[k])
            cuMemFree(pooled[k]);
    for (int k = 0; k < NR_MANAGED; k++)
        if (managed[k])
            cuMemFree(managed[k]);
    return (grown > bound && again > bound) || heap_grown > heap_bound;
}
