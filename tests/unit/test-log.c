/* SPDX-License-Identifier: MIT */
/* The logger: one line a message, and a message too long for a line says where it was cut. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "log.h"

/* What cuheap_log_always(fmt, text) writes on stderr. */
static size_t logged(const char *text, char *buf, size_t size)
{
    int fds[2], saved = dup(STDERR_FILENO);
    assert_int_equal(pipe(fds), 0);
    dup2(fds[1], STDERR_FILENO);
    cuheap_log_always("trace: %s (stacks: libunwind)", text);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], buf, size - 1);
    close(fds[0]);
    assert_true(n > 0);
    buf[n] = 0;
    return (size_t)n;
}

static void test_lines_whole_or_marked(void **state)
{
    (void)state;
    static char text[4096], buf[2 * CUHEAP_LOG_MAX_LINE];
    const size_t frame = strlen("cuheap: trace:  (stacks: libunwind)\n");
    /* the longest that fits is whole */
    memset(text, 'a', CUHEAP_LOG_MAX_LINE - frame);
    text[CUHEAP_LOG_MAX_LINE - frame] = 0;
    size_t n = logged(text, buf, sizeof(buf));
    assert_int_equal(n, CUHEAP_LOG_MAX_LINE);
    assert_non_null(strstr(buf, "a (stacks: libunwind)\n"));
    /* one byte more is cut, and says so: the line's end is not taken for the message's */
    strcat(text, "b");
    n = logged(text, buf, sizeof(buf));
    assert_true(n <= CUHEAP_LOG_MAX_LINE);
    char want[64];
    /* the message: "trace: ", the text and " (stacks: libunwind)", without "cuheap: " */
    snprintf(want, sizeof(want), "... [cut: %d bytes in all]\n", CUHEAP_LOG_MAX_LINE - 8);
    if (!strstr(buf, want) || strchr(buf, '\n') != buf + n - 1)
        fail_msg("%s", buf);
    /* never between the bytes of a character */
    for (size_t i = 0; i + 2 <= sizeof(text) - 1; i += 2)
        memcpy(text + i, "\xc3\xa9", 2);
    text[sizeof(text) - 1] = 0;
    n = logged(text, buf, sizeof(buf));
    const char *mark = strstr(buf, "... [cut: ");
    assert_non_null(mark);
    assert_int_equal((mark - (buf + strlen("cuheap: trace: "))) % 2, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_whole_or_marked),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
