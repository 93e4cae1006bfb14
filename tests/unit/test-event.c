/* SPDX-License-Identifier: MIT */
/* Event names both ways, and the UTF-8 repair of outside text that goes into a trace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "event.h"

static void test_names_round_trip(void **state)
{
    (void)state;
    for (int t = 1; t < CUHEAP_NR_EVENT_TYPES; t++)
        assert_int_equal(cuheap_event_type_from_name(cuheap_event_type_name((unsigned)t)), t);
    for (int a = 0; a < CUHEAP_NR_APIS; a++)
        assert_int_equal(cuheap_api_from_name(cuheap_api_name((unsigned)a)), a);
    assert_int_equal(cuheap_event_type_from_name("nonsense"), -1);
}

static void test_utf8_clean(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain ascii", "plain ascii"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"a\xff"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                                 /* overlong '/' */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},                 /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
        {"cut \xe2\x82", "cut \xef\xbf\xbd\xef\xbf\xbd"}, /* ends inside a character */
    };
    char out[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(cuheap_utf8_clean(cases[i].in, out), cases[i].out);
}

static void test_utf8_cut(void **state)
{
    (void)state;
    const char *s = "ab\xe2\x82\xac"
                    "cd"; /* a, b, euro sign (3 bytes), c, d */
    assert_int_equal(cuheap_utf8_cut(s, 2), 2);
    assert_int_equal(cuheap_utf8_cut(s, 3), 2); /* would keep the euro's first byte */
    assert_int_equal(cuheap_utf8_cut(s, 4), 2);
    assert_int_equal(cuheap_utf8_cut(s, 5), 5);
    assert_int_equal(cuheap_utf8_cut("\x80\x80\x80\x80\x80", 4), 4); /* not text: cut anywhere */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_utf8_clean),
        cmocka_unit_test(test_utf8_cut),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
