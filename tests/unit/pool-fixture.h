/* SPDX-License-Identifier: MIT */
/*
 * The pool's test fixture (test-pool.c): a host backend standing in for the driver, whose
 * fences the test completes by hand and which fails a test that calls it under the pool's
 * lock, and a pool set up over it.
 */
#ifndef CUHEAP_TEST_POOL_FIXTURE_H
#define CUHEAP_TEST_POOL_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#define MIB (1ull << 20)

/* A device of `capacity` bytes of address space (never touched), fences that complete only
 * when the test says so (or when waited on). */
struct host_device {
    pthread_mutex_t lock;
    uint64_t next_addr;
    uint64_t capacity, used;
    int nr_allocs, nr_frees, nr_syncs, nr_waits;
    int nr_fences;
    int nr_idle_checks;                  /* streams_idle asked */
    int nr_infos;                        /* mem_info asked */
    void (*_Atomic on_idle_check)(void); /* called as streams_idle is asked (a test's probe) */
    /* called once, at the first fence query made with no pool lock held (a test's probe) */
    void (*_Atomic on_query_unlocked)(void);
    bool fences_done[4096];
    int fence_refs[4096]; /* record: 1, hold: +1, destroy: -1 (never below 0) */
    /* when gated, a fence wait blocks until the gate opens (waiting says one is blocked); so
     * does a device sync while syncs_gated */
    bool gated, waiting, syncs_gated, maps_gated, allocs_gated;
    int nr_at_map_gate; /* maps that found maps_gated set (each blocked until it opened) */
    /* calls that may take long made while the calling thread held a pool lock (the pool's lock
     * rule: decide under it, call with it dropped); every test's teardown fails on one */
    int nr_under_lock;
    const char *under_lock;
    bool fences_fail; /* fence_record refuses, as the driver does when out of resources */
    /* every fence query answers CUHEAP_BE_NO_ANSWER (a capture's error, refused), or "not yet"
     * however long (stuck); waits and device syncs still pass fences */
    bool queries_refused, queries_stuck;
    int nr_refusals; /* the next that many queries answer CUHEAP_BE_NO_ANSWER */
    bool waits_fail; /* fence waits and device syncs fail and pass nothing */
    /* the next that many address reservations, creates and maps fail (INT_MAX: every one),
     * with fail_result (0: -5, the backend's other failure) */
    int fail_reserve, fail_create, fail_map, fail_result;
    int fail_release;  /* the next that many releases are refused, the memory kept */
    _Atomic bool idle; /* nothing runs: a fence passes as soon as it is recorded */
    pthread_cond_t gate;
    uint64_t sizes[4096]; /* by (addr - base) / 2 MiB: for frees */
    /* vmm: physical memory in multiples of 2 MiB, and a log of what happened in order */
    uint64_t next_va, next_handle;
    uint64_t handle_size[65536]; /* by handle */
    int nr_creates, nr_maps, nr_unmaps, nr_releases;
    /* what is mapped now, as the real driver keeps it: it refuses a map over a mapping
     * (counted in nr_overlaps); an unmap of what is not mapped is counted in nr_bad_unmaps */
    uint64_t map_va[4096], map_size[4096];
    int nr_overlaps, nr_bad_unmaps;
    char log_op[65536];
    uint64_t log_va[65536], log_size[65536];
    unsigned nr_log;
};

static void hd_log(struct host_device *d, char op, uint64_t va, uint64_t size)
{
    if (d->nr_log < 65536) {
        d->log_op[d->nr_log] = op;
        d->log_size[d->nr_log] = size;
        d->log_va[d->nr_log++] = va;
    }
}

/* A call that may take long (memory, mapping, waits, syncs): counted when the calling thread
 * holds a pool lock (d->lock held). */
static void hd_unlocked(struct host_device *d, const char *call)
{
    if (cuheap_pool_lock_held()) {
        d->nr_under_lock++;
        d->under_lock = call;
    }
}

/* Whether log entry i touched [va, va + size). */
static bool hd_logged_in(const struct host_device *d, unsigned i, uint64_t va, uint64_t size)
{
    return d->log_va[i] < va + size && va < d->log_va[i] + d->log_size[i];
}

#define GRANULE (2 * MIB)

/* Whether this call fails by the test's order (*left: calls still to fail; d->lock held). */
static bool hd_fails(struct host_device *d, int *left)
{
    if (*left <= 0)
        return false;
    if (*left != INT_MAX)
        (*left)--;
    return true;
}

static int hd_fail_result(const struct host_device *d)
{
    return d->fail_result ? d->fail_result : -5;
}

static int hd_va_reserve(void *ctx, uint64_t size, uint64_t *ret)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemAddressReserve");
    if (hd_fails(d, &d->fail_reserve)) {
        pthread_mutex_unlock(&d->lock);
        return hd_fail_result(d);
    }
    d->next_va = (d->next_va + size - 1) & ~(size - 1); /* aligned, as a buddy likes it */
    *ret = d->next_va;
    d->next_va += size;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static void hd_va_free(void *ctx, uint64_t va, uint64_t size)
{
    struct host_device *d = ctx;
    (void)va;
    (void)size;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemAddressFree");
    pthread_mutex_unlock(&d->lock);
}

static int hd_phys_create(void *ctx, uint64_t size, uint64_t *ret)
{
    struct host_device *d = ctx;
    assert_true(size && size % GRANULE == 0);
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemCreate");
    if (hd_fails(d, &d->fail_create)) {
        pthread_mutex_unlock(&d->lock);
        return hd_fail_result(d);
    }
    if (d->used + size > d->capacity || d->next_handle + 1 >= 65536) {
        pthread_mutex_unlock(&d->lock);
        return CUHEAP_BE_OOM;
    }
    d->used += size;
    d->nr_creates++;
    *ret = ++d->next_handle;
    d->handle_size[*ret] = size;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_phys_release(void *ctx, uint64_t h)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemRelease");
    assert_true(d->handle_size[h]);
    if (hd_fails(d, &d->fail_release)) {
        pthread_mutex_unlock(&d->lock);
        return hd_fail_result(d);
    }
    d->used -= d->handle_size[h];
    d->handle_size[h] = 0;
    d->nr_releases++;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_phys_map(void *ctx, uint64_t va, uint64_t size, uint64_t h)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemMap");
    if (d->maps_gated)
        d->nr_at_map_gate++;
    while (d->maps_gated) {
        d->waiting = true;
        pthread_cond_wait(&d->gate, &d->lock);
    }
    assert_int_equal(d->handle_size[h], size); /* a handle maps whole, as on the real driver */
    if (hd_fails(d, &d->fail_map)) {           /* as the backend: nothing stays mapped */
        pthread_mutex_unlock(&d->lock);
        return hd_fail_result(d);
    }
    int free_slot = -1;
    for (int i = 0; i < 4096; i++) {
        if (d->map_size[i] && d->map_va[i] < va + size && va < d->map_va[i] + d->map_size[i]) {
            d->nr_overlaps++;
            pthread_mutex_unlock(&d->lock);
            return -5;
        }
        if (!d->map_size[i] && free_slot < 0)
            free_slot = i;
    }
    if (free_slot >= 0) {
        d->map_va[free_slot] = va;
        d->map_size[free_slot] = size;
    }
    d->nr_maps++;
    hd_log(d, 'M', va, size);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_phys_unmap(void *ctx, uint64_t va, uint64_t size)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemUnmap");
    int i = 0;
    while (i < 4096 && !(d->map_va[i] == va && d->map_size[i] == size))
        i++;
    if (i < 4096)
        d->map_size[i] = 0;
    else
        d->nr_bad_unmaps++;
    d->nr_unmaps++;
    hd_log(d, 'U', va, size);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_alloc(void *ctx, uint64_t size, uint64_t *ret)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemAlloc");
    while (d->allocs_gated) {
        d->waiting = true;
        pthread_cond_wait(&d->gate, &d->lock);
    }
    if (d->used + size > d->capacity) {
        pthread_mutex_unlock(&d->lock);
        return CUHEAP_BE_OOM;
    }
    d->used += size;
    d->nr_allocs++;
    *ret = d->next_addr;
    d->sizes[(d->next_addr - (1ull << 44)) / (2 * MIB) % 4096] = size;
    d->next_addr += size + 2 * MIB; /* gaps, like a real driver's spread */
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_free(void *ctx, uint64_t ptr)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "cuMemFree");
    d->used -= d->sizes[(ptr - (1ull << 44)) / (2 * MIB) % 4096];
    d->nr_frees++;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_fence_record(void *ctx, void **ret)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    if (d->fences_fail) {
        pthread_mutex_unlock(&d->lock);
        return -1;
    }
    int id = d->nr_fences++ % 4096;
    for (int tries = 0; d->fence_refs[id] > 0 && tries < 4096; tries++)
        id = (id + 1) % 4096; /* as the driver, never an event still held */
    d->fences_done[id] = atomic_load(&d->idle);
    d->fence_refs[id] = 1;
    pthread_mutex_unlock(&d->lock);
    *ret = (void *)(uintptr_t)(id + 1);
    return 0;
}

/* Nothing runs while the device is idle: every stream answers idle (the pool then needs no
 * fence); otherwise work may still use a freed block. */
static int hd_streams_idle(void *ctx)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    d->nr_idle_checks++;
    pthread_mutex_unlock(&d->lock);
    void (*probe)(void) = atomic_load(&d->on_idle_check);
    if (probe)
        probe();
    return atomic_load(&d->idle);
}

static int hd_fence_query(void *ctx, void *f)
{
    struct host_device *d = ctx;
    if (atomic_load(&d->on_query_unlocked) && !cuheap_pool_lock_held()) {
        void (*probe)(void) = atomic_exchange(&d->on_query_unlocked, NULL);
        if (probe)
            probe();
    }
    pthread_mutex_lock(&d->lock);
    int r = d->queries_refused || (d->nr_refusals > 0 && d->nr_refusals--) ? CUHEAP_BE_NO_ANSWER
            : d->queries_stuck                                             ? 0
                               : d->fences_done[(uintptr_t)f - 1];
    pthread_mutex_unlock(&d->lock);
    return r;
}

static int hd_fence_wait(void *ctx, void *f)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "a fence wait");
    while (d->gated) {
        d->waiting = true;
        pthread_cond_wait(&d->gate, &d->lock);
    }
    d->nr_waits++;
    if (d->waits_fail) {
        pthread_mutex_unlock(&d->lock);
        return -1;
    }
    d->fences_done[(uintptr_t)f - 1] = true;
    hd_log(d, 'W', 0, 0);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static void hd_fence_hold(void *ctx, void *f)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    d->fence_refs[(uintptr_t)f - 1]++;
    pthread_mutex_unlock(&d->lock);
}

static void hd_fence_destroy(void *ctx, void *f)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    int refs = --d->fence_refs[(uintptr_t)f - 1];
    pthread_mutex_unlock(&d->lock);
    if (refs < 0)
        fail_msg("fence %lu let go more often than it was held", (unsigned long)(uintptr_t)f);
}

static int hd_stream_fence(void *ctx, uint64_t s, void **ret)
{
    (void)s;
    return hd_fence_record(ctx, ret);
}

static int hd_sync(void *ctx)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    hd_unlocked(d, "a device sync");
    while (d->syncs_gated) {
        d->waiting = true;
        pthread_cond_wait(&d->gate, &d->lock);
    }
    d->nr_syncs++;
    if (d->waits_fail) {
        pthread_mutex_unlock(&d->lock);
        return -5;
    }
    for (int i = 0; i < 4096; i++) /* the device is idle: every fence has passed */
        d->fences_done[i] = true;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int hd_info(void *ctx, uint64_t *f, uint64_t *t)
{
    struct host_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    d->nr_infos++;
    *f = d->capacity - d->used;
    *t = d->capacity;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static void complete_fences(struct host_device *d)
{
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < 4096; i++)
        d->fences_done[i] = true;
    hd_log(d, 'C', 0, 0);
    pthread_mutex_unlock(&d->lock);
}

struct fixture {
    struct host_device dev;
    struct cuheap_config cfg;
    struct cuheap_pool pool;
    _Atomic uint64_t reserved;
    int notes[CUHEAP_NR_EVENT_TYPES];
};

static struct fixture *current;
static uint64_t fixture_thread_cache; /* CUHEAP_THREAD_CACHE of the next fixture */
/* CUHEAP_VMM_LAYOUT of the next fixture: tight unless a test asks (the vmm tests count driver
 * calls of its rules; WITH_ALIGNED runs the ones that hold under both again, aligned) */
static enum cuheap_vmm_layout fixture_layout = CUHEAP_VMM_TIGHT;
static unsigned fixture_idle_fit = 125; /* CUHEAP_VMM_IDLE_FIT of the next fixture */
/* CUHEAP_VMM_PLACEMENT of the next fixture (WITH_FIRST_FIT runs the vmm tests whose rules hold
 * under either placement again, first fit) */
static enum cuheap_vmm_placement fixture_placement = CUHEAP_PLACE_SCORED;
static uint64_t fixture_vmm_chunk = 8 * MIB; /* CUHEAP_VMM_CHUNK of the next fixture */

static void note(struct cuheap_pool *p, const struct cuheap_pool_note *n)
{
    (void)p;
    current->notes[n->type]++;
}

static const char *no_env(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return NULL;
}

static void no_warn(const char *line, void *arg)
{
    (void)line;
    (void)arg;
}

static bool fixture_no_vmm; /* the device has no VMM: granule 0 */

static struct fixture *setup_backing(enum cuheap_reuse reuse, uint64_t capacity, uint64_t arena,
                                     uint64_t limit, enum cuheap_backing backing)
{
    struct fixture *f = calloc(1, sizeof(*f));
    current = f;
    pthread_mutex_init(&f->dev.lock, NULL);
    f->dev.next_addr = 1ull << 44;
    f->dev.capacity = capacity;
    cuheap_config_parse(&f->cfg, no_env, no_warn, NULL);
    f->cfg.reuse = reuse;
    f->cfg.arena_size = arena;
    f->cfg.pool_max = arena / 2;
    f->cfg.fence_batch = 4;
    f->cfg.backing = backing;
    f->cfg.vmm_chunk = fixture_vmm_chunk;
    /* off unless a test asks: the pool's own rules are tested without a cache in front */
    f->cfg.thread_cache = fixture_thread_cache;
    f->cfg.vmm_layout = fixture_layout;
    f->cfg.vmm_idle_fit = fixture_idle_fit;
    f->cfg.vmm_placement = fixture_placement;
    f->dev.next_va = 1ull << 46;
    struct cuheap_backend be = {
        .ctx = &f->dev,
        .mem_alloc = hd_alloc,
        .mem_free = hd_free,
        .fence_record = hd_fence_record,
        .fence_query = hd_fence_query,
        .fence_wait = hd_fence_wait,
        .fence_hold = hd_fence_hold,
        .fence_destroy = hd_fence_destroy,
        .streams_idle = hd_streams_idle,
        .stream_fence_record = hd_stream_fence,
        .device_sync = hd_sync,
        .mem_info = hd_info,
        .granule = fixture_no_vmm ? 0 : GRANULE,
        .va_reserve = hd_va_reserve,
        .va_free = hd_va_free,
        .phys_create = hd_phys_create,
        .phys_release = hd_phys_release,
        .phys_map = hd_phys_map,
        .phys_unmap = hd_phys_unmap,
    };
    assert_int_equal(cuheap_pool_init(&f->pool, &f->cfg, &be, 0, limit, &f->reserved, note, f), 0);
    return f;
}

static struct fixture *setup(enum cuheap_reuse reuse, uint64_t capacity, uint64_t arena,
                             uint64_t limit)
{
    return setup_backing(reuse, capacity, arena, limit, CUHEAP_BACKING_LEGACY);
}

static void teardown(struct fixture *f)
{
    char why[256];
    if (cuheap_pool_check(&f->pool, why, sizeof(why)))
        fail_msg("pool invariant: %s", why);
    cuheap_pool_trim(&f->pool, false);
    /* every fence the pool recorded is let go once nothing waits for it */
    int held = 0;
    for (int i = 0; i < 4096; i++)
        held += f->dev.fence_refs[i] > 0;
    if (held)
        fail_msg("%d fences still held after a trim", held);
    if (f->dev.nr_under_lock)
        fail_msg("%d driver calls made under the pool's lock (the last: %s)", f->dev.nr_under_lock,
                 f->dev.under_lock);
    if (f->dev.nr_overlaps || f->dev.nr_bad_unmaps)
        fail_msg("%d maps over a mapping, %d unmaps of nothing mapped", f->dev.nr_overlaps,
                 f->dev.nr_bad_unmaps);
    cuheap_pool_forget(&f->pool);
    free(f);
}

static uint64_t alloc(struct fixture *f, uint64_t size, uint64_t stream)
{
    uint64_t ptr, block, seq;
    int r = cuheap_pool_alloc(&f->pool, size, stream, &ptr, &block, &seq);
    assert_int_equal(r, 0);
    assert_true(block >= size);
    assert_int_equal(ptr % 512, 0);
    assert_ptr_equal(cuheap_pool_of(ptr), &f->pool);
    return ptr;
}

static void release(struct fixture *f, uint64_t ptr, uint64_t stream)
{
    uint64_t size, block, seq;
    assert_int_equal(cuheap_pool_free(&f->pool, ptr, stream, &size, &block, &seq), 0);
}

static struct fixture *setup_vmm(enum cuheap_reuse reuse, uint64_t capacity, uint64_t limit)
{
    struct fixture *f = setup_backing(reuse, capacity, 256 * MIB, limit, CUHEAP_BACKING_VMM);
    f->cfg.pool_max = 1ull << 30;
    assert_true(f->pool.vmm);
    return f;
}

/* The driver calls the vmm pool made on physical memory so far: create, map, unmap, release. */
static int mapping_calls(const struct fixture *f)
{
    return f->dev.nr_creates + f->dev.nr_maps + f->dev.nr_unmaps + f->dev.nr_releases;
}

static void check_invariants(struct fixture *f)
{
    char why[256];
    if (cuheap_pool_check(&f->pool, why, sizeof(why)))
        fail_msg("pool invariant: %s", why);
}

/* The cases of tests[0..n) this process runs: all, or with POOL_TEST_SHARD=i/n every n-th from
 * the i-th, so that n processes share them (tests/meson.build runs the pool's cases as two
 * processes: minutes under the sanitizers, the runs' longest),
 * POOL_TEST_FILTER picks cases by name (a pattern), when chasing one or for a test of its own,
 * and POOL_TEST_SKIP leaves cases out by name. */
static int run_pool_tests(const struct CMUnitTest *tests, size_t n)
{
    cmocka_set_message_output(CM_OUTPUT_TAP);
    if (getenv("POOL_TEST_FILTER"))
        cmocka_set_test_filter(getenv("POOL_TEST_FILTER"));
    if (getenv("POOL_TEST_SKIP"))
        cmocka_set_skip_filter(getenv("POOL_TEST_SKIP"));
    struct CMUnitTest *shard = calloc(n, sizeof(*shard));
    unsigned i = 0, of = 1;
    const char *sh = getenv("POOL_TEST_SHARD");
    if (!shard || (sh && (sscanf(sh, "%u/%u", &i, &of) != 2 || !of || i >= of))) {
        fprintf(stderr, "POOL_TEST_SHARD=%s is not i/n with i < n\n", sh ? sh : "");
        free(shard);
        return 2;
    }
    size_t nr = 0;
    for (size_t k = 0; k < n; k++)
        if (k % of == i)
            shard[nr++] = tests[k];
    int r = _cmocka_run_group_tests("tests", shard, nr, NULL, NULL);
    free(shard);
    return r;
}

#pragma GCC diagnostic pop

#endif
