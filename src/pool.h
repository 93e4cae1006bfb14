/* SPDX-License-Identifier: MIT */
/*
 * The per-device pool: arenas taken from the device through a backend (backend.h), a buddy
 * allocator inside each, and the rules that keep reuse safe: a freed block is not handed out
 * again while work submitted before its free may still touch it (CUHEAP_REUSE).
 *
 * The pool knows nothing of CUDA: the hook layer gives it a backend over the real driver,
 * unit tests give it one over host memory. Its parts live in src/pool/, behind
 * src/pool/internal.h; this header is all that other files see.
 *
 * Two backings (CUHEAP_BACKING). legacy: each arena is device memory from cuMemAlloc, so a
 * block's rounding up to a power of two costs device memory. vmm: each arena is address space
 * only, and physical memory comes in granules (2 MiB on current GPUs) mapped under the bytes
 * that live and pending blocks use: a 20 MiB request in a 32 MiB block holds 20 MiB.
 *
 * Every function here may be called from any thread; none holds a lock of the pool's on return.
 */
#ifndef CUHEAP_POOL_H
#define CUHEAP_POOL_H

#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"

struct cuheap_pool;

struct cuheap_pool_stats {
    uint64_t reserved;    /* bytes in arenas */
    uint64_t live;        /* bytes requested by live pooled allocations */
    uint64_t live_blocks; /* bytes of live pooled blocks (rounded) */
    uint64_t pending;     /* bytes freed but waiting for a fence */
    uint64_t nr_hits;
    uint64_t nr_misses;
    uint64_t nr_arenas;
    uint64_t nr_fences;   /* fences recorded */
    uint64_t nr_idle;     /* freed blocks returned with no fence: every stream was found
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
    int vmm_refused; /* CUHEAP_VMM_TO_DRIVER: the driver refused the backing; _ABSENT: none */
    bool to_driver;  /* every request goes to the driver (after a refusal: once the pool held
                        nothing) */
    bool fences_refused; /* fence queries refused outside any capture: freed blocks wait for a
                            device sync instead of a fence */
};

/* Why a CUHEAP_BACKING=vmm pool sends requests to the driver: it refused a VMM call twice over
 * (not for want of memory; requests that need new memory go to the driver, and every request
 * once the pool holds nothing: acquire.c, vmm_refused_locked), or the device has no VMM (every
 * request, from the start). */
enum { CUHEAP_VMM_TO_DRIVER = 1, CUHEAP_VMM_ABSENT };

/* Something the pool did that a trace should show; seq is taken under the pool lock. */
struct cuheap_pool_note {
    int type; /* CUHEAP_EV_ARENA_GROW, _ARENA_RELEASE, _FENCE, _OOM, _LIMIT */
    uint64_t ptr;
    uint64_t size;
    uint64_t aux, aux2;
    void *owner; /* the pool's (cuheap_pool_init) */
};
typedef void (*cuheap_pool_note_fn)(struct cuheap_pool *p, const struct cuheap_pool_note *n);

enum {
    CUHEAP_POOL_PASS = 1, /* not for the pool: the caller goes to the driver */
};

/* A pool's storage, zeroed, for cuheap_pool_init(); never freed (lock-free readers of the
 * address map may still look at a pool after its device is gone). NULL when memory is short. */
struct cuheap_pool *cuheap_pool_create(void);

/* Set up a pool for one device. device_reserved is shared with the hook layer so pass-through
 * allocations count toward the limit. Returns 0 or a negative errno. */
int cuheap_pool_init(struct cuheap_pool *p, const struct cuheap_config *cfg,
                     const struct cuheap_backend *be, int device, uint64_t limit,
                     _Atomic uint64_t *device_reserved, cuheap_pool_note_fn note, void *owner);

/* The owner given to cuheap_pool_init() (the runtime's device record). */
void *cuheap_pool_owner(const struct cuheap_pool *p);

/* Whether the pool maps granules (CUHEAP_BACKING=vmm, and the driver has not refused it). */
bool cuheap_pool_is_vmm(const struct cuheap_pool *p);

/* Streams capturing in the process when the pool was set up (no fences while any does). */
void cuheap_pool_set_capturing(struct cuheap_pool *p, unsigned nr);

/* Around fork (the runtime's handlers, every pool in turn): prepare takes the pool's lock, so
 * that no thread is inside it when the process is copied; parent lets go of it again. */
void cuheap_pool_atfork_prepare(struct cuheap_pool *p);
void cuheap_pool_atfork_parent(struct cuheap_pool *p);

/* Whether the calling thread holds some pool's lock: a backend asserts it does not (no driver
 * call is made under a pool lock). */
bool cuheap_pool_lock_held(void);

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

/* cuheap_pool_free() on the pool whose arena contains ptr; *ret_owner is that pool's owner
 * (cuheap_pool_init()), set when there is one. CUHEAP_POOL_PASS when ptr is in no pool's arena. */
int cuheap_pool_free_any(uint64_t ptr, uint64_t stream, void **ret_owner, uint64_t *ret_size,
                         uint64_t *ret_block, uint64_t *ret_seq);

/* The pool whose arena contains ptr, or NULL. Lock-free. */
struct cuheap_pool *cuheap_pool_of(uint64_t ptr);

/* Async-signal-safe, no lock: take over the free of the live pooled block at ptr (whoever
 * clears a block's size frees it, as a thread cache's free does) and chain it onto *head, a
 * list through the block's own unit records, so that any number of them can wait, with api
 * (enum cuheap_api) kept for its event. Returns 0, or -EINVAL: no live block starts at ptr in
 * a pool's arenas. */
int cuheap_pool_claim_free(uint64_t ptr, int api, _Atomic uint64_t *head);

/* The first block cuheap_pool_claim_free chained onto *head, live again as it was, for its
 * free to be made as any other (cuheap_pool_free_any); 0 when none is left. Only the thread
 * whose list it is pops; its signal handlers may push meanwhile. */
uint64_t cuheap_pool_claimed_pop(_Atomic uint64_t *head, int *ret_api);

/* What a range query on ptr answers for a pooled pointer: the live block containing it.
 * Returns 0, or -EINVAL when ptr is in an arena but not inside a live block. On success also
 * the arena's driver allocation (for IPC decisions). */
int cuheap_pool_block_range(struct cuheap_pool *p, uint64_t ptr, uint64_t *ret_base,
                            uint64_t *ret_size, uint64_t *ret_buffer_id, uint64_t *ret_arena);

/* Wait for every pending fence and give empty arenas back to the driver (all of them, or
 * down to CUHEAP_POOL_INIT when keep_init). Returns the bytes released. */
uint64_t cuheap_pool_trim(struct cuheap_pool *p, bool keep_init);

/* Grow the pool until it holds at least bytes (CUHEAP_POOL_INIT). Returns 0, -ENOMEM, or
 * -EIO when nothing can be reserved because every request goes to the driver (it refused the
 * vmm backing, now or before). */
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

/* For tests: CUHEAP_DEBUG builds check every invariant every 64th pool operation; a test whose
 * warm-up runs thousands over 4 GiB arenas under a sanitizer sets another count (0 = none)
 * and checks itself. No effect in other builds. */
void cuheap_pool_debug_check_every(unsigned every);

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
