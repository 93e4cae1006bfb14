/* SPDX-License-Identifier: MIT */
/*
 * Memory held against memory used: replays the allocations and frees of a recorded job (a cuheap
 * trace, e.g. bench/sequences/gpt-seq-nocache.jsonl.gz decompressed) through cuMemAlloc/cuMemFree
 * and prints peak live bytes, peak bytes held from the device, and their ratio.
 *
 *   bench-replay [--work-us N] [--steps N] [--passes N] [--from-step S] [--eval K]
 *                [--stray 1] [--pluggable 1] [--threads 1] [--step-mark LABEL]
 *                [--max-steps N] [--callgrind-warm 1] TRACE
 *
 * Run it on the simulated driver alone (what the driver itself holds: the device's used bytes),
 * or with libcuheap.so preloaded (what cuheap holds: its peak reserved bytes). Like a training
 * job, the host runs ahead of the device: after every allocation a "kernel" of --work-us
 * microseconds (default 20; 0: none, every stream idle, so that a run repeats exactly) is
 * queued on a non-blocking stream, and the host waits for the streams only at step ends, as a
 * loss.item() does. Fence timing therefore varies from run to run: run it several times and
 * keep the worst.
 *
 * Steps: a trace whose job marked its steps (cuheap_mark("step"), --step-mark names another
 * label, "-" ignores them) ends a step at each mark; a trace without marks is cut into --steps
 * steps (default 30) of as many allocations each. --max-steps N replays only the trace's first N
 * steps (the events up to the N-th step's end), as if the job had stopped there.
 *
 * Threads: each thread of the recorded job gets a replay thread of its own, with its own
 * non-blocking stream (and a stream of its own for each stream a stream-ordered allocation
 * named), and the threads take turns in the recorded order (by seq): the thread whose event is
 * next runs until the next event is another's, then wakes that one. The pool thus sees the
 * job's threads (thread caches, frees from another thread) in the job's order. --threads 1
 * replays every event on one thread.
 *
 * --passes N (default 1) replays the job's steady part N-1 more times, as a long run would: the
 * allocations the trace frees again, with the blocks it never frees (the model) kept from the
 * first pass. Each pass then prints its own "pass=K peak_live=B peak_held=B held_over_live=R"
 * line, so that memory held creeping up over a long run shows; under cuheap the line goes on
 * with "map_ops=N ops_per_step=X": the chunks the vmm pool took from the driver, moved and
 * gave back during that pass (cuheap_get_stats), and that over the pass's steps. A warm job
 * should make none: passes after the first are the warm ones.
 *
 * --settle N (default 8, at most half the steps): in passes after the first, the figures of
 * the pass past its first N steps go on each pass line as " settled_held_over_live=R
 * settled_ops_per_step=X", and over passes 2 to N on the last line. A pass's first steps
 * re-make the first step's state (an optimizer's, freed at the trace's end), which a job does
 * once: the settled figures are the long run's steady state, the pass's own include that
 * boundary.
 *
 * --from-step S (default 0) replays, in passes after the first, only the allocations of the
 * trace's steps from S on: a long run's steady steps again and again, without the first steps'
 * blocks (an optimizer's state, made in the first step and freed at the trace's end) made anew
 * at each pass's start, which a job does once.
 *
 * --eval K adds an evaluation after every K-th step, as a training loop that evaluates every K
 * steps does: the sizes of the first half of the trace's second step allocated in order without
 * their saved tensors (each freed as the next is made), the largest kept until the next
 * evaluation (its output), then a sync. A phase of another shape, and a block kept for K steps.
 *
 * --stray 1 adds, half way through every step, one block of a size no step asked for before
 * (seeded, 256 KiB to 64 MiB, log-uniform: above what thread caches keep), freed at the step's
 * end: a job whose step repeats but for one block of a new size each time (a buffer sized by
 * the batch's data).
 *
 * --pluggable 1 (under cuheap) allocates and frees through cuheap_torch_alloc/cuheap_torch_free
 * on the replaying thread's stream, as PyTorch's CUDAPluggableAllocator does, instead of
 * cuMemAlloc and cuMemFree: blocks freed on a known stream, which may be reused on it at once.
 *
 * Output: first "trace=NAME threads=T streams=S steps=N steps_from=marks|even", then the pass
 * lines, then "replay=NAME allocs=N peak_live=B peak_held=B held_over_live=R", with
 * " warm_ops_per_step=X" (passes 2 to N together) under cuheap when N > 1, and the settled
 * figures (--settle) of passes 2 to N. Built where valgrind's callgrind.h is, the replay
 * starts callgrind's instrumentation only once the trace is read (run it with
 * --instr-atstart=no), so that counting cuheap's instructions skips the JSON parsing, and
 * --callgrind-warm 1 zeroes callgrind's counts as the second pass starts, so that they are the
 * warm passes' alone (each pass line ends with the allocations it made, " allocs=N").
 */
#include <cuheap/cuheap.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifdef CALLGRIND_ZERO_STATS
#define HAVE_CALLGRIND 1
#else
#define HAVE_CALLGRIND 0
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#endif

#define DOOR_PROCADDR 1
#include "../tests/programs/driver_api.h"
#include "event.h"
#include "tracereader.h"

#define NR_MAX_REPLAY_THREADS 256
#define NR_MAX_REPLAY_STREAMS 256

static struct driver_api cu;
static int (*get_stats)(struct cuheap_stats *, size_t);
static void *(*torch_alloc)(ssize_t, int, void *);
static void (*torch_free)(void *, ssize_t, int, void *);

/* Mapping operations so far: chunks taken from the driver, moved and given back (0 without
 * cuheap, or under a cuheap older than these fields, which leaves them as zeroed here). */
static uint64_t map_ops(void)
{
    struct cuheap_stats s = {0};
    if (!get_stats)
        return 0;
    get_stats(&s, sizeof(s));
    return s.nr_chunks_created + s.nr_chunks_moved + s.nr_chunks_released;
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench-replay: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

static void kernel(void *arg)
{
    unsigned us = (unsigned)(uintptr_t)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do /* busy, as a kernel keeps its SM busy: a sleep would let the stream run ahead */
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < (long)us * 1000);
}

/* Bytes held from the device now: cuheap's reserved bytes when it is loaded, else what the
 * driver says is in use. */
static uint64_t held_now(uint64_t used_at_start)
{
    if (get_stats) {
        struct cuheap_stats s;
        get_stats(&s, sizeof(s));
        return s.reserved_bytes;
    }
    size_t f, t;
    check(cu.cuMemGetInfo_v2(&f, &t), "cuMemGetInfo");
    return (uint64_t)(t - f) - used_at_start;
}

static bool device_api(unsigned api)
{
    return api == CUHEAP_API_MEM_ALLOC || api == CUHEAP_API_PITCH || api == CUHEAP_API_TORCH ||
           api == CUHEAP_API_ASYNC || api == CUHEAP_API_POOL_ASYNC;
}

static bool stream_ordered(unsigned api)
{
    return api == CUHEAP_API_ASYNC || api == CUHEAP_API_POOL_ASYNC;
}

/* One replay thread: a recorded thread's events, on its own stream. */
struct replayer {
    pthread_t thread;
    sem_t go;    /* posted when the next event is this thread's */
    CUstream s;  /* its stream: the kernels after its allocations */
    unsigned nr; /* its index */
};

/* Everything the replay shares. Only the thread whose turn it is touches it (the turns pass
 * through semaphores, which order the memory accesses). */
static struct {
    struct cuheap_trace tr;
    unsigned work_us, steps, settle, eval_every, from_step, passes, max_steps;
    bool pluggable, stray, marks; /* marks: steps end at the trace's step marks */
    const char *step_mark;
    CUcontext ctx;
    uint64_t used0;
    /* per event */
    size_t *match;       /* free -> alloc index + 1 */
    bool *freed;         /* an allocation the trace frees */
    CUdeviceptr *vals;   /* an allocation's replayed address while it lives */
    uint32_t *step_of;   /* the step an allocation falls in */
    uint16_t *owner;     /* the replay thread of an event */
    uint16_t *stream_of; /* stream-ordered events: their replay stream */
    /* threads and streams */
    struct replayer thr[NR_MAX_REPLAY_THREADS];
    unsigned nr_threads;
    CUstream streams[NR_MAX_REPLAY_STREAMS]; /* for the recorded streams */
    uint64_t stream_ids[NR_MAX_REPLAY_STREAMS];
    unsigned nr_streams;
    /* the current pass: the events it replays, in order, and the cursor */
    size_t *acts, nr_acts, cur;
    bool quit;
    sem_t done;
    /* figures */
    uint64_t live, peak_live, pass_live, pass_held, nr, per_step;
    uint64_t pass_steps, set_held, set_live, set_ops0;
    /* --eval */
    uint64_t *eval_sizes;
    size_t nr_evals, largest;
    CUdeviceptr kept;
    uint64_t kept_size, steps_done;
    /* --stray */
    uint64_t stray_seed, stray_size;
    CUdeviceptr stray_ptr;
} R = {
    .work_us = 20, .steps = 30, .settle = 8, .passes = 1, .step_mark = "step", .stray_seed = 12345};

static CUdeviceptr replay_alloc(CUstream s, uint64_t size, unsigned api, CUstream async_s)
{
    CUdeviceptr x = 0;
    if (R.pluggable) {
        x = (CUdeviceptr)(uintptr_t)torch_alloc((ssize_t)size, 0, (void *)s);
        check(x ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY, "cuheap_torch_alloc");
    } else if (stream_ordered(api)) {
        check(cu.cuMemAllocAsync(&x, size, async_s), "cuMemAllocAsync");
    } else {
        check(cu.cuMemAlloc_v2(&x, size), "cuMemAlloc");
    }
    return x;
}

static void replay_free(CUstream s, CUdeviceptr x, uint64_t size, unsigned api, CUstream async_s)
{
    if (R.pluggable)
        torch_free((void *)(uintptr_t)x, (ssize_t)size, 0, (void *)s);
    else if (stream_ordered(api))
        check(cu.cuMemFreeAsync(x, async_s), "cuMemFreeAsync");
    else
        check(cu.cuMemFree_v2(x), "cuMemFree");
}

static void add_live(uint64_t size)
{
    R.live += size;
    if (R.live > R.pass_live)
        R.pass_live = R.live;
    if (R.live > R.peak_live)
        R.peak_live = R.live;
}

static void launch(CUstream s)
{
    if (R.work_us)
        check(cu.cuLaunchHostFunc(s, kernel, (void *)(uintptr_t)R.work_us), "launch");
}

/* An evaluation (--eval): the sizes in order, each freed once the next is made (no tensors
 * saved for a backward pass), the largest kept until the next evaluation replaces it. */
static void evaluate(CUstream s)
{
    CUdeviceptr prev = 0, out = 0;
    uint64_t prev_size = 0;
    for (size_t i = 0; i < R.nr_evals; i++) {
        CUdeviceptr x = replay_alloc(s, R.eval_sizes[i], CUHEAP_API_MEM_ALLOC, s);
        add_live(R.eval_sizes[i]);
        launch(s);
        if (prev) {
            replay_free(s, prev, prev_size, CUHEAP_API_MEM_ALLOC, s);
            R.live -= prev_size;
        }
        prev = i == R.largest ? 0 : x;
        prev_size = R.eval_sizes[i];
        if (i == R.largest)
            out = x;
    }
    if (prev) {
        replay_free(s, prev, prev_size, CUHEAP_API_MEM_ALLOC, s);
        R.live -= prev_size;
    }
    if (R.kept) { /* the last evaluation's output, replaced */
        replay_free(s, R.kept, R.kept_size, CUHEAP_API_MEM_ALLOC, s);
        R.live -= R.kept_size;
    }
    R.kept = out;
    R.kept_size = R.eval_sizes[R.largest];
    check(cu.cuStreamSynchronize(s), "eval end");
}

static void sync_all(void)
{
    for (unsigned k = 0; k < R.nr_threads; k++)
        check(cu.cuStreamSynchronize(R.thr[k].s), "step end");
    for (unsigned k = 0; k < R.nr_streams; k++)
        check(cu.cuStreamSynchronize(R.streams[k]), "step end");
}

static void stray_free(CUstream s)
{
    if (R.stray_ptr) {
        replay_free(s, R.stray_ptr, R.stray_size, CUHEAP_API_MEM_ALLOC, s);
        R.stray_ptr = 0;
        R.live -= R.stray_size;
    }
}

/* A step's end: the host waits for the device, as a loss.item() does. */
static void step_end(CUstream s)
{
    stray_free(s);
    sync_all();
    if (++R.pass_steps == R.settle)
        R.set_ops0 = map_ops();
    if (R.eval_every && ++R.steps_done % R.eval_every == 0)
        evaluate(s);
}

static void act(struct replayer *w, size_t i)
{
    const struct cuheap_trace_event *e = &R.tr.events[i];
    CUstream as = stream_ordered(e->api) ? R.streams[R.stream_of[i]] : w->s;
    if (e->type == CUHEAP_EV_MARK) {
        step_end(w->s);
        return;
    }
    if (e->type == CUHEAP_EV_ALLOC) {
        R.vals[i] = replay_alloc(w->s, e->size ? e->size : 1, e->api, as);
        add_live(e->size);
        launch(w->s);
        if (R.stray && R.nr % R.per_step == R.per_step / 2) { /* half way: a new size */
            R.stray_seed = R.stray_seed * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(R.stray_seed >> 11) / 9007199254740992.0;
            R.stray_size = (uint64_t)exp(log(256.0 * 1024) + u * log(256.0));
            R.stray_ptr = replay_alloc(w->s, R.stray_size, CUHEAP_API_MEM_ALLOC, w->s);
            add_live(R.stray_size);
        }
        if (++R.nr % R.per_step == 0 && !R.marks)
            step_end(w->s);
    } else {
        size_t a = R.match[i] - 1;
        const struct cuheap_trace_event *x = &R.tr.events[a];
        replay_free(w->s, R.vals[a], x->size ? x->size : 1, x->api, as);
        R.vals[a] = 0;
        R.live -= x->size;
    }
    uint64_t held = held_now(R.used0);
    if (held > R.pass_held)
        R.pass_held = held;
    if (R.pass_steps >= R.settle) {
        R.set_held = held > R.set_held ? held : R.set_held;
        R.set_live = R.live > R.set_live ? R.live : R.set_live;
    }
}

/* Hands the turn to the owner of the next event, or back to main at the pass's end. */
static void pass_turn(void)
{
    if (R.cur < R.nr_acts)
        sem_post(&R.thr[R.owner[R.acts[R.cur]]].go);
    else
        sem_post(&R.done);
}

static void *replayer_main(void *arg)
{
    struct replayer *w = arg;
    check(cu.cuCtxSetCurrent(R.ctx), "cuCtxSetCurrent");
    check(cu.cuStreamCreate(&w->s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    sem_post(&R.done);
    for (;;) {
        while (sem_wait(&w->go))
            ;
        if (R.quit)
            return NULL;
        while (R.cur < R.nr_acts && R.owner[R.acts[R.cur]] == w->nr)
            act(w, R.acts[R.cur++]);
        pass_turn();
    }
}

static bool is_step_mark(const struct cuheap_trace_event *e)
{
    return e->type == CUHEAP_EV_MARK && e->label && !strcmp(e->label, R.step_mark);
}

/* The events pass `pass` replays: every device allocation and its free in the first; in
 * later ones those the trace frees (from --from-step on); the step marks in each. */
static void plan_pass(unsigned pass)
{
    R.nr_acts = 0;
    for (size_t i = 0; i < R.tr.nr_events; i++) {
        const struct cuheap_trace_event *e = &R.tr.events[i];
        bool take;
        if (e->type == CUHEAP_EV_ALLOC)
            take = device_api(e->api) && e->ptr &&
                   (!pass || (R.freed[i] && R.step_of[i] >= R.from_step));
        else if (e->type == CUHEAP_EV_FREE)
            take = R.match[i] &&
                   (!pass || (R.freed[R.match[i] - 1] && R.step_of[R.match[i] - 1] >= R.from_step));
        else
            take = R.marks && is_step_mark(e);
        if (take)
            R.acts[R.nr_acts++] = i;
    }
}

static unsigned index_of(uint64_t *ids, unsigned *nr, unsigned max, uint64_t id)
{
    for (unsigned k = 0; k < *nr; k++)
        if (ids[k] == id)
            return k;
    if (*nr == max)
        return max - 1; /* past the table: shares the last one */
    ids[*nr] = id;
    return (*nr)++;
}

/* Each free matched to the allocation it frees (by event index), each event to its replay
 * thread and stream, each allocation to its step. */
static void read_events(bool one_thread)
{
    size_t nr_ev = R.tr.nr_events, cap = 1, n = 0, nr_marks = 0;
    while (cap < 2 * nr_ev + 16)
        cap <<= 1;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    size_t *last_alloc = calloc(cap, sizeof(*last_alloc));
    R.match = calloc(nr_ev, sizeof(*R.match));
    R.freed = calloc(nr_ev, sizeof(*R.freed));
    R.vals = calloc(nr_ev, sizeof(*R.vals));
    R.step_of = calloc(nr_ev, sizeof(*R.step_of));
    R.owner = calloc(nr_ev, sizeof(*R.owner));
    R.stream_of = calloc(nr_ev, sizeof(*R.stream_of));
    R.acts = calloc(nr_ev + 1, sizeof(*R.acts));
    uint64_t tids[NR_MAX_REPLAY_THREADS];
    if (!keys || !last_alloc || !R.match || !R.freed || !R.vals || !R.step_of || !R.owner ||
        !R.stream_of || !R.acts) {
        fprintf(stderr, "bench-replay: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < nr_ev; i++)
        nr_marks += is_step_mark(&R.tr.events[i]);
    R.marks = nr_marks > 0;
    size_t nr_allocs = 0;
    for (size_t i = 0; i < nr_ev; i++) {
        const struct cuheap_trace_event *e = &R.tr.events[i];
        nr_allocs += e->type == CUHEAP_EV_ALLOC && device_api(e->api) && e->ptr;
    }
    if (R.marks)
        R.steps = (unsigned)nr_marks;
    R.per_step = nr_allocs / R.steps + 1;
    if (R.max_steps && R.max_steps < R.steps) { /* the trace ends at the N-th step's end */
        for (size_t i = 0, marks = 0, allocs = 0; i < nr_ev; i++) {
            const struct cuheap_trace_event *e = &R.tr.events[i];
            bool end = R.marks ? is_step_mark(e) && ++marks == R.max_steps
                               : e->type == CUHEAP_EV_ALLOC && device_api(e->api) && e->ptr &&
                                     ++allocs == R.max_steps * R.per_step;
            if (end) {
                R.tr.nr_events = nr_ev = i + 1;
                break;
            }
        }
        R.steps = R.max_steps;
    }
    for (size_t i = 0, marks = 0; i < nr_ev; i++) {
        const struct cuheap_trace_event *e = &R.tr.events[i];
        if (is_step_mark(e))
            marks++;
        bool dev = device_api(e->api) && e->ptr;
        if (!(dev && (e->type == CUHEAP_EV_ALLOC || e->type == CUHEAP_EV_FREE)) && !is_step_mark(e))
            continue;
        R.owner[i] =
            (uint16_t)(one_thread ? 0
                                  : index_of(tids, &R.nr_threads, NR_MAX_REPLAY_THREADS, e->tid));
        if (dev && stream_ordered(e->api))
            R.stream_of[i] =
                (uint16_t)index_of(R.stream_ids, &R.nr_streams, NR_MAX_REPLAY_STREAMS, e->stream);
        if (!dev)
            continue;
        size_t h = (size_t)((e->ptr * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
        while (keys[h] && keys[h] != e->ptr)
            h = (h + 1) & (cap - 1);
        if (e->type == CUHEAP_EV_ALLOC) {
            keys[h] = e->ptr;
            last_alloc[h] = i + 1;
            R.step_of[i] = (uint32_t)(R.marks ? marks : n / R.per_step);
            n++;
        } else if (keys[h] == e->ptr && last_alloc[h]) {
            R.match[i] = last_alloc[h];
            R.freed[last_alloc[h] - 1] = true;
            last_alloc[h] = 0;
        }
    }
    if (one_thread || !R.nr_threads)
        R.nr_threads = 1;
    free(keys);
    free(last_alloc);
    /* --eval: the sizes of the first half of the second step's allocations */
    size_t in_step1 = 0;
    for (size_t i = 0; i < nr_ev; i++)
        in_step1 += R.tr.events[i].type == CUHEAP_EV_ALLOC && device_api(R.tr.events[i].api) &&
                    R.tr.events[i].ptr && R.freed[i] && R.step_of[i] == 1;
    R.eval_sizes = calloc(in_step1 / 2 + 1, sizeof(*R.eval_sizes));
    for (size_t i = 0; i < nr_ev && R.eval_every && R.nr_evals < in_step1 / 2; i++) {
        const struct cuheap_trace_event *e = &R.tr.events[i];
        if (e->type != CUHEAP_EV_ALLOC || !device_api(e->api) || !e->ptr || !R.freed[i] ||
            R.step_of[i] != 1)
            continue;
        if (e->size > R.eval_sizes[R.largest])
            R.largest = R.nr_evals;
        R.eval_sizes[R.nr_evals++] = e->size ? e->size : 1;
    }
}

int main(int argc, char **argv)
{
    bool settle_given = false, one_thread = false, callgrind_warm = false;
    int a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--work-us"))
            R.work_us = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--steps"))
            R.steps = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--passes"))
            R.passes = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--from-step"))
            R.from_step = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--settle"))
            R.settle = (unsigned)atoi(argv[a + 1]), settle_given = true;
        else if (!strcmp(argv[a], "--eval"))
            R.eval_every = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--pluggable"))
            R.pluggable = atoi(argv[a + 1]) != 0;
        else if (!strcmp(argv[a], "--stray"))
            R.stray = atoi(argv[a + 1]) != 0;
        else if (!strcmp(argv[a], "--threads"))
            one_thread = atoi(argv[a + 1]) == 1;
        else if (!strcmp(argv[a], "--step-mark"))
            R.step_mark = argv[a + 1];
        else if (!strcmp(argv[a], "--max-steps"))
            R.max_steps = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--callgrind-warm"))
            callgrind_warm = atoi(argv[a + 1]) != 0;
        else
            break;
    }
    if (callgrind_warm && !HAVE_CALLGRIND) {
        fprintf(stderr,
                "bench-replay: --callgrind-warm needs valgrind/callgrind.h at build time\n");
        return 2;
    }
    if (a != argc - 1 || !R.steps || !R.passes) {
        fprintf(stderr, "usage: bench-replay [--work-us N] [--steps N] [--passes N] "
                        "[--settle N] [--from-step S] [--eval K] [--stray 1] [--pluggable 1] "
                        "[--threads 1] [--step-mark LABEL|-] [--max-steps N] "
                        "[--callgrind-warm 1] TRACE\n");
        return 2;
    }
    char err[512];
    if (cuheap_trace_read(argv[a], &R.tr, err, sizeof(err))) {
        fprintf(stderr, "bench-replay: %s\n", err);
        return 2;
    }
    read_events(one_thread);
    if (R.from_step >= R.steps || (settle_given && R.settle >= R.steps)) {
        fprintf(stderr, "bench-replay: --from-step and --settle must be under the %u steps\n",
                R.steps);
        return 2;
    }
    if (!settle_given && R.settle >= R.steps)
        R.settle = R.steps / 2;
    if (driver_api_start(&cu, 0))
        return 1;
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    *(void **)&torch_alloc = dlsym(RTLD_DEFAULT, "cuheap_torch_alloc");
    *(void **)&torch_free = dlsym(RTLD_DEFAULT, "cuheap_torch_free");
    if (R.pluggable && (!torch_alloc || !torch_free)) {
        fprintf(stderr, "bench-replay: --pluggable needs libcuheap.so preloaded\n");
        return 2;
    }
    check(cu.cuCtxGetCurrent(&R.ctx), "cuCtxGetCurrent");
    for (unsigned k = 0; k < R.nr_streams; k++)
        check(cu.cuStreamCreate(&R.streams[k], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    sem_init(&R.done, 0, 0);
    for (unsigned k = 0; k < R.nr_threads; k++) {
        R.thr[k].nr = k;
        sem_init(&R.thr[k].go, 0, 0);
        if (pthread_create(&R.thr[k].thread, NULL, replayer_main, &R.thr[k])) {
            fprintf(stderr, "bench-replay: cannot start a thread\n");
            return 1;
        }
        while (sem_wait(&R.done)) /* its stream made before the device's use is measured */
            ;
    }
    size_t f0, t0;
    check(cu.cuMemGetInfo_v2(&f0, &t0), "cuMemGetInfo");
    R.used0 = get_stats ? 0 : (uint64_t)(t0 - f0);
    const char *name = getenv("REPLAY_LABEL");
    const char *base = strrchr(argv[a], '/');
    printf("trace=%s threads=%u streams=%u steps=%u steps_from=%s\n", base ? base + 1 : argv[a],
           R.nr_threads, R.nr_threads + R.nr_streams, R.steps, R.marks ? "marks" : "even");
    fflush(stdout);
    CALLGRIND_START_INSTRUMENTATION;

    uint64_t peak_held = 0, warm_ops = 0, warm_steps = 0, settled_ops = 0, settled_steps = 0;
    uint64_t warm_nr0 = 0;
    struct cuheap_stats warm0 = {0}; /* at the first warm pass: cuheap's own time from there */
    double settled_worst = 0;
    for (unsigned pass = 0; pass < R.passes; pass++) {
        if (pass == 1 && callgrind_warm)
            CALLGRIND_ZERO_STATS;
        if (pass == 1 && get_stats) {
            get_stats(&warm0, sizeof(warm0));
            warm_nr0 = R.nr;
        }
        uint64_t ops0 = map_ops(), nr0 = R.nr;
        R.pass_held = R.pass_live = 0;
        R.pass_steps = R.set_held = R.set_live = R.set_ops0 = 0;
        plan_pass(pass);
        R.cur = 0;
        pass_turn();
        while (sem_wait(&R.done))
            ;
        stray_free(R.thr[0].s); /* taken in the pass's last, partial step */
        if (R.pass_held > peak_held)
            peak_held = R.pass_held;
        uint64_t ops = map_ops() - ops0;
        /* steps: the marks a pass went through, or --steps evenly */
        uint64_t steps = R.marks ? R.pass_steps : R.steps;
        if (pass) {
            warm_ops += ops;
            warm_steps += steps;
        }
        if (R.passes > 1) {
            printf("pass=%u peak_live=%llu peak_held=%llu held_over_live=%.3f", pass + 1,
                   (unsigned long long)R.pass_live, (unsigned long long)R.pass_held,
                   R.pass_live ? (double)R.pass_held / (double)R.pass_live : 0.0);
            if (get_stats)
                printf(" map_ops=%llu ops_per_step=%.1f", (unsigned long long)ops,
                       steps ? (double)ops / (double)steps : 0.0);
            if (pass && R.pass_steps > R.settle && R.set_live) {
                double r = (double)R.set_held / (double)R.set_live;
                uint64_t o = map_ops() - R.set_ops0;
                printf(" settled_held_over_live=%.3f", r);
                if (get_stats)
                    printf(" settled_ops_per_step=%.1f", (double)o / (R.pass_steps - R.settle));
                settled_worst = r > settled_worst ? r : settled_worst;
                settled_ops += o;
                settled_steps += R.pass_steps - R.settle;
            }
            printf(" allocs=%llu\n", (unsigned long long)(R.nr - nr0));
        }
    }
    sync_all();
    if (get_stats) { /* cuheap keeps its own peak, which sees between our samples too */
        struct cuheap_stats st;
        get_stats(&st, sizeof(st));
        peak_held = st.peak_reserved_bytes;
    }
    printf("replay=%s allocs=%llu peak_live=%llu peak_held=%llu held_over_live=%.3f",
           name ? name : (get_stats ? "cuheap" : "driver"), (unsigned long long)R.nr,
           (unsigned long long)R.peak_live, (unsigned long long)peak_held,
           R.peak_live ? (double)peak_held / (double)R.peak_live : 0.0);
    if (get_stats && R.passes > 1) {
        printf(" warm_ops_per_step=%.1f", warm_steps ? (double)warm_ops / (double)warm_steps : 0.0);
        /* cuheap's own time an allocation (its free's included) and the pool's driver calls a
         * step, by kind, over the warm passes (zeros from a cuheap without those fields) */
        struct cuheap_stats w;
        get_stats(&w, sizeof(w));
        double n = (double)(R.nr - warm_nr0), st = warm_steps ? (double)warm_steps : 1;
        printf(
            " warm_own_ns_per_alloc=%.0f warm_calls_per_step=map:%.1f,record:%.1f,query:%.1f,"
            "sync:%.1f",
            n ? (double)(w.own_alloc_ns + w.own_free_ns - warm0.own_alloc_ns - warm0.own_free_ns) /
                    n
              : 0.0,
            (double)(w.nr_map_calls - warm0.nr_map_calls) / st,
            (double)(w.nr_record_calls - warm0.nr_record_calls) / st,
            (double)(w.nr_query_calls - warm0.nr_query_calls) / st,
            (double)(w.nr_sync_calls - warm0.nr_sync_calls) / st);
    }
    if (settled_steps) {
        printf(" settled_held_over_live=%.3f", settled_worst);
        if (get_stats)
            printf(" settled_ops_per_step=%.1f", (double)settled_ops / (double)settled_steps);
    }
    printf("\n");
    R.quit = true;
    for (unsigned k = 0; k < R.nr_threads; k++) {
        sem_post(&R.thr[k].go);
        pthread_join(R.thr[k].thread, NULL);
    }
    for (size_t k = 0; k < R.tr.nr_events; k++)
        if (R.vals[k])
            replay_free(R.thr[0].s, R.vals[k], R.tr.events[k].size, R.tr.events[k].api,
                        R.nr_streams ? R.streams[R.stream_of[k]] : R.thr[0].s);
    if (R.kept)
        replay_free(R.thr[0].s, R.kept, R.kept_size, CUHEAP_API_MEM_ALLOC, R.thr[0].s);
    free(R.eval_sizes);
    free(R.match);
    free(R.freed);
    free(R.vals);
    free(R.step_of);
    free(R.owner);
    free(R.stream_of);
    free(R.acts);
    cuheap_trace_free(&R.tr);
    return 0;
}
