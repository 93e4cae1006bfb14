/* SPDX-License-Identifier: MIT */
/* Offline symbolization (see symbolize.h). Without libdw at build time it does nothing. */
#include "symbolize.h"

#include <stdlib.h>
#include <string.h>

#ifdef CUHEAP_HAVE_CXXABI
/* The C++ runtime's demangler: readable C++ names. */
char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);
#endif

/* Replace a mangled C++ "function" with its readable form. */
static void demangle_frame(json_t *fr)
{
#ifndef CUHEAP_HAVE_CXXABI
    (void)fr;
#else
    const char *name = json_string_value(json_object_get(fr, "function"));
    if (!name || strncmp(name, "_Z", 2))
        return;
    int status = -1;
    char *pretty = __cxa_demangle(name, NULL, NULL, &status);
    if (status == 0 && pretty)
        json_object_set_new(fr, "function", json_string(pretty));
    free(pretty);
#endif
}

#ifdef CUHEAP_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

struct module {
    char *path;
    Dwfl *dwfl;
    Dwfl_Module *mod;
    uint64_t to_address; /* add to a recorded offset to get a module address */
};

static struct module *modules;
static size_t nr_modules;

static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
};

static struct module *module_for(const char *path)
{
    for (size_t i = 0; i < nr_modules; i++)
        if (!strcmp(modules[i].path, path))
            return &modules[i];
    modules = realloc(modules, (nr_modules + 1) * sizeof(*modules));
    struct module *m = &modules[nr_modules++];
    memset(m, 0, sizeof(*m));
    m->path = strdup(path);
    m->dwfl = dwfl_begin(&callbacks);
    if (!m->dwfl)
        return m;
    /* A trace names any path it likes: open only regular files (a FIFO would block the tool
     * for ever, a device could be read without end). O_NONBLOCK makes the open itself return
     * at once; libdwfl takes the descriptor we checked, so nothing is swapped in between. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return m;
    }
    /* one module per session, so it sits at its own link addresses; on success the
     * descriptor belongs to libdwfl */
    m->mod = dwfl_report_offline(m->dwfl, path, path, fd);
    dwfl_report_end(m->dwfl, NULL, NULL);
    if (!m->mod)
        return m;
    Dwarf_Addr bias = 0;
    Elf *elf = dwfl_module_getelf(m->mod, &bias);
    size_t nr_phdr = 0;
    uint64_t low = UINT64_MAX;
    if (elf && elf_getphdrnum(elf, &nr_phdr) == 0)
        for (size_t i = 0; i < nr_phdr; i++) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD && ph.p_vaddr < low)
                low = ph.p_vaddr & ~(uint64_t)0xfff;
        }
    /* the recorder's offset is from the load base, which is the first segment's page */
    m->to_address = (low == UINT64_MAX ? 0 : low) + bias;
    return m;
}

/* Whether a function with debug information covers addr. Without it, the nearest line of the
 * compilation unit belongs to some other function: _start (no debug information, placed
 * right after main) would read as a line in main's error path. */
static bool in_described_function(Dwfl_Module *mod, Dwarf_Addr addr)
{
    Dwarf_Addr bias = 0;
    Dwarf_Die *cu = dwfl_module_addrdie(mod, addr, &bias);
    if (!cu)
        return false;
    Dwarf_Die *scopes = NULL;
    int n = dwarf_getscopes(cu, addr - bias, &scopes);
    bool found = false;
    for (int i = 0; i < n && !found; i++) {
        int tag = dwarf_tag(&scopes[i]);
        found = tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine;
    }
    free(scopes);
    return found;
}

/* The name of a subprogram or inlined subroutine (through its abstract origin). */
static const char *scope_name(Dwarf_Die *die)
{
    Dwarf_Attribute attr;
    const char *name = NULL;
    if (dwarf_attr_integrate(die, DW_AT_name, &attr))
        name = dwarf_formstring(&attr);
    return name;
}

/* Symbolize one recorded frame into out: first a frame for each function inlined at that
 * address (innermost first, each at its line, marked "inlined"), then the frame itself, at
 * the line where the outermost inlined call sits in it. */
static void symbolize_frame(json_t *fr, json_t *out)
{
    const char *path = json_string_value(json_object_get(fr, "module"));
    const char *off = json_string_value(json_object_get(fr, "offset"));
    struct module *m = path && off && path[0] == '/' ? module_for(path) : NULL;
    if (!m || !m->mod) {
        json_array_append(out, fr);
        return;
    }
    /* Every recorded frame is a return address (the walk starts inside cuheap, whose own
     * frames are left out, so not even the innermost kept frame is an exact PC): the call
     * is the byte before it, and its line is the caller's. */
    Dwarf_Addr addr = strtoull(off, NULL, 16) + m->to_address - 1;
    if (!json_object_get(fr, "function")) {
        const char *name = dwfl_module_addrname(m->mod, addr);
        if (name)
            json_object_set_new(fr, "function", json_string(name));
    }
    Dwfl_Line *line = in_described_function(m->mod, addr) ? dwfl_module_getsrc(m->mod, addr) : NULL;
    int lineno = 0;
    const char *file = line ? dwfl_lineinfo(line, NULL, &lineno, NULL, NULL, NULL) : NULL;
    if (!file || lineno <= 0) {
        json_array_append(out, fr);
        return;
    }
    Dwarf_Addr bias = 0;
    Dwarf_Die *cu = dwfl_module_addrdie(m->mod, addr, &bias);
    Dwarf_Die *scopes = NULL;
    int n = cu ? dwarf_getscopes(cu, addr - bias, &scopes) : 0;
    Dwarf_Files *files = NULL;
    size_t nr_files = 0;
    if (n > 0 && dwarf_getsrcfiles(cu, &files, &nr_files))
        files = NULL;
    for (int i = 0; i < n && files; i++) {
        int tag = dwarf_tag(&scopes[i]);
        if (tag == DW_TAG_subprogram)
            break;
        if (tag != DW_TAG_inlined_subroutine)
            continue;
        const char *name = scope_name(&scopes[i]);
        json_array_append_new(out, json_pack("{s:s, s:s, s:s, s:s, s:i, s:b}", "module", path,
                                             "offset", off, "function", name ? name : "??", "file",
                                             file, "line", lineno, "inlined", 1));
        /* the next frame out is where this one was inlined */
        Dwarf_Attribute attr;
        Dwarf_Word v;
        const char *call_file = NULL;
        if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &v) == 0 &&
            v < nr_files)
            call_file = dwarf_filesrc(files, v, NULL, NULL);
        if (call_file)
            file = call_file;
        if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attr), &v) == 0)
            lineno = (int)v;
    }
    free(scopes);
    json_object_set_new(fr, "file", json_string(file));
    json_object_set_new(fr, "line", json_integer(lineno));
    json_array_append(out, fr);
}

#else

static void symbolize_frame(json_t *fr, json_t *out)
{
    json_array_append(out, fr);
}

#endif

void symbolize_stack(struct cuheap_trace_stack *s)
{
    size_t n = json_array_size(s->frames);
    json_t *out = json_array();
    if (!out)
        return;
    for (size_t k = 0; k < n; k++)
        symbolize_frame(json_array_get(s->frames, k), out);
    for (size_t k = 0; k < json_array_size(out); k++)
        demangle_frame(json_array_get(out, k));
    json_decref(s->frames);
    s->frames = out;
}

void symbolize_trace(struct cuheap_trace *t)
{
    for (size_t i = 0; i < t->nr_stacks; i++)
        symbolize_stack(&t->stacks[i]);
}
