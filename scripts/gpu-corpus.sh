#!/usr/bin/env bash
# Records the job corpus (bench/jobs/, bench/sequences/README.md) on the GPU machine: every job
# run once under cuheap with the pool off and recording on (PyTorch's caching off, no stacks),
# each sequence gzipped. Runs from the repository root with gpu-bundle/ (scripts/gpu-bundle.sh)
# carried along; writes to $OUT:
#   corpus.tar (corpus-2.tar, ... past 15 MiB each)  the sequences, NAME.jsonl.gz, for
#                                                  bench/sequences/ (tar xf corpus.tar -C bench/sequences)
#   summary.txt   per job: exit status, allocations, steps, median step ms, events dropped,
#                 the outputs' md5 (the same under every allocator)
#   corpus.log    every job's output
# Each job has a timeout (CORPUS_JOB_S, default 75 s) and the whole run a budget (CORPUS_S,
# default 400 s): a job that would start with under 20 s left is skipped and said so.
# CORPUS_ONLY="moe-train unet" records only those. About 4 minutes on an H100.
#   scripts/gpu-corpus.sh
set -u
cd "$(dirname "$0")/.."
root=$PWD
B=$root/gpu-bundle
OUT=${OUT:-$root/out-gpu}
mkdir -p "$OUT"
T=$(mktemp -d)
mkdir -p "$T/seq"
start=$SECONDS
budget=${CORPUS_S:-400}
# NVLink multicast stays off on lent machines (see the device tool's notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 JOB_DEVICE=${JOB_DEVICE:-cuda}
export GPT_DEVICE=$JOB_DEVICE # JOB_DEVICE=cpu JOB_STEPS=2: a dry run of this script without a GPU

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

say "== corpus $(date -u +%FT%TZ) commit $(cat "$B/COMMIT" 2>/dev/null) on $(nvidia-smi -L 2>/dev/null | head -1)"
say "   driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)," \
    "$(python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)," \
    "$(python3 -c 'import jax, cupy; print("jax", jax.__version__, "cupy", cupy.__version__)' 2>&1 | tail -1)"

# the plain CUDA program: built by gpu-bundle.sh, else here
mg=$B/multigrid
if [ ! -x "$mg" ]; then
    mg=$T/multigrid
    nvcc -O2 -arch=sm_90 -o "$mg" bench/jobs/multigrid.cu -ldl >"$T/nvcc.log" 2>&1 ||
        say "multigrid: nvcc failed: $(tail -3 "$T/nvcc.log" | tr '\n' ' ')"
fi

# name | command | settings of its own
jobs=(
    "gpt-eval|python3 bench/torch_gpt.py 40|GPT_EVAL=10"
    "gpt-varlen|python3 bench/torch_gpt.py 40|GPT_VARLEN=1"
    "gpt-twice|python3 bench/jobs/gpt_twice.py 20|"
    "hf-gpt2-train|python3 bench/jobs/hf_gpt2_train.py|"
    "hf-generate|python3 bench/jobs/hf_generate.py|"
    "moe-train|python3 bench/jobs/moe_train.py|"
    "cnn-resnet|python3 bench/jobs/cnn_resnet.py|"
    "unet|python3 bench/jobs/unet.py|"
    "grad-accum-ckpt|python3 bench/jobs/grad_accum_ckpt.py|"
    "jax-train|python3 bench/jobs/jax_train.py|XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false"
    "cupy-nopool|python3 bench/jobs/cupy_nopool.py|"
    "mt-server|python3 bench/jobs/mt_server.py|"
    "cuda-multigrid|$mg|"
)
for j in "${jobs[@]}"; do
    IFS='|' read -r name cmd own <<<"$j"
    if [ -n "${CORPUS_ONLY:-}" ] && [[ " $CORPUS_ONLY " != *" $name "* ]]; then
        continue
    fi
    left=$((budget - (SECONDS - start)))
    if ((left < 20)); then
        say "job=$name skipped: out of time (${CORPUS_S:-400} s in all)"
        continue
    fi
    limit=${CORPUS_JOB_S:-75}
    ((limit > left)) && limit=$left
    seq=$T/seq/$name.jsonl
    t0=$SECONDS
    # shellcheck disable=SC2086 # $own and $cmd are word lists
    env $own PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$B/libcuheap.so" CUHEAP_POOL=0 \
        CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$seq" \
        timeout -k 5 "$limit" $cmd >"$T/$name.log" 2>&1
    rc=$?
    { echo "### $name (exit $rc, $((SECONDS - t0)) s): $own $cmd"; cat "$T/$name.log"; } >>"$OUT/corpus.log"
    allocs=- steps=- dropped=- size=-
    if [ -s "$seq" ]; then
        allocs=$(grep -c '"event":"alloc"' "$seq")
        steps=$(grep -c '"event":"mark".*"label":"step"' "$seq")
        dropped=$(tail -1 "$seq" | sed -n 's/.*"dropped":\([0-9]*\).*/\1/p')
        gzip -9 "$seq"
        size=$(du -k "$seq.gz" | cut -f1)K
    fi
    line=$(grep -E '^(job=|step_ms=)' "$T/$name.log" | sed 's/ peak_live=.*launch_ms/ launch_ms/' | paste -sd' ')
    md5=$(grep -E '^(outputs|losses|eval_losses)' "$T/$name.log" | md5sum | cut -c1-12)
    say "job=$name exit=$rc wall_s=$((SECONDS - t0)) allocs=$allocs steps=$steps dropped=${dropped:-?}" \
        "size=$size outputs_md5=$md5 | $line"
    [ $rc = 0 ] || say "  $(grep -v '^\s*$' "$T/$name.log" | tail -2 | cut -c1-300 | paste -sd' ')"
done

# the sequences into tars of at most 15 MiB (what comes back from $OUT: 8 files of 16 MiB)
n=1 size=0 files=()
pack() {
    ((${#files[@]})) || return 0
    local tar=$OUT/corpus.tar
    ((n > 1)) && tar=$OUT/corpus-$n.tar
    tar cf "$tar" -C "$T/seq" "${files[@]}"
    n=$((n + 1)) size=0 files=()
}
for f in "$T"/seq/*.jsonl.gz; do
    [ -e "$f" ] || continue
    k=$(du -k "$f" | cut -f1)
    ((size + k > 15 * 1024)) && pack
    files+=("$(basename "$f")")
    size=$((size + k))
done
pack
say "== corpus done in $((SECONDS - start)) s: $(ls "$OUT"/corpus*.tar 2>/dev/null | xargs -n1 basename | paste -sd' ')"
rm -rf "$T"
