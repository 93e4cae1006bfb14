/* SPDX-License-Identifier: MIT */
/*
 * The pool's private header: its structs, the small helpers every part uses, and the functions
 * the parts call in each other. Only the files of src/pool/ (and the pool's own unit test)
 * include it; everyone else sees pool.h. The thread caches' structs and inline fast path are in
 * tcache.h, built on this one, which the parts that touch a cache include instead.
 *
 * The parts, each one concern (docs/HACKING.md has the map and the call order):
 *   map.c       the global address map: granule -> arena, read without locks
 *   arena.c     arenas: address ranges with a buddy allocator and per-unit records; legacy growth
 *   device.c    every call the pool makes to its backend (the driver), timed, lock rule checked
 *   phys.c      physical memory under vmm arenas: granules and chunks, mapped, moved, released
 *   blocks.c    an arena's blocks, from the buddy or first fit: what is where
 *   place.c     blocks: where one goes (the scored buddy or first fit), quick lists, merging,
 *               metadata purge
 *   fence.c     epochs of freed blocks behind fences, reclaim, the idle check, stream caches
 *   acquire.c   where a vmm block gets its memory: mapped, moved, new, or waited for
 *   tcache.c    per-thread caches of small blocks (tcache.h: their structs and fast path)
 *   timeline.c  the shared fences of threads that keep a large block of their own
 *   check.c     the invariant checker (tests, debug builds)
 *   pool.c      the public entry points for set-up, allocation and free (pool.h)
 *   life.c      the rest of a pool's life: trim, reserve, captures, stats, a context's end
 *
 * The lock rule, for every part: p->lock guards struct cuheap_pool, its arenas, chunks and
 * epochs. Lock order: p->lock, then a thread cache (tc_hold_all); g_map_lock (map.c) is taken
 * inside either. The pool's parts call each other by short names: they are private to the pool
 * (hidden, declared only here). A name ending in _locked is entered and left with p->lock held;
 * one that drops it meanwhile says so in its comment. _unlocked: entered without p->lock.
 * _inside: the caller holds the timeline's flag (tl->busy, timeline.c), not p->lock.
 *
 * Words for the way back, from a block's free to the driver, each meaning one thing:
 *   free      what the program does (cuheap_pool_free): the block is no longer live, not yet
 *             reusable (dev_mem_free, dev_va_free and free_arenas_unlocked keep the driver's
 *             own verb for its call)
 *   pend      a freed block waits behind a fence: in the open epoch, a stream cache or a
 *             thread's batch
 *   reclaim   an epoch's fence has passed: its blocks are returned (reclaim_locked); reap is
 *             a thread cache's own: its oldest batch's blocks ready again (tc_reap_locked)
 *   return    a block that needs no fence any more is reusable again: onto its order's quick
 *             list, or merged (return_block_locked, return_epoch_locked)
 *   merge     a block goes into its arena's buddy allocator, joined with its free buddy
 *             (merge_block_locked); flush merges or moves a holding list's blocks all at once
 *   give      a thread cache hands blocks to the pool, behind a fence or returned
 *             (tc_give_freed_locked); drain: a cache emptied so
 *   forget    blocks dropped with nothing given back: their memory went with a context or a fork
 *   unlink    an arena or idle chunk taken out of the pool's structures under p->lock, for
 *             the caller to release or move with the lock dropped (unlink_arena_locked,
 *             unlink_spare_locked, unlink_idle_locked)
 *   release   memory goes back to the driver: a chunk unmapped and released, a legacy arena
 *             freed (release_*_locked; "give back" in comments means the same); trim releases
 *             what the pool holds for nobody (cuheap_pool_trim)
 *   purge     metadata pages under large free blocks handed back to the kernel (madvise)
 */
#ifndef CUHEAP_POOL_INTERNAL_H
#define CUHEAP_POOL_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../pool.h"
#include "buddy.h"
#include "event.h"
#include "fit.h"
#include "log.h"

#pragma GCC visibility push(hidden)

#define CUHEAP_NR_MAX_ARENAS    4096
#define CUHEAP_NR_EPOCHS        64
#define CUHEAP_NR_STREAM_CACHES 16
#define CUHEAP_NR_STUCK         64
#define CUHEAP_NR_SHARE_MAX     64 /* pieces one share exports at most */

/* Physical memory mapped as one piece at granules [first, first + nr) of its arena: one
 * cuMemCreate, one cuMemMap and one cuMemSetAccess whatever its size. Those cost the same for
 * 2 MiB as for 256 MiB (bench/probe-vmm.c), so a 64 MiB block gets one chunk, not 32
 * granules. A chunk is idle while no block uses any of its granules; an idle
 * chunk stays mapped, so a block handed out at its address again needs no driver call.
 * cuMemMap cannot map part of a handle (offsets are not supported), so a chunk is mapped,
 * moved and released whole. */
struct cuheap_chunk {
    uint64_t handle; /* 0 = this slot holds no chunk */
    uint32_t first, nr;
    uint32_t nr_busy; /* of its granules, those some block uses */
    struct cuheap_arena *arena;
    struct cuheap_chunk *idle_prev, *idle_next; /* on pool->idle while mapped and unused */
};

/* One granule of a vmm arena's address range (2 MiB on current GPUs). */
struct cuheap_granule {
    struct cuheap_chunk *chunk; /* the physical memory mapped here, NULL = none */
    uint32_t nr_users;          /* live or pending blocks whose used bytes reach into it */
};

/* A vmm arena's address range: 4 GiB, or the next power of two above a larger request. */
#define CUHEAP_VMM_ARENA (1ull << 32)

struct cuheap_arena {
    /* what thread caches read without locks, apart from what the pool's lock guards: the
     * range (base, size, unit), and its blocks unless the arena places by first fit */
    struct cuheap_buddy buddy;
    struct cuheap_pool *pool;
    uint64_t *block_size; /* per unit: bytes the program asked for at a block start; 0 = not live */
    uint64_t *buffer_id;  /* per unit: id answered for CU_POINTER_ATTRIBUTE_BUFFER_ID */
    uint64_t *link;       /* per unit: next block on a pending or stream-cache list */
    uint64_t *extent;     /* per unit (vmm): bytes from a block start whose granules it holds */
    size_t meta_bytes;
    struct cuheap_granule *granules; /* vmm: one per granule of the range */
    struct cuheap_chunk *chunks;     /* vmm: per granule, the chunk that starts there */
    uint64_t *mapped_bits;           /* vmm: one bit per granule with memory mapped */
    uint64_t *mapped_words;          /* vmm: one bit per word of mapped_bits with a bit set */
    uint32_t nr_granules;
    /* CUHEAP_VMM_PLACEMENT=first-fit: the blocks (size 0 otherwise: the buddy has them) */
    struct cuheap_fit fit;
    _Alignas(64) uint64_t nr_live; /* allocated blocks, pending ones included */
    uint32_t nr_mapped;            /* granules with physical memory mapped */
    uint32_t nr_used;              /* granules some live or pending block uses */
};

/* A batch of freed blocks waiting behind one fence. */
struct cuheap_epoch {
    void *fence;   /* from backend->fence_record; NULL while the epoch is open */
    uint64_t head; /* first block (address), 0 = none */
    uint64_t nr_blocks;
    uint64_t bytes;
};

/* An epoch whose blocks wait for a device sync with the pool's lock dropped, because no fence
 * could be recorded for them: on the syncing thread's stack, listed for the checks. */
struct cuheap_syncing {
    struct cuheap_epoch epoch;
    struct cuheap_syncing *next;
};

/* Reusable blocks kept whole, per order, so steady alloc/free churn does not split and merge
 * an arena from top to bottom every time (the kernel's per-cpu page lists play this part).
 * They are merged back into their arenas on a miss, on trim and before out-of-memory. */
struct cuheap_quick {
    uint64_t head; /* first block (address), list through arena->link; 0 = empty */
    uint32_t nr;   /* blocks on the list */
};

/* Blocks freed on a known stream (pluggable allocator), reusable on that stream at once. */
struct cuheap_stream_cache {
    uint64_t stream;                  /* 0 = slot unused */
    uint64_t heads[CUHEAP_NR_ORDERS]; /* per order, list through arena->link */
    uint64_t bytes;
};

#define CUHEAP_NR_TIMELINE 16

/* Fences shared by the threads that keep a large block of their own (pool.c, "large blocks off
 * the pool's lock"), numbered in the order they are recorded: fence n is
 * ring[n % CUHEAP_NR_TIMELINE] until it has passed. */
struct cuheap_timeline {
    _Alignas(64) _Atomic bool busy; /* a thread records a fence or asks the driver about them */
    _Atomic uint64_t started;       /* fences whose recording has begun */
    _Atomic uint64_t recorded;      /* ... and ended */
    void *ring[CUHEAP_NR_TIMELINE];
    _Alignas(64) _Atomic uint64_t passed; /* every fence up to this one has passed */
};

struct cuheap_pool {
    /* Read by every allocation and free of the thread caches, written only at setup (and
     * nr_capturing when a capture begins or ends, and vmm once more if the driver refuses the
     * backing, under p->lock with every cache held): on cache lines of their own, away from the
     * lock and the counters the slow paths write. */
    const struct cuheap_config *cfg;
    uint64_t tc_bytes;     /* CUHEAP_THREAD_CACHE; 0 = no thread caches */
    unsigned tc_max_order; /* largest block order a thread cache keeps */
    unsigned min_order;    /* log2 of CUHEAP_MIN_BLOCK */
    bool vmm;              /* CUHEAP_BACKING=vmm and the device has it (till it refuses it) */
    bool first_fit;        /* vmm arenas place by first fit (CUHEAP_VMM_PLACEMENT) */
    unsigned granule_shift;
    int device;
    unsigned nr_capturing; /* streams capturing: no fences recorded meanwhile */
    uint64_t gen;          /* which setup of this pool: thread caches of an earlier one are not
                              this pool's */
    void *owner;           /* cuheap_pool_owner(), read by every free (cuheap_pool_free_any) */
    _Alignas(64) _Atomic uint64_t next_buffer_id; /* taken 256 at a time by thread caches */
    _Alignas(64) pthread_mutex_t lock;
    struct cuheap_backend be;
    uint64_t limit;                    /* bytes, 0 = none; covers arenas and pass-through */
    _Atomic uint64_t *device_reserved; /* bytes this process holds on the device via cuheap */
    cuheap_pool_note_fn note;
    struct cuheap_arena *arenas[CUHEAP_NR_MAX_ARENAS];
    unsigned nr_arenas;
    unsigned nr_empty; /* arenas with no allocated block (quick-list blocks count as allocated) */
    unsigned hint;     /* arena that served the last allocation */
    struct cuheap_epoch
        epochs[CUHEAP_NR_EPOCHS]; /* ring: [ep_head, ep_tail) closed, ep_tail open */
    unsigned ep_head, ep_tail;
    struct cuheap_syncing *syncing; /* epochs out of the ring while a device sync covers them */
    uint64_t nr_synced;             /* of those, returned (or forgotten with the context) */
    pthread_cond_t synced;          /* broadcast when one is */
    unsigned nr_since_poll;
    uint64_t nr_merged; /* blocks merged into the buddy allocators since the last purge */
    struct cuheap_stream_cache caches[CUHEAP_NR_STREAM_CACHES];
    struct cuheap_quick quick[CUHEAP_NR_ORDERS];
    uint64_t quick_bytes;     /* bytes held on the quick lists */
    uint32_t nr_whole;        /* vmm: blocks above CUHEAP_QUICK_MAX_ORDER kept whole on them */
    uint32_t chunk_max;       /* granules per chunk at most (CUHEAP_VMM_CHUNK) */
    struct cuheap_chunk idle; /* list head: mapped chunks no block uses, oldest first */
    uint64_t nr_idle, idle_bytes;
    struct {
        uint64_t handle, bytes;
    } stuck[CUHEAP_NR_STUCK]; /* vmm: unmapped memory the driver would not take back yet */
    unsigned nr_stuck;
    /* vmm: the most bytes busy chunks have held at once for live blocks: what the job has shown
     * it needs. Granules that blocks waiting for a fence still hold do not count: they are
     * the GPU's lag, not the job's need, and a budget that counted them rose with every late
     * fence, and the memory held with it. */
    uint64_t peak_busy;
    uint64_t pending_mapped; /* vmm: bytes the extents of pending blocks reach */
    int vmm_refused;         /* 0, CUHEAP_VMM_TO_DRIVER (no more mapping calls) or _ABSENT */
    bool to_driver;          /* every request goes to the driver (vmm_refused_locked) */
    /* vmm: the device was full for a request the pool could not place, with nothing to wait
     * for: requests go to the driver at their size (device_full_locked, acquire.c, says which)
     * until busy chunks hold full_until bytes or fewer; read without p->lock by
     * pool_alloc_slow, so written atomically */
    bool device_full;
    uint64_t full_until;
    /* one thread at a time makes mapping calls (vmm: phys.c, the mapper) or takes an arena
     * (legacy: arena.c), with p->lock dropped */
    bool mapping;            /* a thread is the mapper */
    pthread_cond_t mapped;   /* broadcast when it is done */
    uint64_t inflight_bytes; /* counted in st.reserved, in no chunk: being created or taken
                                apart by the mapper */
    /* the block the mapper is mapping granules for (use_granules_locked), p->lock dropped: the
     * mapped granules of its range past its extent are held by it already (pool_check) */
    struct cuheap_arena *granting;
    uint64_t granting_ptr, granting_size;
    uint64_t granting_held; /* bytes of the mapped granules it holds meanwhile */
    /* the mapper's last answer from the driver on the device's free memory, and what this
     * process held through cuheap then (phys.c, leaves_room): written by the mapper alone */
    uint64_t free_seen, reserved_seen;
    unsigned nr_unasked;           /* chunks made since, without asking */
    uint64_t nr_resets;            /* contexts abandoned: a mapper that finds it changed publishes
                                      nothing */
    _Atomic bool fences_refused;   /* a fence query was refused outside any capture (fence_passed):
                                      no fence is recorded any more, freed blocks wait for a
                                      device sync */
    struct cuheap_tcache *tcaches; /* every thread's cache of this pool */
    uint32_t nr_tcaches;           /* on that list */
    struct cuheap_timeline tl;     /* fences of the threads' large blocks */
    /* CUHEAP_IDLE_CHECK: checks to skip after the streams were found busy (idle_now), and the
     * checks that found them idle on the timeline's side, folded into st.nr_idle when read */
    _Atomic unsigned idle_skip;
    _Atomic uint64_t nr_idle_tl;
    /* live blocks whose free a signal handler took over (cuheap_pool_claim_free), their size
     * cleared until the thread finishes the free: bytes and block bytes, for pool_check */
    _Atomic uint64_t claimed, claimed_blocks;
    struct cuheap_pool_stats st; /* thread caches' shares folded in by cuheap_pool_get_stats() */
};

/* ---- global address map: 2 MiB granule -> arena, read without locks ---- */

#define GRANULE_SHIFT 21
#define NR_MAP_SLOTS  (1u << 18) /* 512 GiB of arenas at 2 MiB granules, half full */
#define MAP_EMPTY     0
#define MAP_TOMB      UINT64_MAX

struct map_slot {
    _Atomic uint64_t key; /* granule + 1, MAP_EMPTY or MAP_TOMB */
    _Atomic(struct cuheap_arena *) arena;
};

/* map.c: the table and the arena this thread looked up last (a thread frees near where it
 * allocated; a released arena's size is 0, so it never answers again) */
extern struct map_slot *g_map;
extern __thread struct cuheap_arena *map_last __attribute__((tls_model("initial-exec")));

static inline uint32_t map_hash(uint64_t key)
{
    key *= 0x9e3779b97f4a7c15ull;
    return (uint32_t)(key >> 40) & (NR_MAP_SLOTS - 1);
}

/* An arena's size as a lock-free reader sees it: 0 once retired (under p->lock, while a
 * thread cache's free may be looking; TSan saw the plain read race with the retire). */
static inline uint64_t arena_size_seen(const struct cuheap_arena *a)
{
    return __atomic_load_n(&a->buddy.size, __ATOMIC_ACQUIRE);
}

static inline struct cuheap_arena *map_lookup(uint64_t addr)
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

/* ---- arenas ---- */

static inline uint32_t unit_of(const struct cuheap_arena *a, uint64_t addr)
{
    return (uint32_t)((addr - a->buddy.base) >> a->buddy.min_order);
}

static inline uint64_t pow2_ceil(uint64_t v)
{
    return v <= 1 ? 1 : 1ull << (64 - __builtin_clzll(v - 1));
}

static inline uint64_t granule_bytes(const struct cuheap_pool *p)
{
    return 1ull << p->granule_shift;
}

static inline uint64_t granule_va(const struct cuheap_arena *a, uint32_t g)
{
    return a->buddy.base + ((uint64_t)g << a->pool->granule_shift);
}

static inline uint64_t chunk_va(const struct cuheap_chunk *c)
{
    return granule_va(c->arena, c->first);
}

static inline uint64_t chunk_bytes(const struct cuheap_pool *p, const struct cuheap_chunk *c)
{
    return (uint64_t)c->nr << p->granule_shift;
}

/* Bytes from the block at ptr whose granules it holds (0 under legacy). */
static inline uint64_t extent_at(const struct cuheap_pool *p, const struct cuheap_arena *a,
                                 uint64_t ptr)
{
    return p->vmm ? a->extent[unit_of(a, ptr)] : 0;
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

static inline uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- blocks ---- */

#define CUHEAP_FENCE_POLL_NS 50000 /* how long a slow path polls a fence before more memory */
#define CUHEAP_PURGE_EVERY   16384 /* merges between purges of free metadata (place.c) */
#define CUHEAP_QUICK_MAX     64    /* blocks per order (legacy; vmm keeps one, place.c) */
#define CUHEAP_NR_SPARE_MAX  16    /* arenas given back by one free under CUHEAP_RELEASE=empty */
#define CUHEAP_QUICK_MAX_ORDER                                                                     \
    20 /* largest order kept whole (1 MiB): splitting bigger                                       \
          blocks is a few levels, not worth the hoarding */

static inline unsigned order_of_size(const struct cuheap_pool *p, uint64_t size)
{
    if (size <= (1ull << p->min_order))
        return p->min_order;
    return 64u - (unsigned)__builtin_clzll(size - 1);
}

/* The bytes of the block a request of size bytes gets, and the only bytes it may get (a
 * block's bytes are worked out from the size asked for wherever the lock is not held: a thread
 * cache's free, a signal handler's claim): a power of two, or under first fit for a request
 * above the thread caches' orders, the size rounded up to a unit. */
static inline uint64_t block_of_size(const struct cuheap_pool *p, uint64_t size)
{
    unsigned order = order_of_size(p, size);
    if (!p->first_fit || order <= p->tc_max_order)
        return 1ull << order;
    uint64_t unit = 1ull << p->min_order;
    return (size + unit - 1) & ~(unit - 1);
}

/* Whether the requests of size bytes get a block of a whole power of two, so that blocks kept
 * by order (quick lists, stream caches, a thread's large block) may serve them. */
static inline bool pow2_block(const struct cuheap_pool *p, uint64_t size)
{
    return block_of_size(p, size) == 1ull << order_of_size(p, size);
}

static inline bool arena_first_fit(const struct cuheap_arena *a)
{
    return a->fit.size != 0;
}

/* ---- placement (vmm) ---- */

/* vmm: the granules a block would keep busy and never use, its last granule and its buddy
 * block's given: those of the chunk under the last one that lie past it inside the buddy
 * block, where no other block can go while it lives (a 5 MiB block on a chunk mapped for an
 * 8 MiB one holds 8 MiB). A chunk is mapped and released whole, so only placement can avoid
 * them: blocks of random sizes on streams of their own held more there than in any other part
 * of the pool (bench/RESULTS.md). Tight layout only, where chunks fit the blocks they
 * were made for: under aligned a block under a piece maps the whole piece wherever it goes. */
static inline uint32_t wasted_granules(const struct cuheap_pool *p, const struct cuheap_arena *a,
                                       uint32_t last, uint32_t block_last)
{
    const struct cuheap_chunk *c = last < block_last ? a->granules[last].chunk : NULL;
    if (!c || c->first + c->nr - 1 <= last || p->cfg->vmm_layout != CUHEAP_VMM_TIGHT)
        return 0;
    return (c->first + c->nr - 1 < block_last ? c->first + c->nr - 1 : block_last) - last;
}

/* Whether the block at ptr (block bytes) can hold size bytes with no mapping call and no
 * granule kept busy for nothing: every granule under them mapped, none wasted
 * (wasted_granules). */
static inline bool block_fits_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                                     uint64_t size, uint64_t block)
{
    uint64_t off = ptr - a->buddy.base;
    uint32_t last = (uint32_t)((off + size - 1) >> p->granule_shift);
    for (uint32_t g = (uint32_t)(off >> p->granule_shift); g <= last; g++)
        if (!a->granules[g].chunk)
            return false;
    return !wasted_granules(p, a, last, (uint32_t)((off + block - 1) >> p->granule_shift));
}

/* ---- fences ---- */

static inline struct cuheap_epoch *open_epoch(struct cuheap_pool *p)
{
    return &p->epochs[p->ep_tail % CUHEAP_NR_EPOCHS];
}

/* Whether fences may still be recorded: not once the driver refused to answer for them
 * (fence_passed). */
static inline bool fences_usable(struct cuheap_pool *p)
{
    return !atomic_load_explicit(&p->fences_refused, memory_order_relaxed);
}

/* ---- physical memory: where a block gets it (vmm) ---- */

struct acquire {
    bool fenced;         /* the open epoch was closed for this allocation already */
    bool fenced_all;     /* ... with every thread's cache drained behind it (fenced too) */
    bool only_needed;    /* aligned layout: a whole piece did not fit under the limit or on the
                            device, so map only the granules the block needs */
    bool waited_in_vain; /* a wait for the oldest fence gave nothing back: do not wait again */
};

/* ---- thread caches ---- */

/* Per-unit sizes and ids are written by thread caches without p->lock: relaxed atomics, so a
 * query racing with an allocation reads one value or the other, never a torn one. */
static inline uint64_t size_at(const struct cuheap_arena *a, uint32_t u)
{
    return __atomic_load_n(&a->block_size[u], __ATOMIC_RELAXED);
}

/* Buffer ids: the top bit, the device, then a count per pool. */
static inline uint64_t buffer_id_prefix(const struct cuheap_pool *p)
{
    return (1ull << 63) | ((uint64_t)(p->device & 0x7fff) << 48);
}

/* The first of n fresh buffer-id counts (thread caches take them without p->lock). */
static inline uint64_t next_buffer_ids(struct cuheap_pool *p, uint64_t n)
{
    return atomic_fetch_add_explicit(&p->next_buffer_id, n, memory_order_relaxed);
}

/* The memory the pool's blocks use: busy chunks, less the granules under blocks that wait for
 * a fence (pending_mapped), which come back when it passes. */
static inline uint64_t busy_bytes_locked(const struct cuheap_pool *p)
{
    uint64_t held = p->st.reserved - p->idle_bytes; /* busy chunks, pending blocks' included */
    return held > p->pending_mapped ? held - p->pending_mapped : 0;
}

/* vmm: what the pool keeps from the device for no allocation and cannot give back, now or
 * after a wait: its busy chunks' bytes beyond the live bytes (granules partly used, holes
 * between blocks). Idle chunks go back at once (release_idle_locked) and the granules of blocks
 * waiting for a fence once it passes, so neither counts; nor what the block being mapped for
 * holds already (p->granting), which is about to be live. */
static inline uint64_t held_unused_locked(const struct cuheap_pool *p)
{
    uint64_t busy = busy_bytes_locked(p), used = p->st.live;
    if (p->granting)
        used += p->granting_held;
    return busy > used ? busy - used : 0;
}

/* Pool locks the calling thread holds (device.c): the backend's calls that may take long are
 * made with none (device.c checks it in debug builds, and the pool's unit test in every
 * build), and cuheap_pool_lock_held() answers for other layers. */
extern __thread unsigned pool_locks_held __attribute__((tls_model("initial-exec")));

static inline void pool_lock(struct cuheap_pool *p)
{
    pthread_mutex_lock(&p->lock);
    pool_locks_held++;
}

static inline bool pool_trylock(struct cuheap_pool *p)
{
    if (pthread_mutex_trylock(&p->lock))
        return false;
    pool_locks_held++;
    return true;
}

static inline void pool_unlock(struct cuheap_pool *p)
{
    pool_locks_held--;
    pthread_mutex_unlock(&p->lock);
}

/* Wait on one of the pool's conditions, p->lock dropped meanwhile as any wait must. */
static inline void pool_wait(pthread_cond_t *cond, struct cuheap_pool *p)
{
    pool_locks_held--;
    pthread_cond_wait(cond, &p->lock);
    pool_locks_held++;
}

/* Something for the trace (the runtime's note callback): growth, release, fences, OOM. */
static inline void pool_note_event(struct cuheap_pool *p, int type, uint64_t ptr, uint64_t size,
                                   uint64_t aux, uint64_t aux2)
{
    if (p->note) {
        struct cuheap_pool_note n = {type, ptr, size, aux, aux2, p->owner};
        p->note(p, &n);
    }
}

/* The first block of a quick list, off it. */
static inline uint64_t quick_pop_locked(struct cuheap_pool *p, unsigned order,
                                        struct cuheap_arena **ret)
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

/* map.c */
void map_atfork_child(void);
int map_update(struct cuheap_arena *a, bool add);

/* arena.c */
struct cuheap_arena *arena_new(struct cuheap_pool *p, uint64_t base, uint64_t size, bool vmm);
void arena_retire(struct cuheap_arena *a);
int grow_legacy_locked(struct cuheap_pool *p, uint64_t need, bool exact);
uint64_t unlink_arena_locked(struct cuheap_pool *p, unsigned idx, uint64_t *ret_size);
void free_arenas_unlocked(struct cuheap_pool *p, const uint64_t *bases, const uint64_t *sizes,
                          unsigned nr);
unsigned release_empty_locked(struct cuheap_pool *p);
unsigned unlink_spare_locked(struct cuheap_pool *p, uint64_t *bases, uint64_t *sizes);

/* device.c */
int dev_mem_alloc(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr);
int dev_mem_free(struct cuheap_pool *p, uint64_t ptr);
int dev_va_reserve(struct cuheap_pool *p, uint64_t size, uint64_t *ret_va);
void dev_va_free(struct cuheap_pool *p, uint64_t va, uint64_t size);
bool dev_mem_free_bytes(struct cuheap_pool *p, uint64_t *ret_free);
int dev_phys_create(struct cuheap_pool *p, uint64_t bytes, uint64_t *ret_handle, uint64_t *ns);
int dev_phys_release(struct cuheap_pool *p, uint64_t handle, uint64_t *ns);
int dev_phys_map(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle, uint64_t *ns);
int dev_phys_unmap(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t *ns);
bool dev_has_access(const struct cuheap_pool *p);
int dev_phys_access(struct cuheap_pool *p, uint64_t va, uint64_t bytes);
bool dev_has_export(const struct cuheap_pool *p);
int dev_phys_export(struct cuheap_pool *p, uint64_t handle, int *ret_fd);
int dev_fence_wait(struct cuheap_pool *p, void *fence);
int dev_device_sync(struct cuheap_pool *p);
int dev_fence_record(struct cuheap_pool *p, void **ret_fence);
int dev_fence_query(struct cuheap_pool *p, void *fence);
void dev_fence_destroy(struct cuheap_pool *p, void *fence);
void dev_fence_pin(struct cuheap_pool *p, void *fence);
void dev_fence_unpin(struct cuheap_pool *p, void *fence);
bool dev_has_idle_check(const struct cuheap_pool *p);
int dev_streams_idle(struct cuheap_pool *p);
void dev_forget(struct cuheap_pool *p);

/* phys.c */
uint64_t next_mapped_granule(const struct cuheap_arena *a, uint64_t g);
void granule_span(const struct cuheap_pool *p, const struct cuheap_arena *a, uint64_t ptr,
                  uint64_t bytes, uint32_t *ret_first, uint32_t *ret_last);
void hold_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr);
void drop_granule_locked(struct cuheap_pool *p, struct cuheap_granule *gr);
void unuse_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr);
int hold_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size);
void set_extent_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size);
uint64_t release_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c);
void account_release_locked(struct cuheap_pool *p, bool ok, uint64_t handle, uint64_t bytes);
/* Map physical memory at va (with access), once more when the driver failed: p->lock not held.
 * Returns 0, CUHEAP_BE_OOM or -EIO. */
int map_twice(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle, uint64_t *ns);
uint64_t release_idle_locked(struct cuheap_pool *p, uint64_t keep);
void wait_mapper_locked(struct cuheap_pool *p);
int share_locked(struct cuheap_pool *p, uint64_t block, uint64_t buffer_id,
                 struct cuheap_share *pieces, unsigned max);
int grant_access_locked(struct cuheap_pool *p);
int grow_va_locked(struct cuheap_pool *p, uint64_t need);
/* More for the pool (pool.c): address space under vmm, an arena under legacy; drops p->lock
 * around the driver call. Returns 0, CUHEAP_BE_OOM, -EDQUOT or -EIO. */
int grow_locked(struct cuheap_pool *p, uint64_t need, bool exact);
/* The pool's lock made anew (pool.c): at set-up and in a forked child. */
void pool_lock_init(struct cuheap_pool *p);
int new_chunk_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint32_t first, uint32_t nr);
struct cuheap_chunk *idle_of_size_locked(struct cuheap_pool *p, uint32_t nr);
int move_chunk_locked(struct cuheap_pool *p, struct cuheap_chunk *c, struct cuheap_arena *a,
                      uint32_t first);

/* place.c */
bool room_for_locked(const struct cuheap_pool *p, uint64_t size);

/* blocks.c */
int64_t block_bytes_at(const struct cuheap_arena *a, uint64_t ptr);
int block_holding(const struct cuheap_arena *a, uint64_t addr, uint64_t *ret_start,
                  uint64_t *ret_bytes, bool *ret_allocated);
int piece_at(const struct cuheap_arena *a, uint64_t addr, uint64_t *ret_bytes, bool *ret_allocated);
uint64_t largest_free_of(const struct cuheap_arena *a);
int take_block_locked(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr, uint64_t *ret_block,
                      struct cuheap_arena **ret_arena);
void mark_live_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                      uint64_t block);
void merge_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr);
void purge_meta_locked(struct cuheap_pool *p);
void return_block_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr);
unsigned flush_quick_locked(struct cuheap_pool *p);
bool block_mapped_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                         uint64_t size);

/* fence.c */
int fence_passed(struct cuheap_pool *p, void *fence);
unsigned reclaim_locked(struct cuheap_pool *p);
bool wait_oldest_locked(struct cuheap_pool *p);
bool poll_oldest_locked(struct cuheap_pool *p);
bool idle_now(struct cuheap_pool *p);
bool return_if_idle_locked(struct cuheap_pool *p);
bool close_epoch_locked(struct cuheap_pool *p);
void wait_syncing_locked(struct cuheap_pool *p);
void flush_stream_caches_locked(struct cuheap_pool *p);
struct cuheap_stream_cache *stream_cache_locked(struct cuheap_pool *p, uint64_t stream,
                                                bool create);
bool pend_nowait_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr,
                        uint64_t block);
void pend_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t block);
void close_if_due_locked(struct cuheap_pool *p);

/* acquire.c */
void vmm_refused_locked(struct cuheap_pool *p);
void device_full_begin_locked(struct cuheap_pool *p);
bool device_full_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                        uint64_t free_b);
int use_granules_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t size,
                        struct acquire *acq);
int reserve_granules_locked(struct cuheap_pool *p, uint64_t bytes);

/* tcache.c */
void tc_setup_once(void);
void tc_atfork_child(void);
void tc_hold_all(struct cuheap_pool *p);
void tc_unhold_all(struct cuheap_pool *p);
void tc_fold_locked(struct cuheap_pool *p, struct cuheap_tcache *tc);
unsigned tc_drain_all_locked(struct cuheap_pool *p, bool freed_only);
void tc_drain_mine_locked(struct cuheap_pool *p);
struct cuheap_tcache *tc_get_locked(struct cuheap_pool *p);
uint64_t tc_share_locked(const struct cuheap_pool *p);
bool tc_reap_locked(struct cuheap_pool *p, struct cuheap_tcache *tc);
__attribute__((noinline)) bool tc_reap_unlocked(struct cuheap_pool *p, struct cuheap_tcache *tc);
__attribute__((noinline)) void tc_close(struct cuheap_pool *p, struct cuheap_tcache *tc);
bool tc_take_ready(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t size,
                   uint64_t *ret_ptr, struct cuheap_arena **ret_arena);
void pool_lock_noting(struct cuheap_pool *p, struct cuheap_tcache *tc);
void tc_after_alloc_locked(struct cuheap_pool *p, uint64_t size);
void tc_large_unfit_locked(struct cuheap_pool *p, struct cuheap_tcache *tc, uint64_t size,
                           unsigned order, bool streamed);
void tc_forget_all_locked(struct cuheap_pool *p, bool held);

/* timeline.c */
void tl_enter(struct cuheap_timeline *tl);
void tl_leave(struct cuheap_timeline *tl);
void tl_settle(struct cuheap_pool *p);
void tl_forget(struct cuheap_timeline *tl, bool fork_child);
__attribute__((noinline)) int tc_large_free(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                            struct cuheap_arena *a, uint64_t ptr,
                                            uint64_t *ret_size, uint64_t *ret_block,
                                            uint64_t *ret_seq);
__attribute__((noinline)) int tc_large_alloc(struct cuheap_pool *p, struct cuheap_tcache *tc,
                                             uint64_t size, unsigned order, uint64_t *ret_ptr,
                                             uint64_t *ret_block, uint64_t *ret_seq);

/* check.c */
void debug_check(struct cuheap_pool *p);

#pragma GCC visibility pop

#endif
