/* SPDX-License-Identifier: MIT */
/*
 * A long training-shaped job for the tool's scale benchmark (bench/run-tools.sh): run under
 * cuheap with recording on, on the simulated device, it writes a real trace of any size.
 * Each step marks itself (cuheap_mark, and an NVTX range when cuheap is the injection
 * library), allocates an activation per layer from one of several call sites of different
 * depths with short-lived scratch buffers beside it, frees the activations in reverse, runs an
 * optimizer step with a temporary, and every few steps leaks 64 KiB into a cache, as the demo
 * does; no device work is queued, so the recorder, not the program, sets the pace.
 *
 *   trace-gen STEPS [LAYERS]     (LAYERS 1..64, default 12; about 72 events a step at 12)
 *
 * The ring between the hooks and the writer drops events when the program outruns the writer:
 * the program yields for --pace-us microseconds (default 150) after each step, and the script
 * checks the footer for drops.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DOOR_PROCADDR 1
#include "../tests/programs/driver_api.h"

#define NR_MAX_LAYERS 64
#define VISIBLE       __attribute__((visibility("default"), noinline)) /* names for dladdr */

static struct driver_api cu;
static void (*mark)(const char *);

VISIBLE CUdeviceptr tensor_new(size_t bytes);
VISIBLE void tensor_free(CUdeviceptr p);
VISIBLE CUdeviceptr attention(int layer, int step);
VISIBLE CUdeviceptr mlp(int layer, int step);
VISIBLE CUdeviceptr submodule(int depth, int layer, int step);
VISIBLE CUdeviceptr block_forward(int layer, int step);
VISIBLE void model_forward(CUdeviceptr *acts, int layers, int step);
VISIBLE void model_backward(CUdeviceptr *acts, int layers);
VISIBLE void optimizer_step(void);
VISIBLE void grow_cache(void);

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "trace-gen: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

VISIBLE CUdeviceptr tensor_new(size_t bytes)
{
    CUdeviceptr p;
    check(cu.cuMemAlloc_v2(&p, bytes), "cuMemAlloc");
    return p;
}

VISIBLE void tensor_free(CUdeviceptr p)
{
    check(cu.cuMemFree_v2(p), "cuMemFree");
}

/* Scratch buffers (512 B .. 64 KiB) that live only inside the call. */
static void scratch(int layer, int step)
{
    CUdeviceptr a = tensor_new((size_t)512 << ((layer + step) % 8));
    CUdeviceptr b = tensor_new((size_t)4096 << (layer % 5));
    tensor_free(b);
    tensor_free(a);
}

VISIBLE CUdeviceptr attention(int layer, int step)
{
    scratch(layer, step);
    return tensor_new(((size_t)256 << 10) << (layer % 6)); /* 256 KiB .. 8 MiB */
}

VISIBLE CUdeviceptr mlp(int layer, int step)
{
    scratch(layer + 1, step);
    return tensor_new(((size_t)384 << 10) << (layer % 5));
}

/* Modules nest: the depth of the call varies with the layer and the step, so the trace holds a
 * few hundred distinct stacks, as a framework's does. */
VISIBLE CUdeviceptr submodule(int depth, int layer, int step)
{
    if (depth > 0)
        return submodule(depth - 1, layer, step);
    return layer % 3 == 2 ? mlp(layer, step) : attention(layer, step);
}

VISIBLE CUdeviceptr block_forward(int layer, int step)
{
    return submodule(layer + step % 7, layer, step);
}

VISIBLE void model_forward(CUdeviceptr *acts, int layers, int step)
{
    for (int l = 0; l < layers; l++)
        acts[l] = block_forward(l, step);
}

VISIBLE void model_backward(CUdeviceptr *acts, int layers)
{
    for (int l = layers - 1; l >= 0; l--)
        tensor_free(acts[l]);
}

VISIBLE void optimizer_step(void)
{
    tensor_free(tensor_new((size_t)4 << 20));
}

VISIBLE void grow_cache(void)
{
    (void)tensor_new((size_t)64 << 10); /* never freed: what `cuheap leaks` finds */
}

int main(int argc, char **argv)
{
    long pace_us = 150;
    if (argc > 2 && !strncmp(argv[1], "--pace-us=", 10)) {
        pace_us = atol(argv[1] + 10);
        argv++;
        argc--;
    }
    long steps = argc > 1 ? atol(argv[1]) : 0;
    int layers = argc > 2 ? atoi(argv[2]) : 12;
    if (steps <= 0 || layers <= 0 || layers > NR_MAX_LAYERS) {
        fprintf(stderr, "usage: trace-gen [--pace-us=N] STEPS>0 [LAYERS 1..%d]\n", NR_MAX_LAYERS);
        return 2;
    }
    if (driver_api_start(&cu, 0)) {
        fprintf(stderr, "trace-gen: no CUDA driver (for the simulated one: "
                        "LD_LIBRARY_PATH=build/tests/fakecuda)\n");
        return 1;
    }
    *(void **)&mark = dlsym(RTLD_DEFAULT, "cuheap_mark");
    CUdeviceptr params[4], acts[NR_MAX_LAYERS];
    for (int i = 0; i < 4; i++)
        params[i] = tensor_new((size_t)(1 + i) << 20);
    struct timespec pace = {0, pace_us * 1000};
    for (long step = 0; step < steps; step++) {
        if (mark) {
            char label[32];
            snprintf(label, sizeof(label), "step %ld", step);
            mark(label);
        }
        model_forward(acts, layers, (int)step);
        model_backward(acts, layers);
        optimizer_step();
        if (step % 50 == 49)
            grow_cache();
        if (pace_us > 0)
            nanosleep(&pace, NULL);
    }
    for (int i = 0; i < 4; i++)
        tensor_free(params[i]);
    printf("trace-gen: %ld steps, %d layers\n", steps, layers);
    return 0;
}
