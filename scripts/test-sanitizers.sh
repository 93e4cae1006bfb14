#!/usr/bin/env bash
# The unit and integration suites under ASan+UBSan, then under TSan, each in its own build
# directory. The `process` tests preload libcuheap.so into uninstrumented programs (ls, the
# tool), which sanitizer runtimes do not allow, so they are left to the plain run; under TSan
# the configuration that provokes a data race on purpose (CUHEAP_REUSE=immediate) is left out.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
rc=0
for cfg in "build-asan address,undefined" "build-tsan thread provokes-race"; do
    set -- $cfg
    dir=$1
    san=$2
    skip=(--no-suite process)
    [ -n "${3:-}" ] && skip+=(--no-suite "$3")
    [ -f "$dir/build.ninja" ] || meson setup "$dir" -Db_sanitize="$san" -Db_lundef=false \
        -Ddebug_checks=true -Dbuildtype=debug >/dev/null || exit 1
    ninja -C "$dir" >/dev/null || exit 1
    echo "== $san"
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ASAN_OPTIONS=detect_leaks=0 \
    TSAN_OPTIONS=halt_on_error=1 \
        meson test -C "$dir" --suite unit --suite integration "${skip[@]}" \
        --print-errorlogs || rc=1
done
exit $rc
