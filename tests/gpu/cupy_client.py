# SPDX-License-Identifier: MIT
"""CuPy under cuheap with CuPy's memory pool off, so every array is a driver allocation.
Prints a checksum and how many allocations cuheap saw."""
import ctypes

import cupy

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)
rng = cupy.random.default_rng(0)
total = 0.0
for i in range(50):
    a = rng.standard_normal((256 + i, 256), dtype=cupy.float32)
    b = rng.standard_normal((256, 128), dtype=cupy.float32)
    total += float(cupy.tanh(a @ b).sum())
print("checksum", float(total).hex())
try:
    count = ctypes.CDLL(None).cuheap_call_count
    count.restype = ctypes.c_uint64
    print("cuheap:", " ".join("%s=%d" % (n, count(n.encode())) for n in
                              ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemCreate"]))
except AttributeError:
    print("cuheap: not loaded")
