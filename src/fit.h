/* SPDX-License-Identifier: MIT */
/*
 * First fit by address over one address range (an arena): a block of any number of units (one
 * unit = the smallest block) is taken from the start of the lowest-addressed free range that
 * holds it, and freed back into its free neighbours. Pure bookkeeping, like buddy.h: it never
 * touches the memory it manages, so it works for device addresses.
 *
 * Why, against the buddy allocator: blocks are neither rounded up to a power of two nor
 * aligned to one, so what a block leaves free serves the next block of any size, and the
 * lowest addresses are used again first, so the memory a job touches stays packed, and the
 * same granules stay mapped from step to step (bench/run-placement.sh measures it against the
 * buddy on the corpus). This is that placement's core, not yet under the pool.
 *
 * Free ranges live in a treap ordered by address in which each node knows the longest free
 * range of its subtree, so the lowest range that fits is one walk down from the root. Records
 * at each free range's first and last unit, and at each block's first, find a freed block's
 * neighbours at once. Every operation is O(log ranges); cuheap_fit_block_of adds O(units of the
 * block / 64) for a pointer inside a block.
 *
 * Not thread-safe: the caller holds its lock around every call.
 */
#ifndef CUHEAP_FIT_H
#define CUHEAP_FIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cuheap_fit_range; /* a free range: a node of the treap (fit.c) */

struct cuheap_fit {
    uintptr_t base;                  /* first byte, aligned to a unit */
    uint64_t size;                   /* bytes, a multiple of the unit */
    unsigned unit_shift;             /* log2 of the unit */
    uint32_t nr_units;               /* size >> unit_shift */
    uint32_t *block_units;           /* per unit: units of the block that starts here, 0: none */
    uint32_t *range_first;           /* per unit: the free range that starts here, 0: none */
    uint32_t *range_last;            /* per unit: the free range that ends here, 0: none */
    uint64_t *starts;                /* one bit per unit: a block starts there */
    struct cuheap_fit_range *ranges; /* [0] unused: index 0 is "none" */
    uint32_t root;                   /* the treap's root, 0: no free range */
    uint32_t recycled;               /* ranges free for reuse, linked through their left */
    uint32_t nr_fresh;               /* ranges ever used: the next fresh one is nr_fresh + 1 */
    uint32_t seed;                   /* the treap's priorities */
    size_t meta_bytes;               /* bytes mapped for the arrays */
    uint64_t free_bytes;             /* bytes in free ranges */
};

/* Set up an empty (all free) arena of size bytes at base, in units of unit bytes (a power of
 * two; size a multiple of it, base aligned to it). Metadata comes from mmap, so what is never
 * touched costs no memory. Returns 0, -EINVAL or -ENOMEM. */
int cuheap_fit_init(struct cuheap_fit *f, uintptr_t base, uint64_t size, uint64_t unit);

/* Release the metadata. */
void cuheap_fit_destroy(struct cuheap_fit *f);

/* Take a block of at least size bytes (rounded up to units) from the lowest-addressed free
 * range that holds it. Returns 0 and its address and bytes, or -ENOMEM. */
int cuheap_fit_alloc(struct cuheap_fit *f, uint64_t size, uintptr_t *ret_addr, uint64_t *ret_bytes);

/* Give back the block that starts at addr, merged with its free neighbours. Returns its bytes,
 * or -EINVAL when no block starts at addr (a double free, or an interior pointer). */
int64_t cuheap_fit_free(struct cuheap_fit *f, uintptr_t addr);

/* Bytes of the block that starts at addr, 0 when none does. O(1). */
uint64_t cuheap_fit_bytes_at(const struct cuheap_fit *f, uintptr_t addr);

/* The block that holds addr: 0 with its start and bytes, -ENOENT when addr is free, -EINVAL
 * outside the arena. */
int cuheap_fit_block_of(const struct cuheap_fit *f, uintptr_t addr, uintptr_t *ret_start,
                        uint64_t *ret_bytes);

/* What starts at addr, a block or a free range (a walk from the arena's base steps by its
 * bytes): 0 with its bytes and whether it is a block, -EINVAL when nothing starts there. O(1). */
int cuheap_fit_piece_at(const struct cuheap_fit *f, uintptr_t addr, uint64_t *ret_bytes,
                        bool *ret_allocated);

/* Bytes of the longest free range: the largest request served without a free. O(1). */
uint64_t cuheap_fit_largest_free(const struct cuheap_fit *f);

/* True when every byte is free again. */
bool cuheap_fit_empty(const struct cuheap_fit *f);

/* Walk the whole arena and check every invariant: blocks and free ranges tile it, no two free
 * ranges touch, the treap is ordered, a heap by priority, its links and longest ranges right,
 * the records agree, free_bytes adds up. Returns 0 or -EFAULT, and when it fails, a
 * description in why (may be NULL). Expensive: tests and debug builds. */
int cuheap_fit_check(const struct cuheap_fit *f, char *why, size_t why_size);

#endif
