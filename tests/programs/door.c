/* SPDX-License-Identifier: MIT */
/*
 * A small CUDA program for the door tests: allocates through every hooked allocation API,
 * checks what it wrote reads back, and prints one line of results that must be the same with
 * and without cuheap (pointer values aside). Built three times, one per door (driver_api.h).
 * With cuheap loaded it also prints how many calls cuheap saw.
 */
#include <cuheap/cuheap.h>
#include <stdint.h>
#include <stdlib.h>

#include "driver_api.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    struct driver_api d;
    if (driver_api_start(&d, 0)) {
        fprintf(stderr, "door %s: cannot reach the driver\n", door_name);
        return 1;
    }
    unsigned long checksum = 0;
    int failures = 0;
    static const size_t sizes[] = {512, 4096, 1 << 20, (2 << 20) + 5, 20 << 20, 100 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        CUdeviceptr p;
        CHECK(d.cuMemAlloc_v2(&p, sizes[i]));
        unsigned char in[256], out[256];
        for (int k = 0; k < 256; k++)
            in[k] = (unsigned char)(k * 7 + i);
        CHECK(d.cuMemcpyHtoD_v2(p + sizes[i] - 256, in, 256));
        CHECK(d.cuMemcpyDtoH_v2(out, p + sizes[i] - 256, 256));
        failures += memcmp(in, out, 256) != 0;
        CUdeviceptr base;
        size_t range;
        CHECK(d.cuMemGetAddressRange_v2(&base, &range, p + 100));
        failures += base != p || range != sizes[i];
        for (int k = 0; k < 256; k++)
            checksum += out[k];
        CHECK(d.cuMemFree_v2(p));
    }
    /* an invalid free: the driver's error must come back unchanged */
    CUresult bad = d.cuMemFree_v2((CUdeviceptr)0x1234);
    CUdeviceptr pitched;
    size_t pitch;
    CHECK(d.cuMemAllocPitch_v2(&pitched, &pitch, 1000, 10, 4));
    failures += pitch < 1000;
    CHECK(d.cuMemFree_v2(pitched));
    CUstream s;
    CHECK(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a;
    CHECK(d.cuMemAllocAsync(&a, 1 << 16, s));
    CHECK(d.cuMemsetD8_v2(a, 3, 1 << 16));
    CHECK(d.cuMemFreeAsync(a, s));
    CHECK(d.cuStreamSynchronize(s));
    CHECK(d.cuStreamDestroy_v2(s));
    CUdeviceptr m;
    CHECK(d.cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    CHECK(d.cuMemFree_v2(m));
    void *h;
    CHECK(d.cuMemAllocHost_v2(&h, 1 << 16));
    CHECK(d.cuMemFreeHost(h));
    CHECK(d.cuMemHostAlloc(&h, 1 << 16, 0));
    CHECK(d.cuMemFreeHost(h));
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t vsize = 4 << 20;
    CHECK(d.cuMemAddressReserve(&va, vsize, 0, 0, 0));
    CHECK(d.cuMemCreate(&handle, vsize, &prop, 0));
    CHECK(d.cuMemMap(va, vsize, 0, handle, 0));
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(d.cuMemSetAccess(va, vsize, &acc, 1));
    CHECK(d.cuMemsetD8_v2(va, 9, vsize));
    unsigned char v;
    CHECK(d.cuMemcpyDtoH_v2(&v, va + vsize - 1, 1));
    failures += v != 9;
    CHECK(d.cuMemUnmap(va, vsize));
    CHECK(d.cuMemRelease(handle));
    CHECK(d.cuMemAddressFree(va, vsize));
    size_t freeb, total;
    CHECK(d.cuMemGetInfo_v2(&freeb, &total));
    printf("door=%s checksum=%lu failures=%d bad_free=%d total=%zu\n", door_name, checksum,
           failures, (int)bad, total);
    uint64_t (*count)(const char *);
    *(void **)&count = dlsym(RTLD_DEFAULT, "cuheap_call_count");
    if (count)
        printf(
            "cuheap calls: cuMemAlloc_v2=%llu cuMemFree_v2=%llu cuMemAllocAsync=%llu "
            "cuMemCreate=%llu cuMemMap=%llu cuMemAllocHost_v2=%llu cuMemHostAlloc=%llu\n",
            (unsigned long long)count("cuMemAlloc_v2"), (unsigned long long)count("cuMemFree_v2"),
            (unsigned long long)count("cuMemAllocAsync"), (unsigned long long)count("cuMemCreate"),
            (unsigned long long)count("cuMemMap"), (unsigned long long)count("cuMemAllocHost_v2"),
            (unsigned long long)count("cuMemHostAlloc"));
    return failures ? 1 : 0;
}
