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

/* Event lines go through a fast scanner unless they hold something only jansson reads; both
 * ways must give the same events and the same complaints. Each line is read once as it is
 * and once with a nested field added, which sends it to jansson. */
static void read_lines(const char *const *lines, size_t n, const char *extra,
                       struct cuheap_trace *ret)
{
    char buf[8192];
    size_t used = (size_t)snprintf(buf, sizeof(buf), "%s", HEADER);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(lines[i]);
        assert_true(used + len + strlen(extra) + 2 < sizeof(buf));
        memcpy(buf + used, lines[i], len - 1); /* without the closing brace */
        used += len - 1;
        used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s}\n", extra);
    }
    char *path = write_tmp(buf);
    char err[256];
    assert_int_equal(cuheap_trace_read(path, ret, err, sizeof(err)), 0);
    unlink(path);
}

static void test_fast_scanner_reads_as_jansson_does(void **state)
{
    (void)state;
    static const char *const lines[] = {
        "{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
        "\"device\":0,\"tid\":7,\"ptr\":\"0x7f0000001000\",\"size\":100,\"actual\":512,"
        "\"pooled\":true,\"stream\":\"0x55\",\"stack\":3}",
        "{ \"type\" : \"event\" , \"event\":\"free\", \"seq\": 2 ,\"t\":20,\"device\":-1,"
        "\"ptr\":\"0x10\",\"size\":\"0x20\",\"actual\":\"48\",\"pooled\":null }",
        "{\"type\":\"event\",\"seq\":3,\"t\":30,\"event\":\"alloc\",\"size\":1,\"size\":2,"
        "\"ptr\":\"lots\",\"tid\":-4}",
        "{\"type\":\"event\",\"seq\":4,\"t\":1.5,\"event\":\"oom\",\"size\":1e3,"
        "\"driver_free\":5,\"driver_total\":6}",
        "{\"type\":\"event\",\"seq\":5,\"t\":50,\"event\":\"mark\",\"label\":\"step \\\"5\\\"\"}",
        "{\"type\":\"event\",\"seq\":6,\"t\":123456789012345678901,\"event\":\"alloc\"}",
        "{\"type\":\"event\",\"seq\":7,\"t\":70,\"event\":\"limit\",\"size\":9,\"limit\":8,"
        "\"driver_free\":07}",
        "{\"type\":\"event\",\"seq\":8,\"t\":80,\"event\":\"fence\",\"blocks\":2,\"bytes\":1024,"
        "\"device\":\"zero\"}",
        "{\"type\":\"event\",\"seq\":9,\"t\":90,\"event\":\"mark\",\"label\":\"caf\xc3\xa9\"}",
    };
    size_t n = sizeof(lines) / sizeof(lines[0]);
    struct cuheap_trace fast, slow;
    read_lines(lines, n, "", &fast);
    read_lines(lines, n, ",\"x\":[1]", &slow);
    assert_int_equal(fast.nr_events, slow.nr_events);
    assert_int_equal(fast.nr_events, 7); /* the 21-digit number and the leading zero: bad lines */
    assert_int_equal(fast.nr_bad_lines, slow.nr_bad_lines);
    assert_int_equal(fast.nr_bad_fields, slow.nr_bad_fields);
    assert_int_equal(fast.first_bad_field_line, slow.first_bad_field_line);
    assert_string_equal(fast.bad_field, slow.bad_field);
    for (size_t i = 0; i < fast.nr_events; i++) {
        struct cuheap_trace_event a = fast.events[i], b = slow.events[i];
        if (a.label || b.label) {
            assert_string_equal(a.label, b.label);
            a.label = b.label = NULL;
        }
        if (memcmp(&a, &b, sizeof(a)))
            fail_msg("event %zu (seq %llu) differs", i, (unsigned long long)a.seq);
    }
    assert_int_equal(fast.events[0].ptr, 0x7f0000001000);
    assert_int_equal(fast.events[0].stream, 0x55);
    assert_int_equal(fast.events[1].size, 0x20);
    assert_int_equal(fast.events[1].actual, 48);
    assert_int_equal(fast.events[1].device, -1);
    assert_int_equal(fast.events[2].size, 2); /* the last of equal keys */
    assert_string_equal(fast.events[4].label, "step \"5\"");
    assert_int_equal(fast.nr_bad_fields, 3); /* ptr "lots", tid -4, device "zero" */
    cuheap_trace_free(&fast);
    cuheap_trace_free(&slow);
}

/* n events whose seqs are shuffled across the whole file (far) or swapped in pairs (near,
 * as a drain leaves them), every fifth a mark, the last line cut off. With gaps, seqs past
 * 100 skip every other number (dropped events, seqs taken by what was not written). */
static char *shuffled_trace(unsigned n, bool far, bool gaps)
{
    static char buf[1 << 16];
    size_t used = (size_t)snprintf(buf, sizeof(buf), "%s", HEADER);
    for (unsigned i = 0; i < n; i++) {
        unsigned seq = far ? (i * 7919u) % n + 1 : (i ^ 1) + 1; /* 7919 is prime to n */
        if (gaps && seq > 100)
            seq *= 2;
        used += (size_t)snprintf(buf + used, sizeof(buf) - used,
                                 "{\"type\":\"event\",\"seq\":%u,\"t\":%u,\"event\":\"%s\","
                                 "\"device\":0,\"ptr\":\"0x%x\",\"size\":%u%s}\n",
                                 seq, i, i % 5 ? "alloc" : "mark", 0x1000 + i, i,
                                 i % 5 ? "" : ",\"label\":\"m\"");
    }
    used += (size_t)snprintf(buf + used, sizeof(buf) - used, "{\"type\":\"event\",\"se");
    return write_tmp(buf);
}

static void expect_same_events(const char *path, bool want_streamed)
{
    struct cuheap_trace a, b;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &a, err, sizeof(err)), 0);
    assert_int_equal(cuheap_trace_open(path, &b, err, sizeof(err)), 0);
    assert_int_equal(b.streamed, want_streamed);
    assert_int_equal(a.nr_events, b.nr_events);
    assert_int_equal(a.max_t, b.max_t);
    assert_int_equal(a.truncated, b.truncated);
    for (int pass = 0; pass < 2; pass++) { /* the file is read again each time */
        struct cuheap_trace_iter it;
        size_t i = 0;
        for (const struct cuheap_trace_event *e = cuheap_trace_first(&b, &it); e;
             e = cuheap_trace_next(&it), i++) {
            assert_true(i < a.nr_events);
            assert_int_equal(e->seq, a.events[i].seq);
            assert_int_equal(e->ptr, a.events[i].ptr);
            assert_int_equal(!e->label, !a.events[i].label);
            if (e->label)
                assert_string_equal(e->label, a.events[i].label);
        }
        cuheap_trace_iter_end(&it);
        assert_int_equal(i, a.nr_events);
    }
    cuheap_trace_free(&a);
    cuheap_trace_free(&b);
}

/* cuheap_trace_open() streams a trace whose events are near seq order (a window reorders
 * them) and gives the same events in the same order as reading it into memory; one whose
 * events stray further than the window is read into memory instead. */
static void test_streaming_gives_the_same_events(void **state)
{
    (void)state;
    char *path = shuffled_trace(200, false, false);
    cuheap_trace_set_window(4); /* pairs swapped: a window of 4 puts them right */
    expect_same_events(path, true);
    unlink(path);
    /* the window lets events through as soon as they are next in seq; after a gap it must
     * hold them until it is full */
    path = shuffled_trace(200, false, true);
    expect_same_events(path, true);
    unlink(path);
    path = shuffled_trace(200, true, false);
    cuheap_trace_set_window(256); /* wider than the whole file */
    expect_same_events(path, true);
    cuheap_trace_set_window(4); /* events stray ~200 places: read into memory */
    expect_same_events(path, false);
    cuheap_trace_set_window(0);
    unlink(path);
}

/* ---- following a trace as it is written ---- */

struct seen {
    uint64_t seqs[16];
    size_t nr;
};

static void collect(const struct cuheap_trace_event *e, void *ctx)
{
    struct seen *s = ctx;
    if (s->nr < 16)
        s->seqs[s->nr++] = e->seq;
}

static void append(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#define EV(seq, kind)                                                                              \
    "{\"type\":\"event\",\"seq\":" #seq ",\"t\":" #seq ",\"event\":\"" kind                        \
    "\",\"api\":\"cuMemAlloc\",\"device\":0,\"tid\":1,\"ptr\":\"0x1000\",\"size\":100}\n"

/* Each poll hands over only what was appended, a line cut between writes once it is whole,
 * events in seq order (one held back for an earlier one still to come), and the footer ends it. */
static void test_tail_reads_only_what_was_appended(void **state)
{
    (void)state;
    char *path = write_tmp(HEADER);
    struct cuheap_trace_tail tt;
    struct seen s = {.nr = 0};
    char err[256];
    assert_int_equal(cuheap_trace_tail_open(path, &tt), 0);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 1);
    assert_int_equal(tt.t.rank, 3);
    assert_int_equal(s.nr, 0);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 0);
    /* a line cut in two, the second event before the first */
    const char *two = EV(2, "free");
    char half[256];
    snprintf(half, sizeof(half), "%.*s", 40, two);
    append(path, half);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 1);
    assert_int_equal(s.nr, 0);
    char rest[512];
    snprintf(rest, sizeof(rest), "%s%s%s", two + 40, EV(1, "alloc"), EV(3, "alloc"));
    append(path, rest);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 1);
    assert_int_equal(s.nr, 3);
    assert_int_equal(s.seqs[0], 1);
    assert_int_equal(s.seqs[1], 2);
    assert_int_equal(s.seqs[2], 3);
    /* after a gap (4 never written) an event waits one poll, then comes anyway */
    append(path, EV(5, "free"));
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 1);
    assert_int_equal(s.nr, 3);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 0);
    assert_int_equal(s.nr, 4);
    assert_int_equal(s.seqs[3], 5);
    assert_int_equal(tt.t.nr_bad_lines, 0);
    assert_false(tt.ended);
    append(path, "{\"type\":\"footer\",\"events\":3,\"dropped\":0}\n");
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 1);
    assert_true(tt.ended);
    assert_int_equal(s.nr, 4); /* nothing read twice */
    cuheap_trace_tail_close(&tt);
    unlink(path);
}

/* A file that is not a trace, or is compressed, is named as such; one not there yet is waited
 * for. */
static void test_tail_names_what_it_cannot_follow(void **state)
{
    (void)state;
    struct cuheap_trace_tail tt;
    struct seen s = {.nr = 0};
    char err[256];
    assert_int_equal(cuheap_trace_tail_open("/tmp/cuheap-test-not-there-yet.jsonl", &tt), 0);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), 0);
    cuheap_trace_tail_close(&tt);
    char *path = write_tmp("hello\n");
    assert_int_equal(cuheap_trace_tail_open(path, &tt), 0);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not a cuheap trace"));
    cuheap_trace_tail_close(&tt);
    unlink(path);
    path = write_tmp("\x1f\x8b\x08rest");
    assert_int_equal(cuheap_trace_tail_open(path, &tt), 0);
    assert_int_equal(cuheap_trace_tail_poll(&tt, collect, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "gzip-compressed"));
    cuheap_trace_tail_close(&tt);
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
        cmocka_unit_test(test_fast_scanner_reads_as_jansson_does),
        cmocka_unit_test(test_streaming_gives_the_same_events),
        cmocka_unit_test(test_not_a_trace),
        cmocka_unit_test(test_tail_reads_only_what_was_appended),
        cmocka_unit_test(test_tail_names_what_it_cannot_follow),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
