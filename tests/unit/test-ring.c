/* SPDX-License-Identifier: MIT */
/* The event ring: order, exact drop counts when full, no loss with many producers, memory
 * made resident by the consumer just ahead of the producers, without losing events. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "ring.h"

static void push(struct cuheap_ring *r, uint64_t seq, uint32_t tid, bool expect_ok)
{
    struct cuheap_event *ev = cuheap_ring_claim(r);
    if (!expect_ok) {
        assert_null(ev);
        return;
    }
    assert_non_null(ev);
    ev->seq = seq;
    ev->tid = tid;
    cuheap_ring_commit(r, ev);
}

static void test_fifo_and_exact_drops(void **state)
{
    (void)state;
    struct cuheap_ring r;
    assert_int_equal(cuheap_ring_init(&r, 100), -22);
    assert_int_equal(cuheap_ring_init(&r, 64), 0);
    for (uint64_t i = 0; i < 64; i++)
        push(&r, i, 0, true);
    for (uint64_t i = 0; i < 10; i++)
        push(&r, 1000 + i, 0, false); /* full: dropped, never blocks */
    assert_int_equal(atomic_load(&r.nr_dropped), 10);
    for (uint64_t i = 0; i < 64; i++) {
        struct cuheap_event *ev = cuheap_ring_peek(&r);
        assert_non_null(ev);
        assert_int_equal(ev->seq, i);
        cuheap_ring_consume(&r);
    }
    assert_null(cuheap_ring_peek(&r));
    push(&r, 7, 0, true); /* room again after draining */
    assert_int_equal(cuheap_ring_peek(&r)->seq, 7);
    cuheap_ring_destroy(&r);
}

#define NR_PRODUCERS 8
#define PER_PRODUCER 200000

struct shared {
    struct cuheap_ring ring;
    _Atomic int done;
};

static void *producer(void *arg)
{
    struct shared *s = arg;
    static _Atomic uint32_t next_id;
    uint32_t id = atomic_fetch_add(&next_id, 1);
    for (uint64_t i = 0; i < PER_PRODUCER; i++) {
        struct cuheap_event *ev;
        while (!(ev = cuheap_ring_claim(&s->ring)))
            ; /* the test retries; hooks never do */
        ev->seq = i;
        ev->tid = id;
        cuheap_ring_commit(&s->ring, ev);
    }
    atomic_fetch_add(&s->done, 1);
    return NULL;
}

static void test_many_producers_lose_nothing(void **state)
{
    (void)state;
    struct shared *s = calloc(1, sizeof(*s));
    assert_int_equal(cuheap_ring_init(&s->ring, 1 << 12), 0);
    pthread_t t[NR_PRODUCERS];
    for (int i = 0; i < NR_PRODUCERS; i++)
        pthread_create(&t[i], NULL, producer, s);
    uint64_t next[NR_PRODUCERS] = {0}, total = 0;
    while (total < (uint64_t)NR_PRODUCERS * PER_PRODUCER) {
        struct cuheap_event *ev = cuheap_ring_peek(&s->ring);
        if (!ev)
            continue;
        assert_true(ev->tid < NR_PRODUCERS);
        /* each producer's events come out in the order it pushed them */
        assert_int_equal(ev->seq, next[ev->tid]);
        next[ev->tid]++;
        total++;
        cuheap_ring_consume(&s->ring);
    }
    for (int i = 0; i < NR_PRODUCERS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(next[i], PER_PRODUCER);
    }
    assert_null(cuheap_ring_peek(&s->ring));
    cuheap_ring_destroy(&s->ring);
    free(s);
}

static void *dropper(void *arg)
{
    struct cuheap_ring *r = arg;
    for (int i = 0; i < 10000; i++) {
        struct cuheap_event *ev = cuheap_ring_claim(r);
        if (ev)
            cuheap_ring_commit(r, ev);
    }
    return NULL;
}

static void test_drop_count_is_exact_under_contention(void **state)
{
    (void)state;
    struct cuheap_ring r;
    assert_int_equal(cuheap_ring_init(&r, 1024), 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, dropper, &r);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    /* nobody consumed: exactly capacity events got in, the rest were counted as dropped */
    assert_int_equal(cuheap_ring_nr_pushed(&r), 1024);
    assert_int_equal(atomic_load(&r.nr_dropped), 40000 - 1024);
    cuheap_ring_destroy(&r);
}

/* Pages of the ring's mapping resident now. */
static size_t resident_pages(const struct cuheap_ring *r)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (r->map_bytes + page - 1) / page, nr = 0;
    unsigned char *vec = malloc(n);
    assert_int_equal(mincore(r->slots, r->map_bytes, vec), 0);
    for (size_t i = 0; i < n; i++)
        nr += vec[i] & 1;
    free(vec);
    return nr;
}

/* A fresh ring holds no memory; the consumer keeps the pages just ahead of the producers
 * resident (so that producers filling it the first time take no page faults) and no more,
 * without disturbing events already in it, until all of it is; a forked child's reset gives it
 * all back. */
static void test_populated_ahead_of_the_producers(void **state)
{
    (void)state;
    struct cuheap_ring r;
    assert_int_equal(cuheap_ring_init(&r, 1 << 12), 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), all = (r.map_bytes + page - 1) / page;
    size_t ahead = 64 * 1024, slot = sizeof(struct cuheap_ring_slot);
    assert_int_equal(resident_pages(&r), 0);
    for (uint64_t i = 0; i < 300; i++)
        push(&r, i, 7, true);
    assert_true(cuheap_ring_populate(&r, ahead));
    size_t now = resident_pages(&r);
    assert_true(now * page >= 300 * slot + ahead);
    assert_true(now < all);
    assert_true(cuheap_ring_populate(&r, ahead)); /* no new events: nothing more */
    assert_int_equal(resident_pages(&r), now);
    for (uint64_t i = 0; i < 300; i++) { /* the events under the new pages are whole */
        struct cuheap_event *ev = cuheap_ring_peek(&r);
        assert_non_null(ev);
        assert_int_equal(ev->seq, i);
        assert_int_equal(ev->tid, 7);
        cuheap_ring_consume(&r);
    }
    /* once round the ring, it is all resident and the consumer is done */
    uint64_t seq = 300;
    bool more = true;
    while (seq < 300 + (1 << 12)) {
        push(&r, seq, 7, true);
        more = cuheap_ring_populate(&r, ahead);
        assert_int_equal(cuheap_ring_peek(&r)->seq, seq);
        cuheap_ring_consume(&r);
        seq++;
    }
    assert_false(more);
    assert_int_equal(resident_pages(&r), all);
    push(&r, 99, 0, true);
    cuheap_ring_reset(&r);
    assert_int_equal(resident_pages(&r), 0);
    assert_null(cuheap_ring_peek(&r));
    push(&r, 5, 0, true);
    assert_int_equal(cuheap_ring_peek(&r)->seq, 5);
    assert_true(cuheap_ring_populate(&r, ahead)); /* the child's writer starts over */
    cuheap_ring_destroy(&r);
}

/* Around the ring several times: the turns of reused slots stay right. */
static void test_wraps_around(void **state)
{
    (void)state;
    struct cuheap_ring r;
    assert_int_equal(cuheap_ring_init(&r, 8), 0);
    for (uint64_t i = 0; i < 100; i++) {
        for (uint64_t k = 0; k < 5; k++)
            push(&r, i * 5 + k, 0, true);
        for (uint64_t k = 0; k < 5; k++) {
            assert_int_equal(cuheap_ring_peek(&r)->seq, i * 5 + k);
            cuheap_ring_consume(&r);
        }
    }
    for (uint64_t k = 0; k < 8; k++)
        push(&r, k, 0, true);
    push(&r, 8, 0, false);
    cuheap_ring_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_and_exact_drops),
        cmocka_unit_test(test_many_producers_lose_nothing),
        cmocka_unit_test(test_drop_count_is_exact_under_contention),
        cmocka_unit_test(test_populated_ahead_of_the_producers),
        cmocka_unit_test(test_wraps_around),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
