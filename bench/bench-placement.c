/* SPDX-License-Identifier: MIT */
/*
 * Placement alone, on a recorded job's sequence: its allocations and frees, in seq order on one
 * thread with nothing held back behind fences, placed in one address space by first fit by
 * address (src/fit.c) or by the buddy allocator (src/buddy.c, unscored). Device memory lies under
 * the bytes each block asked for (what the pool maps), in 2 MiB granules, and goes back on a free
 * as the pool gives it back: a granule no block uses stays mapped while the mapped ones stay
 * within the most ever busy plus one (the pool's budget and its cushion), past that the highest
 * idle ones are released. The C twin of `bench/model-placement.py --shared --give-back`, on the
 * allocators themselves, and so also their own cost. One line a placement:
 *
 *   held_over_live  the most granules mapped at once over the most live bytes
 *   ops_per_step    in the sequence's second half (by its marks), granules mapped or released
 *                   a step, each run of neighbours counted once (the pool's operations a step)
 *   ns_per_alloc    the placement's own time an allocation, its free included (clock reads
 *                   included: compare the lines with each other)
 *
 * Placements: fit (each block its size in 512 B units), fit-classes (blocks from 128 KiB to
 * 2 MiB rounded up to an eighth of the power of two above, smaller ones to a power of two, as
 * thread caches would keep them), buddy (powers of two).
 *
 *   bench-placement TRACE.jsonl
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buddy.h"
#include "event.h"
#include "fit.h"
#include "tracereader.h"

#define SPACE       (16ull << 30) /* one address space: far more than any recorded job's peak */
#define UNIT        512ull
#define GRANULE     (2ull << 20)
#define NR_GRANULES (SPACE / GRANULE)

enum placement { FIT, FIT_CLASSES, BUDDY, NR_PLACEMENTS };
static const char *const placement_names[] = {"fit", "fit-classes", "buddy"};

/* live blocks by the trace's pointer: linear probing, deleted by shifting back */
struct slot {
    uint64_t ptr, addr, bytes, size;
};
#define NR_SLOTS (1u << 21)
static struct slot *slots;

static uint32_t slot_of(uint64_t ptr)
{
    uint32_t i = (uint32_t)((ptr * 0x9e3779b97f4a7c15ull) >> 43) & (NR_SLOTS - 1);
    while (slots[i].ptr && slots[i].ptr != ptr)
        i = (i + 1) & (NR_SLOTS - 1);
    return i;
}

static void slot_drop(uint32_t i)
{
    slots[i].ptr = 0;
    for (uint32_t j = (i + 1) & (NR_SLOTS - 1); slots[j].ptr; j = (j + 1) & (NR_SLOTS - 1)) {
        struct slot s = slots[j];
        slots[j].ptr = 0;
        slots[slot_of(s.ptr)] = s;
    }
}

static uint64_t classed(uint64_t size)
{
    uint64_t whole = UNIT;
    while (whole < size)
        whole <<= 1;
    if (whole <= (128u << 10) || whole > GRANULE)
        return whole <= (128u << 10) ? whole : size;
    uint64_t eighth = whole >> 3;
    return (size + eighth - 1) & ~(eighth - 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct {
    uint32_t users[NR_GRANULES];
    bool mapped[NR_GRANULES];
    uint64_t busy, busy_peak, nr_mapped, mapped_peak, ops;
} g;

/* Granules [first, last] gain a user (adding is true) or lose one; ops counted when late. */
static void use_granules(uint64_t addr, uint64_t bytes, bool adding, bool late)
{
    uint64_t first = addr / GRANULE, last = (addr + bytes - 1) / GRANULE;
    bool in_run = false;
    for (uint64_t k = first; k <= last; k++) {
        if (adding) {
            bool fresh = !g.mapped[k];
            g.ops += late && fresh && !in_run;
            in_run = fresh;
            g.nr_mapped += fresh;
            g.mapped[k] = true;
            g.busy += g.users[k]++ == 0;
        } else {
            g.busy -= --g.users[k] == 0;
        }
    }
    if (g.busy > g.busy_peak)
        g.busy_peak = g.busy;
    if (g.nr_mapped > g.mapped_peak)
        g.mapped_peak = g.nr_mapped;
    if (adding)
        return; /* memory goes back on a free, as the pool gives it back */
    in_run = false;
    for (uint64_t k = NR_GRANULES; k-- > 0 && g.nr_mapped > g.busy_peak + 1;) {
        bool idle = g.mapped[k] && !g.users[k];
        if (idle) {
            g.mapped[k] = false;
            g.nr_mapped--;
            g.ops += late && !in_run;
        }
        in_run = idle;
    }
}

static int run(const struct cuheap_trace *t, enum placement how)
{
    struct cuheap_fit fit;
    struct cuheap_buddy buddy;
    int r = how == BUDDY ? cuheap_buddy_init(&buddy, 0, SPACE, UNIT)
                         : cuheap_fit_init(&fit, 0, SPACE, UNIT);
    if (r) {
        fprintf(stderr, "bench-placement: no room for the placement's metadata\n");
        return 1;
    }
    memset(slots, 0, NR_SLOTS * sizeof(*slots));
    memset(&g, 0, sizeof(g));
    uint64_t nr_marks = 0, marks = 0, live = 0, live_peak = 0, nr_allocs = 0, ns = 0, nr_live = 0;
    for (size_t i = 0; i < t->nr_events; i++)
        nr_marks += t->events[i].type == CUHEAP_EV_MARK;
    for (size_t i = 0; i < t->nr_events; i++) {
        const struct cuheap_trace_event *e = &t->events[i];
        bool late = nr_marks && marks * 2 >= nr_marks;
        if (e->type == CUHEAP_EV_MARK) {
            marks++;
        } else if (e->type == CUHEAP_EV_ALLOC && e->ptr && e->size) {
            uint32_t s = slot_of(e->ptr);
            if (slots[s].ptr || nr_live >= NR_SLOTS / 2)
                continue; /* allocated twice without a free between: a trace cut short */
            uint64_t want = how == FIT_CLASSES ? classed(e->size) : e->size, addr, bytes;
            uint64_t t0 = now_ns();
            if (how == BUDDY) {
                uintptr_t a;
                unsigned order;
                r = cuheap_buddy_alloc(&buddy, want, &a, &order);
                addr = a;
                bytes = 1ull << order;
            } else {
                uintptr_t a;
                r = cuheap_fit_alloc(&fit, want, &a, &bytes);
                addr = a;
            }
            ns += now_ns() - t0;
            if (r) {
                fprintf(stderr, "bench-placement: %s: out of its address space\n",
                        placement_names[how]);
                break;
            }
            slots[s] = (struct slot){e->ptr, addr, bytes, e->size};
            nr_live++;
            nr_allocs++;
            use_granules(addr, e->size, true, late);
            live += e->size;
            if (live > live_peak)
                live_peak = live;
        } else if (e->type == CUHEAP_EV_FREE && e->ptr) {
            uint32_t s = slot_of(e->ptr);
            if (!slots[s].ptr)
                continue; /* allocated before the trace began */
            struct slot b = slots[s];
            slot_drop(s);
            nr_live--;
            uint64_t t0 = now_ns();
            if (how == BUDDY)
                cuheap_buddy_free(&buddy, b.addr);
            else
                cuheap_fit_free(&fit, b.addr);
            ns += now_ns() - t0;
            live -= b.size;
            use_granules(b.addr, b.size, false, late);
        }
    }
    uint64_t late_steps = nr_marks - nr_marks / 2;
    if (!r)
        printf("placement=%s allocs=%llu peak_live=%llu held_over_live=%.3f ops_per_step=%.1f "
               "ns_per_alloc=%.0f\n",
               placement_names[how], (unsigned long long)nr_allocs, (unsigned long long)live_peak,
               live_peak ? (double)(g.mapped_peak * GRANULE) / (double)live_peak : 0,
               late_steps ? (double)g.ops / (double)late_steps : 0,
               nr_allocs ? (double)ns / (double)nr_allocs : 0);
    if (how == BUDDY)
        cuheap_buddy_destroy(&buddy);
    else
        cuheap_fit_destroy(&fit);
    return r ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench-placement TRACE.jsonl\n");
        return 2;
    }
    struct cuheap_trace t;
    char err[512];
    if (cuheap_trace_read(argv[1], &t, err, sizeof(err))) {
        fprintf(stderr, "bench-placement: %s\n", err);
        return 2;
    }
    slots = calloc(NR_SLOTS, sizeof(*slots));
    if (!slots) {
        fprintf(stderr, "bench-placement: out of memory\n");
        return 1;
    }
    int r = 0;
    for (int how = 0; how < NR_PLACEMENTS && !r; how++)
        r = run(&t, (enum placement)how);
    free(slots);
    cuheap_trace_free(&t);
    return r;
}
