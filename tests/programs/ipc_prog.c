/* SPDX-License-Identifier: MIT */
/*
 * Sharing device memory with another process, as torch.multiprocessing does: the parent
 * fills blocks, exports each with cuIpcGetMemHandle, and starts a child (a new program, so it
 * runs cuheap afresh when preloaded) that opens the handle, checks every byte, writes its own
 * pattern and closes it; the parent then checks the child's bytes. Blocks: one over several
 * 2 MiB granules, two small ones side by side in one granule, and an interior pointer (the
 * handle names the whole block, as the driver's names the whole allocation). A handle whose
 * block was freed since must fail in the child, never give it bytes.
 *
 *   ipc-prog                      the parent; prints "ipc BLOCK: ok" or what went wrong
 *   ipc-prog child HEX SIZE SEED  the child
 *
 * Exit status 0 when every block was shared with the right bytes and the freed one was not,
 * 1 otherwise. (The simulated driver shares VMM memory between processes, not cuMemAlloc
 * memory: run it under CUHEAP_BACKING=vmm.)
 */
#include <cuda.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *self;

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "ipc-prog: %s failed: %d\n", #x, (int)r_);                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void pattern(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)((i * 131u + seed * 7u) >> 3 ^ seed);
}

static void to_hex(const CUipcMemHandle *h, char *out)
{
    for (size_t i = 0; i < sizeof(h->reserved); i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *in, CUipcMemHandle *h)
{
    for (size_t i = 0; i < sizeof(h->reserved); i++) {
        unsigned v;
        sscanf(in + 2 * i, "%2x", &v);
        h->reserved[i] = (char)v;
    }
}

/* The child: open, check the parent's pattern, write seed + 1, close. */
static int child(const char *hex, size_t size, unsigned seed)
{
    CUipcMemHandle h;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    from_hex(hex, &h);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
        printf("child: open failed %d\n", (int)r);
        return 3;
    }
    unsigned char *want = malloc(size), *got = malloc(size);
    pattern(want, size, seed);
    CHECK(cuMemcpyDtoH(got, p, size));
    bool same = !memcmp(want, got, size);
    pattern(want, size, seed + 1);
    CHECK(cuMemcpyHtoD(p, want, size));
    CHECK(cuIpcCloseMemHandle(p));
    free(want);
    free(got);
    printf("child: %s\n", same ? "bytes ok" : "WRONG BYTES");
    return same ? 0 : 4;
}

/* Start the child on a handle; returns its exit status. */
static int run_child(const CUipcMemHandle *h, size_t size, unsigned seed)
{
    char hex[2 * sizeof(h->reserved) + 1], sz[32], sd[32];
    to_hex(h, hex);
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(sd, sizeof(sd), "%u", seed);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "child", hex, sz, sd, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Share size bytes at offset `inner` into a block; returns false on a wrong result. */
static bool share(const char *name, CUdeviceptr block, size_t size, size_t inner, unsigned seed)
{
    unsigned char *buf = malloc(size), *want = malloc(size);
    pattern(buf, size, seed);
    CHECK(cuMemcpyHtoD(block, buf, size));
    CUipcMemHandle h;
    CUresult r = cuIpcGetMemHandle(&h, block + inner);
    bool ok;
    if (r != CUDA_SUCCESS) {
        printf("ipc %s: REFUSED (%d)\n", name, (int)r);
        ok = false;
    } else {
        int st = run_child(&h, size, seed);
        CHECK(cuMemcpyDtoH(buf, block, size));
        pattern(want, size, seed + 1);
        ok = st == 0 && !memcmp(buf, want, size);
        printf("ipc %s: %s (child %d)\n", name, ok ? "ok" : "FAILED", st);
    }
    free(buf);
    free(want);
    return ok;
}

int main(int argc, char **argv)
{
    self = argv[0];
    if (argc == 5 && !strcmp(argv[1], "child"))
        return child(argv[2], strtoull(argv[3], NULL, 10), (unsigned)atoi(argv[4]));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr big, small1, small2;
    CHECK(cuMemAlloc(&big, 5u << 20));
    CHECK(cuMemAlloc(&small1, 3000));
    CHECK(cuMemAlloc(&small2, 5000));
    bool ok = share("5 MiB block", big, 5u << 20, 0, 11);
    ok &= share("small block", small1, 3000, 0, 23);
    ok &= share("small block beside it", small2, 5000, 0, 37);
    ok &= share("interior pointer", big, 5u << 20, 4096, 41);
    /* a handle to a block freed since: the child must get an error, not bytes */
    CUipcMemHandle stale;
    if (cuIpcGetMemHandle(&stale, small1) == CUDA_SUCCESS) {
        CHECK(cuMemFree(small1));
        int st = run_child(&stale, 3000, 23);
        printf("ipc freed block: child %s\n", st == 3 ? "refused" : "DID NOT FAIL");
        ok &= st == 3;
        /* the same address handed out again to a new block: the old handle still must not
         * open it (the block is live, but not the one that was shared) */
        CUdeviceptr again[256];
        int n = 0, hit = -1;
        for (int i = 0; i < 600; i++) { /* frees enough to close the thread's fence batches */
            CHECK(cuMemAlloc(&again[0], 3000));
            CHECK(cuMemFree(again[0]));
        }
        CHECK(cuCtxSynchronize());
        while (n < 256 && hit < 0 && cuMemAlloc(&again[n], 3000) == CUDA_SUCCESS)
            if (again[n++] == small1)
                hit = n - 1;
        if (hit >= 0) {
            st = run_child(&stale, 3000, 23);
            printf("ipc reused address: child %s\n", st == 3 ? "refused" : "DID NOT FAIL");
            ok &= st == 3;
        } else {
            printf("ipc reused address: NOT REUSED in %d allocations\n", n);
            ok = false;
        }
        while (n)
            CHECK(cuMemFree(again[--n]));
    } else {
        CHECK(cuMemFree(small1));
    }
    CHECK(cuMemFree(big));
    CHECK(cuMemFree(small2));
    return ok ? 0 : 1;
}
