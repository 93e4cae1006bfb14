/* SPDX-License-Identifier: MIT */
/*
 * A CUDA program for the recorder's process tests (tests/integration/test-process.c): each
 * subcommand makes the program behave the way one promise of the recorder is tested.
 *   allocs N MS        N alloc/free pairs, "ready" on stdout, then sleeps MS (to be killed)
 *   marks ARG...       one allocation, then cuheap_mark(ARG) and nvtxMarkA(ARG) for each
 *   mark-rss N         N marks after a warm-up; prints the growth of resident memory
 *   huge               asks for 2^63 bytes (the driver refuses)
 *   late N             after cuheap's exit handler ran: N alloc/free pairs, and the stats
 *   rss                one alloc/free; prints resident memory (KiB)
 *   signal-mark        a timer whose handler allocates fires while cuheap_mark starts cuheap
 *   signal-nvtx        the same with an NVTX mark (cuheap as the NVTX injection library)
 * Linked with the driver (the first door), so nothing before the first hooked call starts
 * cuheap. cuheap's entry points are found with dlsym: the program runs without it too.
 */
#include <cuda.h>
#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts))
        ;
}

static int start(void)
{
    CUdevice dev;
    CUcontext ctx;
    return cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
           cuCtxSetCurrent(ctx);
}

static int pairs(long n, size_t size)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, size) || cuMemFree(p))
            return 1;
    }
    return 0;
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

static long late_pairs;

/* Registered before the first CUDA call, so it runs after cuheap's own exit handler, as a
 * thread still allocating at exit would. */
static void late_work(void)
{
    int (*stats)(struct cuheap_stats *, size_t) = stats_fn();
    struct cuheap_stats before = {0}, after = {0};
    if (stats)
        stats(&before, sizeof(before));
    int failed = pairs(late_pairs, 4096);
    if (stats)
        stats(&after, sizeof(after));
    printf("late: failed=%d events+%llu dropped+%llu\n", failed,
           (unsigned long long)(after.nr_events - before.nr_events),
           (unsigned long long)(after.nr_dropped - before.nr_dropped));
    fflush(stdout);
}

static void on_alarm(int sig)
{
    (void)sig;
    CUdeviceptr p;
    if (cuMemAlloc(&p, 4096) == CUDA_SUCCESS)
        cuMemFree(p);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "late") && argc > 2) {
        late_pairs = atol(argv[2]);
        atexit(late_work);
    }
    if (start()) {
        fprintf(stderr, "recprog: cannot reach the driver\n");
        return 1;
    }
    void (*mark)(const char *) = mark_fn();
    if (!strcmp(cmd, "allocs") && argc > 3) {
        if (pairs(atol(argv[2]), 1 << 20))
            return 1;
        printf("ready\n");
        fflush(stdout);
        sleep_ms(atol(argv[3]));
        return 0;
    }
    if (!strcmp(cmd, "marks")) {
        if (pairs(1, 4096) || !mark)
            return 1;
        for (int i = 2; i < argc; i++) {
            mark(argv[i]);
            nvtxMarkA(argv[i]); /* recorded when cuheap is the NVTX injection library */
        }
        return 0;
    }
    if (!strcmp(cmd, "mark-rss") && argc > 2) {
        long n = atol(argv[2]);
        if (pairs(1, 4096) || !mark)
            return 1;
        char label[100];
        memset(label, 'x', sizeof(label) - 1);
        label[sizeof(label) - 1] = 0;
        long before = 0;
        /* the first quarter warms up what is allocated once (tables, buffers) */
        for (long i = 0; i < n + n / 4; i++) {
            mark(label);
            if (i % 1000 == 999)
                sleep_ms(2); /* let the writer drain: marks in the trace, not dropped */
            if (i == n / 4 - 1) {
                sleep_ms(300);
                before = rss_kib();
            }
        }
        sleep_ms(300);
        printf("mark-rss: growth %ld KiB\n", rss_kib() - before);
        return 0;
    }
    if (!strcmp(cmd, "pause")) {
        /* 3 pairs recorded, 5 while paused (one block allocated before the pause and freed
         * during it, one allocated during it and freed after), 2 recorded again; the answers
         * of every call, then the statistics' event count */
        int (*set)(int);
        *(void **)&set = dlsym(RTLD_DEFAULT, "cuheap_set_recording");
        int (*stats)(struct cuheap_stats *, size_t) = stats_fn();
        if (!set || !stats)
            return 1;
        CUdeviceptr before, during;
        if (pairs(3, 4096) || cuMemAlloc(&before, 8192))
            return 1;
        int a = set(0), b = set(0);
        if (cuMemFree(before) || pairs(5, 12288) || cuMemAlloc(&during, 16384))
            return 1;
        int c = set(1), d = set(1);
        if (cuMemFree(during) || pairs(2, 4096))
            return 1;
        struct cuheap_stats s;
        stats(&s, sizeof(s));
        printf("pause: %d %d %d %d allocs %llu\n", a, b, c, d, (unsigned long long)s.nr_allocs);
        return 0;
    }
    if (!strcmp(cmd, "huge")) {
        CUdeviceptr p;
        CUresult a = cuMemAlloc(&p, (size_t)1 << 63);
        printf("huge: %d\n", (int)a);
        return 0;
    }
    if (!strcmp(cmd, "late"))
        return pairs(1, 4096);
    if (!strcmp(cmd, "rss")) {
        if (pairs(1, 4096))
            return 1;
        sleep_ms(100);
        printf("rss: %ld KiB\n", rss_kib());
        return 0;
    }
    if (!strcmp(cmd, "signal-mark") || !strcmp(cmd, "signal-nvtx")) {
        /* the timer fires while the mark starts cuheap (about a millisecond of work). NVTX
         * loads its injection library (cuheap) first: a handler that lands inside that
         * dlopen holds the loader's malloc lock under any injection library, which no shim
         * can take back, so the loader's own start is kept out of the window. */
        if (!strcmp(cmd, "signal-nvtx"))
            nvtxInitialize(NULL);
        signal(SIGALRM, on_alarm);
        struct itimerval t = {{0, 0}, {0, 50}};
        setitimer(ITIMER_REAL, &t, NULL);
        if (!strcmp(cmd, "signal-nvtx"))
            nvtxMarkA("started by NVTX");
        else if (mark)
            mark("started by a mark");
        sleep_ms(5);
        printf("%s: ok\n", cmd);
        return 0;
    }
    return 2;
}
