# SPDX-License-Identifier: MIT
"""The GPT loop (bench/torch_gpt.py) run twice in one process, as a sweep or a restart of
training does: the first run's model, optimizer and data freed, then a new model trained
from the same seed. What it exercises: a job whose steps repeat, stop, and start again from
an empty pool with the allocator's memory of the first run still there.

  python gpt_twice.py [STEPS]   (each run; default 20)"""
import gc
import os
import runpy
import sys

from jobcommon import DEVICE, steps

os.environ.setdefault("GPT_DEVICE", DEVICE)
gpt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_gpt.py")
n = str(steps(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
for run in range(2):
    sys.argv = [gpt, n]
    print("run=%d" % (run + 1))
    sys.stdout.flush()
    runpy.run_path(gpt, run_name="__main__")
    gc.collect()  # the run's globals (model, optimizer, data) go with its namespace
