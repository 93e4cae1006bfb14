/* SPDX-License-Identifier: MIT */
/*
 * Several ranks (traces) side by side, for `report` and `html`: which rank ran out of memory
 * or peaked highest, by how much against the others, and at which call sites (named as
 * `report` names them) its bytes at its peak differ from the others' median. Each trace adds
 * a small record while it is summarized, so the traces need not stay in memory together.
 */
#ifndef CUHEAP_RANKS_H
#define CUHEAP_RANKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "analysis.h"

struct rank_site {
    char name[300];
    uint64_t bytes;
};

struct rank_record {
    char label[64];          /* "rank 3", else "pid 1234" */
    uint64_t peak;           /* the most live bytes on any of its GPUs */
    int peak_device;         /* where */
    uint64_t ooms;           /* out-of-memory answers and limit refusals not recovered from */
    int oom_device;          /* the first GPU with one */
    struct rank_site *sites; /* live at the peak on peak_device, merged by name, largest first */
    size_t nr_sites;
};

struct ranks {
    struct rank_record *r;
    size_t nr, cap;
};

void ranks_add(struct ranks *rk, const struct cuheap_trace *t, const struct trace_summary *s);
void ranks_free(struct ranks *rk);

/* One finding: the rank that stands out and the call sites where it differs. */
struct rank_finding {
    const struct rank_record *who;
    bool oom;                 /* it ran out of memory (else: it peaked highest) */
    uint64_t others;          /* the others' median peak */
    struct rank_site diff[5]; /* bytes: its minus the others' median (signed, as int64) */
    int64_t delta[5];
    uint64_t mine[5], theirs[5];
    size_t nr_diff;
};

/* False with fewer than two ranks. */
bool ranks_compare(const struct ranks *rk, struct rank_finding *ret);

/* The finding as text (report) or as an HTML section (html). */
void ranks_print(FILE *f, const struct ranks *rk);
void ranks_print_html(FILE *f, const struct ranks *rk, void (*esc)(FILE *, const char *));

#endif
