#!/usr/bin/env bash
# Configure (once) and build cuheap into build/ (or $CUHEAP_BUILD_DIR). Extra arguments go to
# meson setup, e.g. -Db_sanitize=address,undefined.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${CUHEAP_BUILD_DIR:-build}"
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null
echo "build: ok ($dir)"
