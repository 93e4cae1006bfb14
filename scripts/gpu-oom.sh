#!/usr/bin/env bash
# Out-of-memory told right, on the GPU (docs/live.md), from the repository root with gpu-bundle/
# (scripts/gpu-bundle.sh) carried along; no pip, no network. Under `cuheap run` (pool on):
#  1. PyTorch's caching allocator fills its cache (tensors made and deleted), then asks for a
#     block larger than any cached segment: the driver refuses, PyTorch frees its cache and asks
#     again, and gets it. Wanted: no out-of-memory block, one "recovered" line, and
#     `cuheap report` saying "recovered ... not out of memory".
#  2. A real out-of-memory (more than the GPU has), caching on and then off
#     (PYTORCH_NO_CUDA_MEMORY_CACHING=1): the block, naming the script's line that asked, and
#     with caching on the line saying live bytes are PyTorch's segments.
#  3. `cuheap run --live` on a pipe while case 1 runs: at least two tables, the last "ended".
# Writes $OUT/gpu-oom.log and ends with "gpu-oom: ok" or what failed. About a minute.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
B=$root/gpu-bundle
OUT=${OUT:-$root/out-gpu}
mkdir -p "$OUT"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
log=$OUT/gpu-oom.log
: >"$log"
export PYTHONUNBUFFERED=1
[ -e "$B/libunwind.so.8" ] && export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say() { echo "$*" | tee -a "$log"; }
failed=0
fail() { say "gpu-oom: FAILED: $*"; failed=1; }

cat >"$T/refill.py" <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
chunk = 512 << 20
held = [torch.empty(chunk, dtype=torch.uint8, device="cuda") for _ in range(int(free * 0.8) // chunk)]
del held                      # all of it stays in PyTorch's cache
big = torch.empty(int(free * 0.5), dtype=torch.uint8, device="cuda")  # no cached segment fits
print("refill: got", big.numel() >> 20, "MiB; reserved", torch.cuda.memory_reserved() >> 20, "MiB")
PY
cat >"$T/real.py" <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
keep = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")
try:
    too_much = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")  # LINE-OOM
except (torch.cuda.OutOfMemoryError, torch.AcceleratorError):  # caching off: cudaMalloc error
    print("real: out of memory, as wanted")
    raise SystemExit(3)
PY
line=$(grep -n 'LINE-OOM' "$T/real.py" | cut -d: -f1)

say "== 1. cache refill (caching on)"
"$B/cuheap" run -o "$T/refill.jsonl" -- python3 "$T/refill.py" >"$T/1.out" 2>"$T/1.err"
cat "$T/1.out" "$T/1.err" >>"$log"
grep -q "call sites holding the most" "$T/1.err" && fail "a block for an out-of-memory PyTorch recovered from"
grep -q "recovered after the program released" "$T/1.err" || say "note: no out-of-memory at all (the cache refill did not need one)"
"$B/cuheap" report "$T/refill.jsonl" >"$T/1.report" 2>&1
grep -q "OUT OF MEMORY" "$T/1.report" && fail "report counts the recovered one as out of memory"
grep -E "recovered|OUT OF" "$T/1.report" | tee -a "$log"

for caching in on off; do
    say "== 2. real out-of-memory, caching $caching"
    env_c=()
    [ $caching = off ] && env_c=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    env "${env_c[@]}" "$B/cuheap" run -o "$T/real-$caching.jsonl" -- python3 "$T/real.py" \
        >"$T/2.out" 2>"$T/2.err"
    rc=$?
    cat "$T/2.out" "$T/2.err" >>"$log"
    [ $rc = 3 ] || fail "caching $caching: exit $rc, not the script's 3"
    grep -q "call sites holding the most" "$T/2.err" || fail "caching $caching: no block"
    grep -q "asked for at .*real.py:$line in" "$T/2.err" || fail "caching $caching: the block does not name real.py:$line"
    if [ $caching = on ]; then
        grep -q "caching allocator" "$T/2.err" || fail "caching on: the block does not say live bytes are PyTorch's segments"
    fi
done

say "== 3. run --live on a pipe"
CUHEAP_LIVE_INTERVAL=0.5 "$B/cuheap" run --live -o "$T/live-%p.jsonl" -- python3 "$T/refill.py" \
    >"$T/3.out" 2>"$T/3.err"
cat "$T/3.out" >>"$log"
[ "$(grep -c '^RANK' "$T/3.out")" -ge 2 ] || fail "run --live printed fewer than two tables"
grep -q "(ended)" "$T/3.out" || fail "run --live: the trace never showed as ended"

[ $failed = 0 ] && say "gpu-oom: ok"
exit $failed
