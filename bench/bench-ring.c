/* SPDX-License-Identifier: MIT */
/*
 * CPU benchmarks of the recorder's parts: events per second through the ring with 1, 2 and 8
 * producer threads and one consumer, and ns per stack capture at depths 10, 30 and 60.
 *   bench-ring
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ring.h"
#include "unwind.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define PER_PRODUCER 2000000

static struct cuheap_ring ring;
static atomic_int producers_done;

static void *producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_PRODUCER; i++) {
        struct cuheap_event *ev;
        while (!(ev = cuheap_ring_claim(&ring)))
            ;
        ev->seq = (uint64_t)i;
        ev->size = 512;
        cuheap_ring_commit(&ring, ev);
    }
    atomic_fetch_add(&producers_done, 1);
    return NULL;
}

static void ring_throughput(int nr)
{
    cuheap_ring_init(&ring, 1 << 16);
    atomic_store(&producers_done, 0);
    pthread_t t[8];
    uint64_t t0 = now_ns(), consumed = 0;
    for (int i = 0; i < nr; i++)
        pthread_create(&t[i], NULL, producer, NULL);
    while (consumed < (uint64_t)nr * PER_PRODUCER) {
        struct cuheap_event *ev = cuheap_ring_peek(&ring);
        if (!ev)
            continue;
        cuheap_ring_consume(&ring);
        consumed++;
    }
    uint64_t dt = now_ns() - t0;
    for (int i = 0; i < nr; i++)
        pthread_join(t[i], NULL);
    printf("ring producers=%d events_per_s=%.1fM ns_per_event=%.1f\n", nr,
           (double)consumed / ((double)dt / 1e9) / 1e6, (double)dt / (double)consumed);
    cuheap_ring_destroy(&ring);
}

__attribute__((noinline)) static unsigned capture_at(int depth, uint64_t *out)
{
    unsigned n = depth > 0 ? capture_at(depth - 1, out) : cuheap_unwind_capture(out, 64);
    __asm__ volatile("" ::: "memory");
    return n;
}

static void stack_cost(int depth)
{
    uint64_t frames[64];
    unsigned n = 0;
    enum { REPS = 200000 };
    uint64_t t0 = now_ns();
    for (int i = 0; i < REPS; i++)
        n = capture_at(depth, frames);
    uint64_t dt = now_ns() - t0;
    /* the benchmark's own frames are skipped like cuheap's (same object); the unwinder still
     * walked them: depth + main + libc's two */
    unsigned walked = (unsigned)depth + 3 + n;
    printf("stack frames_walked=%u ns_per_capture=%.1f ns_per_frame=%.1f\n", walked,
           (double)dt / REPS, (double)dt / REPS / walked);
}

int main(void)
{
    for (int nr = 1; nr <= 8; nr *= 2)
        if (nr != 4)
            ring_throughput(nr);
    printf("unwinder=%s\n", cuheap_unwinder_name(cuheap_unwind_init()));
    stack_cost(10 - 6);
    stack_cost(30 - 6);
    stack_cost(60 - 6);
    return 0;
}
