/* SPDX-License-Identifier: MIT */
/*
 * The step plan's watching and measuring (plan.c serves what this finds): the sizes of large
 * allocations watched for a period, one step's blocks tracked from allocation to free, their
 * placement asked of the planner (src/stepplan.c), and the placement indexed for serving: the
 * slots by offset, the slots that share bytes, and the step's quietest moment.
 *
 * Lock rule: p->lock held in every function here, never dropped. No driver call, no wait.
 */
#include "plan.h"

#include "stepplan.h"

/* Back to watching the sizes for a period (off once PLAN_MAX_REGIONS plans were tried): the
 * step being measured, if any, is forgotten. */
void watch_again(struct cuheap_plan *pl)
{
    pl->state = pl->nr_regions >= PLAN_MAX_REGIONS ? PLAN_OFF : PLAN_WATCH;
    pl->watch_from = pl->clock;
    memset(pl->track, 0, PLAN_NR_TRACK * sizeof(*pl->track));
    pl->nr_tracked = 0;
}

/* Whether size was seen before; remembered if not. Sizes stay remembered through plans made and
 * retired (a step's sizes come back after a phase of another shape); when the set is
 * three-quarters full (sizes of other threads' blocks, each new), it starts again. */
bool watch_seen(struct cuheap_plan *pl, uint64_t size)
{
    uint32_t mask = PLAN_SEEN - 1, home = (uint32_t)(size * 0x9e3779b97f4a7c15ull >> 40) & mask;
    uint32_t i = home;
    for (; pl->seen[i]; i = (i + 1) & mask)
        if (pl->seen[i] == size)
            return true;
    if (pl->nr_seen >= PLAN_SEEN / 4 * 3) {
        memset(pl->seen, 0, PLAN_SEEN * sizeof(*pl->seen));
        pl->nr_seen = 0;
        i = home;
    }
    pl->seen[i] = size;
    pl->nr_seen++;
    return false;
}

static uint32_t track_hash(uint64_t ptr)
{
    return (uint32_t)((ptr >> 9) * 0x9e3779b97f4a7c15ull >> 40) & (PLAN_NR_TRACK - 1);
}

/* The block at ptr is allocation slot of the step being measured. false: the table is full. */
bool watch_track(struct cuheap_plan *pl, uint64_t ptr, uint32_t slot)
{
    if (pl->nr_tracked >= PLAN_NR_TRACK / 2)
        return false;
    for (uint32_t i = track_hash(ptr);; i = (i + 1) & (PLAN_NR_TRACK - 1))
        if (!pl->track[i].ptr) {
            pl->track[i] = (struct plan_track){ptr, slot};
            pl->nr_tracked++;
            return true;
        }
}

/* The slot of the measured block at ptr, taken off the table; -1 when it is not one. Deletes
 * by moving later entries of the run back (no tombstones: the table is emptied per step). */
int64_t watch_untrack(struct cuheap_plan *pl, uint64_t ptr)
{
    uint32_t mask = PLAN_NR_TRACK - 1, i = track_hash(ptr);
    for (; pl->track[i].ptr && pl->track[i].ptr != ptr; i = (i + 1) & mask)
        ;
    if (!pl->track[i].ptr)
        return -1;
    int64_t slot = pl->track[i].slot;
    pl->track[i].ptr = 0;
    pl->nr_tracked--;
    for (uint32_t j = (i + 1) & mask; pl->track[j].ptr; j = (j + 1) & mask) {
        uint32_t h = track_hash(pl->track[j].ptr);
        /* move j back to the hole at i when its home is not in (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
            pl->track[i] = pl->track[j];
            pl->track[j].ptr = 0;
            i = j;
        }
    }
    return slot;
}

static void measure_from_now(struct cuheap_plan *pl, uint64_t period)
{
    pl->period = period;
    pl->start = pl->clock;
    pl->state = PLAN_MEASURE;
    memset(pl->track, 0, PLAN_NR_TRACK * sizeof(*pl->track));
    pl->nr_tracked = 0;
}

/* Whether the last period sizes repeat the period before them. */
static bool repeats(const struct cuheap_plan *pl, uint64_t period)
{
    for (uint64_t i = pl->clock - period; i < pl->clock; i++)
        if (pl->sizes[i % PLAN_WINDOW] != pl->sizes[(i - period) % PLAN_WINDOW])
            return false;
    return true;
}

/* Every PLAN_WINDOW / 4 large allocations once a window is full: do the last PLAN_WINDOW sizes
 * repeat? A period found starts the measure of the next step. After a plan retired, the period
 * it was made for is asked about first, every quarter of it once two periods are seen: a job
 * back in its step after a phase of another shape (an evaluation, a checkpoint) is measured
 * again within a few steps rather than a window's worth (a shorter window alone would take a
 * layer repeating inside the step for one: the full window's test asks for a run past it). */
void watch_locked(struct cuheap_plan *pl)
{
    uint64_t seen = pl->clock - pl->watch_from, known = pl->known_period;
    if (known && seen >= 2 * known && seen % (known / 4 ? known / 4 : 1) == 0 &&
        repeats(pl, known)) {
        measure_from_now(pl, known);
        return;
    }
    if (seen < PLAN_WINDOW || seen % (PLAN_WINDOW / 4))
        return;
    uint64_t *keys = pl->work; /* the window in order, then the search's own memory */
    for (uint64_t i = 0; i < PLAN_WINDOW; i++)
        keys[i] = pl->sizes[(pl->clock - PLAN_WINDOW + i) % PLAN_WINDOW];
    size_t period = cuheap_step_period_in(keys, PLAN_WINDOW, keys + PLAN_WINDOW);
    if (!period || period > PLAN_MAX_SLOTS)
        return;
    measure_from_now(pl, period);
}

/* The measured step's blocks living less than a step (the others stay the rest of the pool's)
 * as the planner's, from pl->blocks[0]. Returns how many. */
size_t measured_blocks(struct cuheap_plan *pl)
{
    size_t n = 0;
    for (uint32_t k = 0; k < pl->period; k++) {
        struct plan_slot *s = &pl->slots[k];
        s->planned = s->end && s->end - k < pl->period;
        if (s->planned)
            pl->blocks[n++] = (struct cuheap_step_block){
                .size = s->size, .start = k, .end = plan_lagged_end(k, s->end, pl->period)};
    }
    return n;
}

/* Offsets for the measured step, and its index (plan_index_locked). Returns false when no plan can
 * be made. */
static bool plan_make_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    uint64_t period = pl->period;
    size_t n = measured_blocks(pl);
    if (!n)
        return false;
    uint64_t region = cuheap_step_plan_in(pl->blocks, n, period, PLAN_ALIGN, pl->work);
    if (region == UINT64_MAX || !region)
        return false;
    uint64_t g = granule_bytes(p);
    pl->region_bytes = (region + g - 1) / g * g;
    return plan_index_locked(pl);
}

/* The planned slots by offset (their offsets from pl->blocks, in the slots' order), the slots
 * that share bytes, and the step's quietest moment, when the region is mapped. */
bool plan_index_locked(struct cuheap_plan *pl)
{
    uint64_t period = pl->period;
    size_t n = 0;
    pl->nr_by_offset = 0;
    for (uint32_t k = 0; k < period; k++) {
        struct plan_slot *s = &pl->slots[k];
        if (!s->planned)
            continue;
        s->offset = pl->blocks[n++].offset;
        uint32_t j = pl->nr_by_offset++, *o = pl->by_offset;
        for (; j && pl->slots[o[j - 1]].offset > s->offset; j--)
            o[j] = o[j - 1];
        o[j] = k;
    }
    /* the slots whose bytes meet each one's, as one list per slot */
    uint32_t nr_conf = 0, *o = pl->by_offset;
    pl->max_size = 0;
    for (uint32_t x = 0; x < pl->nr_by_offset; x++) {
        struct plan_slot *s = &pl->slots[o[x]];
        s->conf_first = nr_conf;
        for (uint32_t y = 0; y < pl->nr_by_offset; y++) {
            struct plan_slot *t = &pl->slots[o[y]];
            if (y == x || t->offset >= s->offset + s->size || s->offset >= t->offset + t->size)
                continue;
            if (t->offset >= s->offset + s->size)
                break;
            if (nr_conf == PLAN_MAX_CONFLICTS)
                return false;
            pl->conf[nr_conf++] = o[y];
        }
        s->conf_nr = nr_conf - s->conf_first;
        if (s->size > pl->max_size)
            pl->max_size = s->size;
    }
    /* the moment of the step with the fewest planned bytes live: the rest of the pool holds
     * the least then, beside the region, while the plan takes over */
    int64_t *delta = pl->work;
    memset(delta, 0, period * sizeof(*delta));
    for (uint32_t k = 0; k < period; k++) {
        struct plan_slot *s = &pl->slots[k];
        if (!s->planned)
            continue;
        uint64_t e = plan_lagged_end(k, s->end, period);
        delta[k] += (int64_t)s->size;
        if (e < period) {
            delta[e] -= (int64_t)s->size;
        } else {
            delta[0] += (int64_t)s->size;
            delta[e - period] -= (int64_t)s->size;
        }
    }
    int64_t live = 0, least = INT64_MAX;
    for (uint32_t k = 0; k < period; k++) {
        live += delta[k];
        if (live < least) {
            least = live;
            pl->quiet = k;
        }
    }
    return true;
}

/* The measure's end (the step measured and one more for its frees): a plan, or watch again. */
void measured_locked(struct cuheap_pool *p, struct cuheap_plan *pl)
{
    pl->nr_by_offset = 0;
    if (plan_make_locked(p, pl) &&
        (!p->limit || atomic_load(p->device_reserved) + pl->region_bytes <= p->limit)) {
        pl->state = PLAN_MAP;
        pl->known_period = pl->period;
        return;
    }
    pl->nr_regions++; /* a plan that cannot be made counts as one tried */
    watch_again(pl);
}
