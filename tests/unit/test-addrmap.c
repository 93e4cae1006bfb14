/* SPDX-License-Identifier: MIT */
/* The pass-through map against a model, deletions included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "addrmap.h"

static void test_put_get_take(void **state)
{
    (void)state;
    struct cuheap_addrmap m;
    assert_int_equal(cuheap_addrmap_init(&m, 1000), -22);
    assert_int_equal(cuheap_addrmap_init(&m, 1024), 0);
    struct cuheap_addr_entry e = {.key = 0x7000, .size = 100, .actual = 512, .device = 1, .api = 2};
    struct cuheap_addr_entry r;
    assert_int_equal(cuheap_addrmap_put(&m, &e), 0);
    assert_int_equal(cuheap_addrmap_get(&m, 0x7000, &r), 0);
    assert_int_equal(r.size, 100);
    assert_int_equal(r.device, 1);
    assert_int_equal(cuheap_addrmap_take(&m, 0x7000, &r), 0);
    assert_int_equal(cuheap_addrmap_take(&m, 0x7000, &r), -2);
    assert_int_equal(cuheap_addrmap_get(&m, 0, &r), -2);
    cuheap_addrmap_destroy(&m);
}

static void test_random_against_model(void **state)
{
    (void)state;
    struct cuheap_addrmap m;
    assert_int_equal(cuheap_addrmap_init(&m, 4096), 0);
    enum { N = 3000 };
    uint64_t *keys = calloc(N, sizeof(*keys));
    bool *present = calloc(N, sizeof(*present));
    for (int i = 0; i < N; i++)
        keys[i] = 0x10000000ull + (uint64_t)i * 512; /* clustered, like real addresses */
    srand(5);
    for (int step = 0; step < 200000; step++) {
        int i = rand() % N;
        struct cuheap_addr_entry r;
        if (present[i]) {
            assert_int_equal(cuheap_addrmap_take(&m, keys[i], &r), 0);
            assert_int_equal(r.size, (uint64_t)i);
            present[i] = false;
        } else {
            struct cuheap_addr_entry e = {.key = keys[i], .size = (uint64_t)i};
            assert_int_equal(cuheap_addrmap_put(&m, &e), 0);
            present[i] = true;
        }
        if (step % 20000 == 0)
            for (int k = 0; k < N; k++)
                assert_int_equal(cuheap_addrmap_get(&m, keys[k], &r) == 0, present[k]);
    }
    free(keys);
    free(present);
    cuheap_addrmap_destroy(&m);
}

static void test_full_map_refuses(void **state)
{
    (void)state;
    struct cuheap_addrmap m;
    assert_int_equal(cuheap_addrmap_init(&m, 64), 0);
    int ok = 0;
    for (uint64_t k = 1; k <= 64; k++) {
        struct cuheap_addr_entry e = {.key = k};
        ok += cuheap_addrmap_put(&m, &e) == 0;
    }
    assert_int_equal(ok, 56); /* 7/8 of the slots, then -ENOSPC */
    cuheap_addrmap_destroy(&m);
}

/* Many addresses over a long run, few held at once: the map stays the size of what it holds
 * (its slots are all touched in time), and grows when it must hold more. */
static void test_size_follows_live_entries(void **state)
{
    (void)state;
    struct cuheap_addrmap m;
    struct cuheap_addr_entry r;
    assert_int_equal(cuheap_addrmap_init(&m, 1u << 20), 0);
    for (uint64_t k = 1; k <= 1000000; k++) {
        struct cuheap_addr_entry e = {.key = k << 9, .size = k};
        assert_int_equal(cuheap_addrmap_put(&m, &e), 0);
        if (k > 100)
            assert_int_equal(cuheap_addrmap_take(&m, (k - 100) << 9, &r), 0);
    }
    assert_true(m.nr_slots <= 1024);
    for (uint64_t k = 1; k <= 200000; k++) {
        struct cuheap_addr_entry e = {.key = k << 12, .size = k};
        assert_int_equal(cuheap_addrmap_put(&m, &e), 0);
    }
    assert_true(m.nr_slots >= 262144 && m.nr_slots <= 524288);
    for (uint64_t k = 1; k <= 200000; k += 997) {
        assert_int_equal(cuheap_addrmap_get(&m, k << 12, &r), 0);
        assert_int_equal(r.size, k);
    }
    cuheap_addrmap_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_take),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_full_map_refuses),
        cmocka_unit_test(test_size_follows_live_entries),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
