/* SPDX-License-Identifier: MIT */
/* Trace replay and grouping (see analysis.h). */
#include "analysis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "event.h"
#include "stepplan.h"

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

static size_t hash_site(uint32_t stack, int16_t device, size_t n)
{
    return hash_ptr(((uint64_t)(uint16_t)device << 32) | stack, n);
}

static struct site_acc *site_of(struct trace_summary *s, uint32_t stack, int16_t device)
{
    if (s->nr_sites * 2 >= s->nr_index_slots) { /* grow the index, and place every site again */
        size_t n = s->nr_index_slots ? s->nr_index_slots * 2 : 1024;
        uint32_t *index = calloc(n, sizeof(*index));
        if (!index)
            abort(); /* the tool, not the host program */
        for (size_t k = 0; k < s->nr_sites; k++) {
            size_t h = hash_site(s->sites[k].stack, s->sites[k].device, n);
            while (index[h])
                h = (h + 1) & (n - 1);
            index[h] = (uint32_t)(k + 1);
        }
        free(s->site_index);
        s->site_index = index;
        s->nr_index_slots = n;
    }
    size_t h = hash_site(stack, device, s->nr_index_slots);
    for (; s->site_index[h]; h = (h + 1) & (s->nr_index_slots - 1)) {
        struct site_acc *a = &s->sites[s->site_index[h] - 1];
        if (a->stack == stack && a->device == device)
            return a;
    }
    if (s->nr_sites == s->cap_sites) {
        s->cap_sites = s->cap_sites ? s->cap_sites * 2 : 256;
        struct site_acc *grown = realloc(s->sites, s->cap_sites * sizeof(*grown));
        if (!grown)
            abort();
        s->sites = grown;
    }
    struct site_acc *a = &s->sites[s->nr_sites++];
    memset(a, 0, sizeof(*a));
    a->stack = stack;
    a->device = device;
    s->site_index[h] = (uint32_t)s->nr_sites;
    return a;
}

/* Before a site's first change since its device's latest peak, keep its value there. */
static void touch(struct site_acc *a, const struct device_summary *d)
{
    if (a->version != d->peak_version) {
        a->saved = a->live;
        a->nr_saved = a->nr_live;
        a->version = d->peak_version;
    }
}

/* The allocation at ptr is gone: its site's bytes go down. Returns whether it was live. */
static bool forget(struct trace_summary *s, struct live_set *live, uint64_t ptr)
{
    struct live_alloc old;
    if (!live_set_take(live, ptr, &old))
        return false;
    struct device_summary *d = summary_device(s, old.device);
    struct site_acc *a = site_of(s, old.stack, old.device);
    if (d)
        touch(a, d);
    if (s->nr_changed < 2)
        s->changed[s->nr_changed++] = (uint32_t)(a - s->sites);
    a->live -= old.size < a->live ? old.size : a->live;
    a->nr_live -= a->nr_live ? 1 : 0;
    return true;
}

void summary_free(struct trace_summary *s)
{
    free(s->sites);
    free(s->site_index);
    s->sites = NULL;
    s->site_index = NULL;
    s->nr_sites = s->cap_sites = s->nr_index_slots = 0;
}

void summarize_begin(struct trace_summary *s)
{
    memset(s, 0, sizeof(*s));
    live_set_init(&s->live);
}

void summarize_event(struct trace_summary *s, const struct cuheap_trace_event *e)
{
    size_t i = s->nr_seen++;
    struct live_set *live = &s->live;
    s->nr_changed = 0;
    if (e->t > s->duration_ns)
        s->duration_ns = e->t;
    if (e->api < 16 && e->type == CUHEAP_EV_ALLOC)
        s->api_count[e->api]++;
    if (e->type == CUHEAP_EV_MARK) {
        s->nr_marks++;
        return;
    }
    if (e->type == CUHEAP_EV_ALLOC && e->api == CUHEAP_API_HOST) {
        s->nr_host_allocs++;
        s->host_bytes += e->size;
        return;
    }
    if (e->device < 0)
        return;
    struct device_summary *d = summary_device(s, e->device);
    if (!d)
        return;
    bool mem = counts_as_device_memory(e);
    switch (e->type) {
    case CUHEAP_EV_ALLOC: {
        if (!mem)
            break;
        d->nr_allocs++;
        d->bytes_allocated += e->size;
        d->nr_pooled += e->pooled;
        d->live += e->size;
        if (!e->pooled)
            d->reserved += e->actual;
        forget(s, live, e->ptr); /* its free was lost: it is gone now */
        struct site_acc *a = site_of(s, e->stack, e->device);
        touch(a, d);
        s->changed[s->nr_changed++] = (uint32_t)(a - s->sites);
        a->live += e->size;
        a->nr_live++;
        a->total += e->size;
        a->nr_total++;
        struct live_alloc la = {
            .ptr = e->ptr, .size = e->size, .stack = e->stack, .device = e->device};
        live_set_put(live, &la);
        if (d->live > d->peak_live) {
            d->peak_live = d->live;
            d->peak_live_t = e->t;
            d->peak_live_index = i;
            d->peak_version++; /* every site's value now is its value at the peak */
        }
        break;
    }
    case CUHEAP_EV_FREE:
        if (!mem)
            break;
        d->nr_frees++;
        /* a free of a block the trace never had (allocated while recording was paused) takes
         * nothing from live: what the exit summary counts, and the sites' sum */
        if (forget(s, live, e->ptr))
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

void summarize_end(struct trace_summary *s)
{
    live_set_free(&s->live);
}

void summarize(const struct cuheap_trace *t, struct trace_summary *s)
{
    summarize_begin(s);
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it))
        summarize_event(s, e);
    cuheap_trace_iter_end(&it);
    summarize_end(s);
}

static int cmp_site(const void *a, const void *b)
{
    const struct site *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static void add_site(struct site **sites, size_t *nr, size_t *cap, uint32_t stack, uint64_t bytes,
                     uint64_t count)
{
    if (*nr == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        struct site *grown = realloc(*sites, *cap * sizeof(**sites));
        if (!grown)
            abort(); /* the tool, not the host program */
        *sites = grown;
    }
    (*sites)[(*nr)++] = (struct site){stack, bytes, count};
}

static int cmp_stack_id(const void *a, const void *b)
{
    const struct site *x = a, *y = b;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

size_t collect_sites(const struct cuheap_trace *t, const struct trace_summary *s,
                     enum site_measure m, int device, struct site **ret)
{
    (void)t;
    struct site *sites = NULL;
    size_t nr = 0, cap = 0;
    for (size_t k = 0; k < s->nr_sites; k++) {
        const struct site_acc *a = &s->sites[k];
        if (device >= 0 && a->device != device)
            continue;
        uint64_t bytes = 0, count = 0;
        if (m == SITES_TOTAL) {
            bytes = a->total;
            count = a->nr_total;
        } else if (m == SITES_LEAKED) {
            bytes = a->live;
            count = a->nr_live;
        } else {
            const struct device_summary *d = NULL;
            for (unsigned i = 0; i < s->nr_dev; i++)
                if (s->dev[i].device == a->device)
                    d = &s->dev[i];
            if (!d || !d->peak_live)
                continue;
            bool changed = a->version == d->peak_version; /* since the peak */
            bytes = changed ? a->saved : a->live;
            count = changed ? a->nr_saved : a->nr_live;
        }
        if (count)
            add_site(&sites, &nr, &cap, a->stack, bytes, count);
    }
    if (device < 0 && nr) { /* one stack on several devices: one site (sorting, not searching:
                               Python programs have tens of thousands of stacks) */
        qsort(sites, nr, sizeof(*sites), cmp_stack_id);
        size_t out = 0;
        for (size_t k = 0; k < nr; k++) {
            if (out && sites[out - 1].stack == sites[k].stack) {
                sites[out - 1].bytes += sites[k].bytes;
                sites[out - 1].count += sites[k].count;
            } else {
                sites[out++] = sites[k];
            }
        }
        nr = out;
    }
    if (nr) /* qsort on NULL is undefined, even for no elements */
        qsort(sites, nr, sizeof(*sites), cmp_site);
    *ret = sites;
    return nr;
}

const char *human_bytes(uint64_t v, char *buf, size_t size)
{
    return cuheap_format_size(v, buf, size);
}

const char *count_of(uint64_t n, const char *one, const char *many, char *buf, size_t size)
{
    snprintf(buf, size, "%" PRIu64 " %s", n, n == 1 ? one : many);
    return buf;
}

const char *ordinal(uint64_t n, char *buf, size_t size)
{
    static const char *const ends[] = {"th", "st", "nd", "rd"};
    unsigned last = (unsigned)(n % 10), teen = (unsigned)(n % 100) / 10 == 1;
    snprintf(buf, size, "%" PRIu64 "%s", n, !teen && last <= 3 ? ends[last] : "th");
    return buf;
}

/* ---- the out-of-memory the shim told (oom_report lines) ---- */

static uint64_t report_bytes(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (json_is_string(v)) /* 2^63 and above */
        return strtoull(json_string_value(v), NULL, 16);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

void print_oom_report(const struct cuheap_trace *t, int device)
{
    json_t *first = NULL, *o;
    size_t i;
    json_array_foreach(t->oom_reports, i, o)
    {
        if (!first && json_integer_value(json_object_get(o, "device")) == device)
            first = o;
    }
    if (!first)
        return;
    char a[32], b[32], c[32], d[32];
    json_t *api = json_object_get(first, "api"), *pool = json_object_get(first, "pool");
    printf("    first at %.3f s: %s of %s; live %s, cuheap held %s, largest free piece %s\n",
           (double)report_bytes(first, "t") / 1e9,
           json_is_string(api) ? json_string_value(api) : "?",
           human_bytes(report_bytes(first, "size"), a, sizeof(a)),
           human_bytes(report_bytes(first, "live"), b, sizeof(b)),
           human_bytes(report_bytes(first, "held"), c, sizeof(c)),
           json_is_false(pool) ? "(no pool)"
                               : human_bytes(report_bytes(first, "largest_free"), d, sizeof(d)));
    json_t *at = json_object_get(first, "at");
    if (json_is_string(at))
        printf("    asked for at %s\n", json_string_value(at));
    json_t *sites = json_object_get(first, "sites"), *s;
    json_array_foreach(sites, i, s)
    {
        char name[512];
        uint64_t id = report_bytes(s, "stack"), blocks = report_bytes(s, "blocks");
        const char *frame = json_string_value(json_object_get(s, "frame"));
        if (cuheap_trace_stack(t, (uint32_t)id) || !frame)
            cuheap_trace_site(t, (uint32_t)id, name, sizeof(name));
        else
            snprintf(name, sizeof(name), "%s", frame);
        printf("    %s %10s in %" PRIu64 " block%s  %s\n", i ? "            " : "held most by",
               human_bytes(report_bytes(s, "bytes"), a, sizeof(a)), blocks, blocks == 1 ? " " : "s",
               name);
    }
    if (!json_is_true(json_object_get(first, "complete")))
        printf("    (the trace lost events before it: those call sites may be off)\n");
}

/* A device's allocations in trace order: size, event index of the allocation and of its free
 * (UINT64_MAX: never freed). */
struct step_alloc {
    uint64_t size, at, freed;
};

#define STEP_PLAN_MAX 16384

static bool grow_allocs(struct step_alloc **v, size_t *cap, size_t nr)
{
    if (nr < *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 4096;
    struct step_alloc *n = realloc(*v, c * sizeof(*n));
    if (!n)
        return false;
    *v = n;
    *cap = c;
    return true;
}

/* A change of live bytes at an event, for the sweep over the step. */
struct step_change {
    uint64_t at;
    uint64_t bytes;
    bool up, planned;
};

static int by_at(const void *x, const void *y)
{
    const struct step_change *a = x, *b = y;
    if (a->at != b->at)
        return a->at < b->at ? -1 : 1;
    return (int)a->up - (int)b->up; /* a free before an allocation at the same event */
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

bool estimate_step(const struct cuheap_trace *t, int device, struct step_estimate *ret)
{
    memset(ret, 0, sizeof(*ret));
    struct step_alloc *v = NULL;
    size_t nr = 0, cap = 0, idx = 0;
    struct live_set live;
    live_set_init(&live);
    bool ok = true;
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e && ok;
         e = cuheap_trace_next(&it), idx++) {
        if (e->device != device || !counts_as_device_memory(e))
            continue;
        struct live_alloc a;
        if (e->type == CUHEAP_EV_ALLOC) {
            if (!(ok = grow_allocs(&v, &cap, nr)))
                break;
            if (live_set_take(&live, e->ptr, &a)) /* its free was lost: gone by now */
                v[a.t].freed = idx;
            v[nr] = (struct step_alloc){e->size, idx, UINT64_MAX};
            live_set_put(&live, &(struct live_alloc){.ptr = e->ptr, .t = nr});
            nr++;
        } else if (e->type == CUHEAP_EV_FREE && live_set_take(&live, e->ptr, &a)) {
            v[a.t].freed = idx;
        }
    }
    ok = ok && !it.failed;
    cuheap_trace_iter_end(&it);
    live_set_free(&live);
    uint64_t *keys = ok ? malloc((nr ? nr : 1) * sizeof(*keys)) : NULL;
    ok = ok && keys;
    for (size_t i = 0; ok && i < nr; i++)
        keys[i] = v[i].size;
    size_t p = ok ? cuheap_step_period(keys, nr) : 0;
    free(keys);
    if (!ok || !p) {
        free(v);
        return ok;
    }
    if (p > STEP_PLAN_MAX) { /* placing is quadratic in a step's blocks: said, not planned */
        free(v);
        ret->period = p;
        return true;
    }
    size_t k0 = nr / 2; /* p <= nr / 4: the step and the allocation after it are in the trace */
    uint64_t t0 = v[k0].at, period = v[k0 + p].at - t0, t1 = t0 + period;
    struct cuheap_step_block *b = calloc(p, sizeof(*b));
    struct step_change *ch = malloc(2 * nr * sizeof(*ch));
    size_t nb = 0, nc = 0;
    ok = b && ch;
    /* Planned: the step's blocks that live less than a step (the ones before the step that
     * are freed in it are the same blocks one step earlier). The rest live beside the plan. */
    for (size_t k = 0; ok && k < nr; k++) {
        uint64_t a = v[k].at, f = v[k].freed;
        if (a >= t1 || f < t0 || v[k].size >= 1ull << 46)
            continue;
        bool shorter = f != UINT64_MAX && f - a < period;
        bool planned = shorter && k >= k0 && k < k0 + p;
        if (planned)
            b[nb++] = (struct cuheap_step_block){.size = v[k].size, .start = a - t0, .end = f - t0};
        ch[nc++] = (struct step_change){a < t0 ? t0 : a, v[k].size, true, shorter};
        if (f < t1)
            ch[nc++] = (struct step_change){f, v[k].size, false, shorter};
    }
    uint64_t region = ok ? cuheap_step_plan(b, nb, period, 2ull << 20) : UINT64_MAX;
    if (region != UINT64_MAX) {
        qsort(ch, nc, sizeof(*ch), by_at);
        uint64_t all = 0, beside = 0;
        for (size_t i = 0; i < nc; i++) {
            uint64_t *sum[2] = {&all, ch[i].planned ? NULL : &beside};
            for (int j = 0; j < 2; j++)
                if (sum[j])
                    *sum[j] = ch[i].up ? add_sat(*sum[j], ch[i].bytes)
                                       : *sum[j] - (ch[i].bytes < *sum[j] ? ch[i].bytes : *sum[j]);
            if (all > ret->peak_live)
                ret->peak_live = all;
            if (beside > ret->outside)
                ret->outside = beside;
        }
        ret->region = region;
        ret->nr_planned = nb;
        ret->period = p;
    }
    free(ch);
    free(b);
    free(v);
    return region != UINT64_MAX;
}
