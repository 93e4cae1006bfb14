/* SPDX-License-Identifier: MIT */
/*
 * Replaying a trace: the live/reserved curves per device, their peaks, which allocations
 * were live at the peak and which were never freed, grouped by call site.
 */
#ifndef CUHEAP_ANALYSIS_H
#define CUHEAP_ANALYSIS_H

#include <stdbool.h>
#include <stdint.h>

#include "tracereader.h"

/* A live allocation while replaying. */
struct live_alloc {
    uint64_t ptr; /* 0 = empty slot */
    uint64_t size;
    uint64_t actual;
    uint64_t t;
    uint32_t stack;
    int16_t device;
    uint8_t api;
    bool pooled;
};

/* Open-addressing set of live allocations keyed by address. */
struct live_set {
    struct live_alloc *slots;
    size_t nr_slots, nr_used;
};

void live_set_init(struct live_set *s);
void live_set_free(struct live_set *s);
void live_set_put(struct live_set *s, const struct live_alloc *a);
bool live_set_take(struct live_set *s, uint64_t ptr, struct live_alloc *ret);

struct device_summary {
    int device;
    uint64_t live, reserved; /* at the end of the trace */
    uint64_t peak_live, peak_reserved;
    uint64_t peak_live_t;   /* ns */
    size_t peak_live_index; /* event index at which live peaked */
    uint64_t nr_allocs, nr_frees, nr_pooled, nr_ooms, nr_limit;
    uint64_t bytes_allocated; /* sum of all allocation sizes */
};

struct trace_summary {
    struct device_summary dev[CUHEAP_TRACE_NR_MAX_DEVICES];
    unsigned nr_dev;
    uint64_t nr_host_allocs, host_bytes;
    uint64_t api_count[16];
    uint64_t duration_ns;
    uint64_t nr_marks;
};

/* Whether an event's bytes count toward a device's live memory. */
bool counts_as_device_memory(const struct cuheap_trace_event *e);

/* Replay the whole trace. */
void summarize(const struct cuheap_trace *t, struct trace_summary *ret);
struct device_summary *summary_device(struct trace_summary *s, int device);

/* Per-site aggregate. */
struct site {
    uint32_t stack;
    uint64_t bytes; /* the measure sorted on */
    uint64_t count;
};

enum site_measure {
    SITES_AT_PEAK, /* bytes live at the device's peak */
    SITES_TOTAL,   /* bytes allocated over the run */
    SITES_LEAKED,  /* bytes never freed */
};

/* Group allocations by stack under a measure, largest first. device < 0: all devices (for
 * SITES_AT_PEAK: each device at its own peak). Returns the number of sites in *ret
 * (malloc'd). */
size_t collect_sites(const struct cuheap_trace *t, const struct trace_summary *s,
                     enum site_measure m, int device, struct site **ret);

/* "12.3 MiB" */
const char *human_bytes(uint64_t v, char *buf, size_t size);

#endif
