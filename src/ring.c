/* SPDX-License-Identifier: MIT */
/* Bounded MPSC ring (see ring.h). Memory orders: a producer's release store of `turn`
 * publishes the event it wrote; the consumer's acquire load sees it whole.
 *
 * A slot stores its turn minus its own index, so a slot that was never used holds 0, which is
 * what a fresh anonymous mapping reads: nothing is written at start-up, and a page of slots
 * becomes resident only when the ring first reaches it (65536 slots are 53 MB when touched). */
#include "ring.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

int cuheap_ring_init(struct cuheap_ring *r, unsigned capacity)
{
    if (capacity < 2 || (capacity & (capacity - 1)))
        return -EINVAL;
    memset(r, 0, sizeof(*r));
    r->map_bytes = (size_t)capacity * sizeof(struct cuheap_ring_slot);
    void *m = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    r->slots = m;
    r->mask = capacity - 1;
    return 0;
}

void cuheap_ring_destroy(struct cuheap_ring *r)
{
    if (r->slots)
        munmap(r->slots, r->map_bytes);
    r->slots = NULL;
}

/* The turn of a slot (its stored value is relative to its index, see above). */
static uint64_t turn_of(const struct cuheap_ring *r, struct cuheap_ring_slot *slot,
                        memory_order order)
{
    return atomic_load_explicit(&slot->turn, order) + (uint64_t)(slot - r->slots);
}

static void set_turn(const struct cuheap_ring *r, struct cuheap_ring_slot *slot, uint64_t turn)
{
    atomic_store_explicit(&slot->turn, turn - (uint64_t)(slot - r->slots), memory_order_release);
}

struct cuheap_event *cuheap_ring_claim(struct cuheap_ring *r)
{
    uint64_t pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
    for (;;) {
        struct cuheap_ring_slot *slot = &r->slots[pos & r->mask];
        uint64_t turn = turn_of(r, slot, memory_order_acquire);
        int64_t diff = (int64_t)(turn - pos);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->enqueue_pos, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                return &slot->event;
        } else if (diff < 0) {
            atomic_fetch_add_explicit(&r->nr_dropped, 1, memory_order_relaxed);
            return NULL;
        } else {
            pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
        }
    }
}

void cuheap_ring_commit(struct cuheap_ring *r, struct cuheap_event *ev)
{
    struct cuheap_ring_slot *slot =
        (struct cuheap_ring_slot *)((char *)ev - offsetof(struct cuheap_ring_slot, event));
    uint64_t pos = turn_of(r, slot, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->nr_pushed, 1, memory_order_relaxed);
    set_turn(r, slot, pos + 1);
}

struct cuheap_event *cuheap_ring_peek(struct cuheap_ring *r)
{
    struct cuheap_ring_slot *slot = &r->slots[r->dequeue_pos & r->mask];
    uint64_t turn = turn_of(r, slot, memory_order_acquire);
    return turn == r->dequeue_pos + 1 ? &slot->event : NULL;
}

void cuheap_ring_consume(struct cuheap_ring *r)
{
    struct cuheap_ring_slot *slot = &r->slots[r->dequeue_pos & r->mask];
    set_turn(r, slot, r->dequeue_pos + r->mask + 1);
    r->dequeue_pos++;
}

void cuheap_ring_reset(struct cuheap_ring *r)
{
    /* Back to zero pages: every slot free for its first turn, and the parent's events no
     * longer resident in the child. */
    if (madvise(r->slots, r->map_bytes, MADV_DONTNEED))
        memset(r->slots, 0, r->map_bytes);
    atomic_store_explicit(&r->enqueue_pos, 0, memory_order_relaxed);
    r->dequeue_pos = 0;
}
