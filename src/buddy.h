/* SPDX-License-Identifier: MIT */
/*
 * A binary buddy allocator over one address range (an arena). Pure bookkeeping: it never
 * touches the memory it manages, so it works for device addresses. Orders are log2 of block
 * sizes in bytes, from min_order (the smallest block) to max_order (the arena).
 *
 * free_area[order] holds the free blocks of that order in an O(1) list; free_bitmap has bit
 * `order` set while that list is non-empty, so the smallest fitting order is one ctz away.
 * Per-unit metadata (one unit = one smallest block) makes pointer-to-block lookup O(1) for
 * block starts and O(orders) for interior pointers.
 *
 * Not thread-safe: the pool holds its lock around every call.
 */
#ifndef CUHEAP_BUDDY_H
#define CUHEAP_BUDDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CUHEAP_MAX_ORDER 40 /* largest block 1 TiB */
#define CUHEAP_NR_ORDERS (CUHEAP_MAX_ORDER + 1)

struct cuheap_free_area {
    uint32_t head;    /* unit of the first free block, CUHEAP_BUDDY_NIL when empty */
    uint32_t nr_free; /* blocks on the list for this order */
};

struct cuheap_buddy {
    /* Fixed once set up, read without locks by the pool's thread caches: kept off the cache
     * lines that every allocation and free below writes. */
    uintptr_t base;      /* first byte of the arena, aligned to the smallest block */
    uint64_t size;       /* bytes, a power of two */
    unsigned min_order;  /* log2 of the smallest block */
    unsigned max_order;  /* log2 of size */
    uint32_t nr_units;   /* size >> min_order */
    uint8_t *unit_state; /* per unit: HEAD|FREE|order for block starts, 0 inside blocks */
    uint32_t *next;      /* free-list links, valid for free block starts */
    uint32_t *prev;
    size_t meta_bytes;                 /* bytes mapped for the three arrays */
    _Alignas(64) uint64_t free_bitmap; /* bit o set iff free_area[o].nr_free > 0 */
    uint64_t free_bytes;               /* bytes in free blocks */
    struct cuheap_free_area free_area[CUHEAP_NR_ORDERS];
};

#define CUHEAP_BUDDY_NIL UINT32_MAX

/* Set up an empty (all free) arena of size bytes at base. size and min_block are powers of
 * two, min_block <= size. Metadata comes from mmap, so untouched parts cost no memory.
 * Returns 0, -EINVAL or -ENOMEM. */
int cuheap_buddy_init(struct cuheap_buddy *b, uintptr_t base, uint64_t size, uint64_t min_block);

/* Release the metadata. */
void cuheap_buddy_destroy(struct cuheap_buddy *b);

/* Release the metadata of an arena going away while lock-free readers may still hold it: size
 * becomes 0 (nothing is inside any more), base, min_order and nr_units stay as they were. */
void cuheap_buddy_retire(struct cuheap_buddy *b);

/* Smallest order that holds size bytes (at least min_order). */
unsigned cuheap_buddy_order_for(const struct cuheap_buddy *b, uint64_t size);

/* Take a block of at least size bytes. Returns 0 and its address and order, or -ENOMEM. */
int cuheap_buddy_alloc(struct cuheap_buddy *b, uint64_t size, uintptr_t *ret_addr,
                       unsigned *ret_order);

/* How much the caller likes the len bytes at addr as a place, or a region to look for a place,
 * for a block of size bytes (for vmm pools: how many of them have memory mapped that such a
 * block should use). Higher is better; len or more is as good as it gets; below 0 is worse
 * than a place the caller does not care about. A region larger than size must score what its
 * two halves score together (the place itself, len == size, may score as it likes). */
typedef int64_t (*cuheap_buddy_score_fn)(void *arg, uintptr_t addr, uint64_t len, uint64_t size);

/* What a score function may answer instead of 0 for a region that has nothing it cares about
 * anywhere (every place in it would score 0): the region is then split without scoring its
 * halves (a large free block of a vmm arena with no memory mapped in it). */
#define CUHEAP_BUDDY_SCORE_NOTHING INT64_MIN

/* Like cuheap_buddy_alloc, but where the block comes from is chosen by score: the first
 * max_candidates free blocks of every order that fits are each split greedily (at each level
 * the better scored half) and the best place wins; the first that scores full ends the search.
 * uniform_order: the score tells no two places apart inside one block of that order (a vmm
 * pool's granule), so halves of such a block are not compared: the lower one is taken, as on a
 * tie. Same results and errors as cuheap_buddy_alloc. */
int cuheap_buddy_alloc_scored(struct cuheap_buddy *b, uint64_t size, cuheap_buddy_score_fn score,
                              void *arg, unsigned max_candidates, unsigned uniform_order,
                              uintptr_t *ret_addr, unsigned *ret_order);

/* Give back the block that starts at addr, merging with free buddies. Returns the freed
 * block's order, or -EINVAL when addr is not the start of an allocated block. */
int cuheap_buddy_free(struct cuheap_buddy *b, uintptr_t addr);

/* Called by cuheap_buddy_purge() with the units of a free block past its start. */
typedef void (*cuheap_buddy_purge_fn)(void *arg, uint32_t first_unit, uint32_t nr_units);

/* Give the kernel back the pages of per-unit metadata that lie wholly inside free blocks of
 * order min_order or more, past their starts: those units hold zeros (only a block's start is
 * marked), which is what the pages read as afterwards. Blocks land all over an arena in a
 * long run, and without this every page of metadata a block ever touched stayed resident.
 * fn (may be NULL) is called for each such block, for the caller's own per-unit arrays.
 * Returns the number of blocks. */
unsigned cuheap_buddy_purge(struct cuheap_buddy *b, unsigned min_order, cuheap_buddy_purge_fn fn,
                            void *arg);

/* The pages of an array of nr elements of elem_size bytes from first that no element outside
 * it shares, given back to the kernel (they read as zeros). */
void cuheap_buddy_drop_pages(void *array, size_t elem_size, uint32_t first, uint32_t nr);

/* The block (free or allocated) that contains addr. Returns 0, or -EINVAL outside the arena.*/
int cuheap_buddy_block_of(const struct cuheap_buddy *b, uintptr_t addr, uintptr_t *ret_start,
                          unsigned *ret_order, bool *ret_allocated);

/* Order of the allocated block that starts at addr, or -EINVAL. O(1). */
int cuheap_buddy_order_at(const struct cuheap_buddy *b, uintptr_t addr);

/* Bytes of the largest free block, 0 when none is: the largest request the arena could
 * serve without another block being freed. O(1), from the bitmap. */
uint64_t cuheap_buddy_largest_free(const struct cuheap_buddy *b);

/* True when every byte is free again (one block of max_order on its list). */
bool cuheap_buddy_empty(const struct cuheap_buddy *b);

/* Walk the whole arena and check every invariant: blocks tile the arena, lists and bitmap
 * agree, no two free buddies left unmerged, free_bytes adds up. Returns 0 or -EFAULT, and
 * when it fails, a description in why (may be NULL). Expensive: tests and debug builds. */
int cuheap_buddy_check(const struct cuheap_buddy *b, char *why, size_t why_size);

#endif
