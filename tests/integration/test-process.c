/* SPDX-License-Identifier: MIT */
/*
 * Whole processes under LD_PRELOAD, as users run them: a program that never touches CUDA is
 * unchanged; programs through each door give the same results as without cuheap; children
 * of fork and exec write their own traces; a bad path, a bad setting or SIGKILL never hurt
 * the program; traces match their schema and every tool command reads them.
 *
 * Paths come from meson: CUHEAP_BUILD_ROOT and CUHEAP_SOURCE_ROOT.
 */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

static char build[PATH_MAX], source[PATH_MAX], tmp[PATH_MAX], env_base[4 * PATH_MAX];
static const char *python;

static char *slurp(const char *path)
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

struct result {
    int status;
    char *out;
    char *err;
};

/* Run a shell command in the test's directory; stdout and stderr are kept. */
static struct result run(const char *fmt, ...)
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

static void done(struct result *r)
{
    free(r->out);
    free(r->err);
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static int count_files(const char *prefix)
{
    DIR *d = opendir(tmp);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

static int fresh_dir(void **state)
{
    (void)state;
    snprintf(tmp, sizeof(tmp), "/tmp/cuheap-proc-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd);
}

#define PRELOAD "LD_PRELOAD=%s/src/libcuheap.so"
#define FAKE    "LD_LIBRARY_PATH=%s/tests/fakecuda"

static void test_process_without_cuda_is_untouched(void **state)
{
    (void)state;
    /* a program that dlopens nothing CUDA; its output must not depend on the moment */
    struct result plain = run("ls -la /usr/include | head -40 && sort /etc/os-release");
    struct result with =
        run(PRELOAD " ls -la /usr/include | head -40 && " PRELOAD " sort /etc/os-release", build,
            build);
    assert_int_equal(with.status, plain.status);
    assert_string_equal(with.out, plain.out);
    assert_string_equal(with.err, "");
    assert_int_equal(count_files("cuheap-"), 0); /* no trace for a process that never used CUDA */
    done(&plain);
    done(&with);
}

static void test_doors_give_the_same_results(void **state)
{
    (void)state;
    static const char *const doors[] = {"linked", "dlsym", "procaddr"};
    for (int i = 0; i < 3; i++) {
        struct result plain = run(FAKE " %s/tests/programs/door-%s", build, build, doors[i]);
        assert_int_equal(plain.status, 0);
        for (int pool = 0; pool < 2; pool++) {
            struct result with = run(FAKE " " PRELOAD " CUHEAP_POOL=%d CUHEAP_OUTPUT=t-%%p.jsonl "
                                          "%s/tests/programs/door-%s",
                                     build, build, pool, build, doors[i]);
            assert_int_equal(with.status, 0);
            /* first line: the program's results, identical */
            size_t len = strcspn(plain.out, "\n");
            assert_int_equal(strncmp(with.out, plain.out, len), 0);
            assert_non_null(strstr(plain.out, "failures=0 bad_free=1"));
            /* every call seen once, whichever door */
            assert_non_null(strstr(with.out, "cuMemAlloc_v2=6 cuMemFree_v2=9 cuMemAllocAsync=1 "
                                             "cuMemCreate=1 cuMemMap=1 cuMemAllocHost_v2=1 "
                                             "cuMemHostAlloc=1"));
            assert_non_null(strstr(with.err, "13 allocations, 13 frees"));
            done(&with);
        }
        done(&plain);
    }
}

static void test_fork_and_exec_children_write_their_own_traces(void **state)
{
    (void)state;
    struct result r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t-%%p.jsonl CUHEAP_SUMMARY=0 "
                               "%s/tests/programs/forker %s/tests/programs/door-procaddr",
                          build, build, build, build);
    assert_int_equal(r.status, 0);
    assert_int_equal(count_files("t-"), 3);
    int parent, forked, execd, st1, st2;
    assert_int_equal(sscanf(strstr(r.out, "forker:"),
                            "forker: parent %d, forked %d (exit %d), exec'd %d (exit %d)", &parent,
                            &forked, &st1, &execd, &st2),
                     5);
    done(&r);
    /* the parent's trace holds its 5 allocations only, the forked child's its own 5 */
    int expect[3][2] = {{parent, 5}, {forked, 5}, {execd, 13}};
    for (int i = 0; i < 3; i++) {
        r = run("%s/tools/cuheap check t-%d.jsonl && grep -c '\"event\":\"alloc\"' t-%d.jsonl",
                build, expect[i][0], expect[i][0]);
        assert_int_equal(r.status, 0);
        char want[32];
        snprintf(want, sizeof(want), "\n%d\n", expect[i][1]);
        if (!strstr(r.out, want))
            fail_msg("trace of pid %d: %s", expect[i][0], r.out);
        done(&r);
    }
}

static void test_unwritable_trace_path(void **state)
{
    (void)state;
    struct result plain = run(FAKE " %s/tests/programs/cuheap-demo 3", build, build);
    struct result r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=/nonexistent/dir/t.jsonl "
                               "%s/tests/programs/cuheap-demo 3",
                          build, build, build);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, plain.out);
    assert_int_equal(count_lines(r.err, "cannot open trace /nonexistent/dir/t.jsonl"), 1);
    assert_non_null(strstr(r.err, "allocations")); /* the summary still comes */
    done(&plain);
    done(&r);
}

static void test_full_disk(void **state)
{
    (void)state;
    struct result plain = run(FAKE " %s/tests/programs/cuheap-demo 30", build, build);
    /* /dev/full: the trace opens, every write fails as on a full disk */
    struct result r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=/dev/full CUHEAP_FLUSH_MS=1 "
                               "%s/tests/programs/cuheap-demo 30",
                          build, build, build);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, plain.out);
    assert_int_equal(count_lines(r.err, "cannot write trace /dev/full"), 1);
    assert_non_null(strstr(r.err, "allocations")); /* the summary still comes */
    done(&plain);
    done(&r);
}

static void test_bad_setting_warns_once_and_runs(void **state)
{
    (void)state;
    struct result plain = run(FAKE " %s/tests/programs/cuheap-demo 3", build, build);
    struct result r = run(FAKE " " PRELOAD " CUHEAP_REUSE=sometimes CUHEAP_OUTPUT=t.jsonl "
                               "%s/tests/programs/cuheap-demo 3",
                          build, build, build);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, plain.out);
    assert_int_equal(count_lines(r.err, "CUHEAP_REUSE=\"sometimes\""), 1);
    done(&plain);
    done(&r);
}

static void test_sigkill_leaves_a_readable_prefix(void **state)
{
    (void)state;
    struct result r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_FLUSH_MS=50 "
                               "%s/tests/programs/cuheap-demo 1000000 & pid=$!; sleep 1; "
                               "kill -9 $pid; wait $pid; %s/tools/cuheap check t.jsonl",
                          build, build, build, build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "t.jsonl: ok"));
    assert_non_null(strstr(r.out, "incomplete"));
    int events = 0;
    sscanf(strstr(r.out, "ok, ") + 4, "%d", &events);
    assert_true(events > 100);
    done(&r);
}

static void test_trace_matches_schema(void **state)
{
    (void)state;
    struct result r =
        run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_SUMMARY=0 "
                 "%s/tests/programs/cuheap-demo 5 && %s %s/scripts/validate-trace.py t.jsonl",
            build, build, build, python, source);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
    /* the validator itself rejects what is wrong */
    r = run("head -1 t.jsonl > bad.jsonl && echo '{\"type\":\"event\",\"seq\":0}' >> bad.jsonl && "
            "%s %s/scripts/validate-trace.py bad.jsonl",
            python, source);
    assert_int_not_equal(r.status, 0);
    done(&r);
}

static void test_chrome_output_opens(void **state)
{
    (void)state;
    struct result r =
        run(FAKE " " PRELOAD " CUHEAP_FORMAT=chrome CUHEAP_OUTPUT=t.json "
                 "CUHEAP_SUMMARY=0 %s/tests/programs/cuheap-demo 5 && %s -c \""
                 "import json; d = json.load(open('t.json')); "
                 "ph = {e['ph'] for e in d}; "
                 "assert {'C', 'b', 'e', 'i', 'M'} <= ph, ph; "
                 "b = [e for e in d if e['ph'] == 'b']; "
                 "assert any('model_forward' in s for e in b for s in e['args'].get('stack', [])); "
                 "print('chrome ok', len(d))\"",
            build, build, build, python);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_tool_commands(void **state)
{
    (void)state;
    struct result r =
        run(FAKE " %s/tools/cuheap run -o demo.jsonl -- %s/tests/programs/cuheap-demo 10", build,
            build, build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.err, "trace: demo.jsonl"));
    done(&r);
    r = run("%s/tools/cuheap report demo.jsonl", build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "GPU 0"));
    assert_non_null(strstr(r.out, "peak live"));
    assert_non_null(strstr(r.out, "layer_forward"));
    done(&r);
    r = run("%s/tools/cuheap leaks demo.jsonl", build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "grow_cache")); /* the demo's deliberate leak */
    assert_non_null(strstr(r.out, "128.00 KiB")); /* 2 x 64 KiB in 10 steps */
    done(&r);
    r = run("%s/tools/cuheap top -n 3 --by total demo.jsonl", build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "allocated over the run"));
    done(&r);
    r = run("%s/tools/cuheap html -o report.html demo.jsonl && grep -c '<svg' report.html && "
            "grep -c 'layer_forward' report.html",
            build);
    assert_int_equal(r.status, 0);
    assert_int_equal(strncmp(r.out, "1\n", 2), 0); /* one chart: one GPU */
    done(&r);
    r = run("%s/tools/cuheap folded demo.jsonl", build);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "model_forward"));
    assert_non_null(strstr(r.out, ";"));
    done(&r);
    r = run("%s/tools/cuheap memviz -o snap.pickle demo.jsonl && %s -c \""
            "import pickle; s = pickle.load(open('snap.pickle', 'rb')); "
            "t = s['device_traces'][0]; "
            "assert {'alloc', 'free_completed'} <= {e['action'] for e in t}; "
            "assert len(s['segments']) == 2; print('memviz ok')\"",
            build, python);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
    /* two ranks merge into one timeline */
    r = run(FAKE
            " RANK=1 %s/tools/cuheap run -o 'r%%r.jsonl' -- %s/tests/programs/cuheap-demo 2 && "
            "%s/tools/cuheap chrome -o merged.json demo.jsonl r1.jsonl && %s -c \""
            "import json; d = json.load(open('merged.json')); "
            "names = [e['args']['name'] for e in d if e['ph'] == 'M']; "
            "assert len({e['pid'] for e in d}) == 2, names; "
            "assert any('rank 1' in n for n in names), names; print('merge ok')\"",
            build, build, build, build, python);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_tool_rejects_bad_input(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "report /nonexistent.jsonl", "frobnicate",           "run",
        "top -n zero demo.jsonl",    "report notatrace.txt", "run --reuse sometimes -- true",
        "run --limit lots -- true",
    };
    struct result w = run("echo hello > notatrace.txt");
    done(&w);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct result r = run("%s/tools/cuheap %s", build, bad[i]);
        assert_int_equal(r.status, 2);
        /* one line, naming what was wrong */
        assert_int_equal(count_lines(r.err, "\n"), 1);
        assert_int_equal(strncmp(r.err, "cuheap: ", 8), 0);
        done(&r);
    }
}

/* Every Python frame of every allocation, as the interpreter itself saw it (file, line,
 * function), not only the innermost one: outer frames' lines are where users look. */
static void check_python_stacks(const char *interpreter)
{
    /* cuheap never overwrites a trace: each interpreter's run starts from no file */
    struct result r = run("rm -f py.jsonl* && " FAKE " " PRELOAD
                          " CUHEAP_OUTPUT=py.jsonl CUHEAP_SUMMARY=0 PY_ALLOC_STACKS=expected.jsonl "
                          "%s %s/tests/programs/py_alloc.py && "
                          "%s %s/tests/programs/check_py_stacks.py py.jsonl expected.jsonl",
                          build, build, interpreter, source, python, source);
    if (r.status || !strstr(r.out, "check_py_stacks: ok"))
        fail_msg("%s: %s%s", interpreter, r.out, r.err);
    done(&r);
}

static void test_python_frames_name_the_script(void **state)
{
    (void)state;
    check_python_stacks(python);
    /* the tool names them too */
    struct result r = run("%s/tools/cuheap top py.jsonl", build);
    assert_non_null(strstr(r.out, "py_alloc.py:"));
    assert_non_null(strstr(r.out, " in allocate_activations"));
    done(&r);
    /* Python processes walk 12 native frames unless told otherwise */
    r = run("head -1 py.jsonl");
    assert_non_null(strstr(r.out, "\"stack_depth\":12"));
    done(&r);
    r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=py2.jsonl CUHEAP_SUMMARY=0 CUHEAP_STACK_DEPTH=20 "
                 "%s %s/tests/programs/py_alloc.py && head -1 py2.jsonl",
            build, build, python, source);
    assert_non_null(strstr(r.out, "\"stack_depth\":20"));
    done(&r);
}

/* Every CPython from 3.10 to 3.13 this machine has (pyenv keeps several): the frame layouts
 * differ per version. None found is a skip, not a pass. */
static void test_python_frames_each_version(void **state)
{
    (void)state;
    struct result list = run("ls -d /root/.pyenv/versions/3.1[0-3]*/bin/python3 "
                             "/usr/bin/python3.1[0-3] 2>/dev/null || true");
    int tried = 0;
    for (char *line = strtok(list.out, "\n"); line; line = strtok(NULL, "\n")) {
        check_python_stacks(line);
        tried++;
    }
    print_message("# python versions tried: %d\n", tried);
    done(&list);
    if (!tried)
        skip();
}

static void test_nvtx_ranges_become_markers(void **state)
{
    (void)state;
    struct result r = run(FAKE " %s/tools/cuheap run -o n.jsonl -- %s/tests/programs/nvtx-prog && "
                               "grep -c '\"label\":\"nvtx push: forward\"' n.jsonl && "
                               "grep -c '\"label\":\"nvtx: activations ready\"' n.jsonl && "
                               "grep -c '\"label\":\"nvtx pop\"' n.jsonl",
                          build, build, build);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    assert_non_null(strstr(r.out, "nvtx_prog: ok\n3\n3\n3\n"));
    done(&r);
}

static void test_several_devices(void **state)
{
    (void)state;
    struct result r = run(FAKE " " PRELOAD " FAKECUDA_DEVICE_COUNT=2 CUHEAP_OUTPUT=md.jsonl "
                               "%s/tests/programs/multidev && %s/tools/cuheap report md.jsonl",
                          build, build, build, build);
    if (r.status)
        fail_msg("%s%s", r.out, r.err);
    assert_non_null(strstr(r.out, "GPU 0"));
    assert_non_null(strstr(r.out, "GPU 1"));
    assert_non_null(strstr(r.out, "still live at the end: 1.00 MiB"));
    assert_non_null(strstr(r.out, "still live at the end: 2.00 MiB"));
    assert_non_null(strstr(r.err, "GPU 1: peak live"));
    done(&r);
}

/* ==== The recorder's promises (ring, trace file, flush, summary, labels, sizes) ====
 * Cases of the recorder's work; each runs tests/programs/recprog (one subcommand per
 * behaviour) under the preloaded library. */

#define RECPROG "%s/tests/programs/recprog"

/* The number after `key` in s, or -1. */
static long number_after(const char *s, const char *key)
{
    const char *p = s ? strstr(s, key) : NULL;
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static void test_rec_ring_resident_as_it_fills(void **state)
{
    (void)state;
    /* a process that made three events holds about as much memory with the default ring
     * (65536 slots, 53 MB if touched) as with a 64-slot one */
    struct result big =
        run(FAKE " " PRELOAD " CUHEAP_OUTPUT=a.jsonl CUHEAP_SUMMARY=0 " RECPROG " rss", build,
            build, build);
    struct result small = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=b.jsonl CUHEAP_SUMMARY=0 "
                                   "CUHEAP_RING=64 " RECPROG " rss",
                              build, build, build);
    long rss_big = number_after(big.out, "rss: "), rss_small = number_after(small.out, "rss: ");
    assert_true(rss_big > 0 && rss_small > 0);
    if (rss_big - rss_small > 8 * 1024)
        fail_msg("default ring: %ld KiB resident, 64 slots: %ld KiB", rss_big, rss_small);
    done(&big);
    done(&small);
}

/* Run recprog allocs N in the background, wait until it has made its events, wait `after_ms`,
 * SIGKILL it; then count the alloc events in t.jsonl. */
static long allocs_left_by_killed_run(const char *settings, int n, int after_ms)
{
    struct result r = run("rm -f t.jsonl o; " FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl %s " RECPROG
                          " allocs %d 20000 >o & pid=$!; "
                          "for i in $(seq 200); do grep -q ready o && break; sleep 0.05; done; "
                          "sleep %d.%03d; kill -9 $pid; wait $pid; "
                          "grep -c '\"event\":\"alloc\"' t.jsonl; wc -l <t.jsonl",
                          build, build, settings, build, n, after_ms / 1000, after_ms % 1000);
    long nr = strtol(r.out, NULL, 10);
    done(&r);
    return nr;
}

static void test_rec_killed_run_keeps_flushed_events(void **state)
{
    (void)state;
    /* events older than CUHEAP_FLUSH_MS are on disk when the program is killed */
    assert_int_equal(allocs_left_by_killed_run("CUHEAP_FLUSH_MS=100", 10, 500), 10);
    /* and not before: between flushes they wait in the trace's buffer (1 MiB, not stdio's
     * default 4 KiB), so a killed program with a long interval leaves only the header */
    assert_int_equal(allocs_left_by_killed_run("CUHEAP_FLUSH_MS=60000", 300, 300), 0);
}

static void test_rec_chrome_name_with_a_rank(void **state)
{
    (void)state;
    struct result r =
        run(FAKE " " PRELOAD " RANK=3 CUHEAP_FORMAT=chrome CUHEAP_SUMMARY=0 " RECPROG " rss && ls",
            build, build, build);
    assert_int_equal(r.status, 0);
    /* the rank's name, with the extension of the format written */
    if (count_files("cuheap-r3-") != 1 || !strstr(r.out, ".trace.json\n"))
        fail_msg("files: %s", r.out);
    done(&r);
}

static void test_rec_marks_do_not_grow_memory(void **state)
{
    (void)state;
    /* 200,000 marks after a warm-up: cuheap's memory stays flat (a leaked string per mark
     * was 24 MB here) */
    struct result r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_RING=4096 " RECPROG
                               " mark-rss 200000 && grep -c '\"event\":\"mark\"' t.jsonl",
                          build, build, build);
    long growth = number_after(r.out, "growth "), written = number_after(r.out, "KiB\n");
    if (r.status || growth < 0 || growth > 4096 || written < 100000)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_rec_text_that_is_not_utf8(void **state)
{
    (void)state;
    /* a program whose path, arguments and labels hold bytes that are not UTF-8 (and a label
     * cut at the length limit inside a character): the header and every line stay readable,
     * the labels keep their text */
    struct result r =
        run("cp " RECPROG " \"rec$(printf '\\377')prog\" && " FAKE " " PRELOAD
            " NVTX_INJECTION64_PATH=%s/src/libcuheap.so CUHEAP_OUTPUT=t.jsonl CUHEAP_SUMMARY=0 "
            "./rec*prog marks \"bad $(printf '\\377\\376') "
            "label\" \"$(for i in $(seq 70); do printf '\\303\\251'; done)\" && "
            "%s/tools/cuheap check t.jsonl && %s -c \""
            "import json; lines = [json.loads(l) for l in open('t.jsonl', encoding='utf-8')]; "
            "h = lines[0]; assert len(h['cmdline']) == 4 and 'prog' in h['exe'], h; "
            "marks = [l['label'] for l in lines if l.get('event') == 'mark']; "
            "marks = [m[6:] if m.startswith('nvtx: ') else m for m in marks]; "
            "assert len(marks) == 4, marks; "
            "assert all(m.startswith('bad ') and m.endswith(' label') for m in marks[:2]), marks; "
            "assert all(m and set(m) == {'\\u00e9'} for m in marks[2:]), marks; "
            "assert all(f.get('module') for l in lines if l['type'] == 'stack' "
            "for f in l['frames'][:1]), lines; print('utf8 ok')\"",
            build, build, build, build, build, python);
    if (r.status || !strstr(r.out, "utf8 ok"))
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_rec_sizes_beyond_int64(void **state)
{
    (void)state;
    /* an out-of-memory for 2^63 bytes: the event survives, with its size, in the tool's
     * report, in any JSON reader, and against the schema */
    struct result r =
        run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_SUMMARY=0 " RECPROG " huge && "
                 "%s/tools/cuheap report t.jsonl && %s %s/scripts/validate-trace.py t.jsonl && "
                 "%s -c \"import json; ev = [json.loads(l) for l in open('t.jsonl')]; "
                 "o = [e for e in ev if e.get('event') == 'oom']; "
                 "s = o[0]['size']; s = int(s, 16) if isinstance(s, str) else s; "
                 "assert len(o) == 1 and s == 2**63, o; print('size ok')\"",
            build, build, build, build, python, source, python);
    if (r.status || !strstr(r.out, "OUT OF MEMORY  1 times") || !strstr(r.out, "size ok") ||
        strstr(r.err, "malformed"))
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_rec_trace_file_is_created_safely(void **state)
{
    (void)state;
    /* the trace holds the command line: only its owner reads it unless told otherwise */
    struct result r =
        run("umask 022; " FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl " RECPROG
            " rss && stat -c %%a t.jsonl && " FAKE " " PRELOAD
            " CUHEAP_OUTPUT=w.jsonl CUHEAP_OUTPUT_MODE=0644 " RECPROG " rss && stat -c %%a w.jsonl",
            build, build, build, build, build, build);
    if (r.status || !strstr(r.out, "\n600\n") || !strstr(r.out, "\n644\n"))
        fail_msg("%s%s", r.out, r.err);
    done(&r);
    /* an existing file is never truncated, a planted symlink never followed (nor a dangling
     * one created through): the trace gets a new name, which the summary gives */
    r = run("echo precious >t.jsonl && echo victim >victim && ln -s victim s.jsonl && "
            "ln -s made-through d.jsonl && "
            "for f in t s d; do " FAKE " " PRELOAD " CUHEAP_OUTPUT=$f.jsonl " RECPROG
            " rss; done; cat t.jsonl victim; ls made-through 2>&1; "
            "%s/tools/cuheap check t.jsonl.1 s.jsonl.1 d.jsonl.1",
            build, build, build, build);
    if (!strstr(r.out, "precious\nvictim\n") || strstr(r.out, "\nmade-through\n") ||
        !strstr(r.err, "trace: t.jsonl.1 ") || !strstr(r.err, "trace: s.jsonl.1 ") ||
        !strstr(r.err, "trace: d.jsonl.1 ") || count_lines(r.out, ": ok, ") != 3)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
    /* a second run to the same name gets the next suffix, and says so without a summary */
    r = run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_SUMMARY=0 " RECPROG " rss", build,
            build, build);
    assert_int_equal(count_lines(r.err, "the trace goes to t.jsonl.2\n"), 1);
    done(&r);
}

static void test_rec_rank_cannot_leave_the_folder(void **state)
{
    (void)state;
    /* the rank comes from the environment: it names a file, never a path */
    struct result r =
        run("mkdir w && cd w && " FAKE " " PRELOAD " RANK=../escaped CUHEAP_OUTPUT=%%r.jsonl "
            "CUHEAP_SUMMARY=0 " RECPROG " rss && ls -A",
            build, build, build);
    assert_int_equal(r.status, 0);
    assert_int_equal(count_files("escaped"), 0);
    assert_non_null(strstr(r.out, "escaped.jsonl\n"));
    done(&r);
}

static void test_rec_summary_says_what_was_written(void **state)
{
    (void)state;
    /* a trace that could not be created is not named as the trace */
    struct result r =
        run(FAKE " " PRELOAD " CUHEAP_OUTPUT=/nonexistent/dir/t.jsonl " RECPROG " rss", build,
            build, build);
    assert_int_equal(r.status, 0);
    if (strstr(r.err, "trace: /nonexistent") || !strstr(r.err, "no trace written"))
        fail_msg("%s", r.err);
    done(&r);
    /* the disk fills up after a while (a file size limit, its signal ignored, stands in):
     * the summary names the partial trace, which the tool reads */
    r = run("trap '' XFSZ; ulimit -f 16; " FAKE " " PRELOAD
            " CUHEAP_OUTPUT=t.jsonl CUHEAP_FLUSH_MS=1 %s/tests/programs/cuheap-demo 30; "
            "ulimit -f unlimited; %s/tools/cuheap check t.jsonl",
            build, build, build, build);
    if (r.status || !strstr(r.err, "trace: t.jsonl is partial") || strstr(r.err, "no trace") ||
        !strstr(r.out, "t.jsonl: ok") || !strstr(r.out, "incomplete"))
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_rec_events_after_stop_are_counted(void **state)
{
    (void)state;
    /* allocations made after recording stopped at exit (recprog's exit handler runs after
     * cuheap's, as a thread still running would) are counted as dropped, not lost unseen */
    struct result r =
        run(FAKE " " PRELOAD " CUHEAP_OUTPUT=t.jsonl CUHEAP_SUMMARY=0 " RECPROG " late 10", build,
            build, build);
    long events = number_after(r.out, "events+"), dropped = number_after(r.out, "dropped+");
    if (r.status || !strstr(r.out, "failed=0") || events < 20 || dropped != events)
        fail_msg("%s%s", r.out, r.err);
    done(&r);
}

static void test_rec_signal_handler_allocating_during_a_mark(void **state)
{
    (void)state;
    /* a signal handler that allocates, run while a mark (cuheap_mark, an NVTX mark) starts
     * cuheap on the same thread: the program finishes (it used to wait on itself forever) */
    static const char *const how[] = {"signal-mark", "signal-nvtx"};
    for (int k = 0; k < 2; k++) {
        struct result r = run("hung=0; for i in $(seq 10); do " FAKE " " PRELOAD
                              " NVTX_INJECTION64_PATH=%s/src/libcuheap.so CUHEAP_OUTPUT=/dev/null "
                              "CUHEAP_SUMMARY=0 timeout 5 " RECPROG " %s >/dev/null || "
                              "hung=$((hung + 1)); done; echo \"hung $hung\"",
                              build, build, build, build, how[k]);
        if (number_after(r.out, "hung ") != 0)
            fail_msg("%s: %s%s", how[k], r.out, r.err);
        done(&r);
    }
}

int main(void)
{
    const char *b = getenv("CUHEAP_BUILD_ROOT"), *s = getenv("CUHEAP_SOURCE_ROOT");
    if (!b || !s) {
        fprintf(stderr, "run through meson test (CUHEAP_BUILD_ROOT, CUHEAP_SOURCE_ROOT)\n");
        return 1;
    }
    snprintf(build, sizeof(build), "%s", b);
    snprintf(source, sizeof(source), "%s", s);
    (void)env_base;
    /* a Python with jsonschema for the schema check: the system one, else the first on PATH */
    python = system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") == 0 ? "/usr/bin/python3"
                                                                                : "python3";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_process_without_cuda_is_untouched, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_doors_give_the_same_results, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_fork_and_exec_children_write_their_own_traces,
                                        fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_unwritable_trace_path, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_full_disk, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_bad_setting_warns_once_and_runs, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_sigkill_leaves_a_readable_prefix, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_trace_matches_schema, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_chrome_output_opens, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_tool_commands, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_tool_rejects_bad_input, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_python_frames_name_the_script, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_python_frames_each_version, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_nvtx_ranges_become_markers, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_several_devices, fresh_dir, remove_dir),
        /* the recorder's cases */
        cmocka_unit_test_setup_teardown(test_rec_ring_resident_as_it_fills, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_killed_run_keeps_flushed_events, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_chrome_name_with_a_rank, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_marks_do_not_grow_memory, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_text_that_is_not_utf8, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_sizes_beyond_int64, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_trace_file_is_created_safely, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_rank_cannot_leave_the_folder, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_summary_says_what_was_written, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_events_after_stop_are_counted, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_rec_signal_handler_allocating_during_a_mark, fresh_dir,
                                        remove_dir),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
