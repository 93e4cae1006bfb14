/* SPDX-License-Identifier: MIT */
/*
 * Resolving the real driver (see driver.h). The driver is opened with RTLD_NOLOAD first: a
 * program that reaches a hook has normally loaded it already; only a program that links
 * -lcuda and calls a hook before anything else could need the second, plain dlopen.
 */
#include "driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

struct cuheap_driver cuheap_drv;

static _Atomic(cuheap_dlsym_fn) real_dlsym_ptr;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_result = -ENOENT;

/* Not instrumented: sanitizer runtimes reach it through our dlsym during their own start-up. */
__attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize("undefined"))) cuheap_dlsym_fn
cuheap_real_dlsym(void)
{
    cuheap_dlsym_fn f = atomic_load_explicit(&real_dlsym_ptr, memory_order_acquire);
    if (f)
        return f;
    /* glibc 2.34 moved dlsym into libc with a new version; older ones have GLIBC_2.2.5. */
    void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    memcpy(&f, &p, sizeof(f)); /* POSIX guarantees the object/function pointer round trip */
    atomic_store_explicit(&real_dlsym_ptr, f, memory_order_release);
    return f;
}

static void load(void)
{
    cuheap_dlsym_fn sym = cuheap_real_dlsym();
    if (!sym)
        return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    cuheap_drv.real_dlsym = sym;
#define CUHEAP_DRIVER_RESOLVE(name, params) *(void **)&cuheap_drv.name = sym(h, #name);
    CUHEAP_DRIVER_FUNCS(CUHEAP_DRIVER_RESOLVE)
#undef CUHEAP_DRIVER_RESOLVE
    cuheap_drv.handle = h;
    load_result = 0;
}

int cuheap_driver_load(void)
{
    pthread_once(&load_once, load);
    return load_result;
}
