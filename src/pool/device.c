/* SPDX-License-Identifier: MIT */
/*
 * The pool's one door to its backend (backend.h): every call the pool makes to the device
 * goes through a function here. The mapping calls are timed for the summary (st.map_ns).
 *
 * Lock rule: the functions here take no lock.
 */
#include "internal.h"

/* The driver's mapping calls, timed for the summary (st.map_ns): each costs tens of
 * microseconds, the clock tens of nanoseconds. */
int be_phys_unmap(struct cuheap_pool *p, uint64_t va, uint64_t bytes)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_unmap(p->be.ctx, va, bytes);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

int be_phys_release(struct cuheap_pool *p, uint64_t handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_release(p->be.ctx, handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

int be_phys_create(struct cuheap_pool *p, uint64_t bytes, uint64_t *ret_handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_create(p->be.ctx, bytes, ret_handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
}

int be_phys_map(struct cuheap_pool *p, uint64_t va, uint64_t bytes, uint64_t handle)
{
    uint64_t t0 = mono_ns();
    int r = p->be.phys_map(p->be.ctx, va, bytes, handle);
    p->st.map_ns += mono_ns() - t0;
    return r;
}
