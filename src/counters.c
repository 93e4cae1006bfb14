/* SPDX-License-Identifier: MIT */
/*
 * Per-thread counters (see counters.h): a lock-free, append-only list of blocks, one owned by
 * each live thread; a pthread key's destructor hands a block back when its thread exits. Also
 * the ticks' clock, calibrated against CLOCK_MONOTONIC when read.
 */
#include "counters.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

_Static_assert(sizeof(pthread_key_t) <= sizeof(unsigned), "pthread_key_t fits an unsigned");

__thread struct cuheap_counters *cuheap_counters_self __attribute__((tls_model("initial-exec")));

/* Set once this thread's block was handed back: later counts go to the shared block. */
static __thread bool gone __attribute__((tls_model("initial-exec")));

/* Counts of threads without a block of their own; always owned, so never handed out. */
static _Alignas(64) struct cuheap_counters shared = {.owned = true};

/* The registry's first block; blocks are pushed in front and never leave. */
static _Atomic(struct cuheap_counters *) head = &shared;

/* The key whose destructor hands blocks back, plus one; 0 until created. */
static _Atomic unsigned key_plus1;

static void thread_gone(void *arg)
{
    struct cuheap_counters *c = arg;
    gone = true;
    if (cuheap_counters_self == c)
        cuheap_counters_self = NULL;
    /* release: the next owner's loads see every count this thread made */
    atomic_store_explicit(&c->owned, false, memory_order_release);
}

/* The key, created once without a lock (a losing racer deletes its own). */
static bool get_key(pthread_key_t *ret)
{
    unsigned k = atomic_load_explicit(&key_plus1, memory_order_acquire);
    if (!k) {
        pthread_key_t mine;
        if (pthread_key_create(&mine, thread_gone))
            return false;
        unsigned want = (unsigned)mine + 1, expected = 0;
        if (atomic_compare_exchange_strong(&key_plus1, &expected, want)) {
            k = want;
        } else {
            pthread_key_delete(mine);
            k = expected;
        }
    }
    *ret = (pthread_key_t)(k - 1);
    return true;
}

/* A block whose thread exited, now owned by the caller; NULL when none is free. */
static struct cuheap_counters *claim(void)
{
    for (struct cuheap_counters *c = atomic_load_explicit(&head, memory_order_acquire); c;
         c = c->next) {
        bool expected = false;
        if (!atomic_load_explicit(&c->owned, memory_order_relaxed) &&
            atomic_compare_exchange_strong_explicit(&c->owned, &expected, true,
                                                    memory_order_acquire, memory_order_relaxed))
            return c;
    }
    return NULL;
}

static struct cuheap_counters *map_block(void)
{
    size_t page = 4096, bytes = (sizeof(struct cuheap_counters) + page - 1) & ~(page - 1);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct cuheap_counters *c = m; /* zero-filled */
    atomic_init(&c->owned, true);
    c->next = atomic_load_explicit(&head, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&head, &c->next, c, memory_order_release,
                                                  memory_order_relaxed))
        ;
    return c;
}

/* Signals are blocked meanwhile: a handler on this thread that counts must not register a
 * second block between our check and our claim. */
struct cuheap_counters *cuheap_counters_register(void)
{
    if (gone)
        return NULL;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    struct cuheap_counters *c = cuheap_counters_self;
    if (!c) {
        c = claim();
        if (!c)
            c = map_block();
        pthread_key_t key;
        if (c && get_key(&key))
            pthread_setspecific(key, c); /* no destructor: the block stays owned, counted */
        cuheap_counters_self = c;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return c;
}

void cuheap_counters_add_shared(unsigned i, int64_t n)
{
    atomic_fetch_add_explicit(&shared.v[i], n, memory_order_relaxed);
}

int64_t cuheap_counters_sum(unsigned i)
{
    int64_t s = 0;
    for (struct cuheap_counters *c = atomic_load_explicit(&head, memory_order_acquire); c;
         c = c->next)
        s += atomic_load_explicit(&c->v[i], memory_order_relaxed);
    return s;
}

unsigned cuheap_counters_nr_blocks(void)
{
    unsigned n = 0;
    for (struct cuheap_counters *c = atomic_load_explicit(&head, memory_order_acquire); c;
         c = c->next)
        n++;
    return n;
}

void cuheap_counters_atfork_child(unsigned first, unsigned n)
{
    for (struct cuheap_counters *c = atomic_load(&head); c; c = c->next) {
        for (unsigned i = first; i < first + n && i < CUHEAP_NR_COUNTERS; i++)
            atomic_store_explicit(&c->v[i], 0, memory_order_relaxed);
        if (c != &shared && c != cuheap_counters_self)
            atomic_store_explicit(&c->owned, false, memory_order_release);
    }
}

/* ---- the ticks' clock ---- */

__thread bool cuheap_own_timing __attribute__((tls_model("initial-exec")));

/* The first reading: ticks and monotonic nanoseconds taken together; 0 until taken. */
static _Atomic uint64_t anchor_ticks, anchor_ns;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cuheap_clock_start(void)
{
    if (atomic_load_explicit(&anchor_ns, memory_order_acquire))
        return;
    uint64_t expected = 0, t = cuheap_ticks(), ns = mono_ns();
    atomic_store_explicit(&anchor_ticks, t, memory_order_relaxed);
    /* release: a reader that sees anchor_ns sees the ticks taken with it (a racing second
     * start may store its ticks after; both readings are a few nanoseconds apart) */
    atomic_compare_exchange_strong_explicit(&anchor_ns, &expected, ns, memory_order_release,
                                            memory_order_relaxed);
}

uint64_t cuheap_ticks_ns(int64_t ticks)
{
    if (ticks <= 0)
        return 0;
#if defined(__x86_64__) || defined(__i386__)
    cuheap_clock_start();
    uint64_t ns0 = atomic_load_explicit(&anchor_ns, memory_order_acquire);
    uint64_t t0 = atomic_load_explicit(&anchor_ticks, memory_order_relaxed);
    uint64_t ns, t;
    do { /* a millisecond at least, so that the two clocks' read times do not matter */
        t = cuheap_ticks();
        ns = mono_ns();
    } while (ns - ns0 < 1000000);
    return t > t0 ? (uint64_t)((double)ticks * (double)(ns - ns0) / (double)(t - t0)) : 0;
#elif defined(__aarch64__)
    uint64_t hz;
    __asm__ __volatile__("mrs %0, cntfrq_el0" : "=r"(hz));
    return hz ? (uint64_t)((double)ticks * 1e9 / (double)hz) : 0;
#else
    return (uint64_t)ticks;
#endif
}
