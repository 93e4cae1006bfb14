/* SPDX-License-Identifier: MIT */
/* The tool's answers on a trace whose truth is known: peak live and when, reserved through
 * arena events, what was live at the peak by site, what was never freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "analysis.h"
#include "event.h"

#define MIB (1ull << 20)

static char path[64];

static void line(FILE *f, const char *ev, uint64_t seq, uint64_t ptr, uint64_t size, int pooled,
                 int stack)
{
    fprintf(f,
            "{\"type\":\"event\",\"seq\":%llu,\"t\":%llu,\"event\":\"%s\",\"api\":\"%s\","
            "\"device\":0,\"tid\":1,\"ptr\":\"0x%llx\",\"size\":%llu,\"actual\":%llu,"
            "\"pooled\":%s%s",
            (unsigned long long)seq, (unsigned long long)seq * 1000, ev,
            strcmp(ev, "arena_grow") ? "cuMemAlloc" : "none", (unsigned long long)ptr,
            (unsigned long long)size, (unsigned long long)size, pooled ? "true" : "false",
            stack ? "" : "}\n");
    if (stack)
        fprintf(f, ",\"stack\":%d}\n", stack);
}

/* Site 1 (train.py:10) allocates 10 MiB from the pool and frees it; site 2 (train.py:20)
 * allocates 20 MiB from the pool, 100 MiB from the driver (the peak, 130 MiB live), and 4 MiB
 * it never frees. The comments give the live bytes after each event. */
static int write_trace(void **state)
{
    (void)state;
    snprintf(path, sizeof(path), "/tmp/cuheap-analysis-XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fputs("{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":9,"
          "\"start_unix_ns\":0,\"config\":{}}\n",
          f);
    fputs("{\"type\":\"stack\",\"id\":1,\"frames\":[],\"python\":[{\"file\":\"train.py\","
          "\"line\":10,\"function\":\"embed\"}]}\n",
          f);
    fputs("{\"type\":\"stack\",\"id\":2,\"frames\":[],\"python\":[{\"file\":\"train.py\","
          "\"line\":20,\"function\":\"attention\"}]}\n",
          f);
    line(f, "arena_grow", 1, 0x100000000, 64 * MIB, 1, 0);
    line(f, "alloc", 2, 0x100000000, 10 * MIB, 1, 1);  /* live 10 */
    line(f, "alloc", 3, 0x101000000, 20 * MIB, 1, 2);  /* live 30 */
    line(f, "alloc", 4, 0x200000000, 100 * MIB, 0, 2); /* live 130: the peak (driver) */
    line(f, "free", 5, 0x200000000, 100 * MIB, 0, 0);  /* live 30 */
    line(f, "free", 6, 0x100000000, 10 * MIB, 1, 0);   /* live 20 */
    line(f, "alloc", 7, 0x102000000, 4 * MIB, 1, 2);   /* live 24 */
    line(f, "free", 8, 0x101000000, 20 * MIB, 1, 0);   /* live 4: site 2 leaks 4 MiB */
    fputs("{\"type\":\"footer\",\"events\":8,\"written\":8,\"dropped\":0,\"stacks\":2,\"t\":9}\n",
          f);
    fclose(f);
    return 0;
}

static int remove_trace(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static void test_summary(void **state)
{
    (void)state;
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    struct trace_summary s;
    summarize(&t, &s);
    assert_int_equal(s.nr_dev, 1);
    struct device_summary *d = &s.dev[0];
    assert_int_equal(d->peak_live, 130 * MIB);
    assert_int_equal(d->peak_live_t, 4000);
    assert_int_equal(d->peak_reserved, 164 * MIB); /* the arena and the driver's 100 MiB */
    assert_int_equal(d->live, 4 * MIB);
    assert_int_equal(d->nr_allocs, 4);
    assert_int_equal(d->nr_pooled, 3);
    assert_int_equal(d->nr_frees, 3);

    struct site *sites;
    size_t nr = collect_sites(&t, &s, SITES_AT_PEAK, -1, &sites);
    assert_int_equal(nr, 2);
    assert_int_equal(sites[0].stack, 2); /* 20 + 100 MiB live at the peak */
    assert_int_equal(sites[0].bytes, 120 * MIB);
    assert_int_equal(sites[1].stack, 1);
    assert_int_equal(sites[1].bytes, 10 * MIB);
    free(sites);

    nr = collect_sites(&t, &s, SITES_LEAKED, -1, &sites);
    assert_int_equal(nr, 1);
    assert_int_equal(sites[0].stack, 2);
    assert_int_equal(sites[0].bytes, 4 * MIB);
    free(sites);

    nr = collect_sites(&t, &s, SITES_TOTAL, -1, &sites);
    assert_int_equal(sites[0].bytes, 124 * MIB);
    assert_int_equal(sites[0].count, 3);
    free(sites);

    char name[128];
    assert_string_equal(cuheap_trace_site(&t, 2, name, sizeof(name)), "train.py:20 in attention");
    summary_free(&s);
    cuheap_trace_free(&t);
}

static void visit(const struct cuheap_trace_event *e, void *ctx)
{
    summarize_event(ctx, e);
}

/* Summarized while the trace is read (one pass) or afterwards: the same answers. A trace
 * whose events stray further than the reordering window is read into memory, and the visit
 * is then said not to count. */
static void test_summary_while_reading(void **state)
{
    (void)state;
    struct cuheap_trace a, b;
    char err[256];
    struct trace_summary x, y;
    assert_int_equal(cuheap_trace_read(path, &a, err, sizeof(err)), 0);
    summarize(&a, &x);
    summarize_begin(&y);
    bool visited = false;
    assert_int_equal(cuheap_trace_open_visit(path, &b, err, sizeof(err), visit, &y, &visited), 0);
    summarize_end(&y);
    assert_true(visited);
    assert_int_equal(y.dev[0].peak_live, x.dev[0].peak_live);
    assert_int_equal(y.dev[0].peak_live_index, x.dev[0].peak_live_index);
    assert_int_equal(y.dev[0].peak_reserved, x.dev[0].peak_reserved);
    struct site *sx, *sy;
    size_t nx = collect_sites(&a, &x, SITES_AT_PEAK, -1, &sx);
    size_t ny = collect_sites(&b, &y, SITES_AT_PEAK, -1, &sy);
    assert_int_equal(nx, ny);
    assert_memory_equal(sx, sy, nx * sizeof(*sx));
    free(sx);
    free(sy);
    summary_free(&x);
    summary_free(&y);
    cuheap_trace_free(&a);
    cuheap_trace_free(&b);

    /* events written last first: a window of 2 cannot order them */
    char reversed[80];
    snprintf(reversed, sizeof(reversed), "%s.rev", path);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "(head -3 %s; sed -n '4,11p' %s | tac; tail -1 %s) > %s", path, path,
             path, reversed);
    assert_int_equal(system(cmd), 0);
    cuheap_trace_set_window(2);
    summarize_begin(&y);
    assert_int_equal(cuheap_trace_open_visit(reversed, &b, err, sizeof(err), visit, &y, &visited),
                     0);
    summarize_end(&y);
    cuheap_trace_set_window(0);
    assert_false(visited);
    assert_false(b.streamed);
    summary_free(&y);
    summarize(&b, &y); /* what the tool then does */
    assert_int_equal(y.dev[0].peak_live, 130 * MIB);
    summary_free(&y);
    cuheap_trace_free(&b);
    unlink(reversed);
}

/* A training loop: 8 MiB kept from the start, a warm-up of other sizes, then 12 steps of
 * A 4 MiB, B 1 MiB, B freed, C 2 MiB, A freed, C freed (A and C live together, B beside A).
 * Planned once for one step, B shares C's place: 6 MiB beside the 8 MiB kept, which is the
 * step's own peak (8 + 4 + 2), so 1.000 of it. */
static int write_loop(void **state)
{
    (void)state;
    snprintf(path, sizeof(path), "/tmp/cuheap-analysis-XXXXXX");
    FILE *f = fdopen(mkstemp(path), "w");
    fputs("{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":9,"
          "\"start_unix_ns\":0,\"config\":{}}\n",
          f);
    uint64_t seq = 1, n = 0;
    line(f, "alloc", seq++, 0x100000000, 8 * MIB, 0, 0);
    for (int i = 0; i < 5; i++) {
        line(f, "alloc", seq++, 0x200000000, (uint64_t)(i + 5) * MIB, 0, 0);
        line(f, "free", seq++, 0x200000000, (uint64_t)(i + 5) * MIB, 0, 0);
    }
    for (int step = 0; step < 12; step++) {
        line(f, "alloc", seq++, 0x300000000, 4 * MIB, 0, 0);
        line(f, "alloc", seq++, 0x400000000, 1 * MIB, 0, 0);
        line(f, "free", seq++, 0x400000000, 1 * MIB, 0, 0);
        line(f, "alloc", seq++, 0x500000000, 2 * MIB, 0, 0);
        line(f, "free", seq++, 0x300000000, 4 * MIB, 0, 0);
        line(f, "free", seq++, 0x500000000, 2 * MIB, 0, 0);
    }
    n = seq - 1;
    fprintf(f,
            "{\"type\":\"footer\",\"events\":%llu,\"written\":%llu,\"dropped\":0,"
            "\"stacks\":0,\"t\":%llu}\n",
            (unsigned long long)n, (unsigned long long)n, (unsigned long long)seq * 1000);
    fclose(f);
    return 0;
}

static void test_step_estimate(void **state)
{
    (void)state;
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    struct step_estimate st;
    assert_true(estimate_step(&t, 0, &st));
    assert_int_equal(st.period, 3);
    assert_int_equal(st.nr_planned, 3);
    assert_int_equal(st.region, 6 * MIB);
    assert_int_equal(st.outside, 8 * MIB);
    assert_int_equal(st.peak_live, 14 * MIB);
    assert_true(estimate_step(&t, 1, &st)); /* a device with nothing: no step */
    assert_int_equal(st.period, 0);
    cuheap_trace_free(&t);
}

/* A double buffer: each step's 100 MiB block lives into the next step, beside the one before
 * it, with 1 and 2 MiB blocks of the step's own. The buffers live longer than a step and stay
 * beside the plan, both at once: no estimate below the step's peak live (it said 0.505). */
static int write_double_buffer(void **state)
{
    (void)state;
    snprintf(path, sizeof(path), "/tmp/cuheap-analysis-XXXXXX");
    FILE *f = fdopen(mkstemp(path), "w");
    fputs("{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":9,"
          "\"start_unix_ns\":0,\"config\":{}}\n",
          f);
    uint64_t seq = 1;
    for (int step = 0; step < 16; step++) {
        uint64_t buf = step % 2 ? 0x300000000 : 0x400000000;
        line(f, "alloc", seq++, buf, 100 * MIB, 0, 0);
        line(f, "alloc", seq++, 0x500000000, 1 * MIB, 0, 0);
        line(f, "free", seq++, 0x500000000, 1 * MIB, 0, 0);
        if (step)
            line(f, "free", seq++, step % 2 ? 0x400000000 : 0x300000000, 100 * MIB, 0, 0);
        line(f, "alloc", seq++, 0x600000000, 2 * MIB, 0, 0);
        line(f, "free", seq++, 0x600000000, 2 * MIB, 0, 0);
    }
    fprintf(f,
            "{\"type\":\"footer\",\"events\":%llu,\"written\":%llu,\"dropped\":0,"
            "\"stacks\":0,\"t\":%llu}\n",
            (unsigned long long)seq - 1, (unsigned long long)seq - 1,
            (unsigned long long)seq * 1000);
    fclose(f);
    return 0;
}

static void test_step_estimate_longer_lives(void **state)
{
    (void)state;
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    struct step_estimate st;
    assert_true(estimate_step(&t, 0, &st));
    assert_int_equal(st.period, 3);
    assert_int_equal(st.peak_live, 201 * MIB);
    assert_int_equal(st.outside, 200 * MIB);
    assert_int_equal(st.region, 2 * MIB);
    assert_true(st.region + st.outside >= st.peak_live);
    cuheap_trace_free(&t);
}

/* The first trace has no step: four allocations of four sizes are no loop. */
static void test_no_step(void **state)
{
    (void)state;
    struct cuheap_trace t;
    char err[256];
    assert_int_equal(cuheap_trace_read(path, &t, err, sizeof(err)), 0);
    struct step_estimate st;
    assert_true(estimate_step(&t, 0, &st));
    assert_int_equal(st.period, 0);
    cuheap_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_summary, write_trace, remove_trace),
        cmocka_unit_test_setup_teardown(test_summary_while_reading, write_trace, remove_trace),
        cmocka_unit_test_setup_teardown(test_step_estimate, write_loop, remove_trace),
        cmocka_unit_test_setup_teardown(test_step_estimate_longer_lives, write_double_buffer,
                                        remove_trace),
        cmocka_unit_test_setup_teardown(test_no_step, write_trace, remove_trace),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
