/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: what the cuheap tool does with a trace once it is read. The input is a
 * trace file; the target reads it as `cuheap` does and runs every command's analysis on it:
 * report, top (--by peak and total), leaks, folded (both), memviz, html, chrome, into
 * /dev/null. tools/cuheap.c is compiled into this file (its main renamed) because report, top
 * and leaks are its static functions; nothing in tools/ is edited for it.
 *
 * One part of `load()` is left out: symbolization opens every module path a trace names
 * (a fuzzed trace names /dev/stdin or a FIFO and the run hangs, issue 12), so it is replaced
 * by a no-op here. Checked besides the sanitizers' findings: peaks
 * are at least what is left at the end, sites come sorted by bytes.
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
    print_sites(t, v, nr, 20, "blocks");
    free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    struct cuheap_trace t;
    if (load(path, &t))
        return 0;
    struct trace_summary s;
    summarize(&t, &s);
    fuzz_check(s.nr_dev <= CUHEAP_TRACE_NR_MAX_DEVICES);
    for (unsigned i = 0; i < s.nr_dev; i++) {
        const struct device_summary *d = &s.dev[i];
        fuzz_check(d->peak_live >= d->live && d->peak_reserved >= d->reserved);
        fuzz_check(d->nr_pooled <= d->nr_allocs);
        fuzz_check(d->peak_live == 0 || d->peak_live_index < t.nr_events);
        sites(&t, &s, SITES_AT_PEAK, d->device);
    }
    sites(&t, &s, SITES_AT_PEAK, -1);
    sites(&t, &s, SITES_TOTAL, -1);
    sites(&t, &s, SITES_LEAKED, -1);

    report_one(&t);
    export_folded(&t, SITES_AT_PEAK, devnull);
    export_folded(&t, SITES_TOTAL, devnull);
    export_memviz(&t, devnull);
    export_html(&t, devnull);
    export_chrome(&t, 1, devnull);
    cuheap_trace_free(&t);
    return 0;
}
