# SPDX-License-Identifier: MIT
"""Gradient accumulation with activation checkpointing: a transformer of 8 blocks, each block
checkpointed (torch.utils.checkpoint, non-reentrant: its activations recomputed in the
backward pass instead of kept), 4 micro-batches a step whose gradients add up before one AdamW
step, bf16 autocast. What it exercises: blocks made twice (forward, then recomputed), a
backward pass that allocates as it goes, and gradients kept across micro-batches."""
import torch
import torch.utils.checkpoint

from jobcommon import DEVICE, Job, autocast, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(24)
VOCAB, D, HEADS, LAYERS = pick(4096, 256), pick(512, 64), pick(8, 4), pick(8, 2)
SEQ, MICRO, ACCUM = pick(256, 32), pick(8, 2), 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D, D))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D // HEADS) ** 0.5
        mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x))


class Model(torch.nn.Module):
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
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return self.head(self.ln(x))


model = Model().to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("grad-accum-ckpt", sync=torch_sync)
for step in range(N):
    with job.step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for micro in range(ACCUM):
            data = torch.randint(0, VOCAB, (MICRO, SEQ + 1), device=DEVICE, generator=gen)
            with autocast():
                logits = model(data[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                                         data[:, 1:].reshape(-1)) / ACCUM
            loss.backward()
            total += loss.item()
        opt.step()
        job.output(total)
job.report()
