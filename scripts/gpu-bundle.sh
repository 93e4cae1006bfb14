#!/usr/bin/env bash
# Build, on this machine, everything the GPU machine runs, into gpu-bundle/ (git-ignored):
# the shim, the tool, the gpu suite, the benchmark, the door programs, two CUDA clients built
# with nvcc (static and shared runtime), and the libraries the GPU machine lacks
# (libunwind.so.8, libcmocka.so.0). Then: device run with carry ["gpu-bundle"] and
# `scripts/gpu-run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
dir=build-gpu
[ -f "$dir/build.ninja" ] || meson setup "$dir" -Dbuildtype=release -Ddebug=true -Dgpu_tests=true \
    -Dsymbolizer=disabled >/dev/null
ninja -C "$dir" >/dev/null
b=gpu-bundle
rm -rf "$b"
mkdir -p "$b"
cp "$dir/src/libcuheap.so" "$dir/tools/cuheap" "$dir/tests/test-gpu" "$dir/bench/bench-alloc" "$dir/bench/bench-churn" "$dir/bench/bench-replay" \
   "$dir/tests/programs/door-procaddr" "$dir/tests/programs/door-dlsym" \
   "$dir/tests/programs/cuheap-demo" "$dir/tests/programs/audit-door" "$b/"
lib=$(dirname "$(readlink -f /usr/lib/x86_64-linux-gnu/libunwind.so.8)")
cp -L "$lib/libunwind.so.8" "$lib/libcmocka.so.0" "$b/"
if [ -e "$lib/liblzma.so.5" ]; then cp -L "$lib/liblzma.so.5" "$b/"; fi
# CUPTI for `gpu-run.sh audit` (CUHEAP_AUDIT=path): the toolkit's copy this bundle was built with
for c in /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64; do
    if [ -e "$c/libcupti.so.13" ]; then cp -L "$c/libcupti.so.13" "$b/"; break; fi
done
# the VMM and fence cost probes link libcuda itself (they are no shim): the toolkit stub here, the driver there
gcc -O2 -I/usr/local/cuda/include -o "$b/probe-vmm" bench/probe-vmm.c -L/usr/local/cuda/lib64/stubs -lcuda -lpthread
gcc -O2 -I/usr/local/cuda/include -o "$b/probe-fence" bench/probe-fence.c -L/usr/local/cuda/lib64/stubs -lcuda -lpthread
nvcc -O2 -arch=sm_90 -cudart static -o "$b/cuda-static" tests/gpu/cuda_client.cu -ldl
nvcc -O2 -arch=sm_90 -cudart shared -o "$b/cuda-shared" tests/gpu/cuda_client.cu -ldl
nvcc -O2 -arch=sm_90 -o "$b/peer-client" tests/gpu/peer_client.cu
# the corpus's plain CUDA program (scripts/gpu-corpus.sh)
nvcc -O2 -arch=sm_90 -o "$b/multigrid" bench/jobs/multigrid.cu -ldl
git describe --always --dirty >"$b/COMMIT" 2>/dev/null || true
du -sh "$b"
