/* SPDX-License-Identifier: MIT */
/*
 * The thread's re-entry guard, one for all of cuheap (defined in runtime.c). Set while this
 * thread works inside cuheap: a hook, cuheap_mark, an NVTX callback, the audit's start and
 * stop. A hook reached meanwhile on the same thread (cuheap calling the driver, a signal
 * handler that allocates) finds cuheap_boot() false and goes straight to the driver instead
 * of waiting for a lock this thread holds. Its own header so that subsystems needing only the
 * guard do not include the runtime.
 */
#ifndef CUHEAP_GUARD_H
#define CUHEAP_GUARD_H

extern __thread int cuheap_busy __attribute__((tls_model("initial-exec")));

#endif
