/* SPDX-License-Identifier: MIT */
/*
 * Chrome Trace Event output (the JSON array form, which Perfetto and chrome://tracing open
 * even when the closing bracket is missing). Shared by the recorder (CUHEAP_FORMAT=chrome)
 * and the `cuheap chrome` command, so both write the same picture: a counter track of live
 * and reserved bytes per device, one async slice per allocation lifetime (process-scoped
 * ids, so merged processes never pair each other's events), instant events for OOMs, limit
 * hits and markers on the process's track, and process names.
 */
#ifndef CUHEAP_CHROME_H
#define CUHEAP_CHROME_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "addrmap.h"

#define CUHEAP_CHROME_NR_DEVICES 64

struct cuheap_chrome {
    FILE *f;
    long pid;                   /* process id shown in the viewer */
    bool first;                 /* no event written yet (no comma needed) */
    struct cuheap_addrmap live; /* open allocation slices: ptr -> size/api */
    /* bytes per device; unsigned and clamped (a trace may hold absurd sizes: signed sums
     * would overflow) */
    uint64_t live_bytes[CUHEAP_CHROME_NR_DEVICES];
    uint64_t reserved_bytes[CUHEAP_CHROME_NR_DEVICES];
};

/* One event, in neutral form. */
struct cuheap_chrome_ev {
    int type; /* enum cuheap_event_type */
    int api;  /* enum cuheap_api */
    bool pooled;
    int device;
    uint64_t ptr, size, actual, aux, aux2;
    double ts_us; /* microseconds since the trace started */
    long tid;
    uint32_t stack_id;
    json_t *stack;     /* borrowed: array of frame strings, or NULL */
    const char *label; /* marks */
};

/* Start writing to f (the caller owns f). Writes the opening bracket and process name. */
int cuheap_chrome_begin(struct cuheap_chrome *c, FILE *f, long pid, const char *process_name);
/* Another process in the same file (the `cuheap chrome` merge of ranks): its events follow.
 * pid must differ from the earlier processes'. Returns 0, or -1 out of memory. */
int cuheap_chrome_process(struct cuheap_chrome *c, long pid, const char *process_name);
void cuheap_chrome_event(struct cuheap_chrome *c, const struct cuheap_chrome_ev *e);
/* Write the closing bracket. */
void cuheap_chrome_end(struct cuheap_chrome *c);

#endif
