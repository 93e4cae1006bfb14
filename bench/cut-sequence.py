#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The first steps of a recorded sequence, as a sequence of its own (the short corpus the
do-no-harm test replays, bench/sequences/short/): the header and device lines, then the events
up to the end of step N, renumbered, with the footer written anew. A trace whose job marked its
steps (cuheap_mark("step")) is cut at its N-th mark; one without marks is cut as bench-replay
cuts it, into --of steps of as many allocations each, and gets a mark at each step's end, so
that the short sequence carries its steps. Events other than device allocations, frees and
step marks (pinned host memory, fences) are left out.

  cut-sequence.py IN.jsonl[.gz] OUT.jsonl.gz --steps N [--of M]"""
import argparse
import gzip
import json

DEVICE_APIS = {"cuMemAlloc", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemAllocFromPoolAsync",
               "torch_pluggable"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--of", type=int, default=30,
                    help="steps the whole trace holds when it has no marks (default 30)")
    a = ap.parse_args()
    opener = gzip.open if a.inp.endswith(".gz") else open
    head, events = [], []
    with opener(a.inp, "rt") as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue  # a last line cut off
            if d.get("type") == "event":
                events.append(d)
            elif d.get("type") in ("header", "device"):
                head.append(d)
    events.sort(key=lambda e: e["seq"])
    marked = any(e["event"] == "mark" and e.get("label") == "step" for e in events)
    allocs = sum(e["event"] == "alloc" and e["api"] in DEVICE_APIS and e["ptr"] != "0x0"
                 for e in events)
    per_step = allocs // a.of + 1
    out, steps, n = [], 0, 0
    for e in events:
        if steps == a.steps:
            break
        if e["event"] == "mark":
            if marked and e.get("label") == "step":
                out.append(e)
                steps += 1
            continue
        if e["event"] not in ("alloc", "free") or e["api"] not in DEVICE_APIS:
            continue
        out.append(e)
        if not marked and e["event"] == "alloc" and e["ptr"] != "0x0":
            n += 1
            if n % per_step == 0:
                out.append({"type": "event", "event": "mark", "api": "none", "device": 0,
                            "tid": e["tid"], "t": e["t"], "ptr": "0x0", "size": 0, "actual": 0,
                            "pooled": False, "label": "step"})
                steps += 1
    for i, e in enumerate(out):
        e["seq"] = i + 1
    with gzip.open(a.out, "wt", compresslevel=9) as f:
        for d in head:
            f.write(json.dumps(d, separators=(",", ":")) + "\n")
        for e in out:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
        f.write(json.dumps({"type": "footer", "events": len(out), "written": len(out),
                            "dropped": 0, "stacks": 0, "t": out[-1]["t"] if out else 0},
                           separators=(",", ":")) + "\n")
    print("%s: %d steps, %d events" % (a.out, steps, len(out)))


if __name__ == "__main__":
    main()
