# SPDX-License-Identifier: MIT
"""A stand-in for PyTorch's allocator switch, for the `cuheap run --torch` tests (no PyTorch
here): it keeps every allocator the program or cuheap made current, in order."""
import types

current = []


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        self.args = (path, alloc_fn_name, free_fn_name)


def change_current_allocator(allocator):
    current.append(allocator.args)


cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                 change_current_allocator=change_current_allocator),
    change_current_allocator=change_current_allocator)
