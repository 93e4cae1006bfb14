#!/usr/bin/env bash
# CPU benchmarks (no GPU): the pool on the simulated device, wall clock and instruction counts
# from valgrind's callgrind (stable on a noisy machine), and the ring and stack capture.
#   bench/run-cpu.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
pre=$PWD/$b/src/libcuheap.so
export LD_LIBRARY_PATH=$PWD/$b/tests/fakecuda CUHEAP_SUMMARY=0 CUHEAP_OUTPUT=/dev/null
echo "## pool pairs on the simulated device (ns, this CPU)"
for cfg in "raw" "norecord CUHEAP_RECORD=0" "immediate CUHEAP_RECORD=0 CUHEAP_REUSE=immediate" \
           "events CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0" "stacks30 CUHEAP_STACK_DEPTH=30 BENCH_DEPTH=30"; do
    set -- $cfg
    label=$1
    shift
    if [ "$label" = raw ]; then
        env BENCH_LABEL=raw "$b/bench/bench-alloc" sync 512 1048576 2097152
    else
        env "$@" LD_PRELOAD=$pre BENCH_LABEL=$label "$b/bench/bench-alloc" sync 512 1048576 2097152
    fi
done
# Instructions per pair from callgrind: the difference of two runs leaves out start-up
# (8 timed repetitions of n pairs each). Printed whole, and split: the simulated driver's calls
# (inclusive; a real driver's cuCtxGetCurrent is not this test double's, with its fault
# injection), the benchmark's own loop, and what is left, cuheap's. Arguments: size, then settings.
per_pair() {
    local size=$1 n
    shift
    for n in 4000 8000; do
        env "$@" LD_PRELOAD=$pre BENCH_PAIRS=$n valgrind --tool=callgrind \
            --callgrind-out-file=/tmp/cuheap-cg.$n "$b/bench/bench-alloc" sync "$size" >/dev/null 2>&1
    done
    local f=/tmp/cuheap-cg.4000 g=/tmp/cuheap-cg.8000
    total() { grep -m1 '^summary:' "$1" | awk '{print $2}'; }
    driver() {
        callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
            grep -E 'fakecuda.c:cu[A-Z][A-Za-z_0-9]* \[' | awk '{gsub(",", "", $1); s += $1} END {print s + 0}'
    }
    loop() {
        callgrind_annotate --threshold=100 "$1" 2>/dev/null |
            grep -E 'bench-alloc.c:.*\[' | awk '{gsub(",", "", $1); s += $1} END {print s + 0}'
    }
    local t=$(($(total $g) - $(total $f))) d=$(($(driver $g) - $(driver $f))) l=$(($(loop $g) - $(loop $f)))
    rm -f "$f" "$g"
    echo "instructions_per_pair=$((t / 32000)) simulated_driver=$((d / 32000)) benchmark_loop=$((l / 32000)) cuheap=$(((t - d - l) / 32000))"
}
echo "## instructions per pair (callgrind, recording off)"
echo "case=immediate-512 $(per_pair 512 CUHEAP_RECORD=0 CUHEAP_REUSE=immediate)"
for size in 512 2097152 20971520; do
    echo "case=default-$size $(per_pair $size CUHEAP_RECORD=0)"
done
echo "## threads at once against one (recording off; ratio 1.0 = perfect scaling; $(nproc) cores here)"
for n in 2 16; do
    env LD_PRELOAD=$pre CUHEAP_RECORD=0 BENCH_LABEL=norecord "$b/bench/bench-alloc" threads $n 512 2097152
done
echo "## ring and stacks"
"$b/bench/bench-ring"
echo "## recording, part by part (bench-record parts: full walk and shortcut side by side)"
"$b/bench/bench-record" parts
echo "## the recorder whole: threads, events a second asked for, seconds"
for args in "1 70000 3" "16 70000 3" "16 200000 3" "16 400000 3" "16 0 3"; do
    "$b/bench/bench-record" record $args
done
echo "## Python frames through the simulated driver (py_alloc.py 200), shortcuts on and off"
for cache in 1 0 1 0; do
    rm -f /tmp/cuheap-py-bench.jsonl*
    env LD_PRELOAD=$pre CUHEAP_STACK_CACHE=$cache CUHEAP_RECORD_TIMING=1 CUHEAP_SUMMARY=1 \
        CUHEAP_OUTPUT=/tmp/cuheap-py-bench.jsonl python3 tests/programs/py_alloc.py 200 2>&1 |
        sed -n "s/^cuheap: recording cost (CUHEAP_RECORD_TIMING): /CUHEAP_STACK_CACHE=$cache /p"
done
rm -f /tmp/cuheap-py-bench.jsonl*
