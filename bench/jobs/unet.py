# SPDX-License-Identifier: MIT
"""A UNet-like denoiser trained as a diffusion model's noise predictor: four levels down
(two 3x3 convolutions, GroupNorm, SiLU, then a strided convolution), four up (a transposed
convolution, the skip connection concatenated), a timestep embedding added at every level;
128x128 images, batch 8, bf16 autocast, AdamW. What it exercises: activations of many sizes
kept for the backward pass, and concatenations that copy them."""
import math

import torch

from jobcommon import DEVICE, Job, autocast, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(30)
SIDE, BATCH, WIDTH = pick(128, 32), pick(8, 2), pick(64, 8)
CH = [WIDTH, 2 * WIDTH, 4 * WIDTH, 4 * WIDTH]


class Block(torch.nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, padding=1)
        self.n1 = torch.nn.GroupNorm(8, cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, padding=1)
        self.n2 = torch.nn.GroupNorm(8, cout)
        self.t = torch.nn.Linear(CH[0], cout)

    def forward(self, x, temb):
        h = torch.nn.functional.silu(self.n1(self.c1(x)))
        h = h + self.t(temb)[:, :, None, None]
        return torch.nn.functional.silu(self.n2(self.c2(h)))


class UNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Conv2d(3, CH[0], 3, padding=1)
        self.down = torch.nn.ModuleList()
        self.pool = torch.nn.ModuleList()
        cin = CH[0]
        for c in CH:
            self.down.append(Block(cin, c))
            self.pool.append(torch.nn.Conv2d(c, c, 3, stride=2, padding=1))
            cin = c
        self.mid = Block(cin, cin)
        self.upconv = torch.nn.ModuleList()
        self.up = torch.nn.ModuleList()
        for c in reversed(CH):
            self.upconv.append(torch.nn.ConvTranspose2d(cin, c, 2, stride=2))
            self.up.append(Block(2 * c, c))
            cin = c
        self.out = torch.nn.Conv2d(cin, 3, 1)

    def forward(self, x, t):
        half = CH[0] // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / half)
        temb = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=1)
        h, skips = self.inp(x), []
        for block, pool in zip(self.down, self.pool):
            h = block(h, temb)
            skips.append(h)
            h = pool(h)
        h = self.mid(h, temb)
        for upconv, block in zip(self.upconv, self.up):
            h = block(torch.cat([upconv(h), skips.pop()], dim=1), temb)
        return self.out(h)


model = UNet().to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("unet", sync=torch_sync)
for step in range(N):
    with job.step():
        x0 = torch.randn(BATCH, 3, SIDE, SIDE, device=DEVICE, generator=gen)
        noise = torch.randn(BATCH, 3, SIDE, SIDE, device=DEVICE, generator=gen)
        t = torch.randint(0, 1000, (BATCH,), device=DEVICE, generator=gen).float()
        a = torch.cos(t / 1000 * math.pi / 2)[:, None, None, None]
        with autocast():
            pred = model(a * x0 + (1 - a * a).sqrt() * noise, t)
            loss = torch.nn.functional.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        job.output(loss.item())
job.report()
