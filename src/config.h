/* SPDX-License-Identifier: MIT */
/*
 * Settings, from CUHEAP_* environment variables, through one option table (config.c) that
 * also holds each option's default and the text the README documents. Parsing is pure: the
 * caller passes how to read a variable and where warnings go, so tests drive it directly.
 */
#ifndef CUHEAP_CONFIG_H
#define CUHEAP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cuheap_reuse {
    CUHEAP_REUSE_FENCE,     /* freed blocks wait for a device-wide fence (default) */
    CUHEAP_REUSE_SYNC,      /* every free waits for the device, like the driver's */
    CUHEAP_REUSE_IMMEDIATE, /* reuse at once: single-stream programs only */
};

enum cuheap_release {
    CUHEAP_RELEASE_OOM,   /* give empty arenas back only when the driver runs out (default) */
    CUHEAP_RELEASE_EMPTY, /* give an arena back as soon as it is empty */
    CUHEAP_RELEASE_NEVER, /* keep every arena until exit */
};

enum cuheap_backing {
    CUHEAP_BACKING_LEGACY, /* arenas from cuMemAlloc: a block's rounding costs device memory */
    CUHEAP_BACKING_VMM,    /* address space from cuMemAddressReserve, 2 MiB physical granules
                              mapped only under blocks in use (cuMemCreate/cuMemMap) */
};

enum cuheap_vmm_layout {
    CUHEAP_VMM_TIGHT,   /* physical memory only under the bytes blocks use (default) */
    CUHEAP_VMM_ALIGNED, /* in whole CUHEAP_VMM_CHUNK pieces at addresses aligned to their size:
                           fewer driver calls, a few percent more memory */
};

enum cuheap_vmm_placement {
    CUHEAP_PLACE_SCORED, /* the buddy allocator, scored by the memory mapped where a block would
                            go: blocks are powers of two (default) */
    CUHEAP_PLACE_FIRST,  /* first fit by address (fit.c): blocks over a thread cache's largest
                            exact to CUHEAP_MIN_BLOCK, at the lowest address that holds them */
};

enum cuheap_format {
    CUHEAP_FORMAT_JSONL,  /* JSON Lines, the cuheap trace format (default) */
    CUHEAP_FORMAT_CHROME, /* Chrome Trace Event JSON for Perfetto */
};

#define CUHEAP_MAX_STACK_DEPTH 64
/* Native frames per event in a Python process unless CUHEAP_STACK_DEPTH says otherwise: the
 * Python frames carry the program's context, and deep native walks through an interpreter and
 * a framework cost microseconds (measured: about 9 us an event at 32 frames in PyTorch). */
#define CUHEAP_PYTHON_STACK_DEPTH 12
#define CUHEAP_PATH_MAX           512

struct cuheap_config {
    bool pool;           /* serve cuMemAlloc from the pool */
    uint64_t pool_init;  /* bytes reserved per device at first use */
    uint64_t arena_size; /* bytes per arena, power of two */
    uint64_t min_block;  /* smallest block, power of two */
    uint64_t pool_max;   /* largest request served from the pool */
    enum cuheap_release release;
    enum cuheap_reuse reuse;
    enum cuheap_backing backing;
    uint64_t vmm_chunk;   /* vmm: most bytes mapped as one piece (rounded to granules) */
    uint64_t vmm_cushion; /* vmm: idle bytes kept beyond the most blocks used at once */
    enum cuheap_vmm_layout vmm_layout;       /* vmm: where chunks start and end */
    enum cuheap_vmm_placement vmm_placement; /* vmm: where a block goes in an arena */
    unsigned vmm_idle_fit;        /* vmm, tight: largest idle chunk a block goes into, in percent of
                                     the granules it needs */
    uint64_t thread_cache;        /* per thread and pool: bytes of ready blocks held lock-free */
    unsigned fence_batch;         /* frees per fence epoch */
    bool idle_check;              /* fence: freed blocks back at once while every stream is idle */
    uint64_t limit_bytes;         /* per-device limit in bytes, 0 = none */
    unsigned limit_permille;      /* per-device limit as a share of the device, 0 = none */
    bool record;                  /* record events at all */
    unsigned stack_depth;         /* native frames per event, 0 = no stacks */
    bool stack_depth_set;         /* CUHEAP_STACK_DEPTH was given (else Python processes get
                                     CUHEAP_PYTHON_STACK_DEPTH) */
    bool python;                  /* add Python frames when the thread holds the GIL */
    bool stack_cache;             /* per-thread shortcuts when capturing stacks (same stacks) */
    bool record_timing;           /* time the recorder's parts, print them in the summary */
    unsigned ring_slots;          /* ring capacity, power of two */
    char output[CUHEAP_PATH_MAX]; /* trace path template (%p pid, %r rank, %h host) */
    unsigned output_mode;         /* permission bits the trace is created with (umask applies) */
    enum cuheap_format format;
    bool summary;      /* print the exit summary on stderr */
    bool verbose;      /* print the effective settings at start */
    unsigned flush_ms; /* trace flush interval */
    bool audit;        /* compare the driver's memory operations (CUPTI) with what hooks saw */
    char audit_cupti[CUHEAP_PATH_MAX]; /* the libcupti.so to use; "" = search for one */
};

/* How to read one variable (NULL when unset) and where to put a warning line. */
typedef const char *(*cuheap_getenv_fn)(const char *name, void *arg);
typedef void (*cuheap_warn_fn)(const char *line, void *arg);

/* Fill *cfg with defaults, then apply every variable get() returns. A bad value produces one
 * warning line naming the variable, the value (escaped, long ones cut where marked) and what
 * is wrong with it, and the default is kept. Returns the number of warnings. */
int cuheap_config_parse(struct cuheap_config *cfg, cuheap_getenv_fn get, cuheap_warn_fn warn,
                        void *arg);

/* Write "NAME=value" lines of the effective settings through warn (for CUHEAP_VERBOSE). */
void cuheap_config_dump(const struct cuheap_config *cfg, cuheap_warn_fn emit, void *arg);

/* Parse a size: a whole number of bytes, with K, M, G or T ("512", "64K", "2GiB"), or, with
 * allow_percent, a percentage of at most one decimal ("80%", "12.5%"), which sets
 * *ret_permille instead. Nothing else: no fractions of bytes, hex, signs, blanks or trailing
 * text. Returns 0 or -EINVAL (the outputs untouched). Exposed for the tool's command line. */
int cuheap_parse_size(const char *s, bool allow_percent, uint64_t *ret_bytes,
                      unsigned *ret_permille);

/* "12.34 MiB": bytes for people (powers of 1024). Returns buf. */
const char *cuheap_format_size(uint64_t bytes, char *buf, size_t size);

/* Expand %p (pid), %r (rank or 0), %h (host name) and %% in a path template. Returns 0, or
 * -ENAMETOOLONG with out empty when the name does not fit in size bytes (never cut short). */
int cuheap_expand_path(const char *tmpl, char *out, size_t size, long pid, const char *rank,
                       const char *host);

/* "legacy" or "vmm". */
const char *cuheap_backing_name(enum cuheap_backing b);

/* "fence", "sync" or "immediate". */
const char *cuheap_reuse_name(enum cuheap_reuse r);

#endif
