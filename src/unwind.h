/* SPDX-License-Identifier: MIT */
/*
 * Stack capture on the hooked thread: return addresses only, everything else later on the
 * writer thread. Uses nongnu libunwind's unw_backtrace (tens of ns a frame) opened with
 * dlopen(RTLD_LOCAL) so its _Unwind_* never reach the global scope, and its cursor to fill a
 * per-thread cache of stacks a thread had before (cuheap_unwind_capture_cached); falls back
 * to glibc's backtrace() when libunwind.so.8 cannot be opened.
 */
#ifndef CUHEAP_UNWIND_H
#define CUHEAP_UNWIND_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "event.h"

/* Open the unwinder (once). Looks for libunwind.so.8 next to libcuheap.so first, then on the
 * library path. Returns the unwinder that will be used. */
enum cuheap_unwinder cuheap_unwind_init(void);

/* Fill out[] with up to max return addresses, innermost first, cuheap's own frames left
 * out. Returns how many. Safe on the hook path (no malloc after init).
 *
 * The unwinder costs per frame walked, and a full walk asks it for max + 16 frames (room for
 * cuheap's own, skipped). With the shortcut on (the default), a thread asks for max plus the
 * number of cuheap frames its previous capture skipped: the call path through cuheap is the
 * same from one event to the next, so that walk is usually just long enough. When it is not
 * (fewer than max frames left after skipping, and the stack did not end), the capture walks
 * again in full. Either way out[] holds exactly what cuheap_unwind_capture_full() gives. */
unsigned cuheap_unwind_capture(uint64_t *out, unsigned max);

/* The full walk (max + 16 frames asked for), the reference the shortcut must equal. */
unsigned cuheap_unwind_capture_full(uint64_t *out, unsigned max);

/* The same frames as cuheap_unwind_capture(), through a per-thread cache of the stacks the
 * thread captured lately (unwind.c says why a stack found there is the one a walk would give):
 * a stack seen before costs a comparison of the stack words its walk read. *ret_frames points
 * at the frames: the cache's own (valid until this thread's next capture) or scratch (room
 * for max). When they are the cache's, *ret_tag (else 0) names them among this thread's
 * captures (two captures with the same tag gave the same frames) and *ret_note (else NULL)
 * is a word the caller may keep with them: 0 when they are new to the cache, else what the
 * caller left there; a child after fork finds it 0. Without libunwind's cursor, with the
 * cache off, or for a stack not (yet) cached: a walk into scratch. walk_lock is read-held
 * around a walk (the unwinder's own locks, fork), not around a stack found. */
unsigned cuheap_unwind_capture_cached(uint64_t *scratch, unsigned max, const uint64_t **ret_frames,
                                      uint32_t *ret_tag, uint64_t **ret_note,
                                      pthread_rwlock_t *walk_lock);

/* In a child after fork: the forking thread keeps its cache, its notes cleared. */
void cuheap_unwind_atfork_child(void);

/* Walks made because a stack was not in the thread's cache (all threads). */
uint64_t cuheap_unwind_nr_stack_walks(void);

/* Turn the per-thread shortcut on (the default) or off (CUHEAP_STACK_CACHE=0: every
 * capture walks in full). */
void cuheap_unwind_set_cache(bool on);

/* Captures that walked again in full because the short walk fell short (all threads). */
uint64_t cuheap_unwind_nr_rewalks(void);

/* "libunwind", "glibc" or "none". */
const char *cuheap_unwinder_name(enum cuheap_unwinder u);

#endif
