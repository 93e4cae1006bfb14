/* SPDX-License-Identifier: MIT */
/*
 * Thread caches (CUHEAP_THREAD_CACHE): each thread keeps, per pool, ready blocks of the small
 * orders and the blocks it freed since it last closed a batch behind a fence of its own. The
 * fast path (tc_alloc, tc_free) is inline in internal.h; here are the slow parts: closing and
 * reaping batches, refills, drains, and a thread's end.
 *
 * Lock rule: a cache is its owner's; a drainer holds p->lock and the cache (tc_hold_all).
 * Order: p->lock, then a cache; a thread never takes p->lock inside its own cache.
 */
#include "tcache.h"

#include <stdlib.h>
#include <unistd.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* The open batch, emptied (a slot that held a closed batch before). */
static void tc_open_reset(struct cuheap_tcache *tc)
{
    struct tc_batch *o = tc_open(tc);
    o->fence = NULL;
    o->passed = false;
    o->nr = 0;
    o->bytes = 0;
}

__thread struct cuheap_tcache *tc_slot[TC_SLOTS] __attribute__((tls_model("initial-exec")));
static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

/* A cache is its owner's but for drainers (trim, out of memory, stats, checks, a thread's
 * end), which are rare and hold p->lock. So the owner enters and leaves without an atomic
 * read-modify-write (an exchange is a full barrier, and the two a pair made were a large share
 * of contending threads' time): it marks itself busy with a plain store and looks for a
 * drainer; a drainer marks the cache held, makes every running thread of the process pass a
 * full memory barrier (membarrier(2)), then waits for the owner to leave. Either the owner
 * sees the drainer or the drainer sees the owner busy: the barrier puts the owner's store
 * before its load. Where membarrier is not to be had, the owner pays a fence instead. */
atomic_bool tc_asym; /* membarrier's private expedited command registered */

static void tc_asym_register(void)
{
    atomic_store(&tc_asym,
                 syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0);
}

static pthread_once_t tc_asym_once = PTHREAD_ONCE_INIT;

void tc_setup_once(void)
{
    pthread_once(&tc_asym_once, tc_asym_register);
}

/* In a child after fork: whether the registration crossed the fork or not, the child's own (the
 * only thread is this one, inside no cache). */
void tc_atfork_child(void)
{
    if (atomic_load(&tc_asym))
        tc_asym_register();
}

/* The drainer's half of the barrier (after marking caches held, before reading busy). */
static void tc_barrier(void)
{
    if (!atomic_load_explicit(&tc_asym, memory_order_relaxed)) {
        atomic_thread_fence(memory_order_seq_cst); /* owners fence too */
        return;
    }
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
        return;
    /* Refused (a registration that did not carry over): from now on owners fence, and the
     * slow global command (every CPU, no registration) covers those that entered without. */
    atomic_store(&tc_asym, false);
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
        /* no barrier at all: wait out a scheduling round (a context switch is one) */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* A drainer takes the caches (p->lock held, which serializes drainers): marks each held, one
 * barrier for all, then waits for each owner to leave. */
static void tc_wait_out(struct cuheap_tcache *tc)
{
    while (atomic_load_explicit(&tc->busy, memory_order_acquire))
        sched_yield();
}

void tc_hold_all(struct cuheap_pool *p)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        atomic_store_explicit(&tc->held, 1, memory_order_seq_cst);
    tc_barrier();
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_wait_out(tc);
}

void tc_unhold_all(struct cuheap_pool *p)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        atomic_store_explicit(&tc->held, 0, memory_order_release);
}

void tc_fold_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    p->st.live += (uint64_t)tc->live;
    p->st.live_blocks += (uint64_t)tc->live_blocks;
    p->st.nr_hits += tc->nr_hits;
    p->st.nr_fences += tc->nr_fences;
    p->st.fence_ns += tc->fence_ns;
    tc->live = tc->live_blocks = 0;
    tc->nr_hits = tc->nr_fences = tc->fence_ns = 0;
}

/* Freed blocks handed to the pool (p->lock held): behind its open epoch, or straight back
 * when their fence has passed or CUHEAP_REUSE=immediate needs none. The open epoch is not
 * closed here: closing may wait for a fence with p->lock dropped, and a drain walking
 * p->tcaches must keep it (a thread that ends frees its cache under it); the caller closes. */
static void tc_give_freed_locked(struct cuheap_pool *p, const struct tc_batch *b, bool passed)
{
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block *k = &b->blocks[i];
        if (passed || p->cfg->reuse == CUHEAP_REUSE_IMMEDIATE)
            return_block_locked(p, k->arena, tc_ptr(k));
        else
            pend_nowait_locked(p, k->arena, tc_ptr(k), 1ull << tc_order(k));
    }
    if (b->fence)
        dev_fence_destroy(p, b->fence);
}

/* The cache's large block to the pool (the caller holds the cache, or is its owner, with
 * p->lock): straight back when its fence has passed, else behind the pool's open epoch.
 * Returns how many blocks moved. */
static unsigned tc_large_give_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    if (!tc->large.ptr)
        return 0;
    uint64_t ptr = tc_ptr(&tc->large);
    struct cuheap_arena *a = tc->large.arena;
    if (tl_passed(&p->tl, tc->large_ticket))
        return_block_locked(p, a, ptr);
    else /* the pool's next fence is recorded after the free, as the timeline's would be */
        pend_nowait_locked(p, a, ptr, 1ull << tc_order(&tc->large));
    tc->large = (struct tc_block){0, NULL};
    return 1;
}

/* Take everything out of a cache the caller holds (tc_hold_all, or one off every list: p->lock
 * held): freed blocks go to the pool (behind its fence unless theirs has passed), and with
 * !freed_only ready blocks are merged back too (a drain is for others to find room). Returns how
 * many blocks moved. */
static unsigned tc_drain_held_locked(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                     bool freed_only)
{
    unsigned n = 0;
    tc_fold_locked(p, tc);
    for (; tc->closed_head != tc->closed_tail; tc->closed_head++) {
        struct tc_batch *b = tc_batch_at(tc, tc->closed_head);
        tc_give_freed_locked(p, b, b->fence && (b->passed || fence_passed(p, b->fence) > 0));
        n += b->nr;
    }
    struct tc_batch *open = tc_open(tc);
    if (open->nr) {
        tc_give_freed_locked(p, open, false);
        n += open->nr;
        tc_open_reset(tc);
    }
    n += tc_large_give_locked(p, tc);
    for (unsigned o = 0; !freed_only && o < TC_NR_ORDERS; o++) {
        for (unsigned i = 0; i < tc->nr_ready[o]; i++) {
            const struct tc_block *k = &tc->ready[o][i];
            if (p->vmm)
                unuse_granules_locked(p, k->arena, k->ptr);
            merge_block_locked(p, k->arena, k->ptr);
        }
        n += tc->nr_ready[o];
        tc->ready_bytes -= (uint64_t)tc->nr_ready[o] << o;
        tc->nr_ready[o] = 0;
    }
    return n;
}

/* Every thread's cache drained (out of memory, trim): one barrier for all of them. Returns
 * how many blocks moved. */
unsigned tc_drain_all_locked(struct cuheap_pool *p, bool freed_only)
{
    unsigned n = 0;
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        n += tc_drain_held_locked(p, tc, freed_only);
    tc_unhold_all(p);
    return n;
}

void tc_drain_mine_locked(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_drain_held_locked(p, tc, false);
}

/* A thread ends: its caches go back to their pools. */
static void tc_thread_exit(void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < TC_SLOTS; i++) {
        struct cuheap_tcache *tc = tc_slot[i];
        if (!tc)
            continue;
        struct cuheap_pool *p = tc->pool;
        pool_lock(p);
        bool listed = false;
        for (struct cuheap_tcache **pp = &p->tcaches; *pp; pp = &(*pp)->next)
            if (*pp == tc) {
                *pp = tc->next;
                p->nr_tcaches--;
                listed = true;
                break;
            }
        if (listed) { /* else the pool was set up again: what the cache held went with it */
            /* off the list under p->lock, its owner this thread, outside it: no drainer can
             * reach it, so no hold (and no membarrier a thread's end) */
            tc_drain_held_locked(p, tc, false);
            close_if_due_locked(p);
        }
        pool_unlock(p);
        tc_slot[i] = NULL;
        munmap(tc, sizeof(*tc));
    }
}

static bool tc_key_ok;

static void tc_make_key(void)
{
    tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0;
    if (!tc_key_ok)
        cuheap_log("thread caches: no thread key; a thread's cache is kept after it ends");
}

/* Ready bytes one thread's cache may keep: its share of a hundred-and-twenty-eighth of the
 * pool's live bytes, at least one batch's bytes (so a batch whose fence passed comes back to
 * the thread whole, as far as each order's cap allows, and pairs of one size seldom take the
 * pool's lock) and at most CUHEAP_THREAD_CACHE. Ready blocks are memory the pool holds for one
 * thread and no other size, scattered over granules that they keep mapped, so what all
 * threads keep together follows what the job uses, not how many threads it has: threads on
 * streams of their own that each kept their whole CUHEAP_THREAD_CACHE of small blocks, or a
 * larger share of the live bytes, made the pool hold measurably more than without caches
 * (bench/RESULTS.md). Taken again at each refill. */
uint64_t tc_share_locked(const struct cuheap_pool *p)
{
    uint64_t n = p->nr_tcaches ? p->nr_tcaches : 1, share = p->st.live / (TC_LIVE_SHARE * n),
             floor = p->tc_bytes / TC_BATCH_PART;
    if (share < floor)
        share = floor;
    return share < p->tc_bytes ? share : p->tc_bytes;
}

/* The calling thread's cache of p, made on first use (p->lock held); NULL when caches are off,
 * the thread has caches for TC_SLOTS other pools already, or memory is short. */
struct cuheap_tcache *tc_get_locked(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc || !p->tc_bytes)
        return tc;
    for (unsigned i = 0; i < TC_SLOTS; i++) {
        if (tc_slot[i] && tc_slot[i]->pool == p) {
            memset(tc_slot[i], 0, sizeof(*tc)); /* left from before p was set up again */
            tc = tc_slot[i];
        } else if (!tc_slot[i]) {
            /* zeroed pages of its own (about 660 KB of address space, resident only for the
             * orders the thread uses: 32 KiB for each of the two smallest) */
            void *m =
                mmap(NULL, sizeof(*tc), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                return NULL;
            tc = m;
        } else {
            continue;
        }
        pthread_once(&tc_key_once, tc_make_key);
        if (tc_key_ok)
            pthread_setspecific(tc_key, tc_slot); /* any non-NULL value: the destructor runs */
        tc->pool = p;
        tc->gen = p->gen;
        tc->next = p->tcaches;
        p->tcaches = tc;
        p->nr_tcaches++;
        tc->ready_cap = tc_share_locked(p);
        tc_slot[i] = tc;
        return tc;
    }
    return NULL;
}

const uint16_t tc_caps[TC_NR_ORDERS] = {
    TC_CAP(0),  TC_CAP(1),  TC_CAP(2),  TC_CAP(3),  TC_CAP(4),  TC_CAP(5),
    TC_CAP(6),  TC_CAP(7),  TC_CAP(8),  TC_CAP(9),  TC_CAP(10), TC_CAP(11),
    TC_CAP(12), TC_CAP(13), TC_CAP(14), TC_CAP(15), TC_CAP(16), TC_CAP(17),
};
_Static_assert(TC_NR_ORDERS == 18, "one cap per order");

/* The oldest closed batch, if its fence has passed, becomes ready blocks; those that do not fit
 * go back to the pool (p->lock held, outside the cache). Returns whether one did. */
bool tc_reap_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    tc_enter(tc);
    if (tc->closed_head == tc->closed_tail) {
        tc_leave(tc);
        return false;
    }
    struct tc_batch *b = tc_batch_at(tc, tc->closed_head);
    /* no query while a stream captures: the driver may refuse it, which is no answer */
    if (!b->passed && (p->nr_capturing || fence_passed(p, b->fence) <= 0)) {
        tc_leave(tc);
        return false;
    }
    /* what does not fit goes to the pool from the batch itself (no copy on the stack: a batch
     * is 16 KiB, on the free path); p->lock keeps drainers out meanwhile */
    uint32_t spill = 0;
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block k = b->blocks[i];
        if (!tc_keep_ready(p, tc, tc_ptr(&k), k.arena, tc_order(&k)))
            b->blocks[spill++] = k;
    }
    b->nr = spill;
    tc_give_freed_locked(p, b, true); /* and the fence goes back */
    tc->closed_head++;
    tc_leave(tc);
    return true;
}

/* Without p->lock: closed batches whose fence has passed give this thread's cache what fits
 * (asking the driver about a fence the thread owns needs no pool lock, and 16 threads each
 * holding it for that serialized on it). What does not fit, and the fence, go back to the pool
 * later, under its lock (tc_reap_locked, tc_drain_held_locked). Returns whether a block came. */
__attribute__((noinline)) bool tc_reap_unlocked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    bool got = false;
    tc_enter(tc);
    for (unsigned c = tc->closed_head; c != tc->closed_tail; c++) {
        struct tc_batch *b = tc_batch_at(tc, c);
        if (!b->passed && fence_passed(p, b->fence) <= 0)
            break; /* fences pass in order */
        b->passed = true;
        /* tc_keep_ready() for each block, with the caps from a table and the room reckoned
         * once: a thread's every block passes here once a round */
        uint32_t keep = 0;
        uint64_t room = tc->ready_cap > tc->ready_bytes ? tc->ready_cap - tc->ready_bytes : 0,
                 moved = 0;
        for (uint32_t i = 0; i < b->nr; i++) {
            const struct tc_block k = b->blocks[i];
            unsigned o = tc_order(&k);
            /* o is a cached order but for a double free racing with a reuse of the address as
             * a larger block (tc_free files it under the size it cleared): that one stays in
             * the batch and goes to the pool */
            uint64_t bytes = o <= p->tc_max_order ? 1ull << o : UINT64_MAX;
            if (bytes <= room && tc->nr_ready[o] < tc_caps[o]) {
                uint16_t n = tc->nr_ready[o];
                tc->ready[o][n] = (struct tc_block){tc_ptr(&k), k.arena};
                tc->nr_ready[o] = (uint16_t)(n + 1);
                room -= bytes;
                moved += bytes;
            } else {
                b->blocks[keep++] = k;
            }
        }
        tc->ready_bytes += moved;
        b->bytes -= moved;
        got |= moved != 0;
        b->nr = keep;
    }
    tc_leave(tc);
    return got;
}

/* The thread's open batch is full: close it behind a fence of its own, so its blocks come back
 * to this thread without passing through the pool; while a stream captures (no fence may be
 * recorded), both closed slots wait, or no fence is to be had, the pool takes them. */
__attribute__((noinline)) void tc_close(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    pool_lock(p);
    tc_enter(tc);
    tc_fold_locked(p, tc); /* a thread that only frees would otherwise never fold its count */
    tc_leave(tc);
    if (tc->closed_tail - tc->closed_head == TC_NR_CLOSED)
        tc_reap_locked(p, tc);
    if (!fences_usable(p) && tc->closed_head != tc->closed_tail) {
        /* their fences will never be answered for: the pool's device sync covers them */
        tc_enter(tc);
        for (; tc->closed_head != tc->closed_tail; tc->closed_head++)
            tc_give_freed_locked(p, tc_batch_at(tc, tc->closed_head), false);
        tc_leave(tc);
    }
    void *fence = NULL;
    bool own = p->cfg->reuse == CUHEAP_REUSE_FENCE && !p->nr_capturing && fences_usable(p) &&
               tc->closed_tail - tc->closed_head < TC_NR_CLOSED && dev_fence_record(p, &fence) == 0;
    if (own)
        p->st.nr_fences++;
    tc_enter(tc);
    if (own) {
        struct tc_batch *c = tc_open(tc);
        c->fence = fence;
        c->passed = false;
        tc->closed_tail++; /* the next slot, free: at most TC_NR_CLOSED are closed */
    } else {
        tc_give_freed_locked(p, tc_open(tc), false);
    }
    tc_open_reset(tc);
    tc_leave(tc);
    if (!own)
        close_if_due_locked(p);
    pool_unlock(p);
}

/* Fill the cache with up to TC_REFILL more ready blocks of the order just allocated, where
 * they need no driver call (vmm: their granules are mapped), holding their memory for size
 * bytes as the block just allocated does (p->lock held): from the thread's own batch whose
 * fence has passed, the pool's quick list, or for small blocks by splitting. */
static void tc_refill_locked(struct cuheap_pool *p, struct cuheap_tcache *tc, unsigned order,
                             uint64_t size)
{
    /* vmm: a block of a granule or more holds memory of its own; taking one the thread has
     * not asked for would keep that memory from every other size */
    if (order > p->tc_max_order)
        return;
    tc_reap_locked(p, tc);
    struct cuheap_quick *q = &p->quick[order];
    struct tc_block got[TC_REFILL];
    unsigned n = 0;
    tc_enter(tc);
    unsigned room = tc_caps[order] - tc->nr_ready[order];
    uint64_t bytes = tc->ready_bytes;
    tc_leave(tc);
    /* Small blocks also come from the arenas when the list is out: splitting is cheap there. */
    bool split = order <= CUHEAP_QUICK_MAX_ORDER && (!p->vmm || order < p->granule_shift);
    while (n < TC_REFILL && n < room && (q->head || split) &&
           bytes + (1ull << order) <= tc->ready_cap) {
        uint64_t ptr, block;
        struct cuheap_arena *a;
        if (q->head) {
            if (p->vmm && !block_mapped_locked(p, map_lookup(q->head), q->head, size))
                break;
            ptr = quick_pop_locked(p, order, &a);
        } else if (take_block_locked(p, size, &ptr, &block, &a)) {
            break;
        } else if (p->vmm && !block_mapped_locked(p, a, ptr, size)) {
            merge_block_locked(p, a, ptr);
            break;
        }
        if (p->vmm && hold_mapped_locked(p, a, ptr, size)) {
            merge_block_locked(p, a, ptr);
            break;
        }
        got[n++] = (struct tc_block){ptr, a};
        bytes += 1ull << order;
    }
    tc_enter(tc);
    for (unsigned i = 0; i < n; i++)
        if (!tc_keep_ready(p, tc, got[i].ptr, got[i].arena, order))
            cuheap_assert(!"room for a refill was counted");
    tc_leave(tc);
}

/* The newest ready block of the order size needs, whatever its memory covers (p->lock held).
 * Returns whether there was one. */
bool tc_take_ready(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t size,
                   uint64_t *ret_ptr, struct cuheap_arena **ret_arena)
{
    unsigned order = order_of_size(p, size);
    if (order > p->tc_max_order)
        return false;
    tc_enter(tc);
    uint16_t nr = tc->nr_ready[order];
    if (nr) {
        *ret_ptr = tc->ready[order][nr - 1].ptr;
        *ret_arena = tc->ready[order][nr - 1].arena;
        tc->nr_ready[order] = nr - 1;
        tc->ready_bytes -= 1ull << order;
    }
    tc_leave(tc);
    return nr != 0;
}

/* ---- large blocks off the pool's lock ----
 *
 * A block above tc_max_order is not kept ready: it holds its memory from every other size. But
 * each pair of such blocks then takes the pool's lock twice and waits for a fence recorded
 * under it, and threads that contend for the lock spend most of their time waiting for it,
 * many times one thread's time a pair. So a thread that
 * keeps finding the lock taken keeps one large block of its own, freed with no pool lock, and
 * its next allocation of that order takes the block back once a fence recorded after the free
 * has passed (the timeline below, also without the pool's lock). A thread that finds the lock free
 * keeps none, so a job with one allocating thread at a time (the GPT loop, its replay) holds no
 * more memory for it. */

#define TC_LOCK_WINDOW 16 /* pool-lock takings a thread's verdict is made over */

/* Take p->lock for the calling thread (its cache tc, or NULL), counting whether it had to
 * wait. At the end of each window of takings the thread keeps a large block from then on if it
 * waited in a quarter of them or more, and stops (its block goes to the pool) if it never
 * waited. */
void pool_lock_noting(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    bool waited = !pool_trylock(p);
    if (waited)
        pool_lock(p);
    if (!tc)
        return;
    /* the owner's own counts (no drainer reads them): no tc_enter */
    tc->nr_contended += waited;
    if (++tc->nr_locks < TC_LOCK_WINDOW)
        return;
    bool on = tc->nr_contended * 4 >= TC_LOCK_WINDOW || (tc->large_on && tc->nr_contended);
    tc->nr_locks = tc->nr_contended = 0;
    if (on == tc->large_on)
        return;
    tc->large_on = on;
    /* p->lock held and this thread the owner: no drainer can be inside (tc_drain_mine_locked) */
    if (!on && tc_large_give_locked(p, tc))
        close_if_due_locked(p);
}

/* The thread asks the pool for a large block (p->lock held, the owner) that the one it keeps
 * could not serve: another order, a stream-ordered request, or under vmm more bytes than the
 * kept block has mapped. The kept block goes to the pool: a thread keeps one to reuse at once,
 * and one whose large sizes vary seldom asks for that order again, while the block (up to
 * CUHEAP_POOL_MAX) holds memory for nobody (bench/RESULTS.md). Pairs of one size
 * keep theirs; a kept block whose fence has not passed yet also stays (tc_large_alloc). */
void tc_large_unfit_locked(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t size,
                           unsigned order, bool streamed)
{
    if (!tc->large.ptr)
        return;
    bool fits = !streamed && tc_large_serves(p, &tc->large, size, order);
    if (!fits && tc_large_give_locked(p, tc))
        close_if_due_locked(p);
}

/* ---- public ---- */

/* The thread's cache after an allocation through the pool (p->lock held): made on first use,
 * its counts folded in, buffer ids to hand out, and ready blocks of the order just served. */
void tc_after_alloc_locked(struct cuheap_pool *p, uint64_t size)
{
    struct cuheap_tcache *tc = tc_get_locked(p);
    if (!tc)
        return;
    tc_enter(tc);
    tc_fold_locked(p, tc);
    tc->ready_cap = tc_share_locked(p);
    tc_leave(tc);
    unsigned order = order_of_size(p, size);
    if (order < CUHEAP_NR_ORDERS)
        tc_refill_locked(p, tc, order, size);
}

/* Empty every thread's cache without giving anything back: the memory is gone (context death,
 * a child after fork). Their counts are folded in first. held: the caller holds every cache
 * (tc_hold_all); else a child after fork, whose other threads are gone from inside them. */
void tc_forget_all_locked(struct cuheap_pool *p, bool held)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next) {
        tc_fold_locked(p, tc);
        memset(tc->nr_ready, 0, sizeof(tc->nr_ready));
        tc->ready_bytes = 0;
        tc->closed_head = tc->closed_tail = 0; /* their fences died with the context */
        tc_open_reset(tc);
        tc->large = (struct tc_block){0, NULL}; /* the timeline's fences died too (tl_forget) */
        tc->next_id = tc->end_id = 0;
        if (!held) /* a thread that was inside is gone with the fork */
            atomic_store(&tc->busy, 0);
    }
    if (!held)
        for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
            atomic_store(&tc->held, 0);
}
