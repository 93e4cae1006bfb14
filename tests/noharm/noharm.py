#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""No default that harms: every pool setting that is on by default (defaults.txt beside this
file) must, on every row of the short corpus (rows.txt), hold at most 1% more memory and make at
most 1% more mapping operations in the warm pass than the same replay with that setting off.
Each row is replayed by bench-replay (two passes, no simulated kernels, so that a run repeats
exactly) with libcuheap.so preloaded on the simulated driver, once under the defaults and once
per setting turned off. Prints TAP, one line a setting and row; a loss listed as known in
defaults.txt is a skip, and a known loss that no longer loses fails (the list must shrink).

  noharm.py --replay bench-replay --lib libcuheap.so --fakecuda DIR --sequences DIR
            [--defaults FILE] [--rows FILE] [--only SETTING,...] [--verbose]"""
import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELD_SLACK = 1.01  # 1% of held memory
OPS_SLACK = 1.01   # 1% of mapping operations


def table(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                rows.append(line)
    return rows


def replay(args, env, trace, steps, of):
    cmd = [args.replay, "--passes", "2", "--work-us", "0", "--steps", str(of)]
    if steps:
        cmd += ["--max-steps", str(steps)]
    # niced: the figures do not depend on timing, the tests beside it (a writer keeping up
    # with marks, a soak's resident memory) may
    out = subprocess.run(cmd + [trace], env=env, capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: os.nice(10))
    if out.returncode:
        raise RuntimeError("bench-replay %s: exit %d: %s" % (
            os.path.basename(trace), out.returncode, out.stderr.strip()[-300:]))
    last = out.stdout.strip().splitlines()[-1]
    held = int(re.search(r" peak_held=(\d+)", last).group(1))
    live = int(re.search(r" peak_live=(\d+)", last).group(1))
    warm = re.search(r"^pass=2 .* map_ops=(\d+)", out.stdout, re.M)
    if not warm:
        raise RuntimeError("bench-replay printed no warm pass under cuheap: " + out.stdout[-300:])
    return held, live, int(warm.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--fakecuda", required=True)
    ap.add_argument("--sequences", required=True)
    ap.add_argument("--defaults", default=os.path.join(HERE, "defaults.txt"))
    ap.add_argument("--rows", default=os.path.join(HERE, "rows.txt"))
    ap.add_argument("--only", default="")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    settings = []  # (name, off, known rows)
    for line in table(args.defaults):
        if len(line) < 2:
            sys.exit("noharm: %s: a line needs a setting and its off value: %s" % (
                args.defaults, " ".join(line)))
        if not args.only or line[0] in args.only.split(","):
            settings.append((line[0], line[1], set(line[2:])))
    rows = []
    for line in table(args.rows):
        rows.append((line[0], int(line[1]) if len(line) > 1 else 0,
                     int(line[2]) if len(line) > 2 else 30))

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUHEAP_")}
    env.update({"LD_LIBRARY_PATH": args.fakecuda, "FAKECUDA_DEVICE_MEM": "32G",
                "CUHEAP_RECORD": "0", "CUHEAP_SUMMARY": "0"})
    tmp = tempfile.mkdtemp(prefix="cuheap-noharm-")
    print("1..%d" % (len(settings) * len(rows)))
    n, failed = 0, 0
    try:
        for name, steps, of in rows:
            path = os.path.join(args.sequences, name + ".jsonl.gz")
            if not os.path.exists(path):  # named before its recording landed
                for setting in [s[0] for s in settings]:
                    n += 1
                    print("ok %d - %s on %s # SKIP %s not recorded" % (n, setting, name, path))
                continue
            t0 = time.monotonic()
            trace = os.path.join(tmp, name + ".jsonl")
            with gzip.open(path, "rb") as src, open(trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
            base = replay(args, dict(env, LD_PRELOAD=args.lib), trace, steps, of)
            if args.verbose:
                print("# %s defaults: held %d live %d warm ops %d" % ((name,) + base))
            for setting, off, known in settings:
                n += 1
                alt = replay(args, dict(env, LD_PRELOAD=args.lib, **{setting: off}), trace,
                             steps, of)
                held_loss = base[0] > alt[0] * HELD_SLACK
                ops_loss = base[2] > alt[2] * OPS_SLACK
                what = "%s on %s: held %.3f of live (off %.3f, %+.1f%%), warm mapping ops %d " \
                    "(off %d)" % (setting, name, base[0] / base[1], alt[0] / alt[1],
                                  100.0 * (base[0] - alt[0]) / alt[0], base[2], alt[2])
                if held_loss or ops_loss:
                    why = " and ".join(w for w, x in (("holds more", held_loss),
                                                      ("maps more", ops_loss)) if x)
                    if name in known:
                        print("ok %d - %s # SKIP known loss (%s): the default %s" % (
                            n, what, os.path.basename(args.defaults), why))
                    else:
                        failed += 1
                        print("not ok %d - %s: the default %s than %s=%s" % (
                            n, what, why, setting, off))
                elif name in known:
                    failed += 1
                    print("not ok %d - %s: listed as a known loss but no longer loses: take %s "
                          "off its line in %s" % (n, what, name, args.defaults))
                else:
                    print("ok %d - %s" % (n, what))
                sys.stdout.flush()
            os.unlink(trace)
            print("# %s: %.1f s" % (name, time.monotonic() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
