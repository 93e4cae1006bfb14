/* SPDX-License-Identifier: MIT */
/*
 * The step plan's private header: its structs and constants, and the functions its three parts
 * call in each other (watch.c finds and measures the step, plan.c serves it, region.c holds its
 * memory). The rest of the pool sees only the entry points declared in internal.h; check.c and
 * the pool's unit test look inside.
 *
 * Lock rule: as internal.h's: p->lock guards the plan (struct cuheap_plan and its regions).
 */
#ifndef CUHEAP_POOL_PLAN_H
#define CUHEAP_POOL_PLAN_H

#include "internal.h"

#pragma GCC visibility push(hidden)

#define PLAN_WINDOW        8192u                /* large allocations looked at for a period */
#define PLAN_MAX_SLOTS     (PLAN_WINDOW / 4)    /* the longest period found in the window */
#define PLAN_NR_TRACK      (2 * PLAN_MAX_SLOTS) /* measured blocks live at once, twice over */
#define PLAN_MAX_CONFLICTS (1u << 20)           /* pairs of planned slots sharing bytes, at most */
#define PLAN_SEEN          (4 * PLAN_WINDOW)    /* sizes remembered as seen (a hash set) */
#define PLAN_MAX_REGIONS                                                                           \
    8u                        /* plans made per pool at most: a job that keeps changing its        \
                                 step gets no more (their arenas are never freed) */
#define PLAN_MAX_PIECES 4096u /* a region's pieces: granules, larger past 8 GiB at 2 MiB */
#define PLAN_HEADROOM                                                                              \
    2u                        /* a region's addresses: planned bytes + 1/HEADROOM of them, for     \
                                 plans made again around blocks kept past their step */
#define PLAN_MAX_PINNED 1024u /* blocks of retired regions still live, at most */
#define PIECE_GOING     UINT32_MAX /* a piece being given back */
/* Allocations a free's fence is given before the plan packs its bytes again. None: on a GPU
 * that runs right behind its host most fences have passed by the next allocation, and the plan
 * waits for the others (slot_free_locked), while each allocation of lag keeps the bytes freed
 * just before it out of reach and grows the region (bench/RESULTS.md). A study build may set
 * it (-Dc_args=-DPLAN_LAG=2u). */
#ifndef PLAN_LAG
#define PLAN_LAG 0u
#endif
#define PLAN_ALIGN       (64u << 10) /* planned blocks of 64 KiB or more start on 64 KiB */
#define PLAN_SYNC        8u  /* sizes in a row that find the step's phase again after a change */
#define PLAN_SYNC_MAX    64u /* sizes looked back at to tell phases apart */
#define PLAN_BAD_STEPS   3u  /* steps in a row of many misses that retire a plan */
#define PLAN_SETTLE      4u  /* steps served after which the rest of the pool is left to itself */
#define PLAN_SPARE_STEPS 4u  /* steps a mapped piece covers nothing before it goes back */

enum plan_state {
    PLAN_OFF,     /* given up: too many plans tried */
    PLAN_WATCH,   /* looking for a period in the sizes */
    PLAN_MEASURE, /* one step's lives being measured */
    PLAN_MAP,     /* planned: the region is mapped at the step's quietest moment */
    PLAN_ON,      /* serving */
};

/* One allocation of the measured step: its size and life, its place, and its state now. */
struct plan_slot {
    uint64_t size;   /* bytes asked for in the measured step */
    uint64_t end;    /* measured: step clock when freed, 0 = not within a step */
    uint64_t offset; /* in the region */
    uint64_t asked;  /* bytes asked now, 0 = not live */
    uint64_t ticket; /* freed: the timeline's ticket (UINT64_MAX: a device sync under way) */
    uint64_t buffer_id;
    uint32_t conf_first, conf_nr; /* the planned slots whose bytes meet this one's */
    bool planned;                 /* lives less than a step: has a place */
    bool waiting;                 /* freed, its fence not yet seen to pass */
    bool filling; /* its pieces being mapped, p->lock dropped (region_fill_locked) */
};

struct plan_track {
    uint64_t ptr; /* 0 = empty */
    uint32_t slot;
};

/* A plan's memory: one address range, mapped in pieces so that a retired region goes back
 * but for the pieces under blocks the program still holds. */
struct plan_region {
    struct cuheap_arena arena; /* first: a planned arena is its region (plan_region_of) */
    uint64_t bytes, piece_bytes;
    uint32_t nr_pieces, nr_held; /* pieces, and those mapped now */
    bool retired;
    uint64_t handle[PLAN_MAX_PIECES];      /* 0 = not mapped yet, or given back */
    uint32_t live[PLAN_MAX_PIECES];        /* pinned blocks over the piece, or PIECE_GOING */
    uint64_t spare_since[PLAN_MAX_PIECES]; /* the plan's clock + 1 since which the piece has
                                              covered no slot and held no block: 0 = it does */
    uint64_t ticket[PLAN_MAX_PIECES];      /* the newest free's ticket over it of a block no slot
                                              follows (pinned, or of a slot before a re-plan), kept one
                                              up: 0 = none */
};

/* A block the program has not freed yet that no slot follows: of a retired region, or of the
 * current one, kept past its step (a stray) or live when the plan was made again. */
struct plan_pinned {
    uint64_t ptr, size, buffer_id;
    struct plan_region *region;
    uint64_t since; /* the plan's clock when pinned */
    bool stray;     /* outlived its slot's step: the plan goes around it */
};

struct cuheap_step_block;

struct cuheap_plan {
    struct plan_region regions[PLAN_MAX_REGIONS]; /* never reused: lock-free readers */
    struct plan_pinned pinned[PLAN_MAX_PINNED];
    uint32_t nr_pinned;
    bool reap_due; /* a retired region's piece may go back */
    int state;
    unsigned nr_regions; /* plans tried */
    uint64_t clock;      /* large allocations the pool's lock saw */
    uint64_t watch_from;
    uint64_t period, start; /* the step: clock start + k is its allocation k, every period */
    uint64_t known_period;  /* the period of the last plan made, 0 = none yet */
    uint64_t quiet;         /* the step's allocation where the fewest planned bytes live */
    uint64_t *sizes;        /* [PLAN_WINDOW], by clock */
    uint64_t *seen;         /* [PLAN_SEEN]: sizes seen before, 0 = empty (watch_seen) */
    uint32_t nr_seen;
    struct plan_slot *slots; /* [period] */
    struct cuheap_step_block *blocks;
    uint32_t *by_offset; /* planned slots in the order of their offsets */
    uint32_t nr_by_offset;
    uint32_t *conf;
    struct plan_track *track; /* measure: block -> slot */
    uint32_t nr_tracked;
    void *work;                 /* the planner's memory */
    struct plan_region *cur;    /* the region being served from, NULL = none */
    struct cuheap_arena *arena; /* its arena */
    uint64_t region_bytes, max_size;
    uint64_t nr_live, step_misses, steps_on, nr_missed;
    uint64_t step_taken;    /* this step's slots served at another place, their own being held */
    unsigned bad_steps;     /* steps in a row of many misses */
    unsigned filling;       /* allocations mapping their pieces (p->lock dropped): no retire */
    uint32_t nr_cur_pinned; /* pinned blocks in the current region */
    bool cur_tickets;       /* a ticket on a piece of the current region may not have passed */
    bool replan_due;        /* a stray was pinned: plan again around it at the quiet moment */
    bool trim_due;          /* pieces of the current region may cover nothing the plan serves */
    bool trim_now;          /* a step began with trim_due: trim at the next allocation */
    bool settle_now;        /* a step began while the plan settles: the rest of the pool gives
                               back at the next allocation (rest_settles_locked) */
    bool lost;       /* the sizes left the measured step's order: its phase is being looked for */
    unsigned strays; /* sizes never seen before, in a row, served beside the plan (plan_alloc) */
};

/* The step clock of a block's end, with the fence's lag: on the H200 a free's fence passed
 * within a few allocations (bench/RESULTS.md, issue 31), and a plan that reused a place at once
 * would find it still waiting. Never a step or more. */
static inline uint64_t plan_lagged_end(uint64_t start, uint64_t end, uint64_t period)
{
    uint64_t e = end + PLAN_LAG;
    return e - start < period ? e : start + period - 1 > end ? start + period - 1 : end;
}

/* watch.c: a period found in the large allocations' sizes, one step measured and placed */
void watch_again(struct cuheap_plan *pl);
bool watch_seen(struct cuheap_plan *pl, uint64_t size);
void watch_locked(struct cuheap_plan *pl);
bool watch_track(struct cuheap_plan *pl, uint64_t ptr, uint32_t slot);
int64_t watch_untrack(struct cuheap_plan *pl, uint64_t ptr);
size_t measured_blocks(struct cuheap_plan *pl);
bool plan_index_locked(struct cuheap_plan *pl);
void measured_locked(struct cuheap_pool *p, struct cuheap_plan *pl);

/* region.c: the step plan's region, its addresses and pieces */
#define PLAN_FILL_BATCH 64u /* pieces mapped per drop of p->lock */
int region_map_locked(struct cuheap_pool *p, struct cuheap_plan *pl);
void rest_settles_locked(struct cuheap_pool *p);
uint32_t region_unmapped(const struct plan_region *rg, uint64_t offset, uint64_t size,
                         uint32_t todo[PLAN_FILL_BATCH]);
int region_fill_locked(struct cuheap_pool *p, struct cuheap_plan *pl, uint64_t offset,
                       uint64_t size);
void region_reap_locked(struct cuheap_pool *p, struct cuheap_plan *pl);
void region_trim_locked(struct cuheap_pool *p, struct cuheap_plan *pl);

static inline struct plan_region *plan_region_of(struct cuheap_arena *a)
{
    return (struct plan_region *)a;
}

/* The bytes of piece i (the last one may be short). */
static inline uint64_t region_piece_len(const struct plan_region *rg, uint32_t i)
{
    uint64_t at = (uint64_t)i * rg->piece_bytes;
    return rg->bytes - at < rg->piece_bytes ? rg->bytes - at : rg->piece_bytes;
}

/* The pieces [*first, *last] under bytes [offset, offset + size) of the region. */
static inline void region_pieces_of(const struct plan_region *rg, uint64_t offset, uint64_t size,
                                    uint32_t *first, uint32_t *last)
{
    *first = (uint32_t)(offset / rg->piece_bytes);
    *last = (uint32_t)((offset + (size ? size : 1) - 1) / rg->piece_bytes);
}

/* Whether a free over piece i of a region still waits for its fence (its ticket is kept one
 * up: 0 = no free over it, ticket 0 being a real one). */
static inline bool region_piece_waits(struct cuheap_pool *p, const struct plan_region *rg,
                                      uint32_t i)
{
    return rg->ticket[i] && !tl_passed(&p->tl, rg->ticket[i] - 1);
}

#pragma GCC visibility pop

#endif
