/* SPDX-License-Identifier: MIT */
/*
 * `cuheap html`: one self-contained HTML file (inline style and script, nothing fetched) with,
 * per process and GPU, a memory timeline (live and reserved bytes as step plots, the largest
 * call sites at the peak as stacked areas, cuheap_mark/NVTX markers, OOMs and limit
 * refusals marked with what was live then; hover for values and stacks, drag to zoom), the
 * summary figures, and tables of the call sites at the peak, what was never freed and the
 * out-of-memory events. Several traces (ranks) share one time axis, aligned on their start.
 *
 * The curves go to the page as fixed time buckets holding each bucket's minimum, maximum and
 * last value, so a long trace keeps its spikes at any zoom: the page draws every pixel
 * column from min to max. They are kept at two resolutions: NR_BUCKETS over the whole run
 * (with the top call sites), and NR_FINE_PER times finer (only buckets that had events go to
 * the page), which a zoom draws once the coarse buckets grow wider than a pixel column: a
 * window then shows its own extremes and cycles, not its buckets'. Markers are thinned
 * evenly past NR_MAX_MARKS (every second one kept, then every fourth, ...), so every window of
 * a long run keeps some; the page draws what fits and says how many it does not.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "export.h"
#include "ranks.h"

#define NR_BUCKETS   3000 /* per GPU: a few times a screen's width */
#define NR_FINE_PER  16   /* fine buckets per bucket: zooms of up to 16x more stay exact */
#define NR_FINE      (NR_BUCKETS * NR_FINE_PER)
#define NR_TOP_SITES 6     /* call sites drawn as stacked areas */
#define NR_MAX_MARKS 16384 /* markers sent to the page, thinned evenly past it */
#define NR_OOM_ROWS  200
#define NR_FRAMES    24

/* Trace text (paths, frames, the command) as HTML text or a quoted attribute's value: no tag,
 * comment or entity of its own, whichever quote the attribute uses. */
static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&#39;", f);
            break;
        default:
            fputc(*s, f);
            break;
        }
    }
}

/* jansson's output inside <script>: the HTML tokenizer reads no JSON, so a string holding
 * "</script" would end the element and one holding "<!--" then "<script" would keep the real end
 * tag from ending it (the page's code is swallowed and the charts stay empty). Outside strings
 * jansson writes no '<', '>' or '&', so each can become its \u escape wherever it is. */
static int script_safe(const char *buf, size_t size, void *data)
{
    FILE *f = data;
    size_t from = 0;
    for (size_t i = 0; i < size; i++) {
        const char *rep = buf[i] == '<'   ? "\\u003c"
                          : buf[i] == '>' ? "\\u003e"
                          : buf[i] == '&' ? "\\u0026"
                                          : NULL;
        if (!rep)
            continue;
        fwrite(buf + from, 1, i - from, f);
        fputs(rep, f);
        from = i + 1;
    }
    fwrite(buf + from, 1, size - from, f);
    return ferror(f) ? -1 : 0;
}

/* A JSON string even for text that is not UTF-8 (a label, a path): bad bytes become '?'. */
static json_t *text(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return json_string("?");
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

/* A byte count for the page: JavaScript numbers hold any uint64 roughly, int64 not at all
 * past 2^63 (an OOM for SIZE_MAX bytes). */
static json_t *jbytes(uint64_t v)
{
    return v > INT64_MAX ? json_real((double)v) : json_integer((json_int_t)v);
}

static json_t *stack_json(const struct cuheap_trace *t, uint32_t id)
{
    json_t *a = json_array();
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, id);
    char buf[700];
    for (size_t i = 0; s && i < NR_FRAMES && cuheap_trace_frame(s, i, buf, sizeof(buf)); i++)
        json_array_append_new(a, text(buf));
    return a;
}

static json_t *site_json(const struct cuheap_trace *t, uint32_t id)
{
    char name[700];
    return text(cuheap_trace_site(t, id, name, sizeof(name)));
}

struct curve {
    uint64_t latest_t; /* time of the latest event in it; UINT64_MAX: none yet */
    uint64_t live_min, live_max, live_last;
    uint64_t res_min, res_max, res_last;
};

struct bucket {
    struct curve c;
    uint64_t site[NR_TOP_SITES]; /* live bytes of each top site when the events left it */
};

/* An event into bucket b: live and res after it; before_* what held until then, since the
 * bucket's start (its first event), which its band covers too. */
static void note(struct curve *b, uint64_t t, uint64_t live, uint64_t res, uint64_t before_live,
                 uint64_t before_res)
{
    if (b->latest_t == UINT64_MAX) {
        b->live_min = b->live_max = before_live;
        b->res_min = b->res_max = before_res;
    }
    if (live < b->live_min)
        b->live_min = live;
    if (live > b->live_max)
        b->live_max = live;
    if (res < b->res_min)
        b->res_min = res;
    if (res > b->res_max)
        b->res_max = res;
    /* events come in seq order, which is not time order across threads: "last" is the
     * state after the event latest in time */
    if (b->latest_t == UINT64_MAX || t >= b->latest_t) {
        b->latest_t = t;
        b->live_last = live;
        b->res_last = res;
    }
}

static json_t *u64_array(const struct bucket *b, size_t n, size_t offset)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, jbytes(*(const uint64_t *)((const char *)&b[i].c + offset)));
    return a;
}

struct fine_sites {
    uint64_t v[NR_TOP_SITES]; /* the top sites' bytes when the events left the bucket */
    bool set;                 /* a group of the log: the events left it */
};

/* The fine buckets that had events, as parallel arrays (i: index; s: the top sites' bytes, per
 * site): the page carries each value forward over the buckets between, as device_json() does
 * for the coarse ones. A bucket whose events left no group (time went back) holds the sites'
 * bytes of the group before it. */
static json_t *fine_json(const struct curve *f, const struct fine_sites *fs, size_t nr_top)
{
    json_t *idx = json_array(), *v[6], *sv = json_array(), *sa[NR_TOP_SITES];
    for (size_t k = 0; k < 6; k++)
        v[k] = json_array();
    for (size_t k = 0; k < nr_top; k++)
        json_array_append_new(sv, sa[k] = json_array());
    static const uint64_t none[NR_TOP_SITES];
    const uint64_t *held = none;
    for (size_t i = 0; i < NR_FINE; i++) {
        if (fs[i].set)
            held = fs[i].v;
        if (f[i].latest_t == UINT64_MAX)
            continue;
        const uint64_t x[6] = {f[i].live_min, f[i].live_max, f[i].live_last,
                               f[i].res_min,  f[i].res_max,  f[i].res_last};
        json_array_append_new(idx, json_integer((json_int_t)i));
        for (size_t k = 0; k < 6; k++)
            json_array_append_new(v[k], jbytes(x[k]));
        for (size_t k = 0; k < nr_top; k++)
            json_array_append_new(sa[k], jbytes(held[k]));
    }
    return json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "n", NR_FINE, "i", idx,
                     "lmin", v[0], "lmax", v[1], "llast", v[2], "rmin", v[3], "rmax", v[4], "rlast",
                     v[5], "s", sv);
}

/* ---- the charts, built while the trace is read ----
 *
 * Each GPU's buckets get their minimum, maximum and last live and reserved bytes as the
 * events go by. The largest call sites at the peak are known only at the end, so the values
 * of every call site are logged sparsely instead: when the events move on to another bucket,
 * the sites changed since the last move are written down with their bytes, under the bucket
 * they leave (a header entry, site NO_SITE, opens each bucket's group). Replaying the log
 * for the few top sites gives each bucket their bytes at its end. The log holds at most
 * NR_MAX_LOG entries; past that (a trace with very many call sites, or threads whose clocks
 * interleave bucket by bucket) the chart is built again in a second read that logs only the
 * top sites. */
#define NO_BUCKET  UINT32_MAX
#define NO_SITE    UINT32_MAX
#define NR_MAX_LOG ((size_t)1 << 22) /* 64 MiB */

struct log_entry {
    uint32_t bucket, site; /* site: index into the summary's sites, or NO_SITE */
    uint64_t value;
};

/* Refusals alike in all but their time (a loop asking again and again) are one row. */
struct oom_row {
    uint64_t t, size, aux, aux2, live, res; /* t: since the trace's start, of the first */
    uint64_t last_t, count;                 /* the latest alike, and how many */
    uint32_t stack;
    bool limit;
};

struct chart_dev {
    struct bucket *b;   /* NR_BUCKETS, from the device's first event on */
    struct curve *fine; /* NR_FINE, with b */
    uint64_t live, res; /* after the device's latest event */
    uint32_t cur;       /* fine bucket of the latest event that set a bucket's last value */
    uint32_t *dirty;    /* sites changed since the last move to another bucket */
    size_t nr_dirty, cap_dirty;
    struct log_entry *log;
    size_t nr_log, cap_log;
    struct oom_row ooms[NR_OOM_ROWS];
    size_t nr_ooms;             /* rows, including those past NR_OOM_ROWS */
    uint32_t top[NR_TOP_SITES]; /* a second read: the only stacks logged */
    size_t nr_top;
};

struct html_chart {
    struct trace_summary *s;                           /* summarized along with the chart */
    uint64_t offset_ns;                                /* of this trace on the common time axis */
    double per_bucket;                                 /* ns */
    struct chart_dev dev[CUHEAP_TRACE_NR_MAX_DEVICES]; /* as s->dev */
    uint8_t *is_dirty;                                 /* per site */
    size_t cap_is_dirty;
    bool filtered;             /* a second read: only the top sites are logged, without a bound */
    bool overflow;             /* the log went past NR_MAX_LOG: read again */
    bool failed;               /* out of memory */
    struct trace_summary *own; /* html_chart_again()'s summary */
    json_t *marks;             /* every mark_stride-th marker */
    size_t nr_marks;           /* markers seen */
    size_t mark_stride;        /* a power of 2 */
};

static bool grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static void log_put(struct html_chart *c, struct chart_dev *cd, uint32_t bucket, uint32_t site,
                    uint64_t value)
{
    if (!c->filtered && cd->nr_log >= NR_MAX_LOG) {
        c->overflow = true;
        return;
    }
    if (!grow((void **)&cd->log, &cd->cap_log, cd->nr_log + 1, sizeof(*cd->log))) {
        c->failed = true;
        return;
    }
    cd->log[cd->nr_log++] = (struct log_entry){bucket, site, value};
}

/* The events move on from bucket cd->cur: its sites' bytes as they are now. */
static void flush(struct html_chart *c, struct chart_dev *cd)
{
    if (cd->cur != NO_BUCKET && !c->overflow)
        log_put(c, cd, cd->cur, NO_SITE, 0);
    for (size_t k = 0; k < cd->nr_dirty; k++) {
        uint32_t site = cd->dirty[k];
        c->is_dirty[site] = 0;
        if (cd->cur != NO_BUCKET && !c->overflow)
            log_put(c, cd, cd->cur, site, c->s->sites[site].live);
    }
    cd->nr_dirty = 0;
}

struct html_chart *html_chart_begin(struct trace_summary *s, uint64_t offset_ns, uint64_t end_ns)
{
    struct html_chart *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->s = s;
    c->offset_ns = offset_ns;
    c->per_bucket = (double)(end_ns ? end_ns : 1) / NR_BUCKETS;
    c->marks = json_array();
    c->mark_stride = 1;
    for (size_t d = 0; d < CUHEAP_TRACE_NR_MAX_DEVICES; d++)
        c->dev[d].cur = NO_BUCKET;
    return c;
}

/* For a second read: log only these stacks of that device (the top sites at its peak). */
static void chart_only(struct html_chart *c, size_t dev, const struct site *sites, size_t nr)
{
    c->filtered = true;
    struct chart_dev *cd = &c->dev[dev];
    for (cd->nr_top = 0; cd->nr_top < nr && cd->nr_top < NR_TOP_SITES; cd->nr_top++)
        cd->top[cd->nr_top] = sites[cd->nr_top].stack;
}

/* The chart of a device the summary has met, or NULL (as the summary's, never adding one). */
static struct chart_dev *chart_dev_of(struct html_chart *c, int device)
{
    for (unsigned i = 0; i < c->s->nr_dev; i++)
        if (c->s->dev[i].device == device)
            return &c->dev[i];
    return NULL;
}

/* Every mark_stride-th marker is kept; when NR_MAX_MARKS are, every second of them goes and
 * the stride doubles, so those kept stay spread evenly over the run. */
static void keep_mark(struct html_chart *c, uint64_t at, const char *label)
{
    size_t i = c->nr_marks++;
    if (i % c->mark_stride)
        return;
    if (json_array_size(c->marks) >= NR_MAX_MARKS) {
        json_t *kept = json_array();
        for (size_t k = 0; k < json_array_size(c->marks); k += 2)
            json_array_append(kept, json_array_get(c->marks, k));
        json_decref(c->marks);
        c->marks = kept;
        c->mark_stride *= 2;
        if (i % c->mark_stride)
            return;
    }
    json_array_append_new(c->marks, json_pack("[I,o]", (json_int_t)at, text(label)));
}

void html_chart_event(const struct cuheap_trace_event *e, void *ctx)
{
    struct html_chart *c = ctx;
    struct trace_summary *s = c->s;
    uint64_t at = e->t + c->offset_ns;
    if (e->type == CUHEAP_EV_MARK) {
        summarize_event(s, e);
        /* marks carry the thread's device (0 when it had none): shown on every GPU */
        if (e->label && strcmp(e->label, "nvtx pop"))
            keep_mark(c, at, e->label);
        return;
    }
    bool mem = counts_as_device_memory(e);
    bool moves = (e->type == CUHEAP_EV_ALLOC && mem) || (e->type == CUHEAP_EV_FREE && mem) ||
                 e->type == CUHEAP_EV_ARENA_GROW || e->type == CUHEAP_EV_ARENA_RELEASE;
    /* clamped before the conversion: an event past the end (a damaged trace) would not fit
     * a size_t (found by fuzzing) */
    double q = (double)at / c->per_bucket;
    size_t k = q < (double)NR_BUCKETS ? (size_t)q : NR_BUCKETS - 1;
    double qf = q * NR_FINE_PER;
    size_t kf = qf < (double)NR_FINE ? (size_t)qf : NR_FINE - 1;
    struct chart_dev *cd = chart_dev_of(c, e->device);
    if (cd && moves && cd->b && kf != cd->cur &&
        (cd->fine[kf].latest_t == UINT64_MAX || at >= cd->fine[kf].latest_t)) {
        flush(c, cd); /* before this event's change: the state the bucket left */
        cd->cur = (uint32_t)kf;
    }
    summarize_event(s, e);
    if (!cd && e->device >= 0) /* the summary may have just met the device */
        cd = chart_dev_of(c, e->device);
    if (cd && moves && !cd->b) {
        cd->b = calloc(NR_BUCKETS, sizeof(*cd->b));
        cd->fine = malloc(NR_FINE * sizeof(*cd->fine));
        if (!cd->b || !cd->fine) {
            free(cd->b);
            free(cd->fine);
            cd->b = NULL;
            cd->fine = NULL;
            c->failed = true;
            return;
        }
        for (size_t i = 0; i < NR_BUCKETS; i++)
            cd->b[i].c.latest_t = UINT64_MAX;
        for (size_t i = 0; i < NR_FINE; i++)
            cd->fine[i].latest_t = UINT64_MAX;
        cd->cur = (uint32_t)kf;
    }
    /* the sites it changed, each logged at the next move by its own device */
    for (unsigned i = 0; i < s->nr_changed; i++) {
        uint32_t site = s->changed[i];
        const struct site_acc *a = &s->sites[site];
        struct chart_dev *acd = chart_dev_of(c, a->device);
        if (!acd)
            continue;
        if (c->filtered) {
            size_t j = 0;
            while (j < acd->nr_top && acd->top[j] != a->stack)
                j++;
            if (j == acd->nr_top)
                continue;
        }
        size_t had = c->cap_is_dirty;
        if (!grow((void **)&c->is_dirty, &c->cap_is_dirty, (size_t)site + 1, 1)) {
            c->failed = true;
            continue;
        }
        memset(c->is_dirty + had, 0, c->cap_is_dirty - had);
        if (c->is_dirty[site])
            continue;
        if (!grow((void **)&acd->dirty, &acd->cap_dirty, acd->nr_dirty + 1, sizeof(*acd->dirty))) {
            c->failed = true;
            continue;
        }
        c->is_dirty[site] = 1;
        acd->dirty[acd->nr_dirty++] = site;
    }
    if (!cd)
        return;
    const struct device_summary *d = &s->dev[cd - c->dev];
    if (moves) {
        note(&cd->b[k].c, at, d->live, d->reserved, cd->live, cd->res);
        note(&cd->fine[kf], at, d->live, d->reserved, cd->live, cd->res);
        cd->live = d->live;
        cd->res = d->reserved;
    } else if (e->type == CUHEAP_EV_OOM || e->type == CUHEAP_EV_LIMIT) {
        struct oom_row o = {e->t,        e->size, e->aux, e->aux2,  d->live,
                            d->reserved, e->t,    1,      e->stack, e->type == CUHEAP_EV_LIMIT};
        for (size_t i = 0; i < cd->nr_ooms && i < NR_OOM_ROWS; i++) {
            struct oom_row *r = &cd->ooms[i];
            if (r->size == o.size && r->aux == o.aux && r->aux2 == o.aux2 && r->live == o.live &&
                r->res == o.res && r->stack == o.stack && r->limit == o.limit) {
                r->count++;
                r->last_t = e->t > r->last_t ? e->t : r->last_t;
                return;
            }
        }
        if (cd->nr_ooms < NR_OOM_ROWS)
            cd->ooms[cd->nr_ooms] = o;
        cd->nr_ooms++;
    }
}

/* At the end of the events: the last buckets' sites. Returns -1 when the chart cannot be
 * drawn from what it kept (out of memory, or the log overflowed: read again). */
int html_chart_end(struct html_chart *c)
{
    for (size_t d = 0; d < CUHEAP_TRACE_NR_MAX_DEVICES; d++)
        if (c->dev[d].b)
            flush(c, &c->dev[d]);
    return c->failed || c->overflow ? -1 : 0;
}

void html_chart_free(struct html_chart *c)
{
    if (!c)
        return;
    for (size_t d = 0; d < CUHEAP_TRACE_NR_MAX_DEVICES; d++) {
        free(c->dev[d].b);
        free(c->dev[d].fine);
        free(c->dev[d].dirty);
        free(c->dev[d].log);
    }
    free(c->is_dirty);
    json_decref(c->marks);
    if (c->own) {
        summary_free(c->own);
        free(c->own);
    }
    free(c);
}

/* One GPU of one trace: its curves, top sites, markers and refusals for the page. */
static json_t *device_json(const struct cuheap_trace *t, const struct trace_summary *s,
                           const struct device_summary *d, struct html_chart *c)
{
    struct chart_dev *cd = &c->dev[d - s->dev];
    const struct trace_summary *cs = c->s; /* the summary the log's site indexes are in */
    struct bucket *b = cd->b;
    if (!b)
        return NULL;
    struct site *sites;
    size_t nr_sites = collect_sites(t, s, SITES_AT_PEAK, d->device, &sites);
    size_t nr_top = nr_sites < NR_TOP_SITES ? nr_sites : NR_TOP_SITES;
    /* the log, replayed for the top sites: each group sets its fine bucket's values, and so
     * those of the bucket it lies in */
    struct fine_sites *fs = calloc(NR_FINE, sizeof(*fs));
    if (!fs) {
        free(sites);
        return NULL;
    }
    uint64_t vals[NR_TOP_SITES] = {0};
    uint32_t group = NO_BUCKET;
    for (size_t i = 0; i <= cd->nr_log; i++) {
        const struct log_entry *l = i < cd->nr_log ? &cd->log[i] : NULL;
        if ((!l || l->site == NO_SITE) && group != NO_BUCKET) {
            memcpy(fs[group].v, vals, sizeof(vals));
            fs[group].set = true;
            memcpy(b[group / NR_FINE_PER].site, vals, sizeof(vals));
        }
        if (!l)
            break;
        if (l->site == NO_SITE) {
            group = l->bucket;
            continue;
        }
        const struct site_acc *a = &cs->sites[l->site];
        for (size_t k = 0; k < nr_top; k++)
            if (a->stack == sites[k].stack && a->device == d->device)
                vals[k] = l->value;
    }
    /* buckets without events hold the value before them; before the first event, nothing */
    struct bucket prev = {.c.latest_t = 0};
    for (size_t i = 0; i < NR_BUCKETS; i++) {
        if (b[i].c.latest_t != UINT64_MAX) {
            prev = b[i];
            continue;
        }
        b[i] = prev;
        b[i].c.live_min = b[i].c.live_max = prev.c.live_last;
        b[i].c.res_min = b[i].c.res_max = prev.c.res_last;
    }
    json_t *top = json_array();
    for (size_t k = 0; k < nr_top; k++) {
        json_t *values = json_array();
        for (size_t i = 0; i < NR_BUCKETS; i++)
            json_array_append_new(values, jbytes(b[i].site[k]));
        json_array_append_new(top, json_pack("{s:o, s:o, s:o, s:o}", "site",
                                             site_json(t, sites[k].stack), "bytes",
                                             jbytes(sites[k].bytes), "stack",
                                             stack_json(t, sites[k].stack), "values", values));
    }
    free(sites);
    json_t *ooms = json_array();
    for (size_t i = 0; i < cd->nr_ooms && i < NR_OOM_ROWS; i++) {
        const struct oom_row *o = &cd->ooms[i];
        json_array_append_new(
            ooms, json_pack("{s:I, s:I, s:I, s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "t",
                            (json_int_t)(o->t + c->offset_ns), "last_t",
                            (json_int_t)(o->last_t + c->offset_ns), "count", (json_int_t)o->count,
                            "kind", o->limit ? "limit" : "oom", "size", jbytes(o->size), "live",
                            jbytes(o->live), "reserved", jbytes(o->res),
                            o->limit ? "limit" : "driver_free", jbytes(o->limit ? o->aux2 : o->aux),
                            "site", site_json(t, o->stack), "stack", stack_json(t, o->stack)));
    }
    const char *name = "?";
    for (unsigned k = 0; k < t->nr_devices; k++)
        if (t->devices[k].ordinal == d->device)
            name = t->devices[k].name;
    json_t *dev = json_pack(
        "{s:i, s:o, s:o, s:o, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:O, s:o, s:I, s:I, s:I, "
        "s:o}",
        "device", d->device, "name", text(name), "peak_live", jbytes(d->peak_live), "peak_reserved",
        jbytes(d->peak_reserved), "peak_t", (json_int_t)(d->peak_live_t + c->offset_ns), "live_min",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, live_min)), "live_max",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, live_max)), "live_last",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, live_last)), "res_min",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, res_min)), "res_max",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, res_max)), "res_last",
        u64_array(b, NR_BUCKETS, offsetof(struct curve, res_last)), "sites", top, "marks", c->marks,
        "ooms", ooms, "marks_left_out", (json_int_t)(c->nr_marks - json_array_size(c->marks)),
        "mark_stride", (json_int_t)c->mark_stride, "end_t", (json_int_t)(t->max_t + c->offset_ns),
        "fine", fine_json(cd->fine, fs, nr_top));
    free(fs);
    return dev;
}

static void stack_details(FILE *f, const struct cuheap_trace *t, uint32_t id)
{
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, id);
    if (!s)
        return;
    char buf[700];
    fputs("<details><summary>stack</summary><pre>", f);
    for (size_t k = 0; k < 40 && cuheap_trace_frame(s, k, buf, sizeof(buf)); k++) {
        esc(f, buf);
        fputc('\n', f);
    }
    fputs("</pre></details>", f);
}

static void site_table(FILE *f, const struct cuheap_trace *t, struct site *sites, size_t nr,
                       const char *what)
{
    char b[32], name[700];
    fprintf(f, "<table><tr><th>bytes</th><th>%s</th><th>call site</th></tr>\n", what);
    for (size_t i = 0; i < nr && i < 25; i++) {
        fprintf(f, "<tr><td>%s</td><td>%" PRIu64 "</td><td>",
                human_bytes(sites[i].bytes, b, sizeof(b)), sites[i].count);
        esc(f, cuheap_trace_site(t, sites[i].stack, name, sizeof(name)));
        stack_details(f, t, sites[i].stack);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* The refusals, each as what happened: the driver out of memory, or CUHEAP_LIMIT. */
static void oom_table(FILE *f, const struct cuheap_trace *t, const struct chart_dev *cd)
{
    size_t n = cd->nr_ooms;
    char b1[32], b2[32], b3[32], b4[32], name[700];
    if (n)
        fputs("<h3>Out of memory and limit refusals</h3>\n<table class=\"ooms\"><tr><th>time</th>"
              "<th>times</th><th>request</th><th>what happened</th><th>live / reserved then</th>"
              "<th>call site</th></tr>\n",
              f);
    for (size_t i = 0; i < n && i < NR_OOM_ROWS; i++) {
        const struct oom_row *o = &cd->ooms[i];
        if (o->count > 1)
            fprintf(f, "<tr><td>%.3f s to %.3f s</td>", (double)o->t / 1e9,
                    (double)o->last_t / 1e9);
        else
            fprintf(f, "<tr><td>%.3f s</td>", (double)o->t / 1e9);
        fprintf(f, "<td>%" PRIu64 "</td><td>%s</td><td>", o->count,
                human_bytes(o->size, b1, sizeof(b1)));
        if (o->limit)
            fprintf(f, "refused by CUHEAP_LIMIT (limit %s)", human_bytes(o->aux2, b2, sizeof(b2)));
        else
            fprintf(f, "the driver ran out of memory (%s free of %s)",
                    human_bytes(o->aux, b2, sizeof(b2)), human_bytes(o->aux2, b3, sizeof(b3)));
        fprintf(f, "</td><td>%s / %s</td><td>", human_bytes(o->live, b3, sizeof(b3)),
                human_bytes(o->res, b4, sizeof(b4)));
        esc(f, cuheap_trace_site(t, o->stack, name, sizeof(name)));
        stack_details(f, t, o->stack);
        fputs("</td></tr>\n", f);
    }
    if (n > NR_OOM_ROWS)
        fprintf(f, "<tr><td colspan=\"6\">%zu more unlike these not shown</td></tr>\n",
                n - NR_OOM_ROWS);
    if (n)
        fputs("</table>\n", f);
}

static const char STYLE[] =
    "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.5em}h3{font-size:1.05em}"
    "table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ddd;"
    "padding:3px 8px;text-align:left;vertical-align:top}pre{margin:0;font-size:12px}"
    ".chart{position:relative;user-select:none}.chart svg{display:block}"
    ".tip{position:absolute;pointer-events:none;background:#fff;border:1px solid #999;"
    "padding:4px 6px;font-size:12px;white-space:pre;display:none;z-index:2;max-width:560px;"
    "overflow:hidden}.axis{font-size:11px;fill:#444}.note{color:#666;font-size:12px}"
    ".legend span{display:inline-block;margin-right:1em;font-size:12px}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}"
    ".ooms td:nth-child(-n+5){white-space:nowrap}";

/* The page's chart code, in pieces. It reads the JSON under #cuheap-data and draws one SVG per GPU;
 * it uses nothing outside this file. */
static const char *const SCRIPT[] = {
    "'use strict';\n",
    "const DATA=JSON.parse(document.getElementById('cuheap-data').textContent);\n",
    "const NS='http://www.w3.org/2000/svg',H=310,L=78,R=12,T=34,B=34;\n",
    "/* the view a chart opens on and goes back to: the run's first to its last event */\n",
    "const ALL=[0,DATA.view_ns||DATA.end_ns||1];\n",
    "function ord(n){const t=n%100,l=n%10;return "
    "n+(t>10&&t<14||l>3||!l?'th':['','st','nd','rd'][l]);}\n",
    "/* the call sites' colours: none near the live line's black or the reserved line's red */\n",
    "const "
    "COLORS=['#f28e2c','#59a14f','#b07aa1','#edc949','#76b7b2','#9c755f'],LIVE='#222222',RES='#"
    "d62728';\n",

    "function el(n,a,p){const e=document.createElementNS(NS,n);"
    "for(const k in a)e.setAttribute(k,a[k]);if(p)p.appendChild(e);return e;}\n",
    "function bytes(v){const u=['B','KiB','MiB','GiB','TiB'];let i=0;"
    "while(v>=1024&&i<4){v/=1024;i++;}return (i?v.toFixed(2):v)+' '+u[i];}\n",
    "function secs(ns,step){const d=step?Math.max(0,Math.min(9,-Math.floor(Math.log10("
    "step/1e9)))):(ns<1e7?6:3);return (ns/1e9).toFixed(d)+' s';}\n",
    "function nice(max,n){const raw=max/n,p=Math.pow(10,Math.floor(Math.log10(raw)));"
    "for(const m of[1,2,5,10])if(m*p>=raw)return m*p;return 10*p;}\n",
    "const UNITS=[1,1024,1048576,1073741824,1099511627776],UNAMES=['B','KiB','MiB','GiB','TiB'];\n"
    "/* ticks in the largest unit the top reaches, labelled in it: 0.2 MiB, not 204.80 KiB */\n"
    "function byteTicks(max){let i=0;while(i<4&&max/UNITS[i+1]>=1)i++;"
    "const s=nice(max/UNITS[i],5),d=Math.max(0,-Math.floor(Math.log10(s)));const t=[];"
    "for(let k=0;k*s<=max/UNITS[i]*1.0001;k++)t.push([k*s*UNITS[i],(k*s).toFixed(d)+' '+"
    "UNAMES[i]]);return t;}\n",
    "/* the fine buckets (only those with events come), each empty one holding the value before it "
    "*/\n",
    "function fineLevel(g){if(g._fine)return g._fine;const f=g.fine,n=f.n,o={n};\n",
    "for(const k of['lmin','lmax','llast','rmin','rmax','rlast'])o[k]=new Float64Array(n);\n",
    "o.s=f.s.map(()=>new Float64Array(n));const sv=f.s.map(()=>0);let j=0,l=0,r=0;\n",
    "for(let i=0;i<n;i++){if(j<f.i.length&&f.i[j]===i){for(const k "
    "of['lmin','lmax','rmin','rmax'])o[k][i]=f[k][j];\n",
    "l=f.llast[j];r=f.rlast[j];f.s.forEach((a,k)=>{sv[k]=a[j];});j++;}else{o.lmin[i]=o.lmax[i]=l;o."
    "rmin[i]=o.rmax[i]=r;}\n",
    "o.llast[i]=l;o.rlast[i]=r;sv.forEach((v,k)=>{o.s[k][i]=v;});}\n",
    "return g._fine=o;}\n",
    "function draw(box,g,view){\n",
    " box.textContent='';const n0=g.live_max.length,span0=DATA.end_ns/n0;\n",
    " /* as wide as the page lets it be */\n",
    " const W=Math.max(480,Math.floor(box.clientWidth||1000));box._W=W;box._g=g;box._view=view;\n",
    " const cols=W-L-R,plotH=H-T-B;\n",
    " /* zoomed in until a coarse bucket is wider than half a column: the fine buckets */\n",
    " const fine=!!g.fine&&(view[1]-view[0])/span0<2*cols;\n",
    " const "
    "lv=fine?fineLevel(g):{n:n0,lmin:g.live_min,lmax:g.live_max,llast:g.live_last,rmin:g.res_min,"
    "rmax:g.res_max,rlast:g.res_last};\n",
    " const n=lv.n,span=DATA.end_ns/n,per=n/n0,end=g.end_t===undefined?DATA.end_ns:g.end_t;\n",
    " /* pixel columns: each the min..max of its buckets, and the last value; none past the "
    "process's end */\n",
    " const col=[];for(let c=0;c<cols;c++){const "
    "t0=view[0]+(view[1]-view[0])*c/cols,t1=view[0]+(view[1]-view[0])*(c+1)/cols;\n",
    " let "
    "i0=Math.floor(t0/span),i1=Math.max(i0+1,Math.ceil(t1/"
    "span));i0=Math.max(0,i0);i1=Math.min(n,i1);\n",
    " if(i0>=i1||t0>end){col.push(null);continue;}const "
    "ci=Math.min(n0-1,Math.floor((i1-1)/per));\n",
    " const "
    "o={lmin:Infinity,lmax:0,rmin:Infinity,rmax:0,l:lv.llast[i1-1],r:lv.rlast[i1-1],"
    "s:fine?lv.s.map(a=>a[i1-1]):g.sites.map(s=>s.values[ci])};\n",
    " for(let "
    "i=i0;i<i1;i++){o.lmin=Math.min(o.lmin,lv.lmin[i]);o.lmax=Math.max(o.lmax,lv.lmax[i]);o.rmin="
    "Math.min(o.rmin,lv.rmin[i]);o.rmax=Math.max(o.rmax,lv.rmax[i]);}\n",
    " col.push(o);}\n",
    " /* the top: this window's extremes, not its buckets' */\n",
    " let top=1;for(const o of col)if(o)top=Math.max(top,o.lmax,o.rmax);\n",
    " const yt=byteTicks(top);top=Math.max(top,yt[yt.length-1][0]);\n",
    " const x=t=>L+(t-view[0])/(view[1]-view[0])*cols,y=v=>T+plotH-v/top*plotH;\n",
    " const svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,role:'img'},box);\n",
    " el('rect',{x:L,y:T,width:cols,height:plotH,fill:'#fcfcfc',stroke:'#ccc'},svg);\n",
    " box._col=col;box._fine=fine; /* for #selftest */\n",
    " /* stacked areas of the top call sites, under the live curve */\n",
    " let base=col.map(()=>0);g.sites.forEach((s,k)=>{let d='';const up=[];"
    "col.forEach((o,c)=>{if(!o)return;const v=Math.max(base[c],Math.min(base[c]+o.s[k],o.lmax));"
    "up.push([c,v]);});"
    "if(!up.length)return;d='M'+(L+up[0][0])+','+y(base[up[0][0]]);"
    "for(const[c,v]of up)d+='L'+(L+c)+','+y(v)+'L'+(L+c+1)+','+y(v);"
    "for(let j=up.length-1;j>=0;j--){const c=up[j][0];d+='L'+(L+c+1)+','+y(base[c])+"
    "'L'+(L+c)+','+y(base[c]);}"
    "const p=el('path',{d:d+'Z',fill:COLORS[k%6],'fill-opacity':0.45,stroke:'none'},svg);"
    "el('title',{},p).textContent=s.site+'\\n'+bytes(s.bytes)+' at the peak\\n\\n'+"
    "s.stack.join('\\n');"
    "for(const[c,v]of up)base[c]=v;});\n",
    " /* min..max bands, then step lines through the last values */\n",
    " for(const[key,cl,lo,hi]of[['r',RES,'rmin','rmax'],['l',LIVE,'lmin','lmax']]){"
    "let band='',step='',prev=null;col.forEach((o,c)=>{if(!o)return;"
    "if(o[hi]>o[lo])band+='M'+(L+c+0.5)+','+y(o[lo])+'V'+y(o[hi]);"
    "const yy=y(o[key]);step+=prev===null?'M'+(L+c)+','+yy:'V'+yy;step+='H'+(L+c+1);"
    "prev=yy;});el('path',{d:band,stroke:cl,'stroke-opacity':0.35,fill:'none'},svg);"
    "el('path',{d:step,stroke:cl,'stroke-width':1.5,fill:'none',class:'line-'+key},svg);}\n",
    " /* axes: bytes on the left, time below */\n",
    " for(const[v,lab]of yt){el('line',{x1:L-4,x2:L+cols,y1:y(v),y2:y(v),stroke:'#eee'},svg);"
    "el('text',{x:L-6,y:y(v)+4,'text-anchor':'end',class:'axis'},svg).textContent=lab;}\n",
    " const ts=nice((view[1]-view[0])||1,8);for(let t=Math.ceil(view[0]/ts)*ts;"
    "t<=view[1];t+=ts){el('line',{x1:x(t),x2:x(t),y1:T+plotH,y2:T+plotH+4,stroke:'#444'},"
    "svg);el('text',{x:x(t),y:T+plotH+16,'text-anchor':'middle',class:'axis'},svg)"
    ".textContent=secs(t,ts);}\n",
    " el('text',{x:L+cols/2,y:H-3,'text-anchor':'middle',class:'axis'},svg).textContent="
    "'time since the first process started';\n",
    " el('text',{x:12,y:T+plotH/2,'text-anchor':'middle',class:'axis',transform:"
    "'rotate(-90 12 '+(T+plotH/2)+')'},svg).textContent='bytes';\n",
    " /* markers: a line where it is 2 px from the last, a label where it overlaps none (two "
    "rows,\n",
    "  * inside the plot's edges); the others show on hover, and the note under the chart counts "
    "them */\n",
    " const shown=g.marks.filter(m=>m[0]>=view[0]&&m[0]<=view[1]).sort((p,q)=>p[0]-q[0]);\n",
    " /* past one marker in 12 columns, lines would hatch the plot: ticks on its top edge */\n",
    " const ticks=shown.length*12>cols;box._ticks=ticks;\n",
    " let lastX=-Infinity,lines=0,labels=0;const rowEnd=[-Infinity,-Infinity];\n",
    " for(const m of shown){const mx=x(m[0]);if(mx-lastX<2)continue;lastX=mx;lines++;\n",
    " const ln=ticks?el('line',{x1:mx,x2:mx,y1:T-3,y2:T+5,stroke:'#777',class:'mark-tick'},svg):"
    "el('line',{x1:mx,x2:mx,y1:T,y2:T+plotH,stroke:'#999','stroke-dasharray':'3 "
    "3',class:'mark'},svg);\n",
    " el('title',{},ln).textContent=m[1]+' at '+secs(m[0]);\n",
    " for(let r=0;r<2;r++){if(mx+2<rowEnd[r])continue;const "
    "tx=el('text',{x:mx+2,y:T-4-r*14,class:'axis mark-label'},svg);\n",
    " tx.textContent=m[1].slice(0,24);const w=tx.getComputedTextLength();let "
    "x0=mx+2;if(x0+w>L+cols)x0=mx-2-w;\n",
    " if(x0<Math.max(L,rowEnd[r])){tx.remove();continue;}tx.setAttribute('x',x0);rowEnd[r]=x0+w+6;"
    "labels++;break;}}\n",
    " const mnote=shown.length?shown.length+(shown.length==1?' marker':' markers')+' in view: '+"
    "lines+' drawn'+(ticks?' as ticks on the top edge':'')+', '+labels+' "
    "labelled, '+(shown.length-lines)+' not drawn (hover shows those near the cursor)':'';\n",
    " const mleft=g.marks_left_out?g.marks_left_out+' markers of the trace are not in this report "
    "(every '+ord(g.mark_stride)+' kept)':'';\n",
    " /* zoomed in past what the data holds: a bucket spans several columns */\n",
    " const bspan=fine?DATA.end_ns/g.fine.n:span0,bcols=bspan/((view[1]-view[0])/cols);\n",
    " const rnote=bcols>=2?'Zoomed in past the data: it holds one lowest, highest and last value "
    "per '+secs(bspan,bspan/10)+' ('+Math.round(bcols)+' columns here), so the shaded band spans "
    "whole buckets':'';\n",
    " for(const o of g.ooms)for(const ot of o.count>1?[o.t,o.last_t]:[o.t]){"
    "if(ot<view[0]||ot>view[1])continue;const ox=x(ot);"
    "const p=el('path',{d:'M'+(ox-6)+','+T+'L'+(ox+6)+','+T+'L'+ox+','+(T+10)+'Z',"
    "fill:o.kind=='oom'?'#d62728':'#ff7f0e',class:'oom'},svg);"
    "el('line',{x1:ox,x2:ox,y1:T,y2:T+plotH,stroke:'#d62728','stroke-opacity':0.5},svg);"
    "el('title',{},p).textContent=(o.kind=='oom'?'out of memory: ':'refused by CUHEAP_LIMIT ('+"
    "bytes(o.limit)+'): ')+bytes(o.size)+' requested at '+secs(o.t)+(o.count>1?', '+o.count+"
    "' times to '+secs(o.last_t):'')+'\\nlive '+bytes(o.live)+"
    "', reserved '+bytes(o.reserved)+'\\n'+o.site+'\\n'+o.stack.join('\\n');}\n",
    " /* hover: the values under the cursor; drag: zoom into a time range */\n",
    " const cur=el('line',{y1:T,y2:T+plotH,stroke:'#444',visibility:'hidden'},svg);\n",
    " const sel=el('rect',{y:T,height:plotH,fill:'#1f77b4','fill-opacity':0.15,"
    "visibility:'hidden'},svg);\n",
    " const over=el('rect',{x:L,y:T,width:cols,height:plotH,fill:'transparent'},svg);\n",
    " const tip=document.createElement('div');tip.className='tip';box.appendChild(tip);\n",
    " let from=null;const at=ev=>Math.max(0,Math.min(cols-1,Math.floor(ev.offsetX-L)));\n",
    " over.addEventListener('mousemove',ev=>{const c=at(ev),o=col[c];cur.setAttribute('x1',"
    "L+c+0.5);cur.setAttribute('x2',L+c+0.5);cur.setAttribute('visibility','visible');"
    "if(from!==null){sel.setAttribute('x',L+Math.min(from,c));sel.setAttribute('width',"
    "Math.abs(c-from)+1);sel.setAttribute('visibility','visible');}"
    "if(!o){tip.style.display='none';return;}"
    "let s=secs(view[0]+(view[1]-view[0])*c/cols)+'\\nlive '+bytes(o.l)+' (column max '+"
    "bytes(o.lmax)+')\\nreserved '+bytes(o.r);g.sites.forEach((st,k)=>{if(o.s[k])"
    "s+='\\n'+bytes(o.s[k])+'  '+st.site;});"
    /* under the cursor: the site whose band it is in (with its stack), the refusals and
     * markers within 3 pixels */
    "const v=(T+plotH-ev.offsetY)/plotH*top;let cum=0;for(let k=0;k<g.sites.length;k++){"
    "cum+=o.s[k];if(v<cum){s+='\\n\\n'+g.sites[k].site+'\\n  '+g.sites[k].stack.join("
    "'\\n  ');break;}}"
    "const near=t=>Math.abs(x(t)-(L+c+0.5))<=3;"
    "const nm=g.marks.filter(m=>near(m[0]));for(const m of nm.slice(0,8))s+='\\n\\nmarker: '+m[1];"
    "if(nm.length>8)s+='\\n\\n'+(nm.length-8)+' more markers here';"
    "for(const r of g.ooms)if(near(r.t))s+='\\n\\n'+(r.kind=='oom'?'out of memory: ':"
    "'refused by CUHEAP_LIMIT ('+bytes(r.limit)+'): ')+bytes(r.size)+' requested; live '+"
    "bytes(r.live)+', reserved '+bytes(r.reserved)+'\\n'+r.site+'\\n  '+r.stack.join("
    "'\\n  ');"
    "tip.textContent=s;tip.style.display='block';"
    "tip.style.left=Math.min(ev.offsetX+14,W-300)+'px';tip.style.top=(ev.offsetY+10)+'px';});\n",
    " over.addEventListener('mouseleave',()=>{tip.style.display='none';"
    "cur.setAttribute('visibility','hidden');});\n",
    " over.addEventListener('mousedown',ev=>{from=at(ev);});\n",
    " over.addEventListener('mouseup',ev=>{const c=at(ev);if(from!==null&&Math.abs(c-from)>2){"
    "const t0=view[0]+(view[1]-view[0])*Math.min(from,c)/cols,"
    "t1=view[0]+(view[1]-view[0])*(Math.max(from,c)+1)/cols;from=null;"
    "draw(box,g,[t0,t1]);return;}from=null;sel.setAttribute('visibility','hidden');});\n",
    " over.addEventListener('dblclick',()=>draw(box,g,ALL));\n",
    " const lg=document.createElement('div');lg.className='legend';box.appendChild(lg);\n",
    " const item=(c,t)=>{const s=document.createElement('span');const i=document."
    "createElement('i');i.style.background=c;s.appendChild(i);s.appendChild(document."
    "createTextNode(t));lg.appendChild(s);};\n",
    " item(LIVE,'live');item(RES,'reserved');"
    "item('linear-gradient(90deg,rgba(34,34,34,.35),rgba(214,39,40,.35))','shaded: lowest to "
    "highest within a column (many changes there)');g.sites.forEach((s,k)=>"
    "item(COLORS[k%6],s.site));\n",
    " if(mnote||mleft){const p=document.createElement('p');p.className='note "
    "marks-note';p.textContent=[mnote,mleft].filter(x=>x).join('; ');box.appendChild(p);}\n",
    " if(rnote){const p=document.createElement('p');p.className='note res-note';"
    "p.textContent=rnote;box.appendChild(p);}\n",

    "}\n",
    "for(const box of document.querySelectorAll('.chart')){const g=DATA.processes"
    "[+box.dataset.process].gpus[+box.dataset.gpu];if(g)draw(box,g,ALL);}\n",
    "/* a new window width: each chart again at its width, on the same view */\n",
    "let resized=null;addEventListener('resize',()=>{clearTimeout(resized);resized=setTimeout(()=>{"
    "for(const box of document.querySelectorAll('.chart'))if(box._g&&box._W!=Math.max(480,"
    "Math.floor(box.clientWidth)))draw(box,box._g,box._view);},100);});\n",
    /* #selftest (the tests open the page so): hover and zoom each chart by synthetic mouse
     * events and leave what they showed in data- attributes */
    "if(location.hash.startsWith('#selftest'))for(const box of "
    "document.querySelectorAll('.chart')){"
    /* what a person sees of the markers and colours: labels that overlap or leave the plot,
     * the note, where the lines end, how far the live colour is from the sites' */
    "const lb=[...box.querySelectorAll('text.mark-label')].map(t=>t.getBBox());let ovl=0,out=0;\n",
    "const W=box._W;lb.forEach((a,i)=>{if(a.x<L-1||a.x+a.width>W-R+1)out++;for(const b of "
    "lb.slice(i+1))if(a.x<b.x+b.width&&b.x<a.x+a.width&&a.y<b.y+b.height&&b.y<a.y+a.height)ovl++;})"
    ";\n",
    "box.dataset.labels=lb.length+' '+ovl+' "
    "'+out;box.dataset.marknote=(box.querySelector('.marks-note')||{}).textContent||'';\n",
    /* the chart within the window, the time axis to the run's last event, the legend, how the
     * markers are drawn */
    "{const ax=[...box.querySelectorAll('text.axis')].map(t=>t.textContent).filter(t=>t.endsWith("
    "' s'));box.dataset.fit=box.querySelector('svg').getBoundingClientRect().right<="
    "document.documentElement.clientWidth;box.dataset.axisend=ax[ax.length-1]+' '+ALL[1]+' '+"
    "box._g.end_t;"
    "box.dataset.legend=box.querySelector('.legend').textContent;box.dataset.marks=box."
    "querySelectorAll('line.mark').length+' '+box.querySelectorAll('line.mark-tick').length;"
    "box.dataset.resnote0=(box.querySelector('.res-note')||{}).textContent||'';}\n",
    "{const cs=box._col;let "
    "last=-1;cs.forEach((o,c)=>{if(o)last=c;});box.dataset.lastcol=(last+1)/cs.length;}\n",
    "{const rgb=h=>[1,3,5].map(i=>parseInt(h.slice(i,i+2),16));const "
    "lv=rgb(box.querySelector('path.line-l').getAttribute('stroke'));\n",
    "let d=1e9;for(const p of box.querySelectorAll('path[fill-opacity]')){const "
    "q=rgb(p.getAttribute('fill'));d=Math.min(d,Math.hypot(...q.map((v,i)=>v-lv[i])));}box.dataset."
    "colours=Math.round(d);}\n",

    "const ov=()=>box.querySelector('svg rect[fill=transparent]');let "
    "r=ov().getBoundingClientRect();"
    "const ev=(type,fx,fy)=>ov().dispatchEvent(new MouseEvent(type,{bubbles:true,"
    "clientX:r.left+r.width*fx,clientY:r.top+r.height*fy}));"
    /* hover where the largest site is at its highest, near the bottom of the chart: inside
     * its band whatever the run's timing */
    "const cs=box._col;let best=0;cs.forEach((o,c)=>{if(o&&o.s.length&&o.s[0]>"
    "((cs[best]&&cs[best].s[0])||0))best=c;});"
    "ev('mousemove',(best+0.5)/r.width,0.97);"
    "box.dataset.hover=box.querySelector('.tip').textContent;"
    "ev('mousedown',0.25,0.5);ev('mousemove',0.5,0.5);ev('mouseup',0.5,0.5);"
    "box.dataset.zoomed=[...box.querySelectorAll('text.axis')].map(t=>t.textContent)"
    ".filter(t=>t.endsWith(' s')).join(' | ');"
    /* #selftest&zoom=A,B (seconds): that window drawn, its columns' extremes and markers */
    "const zm=/zoom=([0-9.]+),([0-9.]+)/.exec(location.hash);if(zm){const g=DATA.processes"
    "[+box.dataset.process].gpus[+box.dataset.gpu];draw(box,g,[zm[1]*1e9,zm[2]*1e9]);"
    "const zc=box._col.filter(o=>o);box.dataset.zoom=Math.min(...zc.map(o=>o.lmin))+' '+"
    "Math.max(...zc.map(o=>o.lmax))+' '+box.querySelectorAll('line.mark').length+' '+"
    "box._fine;box.dataset.resnote=(box.querySelector('.res-note')||{}).textContent||'';}}\n",
    /* #selftest: the refusals' cells that take more than one line (but the call site's) */
    "if(location.hash.startsWith('#selftest')){let w=0;for(const td of document.querySelectorAll("
    "'.ooms td:nth-child(-n+5)')){const g=document.createRange();g.selectNodeContents(td);if(new "
    "Set([...g.getClientRects()].map(q=>Math.round(q.top))).size>1)w++;}"
    "document.body.dataset.oomwrap=w;}\n",
    NULL,
};

bool html_axis(size_t nr, const uint64_t *start_unix_ns, const uint64_t *last_t,
               const bool *any_events, uint64_t *ret_offsets, uint64_t *ret_end)
{
    /* one time axis for every process: offsets from the earliest start */
    uint64_t t0 = UINT64_MAX, end = 1, longest = 0, latest_start = 0;
    for (size_t i = 0; i < nr; i++)
        t0 = start_unix_ns[i] < t0 ? start_unix_ns[i] : t0;
    for (size_t i = 0; i < nr; i++) {
        ret_offsets[i] = start_unix_ns[i] - t0;
        longest = last_t[i] > longest ? last_t[i] : longest;
        latest_start = ret_offsets[i] > latest_start ? ret_offsets[i] : latest_start;
    }
    /* Traces of runs made at different times (not ranks of one job) would leave most of the
     * axis empty: then each is drawn from its own start. */
    bool apart = latest_start > 10 * longest + 60000000000ull;
    for (size_t i = 0; i < nr; i++) {
        if (apart)
            ret_offsets[i] = 0;
        if (any_events[i] && last_t[i] + ret_offsets[i] > end)
            end = last_t[i] + ret_offsets[i];
    }
    *ret_end = end;
    return apart;
}

/* A second read of the trace for its chart, logging only the top sites, with a summary of its
 * own (the log's site indexes are in it). */
struct html_chart *html_chart_again(const struct cuheap_trace *t, const struct trace_summary *s,
                                    uint64_t offset_ns, uint64_t end_ns)
{
    struct trace_summary *own = malloc(sizeof(*own));
    if (!own)
        return NULL;
    summarize_begin(own);
    struct html_chart *c = html_chart_begin(own, offset_ns, end_ns);
    if (!c) {
        summarize_end(own);
        free(own);
        return NULL;
    }
    c->own = own;
    for (unsigned d = 0; d < s->nr_dev; d++) {
        struct site *sites;
        size_t nr = collect_sites(t, s, SITES_AT_PEAK, s->dev[d].device, &sites);
        chart_only(c, d, sites, nr);
        free(sites);
    }
    c->filtered = true;
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it))
        html_chart_event(e, c);
    cuheap_trace_iter_end(&it);
    summarize_end(own);
    if (html_chart_end(c)) {
        html_chart_free(c);
        return NULL;
    }
    return c;
}

int export_html(struct cuheap_trace *traces, const struct trace_summary *sums,
                struct html_chart *const *charts, size_t nr, uint64_t end, bool apart, FILE *f)
{
    json_t *processes = json_array();
    for (size_t i = 0; i < nr; i++) {
        json_t *gpus = json_array();
        for (unsigned d = 0; d < sums[i].nr_dev; d++) {
            json_t *g = device_json(&traces[i], &sums[i], &sums[i].dev[d], charts[i]);
            json_array_append_new(gpus, g ? g : json_null());
        }
        json_array_append_new(processes, json_pack("{s:o}", "gpus", gpus));
    }
    /* the view opens on the run: from the first start to the last event (the axis the
     * buckets are on may go on to a footer's later time) */
    uint64_t view = 0;
    for (size_t i = 0; i < nr; i++)
        if (traces[i].nr_events && traces[i].max_t + charts[i]->offset_ns > view)
            view = traces[i].max_t + charts[i]->offset_ns;
    json_t *data = json_pack("{s:I, s:I, s:o}", "end_ns", (json_int_t)end, "view_ns",
                             (json_int_t)(view ? view : end), "processes", processes);

    fprintf(f,
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cuheap report</title>"
            "<style>%s</style></head><body>\n<h1>cuheap report</h1>\n",
            STYLE);
    fputs("<noscript><p>The charts need JavaScript; the tables below do not.</p></noscript>\n", f);
    if (apart)
        fputs("<p class=\"note\">These traces were not recorded at the same time: each is drawn "
              "from its own start.</p>\n",
              f);
    struct ranks rk = {0};
    for (size_t i = 0; i < nr; i++)
        ranks_add(&rk, &traces[i], &sums[i]);
    ranks_print_html(f, &rk, esc); /* several ranks: which stands out, and where */
    ranks_free(&rk);
    for (size_t i = 0; i < nr; i++) {
        const struct cuheap_trace *t = &traces[i];
        const struct trace_summary *s = &sums[i];
        const char *exe = json_string_value(json_object_get(t->header, "exe"));
        fputs("<h2>", f);
        esc(f, exe ? exe : "?");
        if (t->rank >= 0)
            fprintf(f, ", rank %ld", t->rank);
        fprintf(f, " (pid %ld)</h2>\n<p class=\"note\">", t->pid);
        esc(f, t->path);
        char w[64];
        fprintf(f, ": %.3f s, %s%s</p>\n", (double)s->duration_ns / 1e9,
                count_of(t->nr_events, "event", "events", w, sizeof(w)),
                t->truncated ? " (incomplete: the run did not finish writing)" : "");
        json_int_t dropped = json_integer_value(json_object_get(t->footer, "dropped"));
        if (t->footer && dropped)
            fprintf(f, "<p><b>%s dropped (ring full): figures undercount.</b></p>\n",
                    count_of((uint64_t)dropped, "event was", "events were", w, sizeof(w)));
        if (!s->nr_dev)
            fputs("<p>No device memory was allocated.</p>\n", f);
        for (unsigned d = 0; d < s->nr_dev; d++) {
            const struct device_summary *dv = &s->dev[d];
            char b1[32], b2[32], b3[32];
            fprintf(f,
                    "<h3>GPU %d</h3>\n<p>peak live <b>%s</b> at %.3f s, peak reserved <b>%s</b>, "
                    "fragmentation %.2f, %s (%" PRIu64 " from the pool), %s allocated in all",
                    dv->device, human_bytes(dv->peak_live, b1, sizeof(b1)),
                    (double)dv->peak_live_t / 1e9, human_bytes(dv->peak_reserved, b2, sizeof(b2)),
                    dv->peak_live ? (double)dv->peak_reserved / (double)dv->peak_live : 0.0,
                    count_of(dv->nr_allocs, "allocation", "allocations", w, sizeof(w)),
                    dv->nr_pooled, human_bytes(dv->bytes_allocated, b3, sizeof(b3)));
            uint64_t rec = cuheap_trace_recovered(t, dv->device);
            uint64_t real = dv->nr_ooms > rec ? dv->nr_ooms - rec : 0;
            if (real)
                fprintf(f, ", <b>%" PRIu64 " out of memory</b>", real);
            if (rec)
                fprintf(f, ", %" PRIu64 " out-of-memory answers recovered from", rec);
            if (dv->nr_limit)
                fprintf(f, ", <b>%" PRIu64 " refused by CUHEAP_LIMIT</b>", dv->nr_limit);
            fputs("</p>\n", f);
            fprintf(f,
                    "<div class=\"chart\" data-process=\"%zu\" data-gpu=\"%u\"></div>\n"
                    "<p class=\"note\">Hover for values; drag across the chart to zoom into a "
                    "time range, double-click to see all of it.</p>\n",
                    i, d);
            struct site *sites;
            size_t nr_sites = collect_sites(t, s, SITES_AT_PEAK, dv->device, &sites);
            if (nr_sites) {
                fputs("<h3>Live at the peak, by call site</h3>\n", f);
                site_table(f, t, sites, nr_sites, "blocks");
            }
            free(sites);
            oom_table(f, t, &charts[i]->dev[d]);
        }
        struct site *leaks;
        size_t nr_leaks = collect_sites(t, s, SITES_LEAKED, -1, &leaks);
        if (nr_leaks) {
            fputs("<h3>Never freed</h3>\n", f);
            site_table(f, t, leaks, nr_leaks, "blocks");
        } else if (s->nr_dev) {
            fputs("<p>Everything allocated was freed.</p>\n", f);
        }
        free(leaks);
    }
    /* the data as JSON that no trace text can end or bend (script_safe); U+2028 and U+2029
     * escaped too (JSON_ENSURE_ASCII), which JavaScript before ES2019 took for line ends */
    fputs("<script type=\"application/json\" id=\"cuheap-data\">", f);
    json_dump_callback(data, script_safe, f, JSON_COMPACT | JSON_ENSURE_ASCII);
    fputs("</script>\n<script>", f);
    for (size_t i = 0; SCRIPT[i]; i++) /* pieces: C compilers bound a string's length */
        fputs(SCRIPT[i], f);
    fputs("</script>\n</body></html>\n", f);
    json_decref(data);
    return ferror(f) ? -1 : 0;
}
