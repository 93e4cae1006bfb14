/* SPDX-License-Identifier: MIT */
/*
 * For the fork/exec tests: the parent allocates, a forked child allocates on its own, and a
 * second child execs another CUDA program, a third never uses CUDA. Each process that used
 * CUDA must leave its own trace; the third none.
 *   forker PROGRAM_TO_EXEC
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define DOOR_PROCADDR 1
#include "driver_api.h"

static int alloc_free(struct driver_api *d, int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        if (d->cuMemAlloc_v2(&p, size) || d->cuMemFree_v2(p))
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: forker PROGRAM\n");
        return 2;
    }
    struct driver_api d;
    if (driver_api_start(&d, 0) || alloc_free(&d, 3, 1 << 20))
        return 1;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        exit(alloc_free(&d, 5, 1 << 16)); /* the simulated driver survives fork */
    pid_t idle = fork();
    if (idle == 0)
        exit(0); /* a worker that never touches CUDA: no trace, no summary */
    pid_t execd = fork();
    if (execd == 0) {
        execl(argv[1], argv[1], (char *)NULL);
        _exit(127);
    }
    int st1, st2, st3;
    waitpid(idle, &st3, 0);
    waitpid(child, &st1, 0);
    waitpid(execd, &st2, 0);
    if (alloc_free(&d, 2, 1 << 20))
        return 1;
    printf("forker: parent %d, forked %d (exit %d), exec'd %d (exit %d)\n", (int)getpid(),
           (int)child, WEXITSTATUS(st1), (int)execd, WEXITSTATUS(st2));
    return WEXITSTATUS(st1) || WEXITSTATUS(st2);
}
