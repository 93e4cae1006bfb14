/* SPDX-License-Identifier: MIT */
/*
 * The trace file (see tracefile.h). The program must never pay for cuheap's trace: written
 * to, a FIFO at the trace's name kills it with SIGPIPE when its reader leaves and blocks its
 * exit when the reader stops reading, and one made by another user receives the trace,
 * command line included. So the trace goes only to a regular file created for it or to a
 * character device, every write is SIGPIPE-free whichever thread makes it (a hook's, the
 * writer's, the program's exit), and no write waits long.
 *
 * No state: the recorder's io_lock orders the calls.
 */
#include "tracefile.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What st is, for the summary: "a FIFO owned by uid 65534 (...)". */
static void describe(const struct stat *st, char *why, size_t size)
{
    mode_t m = st->st_mode;
    const char *kind = S_ISREG(m)    ? "an existing file"
                       : S_ISFIFO(m) ? "a FIFO"
                       : S_ISLNK(m)  ? "a symbolic link"
                       : S_ISDIR(m)  ? "a directory"
                       : S_ISSOCK(m) ? "a socket"
                       : S_ISBLK(m)  ? "a block device"
                                     : "neither a file nor a device";
    const char *rule = S_ISREG(m)   ? "never replaced"
                       : S_ISLNK(m) ? "never followed"
                                    : "cuheap writes only a new regular file or a character device";
    char owner[48] = "";
    if (st->st_uid != geteuid())
        snprintf(owner, sizeof(owner), " owned by uid %u", (unsigned)st->st_uid);
    snprintf(why, size, "%s%s (%s)", kind, owner, rule);
}

/* The only existing thing the trace is written to: a device (/dev/null, /dev/full) has no
 * content to clobber nor a reader that could stall or leave. */
static bool may_write_existing(mode_t m)
{
    return S_ISCHR(m);
}

/* The existing thing at path, opened for writing when it is a character device, else -1 with
 * why saying what it is. It is looked at through O_PATH, which opens nothing (opening a FIFO
 * to write tells its reader a writer came), and the device opened must be the one looked at.
 * A symbolic link is followed only when it is the user's or root's (/dev/stdout, /dev/fd/2)
 * and leads to a character device: a link another user made in a shared folder is never
 * followed. *ret_named: path names a device, or a link to one, a pipe or a socket, or lies in
 * /dev or /proc (so a file created beside it, such as /dev/stdout.1, would be no trace the
 * user looks for). */
static int open_device(const char *path, char *why, size_t size, bool *ret_named)
{
    struct stat st, now;
    int follow = O_NOFOLLOW;
    /* a name in /dev or /proc is the system's: a file made beside it is never what was meant */
    *ret_named = !strncmp(path, "/dev/", 5) || !strncmp(path, "/proc/", 6);
    int pfd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0 || fstat(pfd, &st)) {
        snprintf(why, size, "something cuheap cannot look at (%s)", strerror(errno));
        if (pfd >= 0)
            close(pfd);
        return -1;
    }
    close(pfd);
    struct stat to;
    if (S_ISLNK(st.st_mode) && stat(path, &to) == 0 && !S_ISREG(to.st_mode) &&
        !S_ISDIR(to.st_mode)) {
        *ret_named = true; /* a link to a device, a pipe or a socket (/dev/stdout) */
        if ((st.st_uid == geteuid() || st.st_uid == 0) && S_ISCHR(to.st_mode)) {
            st = to; /* the device the link leads to: the one opened must be it */
            follow = 0;
        } else {
            describe(&to, why, size);
            snprintf(why + strlen(why), size - strlen(why), ", at the end of a symbolic link");
            return -1;
        }
    }
    *ret_named |= S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode);
    if (!may_write_existing(st.st_mode)) {
        describe(&st, why, size);
        return -1;
    }
    int fd = open(path, O_WRONLY | follow | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        snprintf(why, size, "a device cuheap cannot open (%s)", strerror(errno));
        return -1;
    }
    if (fstat(fd, &now) || (now.st_mode & S_IFMT) != (st.st_mode & S_IFMT) ||
        now.st_dev != st.st_dev || now.st_ino != st.st_ino || now.st_rdev != st.st_rdev) {
        close(fd);
        snprintf(why, size, "a device replaced while cuheap opened it");
        return -1;
    }
    return fd;
}

/* A file just created with O_EXCL is new and regular; checked all the same, since anything
 * else must never get the trace. Its owner is not: root's file on an NFS share that squashes
 * root belongs to nobody, and is still the one it created. */
static int created(int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        return fd;
    close(fd);
    return -EPERM;
}

int cuheap_tracefile_create(char *path, size_t size, unsigned mode,
                            struct cuheap_trace_refusal *ret_refused)
{
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
    char base[CUHEAP_PATH_MAX], why[sizeof(ret_refused->why)];
    ret_refused->path[0] = ret_refused->why[0] = 0;
    if ((size_t)snprintf(base, sizeof(base), "%s", path) >= sizeof(base))
        return -ENAMETOOLONG;
    int fd = open(base, flags, (mode_t)mode);
    if (fd >= 0)
        return created(fd);
    if (errno != EEXIST && errno != ELOOP)
        return -errno;
    bool named;
    if ((fd = open_device(base, why, sizeof(why), &named)) >= 0)
        return fd;
    snprintf(ret_refused->path, sizeof(ret_refused->path), "%s", base);
    snprintf(ret_refused->why, sizeof(ret_refused->why), "%s", why);
    if (named)
        return -EPERM; /* a device or a link refused: no file beside it (/dev/stdout.1) */
    for (int i = 1; i < 1000; i++) {
        if ((size_t)snprintf(path, size, "%s.%d", base, i) >= size)
            break;
        fd = open(path, flags, (mode_t)mode);
        if (fd >= 0)
            return created(fd);
        if (errno != EEXIST && errno != ELOOP) {
            int err = errno;
            snprintf(path, size, "%s", base);
            return -err;
        }
    }
    snprintf(path, size, "%s", base);
    return -EEXIST;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cuheap_tracefile_write(int fd, const void *buf, size_t len)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    /* a SIGPIPE pending already is the program's: it stays */
    bool theirs = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    const char *p = buf;
    int err = 0;
    int64_t deadline = -1;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            deadline = -1; /* the wait is for a device that takes nothing */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if (deadline < 0)
                deadline = now_ms() + CUHEAP_TRACE_WAIT_MS;
            int64_t left = deadline - now_ms();
            if (left > 0) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                poll(&pfd, 1, (int)left);
                continue;
            }
        }
        err = n < 0 ? errno : EIO;
        break;
    }
    if (err == EPIPE && !theirs) {
        /* the SIGPIPE this write raised, pending on this thread while blocked */
        static const struct timespec zero;
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return -err;
}

static ssize_t stream_write(void *cookie, const char *buf, size_t len)
{
    int r = cuheap_tracefile_write((int)(intptr_t)cookie, buf, len);
    if (r) {
        errno = -r;
        return 0; /* fopencookie: an error, errno says which */
    }
    return (ssize_t)len;
}

static int stream_close(void *cookie)
{
    return close((int)(intptr_t)cookie);
}

FILE *cuheap_tracefile_stream(int fd)
{
    cookie_io_functions_t io = {.write = stream_write, .close = stream_close};
    return fopencookie((void *)(intptr_t)fd, "w", io);
}
