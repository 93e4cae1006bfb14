#!/usr/bin/env bash
# The preload library must export exactly the symbols its version script lists (hooks, dlsym,
# the public API) and must not depend on libcuda, libcudart, CUPTI or libunwind.
# Usage: check-exports.sh LIBCUHEAP.so VERSION_SCRIPT
set -eu
lib="$1"
map="$2"
want=$(sed -n '/global:/,/local:/p' "$map" | grep -oE '^[[:space:]]+[A-Za-z_][A-Za-z0-9_]*;' | tr -d ' ;' | sort)
have=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | grep -v '^$' | sort)
echo "1..2"
if [ "$want" = "$have" ]; then
    echo "ok 1 - exported symbols match $(basename "$map")"
else
    echo "not ok 1 - exported symbols differ from $(basename "$map")"
    diff <(echo "$want") <(echo "$have") 2>/dev/null | sed 's/^/# /' || true
fi
needed=$(readelf -d "$lib" | grep NEEDED || true)
if echo "$needed" | grep -qE 'libcuda|libcudart|cupti|libunwind|libjansson'; then
    echo "not ok 2 - forbidden NEEDED entries"
    echo "$needed" | sed 's/^/# /'
else
    echo "ok 2 - no libcuda, libcudart, CUPTI, libunwind or jansson in NEEDED"
fi
