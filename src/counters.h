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

#define CUHEAP_NR_COUNTED_DEVICES 32 /* CUHEAP_NR_MAX_DEVICES, checked in runtime.c */
#define CUHEAP_NR_COUNTED_HOOKS   64 /* at least NR_HOOKS, checked in hooks.c */

/* The slots of a block. */
enum cuheap_counter {
    CUHEAP_CTR_ALLOCS, /* allocation events (pooled and passed through) */
    CUHEAP_CTR_FREES,  /* free events */
    /* + device index: live bytes this thread changed and has not yet added to the device's
     * record (runtime.c, cuheap_account): signed, below CUHEAP_LIVE_BATCH in magnitude */
    CUHEAP_CTR_LIVE,
    CUHEAP_CTR_CALLS = CUHEAP_CTR_LIVE + CUHEAP_NR_COUNTED_DEVICES, /* + hook id: calls */
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

#endif
