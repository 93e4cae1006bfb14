/* SPDX-License-Identifier: MIT */
/*
 * The step plan (CUHEAP_STEP_PLAN): a job whose large allocations repeat step after step gets
 * them from one region, planned for one step, so that a warm step makes no mapping call. The
 * planner is pure (src/stepplan.c), the region's memory is region.c's, and watch.c finds the
 * period and measures one step's lives; this part reserves the region at the step's quietest
 * moment and serves allocation k of every later step at its place, while
 * the size is the one measured and no block that shares its bytes is live, pinned or waiting
 * for a fence. Whatever the plan cannot serve goes to the rest of the pool as before. Sizes
 * that leave the measured order are followed until the step's phase is found again, the
 * allocations meanwhile served at the region's highest free places, as are those whose place
 * another block holds; a block kept past its step is pinned where it is and the step placed
 * again around it; a plan that keeps missing is
 * retired: its blocks still live stay as pinned blocks, and its region goes back but for the
 * pieces under them, which follow as they are freed.
 *
 * Only blocks above PLAN_MIN_ORDER: smaller ones are served by thread caches without the
 * lock, so the sequence the pool sees of them is not the program's.
 *
 * Lock rule: entered and left with p->lock held; dropped in region.c's calls (as the mapper, or
 * in the rest of the pool's giving back), as the mapper around the export calls, around a
 * free's device sync under CUHEAP_REUSE=sync, and around the wait for a fence that a slot's bytes
 * need (wait_ticket_locked), as the rest of the pool waits. A fence is recorded or asked about
 * under the lock, as the epochs' are, never waited for under the lock.
 */
#include "plan.h"

#include "stepplan.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Bytes of the plan's own memory: taken once when the pool is set up with CUHEAP_STEP_PLAN,
 * from mmap (nothing on an allocation's path calls malloc), touched only as far as used. */
static size_t plan_work_bytes(void)
{
    /* the window's sizes in order, then the period search's memory; or the planner's */
    size_t a = PLAN_WINDOW * sizeof(uint64_t) + cuheap_step_period_work(PLAN_WINDOW);
    size_t b = cuheap_step_plan_work(PLAN_MAX_SLOTS);
    size_t c = PLAN_MAX_SLOTS * sizeof(int64_t);
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

static size_t plan_bytes(void)
{
    return sizeof(struct cuheap_plan) + PLAN_WINDOW * sizeof(uint64_t) +
           PLAN_SEEN * sizeof(uint64_t) +
           PLAN_MAX_SLOTS *
               (sizeof(struct plan_slot) + sizeof(struct cuheap_step_block) + sizeof(uint32_t)) +
           PLAN_NR_TRACK * sizeof(struct plan_track) + PLAN_MAX_CONFLICTS * sizeof(uint32_t) +
           plan_work_bytes();
}

int plan_create(struct cuheap_pool *p)
{
    size_t bytes = plan_bytes();
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    struct cuheap_plan *pl = m;
    char *at = (char *)(pl + 1);
    pl->sizes = (uint64_t *)at;
    at += PLAN_WINDOW * sizeof(uint64_t);
    pl->seen = (uint64_t *)at;
    at += PLAN_SEEN * sizeof(uint64_t);
    pl->slots = (struct plan_slot *)at;
    at += PLAN_MAX_SLOTS * sizeof(struct plan_slot);
    pl->blocks = (struct cuheap_step_block *)at;
    at += PLAN_MAX_SLOTS * sizeof(struct cuheap_step_block);
    pl->track = (struct plan_track *)at;
    at += PLAN_NR_TRACK * sizeof(struct plan_track);
    pl->conf = (uint32_t *)at;
    at += PLAN_MAX_CONFLICTS * sizeof(uint32_t);
    pl->by_offset = (uint32_t *)at;
    at += PLAN_MAX_SLOTS * sizeof(uint32_t);
    pl->work = at;
    pl->state = PLAN_WATCH;
    p->plan = pl;
    return 0;
}

/* ---- the region: region.c ---- */

/* The live block of slot s, pinned where it is in the current region: no slot follows it any
 * more (a stray, or a block live when the plan is made again or retires). The caller has
 * checked that the table has room. */
static void pin_locked(struct cuheap_plan *pl, struct plan_slot *s, bool stray)
{
    struct plan_region *rg = pl->cur;
    uint32_t first, last;
    pl->pinned[pl->nr_pinned++] = (struct plan_pinned){.ptr = rg->arena.buddy.base + s->offset,
                                                       .size = s->asked,
                                                       .buffer_id = s->buffer_id,
                                                       .region = rg,
                                                       .since = pl->clock,
                                                       .stray = stray};
    region_pieces_of(rg, s->offset, s->asked, &first, &last);
    for (uint32_t i = first; i <= last; i++)
        rg->live[i]++, rg->spare_since[i] = 0; /* in use: spare again only from its free on */
    s->asked = 0;
    pl->nr_live--;
    pl->nr_cur_pinned++;
}

/* Slot s freed and its fence not passed: the fence goes onto the pieces under it, which keep
 * it once no slot follows these bytes (a plan made again, or retired). */
static void carry_ticket_locked(struct cuheap_pool *p, struct plan_region *rg, struct plan_slot *s)
{
    if (s->waiting && !tl_passed(&p->tl, s->ticket)) {
        uint32_t first, last;
        region_pieces_of(rg, s->offset, s->size, &first, &last);
        for (uint32_t i = first; i <= last; i++)
            if (s->ticket + 1 > rg->ticket[i])
                rg->ticket[i] = s->ticket + 1;
    }
    s->waiting = false;
}

/* Plan the step again in the region it has, around the blocks kept past their step (strays,
 * pinned where they are, which the new placement takes as fixed): a job that keeps a block of
 * a step of another shape (an evaluation, the replay's first step again) for long would else
 * make every slot sharing its bytes miss, and the plan retire and map a new region. The slots'
 * blocks live now are pinned as well (each goes when freed; a slot over its bytes misses till
 * then) and the fences of those freed go onto the pieces. Returns false when the new placement
 * does not fit the region's addresses or the tables: the plan then retires. */
static bool replan_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    struct plan_region *rg = pl->cur;
    uint64_t base = rg->arena.buddy.base;
    pl->replan_due = false;
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        if (s->waiting && s->ticket == UINT64_MAX) {
            pl->replan_due = true; /* a free's device sync under way: at the next quiet moment */
            return true;
        }
    }
    /* nothing of the plan changes before the new placement is known to fit */
    if (pl->nr_pinned + pl->nr_live > PLAN_MAX_PINNED)
        return false;
    size_t n = measured_blocks(pl), planned = n;
    for (uint32_t i = 0; i < pl->nr_pinned; i++) {
        const struct plan_pinned *b = &pl->pinned[i];
        if (b->region != rg || (!b->stray && pl->clock - b->since < pl->period))
            continue; /* a block of the step, going soon: slots over it miss till then */
        if (n == PLAN_MAX_SLOTS)
            return false;
        pl->blocks[n++] =
            (struct cuheap_step_block){.size = b->size, .offset = b->ptr - base, .fixed = true};
    }
    uint64_t region = cuheap_step_plan_in(pl->blocks, n, pl->period, PLAN_ALIGN, pl->work);
    if (region == UINT64_MAX || region > rg->bytes)
        return false;
    uint64_t pairs = 0; /* the conflict lists plan_index_locked will make */
    for (size_t x = 0; x < planned; x++)
        for (size_t y = 0; y < planned; y++)
            pairs += x != y && pl->blocks[y].offset < pl->blocks[x].offset + pl->blocks[x].size &&
                     pl->blocks[x].offset < pl->blocks[y].offset + pl->blocks[y].size;
    if (pairs > PLAN_MAX_CONFLICTS)
        return false;
    for (uint32_t i = 0; i < pl->nr_pinned; i++) {
        struct plan_pinned *b = &pl->pinned[i];
        if (b->region == rg && pl->clock - b->since >= pl->period)
            b->stray = true; /* fixed in the placement from now on */
    }
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        if (s->asked)
            pin_locked(pl, s, false);
        carry_ticket_locked(p, rg, s);
    }
    pl->cur_tickets = true;
    uint64_t g = granule_bytes(p);
    pl->region_bytes = (region + g - 1) / g * g;
    plan_index_locked(pl);                               /* cannot fail: the pairs fit */
    memset(rg->spare_since, 0, sizeof(rg->spare_since)); /* what the new placement leaves */
    pl->trim_due = true;
    p->st.nr_plan_replans++;
    return true;
}

/* The plan stops serving: its live blocks stay where they are as pinned blocks of a retired
 * region, whose other pieces go back as their fences pass; the sizes are watched again for a
 * new plan. Returns false, and keeps serving, when the pinned blocks would not fit their table
 * or a free is in its device sync (asked again at the next step). */
static bool retire_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    struct plan_region *rg = pl->cur;
    if (!rg) {
        watch_again(pl);
        return true;
    }
    if (pl->nr_pinned + pl->nr_live > PLAN_MAX_PINNED || pl->filling)
        return false; /* or a block's pieces are being mapped: asked again */
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        if (s->waiting && s->ticket == UINT64_MAX)
            return false; /* a free's device sync under way: its ticket is not known yet */
    }
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        if (s->asked)
            pin_locked(pl, s, false);
        carry_ticket_locked(p, rg, s);
        s->asked = 0;
    }
    pl->nr_cur_pinned = 0; /* the region's pinned blocks are a retired region's now */
    pl->cur_tickets = false;
    pl->replan_due = false;
    pl->trim_due = false;
    rg->retired = true;
    pl->cur = NULL;
    pl->arena = NULL;
    pl->nr_live = 0;
    pl->nr_by_offset = 0;
    watch_again(pl);
    pl->reap_due = true; /* its pieces go back at the next allocation's tidy_locked */
    return true;
}

/* ---- serving ---- */

/* Whether slot k's bytes are free: no slot sharing them live, none waiting for a fence.
 * SLOT_FENCE: only fences stand in the way, the latest of them *ret_ticket. SLOT_PINNED: a
 * block no slot follows is on them (kept past its step, or a phase's: the plan is placed again
 * around it at the quiet moment); SLOT_LIVE: a slot's own block is (the step's lives are not the
 * measured ones). */
enum { SLOT_FREE, SLOT_LIVE, SLOT_FENCE, SLOT_PINNED };

/* What no slot follows on the current region's bytes [off, off + size): a pinned block there
 * (SLOT_PINNED), or a fence on a piece under them not passed yet (SLOT_FENCE, the latest in
 * *ret_ticket if later). */
static int obstacles_locked(struct cuheap_pool *p, struct cuheap_plan *pl, uint64_t off,
                            uint64_t size, uint64_t *ret_ticket)
{
    struct plan_region *rg = pl->cur;
    uint64_t lo = rg->arena.buddy.base + off, hi = lo + size;
    for (uint32_t i = 0; i < pl->nr_pinned && pl->nr_cur_pinned; i++) {
        const struct plan_pinned *b = &pl->pinned[i];
        if (b->region == rg && b->ptr < hi && lo < b->ptr + b->size)
            return SLOT_PINNED;
    }
    if (!pl->cur_tickets)
        return SLOT_FREE;
    int r = SLOT_FREE;
    uint32_t first, last;
    region_pieces_of(rg, off, size, &first, &last);
    for (uint32_t i = first; i <= last; i++) {
        if (!rg->ticket[i])
            continue;
        uint64_t t = rg->ticket[i] - 1;
        if (tl_ticket_passed_locked(p, t)) {
            rg->ticket[i] = 0;
            continue;
        }
        r = SLOT_FENCE;
        if (t > *ret_ticket)
            *ret_ticket = t;
    }
    return r;
}

static int slot_free_locked(struct cuheap_pool *p, struct cuheap_plan *pl, uint32_t k,
                            uint64_t *ret_ticket)
{
    struct plan_slot *s = &pl->slots[k];
    int r = SLOT_FREE;
    *ret_ticket = 0;
    for (uint32_t x = 0; x <= s->conf_nr; x++) {
        struct plan_slot *t = x < s->conf_nr ? &pl->slots[pl->conf[s->conf_first + x]] : s;
        if (t->asked)
            return SLOT_LIVE;
        if (t->waiting) {
            if (tl_ticket_passed_locked(p, t->ticket)) {
                t->waiting = false;
                continue;
            }
            if (t->ticket == UINT64_MAX)
                return SLOT_LIVE; /* a device sync: not a fence to poll */
            r = SLOT_FENCE;
            if (t->ticket > *ret_ticket)
                *ret_ticket = t->ticket;
        }
    }
    int o = obstacles_locked(p, pl, s->offset, s->size, ret_ticket);
    return o == SLOT_FREE ? r : o;
}

/* Wait, p->lock dropped, for a fence after ticket: polled for up to CUHEAP_FENCE_POLL_NS,
 * then waited for. The rest of the pool would otherwise map memory for the block, and its own
 * path waits for fences rather than grow past what the job has needed (acquire.c); the
 * driver's own free waits for the whole device every time. */
static void wait_ticket_locked(struct cuheap_pool *p, uint64_t ticket)
{
    uint64_t t0 = mono_ns();
    unsigned fences = 0;
    bool passed;
    pool_unlock(p);
    while (!(passed = tl_try_pass(p, ticket, &fences)) && mono_ns() < t0 + CUHEAP_FENCE_POLL_NS)
        for (int i = 0; i < 64; i++)
            cpu_relax();
    if (!passed)
        tl_wait_for(p, ticket, &fences);
    pool_lock(p);
    p->st.nr_fences += fences;
    p->st.nr_waits += !passed;
    p->st.fence_ns += mono_ns() - t0;
}

/* At the start of every step the plan serves: a step of many misses retires it (the job
 * changed shape). In the first steps, the rest of the pool gives back what the plan took over
 * (rest_settles_locked). Holds p->lock throughout: what would drop it (a trim, the rest's
 * giving back, a retired region's pieces) is left to the next allocation's tidy_locked, since
 * its caller goes on with the slot it has found. */
static void step_begins_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    uint64_t misses = pl->step_misses, taken = pl->step_taken;
    pl->step_misses = pl->step_taken = 0;
    if (misses + taken > pl->period / 4) {
        if (++pl->bad_steps >= PLAN_BAD_STEPS) { /* a retire refused is tried again */
            if (retire_locked(p, pl))
                return;
        }
    } else {
        pl->bad_steps = 0;
    }
    if (misses)
        pl->steps_on = 0; /* the rest of the pool served them: it settles again */
    pl->trim_now = pl->trim_due;
    /* a block pinned when the plan was made again, kept a step since: plan around it too */
    for (uint32_t i = 0; i < pl->nr_pinned && pl->nr_cur_pinned && !pl->replan_due; i++) {
        const struct plan_pinned *b = &pl->pinned[i];
        pl->replan_due = b->region == pl->cur && !b->stray && pl->clock - b->since >= pl->period;
    }
    if (pl->steps_on++ < PLAN_SETTLE)
        pl->settle_now = true;
}

/* The plan's work that drops p->lock (as the mapper, or in the rest of the pool's giving
 * back), done where an allocation begins, before it reads anything of the plan: what is read
 * before a drop is stale after it (another thread may have found the step's phase again,
 * served the slot, placed the step again or retired the plan meanwhile). */
static void tidy_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    if (pl->reap_due)
        region_reap_locked(p, pl); /* may drop p->lock */
    if (pl->trim_now) {
        pl->trim_now = false;
        if (pl->cur && pl->trim_due)
            region_trim_locked(p, pl); /* may drop p->lock */
    }
    if (pl->settle_now) {
        pl->settle_now = false;
        if (pl->cur)
            rest_settles_locked(p); /* may drop p->lock */
    }
}

/* The step's phase again after its sizes left the measured order (an allocation more or
 * less, a step of another shape): the one phase whose measured sizes end with the longest run
 * of the sizes just seen, PLAN_SYNC at least. Where several phases match as far back as
 * PLAN_SYNC_MAX (layers of one shape repeat within a step, and their blocks live differently),
 * none is taken yet: the sizes that follow tell them apart. Returns whether one was found. */
static bool resync_locked(struct cuheap_plan *pl, uint64_t t)
{
    uint64_t period = pl->period, seen = t - pl->watch_from + 1, best = 0, best_phase = 0;
    uint64_t most = seen < PLAN_SYNC_MAX ? seen : PLAN_SYNC_MAX;
    bool tie = false;
    if (most > period)
        most = period;
    for (uint64_t phase = 0; phase < period; phase++) {
        uint64_t n = 0;
        while (n < most && pl->slots[(phase + period * PLAN_SYNC_MAX - n) % period].size ==
                               pl->sizes[(t - n) % PLAN_WINDOW])
            n++;
        if (n > best) {
            best = n;
            best_phase = phase;
            tie = false;
        } else if (n == best) {
            tie = true;
        }
    }
    if (best < PLAN_SYNC || tie)
        return false;
    pl->start = t - best_phase;
    return true;
}

struct busy_bytes {
    uint64_t lo, hi;
};

static struct plan_pinned *pinned_at(struct cuheap_plan *pl, struct cuheap_arena *a, uint64_t ptr);

/* A phase of another shape (the step's order lost: an evaluation, a first step again): its
 * allocations go at the highest place of the current region free now (no slot live or waiting
 * there, no pinned block, no fence pending on its pieces), as pinned blocks, rather than to
 * the rest of the pool, which would map memory for them beside the region's idle places (on
 * the H200's loop with an evaluation every 10 steps, the run's peak). A slot over one misses
 * till it is freed; one kept a step is planned around (step_begins_locked). So does a block
 * allocated at slot k that is known to live `lives` allocations (0: not known), such as slot k
 * itself when another block holds its own place, at a place that also none of the slots comes
 * to that the step allocates meanwhile: put where they come, it made them miss in turn.
 * Returns 0 with the block, or 1 (no place, or its pieces could not be mapped: the rest of the
 * pool serves it). */
static int borrow_locked(struct cuheap_pool *p, struct cuheap_plan *pl, uint64_t size,
                         uint64_t lives, uint32_t k, uint64_t *ret_ptr, uint64_t *ret_block)
{
    struct plan_region *rg = pl->cur;
    uint64_t base = rg->arena.buddy.base, len = (size + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    if (pl->nr_pinned >= PLAN_MAX_PINNED || pl->filling || len > pl->region_bytes)
        return 1;
    /* what is in the way, by offset: the slots in their order, the pinned blocks put in */
    struct busy_bytes *busy = pl->work;
    size_t n = 0;
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[pl->by_offset[x]];
        if (s->waiting && tl_ticket_passed_locked(p, s->ticket))
            s->waiting = false;
        uint32_t j = pl->by_offset[x], ahead = (uint32_t)((j + pl->period - k) % pl->period);
        bool coming = ahead && ahead < lives;
        if (s->asked || s->waiting || coming)
            busy[n++] = (struct busy_bytes){s->offset, s->offset + s->size};
    }
    for (uint32_t i = 0; i < pl->nr_pinned; i++) {
        const struct plan_pinned *b = &pl->pinned[i];
        if (b->region != rg)
            continue;
        struct busy_bytes v = {b->ptr - base, b->ptr - base + b->size};
        size_t j = n++;
        for (; j && busy[j - 1].lo > v.lo; j--)
            busy[j] = busy[j - 1];
        busy[j] = v;
    }
    size_t m = 0; /* merged, still by offset */
    for (size_t j = 0; j < n; j++) {
        if (m && busy[j].lo <= busy[m - 1].hi)
            busy[m - 1].hi = busy[j].hi > busy[m - 1].hi ? busy[j].hi : busy[m - 1].hi;
        else
            busy[m++] = busy[j];
    }
    /* the highest place that fits: the greedy placement fills the region from its start, so
     * its top is where the fewest slots live and the step needs it only at its peak */
    uint64_t off = UINT64_MAX;
    for (size_t g = m + 1; g-- > 0 && off == UINT64_MAX;) {
        uint64_t lo = g ? (busy[g - 1].hi + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN : 0;
        uint64_t hi = g < m ? busy[g].lo : pl->region_bytes;
        while (hi >= lo + len && off == UINT64_MAX) {
            uint64_t at = (hi - len) / PLAN_ALIGN * PLAN_ALIGN, pending = UINT64_MAX;
            if (at < lo)
                break;
            uint32_t first, last;
            region_pieces_of(rg, at, size, &first, &last);
            /* a fence pending on a piece under it, or the piece being given back (a trim's
             * unmap, p->lock dropped: region_trim_locked) */
            for (uint32_t i = first; i <= last; i++)
                if (rg->live[i] == PIECE_GOING ||
                    (rg->ticket[i] && !tl_ticket_passed_locked(p, rg->ticket[i] - 1)))
                    pending = i;
                else
                    rg->ticket[i] = 0;
            if (pending == UINT64_MAX)
                off = at;
            else
                hi = pending * rg->piece_bytes; /* below that piece */
        }
    }
    if (off == UINT64_MAX)
        return 1;
    uint64_t id = buffer_id_prefix(p) | next_buffer_ids(p, 1), block = (size + 511) & ~511ull;
    uint32_t first, last;
    pl->pinned[pl->nr_pinned++] = (struct plan_pinned){
        .ptr = base + off, .size = size, .buffer_id = id, .region = rg, .since = pl->clock};
    region_pieces_of(rg, off, size, &first, &last);
    for (uint32_t i = first; i <= last; i++)
        rg->live[i]++, rg->spare_since[i] = 0; /* in use: spare again only from its free on */
    pl->nr_cur_pinned++;
    p->st.live += size;
    p->st.live_blocks += block;
    uint32_t todo[PLAN_FILL_BATCH];
    if (region_unmapped(rg, off, size, todo)) {
        pl->filling++;
        int r = region_fill_locked(p, pl, off, size); /* may drop p->lock */
        pl->filling--;
        if (r) {
            if (r == -ENODEV)
                return 1; /* the plan was forgotten, the block with it */
            struct plan_pinned *b = pinned_at(pl, &rg->arena, base + off);
            *b = pl->pinned[--pl->nr_pinned];
            for (uint32_t i = first; i <= last; i++)
                rg->live[i]--;
            pl->nr_cur_pinned--;
            p->st.live -= size;
            p->st.live_blocks -= block;
            return 1;
        }
    }
    p->st.nr_hits++;
    p->st.nr_planned++;
    p->st.nr_plan_borrowed++;
    *ret_ptr = base + off;
    *ret_block = block;
    return 0;
}

int plan_alloc_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr, uint64_t *ret_block,
                      int64_t *ret_track)
{
    struct cuheap_plan *pl = p->plan;
    tidy_locked(p, pl); /* may drop p->lock: first, before anything is read */
    /* Until it serves, the plan counts only sizes it has seen before: another thread's block
     * of a size of its own, now and then, would else break every period (it must repeat
     * exactly for a quarter of the window) and no plan be made. Serving, such a block makes
     * it lose its phase and find it again (resync_locked), as a phase of another shape does. */
    if (pl->state != PLAN_ON && pl->state != PLAN_OFF && !watch_seen(pl, size))
        return 1;
    /* Serving, a size no step has asked for is no slot's either: it goes at a free place of the
     * region that no slot comes to before the step ends (else to the rest of the pool), and the
     * step keeps its phase. Taken for a slot's, it made the plan lose its phase and serve the
     * next blocks at free places, in the way of the step's own, at every such block
     * (bench/RESULTS.md). A run of more than PLAN_SYNC is a step of new sizes: counted, as
     * before, so that a plan whose step is gone retires. */
    if (pl->state == PLAN_ON && !pl->lost &&
        pl->slots[(pl->clock - pl->start) % pl->period].size != size) {
        uint32_t k = (uint32_t)((pl->clock - pl->start) % pl->period);
        *ret_track = -1;
        if (pl->strays < PLAN_SYNC && !watch_seen(pl, size) &&
            borrow_locked(p, pl, size, pl->period - k, k, ret_ptr, ret_block) == 0) {
            pl->strays++;
            return 0; /* may have dropped p->lock */
        }
        if (pl->state != PLAN_ON)
            return 1; /* forgotten while the lock was dropped */
    } else {
        pl->strays = 0;
    }
    uint64_t t = pl->clock++;
    pl->sizes[t % PLAN_WINDOW] = size;
    *ret_track = -1;
    switch (pl->state) {
    case PLAN_WATCH:
        watch_locked(pl);
        return 1;
    case PLAN_MEASURE: {
        uint64_t k = t - pl->start;
        if (size != pl->sizes[(t - pl->period) % PLAN_WINDOW]) {
            watch_again(pl); /* not the period after all */
            return 1;
        }
        if (k < pl->period) {
            pl->slots[k] = (struct plan_slot){.size = size};
            *ret_track = (int64_t)k;
        } else if (k == 2 * pl->period - 1) {
            measured_locked(p, pl);
        }
        return 1;
    }
    case PLAN_MAP:
        if ((t - pl->start) % pl->period != pl->quiet)
            return 1;
        {
            int r = region_map_locked(p, pl);
            if (r == -EBUSY)
                return 1;
            if (r) {
                pl->nr_regions++;
                watch_again(pl);
                return 1;
            }
        }
        pl->state = PLAN_ON;
        pl->lost = false;
        pl->bad_steps = 0;
        pl->steps_on = 0;
        pl->step_misses = pl->step_taken = 0;
        break;
    case PLAN_ON:
        break;
    default:
        return 1;
    }
    uint32_t k = (uint32_t)((t - pl->start) % pl->period);
    if (pl->lost || pl->slots[k].size != size) {
        pl->lost = !resync_locked(pl, t);
        k = (uint32_t)((t - pl->start) % pl->period);
    }
    if (k == 0)
        step_begins_locked(p, pl);
    if (pl->state != PLAN_ON)
        return 1;
    struct plan_slot *s = &pl->slots[k];
    /* its block of a step ago still live: kept past its step, it stays where it is, and the
     * step is planned again around it at the next quiet moment */
    if (s->asked && s->planned && !s->filling && !pl->lost && pl->nr_pinned < PLAN_MAX_PINNED) {
        pin_locked(pl, s, true);
        pl->replan_due = true;
    }
    /* not while a block's pieces are being mapped: its slot's place must stay */
    if (pl->replan_due && k == pl->quiet && !pl->lost && !pl->filling && !p->mapping &&
        !replan_locked(p, pl) && retire_locked(p, pl))
        return 1; /* else the plan as it was goes on: nothing of it changed */
    uint64_t ticket = 0;
    int why = s->planned && !pl->lost ? slot_free_locked(p, pl, k, &ticket) : SLOT_LIVE;
    if (why == SLOT_FENCE && !p->nr_capturing) {
        struct cuheap_arena *region = pl->arena;
        p->st.nr_plan_waits++;
        wait_ticket_locked(p, ticket); /* drops p->lock */
        /* Read again: another thread may have served the slot, placed the step again or
         * found another phase meanwhile. Slot k's size is this request's for as long as the
         * region is the same (a placement made again keeps the measured sizes), so what
         * stands between it and its place is what slot_free_locked sees now. */
        if (pl->state != PLAN_ON || pl->arena != region)
            return 1; /* retired or gone meanwhile */
        why = slot_free_locked(p, pl, k, &ticket);
    }
    if (why != SLOT_FREE) {
        /* out of the step's order, or the slot's place held by a block kept or pinned there:
         * a free place of the region, whose memory is mapped, rather than the rest of the
         * pool's, which maps memory beside the region's idle pieces (bench/RESULTS.md) */
        bool taken = (why == SLOT_LIVE || why == SLOT_PINNED) && s->planned;
        if ((pl->lost || taken) &&
            borrow_locked(p, pl, size, pl->lost ? 0 : plan_lagged_end(k, s->end, pl->period) - k, k,
                          ret_ptr, ret_block) == 0) {
            /* served, but not where the plan put it because a slot's own block is still on
             * its place: for the retire, a miss all the same (a job whose lives changed and
             * not its sizes would else keep a plan that fits it no more); a pinned block is
             * planned around instead */
            pl->step_taken += why == SLOT_LIVE && taken && !pl->lost && pl->state == PLAN_ON;
            return 0; /* may have dropped p->lock */
        }
        if (pl->state != PLAN_ON)
            return 1;
        pl->step_misses += s->planned;
        p->st.nr_plan_missed += s->planned;
        pl->nr_missed++;
        return 1;
    }
    s->asked = size;
    s->buffer_id = buffer_id_prefix(p) | next_buffer_ids(p, 1);
    uint64_t block = (size + 511) & ~511ull;
    pl->nr_live++;
    p->st.live += size;
    p->st.live_blocks += block;
    uint32_t todo[PLAN_FILL_BATCH];
    if (region_unmapped(pl->cur, s->offset, size, todo)) {
        pl->filling++;
        s->filling = true;                                  /* not pinned as a stray meanwhile */
        int r = region_fill_locked(p, pl, s->offset, size); /* may drop p->lock */
        pl->filling--;
        s->filling = false;
        if (r) {
            if (r != -ENODEV) { /* else the plan was forgotten, the slot with it */
                s->asked = 0;
                pl->nr_live--;
                p->st.live -= size;
                p->st.live_blocks -= block;
                p->st.nr_plan_missed++;
                pl->step_misses++;
                pl->nr_missed++;
            }
            return 1;
        }
    }
    p->st.nr_hits++;
    p->st.nr_planned++;
    *ret_ptr = pl->arena->buddy.base + s->offset;
    *ret_block = block;
    return 0;
}

void plan_track_locked(struct cuheap_pool *p, uint64_t ptr, int64_t slot)
{
    struct cuheap_plan *pl = p->plan;
    if (pl->state == PLAN_MEASURE && !watch_track(pl, ptr, (uint32_t)slot))
        watch_again(pl); /* more live blocks than the table holds: no plan for this job */
}

void plan_untrack_locked(struct cuheap_pool *p, uint64_t ptr)
{
    struct cuheap_plan *pl = p->plan;
    if (pl->state != PLAN_MEASURE)
        return;
    int64_t k = watch_untrack(pl, ptr);
    if (k >= 0)
        pl->slots[k].end = pl->clock - pl->start;
}

unsigned plan_nr_tried(struct cuheap_pool *p)
{
    return p->plan->nr_regions;
}

/* The live slot starting at ptr, or NULL. */
static struct plan_slot *slot_at_locked(struct cuheap_plan *pl, uint64_t ptr)
{
    uint64_t off = ptr - pl->arena->buddy.base;
    uint32_t lo = 0, hi = pl->nr_by_offset;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (pl->slots[pl->by_offset[mid]].offset < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < pl->nr_by_offset && pl->slots[pl->by_offset[lo]].offset == off; lo++)
        if (pl->slots[pl->by_offset[lo]].asked)
            return &pl->slots[pl->by_offset[lo]];
    return NULL;
}

/* The pinned block of a retired region at ptr, or NULL. */
static struct plan_pinned *pinned_at(struct cuheap_plan *pl, struct cuheap_arena *a, uint64_t ptr)
{
    for (uint32_t i = 0; i < pl->nr_pinned; i++)
        if (pl->pinned[i].ptr == ptr && &pl->pinned[i].region->arena == a)
            return &pl->pinned[i];
    return NULL;
}

/* What a free of a planned block waits for before its bytes serve again, as the rest of the
 * pool's frees do (CUHEAP_REUSE): a fence after now, a device sync (made here, p->lock
 * dropped, as the driver's own free would), or nothing. Returns the ticket (none under
 * CUHEAP_REUSE=immediate: the value is then not to be waited on). */
static uint64_t free_ticket_locked(struct cuheap_pool *p)
{
    if (p->cfg->reuse == CUHEAP_REUSE_IMMEDIATE)
        return 0;
    uint64_t ticket = tl_ticket_now(&p->tl); /* after the block left the live: the free began */
    if (p->cfg->reuse == CUHEAP_REUSE_SYNC) {
        pool_unlock(p);
        dev_device_sync(p); /* the fence after ticket passed with it */
        pool_lock(p);
    }
    return ticket;
}

/* The block stays pinned while the ticket is taken (CUHEAP_REUSE=sync drops p->lock for the
 * device's sync): its pieces may not go back before the sync is over. */
static int pinned_free_locked(struct cuheap_pool *p, struct cuheap_plan *pl, struct cuheap_arena *a,
                              uint64_t ptr, uint64_t *ret_size, uint64_t *ret_block)
{
    uint64_t ticket = free_ticket_locked(p);
    struct plan_pinned *b = pinned_at(pl, a, ptr);
    if (!b)
        return -EINVAL; /* freed by another thread meanwhile, or the context went */
    struct plan_region *rg = b->region;
    uint64_t size = b->size, block = (size + 511) & ~511ull, off = b->ptr - rg->arena.buddy.base;
    *b = pl->pinned[--pl->nr_pinned];
    if (rg == pl->cur) { /* a slot may serve its bytes once the fence has passed */
        pl->nr_cur_pinned--;
        pl->cur_tickets = true;
        pl->trim_due = true;
    }
    p->st.live -= size;
    p->st.live_blocks -= block;
    *ret_size = size;
    *ret_block = block;
    uint32_t first, last;
    region_pieces_of(rg, off, size, &first, &last);
    for (uint32_t i = first; i <= last; i++) {
        rg->live[i]--;
        if (p->cfg->reuse != CUHEAP_REUSE_IMMEDIATE && ticket + 1 > rg->ticket[i])
            rg->ticket[i] = ticket + 1;
    }
    region_reap_locked(p, pl);
    return 0;
}

int plan_free_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                     uint64_t *ret_size, uint64_t *ret_block)
{
    struct cuheap_plan *pl = p->plan;
    struct plan_slot *s = pl->arena == a ? slot_at_locked(pl, ptr) : NULL;
    if (!s) {
        return pinned_at(pl, a, ptr) ? pinned_free_locked(p, pl, a, ptr, ret_size, ret_block)
                                     : -EINVAL;
    }
    uint64_t size = s->asked, block = (size + 511) & ~511ull;
    s->asked = 0;
    pl->nr_live--;
    p->st.live -= size;
    p->st.live_blocks -= block;
    *ret_size = size;
    *ret_block = block;
    /* waiting from before the sync of CUHEAP_REUSE=sync, so that no thread serves its bytes
     * meanwhile (its ticket's fence can only pass after the free began) */
    s->ticket = UINT64_MAX;
    s->waiting = p->cfg->reuse != CUHEAP_REUSE_IMMEDIATE;
    struct plan_region *rg = pl->cur;
    uint64_t ticket = free_ticket_locked(p);
    if (pl->cur == rg && !s->asked) /* not retired meanwhile (retire_locked took the slots) */
        s->ticket = ticket;
    return 0;
}

int plan_block_range_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                            uint64_t *ret_base, uint64_t *ret_size, uint64_t *ret_buffer_id)
{
    struct cuheap_plan *pl = p->plan;
    if (pl->arena == a) {
        uint64_t off = ptr - a->buddy.base;
        for (uint32_t x = pl->nr_by_offset; x-- > 0;) {
            struct plan_slot *s = &pl->slots[pl->by_offset[x]];
            if (s->offset > off)
                continue;
            if (s->offset + pl->max_size <= off)
                break; /* none further down reaches ptr */
            if (s->asked && off < s->offset + s->asked) {
                *ret_base = a->buddy.base + s->offset;
                *ret_size = s->asked;
                *ret_buffer_id = s->buffer_id;
                return 0;
            }
        }
    }
    for (uint32_t i = 0; i < pl->nr_pinned; i++) { /* of a retired region, or the current one */
        struct plan_pinned *b = &pl->pinned[i];
        if (&b->region->arena == a && ptr >= b->ptr && ptr < b->ptr + b->size) {
            *ret_base = b->ptr;
            *ret_size = b->size;
            *ret_buffer_id = b->buffer_id;
            return 0;
        }
    }
    return -EINVAL;
}

/* The pieces under a shared block, exported as the mapper with p->lock dropped, so that they
 * stay. */
int plan_share_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t block,
                      uint64_t buffer_id, struct cuheap_share *pieces, unsigned max)
{
    struct cuheap_plan *pl = p->plan;
    wait_mapper_locked(p);
    struct plan_region *rg = plan_region_of(a);
    uint64_t size = 0;
    struct plan_slot *s = pl->arena == a ? slot_at_locked(pl, block) : NULL;
    struct plan_pinned *b = s ? NULL : pinned_at(pl, a, block);
    if (s && s->buffer_id == buffer_id)
        size = s->asked;
    else if (b && b->buffer_id == buffer_id)
        size = b->size;
    if (!size)
        return -EINVAL;
    uint32_t first, last;
    region_pieces_of(rg, block - a->buddy.base, size, &first, &last);
    if (last - first + 1 > max)
        return -ENOSPC;
    unsigned n = 0;
    for (uint32_t i = first; i <= last; i++, n++) {
        uint64_t va = a->buddy.base + (uint64_t)i * rg->piece_bytes;
        pieces[n] = (struct cuheap_share){.chunk = &rg->handle[i],
                                          .offset = (int64_t)(va - block),
                                          .bytes = region_piece_len(rg, i),
                                          .fd = -1};
    }
    uint64_t resets = p->nr_resets;
    p->mapping = true;
    pool_unlock(p);
    int r = (int)n;
    for (unsigned i = 0; i < n && r >= 0; i++)
        if (dev_phys_export(p, rg->handle[first + i], &pieces[i].fd))
            r = -EIO;
    pool_lock(p);
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
    if (r < 0 || p->nr_resets != resets) {
        for (unsigned i = 0; i < n; i++)
            if (pieces[i].fd >= 0)
                close(pieces[i].fd);
        if (r > 0)
            r = -EINVAL; /* the context went: the handles with it */
    }
    return r;
}

/* The plan's memory back to the driver but for the pieces under live blocks: its region
 * retires (a new plan follows once the step is seen again). Returns the bytes given back. */
uint64_t plan_trim_locked(struct cuheap_pool *p)
{
    struct cuheap_plan *pl = p->plan;
    uint64_t before = p->st.reserved, newest = 0;
    bool found = false;
    if (pl->cur)
        retire_locked(p, pl);
    /* the fences after the last frees over free pieces, waited for as the pool's epochs are
     * (a trim gives back all it can, and holds no fence after) */
    for (unsigned x = 0; x < pl->nr_regions; x++) {
        struct plan_region *rg = &pl->regions[x];
        for (uint32_t i = 0; i < rg->nr_pieces; i++)
            if (rg->handle[i] && !rg->live[i] && region_piece_waits(p, rg, i) &&
                rg->ticket[i] - 1 >= newest)
                newest = rg->ticket[i] - 1, found = true;
    }
    if (found && !p->nr_capturing)
        wait_ticket_locked(p, newest);
    region_reap_locked(p, pl);
    return before > p->st.reserved ? before - p->st.reserved : 0;
}

/* The context went (context: its memory with it, counted out here) or the process forked:
 * every region forgotten, the sizes watched again. */
uint64_t plan_forget_locked(struct cuheap_pool *p, bool context)
{
    struct cuheap_plan *pl = p->plan;
    uint64_t bytes = 0;
    for (unsigned x = 0; x < pl->nr_regions; x++) {
        struct plan_region *rg = &pl->regions[x];
        if (!rg->nr_held && !rg->arena.buddy.size)
            continue;      /* gone already (a region with no piece mapped is still in the map) */
        uint64_t held = 0; /* but for the pieces going back, counted in p->inflight_bytes */
        for (uint32_t i = 0; i < rg->nr_pieces; i++)
            if (rg->handle[i] && rg->live[i] != PIECE_GOING)
                held += region_piece_len(rg, i);
        map_update(&rg->arena, false);
        __atomic_store_n(&rg->arena.buddy.size, 0, __ATOMIC_RELEASE);
        memset(rg->handle, 0, sizeof(rg->handle));
        rg->nr_held = 0;
        rg->retired = true;
        bytes += held;
        if (context && held) {
            atomic_fetch_sub(p->device_reserved, held);
            p->st.reserved -= held;
            pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, rg->arena.buddy.base, held, p->st.reserved,
                            0);
        }
    }
    pl->cur = NULL;
    pl->arena = NULL;
    pl->nr_pinned = 0;
    pl->nr_cur_pinned = 0;
    pl->cur_tickets = false;
    pl->replan_due = false;
    pl->trim_due = pl->trim_now = pl->settle_now = false;
    pl->filling = 0; /* a fork's child: the thread that was mapping is not in it */
    pl->reap_due = false;
    for (uint32_t k = 0; k < PLAN_MAX_SLOTS; k++)
        pl->slots[k].asked = 0, pl->slots[k].waiting = false, pl->slots[k].filling = false;
    pl->nr_live = 0;
    pl->nr_by_offset = 0;
    watch_again(pl);
    return bytes;
}

int plan_check_locked(struct cuheap_pool *p, uint64_t *ret_reserved, uint64_t *ret_live,
                      uint64_t *ret_live_blocks, char *why, size_t why_size)
{
    struct cuheap_plan *pl = p->plan;
    uint64_t nr_live = 0;
    *ret_reserved = *ret_live = *ret_live_blocks = 0;
    for (unsigned x = 0; x < pl->nr_regions; x++) {
        struct plan_region *rg = &pl->regions[x];
        uint32_t held = 0;
        for (uint32_t i = 0; i < rg->nr_pieces; i++) {
            if (!rg->handle[i])
                continue;
            held++;
            if (rg->live[i] == PIECE_GOING)
                continue; /* the mapper is giving it back: in p->inflight_bytes */
            *ret_reserved += region_piece_len(rg, i);
            /* a retired piece is given back once no pinned block is over it */
            uint32_t pins = 0;
            for (uint32_t b = 0; b < pl->nr_pinned; b++) {
                struct plan_pinned *pb = &pl->pinned[b];
                uint32_t first, last;
                region_pieces_of(rg, pb->ptr - rg->arena.buddy.base, pb->size, &first, &last);
                pins += pb->region == rg && i >= first && i <= last;
            }
            if (rg->live[i] != pins) {
                snprintf(why, why_size, "plan region %u piece %u: %u pinned blocks, counted %u", x,
                         i, pins, rg->live[i]);
                return -EFAULT;
            }
        }
        if (held != rg->nr_held || (rg->retired ? rg == pl->cur : rg != pl->cur && held)) {
            snprintf(why, why_size, "plan region %u: %u pieces held, counted %u%s", x, held,
                     rg->nr_held, rg->retired ? " (retired)" : "");
            return -EFAULT;
        }
    }
    for (uint32_t b = 0; b < pl->nr_pinned; b++) {
        *ret_live += pl->pinned[b].size;
        *ret_live_blocks += (pl->pinned[b].size + 511) & ~511ull;
    }
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        uint32_t k = pl->by_offset[x];
        struct plan_slot *s = &pl->slots[k];
        if (!s->asked)
            continue;
        if (!pl->arena) {
            snprintf(why, why_size, "plan slot %u live with no region", k);
            return -EFAULT;
        }
        nr_live++;
        *ret_live += s->asked;
        *ret_live_blocks += (s->asked + 511) & ~511ull;
        uint32_t first, last;
        region_pieces_of(pl->cur, s->offset, s->asked, &first, &last);
        for (uint32_t i = first; i <= last && !pl->filling; i++)
            if (!pl->cur->handle[i]) {
                snprintf(why, why_size, "plan slot %u live over piece %u, not mapped", k, i);
                return -EFAULT;
            }
        for (uint32_t b = 0; b < pl->nr_pinned; b++) {
            const struct plan_pinned *pb = &pl->pinned[b];
            uint64_t at = pl->arena->buddy.base + s->offset;
            if (pb->region == pl->cur && pb->ptr < at + s->asked && at < pb->ptr + pb->size) {
                snprintf(why, why_size, "plan slot %u live over a pinned block at %#lx", k,
                         (unsigned long)pb->ptr);
                return -EFAULT;
            }
        }
        for (uint32_t y = 0; y < s->conf_nr; y++) {
            struct plan_slot *t = &pl->slots[pl->conf[s->conf_first + y]];
            /* a fence passed is only noted when asked: a waiting slot whose ticket has passed
             * is free */
            if (t->asked || (t->waiting && !tl_passed(&p->tl, t->ticket))) {
                snprintf(why, why_size, "plan slot %u live over slot %u's bytes (%s)", k,
                         pl->conf[s->conf_first + y], t->asked ? "live" : "behind a fence");
                return -EFAULT;
            }
        }
    }
    if (nr_live != pl->nr_live) {
        snprintf(why, why_size, "plan: %lu slots live, counted %lu", (unsigned long)nr_live,
                 (unsigned long)pl->nr_live);
        return -EFAULT;
    }
    return 0;
}
