# SPDX-License-Identifier: MIT
"""What every corpus job shares: the device (JOB_DEVICE, default cuda; cpu to try a job on a
machine without a GPU), the number of steps (JOB_STEPS, else the job's own default), seeding,
the step marks cuheap's replay cuts the recorded sequence at (cuheap_mark("step") at the end of
every step, a no-op without cuheap), and the lines a job prints:

  job=NAME device=DEV steps=N step_ms=MEDIAN first_ms=FIRST total_s=S peak_reserved=B
      reserved_from=WHO [device_used=B] [own_ms_per_step=...]
  step_ms_all 12.345 ...
  outputs 0x1.8p+3 ...

step_ms is the median step after the first few (the first compile or warm up); under cuheap the
first line also says cuheap's own time a step over those steps (own_ms_per_step, and as a share
of the median step, own_pct_of_step) and its driver calls a step by kind; device_used is the
most the device held for the process at a step's end, less what it held as its steps began (the
one memory figure that compares every allocator, as it counts every allocation); outputs are the
job's losses or outputs as exact hex floats, the same under every allocator. On the CPU a job
runs at the small sizes it names with pick(), in float32: a check of its paths, not a figure.
"""
import contextlib
import ctypes
import os
import random
import statistics
import sys
import time

DEVICE = os.environ.get("JOB_DEVICE", "cuda")
CUDA = DEVICE.startswith("cuda")

try:
    _mark = ctypes.CDLL(None).cuheap_mark
    _mark.argtypes = [ctypes.c_char_p]
    _mark.restype = None
except AttributeError:  # cuheap not loaded
    _mark = None


try:
    _lib = ctypes.CDLL(os.environ.get("CUHEAP_PLUGGABLE") or None)
    _get_stats = _lib.cuheap_get_stats
except (AttributeError, OSError):  # cuheap not loaded
    _get_stats = None

# struct cuheap_stats from its 18th field: cuheap's own time and its driver calls by kind
_OWN_FIELDS = ("own_alloc_ns", "own_free_ns", "nr_own_timed", "nr_program_calls", "program_ns",
               "nr_map_calls", "map_calls_ns", "nr_record_calls", "record_ns", "nr_query_calls",
               "query_ns", "nr_sync_calls", "sync_ns", "nr_other_calls", "other_ns")


def cuheap_own():
    """cuheap's own time and driver calls so far, as a dict, or None without cuheap."""
    if not _get_stats:
        return None
    s = (ctypes.c_uint64 * (17 + len(_OWN_FIELDS)))()
    if _get_stats(s, ctypes.sizeof(s)) != 0:
        return None
    return dict(zip(_OWN_FIELDS, s[17:]))


def own_words(before, after, n, step_ms):
    """cuheap's own time and its driver calls a step over n steps, as key=value words."""
    if not before or not after or n <= 0:
        return ""
    d = {k: (after[k] - before[k]) / n for k in _OWN_FIELDS}
    own_ms = (d["own_alloc_ns"] + d["own_free_ns"]) / 1e6
    words = "own_ms_per_step=%.4f own_pct_of_step=%.2f" % (
        own_ms, 100 * own_ms / step_ms if step_ms else 0)
    for kind in ("program", "map", "record", "query", "sync"):
        ms = d["map_calls_ns" if kind == "map" else kind + "_ns"] / 1e6
        words += " %s_calls_per_step=%.1f %s_ms_per_step=%.4f" % (
            kind, d["nr_%s_calls" % kind], kind, ms)
    return words


def mem_words():
    """The job's peak reserved device bytes as key=value words: cuheap's (its statistics) where
    it serves the job, else PyTorch's caching allocator's (expandable segments included)."""
    reserved, source = 0, "none"
    if _get_stats:
        s = (ctypes.c_uint64 * 17)()
        if _get_stats(s, ctypes.sizeof(s)) == 0 and s[3]:
            reserved, source = s[3], "cuheap"
    if not reserved and CUDA and "torch" in sys.modules:
        try:
            reserved, source = sys.modules["torch"].cuda.max_memory_reserved(), "torch"
        except RuntimeError:  # a pluggable allocator keeps no PyTorch statistics
            pass
    return "peak_reserved=%d reserved_from=%s" % (reserved, source)


def device_used():
    """What the process holds on the device now as the driver counts it, whatever allocator
    serves the job (and whatever a library allocated beside it): 0 without torch or a GPU."""
    if not CUDA or "torch" not in sys.modules:
        return 0
    free, total = sys.modules["torch"].cuda.mem_get_info()
    return total - free


def steps(default):
    return int(os.environ.get("JOB_STEPS", default))


def pick(gpu, cpu):
    """A size: the job's own on the GPU, a small one on the CPU."""
    return gpu if CUDA else cpu


def autocast():
    """bf16 autocast on the GPU, as training jobs run; float32 on the CPU."""
    import torch
    return torch.autocast("cuda", dtype=torch.bfloat16) if CUDA else contextlib.nullcontext()


def mark(label=b"step"):
    if _mark:
        _mark(label)


def seed_all(seed=0):
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False  # no algorithm search: the same kernels every run
    # kernels whose results do not depend on the order atomics land in, where PyTorch has
    # them; an op without one warns rather than stops the job
    torch.use_deterministic_algorithms(True, warn_only=True)


def torch_sync():
    import torch
    if CUDA:
        torch.cuda.synchronize()


def hexes(values):
    return " ".join(float(v).hex() for v in values)


class Job:
    """Times the steps and prints the job's lines. Use as:

        job = Job("moe", sync=torch_sync)
        for step in range(n):
            with job.step():
                ...
            job.output(loss.item())
        job.report()
    """

    def __init__(self, name, sync=lambda: None, skip=3):
        self.name, self.sync, self.skip = name, sync, skip
        self.times, self.outputs = [], []
        self.own_before = None
        self.used_start, self.used_peak = device_used(), 0
        self.t_start = time.perf_counter()

    class _Step:
        def __init__(self, job):
            self.job = job

        def __enter__(self):
            self.job.sync()
            if len(self.job.times) == self.job.skip:  # the first step the median counts
                self.job.own_before = cuheap_own()
            self.t0 = time.perf_counter()

        def __exit__(self, *exc):
            if exc[0] is None:
                self.job.sync()
                self.job.times.append(time.perf_counter() - self.t0)
                self.job.used_peak = max(self.job.used_peak, device_used())
                mark()
            return False

    def step(self):
        return Job._Step(self)

    def output(self, *values):
        self.outputs.extend(values)

    def report(self, extra=""):
        t = self.times[self.skip:] if len(self.times) > 2 * self.skip else self.times
        own = own_words(self.own_before, cuheap_own(), len(self.times) - self.skip,
                        1000 * statistics.median(self.times[self.skip:]) if
                        len(self.times) > self.skip else 0)
        used = "device_used=%d" % (self.used_peak - self.used_start) if self.used_peak else ""
        extra = " ".join(w for w in (extra, mem_words(), used, own) if w)
        print("job=%s device=%s steps=%d step_ms=%.3f first_ms=%.3f total_s=%.1f%s" % (
            self.name, DEVICE, len(self.times), 1000 * statistics.median(t) if t else 0.0,
            1000 * self.times[0] if self.times else 0.0, time.perf_counter() - self.t_start,
            " " + extra if extra else ""))
        print("step_ms_all", " ".join("%.3f" % (1000 * x) for x in self.times))
        print("outputs", hexes(self.outputs))
        sys.stdout.flush()
