/* SPDX-License-Identifier: MIT */
/* Stack deduplication (see stacktab.h): open addressing on a 64-bit hash of the frames. */
#include "stacktab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t hash_stack(const uint64_t *frames, unsigned n, const struct cuheap_py_frame *py,
                           unsigned npy)
{
    uint64_t h = 0xcbf29ce484222325ull ^ ((uint64_t)n << 8) ^ npy;
    for (unsigned i = 0; i < n; i++)
        h = mix(h, frames[i]);
    for (unsigned i = 0; i < npy; i++)
        h = mix(h, ((uint64_t)py[i].code << 32) | py[i].line);
    return h ? h : 1;
}

void cuheap_stacktab_init(struct cuheap_stacktab *t)
{
    memset(t, 0, sizeof(*t));
}

void cuheap_stacktab_destroy(struct cuheap_stacktab *t)
{
    for (size_t i = 0; i < t->nr_stacks; i++) {
        free(t->stacks[i].frames);
        free(t->stacks[i].py);
    }
    free(t->stacks);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static bool same(const struct cuheap_stack *s, uint64_t h, const uint64_t *frames, unsigned n,
                 const struct cuheap_py_frame *py, unsigned npy)
{
    return s->hash == h && s->nr_frames == n && s->nr_py == npy &&
           (!n || !memcmp(s->frames, frames, n * sizeof(*frames))) &&
           (!npy || !memcmp(s->py, py, npy * sizeof(*py)));
}

static int grow_slots(struct cuheap_stacktab *t)
{
    size_t n = t->nr_slots ? t->nr_slots * 2 : 1024;
    uint32_t *slots = calloc(n, sizeof(*slots));
    if (!slots)
        return -ENOMEM;
    for (size_t i = 0; i < t->nr_stacks; i++) {
        size_t j = t->stacks[i].hash & (n - 1);
        while (slots[j])
            j = (j + 1) & (n - 1);
        slots[j] = t->stacks[i].id;
    }
    free(t->slots);
    t->slots = slots;
    t->nr_slots = n;
    return 0;
}

int cuheap_stacktab_intern(struct cuheap_stacktab *t, const uint64_t *frames, unsigned nr_frames,
                           const struct cuheap_py_frame *py, unsigned nr_py, uint32_t *ret_id,
                           bool *ret_new)
{
    if (nr_frames == 0 && nr_py == 0) {
        *ret_id = 0;
        *ret_new = false;
        return 0;
    }
    if ((t->nr_stacks + 1) * 2 > t->nr_slots && grow_slots(t))
        return -ENOMEM;
    uint64_t h = hash_stack(frames, nr_frames, py, nr_py);
    size_t j = h & (t->nr_slots - 1);
    for (; t->slots[j]; j = (j + 1) & (t->nr_slots - 1)) {
        const struct cuheap_stack *s = &t->stacks[t->slots[j] - 1];
        if (same(s, h, frames, nr_frames, py, nr_py)) {
            *ret_id = s->id;
            *ret_new = false;
            return 0;
        }
    }
    if (t->nr_stacks == t->cap_stacks) {
        size_t cap = t->cap_stacks ? t->cap_stacks * 2 : 256;
        struct cuheap_stack *n = realloc(t->stacks, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        t->stacks = n;
        t->cap_stacks = cap;
    }
    struct cuheap_stack *s = &t->stacks[t->nr_stacks];
    s->frames = malloc(nr_frames * sizeof(*frames) + 1);
    s->py = malloc(nr_py * sizeof(*py) + 1);
    if (!s->frames || !s->py) {
        free(s->frames);
        free(s->py);
        return -ENOMEM;
    }
    if (nr_frames)
        memcpy(s->frames, frames, nr_frames * sizeof(*frames));
    if (nr_py)
        memcpy(s->py, py, nr_py * sizeof(*py));
    s->hash = h;
    s->nr_frames = (uint8_t)nr_frames;
    s->nr_py = (uint8_t)nr_py;
    s->id = (uint32_t)++t->nr_stacks;
    t->slots[j] = s->id;
    *ret_id = s->id;
    *ret_new = true;
    return 0;
}

const struct cuheap_stack *cuheap_stacktab_get(const struct cuheap_stacktab *t, uint32_t id)
{
    return id && id <= t->nr_stacks ? &t->stacks[id - 1] : NULL;
}
