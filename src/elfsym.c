/* SPDX-License-Identifier: MIT */
/*
 * ELF symbol lookup (elfsym.h). Files are mapped read-only and kept mapped (a few, the most
 * recently used), since an out-of-memory names several frames of the same modules. Every
 * offset read from the file is checked against its size: a truncated or odd file gives no
 * name, never a fault.
 *
 * Not thread-safe: one caller (the recorder's writer thread, io_lock held).
 */
#include "elfsym.h"

#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NR_MAPPED 4

struct mapped {
    char path[512];
    const unsigned char *data; /* NULL: empty slot */
    size_t size;
    unsigned age;
};

static struct mapped mapped[NR_MAPPED];
static unsigned clock_now;

static const struct mapped *map_file(const char *path)
{
    struct mapped *slot = &mapped[0];
    for (unsigned i = 0; i < NR_MAPPED; i++) {
        if (mapped[i].data && !strcmp(mapped[i].path, path)) {
            mapped[i].age = ++clock_now;
            return &mapped[i];
        }
        if (!mapped[i].data || mapped[i].age < slot->age)
            slot = &mapped[i];
    }
    if (strlen(path) >= sizeof(slot->path))
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= (off_t)sizeof(Elf64_Ehdr))
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    if (slot->data)
        munmap((void *)slot->data, slot->size);
    snprintf(slot->path, sizeof(slot->path), "%s", path);
    slot->data = p;
    slot->size = (size_t)st.st_size;
    slot->age = ++clock_now;
    return slot;
}

static bool inside(const struct mapped *m, uint64_t off, uint64_t len)
{
    return off <= m->size && len <= m->size - off;
}

/* The function symbol of one symbol table holding addr. */
static bool lookup(const struct mapped *m, const Elf64_Shdr *sh, const Elf64_Shdr *strtab,
                   uint64_t addr, char *buf, size_t size)
{
    if (sh->sh_entsize != sizeof(Elf64_Sym) || !inside(m, sh->sh_offset, sh->sh_size) ||
        !inside(m, strtab->sh_offset, strtab->sh_size))
        return false;
    const Elf64_Sym *syms = (const Elf64_Sym *)(m->data + sh->sh_offset);
    size_t n = sh->sh_size / sizeof(Elf64_Sym);
    const char *strs = (const char *)(m->data + strtab->sh_offset);
    for (size_t i = 0; i < n; i++) {
        const Elf64_Sym *s = &syms[i];
        if (ELF64_ST_TYPE(s->st_info) != STT_FUNC || !s->st_value || s->st_name >= strtab->sh_size)
            continue;
        if (addr < s->st_value || addr - s->st_value >= (s->st_size ? s->st_size : 1))
            continue;
        const char *name = strs + s->st_name;
        size_t max = strtab->sh_size - s->st_name;
        if (!memchr(name, 0, max) || !*name)
            continue;
        snprintf(buf, size, "%s", name);
        return true;
    }
    return false;
}

bool cuheap_elfsym_name(const char *path, uint64_t base, uint64_t ip, char *buf, size_t size)
{
    const struct mapped *m = map_file(path);
    if (!m)
        return false;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m->data;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(Elf64_Shdr) ||
        !inside(m, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)))
        return false;
    /* a shared object's (or PIE's) symbols are offsets from its base; a fixed executable's are
     * addresses */
    uint64_t addr = eh->e_type == ET_DYN ? ip - base : ip;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(m->data + eh->e_shoff);
    for (int pass = 0; pass < 2; pass++) {
        unsigned want = pass ? SHT_DYNSYM : SHT_SYMTAB;
        for (unsigned i = 0; i < eh->e_shnum; i++)
            if (sh[i].sh_type == want && sh[i].sh_link < eh->e_shnum &&
                lookup(m, &sh[i], &sh[sh[i].sh_link], addr, buf, size))
                return true;
    }
    return false;
}
