# SPDX-License-Identifier: MIT
"""What every corpus job shares: the device (JOB_DEVICE, default cuda; cpu to try a job on a
machine without a GPU), the number of steps (JOB_STEPS, else the job's own default), seeding,
the step marks cuheap's replay cuts the recorded sequence at (cuheap_mark("step") at the end of
every step, a no-op without cuheap), and the lines a job prints:

  job=NAME device=DEV steps=N step_ms=MEDIAN first_ms=FIRST total_s=S
  step_ms_all 12.345 ...
  outputs 0x1.8p+3 ...

step_ms is the median step after the first few (the first compile or warm up); outputs are the
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
        self.t_start = time.perf_counter()

    class _Step:
        def __init__(self, job):
            self.job = job

        def __enter__(self):
            self.job.sync()
            self.t0 = time.perf_counter()

        def __exit__(self, *exc):
            if exc[0] is None:
                self.job.sync()
                self.job.times.append(time.perf_counter() - self.t0)
                mark()
            return False

    def step(self):
        return Job._Step(self)

    def output(self, *values):
        self.outputs.extend(values)

    def report(self, extra=""):
        t = self.times[self.skip:] if len(self.times) > 2 * self.skip else self.times
        print("job=%s device=%s steps=%d step_ms=%.3f first_ms=%.3f total_s=%.1f%s" % (
            self.name, DEVICE, len(self.times), 1000 * statistics.median(t) if t else 0.0,
            1000 * self.times[0] if self.times else 0.0, time.perf_counter() - self.t_start,
            " " + extra if extra else ""))
        print("step_ms_all", " ".join("%.3f" % (1000 * x) for x in self.times))
        print("outputs", hexes(self.outputs))
        sys.stdout.flush()
