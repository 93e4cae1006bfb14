#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with gpu-bundle/ (scripts/gpu-bundle.sh)
# carried along. Writes its logs to $OUT (at most a few files: summary.txt, gpu-suite.log,
# clients.log, bench.log, traces.tar.gz).
#
#   scripts/gpu-run.sh tests     the gpu suite (real-stream race per reuse policy, OOM, queries)
#   scripts/gpu-run.sh clients   real clients with and without cuheap, pool off and on
#   scripts/gpu-run.sh bench     benchmarks (bench/run-gpu.sh)
#   scripts/gpu-run.sh record    the GPT job's allocation sequences, for the replay benchmark
#   scripts/gpu-run.sh audit     CUHEAP_AUDIT on the CUDA clients, PyTorch (caching on and
#                                off), pool off and on, and a deliberate miss (audit-door)
#   scripts/gpu-run.sh viewers   memory_viz pages from cuheap snapshots (headless Chromium)
#   scripts/gpu-run.sh ipc       CUDA tensors shared between processes under cuheap
#   scripts/gpu-run.sh soak      a GPT run of SOAK_S seconds with recording, against one without
#   scripts/gpu-run.sh quick     the default suite, then 16 threads and a long GPT run against
#                                gpu-bundle/old/libcuheap.so (little device time)
#   scripts/gpu-run.sh profile   where 16 threads' pairs spend their time (BENCH_PROFILE) and
#                                recording's cost in the GPT loop, against gpu-bundle/*/ builds
#   scripts/gpu-run.sh hot       one-thread pairs and 16 threads, every build in the bundle, and
#                                cudaMallocAsync
#   scripts/gpu-run.sh toggle    recording's cost in the GPT loop within one process (paused
#                                and resumed every few steps)
#   scripts/gpu-run.sh settings  the GPT loop (caching off, no recording) under several
#                                settings of this build (GPT_SETTINGS) beside the caching
#                                allocator: step time, held/live, driver calls
#   scripts/gpu-run.sh side      the gpu suite, then this build against gpu-bundle/old/ side by
#                                side: 16 threads at 512 B and 2 MiB, the GPT loop (caching off)
#   scripts/gpu-run.sh steady    issue 31: the gpu suite, the churn workloads (bench-churn) under
#                                the driver alone, this build and gpu-bundle/old/ (vmm, legacy),
#                                16 threads of 512 B and 64 KiB pairs, then the GPT loop:
#                                caching allocator, caching off under both builds and
#                                backings, caching on + cuheap, cuheap as pluggable
#   scripts/gpu-run.sh eval      the GPT loop with an evaluation every GPT_EVAL steps: caching
#                                allocator, cuheap, pluggable
#   scripts/gpu-run.sh churn     issue 31 in one short call: the churn workloads under the driver,
#                                gpu-bundle/old/ and this build; the GPT loop's settings (old
#                                default, this build's default, pluggable); the loop
#                                with an evaluation every 10 steps; a GPT trace with evaluations
#                                recorded (gpt-seq-eval.jsonl.gz) for bench-replay
#   scripts/gpu-run.sh warm      issue 31's per-step figures: the gpu suite; the GPT loop
#                                (WARM_STEPS, 60) with each step's mapping operations and
#                                milliseconds in mapping calls over the run's second half:
#                                caching allocator, expandable segments, caching off + cuheap,
#                                caching on + cuheap, pluggable; the loop with an evaluation
#                                every 10 steps; the churn workloads under cuheap
#   scripts/gpu-run.sh sites     caching on: the GPT loop recorded, and the sites holding the
#                                most at its peak (what cuheap counts beyond PyTorch's reserved);
#                                pairs of 512 B, 2 and 20 MiB under cuheap beside the driver
#                                alone, three rounds
#   scripts/gpu-run.sh shapes    the GPT loop with batches of varying length (GPT_VARLEN=1) under
#                                the caching allocator, expandable segments, the driver alone,
#                                cuheap, caching on, pluggable; then
#                                bench-churn's shapes, and the loop recorded (record-varlen)
#   scripts/gpu-run.sh record-varlen  the varying-length loop's allocations recorded for
#                                bench-replay (OUT/gpt-seq-varlen.jsonl.gz)
#   scripts/gpu-run.sh own       issue 54's own time: OWN_ROUNDS (5) interleaved rounds of the
#                                GPT loop and the mixture-of-experts loop (bench/jobs/moe_train.py)
#                                under the caching allocator and under cuheap (caching off, no
#                                recording): the step, cuheap's own time a warm step (and its
#                                share of the step) and its driver calls a step by kind, losses
#   scripts/gpu-run.sh layouts   the GPT and MoE loops under the caching allocator, expandable
#                                segments and cuheap's tight and aligned layouts (run_layouts)
#   scripts/gpu-run.sh all       tests, clients and bench
set -u
cd "$(dirname "$0")/.."
root=$PWD
B=$root/gpu-bundle
OUT=${OUT:-$root/out-gpu}
mkdir -p "$OUT"
T=$(mktemp -d)
# NVLink multicast stays off on lent machines (see the device tool's notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
PRE=$B/libcuheap.so
what=${1:-all}
# Builds to compare sit in gpu-bundle/NAME/; the shim loads libunwind from its own folder, and
# without it falls back to glibc's backtrace (about 6 us a 12-frame stack against 0.55 us)
for d in "$B"/*/; do
    [ -f "$d/libcuheap.so" ] && [ ! -e "$d/libunwind.so.8" ] && ln -s ../libunwind.so.8 "$d/libunwind.so.8"
done

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

say "== $(date -u +%FT%TZ) commit $(cat "$B/COMMIT" 2>/dev/null) on $(nvidia-smi -L 2>/dev/null | head -1)"
say "   driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null), $(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null)"

run_tests() {
    for backing in ${BACKINGS:-legacy vmm}; do
        for r in fence sync immediate; do
            echo "## CUHEAP_BACKING=$backing CUHEAP_REUSE=$r"
            LD_PRELOAD=$PRE CUHEAP_BACKING=$backing CUHEAP_REUSE=$r \
                CUHEAP_OUTPUT="$T/gpu-$backing-$r-%p.jsonl" timeout 240 "$B/test-gpu"
            echo "## exit $?"
        done
    done >"$OUT/gpu-suite.log" 2>&1
    say "gpu suite: $(grep -c '^ok' "$OUT/gpu-suite.log") ok, $(grep -c '^not ok' "$OUT/gpu-suite.log") not ok"
    grep -E '^# (race|oom):' "$OUT/gpu-suite.log" | tee -a "$OUT/summary.txt"
}

# the program's result line with and without cuheap: must be the same
compare() {
    local name=$1 base=$2 with=$3
    local a b
    a=$(grep '^checksum' <<<"$base")
    b=$(grep '^checksum' <<<"$with")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        say "  $name: same result ($a)"
    else
        say "  $name: DIFFERENT: '$a' vs '$b'"
    fi
}

# ONLY="cuda torch:graph jax" limits the clients run (default: all)
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# torch.multiprocessing sharing CUDA tensors (IPC) with and without cuheap (caching on; see below)
run_ipc() {
    say "ipc (torch.multiprocessing, spawn):"
    # Caching on only: with PYTORCH_NO_CUDA_MEMORY_CACHING=1 PyTorch itself cannot share a CUDA
    # tensor (H200, torch 2.11, without cuheap: "RuntimeError: invalid device pointer" in
    # _share_cuda_, then the child waits for the queue until its timeout; pytorch#114534).
    # IPC_CACHING="0 1" runs both anyway.
    for cache in ${IPC_CACHING:-1}; do
        envs=()
        [ $cache = 0 ] && envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
        base=$(env "${envs[@]}" timeout 100 python3 tests/gpu/torch_ipc.py 2>&1)
        with=$(env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/ipc-c$cache-%p.jsonl" \
            timeout 100 python3 tests/gpu/torch_ipc.py 2>&1)
        echo "### ipc caching=$cache plain"$'\n'"$base"$'\n'"### cuheap"$'\n'"$with" >>"$OUT/ipc.log"
        say "  caching=$cache: plain: $(grep '^ipc' <<<"$base"); cuheap: $(grep '^ipc' <<<"$with")"
        compare "ipc caching=$cache" "$base" "$with"
    done
}

run_clients() {
    exec 3>>"$OUT/clients.log"
    say "clients (result without cuheap vs with, pool off / on):"
    for prog in cuda-static cuda-shared; do
        wanted cuda || continue
        # stdout alone is compared: cuheap's summary goes to stderr, which is kept apart
        base=$(timeout 120 "$B/$prog" 2>"$T/$prog.err")
        echo "### $prog plain"$'\n'"$base"$'\n'"$(cat "$T/$prog.err")" >&3
        for pool in 0 1; do
            with=$(CUHEAP_POOL=$pool LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/$prog-pool$pool-%p.jsonl" \
                timeout 120 "$B/$prog" 2>"$T/$prog-pool$pool.err")
            echo "### $prog pool=$pool"$'\n'"$with"$'\n'"$(cat "$T/$prog-pool$pool.err")" >&3
            compare "$prog pool=$pool" "$base" "$with"
            say "    $(grep '^program:' <<<"$with")"
            say "    $(grep '^cuheap:' <<<"$with" | head -1)"
            say "    $(grep '^cuheap: GPU' "$T/$prog-pool$pool.err" | head -1)"
        done
    done
    for mode in default nocache expandable async graph pluggable; do
        wanted torch:$mode || continue
        envs=()
        case $mode in
        nocache) envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
        expandable) envs=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
        async) envs=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
        esac
        if [ $mode = pluggable ]; then
            base=$(timeout 300 python3 tests/gpu/torch_client.py default 2>&1)
        else
            base=$(env "${envs[@]}" timeout 300 python3 tests/gpu/torch_client.py $mode 2>&1)
        fi
        echo "### torch $mode plain"$'\n'"$base" >&3
        for pool in 0 1; do
            if [ $mode = pluggable ]; then
                [ $pool = 0 ] && continue
                with=$(CUHEAP_LIB=$PRE CUHEAP_OUTPUT="$T/torch-$mode-%p.jsonl" \
                    timeout 300 python3 tests/gpu/torch_client.py pluggable 2>&1)
            else
                with=$(env "${envs[@]}" CUHEAP_POOL=$pool LD_PRELOAD=$PRE \
                    CUHEAP_OUTPUT="$T/torch-$mode-pool$pool-%p.jsonl" \
                    timeout 300 python3 tests/gpu/torch_client.py $mode 2>&1)
            fi
            echo "### torch $mode pool=$pool"$'\n'"$with" >&3
            a=$(grep '^losses' <<<"$base")
            b=$(grep '^losses' <<<"$with")
            if [ -n "$a" ] && [ "$a" = "$b" ]; then
                say "  torch $mode pool=$pool: losses identical bit for bit"
            else
                say "  torch $mode pool=$pool: LOSSES DIFFER or run failed (see clients.log)"
            fi
            say "    $(grep '^torch:' <<<"$with")"
            say "    $(grep '^cuheap:' <<<"$with")"
        done
    done
    if wanted torch:oom; then
        # PyTorch's OutOfMemoryError and empty_cache() keep working under the pool
        for envs in "PYTORCH_NO_CUDA_MEMORY_CACHING=1" "CUHEAP_POOL=0" "CUHEAP_POOL=1"; do
            with=$(env $envs LD_PRELOAD=$PRE CUHEAP_SUMMARY=0 CUHEAP_OUTPUT=/dev/null \
                timeout 300 python3 tests/gpu/torch_oom.py 2>&1)
            echo "### torch oom $envs"$'\n'"$with" >&3
            say "  torch oom ($envs): $(grep '^oom' <<<"$with" || echo FAILED)"
        done
    fi
    # the Python lines of the model, and the live curve against torch.cuda.memory_allocated()
    tr=$(ls "$T"/torch-nocache-pool1-*.jsonl 2>/dev/null | head -1)
    if [ -n "$tr" ]; then
        "$B/cuheap" top -n 8 "$tr" >&3 2>&1
        say "  top sites of torch nocache+pool:"
        "$B/cuheap" top -n 5 "$tr" 2>/dev/null | sed -n 2,6p | tee -a "$OUT/summary.txt"
        python3 tests/gpu/check_marks.py "$tr" >&3 2>&1
        say "  $(python3 tests/gpu/check_marks.py "$tr" 2>&1 | tail -1)"
    fi
    for lib in jax cupy; do
        wanted $lib || continue
        envs=()
        [ $lib = jax ] && envs=(XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false)
        base=$(env "${envs[@]}" timeout 300 python3 tests/gpu/${lib}_client.py 2>&1 | grep -v Warning)
        echo "### $lib plain"$'\n'"$base" >&3
        for pool in 0 1; do
            with=$(env "${envs[@]}" CUHEAP_POOL=$pool LD_PRELOAD=$PRE \
                CUHEAP_OUTPUT="$T/$lib-pool$pool-%p.jsonl" \
                timeout 300 python3 tests/gpu/${lib}_client.py 2>&1 | grep -v Warning)
            echo "### $lib pool=$pool"$'\n'"$with" >&3
            a=$(grep '^checksum' <<<"$base")
            b=$(grep '^checksum' <<<"$with")
            if [ -n "$a" ] && [ "$a" = "$b" ]; then
                say "  $lib pool=$pool: same result"
            else
                say "  $lib pool=$pool: DIFFERENT or failed (see clients.log)"
            fi
            say "    $(grep '^cuheap:' <<<"$with")"
        done
    done
    if wanted ddp; then
        # torchrun with two ranks: each rank writes its own trace (named by rank); the tool
        # merges them into one timeline. Modes: caching allocator (cuheap records), caching off
        # (cuheap's pool), caching with NCCL buffer registration.
        # DDP_BACKINGS (default vmm): the pool's backings to run each mode under; DDP_AUDIT=1
        # adds one run per mode under CUHEAP_AUDIT (each rank's exit line)
        for mode in ${DDP_MODES:-caching nocache register}; do
            envs=(TORCH_DDP_MODE=$mode)
            [ $mode = nocache ] && envs+=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
            [ $mode = register ] && envs+=(TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1)
            base=$(env "${envs[@]}" timeout 150 torchrun --nproc_per_node=2 \
                tests/gpu/ddp_client.py 2>&1)
            echo "### ddp $mode plain"$'\n'"$base" >&3
            for backing in ${DDP_BACKINGS:-vmm}; do
                local tag=ddp-$mode-$backing
                with=$(env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_BACKING=$backing CUHEAP_SUMMARY=0 \
                    CUHEAP_OUTPUT="$T/$tag-r%r-%p.jsonl" timeout 150 torchrun --nproc_per_node=2 \
                    tests/gpu/ddp_client.py 2>&1)
                echo "### $tag cuheap"$'\n'"$with" >&3
                a=$(grep '^losses' <<<"$base")
                b=$(grep '^losses' <<<"$with")
                if [ -n "$a" ] && [ "$a" = "$b" ]; then
                    say "  $tag ($(grep '^backend' <<<"$with")): losses identical"
                else
                    say "  $tag: LOSSES DIFFER or run failed (see clients.log)"
                fi
                "$B/cuheap" chrome -o "$T/$tag-merged.trace.json" "$T"/$tag-r*.jsonl >&3 2>&1 &&
                    say "    $(ls "$T"/$tag-r*.jsonl | wc -l) rank traces merged into $tag-merged.trace.json"
                "$B/cuheap" report "$T"/$tag-r*.jsonl >"$OUT/$tag-report.txt" 2>&1
                say "    report of both ranks: exit $?, $(grep -cE '^GPU' "$OUT/$tag-report.txt") GPU lines"
                for f in "$T"/$tag-r*.jsonl; do
                    say "    $(basename "$f"): $("$B/cuheap" report "$f" 2>/dev/null | grep -E '^GPU|peak live' | tr -s ' ' | paste -sd' ')"
                done
            done
            if [ "${DDP_AUDIT:-0}" = 1 ]; then
                with=$(env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_AUDIT=1 CUHEAP_VERBOSE=1 \
                    CUHEAP_OUTPUT="$T/ddp-$mode-audit-r%r-%p.jsonl" timeout 150 \
                    torchrun --nproc_per_node=2 tests/gpu/ddp_client.py 2>&1)
                echo "### ddp $mode audit"$'\n'"$with" >&3
                grep -E '^cuheap: audit: ([0-9]+ driver|CUPTI|cannot|no |needs|.*failed)' <<<"$with" |
                    cut -c1-300 | sed "s/^/  ddp $mode audit: /" | tee -a "$OUT/summary.txt" >/dev/null
            fi
        done
    fi
    exec 3>&-
}

# The GPT job's allocation sequences, recorded pass-through (CUHEAP_POOL=0) without stacks, with
# PyTorch's caching allocator off (every tensor) and on (PyTorch's segments): the replay
# benchmark (bench/replay) plays them through the simulated driver.
run_record() {
    for mode in nocache caching; do
        envs=()
        [ $mode = nocache ] && envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
        env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_POOL=0 CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 \
            CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$T/gpt-seq-$mode.jsonl" \
            timeout 300 python3 bench/torch_gpt.py 30 >"$T/gpt-seq-$mode.log" 2>&1
        gzip -9 -c "$T/gpt-seq-$mode.jsonl" >"$OUT/gpt-seq-$mode.jsonl.gz"
        say "recorded gpt-seq-$mode: $(grep -c '"event":"alloc"' "$T/gpt-seq-$mode.jsonl") allocations; $(grep -E '^step_ms' "$T/gpt-seq-$mode.log" | paste -sd' ')"
    done
}

# CUHEAP_AUDIT: CUPTI's record of the driver's memory operations against what the hooks saw.
# Every client must say "all seen"; audit-door's "miss" run must name its dlvsym allocation.
# CUHEAP_VERBOSE=1 adds how each door matched (what CUPTI reports for VMM, sizes). The CUDA
# clients use the bundled CUPTI (CUPTI=... overrides); PyTorch searches (its own copy).
run_audit() {
    local cupti=${CUPTI:-$B/libcupti.so.13} log=$OUT/audit.log
    exec 3>>"$log"
    say "audit (CUHEAP_AUDIT; the exit line of each run):"
    one() { # name, then the command with its environment
        local name=$1
        shift
        local out
        out=$(env CUHEAP_VERBOSE=1 CUHEAP_OUTPUT="$T/audit-$name-%p.jsonl" LD_PRELOAD=$PRE \
            "$@" 2>&1)
        echo "### $name: $*"$'\n'"$out" >&3
        say "  $name: $(grep -E '^cuheap: audit: ([0-9]+ driver|CUPTI|cannot|no |needs|.*failed)' <<<"$out" | head -1 | cut -c1-400)"
        grep -E '^cuheap: audit: (on,|matched by door|[0-9]+ operations matched|incomplete)' <<<"$out" |
            sed 's/^/      /' | tee -a "$OUT/summary.txt" >/dev/null
        grep -E '^(missed|checksum|losses)' <<<"$out" | head -2 | sed 's/^/      /' |
            tee -a "$OUT/summary.txt" >/dev/null
    }
    for pool in 0 1; do
        for prog in cuda-static cuda-shared; do
            wanted cuda || continue
            one "$prog-pool$pool" CUHEAP_AUDIT="$cupti" CUHEAP_POOL=$pool timeout 120 "$B/$prog"
        done
        one "door-pool$pool" CUHEAP_AUDIT="$cupti" CUHEAP_POOL=$pool timeout 120 "$B/audit-door"
        one "door-miss-pool$pool" CUHEAP_AUDIT="$cupti" CUHEAP_POOL=$pool timeout 120 \
            "$B/audit-door" miss
        wanted torch || continue
        one "torch-default-pool$pool" CUHEAP_AUDIT=1 CUHEAP_POOL=$pool timeout 300 \
            python3 tests/gpu/torch_client.py default
        one "torch-nocache-pool$pool" CUHEAP_AUDIT=1 CUHEAP_POOL=$pool \
            PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 python3 tests/gpu/torch_client.py nocache
    done
    # the vmm pool's granules and PyTorch's expandable segments: what CUPTI says of VMM
    one "door-vmm" CUHEAP_AUDIT="$cupti" CUHEAP_BACKING=vmm timeout 120 "$B/audit-door"
    wanted torch && one "torch-expandable" CUHEAP_AUDIT=1 \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 300 \
        python3 tests/gpu/torch_client.py expandable
    # cost: the nocache GPT loop's step time, audit off and on
    for a in 0 1; do
        wanted torch || continue
        out=$(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_AUDIT=$a \
            CUHEAP_OUTPUT="$T/audit-cost$a-%p.jsonl" timeout 300 python3 bench/torch_gpt.py 30 2>&1)
        echo "### cost audit=$a"$'\n'"$out" >&3
        say "  cost, GPT nocache+pool, CUHEAP_AUDIT=$a: $(grep -E '^step_ms' <<<"$out" | paste -sd' ')"
    done
    exec 3>&-
}

# The memory_viz export read by PyTorch's own torch/cuda/_memory_viz.py (the module behind
# https://pytorch.org/memory_viz): a recorded GPT run under the pool, legacy and vmm.
run_viewers() {
    for backing in legacy vmm; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_BACKING=$backing CUHEAP_SUMMARY=0 \
            CUHEAP_OUTPUT="$T/viz-$backing.jsonl" timeout 300 python3 bench/torch_gpt.py 10 \
            >/dev/null 2>&1
        "$B/cuheap" memviz -o "$T/viz-$backing.pickle" "$T/viz-$backing.jsonl" 2>&1 | tail -1
        for cmd in stats trace_plot segment_plot; do
            out=$T/viz-$backing-$cmd.out
            case $cmd in
            stats) python3 -m torch.cuda._memory_viz stats "$T/viz-$backing.pickle" >"$out" 2>&1 ;;
            *) python3 -m torch.cuda._memory_viz $cmd "$T/viz-$backing.pickle" -o "$out.html" \
                >"$out" 2>&1 ;;
            esac
            say "memory_viz $cmd ($backing): exit $? $(head -c 300 "$out" | tr '\n' ' ')"
        done
    done
    # The pages come back to be opened with scripts/check-memviz-page.py --viz DIR (headless
    # Chromium, offline): trace_plot and segment_plot of each backing, and PyTorch's
    # MemoryViz.js when its install has one (wheels ship none: DIR is then a source tree's
    # torch/utils/viz/ with a d3 of the version it imports).
    mkdir -p "$OUT/memviz-pages"
    for backing in legacy vmm; do
        for cmd in trace_plot segment_plot; do
            [ -f "$T/viz-$backing-$cmd.out.html" ] &&
                cp "$T/viz-$backing-$cmd.out.html" "$OUT/memviz-pages/$backing-$cmd.html"
        done
    done
    local viz
    viz=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js"))' 2>/dev/null)
    [ -n "$viz" ] && [ -f "$viz" ] && cp "$viz" "$OUT/memviz-pages/MemoryViz.js"
    say "memory_viz pages: $(cd "$OUT/memviz-pages" && ls | tr '\n' ' ')($(du -sh "$OUT/memviz-pages" | cut -f1)); $(grep -l 'cdn.jsdelivr.net' "$OUT"/memviz-pages/*.html 2>/dev/null | wc -l) of them load MemoryViz.js from the network"
}

# Soak (issue 12; `gpu-run.sh soak`): the GPT loop for SOAK_S seconds (default 330) under
# cuheap, recording on (stacks and Python frames, the defaults), PyTorch's caching allocator
# off so every tensor goes through cuheap's pool (SOAK_CACHING=1 keeps it on); the same steps
# without cuheap run alongside on the same GPU, for the losses (bit for bit), with PyTorch's
# caching allocator on (the losses do not depend on the allocator, and raw cudaMalloc per tensor
# would make that run the slower one and outlast the call; SOAK_PLAIN_CACHING=0 turns it off). Both processes'
# resident memory is sampled every SOAK_EVERY seconds (default 5) into $OUT/soak-rss.txt; the
# trace must pass `cuheap check` with nothing dropped. One command of about SOAK_S + 90 s.
soak_rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
run_soak() {
    local secs=${SOAK_S:-330} every=${SOAK_EVERY:-5} log=$OUT/soak.log envs=() plain_envs=()
    [ "${SOAK_CACHING:-0}" = 1 ] || envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    [ "${SOAK_PLAIN_CACHING:-1}" = 1 ] || plain_envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    # steps for $secs under cuheap, from a short run with the same settings
    local cal ms steps
    cal=$(env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$T/soak-cal.jsonl" \
        timeout 300 python3 bench/torch_gpt.py 40 2>&1)
    rm -f "$T"/soak-cal.jsonl*
    ms=$(sed -n 's/^step_ms=\([0-9.]*\).*/\1/p' <<<"$cal")
    if [ -z "$ms" ]; then
        say "soak: the calibration run failed: $(tail -3 <<<"$cal" | tr '\n' ' ')"
        return
    fi
    # a quarter more than the calibration says: the 40-step calibration includes the warm-up,
    # and a 300 s plan ran 265 s on 2026-12-01 (34 ms a step against 41 calibrated)
    steps=$(python3 -c "import math; print(max(100, math.ceil($secs * 1250 / $ms)))")
    say "soak: $steps GPT steps (${ms} ms a step under cuheap: ${secs} s), caching ${SOAK_CACHING:-0} (plain run ${SOAK_PLAIN_CACHING:-1})"
    (exec env "${plain_envs[@]}" python3 bench/torch_gpt.py "$steps" >"$T/soak-plain.out" 2>&1) &
    local plain=$!
    (exec env "${envs[@]}" LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/soak.jsonl" \
        python3 bench/torch_gpt.py "$steps" >"$T/soak-cuheap.out" 2>"$T/soak-cuheap.err") &
    local with=$! t0=$SECONDS
    echo "t_s rss_kib_cuheap rss_kib_plain" >"$OUT/soak-rss.txt"
    while kill -0 $with 2>/dev/null || kill -0 $plain 2>/dev/null; do
        echo "$((SECONDS - t0)) $(soak_rss $with) $(soak_rss $plain)" >>"$OUT/soak-rss.txt"
        if ((SECONDS - t0 > 3 * secs)); then
            kill $with $plain 2>/dev/null
            say "soak: killed after $((SECONDS - t0)) s (three times the plan)"
        fi
        sleep "$every"
    done
    wait $with
    local rc_with=$?
    wait $plain
    local rc_plain=$?
    local wall=$((SECONDS - t0)) check
    check=$("$B/cuheap" check "$T/soak.jsonl" 2>&1)
    {
        echo "### calibration"$'\n'"$cal"
        echo "### with cuheap (exit $rc_with)"; grep -v '^losses' "$T/soak-cuheap.out"; cat "$T/soak-cuheap.err"
        echo "### without (exit $rc_plain)"; grep -v '^losses' "$T/soak-plain.out"
        echo "### cuheap check"$'\n'"$check"
    } >"$log"
    grep '^losses' "$T/soak-cuheap.out" >"$OUT/soak-losses-cuheap.txt"
    grep '^losses' "$T/soak-plain.out" >"$OUT/soak-losses-plain.txt"
    rm -f "$T"/soak.jsonl* # gigabytes: the check's verdict is kept, not the trace
    say "  exit: with cuheap $rc_with, without $rc_plain; $wall s"
    say "  $(grep -E '^step_ms' "$T/soak-cuheap.out") (with cuheap)"
    say "  $(grep -E '^step_ms' "$T/soak-plain.out") (without)"
    if [ -s "$OUT/soak-losses-plain.txt" ] && cmp -s "$OUT/soak-losses-plain.txt" "$OUT/soak-losses-cuheap.txt"; then
        say "  losses: identical, $(($(wc -w <"$OUT/soak-losses-plain.txt") - 1)) steps bit for bit"
    else
        say "  losses: DIFFERENT (or missing): $OUT/soak-losses-*.txt"
    fi
    say "  trace: $check"
    say "  $(grep -E '^cuheap: [0-9]+ allocations' "$T/soak-cuheap.err")"
    grep -E '^cuheap: (events were dropped|.*came after recording)' "$T/soak-cuheap.err" | sed 's/^/  /' |
        tee -a "$OUT/summary.txt"
    # resident memory: after a minute's warm-up, and at the end, each process
    awk -v every="$every" 'NR > 1 && $2 > 0 { if (!w && $1 >= 60) { w = 1; c0 = $2; p0 = $3 } if (w) { c1 = $2; if ($3 > 0) p1 = $3 } }
        END { if (w) printf "  host RSS (KiB) from 60 s to the end: with cuheap %d -> %d (%+d), without %d -> %d (%+d)\n", c0, c1, c1 - c0, p0, p1, p1 - p0;
              else print "  host RSS: the run ended before the warm-up minute" }' "$OUT/soak-rss.txt" |
        tee -a "$OUT/summary.txt"
}

# 16 threads' pairs under each build of $1 ("label=lib ..."), $2 rounds, sizes $3.
threads_side() {
    local r size lib
    for r in $(seq "$2"); do
        for size in $3; do
            for lib in $1; do
                say "threads size=$size round=$r ${lib%%=*} $(env LD_PRELOAD="${lib#*=}" \
                    CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 timeout 60 "$B/bench-alloc" threads 16 \
                    "$size" 2>&1 | tail -1)"
            done
        done
    done
}

# A short check for a session with little device time: the gpu suite under the default
# backing and policy, then this build against gpu-bundle/old/libcuheap.so when there is one
# (built from another commit): 16 threads of 512 B pairs (3 rounds) and a long GPT run with
# caching off (QUICK_STEPS, default 300; held/live and step time). Lines go to summary.txt as
# they come, so that a run cut short still reports what it did.
run_side() {
    run_tests
    local libs="new=$PRE" lib r size
    [ -f "$B/old/libcuheap.so" ] && libs="old=$B/old/libcuheap.so $libs"
    threads_side "$libs" 3 "512 2097152"
    ROUNDS=${SIDE_ROUNDS:-2} STEPS=${SIDE_STEPS:-60} FULL=0 bash bench/compare-gpt.sh "$OUT" "$libs"
    grep -E 'step_ms|fragmentation|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
}

run_steady() {
    if [ "${STEADY_TESTS:-1}" = 1 ]; then
        run_tests
        say "gpu suite: $(grep -c '^ok' "$OUT/gpu-suite.log") ok, $(grep -c '^not ok' "$OUT/gpu-suite.log") not ok"
    fi
    local libs="new=$PRE" lib w r backing out
    [ -f "$B/old/libcuheap.so" ] && libs="old=$B/old/libcuheap.so $libs"
    for r in $(seq "${STEADY_CHURN_RUNS:-2}"); do
        for w in ${STEADY_WORKLOADS:-streams alternate grow-shrink shapes}; do
            say "churn round=$r driver $(timeout 120 "$B/bench-churn" "$w" 2>&1 | tail -1)"
            for backing in vmm legacy; do
                for lib in $libs; do
                    out=$(env LD_PRELOAD="${lib#*=}" CUHEAP_BACKING=$backing CUHEAP_RECORD=0 \
                        CUHEAP_SUMMARY=0 timeout 120 "$B/bench-churn" "$w" 2>&1 | tail -1)
                    say "churn round=$r ${lib%%=*}-$backing $out"
                done
            done
        done
    done
    threads_side "$libs" 2 "512 65536"
    # STEADY_GPT_OLD=0: the GPT loop under this build alone (the old build's churn only)
    local gpt="$libs"
    [ "${STEADY_GPT_OLD:-1}" = 0 ] && gpt="new=$PRE"
    [ -f "$B/old/libcuheap.so" ] && [ "${STEADY_GPT_OLD:-1}" != 0 ] &&
        gpt="$gpt old-legacy=$B/old/libcuheap.so,CUHEAP_BACKING=legacy"
    gpt="$gpt new-legacy=$PRE,CUHEAP_BACKING=legacy new-cachingon=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    gpt="$gpt new-pluggable=,CUHEAP_PLUGGABLE=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    ROUNDS=${STEADY_ROUNDS:-2} STEPS=${STEADY_STEPS:-40} FULL=0 bash bench/compare-gpt.sh "$OUT" "$gpt"
    grep -E 'step_ms|fragmentation|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
}

run_quick() {
    LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/gpu-quick-%p.jsonl" timeout 120 "$B/test-gpu" \
        >"$OUT/gpu-suite.log" 2>&1
    say "gpu suite (default backing and policy): exit $?, $(grep -c '^ok' "$OUT/gpu-suite.log") ok, $(grep -c '^not ok' "$OUT/gpu-suite.log") not ok"
    grep -E '^# (race|oom):' "$OUT/gpu-suite.log" | tee -a "$OUT/summary.txt"
    local libs="new=$PRE" lib r
    [ -f "$B/old/libcuheap.so" ] && libs="old=$B/old/libcuheap.so $libs"
    for r in 1 2 3; do
        for lib in $libs; do
            say "threads round=$r ${lib%%=*} $(env LD_PRELOAD="${lib#*=}" CUHEAP_RECORD=0 \
                CUHEAP_SUMMARY=0 timeout 60 "$B/bench-alloc" threads 16 512 2>&1 | tail -1)"
        done
    done
    ROUNDS=1 STEPS=${QUICK_STEPS:-300} FULL=0 bash bench/compare-gpt.sh "$OUT" "$libs"
    grep -E 'step_ms|fragmentation|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
}

# Where the time goes, this build against the other builds in the bundle (gpu-bundle/NAME/
# libcuheap.so, labelled NAME: built from another commit or with another setting): a sampled
# profile of 16 threads of 512 B pairs (threads-profile.txt: object+offset, named here with
# addr2line on the bundle's libcuheap.so), the threads' ratio per build and for
# CUHEAP_REUSE=immediate (PROFILE_THREAD_ROUNDS rounds), a first-lap recording microbenchmark
# (events, no stacks: the allocating thread's page faults), then the GPT loop per build in
# PROFILE_GPT_LIBS (default all) under PROFILE_MODES (default "norecord events full";
# PROFILE_ROUNDS rounds of PROFILE_STEPS steps), and one run with CUHEAP_RECORD_TIMING.
run_profile() {
    BENCH_PROFILE=1 BENCH_PAIRS=${PROFILE_PAIRS:-1000000} LD_PRELOAD=$PRE CUHEAP_RECORD=0 \
        CUHEAP_SUMMARY=0 timeout 120 "$B/bench-alloc" threads 16 512 >"$OUT/threads-profile.txt" 2>&1
    grep -E '^profile-object|^config' "$OUT/threads-profile.txt" | tee -a "$OUT/summary.txt"
    local libs="new=$PRE" lib r d
    for d in "$B"/*/libcuheap.so; do
        [ -f "$d" ] && libs="$(basename "$(dirname "$d")")=$d $libs"
    done
    for ((r = 1; r <= ${PROFILE_THREAD_ROUNDS:-2}; r++)); do
        for lib in $libs "immediate=$PRE CUHEAP_REUSE=immediate"; do
            set -- ${lib#*=}
            say "threads round=$r ${lib%%=*} $(env LD_PRELOAD="$1" "${@:2}" CUHEAP_RECORD=0 \
                CUHEAP_SUMMARY=0 timeout 60 "$B/bench-alloc" threads 16 512 2>&1 | tail -1)"
        done
        for lib in $libs; do
            say "events-first-lap round=$r ${lib%%=*} $(env LD_PRELOAD="${lib#*=}" \
                CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$T/fl-%p.jsonl" \
                BENCH_PAIRS=2000 timeout 60 "$B/bench-alloc" sync 512 2>&1 | tail -1)"
            rm -f "$T"/fl-*
        done
    done
    local gpt_libs=""
    for lib in $libs; do
        [[ " ${PROFILE_GPT_LIBS:-${lib%%=*}} " == *" ${lib%%=*} "* ]] && gpt_libs="$gpt_libs $lib"
    done
    ROUNDS=${PROFILE_ROUNDS:-2} STEPS=${PROFILE_STEPS:-40} \
        MODES=${PROFILE_MODES:-norecord events full} bash bench/compare-gpt.sh "$OUT" "$gpt_libs"
    grep -E 'step_ms|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_RECORD_TIMING=1 CUHEAP_SUMMARY=1 \
        CUHEAP_OUTPUT="$T/timing-%p.jsonl" timeout 200 python3 bench/torch_gpt.py \
        "${PROFILE_STEPS:-40}" 2>&1 | grep -E 'recording cost|^step_ms' | tee -a "$OUT/summary.txt"
}

# Recording's cost within one process (bench/torch_gpt.py GPT_TOGGLE: recording paused and
# resumed every TOGGLE_EVERY steps, TOGGLE_STEPS steps): full recording and events only, with
# PyTorch's caching off and on, TOGGLE_RUNS runs each; losses must match a run without cuheap.
run_toggle() {
    local r cfg base
    base=$(timeout 200 python3 bench/torch_gpt.py "${TOGGLE_STEPS:-125}" 2>&1 | grep -m1 '^losses' | md5sum)
    for ((r = 1; r <= ${TOGGLE_RUNS:-3}; r++)); do
        for cfg in nocache-full nocache-events caching-full; do
            set -- CUHEAP_SUMMARY=0
            [[ $cfg == nocache-* ]] && set -- "$@" PYTORCH_NO_CUDA_MEMORY_CACHING=1
            [[ $cfg == *-events ]] && set -- "$@" CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0
            local out
            out=$(env "$@" LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/toggle-%p.jsonl" \
                GPT_TOGGLE=${TOGGLE_EVERY:-5} timeout 200 python3 bench/torch_gpt.py \
                "${TOGGLE_STEPS:-125}" 2>&1)
            local same=different
            [ "$(grep -m1 '^losses' <<<"$out" | md5sum)" = "$base" ] && same=identical
            say "toggle run=$r config=$cfg $(grep -m1 '^toggle' <<<"$out") losses=$same"
            rm -f "$T"/toggle-*
        done
    done
}

# The hot path, this build against the other builds in the bundle (gpu-bundle/NAME/): per
# round (HOT_ROUNDS, default 3), cudaMallocAsync's warm pool and each build at 512 B, 2 MiB
# and 20 MiB on one thread, then 16 threads of pairs against one (HOT_THREAD_SIZES, default
# 512; HOT_THREAD_PAIRS pairs a thread, default 100000: about 10 ms, where a thread started late or a neighbour's burst
# weighs on the wall clock); then a sampled profile of this build's 16 threads
# (threads-profile.txt).
run_hot() {
    local libs="new=$PRE" lib r d
    for d in "$B"/*/libcuheap.so; do
        [ -f "$d" ] && libs="$(basename "$(dirname "$d")")=$d $libs"
    done
    for ((r = 1; r <= ${HOT_ROUNDS:-3}; r++)); do
        # every other round the builds run in the other order: the host favours whichever
        # runs first after a pause (2026-12-02)
        libs=$(tr ' ' '\n' <<<"$libs" | grep . | tac | tr '\n' ' ')
        say "hot round=$r cudaMallocAsync $(timeout 60 "$B/bench-alloc" async 512 2097152 20971520 2>&1 |
            sed -n 's/.*case=\([0-9]*\) ns_per_pair=\([0-9.]*\).*/\1:\2/p' | tr '\n' ' ')"
        for lib in $libs; do
            say "hot round=$r ${lib%%=*} $(env LD_PRELOAD="${lib#*=}" CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 \
                timeout 60 "$B/bench-alloc" sync 512 2097152 20971520 2>&1 |
                sed -n 's/.*case=\([0-9]*\) ns_per_pair=\([0-9.]*\).*/\1:\2/p' | tr '\n' ' ')"
        done
        for lib in $libs; do
            say "threads round=$r ${lib%%=*} $(env LD_PRELOAD="${lib#*=}" CUHEAP_RECORD=0 \
                CUHEAP_SUMMARY=0 BENCH_PAIRS=${HOT_THREAD_PAIRS:-100000} timeout 120 \
                "$B/bench-alloc" threads 16 ${HOT_THREAD_SIZES:-512} 2>&1 | grep '^config' | tr '\n' ' ')"
        done
    done
    BENCH_PROFILE=1 BENCH_PAIRS=${PROFILE_PAIRS:-1000000} LD_PRELOAD=$PRE CUHEAP_RECORD=0 \
        CUHEAP_SUMMARY=0 timeout 120 "$B/bench-alloc" threads 16 512 >"$OUT/threads-profile.txt" 2>&1
    grep -E '^profile-object|^config' "$OUT/threads-profile.txt" | tee -a "$OUT/summary.txt"
}

# One build, several settings (GPT_SETTINGS: "label=VAR=value,VAR=value ..."; default: the
# vmm cushion from 2 MiB to 256 MiB, and the legacy backing), SETTINGS_ROUNDS interleaved
# rounds of SETTINGS_STEPS steps, after the gpu suite once under the default settings.
# SETTINGS_LIBS adds other builds in compare-gpt.sh's form ("label=path,VAR=value ...").
run_settings() {
    LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/gpu-settings-%p.jsonl" timeout 120 "$B/test-gpu" \
        >"$OUT/gpu-suite.log" 2>&1
    say "gpu suite (default settings): exit $?, $(grep -c '^ok' "$OUT/gpu-suite.log") ok, $(grep -c '^not ok' "$OUT/gpu-suite.log") not ok"
    local libs="" s
    for s in ${GPT_SETTINGS:-c2=CUHEAP_VMM_CUSHION=2M c16=CUHEAP_VMM_CUSHION=16M \
        c64=CUHEAP_VMM_CUSHION=64M c256=CUHEAP_VMM_CUSHION=256M legacy=CUHEAP_BACKING=legacy}; do
        libs="$libs ${s%%=*}=$PRE,${s#*=}"
    done
    libs="$libs ${SETTINGS_LIBS:-}"
    ROUNDS=${SETTINGS_ROUNDS:-3} STEPS=${SETTINGS_STEPS:-100} MODES=norecord \
        bash bench/compare-gpt.sh "$OUT" "$libs"
    grep -E 'step_ms|fragmentation|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
}

# the GPT loop with an evaluation every GPT_EVAL steps (default 10; its logits kept until the
# next), EVAL_ROUNDS rounds of: the caching allocator, caching off + cuheap, cuheap as the
# pluggable allocator; losses and evaluation losses must be the same everywhere
run_eval() {
    local r name out
    for ((r = 0; r < ${EVAL_ROUNDS:-2}; r++)); do
        for name in caching cuheap pluggable; do
            case $name in
            caching) set -- ;;
            cuheap) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE ;;
            pluggable) set -- CUHEAP_PLUGGABLE=$PRE ;;
            esac
            out=$(env "$@" GPT_EVAL=${GPT_EVAL:-10} CUHEAP_RECORD=0 timeout 300 \
                python3 bench/torch_gpt.py "${EVAL_STEPS:-80}" 2>&1)
            say "round=$r config=$name $(grep step_ms <<<"$out")"
            grep -E "cuheap: GPU 0: vmm" <<<"$out" | sed "s/^/round=$r config=$name /" |
                tee -a "$OUT/summary.txt"
            say "round=$r config=$name losses_md5=$(grep '^losses' <<<"$out" | md5sum | cut -c1-12)" \
                "eval_md5=$(grep '^eval_losses' <<<"$out" | md5sum | cut -c1-12)"
        done
    done
}

run_churn() {
    local w b lib
    for w in ${CHURN_WORKLOADS:-streams streams alternate grow-shrink}; do
        say "churn $w driver $("$B/bench-churn" "$w" | sed 's/threads=[0-9]* allocs=[0-9]* //')"
        for b in old new; do
            lib=$PRE
            [ $b = old ] && lib=$B/old/libcuheap.so
            say "churn $w $b $(LD_PRELOAD=$lib CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 "$B/bench-churn" "$w" |
                sed 's/threads=[0-9]* allocs=[0-9]* //')"
        done
    done
    # an old build may have a step plan: off, as this build has none
    GPT_SETTINGS="plug=CUHEAP_PLUGGABLE=$PRE" \
        SETTINGS_LIBS="new=$PRE old=$B/old/libcuheap.so,CUHEAP_STEP_PLAN=0" SETTINGS_ROUNDS=${SETTINGS_ROUNDS:-2} \
        SETTINGS_STEPS=${SETTINGS_STEPS:-40} run_settings
    EVAL_ROUNDS=${EVAL_ROUNDS:-1} EVAL_STEPS=${EVAL_STEPS:-60} run_eval
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPT_EVAL=10 LD_PRELOAD=$PRE CUHEAP_POOL=0 CUHEAP_STACK_DEPTH=0 \
        CUHEAP_PYTHON=0 CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$T/gpt-seq-eval.jsonl" \
        timeout 120 python3 bench/torch_gpt.py 60 >"$T/gpt-seq-eval.log" 2>&1
    gzip -9 -c "$T/gpt-seq-eval.jsonl" >"$OUT/gpt-seq-eval.jsonl.gz"
    rm -f "$T/gpt-seq-eval.jsonl"
    say "recorded gpt-seq-eval: $(zcat "$OUT/gpt-seq-eval.jsonl.gz" | grep -c '"event":"alloc"') allocations"
}

run_warm() {
    local r w out
    LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/gpu-warm-%p.jsonl" timeout 120 \
        "$B/test-gpu" >"$OUT/gpu-suite-warm.log" 2>&1
    say "gpu suite: exit $?, $(grep -c '^ok' "$OUT/gpu-suite-warm.log") ok," \
        "$(grep -c '^not ok' "$OUT/gpu-suite-warm.log") not ok"
    local libs="cuheap=$PRE"
    libs="$libs cachingon=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    libs="$libs pluggable=,CUHEAP_PLUGGABLE=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    ROUNDS=${WARM_ROUNDS:-2} STEPS=${WARM_STEPS:-60} FULL=0 bash bench/compare-gpt.sh "$OUT" "$libs"
    grep -E 'step_ms|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
    for ((r = 0; r < ${WARM_ROUNDS:-2}; r++)); do
        out=$(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 300 \
            python3 bench/torch_gpt.py "${WARM_STEPS:-60}" 2>&1)
        say "round=$r config=expandable $(grep step_ms <<<"$out")" \
            "losses_md5=$(grep -m1 '^losses' <<<"$out" | md5sum | cut -c1-12)"
    done
    EVAL_ROUNDS=1 EVAL_STEPS=${WARM_STEPS:-60} run_eval
    for w in streams alternate grow-shrink; do
        say "churn $w cuheap $(LD_PRELOAD=$PRE CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 \
            timeout 120 "$B/bench-churn" "$w" | sed 's/threads=[0-9]* allocs=[0-9]* //')"
    done
}

run_sites() {
    local out r
    out=$(PYTORCH_NO_CUDA_MEMORY_CACHING=0 LD_PRELOAD=$PRE CUHEAP_OUTPUT="$T/cachingon.jsonl" \
        timeout 200 python3 bench/torch_gpt.py "${SITES_STEPS:-20}" 2>&1)
    say "cachingon recorded $(grep step_ms <<<"$out")"
    grep -E '^cuheap: GPU 0: peak' <<<"$out" | tee -a "$OUT/summary.txt"
    "$B/cuheap" top -n 15 --by peak "$T/cachingon.jsonl" >"$OUT/cachingon-top.txt" 2>&1
    "$B/cuheap" report "$T/cachingon.jsonl" >"$OUT/cachingon-report.txt" 2>&1
    for ((r = 0; r < ${PAIR_ROUNDS:-3}; r++)); do
        say "pairs round=$r driver $(timeout 60 "$B/bench-alloc" sync 512 2097152 20971520 2>&1 |
            grep '^config' | tr '\n' ' ')"
        say "pairs round=$r cuheap $(LD_PRELOAD=$PRE CUHEAP_RECORD=0 \
            CUHEAP_SUMMARY=0 timeout 60 "$B/bench-alloc" sync 512 2097152 20971520 2>&1 |
            grep '^config' | tr '\n' ' ')"
    done
}

# A GPT loop whose batches vary in length (GPT_VARLEN=1: sizes change nearly every step), as
# compare-gpt.sh runs it, interleaved: the caching allocator, expandable segments, the driver
# alone (caching off), caching off + cuheap, caching on + cuheap,
# cuheap as the pluggable allocator; then bench-churn's shapes under the driver, vmm, legacy.
run_shapes() {
    local cfg="driver=,PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    cfg="$cfg expandable=,PYTORCH_NO_CUDA_MEMORY_CACHING=0,PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    cfg="$cfg cuheap=$PRE"
    cfg="$cfg cachingon=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    cfg="$cfg pluggable=,CUHEAP_PLUGGABLE=$PRE,PYTORCH_NO_CUDA_MEMORY_CACHING=0"
    ROUNDS=${SHAPES_ROUNDS:-2} STEPS=${SHAPES_STEPS:-60} FULL=0 bash bench/compare-gpt.sh "$OUT" \
        "$cfg" GPT_VARLEN=1
    grep -E 'step_ms|fragmentation|vmm:|losses_md5' "$OUT/compare.log" | tee -a "$OUT/summary.txt"
    say "churn shapes driver $(timeout 120 "$B/bench-churn" shapes | sed 's/threads=[0-9]* //')"
    for b in vmm legacy; do
        say "churn shapes $b $(LD_PRELOAD=$PRE CUHEAP_BACKING=$b CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 \
            timeout 120 "$B/bench-churn" shapes | sed 's/threads=[0-9]* //')"
    done
    record_varlen
}

# The varying-length loop's allocations recorded (the driver serving them) for bench-replay:
# bench/sequences/gpt-seq-varlen.jsonl.gz.
record_varlen() {
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPT_VARLEN=1 LD_PRELOAD=$PRE CUHEAP_POOL=0 \
        CUHEAP_STACK_DEPTH=0 CUHEAP_PYTHON=0 CUHEAP_SUMMARY=0 CUHEAP_OUTPUT="$T/gpt-seq-varlen.jsonl" \
        timeout 120 python3 bench/torch_gpt.py 60 >"$T/gpt-seq-varlen.log" 2>&1
    gzip -9 -c "$T/gpt-seq-varlen.jsonl" >"$OUT/gpt-seq-varlen.jsonl.gz"
    rm -f "$T/gpt-seq-varlen.jsonl"
    say "recorded gpt-seq-varlen: $(zcat "$OUT/gpt-seq-varlen.jsonl.gz" | grep -c '"event":"alloc"') allocations"
}

# cuheap's own time in situ: the step under the caching allocator and under cuheap, in turn,
# OWN_ROUNDS times, for the GPT loop and the mixture-of-experts loop; under cuheap its own time a
# warm step and its driver calls by kind (torch_gpt.py's and jobcommon.py's own_* words) and the
# verbose summary's lines; the losses must match the caching allocator's
run_own() {
    local r name job out
    for ((r = 0; r < ${OWN_ROUNDS:-5}; r++)); do
        for job in gpt moe; do
            for name in caching cuheap; do
                case $name in
                caching) set -- ;;
                cuheap) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE ;;
                esac
                if [ $job = gpt ]; then
                    out=$(env "$@" CUHEAP_RECORD=0 CUHEAP_VERBOSE=1 timeout 300 \
                        python3 bench/torch_gpt.py "${OWN_STEPS:-60}" 2>&1)
                else
                    out=$(env "$@" CUHEAP_RECORD=0 CUHEAP_VERBOSE=1 JOB_STEPS=${OWN_STEPS:-60} \
                        timeout 300 python3 bench/jobs/moe_train.py 2>&1)
                fi
                say "round=$r job=$job config=$name $(grep -E '^(step_ms|job)=' <<<"$out")"
                grep -E "cuheap: (own time|the pool's driver calls)" <<<"$out" |
                    sed "s/^/round=$r job=$job config=$name /" | tee -a "$OUT/summary.txt"
                say "round=$r job=$job config=$name losses_md5=$(grep -E '^(losses|outputs)' <<<"$out" |
                    md5sum | cut -c1-12)"
            done
        done
    done
}

# The pool's two layouts against PyTorch's allocators, in LAYOUT_ROUNDS (3) interleaved rounds
# (each round starts one configuration later): the GPT loop and the MoE loop (LAYOUT_STEPS
# steps, 60) under the caching allocator, expandable segments, and cuheap (caching off) with its
# tight layout (the default), the aligned one (8 MiB pieces) and aligned 16 MiB pieces. Each
# line: the step, peak reserved, mapping operations and cuheap's own time a step, the losses'
# md5 (the same everywhere). LAYOUT_CONFIGS picks and orders them; tight-old is the tight layout
# of a build to compare, put in gpu-bundle/old/.
run_layouts() {
    local r i k name job out configs
    read -r -a configs <<<"${LAYOUT_CONFIGS:-caching expandable tight aligned8 aligned16}"
    for ((r = 0; r < ${LAYOUT_ROUNDS:-3}; r++)); do
        for job in gpt moe; do
            for ((k = 0; k < ${#configs[@]}; k++)); do
                i=$(((k + r) % ${#configs[@]}))
                name=${configs[$i]}
                case $name in
                caching) set -- ;;
                expandable) set -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
                tight) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE ;;
                tight-old) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$B/old/libcuheap.so ;;
                aligned8) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE CUHEAP_VMM_LAYOUT=aligned ;;
                aligned16) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE \
                    CUHEAP_VMM_LAYOUT=aligned CUHEAP_VMM_CHUNK=16M ;;
                first-fit) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE \
                    CUHEAP_VMM_PLACEMENT=first-fit ;;
                scored) set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE \
                    CUHEAP_VMM_PLACEMENT=scored ;;
                *:*) # LABEL:VAR=VALUE,...: this build, caching off, under those settings
                    local extra
                    IFS=, read -r -a extra <<<"${name#*:}"
                    set -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PRE "${extra[@]}" ;;
                esac
                if [ $job = gpt ]; then
                    out=$(env "$@" CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 timeout 200 \
                        python3 bench/torch_gpt.py "${LAYOUT_STEPS:-60}" 2>&1)
                else
                    out=$(env "$@" CUHEAP_RECORD=0 CUHEAP_SUMMARY=0 JOB_STEPS=${LAYOUT_STEPS:-60} \
                        timeout 200 python3 bench/jobs/moe_train.py 2>&1)
                fi
                say "layouts round=$r job=$job config=$name $(grep -E '^(step_ms|job)=' <<<"$out" |
                    head -1) losses_md5=$(grep -E '^(losses|outputs)' <<<"$out" | md5sum | cut -c1-12)"
            done
        done
    done
}

case $what in
own) run_own ;;
layouts) run_layouts ;;
shapes) run_shapes ;;
record-varlen) record_varlen ;;
sites) run_sites ;;
warm) run_warm ;;
churn) run_churn ;;
settings) run_settings ;;
eval) run_eval ;;
tests) run_tests ;;
hot) run_hot ;;
toggle) run_toggle ;;
profile) run_profile ;;
quick) run_quick ;;
side) run_side ;;
steady) run_steady ;;
ipc) run_ipc ;;
audit) run_audit ;;
viewers) run_viewers ;;
record) run_record ;;
soak) run_soak ;;
clients) run_clients ;;
bench) bash bench/run-gpu.sh "$B" "$OUT" "$T" ;;
all)
    run_tests
    run_clients
    bash bench/run-gpu.sh "$B" "$OUT" "$T"
    ;;
*)
    echo "usage: gpu-run.sh own|layouts|shapes|record-varlen|sites|warm|tests|clients|bench|record|audit|viewers|ipc|soak|quick|side|profile|toggle|hot|settings|steady|eval|churn|all" >&2
    exit 2
    ;;
esac
tar -C "$T" -czf "$OUT/traces.tar.gz" . 2>/dev/null
say "== done $(date -u +%FT%TZ)"
