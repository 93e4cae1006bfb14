/* SPDX-License-Identifier: MIT */
/*
 * The step plan's region (plan.c): its addresses, reserved once at the step's quiet moment,
 * and its pieces, mapped as the plan first serves a block over them and given back as they
 * go: a retired region's once no pinned block holds them, the current one's once no slot
 * covers them after a new placement. The plan decides what is served where; this part holds
 * the memory under it.
 *
 * Lock rule: entered and left with p->lock held; dropped only as the mapper around the driver
 * calls, and in the rest of the pool's own giving back (rest_settles_locked).
 */
#include "plan.h"

#include <string.h>

/* Unmap and give back the n pieces of rg marked PIECE_GOING (bytes in all), as the mapper with
 * p->lock dropped, and its addresses too when free_va and the driver took every piece. What
 * the driver kept stays counted, and a trim offers it again (p->stuck). */
static void give_back_going_locked(struct cuheap_pool *p, struct plan_region *rg, uint32_t n,
                                   uint64_t bytes, bool free_va)
{
    uint64_t ns = 0, resets = p->nr_resets, base = rg->arena.buddy.base;
    uint32_t gone = 0;
    bool ok[PLAN_MAX_PIECES];
    p->mapping = true;
    p->inflight_bytes += bytes;
    pool_unlock(p);
    for (uint32_t i = 0; i < rg->nr_pieces; i++) {
        if (rg->live[i] != PIECE_GOING)
            continue;
        ok[i] = dev_phys_unmap(p, base + (uint64_t)i * rg->piece_bytes, region_piece_len(rg, i),
                               &ns) == 0 &&
                dev_phys_release(p, rg->handle[i], &ns) == 0;
        gone += ok[i];
    }
    if (free_va && gone == n)
        dev_va_free(p, base, rg->bytes);
    pool_lock(p);
    p->st.map_ns += ns;
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
    if (p->nr_resets != resets)
        return; /* the context went meanwhile: plan_forget_locked counted the region */
    p->inflight_bytes -= bytes;
    for (uint32_t i = 0; i < rg->nr_pieces; i++) {
        if (rg->live[i] != PIECE_GOING)
            continue;
        account_release_locked(p, ok[i], rg->handle[i], region_piece_len(rg, i));
        p->st.nr_releases += ok[i];
        rg->handle[i] = 0;
        rg->live[i] = 0;
        rg->spare_since[i] = 0; /* mapped again, it starts as a piece in use */
        rg->nr_held--;
    }
    if (bytes)
        pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, base, bytes, p->st.reserved, 0);
}

/* Reserve the region's addresses as the mapper, p->lock dropped, and publish it as an arena
 * of its own (in the address map, so that frees and range queries find it; in no list of the
 * pool's). Its pieces are mapped as the plan first serves into them (region_fill_locked): mapped
 * whole at once, the region came beside the rest of the pool's memory for the blocks of the
 * step before, still live then, and set the run's peak (bench/RESULTS.md, issue 31). What the
 * rest of the pool holds for nobody goes back first. Returns 0, -EBUSY when another thread
 * is the mapper (asked again at the next allocation), or another negative errno (the plan is
 * given up). */
int region_map_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    if (p->mapping)
        return -EBUSY;
    uint64_t resets = p->nr_resets;
    release_unused_locked(p); /* may drop p->lock */
    if (p->mapping || p->nr_resets != resets || pl->state != PLAN_MAP)
        return -EBUSY; /* another mapper, or the plan was forgotten meanwhile */
    struct plan_region *rg = &pl->regions[pl->nr_regions];
    uint64_t g = granule_bytes(p), va = 0;
    if (p->limit && atomic_load(p->device_reserved) + pl->region_bytes > p->limit)
        return -EDQUOT;
    /* addresses past the plan's bytes, mapped only if a plan made again around a block kept
     * past its step needs them (replan_locked) */
    uint64_t bytes = pl->region_bytes + pl->region_bytes / PLAN_HEADROOM;
    uint64_t piece = (bytes + PLAN_MAX_PIECES - 1) / PLAN_MAX_PIECES;
    piece = (piece + g - 1) / g * g;
    bytes = (bytes + piece - 1) / piece * piece;
    memset(rg, 0, sizeof(*rg));
    rg->bytes = bytes;
    rg->piece_bytes = piece;
    rg->nr_pieces = (uint32_t)((bytes + piece - 1) / piece);
    p->mapping = true;
    pool_unlock(p);
    int r = dev_va_reserve(p, bytes, &va);
    pool_lock(p);
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
    if (p->nr_resets != resets)
        return -ENODEV; /* the context went meanwhile, and the addresses with it */
    if (r)
        return r;
    struct cuheap_arena *a = &rg->arena;
    a->pool = p;
    a->planned = true;
    a->buddy.base = va;
    a->buddy.min_order = p->min_order;
    a->buddy.nr_units = 0; /* no thread cache's free takes a block of it (tc_free) */
    __atomic_store_n(&a->buddy.size, bytes, __ATOMIC_RELEASE);
    if (map_update(a, true)) { /* the address map full: the addresses go back */
        __atomic_store_n(&a->buddy.size, 0, __ATOMIC_RELEASE);
        p->mapping = true;
        pool_unlock(p);
        dev_va_free(p, va, bytes);
        pool_lock(p);
        p->mapping = false;
        pthread_cond_broadcast(&p->mapped);
        return p->nr_resets != resets ? -ENODEV : -ENOMEM;
    }
    pl->nr_regions++;
    pl->cur = rg;
    pl->arena = a;
    pl->nr_cur_pinned = 0;
    pl->cur_tickets = false;
    pl->replan_due = false;
    pl->trim_due = false;
    /* what the rest of the pool's blocks need from now on: not the step's peak any more */
    p->peak_busy = busy_bytes_locked(p);
    return 0;
}

/* While the plan settles, the rest of the pool gives back what it held for the step's blocks
 * it served before the plan: its blocks waiting for a fence come back (no allocation of its
 * own may come to reclaim them) and its idle chunks go to the driver; its budget is then what
 * its own blocks use. May drop p->lock. */
void rest_settles_locked(struct cuheap_pool *p)
{
    if (open_epoch(p)->nr_blocks)
        close_epoch_locked(p);
    reclaim_locked(p);
    if (p->idle_bytes)
        release_idle_locked(p, 0);
    p->peak_busy = busy_bytes_locked(p);
}

/* The pieces under the current region's bytes [offset, offset + size) not mapped yet, up to
 * PLAN_FILL_BATCH of them in todo. Returns how many. */
uint32_t region_unmapped(const struct plan_region *rg, uint64_t offset, uint64_t size,
                         uint32_t todo[PLAN_FILL_BATCH])
{
    uint32_t first, last, n = 0;
    region_pieces_of(rg, offset, size, &first, &last);
    for (uint32_t i = first; i <= last && n < PLAN_FILL_BATCH; i++)
        if (!rg->handle[i])
            todo[n++] = i;
    return n;
}

/* Map the pieces under the current region's bytes [offset, offset + size) that are not mapped
 * yet, as the mapper with p->lock dropped, PLAN_FILL_BATCH at a time; while the plan settles, the
 * rest of the pool gives back first, so that the region grows as the memory it replaces goes.
 * The caller holds the slot (live, and marked filling): no other allocation maps its pieces,
 * and no retire or new placement takes the region meanwhile (pl->filling). Returns 0, -ENODEV
 * when the context went meanwhile (the plan was forgotten with the slot), or another negative
 * errno (the slot is missed; the pieces mapped so far stay the region's). */
int region_fill_locked(struct cuheap_pool *p, struct cuheap_plan *pl, uint64_t offset,
                       uint64_t size)
{
    struct plan_region *rg = pl->cur;
    uint64_t resets = p->nr_resets;
    bool settled = pl->steps_on > PLAN_SETTLE;
    for (;;) {
        uint32_t todo[PLAN_FILL_BATCH], n = region_unmapped(rg, offset, size, todo);
        if (!n)
            return 0;
        if (p->vmm_refused)
            return -EIO; /* no more mapping calls (vmm_refused_locked) */
        if (p->mapping) {
            wait_mapper_locked(p); /* the other mapper may be mapping pieces of these bytes */
            if (p->nr_resets != resets)
                return -ENODEV;
            continue;
        }
        if (!settled) {
            settled = true;
            rest_settles_locked(p); /* may drop p->lock */
            if (p->nr_resets != resets)
                return -ENODEV;
            continue; /* pieces may have been mapped meanwhile */
        }
        uint64_t bytes = 0;
        for (uint32_t x = 0; x < n; x++)
            bytes += region_piece_len(rg, todo[x]);
        if (p->limit && atomic_load(p->device_reserved) + bytes > p->limit)
            return -EDQUOT;
        uint64_t h[PLAN_FILL_BATCH], ns = 0, base = rg->arena.buddy.base;
        uint32_t made = 0;
        int r = 0;
        bool released = true; /* the handle of a failed map went back */
        p->mapping = true;
        p->st.reserved += bytes;
        atomic_fetch_add(p->device_reserved, bytes);
        p->inflight_bytes += bytes;
        pool_unlock(p);
        for (; made < n; made++) {
            uint64_t va = base + (uint64_t)todo[made] * rg->piece_bytes,
                     len = region_piece_len(rg, todo[made]);
            h[made] = 0;
            r = dev_phys_create(p, len, &h[made], &ns);
            if (r && r != CUHEAP_BE_OOM)
                r = dev_phys_create(p, len, &h[made], &ns);
            if (!r && (r = map_twice(p, va, len, h[made], &ns)) != 0)
                released = dev_phys_release(p, h[made], &ns) == 0;
            if (r)
                break;
        }
        pool_lock(p);
        p->st.map_ns += ns;
        p->mapping = false;
        pthread_cond_broadcast(&p->mapped);
        if (p->nr_resets != resets)
            return -ENODEV; /* the pieces went with the context */
        p->inflight_bytes -= bytes;
        for (uint32_t x = made; x < n; x++) {
            /* counted before the calls, not made; a handle the driver would not take back
             * stays counted (p->stuck) */
            if (x == made && h[x] && !released)
                account_release_locked(p, false, h[x], region_piece_len(rg, todo[x]));
            else
                account_release_locked(p, true, 0, region_piece_len(rg, todo[x]));
        }
        uint64_t reserved = p->st.reserved;
        for (uint32_t x = 0; x < made; x++)
            reserved -= region_piece_len(rg, todo[x]);
        /* one event for each run of pieces next to each other */
        for (uint32_t x = 0, y; x < made; x = y + 1) {
            uint64_t run = region_piece_len(rg, todo[x]);
            for (y = x; y + 1 < made && todo[y + 1] == todo[y] + 1; y++)
                run += region_piece_len(rg, todo[y + 1]);
            for (uint32_t z = x; z <= y; z++)
                rg->handle[todo[z]] = h[z];
            rg->nr_held += y - x + 1;
            p->st.nr_creates += y - x + 1;
            reserved += run;
            pool_note_event(p, CUHEAP_EV_ARENA_GROW, base + (uint64_t)todo[x] * rg->piece_bytes,
                            run, reserved, 0);
        }
        if (r)
            return r == CUHEAP_BE_OOM ? -ENOMEM : -EIO;
    }
}

static void region_reap_one_locked(struct cuheap_pool *p, struct cuheap_plan *pl,
                                   struct plan_region *rg)
{
    if (p->mapping) {
        pl->reap_due = true;
        return;
    }
    /* one question of the timeline for the newest fence still in the way */
    uint64_t newest = 0;
    bool found = false;
    for (uint32_t i = 0; i < rg->nr_pieces; i++)
        if (rg->handle[i] && !rg->live[i] && region_piece_waits(p, rg, i) &&
            rg->ticket[i] - 1 >= newest)
            newest = rg->ticket[i] - 1, found = true;
    bool passed = !found || tl_ticket_passed_locked(p, newest);
    uint32_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < rg->nr_pieces; i++) {
        if (!rg->handle[i] || rg->live[i])
            continue;
        if (!passed && region_piece_waits(p, rg, i)) {
            pl->reap_due = true; /* asked again at the next large allocation */
            continue;
        }
        rg->live[i] = PIECE_GOING;
        bytes += region_piece_len(rg, i);
        n++;
    }
    if (!n && (rg->nr_held || !rg->arena.buddy.size))
        return; /* pieces still held, or the addresses gone already */
    bool all = n == rg->nr_held;
    if (all) { /* no block of it is live: nothing looks it up any more */
        map_update(&rg->arena, false);
        __atomic_store_n(&rg->arena.buddy.size, 0, __ATOMIC_RELEASE);
    }
    give_back_going_locked(p, rg, n, bytes, all);
}

void region_reap_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    pl->reap_due = false;
    for (unsigned r = 0; r < pl->nr_regions; r++) {
        struct plan_region *rg = &pl->regions[r];
        if (!rg->retired || (!rg->nr_held && !rg->arena.buddy.size))
            continue;
        if (p->mapping) {
            pl->reap_due = true;
            return;
        }
        region_reap_one_locked(p, pl, rg);
    }
}

/* The current region's pieces that no slot covers and no pinned block holds, given back as
 * the mapper once no fence on them is pending: a plan made again moves slots, and the pieces
 * their old places covered would stay mapped for nobody (on the H200's loop with an evaluation
 * every 10 steps, 1.09 held/live against 1.03). A later placement that covers them maps them
 * again (region_fill_locked). Only once a piece has covered nothing for PLAN_SPARE_STEPS
 * steps: a phase of another shape pins blocks and moves slots for a few steps, then the step
 * comes back to its old places, and pieces given back at once were mapped again each time
 * (the replay's passes, bench/RESULTS.md). */
void region_trim_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    struct plan_region *rg = pl->cur;
    if (p->mapping)
        return; /* trim_due stays: at the next step */
    pl->trim_due = false;
    bool covered[PLAN_MAX_PIECES];
    memset(covered, 0, rg->nr_pieces * sizeof(*covered));
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        const struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        uint32_t first, last;
        region_pieces_of(rg, s->offset, s->size, &first, &last);
        for (uint32_t i = first; i <= last; i++)
            covered[i] = true;
    }
    uint32_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < rg->nr_pieces; i++) {
        if (!rg->handle[i] || covered[i] || rg->live[i]) {
            rg->spare_since[i] = 0;
            continue;
        }
        if (!rg->spare_since[i])
            rg->spare_since[i] = pl->clock + 1;
        if (pl->clock + 1 - rg->spare_since[i] < PLAN_SPARE_STEPS * pl->period) {
            pl->trim_due = true; /* at a later step, if it still covers nothing */
            continue;
        }
        if (rg->ticket[i] && !tl_ticket_passed_locked(p, rg->ticket[i] - 1)) {
            pl->trim_due = true; /* a free's fence on it: at the next step */
            continue;
        }
        rg->ticket[i] = 0;
        rg->live[i] = PIECE_GOING;
        bytes += region_piece_len(rg, i);
        n++;
    }
    if (n)
        give_back_going_locked(p, rg, n, bytes, false);
}

/* The current region's and every retired one's pieces, made accessible to the peers. */
int plan_grant_access_locked(struct cuheap_pool *p)
{
    struct cuheap_plan *pl = p->plan;
    wait_mapper_locked(p);
    int r = 0;
    p->mapping = true;
    for (unsigned x = 0; x < pl->nr_regions && !r; x++) {
        struct plan_region *rg = &pl->regions[x];
        for (uint32_t i = 0; i < rg->nr_pieces && !r; i++) {
            if (!rg->handle[i] || rg->live[i] == PIECE_GOING)
                continue;
            uint64_t va = rg->arena.buddy.base + (uint64_t)i * rg->piece_bytes;
            uint64_t len = region_piece_len(rg, i);
            pool_unlock(p);
            r = dev_phys_access(p, va, len) ? -EIO : 0;
            pool_lock(p);
        }
    }
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
    return r;
}
