# SPDX-License-Identifier: MIT
"""Compare the live-bytes curve of a cuheap trace with what the program said at its markers.
torch_client.py puts "step N allocated=BYTES" markers (torch.cuda.memory_allocated()) into the
trace; this replays the trace's device allocations and frees up to each marker.
Usage: check_marks.py TRACE"""
import json
import sys

HOST_APIS = {"cuMemHostAlloc", "cuMemMap"}

live = 0
rows = []
events = []
with open(sys.argv[1]) as f:
    for line in f:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if rec.get("type") == "event":
            events.append(rec)
events.sort(key=lambda e: e["seq"])
for e in events:
    if e["event"] == "mark" and "allocated=" in e.get("label", ""):
        torch_bytes = int(e["label"].split("allocated=")[1])
        rows.append((e["label"].split(" allocated")[0], torch_bytes, live))
    elif e["device"] >= 0 and e["api"] not in HOST_APIS:
        if e["event"] == "alloc":
            live += e["size"]
        elif e["event"] == "free":
            live -= e["size"]
worst = 0.0
for name, t, c in rows:
    rel = abs(c - t) / t if t else 0.0
    worst = max(worst, rel)
    print("%-8s torch.cuda.memory_allocated=%12d  cuheap live=%12d  diff=%+d" % (name, t, c, c - t))
print("markers=%d worst relative difference=%.4f%%" % (len(rows), 100 * worst))
