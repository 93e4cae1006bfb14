/* SPDX-License-Identifier: MIT */
/*
 * The pool's public entry points for set-up, allocation and free (the thread cache's fast
 * path inline, the rest out of line), the signal handlers' frees, range queries and sharing;
 * the rest of its life (trim, reserve, captures, statistics, a context's or a fork's end) is
 * in life.c.
 *
 * Lock rule: p->lock is taken here for the slow paths and dropped around every wait and every
 * driver call that the parts below make.
 */
#include "tcache.h"

#include <unistd.h>
#include <sys/mman.h>

void cuheap_pool_atfork_child(void)
{
    map_atfork_child();
    tc_atfork_child();
}

#define TC_LEGACY_MAX_ORDER 17 /* largest block a legacy thread cache keeps: 128 KiB */

/* The pool's lock spins a little before it sleeps (glibc's adaptive mutex): its holders make
 * at most a driver call or two, and threads that contend for it, each taking it twice a pair,
 * otherwise spend their time in futex sleeps and wake-ups. A thread alone never waits, so
 * nothing changes for it. */
void pool_lock_init(struct cuheap_pool *p)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&p->lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

struct cuheap_pool *cuheap_pool_create(void)
{
    void *m = mmap(NULL, sizeof(struct cuheap_pool), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

void *cuheap_pool_owner(const struct cuheap_pool *p)
{
    return p->owner;
}

bool cuheap_pool_is_vmm(const struct cuheap_pool *p)
{
    return p->vmm;
}

void cuheap_pool_set_capturing(struct cuheap_pool *p, unsigned nr)
{
    __atomic_store_n(&p->nr_capturing, nr, __ATOMIC_RELAXED);
}

/* Taken and let go of without counting it as held (pool_locks_held): the child starts with
 * its pools forgotten and their locks made anew, and no thread of it holds one. */
void cuheap_pool_atfork_prepare(struct cuheap_pool *p)
{
    pthread_mutex_lock(&p->lock);
}

void cuheap_pool_atfork_parent(struct cuheap_pool *p)
{
    pthread_mutex_unlock(&p->lock);
}

bool cuheap_pool_lock_held(void)
{
    return pool_locks_held != 0;
}

int cuheap_pool_init(struct cuheap_pool *p, const struct cuheap_config *cfg,
                     const struct cuheap_backend *be, int device, uint64_t limit,
                     _Atomic uint64_t *device_reserved, cuheap_pool_note_fn note_fn, void *owner)
{
    memset(p, 0, sizeof(*p));
    p->owner = owner;
    pool_lock_init(p);
    pthread_cond_init(&p->synced, NULL);
    pthread_cond_init(&p->mapped, NULL);
    p->cfg = cfg;
    p->be = *be;
    p->device = device;
    p->limit = limit;
    p->device_reserved = device_reserved;
    p->note = note_fn;
    p->next_buffer_id = 1;
    static _Atomic uint64_t nr_pools;
    p->gen = atomic_fetch_add(&nr_pools, 1) + 1;
    p->min_order = 63u - (unsigned)__builtin_clzll(cfg->min_block);
    p->vmm = cfg->backing == CUHEAP_BACKING_VMM && be->granule && be->va_reserve && be->va_free &&
             be->phys_create && be->phys_release && be->phys_map && be->phys_unmap;
    /* a device without VMM: the driver's own allocations, not a legacy pool (vmm_refused_locked
     * says why); CUHEAP_BACKING=legacy asks for one */
    if (cfg->backing == CUHEAP_BACKING_VMM && !p->vmm) {
        p->vmm_refused = CUHEAP_VMM_ABSENT;
        p->to_driver = true;
    }
    p->granule_shift = p->vmm ? 63u - (unsigned)__builtin_clzll(be->granule) : 0;
    p->chunk_max =
        p->vmm && cfg->vmm_chunk > be->granule ? (uint32_t)(cfg->vmm_chunk >> p->granule_shift) : 1;
    /* aligned pieces line up with buddy blocks only when they are a power of two of granules:
     * a 6 MiB piece would reach into a neighbour block's address space */
    if (cfg->vmm_layout == CUHEAP_VMM_ALIGNED)
        p->chunk_max = 1u << (31 - __builtin_clz(p->chunk_max));
    /* first fit places blocks anywhere on a unit: the aligned layout's pieces line up only with
     * the buddy's blocks */
    p->first_fit =
        p->vmm && cfg->vmm_placement == CUHEAP_PLACE_FIRST && cfg->vmm_layout == CUHEAP_VMM_TIGHT;
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    /* under CUHEAP_RELEASE=empty a freed block is merged as soon as it can: none are kept aside */
    p->tc_bytes = cfg->release == CUHEAP_RELEASE_EMPTY ? 0 : cfg->thread_cache;
    if (p->tc_bytes)
        tc_setup_once();
    /* A block a thread keeps holds its memory from every other size: under vmm its granules,
     * which the pool would otherwise move to where they are needed; under legacy its place in
     * an arena, so other sizes grow the pool. The larger the blocks the caches keep, the more
     * memory the pool holds for the same live bytes under both backings (and caching large
     * legacy blocks made a 2 MiB pair dearer). So both cache small blocks only: a sixteenth of
     * a granule, or 128 KiB under legacy (a sixteenth of 2 MiB). */
    p->tc_max_order = p->vmm ? p->granule_shift - 4 : TC_LEGACY_MAX_ORDER;
    if (p->tc_max_order >= TC_NR_ORDERS) /* a device with granules over 2 MiB */
        p->tc_max_order = TC_NR_ORDERS - 1;
    return 0;
}

/* vmm: the block the buddy gave needs granules mapped (or would keep some busy for nothing,
 * block_fits_locked), but blocks freed before wait for a fence. Once it passes they are free
 * with their granules mapped, and the last one freed is the first the buddy gives again: very
 * likely one of this size, at an address that needs no driver call. So wait for the oldest
 * fence and ask again, rather than move memory (an unmap and a map, far dearer than a fence)
 * or take more. Bounded by the number of epochs. */
static void prefer_mapped_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ptr,
                                 uint64_t *block, struct cuheap_arena **arena)
{
    unsigned backs = 0;
    for (unsigned tries = 0; tries <= CUHEAP_NR_EPOCHS; tries++) {
        if (block_fits_locked(p, *arena, *ptr, size, *block))
            return;
        if (p->ep_head == p->ep_tail && !open_epoch(p)->nr_blocks)
            return; /* nothing waits: moving or taking granules is all there is */
        if (!reclaim_locked(p)) {
            bool back = false; /* every stream idle, or a device sync: they came back */
            if (p->ep_head == p->ep_tail) {
                back = close_epoch_locked(p);
                if (p->ep_head == p->ep_tail && !back)
                    return; /* could not close it (a stream captures) */
                if (back && backs++)
                    return; /* once: a device sync each round would cost more than mapping */
            }
            if (!back && !poll_oldest_locked(p))
                wait_oldest_locked(p);
        }
        /* back to the buddy, not a quick list: the list would hand this very block out again */
        merge_block_locked(p, *arena, *ptr);
        if (take_block_locked(p, size, ptr, block, arena))
            cuheap_assert(!"a block just given back could not be taken again");
    }
}

/* More for the pool: address space under vmm (costs no device memory), an arena of device
 * memory under legacy. Drops p->lock around the driver call. Returns 0, CUHEAP_BE_OOM, -EDQUOT
 * (the limit refused) or -EIO (the driver refused the vmm backing). */
int grow_locked(struct cuheap_pool *p, uint64_t need, bool exact)
{
    if (p->nr_arenas == CUHEAP_NR_MAX_ARENAS)
        return CUHEAP_BE_OOM;
    return p->vmm ? grow_va_locked(p, need) : grow_legacy_locked(p, need, exact);
}

static __attribute__((noinline)) int pool_alloc_slow(struct cuheap_pool *p, uint64_t size,
                                                     uint64_t stream, unsigned order, bool cached,
                                                     uint64_t *ret_ptr, uint64_t *ret_block,
                                                     uint64_t *ret_seq);

/* The thread cache's allocation here, everything else out of line: the common call then saves
 * and restores only the registers it uses. */
int cuheap_pool_alloc(struct cuheap_pool *p, uint64_t size, uint64_t stream, uint64_t *ret_ptr,
                      uint64_t *ret_block, uint64_t *ret_seq)
{
    if (size == 0 || size > p->cfg->pool_max || __atomic_load_n(&p->to_driver, __ATOMIC_ACQUIRE))
        return CUHEAP_POOL_PASS;
    unsigned order = order_of_size(p, size);
    /* a block too large for the caches asks no fence on their behalf */
    bool cached = !stream && p->tc_bytes && order <= p->tc_max_order;
    if (cached && !__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED)) {
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && (tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0 ||
                   (tc_reap_unlocked(p, tc) &&
                    tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0)))
            return 0;
    }
    return pool_alloc_slow(p, size, stream, order, cached, ret_ptr, ret_block, ret_seq);
}

static int pool_alloc_slow(struct cuheap_pool *p, uint64_t size, uint64_t stream, unsigned order,
                           bool cached, uint64_t *ret_ptr, uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_tcache *mine = tc_find(p);
    /* here rather than in cuheap_pool_alloc, where it cost the small blocks' path registers */
    if (mine && mine->large_on && !stream && order > p->tc_max_order &&
        tc_large_alloc(p, mine, size, order, ret_ptr, ret_block, ret_seq) == 0)
        return 0;
    /* near a full device, what the driver has free, asked before the lock is taken
     * (device_full_locked); the flag read without it: at worst asked once for nothing, or not
     * asked once and the request served as if the driver had room */
    uint64_t free_b = UINT64_MAX;
    if (p->vmm && __atomic_load_n(&p->device_full, __ATOMIC_RELAXED))
        dev_mem_free_bytes(p, &free_b);
    pool_lock_noting(p, mine);
    if (mine && order > p->tc_max_order)
        tc_large_unfit_locked(p, mine, size, order, stream != 0);
    if (p->to_driver) { /* switched while this thread waited for the lock */
        pool_unlock(p);
        return CUHEAP_POOL_PASS;
    }
    if (p->nr_capturing && !stream) {
        pool_unlock(p);
        return CUHEAP_POOL_PASS;
    }
    if (p->nr_merged >= CUHEAP_PURGE_EVERY)
        purge_meta_locked(p);
    uint64_t ptr = 0, block = 0;
    struct cuheap_arena *arena = NULL;
    int r = -ENOMEM, g = 0;
    bool from_tc = false;
    if (cached) {
        /* the thread's own batch whose fence has passed, before anything of the pool's */
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && tc_reap_locked(p, tc) &&
            tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0) {
            pool_unlock(p);
            return 0;
        }
        /* vmm: a ready block whose memory covers a smaller request gets the rest here */
        if (tc && p->vmm && tc_take_ready(p, tc, size, &ptr, &arena)) {
            block = 1ull << order;
            from_tc = true;
            r = 0;
        }
    }
    bool missed = false, drained = false;
    /* Same-stream reuse needs no fence: later work on that stream is ordered after the free. */
    struct cuheap_stream_cache *sc = stream ? stream_cache_locked(p, stream, false) : NULL;
    if (sc) {
        if (order < CUHEAP_NR_ORDERS && sc->heads[order] && pow2_block(p, size)) {
            ptr = sc->heads[order];
            arena = map_lookup(ptr);
            sc->heads[order] = arena->link[unit_of(arena, ptr)];
            sc->bytes -= 1ull << order;
            block = 1ull << order;
            p->st.pending -= block;
            p->pending_mapped -= extent_at(p, arena, ptr);
            r = 0;
        }
    }
    /* With thread caches, this path runs once per refill: blocks whose fence has passed are
     * what refills come from, so look for them every time the quick list is out. */
    if (r && (++p->nr_since_poll >= 32 || (cached && !p->quick[order % CUHEAP_NR_ORDERS].head))) {
        p->nr_since_poll = 0;
        reclaim_locked(p);
    }
    /* Blocks freed since the last fence come back before a place is chosen, if every stream
     * is idle: chosen first, the new block was placed around them, and under vmm a loop of
     * 2 MiB pairs then moved memory to it from theirs every pair. */
    if (r && !p->quick[order % CUHEAP_NR_ORDERS].head)
        return_if_idle_locked(p);
    bool from_cache = r == 0 && !from_tc;
again:;
    bool flushed = false, trimmed = false, waited_in_vain = false;
    unsigned synced = 0, settles = 0;
    while (r) {
        r = take_block_locked(p, size, &ptr, &block, &arena);
        if (r == 0)
            break;
        missed = true;
        if (reclaim_locked(p) || flush_quick_locked(p))
            continue;
        if (p->vmm) {
            /* out of address space only: more costs no device memory */
            g = grow_locked(p, size, false);
            if (g == 0)
                continue;
            if (g == -EIO)
                goto refused;
            goto out_of_memory;
        }
        if (!flushed) {
            /* Blocks waiting in thread caches, the open epoch or stream caches become
             * reusable sooner behind a fence recorded now. */
            flushed = true;
            tc_drain_all_locked(p, true);
            flush_stream_caches_locked(p);
            if (close_epoch_locked(p))
                continue; /* they came back (streams idle, or a device sync): no need to grow */
        }
        if (poll_oldest_locked(p))
            continue;
        /* An arena is held until it is empty again, so while blocks wait behind fences, wait
         * for them first (as vmm does past its budget, and as the driver's own free waits for
         * the device every time): a host that runs ahead of its streams otherwise grows the
         * pool for good for memory a moment from coming back. However small, a block that
         * comes back may join a free neighbour into room for the request: waiting only while
         * the fenced blocks add up to the request took arenas the pool then kept
         * (bench/RESULTS.md). Frees made meanwhile go behind a fence too (one may be the
         * neighbour); at most an epoch ring's worth of waits, so that threads that keep
         * freeing cannot keep this one waiting for good. None while a stream captures: a
         * failed fence wait falls back to a device sync, which would break the capture. */
        if (!waited_in_vain && p->st.pending && !p->nr_capturing && settles++ < CUHEAP_NR_EPOCHS) {
            if (close_epoch_locked(p))
                continue; /* they came back (streams idle, or a device sync) */
            if (p->ep_head != p->ep_tail && wait_oldest_locked(p))
                continue;
            waited_in_vain = true;
        }
        /* The lock was dropped above (a poll, a wait): other threads' blocks may have come
         * back meanwhile and made room, and an arena taken then stays until it is empty. */
        if (room_for_locked(p, size))
            continue;
        g = grow_locked(p, size, false);
        if (g == 0)
            continue;
        if (p->ep_head != p->ep_tail && wait_oldest_locked(p))
            continue;
        if (!trimmed && p->cfg->release != CUHEAP_RELEASE_NEVER) { /* legacy only, as above */
            /* Empty arenas too small for this request (made under a limit) can make room
             * for one that fits. */
            trimmed = true;
            if (release_empty_locked(p))
                continue;
        }
        if (p->syncing && synced++ < CUHEAP_NR_EPOCHS) {
            wait_syncing_locked(p); /* blocks another thread syncs for come back soon */
            continue;
        }
        goto out_of_memory;
    }
    if (p->vmm && !from_cache && !from_tc)
        prefer_mapped_locked(p, size, &ptr, &block, &arena);
    if (p->vmm) {
        uint64_t before = p->st.nr_creates + p->st.nr_moves;
        struct acquire acq = {.fenced = false};
        /* near a full device, to the driver at the request's size (device_full_locked) */
        bool to_device = device_full_locked(p, arena, ptr, size, free_b);
        g = to_device ? CUHEAP_POOL_PASS : use_granules_locked(p, arena, ptr, size, &acq);
        if (g) {
            if (from_cache)
                pend_locked(p, arena, ptr, block); /* reusable on its stream only: fence it */
            else
                return_block_locked(p, arena, ptr);
            from_cache = from_tc = false;
            r = -ENOMEM;
            if (g == -EIO)
                goto refused;
            if (g == CUHEAP_POOL_PASS) {
                pool_unlock(p);
                return CUHEAP_POOL_PASS;
            }
            goto out_of_memory;
        }
        missed = p->st.nr_creates + p->st.nr_moves != before; /* the driver was needed */
    }
    if (missed)
        p->st.nr_misses++;
    else
        p->st.nr_hits++;
    mark_live_locked(p, arena, ptr, size, block);
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    if (cached)
        tc_after_alloc_locked(p, size);
    pool_unlock(p);
    debug_check(p);
    *ret_ptr = ptr;
    *ret_block = block;
    return 0;
out_of_memory:
    /* Ready and freed blocks in every thread's cache go back before the answer is no. */
    if (!drained) {
        drained = true;
        if (tc_drain_all_locked(p, false))
            goto again;
    }
    if (p->vmm && g == CUHEAP_BE_OOM)
        device_full_begin_locked(p); /* the device, not the limit: the driver's from now on */
    pool_note_event(p, g == -EDQUOT ? CUHEAP_EV_LIMIT : CUHEAP_EV_OOM, 0, size, p->st.reserved,
                    p->limit);
    pool_unlock(p);
    return -ENOMEM;
refused:
    vmm_refused_locked(p);
    pool_unlock(p);
    return CUHEAP_POOL_PASS; /* new memory from the driver while the pool's blocks live */
}

static __attribute__((noinline)) int pool_free_slow(struct cuheap_pool *p, uint64_t ptr,
                                                    uint64_t stream, bool cached,
                                                    uint64_t *ret_size, uint64_t *ret_block,
                                                    uint64_t *ret_seq);

/* The thread cache's free here, everything else out of line (as cuheap_pool_alloc); a is
 * ptr's arena as looked up without a lock (or NULL). */
static __attribute__((always_inline)) inline int
pool_free_in(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t stream,
             uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    bool cached = !stream && p->tc_bytes && p->cfg->reuse != CUHEAP_REUSE_SYNC;
    if (cached) {
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && tc_free(p, tc, a, ptr, ret_size, ret_block, ret_seq) == 0)
            return 0;
    }
    return pool_free_slow(p, ptr, stream, cached, ret_size, ret_block, ret_seq);
}

int cuheap_pool_free(struct cuheap_pool *p, uint64_t ptr, uint64_t stream, uint64_t *ret_size,
                     uint64_t *ret_block, uint64_t *ret_seq)
{
    return pool_free_in(p, map_lookup(ptr), ptr, stream, ret_size, ret_block, ret_seq);
}

/* One look into the address map for both questions, whose pool and where in it: a second
 * (cuheap_pool_of, then the free's own) is a large part of a small pair's cost. */
int cuheap_pool_free_any(uint64_t ptr, uint64_t stream, void **ret_owner, uint64_t *ret_size,
                         uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_arena *a = map_lookup(ptr);
    if (!a)
        return CUHEAP_POOL_PASS;
    *ret_owner = a->pool->owner;
    return pool_free_in(a->pool, a, ptr, stream, ret_size, ret_block, ret_seq);
}

/* The claimed block's unit records hold, until it is popped: link its size and api (in the
 * top byte), buffer_id the next block on the list. A block being freed answers no range query
 * meanwhile, and its buffer id is of no use any more. */
#define CLAIM_API_SHIFT 56

int cuheap_pool_claim_free(uint64_t ptr, int api, _Atomic uint64_t *head)
{
    struct cuheap_arena *a = map_lookup(ptr);
    if (!a || ((ptr - a->buddy.base) & ((1ull << a->buddy.min_order) - 1)))
        return -EINVAL;
    uint32_t u = unit_of(a, ptr);
    if (u >= a->buddy.nr_units)
        return -EINVAL;
    uint64_t size = __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size)
        return -EINVAL; /* not live: a double free, or no block starts here */
    atomic_fetch_add_explicit(&a->pool->claimed, size, memory_order_relaxed); /* pool_check */
    atomic_fetch_add_explicit(&a->pool->claimed_blocks, block_of_size(a->pool, size),
                              memory_order_relaxed);
    __atomic_store_n(&a->link[u], size | (uint64_t)(uint8_t)api << CLAIM_API_SHIFT,
                     __ATOMIC_RELAXED);
    uint64_t old = atomic_load_explicit(head, memory_order_relaxed);
    do
        __atomic_store_n(&a->buffer_id[u], old, __ATOMIC_RELAXED);
    while (!atomic_compare_exchange_weak_explicit(head, &old, ptr, memory_order_release,
                                                  memory_order_relaxed));
    return 0;
}

uint64_t cuheap_pool_claimed_pop(_Atomic uint64_t *head, int *ret_api)
{
    uint64_t ptr = atomic_load_explicit(head, memory_order_acquire);
    while (ptr) {
        struct cuheap_arena *a = map_lookup(ptr);
        uint32_t u = a ? unit_of(a, ptr) : 0;
        uint64_t next =
            a && u < a->buddy.nr_units ? __atomic_load_n(&a->buffer_id[u], __ATOMIC_RELAXED) : 0;
        if (!atomic_compare_exchange_weak_explicit(head, &ptr, next, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* a handler pushed meanwhile: ptr is the new head */
        if (!a || u >= a->buddy.nr_units) {
            ptr = next; /* its arena went with its context: nothing left to free */
            continue;
        }
        uint64_t v = __atomic_load_n(&a->link[u], __ATOMIC_RELAXED);
        uint64_t size = v & ((1ull << CLAIM_API_SHIFT) - 1);
        *ret_api = (int)(v >> CLAIM_API_SHIFT);
        __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELEASE);
        atomic_fetch_sub_explicit(&a->pool->claimed, size, memory_order_relaxed);
        atomic_fetch_sub_explicit(&a->pool->claimed_blocks, block_of_size(a->pool, size),
                                  memory_order_relaxed);
        return ptr;
    }
    return 0;
}

/* Whether a block freed on a known stream (the pluggable allocator's frees) waits in that
 * stream's cache, for reuse there at once, or behind a fence as other frees do. Under vmm only
 * blocks under half a granule: a cached block stays whole at its order with its granules
 * mapped, so a request of another order maps new memory while the cache's sits unused, and one
 * of the same order may need more granules than the cached block has; behind a fence the
 * block merges back into its arena, where placement finds its memory (the GPT replay through
 * the pluggable allocator: bench/RESULTS.md). */
static bool stream_cacheable(const struct cuheap_pool *p, uint64_t block)
{
    return (!p->vmm || block < granule_bytes(p) / 2) && !(block & (block - 1));
}

static int pool_free_slow(struct cuheap_pool *p, uint64_t ptr, uint64_t stream, bool cached,
                          uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_tcache *mine = tc_find(p);
    if (mine && mine->large_on && cached && /* here for the reason pool_alloc_slow says */
        tc_large_free(p, mine, map_lookup(ptr), ptr, ret_size, ret_block, ret_seq) == 0)
        return 0;
    pool_lock_noting(p, mine);
    struct cuheap_arena *a = map_lookup(ptr);
    int64_t found = a && a->pool == p ? block_bytes_at(a, ptr) : -EINVAL;
    uint32_t u = found < 0 ? 0 : unit_of(a, ptr);
    uint64_t size = found < 0 ? 0 : __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size) {
        pool_unlock(p);
        return -EINVAL; /* not a block start, or not live: a double free */
    }
    uint64_t block = (uint64_t)found;
    unsigned order = (unsigned)__builtin_ctzll(block); /* that of its list, when it has one */
    p->st.live -= size;
    p->st.live_blocks -= block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    *ret_size = size;
    *ret_block = block;
    struct cuheap_stream_cache *sc =
        stream && stream_cacheable(p, block) ? stream_cache_locked(p, stream, true) : NULL;
    if (sc) {
        a->link[u] = sc->heads[order];
        sc->heads[order] = ptr;
        sc->bytes += block;
        p->st.pending += block;
        p->pending_mapped += extent_at(p, a, ptr);
        /* Keep per-stream hoards bounded: past an arena's worth, share them behind a fence. */
        if (sc->bytes > p->cfg->arena_size) {
            flush_stream_caches_locked(p);
            close_epoch_locked(p);
        }
    } else if (p->cfg->reuse == CUHEAP_REUSE_IMMEDIATE) {
        return_block_locked(p, a, ptr);
    } else if (p->cfg->reuse == CUHEAP_REUSE_SYNC) {
        pool_unlock(p);
        dev_device_sync(p); /* what cuMemFree itself would have waited for */
        pool_lock(p);
        return_block_locked(p, a, ptr);
    } else {
        pend_locked(p, a, ptr, block);
        /* blocks whose fence has passed may empty an arena that can go back now */
        if (p->cfg->release == CUHEAP_RELEASE_EMPTY)
            reclaim_locked(p);
    }
    if (cached)
        tc_get_locked(p); /* this thread's next frees need no lock */
    uint64_t bases[CUHEAP_NR_SPARE_MAX], sizes[CUHEAP_NR_SPARE_MAX];
    unsigned nr = 0;
    if (p->cfg->release == CUHEAP_RELEASE_EMPTY && p->vmm) /* idle granules go back at once, */
        release_idle_locked(p, p->cfg->pool_init + p->cfg->vmm_cushion); /* but a cushion */
    else if (p->cfg->release == CUHEAP_RELEASE_EMPTY)
        nr = unlink_spare_locked(p, bases, sizes);
    pool_unlock(p);
    if (nr)
        free_arenas_unlocked(p, bases, sizes, nr);
    debug_check(p);
    return 0;
}

int cuheap_pool_block_range(struct cuheap_pool *p, uint64_t ptr, uint64_t *ret_base,
                            uint64_t *ret_size, uint64_t *ret_buffer_id, uint64_t *ret_arena)
{
    pool_lock(p);
    struct cuheap_arena *a = map_lookup(ptr);
    uint64_t start, bytes;
    bool allocated;
    int r = -EINVAL;
    if (a && block_holding(a, ptr, &start, &bytes, &allocated) == 0 && allocated) {
        uint32_t u = unit_of(a, start);
        uint64_t size = size_at(a, u);
        if (size && ptr < start + size) {
            *ret_base = start;
            *ret_size = size;
            *ret_buffer_id = __atomic_load_n(&a->buffer_id[u], __ATOMIC_RELAXED);
            *ret_arena = a->buddy.base;
            r = 0;
        }
    }
    pool_unlock(p);
    return r;
}

int cuheap_pool_share(struct cuheap_pool *p, uint64_t block, uint64_t buffer_id,
                      struct cuheap_share *pieces, unsigned max)
{
    pool_lock(p);
    int r =
        !p->vmm || !dev_has_export(p) ? -EINVAL : share_locked(p, block, buffer_id, pieces, max);
    pool_unlock(p);
    return r;
}
