#!/usr/bin/env bash
# The tool's scale benchmark: record a long job (bench/trace-gen.c) under cuheap on the
# simulated device into a real trace of about 1 GB (STEPS=77000: 5.8 M events), check that
# `cuheap check` accepts it, then time every command on it and print a markdown table: wall
# seconds, CPU seconds (user + system: what other work on a shared machine does not inflate),
# peak resident memory, output size (/usr/bin/time). A benchmark, not a test: the
# figures go to bench/RESULTS.md with the date and the machine.
#
#   bash bench/run-tools.sh [BUILD_DIR]
#   TRACE=/path/big.jsonl bash bench/run-tools.sh    # time an existing trace instead
#   STEPS=20000 ONLY="report html" KEEP=1 bash bench/run-tools.sh
#
# The trace and the outputs go to a temporary directory, removed at the end unless KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
b="$(realpath "${1:-${CUHEAP_BUILD_DIR:-build}}")"
tool="$b/tools/cuheap"
steps="${STEPS:-77000}"
only="${ONLY:-check report top leaks folded html diff memviz memviz-all chrome-window chrome}"
[ -x "$tool" ] && [ -x "$b/bench/trace-gen" ] || {
    echo "run-tools.sh: build first (ninja -C $b)" >&2
    exit 2
}
[ -x /usr/bin/time ] || {
    echo "run-tools.sh: needs /usr/bin/time (Debian: apt-get install time)" >&2
    exit 2
}
dir="$(mktemp -d "${TMPDIR:-/tmp}/cuheap-bench.XXXXXX")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$dir"' EXIT
trace="${TRACE:-}"
if [ -z "$trace" ]; then
    trace="$dir/big.jsonl"
    start=$(date +%s.%N)
    LD_LIBRARY_PATH="$b/tests/fakecuda" CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$trace" \
        LD_PRELOAD="$b/src/libcuheap.so" "$b/bench/trace-gen" "$steps" >/dev/null
    end=$(date +%s.%N)
    dropped=$(tail -n 1 "$trace" | sed -n 's/.*"dropped":\([0-9]*\).*/\1/p')
    if [ "${dropped:-x}" != 0 ]; then
        echo "run-tools.sh: the recorder dropped ${dropped:-?} events (footer): raise --pace-us" >&2
        exit 1
    fi
    printf 'recorded %s steps in %.1f s\n' "$steps" "$(awk "BEGIN { print $end - $start }")"
fi
"$tool" check "$trace" || {
    echo "run-tools.sh: cuheap check refused $trace" >&2
    exit 1
}
printf 'trace: %s, %s bytes\n\n' "$trace" "$(stat -c %s "$trace")"
echo "| command | wall s | CPU s | peak resident MB | output bytes |"
echo "|---|---|---|---|---|"
run() { # NAME OUTPUT ARGS...
    local name="$1" out="$2"
    shift 2
    case " $only " in *" $name "*) ;; *) return 0 ;; esac
    local stats="$dir/time.txt"
    /usr/bin/time -f '%e %U %S %M' -o "$stats" "$tool" "$@" >"$dir/stdout" 2>"$dir/stderr" || {
        echo "run-tools.sh: cuheap $* failed:" >&2
        cat "$dir/stderr" >&2
        exit 1
    }
    local size
    if [ "$out" = - ]; then size=$(stat -c %s "$dir/stdout"); else size=$(stat -c %s "$out"); fi
    read -r secs user sys kib <"$stats"
    printf '| `cuheap %s` | %s | %s | %d | %s |\n' "${*//$dir\//}" "$secs" \
        "$(awk "BEGIN { print $user + $sys }")" $((kib / 1024)) "$size"
    rm -f "$out"
}
run check - check "$trace"
run report - report "$trace"
run top - top "$trace"
run leaks - leaks "$trace"
run folded - folded "$trace"
run html "$dir/out.html" html -o "$dir/out.html" "$trace"
run diff - diff "$trace" "$trace"
run memviz "$dir/out.pickle" memviz -o "$dir/out.pickle" "$trace"
run memviz-all "$dir/all.pickle" memviz --max-entries 0 -o "$dir/all.pickle" "$trace"
run chrome-window "$dir/window.json" chrome --from 1 --to 2 -o "$dir/window.json" "$trace"
run chrome "$dir/all.json" chrome -o "$dir/all.json" "$trace"
