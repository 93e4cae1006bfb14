/* SPDX-License-Identifier: MIT */
/*
 * The global address map: which arena a device address is in, one slot per 2 MiB granule of
 * every arena's range, open addressing. Read without locks by every free (a thread looks at
 * its last arena first); written under g_map_lock when an arena comes or goes.
 *
 * Lock rule: g_map_lock guards writers only, and is taken inside p->lock or with none; readers
 * take no lock (slots are published with release stores). No driver call here.
 */
#include "internal.h"

#include <sys/mman.h>

struct map_slot *g_map;
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;
static void map_init(void)
{
    void *m = mmap(NULL, NR_MAP_SLOTS * sizeof(struct map_slot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g_map = m == MAP_FAILED ? NULL : m;
}

/* Register or unregister every granule the arena touches. g_map_lock taken inside. */
int map_update(struct cuheap_arena *a, bool add)
{
    pthread_once(&g_map_once, map_init);
    if (!g_map)
        return -ENOMEM;
    uint64_t first = a->buddy.base >> GRANULE_SHIFT;
    uint64_t last = (a->buddy.base + a->buddy.size - 1) >> GRANULE_SHIFT;
    pthread_mutex_lock(&g_map_lock);
    for (uint64_t g = first; g <= last; g++) {
        uint64_t key = g + 1;
        uint32_t i = map_hash(key), n = 0;
        if (add) {
            for (; n < NR_MAP_SLOTS; i = (i + 1) & (NR_MAP_SLOTS - 1), n++) {
                uint64_t k = atomic_load_explicit(&g_map[i].key, memory_order_relaxed);
                if (k == key && atomic_load(&g_map[i].arena)) {
                    /* granule shared with another arena: only possible for unaligned arenas */
                    pthread_mutex_unlock(&g_map_lock);
                    for (uint64_t u = first; u < g; u++) {
                        /* roll back what we added */
                        uint64_t uk = u + 1;
                        for (uint32_t j = map_hash(uk);; j = (j + 1) & (NR_MAP_SLOTS - 1))
                            if (atomic_load(&g_map[j].key) == uk &&
                                atomic_load(&g_map[j].arena) == a) {
                                atomic_store(&g_map[j].arena, NULL);
                                atomic_store(&g_map[j].key, MAP_TOMB);
                                break;
                            }
                    }
                    return -EEXIST;
                }
                if (k == MAP_EMPTY || k == MAP_TOMB) {
                    atomic_store_explicit(&g_map[i].arena, a, memory_order_relaxed);
                    atomic_store_explicit(&g_map[i].key, key, memory_order_release);
                    break;
                }
            }
            if (n == NR_MAP_SLOTS) {
                pthread_mutex_unlock(&g_map_lock);
                return -ENOSPC;
            }
        } else {
            for (; n < NR_MAP_SLOTS; i = (i + 1) & (NR_MAP_SLOTS - 1), n++) {
                uint64_t k = atomic_load_explicit(&g_map[i].key, memory_order_relaxed);
                if (k == MAP_EMPTY)
                    break;
                if (k == key && atomic_load(&g_map[i].arena) == a) {
                    atomic_store_explicit(&g_map[i].arena, NULL, memory_order_release);
                    atomic_store_explicit(&g_map[i].key, MAP_TOMB, memory_order_release);
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&g_map_lock);
    return 0;
}

struct cuheap_pool *cuheap_pool_of(uint64_t ptr)
{
    struct cuheap_arena *a = map_lookup(ptr);
    return a ? a->pool : NULL;
}

__thread struct cuheap_arena *map_last __attribute__((tls_model("initial-exec")));

/* In a child after fork: another thread may have held the map's lock. */
void map_atfork_child(void)
{
    pthread_mutex_init(&g_map_lock, NULL);
}
