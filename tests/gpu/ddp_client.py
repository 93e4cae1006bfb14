# SPDX-License-Identifier: MIT
"""DDP training under torchrun, for per-rank traces. With two GPUs it uses NCCL, one GPU per
rank; with one GPU both ranks share it and talk through gloo (NCCL refuses two ranks on one
device). Rank 0 prints the losses as exact hex floats.

  torchrun --nproc_per_node=2 ddp_client.py"""
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
ngpu = torch.cuda.device_count()
dev = torch.device("cuda", rank % ngpu)
torch.cuda.set_device(dev)
dist.init_process_group("nccl" if ngpu >= world else "gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 16)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator(device=dev).manual_seed(100 + rank)
losses = []
for step in range(10):
    x = torch.randn(64, 256, device=dev, generator=gen)
    y = torch.randint(0, 16, (64,), device=dev, generator=gen)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
if rank == 0:
    print("backend", dist.get_backend(), "ranks", world, "gpus", ngpu)
    print("losses", " ".join(float(v).hex() for v in losses))
dist.destroy_process_group()
