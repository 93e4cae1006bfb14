#!/usr/bin/env bash
# Stress for cuheap against the simulated driver (tests/programs/stress.c), recording on:
#   threads   16 threads on 3 devices with a 64-slot ring (always full): every call succeeds,
#             cuheap's counts are exact, the trace reads to its end
#   fork      forks from a threaded parent while streams come and go and fences are recorded
#             (the known-stream lock), then a fork storm: every child creates a stream and
#             allocates in time, and leaves a whole trace; then forks while another thread
#             starts cuheap (fork-boot): every child allocates in time
#   signals   a 100 us timer whose handler puts marks into the trace while the program
#             allocates: it finishes, the trace reads to its end
#   kill      SIGKILL at random points of a 16-thread run: the trace's prefix stays readable
#             (`cuheap check` says incomplete, never damaged)
#   disk      a 64 KiB tmpfs (mounted when root may; else RLIMIT_FSIZE), /dev/full and a folder
#             that cannot be written: the program's output and exit are those without cuheap,
#             the summary says what was written
#   exit      exit(0) while 8 threads allocate, at a random point of cuheap's start-up (0-2 ms
#             in) or later (0-50 ms), in a fresh process or in a child forked after cuheap
#             started (whose trace opens with its first event): every trace reads whole or as
#             a clean prefix (`cuheap check`: ok or incomplete, never empty or damaged), and
#             every process that left a trace printed the summary
#   rss       cuheap's host memory over a long run (pool off: the recorder, stacks, tables):
#             resident memory sampled ten times, growth from the third sample (the ring and the
#             allocation table are then warm) to the last at most 1 MiB
#
#   scripts/stress.sh [--short] [-b BUILD_DIR] [CHECK...]
#
# --short is the CI version (the `stress` test, about 20 s); without it each check runs about
# 50 times longer. Prints one line per check and "stress: ok" or "stress: N failed".
set -u
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build scale=50
checks=()
while [ $# -gt 0 ]; do
    case $1 in
    --short) scale=1 ;;
    -b)
        build=$2
        shift
        ;;
    *) checks+=("$1") ;;
    esac
    shift
done
[ ${#checks[@]} -eq 0 ] && checks=(threads fork signals kill exit disk rss)
case $build in /*) ;; *) build=$root/$build ;; esac
S=$build/tests/programs/stress
tool=$build/tools/cuheap
T=$(mktemp -d /tmp/cuheap-stress-XXXXXX)
mounted=
cleanup() {
    [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
export LD_LIBRARY_PATH=$build/tests/fakecuda
PRE=$build/src/libcuheap.so
failed=0

say() { echo "stress: $*"; }
bad() {
    say "FAILED: $*"
    failed=$((failed + 1))
}

# every trace named must read to its end
whole() {
    local f out
    for f in "$@"; do
        out=$("$tool" check "$f" 2>&1) || {
            bad "trace $f: $out"
            return 1
        }
    done
}

check_threads() {
    local n=$((2000 * scale)) out
    out=$(FAKECUDA_DEVICE_COUNT=3 LD_PRELOAD=$PRE CUHEAP_RING=64 CUHEAP_OUTPUT=$T/thr-%p.jsonl \
        CUHEAP_SUMMARY=0 timeout 600 "$S" threads 16 "$n") || bad "threads: exit $?: $out"
    say "$out"
    [[ $out == *"dropped 0 "* ]] && bad "threads: a 64-slot ring never filled"
    whole "$T"/thr-*.jsonl
}

check_fork() {
    local n=$((40 * scale)) out
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/fs-%p.jsonl CUHEAP_SUMMARY=0 timeout 900 \
        "$S" fork-streams "$n") || bad "fork-streams: exit $?: $out"
    say "$out"
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/storm-%p.jsonl CUHEAP_SUMMARY=0 timeout 900 \
        "$S" fork-storm "$n") || bad "fork-storm: exit $?: $out"
    say "$out; $(ls "$T"/storm-*.jsonl | wc -l) traces"
    whole "$T"/storm-*.jsonl
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/boot-%p.jsonl CUHEAP_SUMMARY=0 timeout 900 \
        "$S" fork-boot $((100 * scale))) || bad "fork-boot: exit $?: $out"
    say "$out"
}

check_signals() {
    local out
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/sig.jsonl CUHEAP_SUMMARY=0 timeout 600 \
        "$S" signals $((5000 * scale))) || bad "signals: exit $?: $out"
    say "$out"
    whole "$T"/sig.jsonl
}

check_kill() {
    local runs=$((5 * scale)) i ms out verdicts=""
    for ((i = 0; i < runs; i++)); do
        ms=$((20 + RANDOM % 400))
        rm -f "$T"/kill.jsonl*
        LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/kill.jsonl CUHEAP_FLUSH_MS=$((1 + RANDOM % 100)) \
            "$S" threads 16 100000000 >/dev/null 2>&1 &
        local pid=$!
        sleep "$(printf '0.%03d' "$ms")"
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        out=$("$tool" check "$T"/kill.jsonl 2>&1)
        case $out in
        *": incomplete, "*) verdicts+=i ;;
        *"no such file"* | *"No such file"*) verdicts+=n ;; # killed before it began
        *) bad "killed after $ms ms: $out" ;;
        esac
    done
    say "kill: $runs runs killed at random points: $(tr -cd i <<<"$verdicts" | wc -c) readable prefixes, $(tr -cd n <<<"$verdicts" | wc -c) killed before a trace"
}

check_exit() {
    local runs=$((100 * scale)) i us mode want f out rc nt ns whole=0 prefix=0 none=0
    for ((i = 0; i < runs; i++)); do
        # most exits inside start-up, the rest while the writer is busy
        if ((i % 4 > 1)); then us=$((RANDOM % 2001)); else us=$(((RANDOM * 32768 + RANDOM) % 50001)); fi
        mode=exit-race want=1
        ((i % 2)) && mode=exit-race-child want=2 # the parent's trace and the child's
        rm -f "$T"/exit-*.jsonl* "$T"/exit.err
        LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/exit-%p.jsonl timeout 60 "$S" $mode "$us" \
            >/dev/null 2>"$T"/exit.err
        rc=$?
        [ $rc -eq 0 ] || bad "$mode after $us us: exit $rc: $(tail -1 "$T"/exit.err)"
        nt=$(find "$T" -maxdepth 1 -name 'exit-*.jsonl*' | wc -l)
        ns=$(grep -cE 'cuheap: (GPU [0-9]+: peak live |no device memory allocated)' "$T"/exit.err)
        # exit came before cuheap started (or, in a child, before its first event): no trace
        ((nt < want)) && none=$((none + 1))
        [ "$ns" -ge "$nt" ] || bad "$mode after $us us: $nt traces, $ns summaries"
        for f in "$T"/exit-*.jsonl*; do
            [ -e "$f" ] || continue
            out=$("$tool" check "$f" 2>&1)
            case $out in
            *": ok, "*) whole=$((whole + 1)) ;;
            *": incomplete, "*) prefix=$((prefix + 1)) ;;
            *) bad "$mode after $us us: $out" ;;
            esac
        done
    done
    say "exit: $runs runs exiting while threads start cuheap (half of them in a forked child): $whole traces whole, $prefix clean prefixes, $none runs left no trace of the exiting process"
}

check_disk() {
    local plain out dir=$T/tiny
    plain=$("$S" threads 4 2000 2>/dev/null | sed 's/; allocs.*//')
    mkdir -p "$dir"
    if mount -t tmpfs -o size=64k tmpfs "$dir" 2>/dev/null; then
        mounted=$dir
        out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$dir/t.jsonl CUHEAP_FLUSH_MS=5 "$S" threads 4 $((2000 * scale)) 2>"$T/tiny.err")
        local rc=$? what="64 KiB tmpfs"
    else
        out=$(
            ulimit -f 64
            LD_PRELOAD=$PRE CUHEAP_OUTPUT=$dir/t.jsonl CUHEAP_FLUSH_MS=5 "$S" threads 4 $((2000 * scale)) 2>"$T/tiny.err"
        )
        local rc=$? what="RLIMIT_FSIZE 64 KiB"
    fi
    [ $rc -eq 0 ] && [[ $out == "${plain% on *}"* ]] || bad "disk ($what): exit $rc: $out"
    grep -q "is partial" "$T/tiny.err" || bad "disk ($what): the summary does not say the trace is partial: $(tail -1 "$T/tiny.err")"
    "$tool" check "$dir/t.jsonl" 2>&1 | grep -q ': incomplete, ' || bad "disk ($what): the prefix is not readable"
    [ -n "$mounted" ] && umount "$mounted" && mounted=
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=/dev/full "$S" threads 4 2000 2>"$T/full.err") || bad "/dev/full: exit $?"
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=/proc/self/cannot/t.jsonl "$S" threads 4 2000 2>"$T/unw.err") || bad "unwritable folder: exit $?"
    grep -q "could not be created" "$T/unw.err" || bad "unwritable folder: the summary does not say so"
    say "disk: $what, /dev/full and an unwritable folder: the program ran as without cuheap"
}

check_rss() {
    local out
    # a 4096-slot ring is all touched after the first tenth (the default ring's 53 MB are
    # touched as it fills, by design): what grows after that is cuheap's to explain
    # pool off: what is measured is the recorder, stacks and tables (with the pool on,
    # resident memory also follows the arenas' metadata, 1/16 of the bytes reserved)
    out=$(LD_PRELOAD=$PRE CUHEAP_OUTPUT=$T/rss.jsonl CUHEAP_SUMMARY=0 CUHEAP_RING=4096 CUHEAP_POOL=0 \
        timeout 1200 "$S" rss $((300000 * scale))) || bad "rss: exit $?"
    read -r -a kib <<<"${out#rss: }"
    if [ ${#kib[@]} -lt 10 ]; then
        bad "rss: $out"
        return
    fi
    local growth=$((kib[9] - kib[2]))
    say "rss: $((300000 * scale)) pairs, resident KiB at each tenth: ${kib[*]}; growth after the third sample $growth KiB"
    ((growth <= 1024)) || bad "rss: cuheap's memory grew by $growth KiB"
}

for c in "${checks[@]}"; do
    "check_$c"
done
if ((failed)); then
    say "$failed failed"
    exit 1
fi
say ok
