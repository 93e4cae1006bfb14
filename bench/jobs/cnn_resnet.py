# SPDX-License-Identifier: MIT
"""A CNN trained with a batch size that changes every step (16 to 64 images, seeded): torchvision's
ResNet-18 (100 classes, random weights; a ResNet-18 of torch.nn alone where torchvision is not
installed), 96x96 images, SGD with momentum, float32 with cuDNN's deterministic algorithms.
What it exercises: convolution workspaces and activations whose sizes follow the batch."""
import random

import torch

from jobcommon import DEVICE, Job, pick, seed_all, steps, torch_sync

seed_all(0)
N = steps(30)
SIDE = pick(96, 32)
try:
    import torchvision
    model, source = torchvision.models.resnet18(num_classes=100), "torchvision"
except ImportError:
    source = "torch.nn"

    class Basic(torch.nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = torch.nn.BatchNorm2d(cout)
            self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = torch.nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (self.down(x) if self.down is not None else x))

    layers = [torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64),
              torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 100)]
    model = torch.nn.Sequential(*layers)
model = model.to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
pickr = random.Random(4)
batches = [pickr.choice(pick([16, 24, 32, 40, 48, 64], [2, 3, 4])) for _ in range(N)]
gen = torch.Generator(device=DEVICE).manual_seed(1)
job = Job("cnn-resnet", sync=torch_sync)
for b in batches:
    with job.step():
        x = torch.randn(b, 3, SIDE, SIDE, device=DEVICE, generator=gen)
        y = torch.randint(0, 100, (b,), device=DEVICE, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        job.output(loss.item())
job.report("model=" + source + " batches=" + ",".join(map(str, batches)))
