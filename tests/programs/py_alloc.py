# SPDX-License-Identifier: MIT
"""A Python program that allocates device memory through the driver with ctypes, from named
functions, so tests can check that cuheap's trace names these Python lines. ctypes.CDLL
releases the GIL around foreign calls, as PyTorch does around its operators.

With PY_ALLOC_STACKS=FILE it also writes, for every allocation, the pointer and the Python
stack at the call (innermost first: file, line, function name) as the interpreter itself sees
it, so tests/programs/check_py_stacks.py can compare every frame of the trace with it."""
import ctypes
import json
import os
import sys

STACKS = open(os.environ["PY_ALLOC_STACKS"], "w") if os.environ.get("PY_ALLOC_STACKS") else None


def python_stack(call_line):
    """The caller's stack as (file, line, name), innermost first; the innermost frame's line is
    the line of the driver call that follows."""
    frames = []
    f = sys._getframe(1)
    while f is not None:
        frames.append([f.f_code.co_filename, f.f_lineno, f.f_code.co_name])
        f = f.f_back
    frames[0][1] = call_line
    return frames


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
    stack = python_stack(sys._getframe().f_lineno + 1) if STACKS else None
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
    if STACKS:
        STACKS.write(json.dumps({"ptr": ptr.value, "stack": stack}) + "\n")
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
