/* SPDX-License-Identifier: MIT */
/*
 * Following running jobs and out-of-memory answers told right, as a user sees them:
 * `cuheap top --follow` on a trace being written shows its live bytes change, follows four
 * ranks at once (the one holding the most first), redraws in place on a terminal and quits on
 * q (tmux drives it; skipped without tmux); `cuheap run --live` follows its program; a program
 * the simulated driver refuses, which frees and asks again, gets one line and no block, and one
 * that gives up gets the block naming its call site.
 *
 * Paths come from meson: CUHEAP_BUILD_ROOT and CUHEAP_SOURCE_ROOT.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define SHELLTEST_PREFIX "cuheap-live-XXXXXX"
#include "shelltest.h"

static char build[PATH_MAX], source[PATH_MAX];
static const char *python;

#define ENV  "LD_LIBRARY_PATH=%s/tests/fakecuda LD_PRELOAD=%s/src/libcuheap.so"
#define PROG "%s/tests/programs/liveprog"
#define TOOL "%s/tools/cuheap"

/* The LIVE column of each table's rows for trace name (in MiB), in order; returns how many. */
static int live_column(const char *out, const char *name, double *ret, int max)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, name)) && n < max; p += strlen(name)) {
        const char *bol = p;
        while (bol > out && bol[-1] != '\n')
            bol--;
        double v;
        char unit[8];
        if (sscanf(bol, "%*s %*s %*s %lf %7s", &v, unit) == 2 && strchr("0123456789-", bol[0]))
            ret[n++] = v * (!strcmp(unit, "KiB") ? 1.0 / 1024 : !strcmp(unit, "B") ? 0 : 1);
    }
    return n;
}

static void test_follow_sees_live_bytes_change(void **state)
{
    (void)state;
    /* 120 blocks of 1 MiB over about 3 s, all freed at the end */
    struct result r = run(ENV " CUHEAP_OUTPUT=t-%%p.jsonl " PROG " grow 120 25 & "
                              "timeout 60 " TOOL " top --follow --interval 0.3 't-*.jsonl'; "
                              "wait",
                          build, build, build, build);
    assert_int_equal(r.status, 0);
    double live[64];
    int n = live_column(r.out, ".jsonl", live, 64);
    if (n < 4)
        fail_msg("too few tables:\n%s", r.out);
    int rising = 0;
    for (int i = 1; i < n; i++)
        rising += live[i] > live[i - 1];
    if (rising < 3)
        fail_msg("live bytes did not grow while the trace was written:\n%s", r.out);
    assert_true(live[n - 1] == 0); /* all freed at the end */
    assert_non_null(strstr(r.out, "(ended)"));
    assert_non_null(strstr(r.out, "keep_block")); /* the call site, named as report names it */
    done(&r);
}

static void test_follow_four_ranks(void **state)
{
    (void)state;
    /* rank r keeps blocks of r+1 MiB: rank 3 holds the most all along */
    struct result r = run("for k in 0 1 2 3; do RANK=$k " ENV " " PROG " grow 100 25 $((k+1)) & "
                          "done; sleep 0.5; timeout 60 " TOOL
                          " top --follow --interval 0.4 'cuheap-r*.jsonl'; wait",
                          build, build, build, build);
    assert_int_equal(r.status, 0);
    /* every table while all four ran: rows by live bytes, most first; rank 3 first in one */
    const char *t = strstr(r.out, "4 traces, 4 being written");
    if (!t)
        fail_msg("no table with four ranks running:\n%s", r.out);
    int rank3_first = 0;
    for (const char *tb = t; tb; tb = strstr(tb + 1, "4 traces, 4 being written")) {
        const char *row = strchr(strchr(tb, '\n') + 1, '\n') + 1; /* past the column names */
        double prev = 1e18;
        for (int k = 0; k < 4; k++) {
            double v;
            char unit[8];
            if (sscanf(row, "%*s %*s %*s %lf %7s", &v, unit) != 2)
                fail_msg("a row that does not read:\n%s", tb);
            v *= !strcmp(unit, "KiB") ? 1.0 / 1024 : !strcmp(unit, "GiB") ? 1024 : 1;
            if (v > prev)
                fail_msg("rows not by live bytes:\n%.600s", tb);
            prev = v;
            rank3_first += k == 0 && !strncmp(row, "3 ", 2);
            row = strchr(row, '\n') + 1;
        }
    }
    assert_true(rank3_first > 0);
    const char *last = t, *p;
    while ((p = strstr(last + 1, "cuheap top --follow")))
        last = p;
    assert_int_equal(count(last, "(ended)\n"), 4);
    for (int k = 0; k < 4; k++) {
        char want[32];
        snprintf(want, sizeof(want), "\nrank %d GPU 0", k);
        assert_non_null(strstr(last, want));
    }
    done(&r);
}

static void test_follow_names_what_it_cannot_follow(void **state)
{
    (void)state;
    struct result r = run("echo hello >junk.jsonl; printf 'x' | gzip >packed.jsonl; " TOOL
                          " top --follow --count 1 junk.jsonl packed.jsonl",
                          build);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.out, "junk.jsonl: not a cuheap trace"));
    assert_non_null(strstr(r.out, "packed.jsonl: a gzip-compressed trace"));
    done(&r);
}

static void test_run_live_follows_its_program(void **state)
{
    (void)state;
    struct result r = run("CUHEAP_LIVE_INTERVAL=0.3 LD_LIBRARY_PATH=%s/tests/fakecuda " TOOL
                          " run --live -- " PROG " grow 60 25",
                          build, build, build);
    assert_int_equal(r.status, 0);
    double live[64];
    int n = live_column(r.out, ".jsonl", live, 64);
    assert_true(n >= 2);
    assert_non_null(strstr(r.out, "(the program ended)"));
    done(&r);
    /* the program's exit status is the run's */
    r = run("CUHEAP_LIVE_INTERVAL=0.3 LD_LIBRARY_PATH=%s/tests/fakecuda FAKECUDA_DEVICE_MEM=256M "
            "CUHEAP_POOL=0 " TOOL " run --live -- " PROG " oom-giveup 64",
            build, build, build);
    assert_int_equal(r.status, 3);
    done(&r);
}

/* Refused, frees, asks again and gets it (as PyTorch's caching allocator does): one line and
 * no block, with or without the pool; `report` and the live view count it apart. */
static void test_oom_recovered_is_one_line(void **state)
{
    (void)state;
    for (int pool = 0; pool < 2; pool++) {
        struct result r =
            run(ENV " FAKECUDA_DEVICE_MEM=256M CUHEAP_POOL=%d CUHEAP_OUTPUT=t.jsonl " PROG
                    " oom-recover 64",
                build, build, pool, build);
        assert_int_equal(r.status, 0);
        if (count(r.err, "cuheap: out of memory") != 1 ||
            !strstr(r.err, "cuheap: out of memory on GPU 0 for 64.00 MiB, recovered after the "
                           "program released 128.00 MiB\n") ||
            strstr(r.err, "call sites holding the most") ||
            !strstr(r.err, "2 out-of-memory errors (recovered from: 2)"))
            fail_msg("pool %d: not one line for a recovered out-of-memory:\n%s", pool, r.err);
        done(&r);
        r = run("%s %s/scripts/validate-trace.py t.jsonl && " TOOL " report t.jsonl && " TOOL
                " top --follow --count 1 t.jsonl",
                python, source, build, build);
        assert_int_equal(r.status, 0);
        assert_null(strstr(r.out, "OUT OF MEMORY"));
        assert_non_null(strstr(r.out, "2 out-of-memory answers the program recovered from"));
        assert_non_null(strstr(r.out, " 0+2r "));
        done(&r);
        run("rm -f t.jsonl");
    }
}

/* Refused and gives up: the block, naming the call sites (a static function's name, which
 * only the program's .symtab has); `report` counts it. */
static void test_oom_given_up_gets_the_block(void **state)
{
    (void)state;
    struct result r =
        run(ENV " FAKECUDA_DEVICE_MEM=256M CUHEAP_OUTPUT=t.jsonl " PROG " oom-giveup 64", build,
            build, build);
    assert_int_equal(r.status, 3);
    if (!strstr(r.err, "call sites holding the most:\n") || !strstr(r.err, "liveprog!keep_block") ||
        strstr(r.err, "recovered") || strstr(r.err, "caching allocator"))
        fail_msg("no block naming the call site:\n%s", r.err);
    assert_int_equal(count(r.err, "CUDA_ERROR_OUT_OF_MEMORY from the driver"), 1);
    done(&r);
    r = run(TOOL " report t.jsonl", build);
    assert_non_null(strstr(r.out, "OUT OF MEMORY  2 times"));
    assert_null(strstr(r.out, "recovered"));
    done(&r);
    /* under a caching allocator the block says what its live bytes are */
    r = run(ENV " FAKECUDA_DEVICE_MEM=256M CUHEAP_OUTPUT=c.jsonl " PROG
                " oom-caching 64 %s/tests/programs/libc10_cuda.so",
            build, build, build, build);
    assert_int_equal(r.status, 3);
    if (!strstr(r.err, "a caching allocator (PyTorch's) holds this memory: the bytes called live "
                       "are its segments, its cache included"))
        fail_msg("the block does not say live bytes are the allocator's segments:\n%s", r.err);
    done(&r);
    /* PyTorch with its cache turned off: every tensor is a cudaMalloc, so the live bytes are
     * tensors and the block must not say they are a cache's */
    r = run(ENV
            " PYTORCH_NO_CUDA_MEMORY_CACHING=1 FAKECUDA_DEVICE_MEM=256M CUHEAP_OUTPUT=c.jsonl " PROG
            " oom-caching 64 %s/tests/programs/libc10_cuda.so",
            build, build, build, build);
    assert_int_equal(r.status, 3);
    if (!strstr(r.err, "call sites holding the most:\n") || strstr(r.err, "caching allocator"))
        fail_msg("caching off, yet the block says a caching allocator holds the memory:\n%s",
                 r.err);
    done(&r);
    /* refused, then a smaller request: not a retry, so the block is told then, before the
     * program goes on (not only at its exit) */
    r = run(ENV " FAKECUDA_DEVICE_MEM=256M CUHEAP_OUTPUT=o.jsonl " PROG " oom-other 64", build,
            build, build);
    assert_int_equal(r.status, 0);
    const char *block = strstr(r.err, "call sites holding the most:\n");
    const char *went = strstr(r.err, "liveprog: went on");
    if (!block || !went || block > went || strstr(r.err, "recovered"))
        fail_msg("the block did not come at the program's next request:\n%s", r.err);
    done(&r);
}

/* Four ranks, one of which runs out of memory: report and html say which, by how much, and at
 * which call site it differs from the others. */
static void test_ranks_compared(void **state)
{
    (void)state;
    struct result r =
        run("for k in 0 1 3; do RANK=$k CUHEAP_SUMMARY=0 " ENV " " PROG
            " grow 20 1 $((k+1)) || exit 1; done; RANK=2 FAKECUDA_DEVICE_MEM=256M " ENV " " PROG
            " oom-giveup 64 2>/dev/null; " TOOL " report cuheap-r*.jsonl && " TOOL
            " html -o r.html cuheap-r*.jsonl && cat r.html",
            build, build, build, build, build, build, build, build);
    if (r.status)
        fail_msg("exit %d\n%s", r.status, r.err);
    const char *across = strstr(r.out, "== across 4 ranks\n");
    if (!across ||
        !strstr(across, "rank 2 ran out of memory (2 times on GPU 0), the others never; it peaked "
                        "at 256.00 MiB, 216.00 MiB above the others' median (40.00 MiB") ||
        !strstr(across, "+256.00 MiB  keep_block") || !strstr(across, "fill_device"))
        fail_msg("report does not single out rank 2:\n%s", across ? across : r.out);
    assert_non_null(strstr(r.out, "<h2>Across 4 ranks</h2>"));
    assert_non_null(strstr(r.out, "<td>+256.00 MiB</td><td>keep_block"));
    done(&r);
    /* without an out-of-memory: the one that peaked highest */
    r = run("rm cuheap-r2-*.jsonl; " TOOL " report cuheap-r*.jsonl", build);
    assert_non_null(strstr(r.out, "rank 3 peaked highest: 80.00 MiB on GPU 0, 60.00 MiB above the "
                                  "others' median (20.00 MiB, 300.0%)"));
    done(&r);
}

/* tmux as the terminal: the view redraws in place (one screen, its figures changing) and q
 * quits, leaving the terminal as it was. */
static void test_terminal_view_redraws_and_quits(void **state)
{
    (void)state;
    char sess[64];
    snprintf(sess, sizeof(sess), "cuheap-live-%d", (int)getpid());
    struct result r = run("tmux -L %s kill-server 2>/dev/null; " ENV
                          " CUHEAP_OUTPUT=t-%%p.jsonl " PROG " grow 400 25 & "
                          "sleep 0.3; tmux -L %s new-session -d -x 120 -y 40 "
                          "\"" TOOL " top --follow --interval 0.2 't-*.jsonl'; stty -a >stty.txt; "
                          "sleep 5\"; sleep 1.5; tmux -L %s capture-pane -p >screen1.txt; "
                          "sleep 1; tmux -L %s capture-pane -p >screen2.txt; "
                          "tmux -L %s send-keys q; sleep 1; cat stty.txt; "
                          "tmux -L %s kill-server; wait",
                          sess, build, build, build, sess, build, sess, sess, sess, sess);
    char p[PATH_MAX + 16];
    snprintf(p, sizeof(p), "%s/screen1.txt", tmp);
    char *s1 = slurp(p);
    snprintf(p, sizeof(p), "%s/screen2.txt", tmp);
    char *s2 = slurp(p);
    if (count(s1, "RANK ") != 1 || count(s2, "RANK ") != 1)
        fail_msg("not one table on the screen:\n%s\n----\n%s", s1, s2);
    assert_int_equal(count(s1, "q quits"), 1);
    double a, b;
    assert_int_equal(live_column(s1, ".jsonl", &a, 1), 1);
    assert_int_equal(live_column(s2, ".jsonl", &b, 1), 1);
    if (!(b > a))
        fail_msg("the view did not redraw with new figures:\n%s\n----\n%s", s1, s2);
    /* q quit the view, and raw mode was undone */
    if (!strstr(r.out, " icanon") || !strstr(r.out, " echo "))
        fail_msg("q did not quit or the terminal stayed raw:\n%s", r.out);
    free(s1);
    free(s2);
    done(&r);
}

int main(void)
{
    const char *b = getenv("CUHEAP_BUILD_ROOT");
    if (!b)
        return fprintf(stderr, "CUHEAP_BUILD_ROOT not set\n"), 1;
    snprintf(build, sizeof(build), "%s", b);
    snprintf(source, sizeof(source), "%s",
             getenv("CUHEAP_SOURCE_ROOT") ? getenv("CUHEAP_SOURCE_ROOT") : ".");
    /* a Python with jsonschema for the schema check: the system one, else the first on PATH */
    python = system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") == 0 ? "/usr/bin/python3"
                                                                                : "python3";
    cmocka_set_message_output(CM_OUTPUT_TAP);
    if (getenv("CUHEAP_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CUHEAP_TEST_FILTER"));
    /* the terminal's case alone, as its own meson test: a skipped cmocka case reads as a
     * failure, so without tmux the whole test says it was skipped */
    if (getenv("CUHEAP_TEST_TMUX")) {
        if (system("command -v tmux >/dev/null 2>&1")) {
            printf("1..0 # SKIP tmux is not installed\n");
            return 0;
        }
        const struct CMUnitTest tty[] = {
            cmocka_unit_test_setup_teardown(test_terminal_view_redraws_and_quits, fresh_dir,
                                            remove_dir),
        };
        return cmocka_run_group_tests(tty, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_follow_sees_live_bytes_change, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_follow_four_ranks, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_follow_names_what_it_cannot_follow, fresh_dir,
                                        remove_dir),
        cmocka_unit_test_setup_teardown(test_run_live_follows_its_program, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_oom_recovered_is_one_line, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_oom_given_up_gets_the_block, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_ranks_compared, fresh_dir, remove_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
