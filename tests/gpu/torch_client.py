# SPDX-License-Identifier: MIT
"""PyTorch under cuheap, for the GPU runs. Trains a small model a few steps in one of several
allocator modes and prints the losses (as exact hex floats, to compare bit for bit with a run
without cuheap) and how many driver allocations PyTorch says it made next to how many cuheap
saw.

  python torch_client.py MODE     MODE: default, nocache, expandable, async, graph, pluggable

The allocator settings themselves come from the environment the runner sets
(PYTORCH_NO_CUDA_MEMORY_CACHING, PYTORCH_CUDA_ALLOC_CONF); `pluggable` installs cuheap's
CUDAPluggableAllocator from CUHEAP_LIB."""
import os
import sys

import torch

import cuheap_probe

mode = sys.argv[1] if len(sys.argv) > 1 else "default"
if mode == "pluggable":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(os.environ["CUHEAP_LIB"], "cuheap_torch_alloc",
                                                     "cuheap_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln(x))


def make_model():
    return torch.nn.Sequential(*[Block(128) for _ in range(3)], torch.nn.Linear(128, 16)).to(dev)


model = make_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=(mode == "graph"))
x = torch.randn(8, 64, 128, device=dev)
y = torch.randint(0, 16, (8, 64), device=dev)
loss_fn = torch.nn.CrossEntropyLoss()
losses = []

def mark_step(i):
    """A marker per step with PyTorch's own live figure, to check cuheap's curve against."""
    if cuheap_probe.loaded():
        torch.cuda.synchronize()
        cuheap_probe.mark("step %d allocated=%d" % (i, torch.cuda.memory_allocated()))


def step():
    opt.zero_grad(set_to_none=False)
    out = model(x)
    loss = loss_fn(out.reshape(-1, 16), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss


if mode == "graph":
    # capture one training step and replay it: allocation during capture goes to the driver
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            losses.append(step().item())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step()
    for _ in range(7):
        g.replay()
        losses.append(static_loss.item())
else:
    for i in range(10):
        mark_step(i)
        losses.append(step().item())
    mark_step(10)
torch.cuda.synchronize()

print("losses", " ".join(float(v).hex() for v in losses))
stats = torch.cuda.memory_stats()
print("torch: num_device_alloc=%s num_device_free=%s max_allocated=%d max_reserved=%d" % (
    stats.get("num_device_alloc"), stats.get("num_device_free"), torch.cuda.max_memory_allocated(),
    torch.cuda.max_memory_reserved()))
print("cuheap:", cuheap_probe.call_counts([
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz", "cuMemCreate", "cuMemMap", "cuMemRelease"]))
