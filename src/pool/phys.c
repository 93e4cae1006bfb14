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

/* Unmap an idle chunk: its physical memory goes to *ret_handle, for the caller to map
 * elsewhere or give back, and its slot is empty afterwards. Returns 0, or -EIO when the
 * driver refused (the chunk then stays mapped and idle, at the back of the list). */
static int unmap_idle_locked(struct cuheap_pool *p, struct cuheap_chunk *c, uint64_t *ret_handle)
{
    cuheap_assert(!c->nr_busy);
    idle_remove_locked(p, c);
    if (be_phys_unmap(p, chunk_va(c), chunk_bytes(p, c))) {
        idle_push_locked(p, c);
        return -EIO;
    }
    *ret_handle = c->handle;
    for (uint32_t g = c->first; g < c->first + c->nr; g++)
        c->arena->granules[g].chunk = NULL;
    set_mapped_bits(c->arena, c->first, c->nr, false);
    c->arena->nr_mapped -= c->nr;
    c->handle = 0;
    return 0;
}

/* Physical memory no mapping uses goes back to the driver. When the driver refuses, the
 * process still holds it: it stays counted, and a later trim tries again. */
static void give_back_locked(struct cuheap_pool *p, uint64_t handle, uint64_t bytes)
{
    if (be_phys_release(p, handle) == 0) {
        p->st.reserved -= bytes;
        atomic_fetch_sub(p->device_reserved, bytes);
    } else if (p->nr_stuck < CUHEAP_NR_STUCK) {
        p->stuck[p->nr_stuck].handle = handle;
        p->stuck[p->nr_stuck++].bytes = bytes;
    } else {
        p->st.lost += bytes;
    }
}

/* Give an idle chunk back to the driver. Returns its bytes, 0 when it could not be unmapped. */
uint64_t release_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    uint64_t va = chunk_va(c), bytes = chunk_bytes(p, c), h;
    if (unmap_idle_locked(p, c, &h))
        return 0;
    give_back_locked(p, h, bytes);
    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, va, bytes, p->st.reserved, 0);
    return bytes;
}

/* Give idle chunks back to the driver, oldest first, while the pool holds more than keep
 * bytes without them; first, memory the driver refused to take back before. Returns the
 * bytes released. */
uint64_t release_idle_locked(struct cuheap_pool *p, uint64_t keep)
{
    uint64_t released = 0;
    for (unsigned i = 0; i < p->nr_stuck;) {
        if (be_phys_release(p, p->stuck[i].handle) == 0) {
            p->st.reserved -= p->stuck[i].bytes;
            atomic_fetch_sub(p->device_reserved, p->stuck[i].bytes);
            released += p->stuck[i].bytes;
            p->stuck[i] = p->stuck[--p->nr_stuck];
            continue;
        }
        i++;
    }
    for (uint64_t n = p->nr_idle;
         n && p->nr_idle && p->st.reserved >= keep + chunk_bytes(p, p->idle.idle_next); n--)
        released += release_chunk_locked(p, p->idle.idle_next);
    return released;
}

/* New physical memory from the driver, within the limit. A failure that is not for want of
 * memory is tried once more: one failed call must not cost the program its allocation.
 * Returns 0, CUHEAP_BE_OOM, -EDQUOT, or -EIO when the driver failed it twice. */
static int create_chunk_locked(struct cuheap_pool *p, uint64_t bytes, uint64_t *ret_handle)
{
    if (p->limit && atomic_load(p->device_reserved) + bytes > p->limit)
        return -EDQUOT;
    int r = be_phys_create(p, bytes, ret_handle);
    if (r && r != CUHEAP_BE_OOM)
        r = be_phys_create(p, bytes, ret_handle);
    if (r)
        return r == CUHEAP_BE_OOM ? CUHEAP_BE_OOM : -EIO;
    p->st.reserved += bytes;
    p->st.nr_creates++;
    atomic_fetch_add(p->device_reserved, bytes);
    return 0;
}

/* Take address space for the pool: a vmm arena of CUHEAP_VMM_ARENA bytes, more for a larger
 * request. Costs no device memory. Drops p->lock around the driver call, which is tried once
 * more when it fails for another reason than memory (create_chunk_locked). Returns 0,
 * CUHEAP_BE_OOM, -ENOMEM (no memory for the arena's records) or -EIO (the driver refused). */
int grow_va_locked(struct cuheap_pool *p, uint64_t need)
{
    uint64_t size = need > CUHEAP_VMM_ARENA ? pow2_ceil(need) : CUHEAP_VMM_ARENA, va = 0;
    pthread_mutex_unlock(&p->lock);
    int r = p->be.va_reserve(p->be.ctx, size, &va);
    if (r && r != CUHEAP_BE_OOM)
        r = p->be.va_reserve(p->be.ctx, size, &va);
    if (r && r != CUHEAP_BE_OOM)
        r = -EIO;
    struct cuheap_arena *a = NULL;
    if (r == 0) {
        a = arena_new(p, va, size, true);
        if (!a || map_update(a, true)) {
            if (a)
                arena_retire(a);
            p->be.va_free(p->be.ctx, va, size);
            r = -ENOMEM;
        }
    }
    pthread_mutex_lock(&p->lock);
    if (r == 0 && !p->vmm) {
        /* another thread gave the backing up meanwhile (vmm_refused_locked): the caller looks
         * at the pool anew, now a legacy one */
        map_update(a, false);
        arena_retire(a);
        p->be.va_free(p->be.ctx, va, size);
        return 0;
    }
    if (r)
        return r;
    p->arenas[p->nr_arenas++] = a;
    p->st.nr_arenas++;
    p->nr_empty++;
    return 0;
}

/* Map physical memory at va (with access), once more when the driver failed it (the backend
 * left nothing mapped): one failed call must not cost the program its allocation. Returns 0,
 * CUHEAP_BE_OOM when the driver said out of memory, or -EIO. */
static int map_chunk_locked(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle)
{
    int r = be_phys_map(p, va, bytes, handle);
    if (r)
        r = be_phys_map(p, va, bytes, handle);
    return !r ? 0 : r == CUHEAP_BE_OOM ? CUHEAP_BE_OOM : -EIO;
}

/* New physical memory mapped at the unmapped granules [first, first + nr) of arena a, as one
 * (idle) chunk. Returns 0, CUHEAP_BE_OOM, -EDQUOT or -EIO (the driver refused the create or
 * the map twice). */
int new_chunk_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first, uint32_t nr)
{
    uint64_t h, va = granule_va(a, first), bytes = (uint64_t)nr << p->granule_shift;
    int r = create_chunk_locked(p, bytes, &h);
    if (r)
        return r;
    if ((r = map_chunk_locked(p, va, bytes, h))) {
        /* cannot map it here: give it back to the driver rather than hold it unmapped */
        give_back_locked(p, h, bytes);
        return r;
    }
    place_chunk_locked(p, a, first, nr, h);
    pool_note_event(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    return 0;
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

/* Move an idle chunk whole to the unmapped granules [first, first + c->nr) of arena a.
 * Returns 0, -EAGAIN when the driver would not unmap it (it stays where it is), or what
 * map_chunk_locked() said (the chunk then went back to the driver). */
int move_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c, struct cuheap_arena *a,
                      uint32_t first)
{
    uint32_t nr = c->nr;
    uint64_t from = chunk_va(c), bytes = chunk_bytes(p, c), va = granule_va(a, first), h;
    if (unmap_idle_locked(p, c, &h))
        return -EAGAIN;
    pool_note_event(p, CUHEAP_EV_ARENA_RELEASE, from, bytes, p->st.reserved, 0);
    int r = map_chunk_locked(p, va, bytes, h);
    if (r) {
        give_back_locked(p, h, bytes);
        return r;
    }
    place_chunk_locked(p, a, first, nr, h);
    p->st.nr_moves++;
    pool_note_event(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    return 0;
}
