/* SPDX-License-Identifier: MIT */
/*
 * Deferred unmaps and releases (unmapper.h).
 *
 * Jobs live in a ring of CUHEAP_NR_UNMAP_JOBS slots, numbered by an ever-growing count: job n
 * is slot n % CUHEAP_NR_UNMAP_JOBS until the owner pops it. A slot goes free -> queued (the
 * owner, its lock held) -> taken (whoever wins the exchange: the worker, or the owner
 * finishing the queue itself) -> done -> free (the owner pops it). Each push posts the
 * semaphore once, and the worker's n-th wake looks at slot n: a job the owner took meanwhile
 * is skipped, and every job is looked at by the worker after it was pushed, so none is left.
 */
#include "unmapper.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "log.h"

enum { JOB_FREE, JOB_QUEUED, JOB_TAKEN, JOB_DONE };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct cuheap_unmap_job *slot(struct cuheap_unmapper *u, unsigned n)
{
    return &u->jobs[n % CUHEAP_NR_UNMAP_JOBS];
}

static bool take(struct cuheap_unmap_job *j)
{
    int want = JOB_QUEUED;
    return atomic_compare_exchange_strong_explicit(&j->state, &want, JOB_TAKEN,
                                                   memory_order_acquire, memory_order_relaxed);
}

/* The driver's calls for a taken job. */
static void run(struct cuheap_unmapper *u, struct cuheap_unmap_job *j)
{
    enum cuheap_unmap_result r = CUHEAP_UNMAP_OK;
    if (u->be->phys_unmap(u->be->ctx, j->va, j->bytes)) {
        r = CUHEAP_UNMAP_UNMAP_FAILED;
    } else if (j->release) {
        if (u->be->phys_release(u->be->ctx, j->handle))
            r = CUHEAP_UNMAP_RELEASE_FAILED;
        else
            atomic_fetch_sub(u->reserved, j->bytes); /* the device has it back now */
    }
    j->result = r;
    atomic_store_explicit(&j->state, JOB_DONE, memory_order_release);
}

static void *worker_main(void *arg)
{
    struct cuheap_unmapper *u = arg;
    for (unsigned n = 0;; n++) {
        while (sem_wait(&u->work) && errno == EINTR)
            ;
        if (atomic_load(&u->stopping))
            break;
        struct cuheap_unmap_job *j = slot(u, n);
        if (!take(j))
            continue; /* the owner did it itself */
        uint64_t t0 = now_ns();
        run(u, j);
        atomic_fetch_add_explicit(&u->worker_ns, now_ns() - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&u->nr_by_worker, 1, memory_order_relaxed);
    }
    return NULL;
}

static bool start_worker(struct cuheap_unmapper *u)
{
    sigset_t all, old;
    sigfillset(&all);
    /* the worker must never take the program's signals */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&u->thread, NULL, worker_main, u);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r) {
        cuheap_log("cannot start the unmapping thread (%s); the allocating thread unmaps",
                   strerror(r));
        return false;
    }
    pthread_setname_np(u->thread, "cuheap-unmap");
    return true;
}

void cuheap_unmapper_init(struct cuheap_unmapper *u, const struct cuheap_backend *be,
                          _Atomic uint64_t *reserved, bool enabled)
{
    memset(u, 0, sizeof(*u));
    u->be = be;
    u->reserved = reserved;
    u->enabled = enabled;
    sem_init(&u->work, 0, 0);
}

bool cuheap_unmapper_ready(struct cuheap_unmapper *u)
{
    if (!u->enabled || u->worker < 0 || u->tail - u->head == CUHEAP_NR_UNMAP_JOBS)
        return false;
    if (u->worker == 0)
        u->worker = start_worker(u) ? 1 : -1;
    return u->worker > 0;
}

bool cuheap_unmapper_push(struct cuheap_unmapper *u, const struct cuheap_unmap_job *job)
{
    if (!cuheap_unmapper_ready(u))
        return false;
    struct cuheap_unmap_job *j = slot(u, u->tail);
    j->result = CUHEAP_UNMAP_OK;
    j->va = job->va;
    j->bytes = job->bytes;
    j->handle = job->handle;
    j->release = job->release;
    j->owner = job->owner;
    j->first = job->first;
    j->nr = job->nr;
    atomic_store_explicit(&j->state, JOB_QUEUED, memory_order_release);
    u->tail++;
    sem_post(&u->work);
    return true;
}

struct cuheap_unmap_job *cuheap_unmapper_done(struct cuheap_unmapper *u)
{
    if (u->head == u->tail)
        return NULL;
    struct cuheap_unmap_job *j = slot(u, u->head);
    return atomic_load_explicit(&j->state, memory_order_acquire) == JOB_DONE ? j : NULL;
}

void cuheap_unmapper_pop(struct cuheap_unmapper *u)
{
    atomic_store_explicit(&slot(u, u->head)->state, JOB_FREE, memory_order_relaxed);
    u->head++;
}

/* Wait for a job the worker took: one driver call or two, tens of microseconds. */
static void wait_done(struct cuheap_unmap_job *j)
{
    for (unsigned spins = 0; atomic_load_explicit(&j->state, memory_order_acquire) != JOB_DONE;
         spins++)
        if (spins % 64 == 63)
            sched_yield();
}

void cuheap_unmapper_finish(struct cuheap_unmapper *u)
{
    for (unsigned n = u->head; n != u->tail; n++) {
        struct cuheap_unmap_job *j = slot(u, n);
        if (take(j))
            run(u, j);
        else
            wait_done(j);
    }
}

void cuheap_unmapper_drop(struct cuheap_unmapper *u)
{
    for (unsigned n = u->head; n != u->tail; n++) {
        struct cuheap_unmap_job *j = slot(u, n);
        if (take(j)) {
            j->result = CUHEAP_UNMAP_DROPPED;
            atomic_store_explicit(&j->state, JOB_DONE, memory_order_release);
        } else {
            wait_done(j);
        }
    }
}

void cuheap_unmapper_stop(struct cuheap_unmapper *u)
{
    cuheap_unmapper_finish(u);
    if (u->worker == 1) {
        atomic_store(&u->stopping, true);
        sem_post(&u->work);
        pthread_join(u->thread, NULL);
    }
    u->worker = -1; /* what is pushed from now on is done by the caller */
}

void cuheap_unmapper_forget(struct cuheap_unmapper *u)
{
    const struct cuheap_backend *be = u->be;
    _Atomic uint64_t *reserved = u->reserved;
    bool enabled = u->enabled;
    cuheap_unmapper_init(u, be, reserved, enabled);
}
