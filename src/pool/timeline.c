/* SPDX-License-Identifier: MIT */
/*
 * Large blocks off the pool's lock. A block above tc_max_order is not kept ready: it holds its
 * memory from every other size. But each pair of such blocks then takes the pool's lock twice
 * and waits for a fence recorded under it, which many threads queue on. So a thread that keeps
 * finding the lock taken keeps one large block of its own, freed with no pool lock, and its next
 * allocation of that order takes it back once a fence recorded after the free has passed: the
 * pool's timeline, fences shared by all such threads, numbered in the order they are recorded.
 * A thread that finds the lock free keeps none.
 *
 * Lock rule: no pool lock; one thread at a time records or asks the driver (tl->busy, taken by
 * tl_try_enter, never slept on), the others read tl->passed.
 */
#include "tcache.h"

/* The fences of the threads' large blocks form one timeline per pool, shared: a block freed
 * takes a ticket, the number of fences whose recording has begun, and may be used again once a
 * later one has passed. One fence recorded serves every block freed before it, and one thread at
 * a time records or asks the driver (tl->busy) while the others read tl->passed: a fence for
 * each free, recorded and polled by many threads at once on the legacy stream, was slower than
 * waiting for the pool's lock (the threads slept in the driver's own locks). Fences pass in
 * the order they were recorded: each is an event on the same streams, each stream in order. */
static uint64_t tl_ticket(struct cuheap_timeline *tl)
{
    return atomic_load_explicit(&tl->started, memory_order_seq_cst);
}

/* Whether the calling thread may record or ask the driver now (tl_leave when done): it never
 * waits, and threads waiting for fences look before they try (tl_wait). */
static bool tl_try_enter(struct cuheap_timeline *tl)
{
    return !atomic_load_explicit(&tl->busy, memory_order_relaxed) &&
           !atomic_exchange_explicit(&tl->busy, true, memory_order_acquire);
}

/* For a trim or a context's death, which must get in: waits for the thread inside to leave. */
void tl_enter(struct cuheap_timeline *tl)
{
    while (!tl_try_enter(tl))
        sched_yield();
}

void tl_leave(struct cuheap_timeline *tl)
{
    atomic_store_explicit(&tl->busy, false, memory_order_release);
}

/* Recorded fences let go, oldest first, as they pass: asked about until one has not (wait:
 * false), or each waited for (a trim, tl_settle). _inside: the caller holds tl->busy
 * (tl_try_enter or tl_enter), not p->lock. */
static void tl_pass_inside(struct cuheap_pool *p, struct cuheap_timeline *tl, bool wait)
{
    uint64_t n = atomic_load_explicit(&tl->passed, memory_order_relaxed);
    uint64_t last = atomic_load_explicit(&tl->recorded, memory_order_relaxed);
    for (; n < last; n++) {
        void **slot = &tl->ring[(n + 1) % CUHEAP_NR_TIMELINE];
        if (wait) {
            if (dev_fence_wait(p, *slot) != 0)
                dev_device_sync(p); /* what the pool's own waits fall back to */
        } else if (fence_passed(p, *slot) <= 0) {
            break;
        }
        dev_fence_destroy(p, *slot);
        *slot = NULL;
        atomic_store_explicit(&tl->passed, n + 1, memory_order_release);
    }
}

/* A fence numbered above the last recorded one, recorded now unless one numbered need or later
 * is already (_inside: the caller holds tl->busy, not p->lock; it asks again while its need
 * is not met). The count
 * of started fences goes up before the driver is asked, so that a free meanwhile waits for the
 * next one; when the driver refuses, it stays up and the next fence recorded takes the number:
 * a free that took it waits for one fence more than it needs, never for fewer, and no ticket is
 * above the count (lowering it again could leave one so, which pool_check refuses). Returns
 * whether a fence was recorded or one is. */
static bool tl_record_inside(struct cuheap_pool *p, struct cuheap_timeline *tl, uint64_t need,
                             struct cuheap_tcache *tc)
{
    uint64_t last = atomic_load_explicit(&tl->recorded, memory_order_relaxed);
    if (last >= need)
        return true;
    if (last + 1 - atomic_load_explicit(&tl->passed, memory_order_relaxed) > CUHEAP_NR_TIMELINE) {
        tl_pass_inside(p, tl, false); /* the ring is full of fences in flight: its oldest slot */
        if (last + 1 - atomic_load_explicit(&tl->passed, memory_order_relaxed) > CUHEAP_NR_TIMELINE)
            return false;
    }
    atomic_store_explicit(&tl->started, last + 1, memory_order_seq_cst);
    if (idle_now(p)) {
        /* asked after the count went up: every free that took a lower ticket is covered, and
         * every fence recorded before has passed */
        tl_pass_inside(p, tl, true); /* each has passed: the waits return at once */
        atomic_store_explicit(&tl->recorded, last + 1, memory_order_release);
        atomic_store_explicit(&tl->passed, last + 1, memory_order_release);
        atomic_fetch_add_explicit(&p->nr_idle_tl, 1, memory_order_relaxed);
        return true;
    }
    void *fence = NULL;
    if (!fences_usable(p) || dev_fence_record(p, &fence))
        return false;
    tl->ring[(last + 1) % CUHEAP_NR_TIMELINE] = fence;
    atomic_store_explicit(&tl->recorded, last + 1, memory_order_release);
    if (tc)
        tc->nr_fences++;
    return true;
}

/* Every recorded fence waited for and let go (trim, with p->lock not held): nothing of the
 * timeline stays held, and the blocks threads keep may go back to the pool at once. Threads
 * waiting meanwhile spin (tl_wait). */
void tl_settle(struct cuheap_pool *p)
{
    tl_enter(&p->tl);
    tl_pass_inside(p, &p->tl, true);
    tl_leave(&p->tl);
}

/* The context is gone, its fences with it (p->lock, every cache and the timeline held:
 * cuheap_pool_abandon; or a child after fork): everything counts as passed. */
void tl_forget(struct cuheap_timeline *tl, bool fork_child)
{
    if (fork_child)
        atomic_store(&tl->busy, false); /* a thread that was inside is gone with the fork */
    memset(tl->ring, 0, sizeof(tl->ring));
    uint64_t n = atomic_load(&tl->started);
    atomic_store(&tl->recorded, n);
    atomic_store(&tl->passed, n);
}

/* A large block freed by a thread that keeps one (large_on) and keeps none yet: it takes the
 * timeline's ticket and stays with the thread. Returns 0, or -EAGAIN for the pool's path
 * (which also answers double frees). */
__attribute__((noinline)) int tc_large_free(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                            struct cuheap_arena *a, uint64_t ptr,
                                            uint64_t *ret_size, uint64_t *ret_block,
                                            uint64_t *ret_seq)
{
    if (!a || a->pool != p || p->cfg->reuse != CUHEAP_REUSE_FENCE ||
        ((ptr - a->buddy.base) & ((1ull << a->buddy.min_order) - 1)))
        return -EAGAIN;
    uint32_t u = unit_of(a, ptr);
    if (u >= a->buddy.nr_units) /* retired since the lookup */
        return -EAGAIN;
    uint64_t asked = size_at(a, u);
    /* kept by order: a block of a power of two (first fit makes others exact) */
    if (!asked || order_of_size(p, asked) <= p->tc_max_order || !pow2_block(p, asked))
        return -EAGAIN;
    tc_enter(tc);
    if (tc->large.ptr) { /* read inside: a drainer may be taking it (ThreadSanitizer saw it) */
        tc_leave(tc);
        return -EAGAIN;
    }
    /* whoever clears the size frees the block (tc_free); a size cleared by a racing double
     * free of the address reused meanwhile may be of another order: the block is kept all the
     * same, and goes back to the pool from here (tc_large_give_locked takes any order) */
    uint64_t size = __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size || !pow2_block(p, size)) { /* as in tc_free */
        if (size)
            __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELEASE);
        tc_leave(tc);
        return -EAGAIN;
    }
    unsigned order = order_of_size(p, size);
    uint64_t block = 1ull << order;
    tc->live -= (int64_t)size;
    tc->live_blocks -= (int64_t)block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    tc->large_ticket = tl_ticket(&p->tl); /* after the size is cleared: the free has begun */
    tc->large = (struct tc_block){ptr | order, a};
    tc_leave(tc);
    *ret_size = size;
    *ret_block = block;
    return 0;
}

/* Wait, up to CUHEAP_FENCE_POLL_NS (as the pool's path polls before it maps more memory), for
 * a fence after the ticket to pass: recording one if none is, asking the driver when no other
 * thread is. No fence is recorded while a stream captures (it would join the capture's graph;
 * the count is read inside the cache, cuheap_pool_capture). Returns whether one passed. */
static bool tl_wait(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t ticket)
{
    struct cuheap_timeline *tl = &p->tl;
    uint64_t t0 = mono_ns(), now = t0;
    bool passed;
    for (unsigned round = 0; !(passed = tl_passed(tl, ticket)); round++) {
        /* Never asleep on a lock, and a look before a try: threads asleep on a mutex while one
         * recorded woke up late, and threads trying a mutex between yields spent much of their
         * time in the try. */
        bool recorded_now = false;
        if (atomic_load_explicit(&tl->recorded, memory_order_acquire) <= ticket) {
            if (__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
                break;
            if (tl_try_enter(tl)) {
                bool ok = tl_record_inside(p, tl, ticket + 1, tc);
                tl_leave(tl);
                if (!ok)
                    break;
                recorded_now = true;
            }
        } else if (tl_try_enter(tl)) {
            tl_pass_inside(p, tl, false);
            tl_leave(tl);
            if ((passed = tl_passed(tl, ticket)))
                break;
        }
        /* a fence just recorded is asked about at least once, however long the recording (or
         * the thread's time off the CPU) took */
        if ((now = mono_ns()) >= t0 + CUHEAP_FENCE_POLL_NS && !recorded_now)
            break;
        /* a fence takes microseconds: spin a little, and let others run now and then */
        if (round % 8 == 7)
            sched_yield();
        else
            for (int i = 0; i < 64; i++)
                cpu_relax();
    }
    tc->fence_ns += (passed ? mono_ns() : now) - t0;
    return passed;
}

/* A large allocation of the order of the thread's kept block: that block, once a fence after
 * its free has passed (tl_wait). Returns 0, or -EAGAIN for the pool's path, which takes the
 * block back with the thread's other frees when it needs memory (fence_pending_once_locked). */
__attribute__((noinline)) int tc_large_alloc(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                             uint64_t size, unsigned order, uint64_t *ret_ptr,
                                             uint64_t *ret_block, uint64_t *ret_seq)
{
    tc_enter(tc);
    struct tc_block b = tc->large;
    uint64_t ptr = tc_ptr(&b);
    /* while a stream captures, allocations go to the driver (pool_alloc_slow) */
    if (!tc_large_serves(p, &b, size, order) ||
        __atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED) || !tl_wait(p, tc, tc->large_ticket)) {
        tc_leave(tc);
        return -EAGAIN;
    }
    tc->large = (struct tc_block){0, NULL};
    return tc_hand_out(p, tc, b.arena, ptr, size, order, ret_ptr, ret_block, ret_seq);
}
