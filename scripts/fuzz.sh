#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz) with clang, ASan (leak detection on) and UBSan into
# build-fuzz, and fuzz each one starting from its seed corpus (tests/fuzz/corpus/TARGET).
#
#   scripts/fuzz.sh -runs=N [TARGET...]   N inputs per target after the seeds, same random
#                                         seed every time (CI: -runs=20000)
#   scripts/fuzz.sh [SECONDS] [TARGET...] fuzz each target that long (default 60); what it
#                                         learns stays in build-fuzz/corpus/TARGET for next time
#   scripts/fuzz.sh --crashes             replay tests/fuzz/crashes/, each without its own
#                                         suppression: which known crashes are still there
#
# Targets: tracereader config analysis events cmdline (tests/fuzz/meson.build says what each
# fuzzes, tests/RELIABILITY.md what each found). A crash, leak, UB report, hang (over 20 s on
# one input) or broken harness check stops that target; its input is saved under
# build-fuzz/artifacts/TARGET/ and the script ends with status 1 and a line saying which. The
# last line is "fuzz: N targets, N executions, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=build-fuzz
all_targets=(tracereader config analysis events cmdline)

mode=time
budget=60
targets=()
for a in "$@"; do
    case "$a" in
    -runs=*) mode=runs budget=${a#-runs=} ;;
    --crashes) mode=crashes ;;
    [0-9]*) mode=time budget=$a ;;
    tracereader | config | analysis | events | cmdline) targets+=("$a") ;;
    *) echo "fuzz: unknown argument $a (see the top of scripts/fuzz.sh)"; exit 2 ;;
    esac
done
((${#targets[@]})) || targets=("${all_targets[@]}")

scripts/setup.sh --fuzz >/dev/null || { echo "fuzz: scripts/setup.sh --fuzz failed"; exit 1; }
if ! command -v clang >/dev/null; then
    echo "fuzz: clang not found (scripts/setup.sh --fuzz installs it)"
    exit 1
fi
# -fsanitize=fuzzer-no-link: every file reports coverage; the harnesses link libFuzzer itself.
# UBSan keeps its default recovery so tests/ubsan.supp can work; halt_on_error=1 below stops
# at the first report that is not suppressed.
if [ ! -f "$dir/build.ninja" ]; then
    CC=clang meson setup "$dir" -Dfuzz=true -Dtests=false -Dbuildtype=debugoptimized \
        -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args="-fsanitize=fuzzer-no-link -fno-omit-frame-pointer" >/dev/null ||
        { echo "fuzz: meson setup $dir failed"; exit 1; }
fi
if ! ninja -C "$dir" fuzz >"$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log"
    echo "fuzz: build failed ($dir/build.log)"
    exit 1
fi

export ASAN_OPTIONS=detect_leaks=1
export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/ubsan.supp

if [ "$mode" = crashes ]; then
    # Each reproducer runs with the suppression entries that name it taken out (a paragraph
    # of tests/lsan.supp or tests/ubsan.supp whose comment names the file) and the harnesses'
    # known-bug guards off, the other entries kept, so it shows its own bug and no other
    # known one. A reproducer that passes is of a fixed bug: it belongs in the seed corpus,
    # and its suppression entry goes.
    export CUHEAP_FUZZ_KNOWN_BUGS=1
    n=0 still=0
    for f in tests/fuzz/crashes/*; do
        [ -f "$f" ] || continue
        name=$(basename "$f")
        t=${name%%-*}
        n=$((n + 1))
        for s in lsan ubsan; do
            awk -v name="$name" 'BEGIN { RS = ""; ORS = "\n\n" } index($0, name) == 0' \
                "tests/$s.supp" >"$dir/replay-$s.supp"
        done
        if LSAN_OPTIONS=suppressions=$root/$dir/replay-lsan.supp:print_suppressions=0 \
            UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$root/$dir/replay-ubsan.supp \
            "$dir/tests/fuzz/fuzz-$t" "$root/$f" >"$dir/replay.log" 2>&1; then
            echo "fixed:         $f (move it to tests/fuzz/corpus/$t/, drop its suppression)"
        else
            still=$((still + 1))
            echo "still crashes: $f: $(grep -m1 -E 'SUMMARY|fuzz check' "$dir/replay.log")"
        fi
    done
    echo "fuzz: $still of $n reproducers still crash"
    exit 0
fi

# One target's run; its result goes to $dir/fuzz-TARGET.{log,rc,time}.
run_one() {
    local t=$1 exe="$dir/tests/fuzz/fuzz-$1" art="$root/$dir/artifacts/$1/" work dict
    mkdir -p "$art"
    local args=(-seed=1 -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$art")
    dict=$root/tests/fuzz/$t.dict
    [ "$t" = analysis ] || [ "$t" = tracereader ] && dict=$root/tests/fuzz/trace.dict
    [ -f "$dict" ] && args+=(-dict="$dict")
    if [ "$mode" = runs ]; then
        # a fresh working corpus each time: the same inputs, so the same run, every time
        work=$(mktemp -d)
        args+=(-runs="$budget")
    else
        work="$root/$dir/corpus/$t"
        mkdir -p "$work"
        args+=(-max_total_time="$budget")
    fi
    local start=$SECONDS
    # new inputs go to the first folder; the seeds in the second are only read
    "$exe" "${args[@]}" "$work" "$root/tests/fuzz/corpus/$t" >"$dir/fuzz-$t.log" 2>&1
    echo $? >"$dir/fuzz-$t.rc"
    echo $((SECONDS - start)) >"$dir/fuzz-$t.time"
    [ "$mode" = runs ] && rm -rf "$work"
}

# As many targets at once as there are cores (libFuzzer runs one input at a time), or
# FUZZ_JOBS.
nr_jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
for t in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= nr_jobs)); do wait -n; done
    rm -f "$dir/fuzz-$t.rc"
    run_one "$t" &
done
wait

total=0 failed=0
for t in "${targets[@]}"; do
    log="$dir/fuzz-$t.log"
    rc=$(cat "$dir/fuzz-$t.rc" 2>/dev/null || echo 1)
    secs=$(cat "$dir/fuzz-$t.time" 2>/dev/null || echo "?")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    execs=${execs:-0}
    total=$((total + execs))
    if [ "$rc" != 0 ]; then
        failed=$((failed + 1))
        grep -E -A30 'ERROR:|runtime error|fuzz check failed|SUMMARY' "$log" | head -60
        echo "fuzz-$t: FAILED after $execs executions ($secs s): input saved in" \
            "$(ls -t "$dir/artifacts/$t/" 2>/dev/null | head -1 | sed "s|^|$dir/artifacts/$t/|"); log $log"
    else
        echo "fuzz-$t: ok, $execs executions in $secs s"
    fi
done
echo "fuzz: ${#targets[@]} targets, $total executions, $failed failed"
[ "$failed" = 0 ]
