/* SPDX-License-Identifier: MIT */
/*
 * Sharing pooled memory with another process (cuIpcGetMemHandle, cuIpcOpenMemHandle) under
 * CUHEAP_BACKING=vmm.
 *
 * The driver's legacy IPC shares a whole cuMemAlloc allocation, and it refuses VMM memory, so
 * it cannot share a pooled block. Instead the handle cuheap gives out names this process and
 * an export. The importer, also running cuheap (children inherit the preload), asks the
 * exporter over a Unix socket for the block's physical memory: the chunks under it arrive as
 * file descriptors (cuMemExportToShareableHandle; SCM_RIGHTS), only for a process of the same
 * user, and are mapped into address space of the importer's own with the same layout. A process
 * not running cuheap gets the driver's answer to a handle it does not know.
 *
 * The exporter answers from a thread started at its first export. The export table remembers
 * each block's buffer id, so a block freed (or handed out again) since it was shared is refused
 * rather than shared with the wrong bytes.
 */
#include "ipc.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "guard.h"
#include "log.h"
#include "pool.h"
#include "runtime.h"

#define IPC_MAGIC      0x5049706165686375ull /* "cuheapIP" */
#define IPC_VERSION    1
#define NR_EXPORTS     1024
#define NR_IMPORTS     256
#define NR_PIECES      64 /* chunks under one shared block at most (a 64 MiB block: 8 to 33) */
#define IPC_TIMEOUT_MS 5000

/* What cuheap's CUipcMemHandle holds (64 bytes are available). */
struct ipc_handle {
    uint64_t magic;
    uint32_t version;
    int32_t pid;
    uint64_t nonce; /* part of the exporter's socket name */
    uint64_t export_id;
    uint64_t block; /* in the exporter: for messages only */
    uint64_t size;
};
_Static_assert(sizeof(struct ipc_handle) <= sizeof(((CUipcMemHandle *)0)->reserved),
               "cuheap's IPC handle must fit the driver's");

struct ipc_request {
    uint64_t magic;
    uint64_t export_id;
};

struct ipc_piece {
    int64_t offset; /* from the block's start */
    uint64_t bytes;
};

struct ipc_reply {
    int32_t status; /* 0, or why not: an errno value */
    uint32_t nr;
    struct ipc_piece pieces[NR_PIECES];
};

/* ---- exporting ---- */

struct export
{
    uint64_t id; /* 0 = free */
    uint64_t block, buffer_id;
    CUcontext ctx;
};

static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct export exports[NR_EXPORTS]; /* by id % NR_EXPORTS; guarded by exports_lock */
static uint64_t next_export_id = 1;
static int server_fd = -1;
static pid_t server_pid; /* the process the server runs in (a forked child starts its own) */
static uint64_t server_nonce;

static void socket_address(struct sockaddr_un *addr, socklen_t *len, int pid, uint64_t nonce)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    /* abstract: no file to clean up, gone with the process */
    int n = snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "cuheap-ipc-%d-%016llx", pid,
                     (unsigned long long)nonce);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeout(int fd)
{
    struct timeval tv = {IPC_TIMEOUT_MS / 1000, (IPC_TIMEOUT_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Answer one importer: the block's chunks as file descriptors, or why not. */
static void answer(int c)
{
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    struct ipc_request req;
    struct ipc_reply rep = {.status = EPERM};
    struct cuheap_share share[NR_PIECES];
    int n = 0;
    set_timeout(c);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || cred.uid != geteuid())
        goto send; /* only the same user's processes get this process's memory */
    if (recv(c, &req, sizeof(req), MSG_WAITALL) != (ssize_t)sizeof(req) || req.magic != IPC_MAGIC)
        return;
    pthread_mutex_lock(&exports_lock);
    struct export e = exports[req.export_id % NR_EXPORTS];
    pthread_mutex_unlock(&exports_lock);
    struct cuheap_device *d = e.id == req.export_id ? cuheap_device_by_ctx(e.ctx) : NULL;
    n = d ? cuheap_pool_share(d->pool, e.block, e.buffer_id, share, NR_PIECES) : -EINVAL;
    rep.status = n < 0 ? -n : 0;
    for (int i = 0; i < n; i++)
        rep.pieces[i] = (struct ipc_piece){share[i].offset, share[i].bytes};
    rep.nr = n > 0 ? (uint32_t)n : 0;
send:;
    char control[CMSG_SPACE(sizeof(int) * NR_PIECES)];
    struct iovec iov = {&rep, sizeof(rep)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n > 0) {
        memset(control, 0, sizeof(control));
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++)
            memcpy(CMSG_DATA(cm) + i * sizeof(int), &share[i].fd, sizeof(int));
    }
    sendmsg(c, &msg, MSG_NOSIGNAL);
    for (int i = 0; i < n; i++)
        close(share[i].fd);
}

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    cuheap_busy = 1; /* this thread is cuheap's own: its driver calls are not the program's */
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
                continue;
            return NULL;
        }
        answer(c);
        close(c);
    }
}

/* Start this process's server (exports_lock held). Returns 0 or -1. */
static int start_server_locked(void)
{
    if (server_fd >= 0 && server_pid == getpid())
        return 0;
    if (server_fd >= 0)
        close(server_fd); /* a forked child's copy of its parent's socket */
    server_fd = -1;
    if (getrandom(&server_nonce, sizeof(server_nonce), 0) != sizeof(server_nonce))
        server_nonce ^= (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
    struct sockaddr_un addr;
    socklen_t len;
    socket_address(&addr, &len, getpid(), server_nonce);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, len) || listen(fd, 16)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals are not for this thread */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int r = pthread_create(&t, &attr, serve, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r) {
        close(fd);
        return -1;
    }
    server_fd = fd;
    server_pid = getpid();
    return 0;
}

int cuheap_ipc_export(struct cuheap_device *d, CUdeviceptr ptr, CUipcMemHandle *ret)
{
    uint64_t block, size, buffer_id, arena;
    if (cuheap_pool_block_range(d->pool, ptr, &block, &size, &buffer_id, &arena))
        return -EINVAL;
    pthread_mutex_lock(&exports_lock);
    if (start_server_locked()) {
        pthread_mutex_unlock(&exports_lock);
        return -EIO;
    }
    uint64_t id = next_export_id++;
    exports[id % NR_EXPORTS] = (struct export){id, block, buffer_id, atomic_load(&d->ctx)};
    struct ipc_handle h = {IPC_MAGIC, IPC_VERSION, (int32_t)getpid(), server_nonce, id,
                           block,     size};
    pthread_mutex_unlock(&exports_lock);
    memset(ret, 0, sizeof(*ret));
    memcpy(ret->reserved, &h, sizeof(h));
    return 0; /* like the driver's for an allocation: the importer gets the block's start */
}

/* ---- importing ---- */

struct import {
    CUdeviceptr ptr; /* what the program got; 0 = free slot */
    CUdeviceptr va;
    uint64_t span;
    unsigned nr;
    struct ipc_piece pieces[NR_PIECES]; /* offsets from va */
};

static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct import imports[NR_IMPORTS]; /* guarded by imports_lock */

bool cuheap_ipc_is_ours(const CUipcMemHandle *h)
{
    struct ipc_handle ih;
    memcpy(&ih, h->reserved, sizeof(ih));
    return ih.magic == IPC_MAGIC;
}

/* Ask the exporter for the pieces; fds[] gets one descriptor per piece. Returns the number of
 * pieces, or -1 with *why set. */
static int ask(const struct ipc_handle *h, struct ipc_reply *rep, int *fds, const char **why)
{
    struct sockaddr_un addr;
    socklen_t len;
    socket_address(&addr, &len, h->pid, h->nonce);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    *why = "the exporting process is gone, or does not run cuheap";
    if (c < 0)
        return -1;
    set_timeout(c);
    struct ipc_request req = {IPC_MAGIC, h->export_id};
    char control[CMSG_SPACE(sizeof(int) * NR_PIECES)];
    struct iovec iov = {rep, sizeof(*rep)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control,
                         .msg_controllen = sizeof(control)};
    if (connect(c, (struct sockaddr *)&addr, len) ||
        send(c, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req) ||
        recvmsg(c, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(*rep)) {
        close(c);
        return -1;
    }
    close(c);
    int nr_fds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n && nr_fds < NR_PIECES; i++)
                memcpy(&fds[nr_fds++], CMSG_DATA(cm) + (size_t)i * sizeof(int), sizeof(int));
        }
    if (rep->status || rep->nr == 0 || rep->nr > NR_PIECES || (int)rep->nr != nr_fds) {
        for (int i = 0; i < nr_fds; i++)
            close(fds[i]);
        *why = rep->status == EPERM    ? "the exporting process belongs to another user"
               : rep->status == EINVAL ? "the block was freed since it was shared"
                                       : "the exporting process could not share the block";
        return -1;
    }
    return (int)rep->nr;
}

static void unmap_import(const struct import *im, unsigned mapped)
{
    for (unsigned i = 0; i < mapped; i++)
        cuheap_drv.cuMemUnmap(im->va + (uint64_t)im->pieces[i].offset, im->pieces[i].bytes);
    cuheap_drv.cuMemAddressFree(im->va, im->span);
}

CUresult cuheap_ipc_open(CUdeviceptr *ret, const CUipcMemHandle *handle)
{
    struct ipc_handle h;
    memcpy(&h, handle->reserved, sizeof(h));
    if (h.version != IPC_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: not in the exporting process */
    if (!cuheap_drv.cuMemImportFromShareableHandle || !cuheap_drv.cuMemAddressReserve)
        return CUDA_ERROR_NOT_SUPPORTED;
    static struct ipc_reply rep; /* guarded by imports_lock: NR_PIECES pieces are 1 KiB */
    int fds[NR_PIECES];
    const char *why;
    CUdevice dev;
    pthread_mutex_lock(&imports_lock);
    struct import *im = NULL;
    for (unsigned i = 0; i < NR_IMPORTS && !im; i++)
        if (!imports[i].ptr)
            im = &imports[i];
    int n = im ? ask(&h, &rep, fds, &why) : -1;
    if (!im)
        why = "too many pooled blocks opened at once";
    if (n < 0 || cuheap_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&imports_lock);
        cuheap_log("cuIpcOpenMemHandle: cannot open the pooled block %#llx of %llu bytes shared "
                   "by process %d: %s",
                   (unsigned long long)h.block, (unsigned long long)h.size, (int)h.pid,
                   n < 0 ? why : "no current device");
        for (int i = 0; i < n; i++)
            close(fds[i]);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* the same layout as the exporter's: chunk offsets from the first chunk's start */
    int64_t lo = rep.pieces[0].offset, hi = lo;
    for (int i = 0; i < n; i++) {
        if (rep.pieces[i].offset < lo)
            lo = rep.pieces[i].offset;
        if (rep.pieces[i].offset + (int64_t)rep.pieces[i].bytes > hi)
            hi = rep.pieces[i].offset + (int64_t)rep.pieces[i].bytes;
    }
    *im = (struct import){.span = (uint64_t)(hi - lo), .nr = (unsigned)n};
    CUresult r = cuheap_drv.cuMemAddressReserve(&im->va, im->span, 0, 0, 0);
    unsigned mapped = 0;
    for (int i = 0; r == CUDA_SUCCESS && i < n; i++) {
        CUmemGenericAllocationHandle ph;
        im->pieces[i] = (struct ipc_piece){rep.pieces[i].offset - lo, rep.pieces[i].bytes};
        r = cuheap_drv.cuMemImportFromShareableHandle(&ph, (void *)(intptr_t)fds[i],
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r == CUDA_SUCCESS) {
            r = cuheap_drv.cuMemMap(im->va + (uint64_t)im->pieces[i].offset, im->pieces[i].bytes, 0,
                                    ph, 0);
            cuheap_drv.cuMemRelease(ph); /* the mapping keeps the memory */
            mapped += r == CUDA_SUCCESS;
        }
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc access;
        memset(&access, 0, sizeof(access));
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = (int)dev;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = cuheap_drv.cuMemSetAccess(im->va, im->span, &access, 1);
    }
    if (r != CUDA_SUCCESS) {
        if (im->va)
            unmap_import(im, mapped);
        memset(im, 0, sizeof(*im));
        pthread_mutex_unlock(&imports_lock);
        cuheap_log("cuIpcOpenMemHandle: mapping the pooled block shared by process %d failed "
                   "(%d)",
                   (int)h.pid, (int)r);
        return r;
    }
    im->ptr = im->va + (uint64_t)(-lo);
    *ret = im->ptr;
    pthread_mutex_unlock(&imports_lock);
    return CUDA_SUCCESS;
}

int cuheap_ipc_close(CUdeviceptr ptr)
{
    pthread_mutex_lock(&imports_lock);
    for (unsigned i = 0; i < NR_IMPORTS; i++)
        if (ptr && imports[i].ptr == ptr) {
            unmap_import(&imports[i], imports[i].nr);
            memset(&imports[i], 0, sizeof(imports[i]));
            pthread_mutex_unlock(&imports_lock);
            return 1;
        }
    pthread_mutex_unlock(&imports_lock);
    return 0;
}
