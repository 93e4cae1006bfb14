# SPDX-License-Identifier: MIT
"""CuPy under cuheap with CuPy's memory pool off, so every array is a driver allocation.
Prints a checksum and how many allocations cuheap saw."""
import cuheap_probe
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
print("cuheap:", cuheap_probe.call_counts(["cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemCreate"]))
