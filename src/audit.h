/* SPDX-License-Identifier: MIT */
/*
 * The coverage audit's matcher: what cuheap's hooks saw reach the driver (pass-through
 * allocations, the pool's arenas and granules, VMM handles and mappings, stream-ordered
 * allocations) against the driver's own account of its memory operations (as CUPTI's memory
 * activity records give it), so a driver operation no hook saw is named. Pure: it knows
 * nothing of CUPTI or CUDA types; cupti_audit.c translates records into these structs.
 *
 * The two sides arrive in any order (CUPTI delivers its records in buffers, late), so the
 * matcher keeps each side's unmatched operations in a multiset keyed by (operation, address)
 * and pairs an arrival with the other side's oldest equal key. Only what stays unmatched once
 * both sides are complete is a miss.
 *
 * The matcher itself is single-threaded (the caller serializes it) and allocates; hooks never
 * call it. They push into a cuheap_audit_queue: bounded, lock-free, no allocation.
 */
#ifndef CUHEAP_AUDIT_H
#define CUHEAP_AUDIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cuheap_audit_op {
    CUHEAP_AUDIT_ALLOC = 1, /* memory was allocated (or mapped) */
    CUHEAP_AUDIT_RELEASE,   /* memory was released (or unmapped) */
};

/* Which door a hooked operation took to the driver. */
enum cuheap_audit_door {
    CUHEAP_AUDIT_PASSTHRU,   /* the program's call, passed to the driver (cuMemAlloc, pitch,
                                managed, pinned host, the pluggable allocator's large requests) */
    CUHEAP_AUDIT_POOL,       /* an arena or a granule of cuheap's own pool */
    CUHEAP_AUDIT_VMM_CREATE, /* physical memory: cuMemCreate / cuMemRelease (no address) */
    CUHEAP_AUDIT_VMM_MAP,    /* cuMemMap / cuMemUnmap */
    CUHEAP_AUDIT_ASYNC,      /* stream-ordered, from a driver memory pool */
    CUHEAP_AUDIT_NR_DOORS
};

/* What the driver says the memory is; the same numbers as CUPTI's memory kinds. */
enum cuheap_audit_memory {
    CUHEAP_AUDIT_MEM_UNKNOWN,
    CUHEAP_AUDIT_MEM_PAGEABLE,
    CUHEAP_AUDIT_MEM_PINNED,
    CUHEAP_AUDIT_MEM_DEVICE,
    CUHEAP_AUDIT_MEM_ARRAY,
    CUHEAP_AUDIT_MEM_MANAGED,
    CUHEAP_AUDIT_MEM_DEVICE_STATIC,  /* a module's __device__ variables, loaded by the driver */
    CUHEAP_AUDIT_MEM_MANAGED_STATIC, /* a module's __managed__ variables */
    CUHEAP_AUDIT_NR_MEMORY
};

/* One operation a hook saw reach the driver. */
struct cuheap_audit_seen {
    uint8_t op;   /* enum cuheap_audit_op */
    uint8_t door; /* enum cuheap_audit_door */
    int16_t device;
    uint64_t addr;     /* 0 for physical VMM memory, which has no address */
    uint64_t size;     /* bytes asked for; 0 when unknown (a free of an unknown pointer) */
    uint64_t size_max; /* bytes the driver may report instead (its rounding), >= size */
};

/* One operation the driver reports. */
struct cuheap_audit_driver_op {
    uint8_t op;           /* enum cuheap_audit_op; anything else is ignored */
    uint8_t memory;       /* enum cuheap_audit_memory */
    bool async;           /* stream-ordered */
    uint32_t correlation; /* the driver's id of the API call that made it */
    uint32_t device;
    uint32_t stream;
    uint64_t addr;
    uint64_t bytes;
    uint64_t pool;   /* base address of the driver memory pool it came from, 0 if none */
    const char *api; /* the API call that made it ("cuMemAlloc_v2"), NULL when unknown; a
                        string that outlives the audit */
};

/* A driver operation no hook saw; `count` identical ones are folded into one. */
struct cuheap_audit_miss {
    struct cuheap_audit_driver_op op;
    uint32_t count;
};

struct cuheap_audit_counts {
    uint64_t nr_driver;       /* driver operations audited (module statics left out) */
    uint64_t nr_matched;      /* of those, matched to a hooked operation */
    uint64_t nr_missed;       /* of those, not (yet) matched: what the hooks did not see */
    uint64_t nr_static;       /* module statics: the driver's loading, not an allocation call */
    uint64_t nr_ignored;      /* records that were neither allocation nor release */
    uint64_t nr_seen;         /* hooked operations fed in */
    uint64_t nr_unreported;   /* of those, not (yet) matched by a driver operation */
    uint64_t nr_size_differs; /* matched by address, but the driver's byte count differs */
    uint64_t nr_by_door[CUHEAP_AUDIT_NR_DOORS]; /* matched operations by door */
};

struct audit_slot;

/* One side's unmatched operations: open addressing, one slot per key with a count. */
struct audit_table {
    struct audit_slot *slots;
    size_t nr_slots; /* power of two */
    size_t nr_used;  /* live slots and tombstones */
    size_t nr_live;
};

struct cuheap_audit {
    struct audit_table seen;   /* hooked operations not matched yet */
    struct audit_table driver; /* driver operations not matched yet */
    uint64_t arrival;          /* arrivals so far, on both sides: the age of a slot */
    uint64_t generation;       /* cuheap_audit_age() calls so far */
    struct cuheap_audit_counts counts;
    struct cuheap_audit_driver_op differs_example; /* the first size difference */
    uint64_t differs_seen_size;
};

/* 0 or -ENOMEM. */
int cuheap_audit_init(struct cuheap_audit *a);
void cuheap_audit_destroy(struct cuheap_audit *a);

/* Feed one side. Each pairs with the other side's oldest unmatched operation of the same
 * kind (alloc or release) at the same address; physical VMM memory (address 0) pairs by byte
 * count. Returns 0, or -ENOMEM when the operation could not be kept (counted as unmatched). */
int cuheap_audit_feed_seen(struct cuheap_audit *a, const struct cuheap_audit_seen *s);
int cuheap_audit_feed_driver(struct cuheap_audit *a, const struct cuheap_audit_driver_op *d);

void cuheap_audit_get_counts(const struct cuheap_audit *a, struct cuheap_audit_counts *ret);

/* The unmatched driver operations, oldest first: up to max into ret; returns how many
 * distinct ones there are in all. */
size_t cuheap_audit_misses(const struct cuheap_audit *a, struct cuheap_audit_miss *ret, size_t max);

/* Misses as they go: calls fn for each unmatched driver operation that was already
 * unmatched at the previous call (so a hook that records its event a moment after the
 * driver's record arrived is not blamed) and was not passed to fn before; then starts a new
 * generation. With `all`, every unmatched one not passed before (at exit). Returns how many
 * were passed. */
size_t cuheap_audit_age(struct cuheap_audit *a, bool all,
                        void (*fn)(const struct cuheap_audit_miss *m, void *arg), void *arg);

/* The one-line verdict: "audit: N driver operations, all seen", or which were missed (the
 * first `max_listed` named with address, size, memory and correlation id). Returns buf. */
char *cuheap_audit_summary(const struct cuheap_audit *a, unsigned max_listed, char *buf,
                           size_t size);

/* One missed operation in words: "alloc device 0x7f0000000000 (1.00 MiB, correlation 17,
 * cuMemAlloc_v2)". */
char *cuheap_audit_describe(const struct cuheap_audit_driver_op *d, char *buf, size_t size);

const char *cuheap_audit_memory_name(unsigned memory);
const char *cuheap_audit_door_name(unsigned door);

/* ---- the hooks' side: a bounded lock-free multi-producer queue ---- */

struct audit_qslot;

struct cuheap_audit_queue {
    struct audit_qslot *slots; /* mmap'd at init: pushing never allocates */
    uint64_t mask;
    _Atomic uint64_t tail;       /* next position to claim (producers) */
    uint64_t head;               /* next position to read (the one consumer) */
    _Atomic uint64_t nr_dropped; /* pushes refused because the queue was full */
};

/* nr_slots a power of two. 0 or -ENOMEM. */
int cuheap_audit_queue_init(struct cuheap_audit_queue *q, uint64_t nr_slots);
void cuheap_audit_queue_destroy(struct cuheap_audit_queue *q);
/* Any thread, never blocks: false (and counted) when full. */
bool cuheap_audit_queue_push(struct cuheap_audit_queue *q, const struct cuheap_audit_seen *s);
/* The consumer only: false when empty. */
bool cuheap_audit_queue_pop(struct cuheap_audit_queue *q, struct cuheap_audit_seen *ret);

#endif
