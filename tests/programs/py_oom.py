# SPDX-License-Identifier: MIT
"""A Python program that runs the simulated device out of memory, as a training step would:
named functions hold most of the memory, then a request no free piece of the pool holds and
the device cannot give. Run under cuheap with CUHEAP_BACKING=legacy, CUHEAP_ARENA_SIZE=64M,
CUHEAP_POOL_INIT=128M and FAKECUDA_DEVICE_MEM=128M, the pool holds two full arenas: 48 MiB in forward's three
blocks, 1 MiB at module level and 32 MiB in backward's block, and its largest free piece is
32 MiB. It prints the lines of its allocations (for the test to look for) and what each
out-of-memory request got from the driver (2: CUDA_ERROR_OUT_OF_MEMORY), which cuheap must
leave unchanged. Usage: py_oom.py [N out-of-memory requests, 2] [pause: pause recording
first]."""
import ctypes
import sys

MIB = 1 << 20


def driver():
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    return cu


def alloc(cu, nbytes):
    ptr = ctypes.c_uint64()
    r = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
    return r, ptr.value


def forward(cu):
    """The model's own line allocates, as a tensor made in forward does under PyTorch (whose
    frames are in site-packages, which the report skips)."""
    out = []
    for _ in range(3):
        ptr = ctypes.c_uint64()
        print("line forward", sys._getframe().f_lineno + 1)
        assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(16 * MIB)) == 0
        out.append(ptr.value)
    return out


def backward(cu):
    ptr = ctypes.c_uint64()
    print("line backward", sys._getframe().f_lineno + 1)
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(32 * MIB)) == 0
    return ptr.value


def main():
    cu = driver()
    held = forward(cu)
    print("line module", sys._getframe().f_lineno + 1)
    held.append(alloc(cu, 1 * MIB)[1])
    held.append(backward(cu))
    assert all(held), held
    if "pause" in sys.argv[2:]:  # cuheap_set_recording(0), from the preloaded library
        assert ctypes.CDLL(None).cuheap_set_recording(0) == 1
    results = [alloc(cu, 40 * MIB)[0] for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2)]
    print("results", " ".join(str(r) for r in results))
    for p in held:
        assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0


if __name__ == "__main__":
    main()
