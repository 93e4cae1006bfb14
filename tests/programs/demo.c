/* SPDX-License-Identifier: MIT */
/*
 * cuheap-demo: a stand-in for a training job, for the README's first command and for tests.
 * It reaches the driver the way every CUDA runtime does (dlopen + cuGetProcAddress), keeps
 * parameters alive, allocates activations in a forward pass and frees them in the backward
 * pass, runs "kernels" (host functions) on a non-blocking stream that read the buffers after
 * the host has moved on, and leaks a little every few steps, so the report has a peak, call
 * sites and a leak to show. It prints a loss computed from device memory: the same number
 * with and without cuheap.
 *
 *   cuheap-demo [STEPS] [LAYERS]
 */
#include <stdint.h>
#include <stdlib.h>

#define DOOR_PROCADDR 1
#include "driver_api.h"

#define NR_MAX_LAYERS 64
#define VISIBLE       __attribute__((visibility("default"), noinline)) /* names for dladdr */

struct tensor;
VISIBLE struct tensor layer_forward(int layer, int step);
VISIBLE void model_forward(struct tensor *acts, int layers, int step, uint64_t *loss);
VISIBLE void model_backward(struct tensor *acts, int layers);
VISIBLE void optimizer_step(struct tensor *params, int nr_params);
VISIBLE void grow_cache(int step);

static struct driver_api cu;
static CUstream compute;
static void (*mark)(const char *);

struct tensor {
    CUdeviceptr ptr;
    size_t bytes;
};

struct kernel_args {
    unsigned char *src;
    size_t n;
    uint64_t *sum;
};

/* A "kernel": sums a buffer on the stream's worker thread, long after the host moved on. */
static void sum_kernel(void *arg)
{
    struct kernel_args *k = arg;
    uint64_t s = 0;
    for (size_t i = 0; i < k->n; i += 4096)
        s += k->src[i];
    *k->sum += s;
    free(k);
}

static int check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuheap-demo: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
    return 0;
}

static struct tensor tensor_new(size_t bytes, unsigned char fill)
{
    struct tensor t = {0, bytes};
    check(cu.cuMemAlloc_v2(&t.ptr, bytes), "cuMemAlloc");
    check(cu.cuMemsetD8_v2(t.ptr, fill, bytes), "cuMemsetD8");
    return t;
}

static void tensor_free(struct tensor *t)
{
    check(cu.cuMemFree_v2(t->ptr), "cuMemFree");
    t->ptr = 0;
}

static void launch_sum(struct tensor *t, uint64_t *sum)
{
    struct kernel_args *k = malloc(sizeof(*k));
    *k = (struct kernel_args){(unsigned char *)(uintptr_t)t->ptr, t->bytes, sum};
    check(cu.cuLaunchHostFunc(compute, sum_kernel, k), "cuLaunchHostFunc");
}

VISIBLE struct tensor layer_forward(int layer, int step)
{
    size_t bytes = ((size_t)256 << 10) << (layer % 6); /* 256 KiB .. 8 MiB */
    return tensor_new(bytes, (unsigned char)(layer + step));
}

VISIBLE void model_forward(struct tensor *acts, int layers, int step, uint64_t *loss)
{
    for (int l = 0; l < layers; l++) {
        acts[l] = layer_forward(l, step);
        launch_sum(&acts[l], loss);
    }
}

VISIBLE void model_backward(struct tensor *acts, int layers)
{
    /* Freed while the stream may still read them: the pool must not hand them out early. */
    for (int l = layers - 1; l >= 0; l--)
        tensor_free(&acts[l]);
}

VISIBLE void optimizer_step(struct tensor *params, int nr_params)
{
    struct tensor tmp = tensor_new(params[0].bytes, 1);
    for (int i = 0; i < nr_params; i++)
        check(cu.cuMemsetD8_v2(params[i].ptr, 2, 4096), "cuMemsetD8");
    tensor_free(&tmp);
}

VISIBLE void grow_cache(int step)
{
    /* A cache that is never emptied: what `cuheap leaks` is for. */
    struct tensor t = tensor_new((size_t)64 << 10, (unsigned char)step);
    (void)t;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    int layers = argc > 2 ? atoi(argv[2]) : 12;
    if (steps <= 0 || layers <= 0 || layers > NR_MAX_LAYERS) {
        fprintf(stderr, "usage: cuheap-demo [STEPS>0] [LAYERS 1..%d]\n", NR_MAX_LAYERS);
        return 2;
    }
    if (driver_api_start(&cu, 0)) {
        fprintf(stderr, "cuheap-demo: no CUDA driver (for the simulated one: "
                        "LD_LIBRARY_PATH=build/tests/fakecuda)\n");
        return 1;
    }
    *(void **)&mark = dlsym(RTLD_DEFAULT, "cuheap_mark");
    check(cu.cuStreamCreate(&compute, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    struct tensor params[4];
    for (int i = 0; i < 4; i++)
        params[i] = tensor_new((size_t)(1 + i) << 20, (unsigned char)i);
    uint64_t loss = 0;
    struct tensor acts[NR_MAX_LAYERS];
    for (int step = 0; step < steps; step++) {
        if (mark) {
            char label[32];
            snprintf(label, sizeof(label), "step %d", step);
            mark(label);
        }
        model_forward(acts, layers, step, &loss);
        model_backward(acts, layers);
        optimizer_step(params, 4);
        if (step % 5 == 4)
            grow_cache(step);
    }
    check(cu.cuStreamSynchronize(compute), "cuStreamSynchronize");
    for (int i = 0; i < 4; i++)
        tensor_free(&params[i]);
    check(cu.cuStreamDestroy_v2(compute), "cuStreamDestroy");
    printf("cuheap-demo: %d steps, %d layers, loss %llu\n", steps, layers,
           (unsigned long long)loss);
    return 0;
}
