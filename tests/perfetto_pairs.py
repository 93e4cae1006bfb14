#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Pair a `cuheap chrome` file's async slices the way Perfetto's JSON importer does.

Perfetto puts a 'b'/'e' event on an async track keyed by process (for id2.local ids; a
plain "id" or id2.global is global to the whole file), category, name and id; an 'e' ends
the newest open slice of its track. This checks that every slice is process-scoped, that
every end finds its begin no earlier than itself, and prints one line per process:

    pid P "NAME": B slices, E ended, O still open, duration D us, counters [...]

Exit 1 with the reason on the first violation. The file may lack its closing bracket (a
run that was killed), as Perfetto allows.
"""
import json
import sys


def load(path):
    text = open(path).read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def fail(msg):
    print(f"perfetto pairs: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    events = load(sys.argv[1])
    names, open_slices, stats, counters = {}, {}, {}, {}
    for e in events:
        pid = e.get("pid")
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            if pid in names:
                fail(f"pid {pid} named twice: {names[pid]!r} and {e['args']['name']!r}")
            names[pid] = e["args"]["name"]
        elif ph in ("b", "e"):
            if "id" in e or "local" not in e.get("id2", {}):
                fail(f"async event without a process-scoped id (id2.local): {e}")
            key = (pid, e.get("cat"), e.get("name"), e["id2"]["local"])
            s = stats.setdefault(pid, [0, 0, 0.0])
            if ph == "b":
                open_slices.setdefault(key, []).append(e["ts"])
                s[0] += 1
            else:
                if not open_slices.get(key):
                    fail(f"end without a begin on its track: {e}")
                begin = open_slices[key].pop()
                if e["ts"] < begin:
                    fail(f"slice ends before it begins: {e}")
                s[1] += 1
                s[2] += e["ts"] - begin
        elif ph == "C":
            counters.setdefault(pid, set()).update(f"{e['name']} {k}" for k in e["args"])
        if pid is not None and ph != "M" and pid not in names:
            fail(f"event of pid {pid} before its process name")
    for pid in sorted(names):
        b, ended, dur = stats.get(pid, [0, 0, 0.0])
        print(f'pid {pid} "{names[pid]}": {b} slices, {ended} ended, {b - ended} still open, '
              f"duration {dur:.0f} us, counters {sorted(counters.get(pid, []))}")


if __name__ == "__main__":
    main()
