#!/usr/bin/env bash
# Issue 57's GPU row, on the GPU machine from the repository root with gpu-bundle/
# (scripts/gpu-bundle.sh) carried along: the GPT loop (bench/torch_gpt.py, PyTorch's caching
# off) with recording paused and resumed every 5 steps in one process (GPT_TOGGLE=5),
# GPU_RECORD_STEPS steps (125; at least 60), 3 rounds, through `scripts/gpu-run.sh toggle`:
# full recording (native + Python frames, the defaults) and events only, and caching on. Then
# the verdict: recording on over off at most 1.02 for the full recording in every round, and
# the losses identical to a run without cuheap. Writes $OUT/summary.txt (gpu-run.sh) and ends
# with "gpu-record: ok" or what missed. About 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out-gpu}
mkdir -p "$OUT"
steps=${GPU_RECORD_STEPS:-125}
[ "$steps" -ge 60 ] || { echo "gpu-record: GPU_RECORD_STEPS=$steps: at least 60"; exit 2; }
TOGGLE_STEPS=$steps TOGGLE_RUNS=3 TOGGLE_EVERY=5 OUT=$OUT bash scripts/gpu-run.sh toggle
python3 - "$OUT/summary.txt" <<'PY'
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("toggle run=")]
full = [l for l in rows if "config=nocache-full" in l]
bad = []
for l in full:
    m = re.search(r"on_over_off=([0-9.]+)", l)
    if not m or float(m.group(1)) > 1.02:
        bad.append("on/off " + (m.group(1) if m else "missing") + ": " + l.strip())
for l in rows:
    if "losses=identical" not in l:
        bad.append("losses differ: " + l.strip())
if len(full) < 3:
    bad.append("%d rounds of full recording, 3 asked for" % len(full))
ratios = [re.search(r"on_over_off=([0-9.]+)", l).group(1) for l in full if "on_over_off=" in l]
print("gpu-record: full recording on/off per round: " + ", ".join(ratios))
print("gpu-record: " + ("ok" if not bad else "missed:\n  " + "\n  ".join(bad)))
sys.exit(1 if bad else 0)
PY
