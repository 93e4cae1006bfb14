#!/usr/bin/env bash
# What `pip install .` gives a user, checked in a fresh venv: the wheel builds (meson-python),
# installs, `cuheap --version` and `python -m cuheap --version` answer, `cuheap run` writes a
# trace on the simulated driver, the Python module imports with nothing but the standard
# library, and `cuheap run --torch` finds its bootstrap in the installed package. Needs the
# build tree's simulated driver (scripts/build.sh) and PyPI for the build tools. About 1-2 min.
set -euo pipefail
cd "$(dirname "$0")/.."
b="${CUHEAP_BUILD_DIR:-build}"
[ -e "$b/tests/fakecuda/libcuda.so.1" ] || { echo "check-wheel: build first (scripts/build.sh)"; exit 1; }
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
python3 -m venv "$t/venv"
v="$t/venv/bin"
"$v/pip" wheel -q --disable-pip-version-check -w "$t/dist" . >"$t/pip.log" 2>&1 ||
    { tail -30 "$t/pip.log"; echo "check-wheel: the wheel did not build"; exit 1; }
whl=$(ls "$t"/dist/cuheap-*.whl)
case $whl in
*-linux_*.whl) ;;
*) echo "check-wheel: $whl is not tagged for the platform (it holds native code)"; exit 1 ;;
esac
"$v/pip" install -q --disable-pip-version-check "$whl"
"$v/cuheap" --version | grep -q '^cuheap [0-9]' || { echo "check-wheel: cuheap --version"; exit 1; }
"$v/python" -m cuheap --version | grep -q '^cuheap [0-9]' ||
    { echo "check-wheel: python -m cuheap --version"; exit 1; }
LD_LIBRARY_PATH="$b/tests/fakecuda" "$v/cuheap" run -o "$t/w.jsonl" -- \
    "$b/tests/programs/cuheap-demo" 3 >/dev/null 2>"$t/run.err"
grep -q "^cuheap: GPU 0: peak live .*; trace: $t/w.jsonl\$" "$t/run.err" ||
    { cat "$t/run.err"; echo "check-wheel: no exit line naming the trace"; exit 1; }
"$v/cuheap" check "$t/w.jsonl"
# outside cuheap the module does nothing and says so; it finds the library beside the tool
"$v/python" -c "import sys; before = set(sys.modules)
import cuheap, cuheap.torch, os
assert not cuheap.loaded() and cuheap.stats() is None and cuheap.pause() is None
assert cuheap.library_path() == os.path.join('$v', 'libcuheap.so'), cuheap.library_path()
new = {m.split('.')[0] for m in set(sys.modules) - before if not m.startswith('_sysconfigdata')} - {'cuheap'}
assert new <= sys.stdlib_module_names, new"
out=$(PYTHONPATH=tests/programs/torchstub "$v/cuheap" run --torch -- "$v/python" -c \
    "import torch; print(torch.current[0][0])")
[ "$out" = "$v/libcuheap.so" ] || { echo "check-wheel: --torch made '$out' the allocator"; exit 1; }
echo "check-wheel: ok ($(basename "$whl"))"
