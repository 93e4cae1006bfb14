/* SPDX-License-Identifier: MIT */
/*
 * The pool's thread caches: their structs and the inline fast path a thread runs without the
 * pool's lock (tc_alloc, tc_free, a kept large block's checks); the slow paths are in tcache.c
 * and timeline.c. Private to src/pool/ as internal.h is, on which it builds: the parts that
 * touch a cache include it.
 *
 * Lock rule: a cache is its owner's, entered with tc_enter; only a drainer, holding p->lock,
 * touches another thread's, after tc_hold_all (tcache.c).
 */
#ifndef CUHEAP_POOL_TCACHE_H
#define CUHEAP_POOL_TCACHE_H

#include "internal.h"

#pragma GCC visibility push(hidden)

#define TC_NR_ORDERS 18 /* orders a thread cache may keep: up to 128 KiB (see tc_max_order) */

/* A thread's small blocks go round its own cache: freed into a batch, the batch closed behind
 * one fence of the thread's own, back to ready once the fence has passed. Every close takes the
 * pool's lock and asks the driver to record an event, so a batch is large in count (the fewer
 * frees a batch, the dearer contending threads' pairs), and an order's ready blocks may number
 * two batches (TC_PER_ORDER), so that a closed batch's fence has a batch's time to pass before
 * the thread needs its blocks (in bytes they are bounded by tc_share_locked). In bytes a batch
 * is small (a sixteenth of CUHEAP_THREAD_CACHE, in tc_free): what waits in it is memory the pool
 * holds for nobody. */
#define TC_PER_ORDER  2048 /* ready blocks of one order at most (tc_caps) */
#define TC_BATCH      1024 /* frees behind one fence of the thread's own */
#define TC_NR_CLOSED  2    /* batches of a thread waiting for their fence */
#define TC_NR_BATCHES 4    /* the closed ones and the open one, in a ring of a power of two */
#define TC_REFILL     16   /* ready blocks taken at once from the pool */
#define TC_IDS        256
#define TC_SLOTS      4 /* pools (devices) a thread keeps a cache for */
/* A batch closes once its bytes reach CUHEAP_THREAD_CACHE over this (tc_free). */
#define TC_BATCH_PART 16
/* What all threads' ready blocks may hold together: a hundred-and-twenty-eighth of the live
 * bytes (tc_share_locked). */
#define TC_LIVE_SHARE 128

struct tc_block {
    uint64_t ptr;
    struct cuheap_arena *arena;
};

/* Blocks a thread freed, behind one fence once closed. A block's order rides in the low bits
 * of its address (blocks are at least 256-byte aligned). */
struct tc_batch {
    void *fence; /* closed batches: from backend->fence_record */
    bool passed; /* its fence has passed (blocks may have become ready already) */
    uint32_t nr;
    uint64_t bytes;
    struct tc_block blocks[TC_BATCH];
};

struct cuheap_tcache {
    /* whole cache lines: no other thread's data shares them */
    _Alignas(64) _Atomic int busy; /* the owner is inside (tc_enter) */
    _Atomic int held;              /* a drainer has it or wants it (tc_hold_all, under p->lock) */
    struct cuheap_pool *pool;
    uint64_t gen;               /* pool->gen when made: a pool set up again is another pool */
    struct cuheap_tcache *next; /* on pool->tcaches (p->lock) */
    struct tc_block ready[TC_NR_ORDERS][TC_PER_ORDER]; /* fence passed, memory held */
    uint16_t nr_ready[TC_NR_ORDERS];
    uint64_t ready_bytes;
    uint64_t ready_cap; /* ready bytes at most: the thread's share (tc_share_locked) */
    /* a ring: [closed_head, closed_tail) closed, oldest first, then the open one (tc_open):
     * a close only moves closed_tail on, where copying the 16 KiB batch was a large part of a
     * small pair */
    struct tc_batch batch[TC_NR_BATCHES];
    unsigned closed_head, closed_tail;
    int64_t live, live_blocks; /* not yet folded into pool->st */
    uint64_t nr_hits;
    uint64_t next_id, end_id; /* buffer ids this thread may hand out */
    /* One large block (above tc_max_order) the thread freed, kept only while the thread keeps
     * finding the pool's lock taken (large_on, pool_lock_noting): reusable once a fence of the
     * pool's timeline numbered above its ticket has passed */
    struct tc_block large; /* the order in the low bits; ptr 0: none */
    uint64_t large_ticket;
    bool large_on;
    uint8_t nr_locks, nr_contended; /* the owner's pool-lock takings, and those that waited */
    uint64_t nr_fences, fence_ns;   /* the large block's, not yet folded into pool->st */
};

_Static_assert(TC_NR_CLOSED < TC_NR_BATCHES && !(TC_NR_BATCHES & (TC_NR_BATCHES - 1)),
               "room for the open batch; a ring index by mask");

/* Batch c of the ring; the open batch is the one at closed_tail. */
static inline struct tc_batch *tc_batch_at(struct cuheap_tcache *tc, unsigned c)
{
    return &tc->batch[c % TC_NR_BATCHES];
}

static inline struct tc_batch *tc_open(struct cuheap_tcache *tc)
{
    return tc_batch_at(tc, tc->closed_tail);
}

/* tcache.c: this thread's caches, one per pool it uses; membarrier registered */
extern __thread struct cuheap_tcache *tc_slot[TC_SLOTS] __attribute__((tls_model("initial-exec")));
extern atomic_bool tc_asym;
extern const uint16_t tc_caps[TC_NR_ORDERS];

static inline __attribute__((always_inline)) void tc_enter(struct cuheap_tcache *tc)
{
    for (;;) {
        atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
        if (__builtin_expect(atomic_load_explicit(&tc_asym, memory_order_relaxed), 1))
            atomic_signal_fence(memory_order_seq_cst); /* the store stays before the load */
        else
            atomic_thread_fence(memory_order_seq_cst);
        if (__builtin_expect(!atomic_load_explicit(&tc->held, memory_order_acquire), 1))
            return;
        atomic_store_explicit(&tc->busy, 0, memory_order_release);
        while (atomic_load_explicit(&tc->held, memory_order_acquire))
            sched_yield(); /* a drainer has it */
    }
}

static inline __attribute__((always_inline)) void tc_leave(struct cuheap_tcache *tc)
{
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
}

static inline __attribute__((always_inline)) struct cuheap_tcache *
tc_find(const struct cuheap_pool *p)
{
    struct cuheap_tcache *last = tc_slot[0]; /* a thread mostly uses one device */
    if (last && last->pool == p && last->gen == p->gen)
        return last;
    for (unsigned i = 1; i < TC_SLOTS; i++)
        if (tc_slot[i] && tc_slot[i]->pool == p && tc_slot[i]->gen == p->gen)
            return tc_slot[i];
    return NULL;
}

static inline uint64_t tc_ptr(const struct tc_block *b)
{
    return b->ptr & ~(uint64_t)0xff;
}

static inline unsigned tc_order(const struct tc_block *b)
{
    return (unsigned)(b->ptr & 0xff);
}

/* Whether a thread's kept large block b can serve a request of size bytes and this order that
 * is not stream-ordered: the same order, and under vmm its granules mapped that far. */
static inline bool tc_large_serves(const struct cuheap_pool *p, const struct tc_block *b,
                                   uint64_t size, unsigned order)
{
    return b->ptr && tc_order(b) == order && pow2_block(p, size) &&
           (!p->vmm || b->arena->extent[unit_of(b->arena, tc_ptr(b))] >= size);
}

/* Whether a block freed with this ticket (tl_ticket) may be used again: a fence whose recording
 * began after its free has passed. */
static inline bool tl_passed(struct cuheap_timeline *tl, uint64_t ticket)
{
    return atomic_load_explicit(&tl->passed, memory_order_acquire) > ticket;
}

/* Ready blocks of one order a cache keeps at most: TC_PER_ORDER of the smallest, whose batches
 * close by count, then half as many an order up to 512 KiB of them, and no more than 64 (as
 * many as a batch of them when batches were 64) from 8 KiB on: a large count of larger blocks
 * keeps memory from every other size. */
#define TC_CAP(o) ((o) <= 10 ? TC_PER_ORDER : (o) == 11 ? 256 : (o) == 12 ? 128 : 64)

/* Put a block into the cache's ready lists if there is room (inside the cache: tc_enter). */
static inline bool tc_keep_ready(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t ptr,
                                 struct cuheap_arena *a, unsigned order)
{
    if (order > p->tc_max_order || tc->nr_ready[order] >= tc_caps[order] ||
        tc->ready_bytes + (1ull << order) > tc->ready_cap)
        return false;
    tc->ready[order][tc->nr_ready[order]++] = (struct tc_block){ptr, a};
    tc->ready_bytes += 1ull << order;
    return true;
}

/* Hand out a block the thread's cache took (inside it, tc_enter): its size and buffer id set,
 * the thread's counts, the event's sequence number; leaves the cache. Returns 0. */
static inline __attribute__((always_inline)) int
tc_hand_out(struct cuheap_pool *p, struct cuheap_tcache *tc, struct cuheap_arena *a, uint64_t ptr,
            uint64_t size, unsigned order, uint64_t *ret_ptr, uint64_t *ret_block,
            uint64_t *ret_seq)
{
    uint32_t u = unit_of(a, ptr);
    if (tc->next_id == tc->end_id) {
        tc->next_id = buffer_id_prefix(p) | next_buffer_ids(p, TC_IDS);
        tc->end_id = tc->next_id + TC_IDS;
    }
    __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELAXED);
    __atomic_store_n(&a->buffer_id[u], tc->next_id++, __ATOMIC_RELAXED);
    tc->live += (int64_t)size;
    tc->live_blocks += (int64_t)(1ull << order);
    tc->nr_hits++;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    tc_leave(tc);
    *ret_ptr = ptr;
    *ret_block = 1ull << order;
    return 0;
}

/* The fast allocation: a ready block of order (that of size, at most tc_max_order) from the
 * thread's own cache. Returns 0, or -EAGAIN for the pool's path. */
static inline __attribute__((always_inline)) int tc_alloc(struct cuheap_pool *p,
                                                          struct cuheap_tcache *tc, uint64_t size,
                                                          unsigned order, uint64_t *ret_ptr,
                                                          uint64_t *ret_block, uint64_t *ret_seq)
{
    tc_enter(tc);
    uint16_t nr = tc->nr_ready[order];
    if (!nr) {
        tc_leave(tc);
        return -EAGAIN;
    }
    struct tc_block b = tc->ready[order][nr - 1];
    uint32_t u = unit_of(b.arena, b.ptr);
    if (p->vmm && b.arena->extent[u] < size) {
        tc_leave(tc); /* its memory is held for a smaller request: the pool maps the rest */
        return -EAGAIN;
    }
    tc->nr_ready[order] = nr - 1;
    tc->ready_bytes -= 1ull << order;
    return tc_hand_out(p, tc, b.arena, b.ptr, size, order, ret_ptr, ret_block, ret_seq);
}

/* The fast free: the block joins the thread's open batch (or, under CUHEAP_REUSE=immediate,
 * its ready blocks). Returns 0, or -EAGAIN for the pool's path (which also answers double
 * frees). */
static inline __attribute__((always_inline)) int
tc_free(struct cuheap_pool *p, struct cuheap_tcache *tc, struct cuheap_arena *a, uint64_t ptr,
        uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    if (!a || a->pool != p || ((ptr - a->buddy.base) & ((1ull << a->buddy.min_order) - 1)))
        return -EAGAIN;
    uint32_t u = unit_of(a, ptr);
    if (u >= a->buddy.nr_units) /* retired since the lookup: its size went to 0 */
        return -EAGAIN;
    uint64_t asked = size_at(a, u); /* a block's order is that of the size it was asked for */
    if (!asked || order_of_size(p, asked) > p->tc_max_order)
        return -EAGAIN;
    /* Whoever clears the size frees the block: a double free racing on two threads frees once.
     * Cleared inside the cache, with the live count: a check sees both or neither. */
    tc_enter(tc);
    uint64_t size = __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    unsigned order = order_of_size(p, size); /* a block's order is its request's */
    if (!size || (order > p->tc_max_order && !pow2_block(p, size))) {
        /* a double free, or its arena died with its context meanwhile; or a racing double free
         * of the address reused meanwhile by a block kept by no order (first fit): its size
         * goes back for the pool's path, which knows the block's bytes */
        if (size)
            __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELEASE);
        tc_leave(tc);
        return -EAGAIN;
    }
    uint64_t block = 1ull << order;
    tc->live -= (int64_t)size;
    tc->live_blocks -= (int64_t)block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    bool full = false;
    if (p->cfg->reuse != CUHEAP_REUSE_IMMEDIATE || (p->vmm && a->extent[u] < size) ||
        !tc_keep_ready(p, tc, ptr, a, order)) {
        struct tc_batch *o = tc_open(tc);
        o->blocks[o->nr++] = (struct tc_block){ptr | order, a};
        o->bytes += block;
        /* a sixteenth of the cache's bytes at most (1 MiB by default): batches of more bytes
         * made the pool hold more memory for the same live bytes */
        full = o->nr == TC_BATCH || o->bytes >= p->tc_bytes / TC_BATCH_PART;
    }
    tc_leave(tc);
    *ret_size = size;
    *ret_block = block;
    if (full)
        tc_close(p, tc);
    return 0;
}

#pragma GCC visibility pop

#endif
