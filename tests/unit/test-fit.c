/* SPDX-License-Identifier: MIT */
/* First fit by address against a reference model: every block handed out is the lowest run of
 * free units that holds it (a unit map searched from the start), overlaps nothing live, is
 * found again from any byte inside it, and everything merges back into one range at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fit.h"

#define BASE ((uintptr_t)1 << 40) /* device-like addresses; never touched */

static void check_ok(const struct cuheap_fit *f)
{
    char why[256] = "";
    if (cuheap_fit_check(f, why, sizeof(why)))
        fail_msg("first-fit invariant broken: %s", why);
}

static void test_init_rejects_bad_shapes(void **state)
{
    (void)state;
    struct cuheap_fit f;
    assert_int_equal(cuheap_fit_init(&f, BASE, 3000, 512), -22);     /* not whole units */
    assert_int_equal(cuheap_fit_init(&f, BASE, 1 << 20, 1000), -22); /* unit not a power of 2 */
    assert_int_equal(cuheap_fit_init(&f, BASE + 3, 1 << 20, 512), -22);
    assert_int_equal(cuheap_fit_init(&f, BASE, 0, 512), -22);
}

/* Sizes are not rounded to powers of two, blocks go to the lowest place that holds them, and
 * what a freed block leaves serves the next block of any size. */
static void test_lowest_place_that_fits(void **state)
{
    (void)state;
    struct cuheap_fit f;
    assert_int_equal(cuheap_fit_init(&f, BASE, 10 << 20, 512), 0); /* 10 MiB: no power of two */
    uintptr_t a, b, c, d, e;
    uint64_t n;
    assert_int_equal(cuheap_fit_alloc(&f, 3 << 20, &a, &n), 0);
    assert_true(a == BASE && n == 3u << 20);
    assert_int_equal(cuheap_fit_alloc(&f, 1, &b, &n), 0); /* one unit */
    assert_true(b == BASE + (3 << 20) && n == 512);
    assert_int_equal(cuheap_fit_alloc(&f, (5 << 20) + 100, &c, &n), 0);
    assert_true(c == b + 512 && n == (5u << 20) + 512);
    assert_int_equal(cuheap_fit_largest_free(&f), (2u << 20) - 1024);
    assert_int_equal(cuheap_fit_alloc(&f, 2 << 20, &d, &n), -12); /* 2 MiB less 1 KiB left */
    check_ok(&f);
    assert_int_equal(cuheap_fit_free(&f, a), 3 << 20);
    assert_int_equal(cuheap_fit_free(&f, a), -22);       /* double free */
    assert_int_equal(cuheap_fit_free(&f, c + 512), -22); /* interior pointer */
    /* the freed 3 MiB at the bottom serves a 1 MiB and a 2 MiB block, lowest first */
    assert_int_equal(cuheap_fit_alloc(&f, 1 << 20, &d, &n), 0);
    assert_int_equal(d, BASE);
    assert_int_equal(cuheap_fit_alloc(&f, 2 << 20, &e, &n), 0);
    assert_int_equal(e, BASE + (1 << 20));
    uintptr_t start;
    uint64_t bytes;
    assert_int_equal(cuheap_fit_block_of(&f, c + (4 << 20), &start, &bytes), 0);
    assert_true(start == c && bytes == (5u << 20) + 512);
    assert_int_equal(cuheap_fit_block_of(&f, BASE + (9 << 20), &start, &bytes), -2); /* free */
    assert_int_equal(cuheap_fit_block_of(&f, BASE + (10 << 20), &start, &bytes), -22);
    assert_int_equal(cuheap_fit_bytes_at(&f, e), 2 << 20);
    assert_int_equal(cuheap_fit_bytes_at(&f, e + 512), 0);
    check_ok(&f);
    /* freed in an order that merges on both sides, then on each side alone */
    assert_int_equal(cuheap_fit_free(&f, d), 1 << 20);
    assert_int_equal(cuheap_fit_free(&f, b), 512);
    assert_int_equal(cuheap_fit_free(&f, e), 2 << 20); /* both neighbours free */
    check_ok(&f);
    assert_int_equal(cuheap_fit_largest_free(&f), (3u << 20) + 512);
    assert_int_equal(cuheap_fit_free(&f, c), (5 << 20) + 512);
    check_ok(&f);
    assert_true(cuheap_fit_empty(&f));
    assert_int_equal(cuheap_fit_largest_free(&f), 10u << 20);
    cuheap_fit_destroy(&f);
}

struct live {
    uintptr_t addr;
    uint64_t bytes;
};

/* The lowest run of n free units in the model, or -1. */
static int64_t model_first_fit(const uint8_t *used, uint32_t nr_units, uint32_t n)
{
    uint32_t run = 0;
    for (uint32_t u = 0; u < nr_units; u++) {
        run = used[u] ? 0 : run + 1;
        if (run == n)
            return (int64_t)u + 1 - n;
    }
    return -1;
}

/* Long random sequences against the model; the arena must be one free range at the end. */
static void random_run(uint64_t arena, uint64_t unit, unsigned seed, int steps, int check_every)
{
    struct cuheap_fit f;
    assert_int_equal(cuheap_fit_init(&f, BASE, arena, unit), 0);
    uint32_t nr_units = (uint32_t)(arena / unit);
    uint8_t *used = calloc(nr_units, 1);
    struct live *l = calloc(65536, sizeof(*l));
    size_t n = 0;
    srand(seed);
    for (int step = 0; step < steps; step++) {
        if (n == 0 || (n < 65536 && rand() % 100 < 55)) {
            /* log-uniform sizes from 1 B to an eighth of the arena */
            int bits = rand() % (int)(63 - __builtin_clzll(arena) - 2);
            uint64_t size = 1 + ((uint64_t)rand() % ((1ull << bits) + 1));
            uint32_t want = (uint32_t)((size + unit - 1) / unit);
            int64_t expect = model_first_fit(used, nr_units, want);
            uintptr_t a;
            uint64_t bytes;
            int r = cuheap_fit_alloc(&f, size, &a, &bytes);
            if (expect < 0) {
                assert_int_equal(r, -12); /* a refusal must be real */
                continue;
            }
            assert_int_equal(r, 0);
            assert_int_equal(a, BASE + (uint64_t)expect * unit);
            assert_int_equal(bytes, (uint64_t)want * unit);
            memset(used + expect, 1, want);
            l[n++] = (struct live){a, bytes};
        } else {
            size_t i = (size_t)rand() % n;
            /* any byte inside finds the block */
            uintptr_t start;
            uint64_t bytes;
            uintptr_t inside = l[i].addr + (uint64_t)rand() % l[i].bytes;
            assert_int_equal(cuheap_fit_block_of(&f, inside, &start, &bytes), 0);
            assert_true(start == l[i].addr && bytes == l[i].bytes);
            assert_int_equal(cuheap_fit_free(&f, l[i].addr), (int64_t)l[i].bytes);
            memset(used + (l[i].addr - BASE) / unit, 0, l[i].bytes / unit);
            l[i] = l[--n];
        }
        /* any unit answers as the model says: in a block, or free */
        uint32_t u = (uint32_t)rand() % nr_units;
        uintptr_t start;
        uint64_t bytes;
        assert_int_equal(cuheap_fit_block_of(&f, BASE + u * unit, &start, &bytes),
                         used[u] ? 0 : -2);
        if (step % check_every == 0) {
            check_ok(&f);
            /* a walk by pieces tiles the arena as the model does: blocks where units are used,
             * free ranges (never two in a row) where they are not */
            bool last_free = false;
            for (uint32_t v = 0; v < nr_units;) {
                bool allocated;
                assert_int_equal(cuheap_fit_piece_at(&f, BASE + v * unit, &bytes, &allocated), 0);
                assert_true(bytes >= unit && bytes % unit == 0 && v + bytes / unit <= nr_units);
                assert_int_equal(allocated, used[v]);
                assert_false(!allocated && last_free);
                for (uint32_t k = v; k < v + bytes / unit; k++)
                    assert_int_equal(used[k], allocated);
                last_free = !allocated;
                v += (uint32_t)(bytes / unit);
            }
            bool inside_free;
            if (nr_units > 1 && !used[0] && !used[1]) /* no piece starts inside a free range */
                assert_int_equal(cuheap_fit_piece_at(&f, BASE + unit, &bytes, &inside_free), -22);
        }
    }
    while (n) {
        n--;
        assert_true(cuheap_fit_free(&f, l[n].addr) > 0);
    }
    check_ok(&f);
    assert_true(cuheap_fit_empty(&f));
    assert_int_equal(cuheap_fit_largest_free(&f), arena);
    free(l);
    free(used);
    cuheap_fit_destroy(&f);
}

static void test_random_small_arena(void **state)
{
    (void)state;
    random_run(1 << 20, 512, 1, 20000, 1);
}

static void test_random_odd_arena(void **state)
{
    (void)state;
    random_run(3ull << 20, 4096, 2, 20000, 7); /* not a power of two, larger units */
}

static void test_random_arena_of_odd_units(void **state)
{
    (void)state;
    random_run(2049 * 512, 512, 4, 20000, 3); /* an odd count of units: every array aligned */
}

static void test_huge_request_refused(void **state)
{
    (void)state;
    struct cuheap_fit f;
    assert_int_equal(cuheap_fit_init(&f, BASE, 1 << 20, 512), 0);
    uintptr_t a;
    uint64_t n;
    assert_int_equal(cuheap_fit_alloc(&f, UINT64_MAX, &a, &n), -12); /* no wrap to 0 units */
    assert_int_equal(cuheap_fit_alloc(&f, (1 << 20) + 1, &a, &n), -12);
    assert_int_equal(cuheap_fit_alloc(&f, 1 << 20, &a, &n), 0);
    check_ok(&f);
    cuheap_fit_destroy(&f);
}

static void test_random_large_arena(void **state)
{
    (void)state;
    random_run(64ull << 20, 512, 3, 100000, 997);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects_bad_shapes),
        cmocka_unit_test(test_lowest_place_that_fits),
        cmocka_unit_test(test_random_small_arena),
        cmocka_unit_test(test_random_odd_arena),
        cmocka_unit_test(test_random_arena_of_odd_units),
        cmocka_unit_test(test_huge_request_refused),
        cmocka_unit_test(test_random_large_arena),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
