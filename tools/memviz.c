/* SPDX-License-Identifier: MIT */
/*
 * `cuheap memviz`: a pickled snapshot in the shape of torch.cuda.memory._snapshot(), for
 * https://pytorch.org/memory_viz and torch.cuda._memory_viz.
 *
 * The snapshot's `segments` are what cuheap really held from the driver at the end of the
 * trace: the pool's arenas (arena_grow .. arena_release) and every allocation that went to
 * the driver on its own (one segment each). Each segment's `blocks` tile it in address order:
 * `active_allocated`, `active_pending_free` (freed by the program, waiting for a fence before
 * reuse) and `inactive` (free space in an arena). `device_traces` hold, per device, the
 * actions that lead there: alloc, free_requested, free_completed, segment_alloc,
 * segment_free, oom. memory_viz's Allocator State History starts from the segments and walks
 * the actions backwards, so the two must agree at every step: the replay below keeps that
 * invariant even on a damaged trace (dropped events), by completing what a later event
 * proves was gone.
 *
 * By default the actions tell what the program held, so that memory_viz shows the figures
 * `cuheap report` does: alloc and free_completed carry the requested size, and a free is
 * completed when the program frees (the Active Memory Timeline then peaks at the report's peak
 * live, and Allocator State History's "allocated" is what was live). With pool_view they tell
 * what the pool set aside, as PyTorch's allocator reports its own: block sizes, and a pooled
 * free completed only at the fence that makes it reusable (active_pending_free meanwhile).
 * Blocks in the segments always have their block size, with requested_size beside it. Times
 * are wall-clock microseconds, as PyTorch's; every segment and action is in pool (0, 0),
 * PyTorch's default pool.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "export.h"

enum action {
    ACT_ALLOC,
    ACT_FREE_REQUESTED,
    ACT_FREE_COMPLETED,
    ACT_SEGMENT_ALLOC,
    ACT_SEGMENT_FREE,
    ACT_OOM,
};

static const char *const action_names[] = {
    [ACT_ALLOC] = "alloc",
    [ACT_FREE_REQUESTED] = "free_requested",
    [ACT_FREE_COMPLETED] = "free_completed",
    [ACT_SEGMENT_ALLOC] = "segment_alloc",
    [ACT_SEGMENT_FREE] = "segment_free",
    [ACT_OOM] = "oom",
};

struct entry {
    uint64_t addr, size, stream, time_us, device_free;
    uint32_t stack;
    uint8_t action;
};

/* Block states, kept in live_alloc.api (the set is shared with the analysis). */
#define ALLOCATED    1
#define PENDING_FREE 2

struct device_replay {
    struct entry *entries;
    size_t nr_entries, cap_entries;
    uint64_t nr_dropped; /* the oldest, beyond max_entries: entries is then a ring whose
                            oldest is entries[nr_dropped % cap_entries] */
    uint64_t *pending;   /* addresses freed and waiting for a fence, oldest first */
    size_t pending_head, nr_pending, cap_pending;
    uint64_t reserved; /* bytes in live segments */
};

struct replay {
    const struct cuheap_trace *t;
    struct device_replay dev[CUHEAP_TRACE_NR_MAX_DEVICES];
    /* blocks: ptr, size = requested, actual = block size, api = state, pooled = inside an
     * arena; segments: ptr, actual = size, pooled = an arena (else one allocation's own) */
    struct live_set blocks, segments;
    struct live_alloc *arenas; /* the live arenas again, few: where pool blocks may lie */
    size_t nr_arenas, cap_arenas;
    bool fence_reuse;   /* CUHEAP_REUSE=fence: pooled frees wait for a fence event */
    bool pool_view;     /* actions in block sizes, frees completed at their fence */
    size_t max_entries; /* per device, 0: all */
    uint64_t now_us;    /* wall clock */
    uint64_t start_ns;  /* the trace's start, since the epoch */
};

/* An action's size for a block: what the program asked for, or under pool_view the block. */
static uint64_t shown(const struct replay *r, const struct live_alloc *b)
{
    return r->pool_view ? b->actual : b->size;
}

static struct entry *add_entry(struct replay *r, int dev, uint8_t action, uint64_t addr,
                               uint64_t size, uint64_t stream, uint32_t stack)
{
    struct device_replay *d = &r->dev[dev];
    struct entry *e;
    if (r->max_entries && d->nr_entries == r->max_entries) {
        /* keep the newest max_entries only: memory stays bounded on long traces */
        e = &d->entries[d->nr_dropped++ % d->nr_entries];
    } else {
        if (d->nr_entries == d->cap_entries) {
            size_t n = d->cap_entries ? d->cap_entries * 2 : 1024;
            if (r->max_entries && n > r->max_entries)
                n = r->max_entries;
            d->entries = realloc(d->entries, n * sizeof(*d->entries));
            if (!d->entries)
                abort(); /* the tool, not the host program: out of memory ends it */
            d->cap_entries = n;
        }
        e = &d->entries[d->nr_entries++];
    }
    *e = (struct entry){
        .addr = addr,
        .size = size,
        .stream = stream,
        .time_us = r->now_us,
        .stack = stack,
        .action = action,
    };
    return e;
}
static bool lookup(struct live_set *s, uint64_t ptr, struct live_alloc *ret)
{
    if (!live_set_take(s, ptr, ret))
        return false;
    live_set_put(s, ret);
    return true;
}

/* The block at ptr is gone: free_requested (unless already requested), free_completed. */
static void complete_block(struct replay *r, const struct live_alloc *b)
{
    if (b->api == ALLOCATED)
        add_entry(r, b->device, ACT_FREE_REQUESTED, b->ptr, shown(r, b), 0, b->stack);
    add_entry(r, b->device, ACT_FREE_COMPLETED, b->ptr, shown(r, b), 0, b->stack);
    live_set_take(&r->blocks, b->ptr, NULL);
}

static void segment_free(struct replay *r, const struct live_alloc *s)
{
    /* every block inside goes first, so no step of the history has a block without its
     * segment. A driver allocation's segment holds one block, at its start: no scan (a
     * program with the pool off frees thousands of them). */
    struct live_alloc own;
    if (!s->pooled) {
        if (lookup(&r->blocks, s->ptr, &own))
            complete_block(r, &own);
    }
    for (size_t k = 0; s->pooled && k < r->blocks.nr_slots; k++) {
        struct live_alloc b = r->blocks.slots[k];
        if (b.ptr && b.ptr >= s->ptr && b.ptr - s->ptr < s->actual) {
            complete_block(r, &b);
            k = (size_t)-1; /* the table moved under the deletion: start over */
        }
    }
    add_entry(r, s->device, ACT_SEGMENT_FREE, s->ptr, s->actual, 0, s->stack);
    for (size_t k = 0; s->pooled && k < r->nr_arenas; k++)
        if (r->arenas[k].ptr == s->ptr) {
            r->arenas[k] = r->arenas[--r->nr_arenas];
            break;
        }
    struct device_replay *d = &r->dev[s->device];
    d->reserved -= s->actual < d->reserved ? s->actual : d->reserved;
    live_set_take(&r->segments, s->ptr, NULL);
}

static void segment_alloc(struct replay *r, int dev, uint64_t ptr, uint64_t size, bool arena,
                          uint32_t stack)
{
    struct live_alloc old;
    if (lookup(&r->segments, ptr, &old)) /* a reset device forgot it without a word */
        segment_free(r, &old);
    struct live_alloc s = {
        .ptr = ptr, .actual = size, .stack = stack, .device = (int16_t)dev, .pooled = arena};
    live_set_put(&r->segments, &s);
    if (arena) {
        if (r->nr_arenas == r->cap_arenas) {
            r->cap_arenas = r->cap_arenas ? r->cap_arenas * 2 : 16;
            r->arenas = realloc(r->arenas, r->cap_arenas * sizeof(*r->arenas));
            if (!r->arenas)
                abort();
        }
        r->arenas[r->nr_arenas++] = s;
    }
    r->dev[dev].reserved += size;
    add_entry(r, dev, ACT_SEGMENT_ALLOC, ptr, size, 0, stack);
}

static bool in_arena(struct replay *r, int dev, uint64_t ptr)
{
    /* arenas are few (the pool doubles them): a scan is enough */
    for (size_t k = 0; k < r->nr_arenas; k++) {
        const struct live_alloc *a = &r->arenas[k];
        if (a->device == dev && ptr >= a->ptr && ptr - a->ptr < a->actual)
            return true;
    }
    return false;
}

static void on_alloc(struct replay *r, const struct cuheap_trace_event *e)
{
    struct live_alloc old;
    if (lookup(&r->blocks, e->ptr, &old)) { /* its free was lost: it is gone now */
        complete_block(r, &old);
        if (!old.pooled && lookup(&r->segments, e->ptr, &old))
            segment_free(r, &old);
    }
    uint64_t block = e->actual ? e->actual : e->size;
    bool arena = e->pooled && in_arena(r, e->device, e->ptr);
    if (!arena) /* the driver's own allocation (or a pool block whose arena was not seen) */
        segment_alloc(r, e->device, e->ptr, block, false, e->stack);
    struct live_alloc b = {.ptr = e->ptr,
                           .size = e->size,
                           .actual = block,
                           .stack = e->stack,
                           .device = e->device,
                           .api = ALLOCATED,
                           .pooled = arena};
    live_set_put(&r->blocks, &b);
    add_entry(r, e->device, ACT_ALLOC, e->ptr, shown(r, &b), e->stream, e->stack);
}

static void on_free(struct replay *r, const struct cuheap_trace_event *e)
{
    struct live_alloc b;
    if (!lookup(&r->blocks, e->ptr, &b) || b.api != ALLOCATED)
        return; /* its allocation was not seen */
    add_entry(r, e->device, ACT_FREE_REQUESTED, b.ptr, shown(r, &b), e->stream, b.stack);
    struct device_replay *d = &r->dev[e->device];
    if (b.pooled && r->pool_view && r->fence_reuse && e->api != CUHEAP_API_TORCH) {
        /* reusable only after the fence that follows: its state says so meanwhile */
        b.api = PENDING_FREE;
        live_set_put(&r->blocks, &b);
        if (d->pending_head + d->nr_pending == d->cap_pending) {
            if (d->pending_head) {
                memmove(d->pending, d->pending + d->pending_head,
                        d->nr_pending * sizeof(*d->pending));
                d->pending_head = 0;
            } else {
                d->cap_pending = d->cap_pending ? d->cap_pending * 2 : 256;
                d->pending = realloc(d->pending, d->cap_pending * sizeof(*d->pending));
                if (!d->pending)
                    abort();
            }
        }
        d->pending[d->pending_head + d->nr_pending++] = b.ptr;
        return;
    }
    add_entry(r, e->device, ACT_FREE_COMPLETED, b.ptr, shown(r, &b), e->stream, b.stack);
    live_set_take(&r->blocks, b.ptr, NULL);
    struct live_alloc s;
    if (!b.pooled && lookup(&r->segments, b.ptr, &s) && !s.pooled)
        segment_free(r, &s); /* the driver's own allocation: its segment goes with it */
}

/* A fence made `blocks` freed blocks reusable. The trace does not say which: the oldest
 * pending ones, as the pool's epochs close in order. */
static void on_fence(struct replay *r, const struct cuheap_trace_event *e)
{
    struct device_replay *d = &r->dev[e->device];
    for (uint64_t n = e->aux; n && d->nr_pending; d->nr_pending--, d->pending_head++) {
        struct live_alloc b;
        uint64_t ptr = d->pending[d->pending_head];
        if (!lookup(&r->blocks, ptr, &b) || b.api != PENDING_FREE)
            continue; /* completed already, by a reuse of its address */
        add_entry(r, b.device, ACT_FREE_COMPLETED, b.ptr, shown(r, &b), 0, b.stack);
        live_set_take(&r->blocks, ptr, NULL);
        n--;
    }
}

static void on_oom(struct replay *r, const struct cuheap_trace_event *e)
{
    struct entry *oom = add_entry(r, e->device, ACT_OOM, 0, e->size, e->stream, e->stack);
    struct device_replay *d = &r->dev[e->device];
    /* what the program could still have had: the driver's free memory, or under
     * CUHEAP_LIMIT what the limit left */
    uint64_t free_bytes = e->aux;
    if (e->type == CUHEAP_EV_LIMIT)
        free_bytes = e->aux2 > d->reserved ? e->aux2 - d->reserved : 0;
    oom->device_free = free_bytes;
}

static void replay_trace(struct replay *r)
{
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(r->t, &it); e;
         e = cuheap_trace_next(&it)) {
        if (e->device < 0 || e->device >= CUHEAP_TRACE_NR_MAX_DEVICES)
            continue;
        r->now_us = (r->start_ns + e->t) / 1000;
        bool mem = counts_as_device_memory(e);
        switch (e->type) {
        case CUHEAP_EV_ALLOC:
            if (mem)
                on_alloc(r, e);
            break;
        case CUHEAP_EV_FREE:
            if (mem)
                on_free(r, e);
            break;
        case CUHEAP_EV_FENCE:
            on_fence(r, e);
            break;
        case CUHEAP_EV_ARENA_GROW:
            segment_alloc(r, e->device, e->ptr, e->size, true, 0);
            break;
        case CUHEAP_EV_ARENA_RELEASE: {
            struct live_alloc s;
            if (lookup(&r->segments, e->ptr, &s))
                segment_free(r, &s);
            break;
        }
        case CUHEAP_EV_OOM:
        case CUHEAP_EV_LIMIT:
            on_oom(r, e);
            break;
        default:
            break;
        }
    }
    cuheap_trace_iter_end(&it);
}

/* ---- a minimal pickle writer (protocol 2): dicts, lists, str, int, and a memo ---- */

struct pickler {
    FILE *f;
    const struct cuheap_trace *t;
    uint32_t *frames_memo; /* per stack (index in t->stacks): memo slot + 1, 0 = not yet */
    uint32_t nr_memo;
};

static void p_str(FILE *f, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    fputc('X', f);
    fwrite(&n, 4, 1, f); /* little-endian on every machine cuheap runs on */
    fwrite(s, 1, n, f);
}

static void p_int(FILE *f, uint64_t u)
{
    if (u <= INT32_MAX) {
        int32_t x = (int32_t)u;
        fputc('J', f);
        fwrite(&x, 4, 1, f);
        return;
    }
    /* LONG1: little-endian two's complement; a ninth byte keeps large values positive */
    unsigned char b[9];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(u >> (8 * i));
    int n = 8;
    if (b[7] & 0x80)
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

static void p_key_int(FILE *f, const char *k, uint64_t v)
{
    p_str(f, k);
    p_int(f, v);
}

/* segment_pool_id: (0, 0), PyTorch's default pool (memory_viz says "pool_id unknown" for an
 * action whose segment is gone by the snapshot and that names none). */
static void p_pool_id(FILE *f)
{
    p_str(f, "segment_pool_id");
    p_int(f, 0);
    p_int(f, 0);
    fputc(0x86, f); /* TUPLE2 */
}

#define P_DICT_BEGIN(f) fputs("}(", f)
#define P_DICT_END(f)   fputc('u', f)
#define P_LIST_BEGIN(f) fputs("](", f)
#define P_LIST_END(f)   fputc('e', f)

static void p_frame(FILE *f, const char *file, int64_t line, const char *name)
{
    P_DICT_BEGIN(f);
    p_key_str(f, "filename", file ? file : "??");
    p_key_int(f, "line", line > 0 ? (uint64_t)line : 0);
    p_key_str(f, "name", name ? name : "??");
    P_DICT_END(f);
}

static bool is_interpreter(json_t *fr)
{
    const char *mod = json_string_value(json_object_get(fr, "module"));
    const char *fn = json_string_value(json_object_get(fr, "function"));
    return (mod && strstr(mod, "python")) ||
           (fn && (!strncmp(fn, "_PyEval", 7) || !strncmp(fn, "PyEval", 6) ||
                   !strncmp(fn, "_PyFunction", 11)));
}

/* A stack as PyTorch's frames, innermost first: the native frames down to the interpreter,
 * then the Python frames. A native frame is split into filename (source file, else the
 * module), line (0 when unknown) and name (function, else module+offset). Each stack is
 * written once and referred to through the pickle memo afterwards. */
static void p_frames(struct pickler *p, uint32_t stack)
{
    FILE *f = p->f;
    const struct cuheap_trace_stack *s = cuheap_trace_stack(p->t, stack);
    if (!s) {
        fputs("]", f);
        return;
    }
    size_t idx = (size_t)(s - p->t->stacks);
    if (p->frames_memo[idx]) {
        uint32_t slot = p->frames_memo[idx] - 1;
        fputc('j', f); /* LONG_BINGET */
        fwrite(&slot, 4, 1, f);
        return;
    }
    P_LIST_BEGIN(f);
    size_t npy = json_array_size(s->python);
    for (size_t i = 0; i < json_array_size(s->frames); i++) {
        json_t *fr = json_array_get(s->frames, i);
        if (npy && is_interpreter(fr))
            break;
        const char *file = json_string_value(json_object_get(fr, "file"));
        const char *mod = json_string_value(json_object_get(fr, "module"));
        const char *fn = json_string_value(json_object_get(fr, "function"));
        char name[600];
        if (!fn) {
            const char *off = json_string_value(json_object_get(fr, "offset"));
            const char *ip = json_string_value(json_object_get(fr, "ip"));
            const char *base = mod ? strrchr(mod, '/') : NULL;
            if (mod)
                snprintf(name, sizeof(name), "%s+%s", base ? base + 1 : mod, off ? off : "?");
            else
                snprintf(name, sizeof(name), "%s", ip ? ip : "??");
            fn = name;
        }
        p_frame(f, file ? file : mod, json_integer_value(json_object_get(fr, "line")), fn);
    }
    for (size_t i = 0; i < npy; i++) {
        json_t *fr = json_array_get(s->python, i);
        p_frame(f, json_string_value(json_object_get(fr, "file")),
                json_integer_value(json_object_get(fr, "line")),
                json_string_value(json_object_get(fr, "function")));
    }
    P_LIST_END(f);
    uint32_t slot = p->nr_memo++;
    fputc('r', f); /* LONG_BINPUT */
    fwrite(&slot, 4, 1, f);
    p->frames_memo[idx] = slot + 1;
}

static int cmp_addr(const void *a, const void *b)
{
    const struct live_alloc *x = a, *y = b;
    return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

/* The live entries of a set, sorted by address. */
static struct live_alloc *sorted(const struct live_set *s, size_t *ret_nr)
{
    struct live_alloc *v = malloc((s->nr_used + 1) * sizeof(*v));
    if (!v)
        abort();
    size_t n = 0;
    for (size_t k = 0; k < s->nr_slots; k++)
        if (s->slots[k].ptr)
            v[n++] = s->slots[k];
    if (n)
        qsort(v, n, sizeof(*v), cmp_addr);
    *ret_nr = n;
    return v;
}

static void p_block(struct pickler *p, uint64_t addr, uint64_t size, uint64_t requested,
                    const char *state, uint32_t stack)
{
    FILE *f = p->f;
    P_DICT_BEGIN(f);
    p_key_int(f, "address", addr);
    p_key_int(f, "size", size);
    p_key_int(f, "requested_size", requested);
    p_key_str(f, "state", state);
    p_str(f, "frames");
    p_frames(p, stack);
    P_DICT_END(f);
}

static void p_segments(struct pickler *p, struct replay *r)
{
    FILE *f = p->f;
    size_t nr_segs, nr_blocks, bi = 0;
    struct live_alloc *segs = sorted(&r->segments, &nr_segs);
    struct live_alloc *blocks = sorted(&r->blocks, &nr_blocks);
    P_LIST_BEGIN(f);
    for (size_t i = 0; i < nr_segs; i++) {
        const struct live_alloc *s = &segs[i];
        uint64_t end = s->ptr + s->actual, allocated = 0, active = 0, requested = 0;
        while (bi < nr_blocks && blocks[bi].ptr < s->ptr)
            bi++; /* outside every segment: cannot happen, see segment_free() */
        size_t first = bi;
        for (size_t k = first; k < nr_blocks && blocks[k].ptr < end; k++) {
            active += blocks[k].actual;
            if (blocks[k].api == ALLOCATED) {
                allocated += blocks[k].actual;
                requested += blocks[k].size;
            }
        }
        P_DICT_BEGIN(f);
        p_key_int(f, "device", (uint64_t)s->device);
        p_key_int(f, "address", s->ptr);
        p_key_int(f, "total_size", s->actual);
        p_key_int(f, "allocated_size", allocated);
        p_key_int(f, "active_size", active);
        p_key_int(f, "requested_size", requested);
        p_key_int(f, "stream", 0);
        /* PyTorch's small pool holds 2 MiB segments; everything else is "large" */
        p_key_str(f, "segment_type", s->actual <= (2u << 20) ? "small" : "large");
        p_pool_id(f);
        p_str(f, "frames");
        p_frames(p, s->stack);
        p_str(f, "blocks");
        P_LIST_BEGIN(f);
        uint64_t at = s->ptr;
        for (; bi < nr_blocks && blocks[bi].ptr < end; bi++) {
            const struct live_alloc *b = &blocks[bi];
            if (b->ptr < at)
                continue; /* overlaps the previous block: a damaged trace */
            if (b->ptr > at)
                p_block(p, at, b->ptr - at, 0, "inactive", 0);
            uint64_t size = b->actual < end - b->ptr ? b->actual : end - b->ptr;
            p_block(p, b->ptr, size, b->size < size ? b->size : size,
                    b->api == ALLOCATED ? "active_allocated" : "active_pending_free", b->stack);
            at = b->ptr + size;
        }
        if (at < end)
            p_block(p, at, end - at, 0, "inactive", 0);
        P_LIST_END(f);
        P_DICT_END(f);
    }
    P_LIST_END(f);
    free(segs);
    free(blocks);
}

int export_memviz(const struct cuheap_trace *t, size_t max_entries, bool pool_view, FILE *f)
{
    struct replay *r = calloc(1, sizeof(*r));
    if (!r)
        return -1;
    r->t = t;
    const char *reuse =
        json_string_value(json_object_get(json_object_get(t->header, "config"), "CUHEAP_REUSE"));
    r->fence_reuse = !reuse || !strcmp(reuse, "fence");
    r->max_entries = max_entries;
    r->pool_view = pool_view;
    r->start_ns = (uint64_t)json_integer_value(json_object_get(t->header, "start_unix_ns"));
    live_set_init(&r->blocks);
    live_set_init(&r->segments);
    replay_trace(r);

    struct pickler p = {.f = f, .t = t, .frames_memo = calloc(t->nr_stacks + 1, sizeof(uint32_t))};
    fputs("\x80\x02", f);
    P_DICT_BEGIN(f);
    p_str(f, "segments");
    p_segments(&p, r);
    int nr_dev = 0;
    for (int d = 0; d < CUHEAP_TRACE_NR_MAX_DEVICES; d++)
        if (r->dev[d].nr_entries)
            nr_dev = d + 1;
    for (unsigned i = 0; i < t->nr_devices; i++)
        if (t->devices[i].ordinal >= nr_dev && t->devices[i].ordinal < CUHEAP_TRACE_NR_MAX_DEVICES)
            nr_dev = t->devices[i].ordinal + 1;
    p_str(f, "device_traces");
    P_LIST_BEGIN(f);
    for (int d = 0; d < nr_dev; d++) {
        struct device_replay *dr = &r->dev[d];
        /* PyTorch's max_entries: the newest are kept, and the history still starts from
         * the snapshot, so it stays consistent */
        P_LIST_BEGIN(f);
        for (size_t i = 0; i < dr->nr_entries; i++) {
            const struct entry *e = &dr->entries[(dr->nr_dropped + i) % dr->nr_entries];
            P_DICT_BEGIN(f);
            p_key_str(f, "action", action_names[e->action]);
            p_key_int(f, "addr", e->addr);
            p_key_int(f, "size", e->size);
            p_key_int(f, "stream", e->stream);
            p_key_int(f, "time_us", e->time_us);
            if (e->action == ACT_OOM)
                p_key_int(f, "device_free", e->device_free);
            p_pool_id(f);
            p_str(f, "frames");
            p_frames(&p, e->stack);
            P_DICT_END(f);
        }
        P_LIST_END(f);
        free(dr->entries);
        free(dr->pending);
    }
    P_LIST_END(f);
    p_str(f, "allocator_settings");
    P_DICT_BEGIN(f);
    p_key_str(f, "source", "cuheap");
    p_key_str(f, "reuse", reuse ? reuse : "fence");
    p_key_str(f, "sizes",
              pool_view ? "blocks, freed at their fence" : "requested, freed when freed");
    P_DICT_END(f);
    P_DICT_END(f);
    fputc('.', f);
    free(p.frames_memo);
    live_set_free(&r->blocks);
    live_set_free(&r->segments);
    free(r->arenas);
    free(r);
    return ferror(f) ? -1 : 0;
}
