/* SPDX-License-Identifier: MIT */
/*
 * The whole-process tests' shell: each test case runs in a folder of its own (tmp, made by
 * fresh_dir under /tmp with the includer's SHELLTEST_PREFIX and removed by remove_dir), where
 * run() executes a shell command and keeps its exit status, stdout and stderr.
 */
#ifndef CUHEAP_TEST_SHELLTEST_H
#define CUHEAP_TEST_SHELLTEST_H

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "slurp.h"

#ifndef SHELLTEST_PREFIX
#error "define SHELLTEST_PREFIX (the test folder's name under /tmp, ending in XXXXXX)"
#endif

static char tmp[PATH_MAX];

struct result {
    int status;
    char *out;
    char *err;
};

/* Run a shell command in the test's directory; stdout and stderr are kept. */
static inline __attribute__((format(printf, 1, 2))) struct result run(const char *fmt, ...)
{
    char cmd[8192], full[8192 + 3 * PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(full, sizeof(full), "cd '%s' && (%s) >'%s/out' 2>'%s/err'", tmp, cmd, tmp, tmp);
    int st = system(full);
    char p[PATH_MAX + 8];
    struct result r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), NULL, NULL};
    snprintf(p, sizeof(p), "%s/out", tmp);
    r.out = slurp(p);
    snprintf(p, sizeof(p), "%s/err", tmp);
    r.err = slurp(p);
    return r;
}

static inline void done(struct result *r)
{
    free(r->out);
    free(r->err);
}

/* How many times needle occurs in s. */
static inline int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static inline int fresh_dir(void **state)
{
    (void)state;
    snprintf(tmp, sizeof(tmp), "/tmp/" SHELLTEST_PREFIX);
    return mkdtemp(tmp) ? 0 : -1;
}

static inline int remove_dir(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd);
}

#endif
