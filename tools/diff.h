/* SPDX-License-Identifier: MIT */
/* `cuheap diff`: what changed between two runs (see diff.c). */
#ifndef CUHEAP_DIFF_H
#define CUHEAP_DIFF_H

#include "analysis.h"
#include "tracereader.h"

/* Print, on stdout, A against B: per GPU the figures and the call sites at the peak whose
 * bytes changed (at most limit rows, largest change first), then the leaks that changed.
 * s[0], s[1]: the summaries of A and B (summarize()); freed here. */
void diff_traces(const struct cuheap_trace *a, const struct cuheap_trace *b,
                 struct trace_summary *s, size_t limit);

#endif
