#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Turn bench.log (bench/run-gpu.sh) into the markdown tables of bench/RESULTS.md: median ns
per pair by size and configuration with ratios to the alternatives, and the PyTorch GPT loop
by allocator with step time, memory and whether the losses match."""
import re
import statistics
import sys

micro, gpt, order = {}, {}, []
cur = None
for line in open(sys.argv[1]):
    m = re.match(r"config=(\S+) case=(\S+) ns_per_(?:pair|op)=([\d.]+)", line)
    if m:
        micro.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
        continue
    m = re.match(r"config=(\S+)$", line.strip())
    if m:
        cur = m.group(1)
        if cur not in gpt:
            order.append(cur)
            gpt[cur] = {"runs": []}
        continue
    if cur and line.startswith("step_ms="):
        kv = dict(kv.split("=") for kv in line.split())
        gpt[cur]["runs"].append(float(kv["step_ms"]))
        gpt[cur].update(kv)
    elif cur and line.startswith("losses"):
        gpt[cur]["losses"] = line.strip()

configs = ["cudaMalloc", "cudaMallocAsync", "cuheap-norecord", "cuheap-events", "cuheap-stacks30",
           "cuheap-sync", "cuheap-immediate"]
print("### Allocation pairs (median ns per alloc+free; mix: per step)\n")
print("| case | " + " | ".join(configs) + " | cudaMalloc / cuheap | cudaMallocAsync / cuheap |")
print("|---" * (len(configs) + 3) + "|")
for case in micro:
    row = micro[case]
    base = row.get("cuheap-norecord")
    cells = ["%.0f" % row[c] if c in row else "" for c in configs]
    r1 = "%.1f" % (row["cudaMalloc"] / base) if base and "cudaMalloc" in row else ""
    r2 = "%.1f" % (row["cudaMallocAsync"] / base) if base and "cudaMallocAsync" in row else ""
    label = case if not case.isdigit() else (
        "%d B" % int(case) if int(case) < 1024 else "%d KiB" % (int(case) >> 10) if int(case) < (1 << 20)
        else "%d MiB" % (int(case) >> 20))
    print("| %s | %s | %s | %s |" % (label, " | ".join(cells), r1, r2))

print("\n### PyTorch GPT training loop (median step, peak memory, losses vs caching allocator)\n")
print("| allocator | median step ms (runs) | vs caching | peak live MiB | peak reserved MiB | reserved/live | device used MiB | vs caching | losses |")
print("|---|---|---|---|---|---|---|---|---|")
ref = gpt.get("caching", {})
for c in order:
    g = gpt[c]
    if "step_ms" not in g:
        print("| %s | failed | | | | | | | |" % c)
        continue
    step = statistics.median(g["runs"])
    ref_step = statistics.median(ref.get("runs") or [0])
    same = "identical" if g.get("losses") == ref.get("losses") else "DIFFER"
    used = int(g.get("device_used", 0)) / 2**20
    ref_used = int(ref.get("device_used", 0)) / 2**20
    print("| %s | %.2f (%s) | %.3f | %.0f | %.0f | %.2f | %s | %s | %s |" % (
        c, step, ", ".join("%.2f" % r for r in g["runs"]), step / ref_step if ref_step else 0,
        int(g["peak_live"]) / 2**20, int(g["peak_reserved"]) / 2**20, float(g["frag"]),
        "%.0f" % used if used else "", "%.3f" % (used / ref_used) if used and ref_used else "",
        same))
