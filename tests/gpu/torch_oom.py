# SPDX-License-Identifier: MIT
"""PyTorch's own out-of-memory handling under cuheap: fill the device with 8 GiB tensors until
PyTorch says out of memory (torch.OutOfMemoryError; with caching off, the CUDA error its
uncached allocator raises), let go of them, empty_cache(), and go on computing. Prints how many
fitted and whether the job recovered."""
import torch

held = []
try:
    while True:
        held.append(torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    n = len(held)
except RuntimeError as e:
    # With PYTORCH_NO_CUDA_MEMORY_CACHING=1 PyTorch's uncached allocator checks cudaMalloc's
    # answer as any CUDA error (C10_CUDA_CHECK), so out of memory comes as torch.AcceleratorError
    # ("CUDA error: out of memory"), with or without cuheap; anything else is a failure.
    if "out of memory" not in str(e):
        raise
    n = len(held)
del held
torch.cuda.empty_cache()
x = torch.ones(4096, 4096, device="cuda")
y = (x @ x).sum().item()
print("oom after %d x 8 GiB; recovered: %s" % (n, y == 4096.0 ** 3))
