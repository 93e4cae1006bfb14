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

#define CUHEAP_LOG_MAX_MESSAGES 64

static atomic_int nr_logged;

static void vlog(const char *fmt, va_list ap)
{
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "cuheap: ");
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len =
        (size_t)n +
        ((size_t)m < sizeof(buf) - (size_t)n - 1 ? (size_t)m : sizeof(buf) - (size_t)n - 2);
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
