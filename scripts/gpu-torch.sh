#!/usr/bin/env bash
# `cuheap run --torch` on the GPU machine, from the repository root with gpu-bundle/
# (scripts/gpu-bundle.sh) carried along; no pip, no network: the bundle's tool and library, the
# Python package from python/ on PYTHONPATH. The GPT loop (bench/torch_gpt.py, GPU_TORCH_STEPS
# steps, 60) under PyTorch's own caching allocator, then under `cuheap run --torch` with
# recording on. Checks: the losses are the same bits; the trace has every tensor (as many
# allocations through cuheap's PyTorch entry points as PyTorch's allocator counted, and their
# frees); the pluggable figures hold (reserved/live, mapping operations a warm step); a run
# that chose cudaMallocAsync keeps it, with one warning. Writes $OUT/gpu-torch.log and ends
# with "gpu-torch: ok" or what failed. About 2 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
B=$root/gpu-bundle
OUT=${OUT:-$root/out-gpu}
STEPS=${GPU_TORCH_STEPS:-60}
mkdir -p "$OUT"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
log=$OUT/gpu-torch.log
: >"$log"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 PYTHONPATH=$root/python
[ -e "$B/libunwind.so.8" ] && export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say() { echo "$*" | tee -a "$log"; }
failed=0
fail() { say "gpu-torch: FAILED: $*"; failed=1; }

# the loop, then PyTorch's own count of allocations (none under a pluggable allocator)
cat >"$T/gpt.py" <<'PY'
import runpy, sys
sys.argv = ["torch_gpt.py", sys.argv[1]]
runpy.run_path("bench/torch_gpt.py", run_name="__main__")
import torch
try:
    s = torch.cuda.memory_stats()
    print("torch_allocations", s["allocation.all.allocated"], s["allocation.all.freed"])
except RuntimeError:
    print("torch_allocations none")
PY

say "== PyTorch's caching allocator, $STEPS steps"
timeout 300 python3 "$T/gpt.py" "$STEPS" >"$T/native.out" 2>&1
cat "$T/native.out" >>"$log"
say "== cuheap run --torch, recording on"
timeout 300 "$B/cuheap" run --torch -o "$T/torch.jsonl" -- python3 "$T/gpt.py" "$STEPS" \
    >"$T/torch.out" 2>"$T/torch.err"
cat "$T/torch.out" "$T/torch.err" >>"$log"
grep -E '^step_ms' "$T/native.out" "$T/torch.out" | sed 's/^[^:]*\///' | tee -a "$log"
grep '^cuheap: ' "$T/torch.err" | tee -a "$log"

nl=$(grep -c '^losses ' "$T/native.out")
[ "$nl" = 1 ] || fail "the caching allocator's run printed no losses (see the log)"
if [ "$(grep '^losses ' "$T/native.out")" != "$(grep '^losses ' "$T/torch.out")" ]; then
    fail "the losses differ under --torch"
else
    say "losses: the same $(grep '^losses ' "$T/native.out" | wc -w | awk '{print $1 - 1}') values, bit for bit"
fi
grep -q 'cuheap: --torch' "$T/torch.err" && fail "--torch warned: $(grep 'cuheap: --torch' "$T/torch.err")"
read -r _ want_allocs want_frees < <(grep '^torch_allocations ' "$T/native.out")
# PyTorch's caching allocator does not count empty tensors; a pluggable allocator is asked for them
read -r got_allocs got_frees got_other got_empty < <(python3 - "$T/torch.jsonl" <<'PY'
import json, sys
allocs = frees = other = empty = 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("type") != "event" or e.get("event") not in ("alloc", "free"):
        continue
    if e.get("api") == "torch_pluggable":
        allocs += e["event"] == "alloc"
        frees += e["event"] == "free"
        empty += e["event"] == "alloc" and e.get("size") == 0
    elif e["event"] == "alloc":
        other += 1
print(allocs, frees, other, empty)
PY
)
say "tensors: PyTorch's caching allocator made ${want_allocs:-?} allocations (${want_frees:-?} freed);" \
    "the --torch trace has $got_allocs through cuheap's PyTorch entry points ($got_empty empty," \
    "$got_frees freed), $got_other other allocations"
[ -n "${want_allocs:-}" ] && { [ "$got_allocs" = "$want_allocs" ] ||
    [ "$((got_allocs - got_empty))" = "$want_allocs" ]; } ||
    fail "the trace does not have every tensor ($got_allocs of ${want_allocs:-?})"
frag=$(sed -n 's/^step_ms.* frag=\([0-9.]*\).*/\1/p' "$T/torch.out")
ops=$(sed -n 's/.* warm_map_ops_per_step=\([0-9.]*\).*/\1/p' "$T/torch.out")
say "--torch: reserved/live $frag, mapping operations a warm step $ops (issue 31, pluggable: 1.024-1.028, 0.0)"
awk -v f="${frag:-9}" 'BEGIN { exit !(f > 0 && f < 1.10) }' || fail "reserved/live $frag"
awk -v o="${ops:-99}" 'BEGIN { exit !(o < 1) }' || fail "$ops mapping operations a warm step"
"$B/cuheap" report "$T/torch.jsonl" 2>&1 | sed -n '1,12p' >>"$log"

say "== a run that chose cudaMallocAsync keeps it"
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 120 "$B/cuheap" run --torch -o "$T/async.jsonl" -- \
    python3 -c "import torch; x = torch.ones(1 << 20, device='cuda'); print(torch.cuda.get_allocator_backend(), float(x.sum()))" \
    >"$T/async.out" 2>"$T/async.err"
cat "$T/async.out" "$T/async.err" >>"$log"
[ "$(cat "$T/async.out")" = "cudaMallocAsync 1048576.0" ] || fail "cudaMallocAsync run: $(cat "$T/async.out")"
[ "$(grep -c 'cuheap: --torch: ' "$T/async.err")" = 1 ] || fail "not one warning for cudaMallocAsync"

((failed)) && exit 1
say "gpu-torch: ok"
