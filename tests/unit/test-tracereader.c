/* SPDX-License-Identifier: MIT */
/* Reading traces back: order, stacks, damage a real run can leave, and files that are not
 * traces at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "event.h"
#include "tracereader.h"

static const char *HEADER =
    "{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":77,\"rank\":3,"
    "\"start_unix_ns\":1,\"config\":{}}\n";

static char *write_tmp(const char *content)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/cuheap-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    return path;
}

static void test_reads_a_trace(void **state)
{
    (void)state;
    char buf[4096];
    snprintf(
        buf, sizeof(buf),
        "%s"
        "{\"type\":\"device\",\"device\":0,\"name\":\"gpu\",\"total\":1000}\n"
        "{\"type\":\"stack\",\"id\":1,\"frames\":[{\"ip\":\"0x10\",\"module\":\"/x/"
        "libtorch_cuda.so\","
        "\"offset\":\"0x10\"}],\"python\":[{\"file\":\"train.py\",\"line\":42,\"function\":"
        "\"forward\"}]}\n"
        "{\"type\":\"event\",\"seq\":2,\"t\":20,\"event\":\"free\",\"api\":\"cuMemAlloc\","
        "\"device\":0,"
        "\"tid\":1,\"ptr\":\"0x1000\",\"size\":100,\"actual\":512,\"pooled\":true}\n"
        "{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
        "\"device\":0,"
        "\"tid\":1,\"ptr\":\"0x1000\",\"size\":100,\"actual\":512,\"pooled\":true,\"stack\":1}\n"
        "{\"type\":\"event\",\"seq\":3,\"t\":30,\"event\":\"mark\",\"api\":\"none\",\"device\":0,"
        "\"tid\":1,\"ptr\":\"0x0\",\"size\":0,\"actual\":0,\"pooled\":false,\"label\":\"step "
        "\\\"1\\\"\"}\n"
        "{\"type\":\"footer\",\"events\":3,\"dropped\":0}\n",
        HEADER);
    char *path = write_tmp(buf);
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    assert_false(t.truncated);
    assert_int_equal(t.pid, 77);
    assert_int_equal(t.rank, 3);
    assert_int_equal(t.nr_devices, 1);
    assert_int_equal(t.nr_events, 3);
    assert_int_equal(t.events[0].type, CUHEAP_EV_ALLOC); /* sorted by seq */
    assert_int_equal(t.events[0].ptr, 0x1000);
    assert_int_equal(t.events[0].stack, 1);
    assert_true(t.events[0].pooled);
    assert_int_equal(t.events[1].type, CUHEAP_EV_FREE);
    assert_string_equal(t.events[2].label, "step \"1\"");
    char site[256];
    /* a Python frame says more than a library offset */
    assert_string_equal(cuheap_trace_site(&t, 1, site, sizeof(site)), "train.py:42 in forward");
    cuheap_trace_free(&t);
    unlink(path);
}

static void test_truncated_trace_keeps_its_prefix(void **state)
{
    (void)state;
    char buf[1024];
    snprintf(
        buf, sizeof(buf),
        "%s{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
        "\"device\":0,\"tid\":1,\"ptr\":\"0x1000\",\"size\":100,\"actual\":512,\"pooled\":true}\n"
        "{\"type\":\"event\",\"seq\":2,\"t\":20,\"ev",
        HEADER);
    char *path = write_tmp(buf);
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    assert_true(t.truncated);
    assert_int_equal(t.nr_events, 1);
    cuheap_trace_free(&t);
    unlink(path);
}

static void test_bad_lines_are_counted(void **state)
{
    (void)state;
    char buf[1024];
    snprintf(buf, sizeof(buf), "%sgarbage here\n{\"type\":\"footer\"}\n", HEADER);
    char *path = write_tmp(buf);
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    assert_int_equal(t.nr_bad_lines, 1);
    assert_int_equal(t.first_bad_line, 2);
    cuheap_trace_free(&t);
    unlink(path);
}

/* Values that are there but unusable are counted, with the first one's line and name; lines
 * that are no record say why; kinds from a newer cuheap are counted apart. */
static void test_malformed_fields_are_counted(void **state)
{
    (void)state;
    char buf[2048];
    snprintf(buf, sizeof(buf),
             "%s[1, 2]\n"
             "{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
             "\"device\":0,\"tid\":1,\"ptr\":\"0x1000\",\"size\":100,\"actual\":512,"
             "\"pooled\":true}\n"
             "{\"type\":\"event\",\"seq\":2,\"t\":20,\"event\":\"free\",\"api\":\"cuMemAlloc\","
             "\"device\":\"zero\",\"tid\":1,\"ptr\":\"0x10zz\",\"size\":-5,\"actual\":512}\n"
             "{\"type\":\"event\",\"seq\":3,\"t\":30,\"event\":\"teleport\"}\n"
             "{\"type\":\"event\",\"t\":40,\"event\":\"alloc\"}\n"
             "{\"type\":\"stack\",\"id\":\"one\",\"frames\":[]}\n"
             "{\"type\":\"footer\",\"events\":4,\"written\":4,\"dropped\":0}\n",
             HEADER);
    char *path = write_tmp(buf);
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    assert_int_equal(t.nr_events, 2);
    assert_int_equal(t.nr_bad_fields, 3); /* device, ptr, size of the free */
    assert_int_equal(t.first_bad_field_line, 4);
    assert_string_equal(t.bad_field, "ptr");
    assert_int_equal(t.nr_unknown_events, 1);
    assert_int_equal(t.nr_bad_lines, 3); /* the array, the event without seq, the stack */
    assert_int_equal(t.first_bad_line, 2);
    assert_string_equal(t.bad_line_why, "not a JSON object");
    assert_int_equal(t.nr_lines, 8);
    cuheap_trace_free(&t);
    unlink(path);
}

static void test_not_a_trace(void **state)
{
    (void)state;
    struct cuheap_trace t;
    char err[512];
    char *path = write_tmp("hello world\n");
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not a cuheap trace"));
    assert_null(strchr(err, '\n'));
    unlink(path);
    path = write_tmp("[\n{\"ph\":\"M\"},\n");
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "Chrome trace"));
    unlink(path);
    path = write_tmp("");
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "empty"));
    unlink(path);
    assert_int_equal(cuheap_trace_read("/nonexistent/x.jsonl", &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/x.jsonl"));
    path = write_tmp("{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":9}\n");
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "version 9"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_a_trace),
        cmocka_unit_test(test_truncated_trace_keeps_its_prefix),
        cmocka_unit_test(test_bad_lines_are_counted),
        cmocka_unit_test(test_malformed_fields_are_counted),
        cmocka_unit_test(test_not_a_trace),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
