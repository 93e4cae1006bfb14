/* SPDX-License-Identifier: MIT */
/*
 * The pass-through map: address -> what was allocated there, for allocations the driver
 * served directly (too large for the pool, async, managed, host, VMM). Frees look up the
 * size here so events and the limit stay exact. Slots from mmap (no malloc on the hook path),
 * doubled when half full up to a fixed capacity; open addressing with backward-shift deletion;
 * one mutex, taken only around driver-bound calls that already cost microseconds.
 */
#ifndef CUHEAP_ADDRMAP_H
#define CUHEAP_ADDRMAP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cuheap_addr_entry {
    uint64_t key;    /* address (or VMM handle); 0 = empty slot */
    uint64_t size;   /* bytes requested */
    uint64_t actual; /* bytes the driver reserved for it */
    int16_t device;  /* -1 for host memory */
    uint8_t api;     /* enum cuheap_api */
};

struct cuheap_addrmap {
    pthread_mutex_t lock;
    struct cuheap_addr_entry *slots;
    size_t nr_slots;  /* power of two, doubled when half full */
    size_t max_slots; /* the capacity: nr_slots stops there */
    size_t nr_used;
};

/* A map that grows to capacity slots at most. Returns 0, -EINVAL (capacity not a power of two)
 * or -ENOMEM. */
int cuheap_addrmap_init(struct cuheap_addrmap *m, size_t capacity);
void cuheap_addrmap_destroy(struct cuheap_addrmap *m);

/* Insert or replace. Returns 0, or -ENOSPC when the map is 7/8 full at its capacity (or
 * could not grow: the entry is not tracked; the caller counts it). */
int cuheap_addrmap_put(struct cuheap_addrmap *m, const struct cuheap_addr_entry *e);

/* Remove key and return its entry. Returns 0 or -ENOENT. */
int cuheap_addrmap_take(struct cuheap_addrmap *m, uint64_t key, struct cuheap_addr_entry *ret);

/* Look without removing. Returns 0 or -ENOENT. */
int cuheap_addrmap_get(struct cuheap_addrmap *m, uint64_t key, struct cuheap_addr_entry *ret);

/* Remove every entry of one device; adds their requested and actual bytes to *ret_size and
 * *ret_actual. */
void cuheap_addrmap_drop_device(struct cuheap_addrmap *m, int device, uint64_t *ret_size,
                                uint64_t *ret_actual);

#endif
