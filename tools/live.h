/* SPDX-License-Identifier: MIT */
/*
 * Following traces while they are written (`cuheap top --follow`, `cuheap run --live`): per
 * process (rank) and GPU, what is live now, what cuheap holds, the driver's free memory where
 * the trace says it, the peak so far, the out-of-memory answers so far and the call sites
 * holding the most now, refreshed every interval. Each trace is read only where it grew
 * (tracereader.h's tail), so following costs what the new lines cost, and memory stays flat.
 */
#ifndef CUHEAP_LIVE_H
#define CUHEAP_LIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct live_options {
    double interval_s; /* between refreshes */
    size_t nr_sites;   /* call sites shown per GPU */
    long count;        /* refreshes before stopping; 0: until the end */
    bool tty;          /* redraw in place and read keys (else one table per refresh) */
    pid_t child;       /* `run --live`: the program; its end ends the following (0: none) */
    long since_s;      /* follow only traces changed since this time (0: any) */
};

/* Follow the traces named by patterns (paths or glob patterns, looked up again at every
 * refresh so ranks that start later join). Returns the exit status: 0, or 2 when a trace
 * could not be followed at all. With a child, *ret_status gets its wait status. */
int live_follow(char **patterns, size_t nr_patterns, const struct live_options *o, int *ret_status);

#endif
