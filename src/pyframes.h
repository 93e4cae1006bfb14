/* SPDX-License-Identifier: MIT */
/*
 * Python frames for events, without taking the GIL and without changes to the script.
 *
 * Only a thread that already holds the GIL runs Python code, so the hook looks at the
 * interpreter only when PyGILState_Check() says this thread holds it; then it walks the
 * frames through the stable C API (PyThreadState_GetFrame, PyFrame_GetCode/GetBack/
 * GetLineNumber, CPython 3.9 and later). A thread without the GIL (an autograd worker) gets
 * no Python frames, which is the truth: it runs no Python code.
 *
 * Code objects are interned into a table the writer thread reads: id -> file, function,
 * first line. Interned code objects are kept alive (one reference each) so ids stay valid.
 */
#ifndef CUHEAP_PYFRAMES_H
#define CUHEAP_PYFRAMES_H

#include <stdbool.h>
#include <stdint.h>

#include "event.h"

/* Resolve the interpreter's entry points from the process (once). Returns true when this
 * process has a Python interpreter cuheap can read. */
bool cuheap_py_init(void);

/* Capture up to max frames of the calling thread, innermost first. Returns 0 when the
 * thread does not hold the GIL or Python is absent. */
unsigned cuheap_py_capture(struct cuheap_py_frame *out, unsigned max);

/* The same, and *ret_same: whether the frames are those of this thread's previous capture (the
 * same code at the same instruction at every depth: read once per change of frame). */
unsigned cuheap_py_capture_same(struct cuheap_py_frame *out, unsigned max, bool *ret_same);

/* Turn the per-thread memo of frames on (the default) or off (CUHEAP_STACK_CACHE=0: every
 * frame looked up in the shared tables). The frames captured are the same either way. */
void cuheap_py_set_memo(bool on);

/* In a child after fork: drop locks another thread of the parent may have held. */
void cuheap_py_atfork_child(void);

/* For the writer: number of interned code objects, and what one of them is. */
uint32_t cuheap_py_nr_codes(void);
bool cuheap_py_code(uint32_t id, const char **ret_file, const char **ret_function);

#endif
