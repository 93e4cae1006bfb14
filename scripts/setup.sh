#!/usr/bin/env bash
# Install what building and testing cuheap needs, only what is missing (Debian/Ubuntu).
# The CUDA toolkit headers (cuda.h) must already be there (e.g. /usr/local/cuda); cuheap
# never links libcuda, libcudart or CUPTI.
#   scripts/setup.sh           build, tests (gcc's ASan/UBSan/TSan runtimes come with gcc)
#   scripts/setup.sh --fuzz    also clang with libFuzzer for scripts/fuzz.sh
# With CI set (CI does), also chromium, which renders the HTML report in a test.
set -euo pipefail

pkgs=(meson ninja-build gcc pkg-config libjansson-dev libcmocka-dev libunwind-dev libdw-dev zlib1g-dev
      python3 python3-jsonschema python3-venv clang-format)
# libclang-rt-dev holds libFuzzer and clang's sanitizer runtimes (only recommended by clang,
# so --no-install-recommends leaves it out); llvm has llvm-symbolizer, which names the
# functions in sanitizer reports (the suppression files match on those names)
[ "${1:-}" = --fuzz ] && pkgs+=(clang libclang-rt-dev llvm)
# CI renders the HTML report in headless Chromium (skipped where Chromium is missing); a
# workstation gets it with CI=true or by installing chromium itself
[ -n "${CI:-}" ] && pkgs+=(chromium)
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${pkgs[@]}"; do
    have_pkg "$p" || need+=("$p")
done
if ((${#need[@]})); then
    echo "setup: installing ${need[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

found=""
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /opt/cuda /usr; do
    [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && { found="$d/include"; break; }
done
if [ -z "$found" ]; then
    echo "setup: cuda.h not found: install the CUDA toolkit headers (or set CUDA_HOME)" >&2
    exit 1
fi
echo "setup: ok (CUDA headers in $found)"
