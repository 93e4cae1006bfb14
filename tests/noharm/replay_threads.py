#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-replay plays a recorded job as the job ran: a made-up trace of three threads (one of
them allocating stream-ordered on two streams) that mark five steps is replayed under cuheap
with its pool off and recording on, and the replay's own trace must show each recorded thread
on a thread of its own, the events in the recorded order, the stream-ordered ones on two
streams of their own, and the five steps; with --threads 1, every event on one thread. Prints
TAP.

  replay_threads.py --replay bench-replay --lib libcuheap.so --fakecuda DIR"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

TIDS = (501, 502, 503)


def made_up_trace(path):
    """Three threads taking turns unevenly within each step; thread 503 allocates with
    cuMemAllocAsync on streams 0x10 and 0x20; a block made by one thread is freed by another."""
    ev, seq = [], [0]

    def add(**e):
        seq[0] += 1
        e.update({"type": "event", "seq": seq[0], "t": seq[0] * 1000, "device": 0,
                  "actual": e.get("size", 0), "pooled": False})
        ev.append(e)

    ptr = [0x7f0000000000]
    for step in range(5):
        live = []
        for k in range(12):
            tid = TIDS[(k * 7 + step) % 3 if k % 4 else 0]
            size = 4096 * (1 + (k * 5 + step) % 9) << (k % 3) * 4
            ptr[0] += 1 << 26
            if tid == 503:
                add(event="alloc", api="cuMemAllocAsync", tid=tid, ptr=hex(ptr[0]), size=size,
                    stream=hex(0x10 if k % 2 else 0x20))
            else:
                add(event="alloc", api="cuMemAlloc", tid=tid, ptr=hex(ptr[0]), size=size)
            live.append((ev[-1]["api"], ev[-1].get("stream"), ptr[0], size))
            if k % 3 == 2:  # freed by the next thread in turn
                api, stream, p, s = live.pop(0)
                e = {"event": "free", "api": api, "tid": TIDS[(k + 1) % 3], "ptr": hex(p),
                     "size": s}
                if stream:
                    e.update(stream=stream, tid=503)
                add(**e)
        for api, stream, p, s in live:
            e = {"event": "free", "api": api, "tid": 503 if stream else TIDS[step % 2],
                 "ptr": hex(p), "size": s}
            if stream:
                e["stream"] = stream
            add(**e)
        add(event="mark", api="none", tid=501, ptr="0x0", size=0, label="step")
    with open(path, "w") as f:
        f.write(json.dumps({"type": "header", "format": "cuheap-trace", "version": 1,
                            "pid": 1, "ppid": 0, "host": "h", "exe": "x", "cmdline": ["x"],
                            "start_unix_ns": 0, "clock": "CLOCK_MONOTONIC", "unwinder": "none",
                            "python": False, "config": {}, "stack_depth": 0}) + "\n")
        f.write('{"type":"device","device":0,"name":"fake","total":17179869184}\n')
        for e in ev:
            f.write(json.dumps(e) + "\n")
        f.write(json.dumps({"type": "footer", "events": len(ev), "written": len(ev),
                            "dropped": 0, "stacks": 0, "t": seq[0] * 1000}) + "\n")
    return [e for e in ev if e["event"] in ("alloc", "free")]


def events_of(path):
    out = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if d.get("type") == "event" and d["event"] in ("alloc", "free") and \
                    d["api"] in ("cuMemAlloc", "cuMemAllocAsync"):
                out.append(d)
    return sorted(out, key=lambda d: d["seq"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--fakecuda", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cuheap-replay-threads-")
    rec = made_up_trace(os.path.join(tmp, "in.jsonl"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUHEAP_")}
    env.update(LD_LIBRARY_PATH=a.fakecuda, LD_PRELOAD=a.lib, CUHEAP_POOL="0",
               CUHEAP_STACK_DEPTH="0", CUHEAP_SUMMARY="0")
    print("1..6")
    failed = 0

    def ok(cond, what):
        nonlocal failed
        failed += not cond
        print(("ok" if cond else "not ok") + " - " + what)

    for n, threads in ((1, []), (2, ["--threads", "1"])):
        out_path = os.path.join(tmp, "out%d.jsonl" % n)
        r = subprocess.run([a.replay, "--work-us", "0"] + threads +
                           [os.path.join(tmp, "in.jsonl")], env=dict(env, CUHEAP_OUTPUT=out_path),
                           capture_output=True, text=True, timeout=60)
        first = r.stdout.splitlines()[0] if r.stdout else ""
        got = events_of(out_path) if os.path.exists(out_path) else []
        # the replay's thread for each recorded one, in order of appearance
        tid_of = {}
        for e, g in zip(rec, got):
            tid_of.setdefault(e["tid"], set()).add(g["tid"])
        same = len(got) == len(rec) and all(
            (e["event"], e["api"], e["size"]) == (g["event"], g["api"], g["size"])
            for e, g in zip(rec, got))
        if not threads:
            ok(r.returncode == 0 and "threads=3 " in first and "steps=5 steps_from=marks" in first,
               "the replay takes 3 threads and 5 steps from the trace's marks: %r" % first)
            ok(same and all(len(v) == 1 for v in tid_of.values()) and
               len(set().union(*tid_of.values())) == 3,
               "each recorded thread replayed on a thread of its own, in the recorded order "
               "(%d of %d events, threads %s)" % (len(got), len(rec), sorted(map(len, tid_of.values()))))
            streams = {e.get("stream") for e in got if e["api"] == "cuMemAllocAsync"}
            ok(len(streams) == 2 and None not in streams and
               not streams & {e.get("stream") for e in got if e["api"] == "cuMemAlloc"},
               "the stream-ordered allocations on two streams of their own: %s" % sorted(map(str, streams)))
        else:
            ok(r.returncode == 0 and "threads=1 " in first, "--threads 1: %r" % first)
            ok(same and len({g["tid"] for g in got}) == 1,
               "--threads 1 replays every event on one thread, in the recorded order")
            ok("allocs=60 " in r.stdout, "every allocation replayed once: %s" %
               r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "no output")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
