/* SPDX-License-Identifier: MIT */
/* Exporters (see export.h). */
#include "export.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chrome.h"
#include "event.h"

static json_t *stack_strings(const struct cuheap_trace *t, uint32_t id)
{
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, id);
    if (!s)
        return NULL;
    json_t *a = json_array();
    char buf[600];
    for (size_t i = 0; i < 16 && cuheap_trace_frame(s, i, buf, sizeof(buf)); i++)
        json_array_append_new(a, json_string(buf));
    return a;
}

int export_chrome(struct cuheap_trace *traces, size_t nr, FILE *out)
{
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < nr; i++) {
        uint64_t s =
            (uint64_t)json_integer_value(json_object_get(traces[i].header, "start_unix_ns"));
        if (s < t0)
            t0 = s;
    }
    struct cuheap_chrome c;
    for (size_t i = 0; i < nr; i++) {
        struct cuheap_trace *t = &traces[i];
        char name[128];
        if (t->rank >= 0)
            snprintf(name, sizeof(name), "rank %ld (pid %ld)", t->rank, t->pid);
        else
            snprintf(name, sizeof(name), "pid %ld", t->pid);
        if (i == 0) {
            if (cuheap_chrome_begin(&c, out, t->pid, name))
                return -1;
        } else {
            cuheap_chrome_process(&c, t->pid, name);
        }
        uint64_t off =
            (uint64_t)json_integer_value(json_object_get(t->header, "start_unix_ns")) - t0;
        for (size_t k = 0; k < t->nr_events; k++) {
            const struct cuheap_trace_event *e = &t->events[k];
            json_t *stack = e->type == CUHEAP_EV_ALLOC ? stack_strings(t, e->stack) : NULL;
            struct cuheap_chrome_ev ce = {
                .type = e->type,
                .api = e->api,
                .pooled = e->pooled,
                .device = e->device,
                .ptr = e->ptr,
                .size = e->size,
                .actual = e->actual,
                .aux = e->aux,
                .aux2 = e->aux2,
                .ts_us = (double)(e->t + off) / 1000.0,
                .tid = e->tid,
                .stack_id = e->stack,
                .stack = stack,
                .label = e->label,
            };
            cuheap_chrome_event(&c, &ce);
            json_decref(stack);
        }
    }
    if (nr)
        cuheap_chrome_end(&c);
    return 0;
}

static bool is_interpreter(const char *frame)
{
    return strstr(frame, "python") || strstr(frame, "Python") || strstr(frame, "_PyEval") ||
           strstr(frame, "PyObject_");
}

int export_folded(const struct cuheap_trace *t, enum site_measure m, FILE *out)
{
    struct trace_summary s;
    summarize(t, &s);
    struct site *sites;
    size_t nr = collect_sites(t, &s, m, -1, &sites);
    for (size_t i = 0; i < nr; i++) {
        if (!sites[i].bytes)
            continue;
        const struct cuheap_trace_stack *st = cuheap_trace_stack(t, sites[i].stack);
        if (!st) {
            fprintf(out, "[no stack] %" PRIu64 "\n", sites[i].bytes);
            continue;
        }
        size_t npy = json_array_size(st->python), nn = json_array_size(st->frames);
        char buf[600];
        bool first = true;
        /* Root first: Python from the outermost frame in, then the native frames below the
         * interpreter down to the allocation. */
        for (size_t k = npy; k-- > 0;) {
            cuheap_trace_frame(st, k, buf, sizeof(buf));
            for (char *p = buf; *p; p++)
                if (*p == ';' || *p == ' ')
                    *p = *p == ';' ? ':' : '_';
            fprintf(out, "%s%s", first ? "" : ";", buf);
            first = false;
        }
        for (size_t k = nn; k-- > 0;) {
            cuheap_trace_frame(st, npy + k, buf, sizeof(buf));
            if (npy && is_interpreter(buf))
                continue;
            for (char *p = buf; *p; p++)
                if (*p == ';' || *p == ' ')
                    *p = *p == ';' ? ':' : '_';
            fprintf(out, "%s%s", first ? "" : ";", buf);
            first = false;
        }
        fprintf(out, " %" PRIu64 "\n", sites[i].bytes);
    }
    free(sites);
    return 0;
}

/* ---- a minimal pickle writer (protocol 2), enough for dicts, lists, str, int, None ---- */

static void p_str(FILE *f, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    fputc('X', f);
    fwrite(&n, 4, 1, f); /* little-endian on every machine cuheap runs on */
    fwrite(s, 1, n, f);
}

static void p_int(FILE *f, int64_t v)
{
    if (v >= INT32_MIN && v <= INT32_MAX) {
        int32_t x = (int32_t)v;
        fputc('J', f);
        fwrite(&x, 4, 1, f);
        return;
    }
    /* LONG1: little-endian two's complement, 8 bytes plus a sign byte when needed */
    unsigned char b[9];
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(u >> (8 * i));
    int n = 8;
    if (v > 0 && (b[7] & 0x80))
        b[n++] = 0;
    fputc(0x8a, f);
    fputc(n, f);
    fwrite(b, 1, (size_t)n, f);
}

static void p_key_str(FILE *f, const char *k, const char *v)
{
    p_str(f, k);
    p_str(f, v);
}

static void p_key_int(FILE *f, const char *k, int64_t v)
{
    p_str(f, k);
    p_int(f, v);
}

#define P_DICT_BEGIN(f) fputs("}(", f)
#define P_DICT_END(f)   fputc('u', f)
#define P_LIST_BEGIN(f) fputs("](", f)
#define P_LIST_END(f)   fputc('e', f)

static void p_frames(FILE *f, const struct cuheap_trace *t, uint32_t stack)
{
    P_LIST_BEGIN(f);
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, stack);
    if (s) {
        size_t npy = json_array_size(s->python);
        for (size_t i = 0; i < npy; i++) {
            json_t *fr = json_array_get(s->python, i);
            P_DICT_BEGIN(f);
            const char *file = json_string_value(json_object_get(fr, "file"));
            const char *fn = json_string_value(json_object_get(fr, "function"));
            p_key_str(f, "filename", file ? file : "??");
            p_key_int(f, "line", json_integer_value(json_object_get(fr, "line")));
            p_key_str(f, "name", fn ? fn : "??");
            P_DICT_END(f);
        }
        char buf[600];
        for (size_t i = 0; i < json_array_size(s->frames); i++) {
            cuheap_trace_frame(s, npy + i, buf, sizeof(buf));
            P_DICT_BEGIN(f);
            p_key_str(f, "filename", "??");
            p_key_int(f, "line", 0);
            p_key_str(f, "name", buf);
            P_DICT_END(f);
        }
    }
    P_LIST_END(f);
}

int export_memviz(const struct cuheap_trace *t, FILE *f)
{
    struct trace_summary s;
    summarize(t, &s);
    int max_dev = -1;
    for (unsigned i = 0; i < s.nr_dev; i++)
        if (s.dev[i].device > max_dev)
            max_dev = s.dev[i].device;
    fputs("\x80\x02", f);
    P_DICT_BEGIN(f);
    /* segments: what was still allocated at the end, one segment each */
    p_str(f, "segments");
    P_LIST_BEGIN(f);
    struct live_set live;
    live_set_init(&live);
    for (size_t i = 0; i < t->nr_events; i++) {
        const struct cuheap_trace_event *e = &t->events[i];
        if (!counts_as_device_memory(e))
            continue;
        if (e->type == CUHEAP_EV_ALLOC) {
            struct live_alloc a = {e->ptr,   e->size,   e->actual, e->t,
                                   e->stack, e->device, e->api,    e->pooled};
            live_set_put(&live, &a);
        } else if (e->type == CUHEAP_EV_FREE) {
            live_set_take(&live, e->ptr, NULL);
        }
    }
    for (size_t k = 0; k < live.nr_slots; k++) {
        const struct live_alloc *a = &live.slots[k];
        if (!a->ptr)
            continue;
        P_DICT_BEGIN(f);
        p_key_int(f, "device", a->device);
        p_key_int(f, "address", (int64_t)a->ptr);
        p_key_int(f, "total_size", (int64_t)a->actual);
        p_key_int(f, "allocated_size", (int64_t)a->actual);
        p_key_int(f, "active_size", (int64_t)a->size);
        p_key_int(f, "requested_size", (int64_t)a->size);
        p_key_int(f, "stream", 0);
        p_key_str(f, "segment_type", a->actual >= (1u << 20) ? "large" : "small");
        p_str(f, "blocks");
        P_LIST_BEGIN(f);
        P_DICT_BEGIN(f);
        p_key_int(f, "address", (int64_t)a->ptr);
        p_key_int(f, "size", (int64_t)a->actual);
        p_key_int(f, "requested_size", (int64_t)a->size);
        p_key_str(f, "state", "active_allocated");
        p_str(f, "frames");
        p_frames(f, t, a->stack);
        P_DICT_END(f);
        P_LIST_END(f);
        P_DICT_END(f);
    }
    live_set_free(&live);
    P_LIST_END(f);
    /* device_traces: one list per device ordinal, PyTorch's action names */
    p_str(f, "device_traces");
    P_LIST_BEGIN(f);
    for (int d = 0; d <= max_dev; d++) {
        P_LIST_BEGIN(f);
        for (size_t i = 0; i < t->nr_events; i++) {
            const struct cuheap_trace_event *e = &t->events[i];
            if (e->device != d || (!counts_as_device_memory(e) && e->type != CUHEAP_EV_OOM))
                continue;
            const char *actions[2] = {NULL, NULL};
            switch (e->type) {
            case CUHEAP_EV_ALLOC:
                actions[0] = "alloc";
                break;
            case CUHEAP_EV_FREE:
                actions[0] = "free_requested";
                actions[1] = "free_completed";
                break;
            case CUHEAP_EV_ARENA_GROW:
                actions[0] = "segment_alloc";
                break;
            case CUHEAP_EV_ARENA_RELEASE:
                actions[0] = "segment_free";
                break;
            case CUHEAP_EV_OOM:
                actions[0] = "oom";
                break;
            default:
                break;
            }
            for (int a = 0; a < 2 && actions[a]; a++) {
                P_DICT_BEGIN(f);
                p_key_str(f, "action", actions[a]);
                p_key_int(f, "addr", (int64_t)e->ptr);
                p_key_int(f, "size", (int64_t)(e->type == CUHEAP_EV_OOM ? e->size : e->size));
                p_key_int(f, "stream", (int64_t)e->stream);
                p_key_int(f, "time_us", (int64_t)(e->t / 1000));
                if (e->type == CUHEAP_EV_OOM)
                    p_key_int(f, "device_free", (int64_t)e->aux);
                p_str(f, "frames");
                p_frames(f, t, e->stack);
                P_DICT_END(f);
            }
        }
        P_LIST_END(f);
    }
    P_LIST_END(f);
    p_str(f, "allocator_settings");
    P_DICT_BEGIN(f);
    p_key_str(f, "source", "cuheap");
    P_DICT_END(f);
    P_DICT_END(f);
    fputc('.', f);
    return ferror(f) ? -1 : 0;
}
