#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check cuheap traces against docs/trace.schema.json, and the rules a schema cannot say:
the header comes first, stacks come before the events that use them, seq never repeats.
A cut-off last line (a killed run) is allowed. Usage: validate-trace.py TRACE..."""
import json
import os
import sys

import jsonschema

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "trace.schema.json")


def check(path, validator):
    stacks, seqs = set(), set()
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if not lines:
        return f"{path}: empty"
    for n, line in enumerate(lines, 1):
        if not line.endswith("\n") and n == len(lines):
            break  # cut off by SIGKILL
        rec = json.loads(line)
        err = next(iter(validator.iter_errors(rec)), None)
        if err is not None:
            return f"{path}:{n}: {err.message}"
        if (n == 1) != (rec["type"] == "header"):
            return f"{path}:{n}: the header must be the first line and only there"
        if rec["type"] == "stack":
            stacks.add(rec["id"])
        if rec["type"] == "event":
            if rec.get("stack") and rec["stack"] not in stacks:
                return f"{path}:{n}: event refers to stack {rec['stack']} before it is defined"
            if rec["seq"] in seqs:
                return f"{path}:{n}: seq {rec['seq']} repeats"
            seqs.add(rec["seq"])
    return None


def main():
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.Draft202012Validator(schema)
    bad = 0
    for path in sys.argv[1:]:
        problem = check(path, validator)
        if problem:
            print(problem, file=sys.stderr)
            bad += 1
        else:
            print(f"{path}: valid")
    return 1 if bad or len(sys.argv) < 2 else 0


if __name__ == "__main__":
    sys.exit(main())
