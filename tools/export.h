/* SPDX-License-Identifier: MIT */
/* Writing traces in the formats other viewers open: Chrome/Perfetto, folded stacks for
 * flame graphs, PyTorch memory_viz snapshots. */
#ifndef CUHEAP_EXPORT_H
#define CUHEAP_EXPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "analysis.h"
#include "tracereader.h"

/* All traces (ranks) into one Chrome Trace Event file, clocks aligned on their start times.
 * from_ns/to_ns (0: no bound), on that common clock: only events in the window, with what
 * was held when it opens given at its start. */
int export_chrome(struct cuheap_trace *traces, size_t nr, uint64_t from_ns, uint64_t to_ns,
                  FILE *out);

/* One line per call site: "outer;...;inner BYTES". */
int export_folded(const struct cuheap_trace *t, const struct trace_summary *s, enum site_measure m,
                  FILE *out);

/* A pickled snapshot in the shape of torch.cuda.memory._snapshot(), for
 * https://pytorch.org/memory_viz and torch.cuda._memory_viz (memviz.c): the reserved
 * segments at the end of the trace with their blocks, and per device the newest max_entries
 * actions (0: all) that led there. */
int export_memviz(const struct cuheap_trace *t, size_t max_entries, bool pool_view, FILE *out);

/* A self-contained HTML report (html.c): per process and GPU a memory timeline (live,
 * reserved, top sites, markers, refusals; hover and zoom), top sites at the peak with stacks,
 * leaks, out-of-memory events. Several traces share one time axis.
 *
 * The charts are built while a trace is first read, along with its summary:
 *
 *     c = html_chart_begin(&summary, offset, end);   (summarize_begin(&summary) before)
 *     cuheap_trace_open_visit(path, &t, ..., html_chart_event, c, &visited);
 *     summarize_end(&summary);
 *     if (!visited || html_chart_end(c)) { html_chart_free(c); c = html_chart_again(...); }
 *
 * html_chart_event() summarizes each event too (no separate summary visitor). The time axis
 * (offset, end) must be known before the read: html_axis() from the traces' starts and last
 * event times (the footers' times before the read, the events' after). A trace read into
 * memory, or whose chart could not be kept (html_chart_end() fails), is read again by
 * html_chart_again(). */
struct html_chart;
struct html_chart *html_chart_begin(struct trace_summary *s, uint64_t offset_ns, uint64_t end_ns);
void html_chart_event(const struct cuheap_trace_event *e, void *chart);
int html_chart_end(struct html_chart *c);
struct html_chart *html_chart_again(const struct cuheap_trace *t, const struct trace_summary *s,
                                    uint64_t offset_ns, uint64_t end_ns);
void html_chart_free(struct html_chart *c);
/* Offsets of each trace on the common axis, and its end (ns); returns whether the traces
 * are drawn apart (runs made at different times, each from its own start). */
bool html_axis(size_t nr, const uint64_t *start_unix_ns, const uint64_t *last_t,
               const bool *any_events, uint64_t *ret_offsets, uint64_t *ret_end);
/* sums[i]: the summary of traces[i]; charts[i]: its chart, on the axis that gave end, apart. */
int export_html(struct cuheap_trace *traces, const struct trace_summary *sums,
                struct html_chart *const *charts, size_t nr, uint64_t end, bool apart, FILE *out);

#endif
