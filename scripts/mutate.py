#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Mutation testing: break cuheap on purpose, one promise at a time, and check that the tests
notice.

Each mutation below is a documented breakage of a rule a user relies on (a freed block is not
reused before the GPU is done with it, every door reaches the hooks, every call leaves its
event, ...), written as an exact text replacement in one source file. For each one the script
applies it to a private copy of the tree, rebuilds, runs the unit and integration suites, and
records which tests failed. A mutation no test catches is a hole in the tests; a mutation whose
text is no longer in the source is stale and must be updated with the code it breaks.

usage: scripts/mutate.py [--only ID[,ID...]] [--report tests/MUTATIONS.md] [--keep]
With --only, the rows run replace theirs in an existing report (new ones are added at the
end of its table) and the rest of it stays; without, the report is written anew.
Exit status: 0 when every mutation was caught, 1 otherwise.
"""
import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, what breaks, the rule it breaks, file, text, replacement)
MUTATIONS = [
    ("fence-skips-non-blocking",
     "fence events recorded only on the legacy stream, not on non-blocking streams",
     "reuse waits for every stream", "src/backend_cuda.c",
     "            r = record_on(f, streams[i].stream);", "            (void)0;"),
    ("fence-skips-legacy",
     "fence events recorded only on non-blocking streams, not on the legacy stream (which orders "
     "blocking and per-thread default streams)",
     "reuse waits for every stream", "src/backend_cuda.c",
     "    int r = record_on(f, CU_STREAM_LEGACY);", "    int r = 0;"),
    ("fence-query-first-event",
     "fence completion checked only on the legacy stream's event",
     "reuse waits for every stream", "src/backend_cuda.c",
     "    for (unsigned i = 0; i < f->nr; i++) {\n        CUresult r;\n"
     "        DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuEventQuery",
     "    for (unsigned i = 0; i < f->nr && i < 1; i++) {\n        CUresult r;\n"
     "        DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuEventQuery"),
    ("priority-stream-unregistered",
     "streams created with a priority not registered for fences",
     "reuse waits for every stream", "src/hooks.c",
     "    CUresult r = cuheap_drv.cuStreamCreateWithPriority(ph, flags, prio);\n    if (active)",
     "    CUresult r = cuheap_drv.cuStreamCreateWithPriority(ph, flags, prio);\n    if (0)"),
    ("reuse-before-fence",
     "freed blocks given back without asking whether their fence completed",
     "reuse waits for the fence", "src/pool/fence.c",
     "        if (fence_passed(p, e->fence) <= 0)\n            break;",
     "        if (0)\n            break;"),
    ("tc-reap-skips-fence",
     "a thread cache's closed batch becomes ready without asking whether its fence passed",
     "reuse waits for the fence", "src/pool/tcache.c",
     "        if (!b->passed && fence_passed(p, b->fence) <= 0)\n            break;",
     "        if (0)\n            break;"),
    ("idle-check-skips-non-blocking",
     "the question whether every stream is idle asks only the legacy stream, not the "
     "non-blocking streams",
     "reuse waits for every stream", "src/backend_cuda.c",
     "                DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuStreamQuery(streams[i].stream));",
     "                r = CUDA_SUCCESS;"),
    ("idle-check-answers-itself",
     "the pool takes every stream for idle without asking the driver",
     "reuse waits for every stream", "src/pool/fence.c",
     "    bool idle = dev_streams_idle(p) == 1;", "    bool idle = true;"),
    ("idle-check-while-capturing",
     "the pool asks whether the streams are idle while a stream captures",
     "a capture's graph gets no node of cuheap's, and no call that ends it", "src/pool/fence.c",
     "    if (!open_epoch(p)->nr_blocks || p->nr_capturing || !idle_now(p))",
     "    if (!open_epoch(p)->nr_blocks || !idle_now(p))"),
    ("legacy-grows-past-pending",
     "under legacy, an allocation that finds no free block takes a new arena while blocks "
     "wait behind fences",
     "memory held stays close to what is used (legacy)", "src/pool/pool.c",
     "            if (p->ep_head != p->ep_tail && wait_oldest_locked(p))\n                continue;\n            waited_in_vain = true;",
     "            waited_in_vain = true;"),
    ("legacy-waits-only-for-as-much",
     "under legacy, an allocation that finds no free block waits for fenced blocks only while "
     "they hold as much as it asks for (a smaller one beside a free piece is not waited for)",
     "memory held stays close to what is used (legacy)", "src/pool/pool.c",
     "        if (!waited_in_vain && p->st.pending && !p->nr_capturing &&",
     "        if (!waited_in_vain && p->st.pending >= 1ull << order && !p->nr_capturing &&"),
    ("legacy-arenas-double",
     "a new legacy arena is as large as what the pool holds already (the pool doubles)",
     "memory held stays close to what is used (legacy)", "src/pool/arena.c",
     "    uint64_t step = p->st.reserved / CUHEAP_LEGACY_GROWTH;",
     "    uint64_t step = p->st.reserved;"),
    ("legacy-grows-by-a-quarter",
     "a new legacy arena is a quarter of what the pool holds, not a sixteenth",
     "memory held stays close to what is used (legacy)", "src/pool/arena.c",
     "#define CUHEAP_LEGACY_GROWTH 16", "#define CUHEAP_LEGACY_GROWTH 4"),
    ("legacy-arenas-at-once",
     "under legacy, threads that miss at once each take an arena of their own",
     "memory held stays close to what is used (legacy)", "src/pool/arena.c",
     "    if (p->mapping) {\n        while (p->mapping)\n            pool_wait(&p->mapped, p);\n        return 0; /* the caller looks again */\n    }",
     "    while (p->mapping)\n        pool_wait(&p->mapped, p);"),
    ("legacy-first-fit-arena",
     "under legacy, a block is taken from the first arena with room, splitting a large piece "
     "while a small one that fits is free in another",
     "memory held stays close to what is used (legacy)", "src/pool/place.c",
     "    unsigned first = p->vmm ? p->hint : best_fit_arena_locked(p, order);",
     "    unsigned first = p->hint;\n    (void)best_fit_arena_locked;"),
    ("legacy-grows-over-room",
     "under legacy, an allocation takes a new arena although blocks that came back while the "
     "pool's lock was dropped (a poll, a wait) left room for it",
     "memory held stays close to what is used (legacy)", "src/pool/pool.c",
     "        if (room_for_locked(p, size))\n            continue;",
     "        (void)room_for_locked;"),
    ("tc-keeps-whole-setting",
     "each thread's cache keeps CUHEAP_THREAD_CACHE bytes of ready blocks however few bytes "
     "the job keeps live",
     "memory held stays close to what is used (thread caches)", "src/pool/tcache.c",
     "    return share < p->tc_bytes ? share : p->tc_bytes;",
     "    return p->tc_bytes;"),
    ("peak-reserved-misses-growth",
     "the peak of reserved bytes is not raised when the pool grows or the driver grants a "
     "pass-through allocation",
     "the summary and the stats report what the pool held", "src/runtime.c",
     "        raise_peak(&d->peak_reserved, atomic_load_explicit(&d->reserved, memory_order_relaxed));",
     "        (void)0;"),
    ("timeline-skips-fence",
     "a thread's kept large block counts its timeline fence as passed without asking the driver",
     "reuse waits for the fence", "src/pool/timeline.c",
     "        } else if (fence_passed(p, *slot) <= 0) {",
     "        } else if (0) {"),
    ("timeline-ticket-too-early",
     "a large block a thread keeps takes the ticket of the fence begun before its free, so a "
     "fence recorded before the free lets it be reused",
     "reuse waits for a fence recorded after the free", "src/pool/timeline.c",
     "tc->large_ticket = tl_ticket(&p->tl);",
     "tc->large_ticket = tl_ticket(&p->tl) ? tl_ticket(&p->tl) - 1 : 0;"),
    ("timeline-records-while-capturing",
     "a thread waiting for its kept large block records a timeline fence while a stream captures",
     "a capture's graph gets no node of cuheap's", "src/pool/timeline.c",
     "            if (__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))\n                break;\n            if (tl_try_enter(tl)) {",
     "            if (tl_try_enter(tl)) {"),
    ("timeline-not-settled-by-trim",
     "a trim leaves the fences of threads' kept large blocks unwaited for and held",
     "a trim gives back everything nothing uses", "src/pool/life.c",
     "    tl_settle(p); /* as the pool's epochs are waited for below */",
     "    if (0)\n        tl_settle(p);"),
    ("tc-large-kept-past-other-order",
     "a thread keeps its large block when it asks the pool for a large block the kept one "
     "cannot serve (another size class)",
     "memory held stays close to what is used (thread caches)", "src/pool/tcache.c",
     "    if (!fits && tc_large_give_locked(p, tc))",
     "    if (!fits && false && tc_large_give_locked(p, tc))"),
    ("chunk-maps-over-mapped",
     "a new chunk's run (tight layout) reaches over granules that are mapped already",
     "physical memory is mapped only where none is", "src/pool/acquire.c",
     "        while (end < last && !a->granules[end + 1].chunk && end + 1 - g < most)",
     "        while (end < last && end + 1 - g < most)"),
    ("tc-free-straight-to-ready",
     "a free into a thread cache under the fence policy makes its block ready at once",
     "reuse waits for the fence", "src/pool/tcache.h",
     "    if (p->cfg->reuse != CUHEAP_REUSE_IMMEDIATE || (p->vmm && a->extent[u] < size) ||",
     "    if ((p->vmm && a->extent[u] < size) ||"),
    ("fence-frees-at-once",
     "a free under the fence policy returns its block at once",
     "reuse waits for the fence", "src/pool/pool.c",
     "    } else {\n        pend_locked(p, a, ptr, block);",
     "    } else {\n        return_block_locked(p, a, ptr);"),
    ("vmm-peer-not-granted",
     "vmm: cuCtxEnablePeerAccess is passed to the driver but the pool's chunks never get access "
     "for the peer",
     "pooled memory behaves as cudaMalloc memory (pool v2)", "src/hooks.c",
     "    cuheap_backend_cuda_add_peer(owner, accessor);", "    (void)owner;"),
    ("vmm-small-block-in-large-idle-chunk",
     "vmm: the place score ignores idle chunks larger than the block, so a small block keeps a "
     "large chunk busy",
     "memory held stays close to what is used (pool v2)", "src/pool/place.c",
     "        if (c->nr_busy || (c->nr <= fits && !aligned))",
     "        if (c->nr_busy || (c->nr <= fits && !aligned) || 1)"),
    ("vmm-budget-counts-pending",
     "vmm: the pool's budget counts granules held by blocks waiting for a fence as needed, so "
     "every late fence raises how much the pool may hold",
     "memory held stays close to what is used (pool v2)", "src/pool/internal.h",
     "    return held > p->pending_mapped ? held - p->pending_mapped : 0;",
     "    return held;"),
    ("vmm-ipc-ignores-buffer-id",
     "vmm: a shared block's handle is answered by address only, so a freed (or reused) block's "
     "memory goes to the importer",
     "IPC never shares the wrong bytes (pool v2)", "src/pool/phys.c",
     "        __atomic_load_n(&a->buffer_id[unit_of(a, block)], __ATOMIC_RELAXED) != buffer_id)",
     "        0)"),
    ("fence-wait-holds-pool-lock",
     "the pool lock stays held while a thread waits for a fence",
     "no lock held while waiting on the GPU", "src/pool/fence.c",
     "    p->st.nr_waits++;\n    pool_unlock(p);\n    bool passed = dev_fence_wait(p, fence) == 0;\n    if (!passed)\n        passed = dev_device_sync(p) == 0;\n    uint64_t waited = mono_ns() - t0; /* not the wait for the lock: other threads' mapping */\n    pool_lock(p);",
     "    p->st.nr_waits++;\n    bool passed = dev_fence_wait(p, fence) == 0;\n    if (!passed)\n        passed = dev_device_sync(p) == 0;\n    uint64_t waited = mono_ns() - t0; /* not the wait for the lock: other threads' mapping */"),
    ("chunk-release-failure-forgotten",
     "vmm: memory the driver refused to release is dropped from the pool's count",
     "memory the driver still holds stays counted", "src/pool/phys.c",
     "    if (ok) {\n        p->st.reserved -= bytes;",
     "    if (ok || 1) {\n        p->st.reserved -= bytes;"),
    ("vmm-granule-moves-while-pending",
     "vmm: a freed block lets go of its granules at the free, not when its fence has passed, so "
     "an idle granule can be moved away while queued work still uses it",
     "reuse waits for the fence (pool v2)", "src/pool/pool.c",
     "    } else {\n        pend_locked(p, a, ptr, block);",
     "    } else {\n        if (p->vmm)\n            unuse_granules_locked(p, a, ptr);\n"
     "        pend_locked(p, a, ptr, block);"),
    ("sync-fallback-under-lock",
     "when no fence can be recorded, the device sync that replaces it runs with the pool's lock "
     "held, so every other thread's allocation waits for the GPU too",
     "no lock held while waiting on the GPU", "src/pool/fence.c",
     "        pool_unlock(p);\n        int synced = dev_device_sync(p);\n"
     "        pool_lock(p);\n        struct cuheap_syncing **at",
     "        int synced = dev_device_sync(p);\n        struct cuheap_syncing **at"),
    ("vmm-maps-after-wait-without-looking",
     "vmm: a thread that waited for a fence (the pool's lock dropped) maps the granules it chose "
     "before the wait, over one another thread's block mapped meanwhile (the race CI's ASan "
     "run found once)",
     "memory held stays close to what is used (pool v2)", "src/pool/acquire.c",
     "            if (waiting && p->st.pending >= granule_bytes(p) && !acq->waited_in_vain)\n"
     "                return MAP_WAIT;",
     "            if (waiting && p->st.pending >= granule_bytes(p) && !acq->waited_in_vain) {\n"
     "                wait_oldest_locked(p);\n                continue;\n            }"),
    ("aligned-piece-not-cut",
     "vmm, CUHEAP_VMM_LAYOUT=aligned: a block of a piece or more maps its last piece whole, "
     "past its bytes (a 20 MiB block holds 24 MiB)",
     "memory held stays close to what is used (pool v2)", "src/pool/acquire.c",
     "        if ((owns || only_needed) && piece_end > last)",
     "        if (((owns && false) || only_needed) && piece_end > last)"),
    ("aligned-idle-piece-avoided",
     "vmm, CUHEAP_VMM_LAYOUT=aligned: placement avoids idle pieces larger than the block, as "
     "under tight, so small blocks go where nothing is mapped and pieces move for them",
     "memory held stays close to what is used (pool v2)", "src/pool/place.c",
     "        else if (aligned)\n            idle += end - g + 1;",
     "        else if (aligned)\n            bad += end - g + 1;"),
    ("aligned-whole-piece-near-limit",
     "vmm, CUHEAP_VMM_LAYOUT=aligned: a small block near the limit or on a full device asks "
     "for a whole piece only, and fails where the granules it needs would fit",
     "out of memory only when the driver alone would say so", "src/pool/acquire.c",
     "            if ((r == CUHEAP_BE_OOM || r == -EDQUOT) && !acq->only_needed &&",
     "            if ((r == CUHEAP_BE_OOM || r == -EDQUOT) && !acq->only_needed && false &&"),
    ("aligned-reserve-over-mapped",
     "vmm, CUHEAP_VMM_LAYOUT=aligned: CUHEAP_POOL_INIT's reserve maps whole pieces, over "
     "granules of a piece mapped in part, and more than asked for",
     "memory held stays close to what is used (pool v2)", "src/pool/acquire.c",
     "        while (end < piece_end && end + 1 < a->nr_granules && !a->granules[end + 1].chunk &&\n"
     "               end + 1 - g < want)",
     "        (void)want;\n        while (end < piece_end && end + 1 < a->nr_granules)"),
    ("idle-fit-ignored",
     "vmm, tight: CUHEAP_VMM_IDLE_FIT is read but placement keeps the fixed 125 percent, so a "
     "block never goes into an idle chunk twice its size and maps memory of its own",
     "every setting does what the README says", "src/pool/place.c",
     "unsigned fit = p->cfg->vmm_idle_fit;",
     "unsigned fit = 125;"),
    ("vmm-whole-block-hides-mapped",
     "vmm: a block kept whole for its size is not merged before placement maps memory for a "
     "block of another size, so that block maps memory of its own beside the idle granules",
     "memory held stays close to what is live", "src/pool/place.c",
     "if (r == 0 && p->nr_whole && !block_mapped_locked(p, a, addr, size) &&",
     "if (r == 0 && p->nr_whole && !block_mapped_locked(p, a, addr, size) && false &&"),
    ("vmm-block-wastes-granules",
     "vmm, tight: placement ignores the granules of a chunk that reach past a block's last one "
     "inside its own buddy block, so a block keeps granules busy that no block can use",
     "memory held stays close to what is used (pool v2)", "src/pool/internal.h",
     "    if (!c || c->first + c->nr - 1 <= last || p->cfg->vmm_layout != CUHEAP_VMM_TIGHT)",
     "    if (true || !c || c->first + c->nr - 1 <= last)"),
    ("vmm-small-quick-hoards",
     "vmm: quick lists below a granule keep up to 64 blocks an order, out of their buddies, so "
     "a granule whose small blocks were all freed never comes back whole",
     "memory held stays close to what is used (pool v2)", "src/pool/place.c",
     "                 (p->vmm ? q->nr == 0",
     "                 (p->vmm ? q->nr < CUHEAP_QUICK_MAX"),
    ("budget-wait-drains-every-cache",
     "vmm: an allocation past the budget that waits for a fence drains every thread's cache "
     "(a barrier on every thread, and their next allocations take the pool's lock)",
     "a thread's cache is its own but when memory runs out", "src/pool/acquire.c",
     "fence_pending_once_locked(p, acq, what == MAP_FENCE)",
     "fence_pending_once_locked(p, acq, true)"),
    ("budget-wait-keeps-own-cache",
     "vmm: an allocation past the budget that waits for a fence leaves its own thread's freed "
     "small blocks in the thread's cache, so their granule stays held and the pool maps more",
     "memory held stays close to what is used (pool v2)", "src/pool/tcache.c",
     "if (tc)\n        tc_drain_held_locked(p, tc, false);",
     "if (tc && false)\n        tc_drain_held_locked(p, tc, false);"),
    ("idle-fit-unguarded",
     "vmm, tight: CUHEAP_VMM_IDLE_FIT above 125 applies however far the pool's busy memory "
     "has spread beyond its live bytes, so free granules of busy chunks add up in long runs",
     "memory held stays close to what is live", "src/pool/place.c",
     "return busy ? 125 : fit;",
     "return fit;"),
    ("sync-does-not-wait",
     "CUHEAP_REUSE=sync frees without waiting for the device",
     "reuse waits for the device (sync)", "src/pool/pool.c",
     "        dev_device_sync(p); /* what cuMemFree itself would have waited for */",
     "        (void)0;"),
    ("stream-cache-any-stream",
     "the pluggable allocator reuses a block freed on one stream on another stream at once",
     "same-stream reuse only", "src/pool/pool.c",
     "stream ? stream_cache_locked(p, stream, false) : NULL;",
     "stream && p->caches[0].stream ? &p->caches[0] : NULL;"),
    ("stream-cache-every-size",
     "under vmm, blocks of every size freed on a stream wait whole in its cache",
     "blocks of half a granule or more merge back behind a fence", "src/pool/pool.c",
     "    return (!p->vmm || block < granule_bytes(p) / 2) && !(block & (block - 1));",
     "    return !(block & (block - 1));"),
    ("pool-init-refusal-unsaid",
     "CUHEAP_POOL_INIT on a device whose driver refuses the vmm backing reports success",
     "what cuheap cannot do is said in one line", "src/pool/life.c",
     "        return to_driver ? -EIO : r ? -ENOMEM : 0;",
     "        return (void)to_driver, r && r != -EIO ? -ENOMEM : 0;"),
    ("vmm-refusal-keeps-stream-caches",
     "a VMM refusal leaves blocks in streams' caches, pinning the pool's memory for good",
     "once the pool holds nothing every request goes to the driver", "src/pool/acquire.c",
     "    flush_stream_caches_locked(p); /* a stream's kept block holds its granules for good else */\n    release_unused_locked(p);\n",
     "    release_unused_locked(p);\n"),
    ("step-plan-ignores-wrap",
     "a step's block that lives past the step's end is placed as if it ended there",
     "blocks that live at once never share memory", "tools/stepplan.c",
     "    if (x->end > period) {",
     "    if (x->end > period && 0) {"),
    ("range-answers-arena",
     "range queries on a pooled pointer answer the arena instead of the block",
     "queries answer the block", "src/pool/pool.c",
     "            *ret_base = start;\n            *ret_size = size;",
     "            *ret_base = a->buddy.base;\n            *ret_size = a->buddy.size;"),
    ("procaddr-v1-not-remapped",
     "cuGetProcAddress (v1) answers not remapped to the hooks",
     "every door reaches the hooks", "src/hooks.c",
     "    CUresult r = cuheap_drv.cuGetProcAddress(symbol, pfn, version, flags);\n"
     "    if (r == CUDA_SUCCESS && pfn)",
     "    CUresult r = cuheap_drv.cuGetProcAddress(symbol, pfn, version, flags);\n"
     "    if (0)"),
    ("procaddr-v2-not-remapped",
     "cuGetProcAddress_v2 answers not remapped to the hooks",
     "every door reaches the hooks", "src/hooks.c",
     "    CUresult r = cuheap_drv.cuGetProcAddress_v2(symbol, pfn, version, flags, st);\n"
     "    if (r == CUDA_SUCCESS && pfn)",
     "    CUresult r = cuheap_drv.cuGetProcAddress_v2(symbol, pfn, version, flags, st);\n"
     "    if (0)"),
    ("dlsym-not-remapped",
     "dlsym of a driver name answers the real function, not the hook",
     "every door reaches the hooks", "src/hooks.c",
     "    if (p && cuheap_driver_load() == 0)\n        remap(&p);",
     "    if (0)\n        remap(&p);"),
    ("ptsz-capture-unseen",
     "a capture begun through a _ptsz twin on the per-thread default stream is not seen",
     "every door reaches the hooks", "src/hooks.c",
     "    bool marked = active && cuheap_capture_changed(capture_key(s, true), true); /* as above */",
     "    bool marked = active && cuheap_capture_changed(s, true); /* as above */"),
    ("async-free-unrecorded",
     "stream-ordered frees of pooled blocks (cuMemFreeAsync) not recorded",
     "every call leaves its event", "src/alloc.h",
     "        cuheap_record_free_event(d->ordinal, api, CUHEAP_EVF_POOLED, ptr, size, block, stream, "
     "seq);",
     "        if (api != CUHEAP_API_ASYNC)\n"
     "            cuheap_record_free_event(d->ordinal, api, CUHEAP_EVF_POOLED, ptr, size, block, "
     "stream, seq);"),
    ("torch-free-unrecorded",
     "frees through the pluggable allocator (cuheap_torch_free) not recorded",
     "every call leaves its event", "src/alloc.h",
     "        cuheap_record_free_event(d->ordinal, api, CUHEAP_EVF_POOLED, ptr, size, block, stream, "
     "seq);",
     "        if (api != CUHEAP_API_TORCH)\n"
     "            cuheap_record_free_event(d->ordinal, api, CUHEAP_EVF_POOLED, ptr, size, block, "
     "stream, seq);"),
    ("managed-unrecorded",
     "cuMemAllocManaged goes to the driver without an event",
     "every call leaves its event", "src/hooks.c",
     "    LEAVE(cuheap_alloc_passthru(cuheap_device_current(), CUHEAP_API_MANAGED, size, actual, 0, "
     "true,\n                                &c.call, dptr));",
     "    (void)c;\n    LEAVE(cuheap_drv.cuMemAllocManaged(dptr, size, flags));"),
    ("vmm-map-unrecorded",
     "cuMemMap leaves no event",
     "every call leaves its event", "src/hooks.c",
     "    cuheap_record_alloc(cuheap_device_by_ordinal(dev), CUHEAP_API_VMM_MAP, 0, ptr, size, "
     "size, 0,",
     "    if (0)\n"
     "        cuheap_record_alloc(cuheap_device_by_ordinal(dev), CUHEAP_API_VMM_MAP, 0, ptr, size, "
     "size, 0,"),
    ("oom-code-replaced",
     "an out-of-memory answer (the pool's passes through to the driver's) reaches the program as "
     "CUDA_ERROR_INVALID_VALUE instead of the driver's code",
     "errors are the driver's", "src/alloc.c",
     "            cuheap_record_oom(d, api, size, false);\n        return r;",
     "            cuheap_record_oom(d, api, size, false);\n"
     "        return r == CUDA_ERROR_OUT_OF_MEMORY ? CUDA_ERROR_INVALID_VALUE : r;"),
    ("pool-oom-not-passed",
     "the pool's out of memory is the program's answer, though the driver would grant the "
     "request (a vmm pool whose cuMemCreate says out of memory, a block rounded up)",
     "out of memory only when the driver alone would say so", "src/alloc.h",
     "    if (r == CUHEAP_POOL_PASS || r < 0)\n        return 0;",
     "    if (r == CUHEAP_POOL_PASS)\n        return 0;\n    if (r < 0)\n        return -1;"),
    ("vmm-refused-becomes-legacy",
     "vmm: once the driver refused the backing and the pool holds nothing, it becomes a legacy "
     "pool of cuMemAlloc arenas (holding far more than the driver alone, failing near the "
     "device's capacity where the driver alone fits) instead of sending requests to the driver",
     "out of memory only when the driver alone would say so", "src/pool/acquire.c",
     "    __atomic_store_n(&p->to_driver, true, __ATOMIC_RELEASE);",
     "    p->vmm = false;"),
    ("no-vmm-device-pools",
     "a device without VMM under the default backing gets a legacy pool instead of the "
     "driver's own allocations",
     "out of memory only when the driver alone would say so", "src/pool/pool.c",
     "        p->to_driver = true;",
     "        (void)0;"),
    ("summary-switch-unsaid",
     "after a VMM refusal the summary says the pool's memory is still used where every request "
     "goes to the driver",
     "a clear one-line error naming what was wrong", "src/pool/life.c",
     "    ret->to_driver = __atomic_load_n(&p->to_driver, __ATOMIC_ACQUIRE);",
     "    ret->to_driver = false;"),
    ("mapping-call-under-pool-lock",
     "vmm: a new chunk is created and mapped with the pool's lock held, so every other thread's "
     "allocation and free waits behind the driver's mapping calls",
     "no lock held across a driver call", "src/pool/phys.c",
     "    p->inflight_bytes += bytes;\n    pool_unlock(p);\n    int r = leaves_room(",
     "    p->inflight_bytes += bytes;\n    int r = leaves_room("),
    ("mapping-call-relock-skipped",
     "vmm: the lock taken again after a new chunk's calls is left out of the count of locks held "
     "(pool_locks_held), so the lock rule's check misses later calls",
     "no lock held across a driver call", "src/pool/internal.h",
     "    pool_locks_held--;\n    pthread_mutex_unlock(&p->lock);",
     "    pthread_mutex_unlock(&p->lock);"),
    ("vmm-failure-not-retried",
     "vmm: a map (or set-access) the driver fails once is not tried again: one transient failure "
     "gives the backing up",
     "out of memory only when the driver alone would say so", "src/pool/phys.c",
     "    if (r)\n        r = dev_phys_map(p, va, bytes, handle, ns);",
     "    if (0)\n        r = dev_phys_map(p, va, bytes, handle, ns);"),
    ("vmm-failed-map-keeps-handle",
     "vmm: physical memory whose map failed leaves the pool's books (in no chunk, not counted as "
     "held by the driver)",
     "the pool gives back what it does not need", "src/pool/phys.c",
     "        account_release_locked(p, given_back, h, bytes);\n        r = m;",
     "        r = m;"),
    ("fence-refusal-not-noted",
     "a fence query refused outside every capture (a capture's error for good) is taken for "
     "\"not yet\" every time: fences go on being recorded and asked about",
     "a driver's broken answer never hangs the program", "src/pool/fence.c",
     "        atomic_store_explicit(&p->fences_refused, true, memory_order_relaxed);",
     "        (void)0;"),
    ("fence-wait-result-ignored",
     "a wait for a fence that returned is not taken as the fence passing: the blocks wait for a "
     "query that never says so, and an allocation past the vmm budget waits at full CPU for ever",
     "a driver's broken answer never hangs the program", "src/pool/fence.c",
     "    if (still && passed) {",
     "    if (still && passed && false) {"),
    ("trim-waits-in-vain",
     "a trim waits for a fence again and again though no wait, sync or query passes it",
     "a driver's broken answer never hangs the program", "src/pool/life.c",
     "    while (p->ep_head != p->ep_tail && wait_oldest_locked(p))\n        ;",
     "    while (p->ep_head != p->ep_tail && (wait_oldest_locked(p) || true))\n        ;"),
    ("vmm-waits-in-vain",
     "vmm: an allocation past the budget waits for a fence again and again though no wait, sync "
     "or query passes it",
     "a driver's broken answer never hangs the program", "src/pool/acquire.c",
     "        acq->waited_in_vain |= !wait_oldest_locked(p);",
     "        (void)wait_oldest_locked(p);"),
    ("pass-through-no-retry",
     "a pass-through allocation the driver refuses is not retried after the pool gave back its "
     "empty arenas",
     "out of memory only when the driver alone would say so", "src/alloc.c",
     "    if (r == CUDA_ERROR_OUT_OF_MEMORY && cuheap_reclaim_for_driver(d))",
     "    if (0 && cuheap_reclaim_for_driver(d))"),
    ("release-empty-keeps-all",
     "CUHEAP_RELEASE=empty never gives an emptied arena back",
     "the pool gives back what it does not need", "src/pool/arena.c",
     "    if (p->cfg->release != CUHEAP_RELEASE_EMPTY || p->nr_empty <= 1)\n        return 0;",
     "    if (1)\n        return 0;"),
    ("periodic-flush-removed",
     "the writer never flushes the trace between exits (a killed program loses what it "
     "recorded)",
     "a killed run leaves a readable trace", "src/recorder_writer.c",
     "        if (now - last_flush >= (uint64_t)cuheap_recorder.cfg->flush_ms * 1000000ull) {",
     "        if (0 && now - last_flush >= (uint64_t)cuheap_recorder.cfg->flush_ms * 1000000ull) {"),
    ("audit-release-pairs-alloc",
     "audit: a driver record pairs with a hooked operation of either kind at its address (an "
     "allocation taken for a release)",
     "the audit names every driver operation no hook saw", "src/audit.c",
     "    struct audit_slot *s = table_find(&a->seen, d->op, d->addr, key, NULL, seen_fits, d);",
     "    struct audit_slot *s = table_find(&a->seen, CUHEAP_AUDIT_ALLOC, d->addr, key, NULL, "
     "seen_fits, d);"),
    ("audit-statics-counted",
     "audit: a module's __device__ variables counted as missed allocations",
     "the audit names every driver operation no hook saw", "src/audit.c",
     "        a->counts.nr_static++;\n        return 0;", "        a->counts.nr_static++;"),
    ("audit-pool-unfed",
     "audit: the pool's arenas are not fed to the matcher",
     "the audit names every driver operation no hook saw", "src/cupti_audit.c",
     "    case CUHEAP_EV_ARENA_GROW:\n        s.door = CUHEAP_AUDIT_POOL;\n        break;",
     "    case CUHEAP_EV_ARENA_GROW:\n        return;"),
    ("audit-pool-blocks-fed",
     "audit: pool blocks fed as if they reached the driver",
     "the audit names every driver operation no hook saw", "src/cupti_audit.c",
     "            return; /* a block of the pool: the driver never heard of it */",
     "            (void)0;"),
    ("audit-not-fed",
     "audit: recorded events never reach the matcher",
     "the audit names every driver operation no hook saw", "src/recorder.c",
     "    if (tap)\n        tap(r);", "    (void)tap;"),
    ("python-outer-lines-zero",
     "outer Python frames recorded with line 0",
     "stacks name the program's lines", "src/pyframes.c",
     "            } else if (frame_info(memo, frame, code, &out[n])) {\n                if (memo) {",
     "            } else if (frame_info(memo, frame, code, &out[n])) {\n"
     "                out[n].line = n == 0 ? out[n].line : 0;\n                if (memo) {"),
    ("python-memo-ignores-offset",
     "the per-thread Python memo keyed by code object alone, not by instruction offset",
     "stacks with the shortcuts are the full walk's", "src/pyframes.c",
     "        uint64_t h = ((uint64_t)code ^ ((uint64_t)(uint32_t)offset << 40)) * "
     "0x9e3779b97f4a7c15ull;\n        slot = &m->slot[h >> 58];\n"
     "        if (slot->code == code && slot->offset == offset && slot->firstline == firstline) {",
     "        uint64_t h = (uint64_t)code * 0x9e3779b97f4a7c15ull;\n"
     "        slot = &m->slot[h >> 58];\n"
     "        if (slot->code == code && slot->firstline == firstline) {"),
    ("unwind-short-walk-kept",
     "a short native walk kept although it fell short of the frames asked for",
     "stacks with the shortcuts are the full walk's", "src/unwind.c",
     "    if (skip < n && (n < want || n - skip >= (int)max)) {", "    if (skip < n) {"),
    ("tc-owner-ignores-drainer",
     "a thread enters its own cache while a drainer (trim, a check, out of memory) holds it",
     "a thread's cache is held still while drained", "src/pool/tcache.h",
     "        if (__builtin_expect(!atomic_load_explicit(&tc->held, memory_order_acquire), 1))\n"
     "            return;",
     "        if (1)\n            return;"),
    ("tc-drainer-skips-owner",
     "a drainer takes a thread's cache without waiting for its owner to leave it",
     "a thread's cache is held still while drained", "src/pool/tcache.c",
     "    while (atomic_load_explicit(&tc->busy, memory_order_acquire))\n        sched_yield();\n}",
     "    (void)tc;\n}"),
    ("pool-metadata-never-purged",
     "the pages of the pool's per-unit arrays inside free blocks never given back",
     "cuheap's host memory does not grow over a long run", "src/pool/pool.c",
     "    if (p->nr_merged >= CUHEAP_PURGE_EVERY)\n        purge_meta_locked(p);",
     "    if (0)\n        purge_meta_locked(p);"),
    ("passthru-map-whole",
     "the pass-through map mapped at its whole capacity from the start",
     "cuheap's host memory does not grow over a long run", "src/addrmap.c",
     "    size_t n = capacity < NR_FIRST_SLOTS ? capacity : NR_FIRST_SLOTS;",
     "    size_t n = capacity;"),
    ("mark-label-leaks",
     "the JSON string of each mark's label never released",
     "cuheap's host memory does not grow over a long run", "src/recorder_writer.c",
     "        json_decref(j);\n        fprintf(cuheap_recorder.out, ",
     "        fprintf(cuheap_recorder.out, "),
    ("record-ignores-pause",
     "events recorded while cuheap_set_recording(0) paused recording",
     "a paused recording leaves the paused part out", "src/recorder.c",
     "    if (atomic_load_explicit(&cuheap_recorder.paused, memory_order_relaxed) &&\n"
     "        r->type != CUHEAP_EV_MARK) {",
     "    if (0) {"),
    ("html-label-not-escaped",
     "the HTML report's data written inside its script element with `<`, `>` and `&` as they "
     "are: a label holding `<!--<script>` swallows the page's code and no chart is drawn",
     "trace text on the HTML page stays text", "tools/html.c",
     "        if (!rep)\n            continue;", "        if (1)\n            continue;"),
    ("preload-path-with-a-space",
     "cuheap run preloads a library whose path holds a space or a colon as it is: ld.so splits "
     "it and the program runs without cuheap",
     "cuheap run runs the program under cuheap, or says why not", "tools/cuheap.c",
     "    if (!preload_safe(lib)) {", "    if (0) {"),
    ("tool-option-opened-as-trace",
     "report and check open an option they do not take as a trace (\"--bogus: cannot open\")",
     "the tool's words name what was wrong", "tools/cuheap.c",
     "        if (argv[i][0] == '-' && argv[i][1])\n            return fail(\"%s: unknown option",
     "        if (0)\n            return fail(\"%s: unknown option"),
    ("tool-folder-read-as-trace",
     "a folder given as a trace is read as an empty file (\"empty file, not a cuheap trace\")",
     "the tool's words name what was wrong", "tools/tracereader.c",
     "    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {",
     "    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode) && 0) {"),
    ("chrome-window-past-the-end",
     "chrome --from past the trace's end writes counters at one timestamp and exits 0",
     "the tool's words name what was wrong", "tools/cuheap.c",
     "    if (ts && from && from > traces_end(ts, nr)) {", "    if (0) {"),
    ("folded-spaces-underscored",
     "folded stacks turn the spaces in frame names into `_` (\"layer_forward_(demo.c:88)\")",
     "the tool's words name what was wrong", "tools/export.c",
     "        else if (*p == '\\n' || *p == '\\r' || *p == '\\t')\n            *p = ' ';",
     "        else if (*p == ' ' || *p == '\\n' || *p == '\\r' || *p == '\\t')\n            *p = '_';"),
    ("summary-peak-live-unbounded",
     "the exit summary prints the recorded peak live alone, which misses what threads hold back "
     "(\"peak live 0 B ... fragmentation 0.00\" for small allocations)",
     "the exit summary's peak live agrees with the trace", "src/runtime.c",
     "    if (most <= peak + peak / 100)\n        snprintf(ret, size, \"%s\", a);",
     "    if (1)\n        snprintf(ret, size, \"%s\", a);"),
    ("summary-peak-live-from-hooks",
     "the exit summary's peak live is the hooks' count, batched 1 MiB a thread (the demo's "
     "\"41.19 MiB to 42.19 MiB\" against the report's 41.69 MiB)",
     "the exit summary's peak live agrees with the trace", "src/runtime.c",
     "        if (traced && cuheap_recorder_live_figures(d->ordinal, &peak, &left) &&",
     "        if (0 && cuheap_recorder_live_figures(d->ordinal, &peak, &left) &&"),
    ("report-unknown-free-takes-live",
     "a free of a block the trace never had (allocated while recording was paused) takes its "
     "size from the report's live bytes: the report's peak and end fall below the summary's",
     "the exit summary's peak live agrees with the trace", "tools/analysis.c",
     "        if (forget(s, live, e->ptr))\n", "        if (forget(s, live, e->ptr) || 1)\n"),
    ("summary-details-by-default",
     "the exit summary prints the pool's figures (hit rate, fences, mapping calls, counts) "
     "without CUHEAP_VERBOSE: five lines of internals for the demo",
     "the exit summary is one line per GPU", "src/runtime.c",
     "    if (cuheap_cfg.verbose)\n        summary_details(&s, &rs);",
     "    if (1)\n        summary_details(&s, &rs);"),
    ("tool-gzip-not-read",
     "a gzip-compressed trace is read as it is on disk (\"not a cuheap trace\")",
     "the tool's words name what was wrong", "tools/tracereader.c",
     "    if (pread(fileno(f), magic, 2, 0) != 2 || magic[0] != 0x1f || magic[1] != 0x8b)",
     "    if (pread(fileno(f), magic, 2, 0) != 2 || magic[0] != 0x1f || magic[1] != 0x8b || 1)"),
    ("tool-counts-always-plural",
     "counts take the plural whatever the number (\"1 sites\", \"1 devices\")",
     "the tool's words name what was wrong", "tools/analysis.c",
     "n == 1 ? one : many", "many"),
    ("run-torch-overrides-choice",
     "cuheap run --torch makes cuheap PyTorch's allocator though PYTORCH_CUDA_ALLOC_CONF chose "
     "another backend", "a program that chose its allocator keeps it",
     "python/cuheap/_bootstrap/sitecustomize.py",
     "    chosen = _chosen_elsewhere()\n", "    chosen = None\n"),
    ("memviz-block-sizes",
     "memviz actions carry block sizes whatever the view: the Active Memory Timeline peaks above "
     "the report's peak live",
     "memory_viz shows the report's figures", "tools/memviz.c",
     "    return r->pool_view ? b->actual : b->size;", "    return b->actual;"),
    ("memviz-frees-wait-for-fence",
     "memviz completes pooled frees at their fence in the program's view: Allocator State History "
     "ends with blocks still allocated that the program freed",
     "memory_viz shows the report's figures", "tools/memviz.c",
     "    if (b.pooled && r->pool_view && r->fence_reuse", "    if (b.pooled && r->fence_reuse"),
    ("memviz-times-from-zero",
     "memviz times counted from the trace's start: memory_viz reads them as 1970",
     "memory_viz shows the report's figures", "tools/memviz.c",
     "        r->now_us = (r->start_ns + e->t) / 1000;", "        r->now_us = e->t / 1000;"),
    ("html-marks-first-only",
     "the HTML report keeps the first markers up to its bound and drops the rest: a later "
     "window of a long run shows none",
     "the HTML report shows a long run as it was", "tools/html.c",
     "    if (json_array_size(c->marks) >= NR_MAX_MARKS) {\n        json_t *kept",
     "    if (json_array_size(c->marks) >= NR_MAX_MARKS) {\n        c->nr_marks += 0;\n        return;\n    }\n    if (0) {\n        json_t *kept"),
    ("html-band-misses-entry",
     "an HTML bucket's band leaves out what held from its start to its first event",
     "the HTML report shows a long run as it was", "tools/html.c",
     "        b->live_min = b->live_max = before_live;", "        b->live_min = b->live_max = live;"),
    ("html-fine-sites-missing",
     "the HTML report's fine buckets carry no call-site bytes: a zoom's stacked areas show the "
     "coarse buckets' ends, empty under a step's allocation",
     "the HTML report shows a long run as it was", "tools/html.c",
     "            memcpy(fs[group].v, vals, sizeof(vals));\n", ""),
    ("html-zoom-coarse-only",
     "a zoom into the HTML chart re-splits the coarse buckets: the window shows its buckets' "
     "extremes, not its own",
     "the HTML report shows a long run as it was", "tools/html.c",
     "const fine=!!g.fine&&", "const fine=false&&"),
    ("html-labels-overlap",
     "marker labels placed without looking at those before: they overlap into a band",
     "the HTML report shows a long run as it was", "tools/html.c",
     "tx.setAttribute('x',x0);rowEnd[r]=x0+w+6;", "tx.setAttribute('x',x0);rowEnd[r]=-Infinity;"),
    ("html-lines-past-end",
     "a process's lines drawn on to the end of the common time axis, past its own end",
     "the HTML report shows a long run as it was", "tools/html.c",
     "if(i0>=i1||t0>end){col.push(null);continue;}", "if(i0>=i1){col.push(null);continue;}"),
    ("memviz-check-menus-under-body",
     "scripts/check-memviz-page.py looks for memory_viz's menus among <body>'s children: today's "
     "page keeps them in a div, and the check times out waiting for it",
     "the memory_viz check works with the viewer PyTorch serves", "scripts/check-memviz-page.py",
     "  const selects = document.querySelectorAll('select');",
     "  const selects = document.querySelectorAll('body > select');"),
    ("memviz-check-d3-version-unchecked",
     "scripts/check-memviz-page.py serves whatever d3 it is given: d3 v5 under today's viewer "
     "reports a false error instead of saying the version is wrong",
     "the memory_viz check works with the viewer PyTorch serves", "scripts/check-memviz-page.py",
     "    if wanted and have and wanted.group(1) != have.group(1):",
     "    if False:"),
    ("trace-written-to-a-fifo",
     "a FIFO at the trace's name is written to (a reader that leaves kills the program with "
     "SIGPIPE, one that never reads hangs its exit, another user's receives the trace)",
     "the trace never costs the program anything", "src/tracefile.c",
     "    return S_ISCHR(m);\n}", "    return S_ISCHR(m) || S_ISFIFO(m);\n}"),
    ("trace-sigpipe-not-blocked",
     "a trace write leaves SIGPIPE unblocked: a pipe whose reader left kills the program",
     "the trace never costs the program anything", "src/tracefile.c",
     "    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);", "    pthread_sigmask(SIG_BLOCK, NULL, &old);"),
    ("trace-sigpipe-left-pending",
     "the SIGPIPE a trace write raised is left pending, delivered once the mask is restored",
     "the trace never costs the program anything", "src/tracefile.c",
     "    if (err == EPIPE && !theirs) {", "    if (err == EPIPE && !theirs && 0) {"),
    ("trace-write-waits-for-good",
     "a trace write waits as long as a device that takes nothing makes it",
     "the trace never costs the program anything", "src/tracefile.c",
     "            if (left > 0) {", "            if (1) {"),
    ("trace-name-cut",
     "a trace name that does not fit is cut short without a word (another file's name)",
     "names and messages are never cut silently", "src/config.c",
     "            out[0] = 0; /* a name cut short is another file's name */\n"
     "            return -ENAMETOOLONG;",
     "            out[o] = 0;\n            return 0;"),
    ("log-line-cut-silently",
     "a log line longer than the buffer is cut without saying so",
     "names and messages are never cut silently", "src/log.c",
     "        memcpy(buf + n + keep, mark, (size_t)k);\n        len = (size_t)n + keep + (size_t)k;",
     "        (void)keep;\n        len = (size_t)n + room;"),
    ("size-ignores-trailing-text",
     "a size's trailing text is ignored (\"12 apples\" is 12 bytes, \"1e3\" one)",
     "a bad setting gets one clear warning and keeps the default", "src/config.c",
     "    if (*p)\n        return refuse(why, \"text after the number (sizes are whole numbers",
     "    if (0)\n        return refuse(why, \"text after the number (sizes are whole numbers"),
    ("mode-owner-cannot-read",
     "CUHEAP_OUTPUT_MODE takes modes that leave the owner unable to read the trace (0, 0200)",
     "a bad setting gets one clear warning and keeps the default", "src/config.c",
     "    if ((n & 0600) != 0600)", "    if (0)"),
    ("warning-prints-newline",
     "a warning prints a value's newline as it is, over two lines",
     "a bad setting gets one clear warning and keeps the default", "src/config.c",
     "                          : c == '\\n' ? \"\\\\n\"", "                          : c == '\\n' ? \"\\n\""),
    ("summary-omits-refused-trace",
     "the summary does not say what was refused as the trace, nor why",
     "the trace never costs the program anything", "src/runtime.c",
     "    if (rs.refused)\n", "    if (0)\n"),
    ("exit-skips-start-up",
     "exit does not wait for a start-up in progress on another thread (and the destructor "
     "finds exit already begun)",
     "an exit during start-up leaves a readable trace and the summary", "src/runtime.c",
     "    if (pthread_mutex_timedlock(&boot_lock, &until))\n        return;\n"
     "    bool first = !atomic_exchange(&exit_began, true);",
     "    bool first = !atomic_exchange(&exit_began, true);\n"
     "    if (pthread_mutex_trylock(&boot_lock))\n        return;"),
    ("exit-skips-child-start",
     "exit does not wait for a forked child's trace that another of its threads is opening",
     "an exit during start-up leaves a readable trace and the summary", "src/recorder.c",
     "    pthread_mutex_lock(&child_start_lock);\n"
     "    bool idle_child = atomic_load(&cuheap_recorder.child_pending);\n"
     "    pthread_mutex_unlock(&child_start_lock);",
     "    bool idle_child = atomic_load(&cuheap_recorder.child_pending);"),
    ("nested-pooled-free-to-driver",
     "a free of a pooled block made by a signal handler while its thread is inside a hook goes "
     "to the driver, which refuses it, instead of being deferred",
     "a signal handler's free is served or deferred, never lost", "src/defer.c",
     "    if (!cuheap_pool_of(ptr))\n        return false;", "    if (1)\n        return false;"),
    ("deferred-never-worked-off",
     "what nested calls left is never worked off as the thread leaves cuheap",
     "a signal handler's free is served or deferred, never lost", "src/guard.h",
     "    if (__builtin_expect(cuheap_defer_pending(), 0))\n        cuheap_defer_drain();",
     "    if (0)\n        cuheap_defer_drain();"),
    ("nested-alloc-unbooked",
     "an allocation a signal handler made inside a hook is served by the driver but never "
     "counted, so its later free makes frees outnumber allocations",
     "the summary's allocations and frees match", "src/defer.c",
     "                         .kind = DEFER_ALLOC,\n                         .api = (uint8_t)api};\n"
     "    push(&e);",
     "                         .kind = DEFER_ALLOC,\n                         .api = (uint8_t)api};\n"
     "    (void)e;"),
    ("nested-book-after-reuse",
     "a handler's driver free is booked after the interrupted call put the address the driver "
     "handed it again into the pass-through map (the new allocation's entry is taken)",
     "the summary's allocations and frees match", "src/alloc.c",
     "    if (cuheap_defer_pending()) /* the map in this thread's order (defer.h) */\n"
     "        cuheap_defer_settle_now();\n    uint64_t seq",
     "    uint64_t seq"),
    ("oom-told-every-time",
     "every out-of-memory the writer sees is described in full on stderr, not only the first "
     "(later ones are to be counted)",
     "an out-of-memory is told once, then counted", "src/recorder_oom.c",
     "        if (n == 1) {\n            if (p->report) {",
     "        if (n >= 1) {\n            if (p->report) {"),
    ("oom-unseen-told-every-time",
     "with recording off or paused, every out-of-memory is described in full from the hook, "
     "not only the first",
     "an out-of-memory is told once, then counted", "src/recorder_oom.c",
     "    if (n > 1) {\n        if (power_of_two(n))",
     "    if (0) {\n        if (power_of_two(n))"),
    ("oom-top-site-smallest",
     "the out-of-memory block lists the call sites holding the least first, so the top one "
     "named is not the one holding the most",
     "an out-of-memory names who holds the most", "src/liveset.c",
     "    return a->bytes != b->bytes ? a->bytes > b->bytes : a->stack < b->stack;",
     "    return a->bytes != b->bytes ? a->bytes < b->bytes : a->stack < b->stack;"),
    ("oom-largest-free-smallest",
     "the largest free piece in the pool is answered with the smallest free block",
     "an out-of-memory names the largest free piece", "src/buddy.c",
     "    return 1ull << (63 - __builtin_clzll(b->free_bitmap));",
     "    return 1ull << __builtin_ctzll(b->free_bitmap);"),
    ("fit-not-lowest",
     "first fit takes the first range on its way down that holds the block, not the lowest",
     "a block goes to the lowest place that holds it (memory stays packed)", "src/fit.c",
     "        if (longest(f, r->left) >= n)",
     "        if (r->len < n && longest(f, r->left) >= n)"),
    ("pool-fit-chunks-any-size",
     "first fit: chunks are made of up to CUHEAP_VMM_CHUNK whatever the job's size, so a small "
     "job's block that shares a freed block's last granule keeps its whole chunk busy",
     "memory held stays close to what is used", "src/pool/acquire.c",
     "        uint32_t most = p->first_fit ? fit_chunk_max(p, span) : p->chunk_max;",
     "        uint32_t most = p->first_fit ? (fit_chunk_max(p, 0), p->chunk_max) : p->chunk_max;"),
    ("pool-fit-blocks-rounded",
     "first fit: blocks are rounded up to a power of two as the buddy's are",
     "memory held stays close to what is used (blocks exact to 512 B)", "src/pool/internal.h",
     "    if (!p->first_fit || order <= p->tc_max_order)",
     "    if (1 || !p->first_fit || order <= p->tc_max_order)"),
    ("pool-fit-quick-any-size",
     "first fit: a freed block of any size goes onto the quick list its bytes' lowest bit names, "
     "and large powers of two are merged",
     "a block holds at least the bytes asked for; memory held stays close to what is used",
     "src/pool/place.c",
     "    if (bytes != 1ll << order || (p->first_fit && order > p->tc_max_order)) {",
     "    if (p->first_fit && bytes == 1ll << order && order > p->tc_max_order) {"),
    ("fit-longest-left-stale",
     "first fit never fixes the longest free range of a subtree after a change",
     "a request finds a free range that holds it whenever one does", "src/fit.c",
     "    while (i && update(f, i))", "    while (0 && i && update(f, i))"),
    ("fit-free-merges-no-lower",
     "a freed block is not merged with the free range below it",
     "freed memory joins its free neighbours (no two free ranges touch)", "src/fit.c",
     "    uint32_t prev = u ? f->range_last[u - 1] : 0;", "    uint32_t prev = 0;"),
    ("scored-split-upper-misjudged",
     "a scored split takes the upper half whenever the region scores more than its lower half, "
     "not only when the upper half scores more: blocks go where no memory is mapped",
     "a block goes where memory is mapped (no driver call)", "src/buddy.c",
     "        if (whole - lower > lower) {", "        if (whole > lower) {"),
    ("default-cushion-holds",
     "the vmm cushion's default keeps 256 MiB of idle memory mapped beyond the most the job's "
     "blocks have used at once, so the default holds more than the same replay with "
     "CUHEAP_VMM_CUSHION=0",
     "no default that harms (a setting on by default is no worse than its off)", "src/config.c",
     '    {"CUHEAP_VMM_CUSHION", "2M",', '    {"CUHEAP_VMM_CUSHION", "256M",'),
    ("html-marks-hatch",
     "every marker in view is a dashed line across the plot however many there are (6,000 hatch "
     "the chart)", "the HTML report reads at any size", "tools/html.c",
     "const ticks=shown.length*12>cols;", "const ticks=false;"),
    ("html-fixed-width",
     "the charts are 1000 px wide whatever the window (a narrow one scrolls)",
     "the HTML report reads at any size", "tools/html.c",
     "const W=Math.max(480,Math.floor(box.clientWidth||1000));", "const W=1000;"),
    ("html-view-to-footer",
     "the time axis runs to the footer's time, past the run's last event (0.075 s for a 0.03 s "
     "run)", "the HTML report reads at any size", "tools/html.c",
     "(json_int_t)(view ? view : end), \"processes\"", "(json_int_t)end, \"processes\""),
    ("html-zoom-past-data-unsaid",
     "zoomed past the data's resolution the band fills whole buckets and no note says why",
     "the HTML report reads at any size", "tools/html.c",
     "const rnote=bcols>=2?", "const rnote=bcols>=1e12?"),
    ("html-oom-rows-repeat",
     "refusals alike in all but their time each get a row of the table",
     "the HTML report reads at any size", "tools/html.c",
     "r->res == o.res && r->stack == o.stack && r->limit == o.limit) {",
     "r->res == o.res && r->stack == o.stack && r->limit == o.limit && 0) {"),
    ("stack-cache-never-invalidates",
     "a thread's cached stack is taken whatever its stack words now hold",
     "every event has its own native stack (a changed stack is recorded as changed)",
     "src/unwind.c",
     "    return k == w->nr_checks;", "    return true;"),
    ("stack-cache-rbp-unchecked",
     "a cached stack is checked by its return addresses only, not by the saved rbp that places "
     "a frame keeping a frame pointer",
     "every event has its own native stack (a changed stack is recorded as changed)",
     "src/unwind.c",
     "            if (rbp.value + 16 == sp && rbp.addr && nr_checks < NR_MAX_CHECKS)",
     "            if (0)"),
    ("same-stack-ref-ignored",
     "the writer interns the frames of an event that names an earlier one's stack (its slot holds "
     "none)",
     "every event has its own native stack (a changed stack is recorded as changed)",
     "src/recorder_writer.c",
     "    if (ev->flags & CUHEAP_EVF_SAME_STACK)", "    if (0)"),
    ("same-stack-across-laps",
     "a stack is named by an event more than a lap of the ring ago, whose slot another holds now",
     "every event has its own native stack (a changed stack is recorded as changed)",
     "src/recorder.c",
     "            pos - ((*note & NOTE_POS_MASK) - 1) <= cuheap_recorder.ring.mask) {",
     "            1) {"),
    ("stamps-not-converted",
     "events' time stamp counter ticks written as nanoseconds",
     "event times are CLOCK_MONOTONIC nanoseconds from the trace's start",
     "src/recorder_writer.c",
     "    ev->time_ns = cuheap_ticks_to_ns(ev->time_ns);", "    (void)0;"),
    ("py-frame-kept-on-new-line",
     "a Python frame running the same code as last time keeps last time's line though it moved on",
     "Python frames are the interpreter's own (file, line, function at every depth)",
     "src/pyframes.c",
     "memo->last[n].code == code &&\n            memo->last[n].offset == frame_offset(frame, code)) {",
     "memo->last[n].code == code) {"),
    ("py-change-not-counted",
     "a stack is named again after the thread's Python frames changed",
     "Python frames are the interpreter's own (file, line, function at every depth)",
     "src/recorder.c",
     "            if (!same_py)\n                tls_py_changes++;", "            (void)same_py;"),
    ("own-time-misses-frees",
     "the pool's frees are never timed: cuheap's own time counts its allocations only",
     "the summary and the statistics say cuheap's own time", "src/alloc.h",
     "    if (__builtin_expect(cuheap_own_due(ctr, CUHEAP_CTR_FREES), 0))",
     "    if (__builtin_expect(0 && cuheap_own_due(ctr, CUHEAP_CTR_FREES), 0))"),
    ("driver-calls-miscounted",
     "the pool's question whether the streams are idle (cuStreamQuery) is counted as an event "
     "record", "the summary and the statistics say cuheap's driver calls by kind",
     "src/backend_cuda.c",
     "    DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuStreamQuery(CU_STREAM_LEGACY));",
     "    DRV(CUHEAP_DRV_RECORD, r, cuheap_drv.cuStreamQuery(CU_STREAM_LEGACY));"),
    ("own-time-keeps-driver-time",
     "cuheap's own time keeps the driver calls made inside the timed call (the program's and the "
     "pool's)", "the summary and the statistics say cuheap's own time", "src/counters.h",
     "    int64_t own = (int64_t)(cuheap_ticks() - s->t0) - (cuheap_drv_ticks_in(c) - s->drv0);",
     "    int64_t own = (int64_t)(cuheap_ticks() - s->t0);"),
    ("own-time-long-call-scaled",
     "a timed call the OS took the CPU from counts for the 32 calls it stands for",
     "the summary and the statistics say cuheap's own time", "src/counters.h",
     "    if (own > CUHEAP_OWN_LONG_TICKS)", "    if (0 && own > CUHEAP_OWN_LONG_TICKS)"),
    ("map-time-as-query",
     "the pool's cuMemMap calls are counted, with their time, as queries",
     "the summary and the statistics say cuheap's driver calls by kind", "src/backend_cuda.c",
     "    DRV(CUHEAP_DRV_MAP, r,\n        cuheap_drv.cuMemMap(",
     "    DRV(CUHEAP_DRV_QUERY, r,\n        cuheap_drv.cuMemMap("),
    ("live-reads-from-start",
     "each refresh of `top --follow` reads the trace from its start again, not from where it "
     "stopped", "the live view shows what is live now", "tools/tracereader.c",
     "ssize_t n = pread(tt->fd, st->chunk, TAIL_CHUNK, (off_t)tt->offset);",
     "ssize_t n = pread(tt->fd, st->chunk, TAIL_CHUNK, 0);"),
    ("live-cut-line-lost",
     "a line the writer had only half written at a refresh is dropped, not finished at the next",
     "the live view shows what is live now", "tools/tracereader.c",
     "                memcpy(st->partial + st->nr_partial, p, piece);\n"
     "                st->nr_partial += piece;",
     "                (void)0;"),
    ("live-least-first",
     "the rank holding the least is shown first", "the live view shows what is live now",
     "tools/live.c", "        return lx > ly ? -1 : 1;", "        return lx > ly ? 1 : -1;"),
    ("live-terminal-left-raw",
     "quitting the terminal view leaves the terminal unechoed and in raw mode",
     "the live view leaves the terminal as it was", "tools/live.c",
     "    if (!raw_mode)\n        return;\n    tcsetattr", "    if (raw_mode)\n        return;\n    tcsetattr"),
    ("live-no-redraw",
     "the terminal view prints each table below the last instead of redrawing in place",
     "the live view leaves the terminal as it was", "tools/live.c",
     '    fputs("\\x1b[?25l\\x1b[H\\x1b[2J", stdout);', '    fputs("\\x1b[?25l", stdout);'),
    ("oom-recovered-told-as-block",
     "an out-of-memory the program recovers from (the same request then answered) gets the "
     "full block", "an out-of-memory is told right", "src/recorder_oom.c",
     "    if (same && ev->type == CUHEAP_EV_ALLOC)\n        tell_recovered(p, ev);",
     "    if (same && ev->type == CUHEAP_EV_ALLOC)\n        tell_real(p), (void)tell_recovered;"),
    ("oom-any-size-is-a-retry",
     "any allocation after an out-of-memory counts as its retry: a program that gave up on the "
     "request and went on is told it recovered", "an out-of-memory is told right",
     "src/recorder_oom.c",
     "    bool same = ev->device == p->device && ev->size == p->size;",
     "    bool same = ev->device == p->device;"),
    ("oom-held-block-lost",
     "an out-of-memory still held when recording stops is never told",
     "an out-of-memory is told right", "src/recorder_oom.c",
     "        if (pending[i].used)\n            tell_real(&pending[i]);\n}",
     "        if (0)\n            tell_real(&pending[i]);\n}"),
    ("oom-static-unnamed",
     "the block names a static function by module and offset, as dladdr alone does",
     "an out-of-memory is told right", "src/elfsym.c",
     "    const struct mapped *m = map_file(path);\n    if (!m)",
     "    const struct mapped *m = map_file(path);\n    if (m)"),
    ("report-counts-recovered",
     "`cuheap report` counts out-of-memory answers the program recovered from as out of memory",
     "an out-of-memory is told right", "tools/cuheap.c",
     "        uint64_t from_ooms = rec < ooms ? rec : ooms;",
     "        uint64_t from_ooms = 0;\n        rec = 0;"),
    ("ranks-lowest-peak",
     "several ranks: the one that peaked lowest is called the one that peaked highest",
     "report and html single out the rank that stands out", "tools/ranks.c",
     "            if (rk->r[i].peak > who->peak)", "            if (rk->r[i].peak < who->peak)"),
    ("chunk-ignores-device-free",
     "vmm: a new chunk is taken whenever the device has room for it, though it leaves the device "
     "less free than the pool's busy chunks hold for no allocation, so near capacity the program "
     "meets a full driver while the pool sits on more than it asks for",
     "out of memory only when the driver alone would say so", "src/pool/phys.c",
     "    return free_b >= bytes + unused;", "    return free_b + unused >= bytes + unused;"),
    ("device-free-asked-every-chunk",
     "vmm: the device's free memory is asked of the driver before every new chunk, far from its "
     "capacity too (a question of microseconds, at times milliseconds, on the allocating thread)",
     "the pool's driver calls are the ones it needs", "src/pool/phys.c",
     "        p->nr_unasked < CUHEAP_FREE_ASK_EVERY) {",
     "        p->nr_unasked < (unsigned)p->vmm_refused) {"),
    ("device-full-never",
     "vmm: a device found full with nothing left to give back or wait for sends no later request "
     "to the driver: the pool keeps taking chunks on the full device, and near capacity the "
     "program is refused what the driver alone grants",
     "out of memory only when the driver alone would say so", "src/pool/pool.c",
     "    if (p->vmm && g == CUHEAP_BE_OOM)\n", "    if (p->vmm && g == CUHEAP_BE_OOM && 0)\n"),
    ("device-full-keeps-holes-filled",
     "vmm: on a full device, blocks keep going into the holes of busy chunks while the pool holds "
     "more for no allocation than the device has free, so its chunks never drain and a larger "
     "request finds the driver full",
     "out of memory only when the driver alone would say so", "src/pool/acquire.c",
     "|| (unused > free_b && free_b >= size);", "|| (0 && unused > free_b && free_b >= size);"),
]


def run(cmd, cwd, log):
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode


def copy_tree(dst):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))


def failed_tests(output):
    """Names of the meson tests that did not pass."""
    names = []
    for line in output.splitlines():
        m = re.match(r"\s*\d+/\d+\s+\S+\s+/\s+(\S+)\s+(FAIL|ERROR|TIMEOUT|UNEXPECTEDPASS)", line)
        if m:
            names.append(m.group(1))
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutation ids")
    ap.add_argument("--report", default=os.path.join(ROOT, "tests", "MUTATIONS.md"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree")
    ap.add_argument("--check", action="store_true",
                    help="only check that every row's text occurs exactly once in its file")
    args = ap.parse_args()
    if args.check:
        # A row whose text the code no longer holds is never applied, yet its last verdict
        # stays in MUTATIONS.md: two rows went unnoticed so on 2026-12-01. CI runs this.
        stale = []
        for mid, _what, _rule, path, text, _replacement in MUTATIONS:
            with open(os.path.join(ROOT, path)) as f:
                n = f.read().count(text)
            if n != 1:
                stale.append(f"{mid} ({path}: found {n} times)")
        for s in stale:
            print(f"mutate: stale row {s}", file=sys.stderr)
        print(f"mutate: {len(MUTATIONS) - len(stale)} of {len(MUTATIONS)} rows apply")
        return 1 if stale else 0
    chosen = MUTATIONS
    if args.only:
        ids = args.only.split(",")
        unknown = [i for i in ids if i not in {m[0] for m in MUTATIONS}]
        if unknown:
            print(f"mutate: unknown mutation id {', '.join(unknown)}", file=sys.stderr)
            return 2
        chosen = [m for m in MUTATIONS if m[0] in ids]

    # the tree the run tests is the one copied now: a commit made meanwhile is not it
    head = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="cuheap-mutate-")
    log = os.path.join(scratch, "mutate.log")
    copy_tree(os.path.join(scratch, "src-tree"))
    tree = os.path.join(scratch, "src-tree")
    build = os.path.join(tree, "build-mutate")
    if run(["meson", "setup", build, "-Dwerror=true"], tree, log) or run(["ninja", "-C", build],
                                                                          tree, log):
        print(f"mutate: the unmutated tree does not build; see {log}", file=sys.stderr)
        return 2
    test_cmd = ["meson", "test", "-C", build, "--suite", "unit", "--suite", "integration",
                "--no-rebuild"]
    baseline = subprocess.run(test_cmd, cwd=tree, capture_output=True, text=True)
    if baseline.returncode != 0:
        print("mutate: the suites fail without any mutation:\n" + baseline.stdout[-3000:],
              file=sys.stderr)
        return 2

    results = []
    for mid, what, rule, path, text, replacement in chosen:
        target = os.path.join(tree, path)
        with open(target) as f:
            original = f.read()
        start = time.time()
        if original.count(text) != 1:
            verdict, caught_by = "STALE (text not found exactly once)", []
        else:
            with open(target, "w") as f:
                f.write(original.replace(text, replacement))
            if run(["ninja", "-C", build], tree, log):
                verdict, caught_by = "DID NOT BUILD", []
            else:
                out = subprocess.run(test_cmd, cwd=tree, capture_output=True, text=True)
                caught_by = failed_tests(out.stdout)
                verdict = "caught" if out.returncode != 0 else "NOT CAUGHT"
                if out.returncode != 0 and not caught_by:
                    caught_by = ["(suite failed)"]
            with open(target, "w") as f:
                f.write(original)
        secs = time.time() - start
        results.append((mid, what, rule, path, verdict, caught_by))
        print(f"mutate: {mid}: {verdict}" + (f" by {', '.join(caught_by)}" if caught_by else "") +
              f" ({secs:.0f} s)", flush=True)
    run(["ninja", "-C", build], tree, log)  # leave the scratch build matching the source

    if args.only and os.path.exists(args.report):
        merge_report(args.report, results)
    else:
        write_report(args.report, results, head, args.only)
    caught = sum(1 for r in results if r[4] == "caught")
    print(f"mutate: {caught} of {len(results)} mutations caught; report: {args.report}")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"mutate: scratch tree kept in {scratch}")
    return 0 if caught == len(results) else 1


def row_of(result):
    mid, what, rule, path, verdict, caught_by = result
    return (f"| `{mid}` | {what} | {rule} | `{path}` | {verdict} | "
            f"{', '.join(caught_by) if caught_by else '-'} |\n")


def merge_report(report, results):
    """--only: the rows run replace theirs in the existing table (new ones go at its end); the
    rest of the report, its history and the other rows, stays as it was."""
    with open(report) as f:
        lines = f.readlines()
    fresh = {r[0]: row_of(r) for r in results}
    for i, line in enumerate(lines):
        mid = line.split("`")[1] if line.startswith("| `") else None
        if mid in fresh:
            lines[i] = fresh.pop(mid)
    last = max((i for i, line in enumerate(lines) if line.startswith("|")), default=len(lines) - 1)
    lines[last + 1:last + 1] = list(fresh.values())
    with open(report, "w") as f:
        f.writelines(lines)


def write_report(report, results, head, only):
    with open(report, "w") as f:
        f.write("# Mutation testing\n\n")
        f.write("Each row is a deliberate breakage of a promise cuheap makes, applied by "
                "`scripts/mutate.py` to a copy of the tree, which is rebuilt and run through the "
                "unit and integration suites. Every breakage must make at least one test fail.\n\n")
        f.write(f"Last run: {datetime.date.today().isoformat()}, commit {head}, "
                f"`python3 scripts/mutate.py`" + (f" `--only {only}`" if only else "") + ".\n\n")
        f.write("| id | breakage | rule | file | result | failing tests |\n")
        f.write("|---|---|---|---|---|---|\n")
        for r in results:
            f.write(row_of(r))


if __name__ == "__main__":
    sys.exit(main())
