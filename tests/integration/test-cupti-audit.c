/* SPDX-License-Identifier: MIT */
/*
 * CUHEAP_AUDIT as a user runs it, against the simulated driver and the CUPTI stand-in
 * (tests/fakecupti, which reports every allocation and release the fake driver makes): the
 * exit line says all were seen, pool on and off, and its count is the number of driver-level
 * operations the trace holds; an allocation made through a door no hook covers (dlvsym) is
 * named with its address, in the line, in the trace and in `cuheap report`; CUPTI held by another
 * subscriber, or not found, costs one line and the program runs as before; `cuheap run --audit`
 * finds CUPTI next to the toolkit (CUDA_HOME).
 *
 * Paths come from meson: CUHEAP_BUILD_ROOT, CUHEAP_SOURCE_ROOT.
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "slurp.h"

static char build[PATH_MAX], source[PATH_MAX], tmp[PATH_MAX], env_base[4 * PATH_MAX];

struct result {
    int status;
    char *out, *err;
};

/* The audit program under cuheap with extra settings; the trace goes to tmp/t.jsonl. */
static struct result run(const char *settings, const char *args)
{
    char cmd[16 * PATH_MAX];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && rm -f t.jsonl* && env %s CUHEAP_OUTPUT=t.jsonl %s "
             "'%s/tests/programs/audit-door' %s >out 2>err",
             tmp, env_base, settings, build, args);
    int st = system(cmd);
    char p[PATH_MAX + 8];
    struct result r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128, NULL, NULL};
    snprintf(p, sizeof(p), "%s/out", tmp);
    r.out = slurp(p);
    snprintf(p, sizeof(p), "%s/err", tmp);
    r.err = slurp(p);
    return r;
}

static void done(struct result *r)
{
    free(r->out);
    free(r->err);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* What a trace says: driver-level operations cuheap recorded (pool arenas, and allocations
 * and frees that were not pool blocks, VMM handles and mappings aside), and its audit events. */
struct trace_audit {
    long driver_level;
    long verdicts, operations, missed;
    long missed_events;
    uint64_t missed_ptr[8];
};

static struct trace_audit read_trace(void)
{
    struct trace_audit t = {0};
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/t.jsonl", tmp);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1 << 16];
    while (fgets(line, sizeof(line), f)) {
        json_t *o = json_loads(line, 0, NULL);
        assert_non_null(o);
        const char *type = json_string_value(json_object_get(o, "type"));
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (type && !strcmp(type, "event") && ev) {
            const char *api = json_string_value(json_object_get(o, "api"));
            bool pooled = json_is_true(json_object_get(o, "pooled"));
            if (!strcmp(ev, "arena_grow") || !strcmp(ev, "arena_release") ||
                ((!strcmp(ev, "alloc") || !strcmp(ev, "free")) && !pooled &&
                 strcmp(api, "cuMemCreate") && strcmp(api, "cuMemMap")))
                t.driver_level++;
            if (!strcmp(ev, "audit")) {
                json_t *ops = json_object_get(o, "operations");
                if (ops) {
                    t.verdicts++;
                    t.operations = (long)json_integer_value(ops);
                    t.missed = (long)json_integer_value(json_object_get(o, "missed"));
                } else {
                    if (t.missed_events < 8)
                        t.missed_ptr[t.missed_events] =
                            strtoull(json_string_value(json_object_get(o, "ptr")), NULL, 16);
                    t.missed_events++;
                }
            }
        }
        json_decref(o);
    }
    fclose(f);
    return t;
}

/* "cuheap: audit: N driver operations, ..." -> N, or -1 without such a line. */
static long audited(const char *err)
{
    long n = -1;
    for (const char *p = err; (p = strstr(p, "cuheap: audit: ")); p++)
        if (sscanf(p, "cuheap: audit: %ld driver operations", &n) == 1)
            return n;
    return -1;
}

static void all_seen(const char *settings)
{
    char s[4 * PATH_MAX];
    snprintf(s, sizeof(s), "%s CUHEAP_VERBOSE=1", settings);
    struct result r = run(s, "");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "ok\n");
    assert_int_equal(count(r.err, "driver operations, all seen"), 1);
    struct trace_audit t = read_trace();
    long n = audited(r.err);
    /* every driver operation the fake's CUPTI reported is one cuheap recorded, and back */
    assert_true(n > 0);
    assert_int_equal(n, t.driver_level);
    assert_int_equal(t.verdicts, 1);
    assert_int_equal(t.operations, n);
    assert_int_equal(t.missed, 0);
    assert_int_equal(t.missed_events, 0);
    /* the stand-in reports everything the fake driver does: a hooked operation it did not
     * report would be one cuheap invented (a pool block taken for a driver call) */
    assert_non_null(strstr(r.err, "hooked operations the driver did not report 0\n"));
    done(&r);
}

static char fake_cupti[PATH_MAX + 64];

static void test_pool_on_all_seen(void **state)
{
    (void)state;
    char s[2 * PATH_MAX];
    snprintf(s, sizeof(s), "CUHEAP_AUDIT=%s CUHEAP_BACKING=legacy", fake_cupti);
    all_seen(s);
}

/* The default vmm pool maps its chunks itself; the stand-in, like the real driver for VMM
 * maps, does not report those: every operation it does report is still one cuheap saw. */
static void test_vmm_pool_all_seen(void **state)
{
    (void)state;
    char s[2 * PATH_MAX];
    snprintf(s, sizeof(s), "CUHEAP_AUDIT=%s CUHEAP_BACKING=vmm CUHEAP_VERBOSE=1", fake_cupti);
    struct result r = run(s, "");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "ok\n");
    assert_int_equal(count(r.err, "driver operations, all seen"), 1);
    struct trace_audit t = read_trace();
    assert_true(audited(r.err) > 0);
    assert_int_equal(t.verdicts, 1);
    assert_int_equal(t.missed, 0);
    assert_int_equal(t.missed_events, 0);
    done(&r);
}

static void test_pool_off_all_seen(void **state)
{
    (void)state;
    char s[2 * PATH_MAX];
    snprintf(s, sizeof(s), "CUHEAP_AUDIT=%s CUHEAP_POOL=0", fake_cupti);
    all_seen(s);
}

/* The door no hook covers: the audit names the allocation and its release by address. */
static void test_uncovered_door_is_named(void **state)
{
    (void)state;
    char s[2 * PATH_MAX];
    snprintf(s, sizeof(s), "CUHEAP_AUDIT=%s CUHEAP_BACKING=legacy", fake_cupti);
    struct result r = run(s, "miss");
    assert_int_equal(r.status, 0);
    unsigned long long addr = 0;
    const char *m = strstr(r.out, "missed 0x");
    assert_non_null(m);
    assert_int_equal(sscanf(m, "missed 0x%llx", &addr), 1);
    assert_non_null(strstr(r.out, "ok\n"));
    char want[128];
    assert_non_null(strstr(r.err, "driver operations, 2 not seen by cuheap: "));
    snprintf(want, sizeof(want), "alloc device 0x%llx (8.00 MiB, correlation ", addr);
    const char *line = strstr(r.err, want);
    assert_non_null(line);
    /* the API call behind it, from CUPTI's callbacks on the driver's memory functions */
    assert_true(strstr(line, ", cuMemAlloc_v2)") == strchr(line, ')') - strlen(", cuMemAlloc_v2"));
    snprintf(want, sizeof(want), "release device 0x%llx (8.00 MiB, correlation ", addr);
    line = strstr(r.err, want);
    assert_non_null(line);
    assert_true(strstr(line, ", cuMemFree_v2)") == strchr(line, ')') - strlen(", cuMemFree_v2"));
    assert_int_equal(count(r.err, "all seen"), 0);
    struct trace_audit t = read_trace();
    assert_int_equal(t.verdicts, 1);
    assert_int_equal(t.missed, 2);
    assert_int_equal(t.operations, t.driver_level + 2);
    assert_int_equal(t.missed_events, 2);
    assert_int_equal(t.missed_ptr[0], addr);
    assert_int_equal(t.missed_ptr[1], addr);
    done(&r);
    /* the trace keeps to its schema, and cuheap report shows the verdict and the misses */
    char cmd[16 * PATH_MAX];
    const char *py = system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") == 0
                         ? "/usr/bin/python3"
                         : "python3";
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && %s '%s/scripts/validate-trace.py' t.jsonl >/dev/null && "
             "'%s/tools/cuheap' report t.jsonl >report 2>&1",
             tmp, py, source, build);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s/report", tmp);
    char *report = slurp(cmd);
    snprintf(want, sizeof(want), "audit: %ld driver operations, 2 not seen by cuheap:\n",
             t.operations);
    assert_non_null(strstr(report, want));
    snprintf(want, sizeof(want), "  alloc device 0x%llx (8.00 MiB, correlation ", addr);
    assert_non_null(strstr(report, want));
    free(report);
}

/* Another subscriber holds CUPTI, or there is none: one line, and the program's run, its
 * output and cuheap's own summary are as without the audit. */
static void test_cupti_held_or_absent(void **state)
{
    (void)state;
    char s[2 * PATH_MAX];
    snprintf(s, sizeof(s), "CUHEAP_AUDIT=%s FAKECUPTI_HELD=1", fake_cupti);
    const char *const settings[] = {s, "CUHEAP_AUDIT=/nonexistent/libcupti.so",
                                    "CUHEAP_AUDIT=1 CUHEAP_RECORD=0"};
    const char *const says[] = {"audit: CUPTI is held by another subscriber",
                                "audit: cannot open /nonexistent/libcupti.so",
                                "audit: needs CUHEAP_RECORD=1"};
    for (int i = 0; i < 3; i++) {
        struct result r = run(settings[i], "miss");
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "ok\n"));
        assert_int_equal(count(r.err, says[i]), 1);
        assert_int_equal(count(r.err, "cuheap: audit: "), 1); /* that line, nothing more */
        assert_int_equal(count(r.err, "driver operations"), 0);
        assert_int_equal(count(r.err, ": peak live "), 1); /* the usual summary */
        done(&r);
    }
}

/* cuheap run --audit: CUPTI found next to the toolkit CUDA_HOME names. */
static void test_run_audit_finds_cupti_next_to_toolkit(void **state)
{
    (void)state;
    char cmd[16 * PATH_MAX];
    snprintf(
        cmd, sizeof(cmd),
        "cd '%s' && mkdir -p cuda/lib64 && ln -sf '%s' cuda/lib64/libcupti.so && rm -f t.jsonl "
        "&& env %s CUDA_HOME='%s/cuda' '%s/tools/cuheap' run --audit -o t.jsonl -- "
        "'%s/tests/programs/audit-door' miss >out 2>err",
        tmp, fake_cupti, env_base, tmp, build, build);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char p[PATH_MAX + 8];
    snprintf(p, sizeof(p), "%s/err", tmp);
    char *err = slurp(p);
    assert_non_null(strstr(err, "driver operations, 2 not seen by cuheap"));
    free(err);
    /* without --audit, no audit */
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && rm -f t.jsonl && env %s CUDA_HOME='%s/cuda' '%s/tools/cuheap' run -o "
             "t.jsonl -- '%s/tests/programs/audit-door' miss >out 2>err",
             tmp, env_base, tmp, build, build);
    st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    err = slurp(p);
    assert_null(strstr(err, "audit:"));
    free(err);
}

static int setup(void **state)
{
    (void)state;
    const char *b = getenv("CUHEAP_BUILD_ROOT");
    const char *src = getenv("CUHEAP_SOURCE_ROOT");
    if (!b || !realpath(b, build) || !src || !realpath(src, source))
        return -1;
    snprintf(tmp, sizeof(tmp), "/tmp/cuheap-audit-XXXXXX");
    if (!mkdtemp(tmp))
        return -1;
    snprintf(fake_cupti, sizeof(fake_cupti), "%s/tests/fakecupti/libcupti.so", build);
    snprintf(env_base, sizeof(env_base),
             "LD_PRELOAD=%s/src/libcuheap.so LD_LIBRARY_PATH=%s/tests/fakecuda", build, build);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_on_all_seen),
        cmocka_unit_test(test_vmm_pool_all_seen),
        cmocka_unit_test(test_pool_off_all_seen),
        cmocka_unit_test(test_uncovered_door_is_named),
        cmocka_unit_test(test_cupti_held_or_absent),
        cmocka_unit_test(test_run_audit_finds_cupti_next_to_toolkit),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, teardown);
}
