/* SPDX-License-Identifier: MIT */
/* Trace replay and grouping (see analysis.h). */
#include "analysis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "event.h"

static size_t hash_ptr(uint64_t p, size_t n)
{
    p ^= p >> 33;
    p *= 0xff51afd7ed558ccdull;
    p ^= p >> 33;
    return (size_t)p & (n - 1);
}

void live_set_init(struct live_set *s)
{
    s->nr_slots = 1024;
    s->nr_used = 0;
    s->slots = calloc(s->nr_slots, sizeof(*s->slots));
}

void live_set_free(struct live_set *s)
{
    free(s->slots);
    memset(s, 0, sizeof(*s));
}

static void grow(struct live_set *s)
{
    struct live_set n = {calloc(s->nr_slots * 2, sizeof(*s->slots)), s->nr_slots * 2, 0};
    for (size_t i = 0; i < s->nr_slots; i++)
        if (s->slots[i].ptr)
            live_set_put(&n, &s->slots[i]);
    free(s->slots);
    *s = n;
}

void live_set_put(struct live_set *s, const struct live_alloc *a)
{
    if ((s->nr_used + 1) * 2 > s->nr_slots)
        grow(s);
    size_t i = hash_ptr(a->ptr, s->nr_slots);
    while (s->slots[i].ptr && s->slots[i].ptr != a->ptr)
        i = (i + 1) & (s->nr_slots - 1);
    if (!s->slots[i].ptr)
        s->nr_used++;
    s->slots[i] = *a;
}

bool live_set_take(struct live_set *s, uint64_t ptr, struct live_alloc *ret)
{
    size_t mask = s->nr_slots - 1, i = hash_ptr(ptr, s->nr_slots);
    while (s->slots[i].ptr && s->slots[i].ptr != ptr)
        i = (i + 1) & mask;
    if (!s->slots[i].ptr)
        return false;
    if (ret)
        *ret = s->slots[i];
    /* backward-shift deletion */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; s->slots[j].ptr; j = (j + 1) & mask) {
        size_t home = hash_ptr(s->slots[j].ptr, s->nr_slots);
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            s->slots[hole] = s->slots[j];
            hole = j;
        }
    }
    memset(&s->slots[hole], 0, sizeof(s->slots[hole]));
    s->nr_used--;
    return true;
}

bool counts_as_device_memory(const struct cuheap_trace_event *e)
{
    return e->device >= 0 && e->api != CUHEAP_API_HOST && e->api != CUHEAP_API_VMM_MAP;
}

struct device_summary *summary_device(struct trace_summary *s, int device)
{
    for (unsigned i = 0; i < s->nr_dev; i++)
        if (s->dev[i].device == device)
            return &s->dev[i];
    if (s->nr_dev == CUHEAP_TRACE_NR_MAX_DEVICES)
        return NULL;
    struct device_summary *d = &s->dev[s->nr_dev++];
    memset(d, 0, sizeof(*d));
    d->device = device;
    return d;
}

void summarize(const struct cuheap_trace *t, struct trace_summary *s)
{
    memset(s, 0, sizeof(*s));
    struct cuheap_trace_iter it;
    size_t i = 0;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it), i++) {
        if (e->t > s->duration_ns)
            s->duration_ns = e->t;
        if (e->api < 16 && e->type == CUHEAP_EV_ALLOC)
            s->api_count[e->api]++;
        if (e->type == CUHEAP_EV_MARK) {
            s->nr_marks++;
            continue;
        }
        if (e->type == CUHEAP_EV_ALLOC && e->api == CUHEAP_API_HOST) {
            s->nr_host_allocs++;
            s->host_bytes += e->size;
            continue;
        }
        if (e->device < 0)
            continue;
        struct device_summary *d = summary_device(s, e->device);
        if (!d)
            continue;
        bool mem = counts_as_device_memory(e);
        switch (e->type) {
        case CUHEAP_EV_ALLOC:
            if (!mem)
                break;
            d->nr_allocs++;
            d->bytes_allocated += e->size;
            d->nr_pooled += e->pooled;
            d->live += e->size;
            if (!e->pooled)
                d->reserved += e->actual;
            if (d->live > d->peak_live) {
                d->peak_live = d->live;
                d->peak_live_t = e->t;
                d->peak_live_index = i;
            }
            break;
        case CUHEAP_EV_FREE:
            if (!mem)
                break;
            d->nr_frees++;
            d->live -= e->size < d->live ? e->size : d->live;
            if (!e->pooled)
                d->reserved -= e->actual < d->reserved ? e->actual : d->reserved;
            break;
        case CUHEAP_EV_ARENA_GROW:
            d->reserved += e->size;
            break;
        case CUHEAP_EV_ARENA_RELEASE:
            d->reserved -= e->size < d->reserved ? e->size : d->reserved;
            break;
        case CUHEAP_EV_OOM:
            d->nr_ooms++;
            break;
        case CUHEAP_EV_LIMIT:
            d->nr_limit++;
            break;
        default:
            break;
        }
        if (d->reserved > d->peak_reserved)
            d->peak_reserved = d->reserved;
    }
    cuheap_trace_iter_end(&it);
}

static int cmp_site(const void *a, const void *b)
{
    const struct site *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static void add_site(struct site **sites, size_t *nr, size_t *cap, uint32_t stack, uint64_t bytes)
{
    /* stacks are few compared with events: a linear index by stack id */
    for (size_t i = 0; i < *nr; i++)
        if ((*sites)[i].stack == stack) {
            (*sites)[i].bytes += bytes;
            (*sites)[i].count++;
            return;
        }
    if (*nr == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *sites = realloc(*sites, *cap * sizeof(**sites));
    }
    (*sites)[(*nr)++] = (struct site){stack, bytes, 1};
}

size_t collect_sites(const struct cuheap_trace *t, const struct trace_summary *s,
                     enum site_measure m, int device, struct site **ret)
{
    struct site *sites = NULL;
    size_t nr = 0, cap = 0;
    struct live_set live;
    live_set_init(&live);
    struct cuheap_trace_iter it;
    size_t i = 0;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it), i++) {
        if (!counts_as_device_memory(e) || (device >= 0 && e->device != device))
            continue;
        if (e->type == CUHEAP_EV_ALLOC) {
            if (m == SITES_TOTAL) {
                add_site(&sites, &nr, &cap, e->stack, e->size);
                continue;
            }
            struct live_alloc a = {e->ptr,   e->size,   e->actual, e->t,
                                   e->stack, e->device, e->api,    e->pooled};
            live_set_put(&live, &a);
        } else if (e->type == CUHEAP_EV_FREE && m != SITES_TOTAL) {
            live_set_take(&live, e->ptr, NULL);
        } else {
            continue;
        }
        if (m == SITES_AT_PEAK) {
            /* Snapshot each device's live set at its own peak event. */
            for (unsigned d = 0; d < s->nr_dev; d++)
                if (s->dev[d].device == e->device && s->dev[d].peak_live_index == i &&
                    s->dev[d].peak_live)
                    for (size_t k = 0; k < live.nr_slots; k++)
                        if (live.slots[k].ptr && live.slots[k].device == e->device)
                            add_site(&sites, &nr, &cap, live.slots[k].stack, live.slots[k].size);
        }
    }
    cuheap_trace_iter_end(&it);
    if (m == SITES_LEAKED)
        for (size_t k = 0; k < live.nr_slots; k++)
            if (live.slots[k].ptr)
                add_site(&sites, &nr, &cap, live.slots[k].stack, live.slots[k].size);
    live_set_free(&live);
    if (nr) /* qsort on NULL is undefined, even for no elements */
        qsort(sites, nr, sizeof(*sites), cmp_site);
    *ret = sites;
    return nr;
}

const char *human_bytes(uint64_t v, char *buf, size_t size)
{
    return cuheap_format_size(v, buf, size);
}
