/* SPDX-License-Identifier: MIT */
/*
 * Stack capture: the per-thread shortcut (a walk just long enough for the frames kept plus
 * the cuheap frames the thread's previous capture skipped) must record exactly the stack a
 * full walk records, whatever the depth, the number of frames kept, the number of cuheap
 * frames on top (which is what the shortcut guesses), and on several threads at once.
 *
 * Here the test executable plays cuheap (its frames are the ones skipped) and
 * libunwind-prog.so the program (tests/unit/unwind-prog.c).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "unwind.h"

typedef unsigned (*prog_cb_fn)(void *arg);
unsigned prog_descend(int depth, unsigned shape, prog_cb_fn cb, void *arg);
unsigned prog_padded(int big, unsigned pad, uint64_t fill, prog_cb_fn cb, void *arg);

struct probe {
    unsigned max;                            /* frames kept */
    int inner;                               /* cuheap-side frames above the capture (0 to 6) */
    unsigned nr;                             /* frames recorded */
    bool differ;                             /* shortcut or cache and full walk disagreed */
    uint32_t tag;                            /* the cached capture's tag */
    uint64_t sum;                            /* of the full walk's frames */
    uint64_t frames[CUHEAP_MAX_STACK_DEPTH]; /* the full walk's */
    uintptr_t sp;                            /* where the capture was made */
    char why[256];
};

/* Capture twice from the same place: the shortcut, then the full walk. */
__attribute__((noinline)) static void both(struct probe *p)
{
    uint64_t fast[CUHEAP_MAX_STACK_DEPTH], full[CUHEAP_MAX_STACK_DEPTH];
    uint64_t scratch[CUHEAP_MAX_STACK_DEPTH];
    const uint64_t *cached;
    uint32_t tag;
    static pthread_rwlock_t walk_lock = PTHREAD_RWLOCK_INITIALIZER;
    uint64_t *note;
    unsigned c = cuheap_unwind_capture_cached(scratch, p->max, &cached, &tag, &note, &walk_lock);
    unsigned a = cuheap_unwind_capture(fast, p->max);
    unsigned b = cuheap_unwind_capture_full(full, p->max);
    p->nr = b;
    p->tag = tag;
    p->sum = 0;
    p->sp = (uintptr_t)__builtin_frame_address(0);
    memcpy(p->frames, full, b * sizeof(full[0]));
    for (unsigned i = 0; i < b; i++)
        p->sum = p->sum * 31 + full[i];
    if (c != b || memcmp(cached, full, c * sizeof(full[0]))) {
        p->differ = true;
        unsigned i = 0;
        while (i < c && i < b && cached[i] == full[i])
            i++;
        snprintf(p->why, sizeof(p->why),
                 "max %u, %d cuheap frames: cached %u frames, full walk %u, first difference "
                 "at frame %u",
                 p->max, p->inner, c, b, i);
        return;
    }
    if (a != b || memcmp(fast, full, a * sizeof(fast[0]))) {
        p->differ = true;
        unsigned i = 0;
        while (i < a && i < b && fast[i] == full[i])
            i++;
        snprintf(p->why, sizeof(p->why),
                 "max %u, %d cuheap frames: shortcut %u frames, full walk %u, first difference "
                 "at frame %u",
                 p->max, p->inner, a, b, i);
    }
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void inner(struct probe *p, int k)
{
    if (k > 0)
        inner(p, k - 1);
    else
        both(p);
    __asm__ volatile("" ::: "memory");
}

static unsigned at_bottom(void *arg)
{
    struct probe *p = arg;
    inner(p, p->inner);
    return p->nr;
}

/* Many events with changing depth, shape, frames kept and cuheap frames on top. */
static void *many_events(void *arg)
{
#if defined(__SANITIZE_THREAD__)
    /* TSan's instrumentation changes which of the unwinder's own functions are inlined, so the
     * two walks skip different numbers of cuheap frames here; the production build (and the
     * ASan run) checks the shortcut. */
    (void)arg;
    return NULL;
#endif
    unsigned seed = (unsigned)(uintptr_t)arg, nr_differ = 0, nr_full = 0;
    static const unsigned maxes[] = {1, 4, 12, 12, 12, 32, 64};
    char *why = NULL;
    static __thread char first[256];
    for (int i = 0; i < 3000; i++) {
        seed = seed * 1103515245u + 12345u;
        struct probe p = {.max = maxes[(seed >> 8) % 7]};
        /* mostly the same cuheap depth, as in cuheap (where the guess holds), sometimes not */
        p.inner = (seed >> 12) % 8 == 0 ? (int)((seed >> 16) % 7) : 2;
        int depth = (int)((seed >> 20) % 48);
        prog_descend(depth, seed >> 3, at_bottom, &p);
        if (p.differ && !nr_differ++) {
            snprintf(first, sizeof(first), "%s", p.why);
            why = first;
        }
        nr_full += p.nr == p.max;
    }
    /* the walks were deep enough to be cut at max most of the time */
    if (!why && nr_full < 1000)
        why = "too few captures were cut at max: the test does not test the shortcut";
    return why;
}

static void test_shortcut_records_the_full_walk(void **state)
{
    (void)state;
    assert_int_not_equal(cuheap_unwind_init(), CUHEAP_UNWIND_NONE);
    const char *why = many_events((void *)(uintptr_t)1);
    if (why)
        fail_msg("%s", why);
        /* the shortcut fell short (more cuheap frames than the guess) and walked again */
#if !defined(__SANITIZE_THREAD__)
    assert_true(cuheap_unwind_nr_rewalks() > 0);
#endif
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, many_events, (void *)(i + 2)), 0);
    for (int i = 0; i < 4; i++) {
        void *why;
        pthread_join(t[i], &why);
        if (why)
            fail_msg("thread %d: %s", i, (const char *)why);
    }
}

/* With the shortcut off every capture is the full walk. */
static void test_shortcut_off(void **state)
{
    (void)state;
    cuheap_unwind_set_cache(false);
    uint64_t before = cuheap_unwind_nr_rewalks();
    const char *why = many_events((void *)(uintptr_t)99);
    cuheap_unwind_set_cache(true);
    if (why)
        fail_msg("%s", why);
    assert_int_equal(cuheap_unwind_nr_rewalks(), before);
}

/* Stacks seen before come from the cache (few walks), and a stack that changed under the same
 * stack pointer (another call site at the same depth) is recorded as changed: every capture
 * equals the full walk, the two call paths give different frames and different tags. */
static void __attribute__((unused)) test_cache_sees_changed_stacks(void **state)
{
    (void)state;
    unsigned nr[2] = {0, 0};
    uint32_t tags[2] = {0, 0};
    uint64_t sums[2] = {0, 0};
    uint64_t walks = cuheap_unwind_nr_stack_walks();
    for (int i = 0; i < 3000; i++) {
        struct probe p = {.max = 12, .inner = 2};
        /* shapes 19 and 2 (unwind-prog.c): the outermost level calls from one call site or
         * the other, and every level below goes the same way (shape 11): the same frames at
         * the same stack pointers but for one return address */
        prog_descend(6, i % 2 ? 2 : 19, at_bottom, &p);
        if (p.differ)
            fail_msg("capture %d: %s", i, p.why);
        nr[i % 2] = p.nr;
        sums[i % 2] = p.sum;
        /* both cached once seen twice and the walks' budget allowed (unwind.c) */
        if (i >= 2500 && p.tag != tags[i % 2])
            fail_msg("capture %d: the same stack got a new tag (walked again)", i);
        tags[i % 2] = p.tag;
    }
    assert_int_equal(nr[0], 12);
    assert_int_equal(nr[1], 12);
    assert_int_not_equal(tags[0], 0);
    assert_int_not_equal(tags[0], tags[1]);
    assert_true(sums[0] != sums[1]);
    assert_true(cuheap_unwind_nr_stack_walks() - walks <= 4);
}

/* A frame that keeps a frame pointer and sizes itself at run time (alloca) is placed by its
 * rbp, not by the words below it: reached from a small frame, or from a large one through a
 * smaller alloca, at the same stack pointer, its caller's return address lies at another
 * place. The large frame's words all hold the small one's return address (where the small
 * path's return address lay, the large path holds the same value), so only the saved rbp
 * tells the two stacks apart. */
static void __attribute__((unused)) test_cache_places_frame_pointer_frames(void **state)
{
    (void)state;
    struct probe a = {.max = 5, .inner = 2};
    enum { PAD = 2048 };
    prog_padded(0, PAD, 0, at_bottom, &a);
    assert_false(a.differ);
    assert_int_equal(a.nr, 5);
    uint64_t small_ra = a.frames[4]; /* the return address into the small frame */
    unsigned pad = 0;
    for (; pad <= PAD; pad += 16) {
        struct probe b = {.max = 5, .inner = 2};
        prog_padded(1, pad, small_ra, at_bottom, &b);
        if (b.sp == a.sp)
            break;
    }
    assert_true(pad <= PAD); /* found the pad that puts both at one stack pointer */
    uint64_t sums[2] = {0, 0};
    for (int i = 0; i < 5000; i++) {
        struct probe p = {.max = 5, .inner = 2};
        prog_padded(i % 2, i % 2 ? pad : PAD, small_ra, at_bottom, &p);
        if (p.differ)
            fail_msg("capture %d (%s frame): %s", i, i % 2 ? "large" : "small", p.why);
        if (p.sp != a.sp)
            fail_msg("capture %d: not at the same stack pointer", i);
        sums[i % 2] = p.sum;
    }
    assert_true(sums[0] != sums[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shortcut_records_the_full_walk),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_shortcut_off),
    /* left out of sanitizer builds rather than skipped (a skip reads as a failure in meson's
     * TAP): many_events says why for TSan; ASan moves frames with alloca */
#if !defined(__SANITIZE_THREAD__)
        cmocka_unit_test(test_cache_sees_changed_stacks),
#endif
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
        cmocka_unit_test(test_cache_places_frame_pointer_frames),
#endif
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
