#!/usr/bin/env bash
# The GPU benchmarks in one go (called by scripts/gpu-run.sh bench): the allocation
# microbenchmark under every configuration, then the PyTorch GPT loop under every allocator.
# Raw lines go to $OUT/bench.log; bench/summarize.py turns them into the tables of RESULTS.md.
#   run-gpu.sh BUNDLE OUT TRACEDIR
set -u
B=$1
OUT=$2
T=$3
PRE=$B/libcuheap.so
LOG=$OUT/bench.log
SIZES="512 1048576 2097152 20971520 268435456"
replay=$(ls "$T"/torch-nocache-pool1-*.jsonl 2>/dev/null | head -1)
PARTS=${BENCH_PARTS:-micro gpt}
REPEAT=${GPT_REPEAT:-1}
echo "== $(date -u +%FT%TZ) bench-alloc (median ns per alloc+free pair)" >>"$LOG"
micro() { # label, env..., -- args
    local label=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" BENCH_LABEL=$label CUHEAP_SUMMARY=0 CUHEAP_OUTPUT=/dev/null \
        timeout 240 "$B/bench-alloc" "$@" >>"$LOG" 2>&1
}
for mode in sync mix-sync; do
    [[ " $PARTS " == *" micro "* ]] || break
    args=($mode)
    [ $mode = sync ] && args+=($SIZES)
    micro cudaMalloc -- "${args[@]}"
    micro cuheap-norecord LD_PRELOAD=$PRE CUHEAP_RECORD=0 -- "${args[@]}"
    micro cuheap-events LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 -- "${args[@]}"
    micro cuheap-stacks30 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=30 BENCH_DEPTH=30 CUHEAP_RING=65536 -- "${args[@]}"
    micro cuheap-sync LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_REUSE=sync -- "${args[@]}"
    micro cuheap-immediate LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_REUSE=immediate -- "${args[@]}"
    micro cuheap-vmm LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=vmm -- "${args[@]}"
done
if [[ " $PARTS " == *" micro "* ]]; then
micro cudaMallocAsync -- async $SIZES
micro cudaMallocAsync -- mix-async
fi
if [ -n "$replay" ] && [[ " $PARTS " == *" micro "* ]]; then
    micro cudaMalloc -- replay-sync "$replay"
    micro cudaMallocAsync -- replay-async "$replay"
    micro cuheap-norecord LD_PRELOAD=$PRE CUHEAP_RECORD=0 -- replay-sync "$replay"
    micro cuheap-stacks30 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=30 BENCH_DEPTH=30 CUHEAP_RING=65536 -- replay-sync "$replay"
    micro cuheap-immediate LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_REUSE=immediate -- replay-sync "$replay"
fi
# issue 14, the hot path: pairs at 512 B, 2 MiB and 20 MiB under cuheap's default (vmm, thread
# caches), without thread caches and on legacy arenas, next to cudaMallocAsync's warm pool, in
# HOT_ROUNDS interleaved rounds (the host is shared: compare within a round); then 16 threads
# against one.
if [[ " $PARTS " == *" hot "* ]]; then
    HOT_SIZES="512 2097152 20971520"
    for ((round = 0; round < ${HOT_ROUNDS:-3}; round++)); do
        echo "hot_round=$round" >>"$LOG"
        micro cudaMallocAsync -- async $HOT_SIZES
        micro cuheap-default LD_PRELOAD=$PRE CUHEAP_RECORD=0 -- sync $HOT_SIZES
        micro cuheap-notc LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_THREAD_CACHE=0 -- sync $HOT_SIZES
        micro cuheap-legacy LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=legacy -- sync $HOT_SIZES
        micro cuheap-events LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 -- sync $HOT_SIZES
    done
    micro cudaMalloc -- sync $HOT_SIZES
    micro cuheap-default LD_PRELOAD=$PRE CUHEAP_RECORD=0 -- threads 16 512 2097152
    micro cuheap-notc LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_THREAD_CACHE=0 -- threads 16 512 2097152
    micro cuheap-legacy LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=legacy -- threads 16 512 2097152
fi
echo "== $(date -u +%FT%TZ) torch_gpt" >>"$LOG"
gpt() { # label, env...
    local label=$1
    shift
    [[ " $PARTS " == *" gpt "* ]] || return 0
    [ -n "${GPT_CONFIGS:-}" ] && [[ " $GPT_CONFIGS " != *" $label "* ]] && return 0
    for ((i = 0; i < REPEAT; i++)); do
        echo "config=$label" >>"$LOG"
        env CUHEAP_SUMMARY=0 "$@" CUHEAP_OUTPUT="$T/gpt-$label-%p.jsonl" timeout 300 python3 bench/torch_gpt.py 30 >>"$LOG" 2>&1
    done
}
for ((round = 0; round < ${GPT_ROUNDS:-1}; round++)); do
gpt caching
gpt caching+cuheap-record LD_PRELOAD=$PRE CUHEAP_POOL=0
gpt nocache-raw PYTORCH_NO_CUDA_MEMORY_CACHING=1
gpt nocache+cuheap-fence PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE
gpt nocache+cuheap-fence-depth32 PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=32
gpt nocache+cuheap-fence-nostacks PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0
gpt nocache+cuheap-fence-norecord PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD=0
gpt nocache+cuheap-sync PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_REUSE=sync
gpt nocache+cuheap-immediate PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_REUSE=immediate
gpt pluggable CUHEAP_PLUGGABLE=$PRE
gpt cudaMallocAsync PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
gpt nocache+cuheap-fence-arena64M PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_ARENA_SIZE=64M CUHEAP_RECORD=0
# pool v2 (CUHEAP_BACKING=vmm): the summary's vmm line (granules taken, moved, fence waits) goes
# to the log
gpt caching+cuheap-pool LD_PRELOAD=$PRE CUHEAP_RECORD=0
gpt caching+cuheap-vmm LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=vmm CUHEAP_SUMMARY=1
gpt nocache+cuheap-vmm-norecord PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=vmm CUHEAP_SUMMARY=1
gpt nocache+cuheap-vmm2M-norecord PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=vmm CUHEAP_VMM_CHUNK=2M CUHEAP_SUMMARY=1
gpt nocache+cuheap-vmm64M-norecord PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_BACKING=vmm CUHEAP_VMM_CHUNK=64M CUHEAP_SUMMARY=1
gpt nocache+cuheap-vmm PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_BACKING=vmm CUHEAP_SUMMARY=1
gpt pluggable-vmm CUHEAP_PLUGGABLE=$PRE CUHEAP_BACKING=vmm CUHEAP_SUMMARY=1
# issue 14, recording's cost (caching off, legacy pool): none, events without stacks, native
# only (12 frames, the Python default), native + Python (the default); the same with the
# per-thread shortcuts off; and two runs that print where an event's time goes (summary lines
# "recording cost" in bench.log). GPT_ROUNDS interleaves them so noise can be judged.
gpt rec-none PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD=0
gpt rec-events PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0
gpt rec-native PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_DEPTH=12 CUHEAP_PYTHON=0
gpt rec-full PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE
gpt rec-full-nocache PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_CACHE=0
gpt rec-full-timing PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD_TIMING=1 CUHEAP_SUMMARY=1
gpt rec-nocache-timing PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_STACK_CACHE=0 CUHEAP_RECORD_TIMING=1 CUHEAP_SUMMARY=1
done
python3 bench/summarize.py "$LOG" | tee "$OUT/bench-summary.md" | tee -a "$OUT/summary.txt"
