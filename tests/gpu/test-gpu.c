/* SPDX-License-Identifier: MIT */
/*
 * The gpu suite: cuheap on a real device, preloaded the way users preload it. The stream
 * races run a real kernel (PTX, loaded at run time, so nothing here needs nvcc) that spins
 * for half a second and then reads a buffer the host has already freed, on each kind of
 * stream (non-blocking, with a priority, per-thread default, blocking), while the host closes
 * fence batches and takes blocks until the freed one could come back.
 * Run with LD_PRELOAD=libcuheap.so and CUHEAP_REUSE set; scripts/gpu-run.sh does.
 */
#include <cuheap/cuheap.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define DOOR_PROCADDR 1
#include "../programs/driver_api.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static struct driver_api cu;
static CUresult (*module_load_data)(CUmodule *, const void *);
static CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
static CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
static CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
static const char *reuse;
static bool pool_on;

/* spin_check(buf, n, cycles, out): wait `cycles` clocks, then count bytes != 0xAA (every 64th). */
static const char spin_ptx[] = ".version 7.0\n"
                               ".target sm_50\n"
                               ".address_size 64\n"
                               ".visible .entry spin_check(.param .u64 buf, .param .u64 n, .param "
                               ".u64 cycles, .param .u64 out)\n"
                               "{\n"
                               "  .reg .pred p;\n"
                               "  .reg .b64 rd<12>;\n"
                               "  .reg .b32 r<2>;\n"
                               "  ld.param.u64 rd1, [buf];\n"
                               "  ld.param.u64 rd2, [n];\n"
                               "  ld.param.u64 rd3, [cycles];\n"
                               "  ld.param.u64 rd4, [out];\n"
                               "  mov.u64 rd5, %clock64;\n"
                               "WAIT:\n"
                               "  mov.u64 rd6, %clock64;\n"
                               "  sub.u64 rd7, rd6, rd5;\n"
                               "  setp.lt.u64 p, rd7, rd3;\n"
                               "  @p bra WAIT;\n"
                               "  mov.u64 rd8, 0;\n"
                               "  mov.u64 rd9, 0;\n"
                               "LOOP:\n"
                               "  setp.ge.u64 p, rd8, rd2;\n"
                               "  @p bra DONE;\n"
                               "  add.u64 rd10, rd1, rd8;\n"
                               "  ld.global.u8 r1, [rd10];\n"
                               "  setp.ne.u32 p, r1, 170;\n"
                               "  @p add.u64 rd9, rd9, 1;\n"
                               "  add.u64 rd8, rd8, 64;\n"
                               "  bra LOOP;\n"
                               "DONE:\n"
                               "  st.global.u64 [rd4], rd9;\n"
                               "  ret;\n"
                               "}\n";

static int setup(void **state)
{
    (void)state;
    if (driver_api_start(&cu, 0))
        return -1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&module_load_data = dlsym(h, "cuModuleLoadData");
    *(void **)&module_get_function = dlsym(h, "cuModuleGetFunction");
    *(void **)&launch_kernel = dlsym(h, "cuLaunchKernel");
    *(void **)&ipc_get = dlsym(h, "cuIpcGetMemHandle");
    const char *r = getenv("CUHEAP_REUSE");
    reuse = r ? r : "fence";
    const char *p = getenv("CUHEAP_POOL");
    pool_on = dlsym(RTLD_DEFAULT, "cuheap_call_count") && !(p && !strcmp(p, "0"));
    return module_load_data && module_get_function && launch_kernel ? 0 : -1;
}

static void test_cuheap_is_loaded_and_sees_calls(void **state)
{
    (void)state;
    uint64_t (*count)(const char *);
    *(void **)&count = dlsym(RTLD_DEFAULT, "cuheap_call_count");
    if (!count)
        fail_msg("run the gpu suite with LD_PRELOAD=libcuheap.so");
    uint64_t before = count("cuMemAlloc_v2");
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
    assert_int_equal(count("cuMemAlloc_v2"), before + 1);
}

/* The race of tests/programs/race.h with a real kernel: spin_check waits about half a second on
 * `reader`, then counts bytes of the freed buffer that are no longer 0xAA. Meanwhile the host
 * frees it, closes fence batches with small frees, and takes same-size blocks until the freed
 * one could come back, filling each with 0x55 on another non-blocking stream at once (ordered
 * after nothing, as another kernel would be). */
struct gpu_race {
    bool reused_early;      /* the freed block came back while the kernel still ran */
    bool came_back;         /* it came back at all (else no early reuse could have been seen) */
    unsigned long long bad; /* bytes the kernel saw changed (every 64th byte is read) */
};

static CUfunction spin_fn(void)
{
    static CUfunction fn;
    if (!fn) {
        CUmodule mod;
        assert_int_equal(module_load_data(&mod, spin_ptx), CUDA_SUCCESS);
        assert_int_equal(module_get_function(&fn, mod, "spin_check"), CUDA_SUCCESS);
    }
    return fn;
}

static struct gpu_race race_with_kernel(CUstream reader)
{
    const size_t n = 8 * MIB;
    /* the other frees are larger than a thread cache keeps (128 KiB), so that they join the
     * pool's fence batch with the block's free and close it (tests/programs/race.h) */
    enum { NR_SMALL = 130, SMALL = 256 << 10, NR_REUSE = 48, NR_AFTER = 64 };
    struct gpu_race res = {false, false, 0};
    CUstream writer;
    assert_int_equal(cu.cuStreamCreate(&writer, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr a, out, small[NR_SMALL], got[NR_REUSE + NR_AFTER];
    assert_int_equal(cu.cuMemAlloc_v2(&out, 8), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemsetD8_v2(out, 0xFF, 8), CUDA_SUCCESS);
    for (int i = 0; i < NR_SMALL; i++)
        assert_int_equal(cu.cuMemAlloc_v2(&small[i], SMALL), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc_v2(&a, n), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemsetD8_v2(a, 0xAA, n), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    unsigned long long cycles = 1000000000ull; /* about half a second at H200 clocks */
    size_t nn = n;
    void *args[] = {&a, &nn, &cycles, &out};
    assert_int_equal(launch_kernel(spin_fn(), 1, 1, 1, 1, 1, 1, 0, reader, args, NULL),
                     CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(a), CUDA_SUCCESS);
    for (int i = 0; i < NR_SMALL; i++)
        assert_int_equal(cu.cuMemFree_v2(small[i]), CUDA_SUCCESS);
    int nr = 0;
    while (nr < NR_REUSE) {
        assert_int_equal(cu.cuMemAlloc_v2(&got[nr], n), CUDA_SUCCESS);
        assert_int_equal(cu.cuMemsetD8Async(got[nr], 0x55, n, writer), CUDA_SUCCESS);
        if (got[nr++] == a) {
            res.came_back = true;
            res.reused_early = cu.cuStreamQuery(reader) == CUDA_ERROR_NOT_READY;
            break;
        }
    }
    assert_int_equal(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    while (!res.came_back && nr < NR_REUSE + NR_AFTER) { /* the kernel is done: now it must */
        assert_int_equal(cu.cuMemAlloc_v2(&got[nr], n), CUDA_SUCCESS);
        res.came_back = got[nr++] == a;
    }
    assert_int_equal(cu.cuMemcpyDtoH_v2(&res.bad, out, 8), CUDA_SUCCESS);
    while (nr > 0)
        assert_int_equal(cu.cuMemFree_v2(got[--nr]), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(out), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy_v2(writer), CUDA_SUCCESS);
    return res;
}

static int races_run, races_came_back; /* test_races_saw_the_block_back: see test-hooks.c */

static void expect_race_outcome(const char *kind, struct gpu_race r)
{
    races_run++;
    races_came_back += r.came_back;
    const char *backing = getenv("CUHEAP_BACKING");
    printf("# race: backing=%s reuse=%s pool=%d stream=%s reused_early=%d came_back=%d "
           "bytes_changed_under_kernel=%llu\n",
           backing ? backing : "default", reuse, pool_on, kind, r.reused_early, r.came_back,
           r.bad * 64);
    if (pool_on && !strcmp(reuse, "immediate"))
        assert_true(r.bad > 0); /* the documented hazard, seen */
    else if (r.bad || r.reused_early)
        fail_msg("%s: %llu bytes changed under a kernel (freed block reused early: %d)", kind,
                 r.bad * 64, r.reused_early);
}

static void test_races_saw_the_block_back(void **state)
{
    (void)state;
    if (pool_on && races_run && !races_came_back)
        fail_msg("in none of %d races did the freed block come back, even after the kernel: "
                 "these tests could not have seen an early reuse",
                 races_run);
}

static void test_race_non_blocking_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    expect_race_outcome("non-blocking", race_with_kernel(s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_race_priority_stream(void **state)
{
    (void)state;
    int least, greatest;
    CUresult (*range)(int *, int *);
    *(void **)&range =
        dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cuCtxGetStreamPriorityRange");
    assert_non_null(range);
    assert_int_equal(range(&least, &greatest), CUDA_SUCCESS);
    CUstream s;
    assert_int_equal(cu.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest),
                     CUDA_SUCCESS);
    expect_race_outcome("priority", race_with_kernel(s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_race_per_thread_default_stream(void **state)
{
    (void)state;
    expect_race_outcome("per-thread-default", race_with_kernel(CU_STREAM_PER_THREAD));
}

static void test_race_blocking_stream(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cu.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    expect_race_outcome("blocking", race_with_kernel(s));
    assert_int_equal(cu.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_pointer_queries_agree(void **state)
{
    (void)state;
    CUdeviceptr p;
    assert_int_equal(cu.cuMemAlloc_v2(&p, 3 * MIB + 100), CUDA_SUCCESS);
    CUdeviceptr base, start;
    size_t size, rsize;
    assert_int_equal(cu.cuMemGetAddressRange_v2(&base, &size, p + MIB), CUDA_SUCCESS);
    assert_int_equal(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5),
                     CUDA_SUCCESS);
    assert_int_equal(cu.cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 5),
                     CUDA_SUCCESS);
    assert_int_equal(base, p);
    assert_int_equal(start, p);
    assert_int_equal(rsize, size);
    assert_true(size >= 3 * MIB + 100);
    CUipcMemHandle h;
    CUresult r = ipc_get(&h, p);
    assert_true(r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemFree_v2(p), CUDA_SUCCESS);
}

static void test_out_of_memory_and_recovery(void **state)
{
    (void)state;
    size_t free0, total;
    assert_int_equal(cu.cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
    enum { NR = 4096 };
    CUdeviceptr *p = calloc(NR, sizeof(*p));
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < NR && (r = cu.cuMemAlloc_v2(&p[n], 64 * MIB)) == CUDA_SUCCESS)
        n++;
    printf("# oom: %d x 64 MiB before CUDA_ERROR_OUT_OF_MEMORY (%.1f of %.1f GiB free at start)\n",
           n, (double)free0 / GIB, (double)total / GIB);
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_true((double)n * 64 * MIB > 0.9 * (double)free0);
    for (int i = 0; i < n; i++)
        assert_int_equal(cu.cuMemFree_v2(p[i]), CUDA_SUCCESS);
    /* one allocation of most of the device: the pool must give its empty arenas back */
    CUdeviceptr big;
    size_t want = free0 / 10 * 8;
    assert_int_equal(cu.cuMemAlloc_v2(&big, want), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree_v2(big), CUDA_SUCCESS);
    free(p);
}

static void test_mem_info_is_truthful(void **state)
{
    (void)state;
    size_t f, t, device_total;
    assert_int_equal(cu.cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    assert_int_equal(cu.cuDeviceTotalMem_v2(&device_total, 0), CUDA_SUCCESS);
    assert_int_equal(t, device_total); /* no limit set: the device's own total, whatever card */
    assert_true(f <= t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuheap_is_loaded_and_sees_calls),
        cmocka_unit_test(test_race_non_blocking_stream),
        cmocka_unit_test(test_race_priority_stream),
        cmocka_unit_test(test_race_per_thread_default_stream),
        cmocka_unit_test(test_race_blocking_stream),
        cmocka_unit_test(test_races_saw_the_block_back),
        cmocka_unit_test(test_pointer_queries_agree),
        cmocka_unit_test(test_out_of_memory_and_recovery),
        cmocka_unit_test(test_mem_info_is_truthful),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, NULL);
}
