# SPDX-License-Identifier: MIT
"""A Python program that allocates device memory through the driver with ctypes, from named
functions, so tests can check that cuheap's trace names these Python lines. ctypes.CDLL
releases the GIL around foreign calls, as PyTorch does around its operators."""
import ctypes
import sys


def driver():
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    return cu


def allocate_activations(cu, nbytes):
    ptr = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
    return ptr.value


class Model:
    def forward(self, cu, step):
        return [allocate_activations(cu, (1 << 16) << (i % 4)) for i in range(4)]


def main():
    cu = driver()
    model = Model()
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        for p in model.forward(cu, step):
            assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0
    print("py_alloc: ok")


if __name__ == "__main__":
    main()
