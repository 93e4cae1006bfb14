/* SPDX-License-Identifier: MIT */
/*
 * The recorder's producer side and its life (recorder.h says what the recorder is): a hook's
 * event claims a ring slot, is filled (time, thread, native and Python stacks) and committed,
 * never blocking and never allocating; start, pause, stop, fork and the counters the summary
 * reads. The writer thread is in recorder_writer.c, the trace file in recorder_trace.c, the
 * state they share in recorder_internal.h.
 *
 * Locking: capture_lock is read-held by a hooked thread while it walks a stack or reads its
 * Python frames (a stack found in the thread's cache needs neither the unwinder nor it);
 * child_start_lock is held while a forked child opens its trace at its first event. Fork takes
 * both and io_lock (recorder_internal.h) so that the child inherits them, the unwinder and the
 * trace consistent. Nothing here takes io_lock on a hook's way: only stop and fork do.
 */
#include "recorder.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "pyframes.h"
#include "recorder_internal.h"
#include "unwind.h"

atomic_bool cuheap_recorder_on;
static bool writer_running;
static pthread_t writer;
static __thread pid_t tls_tid __attribute__((tls_model("initial-exec")));
/* Counts the changes of this thread's Python frames: a stack named again (CUHEAP_EVF_SAME_STACK)
 * must have the Python frames of the event it names. */
static __thread uint32_t tls_py_changes __attribute__((tls_model("initial-exec")));
/* A cached stack's note (unwind.h): the ring position + 1 of this thread's last event with
 * those native frames, and above it the count of Python changes then. */
#define NOTE_POS_BITS 40
#define NOTE_POS_MASK ((1ull << NOTE_POS_BITS) - 1)

static void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static pid_t current_tid(void)
{
    if (!tls_tid)
        tls_tid = (pid_t)syscall(SYS_gettid);
    return tls_tid;
}

/* A child after fork opens its trace with its first event, not at fork: DataLoader-style
 * workers that never use CUDA leave no file. */
static pthread_mutex_t child_start_lock = PTHREAD_MUTEX_INITIALIZER;

/* Stacks are taken on the hooked threads, inside libunwind (or libgcc) and the Python frame
 * tables, whose locks nothing resets at fork: a child forked while another thread was in
 * the middle of a walk inherited libunwind's cache lock held and hung at its own first
 * stack (stress fork-streams: 1 child in a few thousand). A walk holds capture_lock to read;
 * fork's prepare handler takes it to write, so no walk is in progress when the child is
 * made. Writers first, or walks on many threads could keep a fork waiting for good; a
 * thread never walks twice at once (a hook reached from a signal handler inside a hook goes
 * straight to the driver, cuheap_busy), so a walk never waits for itself. */
static pthread_rwlock_t capture_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static bool start_writer(void);

static void child_start(void)
{
    /* Reached from a hook, a mark or an NVTX callback (cuheap_busy set): a signal handler's
     * hook on this thread goes to the driver and never waits for child_start_lock. */
    pthread_mutex_lock(&child_start_lock);
    /* not once recording stopped at exit: the process's end would cut the trace short */
    if (atomic_load(&cuheap_recorder.child_pending) && atomic_load(&cuheap_recorder.accepting)) {
        cuheap_recorder_open_trace();
        if (!start_writer()) {
            atomic_store(&cuheap_recorder_on, false);
            cuheap_recorder_close_trace();
        }
        atomic_store(&cuheap_recorder.child_pending, false);
    }
    pthread_mutex_unlock(&child_start_lock);
}

bool cuheap_recorder_idle_child(void)
{
    return atomic_load(&cuheap_recorder.child_pending);
}

static bool is_oom(const struct cuheap_rec *r)
{
    return r->type == CUHEAP_EV_OOM || r->type == CUHEAP_EV_LIMIT;
}

static _Atomic(cuheap_record_tap_fn) record_tap;

void cuheap_recorder_set_tap(cuheap_record_tap_fn tap)
{
    atomic_store_explicit(&record_tap, tap, memory_order_release);
}

void cuheap_record(const struct cuheap_rec *r)
{
    /* the audit's view of the hooks: every event, before the ring can drop it */
    cuheap_record_tap_fn tap = atomic_load_explicit(&record_tap, memory_order_acquire);
    if (tap)
        tap(r);
    if (!atomic_load_explicit(&cuheap_recorder_on, memory_order_relaxed)) {
        if (is_oom(r))
            cuheap_recorder_oom_unseen(r, cuheap_recorder.cfg && !cuheap_recorder.cfg->record
                                              ? "recording is off (CUHEAP_RECORD=0; with it "
                                                "on, the three holding the most are named)"
                                              : "recording is off (it could not start)");
        return;
    }
    if (atomic_load_explicit(&cuheap_recorder.paused, memory_order_relaxed) &&
        r->type != CUHEAP_EV_MARK) {
        if (is_oom(r))
            cuheap_recorder_oom_unseen(r, "recording is paused (cuheap_set_recording; while "
                                          "it records, the three holding the most are named)");
        return;
    }
    if (!atomic_load_explicit(&cuheap_recorder.accepting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&cuheap_recorder.nr_late, 1, memory_order_relaxed);
        if (is_oom(r))
            cuheap_recorder_oom_unseen(r, "recording has stopped (the program is ending)");
        return;
    }
    if (atomic_load_explicit(&cuheap_recorder.child_pending, memory_order_relaxed))
        child_start();
    uint64_t t_start = cuheap_recorder.timing ? cuheap_recorder_now() : 0, t_stacks = 0,
             t_native = 0, t_python = 0, pos = 0;
    struct cuheap_event *ev = cuheap_ring_claim_pos(&cuheap_recorder.ring, &pos);
    if (!ev) {
        if (is_oom(r))
            cuheap_recorder_oom_unseen(r, "its event was lost to a full ring (raise CUHEAP_RING)");
        return;
    }
    ev->seq = r->seq ? r->seq : cuheap_seq_next();
    ev->time_ns = cuheap_ticks_now();
    ev->ptr = r->ptr;
    ev->size = r->size;
    ev->actual = r->actual;
    ev->stream = r->stream;
    ev->aux = r->aux;
    ev->aux2 = r->aux2;
    ev->tid = (uint32_t)current_tid();
    ev->result = r->result;
    ev->device = r->device;
    ev->type = r->type;
    ev->api = r->api;
    ev->flags = r->flags;
    ev->unwinder = (uint8_t)cuheap_recorder.unwinder;
    ev->nr_frames = 0;
    ev->nr_py = 0;
    if (r->type == CUHEAP_EV_MARK || r->type == CUHEAP_EV_AUDIT) {
        /* cut at the limit between characters, so a long label keeps its text */
        const char *l = r->label ? r->label : "";
        size_t n = strnlen(l, sizeof(ev->label));
        if (n == sizeof(ev->label))
            n = cuheap_utf8_cut(l, sizeof(ev->label) - 1);
        memcpy(ev->label, l, n);
        ev->label[n] = 0;
    } else if (r->type == CUHEAP_EV_ALLOC || r->type == CUHEAP_EV_OOM ||
               r->type == CUHEAP_EV_LIMIT) {
        /* Allocation sites are what users ask about; frees carry no stack to halve the cost. */
        t_stacks = cuheap_recorder.timing ? cuheap_recorder_now() : 0;
        const uint64_t *frames = ev->frames;
        uint32_t tag = 0;
        uint64_t *note = NULL; /* the ring position + 1 of this thread's last event with them */
        if (cuheap_recorder.stack_depth)
            ev->nr_frames = (uint8_t)cuheap_unwind_capture_cached(
                ev->frames, cuheap_recorder.stack_depth, &frames, &tag, &note, &capture_lock);
        t_native = cuheap_recorder.timing ? cuheap_recorder_now() : 0;
        if (cuheap_recorder.python) {
            bool same_py;
            pthread_rwlock_rdlock(&capture_lock);
            ev->nr_py = (uint8_t)cuheap_py_capture_same(ev->py, CUHEAP_MAX_PY_DEPTH, &same_py);
            pthread_rwlock_unlock(&capture_lock);
            if (!same_py)
                tls_py_changes++;
        }
        /* Native frames this thread sent before, in an event the writer has seen (it came
         * first) and whose slot it still knows (less than a lap ago), with the Python frames
         * it has now (none changed since; a lap is fewer events than the count takes to come
         * round): named, not copied. */
        uint64_t changes = tls_py_changes & ((1u << (64 - NOTE_POS_BITS)) - 1);
        if (note && *note && *note >> NOTE_POS_BITS == changes &&
            pos - ((*note & NOTE_POS_MASK) - 1) <= cuheap_recorder.ring.mask) {
            ev->flags |= CUHEAP_EVF_SAME_STACK;
            ev->stack_ref = (*note & NOTE_POS_MASK) - 1;
        } else if (frames != ev->frames) {
            memcpy(ev->frames, frames, ev->nr_frames * sizeof(ev->frames[0]));
        }
        if (note)
            *note = changes << NOTE_POS_BITS | ((pos + 1) & NOTE_POS_MASK);
        t_python = cuheap_recorder.timing ? cuheap_recorder_now() : 0;
    }
    unsigned nr_frames = ev->nr_frames,
             nr_py = ev->nr_py; /* the slot is the writer's after commit */
    cuheap_ring_commit(&cuheap_recorder.ring, ev);
    if (cuheap_recorder.timing) {
        uint64_t t_end = cuheap_recorder_now();
        add(&cuheap_recorder.tm.nr_events, 1);
        add(&cuheap_recorder.tm.ring_ns, t_end - t_start - (t_python - t_stacks));
        if (t_stacks && cuheap_recorder.stack_depth) {
            add(&cuheap_recorder.tm.nr_native, 1);
            add(&cuheap_recorder.tm.unwind_ns, t_native - t_stacks);
            add(&cuheap_recorder.tm.nr_frames, nr_frames);
            if (t_native - t_stacks > 2000)
                add(&cuheap_recorder.tm.nr_slow, 1);
        }
        if (t_stacks && cuheap_recorder.python) {
            add(&cuheap_recorder.tm.nr_python, 1);
            add(&cuheap_recorder.tm.python_ns, t_python - t_native);
            add(&cuheap_recorder.tm.nr_py_frames, nr_py);
        }
    }
}

void cuheap_recorder_device(int ordinal, const char *name, uint64_t total)
{
    if (ordinal < 0 || ordinal >= NR_MAX_DEVICES)
        return;
    struct device_info *d = &cuheap_recorder.devices[ordinal];
    int expected = 0;
    if (!atomic_compare_exchange_strong(&d->state, &expected, -1))
        return;
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->total = total;
    atomic_store(&d->state, 1);
}

static bool start_writer(void)
{
    atomic_store(&cuheap_recorder.stopping, false);
    sigset_t all, old;
    sigfillset(&all);
    /* The writer must never take the program's signals. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&writer, NULL, cuheap_recorder_writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r) {
        cuheap_log("cannot start the trace writer thread (%s); recording is off", strerror(r));
        return false;
    }
    writer_running = true;
    return true;
}

void cuheap_recorder_start(const struct cuheap_config *config)
{
    cuheap_recorder.cfg = config;
    if (!cuheap_recorder.cfg->record)
        return;
    if (cuheap_ring_init(&cuheap_recorder.ring, cuheap_recorder.cfg->ring_slots)) {
        cuheap_log("cannot map an event ring of %u slots; recording is off",
                   cuheap_recorder.cfg->ring_slots);
        return;
    }
    cuheap_recorder.slot_stack = calloc(cuheap_recorder.cfg->ring_slots, sizeof(uint32_t));
    if (!cuheap_recorder.slot_stack) {
        cuheap_log("cannot allocate the writer's table of %u slots; recording is off",
                   cuheap_recorder.cfg->ring_slots);
        cuheap_ring_destroy(&cuheap_recorder.ring);
        return;
    }
    cuheap_ticks_init();
    cuheap_recorder.python = cuheap_recorder.cfg->python && cuheap_py_init();
    cuheap_recorder.timing = cuheap_recorder.cfg->record_timing;
    if (cuheap_recorder.timing) {
        uint64_t t = cuheap_recorder_now();
        for (int i = 0; i < 1000; i++)
            cuheap_recorder_now();
        cuheap_recorder.tm.clock_ns = (cuheap_recorder_now() - t) / 1001;
    }
    cuheap_unwind_set_cache(cuheap_recorder.cfg->stack_cache);
    cuheap_py_set_memo(cuheap_recorder.cfg->stack_cache);
    cuheap_recorder.stack_depth = cuheap_recorder.cfg->stack_depth;
    if (cuheap_recorder.python && !cuheap_recorder.cfg->stack_depth_set &&
        cuheap_recorder.stack_depth > CUHEAP_PYTHON_STACK_DEPTH)
        cuheap_recorder.stack_depth = CUHEAP_PYTHON_STACK_DEPTH;
    cuheap_recorder.unwinder =
        cuheap_recorder.stack_depth ? cuheap_unwind_init() : CUHEAP_UNWIND_NONE;
    cuheap_stacktab_init(&cuheap_recorder.stacks);
    cuheap_recorder_open_trace();
    if (!start_writer()) {
        cuheap_recorder_close_trace();
        return;
    }
    atomic_store(&cuheap_recorder.accepting, true);
    atomic_store(&cuheap_recorder_on, true);
}

bool cuheap_recorder_pause(bool pause)
{
    if (pause)
        atomic_store(&cuheap_recorder.was_paused, true);
    return atomic_exchange(&cuheap_recorder.paused, pause);
}

void cuheap_recorder_stop(void)
{
    if (!atomic_load(&cuheap_recorder_on) || !atomic_exchange(&cuheap_recorder.accepting, false))
        return;
    /* A child's trace that another thread is opening is waited for, header and writer; none
     * opens after this (child_start looks at accepting). */
    pthread_mutex_lock(&child_start_lock);
    bool idle_child = atomic_load(&cuheap_recorder.child_pending);
    pthread_mutex_unlock(&child_start_lock);
    if (idle_child) {
        /* a child that recorded nothing: no writer, no file, and none opened later */
        atomic_store(&cuheap_recorder_on, false);
        return;
    }
    if (writer_running) {
        atomic_store(&cuheap_recorder.stopping, true);
        pthread_join(writer, NULL);
        writer_running = false;
    }
    pthread_mutex_lock(&cuheap_recorder.io_lock);
    cuheap_recorder_drain();
    cuheap_recorder_oom_flush(); /* no retry is coming: told before the footer */
    cuheap_recorder.tm.wall_ns = cuheap_recorder_now() - cuheap_recorder.t0_ns;
    cuheap_recorder_close_trace();
    pthread_mutex_unlock(&cuheap_recorder.io_lock);
}

/* Every lock, whether recording is on or not: the locks cost nothing to take here, and a
 * handler that looked at cuheap_recorder_on could see it change between prepare and child
 * (a child's first event turning recording off when its writer cannot start). */
void cuheap_recorder_atfork_prepare(void)
{
    pthread_rwlock_wrlock(&capture_lock);
    pthread_mutex_lock(&child_start_lock);
    pthread_mutex_lock(&cuheap_recorder.io_lock);
    if (cuheap_recorder.out)
        fflush(
            cuheap_recorder.out); /* an empty buffer cannot be written twice by parent and child */
}

void cuheap_recorder_atfork_parent(void)
{
    pthread_mutex_unlock(&cuheap_recorder.io_lock);
    pthread_mutex_unlock(&child_start_lock);
    pthread_rwlock_unlock(&capture_lock);
}

void cuheap_recorder_atfork_child(void)
{
    tls_tid = 0;
    cuheap_unwind_atfork_child(); /* the child's ring starts empty */
    pthread_mutex_init(&cuheap_recorder.io_lock, NULL);
    pthread_mutex_init(&child_start_lock, NULL);
    /* held by this thread for writing: made anew, as the static one (writers first) */
    capture_lock = (pthread_rwlock_t)PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    cuheap_recorder_oom_atfork_child(); /* the child's own first out-of-memory is told */
    atomic_store(&cuheap_recorder.was_paused, atomic_load(&cuheap_recorder.paused));
    if (!atomic_load(&cuheap_recorder_on))
        return;
    /* The parent's writer thread does not exist here. Start over with our own file. */
    writer_running = false;
    if (cuheap_recorder.out) {
        fclose(cuheap_recorder.out); /* buffer was flushed in prepare */
        cuheap_recorder.out = NULL;
    }
    cuheap_ring_reset(&cuheap_recorder.ring);
    atomic_store(&cuheap_recorder.nr_late, 0);
    atomic_store(&cuheap_recorder.nr_consumed, 0);
    atomic_store(&cuheap_recorder.ring.nr_dropped, 0);
    cuheap_stacktab_destroy(&cuheap_recorder.stacks);
    cuheap_stacktab_init(&cuheap_recorder.stacks);
    for (int i = 0; i < NR_MAX_DEVICES; i++)
        if (atomic_load(&cuheap_recorder.devices[i].state) == 2)
            atomic_store(&cuheap_recorder.devices[i].state, 1);
    atomic_store(&cuheap_recorder.child_pending,
                 true); /* the trace opens with the child's first event */
}

void cuheap_recorder_get_stats(struct cuheap_recorder_stats *ret)
{
    ret->nr_events = cuheap_recorder.ring.slots ? cuheap_recorder_nr_events() : 0;
    ret->nr_dropped = cuheap_recorder.ring.slots ? cuheap_recorder_nr_dropped() : 0;
    ret->nr_full = cuheap_recorder.ring.slots ? atomic_load(&cuheap_recorder.ring.nr_dropped) : 0;
    if (cuheap_recorder.open_failed)
        ret->state = CUHEAP_TRACE_NOT_CREATED;
    else if (cuheap_recorder.write_failed)
        ret->state = cuheap_recorder.header_written ? CUHEAP_TRACE_PARTIAL : CUHEAP_TRACE_LOST;
    else
        ret->state = cuheap_recorder.out_path[0] ? CUHEAP_TRACE_WRITTEN : CUHEAP_TRACE_NONE;
    ret->error = cuheap_recorder.trace_errno;
    ret->path = cuheap_recorder.out_path[0] ? cuheap_recorder.out_path : NULL;
    ret->refused = cuheap_recorder.refused.path[0] ? cuheap_recorder.refused.path : NULL;
    ret->refused_why = cuheap_recorder.refused.why;
    ret->name_too_long = cuheap_recorder.name_too_long;
    ret->unwinder = cuheap_unwinder_name(cuheap_recorder.unwinder);
}

void cuheap_recorder_get_timing(struct cuheap_recorder_timing *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (!cuheap_recorder.timing)
        return;
    ret->on = true;
#define PER(num, den) ((den) ? (double)(num) / (double)(den) : 0.0)
    uint64_t nr = atomic_load(&cuheap_recorder.tm.nr_events),
             nr_native = atomic_load(&cuheap_recorder.tm.nr_native),
             nr_python = atomic_load(&cuheap_recorder.tm.nr_python);
    ret->clock_ns = (double)cuheap_recorder.tm.clock_ns;
    ret->nr_events = nr;
    ret->ring_ns =
        PER(atomic_load(&cuheap_recorder.tm.ring_ns), nr) - (double)cuheap_recorder.tm.clock_ns;
    ret->nr_native = nr_native;
    ret->unwind_ns = PER(atomic_load(&cuheap_recorder.tm.unwind_ns), nr_native) -
                     (double)cuheap_recorder.tm.clock_ns;
    ret->frames = PER(atomic_load(&cuheap_recorder.tm.nr_frames), nr_native);
    ret->nr_slow = atomic_load(&cuheap_recorder.tm.nr_slow);
    ret->nr_rewalks = cuheap_unwind_nr_rewalks();
    ret->nr_python = nr_python;
    ret->python_ns = PER(atomic_load(&cuheap_recorder.tm.python_ns), nr_python) -
                     (double)cuheap_recorder.tm.clock_ns;
    ret->py_frames = PER(atomic_load(&cuheap_recorder.tm.nr_py_frames), nr_python);
    ret->nr_written = cuheap_recorder.tm.nr_written;
    ret->intern_ns = PER(cuheap_recorder.tm.intern_ns, cuheap_recorder.tm.nr_written) -
                     (double)cuheap_recorder.tm.clock_ns;
    ret->write_ns = PER(cuheap_recorder.tm.write_ns - cuheap_recorder.tm.intern_ns,
                        cuheap_recorder.tm.nr_written) -
                    2.0 * (double)cuheap_recorder.tm.clock_ns;
    ret->writer_cpu_s = (double)cuheap_recorder.tm.writer_cpu_ns / 1e9;
    ret->wall_s = (double)cuheap_recorder.tm.wall_ns / 1e9;
#undef PER
}
