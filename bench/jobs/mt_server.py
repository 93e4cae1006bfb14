# SPDX-License-Identifier: MIT
"""A multi-threaded, multi-stream inference server: 4 worker threads share one model (a small
GPT, bf16, no gradients), each on its own torch.cuda.Stream; every round each worker takes a
request (batch 1 to 8, 32 to 256 tokens, seeded) and decodes 8 tokens greedily (the whole
sequence run again for each, no key/value cache), then waits for its stream; a round ends
when all four are done (one step). What it exercises: allocations and frees from several
threads at once, each thread's tensors used on its own stream, sizes that change by request."""
import random
import threading

import torch

from jobcommon import CUDA, DEVICE, Job, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(24)
WORKERS, NEW = 4, pick(8, 2)
VOCAB, D, HEADS, LAYERS, SEQ = pick(4096, 256), pick(512, 64), 8, pick(6, 2), pick(256 + 8, 48)


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


model = GPT().to(DEVICE, dtype=torch.bfloat16 if CUDA else torch.float32).eval()
torch_sync()
pickr = random.Random(6)
requests = [[(pickr.choice(range(1, pick(8, 3) + 1)), pickr.choice(range(32, SEQ - NEW + 1, 8)))
             for _ in range(WORKERS)] for _ in range(N)]
# the prompts made up front on the main thread (a server's input arrives from the host)
prompts = [[torch.randint(0, VOCAB, r, generator=torch.Generator().manual_seed(100 * i + w))
            for w, r in enumerate(rnd)] for i, rnd in enumerate(requests)]
results = [[None] * WORKERS for _ in range(N)]
start = [threading.Barrier(WORKERS + 1) for _ in range(N)]
end = [threading.Barrier(WORKERS + 1) for _ in range(N)]
failed = []


def worker(w):
    stream = torch.cuda.Stream() if CUDA else None
    try:
        for i in range(N):
            start[i].wait()
            with torch.no_grad(), (torch.cuda.stream(stream) if CUDA else torch.no_grad()):
                ids = prompts[i][w].to(DEVICE, non_blocking=False)
                for _ in range(NEW):
                    nxt = model(ids)[:, -1].argmax(dim=-1, keepdim=True)
                    ids = torch.cat([ids, nxt], dim=1)
                out = ids[:, -NEW:].sum()
            if stream is not None:
                stream.synchronize()
            results[i][w] = float(out.item())
            end[i].wait()
    except BaseException as e:  # a worker that fails must not leave the others waiting
        failed.append(repr(e))
        for b in start + end:
            b.abort()


threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
for t in threads:
    t.start()
job = Job("mt-server", sync=torch_sync)
try:
    for i in range(N):
        with job.step():
            start[i].wait()
            end[i].wait()
        job.output(*results[i])
except threading.BrokenBarrierError:
    pass
for t in threads:
    t.join()
if failed:
    raise SystemExit("mt_server: a worker failed: " + failed[0])
job.report("workers=%d" % WORKERS)
