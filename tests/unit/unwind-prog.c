/* SPDX-License-Identifier: MIT */
/*
 * The "program" side of test-unwind: call chains of many shapes (plain recursion, mutual
 * recursion, two call sites per level) in a library of their own, so that the unwinder's
 * "cuheap frames" (the test executable's) and the program's frames lie in different objects,
 * as they do under LD_PRELOAD.
 */
#include <stdint.h>

typedef unsigned (*prog_cb_fn)(void *arg);

unsigned prog_descend(int depth, unsigned shape, prog_cb_fn cb, void *arg);

__attribute__((noinline)) static unsigned other(int depth, unsigned shape, prog_cb_fn cb, void *arg)
{
    unsigned r = prog_descend(depth - 1, shape * 7 + 1, cb, arg);
    __asm__ volatile("" ::: "memory"); /* no tail call: every level keeps its frame */
    return r + 1;
}

/* Descend depth levels, through call sites chosen by shape, then call cb(arg). */
__attribute__((noinline, visibility("default"))) unsigned prog_descend(int depth, unsigned shape,
                                                                       prog_cb_fn cb, void *arg)
{
    unsigned r;
    if (depth <= 0)
        r = cb(arg);
    else if (shape % 3 == 0)
        r = other(depth, shape / 3, cb, arg); /* mutual recursion */
    else if (shape % 3 == 1)
        r = prog_descend(depth - 1, shape / 3 + 5, cb, arg); /* one call site */
    else
        r = prog_descend(depth - 1, shape / 3 + 11, cb, arg) + 2; /* another */
    __asm__ volatile("" ::: "memory");
    return r;
}
