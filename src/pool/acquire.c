/* SPDX-License-Identifier: MIT */
/*
 * Where a vmm block gets its memory: the granules it needs that are not mapped come from an
 * idle chunk moved there, a new chunk within the pool's budget, or, past the budget, from blocks
 * waiting for a fence, waited for. Also what happens when the driver refuses the backing.
 *
 * Lock rule: p->lock held in every _locked function; every wait drops it with nothing held
 * (map_wait_locked), and the block's range is looked at anew afterwards.
 */
#include "internal.h"

/* Put every block freed but not yet behind a fence (open epoch, stream caches, thread caches)
 * behind one, once per allocation. Returns whether it did so now. Past the pool's budget only
 * the caller's own cache is drained (all: false): draining every thread's makes each pass a
 * memory barrier (membarrier(2)) and takes its ready blocks, so that its next allocations take
 * the pool's lock, and a loop of large pairs past the budget did so on every pair. What the
 * others keep may then make the pool map more rather than wait; a full device or limit drains
 * them all (all: true, once more after the caller's alone). Draining only one's own cache
 * costs threads that contend nothing (their time goes to the pool's lock), and a job with one
 * allocating thread sees no difference. */
static bool fence_pending_once_locked(struct cuheap_pool *p, struct acquire *acq, bool all)
{
    if (all ? acq->fenced_all : acq->fenced)
        return false;
    acq->fenced = true;
    acq->fenced_all = all;
    if (all)
        tc_drain_all_locked(p, false); /* what threads keep ready holds memory too */
    else
        tc_drain_mine_locked(p);
    flush_stream_caches_locked(p);
    close_epoch_locked(p);
    return true;
}

/* Everything the pool holds for nobody back to the driver: the open batch of frees closed
 * (returned at once while every stream is idle), the batches whose fences passed reclaimed, the
 * quick lists merged, then the idle chunks. What the driver must see before the pool stops
 * mapping. May drop p->lock. Returns the bytes released. */
static uint64_t release_unused_locked(struct cuheap_pool *p)
{
    close_epoch_locked(p);
    reclaim_locked(p);
    flush_quick_locked(p);
    return release_idle_locked(p, 0);
}

/* The driver failed a VMM call twice over, and not for want of memory (create_chunk_locked,
 * map_chunk_locked, grow_va_locked; a full device is no refusal: it goes through the pool's
 * reclaim, then to the driver). The backing does not work on this device, as on some
 * virtualized or partitioned GPUs, older drivers and containers (on WSL2 cuMemSetAccess
 * answers CUDA_ERROR_UNKNOWN although the device advertises VMM, and every allocation of
 * PyTorch's expandable segments fails), so the pool makes no more mapping calls: a request
 * that needs new memory goes to the driver, and once the pool holds nothing, now or at a later
 * refusal (its idle chunks given back first), every request does (p->to_driver), its address
 * space given back. Not a legacy pool: its arenas held far more of the device than the driver
 * alone, and failed jobs near the device's capacity that the driver alone ran
 * (bench/RESULTS.md); CUHEAP_BACKING=legacy still asks for one. May drop p->lock. */
void vmm_refused_locked(struct cuheap_pool *p)
{
    if (!p->vmm || p->to_driver)
        return; /* another thread saw to it (grow_va_locked drops the lock) */
    p->vmm_refused = CUHEAP_VMM_TO_DRIVER;
    tc_drain_all_locked(p, false);
    flush_stream_caches_locked(p); /* a stream's kept block holds its granules for good else */
    release_unused_locked(p);
    if (p->st.reserved || p->nr_empty != p->nr_arenas) /* blocks in use or pending, or memory */
        return;
    /* no cache holds a block (each would be one in use); held still while the backing changes */
    tc_hold_all(p);
    unsigned nr = p->nr_arenas;
    uint64_t vas[CUHEAP_NR_MAX_ARENAS], sizes[CUHEAP_NR_MAX_ARENAS];
    for (unsigned i = 0; i < nr; i++) {
        struct cuheap_arena *a = p->arenas[i];
        vas[i] = a->buddy.base;
        sizes[i] = a->buddy.size;
        map_update(a, false);
        arena_retire(a);
    }
    p->nr_arenas = p->nr_empty = p->hint = 0;
    p->st.nr_arenas = 0;
    p->peak_busy = 0;
    __atomic_store_n(&p->to_driver, true, __ATOMIC_RELEASE);
    tc_unhold_all(p);
    pool_unlock(p); /* address space nobody can reach any more: given back with no lock */
    for (unsigned i = 0; i < nr; i++)
        dev_va_free(p, vas[i], sizes[i]);
    pool_lock(p);
}

/* The device was full for a request the pool could not place even after giving back what it
 * holds idle and waiting for what is pending (pool_alloc_slow). From now on a request that the
 * pool's mapped memory cannot hold goes to the driver at its own size (device_full_locked)
 * rather than to a new chunk or an idle one moved. Near the device's capacity a chunk costs the
 * program more of the device than the driver's own allocations would (it rounds to granules,
 * and blocks keep partly used chunks busy), while a block in the holes of busy chunks costs it
 * nothing. So the pool stops growing, and as its blocks are freed its chunks go idle and back
 * to the driver when it needs room (cuheap_reclaim_for_driver). The state ends once the busy
 * chunks hold half of what they held here: that much of the device went back to the program,
 * so growing is worth trying again, within what the device has free (new_chunk_locked).
 * Ending only once the pool is empty would keep a long job that touched the ceiling once off
 * the pool for good; ending at the first chunk given back would ask the full device again at
 * once. */
void device_full_begin_locked(struct cuheap_pool *p)
{
    if (p->device_full)
        return;
    __atomic_store_n(&p->device_full, true, __ATOMIC_RELAXED); /* read unlocked too */
    p->full_until = busy_bytes_locked(p) / 2;
}

/* Whether the request for size bytes at the block ptr of arena a goes to the driver at its
 * own size (device_full_begin_locked), with p->lock held; free_b: what the driver said was
 * free just before (UINT64_MAX: not asked). Not once the busy chunks shrank enough; nor while
 * freed blocks wait for a fence, which the pool's own path waits for and serves from (passed
 * to the driver instead, the request would find the device full of the very memory the wait
 * gives back); nor while the busy chunks hold nothing beyond the live bytes, since the pool
 * then costs the device no more than the driver's own allocations would. A block in memory
 * the pool has mapped is served there, at no cost to the device, unless the pool holds more
 * for no allocation than the device has free and the driver has room for the request: then
 * the holes, kept filled, would keep their chunks busy for good, and the next request larger
 * than the device's free would find the driver full where the driver alone had room; passed
 * to the driver, such requests let the chunks drain. Not every request: while the driver has
 * room to spare, one the holes can hold costs the device nothing there, and the driver would
 * take device memory for it. */
bool device_full_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                        uint64_t free_b)
{
    if (!p->device_full)
        return false;
    reclaim_locked(p); /* blocks whose fence passed: their chunks may be idle now */
    return_if_idle_locked(p);
    if (busy_bytes_locked(p) <= p->full_until)
        __atomic_store_n(&p->device_full, false, __ATOMIC_RELAXED);
    uint64_t unused = held_unused_locked(p);
    if (!p->device_full || p->st.pending || !unused)
        return false;
    return !block_mapped_locked(p, a, ptr, size) || (unused > free_b && free_b >= size);
}

/* Physical memory for the unmapped granules [first, first + nr) of arena a, as one chunk:
 * an idle chunk of that size moved here (one unmap, one map); else a new chunk, within the
 * pool's budget: the most memory its blocks have used at once so far, plus a small cushion.
 * Idle chunks past the budget go back to the driver first, oldest first, so the pool holds
 * about what the job needs at its peak, and off-peak idle chunks stay where they are for the
 * blocks that come back to them. Growing past the budget is what waiting beats (the driver's
 * own free waits for the whole device every time): blocks that wait for a fence are waited
 * for first, and the question asked again. When the device or the limit is full, idle chunks
 * go, then pending ones are waited for. Returns 0, CUHEAP_BE_OOM, -EDQUOT or -EIO; or, where
 * waiting is next, MAP_FENCE_POLL, MAP_FENCE or MAP_WAIT for the caller to do with nothing held
 * (map_wait_locked), since each drops p->lock; MAP_BUSY when another thread is making a
 * mapping call (only one does at a time, phys.c): granules of the block's range that were
 * unmapped may be mapped meanwhile by a thread whose block shares them, and a run mapped over
 * them broke the accounting (seen once under CI's load, `pool_check`: a chunk idle with a
 * granule in use). */
enum { MAP_FENCE_POLL = 1, MAP_FENCE, MAP_WAIT, MAP_DEVICE_SYNC, MAP_BUSY };

static int map_run_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first,
                          uint32_t nr, struct acquire *acq)
{
    uint64_t need = (uint64_t)nr << p->granule_shift;
    bool moves = true;
    if (p->vmm_refused)
        return -EIO; /* no more mapping calls (vmm_refused_locked) */
    /* Another thread's mapping call may map granules of this block's range: wait for it with
     * nothing held. Not again below: p->lock is held here but inside this thread's own calls,
     * during which this thread is the mapper. */
    if (p->mapping)
        return MAP_BUSY;
    for (;;) {
        struct cuheap_chunk *c = moves ? idle_of_size_locked(p, nr) : NULL;
        if (c) {
            int m = move_chunk_locked(p, c, a, first);
            if (m == -EBUSY)
                return MAP_BUSY;
            if (m != -EAGAIN && m != CUHEAP_BE_OOM)
                return m;
            moves = false; /* the driver would not move it: make a new one instead */
            continue;
        }
        uint64_t budget = p->peak_busy + p->cfg->vmm_cushion; /* CUHEAP_VMM_CUSHION */
        bool waiting = p->ep_head != p->ep_tail;
        if (p->st.reserved + need > budget && p->st.reserved + need - budget > p->idle_bytes) {
            /* past the job's high-water mark: blocks that wait for a fence first */
            if (reclaim_locked(p))
                continue;
            if (!acq->fenced)
                return MAP_FENCE_POLL;
            if (waiting && p->st.pending >= granule_bytes(p) && !acq->waited_in_vain)
                return MAP_WAIT;
        }
        for (uint64_t n = p->nr_idle; n && p->nr_idle && p->st.reserved + need > budget; n--)
            if (release_chunk_locked(p, p->idle.idle_next))
                p->st.nr_releases++;
        int r = new_chunk_locked(p, a, first, nr);
        if (r == -EBUSY)
            return MAP_BUSY;
        if (r == 0 || r == -EIO)
            return r;
        /* the device or the limit is full: idle memory goes first, then what is pending */
        if (release_idle_locked(p, 0))
            continue;
        if (reclaim_locked(p))
            continue;
        if (!acq->fenced_all)
            return MAP_FENCE;
        if (p->ep_head == p->ep_tail) /* blocks another thread syncs for come back soon */
            return p->syncing ? MAP_DEVICE_SYNC : r;
        return acq->waited_in_vain ? r : MAP_WAIT;
    }
}

/* What map_run_locked() asked for (p->lock held on entry and exit, dropped meanwhile). */
static void map_wait_locked(struct cuheap_pool *p, int what, struct acquire *acq)
{
    if (what == MAP_BUSY)
        wait_mapper_locked(p);
    else if (what == MAP_DEVICE_SYNC)
        wait_syncing_locked(p);
    else if (what == MAP_WAIT)
        acq->waited_in_vain |= !wait_oldest_locked(p);
    else if (fence_pending_once_locked(p, acq, what == MAP_FENCE) && what == MAP_FENCE_POLL)
        poll_oldest_locked(p);
}

/* Under first fit a chunk is at most this share of the memory the job's blocks have kept busy
 * at most (a granule at least, CUHEAP_VMM_CHUNK at most). Blocks lie anywhere there, not on
 * power-of-two places, so a chunk's last granule is often the next block's first: that block
 * keeps the whole chunk busy once the chunk's own block is freed, and a small job's few large
 * blocks then held several granules each for nothing (bench/RESULTS.md, cupy-nopool). A large
 * job keeps its chunks of CUHEAP_VMM_CHUNK, and so its few mapping calls. */
#define CUHEAP_FIT_CHUNK_SHARE 64

/* Granules a new chunk may cover at most under first fit, for a block over span granules: small
 * jobs' chunks are small, but no block is mapped in more than about CUHEAP_NR_SHARE_MAX / 2 chunks
 * (an export of it to another process takes a piece each). */
static uint32_t fit_chunk_max(const struct cuheap_pool *p, uint32_t span)
{
    uint64_t busy = busy_bytes_locked(p);
    if (busy < p->peak_busy)
        busy = p->peak_busy;
    uint64_t n = (busy / CUHEAP_FIT_CHUNK_SHARE) >> p->granule_shift;
    uint64_t few = (span + CUHEAP_NR_SHARE_MAX / 2 - 1) / (CUHEAP_NR_SHARE_MAX / 2);
    if (n < few)
        n = few;
    return n < 1 ? 1 : n < p->chunk_max ? (uint32_t)n : p->chunk_max;
}

/* The granules [*ret_start, *ret_end] one new chunk covers, for the unmapped granule g that
 * the block at ptr needs (its last needed granule: last).
 * tight: from g to the next mapped granule, at most `last` and CUHEAP_VMM_CHUNK, so a block
 * holds only what it uses; but the chunks made are of every size, and an idle one is moved
 * only to a place of its size, so the rest go back to the driver and new ones are made.
 * aligned: the unmapped granules of the CUHEAP_VMM_CHUNK-aligned piece around g, so that
 * chunks are one size and any idle one can move anywhere: fewer mapping calls and a faster
 * step (a mapping call costs the step more than the call's own time), for more memory held,
 * and in some long replays much more, so tight stays the default. A block of a piece or more
 * owns its pieces' address space,
 * so its last chunk ends where the block's bytes do (a 20 MiB block holds 20 MiB, as PyTorch's
 * segments need); a smaller one maps the piece its neighbours will share. */
static void chunk_bounds(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                         uint32_t g, uint32_t last, bool only_needed, uint32_t *ret_start,
                         uint32_t *ret_end)
{
    uint32_t start = g, end = g;
    if (p->cfg->vmm_layout == CUHEAP_VMM_TIGHT) {
        uint32_t span = last + 1 - (uint32_t)((ptr - a->buddy.base) >> p->granule_shift);
        uint32_t most = p->first_fit ? fit_chunk_max(p, span) : p->chunk_max;
        while (end < last && !a->granules[end + 1].chunk && end + 1 - g < most)
            end++;
    } else {
        uint32_t piece = g - g % p->chunk_max, piece_end = piece + p->chunk_max - 1;
        if (piece_end >= a->nr_granules)
            piece_end = a->nr_granules - 1;
        int64_t bytes = block_bytes_at(a, ptr);
        bool owns = bytes >= (int64_t)((uint64_t)p->chunk_max << p->granule_shift);
        /* near the limit or a full device, the granules the block needs, still inside the
         * piece: a whole piece must not turn the last few MiB into out-of-memory */
        if ((owns || only_needed) && piece_end > last)
            piece_end = last;
        while (start > piece && !only_needed && !a->granules[start - 1].chunk)
            start--;
        while (end < piece_end && !a->granules[end + 1].chunk)
            end++;
    }
    *ret_start = start;
    *ret_end = end;
}

/* The bytes of the mapped granules from the block at ptr up to its granule last: those it
 * holds while the rest are mapped (use_granules_locked), about to be live with it. */
static uint64_t held_bytes(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                           uint32_t last)
{
    uint64_t n = 0;
    for (uint32_t g = (uint32_t)((ptr - a->buddy.base) >> p->granule_shift); g <= last; g++)
        n += a->granules[g].chunk != NULL;
    return n << p->granule_shift;
}

/* The block at ptr is about to hold size bytes: hold the granules they reach into, beyond
 * those it holds already (a block reused on the same stream keeps its granules), mapping
 * the unmapped ones in chunks (chunk_bounds). On failure nothing new is held. Returns 0,
 * CUHEAP_BE_OOM, -EDQUOT or -EIO. */
int use_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                        struct acquire *acq)
{
    uint32_t u = unit_of(a, ptr), first, last, held_first, held_last;
    uint64_t old = a->extent[u];
    if (size <= old)
        return 0;
again:
    granule_span(p, a, ptr, size, &first, &last);
    if (old) {
        granule_span(p, a, ptr, old, &held_first, &held_last);
        first = held_last + 1;
    }
    /* what is mapped first: its chunks are then busy, and making room cannot give them back */
    for (uint32_t g = first; g <= last; g++)
        if (a->granules[g].chunk)
            hold_granule_locked(p, &a->granules[g]);
    for (uint32_t g = first; g <= last;) {
        if (a->granules[g].chunk) {
            g++;
            continue;
        }
        uint32_t start, end;
        chunk_bounds(p, a, ptr, g, last, acq->only_needed, &start, &end);
        bool mapper = !p->mapping; /* else map_run_locked answers MAP_BUSY at once */
        if (mapper) {
            p->granting = a;
            p->granting_ptr = ptr;
            p->granting_size = size;
            p->granting_held = held_bytes(p, a, ptr, last);
        }
        int r = map_run_locked(p, a, start, end - start + 1, acq);
        if (mapper)
            p->granting = NULL;
        if (r) {
            for (uint32_t h = first; h <= last; h++)
                if (a->granules[h].chunk) /* below g all, beyond it those held above */
                    drop_granule_locked(p, &a->granules[h]);
            if (r == MAP_FENCE_POLL || r == MAP_FENCE || r == MAP_WAIT || r == MAP_DEVICE_SYNC ||
                r == MAP_BUSY) {
                /* nothing held while p->lock is dropped; then the range is looked at anew */
                map_wait_locked(p, r, acq);
                goto again;
            }
            if ((r == CUHEAP_BE_OOM || r == -EDQUOT) && !acq->only_needed &&
                p->cfg->vmm_layout == CUHEAP_VMM_ALIGNED) {
                acq->only_needed = true; /* a whole piece did not fit: what the block needs */
                goto again;
            }
            return r;
        }
        for (; g <= end && g <= last; g++)
            hold_granule_locked(p, &a->granules[g]);
    }
    set_extent_locked(p, a, ptr, size);
    return 0;
}

/* CUHEAP_POOL_INIT under vmm: idle granules mapped at the start of the first arena, each its
 * own chunk so that blocks of any size can use them (one driver call each, once); under the
 * aligned layout, the unmapped granules of each piece as one chunk (the size chunks come in;
 * a piece may be mapped in part already), no more than asked for. */
int reserve_granules_locked(struct cuheap_pool *p, uint64_t bytes)
{
    int r = p->nr_arenas ? 0 : grow_va_locked(p, bytes);
    if (r == 0 && (!p->vmm || p->vmm_refused))
        r = -EIO; /* the backing was given up (meanwhile): no more mapping calls */
    if (r)
        return r == -EIO ? -EIO : -ENOMEM;
    struct cuheap_arena *a = p->arenas[0];
    uint32_t piece = p->cfg->vmm_layout == CUHEAP_VMM_ALIGNED ? p->chunk_max : 1;
    for (uint32_t g = 0; g < a->nr_granules && p->st.reserved < bytes;) {
        if (a->granules[g].chunk) {
            g++;
            continue;
        }
        uint64_t want = (bytes - p->st.reserved + granule_bytes(p) - 1) >> p->granule_shift;
        uint32_t end = g, piece_end = g - g % piece + piece - 1;
        while (end < piece_end && end + 1 < a->nr_granules && !a->granules[end + 1].chunk &&
               end + 1 - g < want)
            end++;
        if ((r = new_chunk_locked(p, a, g, end - g + 1)) == -EBUSY) {
            wait_mapper_locked(p); /* another thread's mapping call: then look again */
            if (!p->vmm || p->vmm_refused)
                return -EIO;
            continue;
        }
        if (r)
            return r == -EIO ? -EIO : -ENOMEM;
        g = end + 1;
    }
    if (p->st.reserved > p->peak_busy)
        p->peak_busy = p->st.reserved; /* asked for: not to be given back to make room */
    return p->st.reserved >= bytes ? 0 : -ENOMEM;
}
