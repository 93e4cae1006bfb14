#!/usr/bin/env bash
# The README's test command: set up, build with warnings as errors, run the unit and
# integration suites (and the format check), and end with "N passed, N failed[, N skipped]"
# counted from the individual test cases' TAP results.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
scripts/build.sh || exit 1
dir="${CUHEAP_BUILD_DIR:-build}"
meson test -C "$dir" --suite unit --suite integration --print-errorlogs "$@"
rc=$?
format_rc=0
if [ -z "${CUHEAP_SKIP_FORMAT:-}" ]; then
    ninja -C "$dir" clang-format-check >/dev/null 2>&1 || { echo "clang-format-check: FAILED (run ninja -C $dir clang-format)"; format_rc=1; }
fi
log="$dir/meson-logs/testlog.txt"
passed=$(grep -cE '^ok [0-9]+' "$log" || true)
failed=$(grep -cE '^not ok [0-9]+' "$log" || true)
skipped=$(grep -cE '^ok [0-9]+ .*# [Ss][Kk][Ii][Pp]' "$log" || true)
passed=$((passed - skipped))
# a test skipped as a whole (html-chromium without Chromium) prints the plan "1..0 # SKIP"
skipped=$((skipped + $(grep -cE '^1\.\.0 # [Ss][Kk][Ii][Pp]' "$log" || true)))
failed=$((failed + format_rc))
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi  # a crashed test prints no TAP line
line="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
[ "$rc" = 0 ] && [ "$format_rc" = 0 ]
