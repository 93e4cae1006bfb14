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
    struct cuheap_trace_event *events; /* in seq order */
    size_t nr_events;
    bool truncated; /* last line cut off or no footer */
    size_t nr_bad_lines;
    size_t first_bad_line;
};

/* Read a trace. Returns 0, or -1 with a one-line reason in err ("PATH: ..."). Warnings
 * (truncation, skipped lines) are left in the struct for the caller to print. */
int cuheap_trace_read(const char *path, struct cuheap_trace *ret, char *err, size_t err_size);
void cuheap_trace_free(struct cuheap_trace *t);

/* The stack with that id, or NULL. */
const struct cuheap_trace_stack *cuheap_trace_stack(const struct cuheap_trace *t, uint32_t id);

/* A one-line name for a stack's most telling frame: the innermost Python frame
 * ("train.py:42 in forward") if any, else the innermost native frame outside the CUDA
 * libraries ("libfoo.so!fn" or "libfoo.so+0x1234"). Writes into buf. */
const char *cuheap_trace_site(const struct cuheap_trace *t, uint32_t stack, char *buf, size_t size);

/* Render one frame of a stack as text: Python frames first, then native. Returns false past
 * the last frame. */
bool cuheap_trace_frame(const struct cuheap_trace_stack *s, size_t i, char *buf, size_t size);

#endif
