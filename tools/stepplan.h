/* SPDX-License-Identifier: MIT */
/*
 * A job's repeating step, and a placement planned once for it: the blocks of one step put on
 * a circle one step long, so that every later step can reuse the same places. Pure: it knows
 * nothing of CUDA or of the pool. `cuheap report` uses it to say what a layout planned from
 * one step would hold (the _in variants: in the caller's memory, no malloc).
 */
#ifndef CUHEAP_STEPPLAN_H
#define CUHEAP_STEPPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The smallest period p such that, from the middle of keys[0..n) on, keys repeat the ones p
 * before them for at least two periods and a quarter of n (keys[i] == keys[i - p] over
 * [n/2, n/2 + max(2p, n/4))): a warm-up and a tail of another shape are allowed, a pattern
 * repeating only inside the step or a step that changes in the middle of the run is not. 0
 * when no period up to n/4 does. Linear in n. */
size_t cuheap_step_period(const uint64_t *keys, size_t n);

/* The same in caller's memory of cuheap_step_period_work(n) bytes (8-byte aligned): no malloc. */
size_t cuheap_step_period_work(size_t n);
size_t cuheap_step_period_in(const uint64_t *keys, size_t n, void *work);

/* One block of a step: its bytes and when it lives, in the step's own clock: start in
 * [0, period), end in (start, start + period). end past period wraps around the circle. */
struct cuheap_step_block {
    uint64_t size;
    uint64_t start, end;
    uint64_t offset; /* out: where it goes in the region; in, for a fixed block */
    bool fixed;      /* in: already at offset, for the whole step (start and end unused): a
                        block of an earlier placement still held, which the others go around */
};

/* Place blocks so that no two that live at once on the circle overlap: greedy, largest first,
 * each at the lowest offset free over its whole life, around the fixed ones (placed first). Blocks
 * of a granule or more start on a granule (the unit memory is mapped in), smaller ones on 512
 * bytes; every block takes its size rounded up so. Returns the region's bytes, or UINT64_MAX when a
 * block's life is empty or not shorter than the period, a block is 64 TiB or more, or memory ran
 * out (offsets then unset). */
uint64_t cuheap_step_plan(struct cuheap_step_block *blocks, size_t n, uint64_t period,
                          uint64_t granule);

/* The same in caller's memory of cuheap_step_plan_work(n) bytes (8-byte aligned). */
size_t cuheap_step_plan_work(size_t n);
uint64_t cuheap_step_plan_in(struct cuheap_step_block *blocks, size_t n, uint64_t period,
                             uint64_t granule, void *work);

#endif /* CUHEAP_STEPPLAN_H */
