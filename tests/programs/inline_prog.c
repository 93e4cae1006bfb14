/* SPDX-License-Identifier: MIT */
/*
 * inline-prog: allocates through a function the compiler inlines into its caller, so the
 * tool's stacks must name the inlined function and its caller's line from the debug
 * information, not only the one physical frame (tests/integration/test-process.c).
 */
#include <stdlib.h>

#define DOOR_PROCADDR 1
#include "driver_api.h"

static struct driver_api cu;

CUdeviceptr make_buffer(size_t bytes);

/* Inlined: its call to cuMemAlloc sits inside make_buffer's code. */
static inline __attribute__((always_inline)) CUdeviceptr grab(size_t bytes)
{
    CUdeviceptr p = 0;
    if (cu.cuMemAlloc_v2(&p, bytes) != CUDA_SUCCESS)
        exit(1);
    return p;
}

__attribute__((noinline, visibility("default"))) CUdeviceptr make_buffer(size_t bytes)
{
    CUdeviceptr p = grab(bytes); /* the call site the inlined frame points to */
    return p;
}

int main(void)
{
    if (driver_api_start(&cu, 0))
        return 1;
    CUdeviceptr p = make_buffer(1 << 20);
    cu.cuMemFree_v2(p);
    printf("inline-prog: ok\n");
    return 0;
}
