/* SPDX-License-Identifier: MIT */
/* Names of event types and APIs, shared by the writer and the trace reader. */
#include "event.h"

#include <string.h>

static const char *const type_names[CUHEAP_NR_EVENT_TYPES] = {
    [CUHEAP_EV_ALLOC] = "alloc",           [CUHEAP_EV_FREE] = "free",
    [CUHEAP_EV_ARENA_GROW] = "arena_grow", [CUHEAP_EV_ARENA_RELEASE] = "arena_release",
    [CUHEAP_EV_FENCE] = "fence",           [CUHEAP_EV_OOM] = "oom",
    [CUHEAP_EV_LIMIT] = "limit",           [CUHEAP_EV_MARK] = "mark",
};

static const char *const api_names[CUHEAP_NR_APIS] = {
    [CUHEAP_API_NONE] = "none",
    [CUHEAP_API_MEM_ALLOC] = "cuMemAlloc",
    [CUHEAP_API_PITCH] = "cuMemAllocPitch",
    [CUHEAP_API_ASYNC] = "cuMemAllocAsync",
    [CUHEAP_API_POOL_ASYNC] = "cuMemAllocFromPoolAsync",
    [CUHEAP_API_MANAGED] = "cuMemAllocManaged",
    [CUHEAP_API_HOST] = "cuMemHostAlloc",
    [CUHEAP_API_VMM_CREATE] = "cuMemCreate",
    [CUHEAP_API_VMM_MAP] = "cuMemMap",
    [CUHEAP_API_TORCH] = "torch_pluggable",
};

const char *cuheap_event_type_name(unsigned type)
{
    return type < CUHEAP_NR_EVENT_TYPES && type_names[type] ? type_names[type] : "unknown";
}

const char *cuheap_api_name(unsigned api)
{
    return api < CUHEAP_NR_APIS ? api_names[api] : "unknown";
}

int cuheap_event_type_from_name(const char *name)
{
    for (int i = 1; i < CUHEAP_NR_EVENT_TYPES; i++)
        if (type_names[i] && !strcmp(type_names[i], name))
            return i;
    return -1;
}

int cuheap_api_from_name(const char *name)
{
    for (int i = 0; i < CUHEAP_NR_APIS; i++)
        if (!strcmp(api_names[i], name))
            return i;
    return -1;
}
