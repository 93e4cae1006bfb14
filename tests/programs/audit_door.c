/* SPDX-License-Identifier: MIT */
/*
 * The audit's test program, for the simulated driver and for a GPU alike. It allocates
 * through hooked doors (dlsym on libcuda.so.1): small and large cuMemAlloc, stream-ordered,
 * pinned host memory. With "miss" it also takes cuMemAlloc_v2 and cuMemFree_v2 through a door
 * cuheap does not cover, dlvsym() (cuheap overrides dlsym only; glibc's dlvsym hands out an
 * unversioned symbol for any version), falling back to glibc's own dlsym, so the audit must
 * name that allocation. Prints "missed 0xADDR BYTES" for it and "ok" at the end.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef void *(*dlsym_fn)(void *, const char *);

/* A function from dlsym into a function pointer, as ISO C allows: through its bytes. */
#define LOAD(var, name)                                                                            \
    do {                                                                                           \
        void *p_ = dlsym(h, name);                                                                 \
        memcpy(&(var), &p_, sizeof(p_));                                                           \
    } while (0)

/* The driver's function, past cuheap's dlsym. */
static void *uncovered(void *h, const char *name, const char **ret_how)
{
    void *p = dlvsym(h, name, "CUHEAP_AUDIT_MISS");
    *ret_how = "dlvsym";
    if (!p) {
        void *q = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!q)
            q = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        dlsym_fn real;
        memcpy(&real, &q, sizeof(q));
        p = real ? real(h, name) : NULL;
        *ret_how = "glibc dlsym";
    }
    return p;
}

int main(int argc, char **argv)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "audit-door: no libcuda.so.1\n");
        return 1;
    }
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*ctx_sync)(void);
    alloc_fn mem_alloc;
    free_fn mem_free;
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*host_alloc)(void **, size_t, unsigned);
    CUresult (*free_host)(void *);
    LOAD(init, "cuInit");
    LOAD(device_get, "cuDeviceGet");
    LOAD(retain, "cuDevicePrimaryCtxRetain");
    LOAD(set_current, "cuCtxSetCurrent");
    LOAD(ctx_sync, "cuCtxSynchronize");
    LOAD(mem_alloc, "cuMemAlloc_v2");
    LOAD(mem_free, "cuMemFree_v2");
    LOAD(alloc_async, "cuMemAllocAsync");
    LOAD(free_async, "cuMemFreeAsync");
    LOAD(stream_sync, "cuStreamSynchronize");
    LOAD(host_alloc, "cuMemHostAlloc");
    LOAD(free_host, "cuMemFreeHost");
    CUdevice dev;
    CUcontext ctx;
    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));
    /* pooled when the pool is on (up to CUHEAP_POOL_MAX), passed through otherwise */
    static const size_t sizes[] = {512, 4096, 1 << 20, 20 << 20, 96 << 20};
    CUdeviceptr p[5];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 5; i++)
            CHECK(mem_alloc(&p[i], sizes[i]));
        for (int i = 4; i >= 0; i--)
            CHECK(mem_free(p[i]));
    }
    CUdeviceptr a;
    CHECK(alloc_async(&a, 1 << 16, NULL));
    CHECK(free_async(a, NULL));
    CHECK(stream_sync(NULL));
    void *host;
    CHECK(host_alloc(&host, 1 << 16, 0));
    CHECK(free_host(host));
    if (argc > 1 && !strcmp(argv[1], "miss")) {
        const char *how;
        void *pa = uncovered(h, "cuMemAlloc_v2", &how), *pf = uncovered(h, "cuMemFree_v2", &how);
        alloc_fn raw_alloc;
        free_fn raw_free;
        memcpy(&raw_alloc, &pa, sizeof(pa));
        memcpy(&raw_free, &pf, sizeof(pf));
        if (!raw_alloc || !raw_free) {
            fprintf(stderr, "audit-door: no uncovered door to the driver\n");
            return 1;
        }
        CUdeviceptr m;
        CHECK(raw_alloc(&m, 8 << 20));
        printf("missed 0x%llx %d (through %s)\n", (unsigned long long)m, 8 << 20, how);
        CHECK(raw_free(m));
    }
    CHECK(ctx_sync());
    printf("ok\n");
    return 0;
}
