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
    uint32_t peak_version;    /* new peaks so far (see struct site_acc) */
};

/* One call site (stack) on one device, as the replay goes. The bytes live at the device's
 * peak come out of the same single pass: a site's value is saved before its first change
 * after each new peak (version), so at the end a site changed since the last peak holds its
 * peak value in saved, and any other holds it in live. */
struct site_acc {
    uint32_t stack;
    int16_t device;
    uint32_t version;         /* the device's peak_version when saved was taken */
    uint64_t live, nr_live;   /* bytes and allocations live now */
    uint64_t saved, nr_saved; /* the same, at the latest peak, once changed since */
    uint64_t total, nr_total; /* allocated over the run */
};

struct trace_summary {
    struct device_summary dev[CUHEAP_TRACE_NR_MAX_DEVICES];
    unsigned nr_dev;
    uint64_t nr_host_allocs, host_bytes;
    uint64_t api_count[16];
    uint64_t duration_ns;
    uint64_t nr_marks;
    struct site_acc *sites; /* every (device, stack) with device memory; summary_free() */
    size_t nr_sites, cap_sites;
    uint32_t *site_index; /* open addressing: index + 1 into sites, 0 = empty */
    size_t nr_index_slots;
    struct live_set live; /* while summarizing: allocations live now, for each free's site */
    size_t nr_seen;       /* while summarizing: events so far */
    uint32_t changed[2];  /* after summarize_event(): indexes into sites whose live bytes the */
    unsigned nr_changed;  /* event changed (an allocation's, one freed or replaced) */
};

/* Whether an event's bytes count toward a device's live memory. */
bool counts_as_device_memory(const struct cuheap_trace_event *e);

/* Replay the whole trace, once: the figures, and per call site and device what was live at
 * the device's peak, at the end, and allocated over the run. Free with summary_free(). */
void summarize(const struct cuheap_trace *t, struct trace_summary *ret);
void summary_free(struct trace_summary *s);
/* The same, event by event (for cuheap_trace_open_visit()): begin, every event in seq order,
 * end. */
void summarize_begin(struct trace_summary *s);
void summarize_event(struct trace_summary *s, const struct cuheap_trace_event *e);
void summarize_end(struct trace_summary *s);
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

/* Group allocations by stack under a measure, largest first, from the summary (the trace is
 * not read again). device < 0: all devices (for SITES_AT_PEAK: each device at its own
 * peak). Returns the number of sites in *ret (malloc'd). */
size_t collect_sites(const struct cuheap_trace *t, const struct trace_summary *s,
                     enum site_measure m, int device, struct site **ret);

/* A device's repeating step and what a placement planned once from it would hold
 * (stepplan.h): the step taken from the middle of the trace, its blocks placed on a circle
 * of its events, beside the blocks that live a step or longer (or are never freed), counted
 * at their most during the step. */
struct step_estimate {
    size_t period;      /* allocations a step; 0: no step repeats */
    uint64_t region;    /* bytes the planned blocks take */
    uint64_t outside;   /* bytes live through the step outside the plan */
    uint64_t peak_live; /* the most live bytes during the step */
    size_t nr_planned;  /* blocks placed; 0 with a period: too long a step to plan */
};

/* Returns false when the trace could not be read again or memory ran out; a trace without a
 * repeating step is no failure (period 0). */
bool estimate_step(const struct cuheap_trace *t, int device, struct step_estimate *ret);

/* "12.3 MiB" */
const char *human_bytes(uint64_t v, char *buf, size_t size);

/* "1 site", "3 sites": n and the word that goes with it (one, else many), into buf. */
const char *count_of(uint64_t n, const char *one, const char *many, char *buf, size_t size);

/* "1st", "2nd", "3rd", "4th", "11th", "22nd", into buf. */
const char *ordinal(uint64_t n, char *buf, size_t size);

/* `cuheap report`: what the shim told at device's first out-of-memory (its oom_report line:
 * the request, live and held bytes, the largest free piece, the call sites holding the
 * most), indented under the device's OUT OF MEMORY line. Prints nothing without one. */
void print_oom_report(const struct cuheap_trace *t, int device);

#endif
