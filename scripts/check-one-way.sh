#!/bin/sh
# Files call one way: no two of them call into each other (docs/HACKING.md's map). Reads the
# objects of an archive, or of folders of .o files, and prints each pair that does. TAP
# output, one case.
#   check-pool-parts.sh LABEL ARCHIVE|DIR...
set -eu
label=$1
shift
echo "1..1"
for a in "$@"; do
    if [ -d "$a" ]; then
        for o in "$a"/*.o; do
            case $o in *unity*) continue ;; esac
            echo "$o:"
            nm "$o"
        done
    else
        nm "$a"
    fi
done | awk -v label="$label" '
    /^$/ { next }
    /:$/ { part = $0; sub(/\.c\.o:$/, "", part); sub(/.*\//, "", part); sub(/^(\.\._)+/, "", part); sub(/^src_(pool_)?/, "", part); next }
    $1 == "U" { uses[part, $2] = 1; next }
    NF == 3 && $2 ~ /^[TDBRV]$/ { def[$3] = part }
    END {
        for (k in uses) {
            split(k, a, SUBSEP)
            if ((a[2] in def) && def[a[2]] != a[1])
                edge[a[1], def[a[2]]] = a[2]
        }
        bad = 0
        for (k in edge) {
            split(k, a, SUBSEP)
            if (a[1] < a[2] && ((a[2], a[1]) in edge)) {
                printf "# %s call each other: %s -> %s (%s), %s -> %s (%s)\n", label, a[1], a[2], edge[k], a[2], a[1], edge[a[2], a[1]]
                bad = 1
            }
        }
        n = 0
        for (k in edge) n++
        if (n == 0)
            bad = 1 # an archive with no parts in it proves nothing
        printf "%s 1 - %s call one way (%d pairs of files that call)\n", bad ? "not ok" : "ok", label, n
        exit bad
    }'
