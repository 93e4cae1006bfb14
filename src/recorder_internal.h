/* SPDX-License-Identifier: MIT */
/*
 * The recorder's private header: the state its three files share (recorder.c, the producer
 * side and the recorder's life; recorder_writer.c, the writer thread; recorder_trace.c, the
 * trace file) and the calls between them. Nothing outside the recorder includes it.
 *
 * Locking: io_lock is held by the writer thread while it touches the file, the stack table
 * or anything else only the writer uses (and by stop and fork once the writer is gone or
 * paused); the hook side touches none of it, only the ring and the atomic counters.
 */
#ifndef CUHEAP_RECORDER_INTERNAL_H
#define CUHEAP_RECORDER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "chrome.h"
#include "config.h"
#include "event.h"
#include "recorder.h"
#include "ring.h"
#include "stacktab.h"
#include "ticks.h"
#include "tracefile.h"

#define NR_MAX_DEVICES 64

struct device_info {
    _Atomic int state; /* 0 unknown, 1 filled (to announce), 2 announced */
    char name[128];
    uint64_t total;
};

struct cuheap_recorder_state {
    const struct cuheap_config *cfg;
    struct cuheap_ring ring;
    /* What every hook reads and nothing writes while recording, on a line of its own: a
     * counter the writer bumps at every event beside it made each hook wait for the line. */
    _Alignas(64) atomic_bool accepting; /* Events go into the ring. Cleared at stop while
                                         * cuheap_recorder_on stays set, so what threads still
                                         * running at exit record is counted (nr_late) instead
                                         * of vanishing unseen. */
    atomic_bool paused;        /* cuheap_set_recording(0): events other than marks stop at the door,
                                * before their stacks (beside the writer's live set, a line every
                                * event's hook read while the writer wrote it) */
    atomic_bool child_pending; /* a child after fork: its trace opens with its first event */
    bool python;               /* Python frames are taken */
    bool timing;               /* CUHEAP_RECORD_TIMING */
    enum cuheap_unwinder unwinder;
    unsigned stack_depth;                      /* native frames per event in this process */
    uint32_t *slot_stack;                      /* writer: stack id of the event at each ring slot */
    _Alignas(64) _Atomic uint64_t nr_late;     /* events made after recording stopped */
    _Alignas(64) _Atomic uint64_t nr_consumed; /* events the writer took from the ring */
    atomic_bool stopping;                      /* the writer thread is to end */
    atomic_bool was_paused; /* cuheap_set_recording(0) was called: the trace has gaps */
    pthread_mutex_t io_lock;
    /* the trace file (io_lock held) */
    FILE *out;
    char out_path[CUHEAP_PATH_MAX];
    struct cuheap_trace_refusal refused; /* what stood at the trace's name, if anything */
    bool name_too_long;                  /* CUHEAP_OUTPUT expanded past CUHEAP_PATH_MAX */
    bool write_failed;                   /* writing stopped on an error (trace_errno) */
    bool open_failed;                    /* the trace could not be created (trace_errno) */
    bool header_written;                 /* the header reached the file: there is a trace */
    int trace_errno;
    uint64_t nr_written; /* events written to the file */
    uint64_t t0_ns;      /* the trace's t = 0 (CLOCK_MONOTONIC) */
    /* The main program's path: dladdr reports it as it was started ("./a.out"), and the tool
     * needs a path that still works after the program changed directory. */
    char exe_path[1024];
    uintptr_t exe_base;
    struct cuheap_stacktab stacks; /* the writer's (io_lock held) */
    struct cuheap_chrome chrome;   /* CUHEAP_FORMAT=chrome: the writer's */
    struct device_info devices[NR_MAX_DEVICES];
    /* CUHEAP_RECORD_TIMING: where an event's time goes. Hook side: all threads add to these
     * (relaxed atomics, so only when timing). Writer side: the writer thread alone. */
    struct {
        _Atomic uint64_t nr_events;    /* events timed on the hook side */
        _Atomic uint64_t ring_ns;      /* claiming, filling and committing a slot */
        _Atomic uint64_t nr_native;    /* events with a native stack walked */
        _Atomic uint64_t unwind_ns;    /* in cuheap_unwind_capture() */
        _Atomic uint64_t nr_frames;    /* native frames kept */
        _Atomic uint64_t nr_slow;      /* walks over 2 us (the unwinder's slow path?) */
        _Atomic uint64_t nr_python;    /* events whose Python frames were looked for */
        _Atomic uint64_t python_ns;    /* in cuheap_py_capture() */
        _Atomic uint64_t nr_py_frames; /* Python frames kept */
        uint64_t nr_written;           /* writer: events taken from the ring */
        uint64_t intern_ns;            /* writer: cuheap_stacktab_intern() */
        uint64_t write_ns;             /* writer: the rest of write_event() */
        uint64_t writer_cpu_ns;        /* writer thread's CPU time, read when it ends */
        uint64_t wall_ns;              /* recording's wall time, at stop */
        uint64_t clock_ns; /* one clock read, measured at start: taken off each interval */
    } tm;
};

extern struct cuheap_recorder_state cuheap_recorder;

static inline uint64_t cuheap_recorder_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- recorder.c ---- */

/* Events that will never be written: a full ring, made after recording stopped, or left in
 * the ring by a producer that raced with the last drain. */
uint64_t cuheap_recorder_nr_dropped(void);

/* Events recorded, dropped ones included: made late, pushed into the ring or lost to it full
 * (three counts kept anyway, where a fourth cost every event an atomic add). */
uint64_t cuheap_recorder_nr_events(void);

/* ---- recorder_writer.c (io_lock held) ---- */

/* The writer thread's body: drains the ring until stopping, flushing every CUHEAP_FLUSH_MS. */
void *cuheap_recorder_writer_main(void *arg);

/* Write every event in the ring (and devices not yet announced). Returns how many. */
unsigned cuheap_recorder_drain(void);

/* Write obj as one line, unless the file is gone or failed; takes obj's reference. */
void cuheap_recorder_put_line(json_t *obj);

/* A JSON string of text from outside (a path, the command line, a label, a host name): bytes
 * that are not UTF-8 become U+FFFD. Never NULL but on exhaustion. */
json_t *cuheap_recorder_json_text(const char *s);

/* ---- recorder_oom.c: an out-of-memory, told when it happens ---- */

/* Writer (io_lock held): keep the live set from an allocation's or a free's event. */
void cuheap_recorder_oom_track(const struct cuheap_event *ev, uint32_t stack_id);

/* Writer (io_lock held): an out-of-memory event (CUHEAP_EV_OOM, _LIMIT) at stack_id (the
 * request's own stack) was written: its block (the call sites holding the most now) is built
 * and held until the thread's next allocation says whether the program recovered (the same
 * request then answered: one line and an oom_recovered line) or not (the block on stderr for
 * the first, later ones as a count, and an oom_report line in the trace). */
void cuheap_recorder_oom_seen(const struct cuheap_event *ev, uint32_t stack_id);

/* Writer (io_lock held), every round: out-of-memory answers held past the wait for a retry
 * are told as not recovered from. */
void cuheap_recorder_oom_tick(void);

/* Writer (io_lock held), before the footer: every out-of-memory still held is told. */
void cuheap_recorder_oom_flush(void);

/* Hook side: an out-of-memory the writer will never see (why says what stopped it: recording
 * off, paused, ...): told without call sites, saying why. Never allocates, never locks. */
void cuheap_recorder_oom_unseen(const struct cuheap_rec *r, const char *why);

/* In a child after fork: nothing told yet, nothing live. */
void cuheap_recorder_oom_atfork_child(void);

/* ---- recorder_trace.c (io_lock held, or no writer yet) ---- */

/* Open the trace for this process and write its header; on failure say so once and go on
 * without a file (open_failed). */
void cuheap_recorder_open_trace(void);

/* Write the footer and close the trace. */
void cuheap_recorder_close_trace(void);

/* Flush the trace and notice a write error (said once; writing stops). */
void cuheap_recorder_check_write(void);

#endif
