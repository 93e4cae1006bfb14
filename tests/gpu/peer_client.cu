// SPDX-License-Identifier: MIT
// Peer access on pooled memory (two GPUs): device 1's buffers, one allocated before
// cudaDeviceEnablePeerAccess and one after, are read and written by a kernel running on
// device 0, and copied with cudaMemcpyPeer. Prints "checksum X" (the same with and without
// cuheap) or fails with the CUDA error (an unmapped or inaccessible peer buffer faults).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void fill(unsigned *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (unsigned)(i * 2654435761u) ^ seed;
}

// runs on device 0: reads src (device 1), writes dst (device 1) and sums into out (device 0)
__global__ void peer_mix(const unsigned *src, unsigned *dst, size_t n, unsigned long long *out)
{
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = src[i] * 3u + 1u;
        s += src[i];
    }
    atomicAdd(out, s);
}

int main()
{
    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("skip: %d device(s)\n", n);
        return 0;
    }
    const size_t words = (24u << 20) / 4; // 24 MiB: several granules and chunks
    unsigned *before, *after, *local, *copy;
    unsigned long long *sum;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&before, words * 4));
    fill<<<256, 256>>>(before, words, 7);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&after, words * 4)); // mapped after peer access was enabled
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&local, words * 4));
    CHECK(cudaMalloc(&copy, words * 4));
    CHECK(cudaMalloc(&sum, sizeof(*sum)));
    CHECK(cudaMemset(sum, 0, sizeof(*sum)));
    peer_mix<<<256, 256>>>(before, after, words, sum); // device 0 touches device 1's memory
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpyPeer(copy, 0, after, 1, words * 4));
    unsigned *host = (unsigned *)malloc(words * 4);
    unsigned long long s = 0, h = 0;
    CHECK(cudaMemcpy(host, copy, words * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&s, sum, sizeof(s), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < words; i++)
        h = h * 1099511628211ull + host[i];
    printf("checksum %llx %llx\n", s, h);
    CHECK(cudaFree(local));
    CHECK(cudaFree(copy));
    CHECK(cudaFree(sum));
    CHECK(cudaSetDevice(1));
    CHECK(cudaFree(before));
    CHECK(cudaFree(after));
    free(host);
    return 0;
}
