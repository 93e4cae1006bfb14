/* SPDX-License-Identifier: MIT */
/* Trace reader (see tracereader.h). */
#include "tracereader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"

static const char *str_or(json_t *v, const char *dflt)
{
    const char *s = json_string_value(v);
    return s ? s : dflt;
}

/* A number field: a JSON integer, or a string ("0x..." or decimal) for what an int64 cannot
 * hold (the writer gives byte counts of 2^63 and above as "0x..." strings; trace-format.md).
 * Anything else reads as 0. */
static uint64_t hex_or_int(json_t *v)
{
    if (json_is_integer(v))
        return (uint64_t)json_integer_value(v);
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        uint64_t n = strtoull(s, &end, 0);
        return errno || end == s || *end || *s == '-' ? 0 : n;
    }
    return 0;
}

static int cmp_seq(const void *a, const void *b)
{
    const struct cuheap_trace_event *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cmp_stack(const void *a, const void *b)
{
    const struct cuheap_trace_stack *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int add_event(struct cuheap_trace *t, size_t *cap, json_t *o)
{
    if (t->nr_events == *cap) {
        size_t n = *cap ? *cap * 2 : 4096;
        struct cuheap_trace_event *e = realloc(t->events, n * sizeof(*e));
        if (!e)
            return -ENOMEM;
        t->events = e;
        *cap = n;
    }
    int type = cuheap_event_type_from_name(str_or(json_object_get(o, "event"), ""));
    if (type < 0)
        return 0; /* an event kind from a newer cuheap: skip it */
    int api = cuheap_api_from_name(str_or(json_object_get(o, "api"), "none"));
    struct cuheap_trace_event *e = &t->events[t->nr_events++];
    memset(e, 0, sizeof(*e));
    e->seq = hex_or_int(json_object_get(o, "seq"));
    e->t = hex_or_int(json_object_get(o, "t"));
    e->ptr = hex_or_int(json_object_get(o, "ptr"));
    e->size = hex_or_int(json_object_get(o, "size"));
    e->actual = hex_or_int(json_object_get(o, "actual"));
    e->stream = hex_or_int(json_object_get(o, "stream"));
    e->stack = (uint32_t)hex_or_int(json_object_get(o, "stack"));
    e->tid = (uint32_t)hex_or_int(json_object_get(o, "tid"));
    json_t *dev = json_object_get(o, "device");
    e->device = (int16_t)(json_is_integer(dev) ? json_integer_value(dev) : -1);
    e->type = (uint8_t)type;
    e->api = (uint8_t)(api < 0 ? 0 : api);
    e->pooled = json_is_true(json_object_get(o, "pooled"));
    switch (type) {
    case CUHEAP_EV_OOM:
    case CUHEAP_EV_LIMIT:
        e->aux = hex_or_int(json_object_get(o, "driver_free"));
        e->aux2 =
            hex_or_int(json_object_get(o, type == CUHEAP_EV_LIMIT ? "limit" : "driver_total"));
        break;
    case CUHEAP_EV_FENCE:
        e->aux = hex_or_int(json_object_get(o, "blocks"));
        e->aux2 = hex_or_int(json_object_get(o, "bytes"));
        break;
    case CUHEAP_EV_ARENA_GROW:
    case CUHEAP_EV_ARENA_RELEASE:
        e->aux = hex_or_int(json_object_get(o, "reserved"));
        break;
    case CUHEAP_EV_AUDIT:
        /* a verdict holds operations/missed, a missed operation correlation/count */
        e->aux = hex_or_int(
            json_object_get(o, json_object_get(o, "operations") ? "operations" : "correlation"));
        e->aux2 =
            hex_or_int(json_object_get(o, json_object_get(o, "operations") ? "missed" : "count"));
        e->verdict = json_object_get(o, "operations") != NULL;
        /* fall through - the label too */
    case CUHEAP_EV_MARK: {
        const char *l = json_string_value(json_object_get(o, "label"));
        e->label = strdup(l ? l : "");
        break;
    }
    default:
        break;
    }
    return 0;
}

int cuheap_trace_read(const char *path, struct cuheap_trace *t, char *err, size_t err_size)
{
    memset(t, 0, sizeof(*t));
    t->rank = -1;
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    t->path = strdup(path);
    char *line = NULL;
    size_t line_cap = 0, ev_cap = 0, st_cap = 0, lineno = 0;
    ssize_t len;
    int r = 0;
    while ((len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        bool complete = len > 0 && line[len - 1] == '\n';
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)len, 0, &jerr);
        if (lineno == 1) {
            const char *fmt = o ? json_string_value(json_object_get(o, "format")) : NULL;
            if (!o && line[0] == '[') {
                snprintf(err, err_size,
                         "%s: a Chrome trace (CUHEAP_FORMAT=chrome), which "
                         "Perfetto opens; the cuheap tool reads the JSON Lines format",
                         path);
                r = -1;
            } else if (!o || !fmt || strcmp(fmt, "cuheap-trace")) {
                snprintf(err, err_size,
                         "%s: not a cuheap trace (line 1 is not a cuheap "
                         "header)",
                         path);
                r = -1;
            } else if (json_integer_value(json_object_get(o, "version")) > 1) {
                snprintf(err, err_size,
                         "%s: trace format version %lld is newer than this "
                         "tool understands (1)",
                         path, (long long)json_integer_value(json_object_get(o, "version")));
                r = -1;
            }
            if (r) {
                json_decref(o);
                break;
            }
            t->header = o;
            t->pid = (long)json_integer_value(json_object_get(o, "pid"));
            json_t *rank = json_object_get(o, "rank");
            if (json_is_integer(rank))
                t->rank = (long)json_integer_value(rank);
            continue;
        }
        if (!o || !json_is_object(o)) {
            json_decref(o);
            if (!complete) {
                t->truncated = true; /* the run was killed mid-line */
                break;
            }
            if (!t->nr_bad_lines++)
                t->first_bad_line = lineno;
            continue;
        }
        const char *type = json_string_value(json_object_get(o, "type"));
        if (!type) {
            if (!t->nr_bad_lines++)
                t->first_bad_line = lineno;
        } else if (!strcmp(type, "event")) {
            if (add_event(t, &ev_cap, o)) {
                snprintf(err, err_size, "%s: out of memory at line %zu", path, lineno);
                r = -1;
            }
        } else if (!strcmp(type, "stack")) {
            if (t->nr_stacks == st_cap) {
                st_cap = st_cap ? st_cap * 2 : 1024;
                t->stacks = realloc(t->stacks, st_cap * sizeof(*t->stacks));
            }
            struct cuheap_trace_stack *s = &t->stacks[t->nr_stacks++];
            s->id = (uint32_t)json_integer_value(json_object_get(o, "id"));
            s->frames = json_incref(json_object_get(o, "frames"));
            s->python = json_incref(json_object_get(o, "python"));
        } else if (!strcmp(type, "device")) {
            if (t->nr_devices < CUHEAP_TRACE_NR_MAX_DEVICES) {
                struct cuheap_trace_device *d = &t->devices[t->nr_devices++];
                d->ordinal = (int)json_integer_value(json_object_get(o, "device"));
                const char *n = json_string_value(json_object_get(o, "name"));
                d->name = strdup(n ? n : "?");
                d->total = (uint64_t)json_integer_value(json_object_get(o, "total"));
            }
        } else if (!strcmp(type, "footer")) {
            json_decref(t->footer);
            t->footer = json_incref(o);
        }
        json_decref(o);
        if (r)
            break;
    }
    free(line);
    fclose(f);
    if (r == 0 && lineno == 0) {
        snprintf(err, err_size, "%s: empty file, not a cuheap trace", path);
        r = -1;
    }
    if (r) {
        cuheap_trace_free(t);
        return -1;
    }
    if (!t->footer)
        t->truncated = true;
    if (t->nr_events)
        qsort(t->events, t->nr_events, sizeof(*t->events), cmp_seq);
    if (t->nr_stacks)
        qsort(t->stacks, t->nr_stacks, sizeof(*t->stacks), cmp_stack);
    return 0;
}

void cuheap_trace_free(struct cuheap_trace *t)
{
    for (size_t i = 0; i < t->nr_events; i++)
        free(t->events[i].label);
    for (size_t i = 0; i < t->nr_stacks; i++) {
        json_decref(t->stacks[i].frames);
        json_decref(t->stacks[i].python);
    }
    for (unsigned i = 0; i < t->nr_devices; i++)
        free(t->devices[i].name);
    free(t->events);
    free(t->stacks);
    free(t->path);
    json_decref(t->header);
    json_decref(t->footer);
    memset(t, 0, sizeof(*t));
}

const struct cuheap_trace_stack *cuheap_trace_stack(const struct cuheap_trace *t, uint32_t id)
{
    struct cuheap_trace_stack key = {.id = id};
    return id ? bsearch(&key, t->stacks, t->nr_stacks, sizeof(key), cmp_stack) : NULL;
}

static const char *basename_of(const char *p)
{
    const char *s = p ? strrchr(p, '/') : NULL;
    return s ? s + 1 : (p ? p : "?");
}

static void native_frame(json_t *fr, char *buf, size_t size)
{
    const char *mod = json_string_value(json_object_get(fr, "module"));
    const char *fn = json_string_value(json_object_get(fr, "function"));
    const char *off = json_string_value(json_object_get(fr, "offset"));
    const char *ip = json_string_value(json_object_get(fr, "ip"));
    const char *file = json_string_value(json_object_get(fr, "file"));
    if (fn && file)
        snprintf(buf, size, "%s (%s:%lld)", fn, basename_of(file),
                 (long long)json_integer_value(json_object_get(fr, "line")));
    else if (mod && fn)
        snprintf(buf, size, "%s (%s)", fn, basename_of(mod));
    else if (mod)
        snprintf(buf, size, "%s+%s", basename_of(mod), off ? off : "?");
    else
        snprintf(buf, size, "%s", ip ? ip : "?");
}

static void python_frame(json_t *fr, char *buf, size_t size)
{
    snprintf(buf, size, "%s:%lld in %s", str_or(json_object_get(fr, "file"), "?"),
             (long long)json_integer_value(json_object_get(fr, "line")),
             str_or(json_object_get(fr, "function"), "?"));
}

bool cuheap_trace_frame(const struct cuheap_trace_stack *s, size_t i, char *buf, size_t size)
{
    size_t npy = json_array_size(s->python);
    if (i < npy) {
        python_frame(json_array_get(s->python, i), buf, size);
        return true;
    }
    i -= npy;
    if (i < json_array_size(s->frames)) {
        native_frame(json_array_get(s->frames, i), buf, size);
        return true;
    }
    return false;
}

/* Libraries whose frames say nothing about who allocated. */
static bool is_plumbing(const char *mod)
{
    const char *b = basename_of(mod);
    static const char *const skip[] = {"libcuheap",   "libcuda.", "libcudart",
                                       "libc10_cuda", "libcuda-", "libc.so",
                                       "libcupy",     "libxla",   NULL};
    for (int i = 0; skip[i]; i++)
        if (!strncmp(b, skip[i], strlen(skip[i])))
            return true;
    return false;
}

const char *cuheap_trace_site(const struct cuheap_trace *t, uint32_t stack, char *buf, size_t size)
{
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, stack);
    if (!s) {
        snprintf(buf, size, "(no stack)");
        return buf;
    }
    size_t npy = json_array_size(s->python);
    if (npy) {
        /* the program's own line says more than a library's: skip installed packages and
         * the standard library when the stack has a frame of the user's code */
        size_t pick = 0;
        for (size_t i = 0; i < npy; i++) {
            const char *file = str_or(json_object_get(json_array_get(s->python, i), "file"), "");
            if (!strstr(file, "/site-packages/") && !strstr(file, "/dist-packages/") &&
                !strstr(file, "/lib/python3") && file[0] != '<') {
                pick = i;
                break;
            }
        }
        python_frame(json_array_get(s->python, pick), buf, size);
        return buf;
    }
    size_t n = json_array_size(s->frames);
    for (size_t i = 0; i < n; i++) {
        json_t *fr = json_array_get(s->frames, i);
        const char *mod = json_string_value(json_object_get(fr, "module"));
        if (mod && !is_plumbing(mod)) {
            /* the first frame of the program, and who called it: allocation helpers are
             * shared by many sites */
            native_frame(fr, buf, size);
            if (i + 1 < n) {
                size_t used = strlen(buf);
                snprintf(buf + used, size - used, " < ");
                used = strlen(buf);
                native_frame(json_array_get(s->frames, i + 1), buf + used, size - used);
            }
            return buf;
        }
    }
    if (n)
        native_frame(json_array_get(s->frames, 0), buf, size);
    else
        snprintf(buf, size, "(no stack)");
    return buf;
}
