#!/usr/bin/env bash
# The README's first command: set up, build, and run the bundled demo training job under
# cuheap on the simulated device (no GPU needed), then turn its trace into a report and into
# files for Perfetto, flame graphs and PyTorch's memory_viz. Everything lands in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
b="${CUHEAP_BUILD_DIR:-build}"
out=out
mkdir -p "$out"
echo "== running the demo job under cuheap (simulated device)"
# cuheap never writes over an existing trace (it would take demo.jsonl.1): start clean
rm -f "$out"/demo.jsonl "$out"/demo.jsonl.[0-9]*
LD_LIBRARY_PATH="$b/tests/fakecuda" "$b/tools/cuheap" run -o "$out/demo.jsonl" -- \
    "$b/tests/programs/cuheap-demo" 20 12
echo
echo "== cuheap report $out/demo.jsonl"
"$b/tools/cuheap" report "$out/demo.jsonl"
"$b/tools/cuheap" chrome -o "$out/demo.trace.json" "$out/demo.jsonl"
"$b/tools/cuheap" folded "$out/demo.jsonl" >"$out/demo.folded"
"$b/tools/cuheap" memviz -o "$out/demo.pickle" "$out/demo.jsonl"
"$b/tools/cuheap" html -o "$out/demo.html" "$out/demo.jsonl"
echo
echo "trace:       $out/demo.jsonl"
echo "Perfetto:    $out/demo.trace.json   (open in https://ui.perfetto.dev)"
echo "flame graph: $out/demo.folded       (flamegraph.pl or https://speedscope.app)"
echo "memory_viz:  $out/demo.pickle       (https://pytorch.org/memory_viz)"
echo "report:      $out/demo.html         (any browser)"
echo
echo "next, try:"
printf '  %-42s # %s\n' "$b/tools/cuheap top $out/demo.jsonl" "the call sites holding the most at the peak" \
    "$b/tools/cuheap leaks $out/demo.jsonl" "what was never freed, and where" \
    "$b/tools/cuheap run -- python train.py" "your own job, on a GPU (--torch: PyTorch's tensors)"
