/* SPDX-License-Identifier: MIT */
/* Writing traces in the formats other viewers open: Chrome/Perfetto, folded stacks for
 * flame graphs, PyTorch memory_viz snapshots. */
#ifndef CUHEAP_EXPORT_H
#define CUHEAP_EXPORT_H

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
int export_memviz(const struct cuheap_trace *t, size_t max_entries, FILE *out);

/* A self-contained HTML report (html.c): per process and GPU a memory timeline (live,
 * reserved, top sites, markers, refusals; hover and zoom), top sites at the peak with stacks,
 * leaks, out-of-memory events. Several traces share one time axis; sums[i] is summarize() of
 * traces[i]. */
int export_html(struct cuheap_trace *traces, const struct trace_summary *sums, size_t nr,
                FILE *out);

#endif
