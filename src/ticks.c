/* SPDX-License-Identifier: MIT */
/*
 * Event stamps (see ticks.h). The scale is nanoseconds per tick in 32.32 fixed point, from one
 * pair (counter, CLOCK_MONOTONIC) taken at start-up, the base, and a later one; conversions
 * count from the base, so a stamp's nanoseconds never depend on when the writer saw it but
 * for the scale's refinement, which moves a stamp by less than the pairs' own uncertainty.
 *
 * Locking: init runs before any stamp is taken; to_ns and recalibrate run on one thread at a
 * time (the writer, or stop once the writer has ended).
 */
#include "ticks.h"

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

bool cuheap_ticks_tsc;

__extension__ typedef unsigned __int128 u128; /* a tick count times the scale */

static struct {
    uint64_t tsc, ns; /* the base pair */
} base;
static uint64_t mult;          /* ns per tick << 32 */
static uint64_t calibrated_ns; /* time from the base the scale was measured over */

/* A (counter, clock) pair read as close together as this thread can: the tightest of a few. */
static void read_pair(uint64_t *ret_tsc, uint64_t *ret_ns)
{
#if defined(__x86_64__) || defined(__i386__)
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = cuheap_ticks_clock_ns(), t = __rdtsc(), b = cuheap_ticks_clock_ns();
        if (b - a < best) {
            best = b - a;
            *ret_tsc = t;
            *ret_ns = a + (b - a) / 2;
        }
    }
#else
    *ret_tsc = 0;
    *ret_ns = cuheap_ticks_clock_ns();
#endif
}

static bool invariant_tsc(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    /* CPUID 0x80000007 EDX bit 8: the counter runs at a constant rate in all states */
    if (__get_cpuid_max(0x80000000u, NULL) < 0x80000007u)
        return false;
    __cpuid(0x80000007u, a, b, c, d);
    return (d >> 8) & 1;
#else
    return false;
#endif
}

static bool measure(void)
{
    uint64_t t, ns;
    read_pair(&t, &ns);
    if (t <= base.tsc || ns <= base.ns)
        return false;
    u128 m = ((u128)(ns - base.ns) << 32) / (t - base.tsc);
    if (!m || m >> 64)
        return false;
    mult = (uint64_t)m;
    calibrated_ns = ns - base.ns;
    return true;
}

void cuheap_ticks_init(void)
{
    cuheap_ticks_tsc = false;
    if (!invariant_tsc())
        return;
    read_pair(&base.tsc, &base.ns);
    /* a millisecond: start-up happens once, at the first CUDA call */
    uint64_t until = base.ns + 1000000;
    while (cuheap_ticks_clock_ns() < until)
        ;
    cuheap_ticks_tsc = measure();
}

uint64_t cuheap_ticks_to_ns(uint64_t stamp)
{
    if (!cuheap_ticks_tsc)
        return stamp;
    if (stamp < base.tsc) /* not taken by this process's counter: no better answer */
        return base.ns;
    return base.ns + (uint64_t)(((u128)(stamp - base.tsc) * mult) >> 32);
}

void cuheap_ticks_recalibrate(void)
{
    if (!cuheap_ticks_tsc || cuheap_ticks_clock_ns() - base.ns < 2 * calibrated_ns)
        return;
    (void)measure();
}
