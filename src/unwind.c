/* SPDX-License-Identifier: MIT */
/* Stack capture (see unwind.h). */
#include "unwind.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

typedef int (*unw_backtrace_fn)(void **buffer, int size);

static unw_backtrace_fn unw_backtrace_ptr;
static enum cuheap_unwinder kind = CUHEAP_UNWIND_NONE;
static uintptr_t self_start, self_end; /* our executable segment, to skip our frames */

static int find_self(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t fbase = (uintptr_t)arg;
    if (info->dlpi_addr != fbase)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            self_start = info->dlpi_addr + ph->p_vaddr;
            self_end = self_start + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

/* TSan tears a thread down before libunwind's per-thread destructor runs and then faults in
 * it: under TSan, glibc's unwinder does the job. */
#if defined(__SANITIZE_THREAD__)
#define CUHEAP_TRY_LIBUNWIND 0
#else
#define CUHEAP_TRY_LIBUNWIND 1
#endif

enum cuheap_unwinder cuheap_unwind_init(void)
{
    Dl_info self;
    if (dladdr(&self_start, &self)) { /* any address inside this library */
        dl_iterate_phdr(find_self, self.dli_fbase);
        if (self.dli_fname && CUHEAP_TRY_LIBUNWIND) {
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "%s", self.dli_fname);
            char *slash = strrchr(path, '/');
            if (slash) {
                snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "libunwind.so.8");
                void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                if (h)
                    *(void **)&unw_backtrace_ptr = cuheap_real_dlsym()(h, "unw_backtrace");
            }
        }
    }
    if (!unw_backtrace_ptr && CUHEAP_TRY_LIBUNWIND) {
        void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
        if (h)
            *(void **)&unw_backtrace_ptr = cuheap_real_dlsym()(h, "unw_backtrace");
    }
    void *warm[4];
    if (unw_backtrace_ptr) {
        unw_backtrace_ptr(warm, 4); /* first call fills libunwind's caches */
        kind = CUHEAP_UNWIND_LIBUNWIND;
    } else {
        backtrace(warm, 4); /* first call dlopens libgcc_s: do it here, not in a hook */
        kind = CUHEAP_UNWIND_GLIBC;
    }
    return kind;
}

/* Room for cuheap's own frames in a full walk. */
#define NR_SKIP_ROOM 16

static _Atomic bool use_cache = true; /* set at start-up (and by tests) while walks may run */
static _Atomic uint64_t nr_rewalks;
/* cuheap frames skipped by this thread's previous capture, plus one; 0: none yet */
static __thread uint8_t tls_skip __attribute__((tls_model("initial-exec")));

/* Ask the unwinder for up to want return addresses; returns how many it gave, and in
 * *ret_skip how many of them (from the innermost) are cuheap's own. */
__attribute__((noinline)) static int walk(void **buf, int want, int *ret_skip)
{
    int n = 0;
    if (kind == CUHEAP_UNWIND_LIBUNWIND)
        n = unw_backtrace_ptr(buf, want);
    else if (kind == CUHEAP_UNWIND_GLIBC)
        n = backtrace(buf, want);
    int skip = 0;
    while (skip < n && (uintptr_t)buf[skip] >= self_start && (uintptr_t)buf[skip] < self_end)
        skip++;
    *ret_skip = skip;
    return n;
}

static unsigned copy_out(void *const *buf, int n, int skip, uint64_t *out, unsigned max)
{
    unsigned nr = 0;
    for (int i = skip; i < n && nr < max; i++)
        out[nr++] = (uint64_t)(uintptr_t)buf[i];
    return nr;
}

/* Inlined into both entry points, so the full walk sees as many cuheap frames from either. */
__attribute__((always_inline)) static inline unsigned full_walk(uint64_t *out, unsigned max)
{
    void *buf[CUHEAP_MAX_STACK_DEPTH + NR_SKIP_ROOM];
    int want = (int)max + NR_SKIP_ROOM, skip;
    if (want > (int)(sizeof(buf) / sizeof(buf[0])))
        want = (int)(sizeof(buf) / sizeof(buf[0]));
    int n = walk(buf, want, &skip);
    if (skip < n && skip < 255)
        tls_skip = (uint8_t)(skip + 1);
    return copy_out(buf, n, skip, out, max);
}

__attribute__((noinline)) unsigned cuheap_unwind_capture_full(uint64_t *out, unsigned max)
{
    return full_walk(out, max);
}

/* The short walk is a prefix of the full one (same thread, same stack). Its result is the
 * full walk's when it found a frame that is not cuheap's (so the skip count is the full
 * walk's) and either the stack ended inside it or max frames follow the skipped ones (the
 * full walk keeps no more than max). Anything else: walk in full. */
__attribute__((noinline)) unsigned cuheap_unwind_capture(uint64_t *out, unsigned max)
{
    if (!atomic_load_explicit(&use_cache, memory_order_relaxed) || !tls_skip ||
        max > CUHEAP_MAX_STACK_DEPTH)
        return full_walk(out, max);
    void *buf[CUHEAP_MAX_STACK_DEPTH + NR_SKIP_ROOM];
    int guess = tls_skip - 1;
    if (guess > NR_SKIP_ROOM)
        guess = NR_SKIP_ROOM;
    int want = (int)max + guess, skip;
    int n = walk(buf, want, &skip);
    if (skip < n && (n < want || n - skip >= (int)max)) {
        tls_skip = (uint8_t)(skip + 1);
        return copy_out(buf, n, skip, out, max);
    }
    atomic_fetch_add_explicit(&nr_rewalks, 1, memory_order_relaxed);
    return full_walk(out, max);
}

void cuheap_unwind_set_cache(bool on)
{
    atomic_store_explicit(&use_cache, on, memory_order_relaxed);
}

uint64_t cuheap_unwind_nr_rewalks(void)
{
    return atomic_load_explicit(&nr_rewalks, memory_order_relaxed);
}

const char *cuheap_unwinder_name(enum cuheap_unwinder u)
{
    switch (u) {
    case CUHEAP_UNWIND_LIBUNWIND:
        return "libunwind";
    case CUHEAP_UNWIND_GLIBC:
        return "glibc";
    default:
        return "none";
    }
}
