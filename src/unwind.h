/* SPDX-License-Identifier: MIT */
/*
 * Stack capture on the hooked thread: return addresses only, everything else later on the
 * writer thread. Uses nongnu libunwind's unw_backtrace (about 12 ns a frame) opened with
 * dlopen(RTLD_LOCAL) so its _Unwind_* never reach the global scope; falls back to glibc's
 * backtrace() when libunwind.so.8 cannot be opened.
 */
#ifndef CUHEAP_UNWIND_H
#define CUHEAP_UNWIND_H

#include <stdint.h>

#include "event.h"

/* Open the unwinder (once). Looks for libunwind.so.8 next to libcuheap.so first, then on the
 * library path. Returns the unwinder that will be used. */
enum cuheap_unwinder cuheap_unwind_init(void);

/* Fill out[] with up to max return addresses, innermost first, cuheap's own frames left
 * out. Returns how many. Safe on the hook path (no malloc after init). */
unsigned cuheap_unwind_capture(uint64_t *out, unsigned max);

/* "libunwind", "glibc" or "none". */
const char *cuheap_unwinder_name(enum cuheap_unwinder u);

#endif
