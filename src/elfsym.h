/* SPDX-License-Identifier: MIT */
/*
 * Function names from an ELF file's own symbol table (.symtab, else .dynsym), for the frames
 * dladdr cannot name: static functions, and programs not linked with -rdynamic. Used when an
 * out-of-memory is told, off the hook's path; it maps the file and may allocate.
 */
#ifndef CUHEAP_ELFSYM_H
#define CUHEAP_ELFSYM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The function of the module at path (loaded at base) holding the address ip into buf; false
 * when the file has no symbol there (stripped, not ELF, unreadable). */
bool cuheap_elfsym_name(const char *path, uint64_t base, uint64_t ip, char *buf, size_t size);

#endif
