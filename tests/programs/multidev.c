/* SPDX-License-Identifier: MIT */
/* Allocates on every device the driver has, switching primary contexts, for the multi-device
 * tests (the simulated driver: FAKECUDA_DEVICE_COUNT). Prints one line per device. */
#include <stdlib.h>

#define DOOR_PROCADDR 1
#include "driver_api.h"

int main(void)
{
    struct driver_api d;
    int n = 0;
    if (driver_api_open(&d) || d.cuInit(0) || d.cuDeviceGetCount(&n))
        return 1;
    for (int dev = 0; dev < n; dev++) {
        CUdevice h;
        CUcontext ctx;
        if (d.cuDeviceGet(&h, dev) || d.cuDevicePrimaryCtxRetain(&ctx, h) || d.cuCtxSetCurrent(ctx))
            return 1;
        CUdeviceptr p[4];
        for (int i = 0; i < 4; i++)
            if (d.cuMemAlloc_v2(&p[i], (size_t)(dev + 1) << 20))
                return 1;
        for (int i = 0; i < 3; i++) /* one stays live per device */
            if (d.cuMemFree_v2(p[i]))
                return 1;
        printf("device %d: ok\n", dev);
    }
    return 0;
}
