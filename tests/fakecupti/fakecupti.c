/* SPDX-License-Identifier: MIT */
/*
 * A CUPTI stand-in for the simulated driver: built as libcupti.so with the few functions
 * cuheap's audit uses. It subscribes to the fake driver's allocations and releases
 * (fakecuda_set_memory_observer) and hands them over as CUPTI_ACTIVITY_KIND_MEMORY2 records
 * in the buffers the client gives it, as CUPTI does: a buffer is handed back when it is full
 * or at a flush, on whichever thread that happens.
 *
 * FAKECUPTI_HELD=1 plays another subscriber (a profiler) holding CUPTI.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool subscribed, enabled; /* guarded by lock */
static CUpti_BuffersCallbackRequestFunc request;
static CUpti_BuffersCallbackCompleteFunc complete;
static uint8_t *buffer; /* the client's current buffer; guarded by lock */
static size_t buffer_size, used;
static uint32_t next_correlation = 1;
static CUpti_CallbackFunc callback; /* the subscriber's */
static void *callback_arg;
static bool callback_on[CUPTI_DRIVER_TRACE_CBID_SIZE];

/* The entry points the fake driver names (fakecuda_memop.api), with CUPTI's ids. */
static const struct {
    CUpti_CallbackId id;
    const char *name;
} known[] = {
    {CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, "cuMemAlloc_v2"},
    {CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2"},
};

EXPORT CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t id, const char **name)
{
    for (size_t i = 0; domain == CUPTI_CB_DOMAIN_DRIVER_API && i < sizeof(known) / sizeof(known[0]);
         i++)
        if (known[i].id == id) {
            *name = known[i].name;
            return CUPTI_SUCCESS;
        }
    return CUPTI_ERROR_INVALID_PARAMETER;
}

EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle h,
                                       CUpti_CallbackDomain domain, CUpti_CallbackId id)
{
    (void)h;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || id >= CUPTI_DRIVER_TRACE_CBID_SIZE)
        return CUPTI_ERROR_INVALID_PARAMETER;
    callback_on[id] = enable != 0;
    return CUPTI_SUCCESS;
}

/* The subscriber's callback at the entry of the named call, when it asked for that one. */
static void call_back(const char *api, uint32_t correlation)
{
    for (size_t i = 0; api && callback && i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(known[i].name, api) && callback_on[known[i].id]) {
            CUpti_CallbackData d = {.callbackSite = CUPTI_API_ENTER,
                                    .functionName = known[i].name,
                                    .correlationId = correlation};
            callback(callback_arg, CUPTI_CB_DOMAIN_DRIVER_API, known[i].id, &d);
        }
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult r, const char **str)
{
    switch (r) {
    case CUPTI_SUCCESS:
        *str = "CUPTI_SUCCESS";
        break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
        break;
    default:
        *str = "CUPTI_ERROR_UNKNOWN";
        break;
    }
    return CUPTI_SUCCESS;
}

/* Like the real CUPTI (seen on an H200): it registers an exit handler of its own when a
 * subscriber arrives, and activity calls made after that handler ran crash. The stand-in
 * aborts instead, so a client that calls it too late at exit fails its test. */
static bool torn_down;

static void cupti_at_exit(void)
{
    torn_down = true;
}

static void check_alive(const char *what)
{
    if (torn_down) {
        fprintf(stderr, "fakecupti: %s called after CUPTI's exit handler ran\n", what);
        abort();
    }
}

EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *ret, CUpti_CallbackFunc fn, void *arg)
{
    static bool registered;
    if (!registered) {
        registered = true;
        atexit(cupti_at_exit);
    }
    const char *held = getenv("FAKECUPTI_HELD");
    pthread_mutex_lock(&lock);
    bool busy = subscribed || (held && held[0] == '1');
    subscribed = subscribed || !busy;
    pthread_mutex_unlock(&lock);
    if (busy)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    callback = fn;
    callback_arg = arg;
    *ret = (CUpti_SubscriberHandle)&subscribed;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle h)
{
    (void)h;
    pthread_mutex_lock(&lock);
    subscribed = false;
    pthread_mutex_unlock(&lock);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                                  CUpti_BuffersCallbackCompleteFunc done)
{
    if (!req || !done)
        return CUPTI_ERROR_INVALID_PARAMETER;
    request = req;
    complete = done;
    return CUPTI_SUCCESS;
}

/* Hand the current buffer back to the client (lock not held: the client may call us). */
static void hand_back(uint8_t *buf, size_t size, size_t valid)
{
    if (buf)
        complete(NULL, 0, buf, size, valid);
}

static void observe(const struct fakecuda_memop *op)
{
    pthread_mutex_lock(&lock);
    if (!enabled) {
        pthread_mutex_unlock(&lock);
        return;
    }
    uint8_t *full = NULL;
    size_t full_size = 0, full_used = 0;
    uint32_t correlation = next_correlation;
    if (buffer && used + sizeof(CUpti_ActivityMemory4) > buffer_size) {
        full = buffer;
        full_size = buffer_size;
        full_used = used;
        buffer = NULL;
    }
    if (!buffer) {
        size_t max_records = 0;
        request(&buffer, &buffer_size, &max_records);
        used = 0;
    }
    if (buffer && used + sizeof(CUpti_ActivityMemory4) <= buffer_size) {
        CUpti_ActivityMemory4 *m = (CUpti_ActivityMemory4 *)(buffer + used);
        memset(m, 0, sizeof(*m));
        m->kind = CUPTI_ACTIVITY_KIND_MEMORY2;
        m->memoryOperationType = op->release ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE
                                             : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
        m->memoryKind = op->kind == FAKECUDA_MEM_HOST      ? CUPTI_ACTIVITY_MEMORY_KIND_PINNED
                        : op->kind == FAKECUDA_MEM_MANAGED ? CUPTI_ACTIVITY_MEMORY_KIND_MANAGED
                                                           : CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
        m->correlationId = next_correlation++;
        m->address = op->ptr;
        m->bytes = op->bytes;
        m->processId = (uint32_t)getpid();
        m->deviceId = op->device < 0 ? 0 : (uint32_t)op->device;
        m->streamId = op->kind == FAKECUDA_MEM_ASYNC ? 7 : CUPTI_INVALID_STREAM_ID;
        m->isAsync = op->kind == FAKECUDA_MEM_ASYNC;
        if (op->kind == FAKECUDA_MEM_ASYNC) {
            m->memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
            m->memoryPoolConfig.address = op->pool;
        }
        used += sizeof(*m);
    }
    pthread_mutex_unlock(&lock);
    call_back(op->api, correlation);
    hand_back(full, full_size, full_used);
}

EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
    if (kind != CUPTI_ACTIVITY_KIND_MEMORY2)
        return CUPTI_ERROR_NOT_COMPATIBLE;
    if (!request)
        return CUPTI_ERROR_INVALID_OPERATION;
    /* the fake driver is already loaded: its observer hook is how the "driver" reports */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set)(fakecuda_memop_fn) = NULL;
    if (drv)
        *(void **)&set = dlsym(drv, "fakecuda_set_memory_observer");
    if (!set)
        return CUPTI_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    enabled = true;
    pthread_mutex_unlock(&lock);
    set(observe);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
{
    check_alive("cuptiActivityDisable");
    (void)kind;
    pthread_mutex_lock(&lock);
    enabled = false;
    pthread_mutex_unlock(&lock);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    check_alive("cuptiActivityFlushAll");
    (void)flag;
    pthread_mutex_lock(&lock);
    uint8_t *buf = buffer;
    size_t size = buffer_size, valid = used;
    buffer = NULL;
    used = 0;
    pthread_mutex_unlock(&lock);
    hand_back(buf, size, valid);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushPeriod(uint32_t ms)
{
    (void)ms; /* records are handed back when a buffer fills or at a flush */
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec)
{
    uint8_t *next = *rec ? (uint8_t *)*rec + sizeof(CUpti_ActivityMemory4) : buf;
    if (next + sizeof(CUpti_ActivityMemory4) > buf + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *rec = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream,
                                                     size_t *dropped)
{
    (void)ctx;
    (void)stream;
    *dropped = 0;
    return CUPTI_SUCCESS;
}
