/* SPDX-License-Identifier: MIT */
/*
 * The step plan's rules (CUHEAP_STEP_PLAN, src/pool/plan.c, watch.c, region.c), driven through
 * the pool's test fixture: a repeating step served with no mapping call, a plan that retires
 * when its step changes and comes back, blocks kept past their step planned around, phases of
 * another shape served at the region's free places, and the region's memory given back.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "event.h"
#include "pool/plan.h" /* the pool's own test: its private state too (internal.h with it) */

#include "pool-fixture.h"

/* ---- the step plan (CUHEAP_STEP_PLAN) ---- */

enum { PLAN_STEP = 24 };
static bool plan_check_mid; /* check the pool within steps too (a check walks it all: slow) */

/* One training-shaped step: PLAN_STEP large blocks of many sizes (shift changes them all),
 * the first half freed in reverse at the step's end, the rest as soon as the next is made;
 * the host syncs at the end. */
static int plan_keep_at = PLAN_STEP - 1; /* the block plan_step keeps when asked to */
static uint64_t plan_stray; /* a block of this size half way through the step, freed at its end */

static void plan_step(struct fixture *f, uint64_t shift, uint64_t *keep)
{
    uint64_t act[PLAN_STEP], stray = 0;
    for (int k = 0; k < PLAN_STEP; k++) {
        if (plan_stray && k == PLAN_STEP / 2)
            stray = alloc(f, plan_stray, 0x9);
        act[k] = alloc(f, (uint64_t)(k % 7 + 1) * MIB + (uint64_t)k * 256 * 1024 + shift, 0x9);
        if (k > PLAN_STEP / 2 && !(keep && k - 1 == plan_keep_at))
            release(f, act[k - 1], 0x9);
        if (plan_check_mid && k % 5 == 4)
            check_invariants(f); /* mid-step: no block over another's bytes, live or fenced */
    }
    if (keep)
        *keep = act[plan_keep_at];
    if (!(keep && plan_keep_at == PLAN_STEP - 1))
        release(f, act[PLAN_STEP - 1], 0x9);
    for (int k = PLAN_STEP / 2; k-- > 0;)
        if (!(keep && k == plan_keep_at))
            release(f, act[k], 0x9);
    if (stray)
        release(f, stray, 0x9);
    complete_fences(&f->dev);
}

/* A vmm pool with the step plan on and a 4 GiB device, as the plan's cases use. */
static struct fixture *setup_planned(void)
{
    fixture_step_plan = true;
    struct fixture *f = setup_vmm(CUHEAP_REUSE_FENCE, 4ull << 30, 0);
    fixture_step_plan = false;
    return f;
}

/* Steps enough for a plan to be made and serve (a window's worth, twice). */
static void plan_warm(struct fixture *f)
{
    for (int step = 0; step < 2 * (int)PLAN_WINDOW / PLAN_STEP; step++)
        plan_step(f, 0, NULL);
}

static uint64_t planned_so_far(struct fixture *f)
{
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    return st.nr_planned;
}

/* Once a step repeats, its large blocks come from one region mapped once: a warm step makes
 * no mapping call, and the pool holds about the step's peak (the region) and no more. */
static void test_plan_warm_step_maps_nothing(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    uint64_t peak = 0;
    for (int k = 0; k < PLAN_STEP; k++)
        peak += (uint64_t)(k % 7 + 1) * MIB + (uint64_t)k * 256 * 1024;
    int steps = 2 * PLAN_WINDOW / PLAN_STEP, warm = 0;
    uint64_t planned = 0;
    for (int step = 0; step < steps; step++) {
        if (step == steps - 40) {
            warm = mapping_calls(f);
            planned = planned_so_far(f);
            plan_check_mid = true;
        }
        plan_step(f, 0, NULL);
        if (step % 64 == 0)
            check_invariants(f);
    }
    print_message("# plan: %d mapping calls in 40 warm steps, %lu of %d blocks planned, %lu MiB "
                  "held for a step of %lu MiB\n",
                  mapping_calls(f) - warm, (unsigned long)(planned_so_far(f) - planned),
                  40 * PLAN_STEP, (unsigned long)(f->pool.st.reserved / MIB),
                  (unsigned long)(peak / MIB));
    plan_check_mid = false;
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    print_message("# plan: %u tried, %lu served, %lu missed, %lu waits\n", st.nr_plans,
                  (unsigned long)st.nr_planned, (unsigned long)st.nr_plan_missed,
                  (unsigned long)st.nr_plan_waits);
    assert_int_equal(mapping_calls(f) - warm, 0);
    assert_true(planned_so_far(f) - planned >= 40 * PLAN_STEP * 9 / 10);
    assert_int_equal(st.nr_plans, 1);       /* the summary's line: one plan, kept */
    assert_int_equal(st.nr_plan_missed, 0); /* a step that repeats finds every place free */
    assert_true(f->pool.st.reserved <= peak + peak / 10);
    /* a planned block freed twice is refused, as any other */
    uint64_t p = alloc(f, 1 * MIB, 0x9), size, block, seq;
    assert_true(planned_so_far(f) > 0);
    release(f, p, 0x9);
    assert_int_equal(cuheap_pool_free(&f->pool, p, 0x9, &size, &block, &seq), -EINVAL);
    check_invariants(f);
    teardown(f);
}

/* A step that repeats but for one block of a size never seen before (a buffer sized by the
 * batch's data): the plan keeps its phase past it, so the step's own blocks are all served at
 * their places; taken for one of the step's, it lost the phase at every step and served the
 * blocks after it at other free places (in the way of the step's later ones). */
static void test_plan_keeps_its_phase_past_a_stray(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    struct cuheap_pool_stats before, after;
    cuheap_pool_get_stats(&f->pool, &before);
    for (int step = 0; step < 40; step++) {
        plan_stray = 300 * 1024 + (uint64_t)step * 4096 + 777; /* no step's size, new each time */
        plan_step(f, 0, NULL);
        if (step % 8 == 0)
            check_invariants(f);
    }
    plan_stray = 0;
    cuheap_pool_get_stats(&f->pool, &after);
    uint64_t borrowed = after.nr_plan_borrowed - before.nr_plan_borrowed;
    print_message("# plan: 40 steps with a stray: %lu served, %lu missed, %lu at other free "
                  "places\n",
                  (unsigned long)(after.nr_planned - before.nr_planned),
                  (unsigned long)(after.nr_plan_missed - before.nr_plan_missed),
                  (unsigned long)borrowed);
    assert_int_equal(after.nr_plans, 1);
    assert_int_equal(after.nr_plan_missed, before.nr_plan_missed);
    assert_true(borrowed <= 40); /* the strays themselves at most */
    assert_true(after.nr_planned - before.nr_planned >= 40 * PLAN_STEP);
    check_invariants(f);
    teardown(f);
}

/* A job whose step changes shape gets the rest of the pool: the plan retires, its region goes
 * back but for the pieces under a block the program still holds, which go when it is freed;
 * the new shape is planned in turn. */
static void test_plan_retires_when_the_step_changes(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    uint64_t kept;
    plan_step(f, 0, &kept); /* served from the plan, and held on to */
    assert_true(map_lookup(kept)->planned);
    int releases = f->dev.nr_releases;
    for (int step = 0; step < 8; step++)
        plan_step(f, 64 * 1024, NULL); /* every size another */
    check_invariants(f);
    assert_true(f->dev.nr_releases > releases); /* the region went, piece by piece */
    uint64_t reserved = f->pool.st.reserved;
    release(f, kept, 0x9);
    complete_fences(&f->dev);
    for (int step = 0; step < 2; step++)
        plan_step(f, 64 * 1024, NULL); /* its pieces go at the next large allocations */
    check_invariants(f);
    assert_true(f->pool.st.reserved < reserved);
    uint64_t planned = planned_so_far(f);
    for (int step = 0; step < 2 * (int)PLAN_WINDOW / PLAN_STEP; step++)
        plan_step(f, 64 * 1024, NULL);
    assert_true(planned_so_far(f) > planned); /* the new shape planned */
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_true(st.nr_plans >= 2);      /* the summary says a plan was tried again */
    assert_true(st.nr_plan_missed > 0); /* and that the first one missed */
    check_invariants(f);
    teardown(f);
}

/* A retired region's pieces the driver will not take back stay counted as the pool's, and a
 * trim offers them again. */
static void test_plan_refused_release_stays_counted(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    assert_true(planned_so_far(f) > 0);
    f->dev.fail_release = INT_MAX;
    for (int step = 0; step < 8; step++)
        plan_step(f, 64 * 1024, NULL); /* the plan retires; its pieces are refused */
    check_invariants(f);
    uint64_t used = f->dev.used;
    f->dev.fail_release = 0;
    cuheap_pool_trim(&f->pool, false);
    check_invariants(f);
    assert_true(f->dev.used < used);                 /* offered again, and taken */
    assert_true(f->pool.st.reserved <= f->dev.used); /* nothing counted that the device lost */
    teardown(f);
}

/* A step whose second half lives into the next: at every moment half the live blocks came
 * from the step before. Returns the most the pool held at any allocation. */
static uint64_t plan_carry_step(struct fixture *f, uint64_t carry[PLAN_STEP / 2])
{
    uint64_t act[PLAN_STEP], most = 0;
    for (int k = 0; k < PLAN_STEP; k++) {
        act[k] = alloc(f, (uint64_t)(k % 5 + 2) * MIB + (uint64_t)k * 128 * 1024, 0x9);
        if (k < PLAN_STEP / 2 && carry[k])
            release(f, carry[k], 0x9);
        if (k >= PLAN_STEP / 2)
            release(f, act[k - PLAN_STEP / 2], 0x9);
        if (f->pool.st.reserved > most)
            most = f->pool.st.reserved;
        if (plan_check_mid && k % 3 == 2)
            check_invariants(f); /* no slot live over a block kept where it was */
    }
    for (int k = PLAN_STEP / 2; k < PLAN_STEP; k++)
        carry[k - PLAN_STEP / 2] = act[k];
    complete_fences(&f->dev);
    return most;
}

/* Carried steps until the plan serves (a window's worth at most, four times). */
static void plan_carry_warm(struct fixture *f, uint64_t carry[PLAN_STEP / 2])
{
    for (int steps = 0; !planned_so_far(f) && steps < 4 * (int)PLAN_WINDOW / PLAN_STEP; steps++)
        plan_carry_step(f, carry);
}

/* The plan's region is mapped as its blocks come, while the rest of the pool gives back what
 * it held for the blocks of the steps before: taking over holds no more than the steady state
 * does, though blocks of the step before are live at every moment. */
static void test_plan_takes_over_without_a_second_step(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    uint64_t carry[PLAN_STEP / 2] = {0}, before = 0, takeover = 0, steady = 0;
    int steps = 0;
    while (!planned_so_far(f) && steps++ < 4 * (int)PLAN_WINDOW / PLAN_STEP) {
        uint64_t most = plan_carry_step(f, carry);
        before = most > before ? most : before;
    }
    assert_true(planned_so_far(f) > 0);
    for (int step = 0; step < 2 * (int)PLAN_SETTLE; step++) {
        uint64_t most = plan_carry_step(f, carry);
        takeover = most > takeover ? most : takeover;
        check_invariants(f);
    }
    int calls = mapping_calls(f);
    for (int step = 0; step < 40; step++) {
        uint64_t most = plan_carry_step(f, carry);
        steady = most > steady ? most : steady;
    }
    print_message("# plan taking over: held %lu MiB before, %lu MiB at most taking over, %lu MiB "
                  "steady\n",
                  (unsigned long)(before / MIB), (unsigned long)(takeover / MIB),
                  (unsigned long)(steady / MIB));
    assert_int_equal(mapping_calls(f) - calls, 0); /* served, not a step of misses */
    assert_true(takeover <= steady + steady / 8);  /* mapped whole at once: 1.6x */
    for (int k = 0; k < PLAN_STEP / 2; k++)
        release(f, carry[k], 0x9);
    check_invariants(f);
    teardown(f);
}

/* A block of the step kept on for long (the optimizer's state made in a step of another shape,
 * an evaluation's cache): the plan pins it where it is and plans the step again around it in
 * its region, rather than missing every slot over its bytes, retiring, and mapping anew. */
static void test_plan_goes_around_a_block_kept(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    uint64_t kept, steady = f->pool.st.reserved;
    plan_step(f, 0, &kept); /* its last block, planned to go at the step's end, kept */
    assert_true(map_lookup(kept)->planned);
    for (int step = 0; step < 3 + (int)PLAN_SPARE_STEPS; step++) { /* the old places go back */
        plan_step(f, 0, NULL);
        check_invariants(f);
    }
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 1); /* not retired */
    assert_int_equal(st.nr_plan_replans, 1);
    uint64_t missed = st.nr_plan_missed, planned = planned_so_far(f);
    int calls = mapping_calls(f);
    for (int step = 0; step < 20; step++)
        plan_step(f, 0, NULL);
    cuheap_pool_get_stats(&f->pool, &st);
    print_message("# plan around a kept block: %lu served, %lu missed in 20 steps, %d mapping "
                  "calls\n",
                  (unsigned long)(planned_so_far(f) - planned),
                  (unsigned long)(st.nr_plan_missed - missed), mapping_calls(f) - calls);
    assert_int_equal(st.nr_plan_missed, missed); /* every place free again */
    assert_true(mapping_calls(f) - calls <= 2);  /* the new places mapped once, if at all */
    check_invariants(f);
    /* the pieces of the places the slots left go back: the kept block's bytes more, no more */
    uint64_t block_bytes = (PLAN_STEP - 1) % 7 * MIB + MIB + (PLAN_STEP - 1) * 256 * 1024;
    print_message("# plan around a kept block: held %lu MiB before, %lu MiB with it (%lu MiB)\n",
                  (unsigned long)(steady / MIB), (unsigned long)(f->pool.st.reserved / MIB),
                  (unsigned long)(block_bytes / MIB));
    assert_true(f->pool.st.reserved <= steady + block_bytes + 4 * MIB);
    /* the kept block is still the program's, and goes back to the plan's bytes when freed */
    uint64_t base, size, id, arena;
    assert_int_equal(cuheap_pool_block_range(&f->pool, kept + 4096, &base, &size, &id, &arena), 0);
    assert_int_equal(base, kept);
    release(f, kept, 0x9);
    complete_fences(&f->dev);
    for (int step = 0; step < 4; step++)
        plan_step(f, 0, NULL);
    check_invariants(f);
    teardown(f);
}

/* Blocks kept a few steps each, one after another at other places (an evaluation's every few
 * steps): each time the plan is made again, and the pieces its slots left go back, so that the
 * region holds one layout's worth, not all of them together. */
static void test_plan_gives_back_the_places_it_left(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    uint64_t steady = f->pool.st.reserved, most = 0;
    for (int round = 0; round < 6; round++) {
        uint64_t kept;
        plan_keep_at = 13 + 2 * round; /* a block of the step's second half, another each time */
        plan_step(f, 0, &kept);
        for (int step = 0; step < 4; step++)
            plan_step(f, 0, NULL);
        release(f, kept, 0x9);
        for (int step = 0; step < (int)PLAN_SPARE_STEPS + 3; step++)
            plan_step(f, 0, NULL);
        check_invariants(f);
        most = f->pool.st.reserved > most ? f->pool.st.reserved : most;
    }
    plan_keep_at = PLAN_STEP - 1;
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    print_message(
        "# plan: %lu MiB steady, %lu MiB at most over 6 kept blocks, %lu new placements\n",
        (unsigned long)(steady / MIB), (unsigned long)(most / MIB),
        (unsigned long)st.nr_plan_replans);
    assert_int_equal(st.nr_plans, 1);
    assert_true(st.nr_plan_replans >= 6);
    assert_true(most <= steady + steady / 8); /* one layout and a kept block, not six */
    teardown(f);
}

/* A step whose largest block comes first and goes at once, then eight small ones, each freed
 * once the next is made, with a GPU right behind the host: the region is mostly free for the
 * rest of the step. keep: the block
 * of allocation `kept_at`, not freed. */
enum { TAKEN_STEP = 9 };
static void taken_step(struct fixture *f, int kept_at, uint64_t *keep)
{
    uint64_t act[TAKEN_STEP];
    for (int k = 0; k < TAKEN_STEP; k++) {
        act[k] = alloc(f, k ? MIB + (uint64_t)k * 128 * 1024 : 24 * MIB, 0x9);
        if (k && k - 1 != kept_at)
            release(f, act[k - 1], 0x9);
        complete_fences(&f->dev); /* a GPU right behind the host: fences pass at once */
    }
    if (keep)
        *keep = act[kept_at];
    release(f, act[TAKEN_STEP - 1], 0x9);
    complete_fences(&f->dev);
}

/* A block kept past its step holds its slot's place, and the places of the slots that share
 * its bytes: each is served at a place of the region that no other slot comes to while its
 * block lives, not by memory mapped beside the region. */
static void test_plan_serves_a_taken_place_in_the_region(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    for (int step = 0; step < 2 * (int)PLAN_WINDOW / TAKEN_STEP + 4; step++)
        taken_step(f, -1, NULL);
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 1);
    uint64_t missed = st.nr_plan_missed, borrowed = st.nr_plan_borrowed, kept;
    taken_step(f, 4, &kept);
    int calls = mapping_calls(f);
    taken_step(f, -1, NULL); /* slot 4's place still holds the kept block */
    cuheap_pool_get_stats(&f->pool, &st);
    print_message("# plan: a place taken: %lu served at free places, %lu missed, %d mapping "
                  "calls\n",
                  (unsigned long)(st.nr_plan_borrowed - borrowed),
                  (unsigned long)(st.nr_plan_missed - missed), mapping_calls(f) - calls);
    assert_true(st.nr_plan_borrowed > borrowed);
    /* only the largest slot, whose place the kept block is in and which fits nowhere beside
     * it (7 when they all went to the rest of the pool) */
    assert_true(st.nr_plan_missed - missed <= 1);
    check_invariants(f);
    release(f, kept, 0x9);
    complete_fences(&f->dev);
    for (int step = 0; step < 4; step++)
        taken_step(f, -1, NULL);
    cuheap_pool_get_stats(&f->pool, &st);
    missed = st.nr_plan_missed;
    for (int step = 0; step < 4; step++)
        taken_step(f, -1, NULL);
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plan_missed, missed); /* every place free again */
    teardown(f);
}

/* A phase that keeps a block of the step's first half for a few steps, again and again (an
 * evaluation's output held a while): the step is placed again around the block, then back. The
 * pieces the slots leave stay mapped for PLAN_SPARE_STEPS steps, so that once the phase has
 * been seen it costs no mapping call (50 in five rounds when they went back at once), and the
 * pool holds no more than about a kept block's worth past the steady state. */
static void test_plan_keeps_its_places_through_a_phase(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    uint64_t steady = f->pool.st.reserved, most = 0;
    int calls = 0, first = 0;
    for (int round = 0; round < 6; round++) {
        uint64_t kept;
        int before = mapping_calls(f);
        plan_keep_at = 5;
        plan_step(f, 0, &kept);
        plan_keep_at = PLAN_STEP - 1;
        for (int step = 0; step < 2; step++)
            plan_step(f, 0, NULL);
        release(f, kept, 0x9);
        for (int step = 0; step < 3; step++)
            plan_step(f, 0, NULL);
        check_invariants(f);
        most = f->pool.st.reserved > most ? f->pool.st.reserved : most;
        if (round)
            calls += mapping_calls(f) - before;
        else
            first = mapping_calls(f) - before;
    }
    print_message("# plan: a block kept 3 steps, 6 times: %d mapping calls the first time, %d in "
                  "the 5 after; %lu MiB steady, %lu at most\n",
                  first, calls, (unsigned long)(steady / MIB), (unsigned long)(most / MIB));
    assert_true(calls <= 4);
    assert_true(most <= steady + steady / 8);
    teardown(f);
}

/* A phase of another shape between steps (an evaluation): its blocks go at the places of the
 * region free at the time, not to memory mapped beside it, and the step is served as before
 * once they are freed. */
static void test_plan_serves_a_phase_at_free_places(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    uint64_t steady = f->pool.st.reserved;
    struct cuheap_pool_stats st;
    for (int round = 0; round < 3; round++) {
        uint64_t phase[10];
        atomic_store(&f->dev.idle, true); /* the host waited for the step (loss.item()) */
        for (int i = 0; i < 10; i++)      /* sizes the step never asks for, in no order of it */
            phase[i] = alloc(f, (uint64_t)(i % 3 + 1) * 3 * MIB + 4096 * (uint64_t)(i + 1), 0x9);
        for (int i = 0; i < 10; i++)
            assert_true(map_lookup(phase[i])->planned);
        check_invariants(f);
        for (int i = 0; i < 10; i++)
            release(f, phase[i], 0x9);
        atomic_store(&f->dev.idle, false);
        complete_fences(&f->dev);
        for (int step = 0; step < 3; step++)
            plan_step(f, 0, NULL);
    }
    cuheap_pool_get_stats(&f->pool, &st);
    uint64_t missed = st.nr_plan_missed;
    int calls = mapping_calls(f);
    for (int step = 0; step < 5; step++)
        plan_step(f, 0, NULL);
    cuheap_pool_get_stats(&f->pool, &st);
    print_message(
        "# plan: a phase of another shape: %lu at free places, %lu MiB held (steady %lu)\n",
        (unsigned long)st.nr_plan_borrowed, (unsigned long)(f->pool.st.reserved / MIB),
        (unsigned long)(steady / MIB));
    assert_true(st.nr_plan_borrowed >= 30);
    assert_int_equal(st.nr_plans, 1);
    assert_int_equal(st.nr_plan_missed, missed); /* the step served as before */
    assert_int_equal(mapping_calls(f) - calls, 0);
    assert_true(f->pool.st.reserved <= steady + steady / 16);
    check_invariants(f);
    teardown(f);
}

/* The same with the kept block's bytes shared by slots served before the plan is made again:
 * none of them is served over it meanwhile, and the plan made again serves them elsewhere. */
static void test_plan_never_serves_over_a_kept_block(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    uint64_t carry[PLAN_STEP / 2] = {0};
    plan_carry_warm(f, carry);
    for (int step = 0; step < 4; step++)
        plan_carry_step(f, carry);
    uint64_t kept = carry[3]; /* planned to go at allocation 3 of the next step */
    assert_true(map_lookup(kept)->planned);
    carry[3] = 0;
    plan_check_mid = true;
    for (int step = 0; step < 6; step++)
        plan_carry_step(f, carry);
    plan_check_mid = false;
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 1);
    assert_true(st.nr_plan_replans >= 1);
    uint64_t missed = st.nr_plan_missed;
    for (int step = 0; step < 10; step++)
        plan_carry_step(f, carry);
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plan_missed, missed);
    release(f, kept, 0x9);
    for (int k = 0; k < PLAN_STEP / 2; k++)
        release(f, carry[k], 0x9);
    check_invariants(f);
    teardown(f);
}

/* Another thread allocating small blocks and checking the pool while the plan maps its pieces
 * (p->lock dropped): it never sees a planned block over a piece not yet mapped, nor the
 * accounting half done. */
struct plan_neighbour {
    struct fixture *f;
    _Atomic bool stop;
    char why[256];
};

static void *plan_neighbour_thread(void *arg)
{
    struct plan_neighbour *nb = arg;
    uint64_t ptr, block, seq, size, bsize;
    for (unsigned i = 0; !atomic_load(&nb->stop) && !nb->why[0]; i++) {
        if (cuheap_pool_alloc(&nb->f->pool, 64 * 1024, 0, &ptr, &block, &seq) == 0)
            cuheap_pool_free(&nb->f->pool, ptr, 0, &size, &bsize, &seq);
        if (i % 8 == 0) /* a check walks 4 GiB arenas: the lock is the allocating thread's too */
            cuheap_pool_check(&nb->f->pool, nb->why, sizeof(nb->why));
        usleep(50);
    }
    return NULL;
}

static void test_plan_fills_beside_other_threads(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    uint64_t carry[PLAN_STEP / 2] = {0};
    plan_carry_warm(f, carry);
    assert_true(planned_so_far(f) > 0);
    /* a plan made anew, its pieces mapped while the neighbour runs */
    for (int step = 0; step < (int)PLAN_BAD_STEPS + 1; step++)
        plan_step(f, 64 * 1024, NULL);
    struct plan_neighbour nb = {.f = f};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, plan_neighbour_thread, &nb), 0);
    uint64_t planned = planned_so_far(f);
    for (int step = 0; step < 24 && !nb.why[0]; step++)
        plan_carry_step(f, carry);
    atomic_store(&nb.stop, true);
    pthread_join(t, NULL);
    if (nb.why[0])
        fail_msg("pool invariant beside the plan: %s", nb.why);
    assert_true(planned_so_far(f) > planned);
    for (int k = 0; k < PLAN_STEP / 2; k++)
        release(f, carry[k], 0x9);
    check_invariants(f);
    teardown(f);
}

/* A job back in its step after a few steps of another shape (an evaluation) is planned again
 * within a few steps: the period of the plan that retired is asked about first. */
static void test_plan_comes_back_after_an_interlude(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    plan_warm(f);
    for (int step = 0; step < (int)PLAN_BAD_STEPS + 2; step++)
        plan_step(f, 64 * 1024, NULL); /* the interlude: every size another; the plan retires */
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 1);
    uint64_t planned = planned_so_far(f);
    int back = 0;
    while (planned_so_far(f) == planned && back < 16) {
        plan_step(f, 0, NULL);
        back++;
    }
    print_message("# plan: served again %d steps after the interlude (%lu of its allocations "
                  "at free places)\n",
                  back, (unsigned long)st.nr_plan_borrowed);
    assert_true(back <= 8); /* two steps seen, two measured, the quiet moment: not a window */
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 2);
    int calls = mapping_calls(f);
    for (int step = 0; step < 8; step++)
        plan_step(f, 0, NULL);
    check_invariants(f);
    for (int step = 0; step < 20; step++)
        plan_step(f, 0, NULL);
    assert_true(mapping_calls(f) - calls <= 2 * PLAN_STEP); /* the old region's last pieces */
    calls = mapping_calls(f);
    for (int step = 0; step < 20; step++)
        plan_step(f, 0, NULL);
    assert_int_equal(mapping_calls(f) - calls, 0);
    teardown(f);
}

/* A step of a large block, then a chain of smaller ones, each freed once `lag` more have been
 * made: the lives change with lag, the sizes do not. */
static void plan_chain_step(struct fixture *f, int lag)
{
    uint64_t act[PLAN_STEP];
    for (int k = 0; k < PLAN_STEP; k++) {
        act[k] =
            alloc(f, k ? (uint64_t)(k % 7 + 1) * MIB + (uint64_t)k * 64 * 1024 : 64 * MIB, 0x9);
        if (k >= lag)
            release(f, act[k - lag], 0x9);
    }
    for (int k = PLAN_STEP - lag; k < PLAN_STEP; k++)
        release(f, act[k], 0x9);
    complete_fences(&f->dev);
}

/* A job whose step keeps its sizes but not its lives: the places planned for the old lives are
 * taken by the step's own blocks. Served at free places of the region (the large block's, free
 * most of the step) they would keep the old plan going for good; but a plan that must serve its
 * step around itself fits it no more: it retires, the new lives are planned, and every block is
 * served at its own place again. */
static void test_plan_retires_when_lives_change(void **state)
{
    (void)state;
    struct fixture *f = setup_planned();
    for (int step = 0; step < 2 * (int)PLAN_WINDOW / PLAN_STEP; step++)
        plan_chain_step(f, 1);
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_plans, 1);
    int steps = 0;
    for (; st.nr_plans < 2 && steps < 4 * (int)PLAN_WINDOW / PLAN_STEP; steps++) {
        plan_chain_step(f, 2);
        cuheap_pool_get_stats(&f->pool, &st);
    }
    print_message("# plan: lives changed, planned again after %d steps (%lu served elsewhere)\n",
                  steps, (unsigned long)st.nr_plan_borrowed);
    assert_int_equal(st.nr_plans, 2);
    /* the new region's pieces mapped as first served, the rest of the pool settled */
    for (int step = 0; step < 2 * (int)PLAN_SETTLE + 2; step++)
        plan_chain_step(f, 2);
    cuheap_pool_get_stats(&f->pool, &st);
    uint64_t planned = st.nr_planned, borrowed = st.nr_plan_borrowed, missed = st.nr_plan_missed;
    int calls = mapping_calls(f);
    for (int step = 0; step < 20; step++)
        plan_chain_step(f, 2);
    check_invariants(f);
    cuheap_pool_get_stats(&f->pool, &st);
    assert_int_equal(st.nr_planned - planned, 20 * PLAN_STEP);
    assert_int_equal(st.nr_plan_borrowed, borrowed); /* each at its own place */
    assert_int_equal(st.nr_plan_missed, missed);
    assert_int_equal(mapping_calls(f) - calls, 0);
    teardown(f);
}

/* ---- random trouble around a served step ---- */

struct plan_live {
    uint64_t ptr, size;
    int until; /* the step after which a kept block is freed, -1 = the step's own */
};

/* Whether [ptr, ptr + size) meets a block the program holds: two live blocks sharing bytes
 * would corrupt its results, whoever placed them. */
static bool plan_overlaps_live(const struct plan_live *live, int n, uint64_t ptr, uint64_t size)
{
    for (int i = 0; i < n; i++)
        if (live[i].ptr < ptr + size && ptr < live[i].ptr + live[i].size)
            return true;
    return false;
}

/* The plan serving a step with random trouble around it: blocks of sizes the step never asks
 * for at random moments, blocks kept for a few steps, frees on a stream, fences that pass late
 * or only when the pool waits, phases of another shape, a step cut short. No live block ever
 * shares bytes with another, the pool's invariants hold (no block over bytes a freed block
 * still waits on), and everything goes back at the end. The plan must have served through
 * the trouble, or the case tested nothing. */
static void plan_random(unsigned seed, bool threaded_cache)
{
    fixture_thread_cache = threaded_cache ? 16 * MIB : 0;
    struct fixture *f = setup_planned();
    fixture_thread_cache = 0;
    plan_warm(f);
    uint64_t planned = planned_so_far(f);
    assert_true(planned > 0);
    srand(seed);
    enum { MAX_LIVE = 96 };
    struct plan_live live[MAX_LIVE];
    int n = 0;
    for (int step = 0; step < 240; step++) {
        uint64_t shift = rand() % 80 == 0 ? 64 * 1024 * (uint64_t)(1 + rand() % 3) : 0;
        int cut = rand() % 60 == 0 ? rand() % PLAN_STEP : PLAN_STEP;
        int first = n;
        for (int k = 0; k < cut && n < MAX_LIVE - 2; k++) {
            uint64_t size = (uint64_t)(k % 7 + 1) * MIB + (uint64_t)k * 256 * 1024 + shift;
            if (rand() % 150 == 0) { /* a block of another size, kept a few steps or not */
                uint64_t odd = 1 + (uint64_t)rand() % (48 * MIB);
                uint64_t ptr = alloc(f, odd, rand() % 3 ? 0x9 : 0x77);
                assert_false(plan_overlaps_live(live, n, ptr, odd));
                live[n++] = (struct plan_live){ptr, odd, step + rand() % 4};
            }
            uint64_t ptr = alloc(f, size, 0x9);
            assert_false(plan_overlaps_live(live, n, ptr, size));
            /* now and then one outlives its step by a few */
            live[n++] = (struct plan_live){ptr, size, rand() % 150 ? -1 : step + 1 + rand() % 5};
            if (rand() % 50 == 0)
                check_invariants(f);
            /* the step's second half goes as the next comes: free the one before */
            if (k > PLAN_STEP / 2 && live[n - 2].until < 0) {
                release(f, live[n - 2].ptr, rand() % 8 ? 0x9 : 0x77);
                live[n - 2] = live[n - 1];
                n--;
            }
        }
        /* the step's own blocks go at its end, newest first; kept ones when their time comes */
        for (int i = n; i-- > first;)
            if (live[i].until < 0) {
                release(f, live[i].ptr, rand() % 8 ? 0x9 : 0x77);
                live[i] = live[--n];
            }
        for (int i = n; i-- > 0;)
            if (live[i].until >= 0 && live[i].until <= step) {
                release(f, live[i].ptr, 0x9);
                live[i] = live[--n];
            }
        if (rand() % 4) /* else the fences pass later, or when the pool waits for one */
            complete_fences(&f->dev);
        if (step % 16 == 0)
            check_invariants(f);
    }
    struct cuheap_pool_stats st;
    cuheap_pool_get_stats(&f->pool, &st);
    print_message("# plan, random trouble (seed %u%s): %lu served, %lu missed, %u plans, %lu new "
                  "placements, %lu MiB held\n",
                  seed, threaded_cache ? ", thread cache" : "",
                  (unsigned long)(st.nr_planned - planned), (unsigned long)st.nr_plan_missed,
                  st.nr_plans, (unsigned long)st.nr_plan_replans,
                  (unsigned long)(f->pool.st.reserved / MIB));
    assert_true(st.nr_planned - planned >= 240 * PLAN_STEP / 4);
    while (n)
        release(f, live[--n].ptr, 0x9);
    check_invariants(f);
    complete_fences(&f->dev);
    cuheap_pool_trim(&f->pool, false);
    check_invariants(f);
    assert_int_equal(f->pool.st.live, 0);
    assert_int_equal(atomic_load(&f->reserved), 0); /* the region too: nothing is live in it */
    assert_int_equal(f->dev.used, 0);
    teardown(f);
}

static void test_plan_random_with_invariants(void **state)
{
    (void)state;
    plan_random(5, false);
}

static void test_plan_random_with_invariants_thread_cache(void **state)
{
    (void)state;
    plan_random(7, true);
}

/* Threads with blocks of their own beside a repeating step, as a data loader's or a second
 * stream's: small blocks through their caches, and a large block of a size of its own every
 * few steps, which the plan sees between the step's. The plan is made all the same (counted,
 * such blocks broke every period: none was made in 1,365 steps), no two live blocks share
 * bytes, the invariants hold while the plan maps, serves, loses and finds its step beside
 * them (the sanitizers' runs see every lock rule here: suite unit), and it serves throughout. */
struct plan_stormer {
    struct fixture *f;
    unsigned seed;
    _Atomic bool *stop;
    _Atomic int *large; /* large blocks the step's thread allows: one every few steps */
    char why[256];
};

static void *plan_storm_thread(void *arg)
{
    struct plan_stormer *st = arg;
    struct cuheap_pool *p = &st->f->pool;
    uint64_t ptr[32] = {0}, size[32] = {0}, block, seq, got, bsize;
    unsigned r = st->seed;
    for (unsigned i = 0; !atomic_load(st->stop) && !st->why[0]; i++) {
        r = r * 1103515245u + 12345u;
        unsigned k = (r >> 8) % 32;
        if (ptr[k]) {
            if (cuheap_pool_free(p, ptr[k], (r >> 4) % 4 ? 0 : 0x55, &got, &bsize, &seq))
                snprintf(st->why, sizeof(st->why), "free of a live block refused");
            ptr[k] = 0;
            continue;
        }
        uint64_t want = 1 + (r >> 13) % (128 * 1024);
        if ((r >> 16) % 64 == 0 && atomic_load(st->large) > 0 && atomic_fetch_sub(st->large, 1) > 0)
            want = 1 + (r >> 10) % (6 * MIB);
        if (cuheap_pool_alloc(p, want, 0, &ptr[k], &block, &seq)) {
            ptr[k] = 0;
            continue; /* the device may be full for a moment: the driver's answer */
        }
        size[k] = want;
        for (unsigned j = 0; j < 32; j++)
            if (j != k && ptr[j] && ptr[j] < ptr[k] + want && ptr[k] < ptr[j] + size[j])
                snprintf(st->why, sizeof(st->why), "two live blocks share bytes");
        usleep(20); /* a neighbour, not a storm: under TSan a storm starves the step's thread */
    }
    for (unsigned k = 0; k < 32; k++)
        if (ptr[k])
            cuheap_pool_free(p, ptr[k], 0, &got, &bsize, &seq);
    return NULL;
}

static void test_plan_serves_beside_threads(void **state)
{
    (void)state;
    fixture_thread_cache = 16 * MIB;
    struct fixture *f = setup_planned();
    fixture_thread_cache = 0;
    _Atomic bool stop = false;
    _Atomic int large = 0;
    struct plan_stormer st[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        st[i] = (struct plan_stormer){
            .f = f, .seed = 17u + (unsigned)i, .stop = &stop, .large = &large};
        assert_int_equal(pthread_create(&t[i], NULL, plan_storm_thread, &st[i]), 0);
    }
    int step = 0;
    /* a check walks 4 GiB arenas under the pool's lock: this thread's every few steps, not
     * debug builds' every 64th operation, or sanitized runs take minutes */
    cuheap_pool_debug_check_every(0);
    for (; step < 4 * (int)PLAN_WINDOW / PLAN_STEP && !planned_so_far(f); step++) {
        plan_step(f, 0, NULL);
        atomic_store(&large, step % 4 == 3);
    }
    check_invariants(f);
    uint64_t planned = planned_so_far(f);
    for (int i = 0; i < 60; i++) {
        plan_step(f, i % 20 == 19 ? 64 * 1024 : 0, NULL); /* now and then a step of another shape */
        atomic_store(&large, i % 4 == 3);
        if (i % 10 == 9)
            check_invariants(f); /* beside the threads' blocks, cached or not */
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    cuheap_pool_debug_check_every(64);
    for (int i = 0; i < 3; i++)
        if (st[i].why[0])
            fail_msg("beside the plan: %s", st[i].why);
    struct cuheap_pool_stats ps;
    cuheap_pool_get_stats(&f->pool, &ps);
    print_message(
        "# plan beside 3 threads: made after %d steps, %lu served in 60 after, %u plans\n", step,
        (unsigned long)(ps.nr_planned - planned), ps.nr_plans);
    assert_true(planned > 0);
    assert_true(step <= 2 * (int)PLAN_WINDOW / PLAN_STEP); /* a window's worth, twice */
    assert_true(ps.nr_planned - planned >= 60 * PLAN_STEP / 2);
    check_invariants(f);
    complete_fences(&f->dev);
    cuheap_pool_trim(&f->pool, false);
    assert_int_equal(f->pool.st.live, 0);
    assert_int_equal(atomic_load(&f->reserved), 0);
    teardown(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_warm_step_maps_nothing),
        cmocka_unit_test(test_plan_retires_when_the_step_changes),
        cmocka_unit_test(test_plan_keeps_its_phase_past_a_stray),
        cmocka_unit_test(test_plan_refused_release_stays_counted),
        cmocka_unit_test(test_plan_takes_over_without_a_second_step),
        cmocka_unit_test(test_plan_comes_back_after_an_interlude),
        cmocka_unit_test(test_plan_retires_when_lives_change),
        cmocka_unit_test(test_plan_goes_around_a_block_kept),
        cmocka_unit_test(test_plan_never_serves_over_a_kept_block),
        cmocka_unit_test(test_plan_gives_back_the_places_it_left),
        cmocka_unit_test(test_plan_serves_a_taken_place_in_the_region),
        cmocka_unit_test(test_plan_keeps_its_places_through_a_phase),
        cmocka_unit_test(test_plan_serves_a_phase_at_free_places),
        cmocka_unit_test(test_plan_fills_beside_other_threads),
        cmocka_unit_test(test_plan_random_with_invariants),
        cmocka_unit_test(test_plan_random_with_invariants_thread_cache),
        cmocka_unit_test(test_plan_serves_beside_threads),
    };
    return run_pool_tests(tests, sizeof(tests) / sizeof(tests[0]));
}
