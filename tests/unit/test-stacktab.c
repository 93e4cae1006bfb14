/* SPDX-License-Identifier: MIT */
/* Stack deduplication: the same stack gets the same id, any difference a new one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "stacktab.h"

static void test_dedup(void **state)
{
    (void)state;
    struct cuheap_stacktab t;
    cuheap_stacktab_init(&t);
    uint64_t a[3] = {0x1000, 0x2000, 0x3000}, b[3] = {0x1000, 0x2000, 0x3001};
    struct cuheap_py_frame py[2] = {{1, 42}, {2, 7}}, py2[2] = {{1, 43}, {2, 7}};
    uint32_t id1, id2, id3, id4, id5;
    bool fresh;
    assert_int_equal(cuheap_stacktab_intern(&t, a, 3, NULL, 0, &id1, &fresh), 0);
    assert_true(fresh);
    assert_int_equal(cuheap_stacktab_intern(&t, a, 3, NULL, 0, &id2, &fresh), 0);
    assert_false(fresh);
    assert_int_equal(id1, id2);
    assert_int_equal(cuheap_stacktab_intern(&t, b, 3, NULL, 0, &id3, &fresh), 0);
    assert_true(fresh);
    assert_int_not_equal(id3, id1);
    assert_int_equal(cuheap_stacktab_intern(&t, a, 2, NULL, 0, &id4, &fresh), 0);
    assert_true(fresh); /* a prefix is another stack */
    assert_int_equal(cuheap_stacktab_intern(&t, a, 3, py, 2, &id5, &fresh), 0);
    assert_true(fresh);
    uint32_t id6;
    assert_int_equal(cuheap_stacktab_intern(&t, a, 3, py2, 2, &id6, &fresh), 0);
    assert_true(fresh); /* another Python line, another stack */
    const struct cuheap_stack *s = cuheap_stacktab_get(&t, id5);
    assert_non_null(s);
    assert_int_equal(s->nr_frames, 3);
    assert_int_equal(s->nr_py, 2);
    assert_int_equal(s->py[0].line, 42);
    assert_int_equal(cuheap_stacktab_intern(&t, NULL, 0, NULL, 0, &id1, &fresh), 0);
    assert_int_equal(id1, 0);
    assert_null(cuheap_stacktab_get(&t, 0));
    cuheap_stacktab_destroy(&t);
}

static void test_many_stacks(void **state)
{
    (void)state;
    struct cuheap_stacktab t;
    cuheap_stacktab_init(&t);
    for (uint64_t round = 0; round < 2; round++)
        for (uint64_t i = 0; i < 50000; i++) {
            uint64_t f[4] = {i, i * 3, 0x400000 + i, 7};
            uint32_t id;
            bool fresh;
            assert_int_equal(cuheap_stacktab_intern(&t, f, 4, NULL, 0, &id, &fresh), 0);
            assert_int_equal(fresh, round == 0);
            assert_int_equal(id, i + 1);
        }
    assert_int_equal(t.nr_stacks, 50000);
    cuheap_stacktab_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dedup),
        cmocka_unit_test(test_many_stacks),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
