/* SPDX-License-Identifier: MIT */
/* The trace file: only a new regular file or a character device gets the trace, and writing
 * it never raises SIGPIPE in the program nor waits long. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "tracefile.h"

static char dir[64];

static int fresh_dir(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/cuheap-tracefile-XXXXXX");
    return mkdtemp(dir) && chdir(dir) == 0 ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return chdir("/") || system(cmd);
}

static bool sigpipe_pending(void)
{
    sigset_t pending;
    sigpending(&pending);
    return sigismember(&pending, SIGPIPE);
}

static bool sigpipe_blocked(void)
{
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, NULL, &mask);
    return sigismember(&mask, SIGPIPE);
}

/* A write into a pipe whose reader left: EPIPE, and the program (SIGPIPE's default
 * disposition, not blocked: this test's) goes on with its mask and disposition as they were
 * and no signal left over, where SIGPIPE would kill it (exit 141). */
static void test_write_never_raises_sigpipe(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    close(fds[0]);
    struct sigaction sa;
    sigaction(SIGPIPE, NULL, &sa);
    assert_true(sa.sa_handler == SIG_DFL);
    assert_false(sigpipe_blocked());
    for (int i = 0; i < 3; i++)
        assert_int_equal(cuheap_tracefile_write(fds[1], "trace\n", 6), -EPIPE);
    assert_false(sigpipe_pending());
    assert_false(sigpipe_blocked());
    sigaction(SIGPIPE, NULL, &sa);
    assert_true(sa.sa_handler == SIG_DFL);
    close(fds[1]);
}

/* A SIGPIPE the program had pending (blocked) before the write is its own: it stays. */
static void test_program_sigpipe_stays_pending(void **state)
{
    (void)state;
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    pthread_kill(pthread_self(), SIGPIPE);
    assert_true(sigpipe_pending());
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    close(fds[0]);
    assert_int_equal(cuheap_tracefile_write(fds[1], "x", 1), -EPIPE);
    assert_true(sigpipe_pending());
    assert_true(sigpipe_blocked()); /* the program's mask, as it was */
    static const struct timespec zero;
    assert_int_equal(sigtimedwait(&pipe_set, NULL, &zero), SIGPIPE);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(fds[1]);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *drain_later(void *arg)
{
    int fd = *(int *)arg;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char buf[65536];
    size_t total = 0;
    while (total < (1u << 20)) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0)
            total += (size_t)n;
        else if (n == 0 || errno != EAGAIN)
            break;
        else
            nanosleep(&ts, NULL);
    }
    return NULL;
}

/* A descriptor that takes nothing more (a reader that never reads, a terminal stopped) costs
 * one write CUHEAP_TRACE_WAIT_MS at most, then EAGAIN; one that takes it late gets it all.
 * Unbounded, it waits for good, and the program's exit with it. */
static void test_write_waits_a_bounded_time(void **state)
{
    (void)state;
    alarm(30); /* a write that waits for good ends the test here */
    int fds[2];
    assert_int_equal(pipe2(fds, O_NONBLOCK), 0);
    static char big[1 << 20];
    memset(big, 'x', sizeof(big));
    double t = seconds();
    assert_int_equal(cuheap_tracefile_write(fds[1], big, sizeof(big)), -EAGAIN);
    double waited = seconds() - t;
    assert_true(waited >= CUHEAP_TRACE_WAIT_MS / 1000.0 * 0.9 && waited < 10);
    char buf[65536];
    while (read(fds[0], buf, sizeof(buf)) > 0)
        ;
    pthread_t reader;
    pthread_create(&reader, NULL, drain_later, &fds[0]);
    assert_int_equal(cuheap_tracefile_write(fds[1], big, sizeof(big)), 0);
    pthread_join(reader, NULL);
    alarm(0);
    close(fds[0]);
    close(fds[1]);
}

static int create(char *path, struct cuheap_trace_refusal *refused)
{
    return cuheap_tracefile_create(path, CUHEAP_PATH_MAX, 0600, refused);
}

/* What the trace may take: a new regular file, or an existing character device. What stands
 * at the name otherwise is said, and the trace takes the next free ".N". */
static void test_only_new_files_and_devices(void **state)
{
    (void)state;
    struct cuheap_trace_refusal refused;
    struct stat st;
    char path[CUHEAP_PATH_MAX] = "t.jsonl";
    int fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "t.jsonl");
    assert_string_equal(refused.path, "");
    assert_true(fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600);
    assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
    close(fd);

    snprintf(path, sizeof(path), "/dev/null");
    fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "/dev/null");
    assert_string_equal(refused.path, "");
    assert_true(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode));
    close(fd);

    /* a FIFO with a reader: passed over, and the reader never sees a writer come */
    assert_int_equal(mkfifo("p", 0600), 0);
    int reader = open("p", O_RDONLY | O_NONBLOCK);
    assert_true(reader >= 0);
    snprintf(path, sizeof(path), "p");
    fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "p.1");
    assert_string_equal(refused.path, "p");
    assert_non_null(strstr(refused.why, "a FIFO ("));
    assert_int_equal(cuheap_tracefile_write(fd, "header\n", 7), 0);
    char buf[16];
    assert_true(read(reader, buf, sizeof(buf)) <= 0);
    close(fd);
    close(reader);

    static const struct {
        const char *name, *why;
    } others[] = {
        {"f", "an existing file (never replaced)"},
        {"l", "a symbolic link (never followed)"},
        {"d", "a directory ("},
        {"s", "a socket ("},
    };
    FILE *f = fopen("f", "w");
    fputs("precious\n", f);
    fclose(f);
    assert_int_equal(symlink("f", "l"), 0);
    assert_int_equal(mkdir("d", 0700), 0);
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX, .sun_path = "s"};
    assert_int_equal(bind(sock, (struct sockaddr *)&addr, sizeof(addr)), 0);
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        snprintf(path, sizeof(path), "%s", others[i].name);
        fd = create(path, &refused);
        char want[16];
        snprintf(want, sizeof(want), "%s.1", others[i].name);
        if (fd < 0 || strcmp(path, want) || strcmp(refused.path, others[i].name) ||
            strncmp(refused.why, others[i].why, strlen(others[i].why)))
            fail_msg("%s: fd %d, path %s, refused %s: %s", others[i].name, fd, path, refused.path,
                     refused.why);
        close(fd);
    }
    close(sock);
    f = fopen("f", "r");
    assert_non_null(fgets(buf, sizeof(buf), f));
    assert_string_equal(buf, "precious\n");
    fclose(f);

    snprintf(path, sizeof(path), "/nonexistent/t.jsonl");
    assert_int_equal(create(path, &refused), -ENOENT);
    assert_string_equal(path, "/nonexistent/t.jsonl");
}

/* Another user's FIFO or file (root only: chown) is named with its owner. */
static void test_another_users_name(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        printf("# not root: no file of another user to try\n");
        return;
    }
    assert_int_equal(mkfifo("q", 0666), 0);
    assert_int_equal(chown("q", 65534, 65534), 0);
    int reader = open("q", O_RDONLY | O_NONBLOCK);
    fclose(fopen("g", "w"));
    assert_int_equal(chown("g", 65534, 65534), 0);
    struct cuheap_trace_refusal refused;
    char path[CUHEAP_PATH_MAX] = "q";
    int fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "q.1");
    assert_string_equal(refused.why, "a FIFO owned by uid 65534 (cuheap writes only a new "
                                     "regular file or a character device)");
    close(fd);
    snprintf(path, sizeof(path), "g");
    fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "g.1");
    assert_string_equal(refused.why, "an existing file owned by uid 65534 (never replaced)");
    close(fd);
    close(reader);
}

/* A link to a character device (the user's own, or root's such as /dev/stdout on a terminal)
 * is written through as the device is; a link to a pipe, or a name in /dev that is no device
 * (/dev/stdout when the program's output goes to a file), is refused with no file made beside
 * it: a /dev/stdout.1 is no trace anyone looks for. */
static void test_links_to_devices(void **state)
{
    (void)state;
    struct cuheap_trace_refusal refused;
    char path[CUHEAP_PATH_MAX] = "n";
    assert_int_equal(symlink("/dev/null", "n"), 0);
    int fd = create(path, &refused);
    assert_true(fd >= 0);
    assert_string_equal(path, "n");
    assert_string_equal(refused.path, "");
    assert_int_equal(cuheap_tracefile_write(fd, "header\n", 7), 0);
    close(fd);

    assert_int_equal(mkfifo("p", 0600), 0);
    int reader = open("p", O_RDONLY | O_NONBLOCK);
    assert_int_equal(symlink("p", "lp"), 0);
    snprintf(path, sizeof(path), "lp");
    assert_int_equal(create(path, &refused), -EPERM);
    assert_string_equal(path, "lp");
    assert_non_null(strstr(refused.why, "a FIFO"));
    assert_int_equal(access("lp.1", F_OK), -1);
    close(reader);

    /* the program's output in a file: /dev/stdout leads to it, and is refused whole */
    fflush(stdout);
    int saved = dup(1), out = open("out", O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && out >= 0);
    dup2(out, 1);
    snprintf(path, sizeof(path), "/dev/stdout");
    fd = create(path, &refused);
    dup2(saved, 1);
    close(saved);
    close(out);
    if (fd >= 0)
        fail_msg("/dev/stdout on a file: opened as %s", path);
    assert_int_equal(fd, -EPERM);
    assert_int_equal(access("/dev/stdout.1", F_OK), -1);
}

/* stdio over the descriptor: its writes are cuheap_tracefile_write's, errors reach ferror. */
static void test_stream(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    FILE *f = cuheap_tracefile_stream(fds[1]);
    assert_non_null(f);
    fputs("line\n", f);
    assert_int_equal(fflush(f), 0);
    char buf[8] = "";
    assert_int_equal(read(fds[0], buf, sizeof(buf)), 5);
    close(fds[0]);
    fputs("more\n", f);
    errno = 0;
    assert_int_not_equal(fflush(f), 0);
    assert_int_equal(errno, EPIPE);
    assert_false(sigpipe_pending());
    fclose(f); /* closes fds[1] */
    assert_int_equal(fcntl(fds[1], F_GETFD), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_never_raises_sigpipe),
        cmocka_unit_test(test_program_sigpipe_stays_pending),
        cmocka_unit_test(test_write_waits_a_bounded_time),
        cmocka_unit_test_setup_teardown(test_only_new_files_and_devices, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_another_users_name, fresh_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_links_to_devices, fresh_dir, remove_dir),
        cmocka_unit_test(test_stream),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
