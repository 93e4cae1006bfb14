/* SPDX-License-Identifier: MIT */
/*
 * The preload library in a process, against the simulated driver: every door reaches the
 * hooks, each call is one event, errors pass through, pooled pointers answer queries
 * consistently, reuse is stream-safe under each policy, out-of-memory and limits behave like
 * the driver. This binary links libcuheap.so ahead of libcuda.so.1, which interposes exactly
 * as LD_PRELOAD does; meson runs it once per configuration (CUHEAP_* in its environment).
 */
#include <cuheap/cuheap.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define DOOR_LINKED 1
#include "../programs/driver_api.h"
#include "../programs/race.h"
#include "fakecuda.h"

#undef cuGetProcAddress

#define MIB (1ull << 20)

static struct driver_api cu;
static fakecuda_calls_fn fake_calls;
static bool pool_on, limit_on, small_device, vmm;
static const char *reuse = "fence";

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int setup(void **state)
{
    (void)state;
    if (driver_api_start(&cu, 0))
        return -1;
    *(void **)&fake_calls = dlsym(RTLD_DEFAULT, "fakecuda_calls");
    pool_on = strcmp(env_or("CUHEAP_POOL", "1"), "0") != 0;
    reuse = env_or("CUHEAP_REUSE", "fence");
    limit_on = getenv("CUHEAP_LIMIT") != NULL;
    small_device = getenv("FAKECUDA_DEVICE_MEM") != NULL;
    vmm = !strcmp(env_or("CUHEAP_BACKING", "vmm"), "vmm");
    return fake_calls ? 0 : -1;
}

/* A request just above CUHEAP_POOL_MAX: served by the driver, not the pool. */
static size_t big_size(void)
{
    const char *v = getenv("CUHEAP_POOL_MAX");
    size_t pool_max = v ? (size_t)strtoull(v, NULL, 10) * MIB : 64 * MIB; /* "NM" here */
    return pool_max + 4 * MIB;
}

static struct cuheap_stats stats(void)
{
    struct cuheap_stats s;
    assert_int_equal(cuheap_get_stats(&s, sizeof(s)), 0);
    return s;
}

/* ---- doors ---- */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

static void alloc_free_through(alloc_fn a, free_fn f)
{
    uint64_t calls_before = cuheap_call_count("cuMemAlloc_v2");
    uint64_t frees_before = cuheap_call_count("cuMemFree_v2");
    struct cuheap_stats before = stats();
    unsigned long driver_before = fake_calls(FAKECUDA_CALL_MEM_ALLOC);
    CUdeviceptr p;
    assert_int_equal(a(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(cuheap_call_count("cuMemAlloc_v2"), calls_before + 1);
    struct cuheap_stats after = stats();
    assert_int_equal(after.nr_allocs, before.nr_allocs + 1); /* one call, one event */
    if (pool_on) /* the pool served it: arenas (legacy) or granules (vmm), no cuMemAlloc */
        assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_ALLOC) - driver_before,
                         vmm ? 0 : after.nr_arenas - before.nr_arenas);
    else
        assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_ALLOC), driver_before + 1);
    assert_int_equal(f(p), CUDA_SUCCESS);
    assert_int_equal(cuheap_call_count("cuMemFree_v2"), frees_before + 1);
    assert_int_equal(stats().nr_frees, after.nr_frees + 1);
}

static void test_door_linked(void **state)
{
    (void)state;
    alloc_free_through(cuMemAlloc_v2, cuMemFree_v2);
}

static void test_door_dlsym(void **state)
{
    (void)state;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    alloc_fn a;
    free_fn f;
    *(void **)&a = dlsym(h, "cuMemAlloc_v2");
    *(void **)&f = dlsym(h, "cuMemFree_v2");
    alloc_free_through(a, f);
    /* RTLD_NEXT and RTLD_DEFAULT lead to the hooks too */
    *(void **)&a = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    *(void **)&f = dlsym(RTLD_NEXT, "cuMemFree_v2");
    alloc_free_through(a, f);
    /* names that merely start with "cu" are not driver names and pass untouched */
    assert_null(dlsym(h, "cudnnCreate"));
    assert_non_null(dlsym(RTLD_DEFAULT, "malloc"));
}

static gpa_fn procaddr(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    gpa_fn g;
    *(void **)&g = dlsym(h, "cuGetProcAddress_v2");
    assert_non_null(g);
    return g;
}

static void test_door_procaddr(void **state)
{
    (void)state;
    gpa_fn gpa = procaddr();
    alloc_fn a;
    free_fn f;
    CUdriverProcAddressQueryResult st;
    assert_int_equal(gpa("cuMemAlloc", (void **)&a, 12000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(gpa("cuMemFree", (void **)&f, 12000, 0, &st), CUDA_SUCCESS);
    alloc_free_through(a, f);
    /* asking the lookup for itself returns the hook, so later lookups stay hooked */
    gpa_fn again;
    assert_int_equal(gpa("cuGetProcAddress", (void **)&again, 12000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(again("cuMemAlloc", (void **)&a, 12000, 0, &st), CUDA_SUCCESS);
    alloc_free_through(a, f);
    /* unknown names: the driver's answer unchanged */
    void *none;
    assert_int_equal(gpa("cuNoSuchThing", &none, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

static void test_procaddr_per_thread_twins(void **state)
{
    (void)state;
    gpa_fn gpa = procaddr();
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUdriverProcAddressQueryResult st;
    assert_int_equal(gpa("cuMemAllocAsync", (void **)&alloc_async, 12000,
                         CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                     CUDA_SUCCESS);
    assert_int_equal(gpa("cuMemFreeAsync", (void **)&free_async, 12000,
                         CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                     CUDA_SUCCESS);
    uint64_t ptsz = cuheap_call_count("cuMemAllocAsync_ptsz");
    uint64_t legacy = cuheap_call_count("cuMemAllocAsync");
    CUdeviceptr p;
    assert_int_equal(alloc_async(&p, 1 << 16, NULL), CUDA_SUCCESS);
    assert_int_equal(free_async(p, NULL), CUDA_SUCCESS);
    assert_int_equal(cuheap_call_count("cuMemAllocAsync_ptsz"), ptsz + 1);
    assert_int_equal(cuheap_call_count("cuMemAllocAsync"), legacy);
    assert_int_equal(cuheap_call_count("cuMemFreeAsync_ptsz") >= 1, 1);
}

/* ---- errors pass through ---- */

static void test_errors_pass_through(void **state)
{
    (void)state;
    assert_int_equal(cu.cuMemFree_v2((CUdeviceptr)0x1234), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemFree_v2(0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc_v2(NULL, 100), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemAlloc_v2(&p, 1000), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p + 512), CUDA_ERROR_INVALID_VALUE); /* interior */
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE); /* double free */
    size_t pitch;
    assert_int_equal(cu.cuMemAllocPitch_v2(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
    /* sizes whose rounding would wrap: the driver's refusal, never a crash or a success */
    assert_int_equal(cu.cuMemAllocPitch_v2(&p, &pitch, SIZE_MAX - 10, 2, 4),
                     CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cu.cuMemAllocPitch_v2(&p, &pitch, 1 << 20, SIZE_MAX / 4096, 4),
                     CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cu.cuMemAlloc_v2(&p, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cu.cuMemAlloc_v2(&p, SIZE_MAX - (1u << 20)), CUDA_ERROR_OUT_OF_MEMORY);
    /* without a current context the driver says so, hooks or not */
    CUcontext none = NULL;
    CUcontext ctx;
    CUdevice dev;
    assert_int_equal(cu.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxSetCurrent(none), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc_v2(&p, 1000), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* ---- queries on pooled pointers ---- */

static void test_pointer_queries_agree(void **state)
{
    (void)state;
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 3000), CUDA_SUCCESS);
    CUdeviceptr base;
    size_t size;
    assert_int_equal(cu.cuMemGetAddressRange_v2(&base, &size, p + 2999), CUDA_SUCCESS);
    assert_int_equal(base, p);
    assert_int_equal(size, 3000);
    CUdeviceptr start;
    size_t rsize;
    unsigned long long id1, id2;
    assert_int_equal(
        cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 10),
        CUDA_SUCCESS);
    assert_int_equal(cu.cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 10),
                     CUDA_SUCCESS);
    assert_int_equal(cu.cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p),
                     CUDA_SUCCESS);
    assert_int_equal(start, base);
    assert_int_equal(rsize, size);
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                    CU_POINTER_ATTRIBUTE_BUFFER_ID};
    CUdeviceptr s2 = 0;
    size_t z2 = 0;
    unsigned long long i2 = 0;
    void *data[3] = {&s2, &z2, &i2};
    CUresult (*get_attrs)(unsigned, CUpointer_attribute *, void **, CUdeviceptr) =
        cuPointerGetAttributes;
    assert_int_equal(get_attrs(3, attrs, data, p + 100), CUDA_SUCCESS);
    assert_int_equal(s2, base);
    assert_int_equal(z2, size);
    assert_int_equal(i2, id1);
    int mem_type = 0;
    assert_int_equal(cu.cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
                     CUDA_SUCCESS);
    assert_int_equal(mem_type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
    CUdeviceptr q;
    assert_int_equal(cu.cuMemAlloc_v2(&q, 3000), CUDA_SUCCESS);
    assert_int_equal(cu.cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q),
                     CUDA_SUCCESS);
    assert_int_not_equal(id1, id2); /* a new allocation, even at a reused address */
    assert_int_equal(cu.cuMemFree_v2(q), CUDA_SUCCESS);
}

/* A handle shares exactly the block asked for, or is refused. vmm pools hand out cuheap's own
 * handles (opened in another process by tests/programs/ipc_prog.c, test `ipc`); legacy arenas
 * the driver's, for a block at an arena's start only; pass-through memory the driver's. */
static void test_ipc_never_shares_wrong_bytes(void **state)
{
    (void)state;
    unsigned long long (*ipc_base)(const CUipcMemHandle *);
    *(void **)&ipc_base = dlsym(RTLD_DEFAULT, "fakecuda_ipc_handle_base");
    assert_non_null(ipc_base);
    CUdeviceptr small[2];
    assert_int_equal(cu.cuMemAlloc_v2(&small[0], 4096), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc_v2(&small[1], 4096), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CUipcMemHandle h;
        CUresult r = cuIpcGetMemHandle(&h, small[i]);
        if (pool_on && vmm) {
            assert_int_equal(r, CUDA_SUCCESS);
            assert_int_equal(ipc_base(&h), 0); /* not the driver's: it would share an arena */
            CUdeviceptr opened;
            /* like the driver's, not in the process that made it */
            assert_int_equal(cuIpcOpenMemHandle_v2(&opened, h, 0), CUDA_ERROR_INVALID_CONTEXT);
        } else if (r == CUDA_SUCCESS) {
            /* either the handle opens exactly at this pointer, or the driver's refusal */
            assert_int_equal(ipc_base(&h), small[i]);
        } else {
            assert_int_equal(r, CUDA_ERROR_INVALID_VALUE);
        }
    }
    if (pool_on && !vmm && !small_device) {
        CUipcMemHandle h;
        assert_int_equal(cuIpcGetMemHandle(&h, small[1]), CUDA_ERROR_INVALID_VALUE);
    }
    CUdeviceptr big;
    assert_int_equal(cu.cuMemAlloc_v2(&big, big_size()), CUDA_SUCCESS);
    CUipcMemHandle h;
    assert_int_equal(cuIpcGetMemHandle(&h, big), CUDA_SUCCESS);
    assert_int_equal(ipc_base(&h), big);
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(small[0]), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(small[1]), CUDA_SUCCESS);
}

static void test_mem_info(void **state)
{
    (void)state;
    size_t f, t;
    assert_int_equal(cu.cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    if (limit_on) {
        assert_int_equal(t, 96 * MIB); /* CUHEAP_LIMIT=96M in this configuration */
        assert_true(f <= t);
        return;
    }
    size_t dev_total = small_device ? 256 * MIB : 4096 * MIB;
    assert_int_equal(t, dev_total); /* no limit: the driver's own figures */
    assert_true(f <= t);
}

/* ---- stream safety ---- */

/* ---- stream safety: a freed block is not reused while earlier work may still read it ---- */

/* Under `immediate` the pool reuses at once: the race the other policies prevent, shown to
 * be visible to these tests. And the freed block must come back once the reader is done, or
 * the tests prove nothing: the legacy backing's race tests once never got it back (the other
 * frees stayed in a thread cache and the block's fence batch never closed). Whether one run
 * gets it back depends on the buddy's order and the timing (under sanitizers two stream kinds
 * of six missed it once), so test_races_saw_the_block_back asks it of the configuration. */
static int races_run, races_came_back;

static void expect_race_outcome(const char *kind, struct race_result r)
{
    races_run++;
    races_came_back += r.came_back || r.full;
    if (r.error)
        fail_msg("%s: a driver call failed with %d", kind, r.error);
    if (pool_on && !strcmp(reuse, "immediate")) {
        if (!r.changed)
            fail_msg("%s: immediate reuse should have overwritten the reader's bytes", kind);
    } else if (r.changed || r.reused_early) {
        fail_msg("%s: %zu bytes changed under the reader (block reused early: %d)", kind, r.changed,
                 r.reused_early);
    }
}

static void test_races_saw_the_block_back(void **state)
{
    (void)state;
    if (pool_on && races_run && !races_came_back)
        fail_msg("in none of %d races did the freed block come back, even after the reader: "
                 "these tests could not have seen an early reuse",
                 races_run);
}

static void test_race_non_blocking_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    expect_race_outcome("non-blocking stream", race_on_stream(&cu, s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* A stream destroyed right after the free while its kernel still reads the block: the work
 * runs on, and fences recorded later must still wait for it (issue 12, fault runs). */
static void test_race_destroyed_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    expect_race_outcome("destroyed non-blocking stream", race_run(&cu, s, true));
}

static void test_race_priority_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -1), CUDA_SUCCESS);
    expect_race_outcome("stream with a priority", race_on_stream(&cu, s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_race_per_thread_default_stream(void **state)
{
    (void)state;
    expect_race_outcome("per-thread default stream", race_on_stream(&cu, CU_STREAM_PER_THREAD));
}

static void test_race_blocking_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    expect_race_outcome("blocking stream", race_on_stream(&cu, s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* A destroyed stream's work still completes; a stream created afterwards at the same address
 * must be fenced as well. */
static void test_race_after_stream_churn(void **state)
{
    (void)state;
    for (int i = 0; i < 8; i++) {
        CUstream s;
        assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
    test_race_non_blocking_stream(state);
}

/* The pluggable allocator reuses a block at once on the stream that freed it, never on
 * another stream before a fence. */
static void test_race_pluggable_other_stream(void **state)
{
    (void)state;
    CUstream s1, s2;
    assert_int_equal(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    unsigned char *a = cuheap_torch_alloc(RACE_BLOCK, 0, s1);
    assert_non_null(a);
    memset(a, RACE_OLD_PATTERN, RACE_BLOCK);
    struct race_reader reader = {a, RACE_BLOCK, RACE_READER_MS, 0, false};
    assert_int_equal(cu.cuLaunchHostFunc(s1, race_read, &reader), CUDA_SUCCESS);
    cuheap_torch_free(a, RACE_BLOCK, 0, s1);
    void *got[RACE_NR_REUSE];
    int n = 0;
    bool early = false;
    for (; n < RACE_NR_REUSE; n++) {
        got[n] = cuheap_torch_alloc(RACE_BLOCK, 0, s2);
        if (!got[n] && limit_on)
            break; /* the limit is reached: that is all the reuse there is */
        assert_non_null(got[n]);
        memset(got[n], RACE_NEW_PATTERN, RACE_BLOCK);
        if (got[n] == a && !atomic_load(&reader.done)) {
            early = true;
            n++;
            break;
        }
    }
    assert_int_equal(cu.cuStreamSynchronize(s1), CUDA_SUCCESS);
    /* the stream cache keeps other streams off the block, under every policy */
    assert_false(early);
    assert_int_equal(reader.changed, 0);
    while (n > 0)
        cuheap_torch_free(got[--n], RACE_BLOCK, 0, s2);
    assert_int_equal(cu.cuStreamDestroy_v2(s1), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy_v2(s2), CUDA_SUCCESS);
}

/* ---- out of memory and limits ---- */

static void test_out_of_memory(void **state)
{
    (void)state;
    /* 256 MiB device: fill it with 8 MiB blocks until the driver says no */
    CUdeviceptr p[64];
    int n = 0;
    CUresult r;
    while (n < 64 && (r = cu.cuMemAlloc_v2(&p[n], 8 * MIB)) == CUDA_SUCCESS)
        n++;
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY); /* the driver's code, unchanged */
    assert_true(n >= 24);                          /* most of the device was usable */
    assert_true(stats().nr_ooms >= 1);
    /* the peak held counts the pool's growth (the pool moves reserved bytes itself) */
    assert_true(stats().peak_reserved_bytes >= (uint64_t)n * 8 * MIB);
    for (int i = 0; i < n; i++)
        assert_int_equal(cu.cuMemFree_v2(p[i]), CUDA_SUCCESS);
    /* the program frees and goes on: a large request needs the pool to give arenas back */
    CUdeviceptr big;
    assert_int_equal(cu.cuMemAlloc_v2(&big, 200 * MIB), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
    /* what the summary reports held: never more than the device (a GPU log once said 250 GiB
     * on a 140 GiB device) */
    assert_true(stats().peak_reserved_bytes <= 256 * MIB);
    assert_int_equal(cu.cuMemAlloc_v2(&p[0], 8 * MIB), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p[0]), CUDA_SUCCESS);
}

/* Fill the pool until the driver says no, then free everything: the pool now holds the
 * device in empty arenas (or blocks waiting for a fence). */
static void fill_pool_and_free(void)
{
    CUdeviceptr p[64];
    int n = 0;
    while (n < 64 && cu.cuMemAlloc_v2(&p[n], 8 * MIB) == CUDA_SUCCESS)
        n++;
    assert_true(n >= 24);
    for (int i = 0; i < n; i++)
        assert_int_equal(cu.cuMemFree_v2(p[i]), CUDA_SUCCESS);
}

/* Whatever door a large request takes to the driver, the pool gives its empty arenas back and
 * the request is retried before the program sees CUDA_ERROR_OUT_OF_MEMORY: what the driver
 * alone would give. */
static void test_out_of_memory_every_pass_through_door(void **state)
{
    (void)state;
    const size_t big = 200 * MIB;
    CUdeviceptr p;
    size_t pitch;
    CUstream s;
    CUmemoryPool mp;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.cuDeviceGetDefaultMemPool(&mp, 0), CUDA_SUCCESS);

    fill_pool_and_free();
    assert_int_equal(cu.cuMemAlloc_v2(&p, big), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);

    fill_pool_and_free();
    assert_int_equal(cu.cuMemAllocManaged(&p, big, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);

    fill_pool_and_free();
    assert_int_equal(cu.cuMemAllocPitch_v2(&p, &pitch, 1 << 20, 200, 4), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);

    fill_pool_and_free();
    assert_int_equal(cu.cuMemAllocAsync(&p, big, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFreeAsync(p, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamSynchronize(s), CUDA_SUCCESS);

    fill_pool_and_free();
    assert_int_equal(cu.cuMemAllocFromPoolAsync(&p, big, mp, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFreeAsync(p, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamSynchronize(s), CUDA_SUCCESS);

    fill_pool_and_free();
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    assert_int_equal(cu.cuMemCreate(&h, big, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_limit(void **state)
{
    (void)state;
    /* CUHEAP_LIMIT=96M, CUHEAP_ARENA_SIZE=32M: everything counts, pooled or not */
    CUdeviceptr big, small[16];
    assert_int_equal(cu.cuMemAlloc_v2(&big, 70 * MIB), CUDA_SUCCESS); /* pass-through, 72 MiB */
    int n = 0;
    CUresult r;
    while (n < 16 && (r = cu.cuMemAlloc_v2(&small[n], 4 * MIB)) == CUDA_SUCCESS)
        n++;
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_true(n >= 4 && n <= 6); /* 24 MiB left under the limit */
    size_t f, t;
    assert_int_equal(cu.cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, 96 * MIB);
    assert_true(f < 8 * MIB);
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
    for (int i = 0; i < n; i++)
        assert_int_equal(cu.cuMemFree_v2(small[i]), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc_v2(&big, 70 * MIB), CUDA_SUCCESS); /* room again */
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
}

/* ---- threads ---- */

static CUcontext main_ctx;

static void *storm(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    if (cu.cuCtxSetCurrent(main_ctx) != CUDA_SUCCESS) /* driver API: per-thread contexts */
        return (void *)1;
    CUdeviceptr live[32];
    unsigned char tag[32];
    size_t sizes[32];
    int n = 0;
    for (int i = 0; i < 3000; i++) {
        if (n < 32 && (n == 0 || rand_r(&seed) % 2)) {
            size_t size = 1 + rand_r(&seed) % (1u << (rand_r(&seed) % 18));
            if (cu.cuMemAlloc_v2(&live[n], size) != CUDA_SUCCESS)
                return (void *)1;
            tag[n] = (unsigned char)rand_r(&seed);
            sizes[n] = size;
            memset((void *)(uintptr_t)live[n], tag[n], size); /* host memory stands in */
            n++;
        } else {
            int k = (int)(rand_r(&seed) % (unsigned)n);
            const unsigned char *b = (const unsigned char *)(uintptr_t)live[k];
            /* nobody else wrote into our block while it was ours */
            for (size_t j = 0; j < sizes[k]; j += 61)
                if (b[j] != tag[k])
                    return (void *)2;
            if (cu.cuMemFree_v2(live[k]) != CUDA_SUCCESS)
                return (void *)3;
            live[k] = live[n - 1];
            tag[k] = tag[n - 1];
            sizes[k] = sizes[n - 1];
            n--;
        }
    }
    while (n)
        cu.cuMemFree_v2(live[--n]);
    return NULL;
}

static void test_threaded_alloc_free_storm(void **state)
{
    (void)state;
    pthread_t t[8];
    CUresult (*get_ctx)(CUcontext *);
    *(void **)&get_ctx = dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
    assert_int_equal(get_ctx(&main_ctx), CUDA_SUCCESS);
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, storm, (void *)(i + 1));
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        if (r)
            fail_msg("thread %d: %s", i,
                     r == (void *)1   ? "allocation failed"
                     : r == (void *)2 ? "a live block was overwritten"
                                      : "free failed");
    }
}

/* ---- a signal handler's calls while the thread is inside a hook ---- */

/* The handler runs while the interrupted cuMemAlloc_v2 hook asks the driver for the current
 * context (fakecuda_set_ctx_query_hook), on the thread that is inside it: its call is
 * nested. A nested free of a pooled block must not reach the driver, which does not know the
 * pointer (the handler would get CUDA_ERROR_INVALID_VALUE and the block stay live for good);
 * a nested allocation must be counted, or its free makes frees outnumber allocations. */
static CUdeviceptr sig_ptr;
static volatile CUresult sig_result;
static volatile sig_atomic_t sig_calls;
static atomic_bool sig_armed;

static void free_in_handler(int sig)
{
    (void)sig;
    sig_result = cu.cuMemFree_v2(sig_ptr);
    sig_calls++;
}

static void alloc_in_handler(int sig)
{
    (void)sig;
    sig_result = cu.cuMemAlloc_v2(&sig_ptr, 8192);
    sig_calls++;
}

static void raise_once(void)
{
    if (atomic_exchange(&sig_armed, false))
        raise(SIGUSR1);
}

/* One cuMemAlloc_v2 whose hook the handler interrupts; returns the handler's answer. */
static CUresult handler_inside_hook(void (*handler)(int))
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    sig_calls = 0;
    sig_result = CUDA_ERROR_UNKNOWN;
    atomic_store(&sig_armed, true);
    fakecuda_set_ctx_query_hook(raise_once);
    CUdeviceptr p;
    CUresult r = cu.cuMemAlloc_v2(&p, 4096);
    fakecuda_set_ctx_query_hook(NULL);
    sigaction(SIGUSR1, &old, NULL);
    assert_int_equal(r, CUDA_SUCCESS);
    assert_int_equal(sig_calls, 1); /* it ran, inside the hook */
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
    return sig_result;
}

static void test_signal_frees_inside_hook(void **state)
{
    (void)state;
    struct cuheap_stats before = stats();
    assert_int_equal(cu.cuMemAlloc_v2(&sig_ptr, 8192), CUDA_SUCCESS);
    assert_int_equal(handler_inside_hook(free_in_handler), CUDA_SUCCESS);
    /* the block came back: counted, and no longer live */
    struct cuheap_stats after = stats();
    assert_int_equal(after.nr_allocs - before.nr_allocs, 2);
    assert_int_equal(after.nr_frees - before.nr_frees, 2);
    assert_int_equal(after.live_bytes, before.live_bytes);
    /* and the memory is usable again */
    CUdeviceptr q;
    assert_int_equal(cu.cuMemAlloc_v2(&q, 8192), CUDA_SUCCESS);
    memset((void *)(uintptr_t)q, 1, 8192);
    assert_int_equal(cu.cuMemFree_v2(q), CUDA_SUCCESS);
}

/* More frees than the nested list holds, in one handler inside one hook: every one is
 * answered CUDA_SUCCESS and a pooled block comes back to its pool; none goes to the driver,
 * which does not know the pointers (past the list, the 17th and later got
 * CUDA_ERROR_INVALID_VALUE and stayed live for good). */
#define SIG_MANY 64
static CUdeviceptr sig_many[SIG_MANY];
static volatile int sig_many_ok;

static void free_many_in_handler(int sig)
{
    (void)sig;
    for (int i = 0; i < SIG_MANY; i++)
        sig_many_ok += cu.cuMemFree_v2(sig_many[i]) == CUDA_SUCCESS;
    sig_result = CUDA_SUCCESS;
    sig_calls++;
}

static void test_signal_frees_many_inside_hook(void **state)
{
    (void)state;
    struct cuheap_stats before = stats();
    for (int i = 0; i < SIG_MANY; i++)
        assert_int_equal(cu.cuMemAlloc_v2(&sig_many[i], 8192 + (size_t)i * 4096), CUDA_SUCCESS);
    sig_many_ok = 0;
    assert_int_equal(handler_inside_hook(free_many_in_handler), CUDA_SUCCESS);
    assert_int_equal(sig_many_ok, SIG_MANY);
    struct cuheap_stats after = stats();
    if (pool_on) { /* without the pool, the driver's frees past the list go uncounted (logged) */
        assert_int_equal(after.nr_frees - before.nr_frees, SIG_MANY + 1);
        assert_int_equal(after.live_bytes, before.live_bytes);
        assert_int_equal(after.nr_passthrough, before.nr_passthrough);
    }
    /* and their memory is the pool's to hand out again */
    for (int i = 0; i < SIG_MANY; i++) {
        assert_int_equal(cu.cuMemAlloc_v2(&sig_many[i], 8192), CUDA_SUCCESS);
        memset((void *)(uintptr_t)sig_many[i], 1, 8192);
    }
    for (int i = 0; i < SIG_MANY; i++)
        assert_int_equal(cu.cuMemFree_v2(sig_many[i]), CUDA_SUCCESS);
}

static void test_signal_allocates_inside_hook(void **state)
{
    (void)state;
    struct cuheap_stats before = stats();
    assert_int_equal(handler_inside_hook(alloc_in_handler), CUDA_SUCCESS);
    struct cuheap_stats mid = stats();
    assert_int_equal(mid.nr_allocs - before.nr_allocs, 2);
    /* the handler's went to the driver (and so did the hook's, without the pool) */
    assert_int_equal(mid.nr_passthrough - before.nr_passthrough, pool_on ? 1 : 2);
    assert_int_equal(mid.live_bytes, before.live_bytes + 8192);
    memset((void *)(uintptr_t)sig_ptr, 1, 8192);
    assert_int_equal(cu.cuMemFree_v2(sig_ptr), CUDA_SUCCESS); /* not the pool's: passed on */
    struct cuheap_stats after = stats();
    assert_int_equal(after.nr_frees - before.nr_frees, 2);
    assert_int_equal(after.live_bytes, before.live_bytes);
}

/* The mapping operations a benchmark reads per step (bench/bench-replay.c): counted under vmm,
 * none under legacy; and a caller built before those fields gets nothing past its size. */
static void test_stats_count_mapping_ops(void **state)
{
    (void)state;
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 3 * MIB), CUDA_SUCCESS);
    struct cuheap_stats s = stats();
    uint64_t ops = s.nr_chunks_created + s.nr_chunks_moved + s.nr_chunks_released;
    if (pool_on && vmm)
        assert_true(s.nr_chunks_created >= 1); /* the first pooled block mapped one at least */
    else
        assert_int_equal(ops, 0);
    assert_true(s.nr_chunks_created || !s.map_ns);
    size_t old = offsetof(struct cuheap_stats, nr_chunks_created);
    unsigned char buf[sizeof(struct cuheap_stats)];
    memset(buf, 0xa5, sizeof(buf));
    assert_int_equal(cuheap_get_stats((struct cuheap_stats *)buf, old), 0);
    for (size_t i = old; i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0xa5);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
}

/* What the simulated driver counted of each kind of call, as cuheap_get_stats() sorts them. */
struct driver_counts {
    unsigned long memory, vmm, record, query, sync;
};

static struct driver_counts driver_counts(void)
{
    return (struct driver_counts){
        fake_calls(FAKECUDA_CALL_MEM_ALLOC) + fake_calls(FAKECUDA_CALL_MEM_FREE),
        fake_calls(FAKECUDA_CALL_VMM), fake_calls(FAKECUDA_CALL_EVENT_RECORD),
        fake_calls(FAKECUDA_CALL_QUERY), fake_calls(FAKECUDA_CALL_SYNC)};
}

/* cuheap's own time and the driver calls it makes, by kind (cuheap_get_stats): the pool's
 * allocations and frees both have own time; each kind's count is what the driver counted of
 * those calls (the program itself makes none of them here), the program's own calls passed to
 * the driver apart. */
static void test_stats_own_time_and_driver_calls_by_kind(void **state)
{
    (void)state;
    enum { N = 64 };
    CUstream st;
    assert_int_equal(cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    struct cuheap_stats s0 = stats();
    struct driver_counts d0 = driver_counts();
    CUdeviceptr p[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            assert_int_equal(cu.cuMemAlloc_v2(&p[i], (uint64_t)(i % 8 + 1) * 96 * 1024 + 4096u * i),
                             CUDA_SUCCESS);
        for (int i = 0; i < N; i++)
            assert_int_equal(i % 2 ? cu.cuMemFreeAsync(p[i], st) : cu.cuMemFree_v2(p[i]),
                             CUDA_SUCCESS);
    }
    struct cuheap_stats s1 = stats();
    /* the pool's (or, without it, the driver's) allocations and frees: cuheap's own time */
    assert_true(s1.own_alloc_ns > s0.own_alloc_ns);
    assert_true(s1.own_free_ns > s0.own_free_ns);
    assert_true(s1.nr_own_timed >= s0.nr_own_timed + 2);
    CUdeviceptr big;
    assert_int_equal(cu.cuMemAlloc_v2(&big, big_size()), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
    struct cuheap_stats s = stats();
    struct driver_counts d = driver_counts();
    print_message("# own %llu + %llu ns (%llu timed); program %llu (%llu ns); map %llu (%llu ns), "
                  "record %llu, query %llu, sync %llu, other %llu; driver: memory %lu vmm %lu "
                  "record %lu query %lu sync %lu\n",
                  (unsigned long long)(s.own_alloc_ns - s0.own_alloc_ns),
                  (unsigned long long)(s.own_free_ns - s0.own_free_ns),
                  (unsigned long long)(s.nr_own_timed - s0.nr_own_timed),
                  (unsigned long long)(s.nr_program_calls - s0.nr_program_calls),
                  (unsigned long long)(s.program_ns - s0.program_ns),
                  (unsigned long long)(s.nr_map_calls - s0.nr_map_calls),
                  (unsigned long long)(s.map_calls_ns - s0.map_calls_ns),
                  (unsigned long long)(s.nr_record_calls - s0.nr_record_calls),
                  (unsigned long long)(s.nr_query_calls - s0.nr_query_calls),
                  (unsigned long long)(s.nr_sync_calls - s0.nr_sync_calls),
                  (unsigned long long)(s.nr_other_calls - s0.nr_other_calls), d.memory - d0.memory,
                  d.vmm - d0.vmm, d.record - d0.record, d.query - d0.query, d.sync - d0.sync);
    /* the big pair went to the driver (and, without the pool, every pair) */
    assert_int_equal(s.nr_program_calls - s0.nr_program_calls, pool_on ? 2 : 4 * N + 2);
    assert_true(s.program_ns > s0.program_ns);
    if (pool_on) /* arenas are cuMemAlloc's (the program's frees: async ones too, without it) */
        assert_int_equal(s.nr_map_calls - s0.nr_map_calls + 2,
                         d.memory - d0.memory + d.vmm - d0.vmm);
    else
        assert_int_equal(s.nr_map_calls, s0.nr_map_calls);
    if (vmm)
        assert_int_equal(s.nr_map_calls - s0.nr_map_calls, d.vmm - d0.vmm);
    assert_int_equal(s.nr_record_calls - s0.nr_record_calls, d.record - d0.record);
    assert_int_equal(s.nr_query_calls - s0.nr_query_calls, d.query - d0.query);
    assert_int_equal(s.nr_sync_calls - s0.nr_sync_calls, d.sync - d0.sync);
    assert_true(s.nr_map_calls == s0.nr_map_calls || s.map_calls_ns > s0.map_calls_ns);
    assert_int_equal(cu.cuStreamDestroy_v2(st), CUDA_SUCCESS);
}

/* ---- capture, pluggable allocator ---- */

static void test_capture_passes_to_driver(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    unsigned long before = fake_calls(FAKECUDA_CALL_MEM_ALLOC);
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_ALLOC), before + 1); /* the driver's own */
    CUgraph g;
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_pluggable_allocator(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    /* a small block (under vmm, under half a granule: larger ones wait behind a fence, so
     * that their memory serves other sizes) */
    void *a = cuheap_torch_alloc(1 << 16, 0, s);
    assert_non_null(a);
    memset(a, 1, 1 << 16);
    cuheap_torch_free(a, 1 << 16, 0, s);
    void *b = cuheap_torch_alloc(1 << 16, 0, s);
    if (pool_on)
        assert_ptr_equal(b, a); /* same stream: reused at once, in stream order */
    cuheap_torch_free(b, 1 << 16, 0, s);
    void *big = cuheap_torch_alloc((ssize_t)big_size(), 0, s);
    assert_non_null(big);
    cuheap_torch_free(big, (ssize_t)big_size(), 0, s);
    assert_null(cuheap_torch_alloc(0, 0, s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_pool_off_goes_to_driver(void **state)
{
    (void)state;
    unsigned long before = fake_calls(FAKECUDA_CALL_MEM_ALLOC);
    unsigned long frees = fake_calls(FAKECUDA_CALL_MEM_FREE);
    CUdeviceptr p[10];
    for (int i = 0; i < 10; i++)
        assert_int_equal(cu.cuMemAlloc_v2(&p[i], 512u << i), CUDA_SUCCESS);
    for (int i = 0; i < 10; i++)
        assert_int_equal(cu.cuMemFree_v2(p[i]), CUDA_SUCCESS);
    assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_ALLOC), before + 10);
    assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_FREE), frees + 10);
    assert_int_equal(stats().nr_arenas, 0);
    /* the peak held follows what the driver gave (a review found it left behind once) */
    CUdeviceptr q;
    assert_int_equal(cu.cuMemAlloc_v2(&q, stats().peak_reserved_bytes + 64 * MIB), CUDA_SUCCESS);
    struct cuheap_stats s = stats();
    assert_true(s.peak_reserved_bytes >= s.reserved_bytes);
    assert_int_equal(cu.cuMemFree_v2(q), CUDA_SUCCESS);
}

/* cudaDeviceReset and context destruction free everything on the device: the pool must
 * forget its arenas (not hand out freed memory) and start over. Runs last. */
static void test_device_reset_drops_the_pool(void **state)
{
    (void)state;
    CUdeviceptr p, q;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
    unsigned long before = fake_calls(FAKECUDA_CALL_MEM_ALLOC);
    assert_int_equal(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
    struct cuheap_stats s = stats();
    assert_int_equal(s.nr_arenas, 0);
    assert_int_equal(s.reserved_bytes, 0);
    assert_int_equal(s.live_bytes, 0);
    /* the old pointer died with the reset: freeing it is the driver's error */
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemAlloc_v2(&q, 4096), CUDA_SUCCESS);
    if (pool_on && !vmm)
        assert_int_equal(fake_calls(FAKECUDA_CALL_MEM_ALLOC), before + 1); /* a new arena */
    memset((void *)(uintptr_t)q, 1, 4096); /* really device memory of the new epoch */
    assert_int_equal(cu.cuMemFree_v2(q), CUDA_SUCCESS);
}

int main(void)
{
    /* Each configuration runs what applies to it (cmocka's TAP skips read as failures). */
    bool small = getenv("FAKECUDA_DEVICE_MEM") != NULL, limited = getenv("CUHEAP_LIMIT") != NULL;
    bool pool = strcmp(env_or("CUHEAP_POOL", "1"), "0") != 0;
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_door_linked),
        cmocka_unit_test(test_door_dlsym),
        cmocka_unit_test(test_door_procaddr),
        cmocka_unit_test(test_procaddr_per_thread_twins),
        cmocka_unit_test(test_errors_pass_through),
        cmocka_unit_test(test_pointer_queries_agree),
        cmocka_unit_test(test_ipc_never_shares_wrong_bytes),
        cmocka_unit_test(test_mem_info),
        cmocka_unit_test(test_race_non_blocking_stream),
        cmocka_unit_test(test_race_destroyed_stream),
        cmocka_unit_test(test_race_priority_stream),
        cmocka_unit_test(test_race_per_thread_default_stream),
        cmocka_unit_test(test_race_blocking_stream),
        cmocka_unit_test(test_race_after_stream_churn),
        cmocka_unit_test(test_race_pluggable_other_stream),
        cmocka_unit_test(test_races_saw_the_block_back),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_out_of_memory_every_pass_through_door),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_threaded_alloc_free_storm),
        cmocka_unit_test(test_signal_frees_inside_hook),
        cmocka_unit_test(test_signal_frees_many_inside_hook),
        cmocka_unit_test(test_signal_allocates_inside_hook),
        cmocka_unit_test(test_stats_count_mapping_ops),
        cmocka_unit_test(test_stats_own_time_and_driver_calls_by_kind),
        cmocka_unit_test(test_capture_passes_to_driver),
        cmocka_unit_test(test_pluggable_allocator),
        cmocka_unit_test(test_pool_off_goes_to_driver),
        cmocka_unit_test(test_device_reset_drops_the_pool),
    };
    size_t n = 0;
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        if (((tests[i].test_func == test_out_of_memory ||
              tests[i].test_func == test_out_of_memory_every_pass_through_door) &&
             !small) ||
            (tests[i].test_func == test_limit && !limited) ||
            (tests[i].test_func == test_pool_off_goes_to_driver && pool))
            continue;
        tests[n++] = tests[i];
    }
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return _cmocka_run_group_tests("test-hooks", tests, n, setup, NULL);
}
