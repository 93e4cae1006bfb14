/* SPDX-License-Identifier: MIT */
/*
 * What the driver's VMM calls cost by mapping size, on the machine it runs on: the figures the
 * pool's physical layout depends on. For each physical chunk size: cuMemCreate, cuMemMap,
 * cuMemSetAccess, cuMemUnmap, cuMemRelease of one chunk mapped whole (median of ROUNDS), then
 * one 64 MiB chunk mapped as 32 separate 2 MiB pieces (offsets into the handle), and whether a
 * sub-range of a mapping can be unmapped. Build: gcc -O2 probe-vmm.c -lcuda (no cuheap).
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 15
#define MiB    (1ull << 20)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof(*v), cmp);
    return v[n / 2];
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, (int)r_);                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 1ull << 30, 0, 0, 0));
    printf("%-32s %9s %9s %9s %9s %9s %9s\n", "chunk (one mapping)", "create", "map", "access",
           "unmap", "release", "us/2MiB");
    uint64_t sizes[] = {2 * MiB, 8 * MiB, 32 * MiB, 64 * MiB, 256 * MiB};
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
        double t[5][ROUNDS];
        for (int i = 0; i < ROUNDS; i++) {
            CUmemGenericAllocationHandle h;
            double t0 = now_us();
            CHECK(cuMemCreate(&h, sizes[s], &prop, 0));
            double t1 = now_us();
            CHECK(cuMemMap(va, sizes[s], 0, h, 0));
            double t2 = now_us();
            CHECK(cuMemSetAccess(va, sizes[s], &acc, 1));
            double t3 = now_us();
            CHECK(cuMemUnmap(va, sizes[s]));
            double t4 = now_us();
            CHECK(cuMemRelease(h));
            double t5 = now_us();
            t[0][i] = t1 - t0, t[1][i] = t2 - t1, t[2][i] = t3 - t2, t[3][i] = t4 - t3;
            t[4][i] = t5 - t4;
        }
        double m[5], sum = 0;
        for (int k = 0; k < 5; k++)
            sum += m[k] = median(t[k], ROUNDS);
        char name[64];
        snprintf(name, sizeof(name), "%llu MiB", (unsigned long long)(sizes[s] / MiB));
        printf("%-32s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", name, m[0], m[1], m[2], m[3], m[4],
               sum / (sizes[s] / (2 * MiB)));
    }
    /* one 64 MiB handle: 32 mappings of 2 MiB vs one; and moving a run of them */
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, 64 * MiB, &prop, 0));
    double map32[ROUNDS], acc32[ROUNDS], unmap32[ROUNDS], remap1[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        double t0 = now_us();
        for (int g = 0; g < 32; g++)
            CHECK(cuMemMap(va + g * 2 * MiB, 2 * MiB, g * 2 * MiB, h, 0));
        double t1 = now_us();
        for (int g = 0; g < 32; g++)
            CHECK(cuMemSetAccess(va + g * 2 * MiB, 2 * MiB, &acc, 1));
        double t2 = now_us();
        for (int g = 0; g < 32; g++)
            CHECK(cuMemUnmap(va + g * 2 * MiB, 2 * MiB));
        double t3 = now_us();
        /* the same 64 MiB as one mapping at another address: a move of the whole run */
        CHECK(cuMemMap(va + 128 * MiB, 64 * MiB, 0, h, 0));
        CHECK(cuMemSetAccess(va + 128 * MiB, 64 * MiB, &acc, 1));
        CHECK(cuMemUnmap(va + 128 * MiB, 64 * MiB));
        double t4 = now_us();
        map32[i] = t1 - t0, acc32[i] = t2 - t1, unmap32[i] = t3 - t2, remap1[i] = t4 - t3;
    }
    printf("64 MiB handle as 32 x 2 MiB mappings: map %.1f, access %.1f, unmap %.1f us\n",
           median(map32, ROUNDS), median(acc32, ROUNDS), median(unmap32, ROUNDS));
    printf("64 MiB handle as one mapping: map+access+unmap %.1f us\n", median(remap1, ROUNDS));
    /* access over one range made of 32 adjacent mappings of one handle */
    double accr[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        for (int g = 0; g < 32; g++)
            CHECK(cuMemMap(va + g * 2 * MiB, 2 * MiB, g * 2 * MiB, h, 0));
        double t0 = now_us();
        CHECK(cuMemSetAccess(va, 64 * MiB, &acc, 1));
        accr[i] = now_us() - t0;
        for (int g = 0; g < 32; g++)
            CHECK(cuMemUnmap(va + g * 2 * MiB, 2 * MiB));
    }
    printf("one cuMemSetAccess over 32 adjacent mappings of one handle: %.1f us\n",
           median(accr, ROUNDS));
    /* can a sub-range of one mapping be unmapped? */
    CHECK(cuMemMap(va, 64 * MiB, 0, h, 0));
    CHECK(cuMemSetAccess(va, 64 * MiB, &acc, 1));
    CUresult sub = cuMemUnmap(va + 32 * MiB, 32 * MiB);
    printf("cuMemUnmap of the upper half of one 64 MiB mapping: %d\n", (int)sub);
    if (sub != CUDA_SUCCESS)
        CHECK(cuMemUnmap(va, 64 * MiB));
    else
        CHECK(cuMemUnmap(va, 32 * MiB));
    /* the same handle mapped at two addresses at once */
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
    CUresult twice = cuMemMap(va + 512 * MiB, 2 * MiB, 0, h, 0);
    printf("second mapping of the same physical 2 MiB: %d\n", (int)twice);
    CHECK(cuMemUnmap(va, 2 * MiB));
    if (twice == CUDA_SUCCESS)
        CHECK(cuMemUnmap(va + 512 * MiB, 2 * MiB));
    CHECK(cuMemRelease(h));
    /* cuMemSetAccess again on an accessible mapping (a peer granted later re-sets all) */
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
    CHECK(cuMemSetAccess(va, 2 * MiB, &acc, 1));
    double again[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        double t0 = now_us();
        CHECK(cuMemSetAccess(va, 2 * MiB, &acc, 1));
        again[i] = now_us() - t0;
    }
    printf("cuMemSetAccess again on an accessible 2 MiB mapping: %.1f us\n", median(again, ROUNDS));
    CHECK(cuMemUnmap(va, 2 * MiB));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, 1ull << 30));
    return 0;
}
