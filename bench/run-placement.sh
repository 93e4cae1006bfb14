#!/usr/bin/env bash
# Placement alone on every recorded job (bench-placement, src/fit.c against src/buddy.c, memory
# given back as the pool does): one row a job, held over live / mapping operations a late step
# / the placement's own ns an allocation, for each placement, and a last row with the worst.
# Run from the repository root after a build:
#   bench/run-placement.sh [BUILD_DIR]      SEQS="a.jsonl.gz ..." (default: bench/sequences/*)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck disable=SC2206 # a glob, or the list given
seqs=(${SEQS:-bench/sequences/*.jsonl.gz})
names=(fit fit-classes buddy)
printf '%-16s' job
for n in "${names[@]}"; do printf ' | %-22s' "$n"; done
printf '\n%-16s' ''
for n in "${names[@]}"; do printf ' | %6s %6s %8s' held ops ns; done
printf '\n'
declare -A worst_held worst_ops
for seq in "${seqs[@]}"; do
    name=$(basename "$seq" .jsonl.gz)
    gunzip -c "$seq" >"$T/$name.jsonl"
    out=$("$B/bench/bench-placement" "$T/$name.jsonl")
    printf '%-16s' "$name"
    for n in "${names[@]}"; do
        line=$(grep "^placement=$n " <<<"$out")
        h=$(sed -n 's/.* held_over_live=\([0-9.]*\).*/\1/p' <<<"$line")
        o=$(sed -n 's/.* ops_per_step=\([0-9.]*\).*/\1/p' <<<"$line")
        ns=$(sed -n 's/.* ns_per_alloc=\([0-9]*\).*/\1/p' <<<"$line")
        printf ' | %6s %6s %8s' "$h" "$o" "$ns"
        if awk -v a="$h" -v b="${worst_held[$n]:-0}" 'BEGIN {exit !(a > b)}'; then worst_held[$n]=$h; fi
        if awk -v a="$o" -v b="${worst_ops[$n]:-0}" 'BEGIN {exit !(a > b)}'; then worst_ops[$n]=$o; fi
    done
    printf '\n'
    rm -f "$T/$name.jsonl"
done
printf '%-16s' worst
for n in "${names[@]}"; do printf ' | %6s %6s %8s' "${worst_held[$n]}" "${worst_ops[$n]}" ''; done
printf '\n'
