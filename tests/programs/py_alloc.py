# SPDX-License-Identifier: MIT
"""A Python program that allocates device memory through the driver with ctypes, from named
functions, so tests can check that cuheap's trace names these Python lines. ctypes.CDLL
releases the GIL around foreign calls, as PyTorch does around its operators.

With PY_ALLOC_STACKS=FILE it also writes, for every allocation, the pointer and the Python
stack at the call (innermost first: file, line, function name) as the interpreter itself sees
it, so tests/programs/check_py_stacks.py can compare every frame of the trace with it."""
import contextlib
import ctypes
import json
import os
import sys
import threading

STACKS = open(os.environ["PY_ALLOC_STACKS"], "w") if os.environ.get("PY_ALLOC_STACKS") else None
# Threads allocate too: with STACKS, each allocation and its line are written under this lock,
# so the lines of one pointer come in the order the trace holds its allocations.
STACKS_LOCK = threading.Lock() if STACKS else contextlib.nullcontext()


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
    cu.context = ctx
    return cu


def allocate_activations(cu, nbytes):
    ptr = ctypes.c_uint64()
    with STACKS_LOCK:
        stack = python_stack(sys._getframe().f_lineno + 1) if STACKS else None
        assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
        if STACKS:
            STACKS.write(json.dumps({"ptr": ptr.value, "stack": stack}) + "\n")
    return ptr.value


def allocate_other_line(cu, nbytes):
    """Two driver calls in one function: same code object, two lines."""
    ptrs = []
    for i in range(2):
        ptr = ctypes.c_uint64()
        with STACKS_LOCK:
            if i == 0:
                stack = python_stack(sys._getframe().f_lineno + 1) if STACKS else None
                assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
            else:
                stack = python_stack(sys._getframe().f_lineno + 1) if STACKS else None
                assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes + 512)) == 0
            if STACKS:
                STACKS.write(json.dumps({"ptr": ptr.value, "stack": stack}) + "\n")
        ptrs.append(ptr.value)
    return ptrs


def nested(cu, depth, out):
    """Recursion: the same code objects at varying depths, allocating on the way down and up."""
    if depth % 2:
        out.extend(allocate_other_line(cu, 4096 << (depth % 3)))
    else:
        out.append(allocate_activations(cu, 8192 << (depth % 3)))
    if depth:
        nested(cu, depth - 1, out)
        out.append(allocate_activations(cu, 1024 * depth))


class Model:
    def forward(self, cu, step):
        return [allocate_activations(cu, (1 << 16) << (i % 4)) for i in range(4)]


def varied(cu, steps, errors=None):
    """Call sites, depths and lines that change from one allocation to the next."""
    if errors is not None:  # a thread of its own: make the context current here too
        try:
            assert cu.cuCtxSetCurrent(cu.context) == 0
            varied(cu, steps)
        except BaseException as e:  # noqa: B902: the main thread reports it
            errors.append(e)
        return
    for step in range(steps):
        out = []
        nested(cu, (step * 7) % 9, out)
        for p in out:
            assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0


def main():
    cu = driver()
    model = Model()
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for step in range(steps):
        for p in model.forward(cu, step):
            assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0
    varied(cu, steps * 4)
    errors = []
    threads = [threading.Thread(target=varied, args=(cu, steps * 2, errors)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print("py_alloc: ok")


if __name__ == "__main__":
    main()
