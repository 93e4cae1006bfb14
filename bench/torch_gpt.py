# SPDX-License-Identifier: MIT
"""GPT-style training loop written with torch.nn only (no downloads): token embedding, causal
self-attention blocks, bf16 autocast, AdamW. Prints the median step time, peak live and peak
reserved bytes, the most device memory the process held (the driver's count, sampled after
each backward pass and step, less what it held before the model), and the losses as exact hex
floats (they must match across allocators). Under cuheap it adds, for the second half of the
steps, cuheap's mapping operations and its milliseconds in mapping calls per step, and with
PyTorch's caching allocator on, PyTorch's own peak reserved (torch_reserved) beside cuheap's.

  python torch_gpt.py [STEPS]

The allocator is chosen by the environment (PYTORCH_NO_CUDA_MEMORY_CACHING,
PYTORCH_CUDA_ALLOC_CONF, LD_PRELOAD=libcuheap.so); CUHEAP_PLUGGABLE=/path/libcuheap.so installs
cuheap through CUDAPluggableAllocator.

GPT_VARLEN=1 trains each step on a prefix of the batch's sequences, of a length drawn (seeded,
the same in every run) from 64 to 256 in steps of 8: a job whose batches vary in length, so
that nearly every step asks for sizes the one before did not.

GPT_EVAL=K evaluates every K steps, after the step: a forward pass of the same shape without
gradients, whose logits are kept until the next evaluation (a phase of another shape, and a
block made in it that lives for many steps); the evaluation losses are printed as well.

GPT_TOGGLE=K (under LD_PRELOAD=libcuheap.so with recording on) pauses and resumes recording
every K steps through cuheap_set_recording, and prints the median step with recording off and
on and their ratio: recording's cost measured within one process, where the shared host's
noise falls on both halves alike.

Under cuheap, every step ends with cuheap_mark("step") after its sync (bench-replay cuts a
recorded sequence into steps there). GPT_DEVICE=cpu runs it on the CPU, to try a change on a
machine without a GPU."""
import ctypes
import os
import random
import statistics
import sys
import time

import torch

if os.environ.get("CUHEAP_PLUGGABLE"):
    torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["CUHEAP_PLUGGABLE"], "cuheap_torch_alloc", "cuheap_torch_free"))

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
VOCAB, D, LAYERS, HEADS, SEQ, BATCH = 4096, 512, 6, 8, 256, 16
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device(os.environ.get("GPT_DEVICE", "cuda"))
CUDA = dev.type == "cuda"
if not CUDA:  # a check of the script's paths: small, and float32 (bf16 is slow on most CPUs)
    VOCAB, D, LAYERS, HEADS, SEQ, BATCH = 256, 64, 2, 4, 64, 4
try:
    mark_step = ctypes.CDLL(None).cuheap_mark
    mark_step.argtypes = [ctypes.c_char_p]
except AttributeError:  # cuheap not loaded
    mark_step = None


class CausalSelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D // HEADS) ** 0.5
        mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, D))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Embedding(SEQ, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def device_used():
    # what the process holds on the device now, as the driver counts it (whatever allocator)
    if not CUDA:
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def sync():
    if CUDA:
        torch.cuda.synchronize()


if CUDA:
    torch.cuda.init()
used_at_start = device_used()
used_peak = 0
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator(device=dev).manual_seed(1)
data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=dev, generator=gen)
x, y = data[:, :-1], data[:, 1:]
losses, times, launch, launch_cpu = [], [], [], []
TOGGLE = int(os.environ.get("GPT_TOGGLE", "0"))
set_recording = None
if TOGGLE:
    try:
        set_recording = ctypes.CDLL(None).cuheap_set_recording
    except AttributeError:
        sys.exit("torch_gpt: GPT_TOGGLE needs cuheap preloaded (cuheap_set_recording)")
    set_recording.argtypes = [ctypes.c_int]
recorded = []  # per step: whether recording was on
EVAL = int(os.environ.get("GPT_EVAL", "0"))
VARLEN = os.environ.get("GPT_VARLEN") == "1"
lengths = []
if VARLEN:
    pick = random.Random(2)
    lengths = [pick.choice(range(min(64, SEQ), SEQ + 1, 8)) for _ in range(STEPS)]
eval_losses, kept_logits = [], None


def cuheap_lib():
    """cuheap's library when it serves this process (preloaded or pluggable), else None."""
    try:
        lib = ctypes.CDLL(os.environ["CUHEAP_PLUGGABLE"]) if os.environ.get("CUHEAP_PLUGGABLE") \
            else ctypes.CDLL(None)
        lib.cuheap_get_stats
        return lib
    except (AttributeError, OSError):
        return None


def cuheap_stats(lib):
    """struct cuheap_stats as a list: 13 fields, then chunks created, moved, released, map_ns,
    then cuheap's own time and its driver calls (OWN_FIELDS, at 17 on; zeros from an older
    library)."""
    stats = (ctypes.c_uint64 * (17 + len(OWN_FIELDS)))()
    return list(stats) if lib and lib.cuheap_get_stats(stats, ctypes.sizeof(stats)) == 0 else None


OWN_FIELDS = ("own_alloc_ns", "own_free_ns", "nr_own_timed", "nr_program_calls", "program_ns",
              "nr_map_calls", "map_calls_ns", "nr_record_calls", "record_ns", "nr_query_calls",
              "query_ns", "nr_sync_calls", "sync_ns", "nr_other_calls", "other_ns")


def own_per_step(now, before, n, step_ms):
    """cuheap's own time and its driver calls a step over n steps, as key=value words."""
    d = {k: (now[17 + i] - before[17 + i]) / n for i, k in enumerate(OWN_FIELDS)}
    own_ms = (d["own_alloc_ns"] + d["own_free_ns"]) / 1e6
    words = " own_ms_per_step=%.4f own_pct_of_step=%.2f" % (
        own_ms, 100 * own_ms / step_ms if step_ms else 0)
    for kind in ("program", "map", "record", "query", "sync"):
        calls = d["nr_%s_calls" % kind]
        ms = d[("map_calls_ns" if kind == "map" else kind + "_ns")] / 1e6
        words += " %s_calls_per_step=%.1f %s_ms_per_step=%.4f" % (kind, calls, kind, ms)
    return words


# The second half of the run is the warm part: cuheap's mapping operations (chunks taken, moved
# and given back) and its time in mapping calls over those steps, which the step's wall time,
# on a noisy host, hides.
lib = cuheap_lib()
warm_from, warm_stats = STEPS // 2, None
for step in range(STEPS):
    if step == warm_from:
        warm_stats = cuheap_stats(lib)
    if set_recording:
        on = (step // TOGGLE) % 2 == 1
        if set_recording(int(on)) < 0:
            sys.exit("torch_gpt: GPT_TOGGLE needs recording on (cuheap_set_recording said -1)")
        recorded.append(on)
    sync()
    t0, c0 = time.perf_counter(), time.thread_time()
    xs, ys = (x[:, :lengths[step]], y[:, :lengths[step]]) if VARLEN else (x, y)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=CUDA):
        loss = torch.nn.functional.cross_entropy(model(xs).reshape(-1, VOCAB), ys.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    used_peak = max(used_peak, device_used())
    opt.step()
    # the step's work handed to the GPU, before anything waits for it: wall and this thread's
    # CPU time (user and system, the driver's calls included); when launching takes as long as
    # the step, the step is bound by the CPU, and the allocator's CPU time is the step's
    launch.append(time.perf_counter() - t0)
    launch_cpu.append(time.thread_time() - c0)
    losses.append(loss.item())
    sync()
    times.append(time.perf_counter() - t0)
    used_peak = max(used_peak, device_used())
    if EVAL and step % EVAL == EVAL - 1:
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=CUDA):
            logits = model(x)
            eval_losses.append(
                torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).item())
        kept_logits = logits  # the last one freed only now
        used_peak = max(used_peak, device_used())
    if mark_step:
        mark_step(b"step")

try:
    peak_live = torch.cuda.max_memory_allocated() if CUDA else 0
    peak_reserved = torch.cuda.max_memory_reserved() if CUDA else 0
except RuntimeError:  # a pluggable allocator keeps no PyTorch statistics
    peak_live = peak_reserved = 0
source = "torch"
torch_reserved = peak_reserved  # PyTorch's own peak reserved, under cuheap too (0: pluggable)
stats = cuheap_stats(lib)
if stats and stats[3]:
    peak_reserved, source = stats[3], "cuheap"
    if not peak_live:
        peak_live = stats[1]
warm = ""
if stats and warm_stats:
    n = STEPS - warm_from
    warm = " warm_map_ops_per_step=%.1f warm_map_ms_per_step=%.3f" % (
        sum(stats[i] - warm_stats[i] for i in (13, 14, 15)) / n, (stats[16] - warm_stats[16]) / 1e6 / n)
    # cuheap's own time in the warm steps against the median step (not measured before the
    # library had the fields: zeros)
    warm += own_per_step(stats, warm_stats, n, 1000 * statistics.median(times[warm_from:]))
if source == "cuheap" and torch_reserved:
    warm += " torch_reserved=%d" % torch_reserved
skip = 5 if len(times) > 10 else 0
print("step_ms=%.3f peak_live=%d peak_reserved=%d reserved_from=%s frag=%.3f device_used=%d "
      "launch_ms=%.3f launch_cpu_ms=%.3f%s" % (
          1000 * statistics.median(times[skip:]), peak_live, peak_reserved, source,
          peak_reserved / peak_live if peak_live else 0, used_peak - used_at_start,
          1000 * statistics.median(launch[skip:]), 1000 * statistics.median(launch_cpu[skip:]), warm))
print("losses", " ".join(float(v).hex() for v in losses))
if EVAL:
    print("eval_losses", " ".join(float(v).hex() for v in eval_losses))
if set_recording:
    off = [t for t, on in zip(times[5:], recorded[5:]) if not on]
    on = [t for t, on in zip(times[5:], recorded[5:]) if on]
    print("toggle every=%d steps_off=%d steps_on=%d off_ms=%.3f on_ms=%.3f on_over_off=%.4f" % (
        TOGGLE, len(off), len(on), 1000 * statistics.median(off), 1000 * statistics.median(on),
        statistics.median(on) / statistics.median(off)))
