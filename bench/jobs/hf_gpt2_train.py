# SPDX-License-Identifier: MIT
"""Hugging Face GPT-2 trained from a config (random weights, random token ids, no downloads):
transformers' own modules, eager attention, bf16 autocast, AdamW. What it exercises: a second
implementation of the transformer step (the library's, with its own temporaries: attention
masks, causal bias, loss shift) at a fixed shape."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from jobcommon import DEVICE, Job, autocast, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(30)
SEQ, BATCH = pick(256, 32), pick(12, 2)
cfg = GPT2Config(vocab_size=pick(8192, 256), n_positions=SEQ, n_embd=pick(512, 64),
                 n_layer=pick(6, 2), n_head=pick(8, 4), resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0,
                 attn_implementation="eager")  # no fused kernel whose backward uses atomics
model = GPT2LMHeadModel(cfg)
model = model.to(DEVICE)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("hf-gpt2-train", sync=torch_sync)
for step in range(N):
    with job.step():
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), device=DEVICE, generator=gen)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        job.output(loss.item())
job.report()
