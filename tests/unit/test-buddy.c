/* SPDX-License-Identifier: MIT */
/* The buddy allocator against a reference model: every block handed out is aligned to its
 * size, inside the arena, overlaps nothing live, and everything merges back at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "buddy.h"

#define BASE ((uintptr_t)1 << 40) /* device-like addresses; never touched */

static void check_ok(const struct cuheap_buddy *b)
{
    char why[256] = "";
    int r = cuheap_buddy_check(b, why, sizeof(why));
    if (r)
        fail_msg("buddy invariant broken: %s", why);
}

static void test_init_rejects_bad_shapes(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, 3000, 512), -22);
    assert_int_equal(cuheap_buddy_init(&b, BASE, 1 << 20, 1000), -22);
    assert_int_equal(cuheap_buddy_init(&b, BASE, 512, 1024), -22);
    assert_int_equal(cuheap_buddy_init(&b, BASE + 3, 1 << 20, 512), -22);
}

static void test_split_and_merge(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, 1 << 20, 512), 0);
    uintptr_t a1, a2, a3;
    unsigned o1, o2, o3;
    assert_int_equal(cuheap_buddy_alloc(&b, 1, &a1, &o1), 0);
    assert_int_equal(o1, 9); /* 512 B minimum */
    assert_int_equal(a1, BASE);
    assert_int_equal(cuheap_buddy_alloc(&b, 513, &a2, &o2), 0);
    assert_int_equal(o2, 10);
    assert_int_equal(a2 % 1024, 0);
    assert_int_equal(cuheap_buddy_alloc(&b, 300 << 10, &a3, &o3), 0);
    assert_int_equal(o3, 19); /* rounds up to 512 KiB */
    check_ok(&b);
    assert_false(cuheap_buddy_empty(&b));
    assert_int_equal(cuheap_buddy_free(&b, a2), 10);
    assert_int_equal(cuheap_buddy_free(&b, a2), -22);       /* double free */
    assert_int_equal(cuheap_buddy_free(&b, a3 + 512), -22); /* interior pointer */
    assert_int_equal(cuheap_buddy_free(&b, a1), 9);
    assert_int_equal(cuheap_buddy_free(&b, a3), 19);
    check_ok(&b);
    assert_true(cuheap_buddy_empty(&b));
    assert_int_equal(b.free_area[20].nr_free, 1); /* merged back to one 1 MiB block */
    cuheap_buddy_destroy(&b);
}

static void test_exhaustion_and_whole_arena(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, 1 << 20, 512), 0);
    uintptr_t a;
    unsigned o;
    assert_int_equal(cuheap_buddy_alloc(&b, (1 << 20) + 1, &a, &o), -12);
    assert_int_equal(cuheap_buddy_alloc(&b, 1 << 20, &a, &o), 0);
    assert_int_equal(cuheap_buddy_alloc(&b, 1, &a, &o), -12);
    cuheap_buddy_destroy(&b);
}

/* The largest free piece is the largest free block: a split arena's, after frees merge, and
 * none when all is taken (what an out-of-memory's report calls fragmentation). */
static void test_largest_free(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, 1 << 20, 512), 0);
    assert_int_equal(cuheap_buddy_largest_free(&b), 1 << 20);
    uintptr_t a[4];
    unsigned order;
    for (int i = 0; i < 4; i++)
        assert_int_equal(cuheap_buddy_alloc(&b, 256 << 10, &a[i], &order), 0);
    assert_int_equal(cuheap_buddy_largest_free(&b), 0);
    assert_int_equal(cuheap_buddy_free(&b, a[1]), 18);
    assert_int_equal(cuheap_buddy_free(&b, a[3]), 18);
    assert_int_equal(cuheap_buddy_largest_free(&b), 256 << 10); /* 512 KiB free, in two pieces */
    assert_int_equal(cuheap_buddy_free(&b, a[2]), 18);
    assert_int_equal(cuheap_buddy_largest_free(&b), 512 << 10);
    check_ok(&b);
    cuheap_buddy_destroy(&b);
}

static void test_block_of_finds_interior_pointers(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, 1 << 22, 512), 0);
    uintptr_t a, c;
    unsigned o;
    assert_int_equal(cuheap_buddy_alloc(&b, 3000, &a, &o), 0);
    assert_int_equal(cuheap_buddy_alloc(&b, 100000, &c, &o), 0);
    uintptr_t start;
    unsigned order;
    bool allocated;
    assert_int_equal(cuheap_buddy_block_of(&b, c + 99999, &start, &order, &allocated), 0);
    assert_int_equal(start, c);
    assert_int_equal(order, 17);
    assert_true(allocated);
    assert_int_equal(cuheap_buddy_block_of(&b, a + 4095, &start, &order, &allocated), 0);
    assert_int_equal(start, a);
    assert_int_equal(cuheap_buddy_block_of(&b, BASE + (1 << 22), &start, &order, &allocated), -22);
    cuheap_buddy_destroy(&b);
}

struct live {
    uintptr_t addr;
    uint64_t size; /* block size */
};

static int cmp_live(const void *x, const void *y)
{
    const struct live *a = x, *b = y;
    return a->addr < b->addr ? -1 : a->addr > b->addr;
}

static void assert_no_overlap(struct live *l, size_t n)
{
    struct live *sorted = malloc(n * sizeof(*l) + 1);
    memcpy(sorted, l, n * sizeof(*l));
    qsort(sorted, n, sizeof(*l), cmp_live);
    for (size_t i = 1; i < n; i++)
        if (sorted[i - 1].addr + sorted[i - 1].size > sorted[i].addr)
            fail_msg("blocks overlap at %#lx", (unsigned long)sorted[i].addr);
    free(sorted);
}

/* Long random sequences against the model; the arena must be whole again at the end. */
static void random_run(uint64_t arena, uint64_t min_block, unsigned seed, int steps,
                       int check_every)
{
    struct cuheap_buddy b;
    assert_int_equal(cuheap_buddy_init(&b, BASE, arena, min_block), 0);
    struct live *l = calloc(65536, sizeof(*l));
    size_t n = 0;
    uint64_t used = 0;
    srand(seed);
    for (int step = 0; step < steps; step++) {
        bool do_alloc = n == 0 || (n < 65536 && rand() % 100 < 55);
        if (do_alloc) {
            /* log-uniform sizes from 1 B to arena/4 */
            int bits = rand() % (int)(__builtin_ctzll(arena) - 1);
            uint64_t size = 1 + ((uint64_t)rand() % ((1ull << bits) + 1));
            uintptr_t a;
            unsigned o;
            int r = cuheap_buddy_alloc(&b, size, &a, &o);
            if (r == 0) {
                assert_true((1ull << o) >= size);
                assert_true((1ull << o) >= min_block);
                assert_int_equal((a - BASE) % (1ull << o), 0);
                assert_true(a >= BASE && a + (1ull << o) <= BASE + arena);
                l[n++] = (struct live){a, 1ull << o};
                used += 1ull << o;
            } else {
                /* a refusal must be real: no free block of a fitting order */
                assert_int_equal(r, -12);
                unsigned need = cuheap_buddy_order_for(&b, size);
                for (unsigned k = need; k <= b.max_order; k++)
                    assert_int_equal(b.free_area[k].nr_free, 0);
            }
        } else {
            size_t i = (size_t)rand() % n;
            assert_int_equal(cuheap_buddy_free(&b, l[i].addr), __builtin_ctzll(l[i].size));
            used -= l[i].size;
            l[i] = l[--n];
        }
        assert_int_equal(b.free_bytes, arena - used);
        if (step % 997 == 0) /* pages inside free blocks go; every block must stay as it was */
            cuheap_buddy_purge(&b, b.min_order + 1, NULL, NULL);
        if (step % check_every == 0) {
            check_ok(&b);
            assert_no_overlap(l, n);
        }
    }
    while (n)
        assert_true(cuheap_buddy_free(&b, l[--n].addr) >= 0);
    check_ok(&b);
    assert_true(cuheap_buddy_empty(&b));
    assert_int_equal(b.free_area[b.max_order].nr_free, 1);
    free(l);
    cuheap_buddy_destroy(&b);
}

static size_t resident_pages(void *start, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page, nr = 0;
    unsigned char *vec = malloc(n);
    assert_int_equal(mincore(start, bytes, vec), 0);
    for (size_t i = 0; i < n; i++)
        nr += vec[i] & 1;
    free(vec);
    return nr;
}

static void count_units(void *arg, uint32_t first, uint32_t nr)
{
    (void)first;
    *(uint64_t *)arg += nr;
}

/* Blocks all over an arena touch its metadata everywhere; once they are free again, a purge
 * gives those pages back (they stayed resident for good in long runs), and the arena works
 * as before. */
static void test_purge_gives_metadata_back(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    const uint64_t arena = 1ull << 30, block = 256 << 10;
    assert_int_equal(cuheap_buddy_init(&b, BASE, arena, 512), 0);
    enum { N = 4096 }; /* the whole arena */
    uintptr_t *addr = calloc(N, sizeof(*addr));
    unsigned o;
    for (int i = 0; i < N; i++)
        assert_int_equal(cuheap_buddy_alloc(&b, block, &addr[i], &o), 0);
    for (int i = 0; i < N; i += 2) /* every other one: free blocks all over, none merged */
        assert_true(cuheap_buddy_free(&b, addr[i]) >= 0);
    size_t touched = resident_pages(b.next, b.meta_bytes);
    assert_true(touched > 1000);
    uint64_t units = 0;
    /* free blocks of 512 units: too small to hold a page of any array; nothing to count */
    assert_int_equal(cuheap_buddy_purge(&b, b.min_order + 10, count_units, &units), 0);
    for (int i = 1; i < N; i += 2)
        assert_true(cuheap_buddy_free(&b, addr[i]) >= 0);
    assert_true(cuheap_buddy_empty(&b));
    assert_int_equal(cuheap_buddy_purge(&b, b.min_order + 10, count_units, &units), 1);
    assert_int_equal(units, (arena >> 9) - 1);
    assert_true(resident_pages(b.next, b.meta_bytes) <= 3); /* a page of each array's start */
    check_ok(&b);
    for (int i = 0; i < N; i++)
        assert_int_equal(cuheap_buddy_alloc(&b, block, &addr[i], &o), 0);
    check_ok(&b);
    free(addr);
    cuheap_buddy_destroy(&b);
}

static void test_random_small_arena(void **state)
{
    (void)state;
    random_run(1 << 20, 512, 1, 20000, 1);
}

static void test_random_large_arena(void **state)
{
    (void)state;
    random_run(256ull << 20, 512, 2, 200000, 1000);
}

static void test_random_other_min_block(void **state)
{
    (void)state;
    random_run(64ull << 20, 4096, 3, 50000, 100);
}

/* The scored allocation goes where the score says (a vmm pool: where memory is mapped), in
 * any order that fits, and leaves a buddy that checks out. */
static uintptr_t liked_lo, liked_hi;

static int64_t like_range(void *arg, uintptr_t addr, uint64_t len, uint64_t size)
{
    (void)arg;
    (void)size;
    uintptr_t lo = addr > liked_lo ? addr : liked_lo;
    uintptr_t hi = addr + len < liked_hi ? addr + len : liked_hi;
    return hi > lo ? (int64_t)(hi - lo) : 0;
}

static void test_scored_alloc_goes_where_liked(void **state)
{
    (void)state;
    struct cuheap_buddy b;
    const uintptr_t base = 1ull << 40;
    assert_int_equal(cuheap_buddy_init(&b, base, 1ull << 30, 512), 0);
    /* a free 64 MiB block at the start, a larger free block whose third quarter is liked */
    uintptr_t first, second;
    unsigned order;
    assert_int_equal(cuheap_buddy_alloc(&b, 64 << 20, &first, &order), 0);
    assert_int_equal(cuheap_buddy_alloc(&b, 64 << 20, &second, &order), 0);
    assert_int_equal(cuheap_buddy_free(&b, first), 26);
    liked_lo = base + (512u << 20) + (256u << 20);
    liked_hi = liked_lo + (64u << 20);
    uintptr_t got;
    assert_int_equal(cuheap_buddy_alloc_scored(&b, 48 << 20, like_range, NULL, 8, 0, &got, &order),
                     0);
    assert_int_equal(order, 26);
    assert_int_equal(got, liked_lo); /* not the free 64 MiB block the plain alloc would give */
    char why[256];
    if (cuheap_buddy_check(&b, why, sizeof(why)))
        fail_msg("%s", why);
    /* nothing liked: the same block the plain allocation gives */
    liked_lo = liked_hi = 0;
    uintptr_t head = base + ((uintptr_t)b.free_area[26].head << b.min_order), plain;
    assert_int_equal(
        cuheap_buddy_alloc_scored(&b, 64 << 20, like_range, NULL, 8, 0, &plain, &order), 0);
    assert_int_equal(plain, head);
    assert_int_equal(cuheap_buddy_free(&b, plain), 26);
    assert_int_equal(cuheap_buddy_free(&b, got), 26);
    assert_int_equal(cuheap_buddy_free(&b, second), 26);
    assert_int_equal(cuheap_buddy_free(&b, first), -22); /* freed at the start already */
    assert_true(cuheap_buddy_empty(&b));
    cuheap_buddy_destroy(&b);
}

/* A score that answers CUHEAP_BUDDY_SCORE_NOTHING for regions with nothing liked in them
 * gets the same places as one that answers 0 there, with far fewer calls: a large free block
 * with nothing liked is split without its halves being scored. */
static int nr_scores;

static int64_t like_range_counted(void *arg, uintptr_t addr, uint64_t len, uint64_t size)
{
    nr_scores++;
    int64_t s = like_range(arg, addr, len, size);
    return s == 0 && arg ? CUHEAP_BUDDY_SCORE_NOTHING : s;
}

static void test_scored_alloc_skips_what_scores_nothing(void **state)
{
    (void)state;
    const uintptr_t base = 1ull << 40;
    uintptr_t got[2][64];
    int calls[2] = {0, 0};
    for (int nothing = 0; nothing < 2; nothing++) {
        struct cuheap_buddy b;
        assert_int_equal(cuheap_buddy_init(&b, base, 1ull << 32, 512), 0);
        liked_lo = base + (3ull << 30); /* a liked 2 MiB far up in the arena */
        liked_hi = liked_lo + (2u << 20);
        nr_scores = 0;
        unsigned order;
        for (int i = 0; i < 64; i++) /* 2 MiB blocks, then smaller ones */
            assert_int_equal(cuheap_buddy_alloc_scored(&b, i < 32 ? 2u << 20 : 4096,
                                                       like_range_counted, nothing ? &b : NULL, 8,
                                                       0, &got[nothing][i], &order),
                             0);
        calls[nothing] = nr_scores;
        char why[256];
        if (cuheap_buddy_check(&b, why, sizeof(why)))
            fail_msg("%s", why);
        cuheap_buddy_destroy(&b);
    }
    for (int i = 0; i < 64; i++)
        assert_int_equal(got[1][i], got[0][i]);
    assert_int_equal(got[0][0], liked_lo); /* the liked place first, as before */
    print_message("# score calls: %d answering nothing, %d answering 0\n", calls[1], calls[0]);
    if (calls[1] * 2 > calls[0])
        fail_msg("%d score calls with NOTHING against %d without", calls[1], calls[0]);
}

/* A score that tells no two places of one 2 MiB block apart (a vmm pool's: one verdict per
 * granule), told so by uniform_order, gets the same places for small blocks among liked and
 * unliked granules as when every half is compared, with fewer calls. */
static void test_scored_alloc_uniform_blocks_not_compared(void **state)
{
    (void)state;
    const uintptr_t base = 1ull << 40;
    enum { NR = 400 };
    uintptr_t got[2][NR];
    int calls[2] = {0, 0};
    for (int uniform = 0; uniform < 2; uniform++) {
        struct cuheap_buddy b;
        assert_int_equal(cuheap_buddy_init(&b, base, 1ull << 32, 512), 0);
        liked_lo = base + (6u << 20); /* granules 3-4 liked, the first ones not */
        liked_hi = liked_lo + (4u << 20);
        nr_scores = 0;
        unsigned order;
        for (int i = 0; i < NR; i++) {
            uint64_t size = (512u << (i % 9)) + (uint64_t)(i % 7) * 100;
            assert_int_equal(cuheap_buddy_alloc_scored(&b, size, like_range_counted, NULL, 8,
                                                       uniform ? 21 : 0, &got[uniform][i], &order),
                             0);
            if (i % 3 == 2) /* frees among them: free blocks of every order to choose from */
                assert_true(cuheap_buddy_free(&b, got[uniform][i - 1]) >= 0);
        }
        calls[uniform] = nr_scores;
        char why[256];
        if (cuheap_buddy_check(&b, why, sizeof(why)))
            fail_msg("%s", why);
        cuheap_buddy_destroy(&b);
    }
    for (int i = 0; i < NR; i++)
        assert_int_equal(got[1][i], got[0][i]);
    assert_true(got[0][0] >= liked_lo && got[0][0] < liked_hi); /* the liked granules first */
    print_message("# score calls: %d uniform inside 2 MiB, %d comparing every half\n", calls[1],
                  calls[0]);
    if (calls[1] * 2 > calls[0])
        fail_msg("%d score calls told uniform against %d", calls[1], calls[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects_bad_shapes),
        cmocka_unit_test(test_split_and_merge),
        cmocka_unit_test(test_exhaustion_and_whole_arena),
        cmocka_unit_test(test_block_of_finds_interior_pointers),
        cmocka_unit_test(test_largest_free),
        cmocka_unit_test(test_scored_alloc_goes_where_liked),
        cmocka_unit_test(test_scored_alloc_skips_what_scores_nothing),
        cmocka_unit_test(test_scored_alloc_uniform_blocks_not_compared),
        cmocka_unit_test(test_purge_gives_metadata_back),
        cmocka_unit_test(test_random_small_arena),
        cmocka_unit_test(test_random_large_arena),
        cmocka_unit_test(test_random_other_min_block),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
