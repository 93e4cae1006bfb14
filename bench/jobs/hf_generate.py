# SPDX-License-Identifier: MIT
"""Hugging Face `generate` on requests of varying batch (1 to 16) and prompt length (16 to 192
tokens), greedy, 24 new tokens each, GPT-2 from a config (random weights, no downloads), bf16.
What it exercises: inference without gradients, a key/value cache that grows token by token,
and sizes that change with every request (one request a step)."""
import random

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from jobcommon import DEVICE, Job, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(20)
NEW = pick(24, 4)
cfg = GPT2Config(vocab_size=pick(8192, 256), n_positions=pick(256, 64), n_embd=pick(512, 64),
                 n_layer=pick(6, 2), n_head=pick(8, 4), attn_implementation="eager")
model = GPT2LMHeadModel(cfg)
model = model.to(DEVICE, dtype=torch.bfloat16 if DEVICE.startswith("cuda") else torch.float32)
model.eval()
pickr = random.Random(3)
requests = [(pickr.choice(pick([1, 2, 4, 8, 12, 16], [1, 2, 3])),
             pickr.choice(range(16, pick(192, 48) + 1, 16))) for _ in range(N)]
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("hf-generate", sync=torch_sync)
for batch, length in requests:
    with job.step():
        ids = torch.randint(0, cfg.vocab_size, (batch, length), device=DEVICE, generator=gen)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                 min_new_tokens=NEW, do_sample=False, pad_token_id=0)
        job.output(float(out[:, length:].sum().item()))
job.report("requests=" + ",".join("%dx%d" % r for r in requests))
