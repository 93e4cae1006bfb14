#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check a `cuheap memviz` snapshot the way PyTorch's memory_viz reads it.

memory_viz's Allocator State History view starts from the snapshot's segments and their
active blocks, and walks device_traces backwards to show the allocator at any earlier
event; its blocks' addresses come from tiling each segment with its blocks in order. A step
that frees a block it does not have, or a block left outside every segment, crashes the
page ("Cannot read properties of null (reading 'occupied')"). This script does the same
walk, standard library only, and fails on the first step that would break it.

    memviz_history.py SNAPSHOT.pickle [--expect-empty-start]

Prints one line per device: entries, segments and blocks at the end, the largest reserved
and allocated (not pending free) totals seen along the walk, the "allocated" Allocator State
History shows at the last event (requested sizes of every active block, as MemoryView sums
them), the peak of the Active Memory Timeline (alloc to free_completed, in action sizes, as
process_alloc_data stacks them), and whether the walk ends with nothing (the trace covers the
whole run). Exit 1 with the reason on a violation.
"""
import pickle
import sys


def fail(msg):
    print(f"memviz history: {msg}", file=sys.stderr)
    sys.exit(1)


def tile(snapshot):
    """Block addresses as memory_viz computes them, and the sums _memory_viz.segsum asserts."""
    for seg in snapshot["segments"]:
        for key in ("device", "address", "total_size", "stream", "blocks"):
            if key not in seg:
                fail(f"segment without {key!r}: {seg}")
        addr = seg["address"]
        allocated = internal = external = 0
        for b in seg["blocks"]:
            if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
                fail(f"block state {b['state']!r}")
            if "address" in b and b["address"] != addr:
                fail(f"segment {seg['address']:#x}: block says {b['address']:#x}, tiling puts it at {addr:#x}")
            b["addr"] = addr
            if b["state"] == "active_allocated":
                allocated += b["requested_size"]
                internal += b["size"] - b["requested_size"]
            else:
                external += b["size"]
            for f in b.get("frames", []):
                if set(f) != {"filename", "line", "name"}:
                    fail(f"frame keys {sorted(f)}")
            addr += b["size"]
        if allocated + internal + external != seg["total_size"]:
            fail(f"segment {seg['address']:#x}: blocks cover {addr - seg['address']} of {seg['total_size']} bytes")


def walk(snapshot, device):
    segments = {}  # addr -> size
    blocks = {}  # addr -> [size, free_requested, requested_size]
    for seg in snapshot["segments"]:
        if seg["device"] != device:
            continue
        segments[seg["address"]] = seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["addr"]] = [b["size"], b["state"] == "active_pending_free", b["requested_size"]]
    end_allocated = sum(r for _, _, r in blocks.values())
    seg_list = sorted(segments.items())

    def check(i, e):
        ends = sorted(segments.items())
        for a, (size, _, _) in blocks.items():
            if not any(s <= a and a + size <= s + n for s, n in ends):
                fail(f"device {device}, before entry {i} ({e['action']} {e['addr']:#x}): block {a:#x} (+{size}) lies in no segment")
        for (a1, n1), (a2, _) in zip(ends, ends[1:]):
            if a1 + n1 > a2:
                fail(f"device {device}, before entry {i}: segments {a1:#x} and {a2:#x} overlap")

    trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    peak_reserved = sum(segments.values())
    peak_allocated = sum(r for _, pending, r in blocks.values() if not pending)
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        for key in ("action", "addr", "size", "frames"):
            if key not in e:
                fail(f"device {device}, entry {i} without {key!r}")
        a, act = e["addr"], e["action"]
        if act == "free_completed":
            if a in blocks:
                fail(f"device {device}, entry {i}: free_completed of {a:#x}, which is still live after it")
            blocks[a] = [e["size"], True, e["size"]]
        elif act == "free_requested":
            if a not in blocks:
                fail(f"device {device}, entry {i}: free_requested of {a:#x}, which no block holds")
            blocks[a][1] = False
        elif act == "alloc":
            if a not in blocks or blocks[a][1]:
                fail(f"device {device}, entry {i}: alloc of {a:#x}, which is not an allocated block after it")
            if e["size"] not in (blocks[a][0], blocks[a][2]):
                fail(f"device {device}, entry {i}: alloc of {e['size']} bytes at {a:#x}, the block holds {blocks[a][0]}")
            del blocks[a]
        elif act == "segment_free":
            if a in segments:
                fail(f"device {device}, entry {i}: segment_free of {a:#x}, which is still a segment after it")
            segments[a] = e["size"]
        elif act == "segment_alloc":
            if segments.get(a) != e["size"]:
                fail(f"device {device}, entry {i}: segment_alloc of {a:#x} (+{e['size']}), no such segment after it")
            del segments[a]
        elif act == "oom":
            if "device_free" not in e:
                fail(f"device {device}, entry {i}: oom without device_free")
        else:
            fail(f"device {device}, entry {i}: unknown action {act!r}")
        check(i, e)
        peak_reserved = max(peak_reserved, sum(segments.values()))
        peak_allocated = max(peak_allocated, sum(r for _, pending, r in blocks.values() if not pending))
    empty = not segments and not blocks
    return len(trace), len(seg_list), peak_reserved, peak_allocated, end_allocated, empty


def timeline_peak(snapshot, device):
    """The Active Memory Timeline's top: process_alloc_data stacks each alloc's size until the
    free_completed of its address; blocks allocated before the trace (a free without its alloc,
    or active in the segments without one) stand from the start."""
    trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    live, initial, seen = {}, 0, set()
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in live and e["addr"] not in seen:
            initial += e["size"]
    for seg in snapshot["segments"]:
        if seg["device"] == device:
            for b in seg["blocks"]:
                if b["state"] == "active_allocated" and b["addr"] not in seen:
                    initial += b["requested_size"]
    total = peak = initial
    live = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["action"] == "free_completed":
            total -= live.pop(e["addr"], 0)
        peak = max(peak, total)
    return peak, trace[0]["time_us"] if trace else None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        fail("usage: memviz_history.py SNAPSHOT.pickle [--expect-empty-start]")
    with open(args[0], "rb") as f:
        snapshot = pickle.load(f)
    tile(snapshot)
    devices = set(s["device"] for s in snapshot["segments"])
    devices |= {d for d, t in enumerate(snapshot["device_traces"]) if t}
    for d in sorted(devices):
        n, nseg, peak_res, peak_alloc, end_alloc, empty = walk(snapshot, d)
        top, first_us = timeline_peak(snapshot, d)
        if "--expect-empty-start" in sys.argv and not empty:
            fail(f"device {d}: walking back every entry leaves segments or blocks: the trace misses actions")
        nblocks = sum(1 for s in snapshot["segments"] if s["device"] == d
                      for b in s["blocks"] if b["state"] != "inactive")
        print(f"device {d}: {n} entries, {nseg} segments, {nblocks} active blocks at the end, "
              f"peak reserved {peak_res}, peak allocated {peak_alloc}, "
              f"allocated at the end {end_alloc}, timeline peak {top}, first time_us {first_us}, "
              f"start {'empty' if empty else 'not empty'}")


if __name__ == "__main__":
    main()
