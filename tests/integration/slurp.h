/* SPDX-License-Identifier: MIT */
/* The whole-process tests read what a program wrote: a file's text, "" when it is missing. */
#ifndef CUHEAP_TEST_SLURP_H
#define CUHEAP_TEST_SLURP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    fclose(f);
    return buf;
}

#endif
