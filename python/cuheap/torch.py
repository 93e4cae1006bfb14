# SPDX-License-Identifier: MIT
"""cuheap as PyTorch's allocator: every tensor's memory comes from cuheap's pool with its
stream known, so a freed block is reused at once on the same stream and after a fence on
another, and the trace has every tensor (PyTorch's caching allocator shows cuheap only the
few large segments it takes)."""
from . import library_path


def use(library=None):
    """Make cuheap PyTorch's CUDA allocator. Call it before the first CUDA tensor (PyTorch
    refuses to swap an allocator in use). library: the libcuheap.so to use (default: the one in
    the process, else the one installed beside the cuheap command). Returns its path."""
    import torch

    path = library or library_path()
    if path is None:
        raise RuntimeError("cuheap: libcuheap.so not found: run under `cuheap run`, or pass "
                           "its path (or set CUHEAP_LIBRARY)")
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "cuheap_torch_alloc",
                                                     "cuheap_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return path
