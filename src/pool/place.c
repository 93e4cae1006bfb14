/* SPDX-License-Identifier: MIT */
/*
 * Blocks: where a block of a size goes (the buddy allocator, scored under vmm by the memory
 * already mapped where it would land), the quick lists that keep freed blocks whole, merging
 * back into the buddy, live marks, and the purge of metadata pages under large free blocks.
 *
 * Lock rule: p->lock held in every function here. No driver call.
 */
#include "internal.h"

#define CUHEAP_VMM_FIT_SLACK 5 /* percent of live bytes, idle_fit_now() */

/* The CUHEAP_VMM_IDLE_FIT in force: above 125 only while the memory the pool's blocks keep
 * busy is within CUHEAP_VMM_FIT_SLACK percent of the bytes they asked for. A block put into an
 * idle chunk larger than itself leaves granules of a busy chunk that only neighbours at those
 * addresses can use, and blocks end up spread over more granules; over a long job the memory
 * held creeps up, and this guard, which places blocks as 125 does until the spread shrinks
 * again, stops it. The bytes asked for, not rounded up to granules: so for a job whose blocks
 * round up by more than the slack (3 MiB blocks keep 4 MiB busy), 200 acts as 125; but
 * counting the rounding let the creep back, and so did measuring only the free granules of
 * busy chunks. The live bytes are the pool's with the thread caches' folded in at each batch
 * they close (tc_close), so they lag by at most a batch a thread. */
static unsigned idle_fit_now(const struct cuheap_pool *p)
{
    unsigned fit = p->cfg->vmm_idle_fit;
    if (fit <= 125)
        return fit;
    uint64_t busy = busy_bytes_locked(p);
    int64_t live = (int64_t)p->st.live; /* a thread cache's frees may run ahead of it */
    if (live <= 0 || busy / (100 + CUHEAP_VMM_FIT_SLACK) > (uint64_t)live / 100)
        return busy ? 125 : fit;
    return fit;
}

/* vmm: how good [addr, addr + len) is for a block of size bytes: the bytes of it that have
 * memory mapped the block should use (len when all of it has), less those of idle chunks it
 * should not. A place where memory is mapped needs no driver call; but a chunk is mapped and
 * released whole, so a block put into an idle chunk much larger than itself keeps all of it
 * busy: a 4 KiB block in a 64 MiB chunk holds 64 MiB. Busy chunks, and idle ones up to
 * CUHEAP_VMM_IDLE_FIT percent of the block's granules, are good; larger idle ones are
 * avoided, kept whole for a block of their size. (At 125, blocks map chunks of their own next
 * to idle ones twice their size, and at the budget idle ones are released to make room for
 * them: more driver calls than at 200.) */
static int64_t place_score(void *arg, uintptr_t addr, uint64_t len, uint64_t size)
{
    const struct cuheap_arena *a = arg;
    unsigned shift = a->pool->granule_shift;
    uint64_t off = addr - a->buddy.base, first = off >> shift, last = (off + len - 1) >> shift;
    /* the place itself (len == size only there): granules it would keep busy for nothing count
     * twice against it, so that it is never full, and worse than unmapped memory once they are
     * half as many as the mapped ones it uses (scored always worse, a training-shaped loop with
     * late fences held more: test_vmm_late_fences_do_not_raise_the_budget) */
    uint64_t waste = len == size ? wasted_granules(a->pool, a, (uint32_t)last,
                                                   (uint32_t)((off + pow2_ceil(size) - 1) >> shift))
                                 : 0;
    uint64_t fits = ((size + (1ull << shift) - 1) >> shift) * idle_fit_now(a->pool) / 100;
    uint64_t good = 0, bad = 0, idle = 0;
    /* CUHEAP_VMM_LAYOUT=aligned: chunks are one size, so an idle one serves any block; but the
     * free granules of a busy chunk cost nothing more, so they come first */
    bool aligned = a->pool->cfg->vmm_layout == CUHEAP_VMM_ALIGNED;
    /* a chunk's granules share its verdict: one look per chunk, and none at unmapped words
     * (looking at every granule made scoring the dearest part of a large pair) */
    uint64_t g = next_mapped_granule(a, first);
    if (g > last)
        return CUHEAP_BUDDY_SCORE_NOTHING; /* nothing mapped: the buddy splits it unscored */
    for (; g <= last; g = next_mapped_granule(a, g)) {
        const struct cuheap_chunk *c = a->granules[g].chunk;
        uint64_t end =
            (uint64_t)c->first + c->nr - 1 < last ? (uint64_t)c->first + c->nr - 1 : last;
        if (c->nr_busy || (c->nr <= fits && !aligned))
            good += end - g + 1;
        else if (aligned)
            idle += end - g + 1;
        else
            bad += end - g + 1;
        g = end + 1;
        if (g > last)
            break;
    }
    if (waste)
        return (int64_t)(good << shift) - (int64_t)((2 * waste) << shift) - 1;
    if (good == last - first + 1)
        return (int64_t)len;
    return (int64_t)(good << shift) + (int64_t)(idle << (shift - 1)) - (int64_t)(bad << shift);
}

#define CUHEAP_VMM_CANDIDATES 8 /* free blocks of one order looked at for a mapped one */

/* Merge the blocks kept whole (vmm, above CUHEAP_QUICK_MAX_ORDER) back into their arenas, so
 * that placement sees their mapped granules. Returns how many. */
static unsigned merge_whole_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    for (unsigned o = CUHEAP_QUICK_MAX_ORDER + 1; p->nr_whole && o < CUHEAP_NR_ORDERS; o++)
        while (p->quick[o].head) {
            struct cuheap_arena *a;
            uint64_t ptr = quick_pop_locked(p, o, &a);
            merge_block_locked(p, a, ptr);
            n++;
        }
    return n;
}

/* Legacy: the arena whose smallest free block that fits is the smallest (the first such from
 * p->hint), so that a small block takes a small free piece rather than splitting the only
 * large one of the first arena with room: requests of 8-16 MiB among smaller ones on four
 * streams grew the pool to several times their live bytes when they found every large piece
 * split (bench/RESULTS.md). Returns p->hint when no arena has one. */
static unsigned best_fit_arena_locked(const struct cuheap_pool *p, unsigned order)
{
    unsigned best = p->hint, best_order = CUHEAP_NR_ORDERS;
    uint64_t fits = order < 64 ? ~((1ull << order) - 1) : 0;
    for (unsigned n = 0; n < p->nr_arenas; n++) {
        unsigned i = (p->hint + n) % p->nr_arenas;
        uint64_t free_orders = p->arenas[i]->buddy.free_bitmap & fits;
        if (!free_orders)
            continue;
        unsigned o = (unsigned)__builtin_ctzll(free_orders);
        if (o < best_order) {
            best_order = o;
            best = i;
            if (o == order)
                break; /* none fits better */
        }
    }
    return best;
}

/* Whether some arena has a free block of size bytes or more: it would be given at once. */
bool room_for_locked(const struct cuheap_pool *p, uint64_t size)
{
    unsigned order = order_of_size(p, size);
    uint64_t fits = order < 64 ? ~((1ull << order) - 1) : 0;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        const struct cuheap_arena *a = p->arenas[i];
        if (arena_first_fit(a) ? cuheap_fit_largest_free(&a->fit) >= block_of_size(p, size)
                               : (a->buddy.free_bitmap & fits) != 0)
            return true;
    }
    return false;
}

/* First fit: the lowest place in the lowest arena that holds the request's block. */
static int take_first_fit_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr,
                                 uint64_t *ret_block, struct cuheap_arena **ret_arena)
{
    uint64_t want = block_of_size(p, size);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        uintptr_t addr;
        uint64_t got;
        if (cuheap_fit_alloc(&a->fit, want, &addr, &got))
            continue;
        if (a->nr_live++ == 0)
            p->nr_empty--;
        *ret_ptr = addr;
        *ret_block = got;
        *ret_arena = a;
        return 0;
    }
    return -ENOMEM;
}

/* A block of at least size bytes from what the pool has, with no driver call (p->lock held):
 * its order's quick list first (a block kept whole only where its memory is still mapped), else
 * the buddy of an arena with room, from the last one that had some (p->hint), placed under vmm
 * by place_score; or under first fit the lowest place that holds it. Neither live yet
 * (mark_live_locked) nor, under vmm, backed (use_granules_locked). Returns 0 with the block's
 * start, its bytes (block_of_size) and its arena, or -ENOMEM when no arena has room: the caller
 * reclaims, trims or grows and asks again. */
int take_block_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr, uint64_t *ret_block,
                      struct cuheap_arena **ret_arena)
{
    unsigned order = order_of_size(p, size);
    struct cuheap_quick *q =
        order < CUHEAP_NR_ORDERS && pow2_block(p, size) ? &p->quick[order] : NULL;
    /* a block kept whole is taken only where its memory is still mapped and fits it: else
     * placement decides, which may find mapped memory elsewhere */
    if (q && q->head && order > CUHEAP_QUICK_MAX_ORDER &&
        !block_fits_locked(p, map_lookup(q->head), q->head, size, 1ull << order)) {
        struct cuheap_arena *a;
        uint64_t ptr = quick_pop_locked(p, order, &a);
        merge_block_locked(p, a, ptr);
    }
    if (q && q->head) {
        struct cuheap_arena *a;
        *ret_ptr = quick_pop_locked(p, order, &a);
        *ret_block = 1ull << order;
        *ret_arena = a;
        return 0;
    }
    if (p->first_fit)
        return take_first_fit_locked(p, size, ret_ptr, ret_block, ret_arena);
    unsigned first = p->vmm ? p->hint : best_fit_arena_locked(p, order);
    for (unsigned n = 0; n < p->nr_arenas; n++) {
        unsigned i = (first + n) % p->nr_arenas;
        struct cuheap_arena *a = p->arenas[i];
        uintptr_t addr;
        unsigned got;
        /* a block of a granule or more is well placed only on mapped granules no block uses:
         * where the arena has none, there is nothing to score */
        bool score = p->vmm && (size < granule_bytes(p) || a->nr_mapped > a->nr_used);
        int r =
            score ? cuheap_buddy_alloc_scored(&a->buddy, size, place_score, a,
                                              CUHEAP_VMM_CANDIDATES, p->granule_shift, &addr, &got)
                  : cuheap_buddy_alloc(&a->buddy, size, &addr, &got);
        /* a place that needs memory mapped, while blocks kept whole hide mapped memory from
         * placement: merge those and look again (else a block maps memory while mapped
         * memory sits in blocks kept whole) */
        if (r == 0 && p->nr_whole && !block_mapped_locked(p, a, addr, size) &&
            merge_whole_locked(p)) {
            cuheap_buddy_free(&a->buddy, addr);
            n--; /* the same arena again */
            continue;
        }
        if (r == 0) {
            p->hint = i;
            if (a->nr_live++ == 0)
                p->nr_empty--;
            *ret_ptr = addr;
            *ret_block = 1ull << got;
            *ret_arena = a;
            return 0;
        }
    }
    return -ENOMEM;
}

void mark_live_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                      uint64_t block)
{
    uint32_t u = unit_of(a, ptr);
    __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELAXED);
    __atomic_store_n(&a->buffer_id[u], buffer_id_prefix(p) | next_buffer_ids(p, 1),
                     __ATOMIC_RELAXED);
    p->st.live += size;
    p->st.live_blocks += block;
}

/* Give a not-live block back to its buddy allocator. */
void merge_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    if ((arena_first_fit(a) ? cuheap_fit_free(&a->fit, ptr) : cuheap_buddy_free(&a->buddy, ptr)) <
        0)
        return;
    p->nr_merged++;
    if (--a->nr_live == 0)
        p->nr_empty++;
}

/* ---- metadata of free address space ----
 *
 * Blocks land all over an arena's address range in a long run (placement follows mapped
 * memory and the free lists, not the lowest address), and each touches the pages of the
 * per-unit arrays at its start. Kept, those pages would end up holding 41 bytes of host
 * memory for every 512 of the arenas' address space, whatever the job uses. So every
 * CUHEAP_PURGE_EVERY merges the pages wholly inside large free blocks go back to the kernel.
 * Their units hold nothing anyone reads (not live, no granules, on no list): zeros, as the
 * pages read afterwards. A thread cache's free of a bad pointer may read or swap a size
 * there without p->lock: it finds 0 either way. */
#define CUHEAP_PURGE_MIN_UNITS 10 /* free blocks of 2^10 units or more: a page of each array */

static void purge_units(void *arg, uint32_t first, uint32_t nr)
{
    struct cuheap_arena *a = arg;
    cuheap_buddy_drop_pages(a->block_size, sizeof(*a->block_size), first, nr);
    cuheap_buddy_drop_pages(a->buffer_id, sizeof(*a->buffer_id), first, nr);
    cuheap_buddy_drop_pages(a->link, sizeof(*a->link), first, nr);
    cuheap_buddy_drop_pages(a->extent, sizeof(*a->extent), first, nr);
}

/* p->lock held, where an allocation's slow path begins: no caller is in the middle of a walk
 * over blocks it is merging. */
void purge_meta_locked(struct cuheap_pool *p)
{
    p->nr_merged = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        /* first fit keeps block starts packed low, so the records they touch stay within the
         * highest address in use; purging its free ranges only made them churn (page faults:
         * bench/RESULTS.md, the soak under first fit) */
        if (!arena_first_fit(a))
            cuheap_buddy_purge(&a->buddy, a->buddy.min_order + CUHEAP_PURGE_MIN_UNITS, purge_units,
                               a);
    }
}

/* Give a not-live block back for reuse: onto its order's quick list while there is room,
 * else merged into its arena. */
void return_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    cuheap_assert(a && __atomic_load_n(&a->block_size[unit_of(a, ptr)], __ATOMIC_RELAXED) == 0);
    if (p->vmm)
        unuse_granules_locked(p, a, ptr);
    int64_t bytes = block_bytes_at(a, ptr);
    if (bytes < 0)
        return;
    unsigned order = (unsigned)__builtin_ctzll((uint64_t)bytes);
    if (bytes != 1ll << order || (p->first_fit && order > p->tc_max_order)) {
        /* first fit: a block of its own size is found again where it was, with no list */
        merge_block_locked(p, a, ptr);
        return;
    }
    struct cuheap_quick *q = &p->quick[order];
    /* Bounded: quick lists must not hoard what other sizes or the driver could use. Under vmm
     * a block on a quick list holds address space only (its granules went idle above), but it
     * hides that mapped memory from placement: blocks above CUHEAP_QUICK_MAX_ORDER kept whole,
     * many an order, made placement move idle chunks far more often, each an unmap and a map.
     * One an order is kept: a loop that frees a 2 or 20 MiB block and asks for
     * another of its size then takes it back without merging it up through a 4 GiB arena and
     * splitting it down again, scored at every level (which cost that loop most of its pair);
     * and when the scored placement settles on a place that needs memory mapped, those kept
     * whole are merged and it looks again (take_block_locked), so the mapping calls stay as
     * they were. Below a granule too, one an order: a block kept there stays out of its
     * buddy, so its granule never comes back whole, and the list hands it out again wherever
     * it lies, whatever is mapped or used around it; 64 an order spread blocks of random sizes
     * over granules they kept busy (bench/RESULTS.md), where merged, placement packs
     * them into the granules in use. A loop of one size still gets its block back. */
    bool whole = p->vmm && order > CUHEAP_QUICK_MAX_ORDER && q->nr == 0;
    bool small = order <= CUHEAP_QUICK_MAX_ORDER &&
                 (p->vmm ? q->nr == 0
                         : q->nr < CUHEAP_QUICK_MAX &&
                               p->quick_bytes + (1ull << order) <= p->cfg->arena_size / 8);
    if (p->cfg->release != CUHEAP_RELEASE_EMPTY && (whole || small)) {
        a->link[unit_of(a, ptr)] = q->head;
        q->head = ptr;
        q->nr++;
        p->quick_bytes += 1ull << order;
        p->nr_whole += whole;
        return;
    }
    merge_block_locked(p, a, ptr);
}

/* Merge every quick-list block back into its arena. Returns how many. */
unsigned flush_quick_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
        struct cuheap_quick *q = &p->quick[o];
        while (q->head) {
            uint64_t ptr = q->head;
            struct cuheap_arena *a = map_lookup(ptr);
            q->head = a->link[unit_of(a, ptr)];
            merge_block_locked(p, a, ptr);
            n++;
        }
        q->nr = 0;
    }
    p->quick_bytes = 0;
    p->nr_whole = 0;
    return n;
}

/* Whether every granule the first size bytes of the block at ptr reach into is mapped. */
bool block_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size)
{
    uint32_t first, last;
    granule_span(p, a, ptr, size, &first, &last);
    for (uint32_t g = first; g <= last; g++)
        if (!a->granules[g].chunk)
            return false;
    return true;
}
