/* SPDX-License-Identifier: MIT */
/*
 * A CUDA program for the live view's and the out-of-memory tests (tests/integration/test-live.c):
 *   grow N MS [MB]     keeps one more block of MB MiB (1) every MS ms, N times, then frees
 *                      them all
 *   oom-recover SIZE   fills the device with SIZE blocks until refused, asks for one more
 *                      (refused), frees two blocks and asks again, as a caching allocator does
 *                      after an out-of-memory; exits 0 when the second answer was memory
 *   oom-giveup SIZE    fills the device the same way, is refused, and gives up (exit 3)
 *   oom-caching SIZE LIB  loads LIB (a stand-in named as PyTorch's libc10_cuda.so), then as
 *                      oom-giveup
 *   oom-other SIZE     is refused the same way, frees a block and goes on with a smaller
 *                      request (not a retry), waits 300 ms and says "liveprog: went on"
 * Linked with the driver; built without -rdynamic, so its static functions are in .symtab only.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NR_BLOCKS_MAX 4096

static CUdeviceptr blocks[NR_BLOCKS_MAX];
static int nr_blocks;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts))
        ;
}

static int start(void)
{
    CUdevice dev;
    CUcontext ctx;
    return cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
           cuCtxSetCurrent(ctx);
}

static __attribute__((noinline)) CUresult keep_block(size_t size)
{
    CUdeviceptr p;
    CUresult r = cuMemAlloc(&p, size);
    if (r == CUDA_SUCCESS && nr_blocks < NR_BLOCKS_MAX)
        blocks[nr_blocks++] = p;
    return r;
}

/* Blocks of size until the driver refuses one. */
static __attribute__((noinline)) void fill_device(size_t size)
{
    while (nr_blocks < NR_BLOCKS_MAX && keep_block(size) == CUDA_SUCCESS)
        ;
}

static __attribute__((noinline)) CUresult ask_for_more(size_t size, CUdeviceptr *ret)
{
    return cuMemAlloc(ret, size);
}

int main(int argc, char **argv)
{
    if (argc < 3 || start())
        return 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "grow")) {
        long n = atol(argv[2]), ms = argc > 3 ? atol(argv[3]) : 10;
        size_t mb = argc > 4 ? (size_t)atol(argv[4]) : 1;
        for (long i = 0; i < n; i++) {
            if (keep_block(mb << 20))
                return 1;
            sleep_ms(ms);
        }
        for (int i = 0; i < nr_blocks; i++)
            cuMemFree(blocks[i]);
        return 0;
    }
    if (!strcmp(cmd, "oom-caching")) {
        if (argc < 4 || !dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL))
            return 5;
        cmd = "oom-giveup";
    }
    size_t size = (size_t)atol(argv[2]) << 20;
    fill_device(size);
    CUdeviceptr p;
    CUresult r = ask_for_more(size, &p);
    if (r != CUDA_ERROR_OUT_OF_MEMORY)
        return 4; /* the device was not full */
    if (!strcmp(cmd, "oom-giveup")) {
        fprintf(stderr, "liveprog: out of memory, giving up\n");
        return 3;
    }
    if (!strcmp(cmd, "oom-other")) {
        cuMemFree(blocks[--nr_blocks]);
        if (keep_block(1 << 20))
            return 1;
        sleep_ms(300);
        fprintf(stderr, "liveprog: went on\n");
        return 0;
    }
    cuMemFree(blocks[--nr_blocks]);
    cuMemFree(blocks[--nr_blocks]);
    r = ask_for_more(size, &p);
    printf("second answer %d\n", (int)r);
    return r == CUDA_SUCCESS ? 0 : 1;
}
