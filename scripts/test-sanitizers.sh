#!/usr/bin/env bash
# The unit and integration suites under ASan+UBSan (leak detection on), then under TSan, each
# in its own build directory. The `process` tests preload libcuheap.so into uninstrumented
# programs (ls, the tool), which sanitizer runtimes do not allow, so they are left to the plain
# run; under TSan the configuration that provokes a data race on purpose
# (CUHEAP_REUSE=immediate) is left out.
#
# Known leaks and UB reports are listed, each with its issue, in tests/lsan.supp and
# tests/ubsan.supp; everything else fails the run. Two canaries come first, because a
# sanitizer that cannot fail would make its run worthless: a program that leaks must be caught
# with those files in place (leak detection off, or a suppression broad enough to hide
# everything, would let it through), and under TSan the race that CUHEAP_REUSE=immediate
# allows on purpose (suite provokes-race) must be reported.
# Suite long (the promises stress's long form) runs in the plain run only.
# The vmm configurations (suite vmm) run under ASan+UBSan only: their 4 GiB arenas make the
# debug invariant walks too slow under TSan. For the same reason the pool's cases that run the
# vmm tests again under first fit (POOL_TEST_SKIP) do too; promises-first-fit, whose threads
# are what TSan looks at, runs under both.
# Ends with "sanitizers: ok" or "sanitizers: FAILED (...)", and a matching exit status.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/setup.sh >/dev/null || exit 1

# fast_unwind_on_malloc=0: jansson (static, no frame pointers) stops the fast unwinder, and
# the suppressions match on functions further up the allocation's stack
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0
export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/ubsan.supp
export TSAN_OPTIONS=halt_on_error=1

failed=()
canary=$(mktemp -d)
printf '#include <stdlib.h>\nvoid *keep;\nint main(void) { keep = malloc(7); keep = 0; return 0; }\n' \
    >"$canary/leak.c"
if ! cc -fsanitize=address -g "$canary/leak.c" -o "$canary/leak"; then
    failed+=("leak canary does not build")
elif "$canary/leak" >"$canary/log" 2>&1 || ! grep -q 'detected memory leaks' "$canary/log"; then
    cat "$canary/log"
    failed+=("leak canary not caught: leak detection is off or suppressed")
else
    echo "== leak canary caught"
fi
rm -rf "$canary"

for cfg in "build-asan address,undefined long" "build-tsan thread provokes-race vmm long"; do
    set -- $cfg
    dir=$1
    san=$2
    shift 2
    skip=(--no-suite process)
    for s in "$@"; do skip+=(--no-suite "$s"); done
    if [ ! -f "$dir/build.ninja" ] && ! meson setup "$dir" -Db_sanitize="$san" -Db_lundef=false \
        -Ddebug_checks=true -Dbuildtype=debug >/dev/null; then
        failed+=("$san: meson setup")
        continue
    fi
    ninja -C "$dir" >/dev/null || { failed+=("$san: build"); continue; }
    if [ "$san" = thread ]; then
        log=$dir/meson-logs/testlog.txt
        if meson test -C "$dir" --suite provokes-race >/dev/null 2>&1 ||
            ! grep -q 'ThreadSanitizer: data race' "$log"; then
            failed+=("race canary not caught: TSan did not report hooks-immediate's race")
        else
            echo "== race canary caught (hooks-immediate)"
        fi
    fi
    echo "== $san"
    start=$SECONDS
    pool_skip=
    [ "$san" = thread ] && pool_skip='*first_fit*'
    POOL_TEST_SKIP=$pool_skip meson test -C "$dir" --suite unit --suite integration "${skip[@]}" \
        --print-errorlogs ||
        failed+=("$san: tests, see $dir/meson-logs/testlog.txt")
    echo "== $san: $((SECONDS - start)) s"
done
if ((${#failed[@]})); then
    printf 'sanitizers: FAILED (%s)\n' "$(IFS=';'; echo "${failed[*]}")"
    exit 1
fi
echo "sanitizers: ok"
