/* SPDX-License-Identifier: MIT */
/* Names of event types and APIs, shared by the writer and the trace reader; UTF-8 repair of
 * text that goes into a trace; the events' sequence numbers. */
#include "event.h"

#include <stdatomic.h>
#include <string.h>

static const char *const type_names[CUHEAP_NR_EVENT_TYPES] = {
    [CUHEAP_EV_ALLOC] = "alloc",           [CUHEAP_EV_FREE] = "free",
    [CUHEAP_EV_ARENA_GROW] = "arena_grow", [CUHEAP_EV_ARENA_RELEASE] = "arena_release",
    [CUHEAP_EV_FENCE] = "fence",           [CUHEAP_EV_OOM] = "oom",
    [CUHEAP_EV_LIMIT] = "limit",           [CUHEAP_EV_MARK] = "mark",
    [CUHEAP_EV_AUDIT] = "audit",
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

/* Length of the well-formed UTF-8 sequence at p, 0 when p does not begin one (Unicode's
 * table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t sequence_length(const unsigned char *p)
{
    unsigned char c = p[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

char *cuheap_utf8_clean(const char *s, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    char *o = out;
    while (*p) {
        size_t n = sequence_length(p);
        if (n) {
            memcpy(o, p, n);
            o += n;
            p += n;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3); /* U+FFFD */
            o += 3;
            p++;
        }
    }
    *o = 0;
    return out;
}

size_t cuheap_utf8_cut(const char *s, size_t max)
{
    size_t n = max;
    /* s[n] is the first byte left out: when it continues a character, leave that one out */
    while (n > 0 && max - n < 3 && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    return ((unsigned char)s[n] & 0xc0) == 0x80 ? max : n;
}

static _Atomic uint64_t g_seq;

uint64_t cuheap_seq_next(void)
{
    return atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed) + 1;
}
