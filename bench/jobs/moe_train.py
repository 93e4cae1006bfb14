# SPDX-License-Identifier: MIT
"""A mixture-of-experts stack trained with top-2 routing: each layer's router sends every token
to two of 8 experts (feed-forward networks), so how many tokens each expert gets, and with it
the size of every expert's activations and gradients, changes every step; a load-balancing
loss keeps the experts in use. bf16 autocast, AdamW, random tokens. Each expert's tokens are
distinct, so gathering and adding back (index_select, index_add_) are deterministic."""
import torch

from jobcommon import DEVICE, Job, autocast, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(30)
D, FF, EXPERTS, LAYERS = pick(512, 64), pick(1024, 128), 8, pick(4, 2)
VOCAB, SEQ, BATCH = pick(4096, 256), pick(256, 32), pick(16, 2)


class MoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(D)
        self.router = torch.nn.Linear(D, EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(D, FF), torch.nn.GELU(), torch.nn.Linear(FF, D))
            for _ in range(EXPERTS))

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln(x).reshape(b * t, D)
        probs = self.router(h).float().softmax(dim=-1)
        weight, chosen = probs.topk(2, dim=-1)
        weight = weight / weight.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)  # a size known only now
            if token.numel() == 0:
                continue
            y = expert(h.index_select(0, token)) * weight[token, slot].unsqueeze(1).to(h.dtype)
            out = out.index_add(0, token, y.to(out.dtype))
        # the fraction of tokens and of router weight each expert got: balanced when equal
        load = torch.nn.functional.one_hot(chosen[:, 0], EXPERTS).float().mean(0)
        aux = EXPERTS * (load * probs.mean(0)).sum()
        return x + out.reshape(b, t, D), aux


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(MoE() for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x, aux = self.tok(idx), 0.0
        for layer in self.layers:
            x, a = layer(x)
            aux = aux + a
        return self.head(x), aux


model = Model().to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("moe-train", sync=torch_sync)
for step in range(N):
    with job.step():
        data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=DEVICE, generator=gen)
        with autocast():
            logits, aux = model(data[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                                     data[:, 1:].reshape(-1)) + 0.01 * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        job.output(loss.item())
job.report()
