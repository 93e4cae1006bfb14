#!/usr/bin/env bash
# Held / live bytes for the recorded GPT job's allocation sequences (bench/sequences), replayed
# through the simulated driver: the driver alone, then cuheap under each reuse policy and each
# backing. Fence timing varies, so each cuheap configuration runs RUNS times (default 3) and
# the worst ratio is kept. Each vmm configuration also replays the steps three times over
# (--passes 3) and prints the mapping operations per warm step (chunks taken + moved + given
# back in passes 2-3, over their steps: issue 31's goal is at most 1) and held/live over those
# passes, worst and best of RUNS, then the same settled: past each pass's first 8 steps, where
# the pass re-makes the first step's state (bench-replay --settle). pluggable-fence replays
# through the pluggable allocator's entry points (bench-replay --pluggable 1: frees on the
# replay's stream). Each recorded thread (the GPT job's autograd
# thread frees what the main thread allocated) replays on a thread of its own, in the recorded
# order; THREADS=1 replays every event on one thread, as the figures before that did. The
# whole corpus, side by side for two libraries: bench/run-corpus.sh. Run from the repository
# root after a build:
#   bash bench/run-replay.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
RUNS=${RUNS:-3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LD_LIBRARY_PATH=$B/tests/fakecuda FAKECUDA_DEVICE_MEM=${FAKECUDA_DEVICE_MEM:-16G}
printf '%-10s %-28s %8s %8s %8s %-20s %s\n' sequence configuration worst best runs \
    "mapping calls (vmm)" "mapping ops per warm step, held/live (passes 2-3)"
for seq in bench/sequences/gpt-seq-*.jsonl.gz; do
    name=$(basename "$seq" .jsonl.gz)
    gunzip -c "$seq" >"$T/$name.jsonl"
    steps=(--steps 30)
    case $name in gpt-seq-eval | gpt-seq-varlen) steps=(--steps 60) ;; esac # recorded over 60 steps
    [ "${THREADS:-}" = 1 ] && steps+=(--threads 1)
    r=$("$B/bench/bench-replay" "${steps[@]}" "$T/$name.jsonl" | sed -n 's/.* held_over_live=//p')
    out=$("$B/bench/bench-replay" "${steps[@]}" --passes 3 "$T/$name.jsonl")
    h=$(sed -n 's/^pass=[23] .* held_over_live=\([0-9.]*\).*/\1/p' <<<"$out" | sort -g | tail -1)
    sh=$(sed -n 's/^replay=.*settled_held_over_live=\([0-9.]*\).*/\1/p' <<<"$out")
    printf '%-10s %-28s %8s %8s %8s %-20s %s\n' "${name#gpt-seq-}" "driver alone" "$r" "$r" 1 - \
        "no mapping calls, $h; settled $sh"
    for cfg in ${CONFIGS:-fence sync immediate vmm-fence vmm-sync aligned-fence fit200-fence pluggable-fence}; do
        backing=legacy
        reuse=$cfg
        layout=tight
        fit=125
        args=("${steps[@]}")
        plug=
        case $cfg in
        pluggable-*) backing=vmm reuse=${cfg#pluggable-} args+=(--pluggable 1) plug=1 ;;
        vmm-*) backing=vmm reuse=${cfg#vmm-} ;;
        aligned-*) backing=vmm reuse=${cfg#aligned-} layout=aligned ;; # CUHEAP_VMM_LAYOUT
        fit200-*) backing=vmm reuse=${cfg#fit200-} fit=200 ;;          # CUHEAP_VMM_IDLE_FIT
        esac
        ratios=() calls=()
        for ((i = 0; i < RUNS; i++)); do
            out=$(LD_PRELOAD=$B/src/libcuheap.so CUHEAP_SUMMARY=1 CUHEAP_VERBOSE=1 CUHEAP_RECORD=0 \
                CUHEAP_REUSE=$reuse CUHEAP_BACKING=$backing CUHEAP_VMM_LAYOUT=$layout \
                CUHEAP_VMM_IDLE_FIT=$fit \
                "$B/bench/bench-replay" "${args[@]}" "$T/$name.jsonl" 2>&1)
            ratios+=("$(sed -n 's/.* held_over_live=\([0-9.]*\).*/\1/p' <<<"$out")")
            # the summary's vmm line: each chunk made, moved or given back is two driver calls
            calls+=("$(sed -n 's/.*vmm: \([0-9]*\) chunks[^,]*, \([0-9]*\) moved, \([0-9]*\) given.*/\1 \2 \3/p' \
                <<<"$out" | awk '{print 2 * ($1 + $2 + $3)}')")
        done
        sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
        label="cuheap $backing $reuse"
        [ "$layout" = tight ] || label="$label $layout"
        [ "$fit" = 125 ] || label="$label fit $fit"
        [ -z "$plug" ] || label="$label pluggable"
        called=$(printf '%s\n' "${calls[@]}" | sort -n | sed -n '1p;$p' | paste -sd-)
        warm=""
        if [ "$backing" = vmm ]; then
            ops=() held=() sops=() sheld=()
            for ((i = 0; i < RUNS; i++)); do
                out=$(LD_PRELOAD=$B/src/libcuheap.so CUHEAP_SUMMARY=0 CUHEAP_RECORD=0 \
                    CUHEAP_REUSE=$reuse CUHEAP_BACKING=$backing CUHEAP_VMM_LAYOUT=$layout \
                    CUHEAP_VMM_IDLE_FIT=$fit \
                    "$B/bench/bench-replay" "${args[@]}" --passes 3 "$T/$name.jsonl")
                ops+=("$(sed -n 's/^replay=.*warm_ops_per_step=\([0-9.]*\).*/\1/p' <<<"$out")")
                # the higher of passes 2 and 3
                held+=("$(sed -n 's/^pass=[23] .* held_over_live=\([0-9.]*\).*/\1/p' <<<"$out" |
                    sort -g | tail -1)")
                sops+=("$(sed -n 's/^replay=.*settled_ops_per_step=//p' <<<"$out")")
                sheld+=("$(sed -n 's/^replay=.*settled_held_over_live=\([0-9.]*\).*/\1/p' <<<"$out")")
            done
            o=$(printf '%s\n' "${ops[@]}" | sort -g | sed -n '$p;1p' | paste -sd-)
            h=$(printf '%s\n' "${held[@]}" | sort -g | sed -n '$p;1p' | paste -sd-)
            so=$(printf '%s\n' "${sops[@]}" | sort -g | sed -n '$p;1p' | paste -sd-)
            sh=$(printf '%s\n' "${sheld[@]}" | sort -g | sed -n '$p;1p' | paste -sd-)
            warm="$o ops, $h; settled $so ops, $sh"
            [ "$h" = 0.000-0.000 ] && warm="$o ops, nothing freed to replay"
        fi
        printf '%-10s %-28s %8s %8s %8s %-20s %s\n' "${name#gpt-seq-}" "$label" \
            "$(tail -1 <<<"$sorted")" "$(head -1 <<<"$sorted")" "$RUNS" "${called#-}" "$warm"
    done
    # A long run: the job's steps replayed LONG_PASSES times (default 8) under the default
    # backing; held memory must not creep up as fences come late now and then.
    ratios=()
    for ((i = 0; i < RUNS; i++)); do
        ratios+=("$(LD_PRELOAD=$B/src/libcuheap.so CUHEAP_SUMMARY=0 CUHEAP_RECORD=0 \
            "$B/bench/bench-replay" "${steps[@]}" --passes "${LONG_PASSES:-8}" "$T/$name.jsonl" |
            sed -n 's/^replay=.* held_over_live=\([0-9.]*\).*/\1/p')")
    done
    sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
    printf '%-10s %-28s %8s %8s %8s\n' "${name#gpt-seq-}" "cuheap vmm fence, ${LONG_PASSES:-8} passes" \
        "$(tail -1 <<<"$sorted")" "$(head -1 <<<"$sorted")" "$RUNS"
done
