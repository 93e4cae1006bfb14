/* SPDX-License-Identifier: MIT */
/*
 * The invariant checker: every arena's buddy, granules, chunks and records, the pending and
 * quick lists and the thread caches, against the pool's counts. Tests call it; debug builds
 * (-Ddebug_checks=true) every 64th operation.
 *
 * Lock rule: takes p->lock and holds every thread cache while it looks.
 */
#include "tcache.h"

#include <stdio.h>
#include <stdlib.h>

/* Operations between two debug checks; 0 = none (cuheap_pool_debug_check_every). */
static _Atomic unsigned debug_every = 64;

void cuheap_pool_debug_check_every(unsigned every)
{
    atomic_store(&debug_every, every);
}

/* Debug builds (-Ddebug_checks=true) check every invariant every 64th operation (a check
 * walks every unit of every arena). */
void debug_check(struct cuheap_pool *p)
{
#ifdef CUHEAP_DEBUG
    static _Atomic unsigned nr_ops;
    char why[256];
    unsigned every = atomic_load(&debug_every);
    if (every && atomic_fetch_add(&nr_ops, 1) % every == 0 &&
        cuheap_pool_check(p, why, sizeof(why)))
        cuheap_assert_fail(why, __FILE__, __LINE__);
#else
    (void)p;
#endif
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, why_size, __VA_ARGS__);                                                      \
        goto failed;                                                                               \
    } while (0)

/* vmm: every granule's users are the live and pending blocks whose used bytes reach into it;
 * a used granule is mapped; a mapped granule nobody uses is on the idle list. */
static int check_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, char *why,
                                 size_t why_size)
{
    uint32_t *users = calloc(a->nr_granules ? a->nr_granules : 1, sizeof(*users));
    uint32_t mapped = 0;
    if (!users) {
        snprintf(why, why_size, "no memory for the check");
        return -EFAULT;
    }
    for (uint32_t u = 0; u < a->buddy.nr_units;) {
        uint64_t bytes;
        bool allocated;
        uintptr_t addr = a->buddy.base + ((uintptr_t)u << a->buddy.min_order);
        if (piece_at(a, addr, &bytes, &allocated)) {
            snprintf(why, why_size, "nothing starts at %#lx", (unsigned long)addr);
            free(users);
            return -EFAULT;
        }
        if (a->extent[u]) {
            uint32_t first, last;
            granule_span(p, a, addr, a->extent[u], &first, &last);
            if (!allocated || a->extent[u] > bytes) {
                snprintf(why, why_size, "block %#lx holds granules but is free or too small",
                         (unsigned long)addr);
                free(users);
                return -EFAULT;
            }
            for (uint32_t g = first; g <= last; g++)
                users[g]++;
        }
        u += (uint32_t)(bytes >> a->buddy.min_order);
    }
    if (p->granting == a) {
        /* the mapper's block: its mapped granules past its extent are held before the extent
         * grows (use_granules_locked) */
        uint32_t first, last, held_first, held_last;
        uint64_t old = a->extent[unit_of(a, p->granting_ptr)];
        granule_span(p, a, p->granting_ptr, p->granting_size, &first, &last);
        if (old) {
            granule_span(p, a, p->granting_ptr, old, &held_first, &held_last);
            first = held_last + 1;
        }
        for (uint32_t g = first; g <= last; g++)
            users[g] += a->granules[g].chunk != NULL;
    }
    int r = 0;
    for (uint32_t g = 0; g < a->nr_granules && !r; g++) {
        const struct cuheap_granule *gr = &a->granules[g];
        const struct cuheap_chunk *c = gr->chunk;
        mapped += c != NULL;
        bool bit = (a->mapped_bits[g / 64] >> (g % 64)) & 1;
        if (gr->nr_users != users[g] || (gr->nr_users && !c) || bit != (c != NULL) ||
            (c && (!c->handle || c->arena != a || &a->chunks[c->first] != c || g < c->first ||
                   g >= c->first + c->nr))) {
            snprintf(why, why_size, "granule %u at %#lx: %u users (counted %u), mapped %d", g,
                     (unsigned long)granule_va(a, g), gr->nr_users, users[g], c != NULL);
            r = -EFAULT;
        }
    }
    for (uint32_t g = 0; g < a->nr_granules && !r; g++) {
        const struct cuheap_chunk *c = &a->chunks[g];
        if (!c->handle)
            continue;
        uint32_t busy = 0;
        for (uint32_t k = c->first; k < c->first + c->nr && k < a->nr_granules; k++)
            busy += a->granules[k].nr_users > 0;
        bool idle = c->idle_next != NULL;
        /* aligned layout: a chunk never crosses a piece's edge, or it could not move whole */
        bool crosses = p->cfg->vmm_layout == CUHEAP_VMM_ALIGNED &&
                       c->first / p->chunk_max != (c->first + c->nr - 1) / p->chunk_max;
        if (c->first != g || busy != c->nr_busy || idle != !busy || crosses) {
            snprintf(why, why_size, "chunk at %#lx: %u granules, %u busy (counted %u), idle %d",
                     (unsigned long)granule_va(a, g), c->nr, c->nr_busy, busy, idle);
            r = -EFAULT;
        }
    }
    for (uint32_t w = 0; w < (a->nr_granules + 63) / 64 && !r; w++) {
        if (((a->mapped_words[w / 64] >> (w % 64)) & 1) != (a->mapped_bits[w] != 0)) {
            snprintf(why, why_size, "mapped-word summary wrong at granule %u", w * 64);
            r = -EFAULT;
        }
    }
    uint32_t used = 0;
    for (uint32_t g = 0; g < a->nr_granules; g++)
        used += a->granules[g].nr_users > 0;
    if (!r && used != a->nr_used) {
        snprintf(why, why_size, "arena has %u granules in use, counted %u", a->nr_used, used);
        r = -EFAULT;
    }
    if (!r && mapped != a->nr_mapped) {
        snprintf(why, why_size, "arena maps %u granules, counted %u", a->nr_mapped, mapped);
        r = -EFAULT;
    }
    free(users);
    return r;
}

/* Whether the block at ptr is allocated in its arena, starts there and is not live: what a
 * block waiting on a list (pending, quick, a thread's cache) must be. Returns its bytes or -1. */
static int64_t idle_block_bytes(struct cuheap_arena *a, uint64_t ptr)
{
    if (!a || size_at(a, unit_of(a, ptr)))
        return -1;
    return block_bytes_at(a, ptr);
}

/* The blocks of a thread's batch: freed, not live, of the order they carry. */
static int check_batch(const struct tc_batch *b, char *why, size_t why_size)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block *k = &b->blocks[i];
        int64_t got = idle_block_bytes(k->arena, tc_ptr(k));
        if (map_lookup(tc_ptr(k)) != k->arena || got != (int64_t)(1ull << tc_order(k)))
            FAIL("block %#lx freed into a thread cache is live or not a block",
                 (unsigned long)tc_ptr(k));
        bytes += (uint64_t)got;
    }
    if (bytes != b->bytes)
        FAIL("a thread's batch holds %lu bytes, counted %lu", (unsigned long)b->bytes,
             (unsigned long)bytes);
    return 0;
failed:
    return -EFAULT;
}

/* The thread caches' lists (every cache locked by the caller). */
static int check_tcaches_locked(struct cuheap_pool *p, char *why, size_t why_size)
{
    /* each only grows: read in this order, a later one is never below an earlier one */
    uint64_t passed = atomic_load(&p->tl.passed), recorded = atomic_load(&p->tl.recorded),
             started = atomic_load(&p->tl.started);
    if (passed > recorded || recorded > started)
        FAIL("timeline: %lu fences passed, %lu recorded, %lu begun", (unsigned long)passed,
             (unsigned long)recorded, (unsigned long)started);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next) {
        uint64_t ready = 0;
        for (unsigned o = 0; o < TC_NR_ORDERS; o++)
            for (unsigned i = 0; i < tc->nr_ready[o]; i++) {
                const struct tc_block *b = &tc->ready[o][i];
                if (map_lookup(b->ptr) != b->arena ||
                    idle_block_bytes(b->arena, b->ptr) != (int64_t)(1ull << o))
                    FAIL("thread-cached block %#lx of order %u is live or not a block",
                         (unsigned long)b->ptr, o);
                ready += 1ull << o;
            }
        if (ready != tc->ready_bytes)
            FAIL("thread cache holds %lu ready bytes, counted %lu", (unsigned long)tc->ready_bytes,
                 (unsigned long)ready);
        if (tc->closed_tail - tc->closed_head > TC_NR_CLOSED)
            FAIL("thread cache has %u closed batches", tc->closed_tail - tc->closed_head);
        if (tc_open(tc)->fence || tc_open(tc)->passed)
            FAIL("thread cache's open batch has a fence");
        if (check_batch(tc_open(tc), why, why_size))
            return -EFAULT;
        if (tc->large.ptr && (map_lookup(tc_ptr(&tc->large)) != tc->large.arena ||
                              idle_block_bytes(tc->large.arena, tc_ptr(&tc->large)) !=
                                  (int64_t)(1ull << tc_order(&tc->large)) ||
                              tc->large_ticket > atomic_load(&p->tl.started)))
            FAIL("thread's large block %#lx is live, not a block or has a ticket from the future",
                 (unsigned long)tc_ptr(&tc->large));
        for (unsigned c = tc->closed_head; c != tc->closed_tail; c++)
            if (check_batch(tc_batch_at(tc, c), why, why_size))
                return -EFAULT;
    }
    return 0;
failed:
    return -EFAULT;
}

static int check_locked(struct cuheap_pool *p, char *why, size_t why_size);

uint64_t cuheap_pool_debug_live(struct cuheap_pool *p)
{
    pool_lock(p);
    uint64_t live = p->st.live;
    pool_unlock(p);
    return live;
}

bool cuheap_pool_debug_enter(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_enter(tc);
    return tc != NULL;
}

void cuheap_pool_debug_leave(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_leave(tc);
}

void cuheap_pool_debug_hold(struct cuheap_pool *p)
{
    pool_lock(p);
    tc_hold_all(p);
}

void cuheap_pool_debug_unhold(struct cuheap_pool *p)
{
    tc_unhold_all(p);
    pool_unlock(p);
}

int cuheap_pool_check(struct cuheap_pool *p, char *why, size_t why_size)
{
    pool_lock(p);
    /* every thread's cache held still: their blocks change size without p->lock */
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_fold_locked(p, tc);
    int r = check_tcaches_locked(p, why, why_size);
    if (!r)
        r = check_locked(p, why, why_size);
    tc_unhold_all(p);
    pool_unlock(p);
    return r;
}

static int check_locked(struct cuheap_pool *p, char *why, size_t why_size)
{
    uint64_t reserved = 0, live = 0, live_blocks = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        if (arena_first_fit(a) ? cuheap_fit_check(&a->fit, why, why_size)
                               : cuheap_buddy_check(&a->buddy, why, why_size))
            return -EFAULT;
        if (map_lookup(a->buddy.base) != a)
            FAIL("arena %u missing from the address map", i);
        if (p->vmm && check_granules_locked(p, a, why, why_size))
            goto failed;
        reserved += p->vmm ? (uint64_t)a->nr_mapped << p->granule_shift : a->buddy.size;
        uint64_t arena_allocated = 0;
        for (uint32_t u = 0; u < a->buddy.nr_units;) {
            uint64_t bytes;
            bool allocated;
            uintptr_t addr = a->buddy.base + ((uintptr_t)u << a->buddy.min_order);
            if (piece_at(a, addr, &bytes, &allocated))
                FAIL("nothing starts at %#lx", (unsigned long)addr);
            if (allocated) {
                arena_allocated++;
                uint64_t size = size_at(a, u);
                if (size) {
                    live += size;
                    live_blocks += bytes;
                    /* what a free without the lock works out from the size (block_of_size) */
                    if (bytes != block_of_size(p, size))
                        FAIL("block at %#lx holds %lu bytes in a %lu byte block",
                             (unsigned long)addr, (unsigned long)size, (unsigned long)bytes);
                }
            } else if (size_at(a, u)) {
                FAIL("free block at %#lx still has a size", (unsigned long)addr);
            }
            u += (uint32_t)(bytes >> a->buddy.min_order);
        }
        if (arena_allocated != a->nr_live)
            FAIL("arena %u: nr_live %lu, counted %lu", i, (unsigned long)a->nr_live,
                 (unsigned long)arena_allocated);
    }
    unsigned empty = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++)
        empty += p->arenas[i]->nr_live == 0;
    if (empty != p->nr_empty)
        FAIL("nr_empty %u, counted %u", p->nr_empty, empty);
    for (unsigned i = 0; i < p->nr_stuck; i++)
        reserved += p->stuck[i].bytes;
    reserved += p->st.lost;
    reserved += p->inflight_bytes; /* a mapping call in flight (phys.c) */
    if (reserved != p->st.reserved)
        FAIL("reserved %lu, arenas add up to %lu", (unsigned long)p->st.reserved,
             (unsigned long)reserved);
    live += atomic_load(&p->claimed); /* live still: a signal handler's free in progress */
    live_blocks += atomic_load(&p->claimed_blocks);
    if (live != p->st.live || live_blocks != p->st.live_blocks)
        FAIL("live %lu/%lu, counted %lu/%lu", (unsigned long)p->st.live,
             (unsigned long)p->st.live_blocks, (unsigned long)live, (unsigned long)live_blocks);
    /* Every pending block is allocated in its buddy and not live. */
    uint64_t pending = 0, pending_mapped = 0;
    struct cuheap_syncing *syncing = p->syncing;
    for (unsigned e = p->ep_head; e != p->ep_tail + 1 || syncing;) {
        struct cuheap_epoch *ep;
        if (e != p->ep_tail + 1) {
            ep = &p->epochs[e++ % CUHEAP_NR_EPOCHS];
        } else {
            ep = &syncing->epoch; /* then those a device sync covers */
            syncing = syncing->next;
        }
        for (uint64_t ptr = ep->head; ptr;) {
            struct cuheap_arena *a = map_lookup(ptr);
            if (!a || size_at(a, unit_of(a, ptr)))
                FAIL("pending block %#lx is live or outside every arena", (unsigned long)ptr);
            uint64_t start, bytes;
            bool allocated;
            if (block_holding(a, ptr, &start, &bytes, &allocated) || !allocated || start != ptr)
                FAIL("pending block %#lx is free in its arena", (unsigned long)ptr);
            pending += bytes;
            pending_mapped += extent_at(p, a, ptr);
            ptr = a->link[unit_of(a, ptr)];
        }
    }
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        pending += p->caches[c].bytes;
        for (unsigned o = 0; o < CUHEAP_NR_ORDERS && p->caches[c].stream; o++)
            for (uint64_t ptr = p->caches[c].heads[o]; ptr;) {
                struct cuheap_arena *a = map_lookup(ptr);
                pending_mapped += extent_at(p, a, ptr);
                ptr = a->link[unit_of(a, ptr)];
            }
    }
    if (pending_mapped != p->pending_mapped)
        FAIL("pending_mapped %lu, pending blocks reach %lu", (unsigned long)p->pending_mapped,
             (unsigned long)pending_mapped);
    uint64_t quick = 0, whole = 0;
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
        uint32_t nr = 0;
        for (uint64_t ptr = p->quick[o].head; ptr; nr++) {
            struct cuheap_arena *a = map_lookup(ptr);
            if (!a || size_at(a, unit_of(a, ptr)) || block_bytes_at(a, ptr) != (int64_t)(1ull << o))
                FAIL("quick block %#lx of order %u is live or not a block", (unsigned long)ptr, o);
            quick += 1ull << o;
            ptr = a->link[unit_of(a, ptr)];
        }
        if (nr != p->quick[o].nr)
            FAIL("quick list of order %u: nr %u, counted %u", o, p->quick[o].nr, nr);
        if (o > CUHEAP_QUICK_MAX_ORDER)
            whole += nr;
    }
    if (whole != p->nr_whole)
        FAIL("%lu blocks kept whole, counted %u", (unsigned long)whole, p->nr_whole);
    if (quick != p->quick_bytes)
        FAIL("quick_bytes %lu, lists hold %lu", (unsigned long)p->quick_bytes,
             (unsigned long)quick);
    if (pending != p->st.pending)
        FAIL("pending %lu, lists hold %lu", (unsigned long)p->st.pending, (unsigned long)pending);
    uint64_t nr_idle = 0, idle_bytes = 0;
    for (struct cuheap_chunk *c = p->idle.idle_next; p->vmm && c != &p->idle; c = c->idle_next) {
        nr_idle++;
        idle_bytes += chunk_bytes(p, c);
    }
    if (p->vmm && (nr_idle != p->nr_idle || idle_bytes != p->idle_bytes))
        FAIL("idle list holds %lu chunks of %lu bytes, counted %lu of %lu",
             (unsigned long)p->nr_idle, (unsigned long)p->idle_bytes, (unsigned long)nr_idle,
             (unsigned long)idle_bytes);
    return 0;
failed:
    return -EFAULT;
}
