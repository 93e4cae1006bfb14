/* SPDX-License-Identifier: MIT */
/*
 * The event record: what a hook captures and the writer turns into a trace line. Fixed size,
 * so it lives directly in a ring slot and the hook never allocates.
 */
#ifndef CUHEAP_EVENT_H
#define CUHEAP_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define CUHEAP_MAX_PY_DEPTH 24
#define CUHEAP_LABEL_MAX    120

enum cuheap_event_type {
    CUHEAP_EV_ALLOC = 1,     /* the program got memory */
    CUHEAP_EV_FREE,          /* the program gave memory back */
    CUHEAP_EV_ARENA_GROW,    /* the pool took an arena from the driver */
    CUHEAP_EV_ARENA_RELEASE, /* the pool gave an arena back */
    CUHEAP_EV_FENCE,         /* a fence completed: freed blocks became reusable */
    CUHEAP_EV_OOM,           /* CUDA_ERROR_OUT_OF_MEMORY went back to the program */
    CUHEAP_EV_LIMIT,         /* a request was refused by CUHEAP_LIMIT */
    CUHEAP_EV_MARK,          /* cuheap_mark() */
    CUHEAP_EV_AUDIT,         /* CUHEAP_AUDIT: a driver operation no hook saw, or the verdict */
    CUHEAP_NR_EVENT_TYPES
};

enum cuheap_api {
    CUHEAP_API_NONE,
    CUHEAP_API_MEM_ALLOC,  /* cuMemAlloc_v2 / cuMemFree_v2 (cudaMalloc/cudaFree) */
    CUHEAP_API_PITCH,      /* cuMemAllocPitch_v2 */
    CUHEAP_API_ASYNC,      /* cuMemAllocAsync / cuMemFreeAsync */
    CUHEAP_API_POOL_ASYNC, /* cuMemAllocFromPoolAsync */
    CUHEAP_API_MANAGED,    /* cuMemAllocManaged */
    CUHEAP_API_HOST,       /* cuMemAllocHost_v2 / cuMemHostAlloc / cuMemFreeHost */
    CUHEAP_API_VMM_CREATE, /* cuMemCreate / cuMemRelease (physical memory) */
    CUHEAP_API_VMM_MAP,    /* cuMemMap / cuMemUnmap (address ranges) */
    CUHEAP_API_TORCH,      /* cuheap_torch_alloc / cuheap_torch_free */
    CUHEAP_NR_APIS
};

enum cuheap_event_flags {
    CUHEAP_EVF_POOLED = 1 << 0,  /* served by / returned to cuheap's pool */
    CUHEAP_EVF_CAPTURE = 1 << 1, /* during stream capture */
    CUHEAP_EVF_SUMMARY = 1 << 2, /* an audit event holding the verdict (else one missed op) */
    /* the stack (native and Python) of this thread's event at ring position stack_ref, whose
     * frames the writer has seen: the frames were not copied into this one */
    CUHEAP_EVF_SAME_STACK = 1 << 3,
};

enum cuheap_unwinder {
    CUHEAP_UNWIND_NONE,
    CUHEAP_UNWIND_LIBUNWIND, /* nongnu libunwind unw_backtrace */
    CUHEAP_UNWIND_GLIBC,     /* glibc backtrace() fallback */
};

struct cuheap_py_frame {
    uint32_t code; /* id in the Python code table (pyframes.h) */
    uint32_t line;
};

struct cuheap_event {
    uint64_t seq;     /* global order of events, taken where the operation took effect */
    uint64_t time_ns; /* a stamp (ticks.h) from the hook; CLOCK_MONOTONIC once the writer has
                         the event */
    uint64_t ptr;     /* address the event is about; OOM/LIMIT: the device's live bytes */
    uint64_t size;    /* bytes requested by the program (arena bytes for arena events) */
    uint64_t actual;  /* bytes reserved for it (block size, rounded driver size); OOM/LIMIT:
                         the bytes cuheap holds on the device */
    uint64_t stream;  /* CUstream where known, else 0; OOM/LIMIT: the pool's largest free
                         piece (CUHEAP_OOM_NO_POOL: no pool) */
    uint64_t aux;     /* OOM/LIMIT: driver free bytes; FENCE: blocks released; AUDIT: the
                         correlation id of a missed operation, or operations audited */
    uint64_t aux2;    /* OOM/LIMIT: driver total bytes or the limit; FENCE: bytes released;
                         AUDIT: identical operations missed, or all operations missed */
    uint32_t tid;     /* kernel thread id */
    int32_t result;   /* CUresult returned, for failures */
    int16_t device;   /* device ordinal, -1 when unknown (host memory) */
    uint8_t type;     /* enum cuheap_event_type */
    uint8_t api;      /* enum cuheap_api */
    uint8_t flags;    /* enum cuheap_event_flags */
    uint8_t unwinder; /* enum cuheap_unwinder */
    uint8_t nr_frames;
    uint8_t nr_py;
    uint64_t stack_ref; /* CUHEAP_EVF_SAME_STACK: ring position of the event it repeats */
    union {
        uint64_t frames[CUHEAP_MAX_STACK_DEPTH]; /* return addresses, innermost first */
        char label[CUHEAP_LABEL_MAX];            /* CUHEAP_EV_MARK, CUHEAP_EV_AUDIT */
    };
    struct cuheap_py_frame py[CUHEAP_MAX_PY_DEPTH]; /* innermost first */
};

/* Names used in traces ("alloc", "free", ...; "cudaMalloc", ...). */
/* The next number of the one sequence all events share (the pool takes it under its lock, so
 * an allocation and the free of its block are numbered in the order they happened). */
uint64_t cuheap_seq_next(void);

const char *cuheap_event_type_name(unsigned type);
const char *cuheap_api_name(unsigned api);
/* Reverse lookups for the trace reader; -1 when unknown. */
int cuheap_event_type_from_name(const char *name);
int cuheap_api_from_name(const char *name);

/* Text from outside (paths, the command line, labels) made valid UTF-8 for the trace, whose
 * JSON library refuses anything else: s is copied to out, which has room for
 * 3 * strlen(s) + 1 bytes, and every byte that does not begin a well-formed sequence becomes
 * U+FFFD. Returns out. */
char *cuheap_utf8_clean(const char *s, char *out);

/* How many of the first `max` bytes of s (at least max long) to keep so the cut does not
 * split a character. */
size_t cuheap_utf8_cut(const char *s, size_t max);

#endif
