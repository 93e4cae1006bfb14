#!/bin/sh
# The pool's parts call one way: no two of src/pool/*.c call into each other (docs/HACKING.md's
# table). Reads an archive of the parts compiled one by one and prints each pair that does.
# TAP output, one case.
#   check-pool-parts.sh ARCHIVE
set -eu
archive=$1
echo "1..1"
nm "$archive" | awk '
    /^$/ { next }
    /:$/ { part = $0; sub(/\.c\.o:$/, "", part); sub(/.*_/, "", part); next }
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
                printf "# pool parts call each other: %s -> %s (%s), %s -> %s (%s)\n", a[1], a[2], edge[k], a[2], a[1], edge[a[2], a[1]]
                bad = 1
            }
        }
        n = 0
        for (k in edge) n++
        if (n == 0)
            bad = 1 # an archive with no parts in it proves nothing
        printf "%s 1 - pool parts call one way (%d pairs of parts that call)\n", bad ? "not ok" : "ok", n
        exit bad
    }'
