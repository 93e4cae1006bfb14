// SPDX-License-Identifier: MIT
// A plain CUDA runtime program for the GPU door checks, built twice: with the static runtime
// (nvcc's default) and the shared one. It allocates through the runtime APIs, runs a kernel
// over the memory and prints a checksum that must not change under cuheap, then how many
// allocations it made by API so the count cuheap saw can be compared.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <dlfcn.h>

__global__ void fill(unsigned *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (unsigned)(i * 2654435761u) ^ seed;
}

__global__ void sum(const unsigned *p, size_t n, unsigned long long *out)
{
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        s += p[i];
    atomicAdd(out, s);
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main()
{
    unsigned long long *out, total = 0;
    CHECK(cudaMalloc(&out, sizeof(*out)));
    int nr_sync = 1, nr_async = 0, nr_managed = 0, nr_host = 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int round = 0; round < 50; round++) {
        size_t n = (size_t)1024 << (round % 12); // 4 KiB .. 8 MiB of unsigned
        unsigned *p;
        CHECK(cudaMalloc(&p, n * sizeof(unsigned)));
        nr_sync++;
        fill<<<64, 256, 0, s>>>(p, n, (unsigned)round);
        CHECK(cudaMemsetAsync(out, 0, sizeof(*out), s));
        sum<<<64, 256, 0, s>>>(p, n, out);
        unsigned long long part;
        CHECK(cudaMemcpyAsync(&part, out, sizeof(part), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        total += part;
        CHECK(cudaFree(p));
        if (round % 10 == 0) {
            unsigned *a;
            CHECK(cudaMallocAsync(&a, 1 << 20, s));
            nr_async++;
            CHECK(cudaFreeAsync(a, s));
            unsigned *m;
            CHECK(cudaMallocManaged(&m, 1 << 20));
            nr_managed++;
            CHECK(cudaFree(m));
            void *h;
            CHECK(cudaMallocHost(&h, 1 << 16));
            nr_host++;
            CHECK(cudaFreeHost(h));
        }
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(out));
    // cudaGetDriverEntryPoint must lead to the same hooks as every other door
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &q));
    typedef int (*alloc_fn)(unsigned long long *, size_t);
    typedef int (*free_fn)(unsigned long long);
    void *ffn = nullptr;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemFree", &ffn, 12000, cudaEnableDefault, &q));
    unsigned long long dp = 0;
    if (fn && ffn && ((alloc_fn)fn)(&dp, 4096) == 0 && ((free_fn)ffn)(dp) == 0)
        nr_sync++;
    printf("checksum=%llu\n", total);
    uint64_t (*count)(const char *) = (uint64_t (*)(const char *))dlsym(RTLD_DEFAULT, "cuheap_call_count");
    printf("program: cudaMalloc=%d cudaMallocAsync=%d cudaMallocManaged=%d cudaMallocHost=%d\n",
           nr_sync, nr_async, nr_managed, nr_host);
    if (count)
        printf("cuheap: cuMemAlloc_v2=%llu cuMemFree_v2=%llu cuMemAllocAsync=%llu "
               "cuMemAllocAsync_ptsz=%llu cuMemAllocManaged=%llu cuMemAllocHost_v2=%llu "
               "cuMemHostAlloc=%llu\n",
               (unsigned long long)count("cuMemAlloc_v2"), (unsigned long long)count("cuMemFree_v2"),
               (unsigned long long)count("cuMemAllocAsync"),
               (unsigned long long)count("cuMemAllocAsync_ptsz"),
               (unsigned long long)count("cuMemAllocManaged"),
               (unsigned long long)count("cuMemAllocHost_v2"),
               (unsigned long long)count("cuMemHostAlloc"));
    return 0;
}
