/* SPDX-License-Identifier: MIT */
/*
 * Physical memory under vmm arenas: granules (2 MiB on current GPUs) and chunks, one driver
 * allocation mapped at a run of granules. A granule is held by the live and pending blocks whose
 * bytes reach into it; a chunk none of whose granules is held is idle, stays mapped for the next
 * block at its address, and is moved or given back when memory is needed elsewhere.
 *
 * Lock rule: p->lock held in every _locked function.
 */
#include "internal.h"

#include <unistd.h>

/* ---- physical memory: granules and chunks (CUHEAP_BACKING=vmm) ---- */

/* One bit per granule with memory mapped, and one per word of those bits that has any set,
 * so that placement skips long unmapped stretches of address space 64 words (128 GiB) at a
 * time (a 4 GiB arena is 2,048 granules, 32 words). */
static void set_mapped_bits(struct cuheap_arena *a, uint32_t first, uint32_t nr, bool on)
{
    for (uint32_t g = first; g < first + nr; g++) {
        uint64_t bit = 1ull << (g % 64);
        if (on)
            a->mapped_bits[g / 64] |= bit;
        else
            a->mapped_bits[g / 64] &= ~bit;
        uint64_t w = g / 64, word_bit = 1ull << (w % 64);
        if (a->mapped_bits[w])
            a->mapped_words[w / 64] |= word_bit;
        else
            a->mapped_words[w / 64] &= ~word_bit;
    }
}

/* The first granule at or after g with memory mapped, or UINT64_MAX. */
uint64_t next_mapped_granule(const struct cuheap_arena *a, uint64_t g)
{
    uint64_t nr_words = (a->nr_granules + 63) / 64, w = g / 64;
    if (w >= nr_words)
        return UINT64_MAX;
    uint64_t bits = a->mapped_bits[w] & (~0ull << (g % 64));
    if (bits)
        return w * 64 + (uint64_t)__builtin_ctzll(bits);
    for (uint64_t s = ++w / 64; w < nr_words; s = w / 64) { /* the next word with a bit set */
        uint64_t words = a->mapped_words[s] & (~0ull << (w % 64));
        if (words) {
            w = s * 64 + (uint64_t)__builtin_ctzll(words);
            return w < nr_words ? w * 64 + (uint64_t)__builtin_ctzll(a->mapped_bits[w])
                                : UINT64_MAX;
        }
        w = (s + 1) * 64;
    }
    return UINT64_MAX;
}

static void idle_push_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    c->idle_prev = p->idle.idle_prev;
    c->idle_next = &p->idle;
    p->idle.idle_prev->idle_next = c;
    p->idle.idle_prev = c;
    p->nr_idle++;
    p->idle_bytes += chunk_bytes(p, c);
}

static void idle_remove_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    c->idle_prev->idle_next = c->idle_next;
    c->idle_next->idle_prev = c->idle_prev;
    c->idle_prev = c->idle_next = NULL;
    p->nr_idle--;
    p->idle_bytes -= chunk_bytes(p, c);
}

/* The granules [*ret_first, *ret_last] that the first bytes of the block at ptr reach into. */
void granule_span(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                  uint64_t bytes, uint32_t *ret_first, uint32_t *ret_last)
{
    uint64_t off = ptr - a->buddy.base;
    *ret_first = (uint32_t)(off >> p->granule_shift);
    *ret_last = (uint32_t)((off + bytes - 1) >> p->granule_shift);
}

/* One more block uses a mapped granule; its chunk stops being idle. */
void hold_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr)
{
    cuheap_assert(gr->chunk);
    if (gr->nr_users++ == 0) {
        gr->chunk->arena->nr_used++;
        if (gr->chunk->nr_busy++ == 0)
            idle_remove_locked(p, gr->chunk);
    }
}

/* A chunk none of whose granules is used stays mapped, at the back of the idle list: the
 * block handed out at its address next needs no driver call. */
void drop_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr)
{
    cuheap_assert(gr->nr_users > 0 && gr->chunk);
    if (--gr->nr_users == 0) {
        gr->chunk->arena->nr_used--;
        if (--gr->chunk->nr_busy == 0)
            idle_push_locked(p, gr->chunk);
    }
}

/* The block at ptr is free again (its fence has passed): it lets go of its granules. */
void unuse_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    uint32_t u = unit_of(a, ptr), first, last;
    if (!a->extent[u])
        return;
    granule_span(p, a, ptr, a->extent[u], &first, &last);
    for (uint32_t g = first; g <= last; g++)
        drop_granule_locked(p, &a->granules[g]);
    a->extent[u] = 0;
}

/* The block at ptr is about to hold size bytes, all of whose granules are mapped: it holds
 * those it does not hold already. Returns 0, or -EAGAIN (nothing held) when one is unmapped. */
int hold_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size)
{
    uint32_t u = unit_of(a, ptr), first, last, held_first, held_last;
    if (size <= a->extent[u])
        return 0;
    granule_span(p, a, ptr, size, &first, &last);
    if (a->extent[u]) {
        granule_span(p, a, ptr, a->extent[u], &held_first, &held_last);
        first = held_last + 1;
    }
    for (uint32_t g = first; g <= last; g++)
        if (!a->granules[g].chunk)
            return -EAGAIN;
    for (uint32_t g = first; g <= last; g++)
        hold_granule_locked(p, &a->granules[g]);
    set_extent_locked(p, a, ptr, size);
    return 0;
}

/* The block at ptr holds the granules of its first size bytes from now on; what the pool's
 * blocks keep busy may have reached a new high (the budget for new chunks). */
void set_extent_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size)
{
    a->extent[unit_of(a, ptr)] = size;
    uint64_t busy = busy_bytes_locked(p);
    if (busy > p->peak_busy)
        p->peak_busy = busy;
}

/* Put physical memory (handle, nr granules) at granule first of arena a, already mapped
 * there by the caller; the chunk is idle until a block holds one of its granules. */
static void place_chunk_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first,
                               uint32_t nr, uint64_t handle)
{
    struct cuheap_chunk *c = &a->chunks[first];
    *c = (struct cuheap_chunk){.handle = handle, .first = first, .nr = nr, .arena = a};
    for (uint32_t g = first; g < first + nr; g++)
        a->granules[g].chunk = c;
    set_mapped_bits(a, first, nr, true);
    a->nr_mapped += nr;
    idle_push_locked(p, c);
}

/* ---- the mapper ----
 *
 * Mapping calls (create, map with access, unmap, release: tens of microseconds each, one at a
 * time in the driver whoever makes them) are made with p->lock dropped, by one thread at a
 * time: the pool's mapper (p->mapping). What a call will touch is taken off every list first
 * (an idle chunk leaves the idle list and its granules before it is unmapped), or is address
 * space no other thread maps meanwhile (only the mapper maps); memory being created or taken
 * apart stays counted in st.reserved (p->inflight_bytes, so that budgets and the limit see
 * it) until the call is over and the result is published. Another thread that needs to map
 * lets go of what it holds and waits (wait_mapper_locked), then looks again. */

/* Whether the calling thread became the mapper (false: another thread is; nothing waited). */
static bool mapper_enter_locked(struct cuheap_pool *p)
{
    if (p->mapping)
        return false;
    p->mapping = true;
    return true;
}

static void mapper_leave_locked(struct cuheap_pool *p, uint64_t ns)
{
    p->st.map_ns += ns;
    p->mapping = false;
    pthread_cond_broadcast(&p->mapped);
}

void wait_mapper_locked(struct cuheap_pool *p)
{
    while (p->mapping)
        pool_wait(&p->mapped, p);
}

/* Become the mapper, waiting for another thread's call first (p->lock dropped meanwhile). */
static void mapper_take_locked(struct cuheap_pool *p)
{
    wait_mapper_locked(p);
    p->mapping = true;
}

/* Unlink an idle chunk for the mapper to unmap: off the idle list and its granules, still
 * counted (inflight). Returns its handle. */
static uint64_t unlink_idle_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    cuheap_assert(!c->nr_busy && p->mapping);
    uint64_t h = c->handle, bytes = chunk_bytes(p, c);
    idle_remove_locked(p, c);
    for (uint32_t g = c->first; g < c->first + c->nr; g++)
        c->arena->granules[g].chunk = NULL;
    set_mapped_bits(c->arena, c->first, c->nr, false);
    c->arena->nr_mapped -= c->nr;
    c->handle = 0;
    p->inflight_bytes += bytes;
    return h;
}

/* Memory that went back to the driver (ok) or that it would not take back: that stays
 * counted, and a later trim tries again (p->stuck). */
void account_release_locked(struct cuheap_pool *p, bool ok, uint64_t handle, uint64_t bytes)
{
    if (ok) {
        p->st.reserved -= bytes;
        atomic_fetch_sub(p->device_reserved, bytes);
    } else if (p->nr_stuck < CUHEAP_NR_STUCK) {
        p->stuck[p->nr_stuck].handle = handle;
        p->stuck[p->nr_stuck++].bytes = bytes;
    } else {
        p->st.lost += bytes;
    }
}

/* Map physical memory at va (with access), once more when the driver failed it (the backend
 * left nothing mapped): one failed call must not cost the program its allocation. p->lock not
 * held. Returns 0, CUHEAP_BE_OOM when the driver said out of memory, or -EIO. */
int map_twice(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle, uint64_t *ns)
{
    int r = dev_phys_map(p, va, bytes, handle, ns);
    if (r)
        r = dev_phys_map(p, va, bytes, handle, ns);
    return !r ? 0 : r == CUHEAP_BE_OOM ? CUHEAP_BE_OOM : -EIO;
}

/* Give an idle chunk back to the driver (p->lock dropped around the calls). Returns its
 * bytes, 0 when it could not be unmapped (it stays, idle) or another thread is the mapper. */
uint64_t release_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    if (!mapper_enter_locked(p))
        return 0;
    struct cuheap_arena *a = c->arena;
    uint32_t first = c->first, nr = c->nr;
    uint64_t va = chunk_va(c), bytes = chunk_bytes(p, c), resets = p->nr_resets, ns = 0;
    uint64_t h = unlink_idle_locked(p, c);
    pool_unlock(p);
    bool unmapped = dev_phys_unmap(p, va, bytes, &ns) == 0;
    bool released = unmapped && dev_phys_release(p, h, &ns) == 0;
    pool_lock(p);
    if (p->nr_resets != resets) { /* the context went meanwhile, and its memory with it */
        mapper_leave_locked(p, ns);
        return 0;
    }
    p->inflight_bytes -= bytes;
    if (!unmapped) {
        place_chunk_locked(p, a, first, nr, h); /* still mapped: idle again, at the back */
        mapper_leave_locked(p, ns);
        return 0;
    }
    account_release_locked(p, released, h, bytes);
    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, va, bytes, p->st.reserved, 0);
    mapper_leave_locked(p, ns);
    return bytes;
}

/* Memory the driver refused to take back before, offered again (the mapper's, p->lock
 * dropped). Returns the bytes it took. */
static uint64_t release_stuck_locked(struct cuheap_pool *p)
{
    uint64_t released = 0;
    for (unsigned n = p->nr_stuck; n-- && p->nr_stuck && mapper_enter_locked(p);) {
        uint64_t h = p->stuck[p->nr_stuck - 1].handle, bytes = p->stuck[p->nr_stuck - 1].bytes;
        uint64_t resets = p->nr_resets, ns = 0;
        p->nr_stuck--;
        p->inflight_bytes += bytes;
        pool_unlock(p);
        bool ok = dev_phys_release(p, h, &ns) == 0;
        pool_lock(p);
        if (p->nr_resets != resets) {
            mapper_leave_locked(p, ns);
            break;
        }
        p->inflight_bytes -= bytes;
        mapper_leave_locked(p, ns);
        if (ok) {
            account_release_locked(p, true, h, bytes);
            released += bytes;
        } else if (p->nr_stuck < CUHEAP_NR_STUCK) { /* still refused: tried last next time */
            p->stuck[p->nr_stuck] = p->stuck[0];
            p->stuck[0].handle = h;
            p->stuck[0].bytes = bytes;
            p->nr_stuck++;
        } else {
            p->st.lost += bytes;
        }
    }
    return released;
}

/* Give idle chunks back to the driver, oldest first, while the pool holds more than keep
 * bytes without them; first, memory the driver refused to take back before. Waits for another
 * thread's mapping call first (p->lock dropped). Returns the bytes released. */
uint64_t release_idle_locked(struct cuheap_pool *p, uint64_t keep)
{
    wait_mapper_locked(p);
    uint64_t released = release_stuck_locked(p);
    for (uint64_t n = p->nr_idle;
         n && p->nr_idle && p->st.reserved >= keep + chunk_bytes(p, p->idle.idle_next); n--) {
        wait_mapper_locked(p);
        if (p->nr_idle && p->st.reserved >= keep + chunk_bytes(p, p->idle.idle_next))
            released += release_chunk_locked(p, p->idle.idle_next);
    }
    return released;
}

/* Take address space for the pool: a vmm arena of CUHEAP_VMM_ARENA bytes, more for a larger
 * request. Costs no device memory. Drops p->lock around the driver call, which is tried once
 * more when it fails for another reason than memory (create_chunk_locked). Returns 0,
 * CUHEAP_BE_OOM, -ENOMEM (no memory for the arena's records) or -EIO (the driver refused). */
int grow_va_locked(struct cuheap_pool *p, uint64_t need)
{
    uint64_t size = need > CUHEAP_VMM_ARENA ? pow2_ceil(need) : CUHEAP_VMM_ARENA, va = 0;
    if (p->vmm_refused || p->to_driver)
        return -EIO; /* no more VMM calls: the driver serves what the pool cannot */
    pool_unlock(p);
    int r = dev_va_reserve(p, size, &va);
    if (r && r != CUHEAP_BE_OOM)
        r = dev_va_reserve(p, size, &va);
    if (r && r != CUHEAP_BE_OOM)
        r = -EIO;
    struct cuheap_arena *a = NULL;
    if (r == 0) {
        a = arena_new(p, va, size, true);
        if (!a || map_update(a, true)) {
            if (a)
                arena_retire(a);
            dev_va_free(p, va, size);
            r = -ENOMEM;
        }
    }
    pool_lock(p);
    if (r == 0 && (p->vmm_refused || p->to_driver)) {
        /* another thread gave the backing up meanwhile (vmm_refused_locked): the address space
         * goes back, and the caller's request to the driver */
        map_update(a, false);
        arena_retire(a);
        pool_unlock(p);
        dev_va_free(p, va, size);
        pool_lock(p);
        return -EIO;
    }
    if (r)
        return r;
    p->arenas[p->nr_arenas++] = a;
    p->st.nr_arenas++;
    p->nr_empty++;
    return 0;
}

#define CUHEAP_FREE_ASK_EVERY 64

/* Whether a new chunk of `bytes` leaves the device at least `unused` bytes free, the bytes the
 * pool's busy chunks hold for no allocation (held_unused_locked); p->lock not held. Near the
 * device's capacity a chunk that leaves less lets the program meet a full driver while the
 * pool sits on more than the program then asks for, where the driver alone would have had it;
 * refused, the request goes to the driver at its own size (pool_alloc_slow). With nothing
 * unused the create itself says whether there is room, so the driver is not asked. A backend
 * that cannot say leaves the answer to the create. */
static bool leaves_room(struct cuheap_pool *p, uint64_t bytes, uint64_t unused)
{
    if (!unused)
        return true;
    /* Far from the device's capacity the last answer, less what this process took through
     * cuheap since, still leaves four times the room: not asked again (a question costs a few
     * microseconds, at times far more), but at least every CUHEAP_FREE_ASK_EVERY chunks, for
     * what other processes and allocators take meanwhile. */
    uint64_t held = atomic_load(p->device_reserved), taken = 0, free_b;
    if (held > p->reserved_seen)
        taken = held - p->reserved_seen;
    if (p->free_seen > taken && p->free_seen - taken >= 4 * (bytes + unused) &&
        p->nr_unasked < CUHEAP_FREE_ASK_EVERY) {
        p->nr_unasked++;
        return true;
    }
    if (!dev_mem_free_bytes(p, &free_b))
        return true;
    p->free_seen = free_b;
    p->reserved_seen = held - bytes; /* counted already, the new chunk is not on the device yet */
    p->nr_unasked = 0;
    return free_b >= bytes + unused;
}

/* New physical memory from the driver, within the limit, mapped at the unmapped granules
 * [first, first + nr) of arena a as one (idle) chunk; p->lock dropped around the calls. A
 * failure that is not for want of memory is tried once more: one failed call must not cost the
 * program its allocation. The bytes count toward the limit and the pool from before the call,
 * so that no other thread's decision overlooks them meanwhile. Returns 0, CUHEAP_BE_OOM,
 * -EDQUOT, -EIO when the driver failed the create or the map twice, or -EBUSY when another
 * thread is the mapper (nothing done: the caller waits and looks again). */
int new_chunk_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first, uint32_t nr)
{
    uint64_t h = 0, va = granule_va(a, first), bytes = (uint64_t)nr << p->granule_shift, ns = 0;
    if (p->limit && atomic_load(p->device_reserved) + bytes > p->limit)
        return -EDQUOT;
    if (!mapper_enter_locked(p))
        return -EBUSY;
    uint64_t resets = p->nr_resets, unused = held_unused_locked(p);
    p->st.reserved += bytes;
    atomic_fetch_add(p->device_reserved, bytes);
    p->inflight_bytes += bytes;
    pool_unlock(p);
    int r = leaves_room(p, bytes, unused) ? dev_phys_create(p, bytes, &h, &ns) : CUHEAP_BE_OOM;
    if (r && r != CUHEAP_BE_OOM)
        r = dev_phys_create(p, bytes, &h, &ns);
    if (r)
        r = r == CUHEAP_BE_OOM ? CUHEAP_BE_OOM : -EIO;
    int m = r ? 0 : map_twice(p, va, bytes, h, &ns);
    /* cannot map it here: give it back to the driver rather than hold it unmapped */
    bool given_back = m && dev_phys_release(p, h, &ns) == 0;
    pool_lock(p);
    if (p->nr_resets != resets) {
        mapper_leave_locked(p, ns);
        return CUHEAP_BE_OOM; /* the context went meanwhile: nothing of it to publish */
    }
    p->inflight_bytes -= bytes;
    if (r) {
        p->st.reserved -= bytes;
        atomic_fetch_sub(p->device_reserved, bytes);
    } else if (m) {
        account_release_locked(p, given_back, h, bytes);
        r = m;
    } else {
        place_chunk_locked(p, a, first, nr, h);
        p->st.nr_creates++;
        pool_note_event(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    }
    mapper_leave_locked(p, ns);
    return r;
}

/* An idle chunk of exactly nr granules, oldest first (the first 64 looked at). */
struct cuheap_chunk *idle_of_size_locked(struct cuheap_pool *p, uint32_t nr)
{
    unsigned n = 0;
    for (struct cuheap_chunk *c = p->idle.idle_next; c != &p->idle && n < 64; c = c->idle_next, n++)
        if (c->nr == nr)
            return c;
    return NULL;
}

/* Move an idle chunk whole to the unmapped granules [first, first + c->nr) of arena a, p->lock
 * dropped around the calls. Returns 0, -EAGAIN when the driver would not unmap it (it stays
 * where it is), -EBUSY when another thread is the mapper, or what the map said (the chunk then
 * went back to the driver). */
int move_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c, struct cuheap_arena *a,
                      uint32_t first)
{
    if (!mapper_enter_locked(p))
        return -EBUSY;
    struct cuheap_arena *from_arena = c->arena;
    uint32_t nr = c->nr, from_first = c->first;
    uint64_t from = chunk_va(c), bytes = chunk_bytes(p, c), va = granule_va(a, first);
    uint64_t resets = p->nr_resets, ns = 0;
    uint64_t h = unlink_idle_locked(p, c);
    pool_unlock(p);
    bool unmapped = dev_phys_unmap(p, from, bytes, &ns) == 0;
    int r = unmapped ? map_twice(p, va, bytes, h, &ns) : 0;
    bool given_back = unmapped && r && dev_phys_release(p, h, &ns) == 0;
    pool_lock(p);
    if (p->nr_resets != resets) {
        mapper_leave_locked(p, ns);
        return CUHEAP_BE_OOM;
    }
    p->inflight_bytes -= bytes;
    if (!unmapped) {
        place_chunk_locked(p, from_arena, from_first, nr, h);
        mapper_leave_locked(p, ns);
        return -EAGAIN;
    }
    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, from, bytes, p->st.reserved, 0);
    if (r) {
        account_release_locked(p, given_back, h, bytes);
        mapper_leave_locked(p, ns);
        return r;
    }
    place_chunk_locked(p, a, first, nr, h);
    p->st.nr_moves++;
    pool_note_event(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    mapper_leave_locked(p, ns);
    return 0;
}

/* The physical memory under the live block at `block` (still the block shared: its buffer id),
 * exported as file descriptors, p->lock dropped around the exports. The caller is not the
 * mapper; this thread is while it exports, so that no chunk under the block is moved or
 * released meanwhile. Returns the number of pieces, -EINVAL, -ENOSPC or -EIO (pool.h). */
int share_locked(struct cuheap_pool *p, uint64_t block, uint64_t buffer_id,
                 struct cuheap_share *pieces, unsigned max)
{
    mapper_take_locked(p);
    struct cuheap_arena *a = p->vmm ? map_lookup(block) : NULL;
    uint64_t handles[CUHEAP_NR_SHARE_MAX];
    if (max > CUHEAP_NR_SHARE_MAX)
        max = CUHEAP_NR_SHARE_MAX;
    uint64_t start, bytes;
    unsigned n = 0;
    bool allocated;
    int r = -EINVAL;
    if (!a || a->pool != p || block_holding(a, block, &start, &bytes, &allocated) || !allocated ||
        start != block || !size_at(a, unit_of(a, block)) ||
        __atomic_load_n(&a->buffer_id[unit_of(a, block)], __ATOMIC_RELAXED) != buffer_id)
        goto out; /* freed (or taken again) since it was exported */
    uint32_t u = unit_of(a, block), first, last;
    granule_span(p, a, block, a->extent[u], &first, &last);
    for (uint32_t g = first; g <= last; g++) {
        struct cuheap_chunk *c = a->granules[g].chunk;
        if (!c || (n && pieces[n - 1].chunk == c))
            continue;
        if (n == max) {
            r = -ENOSPC;
            goto out;
        }
        handles[n] = c->handle;
        pieces[n++] = (struct cuheap_share){.chunk = c,
                                            .offset = (int64_t)(chunk_va(c) - block),
                                            .bytes = chunk_bytes(p, c),
                                            .fd = -1};
    }
    uint64_t resets = p->nr_resets;
    pool_unlock(p);
    r = (int)n;
    for (unsigned i = 0; i < n && r >= 0; i++)
        if (dev_phys_export(p, handles[i], &pieces[i].fd))
            r = -EIO;
    if (r < 0)
        for (unsigned i = 0; i < n; i++)
            if (pieces[i].fd >= 0)
                close(pieces[i].fd);
    pool_lock(p);
    if (p->nr_resets != resets && r >= 0) { /* the context went: those handles with it */
        for (unsigned i = 0; i < n; i++)
            close(pieces[i].fd);
        r = -EINVAL;
    }
out:
    mapper_leave_locked(p, 0);
    return r < 0 ? r : (int)n;
}

/* Every mapped chunk made accessible again to the device's peers (given access since it was
 * mapped), p->lock dropped around each call; this thread is the mapper meanwhile, so that no
 * chunk is moved or released. Returns 0, or -EIO when the driver refused a chunk. */
int grant_access_locked(struct cuheap_pool *p)
{
    mapper_take_locked(p);
    uint64_t resets = p->nr_resets;
    int r = 0;
    for (unsigned i = 0; p->vmm && i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        for (uint32_t g = 0; g < a->nr_granules; g++) {
            if (!a->chunks[g].handle)
                continue;
            uint64_t va = granule_va(a, g), bytes = chunk_bytes(p, &a->chunks[g]);
            pool_unlock(p);
            if (dev_phys_access(p, va, bytes))
                r = -EIO;
            pool_lock(p);
            if (p->nr_resets != resets)
                goto out;
        }
    }
out:
    mapper_leave_locked(p, 0);
    return r;
}
