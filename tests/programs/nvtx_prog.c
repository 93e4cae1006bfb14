/* SPDX-License-Identifier: MIT */
/* A CUDA program that annotates its phases with NVTX, for the tests that check NVTX ranges
 * reach the trace (cuheap as the NVTX injection library). */
#include <nvtx3/nvToolsExt.h>
#include <stdlib.h>

#define DOOR_PROCADDR 1
#include "driver_api.h"

int main(void)
{
    struct driver_api d;
    if (driver_api_start(&d, 0))
        return 1;
    CUdeviceptr p;
    for (int step = 0; step < 3; step++) {
        nvtxRangePushA("forward");
        if (d.cuMemAlloc_v2(&p, 1 << 20))
            return 1;
        nvtxMarkA("activations ready");
        nvtxRangePop();
        if (d.cuMemFree_v2(p))
            return 1;
    }
    printf("nvtx_prog: ok\n");
    return 0;
}
