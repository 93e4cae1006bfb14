/* SPDX-License-Identifier: MIT */
/*
 * Allocation microbenchmark. One process measures one allocator; bench/run-gpu.sh runs it
 * under each configuration (raw driver, stream-ordered pool, cuheap with each setting) in the
 * same call and bench/summarize.py turns the medians into ratios.
 *
 *   bench-alloc sync   SIZE... : cuMemAlloc/cuMemFree pairs (what cudaMalloc/cudaFree become;
 *                                under LD_PRELOAD=libcuheap.so, cuheap's pool)
 *   bench-alloc async  SIZE... : cuMemAllocAsync/cuMemFreeAsync pairs on one stream from a warm
 *                                default pool (release threshold raised)
 *   bench-alloc mix-sync|mix-async : log-uniform sizes 512 B..64 MiB, random lifetimes
 *   bench-alloc replay-sync|replay-async TRACE : the alloc/free sequence of a cuheap trace
 *   bench-alloc threads N SIZE... : N threads at once, each doing cuMemAlloc/cuMemFree pairs of
 *                                SIZE, against one thread in the same run: "ns_per_pair" is
 *                                what a pair costs a core (wall time x the cores the N threads
 *                                could use / all their pairs), "cpu_ns_per_pair" the threads'
 *                                own CPU time a pair; ratio = ns_per_pair / one_thread_ns (1.0:
 *                                perfect scaling; with more threads than cores, contention and
 *                                lock waits still show, the oversubscription itself does not)
 *
 * Output: one line per case, "case=... ns_per_pair=... pairs=...", median of 7 repetitions
 * after a warm-up.
 *
 * BENCH_PROFILE=1 (threads mode) samples where the N threads spend their CPU time: a profiling
 * timer every 100 us of CPU, the interrupted instruction's object and offset counted, the most
 * frequent printed as "profile obj+0xoff samples" lines (addr2line -f -e obj 0xoff names them
 * where the object has symbols): for a host without perf.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#define DOOR_PROCADDR 1
#include "../tests/programs/driver_api.h"
#include "tracereader.h"
#include "event.h"

static struct driver_api cu;
static CUstream stream;
static CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*free_async)(CUdeviceptr, CUstream);
static bool use_async;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench-alloc: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

static CUdeviceptr do_alloc(size_t n)
{
    CUdeviceptr p;
    check(use_async ? alloc_async(&p, n, stream) : cu.cuMemAlloc_v2(&p, n), "alloc");
    return p;
}

static void do_free(CUdeviceptr p)
{
    check(use_async ? free_async(p, stream) : cu.cuMemFree_v2(p), "free");
}

/* Median over 7 timed repetitions of `pairs` alloc+free pairs of one size. */
static double time_pairs(size_t size, int pairs)
{
    uint64_t t[7];
    for (int w = 0; w < pairs / 10 + 1; w++)
        do_free(do_alloc(size)); /* warm-up: pools grown, code paths hot */
    for (int r = 0; r < 7; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < pairs; i++)
            do_free(do_alloc(size));
        t[r] = now_ns() - t0;
    }
    if (use_async)
        check(cu.cuStreamSynchronize(stream), "sync");
    qsort(t, 7, sizeof(t[0]), cmp_u64);
    return (double)t[3] / pairs;
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Log-uniform sizes from 512 B to 64 MiB; each step frees a random slot of 64 and fills it. */
static double time_mix(int steps)
{
    enum { SLOTS = 64 };
    uint64_t t[7];
    CUdeviceptr live[SLOTS] = {0};
    for (int r = -1; r < 7; r++) {
        uint64_t seed = 0x9e3779b97f4a7c15ull;
        uint64_t t0 = now_ns();
        for (int i = 0; i < steps; i++) {
            int slot = (int)(xorshift(&seed) % SLOTS);
            if (live[slot])
                do_free(live[slot]);
            int bits = 9 + (int)(xorshift(&seed) % 18); /* 2^9 .. 2^26 */
            size_t size = ((size_t)1 << bits) + xorshift(&seed) % ((size_t)1 << bits);
            live[slot] = do_alloc(size > (64u << 20) ? (64u << 20) : size);
        }
        for (int s = 0; s < SLOTS; s++)
            if (live[s]) {
                do_free(live[s]);
                live[s] = 0;
            }
        if (r >= 0)
            t[r] = now_ns() - t0;
    }
    if (use_async)
        check(cu.cuStreamSynchronize(stream), "sync");
    qsort(t, 7, sizeof(t[0]), cmp_u64);
    return (double)t[3] / steps; /* one step = one alloc and (mostly) one free */
}

/* Replay the allocations and frees of a trace (device memory, in seq order). */
static double time_replay(const char *path, size_t *ret_pairs)
{
    struct cuheap_trace tr;
    char err[512];
    if (cuheap_trace_read(path, &tr, err, sizeof(err))) {
        fprintf(stderr, "bench-alloc: %s\n", err);
        exit(2);
    }
    size_t n = 0;
    for (size_t i = 0; i < tr.nr_events; i++)
        n += tr.events[i].type == CUHEAP_EV_ALLOC && tr.events[i].api != CUHEAP_API_HOST &&
             tr.events[i].api != CUHEAP_API_VMM_MAP;
    /* map trace addresses to ours with a small open-addressing table */
    size_t cap = 1;
    while (cap < 4 * n + 16)
        cap <<= 1;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    CUdeviceptr *vals = calloc(cap, sizeof(*vals));
    uint64_t t[5];
    for (int r = -1; r < 5; r++) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < tr.nr_events; i++) {
            const struct cuheap_trace_event *e = &tr.events[i];
            if (e->api == CUHEAP_API_HOST || e->api == CUHEAP_API_VMM_MAP || !e->ptr)
                continue;
            size_t h = (size_t)((e->ptr * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
            if (e->type == CUHEAP_EV_ALLOC) {
                while (keys[h] && keys[h] != e->ptr)
                    h = (h + 1) & (cap - 1);
                keys[h] = e->ptr;
                vals[h] = do_alloc(e->size ? e->size : 1);
            } else if (e->type == CUHEAP_EV_FREE) {
                while (keys[h] && keys[h] != e->ptr)
                    h = (h + 1) & (cap - 1);
                if (keys[h] == e->ptr && vals[h]) {
                    do_free(vals[h]);
                    vals[h] = 0;
                }
            }
        }
        for (size_t k = 0; k < cap; k++)
            if (vals[k]) {
                do_free(vals[k]);
                vals[k] = 0;
            }
        memset(keys, 0, cap * sizeof(*keys));
        if (r >= 0)
            t[r] = now_ns() - t0;
    }
    if (use_async)
        check(cu.cuStreamSynchronize(stream), "sync");
    qsort(t, 5, sizeof(t[0]), cmp_u64);
    *ret_pairs = n;
    free(keys);
    free(vals);
    cuheap_trace_free(&tr);
    return n ? (double)t[2] / (double)n : 0;
}

/* ---- BENCH_PROFILE: a sampling profiler for hosts without perf ---- */

#define NR_SAMPLES (1u << 20)
static uintptr_t *samples;
static _Atomic unsigned nr_samples;

static void on_prof(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    unsigned i = atomic_fetch_add_explicit(&nr_samples, 1, memory_order_relaxed);
    if (i < NR_SAMPLES)
        samples[i] = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
}

static void profile_start(void)
{
    samples = calloc(NR_SAMPLES, sizeof(*samples));
    struct sigaction sa = {.sa_sigaction = on_prof, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_PROF, &it, NULL);
}

static int cmp_uptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Stop sampling; print the 60 most sampled instructions and the share of each object. */
static void profile_report(const char *label)
{
    struct itimerval stop = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &stop, NULL);
    unsigned n = atomic_load(&nr_samples);
    n = n < NR_SAMPLES ? n : NR_SAMPLES;
    qsort(samples, n, sizeof(*samples), cmp_uptr);
    struct hit {
        uintptr_t ip;
        unsigned count;
    } *hits = calloc(n + 1, sizeof(*hits));
    unsigned nr_hits = 0;
    for (unsigned i = 0; i < n; i++) {
        if (nr_hits && hits[nr_hits - 1].ip == samples[i])
            hits[nr_hits - 1].count++;
        else
            hits[nr_hits++] = (struct hit){samples[i], 1};
    }
    for (unsigned i = 1; i < nr_hits; i++) /* by count, most first (insertion: few hits) */
        for (unsigned j = i; j > 0 && hits[j].count > hits[j - 1].count; j--) {
            struct hit t = hits[j];
            hits[j] = hits[j - 1];
            hits[j - 1] = t;
        }
    printf("profile config=%s samples=%u\n", label, n);
    struct obj {
        const char *name;
        unsigned count;
    } objs[32];
    unsigned nr_objs = 0;
    for (unsigned i = 0; i < nr_hits; i++) {
        Dl_info info;
        const char *name = "?", *sym = NULL;
        uintptr_t off = hits[i].ip;
        if (dladdr((void *)hits[i].ip, &info) && info.dli_fname) {
            name = strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
            off = hits[i].ip - (uintptr_t)info.dli_fbase;
            sym = info.dli_sname;
        }
        unsigned o = 0;
        while (o < nr_objs && strcmp(objs[o].name, name))
            o++;
        if (o == nr_objs && nr_objs < 32)
            objs[nr_objs++] = (struct obj){name, 0};
        if (o < nr_objs)
            objs[o].count += hits[i].count;
        if (i < 60)
            printf("profile %s+0x%lx %u %.1f%% %s\n", name, (unsigned long)off, hits[i].count,
                   100.0 * hits[i].count / n, sym ? sym : "");
    }
    for (unsigned o = 0; o < nr_objs; o++)
        printf("profile-object %s %u %.1f%%\n", objs[o].name, objs[o].count,
               100.0 * objs[o].count / n);
    free(hits);
    free(samples);
}

/* ---- threads: N at once against one ---- */

struct threads_run {
    size_t size;
    int pairs; /* per thread */
    CUcontext ctx;
    pthread_barrier_t start;
    uint64_t cpu_ns[256]; /* each thread's CPU time for its pairs */
};

struct worker {
    struct threads_run *run;
    int index;
};

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *pair_worker(void *arg)
{
    struct worker *w = arg;
    struct threads_run *t = w->run;
    check(cu.cuCtxSetCurrent(t->ctx), "cuCtxSetCurrent");
    for (int i = 0; i < t->pairs / 10 + 1; i++)
        do_free(do_alloc(t->size)); /* warm-up: this thread's caches and counters */
    pthread_barrier_wait(&t->start);
    uint64_t c0 = thread_cpu_ns();
    for (int i = 0; i < t->pairs; i++)
        do_free(do_alloc(t->size));
    t->cpu_ns[w->index] = thread_cpu_ns() - c0;
    return NULL;
}

/* One timed run of n threads; returns the wall-clock ns from the start to the last finish. */
static uint64_t threads_once(struct threads_run *t, int n, double *ret_cpu_ns)
{
    pthread_t tid[256];
    struct worker w[256];
    pthread_barrier_init(&t->start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        w[i] = (struct worker){t, i};
        if (pthread_create(&tid[i], NULL, pair_worker, &w[i])) {
            fprintf(stderr, "bench-alloc: cannot start thread %d\n", i);
            exit(1);
        }
    }
    pthread_barrier_wait(&t->start);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++)
        pthread_join(tid[i], NULL);
    uint64_t wall = now_ns() - t0;
    pthread_barrier_destroy(&t->start);
    uint64_t cpu = 0;
    for (int i = 0; i < n; i++)
        cpu += t->cpu_ns[i];
    *ret_cpu_ns = (double)cpu / ((double)n * t->pairs);
    return wall;
}

/* Per pair, median of 5 runs: what a pair costs a core with n threads, and their CPU time. */
static double time_threads(struct threads_run *t, int n, double *ret_cpu_ns)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int used = cores > 0 && cores < n ? (int)cores : n;
    double ns[5], cpu[5];
    for (int r = 0; r < 5; r++)
        ns[r] = (double)threads_once(t, n, &cpu[r]) * used / ((double)n * t->pairs);
    for (int i = 1; i < 5; i++) /* insertion sort of the pairs (ns, cpu) by ns */
        for (int j = i; j > 0 && ns[j] < ns[j - 1]; j--) {
            double a = ns[j], b = cpu[j];
            ns[j] = ns[j - 1];
            cpu[j] = cpu[j - 1];
            ns[j - 1] = a;
            cpu[j - 1] = b;
        }
    *ret_cpu_ns = cpu[2];
    return ns[2];
}

static void run_threads(const char *label, int n, int argc, char **argv)
{
    struct threads_run t = {0};
    check(cu.cuCtxGetCurrent(&t.ctx), "cuCtxGetCurrent");
    for (int i = 0; i < argc; i++) {
        t.size = strtoull(argv[i], NULL, 0);
        t.pairs = t.size >= (1u << 20) ? 20000 : 100000;
        if (getenv("BENCH_PAIRS"))
            t.pairs = atoi(getenv("BENCH_PAIRS"));
        double cpu1, cpun;
        double one = time_threads(&t, 1, &cpu1);
        bool profile = getenv("BENCH_PROFILE") && atoi(getenv("BENCH_PROFILE"));
        if (profile)
            profile_start();
        double many = time_threads(&t, n, &cpun);
        if (profile)
            profile_report(label);
        printf("config=%s case=threads%d-%zu ns_per_pair=%.1f one_thread_ns=%.1f ratio=%.2f "
               "cpu_ns_per_pair=%.1f one_thread_cpu_ns=%.1f pairs=%d\n",
               label, n, t.size, many, one, one > 0 ? many / one : 0.0, cpun, cpu1, t.pairs);
        fflush(stdout);
    }
}

static int run(int argc, char **argv);

/* BENCH_DEPTH=N runs the benchmark N calls deep, so recorded stacks have about N frames. */
__attribute__((noinline)) static int deep(int n, int argc, char **argv)
{
    int r = n > 0 ? deep(n - 1, argc, argv) : run(argc, argv);
    __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a jump */
    return r;
}

int main(int argc, char **argv)
{
    const char *d = getenv("BENCH_DEPTH");
    return deep(d ? atoi(d) : 0, argc, argv);
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench-alloc sync|async SIZE... | mix-sync|mix-async | "
                        "replay-sync|replay-async TRACE | threads N SIZE...\n");
        return 2;
    }
    const char *mode = argv[1];
    use_async = strstr(mode, "async") != NULL;
    if (driver_api_start(&cu, 0)) {
        fprintf(stderr, "bench-alloc: no CUDA driver\n");
        return 1;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&alloc_async = dlsym(h, "cuMemAllocAsync");
    *(void **)&free_async = dlsym(h, "cuMemFreeAsync");
    check(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
    if (use_async) {
        /* a warm pool: keep freed memory instead of returning it at every sync */
        CUresult (*get_pool)(CUmemoryPool *, CUdevice);
        CUresult (*set_attr)(CUmemoryPool, CUmemPool_attribute, void *);
        *(void **)&get_pool = dlsym(h, "cuDeviceGetDefaultMemPool");
        *(void **)&set_attr = dlsym(h, "cuMemPoolSetAttribute");
        CUmemoryPool pool;
        cuuint64_t threshold = UINT64_MAX;
        if (get_pool && set_attr && get_pool(&pool, 0) == CUDA_SUCCESS)
            set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    }
    const char *label = getenv("BENCH_LABEL") ? getenv("BENCH_LABEL") : mode;
    if (!strcmp(mode, "threads")) {
        int n = argc > 2 ? atoi(argv[2]) : 0;
        if (n < 1 || n > 256 || argc < 4) {
            fprintf(stderr, "bench-alloc: threads N SIZE... (N from 1 to 256)\n");
            return 2;
        }
        run_threads(label, n, argc - 3, argv + 3);
    } else if (!strncmp(mode, "mix", 3)) {
        printf("config=%s case=mix ns_per_op=%.1f ops=%d\n", label, time_mix(20000), 20000);
    } else if (!strncmp(mode, "replay", 6)) {
        if (argc < 3)
            return 2;
        size_t pairs;
        double ns = time_replay(argv[2], &pairs);
        printf("config=%s case=replay ns_per_pair=%.1f pairs=%zu\n", label, ns, pairs);
    } else {
        for (int i = 2; i < argc; i++) {
            size_t size = strtoull(argv[i], NULL, 0);
            int pairs = size >= (64u << 20) ? 200 : size >= (1u << 20) ? 2000 : 20000;
            if (getenv("BENCH_PAIRS"))
                pairs = atoi(getenv("BENCH_PAIRS"));
            if (!use_async && !getenv("LD_PRELOAD") && size >= (64u << 20))
                pairs = 50; /* the driver's free of large blocks costs hundreds of us */
            /* page faults this thread took while timed (a recorder whose ring is not yet
             * resident makes the allocating thread take them) */
            struct rusage r0, r1;
            getrusage(RUSAGE_THREAD, &r0);
            double ns = time_pairs(size, pairs);
            getrusage(RUSAGE_THREAD, &r1);
            printf("config=%s case=%zu ns_per_pair=%.1f pairs=%d thread_faults=%ld\n", label, size,
                   ns, pairs, r1.ru_minflt - r0.ru_minflt);
            fflush(stdout);
        }
    }
    return 0;
}
