/* SPDX-License-Identifier: MIT */
/* Pass-through allocation map (see addrmap.h). */
#include "addrmap.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

static size_t slot_of(const struct cuheap_addrmap *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & (m->nr_slots - 1);
}

/* Slots of a new map: a job with few pass-through allocations touches 32 KiB. */
#define NR_FIRST_SLOTS 1024

static struct cuheap_addr_entry *map_slots(size_t n)
{
    void *p = mmap(NULL, n * sizeof(struct cuheap_addr_entry), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int cuheap_addrmap_init(struct cuheap_addrmap *m, size_t capacity)
{
    if (capacity < 8 || (capacity & (capacity - 1)))
        return -EINVAL;
    size_t n = capacity < NR_FIRST_SLOTS ? capacity : NR_FIRST_SLOTS;
    struct cuheap_addr_entry *slots = map_slots(n);
    if (!slots)
        return -ENOMEM;
    pthread_mutex_init(&m->lock, NULL);
    m->slots = slots;
    m->nr_slots = n;
    m->max_slots = capacity;
    m->nr_used = 0;
    return 0;
}

void cuheap_addrmap_destroy(struct cuheap_addrmap *m)
{
    if (m->slots)
        munmap(m->slots, m->nr_slots * sizeof(struct cuheap_addr_entry));
    m->slots = NULL;
}

/* Slot holding key, or the empty slot where it would go. m->lock held. */
static size_t find_locked(const struct cuheap_addrmap *m, uint64_t key)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & (m->nr_slots - 1);
    return i;
}

/* Twice the slots, the entries moved over (m->lock held). Returns 0 or -ENOMEM (the map
 * stays as it was). */
static int grow_locked(struct cuheap_addrmap *m)
{
    size_t n = m->nr_slots * 2;
    struct cuheap_addr_entry *slots = map_slots(n), *old = m->slots;
    if (!slots)
        return -ENOMEM;
    size_t old_n = m->nr_slots;
    m->slots = slots;
    m->nr_slots = n;
    for (size_t j = 0; j < old_n; j++)
        if (old[j].key)
            m->slots[find_locked(m, old[j].key)] = old[j];
    munmap(old, old_n * sizeof(*old));
    return 0;
}

int cuheap_addrmap_put(struct cuheap_addrmap *m, const struct cuheap_addr_entry *e)
{
    if (!e->key)
        return -EINVAL;
    pthread_mutex_lock(&m->lock);
    size_t i = find_locked(m, e->key);
    if (!m->slots[i].key) {
        /* Half full: twice the slots. Addresses spread over every slot of a map, so its size
         * must follow the most entries held at once, not the addresses seen over a run: a map
         * mapped whole from the start became resident page by page as the driver handed out
         * new addresses, up to all of it. */
        if ((m->nr_used + 1) * 2 > m->nr_slots && m->nr_slots < m->max_slots && grow_locked(m) == 0)
            i = find_locked(m, e->key);
        if ((m->nr_used + 1) * 8 > m->nr_slots * 7) {
            pthread_mutex_unlock(&m->lock);
            return -ENOSPC;
        }
        m->nr_used++;
    }
    m->slots[i] = *e;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

int cuheap_addrmap_get(struct cuheap_addrmap *m, uint64_t key, struct cuheap_addr_entry *ret)
{
    if (!key)
        return -ENOENT;
    pthread_mutex_lock(&m->lock);
    size_t i = find_locked(m, key);
    int r = m->slots[i].key ? 0 : -ENOENT;
    if (!r)
        *ret = m->slots[i];
    pthread_mutex_unlock(&m->lock);
    return r;
}

int cuheap_addrmap_take(struct cuheap_addrmap *m, uint64_t key, struct cuheap_addr_entry *ret)
{
    if (!key)
        return -ENOENT;
    pthread_mutex_lock(&m->lock);
    size_t i = find_locked(m, key);
    if (!m->slots[i].key) {
        pthread_mutex_unlock(&m->lock);
        return -ENOENT;
    }
    *ret = m->slots[i];
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t mask = m->nr_slots - 1, hole = i;
    for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
        size_t home = slot_of(m, m->slots[j].key);
        /* Move j into the hole unless its home lies cyclically in (hole, j]. */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    memset(&m->slots[hole], 0, sizeof(m->slots[hole]));
    m->nr_used--;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

void cuheap_addrmap_drop_device(struct cuheap_addrmap *m, int device, uint64_t *ret_size,
                                uint64_t *ret_actual)
{
    /* A rare event (a device reset): scan, then take what was found, a batch at a time. */
    for (;;) {
        uint64_t keys[256];
        size_t nr = 0;
        pthread_mutex_lock(&m->lock);
        for (size_t i = 0; i < m->nr_slots && nr < 256; i++)
            if (m->slots[i].key && m->slots[i].device == device)
                keys[nr++] = m->slots[i].key;
        pthread_mutex_unlock(&m->lock);
        if (!nr)
            return;
        for (size_t i = 0; i < nr; i++) {
            struct cuheap_addr_entry e;
            if (cuheap_addrmap_take(m, keys[i], &e) == 0) {
                *ret_size += e.size;
                *ret_actual += e.actual;
            }
        }
    }
}
