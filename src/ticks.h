/* SPDX-License-Identifier: MIT */
/*
 * The clock events are stamped with, in one place. On the hook path a stamp is a read of the
 * CPU's time stamp counter where the CPU says it runs at a constant rate in every state (a
 * few nanoseconds, where clock_gettime costs about twenty); the writer turns it into
 * CLOCK_MONOTONIC nanoseconds with a scale measured against that clock, refined as time
 * passes. Elsewhere (no invariant counter, another architecture) a stamp is CLOCK_MONOTONIC
 * itself and the conversion is the identity.
 */
#ifndef CUHEAP_TICKS_H
#define CUHEAP_TICKS_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* Stamps are counter ticks (set once by cuheap_ticks_init, before any stamp is taken). */
extern bool cuheap_ticks_tsc;

/* Choose the clock and measure the counter's rate (about a millisecond, once). */
void cuheap_ticks_init(void);

static inline uint64_t cuheap_ticks_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A stamp, for any thread; never allocates, never locks. */
static inline uint64_t cuheap_ticks_now(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (cuheap_ticks_tsc)
        return __rdtsc();
#endif
    return cuheap_ticks_clock_ns();
}

/* A stamp as CLOCK_MONOTONIC nanoseconds. One thread at a time (the writer). */
uint64_t cuheap_ticks_to_ns(uint64_t stamp);

/* Measure the rate again over the longer time now passed, when that is twice the last
 * measurement's (so the scale's error shrinks as a run goes on). The writer, now and then. */
void cuheap_ticks_recalibrate(void);

#endif
