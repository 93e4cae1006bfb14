/* SPDX-License-Identifier: MIT */
/*
 * `cuheap html`: one self-contained HTML file (no scripts, no network) with, per GPU, the live
 * and reserved bytes over time as an inline SVG chart, the summary figures, the call sites live
 * at the peak with their full stacks, what was never freed, and the out-of-memory events.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "export.h"

#define CHART_W   960
#define CHART_H   260
#define NR_POINTS 1500

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
        default:
            fputc(*s, f);
            break;
        }
    }
}

struct point {
    uint64_t t, live, reserved;
};

/* The device's curve, thinned to at most NR_POINTS keeping each bucket's maximum. Events
 * come in seq order, which is not time order across threads: each lands in the bucket of its
 * own time, whatever came before it. */
static size_t curve(const struct cuheap_trace *t, int device, struct point *out)
{
    uint64_t live = 0, reserved = 0, end = 1;
    for (size_t i = 0; i < t->nr_events; i++)
        if (t->events[i].t > end)
            end = t->events[i].t;
    for (size_t b = 0; b < NR_POINTS; b++)
        out[b].t = UINT64_MAX; /* empty bucket */
    for (size_t i = 0; i < t->nr_events; i++) {
        const struct cuheap_trace_event *e = &t->events[i];
        if (e->device != device)
            continue;
        bool mem = counts_as_device_memory(e);
        if (e->type == CUHEAP_EV_ALLOC && mem) {
            live += e->size;
            reserved += e->pooled ? 0 : e->actual;
        } else if (e->type == CUHEAP_EV_FREE && mem) {
            live -= e->size < live ? e->size : live;
            reserved -= !e->pooled && e->actual < reserved ? e->actual : (e->pooled ? 0 : reserved);
        } else if (e->type == CUHEAP_EV_ARENA_GROW) {
            reserved += e->size;
        } else if (e->type == CUHEAP_EV_ARENA_RELEASE) {
            reserved -= e->size < reserved ? e->size : reserved;
        } else {
            continue;
        }
        size_t bucket = (size_t)((double)e->t / (double)end * (NR_POINTS - 1));
        if (bucket >= NR_POINTS)
            bucket = NR_POINTS - 1;
        struct point *p = &out[bucket];
        if (p->t == UINT64_MAX) {
            *p = (struct point){bucket, live, reserved};
        } else {
            if (live > p->live)
                p->live = live;
            if (reserved > p->reserved)
                p->reserved = reserved;
        }
    }
    size_t n = 0;
    for (size_t b = 0; b < NR_POINTS; b++)
        if (out[b].t != UINT64_MAX)
            out[n++] = out[b];
    return n;
}

static void chart(FILE *f, const struct point *p, size_t n, uint64_t top)
{
    fprintf(f,
            "<svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\" stroke=\"#ccc\"/>",
            CHART_W, CHART_H + 20, CHART_W, CHART_H + 20);
    const char *color[2] = {"#d62728", "#1f77b4"};
    for (int s = 0; s < 2; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                color[s]);
        for (size_t i = 0; i < n; i++) {
            uint64_t v = s ? p[i].live : p[i].reserved;
            double x = (double)p[i].t / (NR_POINTS - 1) * (CHART_W - 10) + 5;
            double y = CHART_H - (top ? (double)v / (double)top * (CHART_H - 10) : 0) + 5;
            fprintf(f, "%.1f,%.1f ", x, y);
        }
        fputs("\"/>", f);
    }
    char b[32];
    fprintf(f,
            "<text x=\"8\" y=\"16\" font-size=\"12\">%s</text>"
            "<text x=\"8\" y=\"%d\" font-size=\"12\" fill=\"#1f77b4\">live</text>"
            "<text x=\"48\" y=\"%d\" font-size=\"12\" fill=\"#d62728\">reserved</text></svg>\n",
            human_bytes(top, b, sizeof(b)), CHART_H + 16, CHART_H + 16);
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

int export_html(const struct cuheap_trace *t, FILE *f)
{
    struct trace_summary s;
    summarize(t, &s);
    const char *exe = json_string_value(json_object_get(t->header, "exe"));
    fputs("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cuheap report</title>"
          "<style>body{font:14px sans-serif;margin:2em;max-width:1100px}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;"
          "padding:4px 8px;text-align:left;vertical-align:top}pre{margin:0;font-size:12px}"
          "</style></head><body>\n<h1>cuheap report</h1>\n<p>",
          f);
    esc(f, t->path);
    fprintf(f, ": pid %ld", t->pid);
    if (t->rank >= 0)
        fprintf(f, ", rank %ld", t->rank);
    fputs(", ", f);
    esc(f, exe ? exe : "?");
    fprintf(f, ", %.3f s, %zu events%s</p>\n", (double)s.duration_ns / 1e9, t->nr_events,
            t->truncated ? " (incomplete: the run did not finish writing)" : "");
    if (t->footer && json_integer_value(json_object_get(t->footer, "dropped")))
        fprintf(f, "<p><b>%lld events were dropped (ring full): figures undercount.</b></p>\n",
                (long long)json_integer_value(json_object_get(t->footer, "dropped")));
    struct point *pts = malloc(NR_POINTS * sizeof(*pts));
    for (unsigned i = 0; i < s.nr_dev; i++) {
        struct device_summary *d = &s.dev[i];
        char b1[32], b2[32], b3[32];
        fprintf(f,
                "<h2>GPU %d</h2>\n<p>peak live <b>%s</b> at %.3f s, peak reserved <b>%s</b>, "
                "fragmentation %.2f, %" PRIu64 " allocations (%" PRIu64 " from the pool), %s "
                "allocated in all",
                d->device, human_bytes(d->peak_live, b1, sizeof(b1)), (double)d->peak_live_t / 1e9,
                human_bytes(d->peak_reserved, b2, sizeof(b2)),
                d->peak_live ? (double)d->peak_reserved / (double)d->peak_live : 0.0, d->nr_allocs,
                d->nr_pooled, human_bytes(d->bytes_allocated, b3, sizeof(b3)));
        if (d->nr_ooms || d->nr_limit)
            fprintf(f, ", <b>%" PRIu64 " out-of-memory, %" PRIu64 " refused by the limit</b>",
                    d->nr_ooms, d->nr_limit);
        fputs("</p>\n", f);
        size_t n = curve(t, d->device, pts);
        chart(f, pts, n, d->peak_reserved > d->peak_live ? d->peak_reserved : d->peak_live);
        struct site *sites;
        size_t nr = collect_sites(t, &s, SITES_AT_PEAK, d->device, &sites);
        fputs("<h3>Live at the peak, by call site</h3>\n", f);
        site_table(f, t, sites, nr, "blocks");
        free(sites);
    }
    free(pts);
    struct site *leaks;
    size_t nr = collect_sites(t, &s, SITES_LEAKED, -1, &leaks);
    fputs("<h2>Never freed</h2>\n", f);
    site_table(f, t, leaks, nr, "blocks");
    free(leaks);
    fputs("<h2>Out of memory</h2>\n<table><tr><th>time</th><th>GPU</th><th>request</th>"
          "<th>driver free / total</th><th>call site</th></tr>\n",
          f);
    for (size_t i = 0; i < t->nr_events; i++) {
        const struct cuheap_trace_event *e = &t->events[i];
        if (e->type != CUHEAP_EV_OOM && e->type != CUHEAP_EV_LIMIT)
            continue;
        char b1[32], b2[32], b3[32], name[700];
        fprintf(f, "<tr><td>%.3f s</td><td>%d</td><td>%s%s</td><td>%s / %s</td><td>",
                (double)e->t / 1e9, e->device, human_bytes(e->size, b1, sizeof(b1)),
                e->type == CUHEAP_EV_LIMIT ? " (limit)" : "", human_bytes(e->aux, b2, sizeof(b2)),
                human_bytes(e->aux2, b3, sizeof(b3)));
        esc(f, cuheap_trace_site(t, e->stack, name, sizeof(name)));
        stack_details(f, t, e->stack);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n</body></html>\n", f);
    return ferror(f) ? -1 : 0;
}
