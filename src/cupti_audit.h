/* SPDX-License-Identifier: MIT */
/*
 * CUHEAP_AUDIT: CUPTI, opened at run time, reports the driver's own memory operations
 * (CUPTI_ACTIVITY_KIND_MEMORY2); audit.c matches them against the operations cuheap's hooks
 * recorded, and the exit line says whether every one was seen. When CUPTI cannot be had (not
 * found, or held by another subscriber) one line says so and nothing else changes.
 */
#ifndef CUHEAP_CUPTI_AUDIT_H
#define CUHEAP_CUPTI_AUDIT_H

#include <stdatomic.h>
#include <stdbool.h>

#include "config.h"
#include "recorder.h"

/* Set while the audit runs: cuheap_audit_note() (the recorder's tap, set by the runtime) then
 * matches each event the hooks record. */
extern atomic_bool cuheap_auditing;

/* Open CUPTI and subscribe (at start-up, on the thread that boots cuheap). */
void cuheap_audit_start(const struct cuheap_config *cfg);

/* An event cuheap records: operations that reached the driver are queued for the matcher.
 * Hook path: lock-free, never allocates. */
void cuheap_audit_note(const struct cuheap_rec *r);

/* At exit, before the recorder stops: take CUPTI's last records, match, put the misses and
 * the verdict into the trace and print the verdict. */
void cuheap_audit_stop(void);

/* A forked child: CUPTI's state belongs to the parent; the child does not audit. */
void cuheap_audit_atfork_child(void);

#endif
