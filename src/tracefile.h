/* SPDX-License-Identifier: MIT */
/*
 * The trace file itself: which name the trace may take, and writing to it without the
 * program ever paying for it (tracefile.c). Pure: no CUDA, no recorder state.
 */
#ifndef CUHEAP_TRACEFILE_H
#define CUHEAP_TRACEFILE_H

#include <stddef.h>
#include <stdio.h>

#include "config.h"

/* Most milliseconds a write waits for a device that takes nothing more (a terminal held by
 * flow control) before it fails with EAGAIN. */
#define CUHEAP_TRACE_WAIT_MS 1000

/* What stood at the trace's name instead of somewhere cuheap may write. */
struct cuheap_trace_refusal {
    char path[CUHEAP_PATH_MAX]; /* the name passed over; "" when none was */
    char why[128];              /* "a FIFO owned by uid 65534 (cuheap writes only ...)" */
};

/* Open the trace at path (size bytes, holding the name): a regular file created there, or an
 * existing character device (/dev/null, /dev/full, or one a link of the user's or root's
 * leads to: /dev/stdout on a terminal). Anything else at the name (a file, which is never
 * replaced, a FIFO, another user's file, a socket) is passed over, said in *ret_refused, and
 * ".1", ".2", ... are tried instead; path then holds the name used. A device refused, or a
 * link to one, a pipe or a socket (/dev/stdout on a pipe), gets no file beside it: -EPERM,
 * with *ret_refused saying why. The descriptor is
 * non-blocking. Returns it, or -errno (path as given). */
int cuheap_tracefile_create(char *path, size_t size, unsigned mode,
                            struct cuheap_trace_refusal *ret_refused);

/* write(2) all of buf to fd from any thread, as if SIGPIPE were ignored: the signal is
 * blocked meanwhile and one the write raised is taken back (one the program had pending
 * stays). A device that takes nothing more is waited for CUHEAP_TRACE_WAIT_MS at most.
 * Returns 0 or -errno. */
int cuheap_tracefile_write(int fd, const void *buf, size_t len);

/* A stdio stream over fd whose writes go through cuheap_tracefile_write; fclose closes fd.
 * NULL (errno set) when it cannot be made. */
FILE *cuheap_tracefile_stream(int fd);

#endif
