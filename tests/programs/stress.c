/* SPDX-License-Identifier: MIT */
/*
 * Stress for cuheap on the simulated driver (scripts/stress.sh, test-process's stress cases).
 * Each subcommand prints one result line and exits 0 when what it checks held, 1 when not.
 *   threads T N         T threads over every device, N alloc/free pairs each with a mark
 *                       every 16th; checks cuheap's counts (allocs + frees = events written
 *                       + dropped) and prints them
 *   fork-streams N      one thread creates and destroys non-blocking streams, another
 *                       allocates and frees (fences record on every known stream), while the
 *                       main thread forks N children; each child must create a stream and
 *                       allocate within 10 s (issue 12: the known-stream lock held at fork)
 *   fork-storm N        threads allocate while the main thread forks N children that each
 *                       allocate, free and exit; every child must exit 0 in time
 *   fork-boot N         N rounds, each a fresh process in which one thread's first allocation
 *                       starts cuheap while the main thread forks 8 children back to back
 *                       (fork during start-up); every child must allocate and exit in time
 *   signals N           N alloc/free pairs while a 100 us timer's handler puts a mark in the
 *                       trace (cuheap_mark, which takes cuheap's locks) and counts
 *   rss N               N alloc/free pairs (sizes vary, marks, streams come and go); prints
 *                       resident memory (KiB) every N/10 pairs: "rss: A B C ..."
 *   allocs N MS         N pairs, "ready", then sleeps MS (to be killed)
 *   exit-race US        8 threads loop alloc/free pairs, the first of them starting cuheap,
 *                       while the main thread calls exit(0) US microseconds after the first
 *                       allocation's call began: exit during start-up, or while the writer runs
 *   exit-race-child US  the same in a child forked after cuheap started, whose trace opens with
 *                       its first event; exits with the child's status
 *   release-fails       the pool must give memory back for a large request, and the driver
 *                       fails that (FAKECUDA_FAIL): cuheap's and the device's accounts must
 *                       still agree (tests/RELIABILITY.md)
 *   capacity N SEED     N seeded allocations and frees that keep the device nearly full (sizes
 *                       4 KiB to 12 MiB, live held near FAKECUDA_DEVICE_MEM less its last
 *                       eighth), each block written; prints the allocations refused, so that a
 *                       run under cuheap can be compared with one of the driver alone
 *                       (CUHEAP_POOL=0): cuheap must grant every allocation the driver grants
 *   vmm-refused         10 cuMemAlloc of 4 KiB and 10 of 3 MiB, each written and read back,
 *                       while FAKECUDA_FAIL fails the pool's VMM calls: every one the driver
 *                       alone grants must be granted, and once all are freed cuheap's and the
 *                       device's accounts must agree (issue 29)
 */
#include <cuda.h>
#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static int nr_devices = 1;
static CUcontext ctxs[8];

static int start(void)
{
    if (cuInit(0) || cuDeviceGetCount(&nr_devices) || nr_devices < 1)
        return 1;
    if (nr_devices > 8)
        nr_devices = 8;
    for (int d = 0; d < nr_devices; d++) {
        CUdevice dev;
        if (cuDeviceGet(&dev, d) || cuDevicePrimaryCtxRetain(&ctxs[d], dev))
            return 1;
    }
    return cuCtxSetCurrent(ctxs[0]) != CUDA_SUCCESS;
}

static void (*mark_fn(void))(const char *)
{
    void (*fn)(const char *);
    *(void **)&fn = dlsym(RTLD_DEFAULT, "cuheap_mark");
    return fn;
}

static int (*stats_fn(void))(struct cuheap_stats *, size_t)
{
    int (*fn)(struct cuheap_stats *, size_t);
    *(void **)&fn = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    return fn;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts))
        ;
}

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int pairs(long n, size_t size)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, size + (size_t)(i % 7) * 512) || cuMemFree(p))
            return 1;
    }
    return 0;
}

/* ---- threads ---- */

struct thread_arg {
    int id;
    long n;
    int failed;
};

static void *thread_pairs(void *arg)
{
    struct thread_arg *t = arg;
    void (*mark)(const char *) = mark_fn();
    if (cuCtxSetCurrent(ctxs[t->id % nr_devices])) {
        t->failed = 1;
        return NULL;
    }
    for (long i = 0; i < t->n && !t->failed; i++) {
        CUdeviceptr p;
        t->failed = cuMemAlloc(&p, 256 + (size_t)(i % 64) * 1024) || cuMemFree(p);
        if (mark && i % 16 == 0)
            mark("stress");
    }
    return NULL;
}

static int cmd_threads(int nt, long n)
{
    pthread_t th[64];
    struct thread_arg args[64];
    if (nt < 1 || nt > 64)
        return 2;
    for (int i = 0; i < nt; i++) {
        args[i] = (struct thread_arg){i, n, 0};
        pthread_create(&th[i], NULL, thread_pairs, &args[i]);
    }
    int failed = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        failed |= args[i].failed;
    }
    int (*stats)(struct cuheap_stats *, size_t) = stats_fn();
    struct cuheap_stats s = {0};
    if (stats)
        stats(&s, sizeof(s));
    uint64_t marks = (uint64_t)nt * (uint64_t)((n + 15) / 16);
    printf("threads: %d threads x %ld pairs on %d devices: %s; allocs %llu frees %llu events "
           "%llu dropped %llu marks %llu live %llu\n",
           nt, n, nr_devices, failed ? "a call failed" : "all succeeded",
           (unsigned long long)s.nr_allocs, (unsigned long long)s.nr_frees,
           (unsigned long long)s.nr_events, (unsigned long long)s.nr_dropped,
           (unsigned long long)marks, (unsigned long long)s.live_bytes);
    bool counts = !stats || (s.nr_allocs == (uint64_t)nt * (uint64_t)n &&
                             s.nr_frees == (uint64_t)nt * (uint64_t)n && s.live_bytes == 0);
    return failed || !counts;
}

/* ---- fork while streams and fences change ---- */

static atomic_bool stop;

static void *stream_churn(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(ctxs[0]);
    CUstream s[64] = {0};
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        CUstream *slot = &s[i % 64];
        if (*slot)
            cuStreamDestroy(*slot);
        *slot = NULL;
        cuStreamCreate(slot, CU_STREAM_NON_BLOCKING);
    }
    for (int i = 0; i < 64; i++)
        if (s[i])
            cuStreamDestroy(s[i]);
    return NULL;
}

static void *alloc_churn(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(ctxs[0]);
    while (!atomic_load(&stop))
        pairs(64, 4096); /* 64 frees close a fence batch: a fence on every known stream */
    return NULL;
}

static int child_work(bool stream)
{
    alarm(10);
    if (cuCtxSetCurrent(ctxs[0]))
        return 3;
    if (stream) {
        CUstream s;
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuStreamDestroy(s))
            return 4;
    }
    return pairs(130, 8192) ? 5 : 0;
}

static int fork_under_load(long n, bool streams, const char *what)
{
    pthread_t a, b;
    pthread_create(&a, NULL, alloc_churn, NULL);
    if (streams)
        pthread_create(&b, NULL, stream_churn, NULL);
    long hung = 0, failed = 0;
    for (long i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            exit(child_work(streams)); /* exit, not _exit: cuheap's exit handler ends the trace */
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
            hung++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st))
            failed++;
    }
    atomic_store(&stop, true);
    pthread_join(a, NULL);
    if (streams)
        pthread_join(b, NULL);
    printf("%s: %ld children, %ld hung, %ld failed\n", what, n, hung, failed);
    return hung || failed;
}

/* ---- fork while another thread starts cuheap ---- */

static void *boot_churn(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(ctxs[0]);
    pairs(64, 4096); /* the first allocation starts cuheap, the rest keep its writer busy */
    return NULL;
}

#define NR_BOOT_CHILDREN 8

/* One round: a process where cuheap has not started (the hooks main() called do not start
 * it); a thread starts it while this thread forks. Returns the number of children hung. */
static int boot_round(long *ret_failed)
{
    pthread_t t;
    pthread_create(&t, NULL, boot_churn, NULL);
    pid_t kids[NR_BOOT_CHILDREN];
    for (int i = 0; i < NR_BOOT_CHILDREN; i++) {
        kids[i] = fork();
        if (kids[i] == 0)
            exit(child_work(false));
    }
    int hung = 0;
    for (int i = 0; i < NR_BOOT_CHILDREN; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
            hung++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st))
            ++*ret_failed;
    }
    pthread_join(t, NULL);
    return hung;
}

static int cmd_fork_boot(long n)
{
    long hung = 0, failed = 0;
    for (long i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            long f = 0;
            int h = boot_round(&f);
            _exit(h | (f ? 16 : 0)); /* children hung, and 16 when any failed */
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st)) {
            failed++; /* the round itself did not finish */
            continue;
        }
        hung += WEXITSTATUS(st) & 15;
        failed += (WEXITSTATUS(st) & 16) != 0;
    }
    printf("fork-boot: %ld rounds, %ld children, %ld hung, %ld failed\n", n, n * NR_BOOT_CHILDREN,
           hung, failed);
    return hung || failed;
}

/* ---- exit while threads allocate, during start-up ---- */

#define NR_EXIT_THREADS 8

static atomic_bool calling; /* a thread is about to make its first allocation */

static void *exit_churn(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(ctxs[0]);
    atomic_store(&calling, true);
    for (;;)
        pairs(64, 4096);
    return NULL;
}

/* The delay counts from the first allocation's call, which starts cuheap: on a loaded machine
 * the threads' own start took longer than the window. Prints nothing of its own: the caller
 * reads the trace and cuheap's summary on stderr. */
static int cmd_exit_race(long us)
{
    pthread_t th;
    for (int i = 0; i < NR_EXIT_THREADS; i++)
        pthread_create(&th, NULL, exit_churn, NULL);
    while (!atomic_load(&calling))
        sched_yield();
    /* a spin, not a sleep: woken late on a busy machine, every exit came after start-up */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < us);
    exit(0);
}

/* The same in a child forked after cuheap started: the child's trace opens with its first
 * event, on whichever of its threads makes it. Returns the child's exit status. */
static int cmd_exit_race_child(long us)
{
    if (pairs(1, 4096))
        return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        cmd_exit_race(us);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- signals ---- */

static atomic_long nr_handled;
static void (*g_mark)(const char *);

static void on_timer(int sig)
{
    (void)sig;
    if (g_mark)
        g_mark("signal");
    atomic_fetch_add(&nr_handled, 1);
}

static int cmd_signals(long n)
{
    g_mark = mark_fn();
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_timer;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &it, NULL);
    int r = pairs(n, 65536);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("signals: %ld pairs %s, %ld handlers ran\n", n, r ? "FAILED" : "done",
           atomic_load(&nr_handled));
    return r;
}

/* ---- resident memory over a long run ---- */

static int cmd_rss(long n)
{
    void (*mark)(const char *) = mark_fn();
    long step = n / 10 > 0 ? n / 10 : 1;
    printf("rss:");
    CUdeviceptr keep[32] = {0};
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 512 + (size_t)(i * 7919 % 4096) * 256))
            return 1;
        CUdeviceptr *k = &keep[i % 32];
        if (*k && cuMemFree(*k))
            return 1;
        *k = p;
        if (mark && i % 64 == 0)
            mark("step");
        if (i % 1000 == 0) {
            CUstream s;
            if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS)
                cuStreamDestroy(s);
        }
        if (i % step == step - 1) {
            printf(" %ld", rss_kib());
            fflush(stdout);
        }
    }
    for (int i = 0; i < 32; i++)
        if (keep[i])
            cuMemFree(keep[i]);
    printf("\n");
    return 0;
}

/* ---- the pool gives memory back and the driver fails the call ---- */

/* A pooled block is freed, then a request larger than the pool's cap (so the driver's) does
 * not fit until the pool gives its memory back; FAKECUDA_FAIL fails that release. What the
 * device still has handed out must be what cuheap says it holds. */
static int cmd_release_fails(void)
{
    CUdeviceptr p;
    size_t free_b = 0, total = 0;
    if (cuMemAlloc(&p, 1 << 20) || cuMemFree(p) || cuCtxSynchronize() ||
        cuMemGetInfo(&free_b, &total))
        return 2;
    CUresult r = cuMemAlloc(&p, free_b + (1 << 20)); /* fits only once the pool trims */
    if (r == CUDA_SUCCESS)
        cuMemFree(p);
    int (*stats)(struct cuheap_stats *, size_t) = stats_fn();
    struct cuheap_stats st = {0};
    if (stats)
        stats(&st, sizeof(st));
    size_t used = fakecuda_device_used(0);
    printf("release-fails: large request %d; the device has %zu bytes handed out, cuheap says it "
           "holds %llu\n",
           (int)r, used, (unsigned long long)st.reserved_bytes);
    return stats && used != st.reserved_bytes;
}

/* ---- near the device's capacity ---- */

static int cmd_capacity(long n, unsigned seed)
{
    enum { NR_LIVE = 4096 };
    static CUdeviceptr ptr[NR_LIVE];
    static size_t size[NR_LIVE];
    size_t free_b = 0, total = 0, live = 0;
    unsigned nr = 0, refused = 0;
    if (cuMemGetInfo(&free_b, &total))
        return 2;
    size_t room = total - total / 8; /* live bytes kept under this, 2 MiB rounding counted */
    printf("capacity: refused");
    for (long i = 0; i < n; i++) {
        bool grow = nr < NR_LIVE && (rand_r(&seed) % 3 != 0 || !nr);
        if (grow) {
            double x = (double)rand_r(&seed) / RAND_MAX;
            size_t want = x < 0.5 ? (size_t)(4096 * pow(256, x * 2)) /* 4 KiB - 1 MiB */
                                  : (size_t)((1 << 20) * pow(12, (x - 0.5) * 2));
            want = (want + 255) & ~(size_t)255;
            size_t rounded = want >= (2 << 20) ? (want + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1)
                                               : (want + 511) & ~(size_t)511;
            if (live + rounded > room)
                grow = false;
            else if (cuMemAlloc(&ptr[nr], want) != CUDA_SUCCESS) {
                printf(" %ld", i);
                refused++;
            } else {
                if (cuMemsetD8(ptr[nr], (unsigned char)i, want) != CUDA_SUCCESS)
                    return 2;
                size[nr++] = rounded;
                live += rounded;
            }
        }
        if (!grow && nr) {
            unsigned k = (unsigned)rand_r(&seed) % nr;
            if (cuMemFree(ptr[k]) != CUDA_SUCCESS)
                return 2;
            live -= size[k];
            ptr[k] = ptr[--nr];
            size[k] = size[nr];
        }
    }
    printf("\ncapacity: %u refused of %ld steps\n", refused, n);
    while (nr)
        cuMemFree(ptr[--nr]);
    return 0;
}

/* ---- the driver refuses the pool's VMM calls ---- */

static int cmd_vmm_refused(void)
{
    CUdeviceptr p[20] = {0};
    static unsigned char buf[3 << 20];
    int granted = 0, intact = 0;
    for (int i = 0; i < 20; i++) {
        size_t n = i < 10 ? 4096 : 3 << 20;
        if (cuMemAlloc(&p[i], n) != CUDA_SUCCESS) {
            p[i] = 0;
            continue;
        }
        granted++;
        if (cuMemsetD8(p[i], (unsigned char)(i + 1), n) == CUDA_SUCCESS &&
            cuMemcpyDtoH(buf, p[i], n) == CUDA_SUCCESS && buf[0] == i + 1 && buf[n - 1] == i + 1)
            intact++;
    }
    for (int i = 0; i < 20; i++)
        if (p[i] && cuMemFree(p[i]) != CUDA_SUCCESS)
            return 2;
    int (*stats)(struct cuheap_stats *, size_t) = stats_fn();
    struct cuheap_stats st = {0};
    if (stats)
        stats(&st, sizeof(st));
    size_t used = fakecuda_device_used(0);
    printf("vmm-refused: granted %d of 20, %d intact; the device has %zu bytes handed out, "
           "cuheap says it holds %llu\n",
           granted, intact, used, (unsigned long long)st.reserved_bytes);
    return granted != 20 || intact != 20 || (stats && used != st.reserved_bytes);
}

int main(int argc, char **argv)
{
    if (argc < 2 || start()) {
        fprintf(stderr, "usage: stress "
                        "threads|fork-streams|fork-storm|fork-boot|signals|rss|allocs|exit-race|"
                        "exit-race-child ...\n");
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 1000;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "threads") && argc > 3)
        return cmd_threads(atoi(argv[2]), atol(argv[3]));
    if (!strcmp(cmd, "fork-streams"))
        return fork_under_load(n, true, "fork-streams");
    if (!strcmp(cmd, "fork-storm"))
        return fork_under_load(n, false, "fork-storm");
    if (!strcmp(cmd, "fork-boot"))
        return cmd_fork_boot(n);
    if (!strcmp(cmd, "signals"))
        return cmd_signals(n);
    if (!strcmp(cmd, "rss"))
        return cmd_rss(n);
    if (!strcmp(cmd, "exit-race"))
        return cmd_exit_race(n);
    if (!strcmp(cmd, "exit-race-child"))
        return cmd_exit_race_child(n);
    if (!strcmp(cmd, "release-fails"))
        return cmd_release_fails();
    if (!strcmp(cmd, "vmm-refused"))
        return cmd_vmm_refused();
    if (!strcmp(cmd, "capacity") && argc > 3)
        return cmd_capacity(n, (unsigned)atol(argv[3]));
    if (!strcmp(cmd, "allocs") && argc > 3) {
        if (pairs(n, 4096))
            return 1;
        printf("ready\n");
        fflush(stdout);
        sleep_ms(atol(argv[3]));
        return 0;
    }
    fprintf(stderr, "stress: unknown command %s\n", cmd);
    return 2;
}
