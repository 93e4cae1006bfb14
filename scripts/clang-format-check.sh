#!/bin/sh
# Check (or with --fix, apply) .clang-format on every C file in the repository.
# Usage: clang-format-check.sh CLANG_FORMAT [--fix]
set -eu
cf="$1"
cd "${MESON_SOURCE_ROOT:-$(dirname "$0")/..}"
files=$(git ls-files --cached --others --exclude-standard '*.c' '*.h' 2>/dev/null || find src include tools tests bench -name '*.[ch]')
if [ "${2:-}" = "--fix" ]; then
    "$cf" -i $files
else
    "$cf" --dry-run --Werror $files
fi
