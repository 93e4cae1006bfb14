/* SPDX-License-Identifier: MIT */
/*
 * Arenas: an address range with a buddy allocator and per-unit records (requested size, buffer
 * id, list link, extent). Under CUHEAP_BACKING=legacy an arena is device memory from
 * cuMemAlloc, grown and given back here; a vmm arena is address space (phys.c).
 *
 * Lock rule: p->lock held in every _locked function; the driver's allocation and free of a
 * legacy arena are made with it dropped (decided and unlinked under it, published after).
 */
#include "internal.h"

#include <sys/mman.h>

/* Arena structs are never unmapped: a lock-free reader of the map may still hold one. A
 * released arena has buddy.size == 0, which map_lookup() rejects. Its per-unit arrays stay
 * mapped, emptied (address space only), for a thread cache's free racing with the release: it
 * reads a size of 0 there and leaves the answer to the pool. */
struct cuheap_arena *arena_new(struct cuheap_pool *p, uint64_t base, uint64_t size, bool vmm)
{
    struct cuheap_arena *a =
        mmap(NULL, sizeof(*a), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        return NULL;
    memset(a, 0, sizeof(*a));
    if (cuheap_buddy_init(&a->buddy, (uintptr_t)base, size, p->cfg->min_block)) {
        munmap(a, sizeof(*a));
        return NULL;
    }
    /* first fit keeps the blocks; the buddy, never split, keeps the range */
    if (vmm && p->first_fit && cuheap_fit_init(&a->fit, (uintptr_t)base, size, p->cfg->min_block)) {
        cuheap_buddy_destroy(&a->buddy);
        munmap(a, sizeof(*a));
        return NULL;
    }
    size_t n = a->buddy.nr_units;
    uint32_t nr_granules = vmm ? (uint32_t)(size >> p->granule_shift) : 0;
    size_t nr_words = (nr_granules + 63) / 64, nr_summary = (nr_words + 63) / 64;
    a->meta_bytes = 4 * n * sizeof(uint64_t) +
                    nr_granules * (sizeof(struct cuheap_granule) + sizeof(struct cuheap_chunk)) +
                    (nr_words + nr_summary) * sizeof(uint64_t);
    void *m = mmap(NULL, a->meta_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        cuheap_fit_destroy(&a->fit);
        cuheap_buddy_destroy(&a->buddy);
        munmap(a, sizeof(*a));
        return NULL;
    }
    a->block_size = m;
    a->buffer_id = a->block_size + n;
    a->link = a->buffer_id + n;
    a->extent = a->link + n;
    a->granules = nr_granules ? (struct cuheap_granule *)(a->extent + n) : NULL;
    a->chunks = nr_granules ? (struct cuheap_chunk *)(a->granules + nr_granules) : NULL;
    a->mapped_bits = nr_granules ? (uint64_t *)(a->chunks + nr_granules) : NULL;
    a->mapped_words = nr_granules ? a->mapped_bits + nr_words : NULL;
    a->nr_granules = nr_granules;
    a->pool = p;
    return a;
}

void arena_retire(struct cuheap_arena *a)
{
    madvise(a->block_size, a->meta_bytes, MADV_DONTNEED); /* reads as zeros from now on */
    cuheap_fit_destroy(&a->fit);    /* read only under p->lock, where a retired arena is not seen */
    cuheap_buddy_retire(&a->buddy); /* size becomes 0; base and unit size stay for tc_free */
}

/* A new arena is at least this fraction of what the pool holds (rounded up to a power of
 * two): an arena stays until it is empty, so what the last one taken holds beyond the job's
 * peak is held for good, and a quarter held noticeably more than a sixteenth on streams of
 * churn (bench/RESULTS.md). The cost is more, smaller arenas while the job warms up. */
#define CUHEAP_LEGACY_GROWTH 16

/* Take one arena from the device: a CUHEAP_LEGACY_GROWTH-th of what the pool holds, from an
 * eighth of CUHEAP_ARENA_SIZE up to CUHEAP_ARENA_SIZE, so a small program does not hold a
 * whole arena for a few buffers, and an arena adds little beyond what the job uses (a pool
 * that doubled held up to twice as much for good); smaller when a limit or the device leaves
 * less; never smaller than need. With exact, the arena is need bytes (a power of
 * two), no more: CUHEAP_POOL_INIT. Drops p->lock around the driver call. Returns 0, CUHEAP_BE_OOM,
 * or -EDQUOT when the limit is what refused. */
int grow_legacy_locked(struct cuheap_pool *p, uint64_t need, bool exact)
{
    if (p->nr_arenas == CUHEAP_NR_MAX_ARENAS)
        return CUHEAP_BE_OOM;
    if (need < p->cfg->min_block)
        need = p->cfg->min_block;
    need = pow2_ceil(need);
    uint64_t size = p->cfg->arena_size;
    uint64_t step = p->st.reserved / CUHEAP_LEGACY_GROWTH;
    uint64_t target = pow2_ceil(step > size / 8 ? step : size / 8);
    if (target < size || exact)
        size = target > need && !exact ? target : need;
    /* One thread at a time takes an arena, as the mapper does under vmm: threads that all
     * missed at once each took one (four threads on streams of their own grew the pool from
     * 288 to 672 MiB for 123 MiB live), where the first one's arena may serve the others. */
    if (p->mapping) {
        while (p->mapping)
            pool_wait(&p->mapped, p);
        return 0; /* the caller looks again */
    }
    p->mapping = true;
    bool limited = false;
    int r = CUHEAP_BE_OOM;
    uint64_t ptr = 0;
    pool_unlock(p);
    for (; size >= need; size >>= 1) {
        if (p->limit) {
            uint64_t reserved = atomic_load(p->device_reserved);
            if (reserved + size > p->limit) {
                limited = true;
                continue;
            }
        }
        r = dev_mem_alloc(p, size, &ptr);
        if (r != CUHEAP_BE_OOM)
            break;
    }
    if (r == 0 && (ptr & (p->cfg->min_block - 1))) {
        dev_mem_free(p, ptr); /* never expected: the driver aligns to 512 B */
        r = -EINVAL;
    }
    struct cuheap_arena *a = NULL;
    if (r == 0) {
        a = arena_new(p, ptr, size, false);
        if (!a || map_update(a, true)) {
            if (a)
                arena_retire(a);
            dev_mem_free(p, ptr);
            r = -ENOMEM;
        }
    }
    pool_lock(p);
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
    if (r != 0)
        return limited && r == CUHEAP_BE_OOM ? -EDQUOT : r;
    atomic_fetch_add(p->device_reserved, size);
    p->arenas[p->nr_arenas++] = a;
    p->st.reserved += size;
    p->st.nr_arenas++;
    p->nr_empty++;
    pool_note_event(p, CUHEAP_EV_ARENA_GROW, ptr, size, p->st.reserved, 0);
    return 0;
}

/* Remove an empty legacy arena from the pool; the caller gives its memory back after
 * unlocking. (vmm arenas are address space: they stay.) */
uint64_t unlink_arena_locked(struct cuheap_pool *p, unsigned idx, uint64_t *ret_size)
{
    struct cuheap_arena *a = p->arenas[idx];
    uint64_t base = a->buddy.base, size = a->buddy.size;
    cuheap_assert(a->nr_live == 0);
    p->nr_empty--;
    map_update(a, false);
    arena_retire(a);
    p->arenas[idx] = p->arenas[--p->nr_arenas];
    p->hint = 0;
    p->st.nr_arenas--;
    *ret_size = size;
    p->st.reserved -= size;
    atomic_fetch_sub(p->device_reserved, size);
    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, base, size, p->st.reserved, 0);
    return base;
}

/* Give unlinked legacy arenas back to the driver (p->lock not held). One the driver refuses
 * to free (cuMemFree fails, for example during a stream capture) is still device memory the
 * process holds: it comes back into the pool, counted, and goes at a later trim. */
void free_arenas_unlocked(struct cuheap_pool *p, const uint64_t *bases, const uint64_t *sizes,
                          unsigned nr)
{
    for (unsigned i = 0; i < nr; i++) {
        if (dev_mem_free(p, bases[i]) == 0)
            continue;
        pool_lock(p);
        struct cuheap_arena *a =
            p->nr_arenas < CUHEAP_NR_MAX_ARENAS ? arena_new(p, bases[i], sizes[i], false) : NULL;
        if (a && map_update(a, true) == 0) {
            p->arenas[p->nr_arenas++] = a;
            p->st.nr_arenas++;
            p->nr_empty++;
        } else if (a) {
            arena_retire(a);
        }
        /* counted either way: the driver still holds it for this process */
        p->st.reserved += sizes[i];
        atomic_fetch_add(p->device_reserved, sizes[i]);
        if (!a)
            p->st.lost += sizes[i];
        pool_note_event(p, CUHEAP_EV_ARENA_GROW, bases[i], sizes[i], p->st.reserved, 0);
        pool_unlock(p);
    }
}

/* Release every empty legacy arena to the driver. Entered and left with p->lock held, but
 * drops it around the driver calls (free_arenas_unlocked): the caller looks at the pool anew
 * afterwards. Returns how many were released. */
unsigned release_empty_locked(struct cuheap_pool *p)
{
    flush_quick_locked(p);
    uint64_t bases[CUHEAP_NR_MAX_ARENAS], sizes[CUHEAP_NR_MAX_ARENAS];
    unsigned nr = 0;
    for (unsigned i = 0; i < p->nr_arenas;) {
        if (p->arenas[i]->nr_live == 0) {
            bases[nr] = unlink_arena_locked(p, i, &sizes[nr]);
            nr++;
            continue;
        }
        i++;
    }
    if (!nr)
        return 0;
    pool_unlock(p);
    free_arenas_unlocked(p, bases, sizes, nr);
    pool_lock(p);
    return nr;
}

/* CUHEAP_RELEASE=empty: unlink the empty arenas the pool can spare, at most
 * CUHEAP_NR_SPARE_MAX at a time, into bases[] for the caller to give back after unlocking.
 * One empty arena stays as a cushion, so a loop that allocates and frees a small block does
 * not take an arena from the driver and give it back every time, and so does what keeps
 * CUHEAP_POOL_INIT reserved. Returns how many were unlinked. */
unsigned unlink_spare_locked(struct cuheap_pool *p, uint64_t *bases, uint64_t *sizes)
{
    if (p->cfg->release != CUHEAP_RELEASE_EMPTY || p->nr_empty <= 1)
        return 0;
    unsigned nr = 0;
    bool cushion = false;
    for (unsigned i = 0; i < p->nr_arenas && nr < CUHEAP_NR_SPARE_MAX;) {
        struct cuheap_arena *a = p->arenas[i];
        if (a->nr_live == 0 && cushion && p->st.reserved - a->buddy.size >= p->cfg->pool_init) {
            bases[nr] = unlink_arena_locked(p, i, &sizes[nr]);
            nr++;
            continue; /* slot i now holds another arena */
        }
        cushion |= a->nr_live == 0;
        i++;
    }
    return nr;
}
