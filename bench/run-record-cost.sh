#!/usr/bin/env bash
# What recording costs the allocating thread, on the simulated driver (no GPU): bench-record
# cost under each setting, side by side in one run, best of 3 rounds taken in turn (each round
# runs every setting once, so that the machine's load falls on all of them alike).
#   bench/run-record-cost.sh [BUILD_DIR]
# Settings: recording off (CUHEAP_RECORD=0); events only (CUHEAP_STACK_DEPTH=0); native stacks
# at the default depth; and from 12 Python frames, off and with native + Python frames (the
# default depth of a Python process). Stacks: 24 calls deep, one call path (repeated), eight
# in turn (varied) or 64 in turn (many: more than a thread's stack cache keeps, so mostly
# walked). Prints ns an event and what recording adds to the same run's "off".
# BASE_LIB=path/libcuheap.so adds the same settings (base-*) under another build, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
pre=$PWD/$b/src/libcuheap.so
export LD_LIBRARY_PATH=$PWD/$b/tests/fakecuda CUHEAP_SUMMARY=0 CUHEAP_OUTPUT=/dev/null BENCH_ROUNDS=1
libpython=$(python3 -c 'import os, sysconfig as s; print(os.path.join(s.get_config_var("LIBDIR"), s.get_config_var("LDLIBRARY")))' 2>/dev/null || true)
configs=("off CUHEAP_RECORD=0" "events CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0" "native CUHEAP_PYTHON=0")
[ -n "${BASE_LIB:-}" ] && configs+=("base-events CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0" "base-native CUHEAP_PYTHON=0")
if [ -n "$libpython" ] && [ -e "$libpython" ]; then
    configs+=("py-off CUHEAP_RECORD=0" "native+python CUHEAP_PYTHON=1")
    [ -n "${BASE_LIB:-}" ] && configs+=("base-native+python CUHEAP_PYTHON=1")
else
    echo "# no libpython found: the Python rows are left out"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in 1 2 3; do
    for stack in repeated varied many; do
        for cfg in "${configs[@]}"; do
            set -- $cfg
            label=$1
            shift
            py=()
            case $label in py-* | *python*) py=(python) ;; esac
            lib=$pre
            case $label in base-*) lib=$BASE_LIB ;; esac
            env "$@" BENCH_LABEL=$label BENCH_LIBPYTHON="$libpython" LD_PRELOAD=$lib \
                nice -n 10 "$b/bench/bench-record" cost $stack "${py[@]}" >>"$out"
        done
    done
done
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u '+%Y-%m-%d %H:%M UTC')"
python3 - "$out" <<'PY'
import re, sys
# best of the rounds that dropped nothing (a dropped event costs its thread less than a written
# one: such a round is not the cost); "*" where every round dropped some
best, clean = {}, {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split())
    key = (f["config"], f["stack"])
    ns, ok = float(f["ns_per_event"]), int(f["dropped"]) == 0
    if key not in best or (ok and not clean[key]) or (ok == clean[key] and ns < best[key]):
        best[key], clean[key] = ns, ok
print("%-20s %-9s %10s %10s" % ("setting", "stack", "ns/event", "added"))
for (cfg, stack), ns in sorted(best.items(), key=lambda kv: (kv[0][1], list(best).index(kv[0]))):
    base = best.get(("py-off" if "python" in cfg or cfg == "py-off" else "off", stack), ns)
    print("%-20s %-9s %10.1f %10.1f%s" % (cfg, stack, ns, ns - base,
                                          "" if clean[(cfg, stack)] else " *dropped"))
PY
