/* SPDX-License-Identifier: MIT */
/*
 * A bounded lock-free ring of events: many producers (any thread, inside hooks), one consumer
 * (the writer thread). Vyukov's bounded MPMC queue specialised for one consumer: every slot
 * has a sequence number telling whose turn it is, producers claim a position with one CAS.
 * A full ring never blocks: the event is dropped and counted.
 */
#ifndef CUHEAP_RING_H
#define CUHEAP_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "event.h"

struct cuheap_ring_slot {
    _Atomic uint64_t turn; /* minus the slot's index: == position: free for the producer of
                              that position; == position + 1: holds that position's event.
                              Relative, so an untouched zero page means "free" */
    struct cuheap_event event;
};

struct cuheap_ring {
    struct cuheap_ring_slot *slots;
    uint64_t mask;                             /* capacity - 1 */
    _Alignas(64) _Atomic uint64_t enqueue_pos; /* next position producers claim */
    _Alignas(64) uint64_t dequeue_pos;         /* consumer only */
    _Alignas(64) _Atomic uint64_t nr_dropped;  /* events lost to a full ring */
    size_t map_bytes;
    size_t populated; /* bytes from the start made resident by the consumer (populate) */
};

/* Capacity is a power of two >= 2. Slots come from mmap and are not touched here: memory
 * becomes resident as the ring fills. Returns 0, -EINVAL or -ENOMEM. */
int cuheap_ring_init(struct cuheap_ring *r, unsigned capacity);
void cuheap_ring_destroy(struct cuheap_ring *r);

/* Producer: claim a slot and get the event to fill, or NULL when full (counted as a drop).
 * Fill it, then cuheap_ring_commit() with the same pointer. Never blocks. */
struct cuheap_event *cuheap_ring_claim(struct cuheap_ring *r);
/* The same, with the slot's position (the count of claims before it) in *ret_pos. */
struct cuheap_event *cuheap_ring_claim_pos(struct cuheap_ring *r, uint64_t *ret_pos);
void cuheap_ring_commit(struct cuheap_ring *r, struct cuheap_event *ev);

/* Consumer, from its own thread: make the ring resident up to `ahead` bytes beyond the slot
 * producers claim next, so that producers filling the ring for the first time do not each take
 * page faults (about 2.7 us an event, more than everything else an event costs, on the
 * simulated device) while a program that makes few events holds little of it. Returns false
 * once the whole ring is resident (nothing more to do). */
bool cuheap_ring_populate(struct cuheap_ring *r, size_t ahead);

/* Events that made it in: slots claimed since start or reset (enqueue_pos: a count a producer
 * keeps anyway, where one of its own cost each event an atomic add). */
static inline uint64_t cuheap_ring_nr_pushed(struct cuheap_ring *r)
{
    return atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
}

/* Consumer: the oldest committed event, or NULL when none is ready. Call
 * cuheap_ring_consume() when done with it. Only one thread may consume. */
struct cuheap_event *cuheap_ring_peek(struct cuheap_ring *r);
/* Consumer: the position of the event cuheap_ring_peek() gives. */
static inline uint64_t cuheap_ring_peek_pos(const struct cuheap_ring *r)
{
    return r->dequeue_pos;
}
void cuheap_ring_consume(struct cuheap_ring *r);

/* Drop everything in flight and start empty; for a child after fork (single-threaded). */
void cuheap_ring_reset(struct cuheap_ring *r);

#endif
