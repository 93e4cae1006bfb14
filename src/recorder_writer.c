/* SPDX-License-Identifier: MIT */
/*
 * The recorder's writer thread: it drains the ring, deduplicates stacks into the stack table,
 * symbolizes their frames (dladdr, once per return address) and writes each event as a line
 * of the trace, JSON Lines or Chrome's format. An event's line is built by hand with small
 * appenders: it holds only numbers and fixed names, and the writer must keep up with many
 * producers. Everything that carries outside strings (stacks, devices, labels) goes through
 * jansson, which escapes it correctly.
 *
 * Locking: everything here runs with io_lock held, on the writer thread (or in stop, once the
 * writer has ended); the file, the stack table and the symbol cache are touched by nothing
 * else. No hook waits for io_lock, so what is slow here never slows the program.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "pyframes.h"
#include "recorder_internal.h"

#define CHROME_STACK_FRAMES 16

static const char *module_path(const Dl_info *info)
{
    if (info->dli_fname[0] != '/' && cuheap_recorder.exe_path[0] &&
        (uintptr_t)info->dli_fbase == cuheap_recorder.exe_base)
        return cuheap_recorder.exe_path;
    return info->dli_fname;
}

static json_t *frame_json(uint64_t ip)
{
    Dl_info info;
    char buf[32];
    snprintf(buf, sizeof(buf), "0x%" PRIx64, ip);
    json_t *f = json_pack("{s:s}", "ip", buf);
    /* ip is a return address: look up ip - 1 so a call at a function's end stays in it. */
    if (dladdr((void *)(uintptr_t)(ip - 1), &info) && info.dli_fname) {
        json_object_set_new(f, "module", cuheap_recorder_json_text(module_path(&info)));
        snprintf(buf, sizeof(buf), "0x%" PRIx64, ip - (uint64_t)(uintptr_t)info.dli_fbase);
        json_object_set_new(f, "offset", json_string(buf));
        if (info.dli_sname)
            json_object_set_new(f, "function", cuheap_recorder_json_text(info.dli_sname));
    }
    return f;
}

/* Frames repeat across stacks: each return address is looked up (dladdr) and turned into
 * JSON once. Writer thread only. */
struct sym_slot {
    uint64_t ip;
    json_t *frame;
};

static struct sym_slot *syms;
static size_t nr_sym_slots, nr_syms;

static json_t *frame_cached(uint64_t ip)
{
    if ((nr_syms + 1) * 2 > nr_sym_slots) {
        size_t n = nr_sym_slots ? nr_sym_slots * 2 : 4096;
        struct sym_slot *t = calloc(n, sizeof(*t));
        if (!t)
            return frame_json(ip);
        for (size_t i = 0; i < nr_sym_slots; i++)
            if (syms[i].frame) {
                size_t j = (size_t)(syms[i].ip * 0x9e3779b97f4a7c15ull >> 20) & (n - 1);
                while (t[j].frame)
                    j = (j + 1) & (n - 1);
                t[j] = syms[i];
            }
        free(syms);
        syms = t;
        nr_sym_slots = n;
    }
    size_t j = (size_t)(ip * 0x9e3779b97f4a7c15ull >> 20) & (nr_sym_slots - 1);
    while (syms[j].frame && syms[j].ip != ip)
        j = (j + 1) & (nr_sym_slots - 1);
    if (!syms[j].frame) {
        syms[j] = (struct sym_slot){ip, frame_json(ip)};
        nr_syms++;
    }
    return json_incref(syms[j].frame);
}

static json_t *py_frame_json(const struct cuheap_py_frame *pf)
{
    const char *file = "?", *fn = "?";
    cuheap_py_code(pf->code, &file, &fn);
    return json_pack("{s:o, s:i, s:o}", "file", cuheap_recorder_json_text(file), "line",
                     (int)pf->line, "function", cuheap_recorder_json_text(fn));
}

/* A short, readable form of a stack for Chrome args: Python frames, then native. */
static json_t *stack_strings(const struct cuheap_stack *s)
{
    json_t *a = json_array();
    for (unsigned i = 0; i < s->nr_py && json_array_size(a) < CHROME_STACK_FRAMES; i++) {
        const char *file = "?", *fn = "?";
        cuheap_py_code(s->py[i].code, &file, &fn);
        char buf[600];
        snprintf(buf, sizeof(buf), "%s:%u in %s", file, s->py[i].line, fn);
        json_array_append_new(a, cuheap_recorder_json_text(buf));
    }
    for (unsigned i = 0; i < s->nr_frames && json_array_size(a) < CHROME_STACK_FRAMES; i++) {
        Dl_info info;
        char buf[600];
        uint64_t ip = s->frames[i];
        if (dladdr((void *)(uintptr_t)(ip - 1), &info) && info.dli_fname) {
            const char *base = strrchr(info.dli_fname, '/');
            base = base ? base + 1 : info.dli_fname;
            if (info.dli_sname)
                snprintf(buf, sizeof(buf), "%s (%s)", info.dli_sname, base);
            else
                snprintf(buf, sizeof(buf), "%s+0x%" PRIx64, base,
                         ip - (uint64_t)(uintptr_t)info.dli_fbase);
        } else {
            snprintf(buf, sizeof(buf), "0x%" PRIx64, ip);
        }
        json_array_append_new(a, cuheap_recorder_json_text(buf));
    }
    return a;
}

static void write_stack(const struct cuheap_stack *s)
{
    if (cuheap_recorder.cfg->format != CUHEAP_FORMAT_JSONL)
        return;
    json_t *frames = json_array(), *py = json_array();
    for (unsigned i = 0; i < s->nr_frames; i++)
        json_array_append_new(frames, frame_cached(s->frames[i]));
    for (unsigned i = 0; i < s->nr_py; i++)
        json_array_append_new(py, py_frame_json(&s->py[i]));
    cuheap_recorder_put_line(json_pack("{s:s, s:I, s:o, s:o}", "type", "stack", "id",
                                       (json_int_t)s->id, "frames", frames, "python", py));
}

static void announce_devices(void)
{
    for (int i = 0; i < NR_MAX_DEVICES; i++) {
        struct device_info *d = &cuheap_recorder.devices[i];
        if (atomic_load(&d->state) != 1)
            continue;
        if (cuheap_recorder.cfg->format == CUHEAP_FORMAT_JSONL)
            cuheap_recorder_put_line(json_pack("{s:s, s:i, s:o, s:I}", "type", "device", "device",
                                               i, "name", cuheap_recorder_json_text(d->name),
                                               "total", (json_int_t)d->total));
        atomic_store(&d->state, 2);
    }
}

/* An event's line is built by hand: snprintf was most of the writer's time (4.5 calls an
 * event at about 1,400 instructions each), and the writer must keep up with many producers.
 * The output is byte for byte what the format strings made. */
struct line {
    char buf[512];
    size_t n; /* the longest event line is under 400 bytes */
};

static void put_str(struct line *l, const char *s)
{
    size_t k = strlen(s);
    if (k > sizeof(l->buf) - l->n)
        k = sizeof(l->buf) - l->n;
    memcpy(l->buf + l->n, s, k);
    l->n += k;
}

static void put_u64(struct line *l, uint64_t v)
{
    char d[20];
    unsigned k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k && l->n < sizeof(l->buf))
        l->buf[l->n++] = d[--k];
}

static void put_i64(struct line *l, int64_t v)
{
    if (v < 0) {
        put_str(l, "-");
        put_u64(l, 0 - (uint64_t)v);
        return;
    }
    put_u64(l, (uint64_t)v);
}

/* "0x" and lowercase hex digits, as "0x%" PRIx64 */
static void put_hex(struct line *l, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char d[16];
    unsigned k = 0;
    do {
        d[k++] = digits[v & 15];
        v >>= 4;
    } while (v);
    put_str(l, "0x");
    while (k && l->n < sizeof(l->buf))
        l->buf[l->n++] = d[--k];
}

/* ",\"key\":v" for a byte count. Below 2^63 a JSON number; from 2^63 on a hex string
 * ("0x8000000000000000"), because jansson and most JSON readers hold integers in int64 and
 * would refuse the whole line (an out-of-memory for SIZE_MAX vanished from the report). */
static void put_bytes(struct line *l, const char *key, uint64_t v)
{
    put_str(l, ",\"");
    put_str(l, key);
    put_str(l, "\":");
    if (v <= (uint64_t)INT64_MAX) {
        put_u64(l, v);
        return;
    }
    put_str(l, "\"");
    put_hex(l, v);
    put_str(l, "\"");
}

static void write_event_jsonl(const struct cuheap_event *ev, uint32_t stack_id)
{
    /* an out-of-memory's address fields hold what the hook knew then (event.h) */
    bool oom = ev->type == CUHEAP_EV_OOM || ev->type == CUHEAP_EV_LIMIT;
    uint64_t ptr = oom ? 0 : ev->ptr, actual = oom ? 0 : ev->actual, stream = oom ? 0 : ev->stream;
    struct line l = {.n = 0};
    put_str(&l, "{\"type\":\"event\",\"seq\":");
    put_u64(&l, ev->seq);
    put_str(&l, ",\"t\":");
    put_u64(&l, ev->time_ns - cuheap_recorder.t0_ns);
    put_str(&l, ",\"event\":\"");
    put_str(&l, cuheap_event_type_name(ev->type));
    put_str(&l, "\",\"api\":\"");
    put_str(&l, cuheap_api_name(ev->api));
    put_str(&l, "\",\"device\":");
    put_i64(&l, ev->device);
    put_str(&l, ",\"tid\":");
    put_u64(&l, ev->tid);
    put_str(&l, ",\"ptr\":\"");
    put_hex(&l, ptr);
    put_str(&l, "\"");
    put_bytes(&l, "size", ev->size);
    put_bytes(&l, "actual", actual);
    put_str(&l, (ev->flags & CUHEAP_EVF_POOLED) ? ",\"pooled\":true" : ",\"pooled\":false");
    if (stream) {
        put_str(&l, ",\"stream\":\"");
        put_hex(&l, stream);
        put_str(&l, "\"");
    }
    if (ev->flags & CUHEAP_EVF_CAPTURE)
        put_str(&l, ",\"capture\":true");
    if (stack_id) {
        put_str(&l, ",\"stack\":");
        put_u64(&l, stack_id);
    }
    switch (ev->type) {
    case CUHEAP_EV_OOM:
    case CUHEAP_EV_LIMIT:
        put_str(&l, ",\"result\":");
        put_i64(&l, ev->result);
        put_bytes(&l, "driver_free", ev->aux);
        put_bytes(&l, "driver_total", ev->aux2);
        put_bytes(&l, "limit", ev->type == CUHEAP_EV_LIMIT ? ev->aux2 : (uint64_t)0);
        put_bytes(&l, "live", ev->ptr);
        put_bytes(&l, "held", ev->actual);
        if (ev->stream != CUHEAP_OOM_NO_POOL)
            put_bytes(&l, "largest_free", ev->stream);
        break;
    case CUHEAP_EV_FENCE:
        put_bytes(&l, "blocks", ev->aux);
        put_bytes(&l, "bytes", ev->aux2);
        break;
    case CUHEAP_EV_ARENA_GROW:
    case CUHEAP_EV_ARENA_RELEASE:
        put_bytes(&l, "reserved", ev->aux);
        break;
    case CUHEAP_EV_AUDIT:
        if (ev->flags & CUHEAP_EVF_SUMMARY) {
            put_bytes(&l, "operations", ev->aux);
            put_bytes(&l, "missed", ev->aux2);
        } else {
            put_bytes(&l, "correlation", ev->aux);
            put_bytes(&l, "count", ev->aux2);
        }
        break;
    default:
        break;
    }
    if (ev->type == CUHEAP_EV_MARK || ev->type == CUHEAP_EV_AUDIT) {
        json_t *j = cuheap_recorder_json_text(ev->label);
        char *label = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        fprintf(cuheap_recorder.out, "%.*s,\"label\":%s}\n", (int)l.n, l.buf,
                label ? label : "\"\"");
        free(label);
        return;
    }
    put_str(&l, "}\n");
    fwrite(l.buf, 1, l.n, cuheap_recorder.out);
}

static void write_event_chrome(const struct cuheap_event *ev, uint32_t stack_id);

/* The event at ring position pos: its stamp made CLOCK_MONOTONIC, its stack interned (or
 * taken from the earlier event it repeats, which this writer has written: it came first from
 * the same thread, within a lap of the ring, cuheap_record makes sure), its line written. */
static void write_event(struct cuheap_event *ev, uint64_t pos)
{
    uint32_t stack_id = 0;
    bool is_new = false;
    unsigned nr_frames = ev->nr_frames, nr_py = ev->nr_py;
    ev->time_ns = cuheap_ticks_to_ns(ev->time_ns);
    /* the scale's error (tens of ns) must not put an event taken just after the trace's start
     * before it: t is unsigned */
    if (ev->time_ns < cuheap_recorder.t0_ns)
        ev->time_ns = cuheap_recorder.t0_ns;
    if (ev->type == CUHEAP_EV_MARK || ev->type == CUHEAP_EV_AUDIT)
        nr_frames = nr_py = 0; /* the frames union holds the label */
    uint64_t t0 = cuheap_recorder.timing ? cuheap_recorder_now() : 0;
    int r = 0;
    if (ev->flags & CUHEAP_EVF_SAME_STACK)
        stack_id = cuheap_recorder.slot_stack[ev->stack_ref & cuheap_recorder.ring.mask];
    else
        r = cuheap_stacktab_intern(&cuheap_recorder.stacks, ev->frames, nr_frames, ev->py, nr_py,
                                   &stack_id, &is_new);
    cuheap_recorder.slot_stack[pos & cuheap_recorder.ring.mask] = stack_id;
    if (cuheap_recorder.timing)
        cuheap_recorder.tm.intern_ns += cuheap_recorder_now() - t0;
    if (r == 0 && is_new)
        write_stack(cuheap_stacktab_get(&cuheap_recorder.stacks, stack_id));
    bool oom = ev->type == CUHEAP_EV_OOM || ev->type == CUHEAP_EV_LIMIT;
    cuheap_recorder_oom_track(ev, stack_id); /* whether the trace is written or not */
    if (cuheap_recorder.out && !cuheap_recorder.write_failed) {
        cuheap_recorder.nr_written++;
        if (cuheap_recorder.cfg->format == CUHEAP_FORMAT_JSONL)
            write_event_jsonl(ev, stack_id);
        else
            write_event_chrome(ev, stack_id);
    }
    if (oom) /* after its event's line: the report follows what it reports */
        cuheap_recorder_oom_seen(ev, stack_id);
}

/* CUHEAP_FORMAT=chrome: the event as Chrome's trace events (chrome.h). */
static void write_event_chrome(const struct cuheap_event *ev, uint32_t stack_id)
{
    bool oom = ev->type == CUHEAP_EV_OOM || ev->type == CUHEAP_EV_LIMIT;
    const struct cuheap_stack *s = cuheap_stacktab_get(&cuheap_recorder.stacks, stack_id);
    char label[3 * CUHEAP_LABEL_MAX + 1];
    json_t *strs = s && ev->type == CUHEAP_EV_ALLOC ? stack_strings(s) : NULL;
    struct cuheap_chrome_ev ce = {
        .type = ev->type,
        .api = ev->api,
        .pooled = ev->flags & CUHEAP_EVF_POOLED,
        .device = ev->device,
        .ptr = oom ? 0 : ev->ptr,
        .size = ev->size,
        .actual = oom ? 0 : ev->actual,
        .aux = ev->aux,
        .aux2 = ev->aux2,
        .ts_us = (double)(ev->time_ns - cuheap_recorder.t0_ns) / 1000.0,
        .tid = ev->tid,
        .stack_id = stack_id,
        .stack = strs,
        .label = ev->type == CUHEAP_EV_MARK ? cuheap_utf8_clean(ev->label, label) : NULL,
    };
    cuheap_chrome_event(&cuheap_recorder.chrome, &ce);
    json_decref(strs);
}

/* The ring's pages are made resident 4 MiB ahead of the producers (io_lock held), until all
 * of it is: a producer that found its slot's page absent took two page faults. */
static bool ring_populating;

static void populate_ahead(void)
{
    if (ring_populating)
        ring_populating = cuheap_ring_populate(&cuheap_recorder.ring, 4u << 20);
}

unsigned cuheap_recorder_drain(void)
{
    unsigned n = 0;
    announce_devices();
    populate_ahead();
    struct cuheap_event *ev;
    while ((ev = cuheap_ring_peek(&cuheap_recorder.ring))) {
        if (n % 1024 == 1023)
            populate_ahead();
        uint64_t t0 = cuheap_recorder.timing ? cuheap_recorder_now() : 0;
        write_event(ev, cuheap_ring_peek_pos(&cuheap_recorder.ring));
        if (cuheap_recorder.timing) {
            cuheap_recorder.tm.write_ns += cuheap_recorder_now() - t0;
            cuheap_recorder.tm.nr_written++;
        }
        cuheap_ring_consume(&cuheap_recorder.ring);
        atomic_fetch_add_explicit(&cuheap_recorder.nr_consumed, 1, memory_order_relaxed);
        n++;
    }
    return n;
}

void *cuheap_recorder_writer_main(void *arg)
{
    (void)arg;
    uint64_t last_flush = cuheap_recorder_now();
    ring_populating = true; /* a new writer (a child's too) starts over */
    while (!atomic_load(&cuheap_recorder.stopping)) {
        pthread_mutex_lock(&cuheap_recorder.io_lock);
        unsigned n = cuheap_recorder_drain();
        cuheap_recorder_oom_tick();
        uint64_t now = cuheap_recorder_now();
        if (now - last_flush >= (uint64_t)cuheap_recorder.cfg->flush_ms * 1000000ull) {
            cuheap_recorder_check_write();
            cuheap_ticks_recalibrate();
            last_flush = now;
        }
        pthread_mutex_unlock(&cuheap_recorder.io_lock);
        if (n == 0) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    struct timespec cpu;
    if (cuheap_recorder.timing && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
        cuheap_recorder.tm.writer_cpu_ns =
            (uint64_t)cpu.tv_sec * 1000000000ull + (uint64_t)cpu.tv_nsec;
    return NULL;
}
