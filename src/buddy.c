/* SPDX-License-Identifier: MIT */
/*
 * Buddy allocator (see buddy.h). The vocabulary follows Linux mm/page_alloc.c: a block of
 * order o is split into two of order o-1 by expand(); a freed block merges with its buddy,
 * found by XOR of its unit index with the block's size in units, while that buddy is free and
 * of the same order.
 */
#include "buddy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define UNIT_HEAD       0x80u /* a block starts at this unit */
#define UNIT_FREE       0x40u /* ... and that block is free */
#define UNIT_ORDER_MASK 0x3fu

static unsigned log2_floor(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

static uint32_t units_of(const struct cuheap_buddy *b, unsigned order)
{
    return (uint32_t)1 << (order - b->min_order);
}

static uint32_t buddy_of(const struct cuheap_buddy *b, uint32_t unit, unsigned order)
{
    return unit ^ units_of(b, order);
}

static void list_add(struct cuheap_buddy *b, uint32_t unit, unsigned order)
{
    struct cuheap_free_area *area = &b->free_area[order];
    b->prev[unit] = CUHEAP_BUDDY_NIL;
    b->next[unit] = area->head;
    if (area->head != CUHEAP_BUDDY_NIL)
        b->prev[area->head] = unit;
    area->head = unit;
    area->nr_free++;
    b->free_bitmap |= 1ull << order;
    b->unit_state[unit] = (uint8_t)(UNIT_HEAD | UNIT_FREE | order);
    b->free_bytes += 1ull << order;
}

static void list_del(struct cuheap_buddy *b, uint32_t unit, unsigned order)
{
    struct cuheap_free_area *area = &b->free_area[order];
    uint32_t n = b->next[unit], p = b->prev[unit];
    if (p != CUHEAP_BUDDY_NIL)
        b->next[p] = n;
    else
        area->head = n;
    if (n != CUHEAP_BUDDY_NIL)
        b->prev[n] = p;
    if (--area->nr_free == 0)
        b->free_bitmap &= ~(1ull << order);
    b->free_bytes -= 1ull << order;
}

int cuheap_buddy_init(struct cuheap_buddy *b, uintptr_t base, uint64_t size, uint64_t min_block)
{
    if (!size || (size & (size - 1)) || !min_block || (min_block & (min_block - 1)) ||
        min_block > size || (base & (min_block - 1)) || log2_floor(size) > CUHEAP_MAX_ORDER ||
        (size / min_block) > UINT32_MAX / 2)
        return -EINVAL;
    memset(b, 0, sizeof(*b));
    b->base = base;
    b->size = size;
    b->min_order = log2_floor(min_block);
    b->max_order = log2_floor(size);
    b->nr_units = (uint32_t)(size >> b->min_order);
    size_t n = b->nr_units;
    b->meta_bytes = n + 2 * n * sizeof(uint32_t);
    void *m = mmap(NULL, b->meta_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    b->next = m;
    b->prev = b->next + n;
    b->unit_state = (uint8_t *)(b->prev + n);
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++)
        b->free_area[o].head = CUHEAP_BUDDY_NIL;
    list_add(b, 0, b->max_order);
    return 0;
}

void cuheap_buddy_retire(struct cuheap_buddy *b)
{
    /* base, min_order and nr_units stay: lock-free readers compute a unit from them and must
     * land inside the (emptied, still mapped) per-unit arrays of the arena */
    __atomic_store_n(&b->size, 0, __ATOMIC_RELEASE);
    if (b->next)
        munmap(b->next, b->meta_bytes);
    b->next = b->prev = NULL;
    b->unit_state = NULL;
    b->meta_bytes = 0;
    b->free_bitmap = b->free_bytes = 0;
    memset(b->free_area, 0, sizeof(b->free_area));
}

void cuheap_buddy_destroy(struct cuheap_buddy *b)
{
    if (b->next)
        munmap(b->next, b->meta_bytes);
    memset(b, 0, sizeof(*b));
}

unsigned cuheap_buddy_order_for(const struct cuheap_buddy *b, uint64_t size)
{
    if (size <= (1ull << b->min_order))
        return b->min_order;
    unsigned o = log2_floor(size - 1) + 1;
    return o;
}

/* Split the free block at unit (order high) down to order low, putting the upper halves on
 * their free lists, like expand() in the kernel. */
static void expand(struct cuheap_buddy *b, uint32_t unit, unsigned low, unsigned high)
{
    while (high > low) {
        high--;
        list_add(b, unit + units_of(b, high), high);
    }
}

int cuheap_buddy_alloc(struct cuheap_buddy *b, uint64_t size, uintptr_t *ret_addr,
                       unsigned *ret_order)
{
    unsigned order = cuheap_buddy_order_for(b, size ? size : 1);
    if (order > b->max_order)
        return -ENOMEM;
    uint64_t candidates = b->free_bitmap & ~((1ull << order) - 1);
    if (!candidates)
        return -ENOMEM;
    unsigned found = (unsigned)__builtin_ctzll(candidates);
    uint32_t unit = b->free_area[found].head;
    list_del(b, unit, found);
    expand(b, unit, order, found);
    b->unit_state[unit] = (uint8_t)(UNIT_HEAD | order);
    *ret_addr = b->base + ((uintptr_t)unit << b->min_order);
    *ret_order = order;
    return 0;
}

static uintptr_t addr_of(const struct cuheap_buddy *b, uint32_t unit)
{
    return b->base + ((uintptr_t)unit << b->min_order);
}

/* A place's score, CUHEAP_BUDDY_SCORE_NOTHING counted as the 0 it stands for. */
static int64_t judge(cuheap_buddy_score_fn score, void *arg, uintptr_t addr, uint64_t len,
                     uint64_t size)
{
    int64_t s = score(arg, addr, len, size);
    return s == CUHEAP_BUDDY_SCORE_NOTHING ? 0 : s;
}

/* The unit where the greedy split of the free block at unit (order high) ends for a block of
 * order (the better scored half at each level, the lower one on a tie), and that place's score
 * in *ret_score: with nothing to score anywhere in it, or inside a block of uniform_order or
 * less, every tie goes to the lower half. Above the place itself a region scores what its two
 * halves do together (cuheap_buddy_score_fn), so only the lower half is asked: the upper one
 * scores the rest. */
static uint32_t split_scored(struct cuheap_buddy *b, uint32_t unit, unsigned high, unsigned order,
                             uint64_t want, cuheap_buddy_score_fn score, void *arg,
                             unsigned uniform_order, int64_t *ret_score)
{
    int64_t whole = high > order && high > uniform_order
                        ? score(arg, addr_of(b, unit), 1ull << high, want)
                        : CUHEAP_BUDDY_SCORE_NOTHING;
    bool compare = whole != CUHEAP_BUDDY_SCORE_NOTHING;
    while (high > order) {
        high--;
        uint32_t upper = unit + units_of(b, high);
        if (!compare || high < uniform_order)
            continue;
        if (high == order) { /* the place itself: scored on its own */
            int64_t lower = judge(score, arg, addr_of(b, unit), want, want);
            int64_t up = judge(score, arg, addr_of(b, upper), want, want);
            unit = up > lower ? upper : unit;
            *ret_score = up > lower ? up : lower;
            return unit;
        }
        int64_t lower = judge(score, arg, addr_of(b, unit), 1ull << high, want);
        if (whole - lower > lower) {
            unit = upper;
            whole -= lower;
        } else {
            whole = lower;
        }
    }
    *ret_score = judge(score, arg, addr_of(b, unit), want, want);
    return unit;
}

/* Split the free block at unit (order high, off its list) down to order, towards target (a
 * unit inside it): the halves left behind go onto their free lists. */
static void split_towards(struct cuheap_buddy *b, uint32_t unit, unsigned high, unsigned order,
                          uint32_t target)
{
    while (high > order) {
        high--;
        uint32_t upper = unit + units_of(b, high);
        if (target >= upper) {
            list_add(b, unit, high);
            unit = upper;
        } else {
            list_add(b, upper, high);
        }
    }
}

int cuheap_buddy_alloc_scored(struct cuheap_buddy *b, uint64_t size, cuheap_buddy_score_fn score,
                              void *arg, unsigned max_candidates, unsigned uniform_order,
                              uintptr_t *ret_addr, unsigned *ret_order)
{
    unsigned order = cuheap_buddy_order_for(b, size ? size : 1);
    if (order > b->max_order)
        return -ENOMEM;
    uint64_t candidates = b->free_bitmap & ~((1ull << order) - 1);
    if (!candidates)
        return -ENOMEM;
    unsigned found = (unsigned)__builtin_ctzll(candidates);
    uint64_t want = size ? size : 1;
    uint32_t best = b->free_area[found].head, best_unit = best;
    unsigned best_order = found;
    int64_t best_score = 0;
    bool have = false;
    /* every order that fits, its first max_candidates free blocks, each judged by the best place
     * a greedy split would reach in it */
    for (unsigned o = found; o <= b->max_order && !(have && best_score >= (int64_t)want); o++) {
        if (!(b->free_bitmap & (1ull << o)))
            continue;
        unsigned n = 0;
        for (uint32_t u = b->free_area[o].head; u != CUHEAP_BUDDY_NIL && n < max_candidates;
             u = b->next[u], n++) {
            int64_t s;
            uint32_t unit = split_scored(b, u, o, order, want, score, arg, uniform_order, &s);
            if (!have || s > best_score) {
                have = true;
                best = u;
                best_unit = unit;
                best_order = o;
                best_score = s;
            }
            if (s >= (int64_t)want)
                break;
        }
    }
    list_del(b, best, best_order);
    split_towards(b, best, best_order, order, best_unit);
    b->unit_state[best_unit] = (uint8_t)(UNIT_HEAD | order);
    *ret_addr = addr_of(b, best_unit);
    *ret_order = order;
    return 0;
}

int cuheap_buddy_free(struct cuheap_buddy *b, uintptr_t addr)
{
    if (addr < b->base || addr >= b->base + b->size ||
        ((addr - b->base) & ((1ull << b->min_order) - 1)))
        return -EINVAL;
    uint32_t unit = (uint32_t)((addr - b->base) >> b->min_order);
    uint8_t st = b->unit_state[unit];
    if (!(st & UNIT_HEAD) || (st & UNIT_FREE))
        return -EINVAL;
    unsigned order = st & UNIT_ORDER_MASK, freed = order;
    b->unit_state[unit] = 0;
    while (order < b->max_order) {
        uint32_t buddy = buddy_of(b, unit, order);
        if (b->unit_state[buddy] != (UNIT_HEAD | UNIT_FREE | order))
            break;
        list_del(b, buddy, order);
        b->unit_state[buddy] = 0; /* merge: the pair is now one block at the lower unit */
        unit &= ~units_of(b, order);
        order++;
    }
    list_add(b, unit, order);
    return (int)freed;
}

void cuheap_buddy_drop_pages(void *array, size_t elem_size, uint32_t first, uint32_t nr)
{
    static uintptr_t page; /* written alike by every thread that finds it unset */
    if (!page)
        page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)array + (uintptr_t)first * elem_size;
    uintptr_t end = start + (uintptr_t)nr * elem_size;
    start = (start + page - 1) & ~(page - 1);
    end &= ~(page - 1);
    if (end > start)
        madvise((void *)start, end - start, MADV_DONTNEED);
}

unsigned cuheap_buddy_purge(struct cuheap_buddy *b, unsigned min_order, cuheap_buddy_purge_fn fn,
                            void *arg)
{
    unsigned nr = 0;
    if (min_order < b->min_order + 1)
        min_order = b->min_order + 1;
    for (unsigned o = min_order; o <= b->max_order; o++) {
        if (!(b->free_bitmap & (1ull << o)))
            continue;
        uint32_t n = units_of(b, o) - 1;
        for (uint32_t u = b->free_area[o].head; u != CUHEAP_BUDDY_NIL; u = b->next[u], nr++) {
            /* the start keeps its state and links: the lists run through it */
            cuheap_buddy_drop_pages(b->unit_state, sizeof(*b->unit_state), u + 1, n);
            cuheap_buddy_drop_pages(b->next, sizeof(*b->next), u + 1, n);
            cuheap_buddy_drop_pages(b->prev, sizeof(*b->prev), u + 1, n);
            if (fn)
                fn(arg, u + 1, n);
        }
    }
    return nr;
}

int cuheap_buddy_block_of(const struct cuheap_buddy *b, uintptr_t addr, uintptr_t *ret_start,
                          unsigned *ret_order, bool *ret_allocated)
{
    if (addr < b->base || addr >= b->base + b->size)
        return -EINVAL;
    uint32_t unit = (uint32_t)((addr - b->base) >> b->min_order);
    for (unsigned o = b->min_order; o <= b->max_order; o++) {
        uint32_t start = unit & ~(units_of(b, o) - 1);
        uint8_t st = b->unit_state[start];
        if ((st & UNIT_HEAD) && (st & UNIT_ORDER_MASK) == o) {
            *ret_start = b->base + ((uintptr_t)start << b->min_order);
            *ret_order = o;
            *ret_allocated = !(st & UNIT_FREE);
            return 0;
        }
    }
    return -EINVAL;
}

int cuheap_buddy_order_at(const struct cuheap_buddy *b, uintptr_t addr)
{
    if (addr < b->base || addr >= b->base + b->size ||
        ((addr - b->base) & ((1ull << b->min_order) - 1)))
        return -EINVAL;
    uint8_t st = b->unit_state[(addr - b->base) >> b->min_order];
    if (!(st & UNIT_HEAD) || (st & UNIT_FREE))
        return -EINVAL;
    return st & UNIT_ORDER_MASK;
}

uint64_t cuheap_buddy_largest_free(const struct cuheap_buddy *b)
{
    if (!b->size || !b->free_bitmap) /* a retired arena holds nothing */
        return 0;
    return 1ull << (63 - __builtin_clzll(b->free_bitmap));
}

bool cuheap_buddy_empty(const struct cuheap_buddy *b)
{
    return b->free_bytes == b->size;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (why)                                                                                   \
            snprintf(why, why_size, __VA_ARGS__);                                                  \
        return -EFAULT;                                                                            \
    } while (0)

int cuheap_buddy_check(const struct cuheap_buddy *b, char *why, size_t why_size)
{
    uint32_t nr_free[CUHEAP_NR_ORDERS] = {0};
    uint64_t free_bytes = 0;
    for (uint32_t u = 0; u < b->nr_units;) {
        uint8_t st = b->unit_state[u];
        if (!(st & UNIT_HEAD))
            FAIL("unit %u is not a block start", u);
        unsigned o = st & UNIT_ORDER_MASK;
        if (o < b->min_order || o > b->max_order)
            FAIL("unit %u has order %u", u, o);
        if (u & (units_of(b, o) - 1))
            FAIL("block at unit %u misaligned for order %u", u, o);
        for (uint32_t i = 1; i < units_of(b, o); i++)
            if (b->unit_state[u + i])
                FAIL("unit %u inside block %u is marked", u + i, u);
        if (st & UNIT_FREE) {
            nr_free[o]++;
            free_bytes += 1ull << o;
            if (o < b->max_order) {
                uint32_t bu = buddy_of(b, u, o);
                if (b->unit_state[bu] == (UNIT_HEAD | UNIT_FREE | o))
                    FAIL("free buddies %u and %u of order %u not merged", u, bu, o);
            }
        }
        u += units_of(b, o);
    }
    if (free_bytes != b->free_bytes)
        FAIL("free_bytes %llu, counted %llu", (unsigned long long)b->free_bytes,
             (unsigned long long)free_bytes);
    for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
        const struct cuheap_free_area *area = &b->free_area[o];
        if (area->nr_free != nr_free[o])
            FAIL("order %u: nr_free %u, counted %u", o, area->nr_free, nr_free[o]);
        if (!!(b->free_bitmap & (1ull << o)) != (area->nr_free > 0))
            FAIL("order %u: bitmap disagrees with nr_free", o);
        uint32_t n = 0, prev = CUHEAP_BUDDY_NIL;
        for (uint32_t u = area->head; u != CUHEAP_BUDDY_NIL; u = b->next[u]) {
            if (++n > area->nr_free)
                FAIL("order %u: list longer than nr_free", o);
            if (b->unit_state[u] != (UNIT_HEAD | UNIT_FREE | o))
                FAIL("order %u: unit %u on the list is not a free block of that order", o, u);
            if (b->prev[u] != prev)
                FAIL("order %u: broken back link at unit %u", o, u);
            prev = u;
        }
        if (n != area->nr_free)
            FAIL("order %u: list has %u, nr_free %u", o, n, area->nr_free);
    }
    return 0;
}
