#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""cuheap's own instructions in a callgrind profile: the instructions collected (run with
--toggle-collect on cuheap's entry points, so only what runs inside them counts) less those of
every call from outside the simulated driver into it (its functions' inclusive cost: the test
double's own work, which a real driver's is not). Prints "own=N total=N driver=N".

  callgrind-own.py CALLGRIND_OUT [DRIVER_OBJECT_SUBSTRING (default libcuda.so)]

Reads the callgrind format (valgrind's docs, "Callgrind Format Specification"): name
compression "(id) name", ob/fl/fn for the current function, cob/cfi/cfn/calls for a call whose
cost line follows it; a call's object is its cob= when given, else the caller's."""
import re
import sys


def main():
    path = sys.argv[1]
    driver = sys.argv[2] if len(sys.argv) > 2 else "libcuda.so"
    names = {"ob": {}, "fn": {}}
    total = None
    cur_ob = ""
    call_ob = None  # a cob= seen for the call being read
    in_call = False
    from_driver = False
    driver_cost = 0

    def name(kind, text):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", text)
        if not m:
            return text
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "")

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("ob="):
                cur_ob = name("ob", line[3:])
            elif line.startswith("fn="):
                name("fn", line[3:])
                from_driver = driver in cur_ob
            elif line.startswith("cob="):
                call_ob = name("ob", line[4:])
            elif line.startswith("cfn="):
                name("fn", line[4:])
            elif line.startswith("calls="):
                in_call = True
            elif line.startswith(("totals:", "summary:")):
                total = int(line.split()[1])
            elif line[0].isdigit() or line[0] in "+-*":
                if in_call:
                    callee = call_ob if call_ob is not None else cur_ob
                    if driver in callee and not from_driver:
                        driver_cost += int(line.split()[1])
                    in_call, call_ob = False, None
            # fl=, fi=, fe=, cfi=, jump lines and the header need nothing here
    if total is None:
        sys.exit("callgrind-own: no totals in " + path)
    print("own=%d total=%d driver=%d" % (total - driver_cost, total, driver_cost))


if __name__ == "__main__":
    main()
