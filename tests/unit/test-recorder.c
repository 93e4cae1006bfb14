/* SPDX-License-Identifier: MIT */
/*
 * The recorder, compiled in and fed as hooks feed it (no driver): a stack the thread sends
 * again goes into the ring named, not copied (CUHEAP_EVF_SAME_STACK), and the trace must still
 * give every event its own stack. Two call paths taken in turn, the same depth and stack
 * pointer, differing in one return address: every allocation's stack in the trace is its own
 * path's, the two paths have different stacks, and the event stamps come out as
 * CLOCK_MONOTONIC nanoseconds from the trace's start, in order. Then one path after more than
 * a lap of the (small) ring of the other: the slot of its last event holds another's now.
 *
 * Here the test executable plays cuheap (its frames are the ones skipped) and
 * libunwind-prog.so the program (tests/unit/unwind-prog.c).
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "config.h"
#include "recorder.h"
#include "recorder_internal.h"

typedef unsigned (*prog_cb_fn)(void *arg);
unsigned prog_descend(int depth, unsigned shape, prog_cb_fn cb, void *arg);

#define NR_EVENTS 3000 /* taken in turn, then path 0 after a lap of path 1 */
#define NR_LAP    100

static char trace_path[64];

static const char *test_env(const char *name, void *arg)
{
    (void)arg;
    if (!strcmp(name, "CUHEAP_OUTPUT"))
        return trace_path;
    if (!strcmp(name, "CUHEAP_SUMMARY"))
        return "0";
    if (!strcmp(name, "CUHEAP_STACK_DEPTH"))
        return "12";
    if (!strcmp(name, "CUHEAP_PYTHON"))
        return "0";
    if (!strcmp(name, "CUHEAP_RING"))
        return "64";
    return NULL;
}

static void test_warn(const char *line, void *arg)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
}

static unsigned one_alloc(void *arg)
{
    uint64_t i = *(uint64_t *)arg; /* event << 1 | path */
    struct cuheap_rec a = {.type = CUHEAP_EV_ALLOC,
                           .api = CUHEAP_API_MEM_ALLOC,
                           .device = 0,
                           .ptr = 0x7f0000000000ull + i * 512,
                           .size = 512,
                           .actual = 512};
    cuheap_record(&a);
    return 0;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void test_changed_stacks_recorded_as_changed(void **state)
{
    (void)state;
    snprintf(trace_path, sizeof(trace_path), "/tmp/cuheap-test-recorder-%d.jsonl", (int)getpid());
    static struct cuheap_config cfg;
    assert_int_equal(cuheap_config_parse(&cfg, test_env, test_warn, NULL), 0);
    uint64_t before = monotonic_ns();
    cuheap_recorder_start(&cfg);
    for (uint64_t i = 0; i < NR_EVENTS + NR_LAP + 2; i++) {
        /* shapes 19 and 2 (unwind-prog.c): the outermost level calls from one call site or
         * the other, every level below the same way; after NR_EVENTS, path 1 for a lap and
         * more, then path 0 */
        uint64_t path = i < NR_EVENTS ? i % 2 : i < NR_EVENTS + NR_LAP + 1 ? 1 : 0;
        uint64_t arg = i << 1 | path;
        prog_descend(6, path ? 2 : 19, one_alloc, &arg);
        /* the small ring: the writer takes the events before more come (nothing dropped,
         * however busy the machine) */
        for (int wait = 0;
             i % 16 == 15 && wait < 10000 && atomic_load(&cuheap_recorder.nr_consumed) < i + 1;
             wait++)
            usleep(1000);
    }
    uint64_t after = monotonic_ns();
    cuheap_recorder_stop();

    FILE *f = fopen(trace_path, "r");
    assert_non_null(f);
    char line[1 << 16];
    int64_t stack_of[2] = {-1, -1};
    unsigned nr_allocs = 0, nr_stacks = 0;
    uint64_t last_t = 0;
    while (fgets(line, sizeof(line), f)) {
        json_t *o = json_loads(line, 0, NULL);
        assert_non_null(o);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (type && !strcmp(type, "stack"))
            nr_stacks++;
        if (type && !strcmp(type, "event")) {
            uint64_t ptr = strtoull(json_string_value(json_object_get(o, "ptr")), NULL, 16);
            unsigned i = (unsigned)((ptr - 0x7f0000000000ull) / 512); /* event << 1 | path */
            json_int_t stack = json_integer_value(json_object_get(o, "stack"));
            uint64_t t = (uint64_t)json_integer_value(json_object_get(o, "t"));
            assert_true(stack > 0);
            if (stack_of[i % 2] < 0)
                stack_of[i % 2] = stack;
            if (stack != stack_of[i % 2])
                fail_msg("allocation %u: stack %lld, its path's is %lld", i, (long long)stack,
                         (long long)stack_of[i % 2]);
            assert_true(t >= last_t); /* one thread: its events in order */
            last_t = t;
            nr_allocs++;
        }
        json_decref(o);
    }
    fclose(f);
    unlink(trace_path);
    assert_int_equal(nr_allocs, NR_EVENTS + NR_LAP + 2);
    assert_int_equal(nr_stacks, 2);
    assert_true(stack_of[0] != stack_of[1]);
    /* the stamps, made nanoseconds since the trace's start by the writer, fall within the run */
    assert_true(last_t > 0 && last_t <= after - before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_changed_stacks_recorded_as_changed),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
