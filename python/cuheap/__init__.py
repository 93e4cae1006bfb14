# SPDX-License-Identifier: MIT
"""cuheap from Python: marks, pausing and resuming recording, live figures, and making cuheap
PyTorch's allocator (cuheap.torch.use()).

The functions talk to the libcuheap.so already in the process (preloaded by ``cuheap run``, or
loaded by ``cuheap.torch.use()``) through its C API (include/cuheap/cuheap.h), with nothing but
the standard library. Without cuheap in the process they do nothing and say so in what they
return, so a script that calls them runs the same without cuheap.
"""
import ctypes
import os
import shutil
import sysconfig

__all__ = ["loaded", "mark", "pause", "resume", "set_recording", "paused", "stats",
           "library_path", "tool_path"]

_LIB_NAME = "libcuheap.so"


class _Stats(ctypes.Structure):
    """struct cuheap_stats, field for field (fields are only ever appended)."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes", "nr_allocs",
        "nr_frees", "nr_pool_hits", "nr_pool_misses", "nr_passthrough", "nr_ooms", "nr_events",
        "nr_dropped", "nr_arenas", "nr_chunks_created", "nr_chunks_moved", "nr_chunks_released",
        "map_ns", "own_alloc_ns", "own_free_ns", "nr_own_timed", "nr_program_calls", "program_ns",
        "nr_map_calls", "map_calls_ns", "nr_record_calls", "record_ns", "nr_query_calls",
        "query_ns", "nr_sync_calls", "sync_ns", "nr_other_calls", "other_ns")]


def _loaded_path():
    """The libcuheap.so mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path) == _LIB_NAME:
                    return path
    except OSError:
        pass
    return None


_lib = None


def _handle():
    """The loaded library's handle, or None when cuheap is not in the process."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        glob = ctypes.CDLL(None)
        glob.cuheap_mark  # preloaded: in the global scope
        lib = glob
    except AttributeError:
        path = _loaded_path()  # loaded by PyTorch (RTLD_LOCAL): open the same file again
        if path is None:
            return None
        lib = ctypes.CDLL(path)
    lib.cuheap_mark.argtypes = [ctypes.c_char_p]
    lib.cuheap_mark.restype = None
    lib.cuheap_set_recording.argtypes = [ctypes.c_int]
    lib.cuheap_set_recording.restype = ctypes.c_int
    lib.cuheap_get_stats.argtypes = [ctypes.POINTER(_Stats), ctypes.c_size_t]
    lib.cuheap_get_stats.restype = ctypes.c_int
    _lib = lib
    return lib


def loaded():
    """Whether cuheap is in this process."""
    return _handle() is not None


def mark(label):
    """Put a marker named label in the trace (a phase, a step). Nothing without cuheap."""
    lib = _handle()
    if lib is not None:
        lib.cuheap_mark(str(label).encode("utf-8", "replace"))


def set_recording(on):
    """Pause (False) or resume (True) recording. Returns whether it was on before, or None
    when cuheap records nothing (not in the process, or CUHEAP_RECORD=0)."""
    lib = _handle()
    if lib is None:
        return None
    was = lib.cuheap_set_recording(1 if on else 0)
    return None if was < 0 else bool(was)


def pause():
    """Stop recording events (the accounting and the exit summary go on)."""
    return set_recording(False)


def resume():
    """Record again after pause()."""
    return set_recording(True)


class paused:
    """``with cuheap.paused():`` records nothing inside the block, then as before."""

    def __enter__(self):
        self._was = pause()
        return self

    def __exit__(self, *exc):
        if self._was:
            resume()
        return False


def stats():
    """Live and reserved bytes now and at their peaks, call counts, the pool's mapping work,
    cuheap's own time in the allocation path (own_alloc_ns, own_free_ns) and the driver calls
    it made by kind (nr_map_calls and map_calls_ns, record, query, sync, other; program: the
    program's calls passed to the driver), summed over GPUs, as a dict (struct cuheap_stats);
    None without cuheap. Read it before and after a step for the step's figures."""
    lib = _handle()
    if lib is None:
        return None
    s = _Stats()
    if lib.cuheap_get_stats(ctypes.byref(s), ctypes.sizeof(s)) != 0:
        return None
    return {name: getattr(s, name) for name, _ in _Stats._fields_}


def _tool_dirs():
    """Where the cuheap tool may be: the environment's scripts folder (pip), then PATH's."""
    dirs = [sysconfig.get_path("scripts")]
    found = shutil.which("cuheap")
    if found:
        dirs.append(os.path.dirname(os.path.realpath(found)))
    return [d for d in dirs if d]


def tool_path():
    """The cuheap command's executable, or None."""
    for d in _tool_dirs():
        cand = os.path.join(d, "cuheap")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            with open(cand, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return cand
    return None


def library_path():
    """The libcuheap.so to load: CUHEAP_LIBRARY, the one in this process, or the one beside
    the cuheap tool (as `cuheap run` looks for it). None when there is none."""
    env = os.environ.get("CUHEAP_LIBRARY")
    if env:
        return env
    here = _loaded_path()
    if here:
        return here
    for d in _tool_dirs():
        for rel in (_LIB_NAME, "../src/" + _LIB_NAME, "../lib/" + _LIB_NAME,
                    "../lib64/" + _LIB_NAME, "../lib/x86_64-linux-gnu/" + _LIB_NAME):
            cand = os.path.normpath(os.path.join(d, rel))
            if os.path.isfile(cand):
                return cand
    return None


def __getattr__(name):
    """cuheap.torch on first use, so that `import cuheap` never imports PyTorch."""
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'cuheap' has no attribute %r" % name)
