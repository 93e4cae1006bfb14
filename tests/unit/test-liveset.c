/* SPDX-License-Identifier: MIT */
/* The live set the writer keeps for out-of-memory reports and the exit summary: the top call
 * sites by bytes live now, per device, following frees, replaced addresses and many sites, and
 * each device's peak. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "liveset.h"

static void test_top_sites_follow_frees(void **state)
{
    (void)state;
    struct cuheap_liveset s;
    cuheap_liveset_init(&s);
    struct cuheap_live_site top[3];
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 3), 0);
    for (uint64_t i = 0; i < 3; i++)
        cuheap_liveset_alloc(&s, 0x1000 + i * 0x100, 0, 100, 7); /* site 7: 300 B */
    cuheap_liveset_alloc(&s, 0x2000, 0, 250, 8);                 /* site 8: 250 B */
    cuheap_liveset_alloc(&s, 0x3000, 0, 10, 9);
    cuheap_liveset_alloc(&s, 0x4000, 0, 5, 10);
    cuheap_liveset_alloc(&s, 0x5000, 1, 1000, 11); /* another device */
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 3), 3);
    assert_int_equal(top[0].stack, 7);
    assert_int_equal(top[0].bytes, 300);
    assert_int_equal(top[0].nr_blocks, 3);
    assert_int_equal(top[1].stack, 8);
    assert_int_equal(top[2].stack, 9);
    cuheap_liveset_free(&s, 0x1000);
    cuheap_liveset_free(&s, 0x1100);
    cuheap_liveset_free(&s, 0x9999); /* never live: nothing happens */
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 3), 3);
    assert_int_equal(top[0].stack, 8);
    assert_int_equal(top[1].stack, 7);
    assert_int_equal(top[1].bytes, 100);
    assert_int_equal(cuheap_liveset_bytes(&s, 0), 365);
    assert_int_equal(cuheap_liveset_top(&s, 1, top, 3), 1);
    assert_int_equal(top[0].stack, 11);
    /* an address allocated again without its free seen: the old one is gone */
    cuheap_liveset_alloc(&s, 0x2000, 0, 1, 12);
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 1), 1);
    assert_int_equal(top[0].stack, 7);
    assert_int_equal(cuheap_liveset_bytes(&s, 0), 116);
    /* the peaks: the exit summary's peak live, the report's */
    assert_int_equal(cuheap_liveset_peak(&s, 0), 565);
    assert_int_equal(cuheap_liveset_peak(&s, 1), 1000);
    assert_int_equal(cuheap_liveset_peak(&s, 2), 0);
    assert_false(s.incomplete);
    cuheap_liveset_destroy(&s);
}

/* Many blocks and sites: the tables grow, frees shift entries back, and the count stays
 * exact. */
static void test_many_blocks_and_sites(void **state)
{
    (void)state;
    struct cuheap_liveset s;
    cuheap_liveset_init(&s);
    for (uint64_t i = 1; i <= 100000; i++)
        cuheap_liveset_alloc(&s, i * 512, 0, i % 1000 + 1, (uint32_t)(i % 5000));
    for (uint64_t i = 1; i <= 100000; i += 2)
        cuheap_liveset_free(&s, i * 512);
    uint64_t want = 0;
    for (uint64_t i = 2; i <= 100000; i += 2)
        want += i % 1000 + 1;
    assert_int_equal(cuheap_liveset_bytes(&s, 0), want);
    assert_int_equal(s.nr_blocks, 50000);
    struct cuheap_live_site top[3];
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 3), 3);
    assert_true(top[0].bytes >= top[1].bytes && top[1].bytes >= top[2].bytes);
    for (uint64_t i = 2; i <= 100000; i += 2)
        cuheap_liveset_free(&s, i * 512);
    assert_int_equal(s.nr_blocks, 0);
    assert_int_equal(cuheap_liveset_top(&s, 0, top, 3), 0);
    cuheap_liveset_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_sites_follow_frees),
        cmocka_unit_test(test_many_blocks_and_sites),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
