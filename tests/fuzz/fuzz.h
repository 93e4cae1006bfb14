/* SPDX-License-Identifier: MIT */
/*
 * What the libFuzzer targets in tests/fuzz share: an in-memory file holding the input, so
 * code that reads a path reads the fuzzed bytes without touching the disk, and a check that
 * turns a broken invariant into a crash, which libFuzzer reports and saves as a reproducer.
 */
#ifndef CUHEAP_FUZZ_H
#define CUHEAP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Not assert(): it must stay on whatever the build type, and say which check broke. */
#define fuzz_check(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dprintf(2, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Replace the contents of one memfd with data; returns "/proc/self/fd/N", which opens it
 * from the start like any trace path. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("cuheap-fuzz", MFD_CLOEXEC);
        fuzz_check(fd >= 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    fuzz_check(ftruncate(fd, 0) == 0);
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        fuzz_check(n > 0);
        done += (size_t)n;
    }
    return path;
}

/* The tool prints reports and complaints on stdout and stderr: send them to /dev/null so a
 * run of thousands of inputs stays readable. libFuzzer and the sanitizers keep fd 2 (they
 * captured it before this runs), so crash reports still show. */
static inline void fuzz_quiet_stdio(void)
{
    fuzz_check(freopen("/dev/null", "w", stdout) != NULL);
    FILE *null = fopen("/dev/null", "we");
    fuzz_check(null != NULL);
    stderr = null;
}

#endif
