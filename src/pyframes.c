/* SPDX-License-Identifier: MIT */
/* Python frame capture (see pyframes.h). */
#include "pyframes.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "driver.h"

typedef void PyObject;
typedef int (*int_void_fn)(void);
typedef void *(*ptr_void_fn)(void);
typedef PyObject *(*obj_obj_fn)(PyObject *);
typedef int (*int_obj_fn)(PyObject *);
typedef void (*void_obj_fn)(PyObject *);
typedef PyObject *(*getattr_fn)(PyObject *, const char *);
typedef const char *(*utf8_fn)(PyObject *);

static struct {
    int_void_fn Py_IsInitialized;
    int_void_fn PyGILState_Check;
    ptr_void_fn PyGILState_GetThisThreadState;
    obj_obj_fn PyThreadState_GetFrame;
    obj_obj_fn PyFrame_GetCode;
    obj_obj_fn PyFrame_GetBack;
    int_obj_fn PyFrame_GetLineNumber;
    void_obj_fn Py_IncRef;
    void_obj_fn Py_DecRef;
    getattr_fn PyObject_GetAttrString;
    utf8_fn PyUnicode_AsUTF8;
    void (*PyErr_Clear)(void);
} py;

static bool py_ok;
static pthread_once_t py_once = PTHREAD_ONCE_INIT;

#define NR_CODE_SLOTS (1u << 16)
#define NR_MAX_CODES (NR_CODE_SLOTS / 2)
#define STRINGS_BYTES (8u << 20)

struct code_slot {
    PyObject *code;
    uint32_t id;
};

struct code_info {
    uint32_t file;     /* offset into strings */
    uint32_t function; /* offset into strings */
};

static struct code_slot *code_slots;
static struct code_info *code_infos;
static char *strings;
static uint32_t strings_used;
static _Atomic uint32_t nr_codes; /* published count: infos[0..nr_codes) are complete */
static atomic_flag table_lock = ATOMIC_FLAG_INIT; /* for free-threaded builds; uncontended under a GIL */

static void init(void)
{
    cuheap_dlsym_fn sym = cuheap_real_dlsym();
#define R(name) *(void **)&py.name = sym(RTLD_DEFAULT, #name)
    R(Py_IsInitialized);
    R(PyGILState_Check);
    R(PyGILState_GetThisThreadState);
    R(PyThreadState_GetFrame);
    R(PyFrame_GetCode);
    R(PyFrame_GetBack);
    R(PyFrame_GetLineNumber);
    R(Py_IncRef);
    R(Py_DecRef);
    R(PyObject_GetAttrString);
    R(PyUnicode_AsUTF8);
    R(PyErr_Clear);
#undef R
    void **fields = (void **)&py;
    for (size_t i = 0; i < sizeof(py) / sizeof(void *); i++)
        if (!fields[i])
            return;
    size_t bytes = NR_CODE_SLOTS * sizeof(struct code_slot) + NR_MAX_CODES * sizeof(struct code_info) +
                   STRINGS_BYTES;
    char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        return;
    code_slots = (struct code_slot *)m;
    code_infos = (struct code_info *)(m + NR_CODE_SLOTS * sizeof(struct code_slot));
    strings = (char *)(code_infos + NR_MAX_CODES);
    memcpy(strings, "?", 2);
    strings_used = 2;
    py_ok = true;
}

bool cuheap_py_init(void)
{
    pthread_once(&py_once, init);
    return py_ok;
}

static uint32_t store_string(const char *s)
{
    if (!s)
        return 0;
    size_t n = strlen(s) + 1;
    if (n > 4096 || strings_used + n > STRINGS_BYTES)
        return 0; /* "?" */
    uint32_t off = strings_used;
    memcpy(strings + off, s, n);
    strings_used += (uint32_t)n;
    return off;
}

static uint32_t code_string(PyObject *code, const char *attr, const char *fallback)
{
    PyObject *o = py.PyObject_GetAttrString(code, attr);
    if (!o && fallback) {
        py.PyErr_Clear();
        o = py.PyObject_GetAttrString(code, fallback);
    }
    if (!o) {
        py.PyErr_Clear();
        return 0;
    }
    const char *s = py.PyUnicode_AsUTF8(o);
    if (!s)
        py.PyErr_Clear();
    uint32_t off = store_string(s);
    py.Py_DecRef(o);
    return off;
}

/* Intern a code object; consumes the caller's reference. Returns its id + 1, or 0 when the
 * table is full. */
static uint32_t intern_code(PyObject *code)
{
    uint64_t h = (uint64_t)(uintptr_t)code * 0x9e3779b97f4a7c15ull;
    uint32_t i = (uint32_t)(h >> 48) & (NR_CODE_SLOTS - 1);
    while (atomic_flag_test_and_set_explicit(&table_lock, memory_order_acquire))
        ;
    for (;; i = (i + 1) & (NR_CODE_SLOTS - 1)) {
        if (code_slots[i].code == code) {
            uint32_t id = code_slots[i].id;
            atomic_flag_clear_explicit(&table_lock, memory_order_release);
            py.Py_DecRef(code);
            return id + 1;
        }
        if (!code_slots[i].code)
            break;
    }
    uint32_t id = atomic_load_explicit(&nr_codes, memory_order_relaxed);
    if (id >= NR_MAX_CODES) {
        atomic_flag_clear_explicit(&table_lock, memory_order_release);
        py.Py_DecRef(code);
        return 0;
    }
    code_infos[id].file = code_string(code, "co_filename", NULL);
    code_infos[id].function = code_string(code, "co_qualname", "co_name");
    code_slots[i].code = code; /* keeps the reference: the id must not be reused */
    code_slots[i].id = id;
    atomic_store_explicit(&nr_codes, id + 1, memory_order_release);
    atomic_flag_clear_explicit(&table_lock, memory_order_release);
    return id + 1;
}

unsigned cuheap_py_capture(struct cuheap_py_frame *out, unsigned max)
{
    if (!py_ok || !max || !py.Py_IsInitialized() || !py.PyGILState_Check())
        return 0;
    void *ts = py.PyGILState_GetThisThreadState();
    if (!ts)
        return 0;
    PyObject *f = py.PyThreadState_GetFrame(ts);
    unsigned n = 0;
    while (f && n < max) {
        PyObject *code = py.PyFrame_GetCode(f);
        int line = py.PyFrame_GetLineNumber(f);
        uint32_t id = code ? intern_code(code) : 0;
        if (id) {
            out[n].code = id - 1;
            out[n].line = line > 0 ? (uint32_t)line : 0;
            n++;
        }
        PyObject *back = py.PyFrame_GetBack(f);
        py.Py_DecRef(f);
        f = back;
    }
    if (f)
        py.Py_DecRef(f);
    return n;
}

uint32_t cuheap_py_nr_codes(void)
{
    return atomic_load_explicit(&nr_codes, memory_order_acquire);
}

bool cuheap_py_code(uint32_t id, const char **ret_file, const char **ret_function)
{
    if (id >= cuheap_py_nr_codes())
        return false;
    *ret_file = strings + code_infos[id].file;
    *ret_function = strings + code_infos[id].function;
    return true;
}
