/* SPDX-License-Identifier: MIT */
/*
 * The pool's life around its allocations (pool.h): what it holds for nobody given back (trim),
 * memory asked for ahead (reserve), stream captures, peer access, statistics, the end of its
 * context (abandon) or of the process that forked (forget), and the largest free piece an
 * out-of-memory report names.
 *
 * Lock rule: p->lock is taken here and dropped around every wait and driver call, as in
 * pool.c.
 */
#include "tcache.h"

uint64_t cuheap_pool_trim(struct cuheap_pool *p, bool keep_init)
{
    tl_settle(p); /* as the pool's epochs are waited for below */
    pool_lock(p);
    tc_drain_all_locked(p, false);
    flush_stream_caches_locked(p);
    close_epoch_locked(p);
    /* a fence that no wait passes (the driver refuses every way to ask) stays behind */
    while (p->ep_head != p->ep_tail && wait_oldest_locked(p))
        ;
    flush_quick_locked(p);
    if (p->vmm) {
        /* the address space stays: it costs no device memory */
        uint64_t released = release_idle_locked(p, keep_init ? p->cfg->pool_init : 0);
        pool_unlock(p);
        return released;
    }
    uint64_t bases[CUHEAP_NR_MAX_ARENAS], sizes[CUHEAP_NR_MAX_ARENAS];
    unsigned nr = 0;
    uint64_t released = 0, before = p->st.reserved;
    for (unsigned i = 0; i < p->nr_arenas;) {
        struct cuheap_arena *a = p->arenas[i];
        if (a->nr_live == 0 &&
            (!keep_init || p->st.reserved - a->buddy.size >= p->cfg->pool_init)) {
            bases[nr] = unlink_arena_locked(p, i, &sizes[nr]);
            nr++;
            continue; /* slot i now holds another arena */
        }
        i++;
    }
    pool_unlock(p);
    free_arenas_unlocked(p, bases, sizes, nr);
    pool_lock(p);
    released = before > p->st.reserved ? before - p->st.reserved : 0;
    pool_unlock(p);
    return released;
}

int cuheap_pool_reserve(struct cuheap_pool *p, uint64_t bytes)
{
    int r = 0;
    pool_lock(p);
    if (p->to_driver) {
        pool_unlock(p);
        return -EIO; /* nothing to reserve: the driver serves what is asked */
    }
    if (p->vmm) {
        r = reserve_granules_locked(p, bytes);
        if (r == -EIO)
            vmm_refused_locked(p); /* its granules go back: the driver serves what is asked */
        bool to_driver = p->to_driver;
        pool_unlock(p);
        return to_driver ? -EIO : r ? -ENOMEM : 0;
    }
    while (p->st.reserved < bytes && r == 0) {
        /* in power-of-two arenas that add up to what was asked, rounded up to 2 MiB */
        uint64_t want = bytes - p->st.reserved, size = p->cfg->arena_size;
        if (want < size)
            size = want <= (2u << 20) ? pow2_ceil(want) : 1ull << (63 - __builtin_clzll(want));
        r = grow_locked(p, size, true);
    }
    pool_unlock(p);
    return r ? -ENOMEM : 0;
}

void cuheap_pool_capture(struct cuheap_pool *p, int delta)
{
    pool_lock(p);
    if (delta < 0 && p->nr_capturing == 0) {
        pool_unlock(p);
        return;
    }
    __atomic_store_n(&p->nr_capturing, (unsigned)((int)p->nr_capturing + delta), __ATOMIC_RELAXED);
    if (delta > 0) {
        /* a thread may be recording a timeline fence with no pool lock (tl_wait): the capture
         * begins once every owner has left its cache, and they read the count inside theirs
         * from now on */
        tc_hold_all(p);
        tc_unhold_all(p);
    }
    if (!p->nr_capturing && open_epoch(p)->nr_blocks >= p->cfg->fence_batch)
        close_epoch_locked(p);
    pool_unlock(p);
}

int cuheap_pool_grant_access(struct cuheap_pool *p)
{
    pool_lock(p);
    int r = p->vmm && dev_has_access(p) ? grant_access_locked(p) : 0;
    pool_unlock(p);
    return r;
}

void cuheap_pool_get_stats(struct cuheap_pool *p, struct cuheap_pool_stats *ret)
{
    pool_lock(p);
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_fold_locked(p, tc);
    tc_unhold_all(p);
    *ret = p->st;
    ret->nr_idle += atomic_load_explicit(&p->nr_idle_tl, memory_order_relaxed);
    ret->vmm_refused = p->vmm_refused;
    ret->to_driver = __atomic_load_n(&p->to_driver, __ATOMIC_ACQUIRE);
    ret->fences_refused = atomic_load_explicit(&p->fences_refused, memory_order_relaxed);
    pool_unlock(p);
}

/* Every list of freed blocks emptied, nothing given back: the memory is gone (a context's
 * end, a fork's child). */
static void drop_lists(struct cuheap_pool *p)
{
    memset(p->epochs, 0, sizeof(p->epochs));
    p->syncing = NULL;
    memset(p->caches, 0, sizeof(p->caches));
    memset(p->quick, 0, sizeof(p->quick));
    p->quick_bytes = 0;
    p->nr_whole = 0;
    p->pending_mapped = 0;
    p->ep_head = p->ep_tail = 0;
}

uint64_t cuheap_pool_abandon(struct cuheap_pool *p)
{
    pool_lock(p);
    /* the caches stay held until the backend has forgotten its fences too: a thread records
     * the timeline's inside its cache without p->lock (tl_wait) */
    tc_hold_all(p);
    tc_forget_all_locked(p, true);
    /* and the timeline, which a trim settles holding neither p->lock nor a cache (else a trim
     * could let go of a fence abandon had cleared) */
    tl_enter(&p->tl);
    tl_forget(&p->tl, false);
    uint64_t live = p->st.live;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        uint64_t base = a->buddy.base, size = a->buddy.size;
        if (p->vmm) {
            /* the chunks died with the context: one release per chunk */
            for (uint32_t g = 0; g < a->nr_granules; g++)
                if (a->chunks[g].handle) {
                    uint64_t bytes = chunk_bytes(p, &a->chunks[g]);
                    atomic_fetch_sub(p->device_reserved, bytes);
                    p->st.reserved -= bytes;
                    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, granule_va(a, g), bytes,
                                    p->st.reserved, 0);
                }
        } else {
            atomic_fetch_sub(p->device_reserved, size);
            p->st.reserved -= size;
            pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, base, size, p->st.reserved, 0);
        }
        map_update(a, false);
        arena_retire(a);
    }
    p->nr_arenas = 0;
    p->nr_empty = 0;
    p->hint = 0;
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    p->nr_idle = p->idle_bytes = 0;
    /* a mapping call in flight finds the context gone and publishes nothing (phys.c) */
    atomic_fetch_sub(p->device_reserved, p->inflight_bytes);
    p->inflight_bytes = 0;
    p->nr_resets++;
    p->nr_stuck = 0;
    uint64_t keep_hits = p->st.nr_hits, keep_misses = p->st.nr_misses;
    memset(&p->st, 0, sizeof(p->st));
    atomic_store(&p->nr_idle_tl, 0);
    p->st.nr_hits = keep_hits;
    p->st.nr_misses = keep_misses;
    drop_lists(p); /* their events died with the context; a thread syncing for some finds
                      them gone and drops them */
    pthread_cond_broadcast(&p->synced);
    dev_forget(p);
    tl_leave(&p->tl);
    tc_unhold_all(p);
    pool_unlock(p);
    return live;
}

void cuheap_pool_forget(struct cuheap_pool *p)
{
    /* The caches of threads that did not cross the fork stay listed, empty: their owners'
     * thread-local pointers are gone with them, the forking thread's are still in use. */
    tc_forget_all_locked(p, false);
    tl_forget(&p->tl, true);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        map_update(p->arenas[i], false);
        arena_retire(p->arenas[i]);
    }
    p->nr_arenas = 0;
    p->nr_empty = 0;
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    p->nr_idle = p->idle_bytes = 0;
    p->mapping = false; /* a mapper that did not cross the fork */
    p->inflight_bytes = 0;
    p->nr_stuck = 0;
    memset(&p->st, 0, sizeof(p->st));
    atomic_store(&p->nr_idle_tl, 0);
    atomic_store(&p->fences_refused, false); /* the child's contexts are its own */
    drop_lists(p); /* a syncing list is on the stack of a thread the fork left behind */
    pool_lock_init(p);
    pthread_cond_init(&p->synced, NULL);
    pthread_cond_init(&p->mapped, NULL);
}

/* ---- the largest free piece, for an out-of-memory's report (pool.h) ---- */

uint64_t cuheap_pool_largest_free(struct cuheap_pool *p)
{
    uint64_t best = 0;
    pool_lock(p);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        const struct cuheap_arena *a = p->arenas[i];
        uint64_t piece = largest_free_of(a);
        if (a->granules) { /* vmm: the free block's memory is at most the spare granules */
            uint64_t spare = a->nr_mapped > a->nr_used
                                 ? (uint64_t)(a->nr_mapped - a->nr_used) << p->granule_shift
                                 : 0;
            piece = piece < spare ? piece : spare;
        }
        best = piece > best ? piece : best;
    }
    pool_unlock(p);
    return best;
}
