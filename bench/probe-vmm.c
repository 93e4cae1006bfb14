/* SPDX-License-Identifier: MIT */
/*
 * What the driver's VMM calls cost by mapping size, on the machine it runs on: the figures the
 * pool's physical layout depends on. For each physical chunk size: cuMemCreate, cuMemMap,
 * cuMemSetAccess, cuMemUnmap, cuMemRelease of one chunk mapped whole (median of ROUNDS), then
 * one 64 MiB chunk mapped as 32 separate 2 MiB pieces (offsets into the handle), and whether a
 * sub-range of a mapping can be unmapped. Then which calls wait for work running on the GPU
 * (each timed right after a 20 ms kernel starts on another stream) and what mapping calls
 * made meanwhile cost a stream of short kernels; and whether a thread's mapping calls wait for
 * another thread's (CUHEAP_VMM_DEFER leaves unmaps to a thread of cuheap's). PROBE_PART=threads
 * runs only that part. Build: gcc -O2 probe-vmm.c -lcuda -lpthread (no cuheap).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe.h"

#define ROUNDS 15
/* the module: spin (probe.h), then touch */
static const char spin_ptx[] = SPIN_PTX
    /* and one that writes n words of buf, every thread a stride */
    ".visible .entry touch(.param .u64 buf, .param .u64 n)\n{\n"
    ".reg .u64 %rd<8>;\n.reg .u32 %r<5>;\n.reg .pred %p;\n"
    "ld.param.u64 %rd1, [buf];\nld.param.u64 %rd2, [n];\n"
    "mov.u32 %r1, %ctaid.x;\nmov.u32 %r2, %ntid.x;\n"
    "mov.u32 %r3, %tid.x;\nmov.u32 %r4, %nctaid.x;\n"
    "mul.wide.u32 %rd3, %r1, %r2;\ncvt.u64.u32 %rd4, %r3;\n"
    "add.u64 %rd3, %rd3, %rd4;\nmul.wide.u32 %rd5, %r4, %r2;\n"
    "TLOOP:\nsetp.ge.u64 %p, %rd3, %rd2;\n@%p bra TDONE;\n"
    "shl.b64 %rd6, %rd3, 2;\nadd.u64 %rd7, %rd1, %rd6;\n"
    "st.global.u32 [%rd7], %r3;\nadd.u64 %rd3, %rd3, %rd5;\n"
    "bra TLOOP;\nTDONE:\nret;\n}\n";

enum { OP_CREATE, OP_MAP, OP_ACCESS, OP_UNMAP, OP_RELEASE, OP_ALLOC, OP_FREE, OP_EVENT, NR_OPS };
static const char *const op_names[NR_OPS] = {"cuMemCreate", "cuMemMap",           "cuMemSetAccess",
                                             "cuMemUnmap",  "cuMemRelease",       "cuMemAlloc",
                                             "cuMemFree",   "cuEventRecord+Query"};

/* Which calls wait for a kernel running on another (non-blocking) stream: each is timed right
 * after a 20 ms kernel starts; a call that waits takes about the kernel's remaining time. */
static void probe_busy(CUfunction f, CUfunction touch, CUdeviceptr va,
                       const CUmemAllocationProp *prop, const CUmemAccessDesc *acc)
{
    enum { BUSY_ROUNDS = 5 };
    CUstream s, other;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    printf("%-22s %12s %12s   (ms, median of %d; kernel 20 ms)\n", "call", "GPU idle", "GPU busy",
           BUSY_ROUNDS);
    for (int op = 0; op < NR_OPS; op++) {
        double t[2][BUSY_ROUNDS];
        for (int busy = 0; busy < 2; busy++)
            for (int i = 0; i < BUSY_ROUNDS; i++) {
                CUmemGenericAllocationHandle h = 0;
                CUdeviceptr d = 0;
                /* what the call needs, made before the kernel starts */
                if (op > OP_CREATE && op <= OP_RELEASE)
                    CHECK(cuMemCreate(&h, 2 * MiB, prop, 0));
                if (op > OP_MAP && op <= OP_RELEASE)
                    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
                if (op > OP_ACCESS && op <= OP_RELEASE)
                    CHECK(cuMemSetAccess(va, 2 * MiB, acc, 1));
                if (op == OP_RELEASE)
                    CHECK(cuMemUnmap(va, 2 * MiB));
                if (op == OP_FREE)
                    CHECK(cuMemAlloc(&d, 2 * MiB));
                CHECK(cuCtxSynchronize());
                if (busy)
                    spin(f, s, 20000000);
                /* 1 ms for the kernel to start, spent the same way in both columns: a sleep
                 * here made the busy column time a CPU waking up (even cuMemMap 1 -> 14 us) */
                for (double w = now_us(); now_us() - w < 1000;)
                    ;
                double t0 = now_us();
                switch (op) {
                case OP_CREATE:
                    CHECK(cuMemCreate(&h, 2 * MiB, prop, 0));
                    break;
                case OP_MAP:
                    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
                    break;
                case OP_ACCESS:
                    CHECK(cuMemSetAccess(va, 2 * MiB, acc, 1));
                    break;
                case OP_UNMAP:
                    CHECK(cuMemUnmap(va, 2 * MiB));
                    break;
                case OP_RELEASE:
                    CHECK(cuMemRelease(h));
                    break;
                case OP_ALLOC:
                    CHECK(cuMemAlloc(&d, 2 * MiB));
                    break;
                case OP_FREE:
                    CHECK(cuMemFree(d));
                    break;
                case OP_EVENT:
                    CHECK(cuEventRecord(ev, other));
                    (void)cuEventQuery(ev);
                    break;
                }
                t[busy][i] = (now_us() - t0) / 1e3;
                CHECK(cuCtxSynchronize());
                /* undo what is left */
                if (op >= OP_MAP && op < OP_UNMAP)
                    CHECK(cuMemUnmap(va, 2 * MiB));
                if (op < OP_RELEASE)
                    CHECK(cuMemRelease(h));
                if (op == OP_ALLOC)
                    CHECK(cuMemFree(d));
            }
        printf("%-22s %12.3f %12.3f\n", op_names[op], median(t[0], BUSY_ROUNDS),
               median(t[1], BUSY_ROUNDS));
    }
    /* a stream of 400 kernels of 50 us (20 ms of GPU work) while the CPU makes `moves` moves of
     * a 2 MiB granule (unmap, map elsewhere, set access), like a pool's steady state */
    CUevent e0, e1;
    CHECK(cuEventCreate(&e0, 0));
    CHECK(cuEventCreate(&e1, 0));
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, 2 * MiB, prop, 0));
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
    CHECK(cuMemSetAccess(va, 2 * MiB, acc, 1));
    int where = 0;
    /* kernels that touch no memory, then kernels that write 64 MiB each (does an unmap's TLB
     * work slow the GPU's memory traffic?) */
    CUdeviceptr buf;
    uint64_t words = 16ull << 20;
    CHECK(cuMemAlloc(&buf, words * 4));
    for (int kind = 0; kind < 2; kind++)
        for (int moves = 0; moves <= 64; moves = moves ? moves * 4 : 4) {
            if (moves == 0)
                printf("400 %s on one stream, CPU moving a 2 MiB granule meanwhile:\n",
                       kind ? "kernels writing 64 MiB each (528 x 256 threads)"
                            : "x 50 us kernels");
            double gpu[BUSY_ROUNDS], cpu[BUSY_ROUNDS];
            for (int i = 0; i < BUSY_ROUNDS; i++) {
                CHECK(cuCtxSynchronize());
                CHECK(cuEventRecord(e0, s));
                for (int k = 0; k < 400; k++) {
                    if (!kind) {
                        spin(f, s, 50000);
                        continue;
                    }
                    void *args[] = {&buf, &words};
                    CHECK(cuLaunchKernel(touch, 528, 1, 1, 256, 1, 1, 0, s, args, NULL));
                }
                CHECK(cuEventRecord(e1, s));
                double t0 = now_us();
                for (int m = 0; m < moves; m++) {
                    CHECK(cuMemUnmap(va + (uint64_t)where * 2 * MiB, 2 * MiB));
                    where ^= 1;
                    CHECK(cuMemMap(va + (uint64_t)where * 2 * MiB, 2 * MiB, 0, h, 0));
                    CHECK(cuMemSetAccess(va + (uint64_t)where * 2 * MiB, 2 * MiB, acc, 1));
                }
                cpu[i] = (now_us() - t0) / 1e3;
                CHECK(cuEventSynchronize(e1));
                float ms;
                CHECK(cuEventElapsedTime(&ms, e0, e1));
                gpu[i] = ms;
            }
            printf("  %2d moves: GPU %.2f ms for the kernels, CPU %.3f ms for the moves\n", moves,
                   median(gpu, BUSY_ROUNDS), median(cpu, BUSY_ROUNDS));
        }
    CHECK(cuMemFree(buf));
    CHECK(cuMemUnmap(va + (uint64_t)where * 2 * MiB, 2 * MiB));
    CHECK(cuMemRelease(h));
    CHECK(cuEventDestroy(e0));
    CHECK(cuEventDestroy(e1));
    CHECK(cuEventDestroy(ev));
    CHECK(cuStreamDestroy(s));
    CHECK(cuStreamDestroy(other));
}

/* The other thread of probe_threads(): a 2 MiB handle mapped and unmapped over and over. */
struct other_thread {
    CUcontext ctx;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    atomic_bool stop;
    long nr;
    double us;
};

static void *other_main(void *arg)
{
    struct other_thread *o = arg;
    CHECK(cuCtxSetCurrent(o->ctx));
    double t0 = now_us();
    while (!atomic_load(&o->stop)) {
        CHECK(cuMemMap(o->va, 2 * MiB, 0, o->h, 0));
        CHECK(cuMemUnmap(o->va, 2 * MiB));
        o->nr++;
    }
    o->us = now_us() - t0;
    return NULL;
}

/* Whether one thread's map, access and unmap of a 2 MiB granule take longer while another
 * thread maps and unmaps a granule of its own: if the driver made the calls of two threads one
 * at a time, leaving unmaps to another thread would save the allocating thread nothing. */
static void probe_threads(CUcontext ctx, CUdeviceptr va, const CUmemAllocationProp *prop,
                          const CUmemAccessDesc *acc)
{
    enum { N = 400 };
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, 2 * MiB, prop, 0));
    struct other_thread o = {.ctx = ctx, .va = va + 256 * MiB};
    CHECK(cuMemCreate(&o.h, 2 * MiB, prop, 0));
    for (int round = 0; round < 3; round++)
        for (int with = 0; with < 2; with++) {
            pthread_t t;
            o.nr = 0;
            atomic_store(&o.stop, false);
            if (with)
                pthread_create(&t, NULL, other_main, &o);
            double it[N], map[N], access[N], unmap[N];
            for (int i = 0; i < N; i++) {
                double t0 = now_us();
                CHECK(cuMemMap(va, 2 * MiB, 0, h, 0));
                double t1 = now_us();
                CHECK(cuMemSetAccess(va, 2 * MiB, acc, 1));
                double t2 = now_us();
                CHECK(cuMemUnmap(va, 2 * MiB));
                double t3 = now_us();
                it[i] = t3 - t0, map[i] = t1 - t0, access[i] = t2 - t1, unmap[i] = t3 - t2;
            }
            atomic_store(&o.stop, true);
            if (with)
                pthread_join(t, NULL);
            printf("threads round %d: map+access+unmap %s: %.1f us (map %.1f, access %.1f, "
                   "unmap %.1f)",
                   round, with ? "while another thread maps and unmaps" : "alone", median(it, N),
                   median(map, N), median(access, N), median(unmap, N));
            if (with)
                printf("; the other thread: %.1f us a map+unmap", o.us / (o.nr ? o.nr : 1));
            printf("\n");
        }
    CHECK(cuMemRelease(h));
    CHECK(cuMemRelease(o.h));
}

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
    probe_threads(ctx, va, &prop, &acc);
    const char *part_only = getenv("PROBE_PART");
    if (part_only && !strcmp(part_only, "threads"))
        return 0;
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
    CUresult part = cuMemMap(va, 2 * MiB, 2 * MiB, h, 0);
    if (part == CUDA_SUCCESS)
        CHECK(cuMemUnmap(va, 2 * MiB));
    else /* seen on driver 580 with POSIX FD handles: 801, not supported */
        printf("cuMemMap of 2 MiB at an offset into a 64 MiB handle: %d; skipped\n", (int)part);
    for (int i = 0; i < ROUNDS; i++) {
        double t0 = now_us(), t1 = t0, t2 = t0, t3 = t0;
        if (part == CUDA_SUCCESS) {
            for (int g = 0; g < 32; g++)
                CHECK(cuMemMap(va + g * 2 * MiB, 2 * MiB, g * 2 * MiB, h, 0));
            t1 = now_us();
            for (int g = 0; g < 32; g++)
                CHECK(cuMemSetAccess(va + g * 2 * MiB, 2 * MiB, &acc, 1));
            t2 = now_us();
            for (int g = 0; g < 32; g++)
                CHECK(cuMemUnmap(va + g * 2 * MiB, 2 * MiB));
            t3 = now_us();
        }
        /* the same 64 MiB as one mapping at another address: a move of the whole run */
        CHECK(cuMemMap(va + 128 * MiB, 64 * MiB, 0, h, 0));
        CHECK(cuMemSetAccess(va + 128 * MiB, 64 * MiB, &acc, 1));
        CHECK(cuMemUnmap(va + 128 * MiB, 64 * MiB));
        double t4 = now_us();
        map32[i] = t1 - t0, acc32[i] = t2 - t1, unmap32[i] = t3 - t2, remap1[i] = t4 - t3;
    }
    if (part == CUDA_SUCCESS)
        printf("64 MiB handle as 32 x 2 MiB mappings: map %.1f, access %.1f, unmap %.1f us\n",
               median(map32, ROUNDS), median(acc32, ROUNDS), median(unmap32, ROUNDS));
    printf("64 MiB handle as one mapping: map+access+unmap %.1f us\n", median(remap1, ROUNDS));
    /* access over one range made of 32 adjacent mappings of one handle */
    double accr[ROUNDS];
    for (int i = 0; i < ROUNDS && part == CUDA_SUCCESS; i++) {
        for (int g = 0; g < 32; g++)
            CHECK(cuMemMap(va + g * 2 * MiB, 2 * MiB, g * 2 * MiB, h, 0));
        double t0 = now_us();
        CHECK(cuMemSetAccess(va, 64 * MiB, &acc, 1));
        accr[i] = now_us() - t0;
        for (int g = 0; g < 32; g++)
            CHECK(cuMemUnmap(va + g * 2 * MiB, 2 * MiB));
    }
    if (part == CUDA_SUCCESS)
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
    CHECK(cuMemMap(va, 64 * MiB, 0, h, 0));
    CUresult twice = cuMemMap(va + 512 * MiB, 64 * MiB, 0, h, 0);
    printf("second mapping of the same physical 64 MiB: %d\n", (int)twice);
    CHECK(cuMemUnmap(va, 64 * MiB));
    if (twice == CUDA_SUCCESS)
        CHECK(cuMemUnmap(va + 512 * MiB, 64 * MiB));
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
    CUmodule mod;
    CUfunction f, touch;
    CHECK(cuModuleLoadData(&mod, spin_ptx));
    CHECK(cuModuleGetFunction(&f, mod, "spin"));
    CHECK(cuModuleGetFunction(&touch, mod, "touch"));
    probe_busy(f, touch, va, &prop, &acc);
    CHECK(cuModuleUnload(mod));
    CHECK(cuMemAddressFree(va, 1ull << 30));
    return 0;
}
