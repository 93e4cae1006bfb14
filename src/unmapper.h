/* SPDX-License-Identifier: MIT */
/*
 * Driver work nobody waits for, done on a thread of its own: unmapping a range of address
 * space, and giving physical memory back (CUHEAP_VMM_DEFER).
 *
 * Under vmm the pool moves idle physical memory to where a block needs it, and gives idle
 * memory back to make room for new pieces: on the GPT loop about 14 moves and 13 releases a
 * step. An unmap costs 25-75 us of the calling thread's time on an H200 and a release 10-50 us
 * (bench/probe-vmm.c), and nothing needs either to have happened: a handle may be mapped at
 * two places at once, so a moved piece is mapped at its new place first and its old mapping
 * is left to this worker, as are the unmap and release of a piece given back.
 *
 * The queue belongs to its owner (the pool), who pushes, finishes and pops under a lock of
 * its own. The worker never takes that lock: each job's state says who has it, and the
 * owner, holding its lock, accounts for the jobs the worker has done (cuheap_unmapper_done).
 * Knows nothing of CUDA: the calls go through the backend (backend.h).
 */
#ifndef CUHEAP_UNMAPPER_H
#define CUHEAP_UNMAPPER_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define CUHEAP_NR_UNMAP_JOBS 16

enum cuheap_unmap_result {
    CUHEAP_UNMAP_OK,
    CUHEAP_UNMAP_UNMAP_FAILED,   /* still mapped; not released */
    CUHEAP_UNMAP_RELEASE_FAILED, /* unmapped, but the driver kept the memory */
    CUHEAP_UNMAP_DROPPED,        /* no call made: the context is gone (cuheap_unmapper_drop) */
};

struct cuheap_unmap_job {
    _Atomic int state; /* internal: queued, taken, done */
    enum cuheap_unmap_result result;
    uint64_t va, bytes;
    uint64_t handle; /* released after the unmap when release is set */
    bool release;
    /* the owner's, untouched: where the range lies in its own terms */
    void *owner;
    uint32_t first, nr;
};

struct cuheap_unmapper {
    const struct cuheap_backend *be;
    _Atomic uint64_t *reserved; /* less the bytes of each release, as the driver takes them */
    bool enabled;               /* CUHEAP_VMM_DEFER */
    int worker;                 /* 0: not started yet, 1: running, -1: could not start */
    pthread_t thread;
    _Atomic bool stopping;
    unsigned head, tail; /* owner's lock: jobs [head, tail) not yet popped */
    struct cuheap_unmap_job jobs[CUHEAP_NR_UNMAP_JOBS];
    sem_t work;                    /* one post a job pushed */
    _Atomic uint64_t worker_ns;    /* time the worker spent in the driver's calls */
    _Atomic uint64_t nr_by_worker; /* jobs the worker did (the rest the owner did itself) */
};

/* Set up an empty queue; no thread is started until the first job. */
void cuheap_unmapper_init(struct cuheap_unmapper *u, const struct cuheap_backend *be,
                          _Atomic uint64_t *reserved, bool enabled);

/* Whether a job pushed now would be queued (starting the worker on first use). */
bool cuheap_unmapper_ready(struct cuheap_unmapper *u);

/* Queue a job (its va, bytes, handle, release and the owner's fields), starting the worker
 * on first use. Returns false when it cannot be queued (deferring is off, the queue is full,
 * or the worker could not start): the caller makes the calls itself. */
bool cuheap_unmapper_push(struct cuheap_unmapper *u, const struct cuheap_unmap_job *job);

/* The oldest job, once it is done (for the owner to account for, then pop), else NULL. */
struct cuheap_unmap_job *cuheap_unmapper_done(struct cuheap_unmapper *u);
void cuheap_unmapper_pop(struct cuheap_unmapper *u);

/* Every queued job done now: those the worker has not begun by the caller, the one it is in
 * the middle of waited for. */
void cuheap_unmapper_finish(struct cuheap_unmapper *u);

/* The device's context is gone: queued jobs are done without calling the driver (result
 * CUHEAP_UNMAP_DROPPED), the one the worker is in the middle of waited for. */
void cuheap_unmapper_drop(struct cuheap_unmapper *u);

/* Every job done, and the worker ended: before the queue's memory goes (tests; a pool lives
 * as long as the process). */
void cuheap_unmapper_stop(struct cuheap_unmapper *u);

/* In a child after fork: the worker did not cross it, and the jobs were the parent's. */
void cuheap_unmapper_forget(struct cuheap_unmapper *u);

/* Jobs pushed and not yet popped. */
static inline unsigned cuheap_unmapper_nr_queued(const struct cuheap_unmapper *u)
{
    return u->tail - u->head;
}

#endif
