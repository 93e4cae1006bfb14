/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the cuheap tool's command line. tools/cuheap.c is compiled into this file
 * with its main renamed (nothing in tools/ is edited), and the input is its argv: tokens
 * separated by NUL bytes, the first one the command. Every command and option parser runs on
 * them, against a few fixed trace files: a token "@N" stands for file N (a good trace, a
 * killed run's, not a trace, a Chrome trace, an empty file, a missing one).
 *
 * Kept safe to run anywhere: tokens with a '/' are refused, and the target works in a scratch
 * folder that it empties after every input, so `-o NAME` writes only there; `run` gets as
 * far as execvp(), which this file replaces, and every variable `run` sets is unset again.
 * Checked: the exit status is one the tool documents (0, 2 for bad input, 127 when the
 * program cannot start), and `run` only execs with libcuheap.so first in LD_PRELOAD.
 */
#include <dirent.h>

#include "fuzz.h"

#define main cuheap_tool_main
int cuheap_tool_main(int argc, char **argv);
#include "cuheap.c"
#undef main

#define NR_MAX_ARGS 16

static const char *const trace_texts[] = {
    /* a finished run: header, device, stacks (one in this very program, so the symbolizer
     * reads a real ELF file), events of each kind, footer */
    "{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":7,\"rank\":1,"
    "\"exe\":\"/bin/demo\",\"start_unix_ns\":1000,\"unwinder\":\"libunwind\","
    "\"config\":{\"CUHEAP_POOL\":\"1\",\"CUHEAP_REUSE\":\"fence\"}}\n"
    "{\"type\":\"device\",\"device\":0,\"name\":\"fake 0\",\"total\":4294967296}\n"
    "{\"type\":\"stack\",\"id\":1,\"frames\":[{\"ip\":\"0x1\",\"module\":\"/proc/self/exe\","
    "\"offset\":\"0x1010\"},{\"ip\":\"0x2\",\"module\":\"/lib/libc.so.6\",\"offset\":\"0x20\","
    "\"function\":\"_ZN3foo3barEv\"}]}\n"
    "{\"type\":\"stack\",\"id\":2,\"frames\":[],\"python\":[{\"file\":\"train.py\",\"line\":42,"
    "\"function\":\"forward\"}]}\n"
    "{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"arena_grow\",\"api\":\"none\","
    "\"device\":0,\"ptr\":\"0x1000\",\"size\":33554432,\"actual\":33554432,\"pooled\":true,"
    "\"reserved\":33554432}\n"
    "{\"type\":\"event\",\"seq\":2,\"t\":20,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
    "\"device\":0,\"tid\":7,\"ptr\":\"0x1000\",\"size\":1024,\"actual\":1024,\"pooled\":true,"
    "\"stack\":1}\n"
    "{\"type\":\"event\",\"seq\":3,\"t\":30,\"event\":\"alloc\",\"api\":\"cuMemAllocAsync\","
    "\"device\":0,\"tid\":8,\"ptr\":\"0x9000\",\"size\":4096,\"actual\":4096,\"stack\":2}\n"
    "{\"type\":\"event\",\"seq\":4,\"t\":40,\"event\":\"mark\",\"device\":0,\"label\":\"step\"}\n"
    "{\"type\":\"event\",\"seq\":5,\"t\":50,\"event\":\"free\",\"api\":\"cuMemAlloc\","
    "\"device\":0,\"ptr\":\"0x1000\",\"size\":1024,\"actual\":1024,\"pooled\":true}\n"
    "{\"type\":\"event\",\"seq\":6,\"t\":60,\"event\":\"oom\",\"api\":\"cuMemAlloc\","
    "\"device\":0,\"size\":8589934592,\"driver_free\":0,\"driver_total\":4294967296}\n"
    "{\"type\":\"event\",\"seq\":7,\"t\":70,\"event\":\"alloc\",\"api\":\"cuMemHostAlloc\","
    "\"device\":-1,\"ptr\":\"0x5000\",\"size\":64}\n"
    "{\"type\":\"footer\",\"events\":7,\"dropped\":0}\n",
    /* a killed run: no footer, the last line cut off */
    "{\"type\":\"header\",\"format\":\"cuheap-trace\",\"version\":1,\"pid\":8}\n"
    "{\"type\":\"event\",\"seq\":1,\"t\":10,\"event\":\"alloc\",\"api\":\"cuMemAlloc\","
    "\"device\":0,\"ptr\":\"0x1000\",\"size\":512,\"actual\":512,\"stack\":3}\n"
    "{\"type\":\"event\",\"seq\":2,\"t\":",
    "not a trace\n",
    "[{\"name\":\"cuheap\",\"ph\":\"M\"}\n",
    "",
};
#define NR_TRACES (sizeof(trace_texts) / sizeof(trace_texts[0]) + 1) /* + a missing file */

static char trace_dir[PATH_MAX], scratch_dir[PATH_MAX];
static char trace_paths[NR_TRACES][PATH_MAX + 16];
static bool exec_called;

/* `run` ends here instead of replacing the fuzzer. */
int execvp(const char *file, char *const argv[])
{
    fuzz_check(argv[0] && !strcmp(file, argv[0]));
    const char *preload = getenv("LD_PRELOAD");
    size_t n = strlen(trace_paths[0]);
    fuzz_check(preload && !strncmp(preload, trace_paths[0], n) &&
               (preload[n] == 0 || preload[n] == ':'));
    exec_called = true;
    errno = ENOENT;
    return -1;
}

static void empty_dir(const char *dir, bool remove_dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    if (remove_dir)
        rmdir(dir);
}

static void cleanup(void)
{
    empty_dir(scratch_dir, true);
    empty_dir(trace_dir, true);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(trace_dir, sizeof(trace_dir), "%s/cuheap-fuzz-traces-XXXXXX", tmp ? tmp : "/tmp");
    snprintf(scratch_dir, sizeof(scratch_dir), "%s/cuheap-fuzz-out-XXXXXX", tmp ? tmp : "/tmp");
    fuzz_check(mkdtemp(trace_dir) && mkdtemp(scratch_dir));
    atexit(cleanup);
    for (size_t i = 0; i < NR_TRACES; i++) {
        snprintf(trace_paths[i], sizeof(trace_paths[i]), "%s/trace%zu", trace_dir, i);
        if (i == NR_TRACES - 1)
            break; /* the missing one */
        FILE *f = fopen(trace_paths[i], "we");
        fuzz_check(f && fputs(trace_texts[i], f) >= 0 && fclose(f) == 0);
    }
    fuzz_check(chdir(scratch_dir) == 0);
    /* `run` finds "the library" here (it only checks that it is readable) */
    setenv("CUHEAP_LIBRARY", trace_paths[0], 1);
    fuzz_quiet_stdio();
    return 0;
}

/* What `run` sets for the program it starts: gone again before the next input. */
static const char *const run_vars[] = {
    "CUHEAP_OUTPUT", "CUHEAP_FORMAT",      "CUHEAP_POOL", "CUHEAP_REUSE",
    "CUHEAP_LIMIT",  "CUHEAP_STACK_DEPTH", "LD_PRELOAD",  "NVTX_INJECTION64_PATH",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* argv as a fresh process gets it: separate, writable strings */
    char *args[NR_MAX_ARGS + 2] = {strdup("cuheap")};
    int argc = 1;
    for (size_t i = 0; i < size && argc <= NR_MAX_ARGS;) {
        const uint8_t *end = memchr(data + i, 0, size - i);
        size_t n = end ? (size_t)(end - (data + i)) : size - i;
        if (memchr(data + i, '/', n)) {
            for (int k = 0; k < argc; k++)
                free(args[k]);
            return -1; /* paths only through "@N" */
        }
        /* the live view waits for traces to grow (a killed run's never does) and `run --live`
         * forks: not for a fuzzer, whose inputs must end ("--liv" is the shortest option
         * getopt takes for --live) */
        if ((n == 8 && !memcmp(data + i, "--follow", 8)) ||
            (n >= 5 && !memcmp(data + i, "--liv", 5))) {
            for (int k = 0; k < argc; k++)
                free(args[k]);
            return -1;
        }
        if (n == 2 && data[i] == '@' && data[i + 1] >= '0' && data[i + 1] <= '9')
            args[argc++] = strdup(trace_paths[(data[i + 1] - '0') % NR_TRACES]);
        else
            args[argc++] = strndup((const char *)data + i, n);
        i += n + 1;
    }
    args[argc] = NULL;

    /* getopt keeps where it was inside a cluster ("-xy") across calls; a new process starts
     * clean, so start clean too (optind = 0 makes glibc reinitialise) */
    optind = 0;
    char *none[] = {args[0], NULL};
    getopt(1, none, "");
    opterr = 1;
    exec_called = false;

    int rc = cuheap_tool_main(argc, args);
    /* 0, or 2 for bad input; `check` says 1 for a trace that is incomplete or damaged */
    bool checking = argc > 1 && !strcmp(args[1], "check");
    fuzz_check(rc == 0 || rc == 2 || (rc == 1 && checking) || (rc == 127 && exec_called));
    fflush(stdout);

    for (size_t i = 0; i < sizeof(run_vars) / sizeof(run_vars[0]); i++)
        unsetenv(run_vars[i]);
    empty_dir(scratch_dir, false);
    for (int k = 0; k < argc; k++)
        free(args[k]);
    return 0;
}
