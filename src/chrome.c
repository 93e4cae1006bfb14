/* SPDX-License-Identifier: MIT */
/* Chrome Trace Event writer (see chrome.h). */
#include "chrome.h"

#include <inttypes.h>
#include <string.h>

#include "event.h"

static void emit(struct cuheap_chrome *c, json_t *obj)
{
    if (!c->first)
        fputs(",\n", c->f);
    c->first = false;
    json_dumpf(obj, c->f, JSON_COMPACT);
    json_decref(obj);
}

int cuheap_chrome_begin(struct cuheap_chrome *c, FILE *f, long pid, const char *process_name)
{
    memset(c, 0, sizeof(*c));
    if (cuheap_addrmap_init(&c->live, 1u << 20))
        return -1;
    c->f = f;
    c->first = true;
    fputs("[\n", f);
    return cuheap_chrome_process(c, pid, process_name);
}

int cuheap_chrome_process(struct cuheap_chrome *c, long pid, const char *process_name)
{
    if (!c->first) {
        /* slices still open belong to the previous process: forget them, so an address the
         * next process reuses does not end them */
        cuheap_addrmap_destroy(&c->live);
        if (cuheap_addrmap_init(&c->live, 1u << 20))
            return -1;
    }
    c->pid = pid;
    memset(c->live_bytes, 0, sizeof(c->live_bytes));
    memset(c->reserved_bytes, 0, sizeof(c->reserved_bytes));
    emit(c, json_pack("{s:s, s:s, s:I, s:i, s:{s:s}}", "ph", "M", "name", "process_name", "pid",
                      (json_int_t)pid, "tid", 0, "args", "name", process_name));
    return 0;
}

/* a += b without wrapping past UINT64_MAX, a -= b without going below 0 */
static void add_bytes(uint64_t *a, uint64_t b)
{
    *a = *a > UINT64_MAX - b ? UINT64_MAX : *a + b;
}

static void sub_bytes(uint64_t *a, uint64_t b)
{
    *a = *a > b ? *a - b : 0;
}

/* JSON integers are int64 for most readers: larger values go out as numbers with a
 * fraction rather than turning negative. */
static json_t *bytes_json(uint64_t v)
{
    return v > INT64_MAX ? json_real((double)v) : json_integer((json_int_t)v);
}

static void counter(struct cuheap_chrome *c, int dev, double ts)
{
    char name[48];
    snprintf(name, sizeof(name), "GPU %d memory (bytes)", dev);
    emit(c,
         json_pack("{s:s, s:s, s:I, s:i, s:f, s:{s:o, s:o}}", "ph", "C", "name", name, "pid",
                   (json_int_t)c->pid, "tid", 0, "ts", ts, "args", "live",
                   bytes_json(c->live_bytes[dev]), "reserved", bytes_json(c->reserved_bytes[dev])));
}

static void slice_name(char *buf, size_t n, int api, uint64_t size, bool pooled)
{
    const char *unit = "B";
    double v = (double)size;
    if (size >= (1ull << 30)) {
        v /= (double)(1ull << 30);
        unit = "GiB";
    } else if (size >= (1ull << 20)) {
        v /= (double)(1ull << 20);
        unit = "MiB";
    } else if (size >= 1024) {
        v /= 1024.0;
        unit = "KiB";
    }
    snprintf(buf, n, "%.4g %s %s%s", v, unit, cuheap_api_name((unsigned)api),
             pooled ? " (pool)" : "");
}

/* The open slice's api, with this bit when it came from the pool: the end event must carry
 * the begin's name, as Perfetto keys async tracks by name and id. */
#define POOLED_BIT 0x80

/* Async slices carry process-scoped ids (id2.local): merged ranks reuse the same addresses,
 * and a global id would pair one process's allocation with another's free. */
static void slice_end(struct cuheap_chrome *c, const struct cuheap_addr_entry *ent, long tid,
                      double ts)
{
    char id[40], name[96];
    snprintf(id, sizeof(id), "0x%" PRIx64, ent->key);
    slice_name(name, sizeof(name), ent->api & ~POOLED_BIT, ent->size, ent->api & POOLED_BIT);
    emit(c, json_pack("{s:s, s:s, s:s, s:{s:s}, s:I, s:I, s:f}", "ph", "e", "cat", "alloc", "name",
                      name, "id2", "local", id, "pid", (json_int_t)c->pid, "tid", (json_int_t)tid,
                      "ts", ts));
}

void cuheap_chrome_event(struct cuheap_chrome *c, const struct cuheap_chrome_ev *e)
{
    int dev = e->device >= 0 && e->device < CUHEAP_CHROME_NR_DEVICES ? e->device : -1;
    char id[40], name[96];
    snprintf(id, sizeof(id), "0x%" PRIx64, e->ptr);
    bool device_memory = e->api != CUHEAP_API_HOST && e->api != CUHEAP_API_VMM_MAP;
    struct cuheap_addr_entry ent;
    switch (e->type) {
    case CUHEAP_EV_ALLOC: {
        if (cuheap_addrmap_take(&c->live, e->ptr, &ent) == 0)
            slice_end(c, &ent, e->tid, e->ts_us); /* its free was lost: close it here */
        slice_name(name, sizeof(name), e->api, e->size, e->pooled);
        json_t *args = json_pack("{s:o, s:o, s:s, s:i}", "size", bytes_json(e->size), "actual",
                                 bytes_json(e->actual), "ptr", id, "device", e->device);
        if (e->stack_id)
            json_object_set_new(args, "stack_id", json_integer(e->stack_id));
        if (e->stack)
            json_object_set(args, "stack", e->stack);
        emit(c, json_pack("{s:s, s:s, s:s, s:{s:s}, s:I, s:I, s:f, s:o}", "ph", "b", "cat", "alloc",
                          "name", name, "id2", "local", id, "pid", (json_int_t)c->pid, "tid",
                          (json_int_t)e->tid, "ts", e->ts_us, "args", args));
        ent = (struct cuheap_addr_entry){e->ptr, e->size, e->actual, (int16_t)e->device,
                                         (uint8_t)(e->api | (e->pooled ? POOLED_BIT : 0))};
        cuheap_addrmap_put(&c->live, &ent);
        if (dev >= 0 && device_memory) {
            add_bytes(&c->live_bytes[dev], e->size);
            if (!e->pooled)
                add_bytes(&c->reserved_bytes[dev], e->actual);
            counter(c, dev, e->ts_us);
        }
        break;
    }
    case CUHEAP_EV_FREE: {
        /* a free whose allocation is not in the file (made before recording) ends nothing */
        if (cuheap_addrmap_take(&c->live, e->ptr, &ent) == 0)
            slice_end(c, &ent, e->tid, e->ts_us);
        if (dev >= 0 && device_memory) {
            sub_bytes(&c->live_bytes[dev], e->size);
            if (!e->pooled)
                sub_bytes(&c->reserved_bytes[dev], e->actual);
            counter(c, dev, e->ts_us);
        }
        break;
    }
    case CUHEAP_EV_ARENA_GROW:
    case CUHEAP_EV_ARENA_RELEASE:
        if (dev >= 0) {
            if (e->type == CUHEAP_EV_ARENA_GROW)
                add_bytes(&c->reserved_bytes[dev], e->size);
            else
                sub_bytes(&c->reserved_bytes[dev], e->size);
            counter(c, dev, e->ts_us);
        }
        break;
    case CUHEAP_EV_OOM:
    case CUHEAP_EV_LIMIT:
        snprintf(name, sizeof(name), "%s: %" PRIu64 " bytes refused on GPU %d",
                 e->type == CUHEAP_EV_OOM ? "OOM" : "limit", e->size, e->device);
        /* on the process's own track ("p"), so merged ranks say whose it was */
        emit(c, json_pack("{s:s, s:s, s:s, s:I, s:I, s:f, s:{s:o, s:o, s:o}}", "ph", "i", "s", "p",
                          "name", name, "pid", (json_int_t)c->pid, "tid", (json_int_t)e->tid, "ts",
                          e->ts_us, "args", "size", bytes_json(e->size), "driver_free",
                          bytes_json(e->aux), e->type == CUHEAP_EV_OOM ? "driver_total" : "limit",
                          bytes_json(e->aux2)));
        break;
    case CUHEAP_EV_MARK:
        emit(c, json_pack("{s:s, s:s, s:s, s:I, s:I, s:f}", "ph", "i", "s", "p", "name",
                          e->label ? e->label : "mark", "pid", (json_int_t)c->pid, "tid",
                          (json_int_t)e->tid, "ts", e->ts_us));
        break;
    default:
        break;
    }
}

void cuheap_chrome_end(struct cuheap_chrome *c)
{
    fputs("\n]\n", c->f);
    cuheap_addrmap_destroy(&c->live);
}
