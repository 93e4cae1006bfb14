#!/usr/bin/env bash
# Randomized fault-injection runs: tests/programs/faultload under libcuheap.so against the
# simulated driver, with FAKECUDA_FAIL making chosen driver calls fail at random points
# (tests/fakecuda/fakecuda.c documents the variable). Each run picks a backing (legacy, vmm),
# a reuse policy, 1 to 3 devices and threads, device memory, a ring size, and 1 to 4 fault
# rules with their chances or call numbers, a third of them with another error than the call's
# own (a VMM call refused: not supported, not permitted, unknown; a context broken: illegal
# address; a query refused with a capture's error, 900-908); recording is on. A run passes when
# the workload says every result held (exit 0: the driver's errors passed through, data
# intact, nothing leaked by cuheap's and the driver's accounts, and with one thread no
# allocation refused out of memory while the device had room for it) or the driver refused its
# start (exit 1), with no crash, no hang (timeout), and a trace `cuheap check` reads to its
# end. Pool invariants are checked in builds with -Ddebug_checks=true (every 64th pool call; a
# broken one aborts).
#
#   scripts/fault-runs.sh [-n RUNS] [-s SEED] [-j JOBS] [-b BUILD_DIR] [-t TIMEOUT_S] [-k]
#                         [-x "ENTRY_POINT ..."] [-N]
#
# -b defaults to build-faults, configured here with -Ddebug_checks=true when it does not
# exist; -k keeps the traces and logs of passing runs too; -x spares entry points from every
# rule (FAKECUDA_FAIL's !NAME), e.g. those of a known, reported bug; -N uses BUILD_DIR as it
# is (no configure, no build: the meson test does this). Each failure leaves its log in
# BUILD_DIR/fault-runs/ and prints the line that repeats it. Exit 0 when every run passed.
set -u
cd "$(dirname "$0")/.."
root=$PWD
runs=200 seed=$RANDOM jobs=2 build=build-faults limit=60 keep=0 spare= nobuild=0
while getopts "n:s:j:b:t:kx:N" o; do
    case $o in
    n) runs=$OPTARG ;;
    s) seed=$OPTARG ;;
    j) jobs=$OPTARG ;;
    b) build=$OPTARG ;;
    t) limit=$OPTARG ;;
    k) keep=1 ;;
    x) spare=$OPTARG ;;
    N) nobuild=1 ;;
    *)
        sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 2
        ;;
    esac
done
case $build in /*) ;; *) build=$root/$build ;; esac
if ((!nobuild)); then
    if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" -Ddebug_checks=true >/dev/null || exit 2
    fi
    ninja -C "$build" src/libcuheap.so tests/programs/faultload tools/cuheap >/dev/null || exit 2
fi
logs=$build/fault-runs
rm -rf "$logs"
mkdir -p "$logs"

# Entry points the simulated driver can fail, and what cuheap calls of them.
faultable=(cuMemAlloc cuMemAllocPitch cuMemAllocManaged cuMemAllocAsync cuMemAllocHost cuMemFree
    cuMemFreeAsync cuMemGetInfo cuMemAddressReserve cuMemAddressFree cuMemCreate cuMemRelease
    cuMemMap cuMemSetAccess cuMemUnmap cuStreamCreate cuStreamSynchronize cuLaunchHostFunc
    cuEventCreate cuEventRecord cuEventQuery cuEventSynchronize cuDevicePrimaryCtxRetain
    cuCtxSetCurrent cuCtxPushCurrent cuCtxPopCurrent cuCtxGetCurrent cuCtxGetDevice
    cuCtxSynchronize 'cuMem*' 'cuEvent*' 'cuCtx*' '*')
# Other errors than a call's own (FAKECUDA_FAIL's =ERROR), as drivers give them: the VMM calls
# refused (not supported, not permitted, unknown, invalid value: virtualized GPUs, WSL2), a
# query refused with a capture's error (an event caught in a capture), a sticky context error.
codes_vmm=(801 800 999 1 2)
codes_query=(900 901 902 903 904 905 906 907 908 700 999)
codes_other=(999 700 801)

# One run's settings from its number: printed as the environment and arguments that repeat it.
plan() {
    local i=$1
    RANDOM=$((seed * 7919 + i))
    local backing=legacy reuse=fence rules=() n=$((1 + RANDOM % 4)) readers=1 x
    for x in $spare; do rules+=("!$x"); done
    ((RANDOM % 2)) && backing=vmm
    ((RANDOM % 5 == 0)) && reuse=sync
    for ((k = 0; k < n; k++)); do
        local f=${faultable[RANDOM % ${#faultable[@]}]} when
        case $((RANDOM % 4)) in
        0) when=@$((1 + RANDOM % 40)) ;;
        1) when=@$((1 + RANDOM % 200))+ ;;
        *) when=0.$(printf '%03d' $((1 + RANDOM % 150))) ;;
        esac
        [ "$f" = '*' ] && [[ $when != @* ]] && when=0.0$((1 + RANDOM % 3))
        local code=
        if ((RANDOM % 3 == 0)); then
            case $f in
            cuMemAddressReserve | cuMemCreate | cuMemMap | cuMemSetAccess)
                code=${codes_vmm[RANDOM % ${#codes_vmm[@]}]} ;;
            cuEventQuery) code=${codes_query[RANDOM % ${#codes_query[@]}]} ;;
            *) code=${codes_other[RANDOM % ${#codes_other[@]}]} ;;
            esac
        fi
        rules+=("$f:$when${code:+=$code}")
        # a failed query or sync means a broken context: cuheap then counts the fence as
        # passed, so kernels reading freed blocks are not judged; a query refused with a
        # capture's error is not taken for one (freed blocks wait for a device sync instead)
        case $f in cuEventQuery | cuEventSynchronize | 'cuEvent*' | cuCtxSynchronize | 'cuCtx*' | '*')
            [[ $f == cuEventQuery && $code == 90? ]] || readers=0
            ;;
        esac
    done
    local IFS=,
    echo "FAKECUDA_FAIL=${rules[*]},seed=$((RANDOM * 32768 + RANDOM))" \
        "FAKECUDA_DEVICE_COUNT=$((1 + RANDOM % 3))" "FAKECUDA_DEVICE_MEM=$((512 + RANDOM % 1536))M" \
        "CUHEAP_BACKING=$backing" "CUHEAP_REUSE=$reuse" "CUHEAP_RING=$((256 << (RANDOM % 8)))" \
        "FAULTLOAD_READERS=$readers" \
        "--" "$((RANDOM * 32768 + RANDOM))" "$((100 + RANDOM % 500))" "$((1 + RANDOM % 3))"
}

one() {
    local i=$1 spec envs=() args=() seen=0 w
    spec=$(plan "$i")
    for w in $spec; do
        if [ "$w" = -- ]; then
            seen=1
        elif ((seen)); then
            args+=("$w")
        else
            envs+=("$w")
        fi
    done
    local log=$logs/run-$i.log trace=$logs/run-$i.jsonl
    env "${envs[@]}" CUHEAP_OUTPUT="$trace" CUHEAP_SUMMARY=1 \
        LD_PRELOAD="$build/src/libcuheap.so" LD_LIBRARY_PATH="$build/tests/fakecuda" \
        timeout -k 5 "$limit" "$build/tests/programs/faultload" "${args[@]}" >"$log" 2>&1
    local rc=$? verdict=ok
    case $rc in
    0 | 1) ;;
    10) verdict=violation ;;
    124 | 137) verdict=hang ;;
    *) verdict="crash (exit $rc)" ;;
    esac
    if [ "$verdict" = ok ] && [ -e "$trace" ] &&
        ! "$build/tools/cuheap" check "$trace" >>"$log" 2>&1; then
        verdict="trace not complete"
    fi
    local faults
    faults=$(sed -n 's/^fakecuda: \([0-9]*\) faults injected.*/\1/p' "$log" | tail -1)
    echo "$i ${faults:-0} $verdict" >"$logs/verdict-$i"
    if [ "$verdict" != ok ]; then
        {
            echo "run $i: $verdict"
            echo "  repeat: $(sed 's/ -- / /' <<<"$spec" | sed "s|^|env |; s|\$| (then faultload with the last three numbers)|")"
            echo "  env ${envs[*]} LD_PRELOAD=$build/src/libcuheap.so LD_LIBRARY_PATH=$build/tests/fakecuda $build/tests/programs/faultload ${args[*]}"
            grep -E 'VIOLATION|cuheap:.*(assert|invariant)|fakecuda:|Assertion|check' "$log" | head -5 | sed 's/^/  /'
        } >"$logs/fail-$i.txt"
        cat "$logs/fail-$i.txt"
    elif ((!keep)); then
        rm -f "$log" "$trace"
    fi
}

start=$(date +%s)
for ((i = 0; i < runs; i++)); do
    while (($(jobs -rp | wc -l) >= jobs)); do
        wait -n
    done
    one "$i" &
done
wait
cat "$logs"/verdict-* 2>/dev/null | awk -v runs="$runs" -v seed="$seed" -v t=$(($(date +%s) - start)) '
    { faults += $2; if ($3 == "ok") ok++; else bad++ }
    END { printf "fault runs: %d runs (seed %d), %d faults injected, %d passed, %d failed, %d s\n",
                 runs, seed, faults, ok, bad, t; exit bad > 0 || ok + bad != runs }'
