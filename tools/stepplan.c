/* SPDX-License-Identifier: MIT */
#include "stepplan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

size_t cuheap_step_period_work(size_t n)
{
    size_t nu = (n - n / 2) + (n - n / 4);
    return nu * (sizeof(uint64_t) + sizeof(size_t));
}

size_t cuheap_step_period(const uint64_t *keys, size_t n)
{
    if (n < 4)
        return 0;
    void *work = malloc(cuheap_step_period_work(n));
    size_t p = work ? cuheap_step_period_in(keys, n, work) : 0;
    free(work);
    return p;
}

size_t cuheap_step_period_in(const uint64_t *keys, size_t n, void *work)
{
    /* For every p at once, how far keys from the middle on match the keys p before them: the
     * Z-function of the middle's suffix followed by keys from n/4 on (linear; trying each p
     * in turn was quadratic on a trace of one size with one odd allocation). */
    size_t mid = n / 2, len = n - mid, from = n / 4, nu = len + (n - from);
    if (n < 4)
        return 0;
    uint64_t *u = work;
    size_t *z = (size_t *)(u + nu);
    memset(z, 0, nu * sizeof(*z));
    memcpy(u, keys + mid, len * sizeof(*u));
    memcpy(u + len, keys + from, (n - from) * sizeof(*u));
    for (size_t i = 1, l = 0, r = 0; i < nu; i++) {
        size_t k = i < r ? (z[i - l] < r - i ? z[i - l] : r - i) : 0;
        while (i + k < nu && u[k] == u[i + k])
            k++;
        z[i] = k;
        if (i + k > r) {
            l = i;
            r = i + k;
        }
    }
    size_t found = 0;
    for (size_t p = 1; p <= n / 4 && !found; p++) {
        size_t run = z[len + (mid - from) - p];
        run = run < len ? run : len;
        /* the run must reach a quarter of the trace past the middle, not just two periods: a
         * layer repeating inside the step matches a few times, then breaks at the step's edge */
        size_t need = 2 * p > n / 4 ? 2 * p : n / 4;
        if (run >= need)
            found = p;
    }
    return found;
}

/* A block's life as up to two pieces of [0, period). */
struct span {
    uint64_t a[2], b[2];
    int nr;
};

static struct span span_of(const struct cuheap_step_block *x, uint64_t period)
{
    struct span s = {{x->start, 0}, {x->end, 0}, 1};
    if (x->end > period) {
        s.b[0] = period;
        s.a[1] = 0;
        s.b[1] = x->end - period;
        s.nr = 2;
    }
    return s;
}

static bool spans_meet(const struct span *s, const struct span *t)
{
    for (int i = 0; i < s->nr; i++)
        for (int j = 0; j < t->nr; j++)
            if (s->a[i] < t->b[j] && t->a[j] < s->b[i])
                return true;
    return false;
}

struct placed {
    uint64_t lo, hi; /* bytes taken */
};

struct ranked {
    uint64_t size;
    size_t i;
};

/* Largest first; the step's order among equals, so that one step always gives one plan. */
static bool ranked_before(const struct ranked *p, const struct ranked *q)
{
    return p->size != q->size ? p->size > q->size : p->i < q->i;
}

/* Heap sorts of our own: the _in variants call no malloc, and qsort may. */
static void sift_ranked(struct ranked *a, size_t i, size_t n)
{
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && ranked_before(&a[c], &a[c + 1]))
            c++;
        if (!ranked_before(&a[i], &a[c]))
            return;
        struct ranked t = a[i];
        a[i] = a[c];
        a[c] = t;
    }
}

static void sort_ranked(struct ranked *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_ranked(a, i, n);
    for (size_t k = n; k-- > 1;) {
        struct ranked t = a[0];
        a[0] = a[k];
        a[k] = t;
        sift_ranked(a, 0, k);
    }
}

static void sift_placed(struct placed *a, size_t i, size_t n)
{
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && a[c].lo < a[c + 1].lo)
            c++;
        if (a[i].lo >= a[c].lo)
            return;
        struct placed t = a[i];
        a[i] = a[c];
        a[c] = t;
    }
}

static void sort_placed(struct placed *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_placed(a, i, n);
    for (size_t k = n; k-- > 1;) {
        struct placed t = a[0];
        a[0] = a[k];
        a[k] = t;
        sift_placed(a, 0, k);
    }
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* What a block takes: its size rounded up to its alignment. */
static uint64_t taken(const struct cuheap_step_block *b, uint64_t granule, uint64_t *ret_align)
{
    uint64_t al = b->size >= granule ? granule : 512;
    if (ret_align)
        *ret_align = al;
    return align_up(b->size ? b->size : 1, al);
}

size_t cuheap_step_plan_work(size_t n)
{
    n = n ? n : 1;
    return n * (sizeof(struct ranked) + sizeof(struct span) + sizeof(struct placed) + sizeof(bool));
}

uint64_t cuheap_step_plan(struct cuheap_step_block *blocks, size_t n, uint64_t period,
                          uint64_t granule)
{
    void *work = malloc(cuheap_step_plan_work(n));
    uint64_t region = work ? cuheap_step_plan_in(blocks, n, period, granule, work) : UINT64_MAX;
    free(work);
    return region;
}

uint64_t cuheap_step_plan_in(struct cuheap_step_block *blocks, size_t n, uint64_t period,
                             uint64_t granule, void *work)
{
    for (size_t i = 0; i < n; i++)
        if (blocks[i].size >= 1ull << 46 ||
            (blocks[i].fixed ? blocks[i].offset >= 1ull << 46
                             : blocks[i].start >= period || blocks[i].end <= blocks[i].start ||
                                   blocks[i].end - blocks[i].start >= period))
            return UINT64_MAX;
    size_t m = n ? n : 1;
    struct ranked *order = work;
    struct span *spans = (struct span *)(order + m);
    struct placed *busy = (struct placed *)(spans + m);
    bool *done = (bool *)(busy + m);
    memset(done, 0, m * sizeof(*done));
    size_t nr_free = 0;
    uint64_t region = 0;
    for (size_t i = 0; i < n; i++) {
        if (blocks[i].fixed) { /* lives the whole step, where it is */
            spans[i] = (struct span){{0, 0}, {period, 0}, 1};
            done[i] = true;
            uint64_t end = blocks[i].offset + taken(&blocks[i], granule, NULL);
            region = end > region ? end : region;
            continue;
        }
        order[nr_free++] = (struct ranked){blocks[i].size, i};
        spans[i] = span_of(&blocks[i], period);
    }
    sort_ranked(order, nr_free);
    for (size_t k = 0; k < nr_free; k++) {
        size_t i = order[k].i;
        uint64_t al, len = taken(&blocks[i], granule, &al);
        size_t nr = 0; /* the bytes of placed blocks that live while this one does */
        for (size_t j = 0; j < n; j++)
            if (done[j] && spans_meet(&spans[i], &spans[j]))
                busy[nr++] = (struct placed){blocks[j].offset,
                                             blocks[j].offset + taken(&blocks[j], granule, NULL)};
        sort_placed(busy, nr);
        uint64_t off = 0;
        for (size_t j = 0; j < nr && busy[j].lo < off + len; j++)
            if (busy[j].hi > off)
                off = align_up(busy[j].hi, al);
        blocks[i].offset = off;
        done[i] = true;
        if (off + len > region)
            region = off + len;
    }
    return region;
}
