/* SPDX-License-Identifier: MIT */
/*
 * Sharing pooled blocks with other processes under CUHEAP_BACKING=vmm: cuheap's own IPC
 * handles, answered over a Unix socket with the blocks' physical memory as file descriptors
 * (ipc.c says how).
 */
#ifndef CUHEAP_IPC_H
#define CUHEAP_IPC_H

#include <cuda.h>
#include <stdbool.h>

struct cuheap_device;

/* A handle for the pooled block that holds ptr (vmm pools only). Returns 0, -EINVAL when ptr
 * is in no live block, -EIO when this process cannot serve handles. */
int cuheap_ipc_export(struct cuheap_device *d, CUdeviceptr ptr, CUipcMemHandle *ret);

/* Whether a handle is one cuheap_ipc_export() made (in any process). */
bool cuheap_ipc_is_ours(const CUipcMemHandle *h);

/* Map the block a cuheap handle names into this process; *ret gets the block's start. Returns
 * the driver-style result (CUDA_ERROR_INVALID_VALUE, with one line saying why, when the
 * exporter cannot be reached or the block is gone). */
CUresult cuheap_ipc_open(CUdeviceptr *ret, const CUipcMemHandle *h);

/* Unmap a block cuheap_ipc_open() mapped. Returns 1 when ptr was one, 0 when not (the driver's
 * then). */
int cuheap_ipc_close(CUdeviceptr ptr);

#endif
