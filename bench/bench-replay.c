/* SPDX-License-Identifier: MIT */
/*
 * Memory held against memory used: replays the allocations and frees of a recorded job (a cuheap
 * trace, e.g. bench/sequences/gpt-seq-nocache.jsonl.gz decompressed) through cuMemAlloc/cuMemFree
 * and prints peak live bytes, peak bytes held from the device, and their ratio.
 *
 *   bench-replay [--work-us N] [--steps N] [--passes N] [--from-step S] [--eval K]
 *                [--stray 1] [--pluggable 1] TRACE
 *
 * Run it on the simulated driver alone (what the driver itself holds: the device's used bytes),
 * or with libcuheap.so preloaded (what cuheap holds: its peak reserved bytes). Like a training
 * job, the host runs ahead of the device: after every allocation a "kernel" of --work-us
 * microseconds (default 20) is queued on a non-blocking stream, and the host waits for the
 * stream only at step ends (--steps, default 30, evenly over the trace), as a loss.item() does.
 * Fence timing therefore varies from run to run: run it several times and keep the worst.
 *
 * --passes N (default 1) replays the job's steady part N-1 more times, as a long run would: the
 * allocations the trace frees again, with the blocks it never frees (the model) kept from the
 * first pass. Each pass then prints its own "pass=K peak_live=B peak_held=B held_over_live=R"
 * line, so that memory held creeping up over a long run shows; under cuheap the line goes on
 * with "map_ops=N ops_per_step=X": the chunks the vmm pool took from the driver, moved and
 * gave back during that pass (cuheap_get_stats), and that over --steps. A warm job should make
 * none: passes after the first are the warm ones.
 *
 * --settle N (default 8): in passes after the first, the figures of the pass past its first N
 * steps go on each pass line as " settled_held_over_live=R settled_ops_per_step=X", and over
 * passes 2 to N on the last line. A pass's first steps re-make the first step's state (an
 * optimizer's, freed at the trace's end), which a job does once, and the step plan, which
 * sees its step change there, is made again (up to PLAN_BAD_STEPS steps to retire, two to find
 * the period, one to measure, one to map): the settled figures are the long run's steady
 * state, the pass's own include that boundary.
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
 * (seeded, 256 KiB to 64 MiB, log-uniform: sizes the step plan watches), freed at the step's
 * end: a job whose step repeats but for one block of a new size each time (a buffer sized by
 * the batch's data).
 *
 * --pluggable 1 (under cuheap) allocates and frees through cuheap_torch_alloc/cuheap_torch_free
 * on the replay's stream, as PyTorch's CUDAPluggableAllocator does, instead of cuMemAlloc and
 * cuMemFree: blocks freed on a known stream, which may be reused on it at once.
 *
 * Output: one line, "replay=NAME allocs=N peak_live=B peak_held=B held_over_live=R", with
 * " warm_ops_per_step=X" (passes 2 to N together) under cuheap when N > 1, and the settled
 * figures (--settle) of passes 2 to N.
 */
#include <cuheap/cuheap.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DOOR_PROCADDR 1
#include "../tests/programs/driver_api.h"
#include "event.h"
#include "tracereader.h"

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

static bool pluggable; /* --pluggable: cuheap_torch_alloc/_free on the replay's stream */

static CUdeviceptr replay_alloc(CUstream s, uint64_t size)
{
    CUdeviceptr x = 0;
    if (pluggable) {
        x = (CUdeviceptr)(uintptr_t)torch_alloc((ssize_t)size, 0, (void *)s);
        check(x ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY, "cuheap_torch_alloc");
    } else {
        check(cu.cuMemAlloc_v2(&x, size), "cuMemAlloc");
    }
    return x;
}

static void replay_free(CUstream s, CUdeviceptr x, uint64_t size)
{
    if (pluggable)
        torch_free((void *)(uintptr_t)x, (ssize_t)size, 0, (void *)s);
    else
        check(cu.cuMemFree_v2(x), "cuMemFree");
}

static void add_live(uint64_t *live, uint64_t *pass_live, uint64_t *peak_live, uint64_t size)
{
    *live += size;
    if (*live > *pass_live)
        *pass_live = *live;
    if (*live > *peak_live)
        *peak_live = *live;
}

/* An evaluation (--eval): the sizes in order, each freed once the next is made (no tensors
 * saved for a backward pass), the largest kept until the next evaluation replaces it. */
static void evaluate(CUstream s, unsigned work_us, const uint64_t *sizes, size_t n, size_t largest,
                     CUdeviceptr *kept, uint64_t *kept_size, uint64_t *live, uint64_t *pass_live,
                     uint64_t *peak_live)
{
    CUdeviceptr prev = 0, out = 0;
    uint64_t prev_size = 0;
    for (size_t i = 0; i < n; i++) {
        CUdeviceptr x = replay_alloc(s, sizes[i]);
        add_live(live, pass_live, peak_live, sizes[i]);
        if (work_us)
            check(cu.cuLaunchHostFunc(s, kernel, (void *)(uintptr_t)work_us), "launch");
        if (prev) {
            replay_free(s, prev, prev_size);
            *live -= prev_size;
        }
        prev = i == largest ? 0 : x;
        prev_size = sizes[i];
        if (i == largest)
            out = x;
    }
    if (prev) {
        replay_free(s, prev, prev_size);
        *live -= prev_size;
    }
    if (*kept) { /* the last evaluation's output, replaced */
        replay_free(s, *kept, *kept_size);
        *live -= *kept_size;
    }
    *kept = out;
    *kept_size = sizes[largest];
    check(cu.cuStreamSynchronize(s), "eval end");
}

int main(int argc, char **argv)
{
    unsigned work_us = 20, steps = 30, passes = 1, eval_every = 0, from_step = 0, settle = 8;
    bool stray = false;
    uint64_t stray_seed = 12345, stray_size = 0;
    CUdeviceptr stray_ptr = 0;
    int a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--work-us"))
            work_us = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--steps"))
            steps = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--passes"))
            passes = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--from-step"))
            from_step = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--settle"))
            settle = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--eval"))
            eval_every = (unsigned)atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--pluggable"))
            pluggable = atoi(argv[a + 1]) != 0;
        else if (!strcmp(argv[a], "--stray"))
            stray = atoi(argv[a + 1]) != 0;
        else
            break;
    }
    if (a != argc - 1 || !steps || !passes || from_step >= steps || settle >= steps) {
        fprintf(stderr, "usage: bench-replay [--work-us N] [--steps N] [--passes N] "
                        "[--settle N] [--from-step S] [--eval K] [--stray 1] [--pluggable 1] "
                        "TRACE\n");
        return 2;
    }
    struct cuheap_trace tr;
    char err[512];
    if (cuheap_trace_read(argv[a], &tr, err, sizeof(err))) {
        fprintf(stderr, "bench-replay: %s\n", err);
        return 2;
    }
    if (driver_api_start(&cu, 0))
        return 1;
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    *(void **)&torch_alloc = dlsym(RTLD_DEFAULT, "cuheap_torch_alloc");
    *(void **)&torch_free = dlsym(RTLD_DEFAULT, "cuheap_torch_free");
    if (pluggable && (!torch_alloc || !torch_free)) {
        fprintf(stderr, "bench-replay: --pluggable needs libcuheap.so preloaded\n");
        return 2;
    }
    CUstream s;
    check(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    size_t f0, t0;
    check(cu.cuMemGetInfo_v2(&f0, &t0), "cuMemGetInfo");
    uint64_t used0 = get_stats ? 0 : (uint64_t)(t0 - f0);

    /* Each free matched to the allocation it frees (by event index), so that later passes can
     * replay the freed allocations again without their addresses meeting the model's. */
    size_t nr_ev = tr.nr_events, cap = 1;
    while (cap < 2 * nr_ev + 16)
        cap <<= 1;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    size_t *last_alloc = calloc(cap, sizeof(*last_alloc));
    size_t *match = calloc(nr_ev, sizeof(*match)); /* free -> alloc index + 1 */
    bool *freed = calloc(nr_ev, sizeof(*freed));
    CUdeviceptr *vals = calloc(nr_ev, sizeof(*vals));
    size_t *alloc_no = calloc(nr_ev, sizeof(*alloc_no)); /* an allocation's number in the trace */
    size_t n = 0;
    for (size_t i = 0; i < nr_ev; i++) {
        const struct cuheap_trace_event *e = &tr.events[i];
        bool device = e->api == CUHEAP_API_MEM_ALLOC || e->api == CUHEAP_API_PITCH ||
                      e->api == CUHEAP_API_TORCH;
        if (!device || !e->ptr || (e->type != CUHEAP_EV_ALLOC && e->type != CUHEAP_EV_FREE))
            continue;
        size_t h = (size_t)((e->ptr * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
        while (keys[h] && keys[h] != e->ptr)
            h = (h + 1) & (cap - 1);
        if (e->type == CUHEAP_EV_ALLOC) {
            keys[h] = e->ptr;
            last_alloc[h] = i + 1;
            alloc_no[i] = n++;
        } else if (keys[h] == e->ptr && last_alloc[h]) {
            match[i] = last_alloc[h];
            freed[last_alloc[h] - 1] = true;
            last_alloc[h] = 0;
        }
    }
    uint64_t live = 0, peak_live = 0, peak_held = 0, nr = 0, per_step = n / steps + 1;
    /* --eval: the sizes of the first half of the second step's allocations */
    size_t nr_evals = 0, largest = 0;
    uint64_t *eval_sizes = calloc(per_step / 2 + 1, sizeof(*eval_sizes));
    for (size_t i = 0, k = 0; i < nr_ev && eval_every && nr_evals < per_step / 2; i++) {
        const struct cuheap_trace_event *e = &tr.events[i];
        bool device = e->api == CUHEAP_API_MEM_ALLOC || e->api == CUHEAP_API_PITCH ||
                      e->api == CUHEAP_API_TORCH;
        if (e->type != CUHEAP_EV_ALLOC || !device || !e->ptr || !freed[i] || k++ < per_step)
            continue;
        if (e->size > eval_sizes[largest])
            largest = nr_evals;
        eval_sizes[nr_evals++] = e->size ? e->size : 1;
    }
    CUdeviceptr kept = 0;
    uint64_t kept_size = 0, steps_done = 0;
    uint64_t warm_ops = 0, settled_ops = 0, settled_steps = 0;
    double settled_worst = 0;
    for (unsigned pass = 0; pass < passes; pass++) {
        uint64_t pass_held = 0, pass_live = 0, ops0 = map_ops();
        /* past the pass's first `settle` steps: held and live at most, and the operations */
        uint64_t pass_steps = 0, set_held = 0, set_live = 0, set_ops0 = 0;
        for (size_t i = 0; i < nr_ev; i++) {
            const struct cuheap_trace_event *e = &tr.events[i];
            if (e->type == CUHEAP_EV_ALLOC) {
                bool device = e->api == CUHEAP_API_MEM_ALLOC || e->api == CUHEAP_API_PITCH ||
                              e->api == CUHEAP_API_TORCH;
                if (!device || !e->ptr ||
                    (pass && (!freed[i] || alloc_no[i] < (uint64_t)from_step * per_step)))
                    continue;
                vals[i] = replay_alloc(s, e->size ? e->size : 1);
                add_live(&live, &pass_live, &peak_live, e->size);
                if (work_us)
                    check(cu.cuLaunchHostFunc(s, kernel, (void *)(uintptr_t)work_us), "launch");
                if (stray && nr % per_step == per_step / 2) { /* half way: a new size */
                    stray_seed = stray_seed * 6364136223846793005ull + 1442695040888963407ull;
                    double u = (double)(stray_seed >> 11) / 9007199254740992.0;
                    stray_size = (uint64_t)exp(log(256.0 * 1024) + u * log(256.0));
                    stray_ptr = replay_alloc(s, stray_size);
                    add_live(&live, &pass_live, &peak_live, stray_size);
                }
                if (++nr % per_step == 0) {
                    if (stray_ptr) {
                        replay_free(s, stray_ptr, stray_size);
                        stray_ptr = 0;
                        live -= stray_size;
                    }
                    check(cu.cuStreamSynchronize(s), "step end");
                    if (++pass_steps == settle)
                        set_ops0 = map_ops();
                    if (eval_every && ++steps_done % eval_every == 0)
                        evaluate(s, work_us, eval_sizes, nr_evals, largest, &kept, &kept_size,
                                 &live, &pass_live, &peak_live);
                }
            } else if (e->type == CUHEAP_EV_FREE && match[i] && vals[match[i] - 1]) {
                const struct cuheap_trace_event *x = &tr.events[match[i] - 1];
                replay_free(s, vals[match[i] - 1], x->size ? x->size : 1);
                vals[match[i] - 1] = 0;
                live -= x->size;
            } else {
                continue;
            }
            uint64_t held = held_now(used0);
            if (held > pass_held)
                pass_held = held;
            if (pass_steps >= settle) {
                set_held = held > set_held ? held : set_held;
                set_live = live > set_live ? live : set_live;
            }
        }
        if (stray_ptr) { /* taken in the pass's last, partial step */
            replay_free(s, stray_ptr, stray_size);
            stray_ptr = 0;
            live -= stray_size;
        }
        if (pass_held > peak_held)
            peak_held = pass_held;
        uint64_t ops = map_ops() - ops0;
        if (pass)
            warm_ops += ops;
        if (passes > 1) {
            printf("pass=%u peak_live=%llu peak_held=%llu held_over_live=%.3f", pass + 1,
                   (unsigned long long)pass_live, (unsigned long long)pass_held,
                   pass_live ? (double)pass_held / (double)pass_live : 0.0);
            if (get_stats)
                printf(" map_ops=%llu ops_per_step=%.1f", (unsigned long long)ops,
                       (double)ops / steps);
            if (pass && pass_steps > settle && set_live) {
                double r = (double)set_held / (double)set_live;
                uint64_t o = map_ops() - set_ops0;
                printf(" settled_held_over_live=%.3f", r);
                if (get_stats)
                    printf(" settled_ops_per_step=%.1f", (double)o / (pass_steps - settle));
                settled_worst = r > settled_worst ? r : settled_worst;
                settled_ops += o;
                settled_steps += pass_steps - settle;
            }
            printf("\n");
        }
    }
    check(cu.cuStreamSynchronize(s), "sync");
    if (get_stats) { /* cuheap keeps its own peak, which sees between our samples too */
        struct cuheap_stats st;
        get_stats(&st, sizeof(st));
        peak_held = st.peak_reserved_bytes;
    }
    const char *name = getenv("REPLAY_LABEL");
    printf("replay=%s allocs=%zu peak_live=%llu peak_held=%llu held_over_live=%.3f",
           name ? name : (get_stats ? "cuheap" : "driver"), (size_t)nr,
           (unsigned long long)peak_live, (unsigned long long)peak_held,
           peak_live ? (double)peak_held / (double)peak_live : 0.0);
    if (get_stats && passes > 1)
        printf(" warm_ops_per_step=%.1f", (double)warm_ops / ((double)steps * (passes - 1)));
    if (settled_steps) {
        printf(" settled_held_over_live=%.3f", settled_worst);
        if (get_stats)
            printf(" settled_ops_per_step=%.1f", (double)settled_ops / (double)settled_steps);
    }
    printf("\n");
    for (size_t k = 0; k < nr_ev; k++)
        if (vals[k])
            cu.cuMemFree_v2(vals[k]);
    if (kept)
        replay_free(s, kept, kept_size);
    free(eval_sizes);
    free(keys);
    free(last_alloc);
    free(match);
    free(freed);
    free(vals);
    free(alloc_no);
    cuheap_trace_free(&tr);
    return 0;
}
