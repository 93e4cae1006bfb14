/* SPDX-License-Identifier: MIT */
/*
 * Reading cuheap traces (JSON Lines, docs/trace-format.md) back into memory for the tool.
 * Tolerant where a real run can leave damage (a last line cut off by SIGKILL, a missing
 * footer) and strict where the file is not a trace at all.
 */
#ifndef CUHEAP_TRACEREADER_H
#define CUHEAP_TRACEREADER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CUHEAP_TRACE_NR_MAX_DEVICES 64

struct cuheap_trace_event {
    uint64_t seq;
    uint64_t t; /* ns since the trace started */
    uint64_t ptr, size, actual, stream, aux, aux2;
    uint32_t stack; /* stack id, 0 = none */
    uint32_t tid;
    int16_t device;
    uint8_t type; /* enum cuheap_event_type */
    uint8_t api;  /* enum cuheap_api */
    bool pooled;
    bool verdict; /* audit events: the verdict (aux operations, aux2 missed); else aux is the
                     missed operation's correlation id, aux2 how many */
    char *label;  /* marks, audit events */
};

struct cuheap_trace_stack {
    uint32_t id;
    json_t *frames; /* array of {ip, module, offset, function?} */
    json_t *python; /* array of {file, line, function} */
};

struct cuheap_trace_device {
    int ordinal;
    char *name;
    uint64_t total;
};

struct cuheap_trace {
    char *path;
    json_t *header;
    json_t *footer; /* NULL when the run did not end normally */
    long pid;
    long rank; /* -1 when the run had no rank */
    struct cuheap_trace_device devices[CUHEAP_TRACE_NR_MAX_DEVICES];
    unsigned nr_devices;
    struct cuheap_trace_stack *stacks; /* sorted by id */
    size_t nr_stacks;
    struct cuheap_trace_event *events; /* in seq order; NULL when streamed */
    size_t nr_events;
    bool streamed;  /* events not kept: each iteration reads the file again */
    uint64_t max_t; /* the latest event's t */
    bool truncated; /* last line cut off or no footer */
    size_t nr_lines;
    size_t nr_bad_lines; /* lines skipped: not JSON, not an object, no "type" */
    size_t first_bad_line;
    char bad_line_why[48]; /* what was wrong with the first one */
    /* values that are there but unreadable ("size":"lots", "seq":-1): they read as 0, and
     * the tool says so */
    size_t nr_bad_fields;
    size_t first_bad_field_line;
    char bad_field[40];       /* name of the first */
    size_t nr_unknown_events; /* event kinds this tool does not know (a newer cuheap) */
    json_t *oom_reports;      /* the "oom_report" lines, in file order (an array; NULL: none) */
    /* "oom_recovered" lines by device ordinal: out-of-memory answers the program recovered
     * from (freed, and the same request was then answered), and the requests they were */
    uint64_t oom_recovered[CUHEAP_TRACE_NR_MAX_DEVICES];
    uint64_t oom_recoveries[CUHEAP_TRACE_NR_MAX_DEVICES];
    uint64_t oom_released; /* bytes the program released before the first recovery */
};

/* Out-of-memory answers (and limit refusals) on device the program recovered from. */
uint64_t cuheap_trace_recovered(const struct cuheap_trace *t, int device);

/* Read a trace, its events into t->events. Returns 0, or -1 with a one-line reason in err
 * ("PATH: ..."). Warnings (truncation, skipped lines) are left in the struct for the caller
 * to print. */
int cuheap_trace_read(const char *path, struct cuheap_trace *ret, char *err, size_t err_size);

/* Read a trace without keeping its events (t->streamed) where its events are near enough to
 * seq order for a reordering window; otherwise as cuheap_trace_read(). Memory then grows with
 * stacks and what each command keeps, not with events. Walk the events with the iterator. */
int cuheap_trace_open(const char *path, struct cuheap_trace *ret, char *err, size_t err_size);

/* The same, handing every event in seq order to visit while the trace is read, so a command
 * needs no pass of its own for it. *ret_visited says whether visit saw every event, in order;
 * when not (a trace read into memory), the caller walks the events itself and must forget what
 * visit was given. */
typedef void (*cuheap_trace_visit_fn)(const struct cuheap_trace_event *e, void *ctx);
int cuheap_trace_open_visit(const char *path, struct cuheap_trace *ret, char *err, size_t err_size,
                            cuheap_trace_visit_fn visit, void *ctx, bool *ret_visited);
void cuheap_trace_free(struct cuheap_trace *t);

/* Events in seq order, from memory or read again from the file:
 *
 *     struct cuheap_trace_iter it;
 *     for (e = cuheap_trace_first(t, &it); e; e = cuheap_trace_next(&it)) ...
 *     cuheap_trace_iter_end(&it);
 *
 * An event (and its label) stays valid until the next call. */
struct cuheap_trace_iter {
    const struct cuheap_trace *t;
    size_t next; /* in memory: index of the current event */
    /* streamed: */
    FILE *f;
    char *line;
    size_t line_cap, lineno;
    struct cuheap_trace_event *heap; /* the reordering window, a min-heap by seq */
    size_t nr_heap;
    struct cuheap_trace_event cur;
    uint64_t last; /* seq of the last event out, when any_out */
    bool any_out;
    struct cuheap_trace *counters; /* what this read finds wrong (the first read said it) */
    bool eof, failed;
};
/* Events the reordering window holds (0: the default, 131072); for tests. */
void cuheap_trace_set_window(size_t nr);

const struct cuheap_trace_event *cuheap_trace_first(const struct cuheap_trace *t,
                                                    struct cuheap_trace_iter *it);
const struct cuheap_trace_event *cuheap_trace_next(struct cuheap_trace_iter *it);
void cuheap_trace_iter_end(struct cuheap_trace_iter *it);

/* Called while a trace is read, every few thousand lines and once at the end (finished):
 * bytes read of total, events so far. The tool draws a progress line with it. */
typedef void (*cuheap_trace_progress_fn)(const char *path, uint64_t done, uint64_t total,
                                         size_t events, bool finished);
void cuheap_trace_set_progress(cuheap_trace_progress_fn fn);

/* The stack with that id, or NULL. */
const struct cuheap_trace_stack *cuheap_trace_stack(const struct cuheap_trace *t, uint32_t id);

/* A one-line name for a stack's most telling frame: the innermost Python frame
 * ("train.py:42 in forward") if any, else the innermost native frame outside the CUDA
 * libraries ("libfoo.so!fn" or "libfoo.so+0x1234"). Writes into buf. */
const char *cuheap_trace_site(const struct cuheap_trace *t, uint32_t stack, char *buf, size_t size);

/* Render one frame of a stack as text: Python frames first, then native. Returns false past
 * the last frame. */
bool cuheap_trace_frame(const struct cuheap_trace_stack *s, size_t i, char *buf, size_t size);

/* Following a trace while it is written: each poll reads only what was appended since the
 * last (the offset and a line not yet whole are kept), hands its events in seq order to visit
 * and keeps the header, devices, stacks, out-of-memory reports and footer in t. Memory grows
 * with stacks, not with events. */
struct cuheap_trace_tail_state; /* tracereader.c */
struct cuheap_trace_tail {
    struct cuheap_trace t; /* no events: they went to visit */
    int fd;                /* -1 until the file is there */
    uint64_t offset;       /* bytes read */
    size_t lineno;         /* whole lines read */
    bool ended;            /* its footer was read: the writer closed it */
    bool held;             /* events wait in the window for an earlier one */
    struct cuheap_trace_tail_state *st;
};
/* 0 or -ENOMEM; the file need not exist yet. */
int cuheap_trace_tail_open(const char *path, struct cuheap_trace_tail *ret);
/* Read what was appended. Returns 1 when something was, 0 when not (or the file is not there
 * yet), -1 with a one-line reason in err (not a cuheap trace, compressed, unreadable). */
int cuheap_trace_tail_poll(struct cuheap_trace_tail *tt, cuheap_trace_visit_fn visit, void *ctx,
                           char *err, size_t err_size);
void cuheap_trace_tail_close(struct cuheap_trace_tail *tt);

#endif
