/* SPDX-License-Identifier: MIT */
/*
 * The per-device pool (see pool.h for the rules and the locking).
 *
 * Life of a block under CUHEAP_REUSE=fence: cuheap_pool_free() marks it not live and puts it
 * on the open epoch's list; after CUHEAP_FENCE_BATCH frees the epoch is closed by recording a
 * device-wide fence; when that fence has completed, reclaim_locked() gives the blocks back to
 * the buddy allocator. An allocation that misses the free lists first reclaims completed
 * epochs, then grows the pool, then waits for the oldest fence: the order the issue asks for.
 */
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#include "event.h"
#include "log.h"

#define TC_NR_ORDERS 18 /* orders a thread cache may keep: up to 128 KiB (see tc_max_order) */

/* ---- global address map: 2 MiB granule -> arena, read without locks ---- */

#define GRANULE_SHIFT 21
#define NR_MAP_SLOTS  (1u << 18) /* 512 GiB of arenas at 2 MiB granules, half full */
#define MAP_EMPTY     0
#define MAP_TOMB      UINT64_MAX

struct map_slot {
    _Atomic uint64_t key; /* granule + 1, MAP_EMPTY or MAP_TOMB */
    _Atomic(struct cuheap_arena *) arena;
};

static struct map_slot *g_map;
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;
static void map_init(void)
{
    void *m = mmap(NULL, NR_MAP_SLOTS * sizeof(struct map_slot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g_map = m == MAP_FAILED ? NULL : m;
}

static uint32_t map_hash(uint64_t key)
{
    key *= 0x9e3779b97f4a7c15ull;
    return (uint32_t)(key >> 40) & (NR_MAP_SLOTS - 1);
}

/* The arena this thread looked up last: a thread frees near where it allocated. A released
 * arena's size is 0, so it never answers again. */
static __thread struct cuheap_arena *map_last __attribute__((tls_model("initial-exec")));

/* An arena's size as a lock-free reader sees it: 0 once retired (under p->lock, while a
 * thread cache's free may be looking; TSan saw the plain read race with the retire). */
static uint64_t arena_size_seen(const struct cuheap_arena *a)
{
    return __atomic_load_n(&a->buddy.size, __ATOMIC_ACQUIRE);
}

static struct cuheap_arena *map_lookup(uint64_t addr)
{
    struct cuheap_arena *last = map_last;
    if (last && addr - last->buddy.base < arena_size_seen(last))
        return last;
    struct map_slot *map = g_map;
    if (!map)
        return NULL;
    uint64_t key = (addr >> GRANULE_SHIFT) + 1;
    for (uint32_t i = map_hash(key), n = 0; n < NR_MAP_SLOTS;
         i = (i + 1) & (NR_MAP_SLOTS - 1), n++) {
        uint64_t k = atomic_load_explicit(&map[i].key, memory_order_acquire);
        if (k == MAP_EMPTY)
            return NULL;
        if (k != key)
            continue;
        struct cuheap_arena *a = atomic_load_explicit(&map[i].arena, memory_order_acquire);
        if (a && addr >= a->buddy.base && addr < a->buddy.base + arena_size_seen(a)) {
            map_last = a;
            return a;
        }
    }
    return NULL;
}

/* Register or unregister every granule the arena touches. g_map_lock taken inside. */
static int map_update(struct cuheap_arena *a, bool add)
{
    pthread_once(&g_map_once, map_init);
    if (!g_map)
        return -ENOMEM;
    uint64_t first = a->buddy.base >> GRANULE_SHIFT;
    uint64_t last = (a->buddy.base + a->buddy.size - 1) >> GRANULE_SHIFT;
    pthread_mutex_lock(&g_map_lock);
    for (uint64_t g = first; g <= last; g++) {
        uint64_t key = g + 1;
        uint32_t i = map_hash(key), n = 0;
        if (add) {
            for (; n < NR_MAP_SLOTS; i = (i + 1) & (NR_MAP_SLOTS - 1), n++) {
                uint64_t k = atomic_load_explicit(&g_map[i].key, memory_order_relaxed);
                if (k == key && atomic_load(&g_map[i].arena)) {
                    /* granule shared with another arena: only possible for unaligned arenas */
                    pthread_mutex_unlock(&g_map_lock);
                    for (uint64_t u = first; u < g; u++) {
                        /* roll back what we added */
                        uint64_t uk = u + 1;
                        for (uint32_t j = map_hash(uk);; j = (j + 1) & (NR_MAP_SLOTS - 1))
                            if (atomic_load(&g_map[j].key) == uk &&
                                atomic_load(&g_map[j].arena) == a) {
                                atomic_store(&g_map[j].arena, NULL);
                                atomic_store(&g_map[j].key, MAP_TOMB);
                                break;
                            }
                    }
                    return -EEXIST;
                }
                if (k == MAP_EMPTY || k == MAP_TOMB) {
                    atomic_store_explicit(&g_map[i].arena, a, memory_order_relaxed);
                    atomic_store_explicit(&g_map[i].key, key, memory_order_release);
                    break;
                }
            }
            if (n == NR_MAP_SLOTS) {
                pthread_mutex_unlock(&g_map_lock);
                return -ENOSPC;
            }
        } else {
            for (; n < NR_MAP_SLOTS; i = (i + 1) & (NR_MAP_SLOTS - 1), n++) {
                uint64_t k = atomic_load_explicit(&g_map[i].key, memory_order_relaxed);
                if (k == MAP_EMPTY)
                    break;
                if (k == key && atomic_load(&g_map[i].arena) == a) {
                    atomic_store_explicit(&g_map[i].arena, NULL, memory_order_release);
                    atomic_store_explicit(&g_map[i].key, MAP_TOMB, memory_order_release);
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&g_map_lock);
    return 0;
}

static atomic_bool tc_asym; /* thread caches, below */
static void tc_asym_register(void);
static pthread_once_t tc_asym_once;

void cuheap_pool_atfork_child(void)
{
    pthread_mutex_init(&g_map_lock, NULL);
    /* whether the registration crossed the fork or not, the child's own (the only thread is
     * this one, inside no cache) */
    if (atomic_load(&tc_asym))
        tc_asym_register();
}

struct cuheap_pool *cuheap_pool_of(uint64_t ptr)
{
    struct cuheap_arena *a = map_lookup(ptr);
    return a ? a->pool : NULL;
}

/* ---- arenas ---- */

static uint32_t unit_of(const struct cuheap_arena *a, uint64_t addr)
{
    return (uint32_t)((addr - a->buddy.base) >> a->buddy.min_order);
}

/* Arena structs are never unmapped: a lock-free reader of the map may still hold one. A
 * released arena has buddy.size == 0, which map_lookup() rejects. Its per-unit arrays stay
 * mapped, emptied (address space only), for a thread cache's free racing with the release: it
 * reads a size of 0 there and leaves the answer to the pool. */
static struct cuheap_arena *arena_new(struct cuheap_pool *p, uint64_t base, uint64_t size, bool vmm)
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
    size_t n = a->buddy.nr_units;
    uint32_t nr_granules = vmm ? (uint32_t)(size >> p->granule_shift) : 0;
    size_t nr_words = (nr_granules + 63) / 64, nr_summary = (nr_words + 63) / 64;
    a->meta_bytes = 4 * n * sizeof(uint64_t) +
                    nr_granules * (sizeof(struct cuheap_granule) + sizeof(struct cuheap_chunk)) +
                    (nr_words + nr_summary) * sizeof(uint64_t);
    void *m = mmap(NULL, a->meta_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
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

static void arena_retire(struct cuheap_arena *a)
{
    madvise(a->block_size, a->meta_bytes, MADV_DONTNEED); /* reads as zeros from now on */
    cuheap_buddy_retire(&a->buddy); /* size becomes 0; base and unit size stay for tc_free */
}

static void note(struct cuheap_pool *p, int type, uint64_t ptr, uint64_t size, uint64_t aux,
                 uint64_t aux2)
{
    if (p->note) {
        struct cuheap_pool_note n = {type, ptr, size, aux, aux2};
        p->note(p, &n);
    }
}

#define TC_LEGACY_MAX_ORDER 17 /* largest block a legacy thread cache keeps: 128 KiB */

/* The pool's lock spins a little before it sleeps (glibc's adaptive mutex): its holders make
 * at most a driver call or two, and 16 threads of 2 MiB pairs, each taking it twice a pair,
 * queued on futex sleeps and wake-ups (85% of their CPU samples at two offsets of libc's futex call
 * on the H200): 43.3-43.7 us a pair a thread with it against 48.7-52.3 without (three rounds each,
 * bench/RESULTS.md). A thread alone never waits, so nothing changes for it. */
static void pool_lock_init(struct cuheap_pool *p)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&p->lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

int cuheap_pool_init(struct cuheap_pool *p, const struct cuheap_config *cfg,
                     const struct cuheap_backend *be, int device, uint64_t limit,
                     _Atomic uint64_t *device_reserved, cuheap_pool_note_fn note_fn)
{
    memset(p, 0, sizeof(*p));
    pool_lock_init(p);
    pthread_cond_init(&p->synced, NULL);
    p->cfg = cfg;
    p->be = *be;
    p->device = device;
    p->limit = limit;
    p->device_reserved = device_reserved;
    p->note = note_fn;
    p->next_buffer_id = 1;
    static _Atomic uint64_t nr_pools;
    p->gen = atomic_fetch_add(&nr_pools, 1) + 1;
    p->min_order = 63u - (unsigned)__builtin_clzll(cfg->min_block);
    p->vmm = cfg->backing == CUHEAP_BACKING_VMM && be->granule && be->va_reserve && be->va_free &&
             be->phys_create && be->phys_release && be->phys_map && be->phys_unmap;
    p->granule_shift = p->vmm ? 63u - (unsigned)__builtin_clzll(be->granule) : 0;
    p->chunk_max =
        p->vmm && cfg->vmm_chunk > be->granule ? (uint32_t)(cfg->vmm_chunk >> p->granule_shift) : 1;
    /* aligned pieces line up with buddy blocks only when they are a power of two of granules:
     * a 6 MiB piece would reach into a neighbour block's address space */
    if (cfg->vmm_layout == CUHEAP_VMM_ALIGNED)
        p->chunk_max = 1u << (31 - __builtin_clz(p->chunk_max));
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    /* under CUHEAP_RELEASE=empty a block goes back as soon as it can: none are kept aside */
    p->tc_bytes = cfg->release == CUHEAP_RELEASE_EMPTY ? 0 : cfg->thread_cache;
    if (p->tc_bytes)
        pthread_once(&tc_asym_once, tc_asym_register);
    /* A block a thread keeps holds its memory from every other size: under vmm its granules,
     * which the pool would otherwise move to where they are needed; under legacy its place in
     * an arena, so other sizes grow the pool. Measured on the GPT replay (held/live): vmm
     * 1.033 without caches, 1.036 caching blocks up to a sixteenth of a granule, 1.052 up to a
     * granule, 1.069 up to 64 MiB; legacy 1.294 up to 256 KiB, 1.479 from 512 KiB up to 64 MiB
     * (a 2 MiB pair then costs 1,182 instructions instead of 1,023). So both cache small blocks
     * only: a sixteenth of a granule, or 128 KiB under legacy (a sixteenth of 2 MiB). */
    p->tc_max_order = p->vmm ? p->granule_shift - 4 : TC_LEGACY_MAX_ORDER;
    if (p->tc_max_order >= TC_NR_ORDERS) /* a device with granules over 2 MiB */
        p->tc_max_order = TC_NR_ORDERS - 1;
    return 0;
}

static uint64_t pow2_ceil(uint64_t v)
{
    return v <= 1 ? 1 : 1ull << (64 - __builtin_clzll(v - 1));
}

/* Take one arena from the device. Its size doubles the pool each time, from an eighth of
 * CUHEAP_ARENA_SIZE up to CUHEAP_ARENA_SIZE, so a small program does not hold a whole arena
 * for a few buffers; smaller when a limit or the device leaves less; never smaller than
 * need. With exact, the arena is need bytes (a power of two), no more: CUHEAP_POOL_INIT.
 * Drops p->lock around the driver call.
 * Returns 0, CUHEAP_BE_OOM, or -EDQUOT when the limit is what refused. */
static int grow_va_locked(struct cuheap_pool *p, uint64_t need);

static int grow_locked(struct cuheap_pool *p, uint64_t need, bool exact)
{
    if (p->nr_arenas == CUHEAP_NR_MAX_ARENAS)
        return CUHEAP_BE_OOM;
    if (p->vmm)
        return grow_va_locked(p, need);
    if (need < p->cfg->min_block)
        need = p->cfg->min_block;
    need = pow2_ceil(need);
    uint64_t size = p->cfg->arena_size;
    uint64_t target = pow2_ceil(p->st.reserved > size / 8 ? p->st.reserved : size / 8);
    if (target < size || exact)
        size = target > need && !exact ? target : need;
    bool limited = false;
    int r = CUHEAP_BE_OOM;
    uint64_t ptr = 0;
    pthread_mutex_unlock(&p->lock);
    for (; size >= need; size >>= 1) {
        if (p->limit) {
            uint64_t reserved = atomic_load(p->device_reserved);
            if (reserved + size > p->limit) {
                limited = true;
                continue;
            }
        }
        r = p->be.mem_alloc(p->be.ctx, size, &ptr);
        if (r != CUHEAP_BE_OOM)
            break;
    }
    if (r == 0 && (ptr & (p->cfg->min_block - 1))) {
        p->be.mem_free(p->be.ctx, ptr); /* never expected: the driver aligns to 512 B */
        r = -EINVAL;
    }
    struct cuheap_arena *a = NULL;
    if (r == 0) {
        a = arena_new(p, ptr, size, false);
        if (!a || map_update(a, true)) {
            if (a)
                arena_retire(a);
            p->be.mem_free(p->be.ctx, ptr);
            r = -ENOMEM;
        }
    }
    pthread_mutex_lock(&p->lock);
    if (r != 0)
        return limited && r == CUHEAP_BE_OOM ? -EDQUOT : r;
    atomic_fetch_add(p->device_reserved, size);
    p->arenas[p->nr_arenas++] = a;
    p->st.reserved += size;
    p->st.nr_arenas++;
    p->nr_empty++;
    note(p, CUHEAP_EV_ARENA_GROW, ptr, size, p->st.reserved, 0);
    return 0;
}

/* Remove an empty legacy arena from the pool; the caller gives its memory back after
 * unlocking. (vmm arenas are address space: they stay.) */
static uint64_t unlink_arena_locked(struct cuheap_pool *p, unsigned idx, uint64_t *ret_size)
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
    note(p, CUHEAP_EV_ARENA_RELEASE, base, size, p->st.reserved, 0);
    return base;
}

/* Give unlinked legacy arenas back to the driver (p->lock not held). One the driver refuses
 * to free (cuMemFree fails, for example during a stream capture) is still device memory the
 * process holds: it comes back into the pool, counted, and goes at a later trim. */
static void free_arenas_unlocked(struct cuheap_pool *p, const uint64_t *bases,
                                 const uint64_t *sizes, unsigned nr)
{
    for (unsigned i = 0; i < nr; i++) {
        if (p->be.mem_free(p->be.ctx, bases[i]) == 0)
            continue;
        pthread_mutex_lock(&p->lock);
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
        note(p, CUHEAP_EV_ARENA_GROW, bases[i], sizes[i], p->st.reserved, 0);
        pthread_mutex_unlock(&p->lock);
    }
}

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
static uint64_t next_mapped_granule(const struct cuheap_arena *a, uint64_t g)
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

static uint64_t granule_bytes(const struct cuheap_pool *p)
{
    return 1ull << p->granule_shift;
}

static uint64_t granule_va(const struct cuheap_arena *a, uint32_t g)
{
    return a->buddy.base + ((uint64_t)g << a->pool->granule_shift);
}

static uint64_t chunk_va(const struct cuheap_chunk *c)
{
    return granule_va(c->arena, c->first);
}

static uint64_t chunk_bytes(const struct cuheap_pool *p, const struct cuheap_chunk *c)
{
    return (uint64_t)c->nr << p->granule_shift;
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
static void granule_span(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                         uint64_t bytes, uint32_t *ret_first, uint32_t *ret_last)
{
    uint64_t off = ptr - a->buddy.base;
    *ret_first = (uint32_t)(off >> p->granule_shift);
    *ret_last = (uint32_t)((off + bytes - 1) >> p->granule_shift);
}

/* One more block uses a mapped granule; its chunk stops being idle. */
static void hold_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr)
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
static void drop_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr)
{
    cuheap_assert(gr->nr_users > 0 && gr->chunk);
    if (--gr->nr_users == 0) {
        gr->chunk->arena->nr_used--;
        if (--gr->chunk->nr_busy == 0)
            idle_push_locked(p, gr->chunk);
    }
}

/* The block at ptr is free again (its fence has passed): it lets go of its granules. */
static void unuse_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    uint32_t u = unit_of(a, ptr), first, last;
    if (!a->extent[u])
        return;
    granule_span(p, a, ptr, a->extent[u], &first, &last);
    for (uint32_t g = first; g <= last; g++)
        drop_granule_locked(p, &a->granules[g]);
    a->extent[u] = 0;
}

/* Bytes from the block at ptr whose granules it holds (0 under legacy). */
static inline uint64_t extent_at(const struct cuheap_pool *p, const struct cuheap_arena *a,
                                 uint64_t ptr)
{
    return p->vmm ? a->extent[unit_of(a, ptr)] : 0;
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

/* A spinning thread's pause: cheaper for the core's other hardware thread, and for the cache
 * line it watches. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The driver's mapping calls, timed for the summary (st.map_ns): each costs tens of
 * microseconds, the clock tens of nanoseconds. */
static int be_phys_unmap(struct cuheap_pool *p, uint64_t va, uint64_t bytes)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_unmap(p->be.ctx, va, bytes);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

static int be_phys_release(struct cuheap_pool *p, uint64_t handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_release(p->be.ctx, handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

static int be_phys_create(struct cuheap_pool *p, uint64_t bytes, uint64_t *ret_handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_create(p->be.ctx, bytes, ret_handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

static int be_phys_map(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_map(p->be.ctx, va, bytes, handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
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
static uint64_t release_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c)
{
    uint64_t va = chunk_va(c), bytes = chunk_bytes(p, c), h;
    if (unmap_idle_locked(p, c, &h))
        return 0;
    give_back_locked(p, h, bytes);
    note(p, CUHEAP_EV_ARENA_RELEASE, va, bytes, p->st.reserved, 0);
    return bytes;
}

/* Give idle chunks back to the driver, oldest first, while the pool holds more than keep
 * bytes without them; first, memory the driver refused to take back before. Returns the
 * bytes released. */
static uint64_t release_idle_locked(struct cuheap_pool *p, uint64_t keep)
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
static int grow_va_locked(struct cuheap_pool *p, uint64_t need)
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

/* ---- blocks ---- */

#define CUHEAP_QUICK_MAX    64 /* blocks per order */
#define CUHEAP_NR_SPARE_MAX 16 /* arenas given back by one free under CUHEAP_RELEASE=empty */
#define CUHEAP_QUICK_MAX_ORDER                                                                     \
    20 /* largest order kept whole (1 MiB): splitting bigger                                       \
          blocks is a few levels, not worth the hoarding */

static unsigned order_of_size(const struct cuheap_pool *p, uint64_t size)
{
    if (size <= (1ull << p->min_order))
        return p->min_order;
    return 64u - (unsigned)__builtin_clzll(size - 1);
}

/* The memory the pool's blocks use: busy chunks, less the granules under blocks that wait for
 * a fence (pending_mapped), which come back when it passes. */
static uint64_t busy_bytes_locked(const struct cuheap_pool *p)
{
    uint64_t held = p->st.reserved - p->idle_bytes; /* busy chunks, pending blocks' included */
    return held > p->pending_mapped ? held - p->pending_mapped : 0;
}

#define CUHEAP_VMM_FIT_SLACK 5 /* percent of live bytes, idle_fit_now() */

/* The CUHEAP_VMM_IDLE_FIT in force: above 125 only while the memory the pool's blocks keep
 * busy is within CUHEAP_VMM_FIT_SLACK percent of the bytes they asked for. A block put into an
 * idle chunk larger than itself leaves granules of a busy chunk that only neighbours at those
 * addresses can use, and blocks end up spread over more granules; in long replays of the GPT
 * job (8 passes) that added up to held / live 1.08-1.11 in 3 of 6 runs at 200, and to
 * 1.044-1.049 in 21 of 21 with this guard, which places blocks as 125 does until the spread
 * shrinks again (bench/RESULTS.md). The bytes asked for, not rounded up to granules: so for a
 * job whose blocks round up by more than the slack (3 MiB blocks keep 4 MiB busy), 200 acts as
 * 125, which a review found; but counting the rounding let the creep back (2 of 12 long
 * replays to 1.085-1.104), and so did measuring only the free granules of busy chunks (6 of 8
 * runs at slacks of 2-10%). The live bytes are the pool's with the thread caches' folded in at each
 * batch they close (tc_close), so they lag by at most a batch a thread. */
static unsigned idle_fit_now(const struct cuheap_pool *p)
{
    unsigned fit = p->cfg->vmm_idle_fit;
    if (fit <= 125)
        return fit;
    uint64_t busy = busy_bytes_locked(p);
    int64_t live = (int64_t)p->st.live; /* a thread cache's frees may run ahead of it */
    if (live <= 0 || busy / (100 + CUHEAP_VMM_FIT_SLACK) > (uint64_t)live / 100)
        return busy ? 125 : fit;
    return fit;
}

/* vmm: how good [addr, addr + len) is for a block of size bytes: the bytes of it that have
 * memory mapped the block should use (len when all of it has), less those of idle chunks it
 * should not. A place where memory is mapped needs no driver call; but a chunk is mapped and
 * released whole, so a block put into an idle chunk much larger than itself keeps all of it
 * busy: a 4 KiB block in a 64 MiB chunk holds 64 MiB. Busy chunks, and idle ones up to
 * CUHEAP_VMM_IDLE_FIT percent of the block's granules, are good; larger idle ones are
 * avoided, kept whole for a block of their size. (At 125, the GPT loop's 2 and 4 MiB blocks
 * mapped chunks of their own next to idle ones twice their size, about 15 a step, and at the
 * budget idle ones went back to make room for them: twice the driver calls of 200.) */
static int64_t place_score(void *arg, uintptr_t addr, uint64_t len, uint64_t size)
{
    const struct cuheap_arena *a = arg;
    unsigned shift = a->pool->granule_shift;
    uint64_t off = addr - a->buddy.base, first = off >> shift, last = (off + len - 1) >> shift;
    uint64_t fits = ((size + (1ull << shift) - 1) >> shift) * idle_fit_now(a->pool) / 100;
    uint64_t good = 0, bad = 0, idle = 0;
    /* CUHEAP_VMM_LAYOUT=aligned: chunks are one size, so an idle one serves any block; but the
     * free granules of a busy chunk cost nothing more, so they come first */
    bool aligned = a->pool->cfg->vmm_layout == CUHEAP_VMM_ALIGNED;
    /* a chunk's granules share its verdict: one look per chunk, and none at unmapped words
     * (scoring was half of a 2 MiB pair's instructions looking at every granule, issue 14) */
    uint64_t g = next_mapped_granule(a, first);
    if (g > last)
        return CUHEAP_BUDDY_SCORE_NOTHING; /* nothing mapped: the buddy splits it unscored */
    for (; g <= last; g = next_mapped_granule(a, g)) {
        const struct cuheap_chunk *c = a->granules[g].chunk;
        uint64_t end =
            (uint64_t)c->first + c->nr - 1 < last ? (uint64_t)c->first + c->nr - 1 : last;
        if (c->nr_busy || (c->nr <= fits && !aligned))
            good += end - g + 1;
        else if (aligned)
            idle += end - g + 1;
        else
            bad += end - g + 1;
        g = end + 1;
        if (g > last)
            break;
    }
    if (good == last - first + 1)
        return (int64_t)len;
    return (int64_t)(good << shift) + (int64_t)(idle << (shift - 1)) - (int64_t)(bad << shift);
}

#define CUHEAP_VMM_CANDIDATES 8 /* free blocks of one order looked at for a mapped one */

static bool block_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                                uint64_t size);
static void merge_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr);

/* The first block of a quick list, off it. */
static uint64_t quick_pop_locked(struct cuheap_pool *p, unsigned order, struct cuheap_arena **ret)
{
    struct cuheap_quick *q = &p->quick[order];
    uint64_t ptr = q->head;
    struct cuheap_arena *a = map_lookup(ptr);
    q->head = a->link[unit_of(a, ptr)];
    q->nr--;
    p->quick_bytes -= 1ull << order;
    if (order > CUHEAP_QUICK_MAX_ORDER)
        p->nr_whole--;
    *ret = a;
    return ptr;
}

/* Merge the blocks kept whole (vmm, above CUHEAP_QUICK_MAX_ORDER) back into their arenas, so
 * that placement sees their mapped granules. Returns how many. */
static unsigned merge_whole_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    for (unsigned o = CUHEAP_QUICK_MAX_ORDER + 1; p->nr_whole && o < CUHEAP_NR_ORDERS; o++)
        while (p->quick[o].head) {
            struct cuheap_arena *a;
            uint64_t ptr = quick_pop_locked(p, o, &a);
            merge_block_locked(p, a, ptr);
            n++;
        }
    return n;
}

static int take_block_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr,
                             uint64_t *ret_block, struct cuheap_arena **ret_arena)
{
    unsigned order = order_of_size(p, size);
    struct cuheap_quick *q = order < CUHEAP_NR_ORDERS ? &p->quick[order] : NULL;
    /* a block kept whole is taken only where its memory is still mapped: else placement
     * decides, which may find mapped memory elsewhere */
    if (q && q->head && order > CUHEAP_QUICK_MAX_ORDER &&
        !block_mapped_locked(p, map_lookup(q->head), q->head, size)) {
        struct cuheap_arena *a;
        uint64_t ptr = quick_pop_locked(p, order, &a);
        merge_block_locked(p, a, ptr);
    }
    if (q && q->head) {
        struct cuheap_arena *a;
        *ret_ptr = quick_pop_locked(p, order, &a);
        *ret_block = 1ull << order;
        *ret_arena = a;
        return 0;
    }
    for (unsigned n = 0; n < p->nr_arenas; n++) {
        unsigned i = (p->hint + n) % p->nr_arenas;
        struct cuheap_arena *a = p->arenas[i];
        uintptr_t addr;
        unsigned got;
        /* a block of a granule or more is well placed only on mapped granules no block uses:
         * where the arena has none, there is nothing to score */
        bool score = p->vmm && (size < granule_bytes(p) || a->nr_mapped > a->nr_used);
        int r = score ? cuheap_buddy_alloc_scored(&a->buddy, size, place_score, a,
                                                  CUHEAP_VMM_CANDIDATES, &addr, &got)
                      : cuheap_buddy_alloc(&a->buddy, size, &addr, &got);
        /* a place that needs memory mapped, while blocks kept whole hide mapped memory from
         * placement: merge those and look again (without this the GPT replay's mapping calls
         * rose by a third) */
        if (r == 0 && p->nr_whole && !block_mapped_locked(p, a, addr, size) &&
            merge_whole_locked(p)) {
            cuheap_buddy_free(&a->buddy, addr);
            n--; /* the same arena again */
            continue;
        }
        if (r == 0) {
            p->hint = i;
            if (a->nr_live++ == 0)
                p->nr_empty--;
            *ret_ptr = addr;
            *ret_block = 1ull << got;
            *ret_arena = a;
            return 0;
        }
    }
    return -ENOMEM;
}

/* Buffer ids: the top bit, the device, then a count per pool. */
static uint64_t buffer_id_prefix(const struct cuheap_pool *p)
{
    return (1ull << 63) | ((uint64_t)(p->device & 0x7fff) << 48);
}

/* The first of n fresh buffer-id counts (thread caches take them without p->lock). */
static uint64_t next_buffer_ids(struct cuheap_pool *p, uint64_t n)
{
    return atomic_fetch_add_explicit(&p->next_buffer_id, n, memory_order_relaxed);
}

static void mark_live_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                             uint64_t size, uint64_t block)
{
    uint32_t u = unit_of(a, ptr);
    __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELAXED);
    __atomic_store_n(&a->buffer_id[u], buffer_id_prefix(p) | next_buffer_ids(p, 1),
                     __ATOMIC_RELAXED);
    p->st.live += size;
    p->st.live_blocks += block;
}

/* Give a not-live block back to its buddy allocator. */
static void merge_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    if (cuheap_buddy_free(&a->buddy, ptr) < 0)
        return;
    p->nr_merged++;
    if (--a->nr_live == 0)
        p->nr_empty++;
}

/* ---- metadata of free address space ----
 *
 * Blocks land all over an arena's address range in a long run (placement follows mapped
 * memory and the free lists, not the lowest address), and each touches the pages of the
 * per-unit arrays at its start. Kept, those pages would end up holding 41 bytes of host
 * memory for every 512 of the arenas' address space, whatever the job uses. So every
 * CUHEAP_PURGE_EVERY merges the pages wholly inside large free blocks go back to the kernel.
 * Their units hold nothing anyone reads (not live, no granules, on no list): zeros, as the
 * pages read afterwards. A thread cache's free of a bad pointer may read or swap a size
 * there without p->lock: it finds 0 either way. */
#define CUHEAP_PURGE_EVERY     16384 /* merges between purges */
#define CUHEAP_PURGE_MIN_UNITS 10    /* free blocks of 2^10 units or more: a page of each array */

static void purge_units(void *arg, uint32_t first, uint32_t nr)
{
    struct cuheap_arena *a = arg;
    cuheap_buddy_drop_pages(a->block_size, sizeof(*a->block_size), first, nr);
    cuheap_buddy_drop_pages(a->buffer_id, sizeof(*a->buffer_id), first, nr);
    cuheap_buddy_drop_pages(a->link, sizeof(*a->link), first, nr);
    cuheap_buddy_drop_pages(a->extent, sizeof(*a->extent), first, nr);
}

/* p->lock held, where an allocation's slow path begins: no caller is in the middle of a walk
 * over blocks it is merging. */
static void purge_meta_locked(struct cuheap_pool *p)
{
    p->nr_merged = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        cuheap_buddy_purge(&a->buddy, a->buddy.min_order + CUHEAP_PURGE_MIN_UNITS, purge_units, a);
    }
}

/* Give a not-live block back for reuse: onto its order's quick list while there is room,
 * else merged into its arena. */
static void return_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr)
{
    cuheap_assert(a && __atomic_load_n(&a->block_size[unit_of(a, ptr)], __ATOMIC_RELAXED) == 0);
    if (p->vmm)
        unuse_granules_locked(p, a, ptr);
    int order = cuheap_buddy_order_at(&a->buddy, ptr);
    if (order < 0)
        return;
    struct cuheap_quick *q = &p->quick[order];
    /* Bounded: quick lists must not hoard what other sizes or the driver could use. Under vmm
     * a block on a quick list holds address space only (its granules went idle above), but it
     * hides that mapped memory from placement: blocks above CUHEAP_QUICK_MAX_ORDER kept whole,
     * 64 an order, made the GPT replay move idle chunks 3.6 times as often (1,634 moves
     * against 455, each an unmap and a map: about 50 us on an H200). One an order is kept
     * (issue 14): a loop that frees a 2 or 20 MiB block and asks for another of its size then
     * takes it back without merging it up through a 4 GiB arena and splitting it down again,
     * scored at every level (9,800 instructions a pair, 3,900 so); and when the scored
     * placement settles on a place that needs memory mapped, those kept whole are merged and
     * it looks again (take_block_locked), so the mapping calls stay as they were. */
    bool whole = p->vmm && order > CUHEAP_QUICK_MAX_ORDER && q->nr == 0;
    bool small = q->nr < CUHEAP_QUICK_MAX && order <= CUHEAP_QUICK_MAX_ORDER &&
                 (p->vmm || p->quick_bytes + (1ull << order) <= p->cfg->arena_size / 8);
    if (p->cfg->release != CUHEAP_RELEASE_EMPTY && (whole || small)) {
        a->link[unit_of(a, ptr)] = q->head;
        q->head = ptr;
        q->nr++;
        p->quick_bytes += 1ull << order;
        p->nr_whole += whole;
        return;
    }
    merge_block_locked(p, a, ptr);
}

/* Merge every quick-list block back into its arena. Returns how many. */
static unsigned flush_quick_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
        struct cuheap_quick *q = &p->quick[o];
        while (q->head) {
            uint64_t ptr = q->head;
            struct cuheap_arena *a = map_lookup(ptr);
            q->head = a->link[unit_of(a, ptr)];
            merge_block_locked(p, a, ptr);
            n++;
        }
        q->nr = 0;
    }
    p->quick_bytes = 0;
    p->nr_whole = 0;
    return n;
}

/* ---- fences ---- */

static struct cuheap_epoch *open_epoch(struct cuheap_pool *p)
{
    return &p->epochs[p->ep_tail % CUHEAP_NR_EPOCHS];
}

static void release_epoch_locked(struct cuheap_pool *p, struct cuheap_epoch *e)
{
    uint64_t nr = e->nr_blocks, bytes = e->bytes;
    for (uint64_t ptr = e->head; ptr;) {
        struct cuheap_arena *a = map_lookup(ptr);
        uint64_t next = a->link[unit_of(a, ptr)];
        p->pending_mapped -= extent_at(p, a, ptr);
        return_block_locked(p, a, ptr);
        ptr = next;
    }
    p->st.pending -= bytes;
    if (e->fence)
        p->be.fence_destroy(p->be.ctx, e->fence);
    memset(e, 0, sizeof(*e));
    note(p, CUHEAP_EV_FENCE, 0, 0, nr, bytes);
}

/* Whether a fence has passed, as the driver answers: 1 yes, 0 not yet, -1 no answer. A query
 * refused while a stream captures says nothing (no fence is recorded meanwhile, and the
 * refusal ends with the capture). Refused outside every capture cuheap saw (an event caught
 * in a capture it did not see, a context stuck so), it is refused again every time: a pool
 * that took that for "not yet" polled and waited for it forever at full CPU. From then on no
 * fence is recorded (fences_refused): freed blocks wait for a device sync, as when the driver
 * has no event to give, and fences in flight pass once a wait for them returns
 * (wait_oldest_locked) or at the next device sync (close_epoch_locked). Called with or
 * without p->lock. */
static int fence_passed(struct cuheap_pool *p, void *fence)
{
    int r = p->be.fence_query(p->be.ctx, fence);
    if (r >= 0)
        return r != 0;
    if (__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
        return -1;
    /* once more: a capture may have ended between the refusal and the look at the count */
    if ((r = p->be.fence_query(p->be.ctx, fence)) >= 0)
        return r != 0;
    if (!__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
        atomic_store_explicit(&p->fences_refused, true, memory_order_relaxed);
    return -1;
}

/* Whether fences may still be recorded: not once the driver refused to answer for them
 * (fence_passed). */
static bool fences_usable(struct cuheap_pool *p)
{
    return !atomic_load_explicit(&p->fences_refused, memory_order_relaxed);
}

/* Give back the blocks of every closed epoch whose fence has completed. Returns how many
 * epochs were reclaimed. */
static unsigned reclaim_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    while (p->ep_head != p->ep_tail) {
        struct cuheap_epoch *e = &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS];
        if (fence_passed(p, e->fence) <= 0)
            break;
        release_epoch_locked(p, e);
        p->ep_head++;
        n++;
    }
    return n;
}

/* The oldest closed epoch's fence, kept valid while p->lock is dropped to wait for it
 * (NULL when no epoch is closed). Give it back with unpin_fence_locked(). */
static void *pin_oldest_locked(struct cuheap_pool *p)
{
    if (p->ep_head == p->ep_tail)
        return NULL;
    void *fence = p->epochs[p->ep_head % CUHEAP_NR_EPOCHS].fence;
    if (p->be.fence_hold)
        p->be.fence_hold(p->be.ctx, fence);
    return fence;
}

static void unpin_fence_locked(struct cuheap_pool *p, void *fence)
{
    if (p->be.fence_hold)
        p->be.fence_destroy(p->be.ctx, fence);
}

/* Wait for the oldest closed epoch's fence and give its blocks back. Only the slow paths wait,
 * and never with p->lock held: other threads allocate and free meanwhile (and may reclaim
 * that epoch themselves). A wait (or the device sync after a failed one) that returned says
 * the fence has passed, whatever a query would say: the blocks come back without one, and
 * a query that is refused every time (fence_passed) keeps nobody waiting. Returns whether
 * the epoch came back, here or by another thread: false when neither the wait nor the sync
 * succeeded and the driver does not say it passed, so that no caller waits again in vain. */
static bool wait_oldest_locked(struct cuheap_pool *p)
{
    void *fence = pin_oldest_locked(p);
    if (!fence)
        return false;
    unsigned head = p->ep_head;
    uint64_t t0 = mono_ns();
    p->st.nr_waits++;
    pthread_mutex_unlock(&p->lock);
    bool passed = p->be.fence_wait(p->be.ctx, fence) == 0;
    if (!passed)
        passed = p->be.device_sync(p->be.ctx) == 0;
    uint64_t waited = mono_ns() - t0; /* not the wait for the lock: other threads' mapping */
    pthread_mutex_lock(&p->lock);
    p->st.fence_ns += waited;
    unpin_fence_locked(p, fence);
    struct cuheap_epoch *e = &p->epochs[head % CUHEAP_NR_EPOCHS];
    bool still = p->ep_head == head && p->ep_head != p->ep_tail && e->fence == fence;
    if (still && passed) {
        release_epoch_locked(p, e);
        p->ep_head++;
        still = false;
    }
    reclaim_locked(p);
    return !still || p->ep_head != head;
}

/* An idle GPU passes a fence within microseconds: poll the oldest one briefly (p->lock
 * dropped) before taking more memory from the driver, so a tight alloc/free loop reuses its
 * blocks instead of growing the pool. A busy GPU (long kernels in flight) makes us grow, as
 * the rules say. Returns whether an epoch was reclaimed. */
#define CUHEAP_FENCE_POLL_NS 50000

static bool poll_oldest_locked(struct cuheap_pool *p)
{
    void *fence = pin_oldest_locked(p);
    if (!fence)
        return false;
    uint64_t t0 = mono_ns(), deadline = t0 + CUHEAP_FENCE_POLL_NS;
    pthread_mutex_unlock(&p->lock);
    int done;
    uint64_t now = t0;
    while (!(done = fence_passed(p, fence)) && (now = mono_ns()) < deadline)
        sched_yield();
    uint64_t waited = (done > 0 ? mono_ns() : now) - t0;
    pthread_mutex_lock(&p->lock);
    p->st.fence_ns += waited;
    unpin_fence_locked(p, fence);
    return done > 0 && reclaim_locked(p);
}

/* A fence proves that the work submitted before a free is done only after a round trip
 * through the GPU: an event recorded on each stream, the GPU reaching it, a query seeing it
 * (1.6 us on an idle H200, with the calls' own 1.2 us: bench/probe-fence.c). Asking the
 * streams whether they are idle proves the same at once when they are: the legacy stream's
 * answer covers every blocking stream and every thread's per-thread default stream, as its
 * events do (seen on the H200), and each non-blocking stream is asked as it gets an event. A
 * busy GPU answers no, and the question (about 0.45 us a stream) was wasted: after a no, only
 * every IDLE_RETRY-th fence asks, until a yes. Never while a stream captures (the caller sees
 * to it: a query then may be refused, or join nothing but still say nothing). */
#define IDLE_RETRY 64

static bool idle_now(struct cuheap_pool *p)
{
    if (!p->be.streams_idle || !p->cfg->idle_check || p->cfg->reuse != CUHEAP_REUSE_FENCE)
        return false;
    unsigned skip = atomic_load_explicit(&p->idle_skip, memory_order_relaxed);
    if (skip) { /* a hint among threads: a lost decrement costs one check more or less */
        atomic_store_explicit(&p->idle_skip, skip - 1, memory_order_relaxed);
        return false;
    }
    bool idle = p->be.streams_idle(p->be.ctx) == 1;
    atomic_store_explicit(&p->idle_skip, idle ? 0 : IDLE_RETRY - 1, memory_order_relaxed);
    return idle;
}

/* Every stream was idle (idle_now, after every block of the open epoch was freed; p->lock
 * held): the closed epochs' fences have passed, and the open epoch's blocks need none. */
static void release_all_epochs_locked(struct cuheap_pool *p)
{
    for (; p->ep_head != p->ep_tail; p->ep_head++)
        release_epoch_locked(p, &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS]);
    release_epoch_locked(p, open_epoch(p));
    p->st.nr_idle++;
}

/* The open epoch's blocks given back at once if every stream is idle (p->lock held; never
 * while a stream captures). Returns whether they were. */
static bool give_back_if_idle_locked(struct cuheap_pool *p)
{
    if (!open_epoch(p)->nr_blocks || p->nr_capturing || !idle_now(p))
        return false;
    release_all_epochs_locked(p);
    return true;
}

/* Close the open epoch behind a new fence, or give its blocks back at once while every stream
 * is idle. While a stream captures, recording would disturb the capture: the epoch stays
 * open. Returns whether its blocks came back at once (the caller may look for one again). */
static bool close_epoch_locked(struct cuheap_pool *p)
{
    if (give_back_if_idle_locked(p))
        return true;
    /* a full ring waits for its oldest fence (the lock dropped: the open epoch may change
     * meanwhile); one that does not pass leaves the device sync below */
    bool full = false;
    while ((full = p->ep_tail - p->ep_head == CUHEAP_NR_EPOCHS - 1) && open_epoch(p)->nr_blocks &&
           !p->nr_capturing && wait_oldest_locked(p))
        ;
    struct cuheap_epoch *e = open_epoch(p);
    if (!e->nr_blocks || p->nr_capturing)
        return false;
    void *fence = NULL;
    if (full || !fences_usable(p) || p->be.fence_record(p->be.ctx, &fence) != 0) {
        /* No fence to be had: fall back to what the driver's own free does, a device sync,
         * with p->lock dropped like every other wait. The blocks wait aside meanwhile: a free
         * made during the sync joins a fresh open epoch, which the sync does not cover. The
         * closed epochs' fences were recorded before it: a sync that succeeded passed them. */
        struct cuheap_syncing s = {*e, p->syncing};
        unsigned tail = p->ep_tail;
        memset(e, 0, sizeof(*e));
        p->syncing = &s;
        pthread_mutex_unlock(&p->lock);
        int synced = p->be.device_sync(p->be.ctx);
        pthread_mutex_lock(&p->lock);
        struct cuheap_syncing **at = &p->syncing;
        while (*at && *at != &s)
            at = &(*at)->next;
        if (!*at)
            return false; /* the context went meanwhile (cuheap_pool_abandon), its blocks too */
        *at = s.next;
        for (; synced == 0 && p->ep_head != p->ep_tail && (int)(tail - p->ep_head) > 0;
             p->ep_head++)
            release_epoch_locked(p, &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS]);
        release_epoch_locked(p, &s.epoch);
        p->nr_synced++;
        pthread_cond_broadcast(&p->synced);
        return true;
    }
    e->fence = fence;
    p->st.nr_fences++;
    p->ep_tail++;
    return false;
}

/* Out of memory while another thread syncs the device for blocks no fence covers (above):
 * wait, p->lock dropped, until one such batch has come back (or went with its context); the
 * caller asks again. */
static void wait_syncing_locked(struct cuheap_pool *p)
{
    p->st.nr_waits++;
    uint64_t t0 = mono_ns();
    for (uint64_t n = p->nr_synced; p->syncing && p->nr_synced == n;)
        pthread_cond_wait(&p->synced, &p->lock);
    p->st.fence_ns += mono_ns() - t0; /* the lock taken again included: the wait does so */
}

/* Move every stream-cached block onto the open epoch. */
static void flush_stream_caches_locked(struct cuheap_pool *p)
{
    struct cuheap_epoch *e = open_epoch(p);
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        struct cuheap_stream_cache *sc = &p->caches[c];
        if (!sc->stream)
            continue;
        for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
            for (uint64_t ptr = sc->heads[o]; ptr;) {
                struct cuheap_arena *a = map_lookup(ptr);
                uint64_t next = a->link[unit_of(a, ptr)];
                a->link[unit_of(a, ptr)] = e->head;
                e->head = ptr;
                e->nr_blocks++;
                e->bytes += 1ull << o;
                ptr = next;
            }
        }
        memset(sc, 0, sizeof(*sc));
    }
}

static struct cuheap_stream_cache *stream_cache_locked(struct cuheap_pool *p, uint64_t stream,
                                                       bool create)
{
    struct cuheap_stream_cache *empty = NULL;
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        if (p->caches[c].stream == stream)
            return &p->caches[c];
        if (!p->caches[c].stream && !empty)
            empty = &p->caches[c];
    }
    if (create && empty)
        empty->stream = stream;
    return create ? empty : NULL;
}

/* ---- physical memory: where a block gets it (vmm) ---- */

struct acquire {
    bool fenced;         /* the open epoch was closed for this allocation already */
    bool fenced_all;     /* ... with every thread's cache drained behind it (fenced too) */
    bool only_needed;    /* aligned layout: a whole piece did not fit under the limit or on the
                            device, so map only the granules the block needs */
    bool waited_in_vain; /* a wait for the oldest fence gave nothing back: do not wait again */
};

static unsigned tc_drain_all_locked(struct cuheap_pool *p, bool freed_only);
static void tc_hold_all(struct cuheap_pool *p);
static void tc_unhold_all(struct cuheap_pool *p);

/* The calling thread's own cache drained (p->lock held): no other thread touches a cache but
 * under p->lock, and its owner is here, so no hold and no barrier. */
static void tc_drain_mine_locked(struct cuheap_pool *p);

/* Put every block freed but not yet behind a fence (open epoch, stream caches, thread caches)
 * behind one, once per allocation. Returns whether it did so now. Past the pool's budget only
 * the caller's own cache is drained (all: false): draining every thread's makes each pass a
 * memory barrier (membarrier(2)) and takes its ready blocks, so that its next allocations take
 * the pool's lock, and a loop of large pairs past the budget did so on every pair. What the
 * others keep may then make the pool map more rather than wait; a full device or limit drains
 * them all (all: true, once more after the caller's alone). On the H200, 16 threads of 2 MiB
 * pairs were no faster for it (their time is the pool's lock, bench/RESULTS.md 2026-12-02);
 * the GPT replay (one thread) is unchanged. */
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

/* The driver failed a VMM call twice over, and not for want of memory (create_chunk_locked,
 * map_chunk_locked, grow_va_locked; a full device is no refusal: it goes through the pool's
 * reclaim, then to the driver). The backing does not work on this device, as on some
 * virtualized or partitioned GPUs, older drivers and containers (on WSL2 cuMemSetAccess
 * answers CUDA_ERROR_UNKNOWN although the device advertises VMM, and every allocation of
 * PyTorch's expandable segments fails), so the pool makes no more mapping calls. Once it holds
 * nothing, now or at a later refusal (its idle chunks given back first), it becomes a legacy
 * pool for the rest of the run, its address space given back; until then a request that needs
 * new memory goes to the driver. Returns whether the pool is a legacy pool now. */
static bool vmm_refused_locked(struct cuheap_pool *p)
{
    if (!p->vmm)
        return true; /* another thread saw to it (grow_va_locked drops the lock) */
    p->vmm_refused = CUHEAP_VMM_TO_DRIVER;
    tc_drain_all_locked(p, false);
    reclaim_locked(p);
    flush_quick_locked(p);
    release_idle_locked(p, 0);
    if (p->st.reserved || p->nr_empty != p->nr_arenas) /* blocks in use or pending, or memory */
        return false;
    /* no cache holds a block (each would be one in use); held still while the backing changes */
    tc_hold_all(p);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        uint64_t va = a->buddy.base, size = a->buddy.size;
        map_update(a, false);
        arena_retire(a);
        p->be.va_free(p->be.ctx, va, size);
    }
    p->nr_arenas = p->nr_empty = p->hint = 0;
    p->st.nr_arenas = 0;
    p->peak_busy = 0;
    p->vmm = false;
    p->vmm_refused = CUHEAP_VMM_TO_LEGACY;
    tc_unhold_all(p);
    return true;
}

/* New physical memory mapped at the unmapped granules [first, first + nr) of arena a, as one
 * (idle) chunk. Returns 0, CUHEAP_BE_OOM, -EDQUOT or -EIO (the driver refused the create or
 * the map twice). */
static int new_chunk_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first,
                            uint32_t nr)
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
    note(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    return 0;
}

/* An idle chunk of exactly nr granules, oldest first (the first 64 looked at). */
static struct cuheap_chunk *idle_of_size_locked(struct cuheap_pool *p, uint32_t nr)
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
static int move_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c, struct cuheap_arena *a,
                             uint32_t first)
{
    uint32_t nr = c->nr;
    uint64_t from = chunk_va(c), bytes = chunk_bytes(p, c), va = granule_va(a, first), h;
    if (unmap_idle_locked(p, c, &h))
        return -EAGAIN;
    note(p, CUHEAP_EV_ARENA_RELEASE, from, bytes, p->st.reserved, 0);
    int r = map_chunk_locked(p, va, bytes, h);
    if (r) {
        give_back_locked(p, h, bytes);
        return r;
    }
    place_chunk_locked(p, a, first, nr, h);
    p->st.nr_moves++;
    note(p, CUHEAP_EV_ARENA_GROW, va, bytes, p->st.reserved, 0);
    return 0;
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
 * (map_wait_locked), since each drops p->lock: granules of the block's range that were
 * unmapped may be mapped meanwhile by a thread whose block shares them, and a run mapped over
 * them broke the accounting (seen once under CI's load, `pool_check`: a chunk idle with a
 * granule in use). */
enum { MAP_FENCE_POLL = 1, MAP_FENCE, MAP_WAIT, MAP_DEVICE_SYNC };

static int map_run_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first,
                          uint32_t nr, struct acquire *acq)
{
    uint64_t need = (uint64_t)nr << p->granule_shift;
    bool moves = true;
    if (p->vmm_refused)
        return -EIO; /* no more mapping calls (vmm_refused_locked) */
    for (;;) {
        struct cuheap_chunk *c = moves ? idle_of_size_locked(p, nr) : NULL;
        if (c) {
            int m = move_chunk_locked(p, c, a, first);
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
    if (what == MAP_DEVICE_SYNC)
        wait_syncing_locked(p);
    else if (what == MAP_WAIT)
        acq->waited_in_vain |= !wait_oldest_locked(p);
    else if (fence_pending_once_locked(p, acq, what == MAP_FENCE) && what == MAP_FENCE_POLL)
        poll_oldest_locked(p);
}

/* The granules [*ret_start, *ret_end] one new chunk covers, for the unmapped granule g that
 * the block at ptr needs (its last needed granule: last).
 * tight: from g to the next mapped granule, at most `last` and CUHEAP_VMM_CHUNK, so a block
 * holds only what it uses; but the chunks made are of every size, and an idle one is moved
 * only to a place of its size, so the rest go back to the driver and new ones are made (the
 * GPT loop: about 13 of each a step, beside 14 moves).
 * aligned: the unmapped granules of the CUHEAP_VMM_CHUNK-aligned piece around
 * g, so that chunks are one size and any idle one can move anywhere. The GPT loop on an H200:
 * half the time in mapping calls and a step 1.23x the caching allocator's against 1.39x, for
 * 1.06 held/live against 1.03 (measured, a mapping call costs the step two to four times
 * the call's own time; but in 2 of 15 long replays its memory rose to 1.10-1.12, so tight stays
 * the default). A block of a piece or more owns its pieces' address space,
 * so its last chunk ends where the block's bytes do (a 20 MiB block holds 20 MiB, as PyTorch's
 * segments need); a smaller one maps the piece its neighbours will share. */
static void chunk_bounds(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                         uint32_t g, uint32_t last, bool only_needed, uint32_t *ret_start,
                         uint32_t *ret_end)
{
    uint32_t start = g, end = g;
    if (p->cfg->vmm_layout == CUHEAP_VMM_TIGHT) {
        while (end < last && !a->granules[end + 1].chunk && end + 1 - g < p->chunk_max)
            end++;
    } else {
        uint32_t piece = g - g % p->chunk_max, piece_end = piece + p->chunk_max - 1;
        if (piece_end >= a->nr_granules)
            piece_end = a->nr_granules - 1;
        int order = cuheap_buddy_order_at(&a->buddy, ptr);
        bool owns = order >= 0 && (1ull << order) >= ((uint64_t)p->chunk_max << p->granule_shift);
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

/* The block at ptr is about to hold size bytes: hold the granules they reach into, beyond
 * those it holds already (a block reused on the same stream keeps its granules), mapping
 * the unmapped ones in chunks (chunk_bounds). On failure nothing new is held. Returns 0,
 * CUHEAP_BE_OOM, -EDQUOT or -EIO. */
static int use_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                               uint64_t size, struct acquire *acq)
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
        int r = map_run_locked(p, a, start, end - start + 1, acq);
        if (r) {
            for (uint32_t h = first; h <= last; h++)
                if (a->granules[h].chunk) /* below g all, beyond it those held above */
                    drop_granule_locked(p, &a->granules[h]);
            if (r == MAP_FENCE_POLL || r == MAP_FENCE || r == MAP_WAIT || r == MAP_DEVICE_SYNC) {
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
    a->extent[u] = size;
    uint64_t busy = busy_bytes_locked(p);
    if (busy > p->peak_busy)
        p->peak_busy = busy;
    return 0;
}

/* Whether every granule the first size bytes of the block at ptr reach into is mapped. */
static bool block_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                                uint64_t size)
{
    uint32_t first, last;
    granule_span(p, a, ptr, size, &first, &last);
    for (uint32_t g = first; g <= last; g++)
        if (!a->granules[g].chunk)
            return false;
    return true;
}

/* vmm: the block the buddy gave needs granules mapped, but blocks freed before wait for a
 * fence. Once it passes they are free with their granules mapped, and the last one freed is
 * the first the buddy gives again: very likely one of this size, at an address that needs no
 * driver call. So wait for the oldest fence and ask again, rather than move memory (66 us a
 * granule on an H200) or take more. Bounded by the number of epochs. */
static void prefer_mapped_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ptr,
                                 uint64_t *block, struct cuheap_arena **arena)
{
    unsigned backs = 0;
    for (unsigned tries = 0; tries <= CUHEAP_NR_EPOCHS; tries++) {
        if (block_mapped_locked(p, *arena, *ptr, size))
            return;
        if (p->ep_head == p->ep_tail && !open_epoch(p)->nr_blocks)
            return; /* nothing waits: moving or taking granules is all there is */
        if (!reclaim_locked(p)) {
            bool back = false; /* every stream idle, or a device sync: they came back */
            if (p->ep_head == p->ep_tail) {
                back = close_epoch_locked(p);
                if (p->ep_head == p->ep_tail && !back)
                    return; /* could not close it (a stream captures) */
                if (back && backs++)
                    return; /* once: a device sync each round would cost more than mapping */
            }
            if (!back && !poll_oldest_locked(p))
                wait_oldest_locked(p);
        }
        /* back to the buddy, not a quick list: the list would hand this very block out again */
        merge_block_locked(p, *arena, *ptr);
        if (take_block_locked(p, size, ptr, block, arena))
            cuheap_assert(!"a block just given back could not be taken again");
    }
}

/* Put a not-live block behind the open epoch's fence. The batch closes after
 * CUHEAP_FENCE_BATCH frees, or sooner when it holds an eighth of the pool (of
 * CUHEAP_ARENA_SIZE while the pool is smaller): large blocks should not wait behind many
 * small ones, and a small pool (vmm holds only what is used) should not record a fence for
 * every free. Returns whether the batch is due to close (pend_locked() closes it; closing may
 * wait for a fence with p->lock dropped). */
static bool epoch_due_locked(struct cuheap_pool *p)
{
    const struct cuheap_epoch *e = open_epoch(p);
    uint64_t volume = p->st.reserved > p->cfg->arena_size ? p->st.reserved : p->cfg->arena_size;
    return e->nr_blocks >= p->cfg->fence_batch || e->bytes >= volume / 8;
}

static bool pend_nowait_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                               uint64_t block)
{
    struct cuheap_epoch *e = open_epoch(p);
    a->link[unit_of(a, ptr)] = e->head;
    e->head = ptr;
    e->nr_blocks++;
    e->bytes += block;
    p->st.pending += block;
    p->pending_mapped += extent_at(p, a, ptr);
    return epoch_due_locked(p);
}

static void pend_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t block)
{
    if (pend_nowait_locked(p, a, ptr, block))
        close_epoch_locked(p);
}

/* Close the open epoch if blocks handed over without closing (thread-cache drains) made it
 * due. May drop p->lock. */
static void close_if_due_locked(struct cuheap_pool *p)
{
    if (epoch_due_locked(p))
        close_epoch_locked(p);
}

/* ---- thread caches ---- */

/* Per-unit sizes and ids are written by thread caches without p->lock: relaxed atomics, so a
 * query racing with an allocation reads one value or the other, never a torn one. */
static uint64_t size_at(const struct cuheap_arena *a, uint32_t u)
{
    return __atomic_load_n(&a->block_size[u], __ATOMIC_RELAXED);
}

/* A thread's small blocks go round its own cache: freed into a batch, the batch closed behind
 * one fence of the thread's own, back to ready once the fence has passed. Every close takes the
 * pool's lock and asks the driver to record an event, so a batch is large in count (16 threads
 * of 512 B pairs on the H200, ns of one core a pair: 598-643 closing every 64 frees, 177-206
 * every 256, 102-114 every 1024), and the ready blocks hold two batches' worth, so that a closed
 * batch's fence has a batch's time to pass before the thread needs its blocks. In bytes a batch
 * is small (a sixteenth of CUHEAP_THREAD_CACHE, in tc_free): what waits in it is memory the pool
 * holds for nobody. */
#define TC_PER_ORDER  2048 /* ready blocks of one order at most (tc_caps) */
#define TC_BATCH      1024 /* frees behind one fence of the thread's own */
#define TC_NR_CLOSED  2    /* batches of a thread waiting for their fence */
#define TC_NR_BATCHES 4    /* the closed ones and the open one, in a ring of a power of two */
#define TC_REFILL     16   /* ready blocks taken at once from the pool */
#define TC_IDS        256
#define TC_SLOTS      4 /* pools (devices) a thread keeps a cache for */

struct tc_block {
    uint64_t ptr;
    struct cuheap_arena *arena;
};

/* Blocks a thread freed, behind one fence once closed. A block's order rides in the low bits
 * of its address (blocks are at least 256-byte aligned). */
struct tc_batch {
    void *fence; /* closed batches: from backend->fence_record */
    bool passed; /* its fence has passed (blocks may have become ready already) */
    uint32_t nr;
    uint64_t bytes;
    struct tc_block blocks[TC_BATCH];
};

struct cuheap_tcache {
    /* whole cache lines: no other thread's data shares them */
    _Alignas(64) _Atomic int busy; /* the owner is inside (tc_enter) */
    _Atomic int held;              /* a drainer has it or wants it (tc_hold_all, under p->lock) */
    struct cuheap_pool *pool;
    uint64_t gen;               /* pool->gen when made: a pool set up again is another pool */
    struct cuheap_tcache *next; /* on pool->tcaches (p->lock) */
    struct tc_block ready[TC_NR_ORDERS][TC_PER_ORDER]; /* fence passed, memory held */
    uint16_t nr_ready[TC_NR_ORDERS];
    uint64_t ready_bytes;
    /* a ring: [closed_head, closed_tail) closed, oldest first, then the open one (tc_open):
     * a close only moves closed_tail on, where copying the 16 KiB batch was 14 instructions a
     * 512 B pair (callgrind) */
    struct tc_batch batch[TC_NR_BATCHES];
    unsigned closed_head, closed_tail;
    int64_t live, live_blocks; /* not yet folded into pool->st */
    uint64_t nr_hits;
    uint64_t next_id, end_id; /* buffer ids this thread may hand out */
    /* One large block (above tc_max_order) the thread freed, kept only while the thread keeps
     * finding the pool's lock taken (large_on, pool_lock_noting): reusable once a fence of the
     * pool's timeline numbered above its ticket has passed */
    struct tc_block large; /* the order in the low bits; ptr 0: none */
    uint64_t large_ticket;
    bool large_on;
    uint8_t nr_locks, nr_contended; /* the owner's pool-lock takings, and those that waited */
    uint64_t nr_fences, fence_ns;   /* the large block's, not yet folded into pool->st */
};

_Static_assert(TC_NR_CLOSED < TC_NR_BATCHES && !(TC_NR_BATCHES & (TC_NR_BATCHES - 1)),
               "room for the open batch; a ring index by mask");

/* Batch c of the ring; the open batch is the one at closed_tail. */
static struct tc_batch *tc_batch_at(struct cuheap_tcache *tc, unsigned c)
{
    return &tc->batch[c % TC_NR_BATCHES];
}

static struct tc_batch *tc_open(struct cuheap_tcache *tc)
{
    return tc_batch_at(tc, tc->closed_tail);
}

/* The open batch, emptied (a slot that held a closed batch before). */
static void tc_open_reset(struct cuheap_tcache *tc)
{
    struct tc_batch *o = tc_open(tc);
    o->fence = NULL;
    o->passed = false;
    o->nr = 0;
    o->bytes = 0;
}

static __thread struct cuheap_tcache *tc_slot[TC_SLOTS] __attribute__((tls_model("initial-exec")));
static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

/* A cache is its owner's but for drainers (trim, out of memory, stats, checks, a thread's
 * end), which are rare and hold p->lock. So the owner enters and leaves without an atomic
 * read-modify-write (an exchange is a full barrier: 24% of 16 threads' samples on the H200
 * went to the two a pair made): it marks itself busy with a plain store and looks for a
 * drainer; a drainer marks the cache held, makes every running thread of the process pass a
 * full memory barrier (membarrier(2)), then waits for the owner to leave. Either the owner
 * sees the drainer or the drainer sees the owner busy: the barrier puts the owner's store
 * before its load. Where membarrier is not to be had, the owner pays a fence instead. */
static atomic_bool tc_asym; /* membarrier's private expedited command registered */

static void tc_asym_register(void)
{
    atomic_store(&tc_asym,
                 syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0);
}

static pthread_once_t tc_asym_once = PTHREAD_ONCE_INIT;

/* The drainer's half of the barrier (after marking caches held, before reading busy). */
static void tc_barrier(void)
{
    if (!atomic_load_explicit(&tc_asym, memory_order_relaxed)) {
        atomic_thread_fence(memory_order_seq_cst); /* owners fence too */
        return;
    }
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
        return;
    /* Refused (a registration that did not carry over): from now on owners fence, and the
     * slow global command (every CPU, no registration) covers those that entered without. */
    atomic_store(&tc_asym, false);
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
        /* no barrier at all: wait out a scheduling round (a context switch is one) */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static __attribute__((always_inline)) inline void tc_enter(struct cuheap_tcache *tc)
{
    for (;;) {
        atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
        if (__builtin_expect(atomic_load_explicit(&tc_asym, memory_order_relaxed), 1))
            atomic_signal_fence(memory_order_seq_cst); /* the store stays before the load */
        else
            atomic_thread_fence(memory_order_seq_cst);
        if (__builtin_expect(!atomic_load_explicit(&tc->held, memory_order_acquire), 1))
            return;
        atomic_store_explicit(&tc->busy, 0, memory_order_release);
        while (atomic_load_explicit(&tc->held, memory_order_acquire))
            sched_yield(); /* a drainer has it */
    }
}

static __attribute__((always_inline)) inline void tc_leave(struct cuheap_tcache *tc)
{
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
}

/* A drainer takes the caches (p->lock held, which serializes drainers): marks each held, one
 * barrier for all, then waits for each owner to leave. */
static void tc_wait_out(struct cuheap_tcache *tc)
{
    while (atomic_load_explicit(&tc->busy, memory_order_acquire))
        sched_yield();
}

static void tc_hold_all(struct cuheap_pool *p)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        atomic_store_explicit(&tc->held, 1, memory_order_seq_cst);
    tc_barrier();
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_wait_out(tc);
}

static void tc_unhold_all(struct cuheap_pool *p)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        atomic_store_explicit(&tc->held, 0, memory_order_release);
}

static __attribute__((always_inline)) inline struct cuheap_tcache *
tc_find(const struct cuheap_pool *p)
{
    struct cuheap_tcache *last = tc_slot[0]; /* a thread mostly uses one device */
    if (last && last->pool == p && last->gen == p->gen)
        return last;
    for (unsigned i = 1; i < TC_SLOTS; i++)
        if (tc_slot[i] && tc_slot[i]->pool == p && tc_slot[i]->gen == p->gen)
            return tc_slot[i];
    return NULL;
}

static uint64_t tc_ptr(const struct tc_block *b)
{
    return b->ptr & ~(uint64_t)0xff;
}

static unsigned tc_order(const struct tc_block *b)
{
    return (unsigned)(b->ptr & 0xff);
}

static void tc_fold_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    p->st.live += (uint64_t)tc->live;
    p->st.live_blocks += (uint64_t)tc->live_blocks;
    p->st.nr_hits += tc->nr_hits;
    p->st.nr_fences += tc->nr_fences;
    p->st.fence_ns += tc->fence_ns;
    tc->live = tc->live_blocks = 0;
    tc->nr_hits = tc->nr_fences = tc->fence_ns = 0;
}

/* Freed blocks handed to the pool (p->lock held): behind its open epoch, or straight back
 * when their fence has passed or CUHEAP_REUSE=immediate needs none. The open epoch is not
 * closed here: closing may wait for a fence with p->lock dropped, and a drain walking
 * p->tcaches must keep it (a thread that ends frees its cache under it); the caller closes. */
static void tc_give_freed_locked(struct cuheap_pool *p, const struct tc_batch *b, bool passed)
{
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block *k = &b->blocks[i];
        if (passed || p->cfg->reuse == CUHEAP_REUSE_IMMEDIATE)
            return_block_locked(p, k->arena, tc_ptr(k));
        else
            pend_nowait_locked(p, k->arena, tc_ptr(k), 1ull << tc_order(k));
    }
    if (b->fence)
        p->be.fence_destroy(p->be.ctx, b->fence);
}

/* Whether a block freed with this ticket (tl_ticket) may be used again: a fence whose recording
 * began after its free has passed. */
static bool tl_passed(struct cuheap_timeline *tl, uint64_t ticket)
{
    return atomic_load_explicit(&tl->passed, memory_order_acquire) > ticket;
}

/* The cache's large block to the pool (the caller holds the cache, or is its owner, with
 * p->lock): straight back when its fence has passed, else behind the pool's open epoch.
 * Returns how many blocks moved. */
static unsigned tc_large_give_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    if (!tc->large.ptr)
        return 0;
    uint64_t ptr = tc_ptr(&tc->large);
    struct cuheap_arena *a = tc->large.arena;
    if (tl_passed(&p->tl, tc->large_ticket))
        return_block_locked(p, a, ptr);
    else /* the pool's next fence is recorded after the free, as the timeline's would be */
        pend_nowait_locked(p, a, ptr, 1ull << tc_order(&tc->large));
    tc->large = (struct tc_block){0, NULL};
    return 1;
}

/* Take everything out of a cache the caller holds (tc_hold_all, or one off every list: p->lock
 * held): freed blocks go to the pool (behind its fence unless theirs has passed), and with
 * !freed_only ready blocks are merged back too (a drain is for others to find room). Returns how
 * many blocks moved. */
static unsigned tc_drain_held_locked(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                     bool freed_only)
{
    unsigned n = 0;
    tc_fold_locked(p, tc);
    for (; tc->closed_head != tc->closed_tail; tc->closed_head++) {
        struct tc_batch *b = tc_batch_at(tc, tc->closed_head);
        tc_give_freed_locked(p, b, b->fence && (b->passed || fence_passed(p, b->fence) > 0));
        n += b->nr;
    }
    struct tc_batch *open = tc_open(tc);
    if (open->nr) {
        tc_give_freed_locked(p, open, false);
        n += open->nr;
        tc_open_reset(tc);
    }
    n += tc_large_give_locked(p, tc);
    for (unsigned o = 0; !freed_only && o < TC_NR_ORDERS; o++) {
        for (unsigned i = 0; i < tc->nr_ready[o]; i++) {
            const struct tc_block *k = &tc->ready[o][i];
            if (p->vmm)
                unuse_granules_locked(p, k->arena, k->ptr);
            merge_block_locked(p, k->arena, k->ptr);
        }
        n += tc->nr_ready[o];
        tc->ready_bytes -= (uint64_t)tc->nr_ready[o] << o;
        tc->nr_ready[o] = 0;
    }
    return n;
}

/* Every thread's cache drained (out of memory, trim): one barrier for all of them. Returns
 * how many blocks moved. */
static unsigned tc_drain_all_locked(struct cuheap_pool *p, bool freed_only)
{
    unsigned n = 0;
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        n += tc_drain_held_locked(p, tc, freed_only);
    tc_unhold_all(p);
    return n;
}

static void tc_drain_mine_locked(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_drain_held_locked(p, tc, false);
}

/* A thread ends: its caches go back to their pools. */
static void tc_thread_exit(void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < TC_SLOTS; i++) {
        struct cuheap_tcache *tc = tc_slot[i];
        if (!tc)
            continue;
        struct cuheap_pool *p = tc->pool;
        pthread_mutex_lock(&p->lock);
        bool listed = false;
        for (struct cuheap_tcache **pp = &p->tcaches; *pp; pp = &(*pp)->next)
            if (*pp == tc) {
                *pp = tc->next;
                listed = true;
                break;
            }
        if (listed) { /* else the pool was set up again: what the cache held went with it */
            /* off the list under p->lock, its owner this thread, outside it: no drainer can
             * reach it, so no hold (and no membarrier a thread's end) */
            tc_drain_held_locked(p, tc, false);
            close_if_due_locked(p);
        }
        pthread_mutex_unlock(&p->lock);
        tc_slot[i] = NULL;
        munmap(tc, sizeof(*tc));
    }
}

static bool tc_key_ok;

static void tc_make_key(void)
{
    tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0;
    if (!tc_key_ok)
        cuheap_log("thread caches: no thread key; a thread's cache is kept after it ends");
}

/* The calling thread's cache of p, made on first use (p->lock held); NULL when caches are off,
 * the thread has caches for TC_SLOTS other pools already, or memory is short. */
static struct cuheap_tcache *tc_get_locked(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc || !p->tc_bytes)
        return tc;
    for (unsigned i = 0; i < TC_SLOTS; i++) {
        if (tc_slot[i] && tc_slot[i]->pool == p) {
            memset(tc_slot[i], 0, sizeof(*tc)); /* left from before p was set up again */
            tc = tc_slot[i];
        } else if (!tc_slot[i]) {
            /* zeroed pages of its own (about 660 KB of address space, resident only for the
             * orders the thread uses: 32 KiB for each of the two smallest) */
            void *m =
                mmap(NULL, sizeof(*tc), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                return NULL;
            tc = m;
        } else {
            continue;
        }
        pthread_once(&tc_key_once, tc_make_key);
        if (tc_key_ok)
            pthread_setspecific(tc_key, tc_slot); /* any non-NULL value: the destructor runs */
        tc->pool = p;
        tc->gen = p->gen;
        tc->next = p->tcaches;
        p->tcaches = tc;
        tc_slot[i] = tc;
        return tc;
    }
    return NULL;
}

/* Ready blocks of one order a cache keeps at most: TC_PER_ORDER of the smallest, whose batches
 * close by count, then half as many an order up to 512 KiB of them, and no more than 64 (as
 * many as a batch of them when batches were 64) from 8 KiB on: a large count of larger blocks kept
 * memory from every other size (the GPT replay held 1.043x live with 512 of every order, 1.036x
 * this way). */
#define TC_CAP(o) ((o) <= 10 ? TC_PER_ORDER : (o) == 11 ? 256 : (o) == 12 ? 128 : 64)
static const uint16_t tc_caps[TC_NR_ORDERS] = {
    TC_CAP(0),  TC_CAP(1),  TC_CAP(2),  TC_CAP(3),  TC_CAP(4),  TC_CAP(5),
    TC_CAP(6),  TC_CAP(7),  TC_CAP(8),  TC_CAP(9),  TC_CAP(10), TC_CAP(11),
    TC_CAP(12), TC_CAP(13), TC_CAP(14), TC_CAP(15), TC_CAP(16), TC_CAP(17),
};
_Static_assert(TC_NR_ORDERS == 18, "one cap per order");

/* Put a block into the cache's ready lists if there is room (inside the cache: tc_enter). */
static bool tc_keep_ready(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t ptr,
                          struct cuheap_arena *a, unsigned order)
{
    if (order > p->tc_max_order || tc->nr_ready[order] >= tc_caps[order] ||
        tc->ready_bytes + (1ull << order) > p->tc_bytes)
        return false;
    tc->ready[order][tc->nr_ready[order]++] = (struct tc_block){ptr, a};
    tc->ready_bytes += 1ull << order;
    return true;
}

/* The oldest closed batch, if its fence has passed, becomes ready blocks; those that do not fit
 * go back to the pool (p->lock held, outside the cache). Returns whether one did. */
static bool tc_reap_locked(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    tc_enter(tc);
    if (tc->closed_head == tc->closed_tail) {
        tc_leave(tc);
        return false;
    }
    struct tc_batch *b = tc_batch_at(tc, tc->closed_head);
    /* no query while a stream captures: the driver may refuse it, which is no answer */
    if (!b->passed && (p->nr_capturing || fence_passed(p, b->fence) <= 0)) {
        tc_leave(tc);
        return false;
    }
    /* what does not fit goes to the pool from the batch itself (no copy on the stack: a batch
     * is 16 KiB, on the free path); p->lock keeps drainers out meanwhile */
    uint32_t spill = 0;
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block k = b->blocks[i];
        if (!tc_keep_ready(p, tc, tc_ptr(&k), k.arena, tc_order(&k)))
            b->blocks[spill++] = k;
    }
    b->nr = spill;
    tc_give_freed_locked(p, b, true); /* and the fence goes back */
    tc->closed_head++;
    tc_leave(tc);
    return true;
}

/* Without p->lock: closed batches whose fence has passed give this thread's cache what fits
 * (asking the driver about a fence the thread owns needs no pool lock, and 16 threads each
 * holding it for that serialized on it). What does not fit, and the fence, go back to the pool
 * later, under its lock (tc_reap_locked, tc_drain_held_locked). Returns whether a block came. */
static __attribute__((noinline)) bool tc_reap_unlocked(struct cuheap_pool *p,
                                                       struct cuheap_tcache *tc)
{
    bool got = false;
    tc_enter(tc);
    for (unsigned c = tc->closed_head; c != tc->closed_tail; c++) {
        struct tc_batch *b = tc_batch_at(tc, c);
        if (!b->passed && fence_passed(p, b->fence) <= 0)
            break; /* fences pass in order */
        b->passed = true;
        /* tc_keep_ready() for each block, with the caps from a table and the room reckoned
         * once: a thread's every block passes here once a round */
        uint32_t keep = 0;
        uint64_t room = p->tc_bytes > tc->ready_bytes ? p->tc_bytes - tc->ready_bytes : 0,
                 moved = 0;
        for (uint32_t i = 0; i < b->nr; i++) {
            const struct tc_block k = b->blocks[i];
            unsigned o = tc_order(&k);
            /* o is a cached order but for a double free racing with a reuse of the address as
             * a larger block (tc_free files it under the size it cleared): that one stays in
             * the batch and goes to the pool */
            uint64_t bytes = o <= p->tc_max_order ? 1ull << o : UINT64_MAX;
            if (bytes <= room && tc->nr_ready[o] < tc_caps[o]) {
                uint16_t n = tc->nr_ready[o];
                tc->ready[o][n] = (struct tc_block){tc_ptr(&k), k.arena};
                tc->nr_ready[o] = (uint16_t)(n + 1);
                room -= bytes;
                moved += bytes;
            } else {
                b->blocks[keep++] = k;
            }
        }
        tc->ready_bytes += moved;
        b->bytes -= moved;
        got |= moved != 0;
        b->nr = keep;
    }
    tc_leave(tc);
    return got;
}

/* The thread's open batch is full: close it behind a fence of its own, so its blocks come back
 * to this thread without passing through the pool; while a stream captures (no fence may be
 * recorded), both closed slots wait, or no fence is to be had, the pool takes them. */
static __attribute__((noinline)) void tc_close(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    pthread_mutex_lock(&p->lock);
    tc_enter(tc);
    tc_fold_locked(p, tc); /* a thread that only frees would otherwise never fold its count */
    tc_leave(tc);
    if (tc->closed_tail - tc->closed_head == TC_NR_CLOSED)
        tc_reap_locked(p, tc);
    if (!fences_usable(p) && tc->closed_head != tc->closed_tail) {
        /* their fences will never be answered for: the pool's device sync covers them */
        tc_enter(tc);
        for (; tc->closed_head != tc->closed_tail; tc->closed_head++)
            tc_give_freed_locked(p, tc_batch_at(tc, tc->closed_head), false);
        tc_leave(tc);
    }
    void *fence = NULL;
    bool own = p->cfg->reuse == CUHEAP_REUSE_FENCE && !p->nr_capturing && fences_usable(p) &&
               tc->closed_tail - tc->closed_head < TC_NR_CLOSED &&
               p->be.fence_record(p->be.ctx, &fence) == 0;
    if (own)
        p->st.nr_fences++;
    tc_enter(tc);
    if (own) {
        struct tc_batch *c = tc_open(tc);
        c->fence = fence;
        c->passed = false;
        tc->closed_tail++; /* the next slot, free: at most TC_NR_CLOSED are closed */
    } else {
        tc_give_freed_locked(p, tc_open(tc), false);
    }
    tc_open_reset(tc);
    tc_leave(tc);
    if (!own)
        close_if_due_locked(p);
    pthread_mutex_unlock(&p->lock);
}

/* Fill the cache with up to TC_REFILL more ready blocks of the order just allocated, where
 * they need no driver call (vmm: their granules are mapped), holding their memory for size
 * bytes as the block just allocated does (p->lock held): from the thread's own batch whose
 * fence has passed, the pool's quick list, or for small blocks by splitting. */
static void tc_refill_locked(struct cuheap_pool *p, struct cuheap_tcache *tc, unsigned order,
                             uint64_t size)
{
    /* vmm: a block of a granule or more holds memory of its own; taking one the thread has
     * not asked for would keep that memory from every other size */
    if (order > p->tc_max_order)
        return;
    tc_reap_locked(p, tc);
    struct cuheap_quick *q = &p->quick[order];
    struct tc_block got[TC_REFILL];
    unsigned n = 0;
    tc_enter(tc);
    unsigned room = tc_caps[order] - tc->nr_ready[order];
    uint64_t bytes = tc->ready_bytes;
    tc_leave(tc);
    /* Small blocks also come from the arenas when the list is out: splitting is cheap there. */
    bool split = order <= CUHEAP_QUICK_MAX_ORDER && (!p->vmm || order < p->granule_shift);
    while (n < TC_REFILL && n < room && (q->head || split) &&
           bytes + (1ull << order) <= p->tc_bytes) {
        uint64_t ptr, block;
        struct cuheap_arena *a;
        if (q->head) {
            if (p->vmm && !block_mapped_locked(p, map_lookup(q->head), q->head, size))
                break;
            ptr = quick_pop_locked(p, order, &a);
        } else if (take_block_locked(p, size, &ptr, &block, &a)) {
            break;
        } else if (p->vmm && !block_mapped_locked(p, a, ptr, size)) {
            merge_block_locked(p, a, ptr);
            break;
        }
        struct acquire acq = {.fenced = true, .fenced_all = true}; /* mapped: no driver call */
        if (p->vmm && use_granules_locked(p, a, ptr, size, &acq)) {
            merge_block_locked(p, a, ptr);
            break;
        }
        got[n++] = (struct tc_block){ptr, a};
        bytes += 1ull << order;
    }
    tc_enter(tc);
    for (unsigned i = 0; i < n; i++)
        if (!tc_keep_ready(p, tc, got[i].ptr, got[i].arena, order))
            cuheap_assert(!"room for a refill was counted");
    tc_leave(tc);
}

/* The newest ready block of the order size needs, whatever its memory covers (p->lock held).
 * Returns whether there was one. */
static bool tc_take_ready(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t size,
                          uint64_t *ret_ptr, struct cuheap_arena **ret_arena)
{
    unsigned order = order_of_size(p, size);
    if (order > p->tc_max_order)
        return false;
    tc_enter(tc);
    uint16_t nr = tc->nr_ready[order];
    if (nr) {
        *ret_ptr = tc->ready[order][nr - 1].ptr;
        *ret_arena = tc->ready[order][nr - 1].arena;
        tc->nr_ready[order] = nr - 1;
        tc->ready_bytes -= 1ull << order;
    }
    tc_leave(tc);
    return nr != 0;
}

/* Hand out a block the thread's cache took (inside it, tc_enter): its size and buffer id set,
 * the thread's counts, the event's sequence number; leaves the cache. Returns 0. */
static __attribute__((always_inline)) inline int
tc_hand_out(struct cuheap_pool *p, struct cuheap_tcache *tc, struct cuheap_arena *a, uint64_t ptr,
            uint64_t size, unsigned order, uint64_t *ret_ptr, uint64_t *ret_block,
            uint64_t *ret_seq)
{
    uint32_t u = unit_of(a, ptr);
    if (tc->next_id == tc->end_id) {
        tc->next_id = buffer_id_prefix(p) | next_buffer_ids(p, TC_IDS);
        tc->end_id = tc->next_id + TC_IDS;
    }
    __atomic_store_n(&a->block_size[u], size, __ATOMIC_RELAXED);
    __atomic_store_n(&a->buffer_id[u], tc->next_id++, __ATOMIC_RELAXED);
    tc->live += (int64_t)size;
    tc->live_blocks += (int64_t)(1ull << order);
    tc->nr_hits++;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    tc_leave(tc);
    *ret_ptr = ptr;
    *ret_block = 1ull << order;
    return 0;
}

/* The fast allocation: a ready block of order (that of size, at most tc_max_order) from the
 * thread's own cache. Returns 0, or -EAGAIN for the pool's path. */
static __attribute__((always_inline)) inline int tc_alloc(struct cuheap_pool *p,
                                                          struct cuheap_tcache *tc, uint64_t size,
                                                          unsigned order, uint64_t *ret_ptr,
                                                          uint64_t *ret_block, uint64_t *ret_seq)
{
    tc_enter(tc);
    uint16_t nr = tc->nr_ready[order];
    if (!nr) {
        tc_leave(tc);
        return -EAGAIN;
    }
    struct tc_block b = tc->ready[order][nr - 1];
    uint32_t u = unit_of(b.arena, b.ptr);
    if (p->vmm && b.arena->extent[u] < size) {
        tc_leave(tc); /* its memory is held for a smaller request: the pool maps the rest */
        return -EAGAIN;
    }
    tc->nr_ready[order] = nr - 1;
    tc->ready_bytes -= 1ull << order;
    return tc_hand_out(p, tc, b.arena, b.ptr, size, order, ret_ptr, ret_block, ret_seq);
}

/* The fast free: the block joins the thread's open batch (or, under CUHEAP_REUSE=immediate,
 * its ready blocks). Returns 0, or -EAGAIN for the pool's path (which also answers double
 * frees). */
static __attribute__((always_inline)) inline int
tc_free(struct cuheap_pool *p, struct cuheap_tcache *tc, struct cuheap_arena *a, uint64_t ptr,
        uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    if (!a || a->pool != p || ((ptr - a->buddy.base) & ((1ull << a->buddy.min_order) - 1)))
        return -EAGAIN;
    uint32_t u = unit_of(a, ptr);
    if (u >= a->buddy.nr_units) /* retired since the lookup: its size went to 0 */
        return -EAGAIN;
    uint64_t asked = size_at(a, u); /* a block's order is that of the size it was asked for */
    if (!asked || order_of_size(p, asked) > p->tc_max_order)
        return -EAGAIN;
    /* Whoever clears the size frees the block: a double free racing on two threads frees once.
     * Cleared inside the cache, with the live count: a check sees both or neither. */
    tc_enter(tc);
    uint64_t size = __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size) { /* a double free, or its arena died with its context meanwhile */
        tc_leave(tc);
        return -EAGAIN;
    }
    unsigned order = order_of_size(p, size); /* a block's order is its request's */
    uint64_t block = 1ull << order;
    tc->live -= (int64_t)size;
    tc->live_blocks -= (int64_t)block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    bool full = false;
    if (p->cfg->reuse != CUHEAP_REUSE_IMMEDIATE || (p->vmm && a->extent[u] < size) ||
        !tc_keep_ready(p, tc, ptr, a, order)) {
        struct tc_batch *o = tc_open(tc);
        o->blocks[o->nr++] = (struct tc_block){ptr | order, a};
        o->bytes += block;
        /* a sixteenth of the cache's bytes at most (1 MiB by default): the GPT replay held
         * 1.026x live so, 1.029-1.030 closing at half of them */
        full = o->nr == TC_BATCH || o->bytes >= p->tc_bytes / 16;
    }
    tc_leave(tc);
    *ret_size = size;
    *ret_block = block;
    if (full)
        tc_close(p, tc);
    return 0;
}

/* ---- large blocks off the pool's lock ----
 *
 * A block above tc_max_order is not kept ready: it holds its memory from every other size. But
 * each pair of such blocks then takes the pool's lock twice and waits for a fence recorded
 * under it, and 16 threads of 2 MiB pairs on the H200 spent 85% of their time waiting for that
 * lock, 32-42 times one thread's time a pair (bench/RESULTS.md, 2026-12-02). So a thread that
 * keeps finding the lock taken keeps one large block of its own, freed with no pool lock, and
 * its next allocation of that order takes the block back once a fence recorded after the free
 * has passed (the timeline below, also without the pool's lock). A thread that finds the lock free
 * keeps none, so a job with one allocating thread at a time (the GPT loop, its replay) holds no
 * more memory for it. */

#define TC_LOCK_WINDOW 16 /* pool-lock takings a thread's verdict is made over */

/* Take p->lock for the calling thread (its cache tc, or NULL), counting whether it had to
 * wait. At the end of each window of takings the thread keeps a large block from then on if it
 * waited in a quarter of them or more, and stops (its block goes to the pool) if it never
 * waited. */
static void pool_lock_noting(struct cuheap_pool *p, struct cuheap_tcache *tc)
{
    bool waited = pthread_mutex_trylock(&p->lock) != 0;
    if (waited)
        pthread_mutex_lock(&p->lock);
    if (!tc)
        return;
    /* the owner's own counts (no drainer reads them): no tc_enter */
    tc->nr_contended += waited;
    if (++tc->nr_locks < TC_LOCK_WINDOW)
        return;
    bool on = tc->nr_contended * 4 >= TC_LOCK_WINDOW || (tc->large_on && tc->nr_contended);
    tc->nr_locks = tc->nr_contended = 0;
    if (on == tc->large_on)
        return;
    tc->large_on = on;
    /* p->lock held and this thread the owner: no drainer can be inside (tc_drain_mine_locked) */
    if (!on && tc_large_give_locked(p, tc))
        close_if_due_locked(p);
}

/* The fences of the threads' large blocks form one timeline per pool, shared: a block freed
 * takes a ticket, the number of fences whose recording has begun, and may be used again once a
 * later one has passed. One fence recorded serves every block freed before it, and one thread at
 * a time records or asks the driver (tl->busy) while the others read tl->passed: a fence for
 * each free, recorded and polled by 16 threads at once on the legacy stream, made 16 threads of
 * 2 MiB pairs slower than waiting for the pool's lock (76 against 45 us a pair, CPU 11 against
 * 29 us: they slept in the driver; bench/RESULTS.md 2026-12-02). Fences pass in the order they
 * were recorded: each is an event on the same streams, each stream in order. */
static uint64_t tl_ticket(struct cuheap_timeline *tl)
{
    return atomic_load_explicit(&tl->started, memory_order_seq_cst);
}

/* Whether the calling thread may record or ask the driver now (tl_leave when done): it never
 * waits, and threads waiting for fences look before they try (tl_wait). */
static bool tl_try_enter(struct cuheap_timeline *tl)
{
    return !atomic_load_explicit(&tl->busy, memory_order_relaxed) &&
           !atomic_exchange_explicit(&tl->busy, true, memory_order_acquire);
}

/* For a trim or a context's death, which must get in: waits for the thread inside to leave. */
static void tl_enter(struct cuheap_timeline *tl)
{
    while (!tl_try_enter(tl))
        sched_yield();
}

static void tl_leave(struct cuheap_timeline *tl)
{
    atomic_store_explicit(&tl->busy, false, memory_order_release);
}

/* Recorded fences let go, oldest first, as they pass (inside tl_try_enter): asked about until
 * one has not (wait: false), or each waited for (a trim, tl_settle). */
static void tl_pass_locked(struct cuheap_pool *p, struct cuheap_timeline *tl, bool wait)
{
    uint64_t n = atomic_load_explicit(&tl->passed, memory_order_relaxed);
    uint64_t last = atomic_load_explicit(&tl->recorded, memory_order_relaxed);
    for (; n < last; n++) {
        void **slot = &tl->ring[(n + 1) % CUHEAP_NR_TIMELINE];
        if (wait) {
            if (p->be.fence_wait(p->be.ctx, *slot) != 0)
                p->be.device_sync(p->be.ctx); /* what the pool's own waits fall back to */
        } else if (fence_passed(p, *slot) <= 0) {
            break;
        }
        p->be.fence_destroy(p->be.ctx, *slot);
        *slot = NULL;
        atomic_store_explicit(&tl->passed, n + 1, memory_order_release);
    }
}

/* A fence numbered above the last recorded one, recorded now unless one numbered need or later
 * is already (inside tl_try_enter; the caller asks again while its need is not met). The count
 * of started fences goes up before the driver is asked, so that a free meanwhile waits for the
 * next one; when the driver refuses, it stays up and the next fence recorded takes the number:
 * a free that took it waits for one fence more than it needs, never for fewer, and no ticket is
 * above the count (lowering it again made one so, which pool_check rightly refused; a review
 * found it). Returns whether a fence was recorded or one is. */
static bool tl_record_locked(struct cuheap_pool *p, struct cuheap_timeline *tl, uint64_t need,
                             struct cuheap_tcache *tc)
{
    uint64_t last = atomic_load_explicit(&tl->recorded, memory_order_relaxed);
    if (last >= need)
        return true;
    if (last + 1 - atomic_load_explicit(&tl->passed, memory_order_relaxed) > CUHEAP_NR_TIMELINE) {
        tl_pass_locked(p, tl, false); /* the ring is full of fences in flight: its oldest slot */
        if (last + 1 - atomic_load_explicit(&tl->passed, memory_order_relaxed) > CUHEAP_NR_TIMELINE)
            return false;
    }
    atomic_store_explicit(&tl->started, last + 1, memory_order_seq_cst);
    if (idle_now(p)) {
        /* asked after the count went up: every free that took a lower ticket is covered, and
         * every fence recorded before has passed */
        tl_pass_locked(p, tl, true); /* each has passed: the waits return at once */
        atomic_store_explicit(&tl->recorded, last + 1, memory_order_release);
        atomic_store_explicit(&tl->passed, last + 1, memory_order_release);
        atomic_fetch_add_explicit(&p->nr_idle_tl, 1, memory_order_relaxed);
        return true;
    }
    void *fence = NULL;
    if (!fences_usable(p) || p->be.fence_record(p->be.ctx, &fence))
        return false;
    tl->ring[(last + 1) % CUHEAP_NR_TIMELINE] = fence;
    atomic_store_explicit(&tl->recorded, last + 1, memory_order_release);
    tc->nr_fences++;
    return true;
}

/* Every recorded fence waited for and let go (trim, with p->lock not held): nothing of the
 * timeline stays held, and the blocks threads keep may go back to the pool at once. Threads
 * waiting meanwhile spin (tl_wait). */
static void tl_settle(struct cuheap_pool *p)
{
    tl_enter(&p->tl);
    tl_pass_locked(p, &p->tl, true);
    tl_leave(&p->tl);
}

/* The context is gone, its fences with it (p->lock, every cache and the timeline held:
 * cuheap_pool_abandon; or a child after fork): everything counts as passed. */
static void tl_forget(struct cuheap_timeline *tl, bool fork_child)
{
    if (fork_child)
        atomic_store(&tl->busy, false); /* a thread that was inside is gone with the fork */
    memset(tl->ring, 0, sizeof(tl->ring));
    uint64_t n = atomic_load(&tl->started);
    atomic_store(&tl->recorded, n);
    atomic_store(&tl->passed, n);
}

/* A large block freed by a thread that keeps one (large_on) and keeps none yet: it takes the
 * timeline's ticket and stays with the thread. Returns 0, or -EAGAIN for the pool's path
 * (which also answers double frees). */
static __attribute__((noinline)) int tc_large_free(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                                   struct cuheap_arena *a, uint64_t ptr,
                                                   uint64_t *ret_size, uint64_t *ret_block,
                                                   uint64_t *ret_seq)
{
    if (!a || a->pool != p || p->cfg->reuse != CUHEAP_REUSE_FENCE ||
        ((ptr - a->buddy.base) & ((1ull << a->buddy.min_order) - 1)))
        return -EAGAIN;
    uint32_t u = unit_of(a, ptr);
    if (u >= a->buddy.nr_units) /* retired since the lookup */
        return -EAGAIN;
    uint64_t asked = size_at(a, u);
    if (!asked || order_of_size(p, asked) <= p->tc_max_order)
        return -EAGAIN;
    tc_enter(tc);
    if (tc->large.ptr) { /* read inside: a drainer may be taking it (ThreadSanitizer saw it) */
        tc_leave(tc);
        return -EAGAIN;
    }
    /* whoever clears the size frees the block (tc_free); a size cleared by a racing double
     * free of the address reused meanwhile may be of another order: the block is kept all the
     * same, and goes back to the pool from here (tc_large_give_locked takes any order) */
    uint64_t size = __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size) {
        tc_leave(tc);
        return -EAGAIN;
    }
    unsigned order = order_of_size(p, size);
    uint64_t block = 1ull << order;
    tc->live -= (int64_t)size;
    tc->live_blocks -= (int64_t)block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    tc->large_ticket = tl_ticket(&p->tl); /* after the size is cleared: the free has begun */
    tc->large = (struct tc_block){ptr | order, a};
    tc_leave(tc);
    *ret_size = size;
    *ret_block = block;
    return 0;
}

/* Wait, up to CUHEAP_FENCE_POLL_NS (as the pool's path polls before it maps more memory), for
 * a fence after the ticket to pass: recording one if none is, asking the driver when no other
 * thread is. No fence is recorded while a stream captures (it would join the capture's graph;
 * the count is read inside the cache, cuheap_pool_capture). Returns whether one passed. */
static bool tl_wait(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t ticket)
{
    struct cuheap_timeline *tl = &p->tl;
    uint64_t t0 = mono_ns(), now = t0;
    bool passed;
    for (unsigned round = 0; !(passed = tl_passed(tl, ticket)); round++) {
        /* Never asleep on a lock, and a look before a try: 16 threads asleep on a mutex while
         * one recorded woke up late (33 us a 2 MiB pair on the H200), and 16 threads trying a
         * mutex between yields spent 18% of their time in the try (11 us a pair). */
        bool recorded_now = false;
        if (atomic_load_explicit(&tl->recorded, memory_order_acquire) <= ticket) {
            if (__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
                break;
            if (tl_try_enter(tl)) {
                bool ok = tl_record_locked(p, tl, ticket + 1, tc);
                tl_leave(tl);
                if (!ok)
                    break;
                recorded_now = true;
            }
        } else if (tl_try_enter(tl)) {
            tl_pass_locked(p, tl, false);
            tl_leave(tl);
            if ((passed = tl_passed(tl, ticket)))
                break;
        }
        /* a fence just recorded is asked about at least once, however long the recording (or
         * the thread's time off the CPU) took */
        if ((now = mono_ns()) >= t0 + CUHEAP_FENCE_POLL_NS && !recorded_now)
            break;
        /* a fence takes microseconds: spin a little, and let others run now and then */
        if (round % 8 == 7)
            sched_yield();
        else
            for (int i = 0; i < 64; i++)
                cpu_relax();
    }
    tc->fence_ns += (passed ? mono_ns() : now) - t0;
    return passed;
}

/* A large allocation of the order of the thread's kept block: that block, once a fence after
 * its free has passed (tl_wait). Returns 0, or -EAGAIN for the pool's path, which takes the
 * block back with the thread's other frees when it needs memory (fence_pending_once_locked). */
static __attribute__((noinline)) int tc_large_alloc(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                                    uint64_t size, unsigned order,
                                                    uint64_t *ret_ptr, uint64_t *ret_block,
                                                    uint64_t *ret_seq)
{
    tc_enter(tc);
    struct tc_block b = tc->large;
    uint64_t ptr = tc_ptr(&b);
    /* while a stream captures, allocations go to the driver (pool_alloc_slow) */
    if (!b.ptr || tc_order(&b) != order || __atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED) ||
        (p->vmm && b.arena->extent[unit_of(b.arena, ptr)] < size) ||
        !tl_wait(p, tc, tc->large_ticket)) {
        tc_leave(tc);
        return -EAGAIN;
    }
    tc->large = (struct tc_block){0, NULL};
    return tc_hand_out(p, tc, b.arena, ptr, size, order, ret_ptr, ret_block, ret_seq);
}

/* Give every empty arena back (p->lock held on entry and exit, dropped around the driver
 * calls). Returns how many were released. */
static unsigned release_empty_unlocked(struct cuheap_pool *p)
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
    pthread_mutex_unlock(&p->lock);
    free_arenas_unlocked(p, bases, sizes, nr);
    pthread_mutex_lock(&p->lock);
    return nr;
}

/* CUHEAP_RELEASE=empty: unlink the empty arenas the pool can spare, at most
 * CUHEAP_NR_SPARE_MAX at a time, into bases[] for the caller to give back after unlocking.
 * One empty arena stays as a cushion, so a loop that allocates and frees a small block does
 * not take an arena from the driver and give it back every time, and so does what keeps
 * CUHEAP_POOL_INIT reserved. Returns how many were unlinked. */
static unsigned spare_empty_locked(struct cuheap_pool *p, uint64_t *bases, uint64_t *sizes)
{
    if (p->vmm && p->cfg->release == CUHEAP_RELEASE_EMPTY) {
        /* idle granules go back at once, but for a cushion against churn */
        release_idle_locked(p, p->cfg->pool_init + p->cfg->vmm_cushion);
        return 0;
    }
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

/* Debug builds (-Ddebug_checks=true) check every invariant every 64th operation (a check
 * walks every unit of every arena). */
static void debug_check(struct cuheap_pool *p)
{
#ifdef CUHEAP_DEBUG
    static _Atomic unsigned nr_ops;
    char why[256];
    if (atomic_fetch_add(&nr_ops, 1) % 64 == 0 && cuheap_pool_check(p, why, sizeof(why)))
        cuheap_assert_fail(why, __FILE__, __LINE__);
#else
    (void)p;
#endif
}

/* ---- public ---- */

/* The thread's cache after an allocation through the pool (p->lock held): made on first use,
 * its counts folded in, buffer ids to hand out, and ready blocks of the order just served. */
static void tc_after_alloc_locked(struct cuheap_pool *p, uint64_t size)
{
    struct cuheap_tcache *tc = tc_get_locked(p);
    if (!tc)
        return;
    tc_enter(tc);
    tc_fold_locked(p, tc);
    tc_leave(tc);
    unsigned order = order_of_size(p, size);
    if (order < CUHEAP_NR_ORDERS)
        tc_refill_locked(p, tc, order, size);
}

static __attribute__((noinline)) int pool_alloc_slow(struct cuheap_pool *p, uint64_t size,
                                                     uint64_t stream, unsigned order, bool cached,
                                                     uint64_t *ret_ptr, uint64_t *ret_block,
                                                     uint64_t *ret_seq);

/* The thread cache's allocation here, everything else out of line: the common call then saves
 * and restores only the registers it uses. */
int cuheap_pool_alloc(struct cuheap_pool *p, uint64_t size, uint64_t stream, uint64_t *ret_ptr,
                      uint64_t *ret_block, uint64_t *ret_seq)
{
    if (size == 0 || size > p->cfg->pool_max)
        return CUHEAP_POOL_PASS;
    unsigned order = order_of_size(p, size);
    /* a block too large for the caches asks no fence on their behalf */
    bool cached = !stream && p->tc_bytes && order <= p->tc_max_order;
    if (cached && !__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED)) {
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && (tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0 ||
                   (tc_reap_unlocked(p, tc) &&
                    tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0)))
            return 0;
    }
    return pool_alloc_slow(p, size, stream, order, cached, ret_ptr, ret_block, ret_seq);
}

static int pool_alloc_slow(struct cuheap_pool *p, uint64_t size, uint64_t stream, unsigned order,
                           bool cached, uint64_t *ret_ptr, uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_tcache *mine = tc_find(p);
    /* here rather than in cuheap_pool_alloc, where it cost the small blocks' path registers */
    if (mine && mine->large_on && !stream && order > p->tc_max_order &&
        tc_large_alloc(p, mine, size, order, ret_ptr, ret_block, ret_seq) == 0)
        return 0;
    pool_lock_noting(p, mine);
    if (p->nr_capturing && !stream) {
        pthread_mutex_unlock(&p->lock);
        return CUHEAP_POOL_PASS;
    }
    if (p->nr_merged >= CUHEAP_PURGE_EVERY)
        purge_meta_locked(p);
    uint64_t ptr = 0, block = 0;
    struct cuheap_arena *arena = NULL;
    int r = -ENOMEM, g = 0;
    bool from_tc = false;
    if (cached) {
        /* the thread's own batch whose fence has passed, before anything of the pool's */
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && tc_reap_locked(p, tc) &&
            tc_alloc(p, tc, size, order, ret_ptr, ret_block, ret_seq) == 0) {
            pthread_mutex_unlock(&p->lock);
            return 0;
        }
        /* vmm: a ready block whose memory covers a smaller request gets the rest here */
        if (tc && p->vmm && tc_take_ready(p, tc, size, &ptr, &arena)) {
            block = 1ull << order;
            from_tc = true;
            r = 0;
        }
    }
    bool missed = false, drained = false;
    /* Same-stream reuse needs no fence: later work on that stream is ordered after the free. */
    struct cuheap_stream_cache *sc = stream ? stream_cache_locked(p, stream, false) : NULL;
    if (sc) {
        if (order < CUHEAP_NR_ORDERS && sc->heads[order]) {
            ptr = sc->heads[order];
            arena = map_lookup(ptr);
            sc->heads[order] = arena->link[unit_of(arena, ptr)];
            sc->bytes -= 1ull << order;
            block = 1ull << order;
            p->st.pending -= block;
            p->pending_mapped -= extent_at(p, arena, ptr);
            r = 0;
        }
    }
    /* With thread caches, this path runs once per refill: blocks whose fence has passed are
     * what refills come from, so look for them every time the quick list is out. */
    if (r && (++p->nr_since_poll >= 32 || (cached && !p->quick[order % CUHEAP_NR_ORDERS].head))) {
        p->nr_since_poll = 0;
        reclaim_locked(p);
    }
    /* Blocks freed since the last fence come back before a place is chosen, if every stream
     * is idle: chosen first, the new block was placed around them, and under vmm a loop of
     * 2 MiB pairs then moved memory to it from theirs every pair. */
    if (r && !p->quick[order % CUHEAP_NR_ORDERS].head)
        give_back_if_idle_locked(p);
    bool from_cache = r == 0 && !from_tc;
again:;
    bool flushed = false, trimmed = false;
    unsigned synced = 0;
    while (r) {
        r = take_block_locked(p, size, &ptr, &block, &arena);
        if (r == 0)
            break;
        missed = true;
        if (reclaim_locked(p) || flush_quick_locked(p))
            continue;
        if (p->vmm) {
            /* out of address space only: more costs no device memory */
            g = grow_locked(p, size, false);
            if (g == 0)
                continue;
            if (g == -EIO)
                goto refused;
            goto out_of_memory;
        }
        if (!flushed) {
            /* Blocks waiting in thread caches, the open epoch or stream caches become
             * reusable sooner behind a fence recorded now. */
            flushed = true;
            tc_drain_all_locked(p, true);
            flush_stream_caches_locked(p);
            if (close_epoch_locked(p))
                continue; /* every stream idle: they came back, a reason not to grow */
        }
        if (poll_oldest_locked(p))
            continue;
        g = grow_locked(p, size, false);
        if (g == 0)
            continue;
        if (p->ep_head != p->ep_tail && wait_oldest_locked(p))
            continue;
        if (!trimmed && p->cfg->release != CUHEAP_RELEASE_NEVER) { /* legacy only, as above */
            /* Empty arenas too small for this request (made under a limit) can make room
             * for one that fits. */
            trimmed = true;
            if (release_empty_unlocked(p))
                continue;
        }
        if (p->syncing && synced++ < CUHEAP_NR_EPOCHS) {
            wait_syncing_locked(p); /* blocks another thread syncs for come back soon */
            continue;
        }
        goto out_of_memory;
    }
    if (p->vmm && !from_cache && !from_tc)
        prefer_mapped_locked(p, size, &ptr, &block, &arena);
    if (p->vmm) {
        uint64_t before = p->st.nr_creates + p->st.nr_moves;
        struct acquire acq = {.fenced = false};
        g = use_granules_locked(p, arena, ptr, size, &acq);
        if (g) {
            if (from_cache)
                pend_locked(p, arena, ptr, block); /* reusable on its stream only: fence it */
            else
                return_block_locked(p, arena, ptr);
            from_cache = from_tc = false;
            r = -ENOMEM;
            if (g == -EIO)
                goto refused;
            goto out_of_memory;
        }
        missed = p->st.nr_creates + p->st.nr_moves != before; /* the driver was needed */
    }
    if (missed)
        p->st.nr_misses++;
    else
        p->st.nr_hits++;
    mark_live_locked(p, arena, ptr, size, block);
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    if (cached)
        tc_after_alloc_locked(p, size);
    pthread_mutex_unlock(&p->lock);
    debug_check(p);
    *ret_ptr = ptr;
    *ret_block = block;
    return 0;
out_of_memory:
    /* Ready and freed blocks in every thread's cache go back before the answer is no. */
    if (!drained) {
        drained = true;
        if (tc_drain_all_locked(p, false))
            goto again;
    }
    note(p, g == -EDQUOT ? CUHEAP_EV_LIMIT : CUHEAP_EV_OOM, 0, size, p->st.reserved, p->limit);
    pthread_mutex_unlock(&p->lock);
    return -ENOMEM;
refused:
    if (vmm_refused_locked(p))
        goto again; /* a legacy pool now */
    pthread_mutex_unlock(&p->lock);
    return CUHEAP_POOL_PASS; /* new memory from the driver while the pool's blocks live */
}

static __attribute__((noinline)) int pool_free_slow(struct cuheap_pool *p, uint64_t ptr,
                                                    uint64_t stream, bool cached,
                                                    uint64_t *ret_size, uint64_t *ret_block,
                                                    uint64_t *ret_seq);

/* The thread cache's free here, everything else out of line (as cuheap_pool_alloc); a is
 * ptr's arena as looked up without a lock (or NULL). */
static __attribute__((always_inline)) inline int
pool_free_in(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t stream,
             uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    bool cached = !stream && p->tc_bytes && p->cfg->reuse != CUHEAP_REUSE_SYNC;
    if (cached) {
        struct cuheap_tcache *tc = tc_find(p);
        if (tc && tc_free(p, tc, a, ptr, ret_size, ret_block, ret_seq) == 0)
            return 0;
    }
    return pool_free_slow(p, ptr, stream, cached, ret_size, ret_block, ret_seq);
}

int cuheap_pool_free(struct cuheap_pool *p, uint64_t ptr, uint64_t stream, uint64_t *ret_size,
                     uint64_t *ret_block, uint64_t *ret_seq)
{
    return pool_free_in(p, map_lookup(ptr), ptr, stream, ret_size, ret_block, ret_seq);
}

/* One look into the address map for both questions, whose pool and where in it: a second
 * (cuheap_pool_of, then the free's own) was 17 instructions of a 512 B pair. */
int cuheap_pool_free_any(uint64_t ptr, uint64_t stream, struct cuheap_pool **ret_pool,
                         uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_arena *a = map_lookup(ptr);
    if (!a)
        return CUHEAP_POOL_PASS;
    *ret_pool = a->pool;
    return pool_free_in(a->pool, a, ptr, stream, ret_size, ret_block, ret_seq);
}

static int pool_free_slow(struct cuheap_pool *p, uint64_t ptr, uint64_t stream, bool cached,
                          uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq)
{
    struct cuheap_tcache *mine = tc_find(p);
    if (mine && mine->large_on && cached && /* here for the reason pool_alloc_slow says */
        tc_large_free(p, mine, map_lookup(ptr), ptr, ret_size, ret_block, ret_seq) == 0)
        return 0;
    pool_lock_noting(p, mine);
    struct cuheap_arena *a = map_lookup(ptr);
    int found = a && a->pool == p ? cuheap_buddy_order_at(&a->buddy, ptr) : -EINVAL;
    uint32_t u = found < 0 ? 0 : unit_of(a, ptr);
    uint64_t size = found < 0 ? 0 : __atomic_exchange_n(&a->block_size[u], 0, __ATOMIC_ACQ_REL);
    if (!size) {
        pthread_mutex_unlock(&p->lock);
        return -EINVAL; /* not a block start, or not live: a double free */
    }
    unsigned order = (unsigned)found;
    uint64_t block = 1ull << order;
    p->st.live -= size;
    p->st.live_blocks -= block;
    if (ret_seq)
        *ret_seq = cuheap_seq_next();
    *ret_size = size;
    *ret_block = block;
    struct cuheap_stream_cache *sc = stream ? stream_cache_locked(p, stream, true) : NULL;
    if (sc) {
        a->link[u] = sc->heads[order];
        sc->heads[order] = ptr;
        sc->bytes += block;
        p->st.pending += block;
        p->pending_mapped += extent_at(p, a, ptr);
        /* Keep per-stream hoards bounded: past an arena's worth, share them behind a fence. */
        if (sc->bytes > p->cfg->arena_size) {
            flush_stream_caches_locked(p);
            close_epoch_locked(p);
        }
    } else if (p->cfg->reuse == CUHEAP_REUSE_IMMEDIATE) {
        return_block_locked(p, a, ptr);
    } else if (p->cfg->reuse == CUHEAP_REUSE_SYNC) {
        pthread_mutex_unlock(&p->lock);
        p->be.device_sync(p->be.ctx); /* what cuMemFree itself would have waited for */
        pthread_mutex_lock(&p->lock);
        return_block_locked(p, a, ptr);
    } else {
        pend_locked(p, a, ptr, block);
        /* blocks whose fence has passed may empty an arena that can go back now */
        if (p->cfg->release == CUHEAP_RELEASE_EMPTY)
            reclaim_locked(p);
    }
    if (cached)
        tc_get_locked(p); /* this thread's next frees need no lock */
    uint64_t bases[CUHEAP_NR_SPARE_MAX], sizes[CUHEAP_NR_SPARE_MAX];
    unsigned nr = spare_empty_locked(p, bases, sizes);
    pthread_mutex_unlock(&p->lock);
    if (nr)
        free_arenas_unlocked(p, bases, sizes, nr);
    debug_check(p);
    return 0;
}

int cuheap_pool_block_range(struct cuheap_pool *p, uint64_t ptr, uint64_t *ret_base,
                            uint64_t *ret_size, uint64_t *ret_buffer_id, uint64_t *ret_arena)
{
    pthread_mutex_lock(&p->lock);
    struct cuheap_arena *a = map_lookup(ptr);
    uintptr_t start;
    unsigned order;
    bool allocated;
    int r = -EINVAL;
    if (a && cuheap_buddy_block_of(&a->buddy, ptr, &start, &order, &allocated) == 0 && allocated) {
        uint32_t u = unit_of(a, start);
        uint64_t size = size_at(a, u);
        if (size && ptr < start + size) {
            *ret_base = start;
            *ret_size = size;
            *ret_buffer_id = __atomic_load_n(&a->buffer_id[u], __ATOMIC_RELAXED);
            *ret_arena = a->buddy.base;
            r = 0;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

int cuheap_pool_share(struct cuheap_pool *p, uint64_t block, uint64_t buffer_id,
                      struct cuheap_share *pieces, unsigned max)
{
    pthread_mutex_lock(&p->lock);
    struct cuheap_arena *a = p->vmm && p->be.phys_export ? map_lookup(block) : NULL;
    int r = -EINVAL;
    uintptr_t start;
    unsigned order;
    bool allocated;
    if (!a || a->pool != p || cuheap_buddy_block_of(&a->buddy, block, &start, &order, &allocated) ||
        !allocated || start != block || !size_at(a, unit_of(a, block)) ||
        __atomic_load_n(&a->buffer_id[unit_of(a, block)], __ATOMIC_RELAXED) != buffer_id)
        goto out; /* freed (or taken again) since it was exported */
    uint32_t u = unit_of(a, block), first, last;
    granule_span(p, a, block, a->extent[u], &first, &last);
    unsigned n = 0;
    for (uint32_t g = first; g <= last; g++) {
        struct cuheap_chunk *c = a->granules[g].chunk;
        if (!c || (n && pieces[n - 1].chunk == c))
            continue;
        if (n == max) {
            r = -ENOSPC;
            goto undo;
        }
        int fd;
        if (p->be.phys_export(p->be.ctx, c->handle, &fd)) {
            r = -EIO;
            goto undo;
        }
        pieces[n++] = (struct cuheap_share){.chunk = c,
                                            .offset = (int64_t)(chunk_va(c) - block),
                                            .bytes = chunk_bytes(p, c),
                                            .fd = fd};
    }
    r = (int)n;
    goto out;
undo:
    while (n)
        close(pieces[--n].fd);
out:
    pthread_mutex_unlock(&p->lock);
    return r;
}

uint64_t cuheap_pool_trim(struct cuheap_pool *p, bool keep_init)
{
    tl_settle(p); /* as the pool's epochs are waited for below */
    pthread_mutex_lock(&p->lock);
    tc_drain_all_locked(p, false);
    flush_stream_caches_locked(p);
    close_epoch_locked(p);
    /* a fence that no wait passes (the driver refuses every way to ask) stays behind */
    while (p->ep_head != p->ep_tail && wait_oldest_locked(p))
        ;
    flush_quick_locked(p);
    if (p->vmm) {
        /* the address space stays: it costs no device memory */
        uint64_t released = release_idle_locked(p, keep_init ? p->cfg->pool_init : 0);
        pthread_mutex_unlock(&p->lock);
        return released;
    }
    uint64_t bases[CUHEAP_NR_MAX_ARENAS], sizes[CUHEAP_NR_MAX_ARENAS];
    unsigned nr = 0;
    uint64_t released = 0, before = p->st.reserved;
    for (unsigned i = 0; i < p->nr_arenas;) {
        struct cuheap_arena *a = p->arenas[i];
        if (a->nr_live == 0 &&
            (!keep_init || p->st.reserved - a->buddy.size >= p->cfg->pool_init)) {
            bases[nr] = unlink_arena_locked(p, i, &sizes[nr]);
            nr++;
            continue; /* slot i now holds another arena */
        }
        i++;
    }
    pthread_mutex_unlock(&p->lock);
    free_arenas_unlocked(p, bases, sizes, nr);
    pthread_mutex_lock(&p->lock);
    released = before > p->st.reserved ? before - p->st.reserved : 0;
    pthread_mutex_unlock(&p->lock);
    return released;
}

/* CUHEAP_POOL_INIT under vmm: idle granules mapped at the start of the first arena, each its
 * own chunk so that blocks of any size can use them (one driver call each, once); under the
 * aligned layout, the unmapped granules of each piece as one chunk (the size chunks come in;
 * a piece may be mapped in part already), no more than asked for. */
static int reserve_granules_locked(struct cuheap_pool *p, uint64_t bytes)
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
        if ((r = new_chunk_locked(p, a, g, end - g + 1)))
            return r == -EIO ? -EIO : -ENOMEM;
        g = end + 1;
    }
    if (p->st.reserved > p->peak_busy)
        p->peak_busy = p->st.reserved; /* asked for: not to be given back to make room */
    return p->st.reserved >= bytes ? 0 : -ENOMEM;
}

int cuheap_pool_reserve(struct cuheap_pool *p, uint64_t bytes)
{
    int r = 0;
    pthread_mutex_lock(&p->lock);
    if (p->vmm) {
        r = reserve_granules_locked(p, bytes);
        if (r != -EIO || !vmm_refused_locked(p)) {
            pthread_mutex_unlock(&p->lock);
            return r ? -ENOMEM : 0;
        }
        r = 0; /* a legacy pool now: arenas as below */
    }
    while (p->st.reserved < bytes && r == 0) {
        /* in power-of-two arenas that add up to what was asked, rounded up to 2 MiB */
        uint64_t want = bytes - p->st.reserved, size = p->cfg->arena_size;
        if (want < size)
            size = want <= (2u << 20) ? pow2_ceil(want) : 1ull << (63 - __builtin_clzll(want));
        r = grow_locked(p, size, true);
    }
    pthread_mutex_unlock(&p->lock);
    return r ? -ENOMEM : 0;
}

void cuheap_pool_capture(struct cuheap_pool *p, int delta)
{
    pthread_mutex_lock(&p->lock);
    if (delta < 0 && p->nr_capturing == 0) {
        pthread_mutex_unlock(&p->lock);
        return;
    }
    __atomic_store_n(&p->nr_capturing, (unsigned)((int)p->nr_capturing + delta), __ATOMIC_RELAXED);
    if (delta > 0) {
        /* a thread may be recording a timeline fence with no pool lock (tl_wait): the capture
         * begins once every owner has left its cache, and they read the count inside theirs
         * from now on */
        tc_hold_all(p);
        tc_unhold_all(p);
    }
    if (!p->nr_capturing && open_epoch(p)->nr_blocks >= p->cfg->fence_batch)
        close_epoch_locked(p);
    pthread_mutex_unlock(&p->lock);
}

int cuheap_pool_grant_access(struct cuheap_pool *p)
{
    int r = 0;
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; p->vmm && p->be.phys_access && i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        for (uint32_t g = 0; g < a->nr_granules; g++)
            if (a->chunks[g].handle &&
                p->be.phys_access(p->be.ctx, granule_va(a, g), chunk_bytes(p, &a->chunks[g])))
                r = -EIO;
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

void cuheap_pool_get_stats(struct cuheap_pool *p, struct cuheap_pool_stats *ret)
{
    pthread_mutex_lock(&p->lock);
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_fold_locked(p, tc);
    tc_unhold_all(p);
    *ret = p->st;
    ret->nr_idle += atomic_load_explicit(&p->nr_idle_tl, memory_order_relaxed);
    ret->vmm_refused = p->vmm_refused;
    ret->fences_refused = atomic_load_explicit(&p->fences_refused, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, why_size, __VA_ARGS__);                                                      \
        goto failed;                                                                               \
    } while (0)

/* vmm: every granule's users are the live and pending blocks whose used bytes reach into it;
 * a used granule is mapped; a mapped granule nobody uses is on the idle list. */
static int check_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, char *why,
                                 size_t why_size)
{
    uint32_t *users = calloc(a->nr_granules ? a->nr_granules : 1, sizeof(*users));
    uint32_t mapped = 0;
    if (!users) {
        snprintf(why, why_size, "no memory for the check");
        return -EFAULT;
    }
    for (uint32_t u = 0; u < a->buddy.nr_units;) {
        uintptr_t start;
        unsigned order;
        bool allocated;
        uintptr_t addr = a->buddy.base + ((uintptr_t)u << a->buddy.min_order);
        cuheap_buddy_block_of(&a->buddy, addr, &start, &order, &allocated);
        if (a->extent[u]) {
            uint32_t first, last;
            granule_span(p, a, addr, a->extent[u], &first, &last);
            if (!allocated || a->extent[u] > (1ull << order)) {
                snprintf(why, why_size, "block %#lx holds granules but is free or too small",
                         (unsigned long)addr);
                free(users);
                return -EFAULT;
            }
            for (uint32_t g = first; g <= last; g++)
                users[g]++;
        }
        u += 1u << (order - a->buddy.min_order);
    }
    int r = 0;
    for (uint32_t g = 0; g < a->nr_granules && !r; g++) {
        const struct cuheap_granule *gr = &a->granules[g];
        const struct cuheap_chunk *c = gr->chunk;
        mapped += c != NULL;
        bool bit = (a->mapped_bits[g / 64] >> (g % 64)) & 1;
        if (gr->nr_users != users[g] || (gr->nr_users && !c) || bit != (c != NULL) ||
            (c && (!c->handle || c->arena != a || &a->chunks[c->first] != c || g < c->first ||
                   g >= c->first + c->nr))) {
            snprintf(why, why_size, "granule %u at %#lx: %u users (counted %u), mapped %d", g,
                     (unsigned long)granule_va(a, g), gr->nr_users, users[g], c != NULL);
            r = -EFAULT;
        }
    }
    for (uint32_t g = 0; g < a->nr_granules && !r; g++) {
        const struct cuheap_chunk *c = &a->chunks[g];
        if (!c->handle)
            continue;
        uint32_t busy = 0;
        for (uint32_t k = c->first; k < c->first + c->nr && k < a->nr_granules; k++)
            busy += a->granules[k].nr_users > 0;
        bool idle = c->idle_next != NULL;
        /* aligned layout: a chunk never crosses a piece's edge, or it could not move whole */
        bool crosses = p->cfg->vmm_layout == CUHEAP_VMM_ALIGNED &&
                       c->first / p->chunk_max != (c->first + c->nr - 1) / p->chunk_max;
        if (c->first != g || busy != c->nr_busy || idle != !busy || crosses) {
            snprintf(why, why_size, "chunk at %#lx: %u granules, %u busy (counted %u), idle %d",
                     (unsigned long)granule_va(a, g), c->nr, c->nr_busy, busy, idle);
            r = -EFAULT;
        }
    }
    for (uint32_t w = 0; w < (a->nr_granules + 63) / 64 && !r; w++) {
        if (((a->mapped_words[w / 64] >> (w % 64)) & 1) != (a->mapped_bits[w] != 0)) {
            snprintf(why, why_size, "mapped-word summary wrong at granule %u", w * 64);
            r = -EFAULT;
        }
    }
    uint32_t used = 0;
    for (uint32_t g = 0; g < a->nr_granules; g++)
        used += a->granules[g].nr_users > 0;
    if (!r && used != a->nr_used) {
        snprintf(why, why_size, "arena has %u granules in use, counted %u", a->nr_used, used);
        r = -EFAULT;
    }
    if (!r && mapped != a->nr_mapped) {
        snprintf(why, why_size, "arena maps %u granules, counted %u", a->nr_mapped, mapped);
        r = -EFAULT;
    }
    free(users);
    return r;
}

/* Whether the block at ptr is allocated in its arena, starts there and is not live: what a
 * block waiting on a list (pending, quick, a thread's cache) must be. Returns its order or -1. */
static int idle_block_order(struct cuheap_arena *a, uint64_t ptr)
{
    if (!a || size_at(a, unit_of(a, ptr)))
        return -1;
    return cuheap_buddy_order_at(&a->buddy, ptr);
}

/* The blocks of a thread's batch: freed, not live, of the order they carry. */
static int check_batch(const struct tc_batch *b, char *why, size_t why_size)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < b->nr; i++) {
        const struct tc_block *k = &b->blocks[i];
        int o = idle_block_order(k->arena, tc_ptr(k));
        if (map_lookup(tc_ptr(k)) != k->arena || o != (int)tc_order(k))
            FAIL("block %#lx freed into a thread cache is live or not a block",
                 (unsigned long)tc_ptr(k));
        bytes += 1ull << o;
    }
    if (bytes != b->bytes)
        FAIL("a thread's batch holds %lu bytes, counted %lu", (unsigned long)b->bytes,
             (unsigned long)bytes);
    return 0;
failed:
    return -EFAULT;
}

/* The thread caches' lists (every cache locked by the caller). */
static int check_tcaches_locked(struct cuheap_pool *p, char *why, size_t why_size)
{
    /* each only grows: read in this order, a later one is never below an earlier one */
    uint64_t passed = atomic_load(&p->tl.passed), recorded = atomic_load(&p->tl.recorded),
             started = atomic_load(&p->tl.started);
    if (passed > recorded || recorded > started)
        FAIL("timeline: %lu fences passed, %lu recorded, %lu begun", (unsigned long)passed,
             (unsigned long)recorded, (unsigned long)started);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next) {
        uint64_t ready = 0;
        for (unsigned o = 0; o < TC_NR_ORDERS; o++)
            for (unsigned i = 0; i < tc->nr_ready[o]; i++) {
                const struct tc_block *b = &tc->ready[o][i];
                if (map_lookup(b->ptr) != b->arena || idle_block_order(b->arena, b->ptr) != (int)o)
                    FAIL("thread-cached block %#lx of order %u is live or not a block",
                         (unsigned long)b->ptr, o);
                ready += 1ull << o;
            }
        if (ready != tc->ready_bytes)
            FAIL("thread cache holds %lu ready bytes, counted %lu", (unsigned long)tc->ready_bytes,
                 (unsigned long)ready);
        if (tc->closed_tail - tc->closed_head > TC_NR_CLOSED)
            FAIL("thread cache has %u closed batches", tc->closed_tail - tc->closed_head);
        if (tc_open(tc)->fence || tc_open(tc)->passed)
            FAIL("thread cache's open batch has a fence");
        if (check_batch(tc_open(tc), why, why_size))
            return -EFAULT;
        if (tc->large.ptr &&
            (map_lookup(tc_ptr(&tc->large)) != tc->large.arena ||
             idle_block_order(tc->large.arena, tc_ptr(&tc->large)) != (int)tc_order(&tc->large) ||
             tc->large_ticket > atomic_load(&p->tl.started)))
            FAIL("thread's large block %#lx is live, not a block or has a ticket from the future",
                 (unsigned long)tc_ptr(&tc->large));
        for (unsigned c = tc->closed_head; c != tc->closed_tail; c++)
            if (check_batch(tc_batch_at(tc, c), why, why_size))
                return -EFAULT;
    }
    return 0;
failed:
    return -EFAULT;
}

static int check_locked(struct cuheap_pool *p, char *why, size_t why_size);

uint64_t cuheap_pool_debug_live(struct cuheap_pool *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t live = p->st.live;
    pthread_mutex_unlock(&p->lock);
    return live;
}

bool cuheap_pool_debug_enter(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_enter(tc);
    return tc != NULL;
}

void cuheap_pool_debug_leave(struct cuheap_pool *p)
{
    struct cuheap_tcache *tc = tc_find(p);
    if (tc)
        tc_leave(tc);
}

void cuheap_pool_debug_hold(struct cuheap_pool *p)
{
    pthread_mutex_lock(&p->lock);
    tc_hold_all(p);
}

void cuheap_pool_debug_unhold(struct cuheap_pool *p)
{
    tc_unhold_all(p);
    pthread_mutex_unlock(&p->lock);
}

int cuheap_pool_check(struct cuheap_pool *p, char *why, size_t why_size)
{
    pthread_mutex_lock(&p->lock);
    /* every thread's cache held still: their blocks change size without p->lock */
    tc_hold_all(p);
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
        tc_fold_locked(p, tc);
    int r = check_tcaches_locked(p, why, why_size);
    if (!r)
        r = check_locked(p, why, why_size);
    tc_unhold_all(p);
    pthread_mutex_unlock(&p->lock);
    return r;
}

static int check_locked(struct cuheap_pool *p, char *why, size_t why_size)
{
    uint64_t reserved = 0, live = 0, live_blocks = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        if (cuheap_buddy_check(&a->buddy, why, why_size))
            return -EFAULT;
        if (map_lookup(a->buddy.base) != a)
            FAIL("arena %u missing from the address map", i);
        if (p->vmm && check_granules_locked(p, a, why, why_size))
            goto failed;
        reserved += p->vmm ? (uint64_t)a->nr_mapped << p->granule_shift : a->buddy.size;
        uint64_t arena_allocated = 0;
        for (uint32_t u = 0; u < a->buddy.nr_units;) {
            uintptr_t start;
            unsigned order;
            bool allocated;
            uintptr_t addr = a->buddy.base + ((uintptr_t)u << a->buddy.min_order);
            cuheap_buddy_block_of(&a->buddy, addr, &start, &order, &allocated);
            if (allocated) {
                arena_allocated++;
                uint64_t size = size_at(a, u);
                if (size) {
                    live += size;
                    live_blocks += 1ull << order;
                    if (size > (1ull << order))
                        FAIL("block at %#lx holds %lu bytes in a %llu byte block",
                             (unsigned long)addr, (unsigned long)size, 1ull << order);
                }
            } else if (size_at(a, u)) {
                FAIL("free block at %#lx still has a size", (unsigned long)addr);
            }
            u += 1u << (order - a->buddy.min_order);
        }
        if (arena_allocated != a->nr_live)
            FAIL("arena %u: nr_live %lu, counted %lu", i, (unsigned long)a->nr_live,
                 (unsigned long)arena_allocated);
    }
    unsigned empty = 0;
    for (unsigned i = 0; i < p->nr_arenas; i++)
        empty += p->arenas[i]->nr_live == 0;
    if (empty != p->nr_empty)
        FAIL("nr_empty %u, counted %u", p->nr_empty, empty);
    for (unsigned i = 0; i < p->nr_stuck; i++)
        reserved += p->stuck[i].bytes;
    reserved += p->st.lost;
    if (reserved != p->st.reserved)
        FAIL("reserved %lu, arenas add up to %lu", (unsigned long)p->st.reserved,
             (unsigned long)reserved);
    if (live != p->st.live || live_blocks != p->st.live_blocks)
        FAIL("live %lu/%lu, counted %lu/%lu", (unsigned long)p->st.live,
             (unsigned long)p->st.live_blocks, (unsigned long)live, (unsigned long)live_blocks);
    /* Every pending block is allocated in its buddy and not live. */
    uint64_t pending = 0, pending_mapped = 0;
    struct cuheap_syncing *syncing = p->syncing;
    for (unsigned e = p->ep_head; e != p->ep_tail + 1 || syncing;) {
        struct cuheap_epoch *ep;
        if (e != p->ep_tail + 1) {
            ep = &p->epochs[e++ % CUHEAP_NR_EPOCHS];
        } else {
            ep = &syncing->epoch; /* then those a device sync covers */
            syncing = syncing->next;
        }
        for (uint64_t ptr = ep->head; ptr;) {
            struct cuheap_arena *a = map_lookup(ptr);
            if (!a || size_at(a, unit_of(a, ptr)))
                FAIL("pending block %#lx is live or outside every arena", (unsigned long)ptr);
            uintptr_t start;
            unsigned order;
            bool allocated;
            cuheap_buddy_block_of(&a->buddy, ptr, &start, &order, &allocated);
            if (!allocated || start != ptr)
                FAIL("pending block %#lx is free in its arena", (unsigned long)ptr);
            pending += 1ull << order;
            pending_mapped += extent_at(p, a, ptr);
            ptr = a->link[unit_of(a, ptr)];
        }
    }
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        pending += p->caches[c].bytes;
        for (unsigned o = 0; o < CUHEAP_NR_ORDERS && p->caches[c].stream; o++)
            for (uint64_t ptr = p->caches[c].heads[o]; ptr;) {
                struct cuheap_arena *a = map_lookup(ptr);
                pending_mapped += extent_at(p, a, ptr);
                ptr = a->link[unit_of(a, ptr)];
            }
    }
    if (pending_mapped != p->pending_mapped)
        FAIL("pending_mapped %lu, pending blocks reach %lu", (unsigned long)p->pending_mapped,
             (unsigned long)pending_mapped);
    uint64_t quick = 0, whole = 0;
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
        uint32_t nr = 0;
        for (uint64_t ptr = p->quick[o].head; ptr; nr++) {
            struct cuheap_arena *a = map_lookup(ptr);
            if (!a || size_at(a, unit_of(a, ptr)) ||
                cuheap_buddy_order_at(&a->buddy, ptr) != (int)o)
                FAIL("quick block %#lx of order %u is live or not a block", (unsigned long)ptr, o);
            quick += 1ull << o;
            ptr = a->link[unit_of(a, ptr)];
        }
        if (nr != p->quick[o].nr)
            FAIL("quick list of order %u: nr %u, counted %u", o, p->quick[o].nr, nr);
        if (o > CUHEAP_QUICK_MAX_ORDER)
            whole += nr;
    }
    if (whole != p->nr_whole)
        FAIL("%lu blocks kept whole, counted %u", (unsigned long)whole, p->nr_whole);
    if (quick != p->quick_bytes)
        FAIL("quick_bytes %lu, lists hold %lu", (unsigned long)p->quick_bytes,
             (unsigned long)quick);
    if (pending != p->st.pending)
        FAIL("pending %lu, lists hold %lu", (unsigned long)p->st.pending, (unsigned long)pending);
    uint64_t nr_idle = 0, idle_bytes = 0;
    for (struct cuheap_chunk *c = p->idle.idle_next; p->vmm && c != &p->idle; c = c->idle_next) {
        nr_idle++;
        idle_bytes += chunk_bytes(p, c);
    }
    if (p->vmm && (nr_idle != p->nr_idle || idle_bytes != p->idle_bytes))
        FAIL("idle list holds %lu chunks of %lu bytes, counted %lu of %lu",
             (unsigned long)p->nr_idle, (unsigned long)p->idle_bytes, (unsigned long)nr_idle,
             (unsigned long)idle_bytes);
    return 0;
failed:
    return -EFAULT;
}

/* Empty every thread's cache without giving anything back: the memory is gone (context death,
 * a child after fork). Their counts are folded in first. held: the caller holds every cache
 * (tc_hold_all); else a child after fork, whose other threads are gone from inside them. */
static void tc_forget_all_locked(struct cuheap_pool *p, bool held)
{
    for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next) {
        tc_fold_locked(p, tc);
        memset(tc->nr_ready, 0, sizeof(tc->nr_ready));
        tc->ready_bytes = 0;
        tc->closed_head = tc->closed_tail = 0; /* their fences died with the context */
        tc_open_reset(tc);
        tc->large = (struct tc_block){0, NULL}; /* the timeline's fences died too (tl_forget) */
        tc->next_id = tc->end_id = 0;
        if (!held) /* a thread that was inside is gone with the fork */
            atomic_store(&tc->busy, 0);
    }
    if (!held)
        for (struct cuheap_tcache *tc = p->tcaches; tc; tc = tc->next)
            atomic_store(&tc->held, 0);
}

uint64_t cuheap_pool_abandon(struct cuheap_pool *p)
{
    pthread_mutex_lock(&p->lock);
    /* the caches stay held until the backend has forgotten its fences too: a thread records
     * the timeline's inside its cache without p->lock (tl_wait) */
    tc_hold_all(p);
    tc_forget_all_locked(p, true);
    /* and the timeline, which a trim settles holding neither p->lock nor a cache (a review
     * found a trim letting go of a fence abandon had cleared) */
    tl_enter(&p->tl);
    tl_forget(&p->tl, false);
    uint64_t live = p->st.live;
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        struct cuheap_arena *a = p->arenas[i];
        uint64_t base = a->buddy.base, size = a->buddy.size;
        if (p->vmm) {
            /* the chunks died with the context: one release per chunk */
            for (uint32_t g = 0; g < a->nr_granules; g++)
                if (a->chunks[g].handle) {
                    uint64_t bytes = chunk_bytes(p, &a->chunks[g]);
                    atomic_fetch_sub(p->device_reserved, bytes);
                    p->st.reserved -= bytes;
                    note(p, CUHEAP_EV_ARENA_RELEASE, granule_va(a, g), bytes, p->st.reserved, 0);
                }
        } else {
            atomic_fetch_sub(p->device_reserved, size);
            p->st.reserved -= size;
            note(p, CUHEAP_EV_ARENA_RELEASE, base, size, p->st.reserved, 0);
        }
        map_update(a, false);
        arena_retire(a);
    }
    p->nr_arenas = 0;
    p->nr_empty = 0;
    p->hint = 0;
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    p->nr_idle = p->idle_bytes = 0;
    p->nr_stuck = 0;
    uint64_t keep_hits = p->st.nr_hits, keep_misses = p->st.nr_misses;
    memset(&p->st, 0, sizeof(p->st));
    atomic_store(&p->nr_idle_tl, 0);
    p->st.nr_hits = keep_hits;
    p->st.nr_misses = keep_misses;
    memset(p->epochs, 0, sizeof(p->epochs)); /* their events died with the context */
    p->syncing = NULL; /* a thread syncing for some finds them gone and drops them */
    pthread_cond_broadcast(&p->synced);
    memset(p->caches, 0, sizeof(p->caches));
    memset(p->quick, 0, sizeof(p->quick));
    p->quick_bytes = 0;
    p->nr_whole = 0;
    p->pending_mapped = 0;
    p->ep_head = p->ep_tail = 0;
    if (p->be.forget)
        p->be.forget(p->be.ctx);
    tl_leave(&p->tl);
    tc_unhold_all(p);
    pthread_mutex_unlock(&p->lock);
    return live;
}

void cuheap_pool_forget(struct cuheap_pool *p)
{
    /* The caches of threads that did not cross the fork stay listed, empty: their owners'
     * thread-local pointers are gone with them, the forking thread's are still in use. */
    tc_forget_all_locked(p, false);
    tl_forget(&p->tl, true);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        map_update(p->arenas[i], false);
        arena_retire(p->arenas[i]);
    }
    p->nr_arenas = 0;
    p->nr_empty = 0;
    p->idle.idle_next = p->idle.idle_prev = &p->idle;
    p->nr_idle = p->idle_bytes = 0;
    p->nr_stuck = 0;
    memset(&p->st, 0, sizeof(p->st));
    atomic_store(&p->nr_idle_tl, 0);
    atomic_store(&p->fences_refused, false); /* the child's contexts are its own */
    memset(p->epochs, 0, sizeof(p->epochs));
    p->syncing = NULL; /* on the stack of a thread the fork left behind */
    memset(p->caches, 0, sizeof(p->caches));
    memset(p->quick, 0, sizeof(p->quick));
    p->quick_bytes = 0;
    p->nr_whole = 0;
    p->pending_mapped = 0;
    p->ep_head = p->ep_tail = 0;
    pool_lock_init(p);
    pthread_cond_init(&p->synced, NULL);
}

/* ---- the largest free piece, for an out-of-memory's report (pool.h) ---- */

uint64_t cuheap_pool_largest_free(struct cuheap_pool *p)
{
    uint64_t best = 0;
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < p->nr_arenas; i++) {
        const struct cuheap_arena *a = p->arenas[i];
        uint64_t piece = cuheap_buddy_largest_free(&a->buddy);
        if (a->granules) { /* vmm: the free block's memory is at most the spare granules */
            uint64_t spare = a->nr_mapped > a->nr_used
                                 ? (uint64_t)(a->nr_mapped - a->nr_used) << p->granule_shift
                                 : 0;
            piece = piece < spare ? piece : spare;
        }
        best = piece > best ? piece : best;
    }
    pthread_mutex_unlock(&p->lock);
    return best;
}
