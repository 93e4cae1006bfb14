/* SPDX-License-Identifier: MIT */
/*
 * The live set (liveset.h): a hash table of live allocations by address, each pointing at
 * its site, and the sites in one array with a hash index over it, so a free costs one lookup
 * and asking for the top sites one pass over the sites. Allocation failure leaves the set
 * incomplete (said by `incomplete`), never wrong about what it holds.
 *
 * Locking: none; the writer thread alone uses a set.
 */
#include "liveset.h"

#include <stdlib.h>
#include <string.h>

struct cuheap_live_block {
    uint64_t ptr; /* 0 = empty slot */
    uint64_t size;
    uint32_t site; /* index in sites */
};

static size_t mix(uint64_t p, size_t n)
{
    p ^= p >> 33;
    p *= 0xff51afd7ed558ccdull;
    p ^= p >> 33;
    return (size_t)p & (n - 1);
}

static size_t site_hash(uint32_t stack, int16_t device, size_t n)
{
    return mix(((uint64_t)(uint16_t)device << 32) | stack, n);
}

void cuheap_liveset_init(struct cuheap_liveset *s)
{
    memset(s, 0, sizeof(*s));
}

void cuheap_liveset_destroy(struct cuheap_liveset *s)
{
    free(s->blocks);
    free(s->sites);
    free(s->site_index);
    memset(s, 0, sizeof(*s));
}

static bool grow_index(struct cuheap_liveset *s)
{
    size_t n = s->nr_index_slots ? s->nr_index_slots * 2 : 256;
    uint32_t *index = calloc(n, sizeof(*index));
    if (!index)
        return false;
    for (size_t k = 0; k < s->nr_sites; k++) {
        size_t h = site_hash(s->sites[k].stack, s->sites[k].device, n);
        while (index[h])
            h = (h + 1) & (n - 1);
        index[h] = (uint32_t)(k + 1);
    }
    free(s->site_index);
    s->site_index = index;
    s->nr_index_slots = n;
    return true;
}

/* The index in sites of (stack, device), added when new; -1 for want of memory. */
static long site_of(struct cuheap_liveset *s, uint32_t stack, int16_t device)
{
    if ((s->nr_sites + 1) * 2 > s->nr_index_slots && !grow_index(s))
        return -1;
    size_t h = site_hash(stack, device, s->nr_index_slots);
    for (; s->site_index[h]; h = (h + 1) & (s->nr_index_slots - 1)) {
        const struct cuheap_live_site *a = &s->sites[s->site_index[h] - 1];
        if (a->stack == stack && a->device == device)
            return (long)s->site_index[h] - 1;
    }
    if (s->nr_sites == s->cap_sites) {
        size_t cap = s->cap_sites ? s->cap_sites * 2 : 256;
        struct cuheap_live_site *grown = realloc(s->sites, cap * sizeof(*grown));
        if (!grown)
            return -1;
        s->sites = grown;
        s->cap_sites = cap;
    }
    s->sites[s->nr_sites] = (struct cuheap_live_site){.stack = stack, .device = device};
    s->site_index[h] = (uint32_t)++s->nr_sites;
    return (long)s->nr_sites - 1;
}

static void put_block(struct cuheap_live_block *slots, size_t n, const struct cuheap_live_block *b)
{
    size_t i = mix(b->ptr, n);
    while (slots[i].ptr)
        i = (i + 1) & (n - 1);
    slots[i] = *b;
}

static bool grow_blocks(struct cuheap_liveset *s)
{
    size_t n = s->nr_block_slots ? s->nr_block_slots * 2 : 1024;
    struct cuheap_live_block *slots = calloc(n, sizeof(*slots));
    if (!slots)
        return false;
    for (size_t i = 0; i < s->nr_block_slots; i++)
        if (s->blocks[i].ptr)
            put_block(slots, n, &s->blocks[i]);
    free(s->blocks);
    s->blocks = slots;
    s->nr_block_slots = n;
    return true;
}

void cuheap_liveset_alloc(struct cuheap_liveset *s, uint64_t ptr, int device, uint64_t size,
                          uint32_t stack)
{
    if (!ptr)
        return;
    cuheap_liveset_free(s, ptr);
    if ((s->nr_blocks + 1) * 2 > s->nr_block_slots && !grow_blocks(s)) {
        s->incomplete = true;
        return;
    }
    long site = site_of(s, stack, (int16_t)device);
    if (site < 0) {
        s->incomplete = true;
        return;
    }
    struct cuheap_live_block b = {.ptr = ptr, .size = size, .site = (uint32_t)site};
    put_block(s->blocks, s->nr_block_slots, &b);
    s->nr_blocks++;
    s->sites[site].bytes += size;
    s->sites[site].nr_blocks++;
    if (device >= 0 && device < CUHEAP_LIVESET_NR_DEVICES) {
        s->dev_bytes[device] += size;
        if (s->dev_bytes[device] > s->dev_peak[device])
            s->dev_peak[device] = s->dev_bytes[device];
    }
}

void cuheap_liveset_free(struct cuheap_liveset *s, uint64_t ptr)
{
    if (!ptr || !s->nr_blocks)
        return;
    size_t mask = s->nr_block_slots - 1, i = mix(ptr, s->nr_block_slots);
    while (s->blocks[i].ptr && s->blocks[i].ptr != ptr)
        i = (i + 1) & mask;
    if (!s->blocks[i].ptr)
        return;
    struct cuheap_live_site *a = &s->sites[s->blocks[i].site];
    a->bytes -= s->blocks[i].size;
    a->nr_blocks--;
    if (a->device >= 0 && a->device < CUHEAP_LIVESET_NR_DEVICES)
        s->dev_bytes[a->device] -= s->blocks[i].size;
    /* backward-shift deletion: no tombstones, so lookups stay short in a long run */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; s->blocks[j].ptr; j = (j + 1) & mask) {
        size_t home = mix(s->blocks[j].ptr, s->nr_block_slots);
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            s->blocks[hole] = s->blocks[j];
            hole = j;
        }
    }
    memset(&s->blocks[hole], 0, sizeof(s->blocks[hole]));
    s->nr_blocks--;
}

static bool before(const struct cuheap_live_site *a, const struct cuheap_live_site *b)
{
    return a->bytes != b->bytes ? a->bytes > b->bytes : a->stack < b->stack;
}

unsigned cuheap_liveset_top(const struct cuheap_liveset *s, int device,
                            struct cuheap_live_site *ret, unsigned max)
{
    unsigned n = 0;
    for (size_t k = 0; k < s->nr_sites && max; k++) {
        const struct cuheap_live_site *a = &s->sites[k];
        if (a->device != device || !a->nr_blocks)
            continue;
        if (n == max && !before(a, &ret[n - 1]))
            continue;
        unsigned at = n < max ? n++ : n - 1; /* the last one falls off when full */
        while (at > 0 && before(a, &ret[at - 1])) {
            ret[at] = ret[at - 1];
            at--;
        }
        ret[at] = *a;
    }
    return n;
}

uint64_t cuheap_liveset_bytes(const struct cuheap_liveset *s, int device)
{
    uint64_t bytes = 0;
    for (size_t k = 0; k < s->nr_sites; k++)
        if (s->sites[k].device == device)
            bytes += s->sites[k].bytes;
    return bytes;
}

uint64_t cuheap_liveset_peak(const struct cuheap_liveset *s, int device)
{
    return device >= 0 && device < CUHEAP_LIVESET_NR_DEVICES ? s->dev_peak[device] : 0;
}
