# SPDX-License-Identifier: MIT
"""CuPy without its memory pool (cupy.cuda.set_allocator(None): every array from cudaMalloc,
freed with cudaFree when Python drops it): a spectral solver of the 2D Poisson equation on a
grid whose size changes every step (256 to 1024 points a side, seeded), the solution checked
by its residual, then a batch of least-squares fits (QR through cuSOLVER, whose workspace
CuPy allocates too) of varying shape. What it exercises: a numerical code whose arrays, FFT
plans and solver workspaces follow the problem size, with no framework in between. On the
CPU (JOB_DEVICE=cpu) NumPy stands in for CuPy."""
import random

from jobcommon import CUDA, Job, pick, steps

if CUDA:
    import cupy as xp
    xp.cuda.set_allocator(None)
    xp.cuda.set_pinned_memory_allocator(None)

    def sync():
        xp.cuda.Device().synchronize()
else:
    import numpy as xp

    def sync():
        pass

N = steps(30)
pickr = random.Random(5)
sides = [pickr.choice(pick([256, 384, 512, 768, 1024], [32, 48, 64])) for _ in range(N)]
fits = [(pickr.choice(pick([256, 512, 1024], [16, 32])), pickr.choice(pick([32, 64, 128], [4, 8])))
        for _ in range(N)]
job = Job("cupy-nopool", sync=sync)
rng = xp.random.RandomState(1)
for n, (rows, cols) in zip(sides, fits):
    with job.step():
        # -laplacian(u) = f on a periodic n x n grid, solved by FFT
        x = xp.arange(n, dtype=xp.float64) / n
        f = xp.sin(2 * xp.pi * x)[:, None] * xp.cos(4 * xp.pi * x)[None, :] + \
            0.1 * rng.standard_normal((n, n))
        f -= f.mean()
        k = xp.fft.fftfreq(n, d=1.0 / n) * 2 * xp.pi
        k2 = k[:, None] ** 2 + k[None, :] ** 2
        k2[0, 0] = 1.0
        u = xp.real(xp.fft.ifft2(xp.fft.fft2(f) / k2))
        lap = (4 * u - xp.roll(u, 1, 0) - xp.roll(u, -1, 0) - xp.roll(u, 1, 1) -
               xp.roll(u, -1, 1)) * n * n
        resid = float(xp.abs(lap - f).mean())
        # a batch of least-squares fits: A x = b by QR
        a = rng.standard_normal((8, rows, cols))
        b = rng.standard_normal((8, rows, 1))
        err = 0.0
        for i in range(8):
            q, r = xp.linalg.qr(a[i])
            sol = xp.linalg.solve(r, q.T @ b[i])
            err += float(xp.linalg.norm(a[i] @ sol - b[i]))
        job.output(resid, err)
job.report("sides=" + ",".join(map(str, sides)))
