/* SPDX-License-Identifier: MIT */
/*
 * CPU benchmark of recording, part by part and whole (no GPU, no driver): the recorder of
 * libcuheap compiled in, fed by cuheap_record() the way hooks feed it.
 *   bench-record parts            ns per event: native unwinder (full walk, the per-thread
 *                                 shortcut, and their ratio, measured side by side), stack
 *                                 table interning, ring push
 *   bench-record record T RATE SECONDS
 *                                 T threads record RATE events a second in all (0: as fast
 *                                 as they can; an alloc with a 12-frame stack from 20 to 26
 *                                 frames deep, then its free) for SECONDS, through the real
 *                                 writer into a file: events a second, written, dropped,
 *                                 and the writer's CPU share
 *   bench-record cost repeated|varied|many [python]
 *                                 under LD_PRELOAD=libcuheap.so over the simulated driver
 *                                 (tests/fakecuda): cuMemAlloc + cuMemFree pairs of 512 B made
 *                                 24 calls deep, from one call path (repeated) or eight taken
 *                                 in turn (varied) or 64 (many: more than a thread's stack
 *                                 cache holds), paced so the writer keeps up; prints the
 *                                 allocating thread's CPU ns an event, best of 3 rounds
 *                                 (BENCH_ROUNDS) of 100,000 pairs after a lap of the ring. With
 * "python", from 12 Python frames (the interpreter from BENCH_LIBPYTHON, reached through ctypes,
 * which lets go of the GIL as PyTorch does). bench/run-record-cost.sh runs it under each setting.
 * Python frames need an interpreter: bench/run-cpu.sh times them through the simulated
 * driver (tests/programs/py_alloc.py with CUHEAP_RECORD_TIMING=1).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "cuheap/cuheap.h"
#include "recorder.h"
#include "ring.h"
#include "stacktab.h"
#include "unwind.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define NR_REPS 7

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return v[n / 2];
}

/* ---- parts ---- */

typedef unsigned (*capture_fn)(uint64_t *out, unsigned max);
/* The program's frames, in a library of their own (tests/unit/unwind-prog.c): the frames of
 * this executable are skipped like cuheap's own. */
typedef unsigned (*prog_cb_fn)(void *arg);
unsigned prog_descend(int depth, unsigned shape, prog_cb_fn cb, void *arg);

struct capture_call {
    capture_fn f;
    uint64_t *out;
};

static unsigned do_capture(void *arg)
{
    struct capture_call *c = arg;
    return c->f(c->out, 12);
}

static unsigned program(int depth, capture_fn f, uint64_t *out)
{
    struct capture_call c = {f, out};
    return prog_descend(depth, 1, do_capture, &c); /* shape 1: one call site, plain recursion */
}

static void unwind_parts(void)
{
    enum { CALLS = 20000 };
    uint64_t out[CUHEAP_MAX_STACK_DEPTH];
    printf("unwinder=%s\n", cuheap_unwinder_name(cuheap_unwind_init()));
    for (int depth = 8; depth <= 40; depth += 32) {
        double full[NR_REPS], fast[NR_REPS];
        for (int r = 0; r < NR_REPS; r++) { /* interleaved, so load hits both alike */
            uint64_t t0 = now_ns();
            for (int i = 0; i < CALLS; i++)
                program(depth, cuheap_unwind_capture_full, out);
            uint64_t t1 = now_ns();
            for (int i = 0; i < CALLS; i++)
                program(depth, cuheap_unwind_capture, out);
            uint64_t t2 = now_ns();
            full[r] = (double)(t1 - t0) / CALLS;
            fast[r] = (double)(t2 - t1) / CALLS;
        }
        double f = median(full, NR_REPS), s = median(fast, NR_REPS);
        printf("unwind frames_kept=12 program_frames=%d full_ns=%.0f shortcut_ns=%.0f "
               "shortcut/full=%.2f rewalks=%" PRIu64 "\n",
               depth + 4, f, s, s / f, cuheap_unwind_nr_rewalks());
    }
}

static void stacktab_parts(void)
{
    enum { NR_STACKS = 256, CALLS = 200000 };
    static uint64_t frames[NR_STACKS][12];
    static struct cuheap_py_frame py[NR_STACKS][16];
    for (int s = 0; s < NR_STACKS; s++) {
        for (int i = 0; i < 12; i++)
            frames[s][i] = 0x7f0000400000ull + (uint64_t)(i * 4096 + (i < 3 ? s * 64 : 0));
        for (int i = 0; i < 16; i++)
            py[s][i] =
                (struct cuheap_py_frame){(uint32_t)(i + (i < 2 ? s : 0)), (uint32_t)(10 + i)};
    }
    double v[NR_REPS];
    for (int r = 0; r < NR_REPS; r++) {
        struct cuheap_stacktab t;
        cuheap_stacktab_init(&t);
        uint32_t id;
        bool is_new;
        for (int s = 0; s < NR_STACKS; s++)
            cuheap_stacktab_intern(&t, frames[s], 12, py[s], 16, &id, &is_new);
        uint64_t t0 = now_ns();
        for (int i = 0; i < CALLS; i++) {
            int s = (i * 37) % NR_STACKS;
            cuheap_stacktab_intern(&t, frames[s], 12, py[s], 16, &id, &is_new);
        }
        v[r] = (double)(now_ns() - t0) / CALLS;
        cuheap_stacktab_destroy(&t);
    }
    printf("stacktab 12 native + 16 Python frames, %d stacks known: intern_ns=%.0f\n", NR_STACKS,
           median(v, NR_REPS));
}

/* One thread, half a ring at a time, drained between timings (untimed): the producer's
 * cost without a consumer competing for this machine's cores. */
static void ring_parts(void)
{
    enum { BATCH = 32768 };
    struct cuheap_ring ring;
    cuheap_ring_init(&ring, 1 << 16);
    double v[NR_REPS];
    uint64_t frames[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    for (int r = 0; r < NR_REPS + 2; r++) { /* two rounds first: the slots' pages touched */
        uint64_t t0 = now_ns();
        for (int i = 0; i < BATCH; i++) {
            struct cuheap_event *ev = cuheap_ring_claim(&ring);
            ev->seq = (uint64_t)i;
            ev->size = 512;
            ev->nr_frames = 12;
            memcpy(ev->frames, frames, sizeof(frames));
            ev->nr_py = 16;
            memset(ev->py, 0, 16 * sizeof(ev->py[0]));
            cuheap_ring_commit(&ring, ev);
        }
        if (r >= 2)
            v[r - 2] = (double)(now_ns() - t0) / BATCH;
        while (cuheap_ring_peek(&ring))
            cuheap_ring_consume(&ring);
    }
    printf("ring push (claim, 12 + 16 frames, commit): ns=%.0f\n", median(v, NR_REPS));
    cuheap_ring_destroy(&ring);
}

/* ---- the recorder, whole ---- */

static const char *bench_env(const char *name, void *arg)
{
    (void)arg;
    if (!strcmp(name, "CUHEAP_RECORD_TIMING"))
        return "1";
    if (!strcmp(name, "CUHEAP_SUMMARY"))
        return "0";
    if (!strcmp(name, "CUHEAP_OUTPUT")) {
        const char *o = getenv("BENCH_OUTPUT");
        return o ? o : "/tmp/cuheap-bench-record-%p.jsonl";
    }
    if (!strcmp(name, "CUHEAP_STACK_DEPTH"))
        return "12";
    return getenv(name); /* CUHEAP_STACK_CACHE, CUHEAP_RING, ... from the caller */
}

static void bench_warn(const char *line, void *arg)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
}

static struct cuheap_config cfg;
static double seconds, rate_per_thread; /* events a second per thread, 0: flat out */
static atomic_bool go;

/* What a hook records for one cudaMalloc + cudaFree. */
static unsigned one_pair(void *arg)
{
    uint64_t i = *(uint64_t *)arg;
    struct cuheap_rec a = {.type = CUHEAP_EV_ALLOC,
                           .api = CUHEAP_API_MEM_ALLOC,
                           .device = 0,
                           .ptr = 0x7f0000000000ull + i * 512,
                           .size = 512,
                           .actual = 512};
    cuheap_record(&a);
    struct cuheap_rec f = a;
    f.type = CUHEAP_EV_FREE;
    cuheap_record(&f);
    return 0;
}

/* Pairs from call sites 20 to 26 frames deep, paced in batches of 32 pairs with sleeps (so
 * producers leave the writer its CPU, as a training loop does between allocations). */
static void *producer(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg << 32, i = 0;
    while (!atomic_load(&go))
        ;
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    while (now_ns() < end) {
        for (int k = 0; k < 32; k++, i++) {
            uint64_t n = base + i;
            prog_descend(20 + (int)(i % 7), (unsigned)(i % 5) * 3 + 1, one_pair, &n);
        }
        if (rate_per_thread > 0) {
            uint64_t next = t0 + (uint64_t)((double)(2 * i) * 1e9 / rate_per_thread);
            uint64_t t = now_ns();
            if (next > t) {
                struct timespec ts = {(time_t)((next - t) / 1000000000ull),
                                      (long)((next - t) % 1000000000ull)};
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

static void report(const char *what, double wall)
{
    cuheap_recorder_stop();
    struct cuheap_recorder_stats s;
    struct cuheap_recorder_timing t;
    cuheap_recorder_get_stats(&s);
    cuheap_recorder_get_timing(&t);
    printf("%s: events=%" PRIu64 " events_per_s=%.0f written=%" PRIu64 " dropped=%" PRIu64
           " writer_cpu_share=%.1f%% writer_cpu_ns_per_event=%.0f (stack table %.0f, formatting "
           "%.0f) hook: ring_ns=%.0f unwind_ns=%.0f frames=%.1f\n",
           what, s.nr_events, (double)s.nr_events / wall, t.nr_written, s.nr_dropped,
           t.wall_s > 0 ? 100.0 * t.writer_cpu_s / t.wall_s : 0.0,
           t.nr_written ? t.writer_cpu_s * 1e9 / (double)t.nr_written : 0.0, t.intern_ns,
           t.write_ns, t.ring_ns, t.unwind_ns, t.frames);
    if (s.path)
        unlink(s.path);
}

/* ---- the allocating thread's cost, through the hooks ---- */

static struct {
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
} cu;

static uint64_t thread_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned driver_pair(void *arg)
{
    (void)arg;
    CUdeviceptr p;
    if (cu.alloc(&p, 512) == CUDA_SUCCESS)
        cu.free(p);
    return 0;
}

static int driver_open(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return -1;
    CUresult (*init)(unsigned) = NULL, (*get)(CUdevice *, int) = NULL,
             (*retain)(CUcontext *, CUdevice) = NULL, (*set)(CUcontext) = NULL;
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&get = dlsym(h, "cuDeviceGet");
    *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&set = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.free = dlsym(h, "cuMemFree_v2");
    CUdevice dev;
    CUcontext ctx;
    if (!init || !get || !retain || !set || !cu.alloc || !cu.free || init(0) || get(&dev, 0) ||
        retain(&ctx, dev) || set(ctx))
        return -1;
    return 0;
}

/* pairs pairs 24 calls deep, in batches of 256 with a pause after each (untimed) so that the
 * writer, which shares this machine's cores, keeps up: the thread's CPU ns a pair */
static double cost_round(int pairs, unsigned paths)
{
    enum { BATCH = 256 };
    uint64_t busy = 0;
    for (int done = 0; done < pairs; done += BATCH) {
        uint64_t t0 = thread_ns();
        for (int i = 0; i < BATCH; i++)
            prog_descend(23, 1 + (unsigned)(i % paths) * 3, driver_pair, NULL);
        busy += thread_ns() - t0;
        struct timespec ts = {0, 2000 * 1000};
        nanosleep(&ts, NULL);
    }
    return (double)busy / (double)((pairs + BATCH - 1) / BATCH * BATCH);
}

/* Exported for the Python side of "cost ... python" (ctypes). */
__attribute__((visibility("default"))) int bench_record_cost(unsigned paths);

int bench_record_cost(unsigned paths)
{
    if (driver_open()) {
        fprintf(stderr, "bench-record: no simulated driver (LD_LIBRARY_PATH=tests/fakecuda)\n");
        return 1;
    }
    int (*stats)(struct cuheap_stats *, size_t) = NULL;
    *(void **)&stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    /* a lap of the default ring first: its pages resident (BENCH_PAIRS: fewer, for callgrind) */
    int pairs = getenv("BENCH_PAIRS") ? atoi(getenv("BENCH_PAIRS")) : 100000;
    cost_round(pairs < 40000 ? pairs : 40000, paths);
    double best = 0;
    int rounds = getenv("BENCH_ROUNDS") ? atoi(getenv("BENCH_ROUNDS")) : 3;
    for (int r = 0; r < rounds; r++) {
        double ns = cost_round(pairs, paths);
        if (r == 0 || ns < best)
            best = ns;
    }
    struct cuheap_stats s = {0};
    if (stats)
        stats(&s, sizeof(s));
    const char *label = getenv("BENCH_LABEL");
    printf("config=%s stack=%s ns_per_event=%.1f ns_per_pair=%.1f events=%" PRIu64
           " dropped=%" PRIu64 "\n",
           label ? label : "-",
           paths == 1   ? "repeated"
           : paths == 8 ? "varied"
                        : "many",
           best / 2, best, s.nr_events, s.nr_dropped);
    fflush(stdout);
    return 0;
}

/* Twelve Python frames, then the C loop through ctypes. */
static int cost_python(unsigned paths)
{
    const char *lib = getenv("BENCH_LIBPYTHON");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_GLOBAL) : NULL;
    void (*init)(int) = NULL;
    int (*run)(const char *) = NULL;
    if (h) {
        *(void **)&init = dlsym(h, "Py_InitializeEx");
        *(void **)&run = dlsym(h, "PyRun_SimpleString");
    }
    if (!init || !run) {
        fprintf(stderr, "bench-record: BENCH_LIBPYTHON=%s: no interpreter\n", lib ? lib : "");
        return 1;
    }
    init(0);
    char code[512];
    snprintf(code, sizeof(code),
             "import ctypes, sys\n"
             "f = ctypes.CDLL(None).bench_record_cost\n"
             "def down(n):\n"
             "    return down(n - 1) if n > 1 else f(%u)\n"
             "sys.exit(down(12))\n",
             paths);
    return run(code) ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "parts";
    if (!strcmp(mode, "cost") && argc > 2) {
        unsigned paths = !strcmp(argv[2], "varied") ? 8 : !strcmp(argv[2], "many") ? 64 : 1;
        if (argc > 3 && !strcmp(argv[3], "python"))
            return cost_python(paths);
        return bench_record_cost(paths);
    }
    if (!strcmp(mode, "parts")) {
        unwind_parts();
        stacktab_parts();
        ring_parts();
        return 0;
    }
    if (argc < 5 || strcmp(mode, "record")) {
        fprintf(stderr, "usage: bench-record parts | record THREADS EVENTS_PER_S SECONDS | cost "
                        "repeated|varied|many [python]\n");
        return 2;
    }
    int nr = atoi(argv[2]);
    double rate = atof(argv[3]);
    seconds = atof(argv[4]);
    if (nr < 1 || nr > 256)
        return 2;
    rate_per_thread = rate / nr;
    cuheap_config_parse(&cfg, bench_env, bench_warn, NULL);
    cuheap_recorder_start(&cfg);
    pthread_t t[256];
    for (int i = 0; i < nr; i++)
        pthread_create(&t[i], NULL, producer, (void *)(uintptr_t)(i + 1));
    uint64_t t0 = now_ns();
    atomic_store(&go, true);
    for (int i = 0; i < nr; i++)
        pthread_join(t[i], NULL);
    char what[96];
    snprintf(what, sizeof(what), "record threads=%d asked_per_s=%.0f", nr, rate);
    report(what, (double)(now_ns() - t0) / 1e9);
    return 0;
}
