/* SPDX-License-Identifier: MIT */
/*
 * The audit's matcher against recorded streams: what cuheap's hooks saw and what CUPTI's
 * memory records (CUPTI_ACTIVITY_KIND_MEMORY2) said, written down line by line in the form
 * the two sides take in a run: pass-through allocations with the pool off, the pool's own
 * arenas, VMM granules and a framework's expandable segment, stream-ordered allocations that
 * CUPTI reports with their memory pool, a program that reaches the driver through a door no
 * hook covers, and records that arrive before the hook recorded its event.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "audit.h"

/* One line of a stream:
 *   seen OP DOOR ADDR SIZE [SIZE_MAX]      a hooked operation (DOOR: passthru pool create map
 * async) driver OP MEMORY ADDR BYTES [corr=N] [stream=N] [pool=ADDR] [async] OP is alloc or
 * release; MEMORY device, pinned, managed, array, static. */
static void feed_line(struct cuheap_audit *a, const char *line)
{
    char side[16], op[16], what[16];
    uint64_t addr, size, size_max = 0;
    int used = 0;
    int n = sscanf(line, "%15s %15s %15s %" SCNx64 " %" SCNu64 "%n", side, op, what, &addr, &size,
                   &used);
    assert_int_equal(n, 5);
    uint8_t o = !strcmp(op, "alloc") ? CUHEAP_AUDIT_ALLOC : CUHEAP_AUDIT_RELEASE;
    const char *rest = line + used;
    if (!strcmp(side, "seen")) {
        static const char *const doors[] = {"passthru", "pool", "create", "map", "async"};
        struct cuheap_audit_seen s = {.op = o, .addr = addr, .size = size, .size_max = size};
        for (uint8_t i = 0; i < 5; i++)
            if (!strcmp(what, doors[i]))
                s.door = i;
        if (sscanf(rest, "%" SCNu64, &size_max) == 1)
            s.size_max = size_max;
        assert_int_equal(cuheap_audit_feed_seen(a, &s), 0);
        return;
    }
    assert_string_equal(side, "driver");
    struct cuheap_audit_driver_op d = {.op = o, .addr = addr, .bytes = size};
    d.memory = !strcmp(what, "device")    ? CUHEAP_AUDIT_MEM_DEVICE
               : !strcmp(what, "pinned")  ? CUHEAP_AUDIT_MEM_PINNED
               : !strcmp(what, "managed") ? CUHEAP_AUDIT_MEM_MANAGED
               : !strcmp(what, "array")   ? CUHEAP_AUDIT_MEM_ARRAY
               : !strcmp(what, "static")  ? CUHEAP_AUDIT_MEM_DEVICE_STATIC
                                          : CUHEAP_AUDIT_MEM_UNKNOWN;
    const char *p;
    if ((p = strstr(rest, "corr=")))
        d.correlation = (uint32_t)strtoul(p + 5, NULL, 10);
    if ((p = strstr(rest, "stream=")))
        d.stream = (uint32_t)strtoul(p + 7, NULL, 10);
    if ((p = strstr(rest, "pool=")))
        d.pool = strtoull(p + 5, NULL, 16);
    d.async = strstr(rest, "async") != NULL;
    if ((p = strstr(rest, "api="))) {
        static char names[64][32];
        static unsigned nr_names;
        char *name = names[nr_names++ % 64];
        sscanf(p + 4, "%31s", name);
        d.api = name;
    }
    assert_int_equal(cuheap_audit_feed_driver(a, &d), 0);
}

static void feed(struct cuheap_audit *a, const char *const *lines)
{
    for (; *lines; lines++)
        feed_line(a, *lines);
}

static struct cuheap_audit_counts counts_of(const struct cuheap_audit *a)
{
    struct cuheap_audit_counts c;
    cuheap_audit_get_counts(a, &c);
    return c;
}

static const char *summary_of(const struct cuheap_audit *a)
{
    static char buf[1024];
    return cuheap_audit_summary(a, 4, buf, sizeof(buf));
}

/* CUHEAP_POOL=0, a cudaMalloc loop: every allocation a pass-through, freed in another order;
 * the second 4 KiB buffer lands where the first was. */
static const char *const pool_off[] = {
    "seen alloc passthru 7f1e4c000000 4096 4096",
    "seen alloc passthru 7f1e4c200000 3145728 4194304",
    "seen release passthru 7f1e4c000000 4096 4096",
    "seen alloc passthru 7f1e4c000000 4096 4096",
    "seen alloc passthru 7f1e4c600000 1000 1024",
    "driver alloc device 7f1e4c000000 4096 corr=11",
    "driver alloc device 7f1e4c200000 3145728 corr=12",
    "driver release device 7f1e4c000000 4096 corr=13",
    "driver alloc device 7f1e4c000000 4096 corr=14",
    "driver alloc device 7f1e4c600000 1000 corr=15",
    "seen release passthru 7f1e4c200000 3145728 4194304",
    "driver release device 7f1e4c200000 3145728 corr=16",
    NULL,
};

static void test_pool_off_all_seen(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed(&a, pool_off);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_driver, 6);
    assert_int_equal(c.nr_matched, 6);
    assert_int_equal(c.nr_missed, 0);
    assert_int_equal(c.nr_unreported, 0);
    assert_int_equal(c.nr_size_differs, 0);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_PASSTHRU], 6);
    assert_string_equal(summary_of(&a), "audit: 6 driver operations, all seen");
    cuheap_audit_destroy(&a);
}

/* CUHEAP_POOL=1 (legacy): the program's small cudaMallocs never reach the driver; cuheap's
 * pool takes a 32 MiB arena, then a 64 MiB one, and a 128 MiB request passes through. Pinned
 * staging memory and a module's __device__ array also appear in CUPTI's stream. */
static const char *const pool_on[] = {
    "seen alloc pool 7f1e40000000 33554432",
    "driver alloc device 7f1e40000000 33554432 corr=7",
    "driver alloc static 7f1e3e000000 65536 corr=0",
    "seen alloc pool 7f1e42000000 67108864",
    "seen alloc passthru 7f1e50000000 134217728 134217728",
    "driver alloc device 7f1e42000000 67108864 corr=52",
    "driver alloc device 7f1e50000000 134217728 corr=53",
    "seen alloc passthru 7f1f20000000 1048576",
    "driver alloc pinned 7f1f20000000 1048576 corr=54",
    "seen release passthru 7f1e50000000 134217728 134217728",
    "driver release device 7f1e50000000 134217728 corr=90",
    "seen release pool 7f1e42000000 67108864",
    "driver release device 7f1e42000000 67108864 corr=91",
    NULL,
};

static void test_pool_arenas_are_seen(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed(&a, pool_on);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_driver, 6); /* the module static is not an allocation call */
    assert_int_equal(c.nr_static, 1);
    assert_int_equal(c.nr_missed, 0);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_POOL], 3);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_PASSTHRU], 3);
    assert_string_equal(summary_of(&a), "audit: 6 driver operations, all seen");
    cuheap_audit_destroy(&a);
}

/* CUHEAP_BACKING=vmm and PyTorch's expandable segments: the pool maps 2 MiB granules and the
 * framework creates and maps a 20 MiB segment. The driver's records carry addresses for the
 * mappings and none (0) for physical memory, which pairs by size with cuMemCreate. */
static const char *const vmm[] = {
    "seen alloc pool 7f0000000000 2097152",
    "seen alloc pool 7f0000200000 2097152",
    "driver alloc device 7f0000000000 2097152 corr=30",
    "driver alloc device 7f0000200000 2097152 corr=31",
    "seen alloc create 0 20971520",
    "seen alloc map 7e0000000000 20971520",
    "driver alloc device 0 20971520 corr=40",
    "driver alloc device 7e0000000000 20971520 corr=41",
    "seen release pool 7f0000000000 2097152",
    "driver release device 7f0000000000 2097152 corr=50",
    "seen release map 7e0000000000 20971520",
    "seen release create 0 20971520",
    "driver release device 7e0000000000 20971520 corr=60",
    "driver release device 0 20971520 corr=61",
    NULL,
};

static void test_vmm_granules_and_segments(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed(&a, vmm);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_driver, 7);
    assert_int_equal(c.nr_missed, 0);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_POOL], 3);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_VMM_CREATE], 2);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_VMM_MAP], 2);
    /* physical memory of another size is another key: not a match */
    feed_line(&a, "driver alloc device 0 4194304 corr=70");
    assert_int_equal(counts_of(&a).nr_missed, 1);
    cuheap_audit_destroy(&a);
}

/* cudaMallocAsync: CUPTI reports each one with its stream and the base of the driver memory
 * pool it came from; the hook saw cuMemAllocAsync / cuMemFreeAsync. */
static const char *const async_pool[] = {
    "seen alloc async 7f2a00000000 1048576 1048576",
    "seen alloc async 7f2a00100000 512 512",
    "driver alloc device 7f2a00000000 1048576 corr=100 stream=13 pool=7f2a00000000 async",
    "driver alloc device 7f2a00100000 512 corr=101 stream=13 pool=7f2a00000000 async",
    "seen release async 7f2a00000000 1048576 1048576",
    "driver release device 7f2a00000000 1048576 corr=102 stream=13 pool=7f2a00000000 async",
    NULL,
};

static void test_async_pool_allocations(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed(&a, async_pool);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_matched, 3);
    assert_int_equal(c.nr_missed, 0);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_ASYNC], 3);
    /* the second buffer is still live: the hook saw it, the driver's release is yet to come */
    assert_int_equal(c.nr_unreported, 0);
    cuheap_audit_destroy(&a);
}

/* The deliberate miss: the program takes cuMemAlloc_v2 with dlvsym(libcuda.so.1), a door no
 * hook covers, between ordinary cudaMallocs, and frees it the same way. */
static const char *const missed[] = {
    "seen alloc passthru 7f1e4c000000 4096 4096",
    "driver alloc device 7f1e4c000000 4096 corr=11",
    "driver alloc device 7f1e60000000 8388608 corr=311 api=cuMemAlloc_v2",
    "seen alloc async 7f2a00000000 1048576 1048576",
    "driver alloc device 7f2a00000000 1048576 corr=312 stream=13 pool=7f2a00000000 async",
    "driver release device 7f1e60000000 8388608 corr=320",
    "driver alloc device 7f2b00000000 65536 corr=330 stream=14 pool=7f2b00000000 async",
    /* the hooked cudaMalloc'd buffer freed through the uncovered door: the hook saw its
     * allocation, not its release, and an allocation is no release */
    "driver release device 7f1e4c000000 4096 corr=340",
    NULL,
};

static void test_a_miss_is_named(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed(&a, missed);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_driver, 6);
    assert_int_equal(c.nr_matched, 2);
    assert_int_equal(c.nr_missed, 4);
    assert_string_equal(
        summary_of(&a),
        "audit: 6 driver operations, 4 not seen by cuheap: "
        "alloc device 0x7f1e60000000 (8.00 MiB, correlation 311, cuMemAlloc_v2); "
        "release device 0x7f1e60000000 (8.00 MiB, correlation 320); "
        "alloc device 0x7f2b00000000 (64.00 KiB, correlation 330, memory pool "
        "0x7f2b00000000); release device 0x7f1e4c000000 (4.00 KiB, correlation 340)");
    struct cuheap_audit_miss m[8];
    assert_int_equal(cuheap_audit_misses(&a, m, 8), 4);
    assert_int_equal(m[0].op.addr, 0x7f1e60000000);
    assert_int_equal(m[0].op.op, CUHEAP_AUDIT_ALLOC);
    assert_int_equal(m[1].op.op, CUHEAP_AUDIT_RELEASE);
    assert_int_equal(m[2].op.pool, 0x7f2b00000000);
    /* a list longer than asked for says how many more */
    char buf[512];
    assert_non_null(strstr(cuheap_audit_summary(&a, 1, buf, sizeof(buf)), "; and 3 more"));
    cuheap_audit_destroy(&a);
}

/* CUPTI hands over its records late, but a buffer can complete between the driver's return
 * and the hook's event: a record that arrives first waits for its hook. */
static void test_driver_record_before_hook(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed_line(&a, "driver alloc device 7f1e4c000000 4096 corr=11");
    assert_int_equal(counts_of(&a).nr_missed, 1);
    feed_line(&a, "seen alloc passthru 7f1e4c000000 4096 4096");
    assert_int_equal(counts_of(&a).nr_missed, 0);
    assert_int_equal(counts_of(&a).nr_matched, 1);
    /* both of the driver's records first, the free through an uncovered door: the hook's
     * allocation pairs with the allocation, and the release is what was missed */
    feed_line(&a, "driver alloc device 7f1e4d000000 4096 corr=20");
    feed_line(&a, "driver release device 7f1e4d000000 4096 corr=21");
    feed_line(&a, "seen alloc passthru 7f1e4d000000 4096 4096");
    struct cuheap_audit_miss m[2];
    assert_int_equal(cuheap_audit_misses(&a, m, 2), 1);
    assert_int_equal(m[0].op.op, CUHEAP_AUDIT_RELEASE);
    assert_int_equal(m[0].op.correlation, 21);
    cuheap_audit_destroy(&a);
}

struct collected {
    unsigned n;
    uint64_t addr[8];
};

static void collect(const struct cuheap_audit_miss *m, void *arg)
{
    struct collected *c = arg;
    if (c->n < 8)
        c->addr[c->n] = m->op.addr;
    c->n++;
}

/* Misses go into the trace as the run goes, but only once they were unmatched for a whole
 * generation (one CUPTI buffer): a hook a moment late is not blamed, a true miss is named
 * once. */
static void test_misses_age_before_they_are_named(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    struct collected c = {0};
    feed_line(&a, "driver alloc device 7f1e4c000000 4096 corr=11");    /* its hook comes late */
    feed_line(&a, "driver alloc device 7f1e60000000 8388608 corr=12"); /* never hooked */
    assert_int_equal(cuheap_audit_age(&a, false, collect, &c), 0);
    feed_line(&a, "seen alloc passthru 7f1e4c000000 4096 4096");
    assert_int_equal(cuheap_audit_age(&a, false, collect, &c), 1);
    assert_int_equal(c.addr[0], 0x7f1e60000000);
    assert_int_equal(cuheap_audit_age(&a, false, collect, &c), 0); /* named once */
    feed_line(&a, "driver alloc device 7f1e70000000 4096 corr=13");
    assert_int_equal(cuheap_audit_age(&a, true, collect, &c), 1); /* at exit: all */
    assert_int_equal(c.addr[1], 0x7f1e70000000);
    assert_int_equal(c.n, 2);
    cuheap_audit_destroy(&a);
}

/* Matched by address, but the driver counted other bytes: still seen, counted apart so the
 * GPU run shows how the driver's sizes relate to the requests. */
static void test_size_difference_is_counted(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    feed_line(&a, "seen alloc passthru 7f1e4c000000 1000 1024");
    feed_line(&a, "driver alloc device 7f1e4c000000 1024 corr=1"); /* the rounding: fits */
    feed_line(&a, "seen alloc passthru 7f1e4d000000 1000 1024");
    feed_line(&a, "driver alloc device 7f1e4d000000 2097152 corr=2");
    feed_line(&a, "seen release passthru 7f1e4e000000 0 0"); /* a free of an unknown size */
    feed_line(&a, "driver release device 7f1e4e000000 4096 corr=3");
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_matched, 3);
    assert_int_equal(c.nr_size_differs, 1);
    assert_int_equal(a.differs_example.bytes, 2097152);
    cuheap_audit_destroy(&a);
}

/* One address handed out three times with three sizes before CUPTI's buffer arrived: each
 * driver record pairs with the hooked operation of its size, not just the first at the
 * address, so no size difference is invented. */
static void test_reused_address_pairs_by_size(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    static const char *const batch[] = {
        "seen alloc passthru 7f1e4c000000 512 512",
        "seen release passthru 7f1e4c000000 512 512",
        "seen alloc async 7f1e4c000000 65536 65536",
        "seen release async 7f1e4c000000 65536 65536",
        "seen alloc passthru 7f1e4c000000 100663296 100663296",
        "driver alloc device 7f1e4c000000 512 corr=1",
        "driver release device 7f1e4c000000 512 corr=2",
        "driver alloc device 7f1e4c000000 65536 corr=3 stream=7 pool=7f1e40000000 async",
        "driver release device 7f1e4c000000 65536 corr=4 stream=7 pool=7f1e40000000 async",
        "driver alloc device 7f1e4c000000 100663296 corr=5",
        NULL,
    };
    feed(&a, batch);
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_matched, 5);
    assert_int_equal(c.nr_size_differs, 0);
    assert_int_equal(c.nr_by_door[CUHEAP_AUDIT_ASYNC], 2);
    cuheap_audit_destroy(&a);
}

/* Many operations in flight: the tables grow, and whatever is left unmatched comes out oldest
 * first, identical ones folded with their count. */
static void test_many_and_order(void **state)
{
    (void)state;
    struct cuheap_audit a;
    assert_int_equal(cuheap_audit_init(&a), 0);
    const unsigned n = 20000;
    for (unsigned i = 0; i < n; i++) {
        struct cuheap_audit_driver_op d = {.op = CUHEAP_AUDIT_ALLOC,
                                           .memory = CUHEAP_AUDIT_MEM_DEVICE,
                                           .addr = 0x7f0000000000ull + (uint64_t)(n - i) * 512,
                                           .bytes = 512,
                                           .correlation = i};
        assert_int_equal(cuheap_audit_feed_driver(&a, &d), 0);
    }
    for (unsigned i = 0; i < n; i += 2) {
        struct cuheap_audit_seen s = {.op = CUHEAP_AUDIT_ALLOC,
                                      .door = CUHEAP_AUDIT_PASSTHRU,
                                      .addr = 0x7f0000000000ull + (uint64_t)(n - i) * 512,
                                      .size = 512,
                                      .size_max = 512};
        assert_int_equal(cuheap_audit_feed_seen(&a, &s), 0);
    }
    struct cuheap_audit_counts c = counts_of(&a);
    assert_int_equal(c.nr_matched, n / 2);
    assert_int_equal(c.nr_missed, n / 2);
    struct cuheap_audit_miss m[3];
    assert_int_equal(cuheap_audit_misses(&a, m, 3), n / 2);
    assert_int_equal(m[0].op.correlation, 1);
    assert_int_equal(m[1].op.correlation, 3);
    assert_int_equal(m[2].op.correlation, 5);
    /* the same physical size three times: one entry, counted three times */
    cuheap_audit_destroy(&a);
    assert_int_equal(cuheap_audit_init(&a), 0);
    for (int i = 0; i < 3; i++)
        feed_line(&a, "driver alloc device 0 2097152 corr=9");
    assert_int_equal(cuheap_audit_misses(&a, m, 3), 1);
    assert_int_equal(m[0].count, 3);
    assert_non_null(strstr(summary_of(&a), "x3"));
    cuheap_audit_destroy(&a);
}

/* ---- the hooks' queue ---- */

#define NR_PRODUCERS 4
#define NR_PUSHES    50000

static struct cuheap_audit_queue queue;

static void *producer(void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 0; i < NR_PUSHES; i++) {
        struct cuheap_audit_seen s = {.op = CUHEAP_AUDIT_ALLOC, .addr = id << 32 | i, .size = i};
        while (!cuheap_audit_queue_push(&queue, &s))
            ; /* the consumer is draining: wait for room */
    }
    return NULL;
}

static void test_queue_many_producers(void **state)
{
    (void)state;
    assert_int_equal(cuheap_audit_queue_init(&queue, 1024), 0);
    pthread_t t[NR_PRODUCERS];
    for (uintptr_t i = 0; i < NR_PRODUCERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, producer, (void *)i), 0);
    uint64_t next[NR_PRODUCERS] = {0}, got = 0;
    while (got < NR_PRODUCERS * NR_PUSHES) {
        struct cuheap_audit_seen s;
        if (!cuheap_audit_queue_pop(&queue, &s))
            continue;
        uint64_t id = s.addr >> 32, i = s.addr & 0xffffffffu;
        assert_true(id < NR_PRODUCERS);
        assert_int_equal(i, next[id]); /* each producer's pushes come out in order, once */
        assert_int_equal(s.size, i);
        next[id]++;
        got++;
    }
    for (int i = 0; i < NR_PRODUCERS; i++)
        pthread_join(t[i], NULL);
    struct cuheap_audit_seen s;
    assert_false(cuheap_audit_queue_pop(&queue, &s));
    cuheap_audit_queue_destroy(&queue);
}

static void test_queue_full_drops_and_counts(void **state)
{
    (void)state;
    struct cuheap_audit_queue q;
    assert_int_equal(cuheap_audit_queue_init(&q, 4), 0);
    struct cuheap_audit_seen s = {.op = CUHEAP_AUDIT_ALLOC};
    for (int i = 0; i < 4; i++)
        assert_true(cuheap_audit_queue_push(&q, &s));
    assert_false(cuheap_audit_queue_push(&q, &s));
    assert_int_equal(atomic_load(&q.nr_dropped), 1);
    assert_true(cuheap_audit_queue_pop(&q, &s));
    assert_true(cuheap_audit_queue_push(&q, &s)); /* room again */
    cuheap_audit_queue_destroy(&q);
    assert_int_equal(cuheap_audit_queue_init(&q, 3), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_off_all_seen),
        cmocka_unit_test(test_pool_arenas_are_seen),
        cmocka_unit_test(test_vmm_granules_and_segments),
        cmocka_unit_test(test_async_pool_allocations),
        cmocka_unit_test(test_a_miss_is_named),
        cmocka_unit_test(test_driver_record_before_hook),
        cmocka_unit_test(test_misses_age_before_they_are_named),
        cmocka_unit_test(test_size_difference_is_counted),
        cmocka_unit_test(test_reused_address_pairs_by_size),
        cmocka_unit_test(test_many_and_order),
        cmocka_unit_test(test_queue_many_producers),
        cmocka_unit_test(test_queue_full_drops_and_counts),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
