/* SPDX-License-Identifier: MIT */
/*
 * The coverage audit's matcher and the hooks' queue into it (see audit.h). Each side keeps its
 * unmatched operations in an open-addressing table keyed by (operation, address), with a
 * count per key: an address the driver hands out again after a release is the same key, and
 * identical keys pair in any order because they describe the same memory.
 */
#include "audit.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "config.h"

enum { SLOT_EMPTY, SLOT_LIVE, SLOT_TOMB };

struct audit_slot {
    uint64_t addr;
    uint64_t bytes_key;  /* the byte count, for address 0 (physical memory); else 0 */
    uint64_t first;      /* arrival number of the oldest unmatched one */
    uint64_t generation; /* generation in which the newest one arrived */
    uint32_t count;      /* unmatched operations with this key */
    uint32_t reported;   /* of those, already passed to cuheap_audit_age()'s fn */
    uint8_t op;
    uint8_t state;
    union {
        struct cuheap_audit_seen seen;
        struct cuheap_audit_driver_op driver;
    } rep; /* the oldest one, as it came */
};

static uint64_t units(const struct audit_table *t)
{
    uint64_t n = 0;
    for (size_t i = 0; i < t->nr_slots; i++)
        if (t->slots[i].state == SLOT_LIVE)
            n += t->slots[i].count;
    return n;
}

static size_t hash(uint8_t op, uint64_t addr, uint64_t bytes_key, size_t nr_slots)
{
    uint64_t h = (addr ^ (bytes_key * 0xff51afd7ed558ccdull) ^ op) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (nr_slots - 1);
}

static int table_init(struct audit_table *t, size_t nr_slots)
{
    t->slots = calloc(nr_slots, sizeof(*t->slots));
    if (!t->slots)
        return -ENOMEM;
    t->nr_slots = nr_slots;
    t->nr_used = t->nr_live = 0;
    return 0;
}

/* Bytes a slot's operation covers, for telling apart operations at one address. */
static uint64_t slot_bytes(const struct audit_slot *s, bool seen)
{
    return seen ? s->rep.seen.size : s->rep.driver.bytes;
}

/* A live slot for the key, or NULL; *ret_free (when asked) gets where to insert one. One key
 * can hold several slots (an address reused with another size before either side caught up):
 * with `fits`, the oldest whose size fits it is returned, else the oldest; with `exact`, only
 * one of exactly those bytes. */
static struct audit_slot *table_find(struct audit_table *t, uint8_t op, uint64_t addr,
                                     uint64_t bytes_key, struct audit_slot **ret_free,
                                     bool (*fits)(const struct audit_slot *s, const void *arg),
                                     const void *arg)
{
    struct audit_slot *tomb = NULL, *oldest = NULL, *best = NULL;
    size_t i = hash(op, addr, bytes_key, t->nr_slots);
    for (size_t n = 0; n < t->nr_slots; i = (i + 1) & (t->nr_slots - 1), n++) {
        struct audit_slot *s = &t->slots[i];
        if (s->state == SLOT_EMPTY)
            break;
        if (s->state == SLOT_TOMB) {
            if (!tomb)
                tomb = s;
        } else if (s->op == op && s->addr == addr && s->bytes_key == bytes_key) {
            if (!oldest || s->first < oldest->first)
                oldest = s;
            if (fits && fits(s, arg) && (!best || s->first < best->first))
                best = s;
        }
    }
    if (ret_free)
        *ret_free = tomb ? tomb : &t->slots[i];
    return best ? best : oldest;
}

/* Room for one more key: rehash (dropping tombstones, doubling when live slots need it). */
static int table_reserve(struct audit_table *t)
{
    if ((t->nr_used + 1) * 4 <= t->nr_slots * 3)
        return 0;
    size_t n = t->nr_slots;
    while ((t->nr_live + 1) * 2 > n)
        n *= 2;
    struct audit_table fresh;
    if (table_init(&fresh, n))
        return -ENOMEM;
    for (size_t i = 0; i < t->nr_slots; i++) {
        struct audit_slot *s = &t->slots[i], *to = NULL;
        if (s->state != SLOT_LIVE)
            continue;
        table_find(&fresh, s->op, s->addr, s->bytes_key, &to, NULL, NULL);
        *to = *s;
        fresh.nr_used++;
        fresh.nr_live++;
    }
    free(t->slots);
    *t = fresh;
    return 0;
}

/* Take one unmatched operation out of a live slot. */
static void table_take(struct audit_table *t, struct audit_slot *s)
{
    if (--s->count == 0) {
        s->state = SLOT_TOMB;
        t->nr_live--;
    } else if (s->reported > s->count) {
        s->reported = s->count;
    }
}

struct same {
    uint64_t bytes;
    bool seen;
};

static bool same_bytes(const struct audit_slot *s, const void *arg)
{
    const struct same *w = arg;
    return slot_bytes(s, w->seen) == w->bytes;
}

/* Keep one more unmatched operation: counted in the slot of its key and size, or a new slot
 * holding a copy of rep. */
static int table_add(struct cuheap_audit *a, struct audit_table *t, bool seen, uint8_t op,
                     uint64_t addr, uint64_t bytes_key, const void *rep, size_t rep_size,
                     uint64_t bytes)
{
    if (table_reserve(t))
        return -ENOMEM;
    struct audit_slot *free_slot = NULL;
    struct same w = {bytes, seen};
    struct audit_slot *s = table_find(t, op, addr, bytes_key, &free_slot, same_bytes, &w);
    if (s && slot_bytes(s, seen) != bytes)
        s = NULL;
    if (!s) {
        s = free_slot;
        if (s->state == SLOT_EMPTY)
            t->nr_used++;
        t->nr_live++;
        memset(s, 0, sizeof(*s));
        s->state = SLOT_LIVE;
        s->op = op;
        s->addr = addr;
        s->bytes_key = bytes_key;
        s->first = a->arrival;
        memcpy(&s->rep, rep, rep_size);
    }
    s->count++;
    s->generation = a->generation;
    return 0;
}

int cuheap_audit_init(struct cuheap_audit *a)
{
    memset(a, 0, sizeof(*a));
    if (table_init(&a->seen, 1024))
        return -ENOMEM;
    if (table_init(&a->driver, 1024)) {
        free(a->seen.slots);
        return -ENOMEM;
    }
    return 0;
}

void cuheap_audit_destroy(struct cuheap_audit *a)
{
    free(a->seen.slots);
    free(a->driver.slots);
    memset(a, 0, sizeof(*a));
}

/* Does the driver's byte count fit what the hook saw (the request, or the driver's rounding
 * of it)? Unknown sizes fit. */
static bool size_fits(const struct cuheap_audit_seen *s, uint64_t bytes)
{
    if (!s->size || !bytes)
        return true;
    uint64_t hi = s->size_max > s->size ? s->size_max : s->size;
    return bytes >= s->size && bytes <= hi;
}

static bool driver_fits(const struct audit_slot *s, const void *arg)
{
    return size_fits(arg, s->rep.driver.bytes);
}

static bool seen_fits(const struct audit_slot *s, const void *arg)
{
    return size_fits(&s->rep.seen, ((const struct cuheap_audit_driver_op *)arg)->bytes);
}

static void matched(struct cuheap_audit *a, const struct cuheap_audit_seen *s,
                    const struct cuheap_audit_driver_op *d)
{
    a->counts.nr_matched++;
    if (s->door < CUHEAP_AUDIT_NR_DOORS)
        a->counts.nr_by_door[s->door]++;
    if (!size_fits(s, d->bytes) && a->counts.nr_size_differs++ == 0) {
        a->differs_example = *d;
        a->differs_seen_size = s->size;
    }
}

int cuheap_audit_feed_seen(struct cuheap_audit *a, const struct cuheap_audit_seen *s)
{
    a->counts.nr_seen++;
    a->arrival++;
    uint64_t key = s->addr ? 0 : s->size;
    struct audit_slot *d = table_find(&a->driver, s->op, s->addr, key, NULL, driver_fits, s);
    if (d) {
        matched(a, s, &d->rep.driver);
        table_take(&a->driver, d);
        return 0;
    }
    return table_add(a, &a->seen, true, s->op, s->addr, key, s, sizeof(*s), s->size);
}

int cuheap_audit_feed_driver(struct cuheap_audit *a, const struct cuheap_audit_driver_op *d)
{
    if (d->op != CUHEAP_AUDIT_ALLOC && d->op != CUHEAP_AUDIT_RELEASE) {
        a->counts.nr_ignored++;
        return 0;
    }
    /* A module's globals are placed by the driver when it loads the module: no allocation
     * call made them, so there is no door a hook could have missed. */
    if (d->memory == CUHEAP_AUDIT_MEM_DEVICE_STATIC ||
        d->memory == CUHEAP_AUDIT_MEM_MANAGED_STATIC) {
        a->counts.nr_static++;
        return 0;
    }
    a->counts.nr_driver++;
    a->arrival++;
    uint64_t key = d->addr ? 0 : d->bytes;
    struct audit_slot *s = table_find(&a->seen, d->op, d->addr, key, NULL, seen_fits, d);
    if (s) {
        matched(a, &s->rep.seen, d);
        table_take(&a->seen, s);
        return 0;
    }
    return table_add(a, &a->driver, false, d->op, d->addr, key, d, sizeof(*d), d->bytes);
}

void cuheap_audit_get_counts(const struct cuheap_audit *a, struct cuheap_audit_counts *ret)
{
    *ret = a->counts;
    ret->nr_missed = units(&a->driver);
    ret->nr_unreported = units(&a->seen);
}

static int by_first(const void *x, const void *y)
{
    const struct audit_slot *a = *(struct audit_slot *const *)x,
                            *b = *(struct audit_slot *const *)y;
    return a->first < b->first ? -1 : a->first > b->first;
}

/* The live driver slots, oldest first, in a malloc'd array (NULL when none or no memory). */
static struct audit_slot **sorted_misses(const struct cuheap_audit *a, size_t *ret_n)
{
    *ret_n = 0;
    if (!a->driver.nr_live)
        return NULL;
    struct audit_slot **v = malloc(a->driver.nr_live * sizeof(*v));
    if (!v)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < a->driver.nr_slots; i++)
        if (a->driver.slots[i].state == SLOT_LIVE)
            v[n++] = &a->driver.slots[i];
    qsort(v, n, sizeof(*v), by_first);
    *ret_n = n;
    return v;
}

size_t cuheap_audit_misses(const struct cuheap_audit *a, struct cuheap_audit_miss *ret, size_t max)
{
    size_t n;
    struct audit_slot **v = sorted_misses(a, &n);
    size_t total = v ? n : a->driver.nr_live;
    for (size_t i = 0; i < n && i < max; i++)
        ret[i] = (struct cuheap_audit_miss){v[i]->rep.driver, v[i]->count};
    free(v);
    return total;
}

size_t cuheap_audit_age(struct cuheap_audit *a, bool all,
                        void (*fn)(const struct cuheap_audit_miss *m, void *arg), void *arg)
{
    size_t n, passed = 0;
    struct audit_slot **v = sorted_misses(a, &n);
    for (size_t i = 0; i < n; i++) {
        struct audit_slot *s = v[i];
        if (s->reported >= s->count || (!all && s->generation >= a->generation))
            continue;
        struct cuheap_audit_miss m = {s->rep.driver, s->count - s->reported};
        s->reported = s->count;
        fn(&m, arg);
        passed++;
    }
    free(v);
    a->generation++;
    return passed;
}

static const char *const memory_names[CUHEAP_AUDIT_NR_MEMORY] = {
    "unknown", "pageable", "pinned",        "device",
    "array",   "managed",  "device static", "managed static",
};

const char *cuheap_audit_memory_name(unsigned memory)
{
    return memory < CUHEAP_AUDIT_NR_MEMORY ? memory_names[memory] : "unknown";
}

static const char *const door_names[CUHEAP_AUDIT_NR_DOORS] = {
    "pass-through", "pool", "vmm create", "vmm map", "async pool",
};

const char *cuheap_audit_door_name(unsigned door)
{
    return door < CUHEAP_AUDIT_NR_DOORS ? door_names[door] : "unknown";
}

char *cuheap_audit_describe(const struct cuheap_audit_driver_op *d, char *buf, size_t size)
{
    char bytes[32];
    int n = snprintf(buf, size, "%s %s 0x%" PRIx64 " (%s, correlation %" PRIu32,
                     d->op == CUHEAP_AUDIT_ALLOC ? "alloc" : "release",
                     cuheap_audit_memory_name(d->memory), d->addr,
                     cuheap_format_size(d->bytes, bytes, sizeof(bytes)), d->correlation);
    if (n >= 0 && (size_t)n < size && d->pool)
        n += snprintf(buf + n, size - (size_t)n, ", memory pool 0x%" PRIx64, d->pool);
    if (n >= 0 && (size_t)n < size && d->api)
        n += snprintf(buf + n, size - (size_t)n, ", %s", d->api);
    if (n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ")");
    return buf;
}

char *cuheap_audit_summary(const struct cuheap_audit *a, unsigned max_listed, char *buf,
                           size_t size)
{
    struct cuheap_audit_counts c;
    cuheap_audit_get_counts(a, &c);
    if (!c.nr_missed) {
        snprintf(buf, size, "audit: %" PRIu64 " driver operations, all seen", c.nr_driver);
        return buf;
    }
    size_t n = (size_t)snprintf(
        buf, size,
        "audit: %" PRIu64 " driver operations, %" PRIu64 " not seen by cuheap: ", c.nr_driver,
        c.nr_missed);
    size_t nr_slots;
    struct audit_slot **v = sorted_misses(a, &nr_slots);
    uint64_t listed = 0;
    for (size_t i = 0; i < nr_slots && i < max_listed && n < size; i++) {
        char one[160];
        cuheap_audit_describe(&v[i]->rep.driver, one, sizeof(one));
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? "; " : "", one);
        if (v[i]->count > 1 && n < size)
            n += (size_t)snprintf(buf + n, size - n, " x%" PRIu32, v[i]->count);
        listed += v[i]->count;
    }
    free(v);
    if (listed < c.nr_missed && n < size)
        snprintf(buf + n, size - n, "%sand %" PRIu64 " more", listed ? "; " : "",
                 c.nr_missed - listed);
    return buf;
}

/* ---- the queue (Vyukov's bounded queue: a sequence number per slot) ---- */

struct audit_qslot {
    /* The slot's sequence number minus its index: 0 in fresh (zeroed) memory means "free for
     * the push at its index", so the mapping needs no initial pass and costs only the pages
     * the queue reaches. Sequence pos: free for the push at pos; pos + 1: holds that push. */
    _Atomic uint64_t rel_seq;
    struct cuheap_audit_seen v;
};

static uint64_t seq_load(struct audit_qslot *slot, uint64_t idx)
{
    return atomic_load_explicit(&slot->rel_seq, memory_order_acquire) + idx;
}

static void seq_store(struct audit_qslot *slot, uint64_t idx, uint64_t seq)
{
    atomic_store_explicit(&slot->rel_seq, seq - idx, memory_order_release);
}

int cuheap_audit_queue_init(struct cuheap_audit_queue *q, uint64_t nr_slots)
{
    memset(q, 0, sizeof(*q));
    if (!nr_slots || (nr_slots & (nr_slots - 1)))
        return -EINVAL;
    /* mmap: zeroed pages, touched only as the queue fills; nothing here uses malloc, which a
     * program's allocator replacement might route back into CUDA. */
    void *m = mmap(NULL, nr_slots * sizeof(struct audit_qslot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    q->slots = m;
    q->mask = nr_slots - 1;
    return 0;
}

void cuheap_audit_queue_destroy(struct cuheap_audit_queue *q)
{
    if (q->slots)
        munmap(q->slots, (q->mask + 1) * sizeof(struct audit_qslot));
    memset(q, 0, sizeof(*q));
}

bool cuheap_audit_queue_push(struct cuheap_audit_queue *q, const struct cuheap_audit_seen *s)
{
    if (!q->slots)
        return false;
    uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    struct audit_qslot *slot;
    for (;;) {
        slot = &q->slots[pos & q->mask];
        int64_t dif = (int64_t)(seq_load(slot, pos & q->mask) - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed))
                break;
        } else if (dif < 0) {
            atomic_fetch_add_explicit(&q->nr_dropped, 1, memory_order_relaxed);
            return false;
        } else {
            pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
        }
    }
    slot->v = *s;
    seq_store(slot, pos & q->mask, pos + 1);
    return true;
}

bool cuheap_audit_queue_pop(struct cuheap_audit_queue *q, struct cuheap_audit_seen *ret)
{
    if (!q->slots)
        return false;
    uint64_t idx = q->head & q->mask;
    struct audit_qslot *slot = &q->slots[idx];
    if (seq_load(slot, idx) != q->head + 1)
        return false;
    *ret = slot->v;
    seq_store(slot, idx, q->head + q->mask + 1);
    q->head++;
    return true;
}
