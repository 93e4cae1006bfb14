/* SPDX-License-Identifier: MIT */
/*
 * Fences: freed blocks wait in epochs, each closed behind a device-wide fence, and come back
 * once it has passed (reclaim); the idle check returns them without a fence when every
 * stream is idle; blocks freed on a known stream wait in that stream's cache. Life of a block
 * under CUHEAP_REUSE=fence: freed onto the open epoch; after CUHEAP_FENCE_BATCH frees the epoch
 * closes behind a fence; when the fence has completed, its blocks go back to placement.
 *
 * Lock rule: p->lock held in every _locked function; fence waits, polls and device syncs are
 * made with it dropped (the fence pinned first, the epoch looked at anew afterwards).
 */
#include "internal.h"

#include <sched.h>

static void return_epoch_locked(struct cuheap_pool *p, struct cuheap_epoch *e)
{
    uint64_t nr = e->nr_blocks, bytes = e->bytes;
    for (uint64_t ptr = e->head; ptr;) {
        struct cuheap_arena *a = map_lookup(ptr);
        uint64_t next = a->link[unit_of(a, ptr)];
        p->pending_mapped -= extent_at(p, a, ptr);
        return_block_locked(p, a, ptr);
        ptr = next;
    }
    p->st.pending -= bytes;
    if (e->fence)
        dev_fence_destroy(p, e->fence);
    memset(e, 0, sizeof(*e));
    pool_note_event(p, CUHEAP_EV_FENCE, 0, 0, nr, bytes);
}

/* Whether a fence has passed, as the driver answers: 1 yes, 0 not yet, -1 no answer. A query
 * refused while a stream captures says nothing (no fence is recorded meanwhile, and the
 * refusal ends with the capture). Refused outside every capture cuheap saw (an event caught
 * in a capture it did not see, a context stuck so), it is refused again every time: a pool
 * that took that for "not yet" polled and waited for it forever at full CPU. From then on no
 * fence is recorded (fences_refused): freed blocks wait for a device sync, as when the driver
 * has no event to give, and fences in flight pass once a wait for them returns
 * (wait_oldest_locked) or at the next device sync (close_epoch_locked). Called with or
 * without p->lock. */
int fence_passed(struct cuheap_pool *p, void *fence)
{
    int r = dev_fence_query(p, fence);
    if (r >= 0)
        return r != 0;
    if (__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
        return -1;
    /* once more: a capture may have ended between the refusal and the look at the count */
    if ((r = dev_fence_query(p, fence)) >= 0)
        return r != 0;
    if (!__atomic_load_n(&p->nr_capturing, __ATOMIC_RELAXED))
        atomic_store_explicit(&p->fences_refused, true, memory_order_relaxed);
    return -1;
}

/* Give back the blocks of every closed epoch whose fence has completed. Returns how many
 * epochs were reclaimed. */
unsigned reclaim_locked(struct cuheap_pool *p)
{
    unsigned n = 0;
    while (p->ep_head != p->ep_tail) {
        struct cuheap_epoch *e = &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS];
        if (fence_passed(p, e->fence) <= 0)
            break;
        return_epoch_locked(p, e);
        p->ep_head++;
        n++;
    }
    return n;
}

/* The oldest closed epoch's fence, kept valid while p->lock is dropped to wait for it
 * (NULL when no epoch is closed). Give it back with unpin_fence_locked(). */
static void *pin_oldest_locked(struct cuheap_pool *p)
{
    if (p->ep_head == p->ep_tail)
        return NULL;
    void *fence = p->epochs[p->ep_head % CUHEAP_NR_EPOCHS].fence;
    dev_fence_pin(p, fence);
    return fence;
}

static void unpin_fence_locked(struct cuheap_pool *p, void *fence)
{
    dev_fence_unpin(p, fence);
}

/* Wait for the oldest closed epoch's fence and give its blocks back. Only the slow paths wait,
 * and never with p->lock held: other threads allocate and free meanwhile (and may reclaim
 * that epoch themselves). A wait (or the device sync after a failed one) that returned says
 * the fence has passed, whatever a query would say: the blocks come back without one, and
 * a query that is refused every time (fence_passed) keeps nobody waiting. Returns whether
 * the epoch came back, here or by another thread: false when neither the wait nor the sync
 * succeeded and the driver does not say it passed, so that no caller waits again in vain. */
bool wait_oldest_locked(struct cuheap_pool *p)
{
    void *fence = pin_oldest_locked(p);
    if (!fence)
        return false;
    unsigned head = p->ep_head;
    uint64_t t0 = mono_ns();
    p->st.nr_waits++;
    pool_unlock(p);
    bool passed = dev_fence_wait(p, fence) == 0;
    if (!passed)
        passed = dev_device_sync(p) == 0;
    uint64_t waited = mono_ns() - t0; /* not the wait for the lock: other threads' mapping */
    pool_lock(p);
    p->st.fence_ns += waited;
    unpin_fence_locked(p, fence);
    struct cuheap_epoch *e = &p->epochs[head % CUHEAP_NR_EPOCHS];
    bool still = p->ep_head == head && p->ep_head != p->ep_tail && e->fence == fence;
    if (still && passed) {
        return_epoch_locked(p, e);
        p->ep_head++;
        still = false;
    }
    reclaim_locked(p);
    return !still || p->ep_head != head;
}

/* An idle GPU passes a fence within microseconds: poll the oldest one briefly (p->lock
 * dropped) before taking more memory from the driver, so a tight alloc/free loop reuses its
 * blocks instead of growing the pool. A busy GPU (long kernels in flight) leaves the caller
 * to its rules (vmm within its budget maps, legacy waits). Returns whether an epoch was
 * reclaimed. */

bool poll_oldest_locked(struct cuheap_pool *p)
{
    void *fence = pin_oldest_locked(p);
    if (!fence)
        return false;
    uint64_t t0 = mono_ns(), deadline = t0 + CUHEAP_FENCE_POLL_NS;
    pool_unlock(p);
    int done;
    uint64_t now = t0;
    while (!(done = fence_passed(p, fence)) && (now = mono_ns()) < deadline)
        sched_yield();
    uint64_t waited = (done > 0 ? mono_ns() : now) - t0;
    pool_lock(p);
    p->st.fence_ns += waited;
    unpin_fence_locked(p, fence);
    return done > 0 && reclaim_locked(p);
}

/* A fence proves that the work submitted before a free is done only after a round trip
 * through the GPU: an event recorded on each stream, the GPU reaching it, a query seeing it
 * (microseconds even on an idle GPU: bench/probe-fence.c). Asking the streams whether they
 * are idle proves the same at once when they are: the legacy stream's answer covers every
 * blocking stream and every thread's per-thread default stream, as its events do (the probe
 * shows it), and each non-blocking stream is asked as it gets an event. A busy GPU answers
 * no, and the question (a driver call a stream) was wasted: after a no, only
 * every IDLE_RETRY-th fence asks, until a yes. Never while a stream captures (the caller sees
 * to it: a query then may be refused, or join nothing but still say nothing). */
#define IDLE_RETRY 64

bool idle_now(struct cuheap_pool *p)
{
    if (!dev_has_idle_check(p) || !p->cfg->idle_check || p->cfg->reuse != CUHEAP_REUSE_FENCE)
        return false;
    unsigned skip = atomic_load_explicit(&p->idle_skip, memory_order_relaxed);
    if (skip) { /* a hint among threads: a lost decrement costs one check more or less */
        atomic_store_explicit(&p->idle_skip, skip - 1, memory_order_relaxed);
        return false;
    }
    bool idle = dev_streams_idle(p) == 1;
    atomic_store_explicit(&p->idle_skip, idle ? 0 : IDLE_RETRY - 1, memory_order_relaxed);
    return idle;
}

/* Every stream was idle (idle_now, after every block of the open epoch was freed; p->lock
 * held): the closed epochs' fences have passed, and the open epoch's blocks need none. */
static void return_all_epochs_locked(struct cuheap_pool *p)
{
    for (; p->ep_head != p->ep_tail; p->ep_head++)
        return_epoch_locked(p, &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS]);
    return_epoch_locked(p, open_epoch(p));
    p->st.nr_idle++;
}

/* The open epoch's blocks returned at once if every stream is idle (p->lock held; never
 * while a stream captures). Returns whether they were. */
bool return_if_idle_locked(struct cuheap_pool *p)
{
    if (!open_epoch(p)->nr_blocks || p->nr_capturing || !idle_now(p))
        return false;
    return_all_epochs_locked(p);
    return true;
}

/* Close the open epoch behind a new fence, or return its blocks at once while every stream
 * is idle. While a stream captures, recording would disturb the capture: the epoch stays
 * open. Returns whether its blocks came back at once (the caller may look for one again). */
bool close_epoch_locked(struct cuheap_pool *p)
{
    if (return_if_idle_locked(p))
        return true;
    /* a full ring waits for its oldest fence (the lock dropped: the open epoch may change
     * meanwhile); one that does not pass leaves the device sync below */
    bool full = false;
    while ((full = p->ep_tail - p->ep_head == CUHEAP_NR_EPOCHS - 1) && open_epoch(p)->nr_blocks &&
           !p->nr_capturing && wait_oldest_locked(p))
        ;
    struct cuheap_epoch *e = open_epoch(p);
    if (!e->nr_blocks || p->nr_capturing)
        return false;
    void *fence = NULL;
    if (full || !fences_usable(p) || dev_fence_record(p, &fence) != 0) {
        /* No fence to be had: fall back to what the driver's own free does, a device sync,
         * with p->lock dropped like every other wait. The blocks wait aside meanwhile: a free
         * made during the sync joins a fresh open epoch, which the sync does not cover. The
         * closed epochs' fences were recorded before it: a sync that succeeded passed them. */
        struct cuheap_syncing s = {*e, p->syncing};
        unsigned tail = p->ep_tail;
        memset(e, 0, sizeof(*e));
        p->syncing = &s;
        pool_unlock(p);
        int synced = dev_device_sync(p);
        pool_lock(p);
        struct cuheap_syncing **at = &p->syncing;
        while (*at && *at != &s)
            at = &(*at)->next;
        if (!*at)
            return false; /* the context went meanwhile (cuheap_pool_abandon), its blocks too */
        *at = s.next;
        for (; synced == 0 && p->ep_head != p->ep_tail && (int)(tail - p->ep_head) > 0;
             p->ep_head++)
            return_epoch_locked(p, &p->epochs[p->ep_head % CUHEAP_NR_EPOCHS]);
        return_epoch_locked(p, &s.epoch);
        p->nr_synced++;
        pthread_cond_broadcast(&p->synced);
        return true;
    }
    e->fence = fence;
    p->st.nr_fences++;
    p->ep_tail++;
    return false;
}

/* Out of memory while another thread syncs the device for blocks no fence covers (above):
 * wait, p->lock dropped, until one such batch has come back (or went with its context); the
 * caller asks again. */
void wait_syncing_locked(struct cuheap_pool *p)
{
    p->st.nr_waits++;
    uint64_t t0 = mono_ns();
    for (uint64_t n = p->nr_synced; p->syncing && p->nr_synced == n;)
        pool_wait(&p->synced, p);
    p->st.fence_ns += mono_ns() - t0; /* the lock taken again included: the wait does so */
}

/* Move every stream-cached block onto the open epoch. */
void flush_stream_caches_locked(struct cuheap_pool *p)
{
    struct cuheap_epoch *e = open_epoch(p);
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        struct cuheap_stream_cache *sc = &p->caches[c];
        if (!sc->stream)
            continue;
        for (unsigned o = 0; o < CUHEAP_NR_ORDERS; o++) {
            for (uint64_t ptr = sc->heads[o]; ptr;) {
                struct cuheap_arena *a = map_lookup(ptr);
                uint64_t next = a->link[unit_of(a, ptr)];
                a->link[unit_of(a, ptr)] = e->head;
                e->head = ptr;
                e->nr_blocks++;
                e->bytes += 1ull << o;
                ptr = next;
            }
        }
        memset(sc, 0, sizeof(*sc));
    }
}

struct cuheap_stream_cache *stream_cache_locked(struct cuheap_pool *p, uint64_t stream, bool create)
{
    struct cuheap_stream_cache *empty = NULL;
    for (unsigned c = 0; c < CUHEAP_NR_STREAM_CACHES; c++) {
        if (p->caches[c].stream == stream)
            return &p->caches[c];
        if (!p->caches[c].stream && !empty)
            empty = &p->caches[c];
    }
    if (create && empty)
        empty->stream = stream;
    return create ? empty : NULL;
}

/* Put a not-live block behind the open epoch's fence. The batch closes after
 * CUHEAP_FENCE_BATCH frees, or sooner when it holds an eighth of the pool (of
 * CUHEAP_ARENA_SIZE while the pool is smaller): large blocks should not wait behind many
 * small ones, and a small pool (vmm holds only what is used) should not record a fence for
 * every free. Returns whether the batch is due to close (pend_locked() closes it; closing may
 * wait for a fence with p->lock dropped). */
static bool epoch_due_locked(struct cuheap_pool *p)
{
    const struct cuheap_epoch *e = open_epoch(p);
    uint64_t volume = p->st.reserved > p->cfg->arena_size ? p->st.reserved : p->cfg->arena_size;
    return e->nr_blocks >= p->cfg->fence_batch || e->bytes >= volume / 8;
}

bool pend_nowait_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t block)
{
    struct cuheap_epoch *e = open_epoch(p);
    a->link[unit_of(a, ptr)] = e->head;
    e->head = ptr;
    e->nr_blocks++;
    e->bytes += block;
    p->st.pending += block;
    p->pending_mapped += extent_at(p, a, ptr);
    return epoch_due_locked(p);
}

void pend_locked(struct cuheap_pool *p, struct cuheap_arena *a, uint64_t ptr, uint64_t block)
{
    if (pend_nowait_locked(p, a, ptr, block))
        close_epoch_locked(p);
}

/* Close the open epoch if blocks handed over without closing (thread-cache drains) made it
 * due. May drop p->lock. */
void close_if_due_locked(struct cuheap_pool *p)
{
    if (epoch_due_locked(p))
        close_epoch_locked(p);
}
