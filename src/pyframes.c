/* SPDX-License-Identifier: MIT */
/*
 * Python frame capture (see pyframes.h).
 *
 * Frameworks release the GIL around their C++ work (PyTorch does for every operator), so the
 * allocating thread usually does not hold it when a hook runs. Its Python frames still sit
 * untouched on its thread state while it runs C code, so we read them the way out-of-process
 * profilers do: the thread state from PyGILState_GetThisThreadState() (a thread-local lookup,
 * no GIL), then the frame chain through the structure layout of the running CPython version
 * (3.10 to 3.13, x86-64 and aarch64 alike: all fields are pointers or ints). Nothing is
 * written, no reference counts change, nothing is allocated in the interpreter.
 *
 * Guard rails: each code object must have PyCode_Type as its type and each string
 * PyUnicode_Type, or the walk stops. The first captures read memory through
 * process_vm_readv(), which fails instead of faulting, so a wrong layout is found and
 * turned off without harm; later captures read directly.
 *
 * Code objects are interned by address with their first line as a check (an address can be
 * reused by a new code object after the old one is freed): id -> file, function name.
 */
#include "pyframes.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "driver.h"
#include "log.h"

typedef int (*int_void_fn)(void);
typedef void *(*ptr_void_fn)(void);
typedef const char *(*str_void_fn)(void);
typedef int (*addr2line_fn)(void *code, int byte_offset);

/* Where things are in one CPython version's structures (byte offsets). */
struct py_layout {
    int minor;
    size_t ts_frame; /* tstate -> frame (3.10, 3.13) or -> cframe (3.11, 3.12) */
    bool via_cframe;
    size_t cframe_current; /* cframe -> current_frame */
    size_t frame_code;     /* frame -> code object */
    size_t frame_previous; /* frame -> calling frame */
    size_t frame_instr;    /* frame -> instruction pointer (or int f_lasti for 3.10) */
    bool lasti_is_int;     /* 3.10: int f_lasti in code units */
    ssize_t frame_owner;   /* char owner, -1 when absent */
    int owner_cstack;      /* owner value of C-stack shim frames, -1 when none */
    size_t code_filename;
    size_t code_name; /* co_qualname where it exists */
    size_t code_firstlineno;
    size_t ascii_data; /* sizeof(PyASCIIObject): where compact ASCII text starts */
};

static const struct py_layout layouts[] = {
    {10, 24, false, 0, 32, 24, 96, true, -1, -1, 104, 112, 40, 48},
    {11, 56, true, 8, 32, 48, 56, false, 69, -1, 112, 128, 72, 48},
    {12, 56, true, 0, 0, 8, 56, false, 70, 3, 112, 128, 68, 40},
    {13, 72, false, 0, 0, 8, 56, false, 70, 3, 112, 128, 68, 40},
};

static struct {
    int_void_fn Py_IsInitialized;
    ptr_void_fn PyGILState_GetThisThreadState;
    str_void_fn Py_GetVersion;
    addr2line_fn PyCode_Addr2Line;
    void *PyCode_Type;
    void *PyUnicode_Type;
} py;

static const struct py_layout *layout;
static size_t code_header;     /* PyCode_Type.tp_basicsize: where bytecode starts (3.11+) */
static _Atomic int nr_checked; /* captures read through process_vm_readv so far */
static atomic_bool broken;
static bool py_ok;
static pthread_once_t py_once = PTHREAD_ONCE_INIT;

#define NR_CHECKED_CAPTURES 32
#define NR_CODE_SLOTS       (1u << 16)
#define NR_MAX_CODES        (NR_CODE_SLOTS / 2)
#define STRINGS_BYTES       (8u << 20)
#define NAME_MAX_BYTES      1024

struct code_slot {
    uintptr_t code;
    uint32_t id;
    int firstline;
};

struct code_info {
    uint32_t file;     /* offset into strings */
    uint32_t function; /* offset into strings */
};

/* ---- the per-thread memo ----
 *
 * intern_code() and cached_line() each take a lock shared by all threads and probe a global
 * table: about 50 ns a frame, and a Python stack is 10 to 24 frames on every allocation.
 * The frames a thread allocates from repeat, so each thread keeps a small direct-mapped memo
 * of (code object, first line, instruction offset) -> (code id, line), read and written by
 * that thread alone. Its answers are the tables' own: code ids are never taken back, and a
 * line is a function of the code object and the offset. Memos are claimed from a fixed
 * table mapped at start-up (nothing allocated in a hook); a thread finding none free, even
 * after taking back those of threads that have exited, goes to the shared tables. */
#define NR_THREAD_MEMOS 256
#define NR_MEMO_SLOTS   64

struct memo_slot {
    uintptr_t code; /* 0: empty */
    int32_t offset;
    int32_t firstline;
    struct cuheap_py_frame frame; /* what the tables answered */
};

struct thread_memo {
    _Atomic pid_t owner; /* kernel thread id of the thread using it, 0: free */
    struct memo_slot slot[NR_MEMO_SLOTS];
    /* The thread's last capture, frame by frame: a frame running the same code object at the
     * same instruction as the frame at its depth last time is that frame again (its code and
     * line are a function of the two, as the memo's are), taken without the code object's
     * fields or the memo. nr_last: frames kept last time. */
    unsigned nr_last;
    struct {
        uintptr_t code;
        int32_t offset;
        struct cuheap_py_frame frame;
    } last[CUHEAP_MAX_PY_DEPTH];
};

static struct thread_memo *memos; /* NR_THREAD_MEMOS of them, mapped by init() */
static bool use_memo = true;
/* this thread's memo index + 1; 0: none claimed yet; -1: none to be had */
static __thread int16_t tls_memo __attribute__((tls_model("initial-exec")));

static struct code_slot *code_slots;
static struct code_info *code_infos;
static char *strings;
static uint32_t strings_used;
static _Atomic uint32_t nr_codes; /* published: infos[0..nr_codes) are complete */
static atomic_flag table_lock = ATOMIC_FLAG_INIT;

/* ---- reading the interpreter's memory ---- */

static bool checked_phase(void)
{
    return atomic_load_explicit(&nr_checked, memory_order_relaxed) < NR_CHECKED_CAPTURES;
}

__attribute__((noinline)) static bool peek_checked(uintptr_t addr, void *out, size_t n)
{
    struct iovec local = {out, n}, remote = {(void *)addr, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

/* Copy n bytes from addr; false when the memory is not readable. Inlined: after the checked
 * captures a frame's fields are plain loads (a call per field cost a third of a capture). */
__attribute__((always_inline)) static inline bool peek(uintptr_t addr, void *out, size_t n)
{
    if (!addr)
        return false;
    if (__builtin_expect(!checked_phase(), 1)) {
        memcpy(out, (const void *)addr, n);
        return true;
    }
    return peek_checked(addr, out, n);
}

static inline bool peek_ptr(uintptr_t addr, uintptr_t *ret)
{
    return peek(addr, ret, sizeof(*ret));
}

static bool has_type(uintptr_t obj, void *type)
{
    uintptr_t t;
    return peek_ptr(obj + sizeof(uintptr_t), &t) && t == (uintptr_t)type;
}

/* Copy a compact ASCII str object's text; "?" for anything else. */
static void read_ascii(uintptr_t obj, char *out, size_t size)
{
    snprintf(out, size, "?");
    if (!obj || !has_type(obj, py.PyUnicode_Type))
        return;
    int64_t len;
    uint32_t state;
    if (!peek(obj + 16, &len, sizeof(len)) || !peek(obj + 32, &state, sizeof(state)))
        return;
    /* state bits: interned(2), kind(3), compact(1), ascii(1) from bit 0 upward */
    bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || !ascii || len < 0 || (size_t)len >= size)
        return;
    if (!peek(obj + layout->ascii_data, out, (size_t)len))
        snprintf(out, size, "?");
    else
        out[len] = 0;
}

/* ---- set-up ---- */

static void init(void)
{
    cuheap_dlsym_fn sym = cuheap_real_dlsym();
    *(void **)&py.Py_IsInitialized = sym(RTLD_DEFAULT, "Py_IsInitialized");
    *(void **)&py.PyGILState_GetThisThreadState =
        sym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    *(void **)&py.Py_GetVersion = sym(RTLD_DEFAULT, "Py_GetVersion");
    *(void **)&py.PyCode_Addr2Line = sym(RTLD_DEFAULT, "PyCode_Addr2Line");
    py.PyCode_Type = sym(RTLD_DEFAULT, "PyCode_Type");
    py.PyUnicode_Type = sym(RTLD_DEFAULT, "PyUnicode_Type");
    if (!py.Py_IsInitialized || !py.PyGILState_GetThisThreadState || !py.Py_GetVersion ||
        !py.PyCode_Addr2Line || !py.PyCode_Type || !py.PyUnicode_Type)
        return; /* not a Python process */
    const char *v = py.Py_GetVersion();
    int major = 0, minor = 0;
    if (!v || sscanf(v, "%d.%d", &major, &minor) != 2)
        return;
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
        if (major == 3 && layouts[i].minor == minor)
            layout = &layouts[i];
    if (!layout) {
        cuheap_log_once("Python %d.%d: no frame layout known (3.10 to 3.13 are); stacks will "
                        "show native frames only",
                        major, minor);
        return;
    }
    /* PyTypeObject: ob_refcnt, ob_type, ob_size, tp_name, then tp_basicsize */
    memcpy(&code_header, (char *)py.PyCode_Type + 4 * sizeof(void *), sizeof(code_header));
    size_t bytes = NR_CODE_SLOTS * sizeof(struct code_slot) +
                   NR_MAX_CODES * sizeof(struct code_info) + STRINGS_BYTES +
                   NR_THREAD_MEMOS * sizeof(struct thread_memo);
    char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        return;
    code_slots = (struct code_slot *)m;
    code_infos = (struct code_info *)(m + NR_CODE_SLOTS * sizeof(struct code_slot));
    strings = (char *)(code_infos + NR_MAX_CODES);
    memos = (struct thread_memo *)(strings + STRINGS_BYTES);
    memcpy(strings, "?", 2);
    strings_used = 2;
    py_ok = true;
}

bool cuheap_py_init(void)
{
    pthread_once(&py_once, init);
    return py_ok;
}

/* ---- interning ---- */

static uint32_t store_string(const char *s)
{
    size_t n = strlen(s) + 1;
    if (!strcmp(s, "?") || strings_used + n > STRINGS_BYTES)
        return 0;
    uint32_t off = strings_used;
    memcpy(strings + off, s, n);
    strings_used += (uint32_t)n;
    return off;
}

/* Id + 1 of a code object (whose first line was read as firstline), interning it on first
 * sight; 0 when the table is full. */
static uint32_t intern_code(uintptr_t code, int firstline)
{
    uint64_t h = (uint64_t)code * 0x9e3779b97f4a7c15ull;
    uint32_t i = (uint32_t)(h >> 48) & (NR_CODE_SLOTS - 1);
    while (atomic_flag_test_and_set_explicit(&table_lock, memory_order_acquire))
        ;
    for (;; i = (i + 1) & (NR_CODE_SLOTS - 1)) {
        if (code_slots[i].code == code && code_slots[i].firstline == firstline) {
            uint32_t id = code_slots[i].id;
            atomic_flag_clear_explicit(&table_lock, memory_order_release);
            return id + 1;
        }
        if (!code_slots[i].code)
            break;
    }
    uint32_t id = atomic_load_explicit(&nr_codes, memory_order_relaxed);
    if (id >= NR_MAX_CODES) {
        atomic_flag_clear_explicit(&table_lock, memory_order_release);
        return 0;
    }
    char file[NAME_MAX_BYTES], name[NAME_MAX_BYTES];
    uintptr_t file_obj = 0, name_obj = 0;
    peek_ptr(code + layout->code_filename, &file_obj);
    peek_ptr(code + layout->code_name, &name_obj);
    read_ascii(file_obj, file, sizeof(file));
    read_ascii(name_obj, name, sizeof(name));
    code_infos[id].file = store_string(file);
    code_infos[id].function = store_string(name);
    code_slots[i].code = code;
    code_slots[i].firstline = firstline;
    code_slots[i].id = id;
    atomic_store_explicit(&nr_codes, id + 1, memory_order_release);
    atomic_flag_clear_explicit(&table_lock, memory_order_release);
    return id + 1;
}

/* ---- the walk ---- */

/* PyCode_Addr2Line walks a code object's line table from its start: microseconds for the
 * long functions of frameworks. The same call sites allocate again and again, so lines are
 * cached by (code object, instruction offset). Direct-mapped; entries are written whole
 * under line_lock. */
#define NR_LINE_SLOTS 8192

struct line_slot {
    uintptr_t code;
    int offset;
    int line;
};

static struct line_slot line_cache[NR_LINE_SLOTS];
static atomic_flag line_lock = ATOMIC_FLAG_INIT;

static int cached_line(uintptr_t code, int offset)
{
    uint64_t h = ((uint64_t)code ^ ((uint64_t)offset << 40)) * 0x9e3779b97f4a7c15ull;
    struct line_slot *slot = &line_cache[h >> 51];
    int line = -1;
    while (atomic_flag_test_and_set_explicit(&line_lock, memory_order_acquire))
        ;
    if (slot->code == code && slot->offset == offset)
        line = slot->line;
    atomic_flag_clear_explicit(&line_lock, memory_order_release);
    if (line >= 0)
        return line;
    line = py.PyCode_Addr2Line((void *)code, offset);
    while (atomic_flag_test_and_set_explicit(&line_lock, memory_order_acquire))
        ;
    *slot = (struct line_slot){code, offset, line};
    atomic_flag_clear_explicit(&line_lock, memory_order_release);
    return line;
}

/* The frame's instruction offset in its code object's bytecode (bytes), -1 when unreadable. */
static int frame_offset(uintptr_t frame, uintptr_t code)
{
    if (layout->lasti_is_int) {
        int lasti;
        if (!peek(frame + layout->frame_instr, &lasti, sizeof(lasti)))
            return -1;
        return lasti * 2;
    }
    uintptr_t instr;
    if (!peek_ptr(frame + layout->frame_instr, &instr) || instr < code + code_header)
        return -1;
    return (int)(instr - (code + code_header));
}

/* ---- the per-thread memo (struct thread_memo says why) ---- */

static bool claim_memo(struct thread_memo *m, pid_t expected, pid_t tid)
{
    if (!atomic_compare_exchange_strong(&m->owner, &expected, tid))
        return false;
    memset(m->slot, 0, sizeof(m->slot));
    m->nr_last = 0;
    return true;
}

static struct thread_memo *thread_memo(void)
{
    if (tls_memo > 0)
        return &memos[tls_memo - 1];
    if (tls_memo < 0 || !memos || !use_memo)
        return NULL;
    pid_t tid = (pid_t)syscall(SYS_gettid), pid = getpid();
    int saved_errno = errno;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < NR_THREAD_MEMOS; i++) {
            pid_t owner = atomic_load(&memos[i].owner);
            /* second pass: take back the memo of a thread that has exited */
            if (pass == 1 && owner && syscall(SYS_tgkill, pid, owner, 0) != 0 && errno == ESRCH &&
                claim_memo(&memos[i], owner, tid)) {
                tls_memo = (int16_t)(i + 1);
                errno = saved_errno;
                return &memos[i];
            }
            if (pass == 0 && !owner && claim_memo(&memos[i], 0, tid)) {
                tls_memo = (int16_t)(i + 1);
                return &memos[i];
            }
        }
    errno = saved_errno;
    tls_memo = -1;
    return NULL;
}

/* The code id and line of one frame whose code object is code: from the thread's memo, else
 * from the shared tables (and remembered). False when the code object cannot be read or
 * the code table is full: the frame is left out. */
static bool frame_info(struct thread_memo *m, uintptr_t frame, uintptr_t code,
                       struct cuheap_py_frame *ret)
{
    int firstline;
    if (!peek(code + layout->code_firstlineno, &firstline, sizeof(firstline)))
        return false;
    int offset = frame_offset(frame, code);
    struct memo_slot *slot = NULL;
    if (m) {
        uint64_t h = ((uint64_t)code ^ ((uint64_t)(uint32_t)offset << 40)) * 0x9e3779b97f4a7c15ull;
        slot = &m->slot[h >> 58];
        if (slot->code == code && slot->offset == offset && slot->firstline == firstline) {
            *ret = slot->frame;
            return true;
        }
    }
    uint32_t id = intern_code(code, firstline);
    if (!id)
        return false;
    int line = offset >= 0 ? cached_line(code, offset) : 0;
    ret->code = id - 1;
    ret->line = line > 0 ? (uint32_t)line : 0;
    if (slot)
        *slot = (struct memo_slot){code, offset, firstline, *ret};
    return true;
}

void cuheap_py_set_memo(bool on)
{
    use_memo = on;
}

/* The last capture of this thread found no frames (it runs no Python, or none now). */
static __thread bool tls_py_empty __attribute__((tls_model("initial-exec")));

static unsigned capture(struct cuheap_py_frame *out, unsigned max, bool *ret_same);

unsigned cuheap_py_capture(struct cuheap_py_frame *out, unsigned max)
{
    bool same;
    return cuheap_py_capture_same(out, max, &same);
}

unsigned cuheap_py_capture_same(struct cuheap_py_frame *out, unsigned max, bool *ret_same)
{
    bool same = false;
    unsigned n = capture(out, max, &same);
    *ret_same = n ? same : tls_py_empty;
    tls_py_empty = n == 0;
    return n;
}

static unsigned capture(struct cuheap_py_frame *out, unsigned max, bool *ret_same)
{
    *ret_same = false;
    if (!py_ok || !max || atomic_load_explicit(&broken, memory_order_relaxed) ||
        !py.Py_IsInitialized())
        return 0;
    uintptr_t ts = (uintptr_t)py.PyGILState_GetThisThreadState();
    if (!ts)
        return 0; /* a thread that never ran Python code */
    bool checking = checked_phase();
    struct thread_memo *memo = thread_memo();
    uintptr_t frame = 0;
    if (layout->via_cframe) {
        uintptr_t cframe;
        if (!peek_ptr(ts + layout->ts_frame, &cframe) ||
            (cframe && !peek_ptr(cframe + layout->cframe_current, &frame)))
            goto bad;
    } else if (!peek_ptr(ts + layout->ts_frame, &frame)) {
        goto bad;
    }
    unsigned n = 0;
    bool same = memo && !checking; /* every frame as last time, so far */
    if (max > CUHEAP_MAX_PY_DEPTH)
        max = CUHEAP_MAX_PY_DEPTH;
    for (unsigned guard = 0; frame && n < max && guard < 256; guard++) {
        uintptr_t code = 0, previous = 0;
        if (!peek_ptr(frame + layout->frame_code, &code) ||
            !peek_ptr(frame + layout->frame_previous, &previous))
            goto bad;
        bool shim = false;
        if (layout->frame_owner >= 0) {
            char owner;
            if (!peek(frame + (size_t)layout->frame_owner, &owner, 1))
                goto bad;
            shim = owner == layout->owner_cstack;
        }
        if (!shim && code && memo && !checking && n < memo->nr_last && memo->last[n].code == code &&
            memo->last[n].offset == frame_offset(frame, code)) {
            out[n] = memo->last[n].frame;
            n++;
        } else if (!shim && code) {
            same = false;
            if (!has_type(code, py.PyCode_Type)) {
                /* 3.13 frames can run non-code executables; elsewhere it means a bad layout */
                if (layout->minor < 13)
                    goto bad;
            } else if (frame_info(memo, frame, code, &out[n])) {
                if (memo) {
                    memo->last[n].code = code;
                    memo->last[n].offset = frame_offset(frame, code);
                    memo->last[n].frame = out[n];
                }
                n++;
            }
        }
        frame = previous;
    }
    if (checking)
        atomic_fetch_add_explicit(&nr_checked, 1, memory_order_relaxed);
    if (memo) {
        *ret_same = same && n == memo->nr_last;
        memo->nr_last = n;
    }
    return n;
bad:
    if (checking) {
        atomic_store(&broken, true);
        cuheap_log_once("cannot read this Python's frames (layout check failed); stacks will "
                        "show native frames only");
    }
    return 0;
}

void cuheap_py_atfork_child(void)
{
    /* the forking thread keeps its memo under its new thread id; the parent's other threads
     * do not exist here, so theirs can be taken back */
    if (tls_memo > 0)
        atomic_store(&memos[tls_memo - 1].owner, (pid_t)syscall(SYS_gettid));
    atomic_flag_clear(&table_lock);
    atomic_flag_clear(&line_lock);
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
