/* SPDX-License-Identifier: MIT */
/*
 * The stack table: deduplicates call stacks (native return addresses plus Python frames) and
 * gives each distinct stack a small id, so a trace stores each stack once. Used by the writer
 * thread only (and by tests); not thread-safe, may allocate.
 */
#ifndef CUHEAP_STACKTAB_H
#define CUHEAP_STACKTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "event.h"

struct cuheap_stack {
    uint64_t hash;
    uint32_t id; /* 1-based */
    uint8_t nr_frames;
    uint8_t nr_py;
    uint64_t *frames;           /* nr_frames return addresses, innermost first */
    struct cuheap_py_frame *py; /* nr_py Python frames, innermost first */
};

struct cuheap_stacktab {
    struct cuheap_stack *stacks; /* stacks[id - 1] */
    size_t nr_stacks, cap_stacks;
    uint32_t *slots; /* open addressing: id, 0 = empty */
    size_t nr_slots; /* power of two */
};

void cuheap_stacktab_init(struct cuheap_stacktab *t);
void cuheap_stacktab_destroy(struct cuheap_stacktab *t);

/* Find or add a stack. *ret_new tells whether it was added. Returns 0 or -ENOMEM. An empty
 * stack (no frames at all) gets id 0 and is never stored. */
int cuheap_stacktab_intern(struct cuheap_stacktab *t, const uint64_t *frames, unsigned nr_frames,
                           const struct cuheap_py_frame *py, unsigned nr_py, uint32_t *ret_id,
                           bool *ret_new);

/* The stack with that id, or NULL. */
const struct cuheap_stack *cuheap_stacktab_get(const struct cuheap_stacktab *t, uint32_t id);

#endif
