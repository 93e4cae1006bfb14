# SPDX-License-Identifier: MIT
"""What the GPU clients ask of a preloaded cuheap, through ctypes: how many calls it saw per
entry point, and markers. Both are no-ops when cuheap is not loaded."""
import ctypes

_lib = ctypes.CDLL(None)


def loaded():
    return hasattr(_lib, "cuheap_call_count")


def call_counts(names):
    """'name=count ...' for the given driver entry points, or 'not loaded'."""
    if not loaded():
        return "not loaded"
    count = _lib.cuheap_call_count
    count.restype = ctypes.c_uint64
    return " ".join("%s=%d" % (n, count(n.encode())) for n in names)


def mark(label):
    if loaded():
        _lib.cuheap_mark.argtypes = [ctypes.c_char_p]
        _lib.cuheap_mark(label.encode())
