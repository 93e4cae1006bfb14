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

/* A frame that keeps a frame pointer (alloca: its size is known only at run time), pad bytes
 * below it, then two levels of prog_descend and cb(arg). */
__attribute__((noinline)) static unsigned with_pad(unsigned pad, prog_cb_fn cb, void *arg)
{
    volatile char *p = __builtin_alloca(pad + 1);
    p[0] = 0;
    unsigned r = prog_descend(2, 1, cb, arg);
    __asm__ volatile("" ::"r"(p) : "memory");
    return r + 1;
}

unsigned prog_padded(int big, unsigned pad, uint64_t fill, prog_cb_fn cb, void *arg);

/* with_pad from a small frame, or from a large one whose words all hold fill. */
__attribute__((noinline)) static unsigned from_small(unsigned pad, prog_cb_fn cb, void *arg)
{
    volatile uint64_t local[2] = {0, 0};
    unsigned r = with_pad(pad, cb, arg);
    __asm__ volatile("" ::"r"(local) : "memory");
    return r + 1;
}

__attribute__((noinline)) static unsigned from_big(unsigned pad, uint64_t fill, prog_cb_fn cb,
                                                   void *arg)
{
    volatile uint64_t local[128];
    for (int i = 0; i < 128; i++)
        local[i] = fill;
    unsigned r = with_pad(pad, cb, arg);
    __asm__ volatile("" ::"r"(local) : "memory");
    return r + 1;
}

__attribute__((noinline, visibility("default"))) unsigned
prog_padded(int big, unsigned pad, uint64_t fill, prog_cb_fn cb, void *arg)
{
    unsigned r = big ? from_big(pad, fill, cb, arg) : from_small(pad, cb, arg);
    __asm__ volatile("" ::: "memory");
    return r;
}
