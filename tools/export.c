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

/* "train.py --lr 3e-4 (rank 1, pid 4242 on node7)": what a user recognizes a process by. */
static void process_name(const struct cuheap_trace *t, char *buf, size_t size)
{
    json_t *argv = json_object_get(t->header, "cmdline");
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < json_array_size(argv) && n + 4 < size; i++) {
        const char *a = json_string_value(json_array_get(argv, i));
        if (!a)
            continue;
        if (i == 0) { /* the program's name, not its folder */
            const char *slash = strrchr(a, '/');
            a = slash ? slash + 1 : a;
        }
        n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? " " : "", a);
    }
    if (n >= 60) /* long command lines make unreadable track names */
        snprintf(buf + 56, size - 56, "...");
    if (!buf[0]) {
        const char *exe = json_string_value(json_object_get(t->header, "exe"));
        snprintf(buf, size, "%s", exe ? exe : "process");
    }
    n = strlen(buf);
    const char *host = json_string_value(json_object_get(t->header, "host"));
    if (t->rank >= 0)
        n += (size_t)snprintf(buf + n, size - n, " (rank %ld, ", t->rank);
    else
        n += (size_t)snprintf(buf + n, size - n, " (");
    if (n < size)
        snprintf(buf + n, size - n, "pid %ld%s%s)", t->pid, host ? " on " : "", host ? host : "");
}

static void feed(struct cuheap_chrome *c, const struct cuheap_trace *t,
                 const struct cuheap_trace_event *e, double ts_us)
{
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
        .ts_us = ts_us,
        .tid = e->tid,
        .stack_id = e->stack,
        .stack = stack,
        .label = e->label,
    };
    cuheap_chrome_event(c, &ce);
    json_decref(stack);
}

static int cmp_order(const void *a, const void *b)
{
    const struct live_alloc *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* What was held when the window opens (arenas, then allocations, each in the order they
 * were made: .t holds the order), given at its start so the counters and slices begin
 * right. */
static void open_window(struct cuheap_chrome *c, const struct cuheap_trace *t,
                        struct live_set held[2], double ts_us)
{
    for (int set = 0; set < 2; set++) {
        struct live_alloc *v = malloc((held[set].nr_used + 1) * sizeof(*v));
        size_t n = 0;
        if (!v)
            return;
        for (size_t k = 0; k < held[set].nr_slots; k++)
            if (held[set].slots[k].ptr)
                v[n++] = held[set].slots[k];
        if (n)
            qsort(v, n, sizeof(*v), cmp_order);
        for (size_t k = 0; k < n; k++) {
            struct cuheap_trace_event e = {
                .type = set ? CUHEAP_EV_ALLOC : CUHEAP_EV_ARENA_GROW,
                .api = v[k].api,
                .pooled = v[k].pooled,
                .device = v[k].device,
                .ptr = v[k].ptr,
                .size = v[k].size,
                .actual = v[k].actual,
                .stack = v[k].stack,
            };
            feed(c, t, &e, ts_us);
        }
        free(v);
    }
}

int export_chrome(struct cuheap_trace *traces, size_t nr, uint64_t from_ns, uint64_t to_ns,
                  FILE *out)
{
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < nr; i++) {
        uint64_t s =
            (uint64_t)json_integer_value(json_object_get(traces[i].header, "start_unix_ns"));
        if (s < t0)
            t0 = s;
    }
    struct cuheap_chrome c;
    long *pids = calloc(nr + 1, sizeof(*pids));
    if (!pids)
        return -1;
    for (size_t i = 0; i < nr; i++) {
        struct cuheap_trace *t = &traces[i];
        char name[256];
        process_name(t, name, sizeof(name));
        /* Ranks on different hosts can share a pid; the viewer must still see two
         * processes. The name keeps the real one. */
        long pid = t->pid;
        for (size_t k = 0; k < i; k++)
            if (pids[k] == pid) {
                pid += 1L << 22; /* above Linux's pid_max */
                k = (size_t)-1;
            }
        pids[i] = pid;
        int r =
            i == 0 ? cuheap_chrome_begin(&c, out, pid, name) : cuheap_chrome_process(&c, pid, name);
        if (r) {
            free(pids);
            if (i)
                cuheap_chrome_end(&c);
            return -1;
        }
        uint64_t off =
            (uint64_t)json_integer_value(json_object_get(t->header, "start_unix_ns")) - t0;
        /* before the window: only what is held, by address, in the order made (.t): arenas
         * apart from allocations, as an arena's first block has its address */
        struct live_set held[2];
        live_set_init(&held[0]);
        live_set_init(&held[1]);
        bool opened = from_ns == 0;
        struct cuheap_trace_iter it;
        size_t k = 0;
        for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
             e = cuheap_trace_next(&it), k++) {
            uint64_t at = e->t + off;
            if (!opened && at < from_ns) {
                struct live_alloc a = {.ptr = e->ptr,
                                       .size = e->size,
                                       .actual = e->actual,
                                       .t = k,
                                       .stack = e->stack,
                                       .device = e->device,
                                       .api = e->api,
                                       .pooled = e->pooled};
                if (!e->ptr)
                    continue;
                if (e->type == CUHEAP_EV_ARENA_GROW || e->type == CUHEAP_EV_ALLOC)
                    live_set_put(&held[e->type == CUHEAP_EV_ALLOC], &a);
                else if (e->type == CUHEAP_EV_ARENA_RELEASE || e->type == CUHEAP_EV_FREE)
                    live_set_take(&held[e->type == CUHEAP_EV_FREE], e->ptr, NULL);
                continue;
            }
            if (!opened) {
                open_window(&c, t, held, (double)from_ns / 1000.0);
                opened = true;
            }
            if (to_ns && at > to_ns)
                break; /* seq order is nearly time order: what follows is later still */
            feed(&c, t, e, (double)at / 1000.0);
        }
        cuheap_trace_iter_end(&it);
        if (!opened)
            open_window(&c, t, held, (double)from_ns / 1000.0);
        live_set_free(&held[0]);
        live_set_free(&held[1]);
    }
    if (nr)
        cuheap_chrome_end(&c);
    free(pids);
    return 0;
}

static bool is_interpreter(const char *frame)
{
    return strstr(frame, "python") || strstr(frame, "Python") || strstr(frame, "_PyEval") ||
           strstr(frame, "PyObject_");
}

/* A frame as folded stacks can hold it: ';' separates frames and a line break ends the line
 * (a frame name with one split its line in two, found by fuzzing). Spaces stay: flamegraph.pl,
 * speedscope and inferno take the count after the line's last space, so "forward (model.py:42)"
 * keeps its name; other white space becomes a space. */
static void folded_name(char *buf)
{
    for (char *p = buf; *p; p++)
        if (*p == ';')
            *p = ':';
        else if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
}

int export_folded(const struct cuheap_trace *t, const struct trace_summary *s, enum site_measure m,
                  FILE *out)
{
    struct site *sites;
    size_t nr = collect_sites(t, s, m, -1, &sites);
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
            folded_name(buf);
            fprintf(out, "%s%s", first ? "" : ";", buf);
            first = false;
        }
        for (size_t k = nn; k-- > 0;) {
            cuheap_trace_frame(st, npy + k, buf, sizeof(buf));
            if (npy && is_interpreter(buf))
                continue;
            folded_name(buf);
            fprintf(out, "%s%s", first ? "" : ";", buf);
            first = false;
        }
        fprintf(out, " %" PRIu64 "\n", sites[i].bytes);
    }
    free(sites);
    return 0;
}
