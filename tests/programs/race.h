/* SPDX-License-Identifier: MIT */
/*
 * The stream-safety race on the simulated device, shared by the integration tests and the
 * door programs: a slow "kernel" (a host function queued on a stream) still reads a buffer
 * after the program freed it; the program then makes the pool close its fence batch and hand
 * out blocks of the same size until the freed block could come back, and writes every block it
 * gets at once, as a kernel on another, unordered stream would. A pool that reuses the block
 * before the reader is done shows up as changed bytes under the reader.
 *
 * The fence batch is closed by the number of frees (CUHEAP_FENCE_BATCH, 64 by default), the way
 * a real program closes it, not by an explicit call: a test that frees one block and allocates
 * one proves nothing, since the next block comes from fresh space whether fences work or not.
 */
#ifndef CUHEAP_TEST_RACE_H
#define CUHEAP_TEST_RACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_api.h"

#define RACE_BLOCK    (1u << 20) /* the buffer the reader reads */
#define RACE_NR_SMALL 130        /* other frees: enough to close two fence batches */
/* Their size: above what a thread cache keeps (128 KiB), so that they join the pool's fence
 * batch as the block's free did, and close it (512 B frees stay in the thread's own batch:
 * the block's batch stayed open, it never came back, and the race tests of the legacy backing
 * proved nothing). */
#define RACE_SMALL_SIZE  (256u << 10)
#define RACE_NR_REUSE    96  /* same-size blocks handed out after the free */
#define RACE_NR_AFTER    64  /* and more once the reader is done, until it comes back */
#define RACE_READER_MS   300 /* how long the "kernel" waits before it reads */
#define RACE_OLD_PATTERN 0xAA
#define RACE_NEW_PATTERN 0x55

struct race_reader {
    const unsigned char *buf;
    size_t n;
    int delay_ms;
    size_t changed;    /* bytes that were not the old pattern when the reader read them */
    _Atomic bool done; /* the reader has finished */
};

static void race_read(void *arg)
{
    struct race_reader *r = arg;
    struct timespec ts = {r->delay_ms / 1000, (long)(r->delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    for (size_t i = 0; i < r->n; i++)
        r->changed += r->buf[i] != RACE_OLD_PATTERN;
    atomic_store(&r->done, true);
}

struct race_result {
    int error;         /* a driver call failed: its CUresult, or -1 */
    size_t changed;    /* bytes changed under the reader: must be 0 unless reuse is unsafe */
    bool reused_early; /* the freed block's address came back while the reader could run */
    bool came_back;    /* it came back at all, early or once the reader was done: without
                          this the test could not have seen an early reuse */
    bool full;         /* an allocation ran out of memory (a limit or a small device) */
};

/* Run the race with the reader queued on `reader_stream` (a stream handle, CU_STREAM_LEGACY or
 * CU_STREAM_PER_THREAD). With destroy, the program destroys the reader's stream right after
 * the free, as one does when done with a stream: its queued work still runs. */
static struct race_result race_run(const struct driver_api *cu, CUstream reader_stream,
                                   bool destroy)
{
    struct race_result res = {0, 0, false, false, false};
    CUdeviceptr small[RACE_NR_SMALL], reuse[RACE_NR_REUSE + RACE_NR_AFTER], a;
    int nr_reuse = 0, nr_small = 0;
    CUresult r;
#define RACE_TRY(call)                                                                             \
    if ((r = (call)) != CUDA_SUCCESS) {                                                            \
        res.error = (int)r;                                                                        \
        goto out;                                                                                  \
    }
    for (; nr_small < RACE_NR_SMALL; nr_small++)
        RACE_TRY(cu->cuMemAlloc_v2(&small[nr_small], RACE_SMALL_SIZE));
    RACE_TRY(cu->cuMemAlloc_v2(&a, RACE_BLOCK));
    RACE_TRY(cu->cuMemsetD8_v2(a, RACE_OLD_PATTERN, RACE_BLOCK));
    struct race_reader reader = {(const unsigned char *)(uintptr_t)a, RACE_BLOCK, RACE_READER_MS, 0,
                                 false};
    RACE_TRY(cu->cuLaunchHostFunc(reader_stream, race_read, &reader));
    RACE_TRY(cu->cuMemFree_v2(a));
    if (destroy)
        RACE_TRY(cu->cuStreamDestroy_v2(reader_stream));
    /* The free joins a fence batch; these close it (and the next) behind a fence. */
    while (nr_small > 0)
        RACE_TRY(cu->cuMemFree_v2(small[--nr_small]));
    for (; nr_reuse < RACE_NR_REUSE; nr_reuse++) {
        CUdeviceptr b;
        r = cu->cuMemAlloc_v2(&b, RACE_BLOCK);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            res.full = true;
            break; /* under a limit: the device is full, and that is all the reuse there is */
        }
        RACE_TRY(r);
        reuse[nr_reuse] = b;
        /* written at once, ordered after nothing: a kernel on another stream */
        memset((void *)(uintptr_t)b, RACE_NEW_PATTERN, RACE_BLOCK);
        if (b == a) {
            res.came_back = true;
            res.reused_early = !atomic_load(&reader.done);
            nr_reuse++;
            break;
        }
    }
    RACE_TRY(destroy ? cu->cuCtxSynchronize() : cu->cuStreamSynchronize(reader_stream));
    res.changed = reader.changed;
    /* the reader is done: now the block must come back (to these or to further requests) */
    while (!res.came_back && nr_reuse < RACE_NR_REUSE + RACE_NR_AFTER) {
        CUdeviceptr b;
        if ((r = cu->cuMemAlloc_v2(&b, RACE_BLOCK)) != CUDA_SUCCESS) {
            res.full = r == CUDA_ERROR_OUT_OF_MEMORY;
            res.error = res.full ? 0 : (int)r;
            break;
        }
        reuse[nr_reuse++] = b;
        res.came_back = b == a;
    }
out:
    cu->cuCtxSynchronize();
    while (nr_reuse > 0)
        cu->cuMemFree_v2(reuse[--nr_reuse]);
    while (nr_small > 0)
        cu->cuMemFree_v2(small[--nr_small]);
    return res;
#undef RACE_TRY
}

static struct race_result race_on_stream(const struct driver_api *cu, CUstream reader_stream)
{
    return race_run(cu, reader_stream, false);
}

#endif
