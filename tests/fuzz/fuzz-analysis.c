/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer targets: what the cuheap tool does with a trace once it is read. Every command's
 * analysis runs on it: report, top (--by peak and total), leaks, folded (both), memviz, html,
 * chrome, into /dev/null. tools/cuheap.c is compiled into this file (its main renamed)
 * because report, top and leaks are its static functions; nothing in tools/ is edited for it.
 *
 * Two targets are built from this file:
 * - analysis: the input is a trace file, read as `cuheap` reads it;
 * - events (-DFUZZ_EVENTS): the input is a list of 8-byte event records that become a trace
 *   directly, so inputs of a few kilobytes hold thousands of events in any order, which a
 *   JSON trace of the same size cannot (see from_records()).
 *
 * One part of `load()` is left out: symbolization opens every module path a trace names
 * (a fuzzed trace names /dev/stdin or a FIFO and the run hangs, issue 12), so it is replaced
 * by a no-op here. Checked besides the sanitizers' findings: peaks are at least what is left
 * at the end, sites come sorted by bytes, the Chrome trace parses as JSON and the folded
 * stacks as "frames BYTES" lines.
 */
#include "fuzz.h"

#define main cuheap_tool_main
int cuheap_tool_main(int argc, char **argv);
#include "cuheap.c"
#undef main

void symbolize_trace(struct cuheap_trace *t)
{
    (void)t; /* see the top of the file */
}

void symbolize_stack(struct cuheap_trace_stack *s)
{
    (void)s; /* the same, for a followed trace */
}

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stdio();
    devnull = fopen("/dev/null", "we");
    fuzz_check(devnull != NULL);
    return 0;
}

/* collect_sites() as `top`, `leaks` and `report` use it, with the checks that hold for any
 * trace. */
static void sites(struct cuheap_trace *t, struct trace_summary *s, enum site_measure m, int device)
{
    struct site *v;
    size_t nr = collect_sites(t, s, m, device, &v);
    for (size_t i = 0; i < nr; i++) {
        fuzz_check(i == 0 || v[i - 1].bytes >= v[i].bytes);
        fuzz_check(v[i].count > 0);
    }
    print_sites(t, v, nr, 20, NULL);
    free(v);
}

/* What viewers read must parse: the Chrome trace as JSON (Perfetto), folded stacks as
 * "frames BYTES" lines (flamegraph.pl). */
static void check_outputs(struct cuheap_trace *t, const struct trace_summary *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fuzz_check(f != NULL);
    export_chrome(t, 1, 0, 0, f);
    fuzz_check(fclose(f) == 0);
    json_error_t err;
    json_t *doc = json_loadb(buf, len, 0, &err);
    if (!doc)
        dprintf(2, "chrome output is not JSON: %s at line %d\n", err.text, err.line);
    fuzz_check(json_is_array(doc));
    json_decref(doc);
    free(buf);

    f = open_memstream(&buf, &len);
    fuzz_check(f != NULL);
    export_folded(t, s, SITES_TOTAL, f);
    fuzz_check(fclose(f) == 0);
    for (char *line = buf, *end; line < buf + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(buf + len - line));
        fuzz_check(end != NULL); /* every line ends */
        char *sp = memrchr(line, ' ', (size_t)(end - line));
        fuzz_check(sp && sp + 1 < end);
        for (char *d = sp + 1; d < end; d++)
            fuzz_check(*d >= '0' && *d <= '9');
    }
    free(buf);
}

/* The HTML report both ways the tool builds its charts: during one read, and in the second
 * read it falls back on. */
static void html(struct cuheap_trace *t, const struct trace_summary *s)
{
    uint64_t start = (uint64_t)json_integer_value(json_object_get(t->header, "start_unix_ns"));
    uint64_t last = t->max_t, offset, end;
    bool any = t->nr_events > 0;
    bool apart = html_axis(1, &start, &last, &any, &offset, &end);
    struct trace_summary one;
    summarize_begin(&one);
    struct html_chart *c = html_chart_begin(&one, offset, end);
    fuzz_check(c != NULL);
    struct cuheap_trace_iter it;
    for (const struct cuheap_trace_event *e = cuheap_trace_first(t, &it); e;
         e = cuheap_trace_next(&it))
        html_chart_event(e, c);
    cuheap_trace_iter_end(&it);
    summarize_end(&one);
    if (!html_chart_end(c))
        export_html(t, &one, &c, 1, end, apart, devnull);
    html_chart_free(c);
    summary_free(&one);
    c = html_chart_again(t, s, offset, end);
    fuzz_check(c != NULL);
    export_html(t, s, &c, 1, end, apart, devnull);
    html_chart_free(c);
}

static void analyse(struct cuheap_trace *t)
{
    struct trace_summary s;
    summarize(t, &s);
    fuzz_check(s.nr_dev <= CUHEAP_TRACE_NR_MAX_DEVICES);
    for (unsigned i = 0; i < s.nr_dev; i++) {
        const struct device_summary *d = &s.dev[i];
        fuzz_check(d->peak_live >= d->live && d->peak_reserved >= d->reserved);
        fuzz_check(d->nr_pooled <= d->nr_allocs);
        fuzz_check(d->peak_live == 0 || d->peak_live_index < t->nr_events);
        sites(t, &s, SITES_AT_PEAK, d->device);
    }
    sites(t, &s, SITES_AT_PEAK, -1);
    sites(t, &s, SITES_TOTAL, -1);
    sites(t, &s, SITES_LEAKED, -1);

    report_one(t, &s);
    export_folded(t, &s, SITES_AT_PEAK, devnull);
    export_folded(t, &s, SITES_TOTAL, devnull);
    export_memviz(t, 1000, false, devnull);
    export_memviz(t, 1000, true, devnull);
    html(t, &s);
    check_outputs(t, &s);
    summary_free(&s);
}

#ifndef FUZZ_EVENTS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cuheap_trace t;
    if (load(fuzz_file(data, size), &t))
        return 0;
    analyse(&t);
    cuheap_trace_free(&t);
    return 0;
}

#else

/* Stacks 1 to 7 of every events trace: native frames, Python frames, both, and deep. */
static const char *const stack_json[] = {
    "{\"frames\":[{\"ip\":\"0x1\",\"module\":\"/opt/app\",\"offset\":\"0x10\"}]}",
    "{\"frames\":[{\"ip\":\"0x2\",\"module\":\"/usr/lib/libcudart.so.12\",\"offset\":"
    "\"0x20\",\"function\":\"cudaMalloc\"},{\"ip\":\"0x3\",\"module\":\"/opt/app\","
    "\"offset\":\"0x30\",\"function\":\"alloc_layer\",\"file\":\"/src/a;b c.c\","
    "\"line\":7}]}",
    "{\"frames\":[],\"python\":[{\"file\":\"/usr/lib/python3/dist-packages/torch/x.py\","
    "\"line\":1,\"function\":\"f\"},{\"file\":\"train.py\",\"line\":42,\"function\":"
    "\"<step>\"}]}",
    "{\"frames\":[{\"ip\":\"0x4\",\"module\":\"/usr/bin/python3\",\"offset\":\"0x40\","
    "\"function\":\"_PyEval_EvalFrameDefault\"}],\"python\":[{\"file\":\"<frozen>\","
    "\"line\":0,\"function\":\"g\"}]}",
    "{\"frames\":[{\"ip\":\"0x5\"},{\"module\":\"lib\\\"q\\\"<&>.so\"},{}]}",
    "{\"frames\":[{\"ip\":\"0x6\",\"module\":\"/usr/lib/libc.so.6\",\"offset\":\"0x60\"}]}",
    "{\"frames\":[{\"ip\":\"0x7\",\"module\":\"/opt/app\",\"offset\":\"0x70\"},"
    "{\"ip\":\"0x8\",\"module\":\"/opt/app\",\"offset\":\"0x80\"},{\"ip\":\"0x9\","
    "\"module\":\"/opt/app\",\"offset\":\"0x90\"}]}",
};
#define NR_STACKS (sizeof(stack_json) / sizeof(stack_json[0]))

/*
 * One event per 8 bytes, b[0..7]:
 *   b0 type (1..8)        b1 api (low 4 bits, mod NR_APIS), pooled (bit 7)
 *   b2 device: 0 below 128, else (b2 - 128) % 80 - 1, so -1 and up to 78 devices
 *   b3 address: one of 64 (frees find their allocations)
 *   b4 b5 size, shifted left by b6's low 5 bits (up to 2^47)
 *   b6 stack id (top 3 bits; 0 = none)
 *   b7 time step in us, signed: threads make time go back in seq order
 */
static void from_records(const uint8_t *data, size_t size, struct cuheap_trace *t)
{
    memset(t, 0, sizeof(*t));
    t->path = strdup("events");
    t->rank = -1;
    t->pid = 1;
    t->header =
        json_pack("{s:s, s:i, s:s}", "format", "cuheap-trace", "version", 1, "exe", "/opt/app");
    t->truncated = true;
    t->nr_devices = 2;
    for (unsigned d = 0; d < 2; d++)
        t->devices[d] = (struct cuheap_trace_device){(int)d, strdup("fuzz"), 80ull << 30};
    t->nr_stacks = NR_STACKS;
    t->stacks = calloc(NR_STACKS, sizeof(*t->stacks));
    for (size_t i = 0; i < NR_STACKS; i++) {
        json_t *o = json_loads(stack_json[i], 0, NULL);
        fuzz_check(o != NULL);
        t->stacks[i].id = (uint32_t)i + 1;
        t->stacks[i].frames = json_incref(json_object_get(o, "frames"));
        t->stacks[i].python = json_incref(json_object_get(o, "python"));
        json_decref(o);
    }
    t->nr_events = size / 8;
    t->events = calloc(t->nr_events ? t->nr_events : 1, sizeof(*t->events));
    uint64_t now = 1000000;
    for (size_t i = 0; i < t->nr_events; i++) {
        const uint8_t *b = data + 8 * i;
        struct cuheap_trace_event *e = &t->events[i];
        e->seq = i + 1;
        now += (uint64_t)((int64_t)(int8_t)b[7] * 1000);
        e->t = now;
        e->type = (uint8_t)(b[0] % (CUHEAP_NR_EVENT_TYPES - 1) + 1);
        e->api = (uint8_t)((b[1] & 15) % CUHEAP_NR_APIS);
        e->pooled = b[1] >> 7;
        e->device = (int16_t)(b[2] < 128 ? 0 : (b[2] - 128) % 80 - 1);
        e->ptr = ((uint64_t)(b[3] % 64) + 1) << 20;
        e->size = (uint64_t)(b[4] | b[5] << 8) << (b[6] & 31);
        e->actual = e->size;
        e->stack = b[6] >> 5;
        e->tid = b[7] & 3;
        if (e->type == CUHEAP_EV_MARK)
            e->label = strdup("step");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cuheap_trace t;
    from_records(data, size, &t);
    analyse(&t);
    cuheap_trace_free(&t);
    return 0;
}

#endif
