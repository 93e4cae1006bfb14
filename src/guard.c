/* SPDX-License-Identifier: MIT */
/*
 * The thread's re-entry guard (guard.h): its own file, so that every layer that sets or reads
 * it (the hooks, the runtime, the audit, NVTX) depends on it alone and on nothing above it.
 */
#include "guard.h"

__thread int cuheap_busy __attribute__((tls_model("initial-exec")));
