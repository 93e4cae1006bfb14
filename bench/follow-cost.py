#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The cost of following a trace (`cuheap top --follow`, docs/live.md): a real trace recorded
from bench/trace-gen on the simulated device is written out again at a steady rate (default
1 million events a minute) while the tool follows it on a pipe, refreshing every second; the
follower's CPU time (utime + stime from /proc/PID/stat, read just before its end) gives its
share of a core and the events a second it follows per percent of a core. A second figure
reads the whole trace in one refresh (how fast it catches up with a trace already written).

    bench/follow-cost.py [--build DIR] [--rate EVENTS_PER_MIN] [--seconds S] [--steps N]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick  # utime, stime


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rate", type=float, default=1e6, help="events a minute")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--steps", type=int, default=14000, help="trace-gen steps (~72 events each)")
    a = ap.parse_args()
    b = os.path.abspath(a.build)
    tool = f"{b}/tools/cuheap"
    with tempfile.TemporaryDirectory() as d:
        src = f"{d}/src.jsonl"
        env = dict(os.environ, LD_LIBRARY_PATH=f"{b}/tests/fakecuda", CUHEAP_SUMMARY="0",
                   CUHEAP_OUTPUT=src, LD_PRELOAD=f"{b}/src/libcuheap.so")
        subprocess.run([f"{b}/bench/trace-gen", str(a.steps)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        with open(src, "rb") as f:
            lines = f.readlines()
        head = [l for l in lines if b'"type":"event"' not in l and b'"type":"footer"' not in l]
        events = [l for l in lines if b'"type":"event"' in l]
        footer = [l for l in lines if b'"type":"footer"' in l]
        nr = min(len(events), int(a.rate / 60 * a.seconds))
        out = f"{d}/live.jsonl"
        # stacks before the events, as the writer puts them (every stack up front is the worst
        # case for the first refresh, not for the steady state measured)
        with open(out, "wb") as w:
            w.writelines(head)
        follower = subprocess.Popen([tool, "top", "--follow", "--interval", "1", out],
                                    stdout=subprocess.DEVNULL)
        per_tick, tick = a.rate / 60 / 10, 0.1
        t0, done = time.monotonic(), 0
        with open(out, "ab", buffering=0) as w:
            while done < nr:
                n = min(nr - done, int(per_tick * (1 + (time.monotonic() - t0) // tick) - done))
                if n > 0:
                    w.write(b"".join(events[done:done + n]))
                    done += n
                time.sleep(tick / 2)
            wall = time.monotonic() - t0
            time.sleep(1.5)  # the last refresh
            cpu = cpu_seconds(follower.pid)
            rss = peak_rss_mib(follower.pid)
            w.writelines(footer)
        follower.wait(timeout=30)
        share = 100 * cpu / wall
        rate = nr / wall
        print(f"follow: {nr} events in {wall:.1f} s ({rate * 60 / 1e6:.2f} M events/min), "
              f"follower CPU {cpu:.2f} s = {share:.2f}% of a core, "
              f"{rate / max(share, 1e-9):.0f} events/s per 1% of a core; peak RSS {rss:.1f} MiB")
        # catching up: the whole trace in one refresh (/usr/bin/time: the peak RSS of the
        # tool itself, not of this script's fork before the exec)
        t1 = time.monotonic()
        r = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", tool, "top", "--follow", "--count",
                            "1", src], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        kib, user, system = r.stderr.strip().split("\n")[-1].split()
        took = float(user) + float(system)
        print(f"catch-up: {len(events)} events read in one refresh, CPU {took:.2f} s "
              f"({len(events) / max(took, 1e-9) / 1e6:.2f} M events per CPU second; "
              f"wall {time.monotonic() - t1:.2f} s; peak RSS {int(kib) / 1024:.1f} MiB; "
              f"trace {os.path.getsize(src) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
