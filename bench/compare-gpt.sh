#!/usr/bin/env bash
# The GPT loop (bench/torch_gpt.py) under several builds of the shim side by side, in
# interleaved rounds, to tell a change's cost from the host's noise. Runs on the GPU machine.
#   bench/compare-gpt.sh OUT "label=path/libcuheap.so[,VAR=value...] ..." [extra-env...]
# (a build may come with settings of its own: "small=gpu-bundle/libcuheap.so,CUHEAP_VMM_CUSHION=2M")
# Each round runs PyTorch's caching allocator alone and every build with caching off,
# recording off and on (native + Python stacks, the defaults; FULL=0 leaves recording out;
# MODES picks from "norecord events full", events being recording without stacks).
# ROUNDS (default 3) and STEPS (default 30) size the run. Lines go to OUT/compare.log:
# "round=R config=LABEL step_ms=... peak_live=... peak_reserved=..." and the shim's summary
# lines for the recording-off runs.
set -u
OUT=$1
LIBS=$2
shift 2
LOG=$OUT/compare.log
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
T=$(mktemp -d)
run() { # round label env...
    local round=$1 label=$2
    shift 2
    local out
    out=$(env "$@" CUHEAP_OUTPUT="$T/%p.jsonl" timeout 300 python3 bench/torch_gpt.py "$STEPS" 2>&1)
    echo "round=$round config=$label $(grep -m1 '^step_ms' <<<"$out")" >>"$LOG"
    grep '^cuheap: GPU' <<<"$out" | sed "s/^/round=$round config=$label /" >>"$LOG"
    grep -m1 '^losses' <<<"$out" | md5sum | sed "s/^/round=$round config=$label losses_md5=/" >>"$LOG"
    rm -f "$T"/*.jsonl*
}
MODES=${MODES:-norecord full}
[ "${FULL:-1}" = 0 ] && MODES=norecord
EXTRA=("$@")
# One round is every job once; each round starts one job later than the one before, so that no
# configuration always runs first (after the host has been idle) or last.
jobs=(caching)
for mode in $MODES; do
    for lib in $LIBS; do
        jobs+=("$mode $lib")
    done
done
for ((r = 0; r < ROUNDS; r++)); do
    for ((k = 0; k < ${#jobs[@]}; k++)); do
        job=${jobs[(k + r) % ${#jobs[@]}]}
        if [ "$job" = caching ]; then
            run "$r" caching "${EXTRA[@]}"
            continue
        fi
        mode=${job%% *} lib=${job#* }
        case $mode in
        norecord) set -- CUHEAP_RECORD=0 CUHEAP_SUMMARY=1 CUHEAP_VERBOSE=1 ;;
        events) set -- CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 CUHEAP_SUMMARY=0 ;;
        *) set -- CUHEAP_SUMMARY=0 ;;
        esac
        spec=${lib#*=}
        IFS=, read -r -a settings <<<"${spec#*,}"
        [ "$spec" = "${spec#*,}" ] && settings=()
        run "$r" "${lib%%=*}-$mode" "${EXTRA[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
            LD_PRELOAD="${spec%%,*}" "$@" "${settings[@]}"
    done
done
rm -rf "$T"
grep 'step_ms' "$LOG"
