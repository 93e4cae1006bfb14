/* SPDX-License-Identifier: MIT */
/* A job's repeating step and the placement planned once for it (src/stepplan.c): the period
 * found past a warm-up and not fooled by a shorter pattern inside the step; blocks that live
 * at once on the circle never overlap, blocks apart in time share memory, across the wrap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "stepplan.h"

#define MIB (1ull << 20)

static void test_period_after_warmup(void **state)
{
    (void)state;
    /* a step whose first half repeats inside it: 1 2 1 2 1 3 */
    static const uint64_t step[] = {1, 2, 1, 2, 1, 3};
    uint64_t keys[200];
    size_t n = 0;
    srand(7);
    for (int i = 0; i < 37; i++)
        keys[n++] = 100 + (uint64_t)(rand() % 50); /* warm-up of other sizes */
    while (n + 6 <= 190)
        for (int i = 0; i < 6; i++)
            keys[n++] = step[i];
    keys[n++] = 999; /* a tail of another shape (the last evaluation) */
    assert_int_equal(cuheap_step_period(keys, n), 6);
    /* a step of 12 layers alike: the layer repeats inside it, the step is what repeats on */
    uint64_t model[38 * 12];
    for (int r = 0; r < 12; r++) {
        uint64_t *k = model + r * 38;
        k[0] = 11;
        for (int layer = 0; layer < 12; layer++)
            for (int j = 0; j < 3; j++)
                k[1 + layer * 3 + j] = (uint64_t)(3 + 2 * j);
        k[37] = 13;
    }
    for (size_t len = 38 * 8; len <= 38 * 12; len++)
        assert_int_equal(cuheap_step_period(model, len), 38);
}

static void test_no_period(void **state)
{
    (void)state;
    uint64_t keys[400];
    srand(11);
    for (int i = 0; i < 400; i++)
        keys[i] = (uint64_t)rand();
    assert_int_equal(cuheap_step_period(keys, 400), 0);
    assert_int_equal(cuheap_step_period(keys, 3), 0);
    /* a job that stops repeating halfway: the pattern before says nothing of what comes */
    for (int i = 0; i < 400; i++)
        keys[i] = i < 200 ? (uint64_t)(i % 5) : (uint64_t)rand();
    assert_int_equal(cuheap_step_period(keys, 400), 0);
}

/* Whether two blocks live at once on a circle of period events. */
static bool meet(const struct cuheap_step_block *x, const struct cuheap_step_block *y,
                 uint64_t period)
{
    for (int sx = 0; sx < 2; sx++)
        for (int sy = 0; sy < 2; sy++) {
            uint64_t a = x->start + (uint64_t)sx * period, b = x->end + (uint64_t)sx * period;
            uint64_t c = y->start + (uint64_t)sy * period, d = y->end + (uint64_t)sy * period;
            if (a < d && c < b)
                return true;
        }
    return false;
}

static void test_plan_never_overlaps(void **state)
{
    (void)state;
    enum { N = 300, PERIOD = 1000 };
    const uint64_t granule = 2 * MIB;
    struct cuheap_step_block b[N];
    srand(3);
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t start = (uint64_t)(rand() % PERIOD);
            uint64_t life = 1 + (uint64_t)(rand() % (PERIOD - 1));
            uint64_t size = 1ull << (rand() % 26); /* 1 B to 32 MiB */
            b[i] = (struct cuheap_step_block){size + (uint64_t)(rand() % 1000), start, start + life,
                                              0, false};
        }
        uint64_t region = cuheap_step_plan(b, N, PERIOD, granule);
        assert_true(region != UINT64_MAX);
        uint64_t most = 0; /* the most bytes live at one point: no plan can hold less */
        for (uint64_t t = 0; t < 2 * PERIOD; t++) {
            uint64_t live = 0;
            for (int i = 0; i < N; i++)
                if ((b[i].start <= t && t < b[i].end) ||
                    (b[i].start <= t + PERIOD && t + PERIOD < b[i].end))
                    live += b[i].size;
            most = live > most ? live : most;
        }
        assert_true(region >= most);
        for (int i = 0; i < N; i++) {
            assert_int_equal(b[i].offset % (b[i].size >= granule ? granule : 512), 0);
            assert_true(b[i].offset + b[i].size <= region);
            for (int j = 0; j < i; j++)
                if (meet(&b[i], &b[j], PERIOD))
                    assert_true(b[i].offset + b[i].size <= b[j].offset ||
                                b[j].offset + b[j].size <= b[i].offset);
        }
    }
}

/* Blocks still held from an earlier placement stay where they are, and no block is placed
 * over their bytes at any time of the step. */
static void test_plan_goes_around_fixed_blocks(void **state)
{
    (void)state;
    enum { N = 200, FIXED = 6, PERIOD = 500 };
    const uint64_t granule = 2 * MIB;
    struct cuheap_step_block b[N];
    srand(5);
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t start = (uint64_t)(rand() % PERIOD);
            uint64_t life = 1 + (uint64_t)(rand() % (PERIOD - 1));
            b[i] = (struct cuheap_step_block){(1ull << (rand() % 25)) + (uint64_t)(rand() % 999),
                                              start, start + life, 0, false};
        }
        uint64_t at[FIXED];
        for (int i = 0; i < FIXED; i++) { /* somewhere in the first 64 MiB, apart */
            at[i] = (uint64_t)(i * 10 + rand() % 4) * MIB;
            b[i * 7] =
                (struct cuheap_step_block){MIB + (uint64_t)(rand() % 999), 0, 0, at[i], true};
        }
        uint64_t region = cuheap_step_plan(b, N, PERIOD, granule);
        assert_true(region != UINT64_MAX);
        for (int i = 0; i < N; i++) {
            if (b[i].fixed)
                continue;
            assert_true(b[i].offset + b[i].size <= region);
            for (int f = 0; f < FIXED; f++) {
                const struct cuheap_step_block *x = &b[f * 7];
                assert_int_equal(x->offset, at[f]);
                assert_true(b[i].offset + b[i].size <= x->offset ||
                            x->offset + x->size <= b[i].offset);
            }
            for (int j = 0; j < i; j++)
                if (!b[j].fixed && meet(&b[i], &b[j], PERIOD))
                    assert_true(b[i].offset + b[i].size <= b[j].offset ||
                                b[j].offset + b[j].size <= b[i].offset);
        }
    }
    /* a fixed block past every other sets the region's end */
    struct cuheap_step_block two[] = {{MIB, 0, 10, 0, false}, {MIB, 0, 0, 8 * MIB, true}};
    assert_int_equal(cuheap_step_plan(two, 2, 100, granule), 9 * MIB);
    assert_int_equal(two[0].offset, 0);
}

static void test_plan_shares_across_the_wrap(void **state)
{
    (void)state;
    /* A lives [10, 60); B from 60 past the step's end to 10 of the next: they share. C lives
     * from 90 to 20 of the next, when A is live: it goes beside them, on a granule. */
    struct cuheap_step_block b[] = {
        {3 * MIB, 10, 60, 0, false}, {3 * MIB, 60, 110, 0, false}, {3 * MIB, 90, 120, 0, false}};
    assert_int_equal(cuheap_step_plan(b, 2, 100, 2 * MIB), 4 * MIB);
    assert_int_equal(b[0].offset, 0);
    assert_int_equal(b[1].offset, 0);
    assert_int_equal(cuheap_step_plan(b, 3, 100, 2 * MIB), 8 * MIB);
    assert_int_equal(b[2].offset, 4 * MIB);
    assert_int_equal(b[0].offset, 0);
    assert_int_equal(b[1].offset, 0);
}

static void test_plan_refuses_a_life_of_a_step(void **state)
{
    (void)state;
    struct cuheap_step_block b[] = {{MIB, 10, 110, 0, false}};
    assert_int_equal(cuheap_step_plan(b, 1, 100, 2 * MIB), UINT64_MAX);
    b[0] = (struct cuheap_step_block){MIB, 100, 120, 0, false}; /* starts past the step */
    assert_int_equal(cuheap_step_plan(b, 1, 100, 2 * MIB), UINT64_MAX);
    assert_int_equal(cuheap_step_plan(b, 0, 100, 2 * MIB), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_period_after_warmup),
        cmocka_unit_test(test_no_period),
        cmocka_unit_test(test_plan_never_overlaps),
        cmocka_unit_test(test_plan_goes_around_fixed_blocks),
        cmocka_unit_test(test_plan_shares_across_the_wrap),
        cmocka_unit_test(test_plan_refuses_a_life_of_a_step),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
