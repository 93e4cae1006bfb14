#!/usr/bin/env bash
# The corpus table: every recorded job in bench/sequences/ (README.md there says how each was
# recorded) replayed through the simulated driver by bench-replay, two passes each (the second
# is the warm one: the job's steps again, its model kept), under the driver alone and under
# each library and setting asked for. One row a job, and a last row with the worst of each
# column:
#   job, allocations, replay threads, steps (from the job's step marks, or --steps evenly),
#   peak live MiB, what the driver alone holds over live; then for each library/setting:
#   held  = cuheap's peak held / the driver alone's peak held (both passes),
#   ops   = mapping operations a warm step (chunks created + moved + given back in pass 2,
#           over its steps; cuheap_get_stats),
#   instr = cuheap's own instructions an allocation (its free included) in the warm pass:
#           callgrind (bench-replay --callgrind-warm 1: counts from the second pass on) with
#           --toggle-collect on the allocation and free entry points, less the simulated
#           driver's calls (bench/callgrind-own.py), over pass 2's allocations; "-" where not
#           measured (CALLGRIND below, or no valgrind).
# held and ops take RUNS runs with a kernel of WORK_US after every allocation (fence timing
# varies: the worst is kept); instr one run with none (WORK_US=0 makes every figure repeat).
# Run from the repository root after a build:
#   bench/run-corpus.sh [BUILD_DIR]
# Settings (environment):
#   NEW=lib.so           the library (default BUILD_DIR/src/libcuheap.so)
#   OLD=lib.so           a second one beside it (e.g. main's, built in a git worktree:
#                        git worktree add --detach /tmp/main-tree main &&
#                        (cd /tmp/main-tree && meson setup build && ninja -C build src/libcuheap.so))
#   CONFIGS="default aligned=CUHEAP_VMM_LAYOUT=aligned notc=CUHEAP_THREAD_CACHE=0,CUHEAP_IDLE_CHECK=0"
#                        settings each library runs under: LABEL[=VAR=VALUE,...] (default: default)
#   SEQS="a.jsonl.gz ..."  the sequences (default: bench/sequences/*.jsonl.gz)
#   WORK_US=20           the replay's kernel after each allocation (0: none, a run repeats exactly)
#   RUNS=1               runs of each cuheap replay; the worst held and ops are kept
#   CALLGRIND=1          instr for each library's first setting; all: every column; 0: none
#                        (valgrind: about a minute for a GPT sequence)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
NEW=${NEW:-$B/src/libcuheap.so}
OLD=${OLD:-}
WORK_US=${WORK_US:-20}
RUNS=${RUNS:-1}
CALLGRIND=${CALLGRIND:-1}
command -v valgrind >/dev/null || CALLGRIND=0
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LD_LIBRARY_PATH=$B/tests/fakecuda FAKECUDA_DEVICE_MEM=${FAKECUDA_DEVICE_MEM:-32G}
libs=("new=$NEW")
[ -z "$OLD" ] || libs=("old=$OLD" "new=$NEW")
read -r -a configs <<<"${CONFIGS:-default}"
# shellcheck disable=SC2206 # a glob, or the list given
seqs=(${SEQS:-bench/sequences/*.jsonl.gz})

field() { sed -n "s/^replay=.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
# the settings of a CONFIGS entry, as env arguments
settings() {
    local s=${1#*=}
    [ "$s" = "$1" ] && return 0
    tr ',' '\n' <<<"$s"
}

cols=()
for l in "${libs[@]}"; do
    for c in "${configs[@]}"; do
        cols+=("${l%%=*}${c:+ ${c%%=*}}")
    done
done
printf '%-16s %8s %3s %9s %8s %6s' job allocs thr steps live_MiB drv/lv
for c in "${cols[@]}"; do
    printf ' | %-26s' "$c"
done
printf '\n%-16s %8s %3s %9s %8s %6s' "" "" "" "" "" ""
for c in "${cols[@]}"; do
    printf ' | %7s %7s %10s' held ops instr
done
printf '\n'

worst_held=() worst_ops=() worst_instr=() worst_held_job=() worst_ops_job=() worst_instr_job=()
for seq in "${seqs[@]}"; do
    name=$(basename "$seq" .jsonl.gz)
    gunzip -c "$seq" >"$T/$name.jsonl"
    args=(--passes 2 --work-us "$WORK_US" --steps 30)
    case $name in gpt-seq-eval | gpt-seq-varlen) args=(--passes 2 --work-us "$WORK_US" --steps 60) ;; esac
    drv=$("$B/bench/bench-replay" "${args[@]}" "$T/$name.jsonl")
    info=$(head -1 <<<"$drv")
    d_held=$(field peak_held "$drv")
    live=$(field peak_live "$drv")
    allocs=$(field allocs "$drv")
    threads=$(sed -n 's/.* threads=\([0-9]*\).*/\1/p' <<<"$info")
    steps=$(sed -n 's/.* steps=\([0-9]*\) steps_from=\([a-z]*\).*/\1 \2/p' <<<"$info")
    printf '%-16s %8s %3s %9s %8s %6s' "$name" "$allocs" "$threads" "${steps/ /,}" \
        "$(awk -v l="$live" 'BEGIN {printf "%.0f", l / 1048576}')" \
        "$(awk -v h="$d_held" -v l="$live" 'BEGIN {printf "%.3f", l ? h / l : 0}')"
    k=0
    for l in "${libs[@]}"; do
        lib=${l#*=}
        for c in "${configs[@]}"; do
            mapfile -t env_set < <(settings "$c")
            held=0 ops=0
            for ((r = 0; r < RUNS; r++)); do
                out=$(env "${env_set[@]}" LD_PRELOAD="$lib" CUHEAP_SUMMARY=0 CUHEAP_RECORD=0 \
                    "$B/bench/bench-replay" "${args[@]}" "$T/$name.jsonl")
                h=$(awk -v h="$(field peak_held "$out")" -v d="$d_held" 'BEGIN {printf "%.3f", d ? h / d : 0}')
                o=$(field warm_ops_per_step "$out")
                held=$(awk -v a="$held" -v b="$h" 'BEGIN {print (b > a ? b : a)}')
                ops=$(awk -v a="$ops" -v b="$o" 'BEGIN {print (b > a ? b : a)}')
            done
            instr=-
            if [ "$CALLGRIND" = all ] || { [ "$CALLGRIND" = 1 ] && [ "$c" = "${configs[0]}" ]; }; then
                out=$(env "${env_set[@]}" LD_PRELOAD="$lib" CUHEAP_SUMMARY=0 CUHEAP_RECORD=0 \
                    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$T/cg.out" \
                    --toggle-collect=cuMemAlloc_v2 --toggle-collect=cuMemFree_v2 \
                    --toggle-collect=cuMemAllocAsync --toggle-collect=cuMemFreeAsync \
                    "$B/bench/bench-replay" "${args[@]}" --work-us 0 --callgrind-warm 1 \
                    "$T/$name.jsonl" 2>/dev/null)
                own=$(python3 bench/callgrind-own.py "$T/cg.out" | sed -n 's/^own=\([0-9]*\).*/\1/p')
                n=$(sed -n 's/^pass=2 .* allocs=\([0-9]*\).*/\1/p' <<<"$out")
                # a job whose second pass makes nothing (no block freed) has no figure
                instr=$(awk -v o="$own" -v n="${n:-0}" 'BEGIN {if (n > 0) printf "%.0f", o / n; else print "-"}')
                rm -f "$T/cg.out"
            fi
            printf ' | %7s %7s %10s' "$held" "$ops" "$instr"
            if [ -z "${worst_held[$k]:-}" ] || awk -v a="$held" -v b="${worst_held[$k]}" 'BEGIN {exit !(a > b)}'; then
                worst_held[k]=$held worst_held_job[k]=$name
            fi
            if [ -z "${worst_ops[$k]:-}" ] || awk -v a="$ops" -v b="${worst_ops[$k]}" 'BEGIN {exit !(a > b)}'; then
                worst_ops[k]=$ops worst_ops_job[k]=$name
            fi
            if [ "$instr" != - ] && { [ -z "${worst_instr[$k]:-}" ] || ((instr > worst_instr[k])); }; then
                worst_instr[k]=$instr worst_instr_job[k]=$name
            fi
            k=$((k + 1))
        done
    done
    printf '\n'
    rm -f "$T/$name.jsonl"
done
printf '%-16s %8s %3s %9s %8s %6s' worst "" "" "" "" ""
for ((k = 0; k < ${#cols[@]}; k++)); do
    printf ' | %7s %7s %10s' "${worst_held[$k]:--}" "${worst_ops[$k]:--}" "${worst_instr[$k]:--}"
done
printf '\n'
for ((k = 0; k < ${#cols[@]}; k++)); do
    echo "worst of ${cols[$k]}: held ${worst_held[$k]:--} (${worst_held_job[$k]:--}), ops" \
        "${worst_ops[$k]:--} (${worst_ops_job[$k]:--}), instr ${worst_instr[$k]:--} (${worst_instr_job[$k]:--})"
done
