/* SPDX-License-Identifier: MIT */
/*
 * The pool's one door to its backend (backend.h): every call the pool makes to the device
 * goes through a function here, so that the lock rule can be checked in one place.
 *
 * Lock rule: the functions here take no lock. Those that may take long (memory, mapping,
 * address space, access, export, waits, syncs: tens of microseconds to seconds) must be
 * called with no pool lock held: decide under the lock, reserve what the call will touch,
 * drop the lock, call, take it again and publish (phys.c's mapper, arena.c's growth). Debug
 * builds assert it here. The event calls of fences (record, query, destroy) and the idle check
 * cost well under a microsecond, and the epochs they serve are ordered by p->lock: those may
 * be made under it (fence.c, tcache.c).
 */
#include "internal.h"

__thread unsigned pool_locks_held __attribute__((tls_model("initial-exec")));

/* The calling thread holds no pool lock (debug builds). */
static inline void unlocked(void)
{
    cuheap_assert(!pool_locks_held);
}

static inline void timed(uint64_t t0, uint64_t *ns)
{
    *ns += mono_ns() - t0;
}

int dev_mem_alloc(struct cuheap_pool *p, uint64_t size, uint64_t *ret_ptr)
{
    unlocked();
    return p->be.mem_alloc(p->be.ctx, size, ret_ptr);
}

int dev_mem_free(struct cuheap_pool *p, uint64_t ptr)
{
    unlocked();
    return p->be.mem_free(p->be.ctx, ptr);
}

int dev_va_reserve(struct cuheap_pool *p, uint64_t size, uint64_t *ret_va)
{
    unlocked();
    return p->be.va_reserve(p->be.ctx, size, ret_va);
}

void dev_va_free(struct cuheap_pool *p, uint64_t va, uint64_t size)
{
    unlocked();
    p->be.va_free(p->be.ctx, va, size);
}

/* What the driver says is free on the device (asked before a new chunk while the pool holds
 * memory for no allocation: new_chunk_locked). Returns false where the backend cannot say. */
bool dev_mem_free_bytes(struct cuheap_pool *p, uint64_t *ret_free)
{
    unlocked();
    uint64_t free_b, total;
    if (!p->be.mem_info || p->be.mem_info(p->be.ctx, &free_b, &total))
        return false;
    *ret_free = free_b;
    return true;
}

/* The mapping calls add their time to *ns, which the caller folds into st.map_ns under the
 * lock (the summary's time in mapping calls): each costs tens of microseconds, the clock tens
 * of nanoseconds. */
int dev_phys_create(struct cuheap_pool *p, uint64_t bytes, uint64_t *ret_handle, uint64_t *ns)
{
    unlocked();
    uint64_t t0 = mono_ns();
    int r = p->be.phys_create(p->be.ctx, bytes, ret_handle);
    timed(t0, ns);
    return r;
}

int dev_phys_release(struct cuheap_pool *p, uint64_t handle, uint64_t *ns)
{
    unlocked();
    uint64_t t0 = mono_ns();
    int r = p->be.phys_release(p->be.ctx, handle);
    timed(t0, ns);
    return r;
}

int dev_phys_map(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle, uint64_t *ns)
{
    unlocked();
    uint64_t t0 = mono_ns();
    int r = p->be.phys_map(p->be.ctx, va, bytes, handle);
    timed(t0, ns);
    return r;
}

int dev_phys_unmap(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t *ns)
{
    unlocked();
    uint64_t t0 = mono_ns();
    int r = p->be.phys_unmap(p->be.ctx, va, bytes);
    timed(t0, ns);
    return r;
}

bool dev_has_access(const struct cuheap_pool *p)
{
    return p->be.phys_access != NULL;
}

int dev_phys_access(struct cuheap_pool *p, uint64_t va, uint64_t bytes)
{
    unlocked();
    return p->be.phys_access(p->be.ctx, va, bytes);
}

bool dev_has_export(const struct cuheap_pool *p)
{
    return p->be.phys_export != NULL;
}

int dev_phys_export(struct cuheap_pool *p, uint64_t handle, int *ret_fd)
{
    unlocked();
    return p->be.phys_export(p->be.ctx, handle, ret_fd);
}

int dev_fence_wait(struct cuheap_pool *p, void *fence)
{
    unlocked();
    return p->be.fence_wait(p->be.ctx, fence);
}

int dev_device_sync(struct cuheap_pool *p)
{
    unlocked();
    return p->be.device_sync(p->be.ctx);
}

int dev_fence_record(struct cuheap_pool *p, void **ret_fence)
{
    return p->be.fence_record(p->be.ctx, ret_fence);
}

int dev_fence_query(struct cuheap_pool *p, void *fence)
{
    return p->be.fence_query(p->be.ctx, fence);
}

void dev_fence_destroy(struct cuheap_pool *p, void *fence)
{
    p->be.fence_destroy(p->be.ctx, fence);
}

/* Keep a fence valid across a wait with p->lock dropped (another thread may destroy it
 * meanwhile); dev_fence_unpin() lets go of it. Backends without fence_hold keep destroyed
 * fences safe to ask about. */
void dev_fence_pin(struct cuheap_pool *p, void *fence)
{
    if (p->be.fence_hold)
        p->be.fence_hold(p->be.ctx, fence);
}

void dev_fence_unpin(struct cuheap_pool *p, void *fence)
{
    if (p->be.fence_hold)
        p->be.fence_destroy(p->be.ctx, fence);
}

bool dev_has_idle_check(const struct cuheap_pool *p)
{
    return p->be.streams_idle != NULL;
}

int dev_streams_idle(struct cuheap_pool *p)
{
    return p->be.streams_idle(p->be.ctx);
}

void dev_forget(struct cuheap_pool *p)
{
    if (p->be.forget)
        p->be.forget(p->be.ctx);
}
