/* SPDX-License-Identifier: MIT */
/* Trace reader (see tracereader.h). */
#include "tracereader.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef CUHEAP_HAVE_ZLIB
#include <zlib.h>
#endif

#include "event.h"

/* ---- opening a trace: plain, or gzip-compressed (read through zlib as a stdio stream) ---- */

#ifdef CUHEAP_HAVE_ZLIB
static ssize_t gz_read(void *cookie, char *buf, size_t size)
{
    int n = gzread(cookie, buf, size > INT_MAX ? INT_MAX : (unsigned)size);
    return n < 0 ? -1 : n; /* a cut-off file: what came before it, then the end */
}

/* Only where the reading is, for the progress line: in compressed bytes, as the file's size. */
static int gz_seek(void *cookie, off64_t *pos, int whence)
{
    if (*pos || whence != SEEK_CUR)
        return -1;
    *pos = gzoffset(cookie);
    return 0;
}

static int gz_close(void *cookie)
{
    return gzclose(cookie) == Z_OK ? 0 : -1;
}
#endif

/* Open path for reading, decompressing it as it is read when it starts with gzip's magic
 * bytes. NULL after saying why in err. */
static FILE *open_trace_file(const char *path, char *err, size_t err_size)
{
    FILE *f = fopen(path, "re");
    struct stat st;
    if (!f) {
        snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        snprintf(err, err_size, "%s: is a folder, not a cuheap trace", path);
        return NULL;
    }
    unsigned char magic[2];
    if (pread(fileno(f), magic, 2, 0) != 2 || magic[0] != 0x1f || magic[1] != 0x8b)
        return f; /* a pipe too: read as it is */
#ifdef CUHEAP_HAVE_ZLIB
    int fd = fcntl(fileno(f), F_DUPFD_CLOEXEC, 0);
    fclose(f);
    gzFile gz = fd >= 0 ? gzdopen(fd, "rb") : NULL;
    f = gz ? fopencookie(
                 gz, "r",
                 (cookie_io_functions_t){.read = gz_read, .seek = gz_seek, .close = gz_close})
           : NULL;
    if (!f) {
        if (gz)
            gzclose(gz);
        else if (fd >= 0)
            close(fd);
        snprintf(err, err_size, "%s: cannot read it as gzip: out of memory", path);
    }
    return f;
#else
    fclose(f);
    snprintf(err, err_size,
             "%s: a gzip-compressed file; this cuheap was built without zlib: gunzip it first",
             path);
    return NULL;
#endif
}

static const char *str_or(json_t *v, const char *dflt)
{
    const char *s = json_string_value(v);
    return s ? s : dflt;
}

/* One field's value, from jansson or from the scanner of plain event lines below. */
enum value_kind { V_NONE, V_INT, V_REAL, V_STR, V_TRUE, V_FALSE, V_NULL, V_OTHER };

struct value {
    enum value_kind kind;
    long long i;
    double r;
    const char *s;
};

#define NR_MAX_FLAT 32

/* An event line's fields: a jansson object, or what scan_flat() found. */
struct fields {
    json_t *obj;
    int nr;
    const char *keys[NR_MAX_FLAT];
    struct value vals[NR_MAX_FLAT];
};

/* strcmp() == 0 for the short names of a trace line, inline (a call per key of every event
 * line was a sixth of the reader's time). */
static inline bool same(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static struct value get(const struct fields *f, const char *key)
{
    struct value v = {V_NONE, 0, 0, NULL};
    if (!f->obj) {
        for (int k = f->nr - 1; k >= 0; k--) /* the last of equal keys, as jansson keeps */
            if (same(f->keys[k], key))
                return f->vals[k];
        return v;
    }
    json_t *j = json_object_get(f->obj, key);
    if (!j)
        return v;
    switch (json_typeof(j)) {
    case JSON_INTEGER:
        v.kind = V_INT;
        v.i = json_integer_value(j);
        break;
    case JSON_REAL:
        v.kind = V_REAL;
        v.r = json_real_value(j);
        break;
    case JSON_STRING:
        v.kind = V_STR;
        v.s = json_string_value(j);
        break;
    case JSON_TRUE:
        v.kind = V_TRUE;
        break;
    case JSON_FALSE:
        v.kind = V_FALSE;
        break;
    case JSON_NULL:
        v.kind = V_NULL;
        break;
    default:
        v.kind = V_OTHER;
        break;
    }
    return v;
}

/* A number field: an integer, or a string of one ("0x..." and decimal strings are, for what
 * an int64 cannot hold) into *ret; anything else reads as 0. Returns false when the value is
 * there but is not a byte count or id this reader can use: a negative number, or a string that
 * is not entirely a number. Addresses ("0x" and up to 16 hex digits) take a short path. */
static bool read_number(struct value v, uint64_t *ret)
{
    *ret = 0;
    if (v.kind == V_NONE)
        return true;
    if (v.kind == V_INT) {
        if (v.i < 0)
            return false;
        *ret = (uint64_t)v.i;
        return true;
    }
    if (v.kind == V_REAL)
        return v.r >= 0;
    if (v.kind != V_STR)
        return false;
    const char *s = v.s;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && s[2]) {
        uint64_t n = 0;
        size_t i = 2;
        for (; i < 18; i++) {
            unsigned c = (unsigned char)s[i], d;
            if (c - '0' < 10)
                d = c - '0';
            else if ((c | 0x20) - 'a' < 6)
                d = (c | 0x20) - 'a' + 10;
            else
                break;
            n = n << 4 | d;
        }
        if (!s[i]) {
            *ret = n;
            return true;
        }
    }
    char *end;
    uint64_t n = strtoull(s, &end, 0);
    if (end == s || *end || *s == '-')
        return false;
    *ret = n;
    return true;
}

static bool bad_number(struct value v)
{
    uint64_t n;
    return !read_number(v, &n);
}

static uint64_t number(struct value v)
{
    uint64_t n;
    (void)read_number(v, &n);
    return n;
}

/* Event lines are most of a trace, and jansson builds a whole object for each. The
 * recorder writes them as one flat object of plain values, which this scans in place:
 * strings of printable ASCII without escapes, integers of at most 18 digits, true, false,
 * null. Anything else (escapes, nesting, fractions, a cut-off line) returns false before a
 * byte of line is used, and the caller parses the line with jansson: both read a line the
 * same way. The strings are NUL-terminated inside line, which the caller gives as a copy. */
static bool scan_flat(char *line, size_t len, struct fields *f)
{
    size_t i = 0, ends[2 * NR_MAX_FLAT];
    int nr_ends = 0;
#define SKIP_WS()                                                                                  \
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))   \
    i++
    f->obj = NULL;
    f->nr = 0;
    SKIP_WS();
    if (i >= len || line[i++] != '{')
        return false;
    for (;;) {
        SKIP_WS();
        if (i >= len || line[i] != '"' || f->nr == NR_MAX_FLAT)
            return false;
        size_t k = ++i;
        while (i < len && line[i] != '"' && line[i] != '\\' && (unsigned char)line[i] >= 0x20 &&
               (unsigned char)line[i] < 0x80)
            i++;
        if (i >= len || line[i] != '"')
            return false;
        f->keys[f->nr] = line + k;
        ends[nr_ends++] = i++;
        SKIP_WS();
        if (i >= len || line[i++] != ':')
            return false;
        SKIP_WS();
        struct value *v = &f->vals[f->nr];
        memset(v, 0, sizeof(*v));
        if (i < len && line[i] == '"') {
            size_t b = ++i;
            while (i < len && line[i] != '"' && line[i] != '\\' && (unsigned char)line[i] >= 0x20 &&
                   (unsigned char)line[i] < 0x80)
                i++;
            if (i >= len || line[i] != '"')
                return false;
            v->kind = V_STR;
            v->s = line + b;
            ends[nr_ends++] = i++;
        } else if (i < len && (line[i] == '-' || (line[i] >= '0' && line[i] <= '9'))) {
            bool neg = line[i] == '-';
            size_t b = i += neg;
            long long n = 0;
            while (i < len && line[i] >= '0' && line[i] <= '9' && i - b < 18)
                n = n * 10 + (line[i++] - '0');
            if (i == b || (line[b] == '0' && i - b > 1) ||
                (i < len && (line[i] == '.' || line[i] == 'e' || line[i] == 'E' ||
                             (line[i] >= '0' && line[i] <= '9'))))
                return false; /* a fraction, an exponent, 19+ digits, a leading zero */
            v->kind = V_INT;
            v->i = neg ? -n : n;
        } else if (len - i >= 4 && !memcmp(line + i, "true", 4)) {
            v->kind = V_TRUE;
            i += 4;
        } else if (len - i >= 5 && !memcmp(line + i, "false", 5)) {
            v->kind = V_FALSE;
            i += 5;
        } else if (len - i >= 4 && !memcmp(line + i, "null", 4)) {
            v->kind = V_NULL;
            i += 4;
        } else {
            return false;
        }
        f->nr++;
        SKIP_WS();
        if (i < len && line[i] == ',') {
            i++;
            continue;
        }
        if (i >= len || line[i++] != '}')
            return false;
        break;
    }
    SKIP_WS();
#undef SKIP_WS
    if (i != len)
        return false;
    for (int k = 0; k < nr_ends; k++)
        line[ends[k]] = 0;
    return true;
}

static cuheap_trace_progress_fn progress;

void cuheap_trace_set_progress(cuheap_trace_progress_fn fn)
{
    progress = fn;
}

static void bad_line(struct cuheap_trace *t, size_t lineno, const char *why)
{
    if (!t->nr_bad_lines++) {
        t->first_bad_line = lineno;
        snprintf(t->bad_line_why, sizeof(t->bad_line_why), "%s", why);
    }
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

/* The fields an event line may have, looked up once (clang-format does not settle on
 * X-macro lists, hence off). */
/* clang-format off */
#define EVENT_FIELDS(X) \
    X(seq) X(t) X(event) X(api) X(device) X(tid) X(ptr) X(size) X(actual) X(pooled) X(stream) \
    X(stack) X(label) X(driver_free) X(driver_total) X(limit) X(blocks) X(bytes) X(reserved) \
    X(operations) X(missed) X(correlation) X(count)
/* clang-format on */

struct event_fields {
#define X(name) struct value name;
    EVENT_FIELDS(X)
#undef X
};

/* Where a key's value goes, or NULL for a key events do not have: a switch on the first
 * letter, then at most three comparisons (this runs for every field of every event). */
static struct value *field_slot(struct event_fields *ef, const char *k)
{
#define IS(name)                                                                                   \
    if (same(k, #name))                                                                            \
    return &ef->name
    switch (k[0]) {
    case 'a':
        IS(api);
        IS(actual);
        break;
    case 'b':
        IS(blocks);
        IS(bytes);
        break;
    case 'c':
        IS(correlation);
        IS(count);
        break;
    case 'd':
        IS(device);
        IS(driver_free);
        IS(driver_total);
        break;
    case 'e':
        IS(event);
        break;
    case 'l':
        IS(label);
        IS(limit);
        break;
    case 'm':
        IS(missed);
        break;
    case 'o':
        IS(operations);
        break;
    case 'p':
        IS(ptr);
        IS(pooled);
        break;
    case 'r':
        IS(reserved);
        break;
    case 's':
        if (k[1] == 'e') {
            IS(seq);
        } else if (k[1] == 'i') {
            IS(size);
        } else {
            IS(stream);
            IS(stack);
        }
        break;
    case 't':
        IS(t);
        IS(tid);
        break;
    default:
        break;
    }
#undef IS
    return NULL;
}

static void event_fields(const struct fields *f, struct event_fields *ef)
{
    memset(ef, 0, sizeof(*ef));
    if (f->obj) {
#define X(name) ef->name = get(f, #name);
        EVENT_FIELDS(X)
#undef X
        return;
    }
    for (int k = 0; k < f->nr; k++) { /* in order: the last of equal keys wins, as in jansson */
        struct value *slot = field_slot(ef, f->keys[k]);
        if (slot)
            *slot = f->vals[k];
    }
}

static void check_field(struct cuheap_trace *t, struct value v, const char *key, size_t lineno)
{
    if (!bad_number(v))
        return;
    if (!t->nr_bad_fields++) {
        t->first_bad_field_line = lineno;
        snprintf(t->bad_field, sizeof(t->bad_field), "%s", key);
    }
}

/* Event kind and API names, with the last two answers of each tried first (events alternate
 * between a few kinds): cuheap_*_from_name() compare with every name. */
static _Thread_local int recent_types[2], recent_apis[2];

static int recent(int *memo, const char *name, const char *(*name_of)(unsigned),
                  int (*from_name)(const char *))
{
    for (int k = 0; k < 2; k++)
        if (memo[k] > 0 && same(name_of((unsigned)memo[k]), name))
            return memo[k];
    int r = from_name(name);
    if (r > 0 && r != memo[0]) {
        memo[1] = memo[0];
        memo[0] = r;
    }
    return r;
}

/* A number field's value, counting it in t when it is unusable. */
static uint64_t num(struct cuheap_trace *t, struct value v, const char *key, size_t lineno)
{
    uint64_t n;
    if (!read_number(v, &n) && !t->nr_bad_fields++) {
        t->first_bad_field_line = lineno;
        snprintf(t->bad_field, sizeof(t->bad_field), "%s", key);
    }
    return n;
}

/* An event line into *e; what was wrong with it is counted in t. Returns whether it gave an
 * event (a kind this tool knows, with "seq"). */
static bool parse_event(struct cuheap_trace *t, const struct fields *f, size_t lineno,
                        struct cuheap_trace_event *e)
{
    struct event_fields ef;
    event_fields(f, &ef);
    if (ef.event.kind != V_STR || ef.seq.kind != V_INT) {
        bad_line(t, lineno,
                 ef.event.kind == V_STR ? "an event without \"seq\""
                                        : "an event without \"event\"");
        return false;
    }
    int type =
        recent(recent_types, ef.event.s, cuheap_event_type_name, cuheap_event_type_from_name);
    if (type < 0) {
        t->nr_unknown_events++; /* an event kind from a newer cuheap: skip it */
        return false;
    }
    memset(e, 0, sizeof(*e));
    /* each number read once; unusable values counted, in this order, then the rest */
    e->seq = num(t, ef.seq, "seq", lineno);
    e->t = num(t, ef.t, "t", lineno);
    e->ptr = num(t, ef.ptr, "ptr", lineno);
    e->size = num(t, ef.size, "size", lineno);
    e->actual = num(t, ef.actual, "actual", lineno);
    e->stack = (uint32_t)num(t, ef.stack, "stack", lineno);
    e->tid = (uint32_t)num(t, ef.tid, "tid", lineno);
    e->stream = num(t, ef.stream, "stream", lineno);
    const struct {
        const struct value *v;
        const char *name;
    } rest[] = {{&ef.limit, "limit"},
                {&ef.driver_free, "driver_free"},
                {&ef.driver_total, "driver_total"},
                {&ef.blocks, "blocks"},
                {&ef.bytes, "bytes"},
                {&ef.reserved, "reserved"},
                {&ef.operations, "operations"},
                {&ef.missed, "missed"},
                {&ef.correlation, "correlation"},
                {&ef.count, "count"}};
    for (size_t k = 0; k < sizeof(rest) / sizeof(rest[0]); k++)
        if (rest[k].v->kind != V_NONE)
            check_field(t, *rest[k].v, rest[k].name, lineno);
    if (ef.device.kind != V_NONE && ef.device.kind != V_INT) /* -1 is a device: host memory */
        check_field(t, ef.device, "device", lineno);
    int api = recent(recent_apis, ef.api.kind == V_STR ? ef.api.s : "none", cuheap_api_name,
                     cuheap_api_from_name);
    e->device = (int16_t)(ef.device.kind == V_INT ? ef.device.i : -1);
    e->type = (uint8_t)type;
    e->api = (uint8_t)(api < 0 ? 0 : api);
    e->pooled = ef.pooled.kind == V_TRUE;
    switch (type) {
    case CUHEAP_EV_OOM:
    case CUHEAP_EV_LIMIT:
        e->aux = number(ef.driver_free);
        e->aux2 = number(type == CUHEAP_EV_LIMIT ? ef.limit : ef.driver_total);
        break;
    case CUHEAP_EV_FENCE:
        e->aux = number(ef.blocks);
        e->aux2 = number(ef.bytes);
        break;
    case CUHEAP_EV_ARENA_GROW:
    case CUHEAP_EV_ARENA_RELEASE:
        e->aux = number(ef.reserved);
        break;
    case CUHEAP_EV_AUDIT:
        /* a verdict holds operations/missed, a missed operation correlation/count */
        e->verdict = ef.operations.kind != V_NONE;
        e->aux = number(e->verdict ? ef.operations : ef.correlation);
        e->aux2 = number(e->verdict ? ef.missed : ef.count);
        /* fall through - the label too */
    case CUHEAP_EV_MARK:
        e->label = strdup(ef.label.kind == V_STR ? ef.label.s : "");
        break;
    default:
        break;
    }
    return true;
}

/* ---- events in seq order from a file read again: a window that reorders them ---- */

/* The writer drains events nearly in seq order (threads race only for ring slots), so a
 * min-heap of this many reorders them; a trace whose events stray further is read into
 * memory and sorted instead (cuheap_trace_open() finds out on its first read). */
#define NR_WINDOW (1u << 17)

static size_t window = NR_WINDOW;

void cuheap_trace_set_window(size_t nr)
{
    window = nr ? nr : NR_WINDOW;
}

static void heap_push(struct cuheap_trace_event *h, size_t *n, const struct cuheap_trace_event *e)
{
    size_t i = (*n)++;
    while (i && h[(i - 1) / 2].seq > e->seq) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = *e;
}

static struct cuheap_trace_event heap_pop(struct cuheap_trace_event *h, size_t *n)
{
    struct cuheap_trace_event top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1].seq < h[c].seq)
            c++;
        if (h[c].seq >= last.seq)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* Whether the window's first event is the one after the last that went out (seq 1 first): no
 * event still to come can go before it, so it goes out now rather than a window later. Most
 * traces have no gaps in seq, and their events pass the window at once (a heap of the whole
 * window costs a cache miss per level). After a gap, the window fills, then drains again. The
 * first read and every later one follow the same rule, so they give the same order. */
static bool in_turn(const struct cuheap_trace_event *heap, bool any_out, uint64_t last)
{
    return heap[0].seq <= (any_out ? last + 1 : 1);
}

/* What the first read does with its events: puts them through the window, to learn whether
 * it keeps them in order, and hands them to a visitor while it does. */
struct order_check {
    struct cuheap_trace_event *heap;
    size_t nr;
    uint64_t last; /* seq of the last event out */
    bool any_out, unsorted;
    bool follow; /* a trace being written: every event is visited, late ones too */
    size_t cap;  /* events the heap holds (0: window) */
    cuheap_trace_visit_fn visit;
    void *ctx;
};

static void order_out(struct order_check *w, struct cuheap_trace_event e)
{
    if (w->any_out && e.seq < w->last)
        w->unsorted = true;
    w->last = e.seq;
    w->any_out = true;
    if (w->visit && (!w->unsorted || w->follow))
        w->visit(&e, w->ctx);
    free(e.label);
}

static void order_in(struct order_check *w, const struct cuheap_trace_event *e)
{
    heap_push(w->heap, &w->nr, e);
    while (w->nr == (w->cap ? w->cap : window) || (w->nr && in_turn(w->heap, w->any_out, w->last)))
        order_out(w, heap_pop(w->heap, &w->nr));
}

/* Keep the event (array mode) or only check its order (streaming). Returns -ENOMEM. */
static int add_event(struct cuheap_trace *t, size_t *cap, struct order_check *w,
                     const struct fields *f, size_t lineno)
{
    struct cuheap_trace_event e;
    if (!parse_event(t, f, lineno, &e))
        return 0;
    if (e.t > t->max_t)
        t->max_t = e.t;
    if (w) {
        order_in(w, &e); /* the window owns the label now */
        t->nr_events++;
        return 0;
    }
    if (t->nr_events == *cap) {
        size_t n = *cap ? *cap * 2 : 4096;
        struct cuheap_trace_event *grown = realloc(t->events, n * sizeof(*grown));
        if (!grown) {
            free(e.label);
            return -ENOMEM;
        }
        t->events = grown;
        *cap = n;
    }
    t->events[t->nr_events++] = e;
    return 0;
}

/* What reading keeps between lines: the capacities of the arrays it grows, and the window
 * events go through (NULL: into t->events). */
struct line_state {
    size_t ev_cap, st_cap;
    struct order_check *w;
    char scratch[1024]; /* event lines are about 250 bytes */
};

/* One line of a trace (lineno counts from 1; complete: it ends in a newline). Returns 0, 1
 * when the reading stops here (a last line cut off), or -1 with the reason in err. */
static int take_line(const char *path, struct cuheap_trace *t, struct line_state *ls, char *line,
                     size_t len, size_t lineno, char *err, size_t err_size)
{
    bool complete = len > 0 && line[len - 1] == '\n';
    /* event lines through the scanner, on a copy: the line stays whole for jansson */
    struct fields flat;
    if (lineno > 1 && complete && len <= sizeof(ls->scratch)) {
        memcpy(ls->scratch, line, len);
        if (scan_flat(ls->scratch, len, &flat)) {
            struct value type = get(&flat, "type");
            if (type.kind == V_STR && !strcmp(type.s, "event")) {
                if (add_event(t, &ls->ev_cap, ls->w, &flat, lineno)) {
                    snprintf(err, err_size, "%s: out of memory at line %zu", path, lineno);
                    return -1;
                }
                return 0;
            }
        }
    }
    json_error_t jerr;
    json_t *o = json_loadb(line, len, 0, &jerr);
    if (lineno == 1) {
        const char *fmt = o ? json_string_value(json_object_get(o, "format")) : NULL;
        int r = 0;
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
            return r;
        }
        t->header = o;
        t->pid = (long)json_integer_value(json_object_get(o, "pid"));
        json_t *rank = json_object_get(o, "rank");
        if (json_is_integer(rank))
            t->rank = (long)json_integer_value(rank);
        return 0;
    }
    if (!o || !json_is_object(o)) {
        json_decref(o);
        if (!complete) {
            t->truncated = true; /* the run was killed mid-line */
            return 1;
        }
        bad_line(t, lineno, o ? "not a JSON object" : "not JSON");
        return 0;
    }
    int r = 0;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type) {
        bad_line(t, lineno, "no \"type\"");
    } else if (!strcmp(type, "event")) {
        struct fields fo = {.obj = o};
        if (add_event(t, &ls->ev_cap, ls->w, &fo, lineno)) {
            snprintf(err, err_size, "%s: out of memory at line %zu", path, lineno);
            r = -1;
        }
    } else if (!strcmp(type, "stack")) {
        json_t *id = json_object_get(o, "id"), *fr = json_object_get(o, "frames"),
               *py = json_object_get(o, "python");
        if (!json_is_integer(id) || json_integer_value(id) <= 0 ||
            json_integer_value(id) > UINT32_MAX || (fr && !json_is_array(fr)) ||
            (py && !json_is_array(py))) {
            bad_line(t, lineno, "a stack without a usable id or frames");
            json_decref(o);
            return 0;
        }
        if (t->nr_stacks == ls->st_cap) {
            size_t n = ls->st_cap ? ls->st_cap * 2 : 1024;
            struct cuheap_trace_stack *grown = realloc(t->stacks, n * sizeof(*grown));
            if (!grown) {
                snprintf(err, err_size, "%s: out of memory at line %zu", path, lineno);
                json_decref(o);
                return -1;
            }
            t->stacks = grown;
            ls->st_cap = n;
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
    } else if (!strcmp(type, "oom_recovered")) { /* an out-of-memory that was not one */
        json_int_t dev = json_integer_value(json_object_get(o, "device"));
        json_int_t tries = json_integer_value(json_object_get(o, "tries"));
        if (dev >= 0 && dev < CUHEAP_TRACE_NR_MAX_DEVICES) {
            if (!t->oom_recoveries[dev] && !t->oom_released)
                t->oom_released = (uint64_t)json_integer_value(json_object_get(o, "released"));
            t->oom_recovered[dev] += tries > 0 ? (uint64_t)tries : 1;
            t->oom_recoveries[dev]++;
        }
    } else if (!strcmp(type, "oom_report")) { /* what cuheap told at an out-of-memory */
        if (!t->oom_reports)
            t->oom_reports = json_array();
        json_array_append(t->oom_reports, o);
    }
    json_decref(o);
    return r;
}

static int read_trace(const char *path, struct cuheap_trace *t, char *err, size_t err_size,
                      struct order_check *w)
{
    memset(t, 0, sizeof(*t));
    t->rank = -1;
    FILE *f = open_trace_file(path, err, err_size);
    if (!f)
        return -1;
    struct stat st;
    t->path = strdup(path);
    uint64_t total = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    struct line_state *ls = calloc(1, sizeof(*ls));
    char *line = NULL;
    size_t line_cap = 0, lineno = 0;
    ssize_t len;
    int r = ls ? 0 : -1;
    if (!ls)
        snprintf(err, err_size, "%s: out of memory", path);
    else
        ls->w = w;
    while (!r && (len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        t->nr_lines = lineno;
        if (progress && !(lineno & 0x3fff))
            progress(path, (uint64_t)ftello(f), total, t->nr_events, false);
        r = take_line(path, t, ls, line, (size_t)len, lineno, err, err_size);
    }
    if (r > 0)
        r = 0;
    free(line);
    free(ls);
    if (progress)
        progress(path, (uint64_t)ftello(f), total, t->nr_events, true);
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
    if (t->nr_events && !w)
        qsort(t->events, t->nr_events, sizeof(*t->events), cmp_seq);
    if (t->nr_stacks)
        qsort(t->stacks, t->nr_stacks, sizeof(*t->stacks), cmp_stack);
    return 0;
}

int cuheap_trace_read(const char *path, struct cuheap_trace *t, char *err, size_t err_size)
{
    return read_trace(path, t, err, err_size, NULL);
}

int cuheap_trace_open(const char *path, struct cuheap_trace *t, char *err, size_t err_size)
{
    return cuheap_trace_open_visit(path, t, err, err_size, NULL, NULL, NULL);
}

int cuheap_trace_open_visit(const char *path, struct cuheap_trace *t, char *err, size_t err_size,
                            cuheap_trace_visit_fn visit, void *ctx, bool *ret_visited)
{
    if (ret_visited)
        *ret_visited = false;
    struct order_check w = {.heap = malloc(window * sizeof(*w.heap)), .visit = visit, .ctx = ctx};
    if (!w.heap)
        return cuheap_trace_read(path, t, err, err_size);
    int r = read_trace(path, t, err, err_size, &w);
    if (r)
        w.visit = NULL;
    while (w.nr) /* the rest, in order (or only freed, after an error) */
        order_out(&w, heap_pop(w.heap, &w.nr));
    free(w.heap);
    if (r)
        return r;
    if (!w.unsorted) {
        t->streamed = true;
        if (ret_visited)
            *ret_visited = visit != NULL;
        return 0;
    }
    /* events too far from seq order for the window: all of them in memory, sorted */
    cuheap_trace_free(t);
    return cuheap_trace_read(path, t, err, err_size);
}

const struct cuheap_trace_event *cuheap_trace_first(const struct cuheap_trace *t,
                                                    struct cuheap_trace_iter *it)
{
    memset(it, 0, sizeof(*it));
    it->t = t;
    if (!t->streamed)
        return t->nr_events ? &t->events[0] : NULL;
    char err[16];
    it->f = open_trace_file(t->path, err, sizeof(err));
    it->heap = malloc(window * sizeof(*it->heap));
    it->counters = calloc(1, sizeof(*it->counters));
    if (!it->f || !it->heap || !it->counters) {
        it->failed = true; /* the file went away since it was read */
        return NULL;
    }
    return cuheap_trace_next(it);
}

const struct cuheap_trace_event *cuheap_trace_next(struct cuheap_trace_iter *it)
{
    const struct cuheap_trace *t = it->t;
    if (!t->streamed) {
        it->next++;
        return it->next < t->nr_events ? &t->events[it->next] : NULL;
    }
    free(it->cur.label);
    it->cur.label = NULL;
    if (!it->f)
        return NULL;
    char scratch[1024];
    ssize_t len;
    while (it->nr_heap < window && !it->eof &&
           !(it->nr_heap && in_turn(it->heap, it->any_out, it->last))) {
        if ((len = getline(&it->line, &it->line_cap, it->f)) < 0 || it->line[len - 1] != '\n') {
            it->eof = true; /* the end, or a last line cut off: the first read stopped there */
            break;
        }
        if (++it->lineno == 1)
            continue;
        struct fields flat;
        struct cuheap_trace_event e;
        if ((size_t)len <= sizeof(scratch)) {
            memcpy(scratch, it->line, (size_t)len);
            if (scan_flat(scratch, (size_t)len, &flat)) {
                struct value type = get(&flat, "type");
                if (type.kind == V_STR && !strcmp(type.s, "event") &&
                    parse_event(it->counters, &flat, it->lineno, &e))
                    heap_push(it->heap, &it->nr_heap, &e);
                continue;
            }
        }
        json_t *o = json_loadb(it->line, (size_t)len, 0, NULL);
        struct fields fo = {.obj = o};
        if (json_is_object(o) && !strcmp(str_or(json_object_get(o, "type"), ""), "event") &&
            parse_event(it->counters, &fo, it->lineno, &e))
            heap_push(it->heap, &it->nr_heap, &e);
        json_decref(o);
    }
    if (!it->nr_heap)
        return NULL;
    it->cur = heap_pop(it->heap, &it->nr_heap);
    it->last = it->cur.seq;
    it->any_out = true;
    return &it->cur;
}

void cuheap_trace_iter_end(struct cuheap_trace_iter *it)
{
    if (!it->t || !it->t->streamed)
        return;
    free(it->cur.label);
    while (it->nr_heap)
        free(heap_pop(it->heap, &it->nr_heap).label);
    free(it->heap);
    free(it->line);
    if (it->counters)
        cuheap_trace_free(it->counters);
    free(it->counters);
    if (it->f)
        fclose(it->f);
    memset(it, 0, sizeof(*it));
}

void cuheap_trace_free(struct cuheap_trace *t)
{
    for (size_t i = 0; t->events && i < t->nr_events; i++) /* none kept when streamed */
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
    json_decref(t->oom_reports);
    memset(t, 0, sizeof(*t));
}

uint64_t cuheap_trace_recovered(const struct cuheap_trace *t, int device)
{
    return device >= 0 && device < CUHEAP_TRACE_NR_MAX_DEVICES ? t->oom_recovered[device] : 0;
}

const struct cuheap_trace_stack *cuheap_trace_stack(const struct cuheap_trace *t, uint32_t id)
{
    struct cuheap_trace_stack key = {.id = id};
    /* bsearch on NULL is undefined, even for no elements: a trace may have no stacks */
    if (!id || !t->nr_stacks)
        return NULL;
    return bsearch(&key, t->stacks, t->nr_stacks, sizeof(key), cmp_stack);
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

/* ---- following a trace being written ---- */

/* Events a followed trace holds back for one in seq order still to come: the writer drains its
 * ring nearly in order, so a few thousand are plenty. */
#define NR_TAIL_WINDOW 8192
#define TAIL_CHUNK     (1u << 20)

struct cuheap_trace_tail_state {
    struct line_state ls;
    struct order_check w;
    char *partial; /* the start of a line not yet whole */
    size_t nr_partial, cap_partial;
    char *chunk;
};

int cuheap_trace_tail_open(const char *path, struct cuheap_trace_tail *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->fd = -1;
    ret->t.rank = -1;
    ret->t.path = strdup(path);
    ret->st = calloc(1, sizeof(*ret->st));
    if (ret->st) {
        ret->st->w.heap = malloc(NR_TAIL_WINDOW * sizeof(*ret->st->w.heap));
        ret->st->chunk = malloc(TAIL_CHUNK);
    }
    if (!ret->t.path || !ret->st || !ret->st->w.heap || !ret->st->chunk) {
        cuheap_trace_tail_close(ret);
        return -ENOMEM;
    }
    ret->st->w.cap = NR_TAIL_WINDOW;
    ret->st->w.follow = true;
    ret->st->ls.w = &ret->st->w;
    return 0;
}

/* One whole line (or the last, cut-off piece when final). Returns take_line's answer. */
static int tail_line(struct cuheap_trace_tail *tt, char *line, size_t len, char *err,
                     size_t err_size)
{
    tt->lineno++;
    tt->t.nr_lines = tt->lineno;
    int r = take_line(tt->t.path, &tt->t, &tt->st->ls, line, len, tt->lineno, err, err_size);
    if (r == 0 && tt->t.footer)
        tt->ended = true;
    return r;
}

int cuheap_trace_tail_poll(struct cuheap_trace_tail *tt, cuheap_trace_visit_fn visit, void *ctx,
                           char *err, size_t err_size)
{
    struct cuheap_trace_tail_state *st = tt->st;
    st->w.visit = visit;
    st->w.ctx = ctx;
    /* events held back since the last poll: what they waited for is not coming */
    while (st->w.nr && tt->held)
        order_out(&st->w, heap_pop(st->w.heap, &st->w.nr));
    if (tt->fd < 0) {
        tt->fd = open(tt->t.path, O_RDONLY | O_CLOEXEC);
        if (tt->fd < 0) {
            if (errno == ENOENT)
                return 0; /* not written yet */
            snprintf(err, err_size, "%s: cannot open: %s", tt->t.path, strerror(errno));
            return -1;
        }
        struct stat sb;
        if (fstat(tt->fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            snprintf(err, err_size, "%s: is a folder, not a cuheap trace", tt->t.path);
            return -1;
        }
    }
    size_t got = 0;
    for (;;) {
        ssize_t n = pread(tt->fd, st->chunk, TAIL_CHUNK, (off_t)tt->offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, err_size, "%s: cannot read: %s", tt->t.path, strerror(errno));
            return -1;
        }
        if (n == 0)
            break;
        if (tt->offset == 0 && n >= 2 && (unsigned char)st->chunk[0] == 0x1f &&
            (unsigned char)st->chunk[1] == 0x8b) {
            snprintf(err, err_size,
                     "%s: a gzip-compressed trace, which cannot grow: `cuheap report` reads it",
                     tt->t.path);
            return -1;
        }
        tt->offset += (uint64_t)n;
        got += (size_t)n;
        char *p = st->chunk, *end = st->chunk + n;
        while (p < end) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t piece = (size_t)((nl ? nl + 1 : end) - p);
            if (!nl || st->nr_partial) { /* keep it, or finish the line kept */
                if (st->nr_partial + piece > st->cap_partial) {
                    size_t cap = (st->nr_partial + piece) * 2;
                    char *grown = realloc(st->partial, cap);
                    if (!grown) {
                        snprintf(err, err_size, "%s: out of memory", tt->t.path);
                        return -1;
                    }
                    st->partial = grown;
                    st->cap_partial = cap;
                }
                memcpy(st->partial + st->nr_partial, p, piece);
                st->nr_partial += piece;
                if (nl) {
                    int r = tail_line(tt, st->partial, st->nr_partial, err, err_size);
                    st->nr_partial = 0;
                    if (r < 0)
                        return -1;
                }
            } else if (tail_line(tt, p, piece, err, err_size) < 0) {
                return -1;
            }
            p += piece;
        }
        if ((size_t)n < TAIL_CHUNK)
            break;
    }
    /* a first line that cannot become a header, said before it ends (a binary file may never
     * hold a newline); JSON may start with blanks */
    size_t lead = 0;
    while (lead < st->nr_partial &&
           (st->partial[lead] == ' ' || st->partial[lead] == '\t' || st->partial[lead] == '\r'))
        lead++;
    if (tt->lineno == 0 && lead < st->nr_partial && st->partial[lead] != '{' &&
        st->partial[lead] != '[') {
        snprintf(err, err_size, "%s: not a cuheap trace (line 1 is not a cuheap header)",
                 tt->t.path);
        return -1;
    }
    if (tt->ended) /* nothing more is coming: the rest, in order */
        while (st->w.nr)
            order_out(&st->w, heap_pop(st->w.heap, &st->w.nr));
    tt->held = st->w.nr > 0;
    if (tt->t.nr_stacks > 1 &&
        tt->t.stacks[tt->t.nr_stacks - 1].id < tt->t.stacks[tt->t.nr_stacks - 2].id)
        qsort(tt->t.stacks, tt->t.nr_stacks, sizeof(*tt->t.stacks), cmp_stack);
    return got > 0;
}

void cuheap_trace_tail_close(struct cuheap_trace_tail *tt)
{
    if (tt->st) {
        while (tt->st->w.nr)
            free(heap_pop(tt->st->w.heap, &tt->st->w.nr).label);
        free(tt->st->w.heap);
        free(tt->st->partial);
        free(tt->st->chunk);
        free(tt->st);
    }
    if (tt->fd >= 0)
        close(tt->fd);
    cuheap_trace_free(&tt->t);
    memset(tt, 0, sizeof(*tt));
    tt->fd = -1;
}
