/* SPDX-License-Identifier: MIT */
/*
 * Hook-safe logging: format into a stack buffer, one write(2). vsnprintf with the plain
 * conversions used here does not allocate.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "event.h"

#define CUHEAP_LOG_MAX_MESSAGES 64

static atomic_int nr_logged;

static void vlog(const char *fmt, va_list ap)
{
    char buf[CUHEAP_LOG_MAX_LINE];
    int n = snprintf(buf, sizeof(buf), "cuheap: ");
    size_t room = sizeof(buf) - (size_t)n - 1; /* the newline's byte kept */
    int m = vsnprintf(buf + n, room + 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if ((size_t)m > room) {
        /* A line that does not fit says so where it is cut, between characters: cut
         * silently, it reads as whole with its end missing (a path, or the reason). */
        char mark[64];
        int k = snprintf(mark, sizeof(mark), "... [cut: %d bytes in all]", m);
        size_t keep = cuheap_utf8_cut(buf + n, room - (size_t)k);
        memcpy(buf + n + keep, mark, (size_t)k);
        len = (size_t)n + keep + (size_t)k;
    }
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void cuheap_log(const char *fmt, ...)
{
    if (atomic_fetch_add_explicit(&nr_logged, 1, memory_order_relaxed) >= CUHEAP_LOG_MAX_MESSAGES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void cuheap_log_always(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void cuheap_assert_fail(const char *what, const char *file, int line)
{
    cuheap_log_always("internal check failed: %s (%s:%d)", what, file, line);
    abort();
}
