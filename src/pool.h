/* SPDX-License-Identifier: MIT */
/*
 * The per-device pool: arenas taken from the device through a backend (backend.h), a buddy
 * allocator inside each, and the rules that keep reuse safe: a freed block is not handed out
 * again while work submitted before its free may still touch it (CUHEAP_REUSE).
 *
 * The pool knows nothing of CUDA: the hook layer gives it a backend over the real driver,
 * unit tests give it one over host memory.
 *
 * Two backings (CUHEAP_BACKING). legacy: each arena is device memory from cuMemAlloc, so a
 * block's rounding up to a power of two costs device memory. vmm: each arena is address space
 * only (cuMemAddressReserve, 4 GiB and up), and physical memory comes in granules (2 MiB on
 * current GPUs) mapped under the bytes that live and pending blocks use: a 20 MiB request in
 * a 32 MiB block holds 20 MiB. The granules a block needs are mapped in chunks, one per run of
 * unmapped granules (struct cuheap_chunk). A chunk no block uses stays mapped (idle), so a
 * block reused at the same address needs no driver call; when a block needs memory, an idle
 * chunk of the same size moves to it, else idle chunks go back to the driver to make room
 * for a new one, so the pool holds about what is used. Blocks that wait for a fence are
 * waited for before the pool grows. A granule under a pending block (freed, fence not passed)
 * is in use: it never moves while work queued before the free may touch it.
 *
 * Locking: one mutex per pool (p->lock) guards everything in struct cuheap_pool and its
 * arenas. Driver calls that may block for long (arena allocation and release, device syncs,
 * fence waits and polls) are made with the lock dropped: other threads allocate and free
 * meanwhile, and the slow path looks at the pool afresh afterwards. The VMM calls of the vmm
 * slow path (create, map, unmap, release: tens of microseconds each) are made with it held. The
 * address map (arena lookup by pointer) is global and read without locks.
 *
 * Thread caches (CUHEAP_THREAD_CACHE): each thread keeps, per pool, a few ready blocks per order
 * (fence passed, granules held) and the blocks it freed since it last handed them to the pool's
 * open epoch. A thread allocates from and frees into its own cache, which no other thread
 * touches but the rare drainer (trim, out of memory, stats, checks, context death) holding
 * p->lock, so the common pair touches no shared cache line and takes no atomic exchange
 * (pool.c, tc_enter). Order: p->lock before a cache; a thread never takes p->lock inside
 * its own cache.
 */
#ifndef CUHEAP_POOL_H
#define CUHEAP_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "buddy.h"
#include "config.h"

#define CUHEAP_NR_MAX_ARENAS    4096
#define CUHEAP_NR_EPOCHS        64
#define CUHEAP_NR_STREAM_CACHES 16
#define CUHEAP_NR_STUCK         64

struct cuheap_pool;
struct cuheap_arena;
struct cuheap_tcache;

/* Physical memory mapped as one piece at granules [first, first + nr) of its arena: one
 * cuMemCreate, one cuMemMap and one cuMemSetAccess whatever its size. On an H200 those cost
 * about 40 us for 2 MiB and for 256 MiB alike (bench/probe-vmm.c), so a 64 MiB block gets one
 * chunk, not 32 granules. A chunk is idle while no block uses any of its granules; an idle
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
    /* what thread caches read without locks, apart from what the pool's lock guards */
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

struct cuheap_pool_stats {
    uint64_t reserved;    /* bytes in arenas */
    uint64_t live;        /* bytes requested by live pooled allocations */
    uint64_t live_blocks; /* bytes of live pooled blocks (rounded) */
    uint64_t pending;     /* bytes freed but waiting for a fence */
    uint64_t nr_hits;
    uint64_t nr_misses;
    uint64_t nr_arenas;
    uint64_t nr_fences;   /* fences recorded */
    uint64_t nr_idle;     /* freed blocks given back with no fence: every stream was found
                             idle (CUHEAP_IDLE_CHECK) */
    uint64_t nr_waits;    /* times an allocation waited for a fence */
    uint64_t nr_moves;    /* vmm: idle chunks moved whole to where a block needed them */
    uint64_t nr_creates;  /* vmm: chunks taken from the driver */
    uint64_t nr_releases; /* vmm: idle chunks given back to make room for a new one */
    uint64_t map_ns;      /* vmm: time in the driver's create, map (with access), unmap and
                             release calls */
    uint64_t fence_ns;    /* time the pool's threads spent polling (up to 50 us at a time) and
                             waiting for fences, and waiting for another thread's device sync,
                             the lock dropped; not the device syncs themselves (no fence to be
                             had, CUHEAP_REUSE=sync) */
    uint64_t lost;   /* bytes the driver would not take back and the pool could not keep track of
                        (counted in reserved for good) */
    int vmm_refused; /* CUHEAP_VMM_TO_DRIVER or _TO_LEGACY: the driver refused the backing */
    bool fences_refused; /* fence queries refused outside any capture: freed blocks wait for a
                            device sync instead of a fence */
};

/* What the pool does after the driver refused a VMM call twice over (not for want of memory):
 * requests that need new memory go to the driver, until the pool holds nothing and becomes a
 * legacy pool (pool.c, vmm_refused_locked). */
enum { CUHEAP_VMM_TO_DRIVER = 1, CUHEAP_VMM_TO_LEGACY };

/* Something the pool did that a trace should show; seq is taken under the pool lock. */
struct cuheap_pool_note {
    int type; /* CUHEAP_EV_ARENA_GROW, _ARENA_RELEASE, _FENCE, _OOM, _LIMIT */
    uint64_t ptr;
    uint64_t size;
    uint64_t aux, aux2;
};
typedef void (*cuheap_pool_note_fn)(struct cuheap_pool *p, const struct cuheap_pool_note *n);

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
    unsigned granule_shift;
    int device;
    unsigned nr_capturing; /* streams capturing: no fences recorded meanwhile */
    uint64_t gen;          /* which setup of this pool: thread caches of an earlier one are not
                              this pool's */
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
    uint64_t nr_synced;             /* of those, given back (or dropped with the context) */
    pthread_cond_t synced;          /* broadcast when one is */
    unsigned nr_since_poll;
    uint64_t nr_merged; /* blocks given back to the buddy allocators since the last purge */
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
     * fence (the GPT replay's held/live crept from 1.04 to 1.11 over 8 passes). */
    uint64_t peak_busy;
    uint64_t pending_mapped;     /* vmm: bytes the extents of pending blocks reach */
    int vmm_refused;             /* 0, CUHEAP_VMM_TO_DRIVER (no more mapping calls) or _TO_LEGACY */
    _Atomic bool fences_refused; /* a fence query was refused outside any capture (fence_passed):
                                    no fence is recorded any more, freed blocks wait for a
                                    device sync */
    struct cuheap_tcache *tcaches; /* every thread's cache of this pool */
    struct cuheap_timeline tl;     /* fences of the threads' large blocks */
    /* CUHEAP_IDLE_CHECK: checks to skip after the streams were found busy (idle_now), and the
     * checks that found them idle on the timeline's side, folded into st.nr_idle when read */
    _Atomic unsigned idle_skip;
    _Atomic uint64_t nr_idle_tl;
    struct cuheap_pool_stats st; /* thread caches' shares folded in by cuheap_pool_get_stats() */
};

enum {
    CUHEAP_POOL_PASS = 1, /* not for the pool: the caller goes to the driver */
};

/* Set up a pool for one device. device_reserved is shared with the hook layer so pass-through
 * allocations count toward the limit. Returns 0 or a negative errno. */
int cuheap_pool_init(struct cuheap_pool *p, const struct cuheap_config *cfg,
                     const struct cuheap_backend *be, int device, uint64_t limit,
                     _Atomic uint64_t *device_reserved, cuheap_pool_note_fn note);

/* Allocate size bytes. stream is the stream the memory will be used on when known (pluggable
 * allocator), else 0. Returns 0 with the address, block size and event sequence number (none
 * taken when ret_seq is NULL: recording is off);
 * CUHEAP_POOL_PASS when the request is not for the pool (too large, during capture, or it
 * needs new memory and the driver refused the vmm backing);
 * -ENOMEM when neither the pool nor the driver can give it after every reclaim. */
int cuheap_pool_alloc(struct cuheap_pool *p, uint64_t size, uint64_t stream, uint64_t *ret_ptr,
                      uint64_t *ret_block, uint64_t *ret_seq);

/* Free a block this pool handed out. With a stream, the block is reusable at once on that
 * stream and after a fence elsewhere. Returns 0 with the requested and block sizes and the
 * event sequence number (ret_seq may be NULL), or -EINVAL when ptr is not a live block start
 * (a double free). */
int cuheap_pool_free(struct cuheap_pool *p, uint64_t ptr, uint64_t stream, uint64_t *ret_size,
                     uint64_t *ret_block, uint64_t *ret_seq);

/* cuheap_pool_free() on the pool whose arena contains ptr (*ret_pool, set when there is one);
 * CUHEAP_POOL_PASS when ptr is in no pool's arena. */
int cuheap_pool_free_any(uint64_t ptr, uint64_t stream, struct cuheap_pool **ret_pool,
                         uint64_t *ret_size, uint64_t *ret_block, uint64_t *ret_seq);

/* The pool whose arena contains ptr, or NULL. Lock-free. */
struct cuheap_pool *cuheap_pool_of(uint64_t ptr);

/* What a range query on ptr answers for a pooled pointer: the live block containing it.
 * Returns 0, or -EINVAL when ptr is in an arena but not inside a live block. On success also
 * the arena's driver allocation (for IPC decisions). */
int cuheap_pool_block_range(struct cuheap_pool *p, uint64_t ptr, uint64_t *ret_base,
                            uint64_t *ret_size, uint64_t *ret_buffer_id, uint64_t *ret_arena);

/* Wait for every pending fence and give empty arenas back to the driver (all of them, or
 * down to CUHEAP_POOL_INIT when keep_init). Returns the bytes released. */
uint64_t cuheap_pool_trim(struct cuheap_pool *p, bool keep_init);

/* Grow the pool until it holds at least bytes (CUHEAP_POOL_INIT). Returns 0 or -ENOMEM. */
int cuheap_pool_reserve(struct cuheap_pool *p, uint64_t bytes);

/* Stream capture began (+1) or ended (-1) somewhere in the process. */
void cuheap_pool_capture(struct cuheap_pool *p, int delta);

/* One piece of physical memory under a shared block: a chunk exported as a file descriptor,
 * at offset bytes from the block's start (negative when it begins before the block). */
struct cuheap_share {
    const void *chunk; /* to tell pieces apart; not for use */
    int64_t offset;
    uint64_t bytes;
    int fd; /* the caller closes it */
};

/* vmm: the physical memory under the live block at `block` (whose buffer id, from
 * cuheap_pool_block_range(), says it is still the block that was shared), as at most max
 * pieces exported as file descriptors, for another process to map (cuIpcOpenMemHandle).
 * Returns the number of pieces, -EINVAL when the block is gone or the pool has no vmm,
 * -ENOSPC when more than max pieces, -EIO when the driver would not export one. */
int cuheap_pool_share(struct cuheap_pool *p, uint64_t block, uint64_t buffer_id,
                      struct cuheap_share *pieces, unsigned max);

/* vmm: a peer was given access to this pool's device: make every mapped chunk accessible to
 * the device's peers as the backend now knows them (chunks mapped later get it when mapped).
 * Returns 0, or -EIO when the driver refused a chunk. */
int cuheap_pool_grant_access(struct cuheap_pool *p);

void cuheap_pool_get_stats(struct cuheap_pool *p, struct cuheap_pool_stats *ret);

/* The largest free piece of memory the pool holds: the largest block any of its arenas could
 * hand out now without the driver (under vmm, a free block counts only as far as the arena
 * has granules mapped and unused: address space alone is not memory). Takes p->lock; for an
 * out-of-memory's report, never a hot path. */
uint64_t cuheap_pool_largest_free(struct cuheap_pool *p);

/* Check every invariant of every arena and the pending lists. Returns 0 or -EFAULT with a
 * description in why. Expensive: tests and CUHEAP_DEBUG builds. */
int cuheap_pool_check(struct cuheap_pool *p, char *why, size_t why_size);

/* For tests of the thread caches' hand-over: the calling thread enters its own cache of p as
 * its allocations do, and stays inside until cuheap_pool_debug_leave() (false: no cache);
 * cuheap_pool_debug_hold() holds every cache as a drain does (p->lock taken) until
 * cuheap_pool_debug_unhold(). */
bool cuheap_pool_debug_enter(struct cuheap_pool *p);
void cuheap_pool_debug_leave(struct cuheap_pool *p);
void cuheap_pool_debug_hold(struct cuheap_pool *p);
void cuheap_pool_debug_unhold(struct cuheap_pool *p);

/* For tests: the pool's own count of live bytes as placement sees it (CUHEAP_VMM_IDLE_FIT's
 * guard), without folding in what thread caches have not handed over yet. */
uint64_t cuheap_pool_debug_live(struct cuheap_pool *p);

/* The device context is being destroyed or reset: the driver frees every arena itself. Drop
 * them all without calling it (a trace note per arena), along with pending fences. Returns
 * the bytes of live pooled allocations that went with them. */
uint64_t cuheap_pool_abandon(struct cuheap_pool *p);

/* Forget everything without calling the driver: a child after fork cannot use the parent's
 * device memory. */
void cuheap_pool_forget(struct cuheap_pool *p);

/* In a child after fork: the address map's lock may have been held by another thread. */
void cuheap_pool_atfork_child(void);

#endif
