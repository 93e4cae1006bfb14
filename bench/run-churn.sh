#!/usr/bin/env bash
# Held / live bytes and mapping operations for allocation patterns a recorded job does not show
# (bench/bench-churn.c, issue 31): threads on streams of their own freeing without a sync (with
# the driver's launch queue, with a shallower one, and 16 threads instead of 4), sizes that
# alternate step by step, a working set that grows and shrinks, sizes that change every step
# (batches of every length). Each runs on the simulated driver alone, then under
# cuheap's vmm and legacy backings (CONFIGS adds vmm-notc: vmm without thread caches), RUNS
# times each (default 3; thread timing varies, the seed does not): worst and best held/live,
# cuheap's worst over the driver's worst, and the vmm pool's mapping operations per warm step
# (the run's second half), worst and best. Run from the repository root after a build:
#   bash bench/run-churn.sh [BUILD_DIR]
#
# CAPACITIES="262M 300M 400M" asks instead whether each configuration fits on a device of each
# size (the simulated device's memory): the runs, of RUNS, that ran to the end without an
# out-of-memory (the driver alone's peak is its held bytes; cuheap's may be more).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
RUNS=${RUNS:-3}
if [ -n "${CAPACITIES:-}" ]; then
    export LD_LIBRARY_PATH=$B/tests/fakecuda
    printf '%-22s %-10s %s\n' workload device "runs that ran to the end, of $RUNS"
    for w in ${WORKLOADS:-streams}; do
        args=${w//,/ }
        name=${args%% *}
        opts=${args#"$name"}
        for mem in $CAPACITIES; do
            line=
            for cfg in driver ${CONFIGS:-vmm legacy}; do
                ok=0
                for ((i = 0; i < RUNS; i++)); do
                    if [ "$cfg" = driver ]; then
                        FAKECUDA_DEVICE_MEM=$mem "$B/bench/bench-churn" $opts "$name" >/dev/null 2>&1 &&
                            ok=$((ok + 1))
                    else
                        FAKECUDA_DEVICE_MEM=$mem LD_PRELOAD=$B/src/libcuheap.so CUHEAP_SUMMARY=0 \
                            CUHEAP_RECORD=0 CUHEAP_BACKING=${cfg%-notc} "$B/bench/bench-churn" \
                            $opts "$name" >/dev/null 2>&1 && ok=$((ok + 1))
                    fi
                done
                line="$line $cfg $ok"
            done
            printf '%-22s %-10s%s\n' "$name$opts" "$mem" "$line"
        done
    done
    exit 0
fi
export LD_LIBRARY_PATH=$B/tests/fakecuda FAKECUDA_DEVICE_MEM=${FAKECUDA_DEVICE_MEM:-16G}
WORKLOADS=${WORKLOADS:-streams streams,--depth,64 streams,--threads,16 alternate grow-shrink shapes}
printf '%-22s %-20s %8s %8s %5s %10s %s\n' workload configuration worst best runs "x driver" \
    "mapping ops per warm step"
for w in $WORKLOADS; do
    args=${w//,/ } # "streams,--depth,64": the workload's options after its name
    name=${args%% *}
    opts=${args#"$name"}
    driver_worst=
    for cfg in driver ${CONFIGS:-vmm legacy}; do
        ratios=() ops=()
        for ((i = 0; i < RUNS; i++)); do
            case $cfg in
            driver) out=$("$B/bench/bench-churn" $opts "$name") ;;
            *)
                backing=${cfg%-notc} tc=16M
                [ "$cfg" = vmm-notc ] && tc=0
                out=$(LD_PRELOAD=$B/src/libcuheap.so CUHEAP_SUMMARY=0 CUHEAP_RECORD=0 \
                    CUHEAP_BACKING=$backing CUHEAP_THREAD_CACHE=$tc \
                    "$B/bench/bench-churn" $opts "$name")
                ;;
            esac
            ratios+=("$(sed -n 's/.*held_over_live=\([0-9.]*\).*/\1/p' <<<"$out")")
            ops+=("$(sed -n 's/.*warm_ops_per_step=//p' <<<"$out")")
        done
        sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
        worst=$(tail -1 <<<"$sorted") best=$(head -1 <<<"$sorted")
        [ "$cfg" = driver ] && driver_worst=$worst
        x=$(awk -v a="$worst" -v b="$driver_worst" 'BEGIN { printf "%.2f", a / b }')
        o=
        [ "$cfg" = driver ] || [ "$cfg" = legacy ] ||
            o=$(printf '%s\n' "${ops[@]}" | sort -g | sed -n '$p;1p' | paste -sd-)
        label=$cfg
        [ "$cfg" = driver ] && label="driver alone"
        [ "$cfg" = driver ] || label="cuheap $cfg"
        printf '%-22s %-20s %8s %8s %5s %10s %s\n' "$name$opts" "$label" "$worst" "$best" \
            "$RUNS" "$x" "$o"
    done
done
