/* SPDX-License-Identifier: MIT */
/*
 * Every hooked entry point through every door, judged by the trace a user would read: the
 * program tests/programs/every_hook.c (built once per door) says which allocation and free
 * events its calls must produce, and this test finds each of them exactly once in the trace,
 * with no other allocation or free event. Call counters are not enough: they count before
 * anything is recorded. The program checks the hooks that make no event (queries, streams,
 * contexts) by their answers and prints "check NAME ok".
 *
 * Paths come from meson: CUHEAP_BUILD_ROOT.
 */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define SHELLTEST_PREFIX "cuheap-doors-XXXXXX"
#include "shelltest.h"

static char build[PATH_MAX];

/* One expected event: ptr 0 and api "-" match anything. */
struct expected {
    char event[16], api[40];
    uint64_t ptr, size;
    bool capture;
    int seen;
};

struct trace_event {
    char event[16], api[40];
    uint64_t ptr, size;
    bool capture;
};

static int read_expectations(const char *out, struct expected *e, int max)
{
    int n = 0;
    for (const char *line = out; line && *line && n < max; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        char ptr[32], extra[16] = "";
        unsigned long long size;
        if (sscanf(line, "expect %15s %39s %31s %llu %15s", e[n].event, e[n].api, ptr, &size,
                   extra) < 4)
            continue;
        e[n].ptr = strcmp(ptr, "-") ? strtoull(ptr, NULL, 16) : 0;
        e[n].size = size;
        e[n].capture = !strcmp(extra, "capture");
        e[n].seen = 0;
        n++;
    }
    return n;
}

/* Allocation and free events of the trace up to the mark "end of counted events". */
static int read_trace(const char *path, struct trace_event *ev, int max, bool *ret_marked)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[65536];
    int n = 0;
    *ret_marked = false;
    while (fgets(line, sizeof(line), f) && !*ret_marked) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j)
            continue;
        const char *type = json_string_value(json_object_get(j, "type"));
        const char *event = json_string_value(json_object_get(j, "event"));
        if (type && !strcmp(type, "event") && event) {
            const char *label = json_string_value(json_object_get(j, "label"));
            if (!strcmp(event, "mark") && label && !strcmp(label, "end of counted events")) {
                *ret_marked = true;
            } else if ((!strcmp(event, "alloc") || !strcmp(event, "free")) && n < max) {
                snprintf(ev[n].event, sizeof(ev[n].event), "%s", event);
                snprintf(ev[n].api, sizeof(ev[n].api), "%s",
                         json_string_value(json_object_get(j, "api")));
                const char *ptr = json_string_value(json_object_get(j, "ptr"));
                ev[n].ptr = ptr ? strtoull(ptr, NULL, 16) : 0;
                ev[n].size = (uint64_t)json_integer_value(json_object_get(j, "size"));
                ev[n].capture = json_is_true(json_object_get(j, "capture"));
                n++;
            }
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

static bool matches(const struct expected *e, const struct trace_event *t)
{
    return !strcmp(e->event, t->event) && (!strcmp(e->api, "-") || !strcmp(e->api, t->api)) &&
           (!e->ptr || e->ptr == t->ptr) && e->size == t->size && e->capture == t->capture;
}

/* Run the door's program under cuheap; returns its exit status, stdout in *ret_out. */
static int run_door(const char *door, const char *settings, const char *args, char **ret_out)
{
    char cmd[8 * PATH_MAX];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && rm -f trace.jsonl* && LD_LIBRARY_PATH='%s/tests/fakecuda' "
             "LD_PRELOAD='%s/src/libcuheap.so' "
             "CUHEAP_SUMMARY=0 CUHEAP_LIMIT=1024M CUHEAP_OUTPUT=trace.jsonl %s "
             "'%s/tests/programs/every-hook-%s' %s >out 2>err",
             tmp, build, build, settings, build, door, args);
    int st = system(cmd);
    char path[PATH_MAX + 8];
    snprintf(path, sizeof(path), "%s/out", tmp);
    *ret_out = slurp(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define MAX_EVENTS 256

static void check_door(const char *door, const char *settings, const char *args)
{
    char *out;
    int status = run_door(door, settings, args, &out);
    /* every query, stream and context hook answered as it must through this door */
    for (const char *p = out; (p = strstr(p, "FAILED")); p++)
        print_error("%s (%s): %.*s\n", door, settings, (int)strcspn(p, "\n"), p);
    bool answered = !strstr(out, "FAILED") && status == 0 &&
                    (*args || strstr(out, "check cuStreamCreateWithPriority ok"));
    if (!answered)
        free(out);
    assert_true(answered);

    struct expected want[MAX_EVENTS];
    struct trace_event got[MAX_EVENTS];
    int nr_want = read_expectations(out, want, MAX_EVENTS);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/trace.jsonl", tmp);
    bool marked;
    int nr_got = read_trace(path, got, MAX_EVENTS, &marked);
    free(out);
    assert_true(nr_want >= 30);
    assert_true(marked); /* the trace holds the whole counted part */
    for (int i = 0; i < nr_got; i++) {
        /* the same address can come back (the driver reuses it): first unseen match first */
        int hit = -1;
        for (int k = 0; k < nr_want && (hit < 0 || want[hit].seen); k++)
            if (matches(&want[k], &got[i]) && (hit < 0 || !want[k].seen))
                hit = k;
        if (hit >= 0)
            want[hit].seen++;
        else
            print_error("%s (%s): unexpected %s %s %#" PRIx64 " %" PRIu64 "%s\n", door, settings,
                        got[i].event, got[i].api, got[i].ptr, got[i].size,
                        got[i].capture ? " capture" : "");
    }
    int missing = 0;
    for (int k = 0; k < nr_want; k++)
        if (want[k].seen != 1) {
            print_error("%s (%s): %s %s %#" PRIx64 " %" PRIu64 " seen %d times\n", door, settings,
                        want[k].event, want[k].api, want[k].ptr, want[k].size, want[k].seen);
            missing++;
        }
    assert_int_equal(missing, 0);
    assert_int_equal(nr_got, nr_want); /* one event per call, nothing else */
}

static const char *const doors[] = {"linked", "dlsym", "procaddr", "procaddr-v1"};

static void test_every_hook_pool_on(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        check_door(doors[i], "CUHEAP_POOL=1", "");
}

static void test_every_hook_pool_off(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        check_door(doors[i], "CUHEAP_POOL=0", "");
}

static void test_every_hook_other_policies(void **state)
{
    (void)state;
    check_door("procaddr", "CUHEAP_REUSE=sync", "");
    check_door("dlsym", "CUHEAP_BACKING=vmm", "");
    /* immediate reuse fails the stream checks by design (tests/integration/test-hooks.c shows
     * it): here only the events count */
    check_door("procaddr-v1", "CUHEAP_REUSE=immediate", "--no-streams");
}

/* Peer access through every door, pool on (both backings) and off: device 0 can use device
 * 1's pooled memory once cuCtxEnablePeerAccess said so. */
static void test_peer_access(void **state)
{
    (void)state;
    const char *settings[] = {"CUHEAP_POOL=1", "CUHEAP_BACKING=vmm", "CUHEAP_POOL=0"};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 3; k++) {
            char env[128], *out;
            snprintf(env, sizeof(env), "FAKECUDA_DEVICE_COUNT=2 %s", settings[k]);
            int status = run_door(doors[i], env, "--peer", &out);
            if (status != 0 || !strstr(out, "check cuCtxEnablePeerAccess ok"))
                print_error("%s (%s): %s", doors[i], env, out);
            assert_int_equal(status, 0);
            assert_non_null(strstr(out, "check cuCtxEnablePeerAccess ok"));
            free(out);
        }
}

int main(void)
{
    const char *b = getenv("CUHEAP_BUILD_ROOT");
    if (!b)
        return 1;
    snprintf(build, sizeof(build), "%s", b);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_hook_pool_on, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_every_hook_pool_off, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_every_hook_other_policies, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_peer_access, fresh_dir, remove_dir),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
