# SPDX-License-Identifier: MIT
"""CUDA tensors shared between processes with torch.multiprocessing (cuIpcGetMemHandle in the
parent, cuIpcOpenMemHandle in a spawned child, which inherits cuheap's preload): the child
checks the parent's bytes, adds to them in place, and the parent checks the child's work.
Prints "checksum ..." (the same with and without cuheap) or fails.

  python torch_ipc.py"""
import torch
import torch.multiprocessing as mp


def child(q, done):
    print("child: started", flush=True)
    tensors = q.get(timeout=60)
    print("child: got", len(tensors), "tensors", flush=True)
    sums = [float(t.double().sum()) for t in tensors]
    for t in tensors:
        t.add_(1.0)  # written through the shared memory
    torch.cuda.synchronize()
    done.put(sums)


def main():
    torch.manual_seed(0)
    # a large tensor over many granules, small ones that share one, and a view inside a block
    tensors = [torch.randn(5 << 20, device="cuda"), torch.randn(300, device="cuda"),
               torch.randn(700, device="cuda")]
    base = torch.randn(1 << 20, device="cuda")
    tensors.append(base[4096:8192])
    before = [float(t.double().sum()) for t in tensors]
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, done))
    p.start()
    q.put(tensors)
    print("parent: sent", flush=True)
    seen = done.get(timeout=90)
    print("parent: child done", flush=True)
    p.join(60)
    torch.cuda.synchronize()
    after = [float(t.double().sum()) for t in tensors]
    ok = p.exitcode == 0 and seen == before and all(
        abs(a - (b + t.numel())) < 1e-3 * t.numel() for a, b, t in zip(after, before, tensors))
    print("ipc", "ok" if ok else "FAILED", "child exit", p.exitcode)
    print("checksum", " ".join("%.6f" % v for v in after))


if __name__ == "__main__":
    main()
