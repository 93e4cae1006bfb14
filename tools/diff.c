/* SPDX-License-Identifier: MIT */
/*
 * `cuheap diff A B`: what changed between two runs, the question after every change to a
 * program: per GPU the peak live and reserved bytes, fragmentation, allocations and OOMs; the
 * call sites by bytes live at the peak; leaks that appeared or went away. Call sites are
 * matched by their name (cuheap_trace_site), as stack ids differ from run to run.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "diff.h"

struct named {
    char name[700];
    uint64_t bytes[2]; /* in A, in B */
};

struct named_set {
    struct named *v;
    size_t nr, cap;
};

/* Append; merge() later joins equal names (sorting, not searching: a Python program has tens
 * of thousands of stacks). */
static void add(struct named_set *s, const char *name, int side, uint64_t bytes)
{
    if (s->nr == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 32;
        struct named *v = realloc(s->v, s->cap * sizeof(*v));
        if (!v)
            abort(); /* the tool, not the host program */
        s->v = v;
    }
    struct named *n = &s->v[s->nr++];
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "%s", name);
    n->bytes[side] = bytes;
}

static void add_sites(struct named_set *s, const struct cuheap_trace *t,
                      const struct trace_summary *sum, enum site_measure m, int device, int side)
{
    struct site *sites;
    size_t nr = collect_sites(t, sum, m, device, &sites);
    char name[700];
    for (size_t i = 0; i < nr; i++)
        add(s, cuheap_trace_site(t, sites[i].stack, name, sizeof(name)), side, sites[i].bytes);
    free(sites);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

static void merge(struct named_set *s)
{
    if (!s->nr)
        return;
    qsort(s->v, s->nr, sizeof(*s->v), cmp_name);
    size_t out = 0;
    for (size_t i = 0; i < s->nr; i++) {
        if (out && !strcmp(s->v[out - 1].name, s->v[i].name)) {
            s->v[out - 1].bytes[0] += s->v[i].bytes[0];
            s->v[out - 1].bytes[1] += s->v[i].bytes[1];
        } else {
            s->v[out++] = s->v[i];
        }
    }
    s->nr = out;
}

static uint64_t delta_abs(const struct named *n)
{
    return n->bytes[1] > n->bytes[0] ? n->bytes[1] - n->bytes[0] : n->bytes[0] - n->bytes[1];
}

static int cmp_change(const void *a, const void *b)
{
    uint64_t x = delta_abs(a), y = delta_abs(b);
    if (x != y)
        return x > y ? -1 : 1;
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* "+3.50 MiB (+11.1%)", "-1.00 KiB", "0" */
static const char *change(uint64_t a, uint64_t b, char *buf, size_t size)
{
    char h[32];
    if (a == b)
        return snprintf(buf, size, "0"), buf;
    human_bytes(b > a ? b - a : a - b, h, sizeof(h));
    if (a)
        snprintf(buf, size, "%c%s (%+.1f%%)", b > a ? '+' : '-', h,
                 ((double)b - (double)a) * 100.0 / (double)a);
    else
        snprintf(buf, size, "+%s (new)", h);
    return buf;
}

static void row_bytes(const char *what, uint64_t a, uint64_t b)
{
    char x[32], y[32], c[64];
    printf("  %-16s %12s %12s   %s\n", what, human_bytes(a, x, sizeof(x)),
           human_bytes(b, y, sizeof(y)), change(a, b, c, sizeof(c)));
}

static void row_count(const char *what, uint64_t a, uint64_t b)
{
    printf("  %-16s %12" PRIu64 " %12" PRIu64 "   %+" PRId64 "\n", what, a, b, (int64_t)(b - a));
}

static const struct device_summary *find_device(const struct trace_summary *s, int device)
{
    for (unsigned i = 0; i < s->nr_dev; i++)
        if (s->dev[i].device == device)
            return &s->dev[i];
    return NULL;
}

static void print_sites(struct named_set *s, size_t limit)
{
    char x[32], y[32], c[64];
    size_t shown = 0;
    if (s->nr)
        qsort(s->v, s->nr, sizeof(*s->v), cmp_change);
    for (size_t i = 0; i < s->nr && shown < limit; i++) {
        const struct named *n = &s->v[i];
        if (n->bytes[0] == n->bytes[1])
            continue;
        printf("  %12s %12s   %-22s %s\n", human_bytes(n->bytes[0], x, sizeof(x)),
               human_bytes(n->bytes[1], y, sizeof(y)),
               change(n->bytes[0], n->bytes[1], c, sizeof(c)), n->name);
        shown++;
    }
    if (!shown)
        printf("  (no change)\n");
}

void diff_traces(const struct cuheap_trace *a, const struct cuheap_trace *b,
                 struct trace_summary *s, size_t limit)
{
    const struct cuheap_trace *t[2] = {a, b};
    printf("A: %s (pid %ld, %.3f s, %zu events)\nB: %s (pid %ld, %.3f s, %zu events)\n", a->path,
           a->pid, (double)s[0].duration_ns / 1e9, a->nr_events, b->path, b->pid,
           (double)s[1].duration_ns / 1e9, b->nr_events);
    /* every GPU either run used, in order */
    int devices[2 * CUHEAP_TRACE_NR_MAX_DEVICES], nr_devices = 0;
    for (int side = 0; side < 2; side++)
        for (unsigned i = 0; i < s[side].nr_dev; i++) {
            int d = s[side].dev[i].device, k = 0;
            while (k < nr_devices && devices[k] != d)
                k++;
            if (k == nr_devices)
                devices[nr_devices++] = d;
        }
    for (int i = 1; i < nr_devices; i++)
        for (int k = i; k > 0 && devices[k] < devices[k - 1]; k--) {
            int tmp = devices[k];
            devices[k] = devices[k - 1];
            devices[k - 1] = tmp;
        }
    static const struct device_summary none;
    for (int i = 0; i < nr_devices; i++) {
        const struct device_summary *da = find_device(&s[0], devices[i]);
        const struct device_summary *db = find_device(&s[1], devices[i]);
        da = da ? da : &none;
        db = db ? db : &none;
        printf("\nGPU %d %27s %12s   change\n", devices[i], "A", "B");
        row_bytes("peak live", da->peak_live, db->peak_live);
        row_bytes("peak reserved", da->peak_reserved, db->peak_reserved);
        double fa = da->peak_live ? (double)da->peak_reserved / (double)da->peak_live : 0;
        double fb = db->peak_live ? (double)db->peak_reserved / (double)db->peak_live : 0;
        printf("  %-16s %12.2f %12.2f   %+.2f\n", "fragmentation", fa, fb, fb - fa);
        row_count("allocations", da->nr_allocs, db->nr_allocs);
        row_bytes("allocated", da->bytes_allocated, db->bytes_allocated);
        /* answers the program recovered from are not out of memory (as report counts them) */
        uint64_t oa = da->nr_ooms + da->nr_limit, ob = db->nr_ooms + db->nr_limit;
        uint64_t ra = cuheap_trace_recovered(t[0], devices[i]);
        uint64_t rb = cuheap_trace_recovered(t[1], devices[i]);
        row_count("out of memory", oa - (ra < oa ? ra : oa), ob - (rb < ob ? rb : ob));
        row_bytes("live at the end", da->live, db->live);
        struct named_set sites = {0};
        for (int side = 0; side < 2; side++)
            add_sites(&sites, t[side], &s[side], SITES_AT_PEAK, devices[i], side);
        merge(&sites);
        printf("\n  live at the peak, by call site (largest changes first):\n"
               "  %12s %12s   %-22s %s\n",
               "A", "B", "change", "call site");
        print_sites(&sites, limit);
        free(sites.v);
    }
    struct named_set leaks = {0};
    for (int side = 0; side < 2; side++)
        add_sites(&leaks, t[side], &s[side], SITES_LEAKED, -1, side);
    merge(&leaks);
    size_t nr_new = 0, nr_gone = 0;
    for (size_t i = 0; i < leaks.nr; i++) {
        nr_new += !leaks.v[i].bytes[0] && leaks.v[i].bytes[1];
        nr_gone += leaks.v[i].bytes[0] && !leaks.v[i].bytes[1];
    }
    printf("\nnever freed, by call site: %zu new in B, %zu gone\n"
           "  %12s %12s   %-22s %s\n",
           nr_new, nr_gone, "A", "B", "change", "call site");
    print_sites(&leaks, limit);
    free(leaks.v);
    summary_free(&s[0]);
    summary_free(&s[1]);
}
