/* SPDX-License-Identifier: MIT */
/*
 * First fit by address (see fit.h). The free ranges are the nodes of a treap: a binary search
 * tree by start, a heap by a random priority (so its depth stays logarithmic whatever the order
 * of frees), each node knowing the longest range in its subtree. The lowest range that holds n
 * units is then found from the root: left while the left subtree has one, else this node if it
 * holds n, else right.
 *
 * A change of one range's length fixes the longest figures from it up, stopping at the first
 * that stays as it was: the ones above are made of it. So every change is made with the rest
 * of the tree right, one at a time (a merge erases the upper range first, then grows the lower).
 */
#include "fit.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

struct cuheap_fit_range {
    uint32_t start, len; /* units */
    uint32_t longest;    /* the longest len in this subtree */
    uint32_t prio;       /* smaller is nearer the root */
    uint32_t left, right, parent;
};

static struct cuheap_fit_range *at(const struct cuheap_fit *f, uint32_t i)
{
    return &f->ranges[i];
}

static uint32_t longest(const struct cuheap_fit *f, uint32_t i)
{
    return i ? f->ranges[i].longest : 0;
}

/* This node's longest from its own length and its children's; whether it changed. */
static bool update(struct cuheap_fit *f, uint32_t i)
{
    struct cuheap_fit_range *r = at(f, i);
    uint32_t m = r->len, l = longest(f, r->left), g = longest(f, r->right);
    if (l > m)
        m = l;
    if (g > m)
        m = g;
    bool changed = r->longest != m;
    r->longest = m;
    return changed;
}

/* After a change at node i (the rest of the tree right): its longest and its ancestors'. */
static void fix_up(struct cuheap_fit *f, uint32_t i)
{
    while (i && update(f, i))
        i = at(f, i)->parent;
}

static void replace_child(struct cuheap_fit *f, uint32_t parent, uint32_t old, uint32_t new)
{
    if (!parent)
        f->root = new;
    else if (at(f, parent)->left == old)
        at(f, parent)->left = new;
    else
        at(f, parent)->right = new;
    if (new)
        at(f, new)->parent = parent;
}

/* Node x takes its parent's place; the parent becomes its child. Both longest figures are
 * made again; those above stay right (the subtree holds the same ranges). */
static void rotate_up(struct cuheap_fit *f, uint32_t x)
{
    struct cuheap_fit_range *r = at(f, x);
    uint32_t p = r->parent, g = at(f, p)->parent;
    if (at(f, p)->left == x) {
        at(f, p)->left = r->right;
        if (r->right)
            at(f, r->right)->parent = p;
        r->right = p;
    } else {
        at(f, p)->right = r->left;
        if (r->left)
            at(f, r->left)->parent = p;
        r->left = p;
    }
    at(f, p)->parent = x;
    replace_child(f, g, p, x);
    update(f, p);
    update(f, x);
}

static uint32_t next_prio(struct cuheap_fit *f)
{
    uint32_t x = f->seed; /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    f->seed = x;
    return x;
}

/* A new free range [start, start + len) in the tree. There is always a node for it: ranges
 * never touch, so there are at most half the units' count of them (cuheap_fit_init). */
static uint32_t insert(struct cuheap_fit *f, uint32_t start, uint32_t len)
{
    uint32_t i = f->recycled;
    if (i)
        f->recycled = at(f, i)->left;
    else
        i = ++f->nr_fresh;
    *at(f, i) = (struct cuheap_fit_range){start, len, len, next_prio(f), 0, 0, 0};
    uint32_t parent = 0;
    for (uint32_t c = f->root; c;) {
        parent = c;
        c = start < at(f, c)->start ? at(f, c)->left : at(f, c)->right;
    }
    at(f, i)->parent = parent;
    if (!parent)
        f->root = i;
    else if (start < at(f, parent)->start)
        at(f, parent)->left = i;
    else
        at(f, parent)->right = i;
    while (at(f, i)->parent && at(f, i)->prio < at(f, at(f, i)->parent)->prio)
        rotate_up(f, i);
    fix_up(f, at(f, i)->parent);
    return i;
}

/* Range i out of the tree: rotated down to a leaf, then cut off. */
static void erase(struct cuheap_fit *f, uint32_t i)
{
    for (;;) {
        struct cuheap_fit_range *r = at(f, i);
        if (!r->left && !r->right)
            break;
        uint32_t c = !r->left                                       ? r->right
                     : !r->right                                    ? r->left
                     : at(f, r->left)->prio < at(f, r->right)->prio ? r->left
                                                                    : r->right;
        rotate_up(f, c);
    }
    uint32_t parent = at(f, i)->parent;
    replace_child(f, parent, i, 0);
    fix_up(f, parent);
    at(f, i)->left = f->recycled;
    f->recycled = i;
}

static void *map_array(size_t bytes)
{
    /* reserved as it is touched: an arena's arrays are mostly never */
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

int cuheap_fit_init(struct cuheap_fit *f, uintptr_t base, uint64_t size, uint64_t unit)
{
    if (!unit || (unit & (unit - 1)) || !size || (size & (unit - 1)) || (base & (unit - 1)) ||
        size / unit > UINT32_MAX / 2 || base + size - 1 < base)
        return -EINVAL;
    memset(f, 0, sizeof(*f));
    f->base = base;
    f->size = size;
    f->unit_shift = (unsigned)__builtin_ctzll(unit);
    f->nr_units = (uint32_t)(size / unit);
    size_t n = f->nr_units, words = (n + 63) / 64, nodes = n / 2 + 2;
    /* the 8-byte words first, then arrays of 4-byte fields: each aligned whatever n is */
    size_t starts = words * sizeof(uint64_t), ranges = nodes * sizeof(struct cuheap_fit_range);
    f->meta_bytes = starts + ranges + 3 * n * sizeof(uint32_t);
    char *m = map_array(f->meta_bytes);
    if (!m)
        return -ENOMEM;
    f->starts = (uint64_t *)m;
    f->ranges = (struct cuheap_fit_range *)(m + starts);
    f->block_units = (uint32_t *)(m + starts + ranges);
    f->range_first = f->block_units + n;
    f->range_last = f->range_first + n;
    f->seed = (0x9e3779b9u ^ (uint32_t)(base >> 12)) | 1; /* xorshift stays at 0 from 0 */
    uint32_t i = insert(f, 0, f->nr_units);
    f->range_first[0] = f->range_last[f->nr_units - 1] = i;
    f->free_bytes = size;
    return 0;
}

void cuheap_fit_destroy(struct cuheap_fit *f)
{
    if (f->starts)
        munmap(f->starts, f->meta_bytes);
    memset(f, 0, sizeof(*f));
}

int cuheap_fit_alloc(struct cuheap_fit *f, uint64_t size, uintptr_t *ret_addr, uint64_t *ret_bytes)
{
    if (size > f->size)
        return -ENOMEM; /* and rounding it up cannot wrap */
    uint64_t want = size ? (size + (1ull << f->unit_shift) - 1) >> f->unit_shift : 1;
    if (want > longest(f, f->root))
        return -ENOMEM;
    uint32_t n = (uint32_t)want, i = f->root;
    for (;;) { /* the root's subtree holds one: the lowest is left, here, or right */
        struct cuheap_fit_range *r = at(f, i);
        if (longest(f, r->left) >= n)
            i = r->left;
        else if (r->len >= n)
            break;
        else
            i = r->right;
    }
    struct cuheap_fit_range *r = at(f, i);
    uint32_t u = r->start;
    f->range_first[u] = 0;
    if (r->len == n) {
        f->range_last[u + n - 1] = 0;
        erase(f, i);
    } else {
        r->start += n; /* still between the same neighbours: the order holds */
        r->len -= n;
        f->range_first[r->start] = i;
        fix_up(f, i);
    }
    f->block_units[u] = n;
    f->starts[u / 64] |= 1ull << (u % 64);
    f->free_bytes -= (uint64_t)n << f->unit_shift;
    *ret_addr = f->base + ((uintptr_t)u << f->unit_shift);
    *ret_bytes = (uint64_t)n << f->unit_shift;
    return 0;
}

/* The unit of a block's start at addr, or -EINVAL. */
static int64_t block_unit(const struct cuheap_fit *f, uintptr_t addr)
{
    if (addr < f->base || addr - f->base >= f->size ||
        ((addr - f->base) & ((1ull << f->unit_shift) - 1)))
        return -EINVAL;
    uint32_t u = (uint32_t)((addr - f->base) >> f->unit_shift);
    return f->block_units[u] ? (int64_t)u : -EINVAL;
}

int64_t cuheap_fit_free(struct cuheap_fit *f, uintptr_t addr)
{
    int64_t found = block_unit(f, addr);
    if (found < 0)
        return -EINVAL;
    uint32_t u = (uint32_t)found, n = f->block_units[u], end = u + n;
    f->block_units[u] = 0;
    f->starts[u / 64] &= ~(1ull << (u % 64));
    uint32_t prev = u ? f->range_last[u - 1] : 0;
    uint32_t next = end < f->nr_units ? f->range_first[end] : 0;
    if (prev && next) {
        uint32_t next_len = at(f, next)->len, last = end + next_len - 1;
        f->range_last[u - 1] = 0;
        f->range_first[end] = 0;
        erase(f, next);
        at(f, prev)->len += n + next_len;
        f->range_last[last] = prev;
        fix_up(f, prev);
    } else if (prev) {
        f->range_last[u - 1] = 0;
        at(f, prev)->len += n;
        f->range_last[end - 1] = prev;
        fix_up(f, prev);
    } else if (next) {
        f->range_first[end] = 0;
        at(f, next)->start = u; /* nothing lies between: the order holds */
        at(f, next)->len += n;
        f->range_first[u] = next;
        fix_up(f, next);
    } else {
        uint32_t i = insert(f, u, n);
        f->range_first[u] = i;
        f->range_last[end - 1] = i;
    }
    f->free_bytes += (uint64_t)n << f->unit_shift;
    return (int64_t)((uint64_t)n << f->unit_shift);
}

uint64_t cuheap_fit_bytes_at(const struct cuheap_fit *f, uintptr_t addr)
{
    int64_t u = block_unit(f, addr);
    return u < 0 ? 0 : (uint64_t)f->block_units[u] << f->unit_shift;
}

int cuheap_fit_block_of(const struct cuheap_fit *f, uintptr_t addr, uintptr_t *ret_start,
                        uint64_t *ret_bytes)
{
    if (addr < f->base || addr - f->base >= f->size)
        return -EINVAL;
    uint32_t u = (uint32_t)((addr - f->base) >> f->unit_shift), w = u / 64;
    /* the free range that starts last at or below u: if it holds u, u is free; else u lies in
     * a block that starts after it, and the scan below crosses that block only */
    uint32_t below = 0;
    for (uint32_t i = f->root; i;) {
        if (at(f, i)->start <= u) {
            below = i;
            i = at(f, i)->right;
        } else {
            i = at(f, i)->left;
        }
    }
    if (below && u < at(f, below)->start + at(f, below)->len)
        return -ENOENT;
    uint64_t bits = f->starts[w] & (~0ull >> (63 - u % 64)); /* starts at or below u */
    while (!bits) {
        if (!w)
            return -ENOENT;
        bits = f->starts[--w];
    }
    uint32_t s = w * 64 + 63 - (uint32_t)__builtin_clzll(bits);
    if (u >= s + f->block_units[s])
        return -ENOENT; /* past that block: in a free range */
    *ret_start = f->base + ((uintptr_t)s << f->unit_shift);
    *ret_bytes = (uint64_t)f->block_units[s] << f->unit_shift;
    return 0;
}

int cuheap_fit_piece_at(const struct cuheap_fit *f, uintptr_t addr, uint64_t *ret_bytes,
                        bool *ret_allocated)
{
    int64_t u = block_unit(f, addr);
    if (u >= 0) {
        *ret_bytes = (uint64_t)f->block_units[u] << f->unit_shift;
        *ret_allocated = true;
        return 0;
    }
    if (addr < f->base || addr - f->base >= f->size ||
        (addr - f->base) & ((1ull << f->unit_shift) - 1))
        return -EINVAL;
    uint32_t r = f->range_first[(addr - f->base) >> f->unit_shift];
    if (!r)
        return -EINVAL;
    *ret_bytes = (uint64_t)at(f, r)->len << f->unit_shift;
    *ret_allocated = false;
    return 0;
}

uint64_t cuheap_fit_largest_free(const struct cuheap_fit *f)
{
    return (uint64_t)longest(f, f->root) << f->unit_shift;
}

bool cuheap_fit_empty(const struct cuheap_fit *f)
{
    return f->free_bytes == f->size;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (why)                                                                                   \
            snprintf(why, why_size, __VA_ARGS__);                                                  \
        return -EFAULT;                                                                            \
    } while (0)

/* The subtree at i: ordered between lo and hi (units), its links, priorities and longest
 * figures right, each range recorded at its ends. Counts its ranges into *nr. */
static int check_tree(const struct cuheap_fit *f, uint32_t i, uint32_t parent, uint64_t lo,
                      uint64_t hi, unsigned depth, uint32_t *nr, char *why, size_t why_size)
{
    if (!i)
        return 0;
    const struct cuheap_fit_range *r = at(f, i);
    if (++*nr > f->nr_units / 2 + 1)
        FAIL("more ranges in the tree than can be");
    if (r->parent != parent)
        FAIL("range %u: parent %u, linked from %u", i, r->parent, parent);
    if (depth > 64 + 4 * 32)
        FAIL("the tree is %u deep: its priorities are not random", depth);
    if (parent && r->prio < at(f, parent)->prio)
        FAIL("range %u: priority above its parent's", i);
    if (!r->len || r->start < lo || (uint64_t)r->start + r->len > hi)
        FAIL("range %u at unit %u of %u units out of order", i, r->start, r->len);
    if (f->range_first[r->start] != i || f->range_last[r->start + r->len - 1] != i)
        FAIL("range %u at unit %u not recorded at its ends", i, r->start);
    uint32_t m = r->len, l = longest(f, r->left), g = longest(f, r->right);
    if (r->longest != (l > m ? (l > g ? l : g) : (m > g ? m : g)))
        FAIL("range %u: longest %u is wrong", i, r->longest);
    if (check_tree(f, r->left, i, lo, r->start, depth + 1, nr, why, why_size) ||
        check_tree(f, r->right, i, (uint64_t)r->start + r->len, hi, depth + 1, nr, why, why_size))
        return -EFAULT;
    return 0;
}

int cuheap_fit_check(const struct cuheap_fit *f, char *why, size_t why_size)
{
    uint64_t free_units = 0;
    uint32_t nr_free = 0, nr_tree = 0;
    bool was_free = false;
    for (uint32_t u = 0; u < f->nr_units;) {
        bool start_bit = (f->starts[u / 64] >> (u % 64)) & 1;
        uint32_t n = f->block_units[u], i = f->range_first[u];
        if (n && i)
            FAIL("unit %u starts a block and a free range", u);
        if (start_bit != (n != 0))
            FAIL("unit %u: start bit %d, block of %u units", u, start_bit, n);
        if (i) {
            if (was_free)
                FAIL("free ranges touch at unit %u", u);
            if (at(f, i)->start != u)
                FAIL("unit %u records range %u, which starts at %u", u, i, at(f, i)->start);
            n = at(f, i)->len;
            free_units += n;
            nr_free++;
        } else if (!n) {
            FAIL("unit %u starts neither a block nor a free range", u);
        }
        if ((uint64_t)u + n > f->nr_units)
            FAIL("unit %u: %u units reach past the arena", u, n);
        for (uint32_t k = 0; k < n; k++)
            if ((k && (f->block_units[u + k] || f->range_first[u + k] ||
                       ((f->starts[(u + k) / 64] >> ((u + k) % 64)) & 1))) ||
                (k < n - 1 && f->range_last[u + k]))
                FAIL("unit %u inside the %s at unit %u is marked", u + k, i ? "range" : "block", u);
        if (!i && f->range_last[u + n - 1])
            FAIL("the block at unit %u ends where a free range is recorded", u);
        was_free = i != 0;
        u += n;
    }
    if (free_units << f->unit_shift != f->free_bytes)
        FAIL("free_bytes %llu, ranges hold %llu", (unsigned long long)f->free_bytes,
             (unsigned long long)(free_units << f->unit_shift));
    if (check_tree(f, f->root, 0, 0, f->nr_units, 0, &nr_tree, why, why_size))
        return -EFAULT;
    if (nr_tree != nr_free)
        FAIL("%u ranges in the tree, %u in the arena", nr_tree, nr_free);
    return 0;
}
