/* SPDX-License-Identifier: MIT */
/* Settings: defaults, every value form, and one clear warning per bad value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "config.h"

struct fake_env {
    const char *vars[16][2];
    char warnings[16][600];
    int nr_warnings;
};

static const char *get(const char *name, void *arg)
{
    struct fake_env *e = arg;
    for (int i = 0; i < 16 && e->vars[i][0]; i++)
        if (!strcmp(e->vars[i][0], name))
            return e->vars[i][1];
    return NULL;
}

static void warn(const char *line, void *arg)
{
    struct fake_env *e = arg;
    if (e->nr_warnings < 16)
        snprintf(e->warnings[e->nr_warnings], 600, "%s", line);
    e->nr_warnings++;
}

static bool warned(const struct fake_env *e, const char *what)
{
    for (int i = 0; i < e->nr_warnings && i < 16; i++)
        if (strstr(e->warnings[i], what))
            return true;
    return false;
}

static void test_defaults(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_true(c.pool);
    assert_int_equal(c.arena_size, 256ull << 20);
    assert_int_equal(c.min_block, 512);
    assert_int_equal(c.pool_max, 64ull << 20);
    assert_int_equal(c.vmm_chunk, 8ull << 20);
    assert_int_equal(c.vmm_cushion, 2ull << 20);
    assert_int_equal(c.vmm_layout, CUHEAP_VMM_TIGHT);
    assert_int_equal(c.vmm_idle_fit, 125);
    assert_int_equal(c.reuse, CUHEAP_REUSE_FENCE);
    assert_int_equal(c.release, CUHEAP_RELEASE_OOM);
    assert_int_equal(c.limit_bytes, 0);
    assert_int_equal(c.stack_depth, 32);
    assert_true(c.stack_cache);
    assert_false(c.record_timing);
    assert_string_equal(c.output, "cuheap-%p.jsonl");
    assert_int_equal(c.format, CUHEAP_FORMAT_JSONL);
}

static void test_values(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_POOL", "off"},
                                  {"CUHEAP_ARENA_SIZE", "1G"},
                                  {"CUHEAP_POOL_MAX", "128MiB"},
                                  {"CUHEAP_VMM_CHUNK", "64M"},
                                  {"CUHEAP_VMM_CUSHION", "0"},
                                  {"CUHEAP_VMM_LAYOUT", "aligned"},
                                  {"CUHEAP_VMM_IDLE_FIT", "300"},
                                  {"CUHEAP_REUSE", "immediate"},
                                  {"CUHEAP_RELEASE", "empty"},
                                  {"CUHEAP_LIMIT", "1.5G"},
                                  {"CUHEAP_STACK_DEPTH", "0"},
                                  {"CUHEAP_STACK_CACHE", "0"},
                                  {"CUHEAP_RECORD_TIMING", "1"},
                                  {"CUHEAP_FORMAT", "chrome"},
                                  {"CUHEAP_OUTPUT", "/tmp/x-%p-%r.json"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_false(c.pool);
    assert_int_equal(c.arena_size, 1ull << 30);
    assert_int_equal(c.pool_max, 128ull << 20);
    assert_int_equal(c.vmm_chunk, 64ull << 20);
    assert_int_equal(c.vmm_cushion, 0);
    assert_int_equal(c.vmm_layout, CUHEAP_VMM_ALIGNED);
    assert_int_equal(c.vmm_idle_fit, 300);
    assert_int_equal(c.reuse, CUHEAP_REUSE_IMMEDIATE);
    assert_int_equal(c.release, CUHEAP_RELEASE_EMPTY);
    assert_int_equal(c.limit_bytes, (uint64_t)(1.5 * (1ull << 30)));
    assert_int_equal(c.stack_depth, 0);
    assert_false(c.stack_cache);
    assert_true(c.record_timing);
    assert_int_equal(c.format, CUHEAP_FORMAT_CHROME);
    assert_string_equal(c.output, "/tmp/x-%p-%r.json");
}

static void test_percent_limit(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_LIMIT", "80%"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 0);
    assert_int_equal(c.limit_permille, 800);
    assert_int_equal(c.limit_bytes, 0);
}

static void test_bad_values_warn_and_keep_defaults(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_ARENA_SIZE", "3M"}, /* not a power of two */
                                  {"CUHEAP_REUSE", "sometimes"},
                                  {"CUHEAP_LIMIT", "150%"},
                                  {"CUHEAP_STACK_DEPTH", "-1"},
                                  {"CUHEAP_POOL", "maybe"},
                                  {"CUHEAP_RING", "1000"},
                                  {"CUHEAP_VMM_IDLE_FIT", "99"}}}; /* below 100 percent */
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 7);
    assert_int_equal(c.arena_size, 256ull << 20);
    assert_int_equal(c.reuse, CUHEAP_REUSE_FENCE);
    assert_int_equal(c.limit_bytes, 0);
    assert_int_equal(c.limit_permille, 0);
    assert_int_equal(c.stack_depth, 32);
    assert_true(c.pool);
    assert_int_equal(c.ring_slots, 65536);
    assert_int_equal(c.vmm_idle_fit, 125);
    /* each warning names the variable and the value */
    assert_true(warned(&e, "CUHEAP_ARENA_SIZE=\"3M\""));
    assert_true(warned(&e, "CUHEAP_REUSE=\"sometimes\""));
    assert_true(warned(&e, "CUHEAP_LIMIT=\"150%\""));
    assert_true(warned(&e, "CUHEAP_STACK_DEPTH=\"-1\""));
    assert_true(warned(&e, "CUHEAP_POOL=\"maybe\""));
    assert_true(warned(&e, "CUHEAP_RING=\"1000\""));
    assert_true(warned(&e, "CUHEAP_VMM_IDLE_FIT=\"99\""));
    for (int i = 0; i < 7; i++)
        assert_null(strchr(e.warnings[i], '\n'));
}

static void test_pool_max_capped_by_arena(void **state)
{
    (void)state;
    struct fake_env e = {.vars = {{"CUHEAP_ARENA_SIZE", "32M"}, {"CUHEAP_POOL_MAX", "64M"}}};
    struct cuheap_config c;
    assert_int_equal(cuheap_config_parse(&c, get, warn, &e), 1);
    assert_int_equal(c.pool_max, 32ull << 20);
}

static void test_sizes_and_paths(void **state)
{
    (void)state;
    uint64_t b;
    unsigned pm;
    assert_int_equal(cuheap_parse_size("512", false, &b, &pm), 0);
    assert_int_equal(b, 512);
    assert_int_equal(cuheap_parse_size("64k", false, &b, &pm), 0);
    assert_int_equal(b, 65536);
    assert_int_equal(cuheap_parse_size("2GB", false, &b, &pm), 0);
    assert_int_equal(b, 2ull << 30);
    assert_int_equal(cuheap_parse_size("12 apples", false, &b, &pm), -22);
    assert_int_equal(cuheap_parse_size("", false, &b, &pm), -22);
    assert_int_equal(cuheap_parse_size("50%", false, &b, &pm), -22);
    char out[128];
    cuheap_expand_path("t-%p-r%r-%h-%%.jsonl", out, sizeof(out), 42, "3", "node1");
    assert_string_equal(out, "t-42-r3-node1-%.jsonl");
    cuheap_expand_path("t-%r", out, sizeof(out), 42, NULL, NULL);
    assert_string_equal(out, "t-0");
}

static void test_output_mode(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    cuheap_config_parse(&c, get, warn, &e);
    assert_int_equal(c.output_mode, 0600); /* the trace holds the command line */
    struct fake_env wide = {.vars = {{"CUHEAP_OUTPUT_MODE", "644"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &wide), 0);
    assert_int_equal(c.output_mode, 0644);
    /* not octal, executable, beyond the permission bits: warned, default kept */
    static const char *const bad[] = {"0689", "0755", "01600", "-600", "rw", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct fake_env b = {.vars = {{"CUHEAP_OUTPUT_MODE", bad[i]}}};
        assert_int_equal(cuheap_config_parse(&c, get, warn, &b), 1);
        assert_int_equal(c.output_mode, 0600);
        assert_true(warned(&b, "CUHEAP_OUTPUT_MODE"));
    }
}

static void audit_line(const char *line, void *arg)
{
    if (!strncmp(line, "CUHEAP_AUDIT=", 13))
        snprintf(arg, 600, "%s", line);
}

/* The audit is opt-in; a path names the CUPTI to use and turns it on; the effective setting
 * shows in the dump the trace header holds. */
static void test_audit(void **state)
{
    (void)state;
    struct fake_env e = {0};
    struct cuheap_config c;
    cuheap_config_parse(&c, get, warn, &e);
    assert_false(c.audit);
    assert_string_equal(c.audit_cupti, "");
    struct fake_env on = {.vars = {{"CUHEAP_AUDIT", "1"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &on), 0);
    assert_true(c.audit);
    assert_string_equal(c.audit_cupti, "");
    struct fake_env path = {.vars = {{"CUHEAP_AUDIT", "/opt/cuda/lib64/libcupti.so.13"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &path), 0);
    assert_true(c.audit);
    assert_string_equal(c.audit_cupti, "/opt/cuda/lib64/libcupti.so.13");
    char line[600] = "";
    cuheap_config_dump(&c, audit_line, line);
    assert_string_equal(line, "CUHEAP_AUDIT=/opt/cuda/lib64/libcupti.so.13");
    /* a relative name would be looked up who knows where: warned, the default kept */
    struct fake_env bad = {.vars = {{"CUHEAP_AUDIT", "libcupti.so"}}};
    assert_int_equal(cuheap_config_parse(&c, get, warn, &bad), 1);
    assert_true(warned(&bad, "CUHEAP_AUDIT"));
    assert_false(c.audit);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_percent_limit),
        cmocka_unit_test(test_bad_values_warn_and_keep_defaults),
        cmocka_unit_test(test_pool_max_capped_by_arena),
        cmocka_unit_test(test_sizes_and_paths),
        cmocka_unit_test(test_output_mode),
        cmocka_unit_test(test_audit),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
