/* SPDX-License-Identifier: MIT */
/*
 * A logger that is safe on the hook path: a fixed stack buffer and one write(2) to stderr,
 * no malloc, no stdio locks. Messages are capped per process so a broken setup cannot flood
 * the program's output.
 */
#ifndef CUHEAP_LOG_H
#define CUHEAP_LOG_H

#include <stdatomic.h>
#include <stdbool.h>

/* The longest line written, "cuheap: " and the newline included: sized for the longest
 * lines, which name a path (CUHEAP_PATH_MAX) or show a bad setting. A longer message is cut
 * where "... [cut: N bytes in all]" says. On the stack of whoever logs. */
#define CUHEAP_LOG_MAX_LINE 1024

/* Write "cuheap: <message>\n" to stderr unless the per-process cap was reached. */
void cuheap_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Same, without the cap: for the exit summary the user asked for. */
void cuheap_log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Log at most once per call site. */
#define cuheap_log_once(...)                                                                       \
    do {                                                                                           \
        static atomic_bool logged_;                                                                \
        if (!atomic_exchange_explicit(&logged_, true, memory_order_relaxed))                       \
            cuheap_log(__VA_ARGS__);                                                               \
    } while (0)

#ifdef CUHEAP_DEBUG
#define cuheap_assert(cond)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            cuheap_assert_fail(#cond, __FILE__, __LINE__);                                         \
    } while (0)
#else
#define cuheap_assert(cond)                                                                        \
    do {                                                                                           \
        (void)sizeof(cond);                                                                        \
    } while (0)
#endif

/* Debug builds only: report a broken invariant and abort (tests want to see it). */
void cuheap_assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));

#endif
