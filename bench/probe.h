/* SPDX-License-Identifier: MIT */
/*
 * What the driver probes (probe-vmm.c, probe-fence.c) share: a clock, quantiles, a check that
 * stops at the first refused call, and a kernel that spins on the GPU's clock. They link
 * libcuda themselves and include no part of cuheap.
 */
#ifndef CUHEAP_BENCH_PROBE_H
#define CUHEAP_BENCH_PROBE_H

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MiB (1ull << 20)

static inline double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline double now_us(void)
{
    return now_ns() / 1e3;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of v's n values (sorts v). */
static inline double quantile(double *v, int n, double q)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[(int)(q * (n - 1))];
}

static inline double median(double *v, int n)
{
    qsort(v, n, sizeof(*v), cmp_double);
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

/* PTX of a kernel `spin` that runs until the GPU's clock passes ns nanoseconds from its
 * start (a probe's module may add kernels of its own after it). */
#define SPIN_PTX                                                                                   \
    ".version 7.0\n.target sm_70\n.address_size 64\n"                                              \
    ".visible .entry spin(.param .u64 ns)\n{\n"                                                    \
    ".reg .u64 %rd<5>;\n.reg .pred %p;\n"                                                          \
    "ld.param.u64 %rd1, [ns];\nmov.u64 %rd2, %globaltimer;\n"                                      \
    "add.u64 %rd3, %rd2, %rd1;\nLOOP:\nmov.u64 %rd4, %globaltimer;\n"                              \
    "setp.lt.u64 %p, %rd4, %rd3;\n@%p bra LOOP;\nret;\n}\n"

/* One thread of `spin` on stream s for ns nanoseconds. */
static inline void spin(CUfunction f, CUstream s, uint64_t ns)
{
    void *args[] = {&ns};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
}

#endif
