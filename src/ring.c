/* SPDX-License-Identifier: MIT */
/* Bounded MPSC ring (see ring.h). Memory orders: a producer's release store of `turn`
 * publishes the event it wrote; the consumer's acquire load sees it whole.
 *
 * A slot stores its turn minus its own index, so a slot that was never used holds 0, which is
 * what a fresh anonymous mapping reads: nothing is written at start-up. The consumer makes the
 * pages just ahead of the producers resident (cuheap_ring_populate), rather than leave each
 * producer to fault a page in every few events the first time round; a program that makes few
 * events still holds little of the ring (65536 slots are 53 MB when all touched). */
#include "ring.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
    /* fewer faults and TLB misses where transparent huge pages are offered on request */
    (void)madvise(m, r->map_bytes, MADV_HUGEPAGE);
    return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

bool cuheap_ring_populate(struct cuheap_ring *r, size_t ahead)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), slot = sizeof(struct cuheap_ring_slot);
    if (r->populated >= r->map_bytes)
        return false;
    uint64_t pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
    size_t front = pos > r->mask ? r->map_bytes : (size_t)pos * slot;
    size_t want =
        front + ahead < r->map_bytes ? (front + ahead + page - 1) & ~(page - 1) : r->map_bytes;
    if (want <= r->populated)
        return true;
    size_t start = r->populated;
    if (madvise((char *)r->slots + start, want - start, MADV_POPULATE_WRITE)) {
        /* An older kernel: a write to each slot's turn that changes nothing (an atomic add of
         * 0, so a producer filling that slot meanwhile loses nothing) faults its page in. */
        for (size_t i = (start + slot - 1) / slot; i * slot < want && i <= r->mask; i++)
            atomic_fetch_add_explicit(&r->slots[i].turn, 0, memory_order_relaxed);
    }
    r->populated = want;
    return want < r->map_bytes;
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

/* The lines the next event will most likely write (its header and first native frames, and its
 * first Python frames), asked for ahead: a slot was last touched a lap ago, and filling it
 * from cold memory made the producer wait on cache misses at every event (bench/RESULTS.md). */
static void prefetch_slot(struct cuheap_ring_slot *next)
{
    const char *c = (const char *)next;
    __builtin_prefetch(c, 1, 3);
    __builtin_prefetch(c + 64, 1, 3);
    __builtin_prefetch(c + 128, 1, 3);
    __builtin_prefetch(c + 192, 1, 3);
    __builtin_prefetch((const char *)next->event.py, 1, 3);
    __builtin_prefetch((const char *)next->event.py + 64, 1, 3);
}

struct cuheap_event *cuheap_ring_claim(struct cuheap_ring *r)
{
    uint64_t pos;
    return cuheap_ring_claim_pos(r, &pos);
}

struct cuheap_event *cuheap_ring_claim_pos(struct cuheap_ring *r, uint64_t *ret_pos)
{
    uint64_t pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
    for (;;) {
        struct cuheap_ring_slot *slot = &r->slots[pos & r->mask];
        uint64_t turn = turn_of(r, slot, memory_order_acquire);
        int64_t diff = (int64_t)(turn - pos);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->enqueue_pos, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                prefetch_slot(&r->slots[(pos + 1) & r->mask]);
                *ret_pos = pos;
                return &slot->event;
            }
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
    r->populated = 0;
}
