/* SPDX-License-Identifier: MIT */
/*
 * Every hooked driver entry point, called once through one door (driver_api.h: linked, dlsym,
 * cuGetProcAddress_v2 or cuGetProcAddress), on the simulated driver. The test that runs it
 * under cuheap compares the trace with what this program says must be in it:
 *
 *   expect EVENT API PTR SIZE [capture]   one line per allocation or free event ("-": any)
 *
 * and each expected event must appear exactly once, with no other allocation or free event.
 * Entry points that make no event are checked here, by their answers and their effect:
 *
 *   check NAME ok | check NAME FAILED: why
 *
 * Exit status 1 when a check failed or a call went wrong.
 */
#include <cuheap/cuheap.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#include "driver_api.h"
#include "race.h"

static struct driver_api d;
static bool under_cuheap, pool_on;
static int failures;
static int (*get_stats)(struct cuheap_stats *, size_t);
static void (*mark)(const char *);

/* Bytes cuheap holds from the device now (0 without cuheap). */
static uint64_t reserved_now(void)
{
    struct cuheap_stats st = {0};
    if (get_stats)
        get_stats(&st, sizeof(st));
    return st.reserved_bytes;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "every-hook %s: %s failed: %d\n", door_name, #call, (int)r_);          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void expect(const char *event, const char *api, uint64_t ptr, uint64_t size,
                   const char *extra)
{
    if (ptr)
        printf("expect %s %s 0x%" PRIx64 " %" PRIu64 "%s%s\n", event, api, ptr, size,
               extra ? " " : "", extra ? extra : "");
    else
        printf("expect %s %s - %" PRIu64 "%s%s\n", event, api, size, extra ? " " : "",
               extra ? extra : "");
}

static void check(const char *name, bool ok, const char *why)
{
    if (ok) {
        printf("check %s ok\n", name);
    } else {
        printf("check %s FAILED: %s\n", name, why);
        failures++;
    }
}

static int races_came_back; /* races where the freed block came back (see test-hooks.c) */

/* The fence must cover streams made through this door: a freed block read by a slow kernel
 * on such a stream is not handed out again until the kernel is done. */
static void check_stream_fenced(const char *name, CUstream s)
{
    struct race_result r = race_on_stream(&d, s);
    bool ok = !r.error && !r.changed && !r.reused_early;
    check(name, ok, "a freed block was reused while a kernel on the stream still read it");
    races_came_back += r.came_back || r.full;
}

static void allocations(void)
{
    CUdeviceptr p;
    CHECK(d.cuMemAlloc_v2(&p, 4096));
    expect("alloc", "cuMemAlloc", p, 4096, NULL);
    /* the pool answers range queries for the block, not for its arena */
    CUdeviceptr base = 0, start = 0;
    size_t size = 0, rsize = 0;
    CHECK(d.cuMemGetAddressRange_v2(&base, &size, p + 100));
    check("cuMemGetAddressRange_v2", base == p && size == 4096, "range is not the block");
    CHECK(d.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5));
    check("cuPointerGetAttribute", start == p, "range start is not the block");
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    start = 0;
    void *data[2] = {&start, &rsize};
    CHECK(d.cuPointerGetAttributes(2, attrs, data, p + 5));
    check("cuPointerGetAttributes", start == p && rsize == 4096, "range is not the block");
    CHECK(d.cuMemFree_v2(p));
    expect("free", "-", p, 4096, NULL);

    CUdeviceptr q, inner;
    CHECK(d.cuMemAlloc_v2(&q, 4096));
    expect("alloc", "cuMemAlloc", q, 4096, NULL);
    CHECK(d.cuMemAlloc_v2(&inner, 4096));
    expect("alloc", "cuMemAlloc", inner, 4096, NULL);
    CUipcMemHandle h;
    CUresult ipc = d.cuIpcGetMemHandle(&h, inner);
    /* legacy IPC would share the whole arena: refused for a block inside one; a vmm pool
     * shares the block itself (cuheap's own handle, tests/programs/ipc_prog.c) */
    const char *backing = getenv("CUHEAP_BACKING");
    bool vmm = pool_on && (!backing || !strcmp(backing, "vmm"));
    check("cuIpcGetMemHandle",
          pool_on && !vmm ? ipc == CUDA_ERROR_INVALID_VALUE : ipc == CUDA_SUCCESS,
          vmm ? "a pooled block was not shared" : "a pooled block inside an arena was exported");
    CUdeviceptr opened;
    check("cuIpcOpenMemHandle",
          ipc != CUDA_SUCCESS ||
              (d.cuIpcOpenMemHandle_v2(&opened, h, 0) == CUDA_ERROR_INVALID_CONTEXT &&
               d.cuIpcCloseMemHandle(inner) == CUDA_ERROR_INVALID_VALUE),
          "a handle opened in the process that made it, or a block closed that was not opened");
    CHECK(d.cuMemFree_v2(inner));
    expect("free", "-", inner, 4096, NULL);

    CUdeviceptr pitched;
    size_t pitch;
    CHECK(d.cuMemAllocPitch_v2(&pitched, &pitch, 1000, 10, 4));
    expect("alloc", "cuMemAllocPitch", pitched, (uint64_t)pitch * 10, NULL);
    CHECK(d.cuMemFree_v2(pitched));
    expect("free", "-", pitched, (uint64_t)pitch * 10, NULL);

    CUstream s;
    CHECK(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUmemoryPool mp;
    CHECK(d.cuDeviceGetDefaultMemPool(&mp, 0));
    CUdeviceptr a;
    CHECK(d.cuMemAllocAsync(&a, 1 << 16, s));
    expect("alloc", "cuMemAllocAsync", a, 1 << 16, NULL);
    CHECK(d.cuMemFreeAsync(a, s));
    expect("free", "-", a, 1 << 16, NULL);
    CHECK(d.ptsz.cuMemAllocAsync(&a, 1 << 15, NULL));
    expect("alloc", "cuMemAllocAsync", a, 1 << 15, NULL);
    CHECK(d.ptsz.cuMemFreeAsync(a, NULL));
    expect("free", "-", a, 1 << 15, NULL);
    CHECK(d.cuMemAllocFromPoolAsync(&a, 1 << 14, mp, s));
    expect("alloc", "cuMemAllocFromPoolAsync", a, 1 << 14, NULL);
    CHECK(d.cuMemFreeAsync(a, s));
    expect("free", "-", a, 1 << 14, NULL);
    CHECK(d.ptsz.cuMemAllocFromPoolAsync(&a, 1 << 13, mp, NULL));
    expect("alloc", "cuMemAllocFromPoolAsync", a, 1 << 13, NULL);
    CHECK(d.ptsz.cuMemFreeAsync(a, NULL));
    expect("free", "-", a, 1 << 13, NULL);
    /* a stream-ordered free of a block cudaMalloc gave (pooled under cuheap) */
    CHECK(d.cuMemAlloc_v2(&a, 8192));
    expect("alloc", "cuMemAlloc", a, 8192, NULL);
    CHECK(d.cuMemFreeAsync(a, s));
    expect("free", "-", a, 8192, NULL);
    CHECK(d.cuMemAlloc_v2(&a, 8192 + 512));
    expect("alloc", "cuMemAlloc", a, 8192 + 512, NULL);
    CHECK(d.ptsz.cuMemFreeAsync(a, NULL));
    expect("free", "-", a, 8192 + 512, NULL);
    CHECK(d.cuStreamSynchronize(s));
    CHECK(d.cuStreamDestroy_v2(s));

    CUdeviceptr m;
    CHECK(d.cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    expect("alloc", "cuMemAllocManaged", m, 1 << 20, NULL);
    CHECK(d.cuMemFree_v2(m));
    expect("free", "-", m, 1 << 20, NULL);

    void *host;
    CHECK(d.cuMemAllocHost_v2(&host, 1 << 16));
    expect("alloc", "cuMemHostAlloc", (uint64_t)(uintptr_t)host, 1 << 16, NULL);
    CHECK(d.cuMemFreeHost(host));
    expect("free", "-", (uint64_t)(uintptr_t)host, 1 << 16, NULL);
    CHECK(d.cuMemHostAlloc(&host, 1 << 17, 0));
    expect("alloc", "cuMemHostAlloc", (uint64_t)(uintptr_t)host, 1 << 17, NULL);
    CHECK(d.cuMemFreeHost(host));
    expect("free", "-", (uint64_t)(uintptr_t)host, 1 << 17, NULL);

    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t vsize = 4 << 20;
    CHECK(d.cuMemAddressReserve(&va, vsize, 0, 0, 0));
    CHECK(d.cuMemCreate(&handle, vsize, &prop, 0));
    expect("alloc", "cuMemCreate", 0, vsize, NULL);
    CHECK(d.cuMemMap(va, vsize, 0, handle, 0));
    expect("alloc", "cuMemMap", va, vsize, NULL);
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(d.cuMemSetAccess(va, vsize, &acc, 1));
    CHECK(d.cuMemUnmap(va, vsize));
    expect("free", "-", va, vsize, NULL);
    CHECK(d.cuMemRelease(handle));
    expect("free", "-", 0, vsize, NULL);
    CHECK(d.cuMemAddressFree(va, vsize));
}

/* PyTorch's pluggable allocator entry points (cuheap's own, not the driver's): a block freed
 * on a stream is recorded like any other free. */
static void pluggable(void)
{
    void *(*torch_alloc)(ssize_t, int, void *);
    void (*torch_free)(void *, ssize_t, int, void *);
    *(void **)&torch_alloc = dlsym(RTLD_DEFAULT, "cuheap_torch_alloc");
    *(void **)&torch_free = dlsym(RTLD_DEFAULT, "cuheap_torch_free");
    if (!torch_alloc || !torch_free)
        return;
    CUstream s;
    CHECK(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *p = torch_alloc(20000, 0, s);
    if (!p) {
        check("cuheap_torch_alloc", false, "no memory from the pluggable allocator");
        return;
    }
    expect("alloc", "torch_pluggable", (uint64_t)(uintptr_t)p, 20000, NULL);
    torch_free(p, 20000, 0, s);
    expect("free", "-", (uint64_t)(uintptr_t)p, 20000, NULL);
    CHECK(d.cuStreamSynchronize(s));
    CHECK(d.cuStreamDestroy_v2(s));
}

/* Allocations while a stream captures a graph go to the driver, and the trace says so. */
static void capture(void)
{
    CUstream s;
    CHECK(d.cuStreamCreate(&s, 0));
    CUgraph g;
    CUdeviceptr p;
    CHECK(d.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(d.cuMemAlloc_v2(&p, 3000));
    CHECK(d.cuStreamEndCapture(s, &g));
    expect("alloc", "cuMemAlloc", p, 3000, "capture");
    CHECK(d.cuMemFree_v2(p));
    expect("free", "-", p, 3000, NULL);
    CHECK(d.cuStreamDestroy_v2(s));
    /* the per-thread default stream's twins */
    CHECK(d.ptsz.cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(d.cuMemAlloc_v2(&p, 3072));
    CHECK(d.ptsz.cuStreamEndCapture(NULL, &g));
    expect("alloc", "cuMemAlloc", p, 3072, "capture");
    CHECK(d.cuMemFree_v2(p));
    expect("free", "-", p, 3072, NULL);
}

static void streams(void)
{
    CUstream s;
    CHECK(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    check_stream_fenced("cuStreamCreate", s);
    CHECK(d.cuStreamDestroy_v2(s));
    CHECK(d.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -1));
    check_stream_fenced("cuStreamCreateWithPriority", s);
    CHECK(d.cuStreamDestroy_v2(s));
    if (pool_on) /* else the two checks above could not have seen an early reuse */
        check("stream races", races_came_back > 0, "the freed block never came back");
}

/* A reset or a destroyed context frees everything on the device: the pool must forget its
 * arenas (cuheap holds nothing afterwards) and start over. */
static void contexts(void)
{
    CUdeviceptr p;
    CHECK(d.cuMemAlloc_v2(&p, 4096));
    CHECK(d.cuDevicePrimaryCtxReset_v2(0));
    if (under_cuheap)
        check("cuDevicePrimaryCtxReset_v2", reserved_now() == 0, "the pool kept its arenas");
    CHECK(d.cuMemAlloc_v2(&p, 4096));
    unsigned char v = 7;
    CHECK(d.cuMemcpyHtoD_v2(p, &v, 1));
    CUcontext ctx;
    CHECK(d.cuCtxGetCurrent(&ctx));
    CHECK(d.cuCtxDestroy_v2(ctx));
    if (under_cuheap)
        check("cuCtxDestroy_v2", reserved_now() == 0, "the pool kept its arenas");
}

/* cuCtxEnablePeerAccess (run alone, with --peer, on two simulated devices): device 0 may then
 * read and write device 1's memory, pooled or not, whether it was mapped before access was
 * enabled or after. */
static void peer_access(void)
{
    int n = 0;
    CHECK(d.cuDeviceGetCount(&n));
    if (n < 2) {
        check("cuCtxEnablePeerAccess", false, "needs FAKECUDA_DEVICE_COUNT=2");
        return;
    }
    CUdevice dev1;
    CUcontext c0, c1;
    CUdeviceptr before, after;
    CHECK(d.cuCtxGetCurrent(&c0));
    CHECK(d.cuDeviceGet(&dev1, 1));
    CHECK(d.cuDevicePrimaryCtxRetain(&c1, dev1));
    CHECK(d.cuCtxSetCurrent(c1));
    CHECK(d.cuMemAlloc_v2(&before, 3u << 20));
    CHECK(d.cuCtxSetCurrent(c0));
    CHECK(d.cuCtxEnablePeerAccess(c1, 0));
    CHECK(d.cuCtxSetCurrent(c1));
    CHECK(d.cuMemAlloc_v2(&after, 5u << 20));
    CHECK(d.cuCtxSetCurrent(c0));
    CUmemLocation dev0 = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    unsigned long long fb = 0, fa = 0;
    CHECK(d.cuMemGetAccess(&fb, &dev0, before + (3u << 20) - 1));
    CHECK(d.cuMemGetAccess(&fa, &dev0, after));
    check("cuCtxEnablePeerAccess",
          fb == CU_MEM_ACCESS_FLAGS_PROT_READWRITE && fa == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
          "device 0 cannot use device 1's memory");
    CHECK(d.cuCtxSetCurrent(c1));
    CHECK(d.cuMemFree_v2(before));
    CHECK(d.cuMemFree_v2(after));
    CHECK(d.cuCtxSetCurrent(c0));
}

int main(int argc, char **argv)
{
    if (driver_api_start(&d, 0)) {
        fprintf(stderr, "every-hook %s: cannot reach the driver\n", door_name);
        return 1;
    }
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    *(void **)&mark = dlsym(RTLD_DEFAULT, "cuheap_mark");
    under_cuheap = get_stats && mark;
    const char *pool = getenv("CUHEAP_POOL");
    pool_on = under_cuheap && !(pool && !strcmp(pool, "0"));
    printf("door %s\n", door_name);
    if (argc > 1 && !strcmp(argv[1], "--peer")) {
        peer_access();
        return failures ? 1 : 0;
    }
    allocations();
    pluggable();
    capture();
    size_t f, t;
    CHECK(d.cuMemGetInfo_v2(&f, &t));
    const char *limit = getenv("CUHEAP_LIMIT");
    if (under_cuheap && limit)
        check("cuMemGetInfo_v2", t == strtoull(limit, NULL, 10) << 20,
              "total is not the limit (CUHEAP_LIMIT=NM)");
    /* The race and the context calls allocate and free too: the trace is compared up to here. */
    if (mark)
        mark("end of counted events");
    if (argc < 2 || strcmp(argv[1], "--no-streams") != 0)
        streams();
    contexts();
    return failures ? 1 : 0;
}
