/* SPDX-License-Identifier: MIT */
/*
 * Offline symbolization for the tool: native frames the recorder could only name by
 * module + offset (static functions, stripped dynamic symbols) get a function name and,
 * where debug information exists, file and line, read with elfutils' libdwfl from the
 * modules on this machine; functions inlined at a frame's address become frames of their own
 * ("inlined": true), each at its line. Frames whose module is missing here keep what the
 * trace has.
 */
#ifndef CUHEAP_SYMBOLIZE_H
#define CUHEAP_SYMBOLIZE_H

#include "tracereader.h"

/* Add "function", "file" and "line" to the native frames of every stack in t. */
void symbolize_trace(struct cuheap_trace *t);
/* The same for one stack (a followed trace's new ones). */
void symbolize_stack(struct cuheap_trace_stack *s);

#endif
