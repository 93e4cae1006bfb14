/* SPDX-License-Identifier: MIT */
/*
 * Per-thread counters for the hook path. Each thread counts into a block of its own (no shared
 * cache line, no atomic read-modify-write: a relaxed load and store of its own slot); readers
 * sum every block. Blocks are registered lock-free on a thread's first count and never freed:
 * when a thread exits its block is handed to the next new thread, which counts on top of it, so
 * no count is ever lost and the list is as long as the most threads that lived at once. A
 * thread that counts after its block was handed back (another key's destructor calling CUDA),
 * or when a block cannot be mapped, counts into one shared block with atomic adds.
 *
 * Reads are sums of relaxed loads: a count made on another thread may not be seen yet, but is
 * never lost, and everything a joined thread counted is seen. Async-signal-safe: no lock, no
 * malloc (blocks are mmap'd).
 */
#ifndef CUHEAP_COUNTERS_H
#define CUHEAP_COUNTERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define CUHEAP_NR_COUNTED_DEVICES 32 /* CUHEAP_NR_MAX_DEVICES, checked in runtime.c */
#define CUHEAP_NR_COUNTED_HOOKS   64 /* at least NR_HOOKS, checked in hooks.c */

/* The driver calls cuheap makes, by kind (cuheap_drv_start). The first CUHEAP_NR_DRV_SAMPLED
 * kinds are frequent and cheap: always counted, timed only inside a timed call. */
enum cuheap_drv_kind {
    CUHEAP_DRV_RECORD,  /* cuEventRecord: the pool's fences */
    CUHEAP_DRV_QUERY,   /* cuEventQuery, cuStreamQuery: has a fence passed, is every stream idle */
    CUHEAP_DRV_MAP,     /* memory and mapping for the pool: cuMemCreate, cuMemRelease, cuMemMap,
                         * cuMemUnmap, cuMemSetAccess, cuMemAddressReserve, cuMemAddressFree,
                         * and the legacy arenas' cuMemAlloc and cuMemFree */
    CUHEAP_DRV_SYNC,    /* cuEventSynchronize, cuCtxSynchronize: waits for the device */
    CUHEAP_DRV_OTHER,   /* cuEventCreate, cuMemGetInfo, cuMemExportToShareableHandle */
    CUHEAP_DRV_PROGRAM, /* the program's allocations and frees passed to the driver */
    CUHEAP_NR_DRV_KINDS
};
#define CUHEAP_NR_DRV_SAMPLED 2

/* Which own-time slot (CUHEAP_CTR_OWN + which). */
#define CUHEAP_OWN_ALLOC 0
#define CUHEAP_OWN_FREE  1

/* One pooled allocation (and one pooled free) in this many on each thread is timed: the clock
 * costs more than the rest of a small pair. A power of two. */
#define CUHEAP_OWN_EVERY 32

/* The slots of a block. */
enum cuheap_counter {
    CUHEAP_CTR_ALLOCS, /* allocation events (pooled and passed through) */
    CUHEAP_CTR_FREES,  /* free events */
    /* + device index: live bytes this thread changed and has not yet added to the device's
     * record (runtime.c, cuheap_account): signed, below CUHEAP_LIVE_BATCH in magnitude */
    CUHEAP_CTR_LIVE,
    /* + CUHEAP_OWN_ALLOC or CUHEAP_OWN_FREE: cuheap's own ticks in the allocation layer, the
     * driver calls timed inside left out; a pooled call timed counts CUHEAP_OWN_EVERY times */
    CUHEAP_CTR_OWN = CUHEAP_CTR_LIVE + CUHEAP_NR_COUNTED_DEVICES,
    CUHEAP_CTR_OWN_TIMED = CUHEAP_CTR_OWN + 2, /* calls timed for CUHEAP_CTR_OWN */
    CUHEAP_CTR_DRV_CALLS,                      /* + driver call kind: calls made */
    CUHEAP_CTR_DRV_TIMED = CUHEAP_CTR_DRV_CALLS + CUHEAP_NR_DRV_KINDS, /* + kind: calls timed */
    CUHEAP_CTR_DRV_TICKS = CUHEAP_CTR_DRV_TIMED + CUHEAP_NR_DRV_KINDS, /* + kind: their ticks */
    CUHEAP_CTR_DRV_ALL = CUHEAP_CTR_DRV_TICKS + CUHEAP_NR_DRV_KINDS,   /* ticks of every kind */
    CUHEAP_CTR_CALLS,                                                  /* + hook id: calls */
    CUHEAP_NR_COUNTERS = CUHEAP_CTR_CALLS + CUHEAP_NR_COUNTED_HOOKS,
};

struct cuheap_counters {
    _Atomic int64_t v[CUHEAP_NR_COUNTERS]; /* written by the owning thread only (but the
                                            * shared block: atomic adds) */
    struct cuheap_counters *next;          /* the registry; set before the block is published */
    atomic_bool owned;                     /* a live thread counts here */
};

/* The calling thread's block, NULL until its first count or once it was handed back. */
extern __thread struct cuheap_counters *cuheap_counters_self
    __attribute__((tls_model("initial-exec")));

/* Register the calling thread (takes a handed-back block or maps one). Returns its block, or
 * NULL when the thread must count into the shared block (exiting, or no memory). */
struct cuheap_counters *cuheap_counters_register(void);

/* The calling thread's own block, registering it on first use; NULL as above. */
static inline struct cuheap_counters *cuheap_counters_mine(void)
{
    struct cuheap_counters *c = cuheap_counters_self;
    return __builtin_expect(c != NULL, 1) ? c : cuheap_counters_register();
}

/* Add n to slot i of a thread's own block: no read-modify-write. */
static inline void cuheap_counters_add_own(struct cuheap_counters *c, unsigned i, int64_t n)
{
    atomic_store_explicit(&c->v[i], atomic_load_explicit(&c->v[i], memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Add n to slot i for the calling thread when it cannot have a block: the shared one. */
void cuheap_counters_add_shared(unsigned i, int64_t n);

/* Add n to slot i for the thread whose counters c are (cuheap_counters_mine(), maybe NULL). */
static inline void cuheap_count_in(struct cuheap_counters *c, unsigned i, int64_t n)
{
    if (__builtin_expect(c != NULL, 1))
        cuheap_counters_add_own(c, i, n);
    else
        cuheap_counters_add_shared(i, n);
}

/* Add n to slot i for the calling thread. */
static inline void cuheap_count(unsigned i, int64_t n)
{
    cuheap_count_in(cuheap_counters_mine(), i, n);
}

/* Slot i summed over every block, live or handed back. */
int64_t cuheap_counters_sum(unsigned i);

/* How many blocks there are: at most as many threads can hold counts back at once. */
unsigned cuheap_counters_nr_blocks(void);

/* In a forked child (one thread left): zero slots [first, first + n) in every block and hand
 * back every block but the calling thread's (their threads do not exist in the child). */
void cuheap_counters_atfork_child(unsigned first, unsigned n);

/* ---- cuheap's own time ----
 *
 * Ticks are the CPU's time-stamp counter where it has one (a few nanoseconds to read, no
 * system call), converted to nanoseconds only when read (cuheap_ticks_ns). A thread's own
 * time in the allocation layer is its calls' ticks less the ticks of the driver calls timed
 * inside them. Driver calls are counted by kind (enum cuheap_drv_kind) on the thread that
 * makes them. */

static inline uint64_t cuheap_ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

/* Take the clock's first reading, which cuheap_ticks_ns() measures the ticks' rate from (at
 * start-up; once, later calls do nothing). */
void cuheap_clock_start(void);

/* Ticks in nanoseconds. The rate is measured from cuheap_clock_start() to now: a read within a
 * millisecond of it waits for the millisecond to pass. */
uint64_t cuheap_ticks_ns(int64_t ticks);

/* Set while the calling thread times a call of the allocation layer: every driver call inside
 * is timed, so that it can be taken off. */
extern __thread bool cuheap_own_timing __attribute__((tls_model("initial-exec")));

/* A driver call of this kind is about to be made: its start in ticks when it is to be timed
 * (record and query only inside a timed call, the rest always), else 0. */
static inline uint64_t cuheap_drv_start(unsigned kind)
{
    return kind >= CUHEAP_NR_DRV_SAMPLED || cuheap_own_timing ? cuheap_ticks() : 0;
}

/* The driver call cuheap_drv_start() gave t0 for returned: counted, and timed unless t0 is 0. */
static inline void cuheap_drv_done(unsigned kind, uint64_t t0)
{
    struct cuheap_counters *c = cuheap_counters_mine();
    cuheap_count_in(c, CUHEAP_CTR_DRV_CALLS + kind, 1);
    if (t0) {
        int64_t d = (int64_t)(cuheap_ticks() - t0);
        cuheap_count_in(c, CUHEAP_CTR_DRV_TIMED + kind, 1);
        cuheap_count_in(c, CUHEAP_CTR_DRV_TICKS + kind, d > 0 ? d : 0);
        cuheap_count_in(c, CUHEAP_CTR_DRV_ALL, d > 0 ? d : 0);
    }
}

/* A call of the allocation layer being timed: from cuheap_own_begin() to cuheap_own_end(). */
struct cuheap_own_span {
    uint64_t t0;  /* ticks at the start */
    int64_t drv0; /* the thread's ticks in driver calls at the start */
    bool was;     /* cuheap_own_timing before */
};

/* The ticks this thread's block holds for driver calls. */
static inline int64_t cuheap_drv_ticks_in(struct cuheap_counters *c)
{
    return atomic_load_explicit(&c->v[CUHEAP_CTR_DRV_ALL], memory_order_relaxed);
}

/* Start timing a call on the thread whose block c is (not NULL). */
static inline void cuheap_own_begin(struct cuheap_counters *c, struct cuheap_own_span *s)
{
    s->was = cuheap_own_timing;
    cuheap_own_timing = true;
    s->drv0 = cuheap_drv_ticks_in(c);
    s->t0 = cuheap_ticks();
}

/* A timed call longer than this many ticks (about 100 us, far longer than the pool's slowest
 * work without a driver call) counts for itself alone whatever its weight: the OS took the CPU
 * away meanwhile, or the pool set something up once or waited for another thread, and the
 * calls it stood for paid none of that. */
#define CUHEAP_OWN_LONG_TICKS (1ll << 18)

/* The timed call ends: its ticks less its driver calls', times `weight` (the calls it stands
 * for), go to own-time slot `which` (CUHEAP_OWN_ALLOC or CUHEAP_OWN_FREE). */
static inline void cuheap_own_end(struct cuheap_counters *c, struct cuheap_own_span *s,
                                  unsigned which, int64_t weight)
{
    int64_t own = (int64_t)(cuheap_ticks() - s->t0) - (cuheap_drv_ticks_in(c) - s->drv0);
    cuheap_own_timing = s->was;
    if (own > CUHEAP_OWN_LONG_TICKS)
        weight = 1;
    cuheap_counters_add_own(c, CUHEAP_CTR_OWN + which, own > 0 ? own * weight : 0);
    cuheap_counters_add_own(c, CUHEAP_CTR_OWN_TIMED, 1);
}

#endif
