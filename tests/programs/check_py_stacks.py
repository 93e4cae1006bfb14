# SPDX-License-Identifier: MIT
"""Compare every Python frame cuheap recorded with what the interpreter saw.

usage: check_py_stacks.py TRACE.jsonl EXPECTED.jsonl

EXPECTED comes from py_alloc.py with PY_ALLOC_STACKS set: for each allocation its pointer and
its stack (file, line, function name; innermost first). The k-th expectation for a pointer is
matched with the k-th allocation event at that pointer in the trace. Every frame must agree in
file and line, and the recorded function must name the frame's function (cuheap records the
qualified name where the interpreter has one: "Model.forward" for "forward"). Prints one line
per mismatch and exits 1 if there was any, else prints how many frames it checked.
"""
import collections
import json
import sys


def main():
    trace_path, expected_path = sys.argv[1:3]
    stacks, allocs = {}, collections.defaultdict(list)
    with open(trace_path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "stack":
                stacks[rec["id"]] = rec.get("python", [])
            elif rec.get("type") == "event" and rec.get("event") == "alloc":
                allocs[int(rec["ptr"], 16)].append(rec.get("stack"))
    seen = collections.Counter()
    errors, frames, checked = [], 0, 0
    with open(expected_path) as f:
        for line in f:
            want = json.loads(line)
            ptr = want["ptr"]
            k = seen[ptr]
            seen[ptr] += 1
            if k >= len(allocs[ptr]):
                errors.append(f"allocation {ptr:#x} (#{k}) is not in the trace")
                continue
            got = stacks.get(allocs[ptr][k], [])
            expected = [fr for fr in want["stack"]]
            if len(got) != len(expected):
                errors.append(f"allocation {ptr:#x}: {len(got)} Python frames, expected "
                              f"{len(expected)}: {got}")
                continue
            for depth, (g, (file, lineno, name)) in enumerate(zip(got, expected)):
                frames += 1
                if g.get("file") != file or g.get("line") != lineno or not (
                        g.get("function") == name or g.get("function", "").endswith("." + name)):
                    errors.append(f"allocation {ptr:#x} frame {depth}: recorded {g}, "
                                  f"interpreter {file}:{lineno} in {name}")
            checked += 1
    for e in errors[:20]:
        print(e)
    if errors or not checked:
        print(f"check_py_stacks: {len(errors)} mismatches, {checked} allocations checked")
        return 1
    print(f"check_py_stacks: ok, {checked} allocations, {frames} frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
