/* SPDX-License-Identifier: MIT */
/*
 * The live set: which allocations are live right now and the bytes each call site (stack id
 * and device) holds, kept by the recorder's writer thread from the events it writes, so that
 * an out-of-memory can name who holds the memory at that moment (recorder_oom.c). Pure and
 * not thread-safe: the writer thread alone uses it (and tests); it may allocate.
 */
#ifndef CUHEAP_LIVESET_H
#define CUHEAP_LIVESET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cuheap_live_site {
    uint32_t stack;     /* stack id (0: no stack) */
    int16_t device;     /* device ordinal */
    uint64_t bytes;     /* bytes requested by its live allocations */
    uint64_t nr_blocks; /* its live allocations */
};

struct cuheap_live_block; /* liveset.c */

#define CUHEAP_LIVESET_NR_DEVICES 32 /* ordinals whose totals and peaks are kept */

struct cuheap_liveset {
    struct cuheap_live_block *blocks; /* open addressing by address; ptr 0 = empty */
    size_t nr_block_slots, nr_blocks; /* nr_block_slots: 0 or a power of two */
    struct cuheap_live_site *sites;   /* every site seen, in order of first sight */
    size_t nr_sites, cap_sites;
    uint32_t *site_index;  /* open addressing by (stack, device): index in sites + 1, 0 = empty */
    size_t nr_index_slots; /* 0 or a power of two */
    bool incomplete;       /* an allocation went untracked for want of memory */
    uint64_t dev_bytes[CUHEAP_LIVESET_NR_DEVICES]; /* bytes live per device ordinal */
    uint64_t dev_peak[CUHEAP_LIVESET_NR_DEVICES];  /* the most dev_bytes has been */
};

void cuheap_liveset_init(struct cuheap_liveset *s);
void cuheap_liveset_destroy(struct cuheap_liveset *s);

/* An allocation of size bytes at ptr on device, made at stack. One already live at ptr (its
 * free was never seen: a context's end, a lost event) is forgotten first. */
void cuheap_liveset_alloc(struct cuheap_liveset *s, uint64_t ptr, int device, uint64_t size,
                          uint32_t stack);

/* The allocation at ptr is gone (nothing happens when it was not live). */
void cuheap_liveset_free(struct cuheap_liveset *s, uint64_t ptr);

/* The sites of device holding the most bytes now, most first (ties: lower stack id first),
 * at most max of them into ret. Returns how many. */
unsigned cuheap_liveset_top(const struct cuheap_liveset *s, int device,
                            struct cuheap_live_site *ret, unsigned max);

/* Bytes live on device, as the events seen say. */
uint64_t cuheap_liveset_bytes(const struct cuheap_liveset *s, int device);

/* The most bytes live on device at once, as the events seen say: `cuheap report`'s peak live
 * of the same events. 0 for an ordinal past CUHEAP_LIVESET_NR_DEVICES. */
uint64_t cuheap_liveset_peak(const struct cuheap_liveset *s, int device);

#endif
