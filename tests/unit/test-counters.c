/* SPDX-License-Identifier: MIT */
/* Per-thread counters: no count is lost when threads exit (their blocks are reused), counts
 * made from another key's destructor after the thread's block went back still count, sums
 * read while threads count only grow, and a forked child starts its slots over. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "counters.h"

#define PER_THREAD 100000

static void *counter(void *arg)
{
    unsigned slot = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++)
        cuheap_count(slot, 1);
    cuheap_count(CUHEAP_CTR_LIVE, -3);
    return NULL;
}

static void test_exited_threads_keep_their_counts(void **state)
{
    (void)state;
    int64_t before = cuheap_counters_sum(CUHEAP_CTR_ALLOCS);
    int64_t live = cuheap_counters_sum(CUHEAP_CTR_LIVE);
    /* rounds of threads: later rounds take the blocks of earlier ones */
    for (int round = 0; round < 5; round++) {
        pthread_t t[8];
        for (int i = 0; i < 8; i++)
            assert_int_equal(pthread_create(&t[i], NULL, counter, (void *)CUHEAP_CTR_ALLOCS), 0);
        for (int i = 0; i < 8; i++)
            pthread_join(t[i], NULL);
        assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_ALLOCS),
                         before + (int64_t)(round + 1) * 8 * PER_THREAD);
    }
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_LIVE), live - 5 * 8 * 3);
}

struct reader {
    _Atomic int stop;
    bool monotone;
};

static void *read_sums(void *arg)
{
    struct reader *r = arg;
    int64_t last = 0;
    while (!atomic_load(&r->stop)) {
        int64_t now = cuheap_counters_sum(CUHEAP_CTR_FREES);
        if (now < last)
            r->monotone = false;
        last = now;
    }
    return NULL;
}

static void test_sums_only_grow_while_threads_count(void **state)
{
    (void)state;
    struct reader r = {.monotone = true};
    pthread_t rd, t[6];
    int64_t before = cuheap_counters_sum(CUHEAP_CTR_FREES);
    assert_int_equal(pthread_create(&rd, NULL, read_sums, &r), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, counter, (void *)CUHEAP_CTR_FREES), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    atomic_store(&r.stop, 1);
    pthread_join(rd, NULL);
    assert_true(r.monotone);
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_FREES), before + 6 * PER_THREAD);
}

/* A later key's destructor counts after the counters' own destructor handed the block back. */
static pthread_key_t late_key;

static void late_count(void *arg)
{
    (void)arg;
    cuheap_count(CUHEAP_CTR_CALLS, 7);
}

static void *count_then_exit(void *arg)
{
    (void)arg;
    cuheap_count(CUHEAP_CTR_CALLS, 1); /* registers: the counters' key exists from here */
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void test_counts_after_the_block_went_back(void **state)
{
    (void)state;
    cuheap_count(CUHEAP_CTR_CALLS, 0); /* the counters' key first: its destructor runs first */
    assert_int_equal(pthread_key_create(&late_key, late_count), 0);
    int64_t before = cuheap_counters_sum(CUHEAP_CTR_CALLS);
    for (int i = 0; i < 4; i++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, count_then_exit, NULL), 0);
        pthread_join(t, NULL);
    }
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_CALLS), before + 4 * 8);
}

static void test_fork_child_starts_over(void **state)
{
    (void)state;
    cuheap_count(CUHEAP_CTR_ALLOCS, 5);
    cuheap_count(CUHEAP_CTR_CALLS + 1, 2);
    int64_t calls = cuheap_counters_sum(CUHEAP_CTR_CALLS + 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cuheap_counters_atfork_child(CUHEAP_CTR_ALLOCS, CUHEAP_CTR_CALLS);
        bool ok = cuheap_counters_sum(CUHEAP_CTR_ALLOCS) == 0 &&
                  cuheap_counters_sum(CUHEAP_CTR_CALLS + 1) == calls;
        /* threads in the child count and exit as usual */
        pthread_t t;
        ok = ok && pthread_create(&t, NULL, counter, (void *)CUHEAP_CTR_ALLOCS) == 0;
        ok = ok && pthread_join(t, NULL) == 0;
        cuheap_count(CUHEAP_CTR_ALLOCS, 1);
        ok = ok && cuheap_counters_sum(CUHEAP_CTR_ALLOCS) == PER_THREAD + 1;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts))
        ;
}

/* The ticks' clock reads as nanoseconds: a sleep of 30 ms measures as about that. */
static void test_ticks_read_as_nanoseconds(void **state)
{
    (void)state;
    cuheap_clock_start();
    uint64_t t0 = cuheap_ticks();
    sleep_ms(30);
    uint64_t ns = cuheap_ticks_ns((int64_t)(cuheap_ticks() - t0));
    print_message("# 30 ms slept: %llu ns\n", (unsigned long long)ns);
    assert_true(ns >= 29000000 && ns < 1000000000);
    assert_int_equal(cuheap_ticks_ns(0), 0);
    assert_int_equal(cuheap_ticks_ns(-5), 0);
}

/* A timed call's driver calls are counted by kind with their time and taken off its own time;
 * record and query are timed only inside a timed call, the other kinds always. */
static void test_driver_time_is_taken_off_own_time(void **state)
{
    (void)state;
    struct cuheap_counters *c = cuheap_counters_mine();
    assert_non_null(c);
    int64_t own0 = cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_FREE);
    int64_t map0 = cuheap_counters_sum(CUHEAP_CTR_DRV_TICKS + CUHEAP_DRV_MAP);
    int64_t q0 = cuheap_counters_sum(CUHEAP_CTR_DRV_CALLS + CUHEAP_DRV_QUERY);
    int64_t qt0 = cuheap_counters_sum(CUHEAP_CTR_DRV_TIMED + CUHEAP_DRV_QUERY);
    int64_t mapn0 = cuheap_counters_sum(CUHEAP_CTR_DRV_CALLS + CUHEAP_DRV_MAP);
    uint64_t t = cuheap_drv_start(CUHEAP_DRV_QUERY); /* outside a timed call: counted only */
    cuheap_drv_done(CUHEAP_DRV_QUERY, t);
    assert_int_equal(t, 0);
    struct cuheap_own_span span;
    cuheap_own_begin(c, &span);
    t = cuheap_drv_start(CUHEAP_DRV_QUERY);
    cuheap_drv_done(CUHEAP_DRV_QUERY, t);
    t = cuheap_drv_start(CUHEAP_DRV_MAP);
    sleep_ms(40); /* a slow mapping call */
    cuheap_drv_done(CUHEAP_DRV_MAP, t);
    cuheap_own_end(c, &span, CUHEAP_OWN_FREE, 1);
    assert_false(cuheap_own_timing);
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_DRV_CALLS + CUHEAP_DRV_QUERY), q0 + 2);
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_DRV_TIMED + CUHEAP_DRV_QUERY), qt0 + 1);
    assert_int_equal(cuheap_counters_sum(CUHEAP_CTR_DRV_CALLS + CUHEAP_DRV_MAP), mapn0 + 1);
    uint64_t map_ns =
        cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_DRV_TICKS + CUHEAP_DRV_MAP) - map0);
    uint64_t own_ns = cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_FREE) - own0);
    print_message("# map %llu ns, own %llu ns\n", (unsigned long long)map_ns,
                  (unsigned long long)own_ns);
    assert_true(map_ns >= 39000000);
    assert_true(own_ns < 20000000);
}

/* A timed call standing for 32 that the OS took the CPU from (a sleep here) counts once: the
 * calls it stood for did not wait; a short one counts for all of them. */
static void test_long_timed_call_counts_once(void **state)
{
    (void)state;
    struct cuheap_counters *c = cuheap_counters_mine();
    assert_non_null(c);
    int64_t own0 = cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_ALLOC);
    struct cuheap_own_span span;
    cuheap_own_begin(c, &span);
    sleep_ms(20);
    cuheap_own_end(c, &span, CUHEAP_OWN_ALLOC, 32);
    uint64_t ns = cuheap_ticks_ns(cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_ALLOC) - own0);
    print_message("# a 20 ms call standing for 32: %llu ns\n", (unsigned long long)ns);
    assert_true(ns >= 19000000 && ns < 200000000);
    own0 = cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_ALLOC);
    cuheap_own_begin(c, &span);
    cuheap_own_end(c, &span, CUHEAP_OWN_ALLOC, 32);
    int64_t short_ticks = cuheap_counters_sum(CUHEAP_CTR_OWN + CUHEAP_OWN_ALLOC) - own0;
    assert_true(short_ticks > 0 && short_ticks % 32 == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exited_threads_keep_their_counts),
        cmocka_unit_test(test_sums_only_grow_while_threads_count),
        cmocka_unit_test(test_counts_after_the_block_went_back),
        cmocka_unit_test(test_fork_child_starts_over),
        cmocka_unit_test(test_ticks_read_as_nanoseconds),
        cmocka_unit_test(test_driver_time_is_taken_off_own_time),
        cmocka_unit_test(test_long_timed_call_counts_once),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
