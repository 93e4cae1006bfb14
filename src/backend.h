/* SPDX-License-Identifier: MIT */
/*
 * The device backend: the few device operations the pool needs, as function pointers.
 * backend_cuda.c implements it over the real driver; unit tests implement it over host
 * memory. Results are 0 on success, CUHEAP_BE_OOM when the device is out of memory, or
 * another negative value for any other failure.
 */
#ifndef CUHEAP_BACKEND_H
#define CUHEAP_BACKEND_H

#include <stdint.h>

#define CUHEAP_BE_OOM       (-12) /* same value as -ENOMEM */
#define CUHEAP_BE_NO_ANSWER (-11) /* fence_query: the driver would not say (same as -EAGAIN) */

struct cuheap_backend {
    void *ctx; /* the device (a CUcontext for the CUDA backend) */
    /* Take / give back device memory for an arena. */
    int (*mem_alloc)(void *ctx, uint64_t size, uint64_t *ret_ptr);
    int (*mem_free)(void *ctx, uint64_t ptr);
    /* A device-wide fence: completes once all work submitted to the device before it does.
     * query returns 1 when complete, 0 when not yet, CUHEAP_BE_NO_ANSWER when the driver
     * refused the question (a stream capture's error); wait returns 0 once it completed. */
    int (*fence_record)(void *ctx, void **ret_fence);
    int (*fence_query)(void *ctx, void *fence);
    int (*fence_wait)(void *ctx, void *fence);
    void (*fence_destroy)(void *ctx, void *fence);
    /* Keep a fence valid until one more fence_destroy (optional: without it, a destroyed
     * fence must stay safe to query and wait for). The pool holds the fence it waits for
     * while it lets other threads go on, which may destroy it meanwhile. */
    void (*fence_hold)(void *ctx, void *fence);
    /* Whether every stream a fence covers is idle now, so that all work submitted before the
     * call has completed: 1 when so, 0 when busy or not known (optional). */
    int (*streams_idle)(void *ctx);
    /* A fence on one stream only (pluggable allocator frees). */
    int (*stream_fence_record)(void *ctx, uint64_t stream, void **ret_fence);
    /* Wait for the whole device, as the driver's free does. */
    int (*device_sync)(void *ctx);
    /* What the driver says is free and total on the device. */
    int (*mem_info)(void *ctx, uint64_t *ret_free, uint64_t *ret_total);
    /* The device's context is gone: forget fence resources without calling the driver
     * (optional). */
    void (*forget)(void *ctx);

    /* Virtual memory (CUHEAP_BACKING=vmm); granule is 0 when the device has none.
     * va_reserve takes address space only; phys_create physical memory of size bytes (a
     * multiple of granule; CUHEAP_BE_OOM when the device is full); phys_map maps all of it at
     * va and makes it accessible to the device and the peers given access (CUHEAP_BE_OOM when
     * the driver said out of memory; on any failure nothing stays mapped); phys_unmap undoes that;
     * the handle stays valid until released. phys_release and phys_unmap return 0, or
     * non-zero when the driver refused (the memory is then still held, or still mapped). */
    uint64_t granule;
    int (*va_reserve)(void *ctx, uint64_t size, uint64_t *ret_va);
    void (*va_free)(void *ctx, uint64_t va, uint64_t size);
    int (*phys_create)(void *ctx, uint64_t size, uint64_t *ret_handle);
    int (*phys_release)(void *ctx, uint64_t handle);
    int (*phys_map)(void *ctx, uint64_t va, uint64_t size, uint64_t handle);
    int (*phys_unmap)(void *ctx, uint64_t va, uint64_t size);
    /* Make a mapped range accessible again to the device and every peer it now has (optional:
     * peers given access after the range was mapped). */
    int (*phys_access)(void *ctx, uint64_t va, uint64_t size);
    /* A file descriptor for physical memory, for another process to import (optional). */
    int (*phys_export)(void *ctx, uint64_t handle, int *ret_fd);
};

#endif
