/* SPDX-License-Identifier: MIT */
/*
 * The recorder: hooks hand it events (cuheap_record, lock-free, never blocks); a writer
 * thread drains the ring, deduplicates and symbolizes stacks, and streams the trace file
 * (JSON Lines, or Chrome Trace Event JSON with CUHEAP_FORMAT=chrome), flushed every
 * CUHEAP_FLUSH_MS so a killed program still leaves a readable prefix.
 */
#ifndef CUHEAP_RECORDER_H
#define CUHEAP_RECORDER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "event.h"

/* What a hook knows about one event; the recorder adds time, thread and stacks. */
struct cuheap_rec {
    uint8_t type;  /* enum cuheap_event_type */
    uint8_t api;   /* enum cuheap_api */
    uint8_t flags; /* enum cuheap_event_flags */
    int16_t device;
    uint64_t seq; /* 0: take the next one now */
    /* CUHEAP_EV_OOM and _LIMIT: ptr the device's live bytes, actual the bytes cuheap holds
     * there, stream the pool's largest free piece (CUHEAP_OOM_NO_POOL: no pool), aux and aux2
     * as in struct cuheap_event */
    uint64_t ptr, size, actual, stream, aux, aux2;
    int32_t result;
    const char *label; /* CUHEAP_EV_MARK, CUHEAP_EV_AUDIT */
};

/* An out-of-memory's largest free piece when there is no pool (CUHEAP_POOL=0). */
#define CUHEAP_OOM_NO_POOL UINT64_MAX

/* Start recording per cfg (ring, unwinder, Python, writer thread, trace file). Failure to
 * open the trace is reported once; events are then counted but not written. */
void cuheap_recorder_start(const struct cuheap_config *cfg);

/* Whether hooks hand events to the recorder (cheap: hooks skip building events when not).
 * Stays true after cuheap_recorder_stop(): what is recorded then is counted as dropped. */
extern atomic_bool cuheap_recorder_on;
static inline bool cuheap_recording(void)
{
    return atomic_load_explicit(&cuheap_recorder_on, memory_order_relaxed);
}

/* Pause (true) or resume recording at run time (cuheap_set_recording): while paused, events
 * other than marks are neither walked nor written (the audit still sees them). Returns
 * whether recording was paused before. */
bool cuheap_recorder_pause(bool pause);

/* Record one event from a hook. Never blocks, never allocates. Every event goes out here.
 * An out-of-memory is also told on stderr (recorder_oom.c): by the writer thread, with the
 * call sites holding the most, or here when the writer will not see it. */
void cuheap_record(const struct cuheap_rec *r);

/* A function that sees every event cuheap_record() is given, before the ring can drop it (the
 * audit's view of the hooks): the runtime sets it, so that the recorder calls into nothing
 * above it. NULL: none. */
typedef void (*cuheap_record_tap_fn)(const struct cuheap_rec *r);
void cuheap_recorder_set_tap(cuheap_record_tap_fn tap);

/* A mark (a user's, an NVTX label, a context's end) on device (-1: none). */
static inline void cuheap_record_mark(int device, const char *label)
{
    struct cuheap_rec r = {.type = CUHEAP_EV_MARK, .device = (int16_t)device, .label = label};
    cuheap_record(&r);
}

/* Tell the trace about a device (written once per device). */
void cuheap_recorder_device(int ordinal, const char *name, uint64_t total);

/* Stop the writer, drain what is left, close the trace. Idempotent. Events recorded later
 * are counted as dropped. */
void cuheap_recorder_stop(void);

/* A child of fork that has recorded nothing yet (it prints no summary either). */
bool cuheap_recorder_idle_child(void);

/* Fork handling: the child writes its own trace, opened at its first event. */
void cuheap_recorder_atfork_prepare(void);
void cuheap_recorder_atfork_parent(void);
void cuheap_recorder_atfork_child(void);

enum cuheap_trace_state {
    CUHEAP_TRACE_NONE,        /* no trace attempted (recording off, or did not start) */
    CUHEAP_TRACE_WRITTEN,     /* being written, no error so far */
    CUHEAP_TRACE_NOT_CREATED, /* the file could not be created */
    CUHEAP_TRACE_LOST,        /* created, but writing failed before the header got there */
    CUHEAP_TRACE_PARTIAL,     /* writing failed later: a readable prefix is there */
};

struct cuheap_recorder_stats {
    uint64_t nr_events;  /* events recorded, including those dropped */
    uint64_t nr_dropped; /* never written: a full ring, or made after recording stopped */
    uint64_t nr_full;    /* of those, lost to a full ring */
    enum cuheap_trace_state state;
    int error;               /* errno of what failed (NOT_CREATED, LOST, PARTIAL) */
    const char *path;        /* the trace file (the name used, suffix included) */
    const char *refused;     /* the name passed over for the trace (a FIFO, a file), or NULL */
    const char *refused_why; /* what stood there: "a FIFO owned by uid 65534 (...)" */
    bool name_too_long;      /* CUHEAP_OUTPUT expanded past CUHEAP_PATH_MAX: the default name */
    const char *unwinder;
};
void cuheap_recorder_get_stats(struct cuheap_recorder_stats *ret);

/* Once the writer stopped (cuheap_recorder_stop): device's peak live and its live bytes at the
 * end, counted from the events the writer took, as `cuheap report` counts them from the trace.
 * False when it may have missed an allocation for want of host memory. */
bool cuheap_recorder_live_figures(int device, uint64_t *ret_peak, uint64_t *ret_live);

/* Out-of-memory answers the program recovered from (freed, and the same request was then
 * answered), as the writer told them. */
uint64_t cuheap_recorder_oom_recovered(void);

/* CUHEAP_RECORD_TIMING=1: where each event's time went (averages over the run; all zero
 * with timing off). Complete after cuheap_recorder_stop(). */
struct cuheap_recorder_timing {
    bool on;
    double clock_ns;     /* one clock read; taken off every figure below */
    uint64_t nr_events;  /* events timed on the hooked threads */
    double ring_ns;      /* per event: claiming, filling, committing a ring slot */
    uint64_t nr_native;  /* events with a native walk */
    double unwind_ns;    /* per walk, in the unwinder */
    double frames;       /* native frames kept per walk */
    uint64_t nr_slow;    /* walks over 2 us */
    uint64_t nr_rewalks; /* short walks that fell short and walked again in full */
    uint64_t nr_python;  /* events whose Python frames were looked for */
    double python_ns;    /* per such event */
    double py_frames;    /* Python frames kept per such event */
    uint64_t nr_written; /* events the writer took from the ring */
    double intern_ns;    /* per event on the writer: the stack table */
    double write_ns;     /* per event on the writer: the rest (formatting, stdio) */
    double writer_cpu_s; /* the writer thread's CPU time */
    double wall_s;       /* from the trace's start to the stop */
};
void cuheap_recorder_get_timing(struct cuheap_recorder_timing *ret);

#endif
