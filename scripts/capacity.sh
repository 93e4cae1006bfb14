#!/usr/bin/env bash
# Near the device's capacity, cuheap refuses no allocation the driver alone grants: the stress
# program's capacity run (tests/programs/stress.c: seeded allocations of 4 KiB-12 MiB and frees
# that keep the live bytes near 7/8 of the simulated device, each block written) under the
# driver alone and under cuheap (defaults), on small devices and a few seeds. Passes when every
# allocation the driver alone granted, by its index, cuheap granted too.
#
#   scripts/capacity.sh [-b BUILD_DIR] [-n STEPS] [SIZE:SEED...]
#
# Prints one line per run and "capacity: ok" or "capacity: N failed".
set -u
cd "$(dirname "$0")/.."
build=$PWD/build steps=5000
runs=()
while [ $# -gt 0 ]; do
    case $1 in
    -b)
        build=$2
        shift
        ;;
    -n)
        steps=$2
        shift
        ;;
    *) runs+=("$1") ;;
    esac
    shift
done
[ ${#runs[@]} -eq 0 ] && runs=(150M:1 150M:2 64M:1 64M:2)
case $build in /*) ;; *) build=$PWD/$build ;; esac
S=$build/tests/programs/stress
export LD_LIBRARY_PATH=$build/tests/fakecuda CUHEAP_RECORD=0 CUHEAP_SUMMARY=0
failed=0

# The indices refused, one a line, from the program's "capacity: refused I J ..." line.
refused() { sed -n 's/^capacity: refused//p' | tr ' ' '\n' | sed '/^$/d' | sort -n; }

for run in "${runs[@]}"; do
    size=${run%%:*} seed=${run#*:}
    alone=$(FAKECUDA_DEVICE_MEM=$size "$S" capacity "$steps" "$seed") || {
        echo "capacity: $size seed $seed: the driver alone failed the run"
        failed=$((failed + 1))
        continue
    }
    pooled=$(FAKECUDA_DEVICE_MEM=$size LD_PRELOAD=$build/src/libcuheap.so \
        "$S" capacity "$steps" "$seed") || {
        echo "capacity: $size seed $seed: the run failed under cuheap"
        failed=$((failed + 1))
        continue
    }
    # refused under cuheap, granted by the driver alone
    extra=$(comm -13 <(refused <<<"$alone" | sort) <(refused <<<"$pooled" | sort) | sort -n)
    n_alone=$(refused <<<"$alone" | wc -l) n_pooled=$(refused <<<"$pooled" | wc -l)
    if [ -n "$extra" ] || [ "$n_pooled" -gt "$n_alone" ]; then
        echo "capacity: $size seed $seed: FAILED, refused $n_alone alone, $n_pooled under cuheap;" \
            "granted alone, refused under cuheap: $(head -8 <<<"$extra" | tr '\n' ' ')"
        failed=$((failed + 1))
    else
        echo "capacity: $size seed $seed: refused $n_alone alone, $n_pooled under cuheap"
    fi
done
if [ $failed -eq 0 ]; then
    echo "capacity: ok"
else
    echo "capacity: $failed failed"
fi
exit $((failed != 0))
