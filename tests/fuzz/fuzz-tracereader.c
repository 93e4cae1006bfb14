/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the trace reader's public API (src/tracereader.h) on arbitrary bytes as
 * a trace file. Besides the sanitizers' findings it checks what the tool relies on: a failed
 * read says why and leaves nothing behind; a good one has a cuheap header, events in seq
 * order, stacks in id order, every stack findable by its id, and names for every site and
 * frame that fit the caller's buffer, however small.
 */
#include <string.h>

#include "event.h"
#include "fuzz.h"
#include "tracereader.h"

/* Text the reader writes into a caller's buffer: terminated inside it. */
static void check_text(const char *buf, size_t size)
{
    fuzz_check(memchr(buf, 0, size) != NULL);
}

static void check_stack_text(const struct cuheap_trace *t, uint32_t id)
{
    static const size_t sizes[] = {1, 7, 700};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        char buf[700];
        memset(buf, 'x', sizeof(buf));
        fuzz_check(cuheap_trace_site(t, id, buf, sizes[k]) == buf);
        check_text(buf, sizes[k]);
    }
    const struct cuheap_trace_stack *s = cuheap_trace_stack(t, id);
    if (!s)
        return;
    fuzz_check(s->id == id);
    char buf[64];
    for (size_t i = 0; i < 256 && cuheap_trace_frame(s, i, buf, sizeof(buf)); i++)
        check_text(buf, sizeof(buf));
}

static void count_event(const struct cuheap_trace_event *e, void *ctx)
{
    fuzz_check(e->type >= CUHEAP_EV_ALLOC && e->type < CUHEAP_NR_EVENT_TYPES);
    (*(size_t *)ctx)++;
}

/* Following the same bytes, written in two pieces cut at any byte (polled between), hands
 * over as many events as reading them at once. */
static void check_tail(const uint8_t *data, size_t size, size_t nr_events)
{
    size_t cut = size > 1 ? data[size / 2] % size : 0;
    const char *path = fuzz_file(data, cut);
    struct cuheap_trace_tail tt;
    char err[600];
    size_t n = 0;
    if (cuheap_trace_tail_open(path, &tt))
        return;
    int r = cuheap_trace_tail_poll(&tt, count_event, &n, err, sizeof(err));
    if (r >= 0) {
        fuzz_file(data, size); /* the same file, grown */
        r = cuheap_trace_tail_poll(&tt, count_event, &n, err, sizeof(err));
    }
    if (r >= 0)
        r = cuheap_trace_tail_poll(&tt, count_event, &n, err, sizeof(err)); /* held ones */
    fuzz_check(r >= 0);
    fuzz_check(n == nr_events);
    cuheap_trace_tail_close(&tt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    struct cuheap_trace t;
    char err[600];
    memset(err, 'x', sizeof(err));
    if (cuheap_trace_read(path, &t, err, sizeof(err))) {
        check_text(err, sizeof(err));
        fuzz_check(!strncmp(err, path, strlen(path))); /* "PATH: reason" */
        fuzz_check(!t.events && !t.stacks && !t.header && !t.path && !t.nr_devices);
        return 0;
    }
    fuzz_check(t.header && !strcmp(t.path, path));
    fuzz_check(!strcmp(json_string_value(json_object_get(t.header, "format")), "cuheap-trace"));
    fuzz_check(t.footer || t.truncated);
    fuzz_check(t.nr_devices <= CUHEAP_TRACE_NR_MAX_DEVICES);
    for (unsigned i = 0; i < t.nr_devices; i++)
        fuzz_check(t.devices[i].name != NULL);
    for (size_t i = 0; i < t.nr_events; i++) {
        const struct cuheap_trace_event *e = &t.events[i];
        fuzz_check(i == 0 || t.events[i - 1].seq <= e->seq);
        fuzz_check(e->type >= CUHEAP_EV_ALLOC && e->type < CUHEAP_NR_EVENT_TYPES);
        fuzz_check(e->api < CUHEAP_NR_APIS);
        fuzz_check(e->type != CUHEAP_EV_MARK || e->label != NULL);
        if (i < 64)
            check_stack_text(&t, e->stack);
    }
    for (size_t i = 0; i < t.nr_stacks; i++) {
        fuzz_check(i == 0 || t.stacks[i - 1].id <= t.stacks[i].id);
        if (t.stacks[i].id) {
            const struct cuheap_trace_stack *s = cuheap_trace_stack(&t, t.stacks[i].id);
            fuzz_check(s && s->id == t.stacks[i].id);
        }
        if (i < 64)
            check_stack_text(&t, t.stacks[i].id);
    }
    size_t nr_events = t.nr_events;
    cuheap_trace_free(&t);
    fuzz_check(!t.events && !t.stacks && !t.header);
    /* a whole trace, plain: the follower reads it as the reader does */
    if (size && data[size - 1] == '\n' && !(size >= 2 && data[0] == 0x1f && data[1] == 0x8b))
        check_tail(data, size, nr_events);
    return 0;
}
