/* SPDX-License-Identifier: MIT */
/* Stack capture (see unwind.h). */
#include "unwind.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "driver.h"

typedef int (*unw_backtrace_fn)(void **buffer, int size);
/* libunwind's cursor API (no header: the symbols are libunwind.so.8's x86-64 local ones) */
typedef int (*unw_getcontext_fn)(ucontext_t *uc);
typedef int (*unw_init_local_fn)(void *cursor, ucontext_t *uc);
typedef int (*unw_step_fn)(void *cursor);
typedef int (*unw_get_reg_fn)(void *cursor, int reg, uint64_t *val);
typedef int (*unw_get_save_loc_fn)(void *cursor, int reg, void *loc);
typedef int (*unw_is_signal_frame_fn)(void *cursor);

static unw_backtrace_fn unw_backtrace_ptr;
static struct {
    unw_getcontext_fn getcontext;
    unw_init_local_fn init_local;
    unw_step_fn step;
    unw_get_reg_fn get_reg;
    unw_get_save_loc_fn get_save_loc;
    unw_is_signal_frame_fn is_signal_frame;
} cur; /* all set, or none (then no stack cache) */
static enum cuheap_unwinder kind = CUHEAP_UNWIND_NONE;
static uintptr_t self_start, self_end; /* our executable segment, to skip our frames */

static int find_self(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t fbase = (uintptr_t)arg;
    if (info->dlpi_addr != fbase)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            self_start = info->dlpi_addr + ph->p_vaddr;
            self_end = self_start + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

/* TSan tears a thread down before libunwind's per-thread destructor runs and then faults in
 * it: under TSan, glibc's unwinder does the job. */
#if defined(__SANITIZE_THREAD__)
#define CUHEAP_TRY_LIBUNWIND 0
#else
#define CUHEAP_TRY_LIBUNWIND 1
#endif

static void find_cursor_api(void *h);

enum cuheap_unwinder cuheap_unwind_init(void)
{
    Dl_info self;
    if (dladdr(&self_start, &self)) { /* any address inside this library */
        dl_iterate_phdr(find_self, self.dli_fbase);
        if (self.dli_fname && CUHEAP_TRY_LIBUNWIND) {
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "%s", self.dli_fname);
            char *slash = strrchr(path, '/');
            if (slash) {
                snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "libunwind.so.8");
                void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                if (h) {
                    *(void **)&unw_backtrace_ptr = cuheap_real_dlsym()(h, "unw_backtrace");
                    find_cursor_api(h);
                }
            }
        }
    }
    if (!unw_backtrace_ptr && CUHEAP_TRY_LIBUNWIND) {
        void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
        if (h) {
            *(void **)&unw_backtrace_ptr = cuheap_real_dlsym()(h, "unw_backtrace");
            find_cursor_api(h);
        }
    }
    void *warm[4];
    if (unw_backtrace_ptr) {
        unw_backtrace_ptr(warm, 4); /* first call fills libunwind's caches */
        kind = CUHEAP_UNWIND_LIBUNWIND;
    } else {
        backtrace(warm, 4); /* first call dlopens libgcc_s: do it here, not in a hook */
        kind = CUHEAP_UNWIND_GLIBC;
    }
    return kind;
}

/* Room for cuheap's own frames in a full walk. */
#define NR_SKIP_ROOM 16

static _Atomic bool use_cache = true; /* set at start-up (and by tests) while walks may run */
static _Atomic uint64_t nr_rewalks;
/* cuheap frames skipped by this thread's previous capture, plus one; 0: none yet */
static __thread uint8_t tls_skip __attribute__((tls_model("initial-exec")));

/* Ask the unwinder for up to want return addresses; returns how many it gave, and in
 * *ret_skip how many of them (from the innermost) are cuheap's own. */
__attribute__((noinline)) static int walk(void **buf, int want, int *ret_skip)
{
    int n = 0;
    if (kind == CUHEAP_UNWIND_LIBUNWIND)
        n = unw_backtrace_ptr(buf, want);
    else if (kind == CUHEAP_UNWIND_GLIBC)
        n = backtrace(buf, want);
    int skip = 0;
    while (skip < n && (uintptr_t)buf[skip] >= self_start && (uintptr_t)buf[skip] < self_end)
        skip++;
    *ret_skip = skip;
    return n;
}

static unsigned copy_out(void *const *buf, int n, int skip, uint64_t *out, unsigned max)
{
    unsigned nr = 0;
    for (int i = skip; i < n && nr < max; i++)
        out[nr++] = (uint64_t)(uintptr_t)buf[i];
    return nr;
}

/* Inlined into both entry points, so the full walk sees as many cuheap frames from either. */
__attribute__((always_inline)) static inline unsigned full_walk(uint64_t *out, unsigned max)
{
    void *buf[CUHEAP_MAX_STACK_DEPTH + NR_SKIP_ROOM];
    int want = (int)max + NR_SKIP_ROOM, skip;
    if (want > (int)(sizeof(buf) / sizeof(buf[0])))
        want = (int)(sizeof(buf) / sizeof(buf[0]));
    int n = walk(buf, want, &skip);
    if (skip < n && skip < 255)
        tls_skip = (uint8_t)(skip + 1);
    return copy_out(buf, n, skip, out, max);
}

__attribute__((noinline)) unsigned cuheap_unwind_capture_full(uint64_t *out, unsigned max)
{
    return full_walk(out, max);
}

/* The short walk is a prefix of the full one (same thread, same stack). Its result is the
 * full walk's when it found a frame that is not cuheap's (so the skip count is the full
 * walk's) and either the stack ended inside it or max frames follow the skipped ones (the
 * full walk keeps no more than max). Anything else: walk in full. */
__attribute__((noinline)) unsigned cuheap_unwind_capture(uint64_t *out, unsigned max)
{
    if (!atomic_load_explicit(&use_cache, memory_order_relaxed) || !tls_skip ||
        max > CUHEAP_MAX_STACK_DEPTH)
        return full_walk(out, max);
    void *buf[CUHEAP_MAX_STACK_DEPTH + NR_SKIP_ROOM];
    int guess = tls_skip - 1;
    if (guess > NR_SKIP_ROOM)
        guess = NR_SKIP_ROOM;
    int want = (int)max + guess, skip;
    int n = walk(buf, want, &skip);
    if (skip < n && (n < want || n - skip >= (int)max)) {
        tls_skip = (uint8_t)(skip + 1);
        return copy_out(buf, n, skip, out, max);
    }
    atomic_fetch_add_explicit(&nr_rewalks, 1, memory_order_relaxed);
    return full_walk(out, max);
}

/* ---- the per-thread stack cache ----
 *
 * A walk costs the unwinder tens of nanoseconds a frame, and a hook is usually reached from a
 * handful of call paths. What the unwinder computes for a frame (where its caller's frame
 * starts, the CFA) depends on the frame's instruction pointer and its stack pointer, or, in a
 * frame that keeps a frame pointer (CFA = rbp + 16), its rbp; the caller's instruction pointer
 * is the word just below the CFA (the x86-64 ABI). So a walk is a function of the capture's
 * own frame (fixed: the capturing function keeps a frame pointer) and of the stack words it
 * read: each return address, and the saved rbp of each frame placed by its rbp. A cursor walk
 * (libunwind's, which says where each register was saved) notes those words' addresses and
 * values; a later capture at the same stack pointer whose words all hold the same values has
 * the same stack, checked innermost first, so that only words of frames already proven live
 * are read. A stack with a signal frame (its caller's state is in a saved context) is never
 * cached; x86-64 only (the cursor's symbols), elsewhere every capture walks. */
#define NR_STACK_WAYS 16  /* stacks a thread keeps */
#define NR_MAX_CHECKS 128 /* stack words checked: a return address and a saved rbp a frame */
#define NR_RECENT     64  /* stacks a thread missed lately, by hash */
/* A walk through the cursor costs tens of microseconds (libunwind's cache lock blocks signals
 * at each step): a stack is cached only once seen twice, and at most once in this many
 * misses, so that a thread whose stacks keep changing pays a few percent more than the walk
 * it always made. */
#define NR_MISSES_A_WALK 1024
#define NR_THREAD_STACKS 512
#define UNW_X86_64_RBP   6
#define UNW_X86_64_RSP   7
#define UNW_X86_64_RIP   16
#define UNW_SLT_MEMORY   1
#define NR_CURSOR_WORDS  256 /* libunwind's x86-64 cursor is 127 words */

struct stack_word {
    uintptr_t addr;
    uint64_t value;
};

struct stack_way {
    uintptr_t sp;   /* the capturing function's stack pointer (its CFA): 0 = empty */
    uint32_t tag;   /* this thread's name for these frames, never 0 */
    uint8_t max;    /* frames asked for */
    uint8_t nr_out; /* frames kept */
    uint16_t nr_checks;
    uint64_t note; /* the caller's, kept with these frames: 0 when they were just walked */
    uint64_t out[CUHEAP_MAX_STACK_DEPTH];
    struct stack_word check[NR_MAX_CHECKS]; /* innermost first */
};

struct thread_stacks {
    _Atomic pid_t owner; /* kernel thread id of the thread using it, 0: free */
    uint32_t next_tag;
    uint32_t misses;             /* captures not found since the last cursor walk */
    unsigned next_way;           /* round robin */
    unsigned last_hit;           /* the way found last, looked at first */
    uint64_t recent[NR_RECENT];  /* hashes of the frames of stacks not found lately */
    uintptr_t sp[NR_STACK_WAYS]; /* way[i].sp, side by side for the search */
    struct stack_way spare;      /* where a cursor walk goes first */
    struct stack_way way[NR_STACK_WAYS];
};
static struct thread_stacks *thread_stacks; /* NR_THREAD_STACKS, mapped by init */
/* this thread's entry + 1; 0: none claimed yet; -1: none to be had */
static __thread int16_t tls_stacks __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t nr_stack_walks; /* slow walks (stack not in the cache) */

static void find_cursor_api(void *h)
{
    cuheap_dlsym_fn sym = cuheap_real_dlsym();
    *(void **)&cur.getcontext = sym(h, "_Ux86_64_getcontext");
    *(void **)&cur.init_local = sym(h, "_ULx86_64_init_local");
    *(void **)&cur.step = sym(h, "_ULx86_64_step");
    *(void **)&cur.get_reg = sym(h, "_ULx86_64_get_reg");
    *(void **)&cur.get_save_loc = sym(h, "_ULx86_64_get_save_loc");
    *(void **)&cur.is_signal_frame = sym(h, "_ULx86_64_is_signal_frame");
    int (*set_caching_policy)(void *as, int policy) = NULL;
    void **local_as = sym(h, "_ULx86_64_local_addr_space");
    *(void **)&set_caching_policy = sym(h, "_ULx86_64_set_caching_policy");
    /* The global cache takes a lock with every signal blocked at each step (two system
     * calls a frame); a cache per thread takes none. */
    if (!cur.getcontext || !cur.init_local || !cur.step || !cur.get_reg || !cur.get_save_loc ||
        !cur.is_signal_frame || !local_as || !set_caching_policy ||
        set_caching_policy(*local_as, 2 /* UNW_CACHE_PER_THREAD */)) {
        memset(&cur, 0, sizeof(cur));
        return;
    }
    size_t bytes = NR_THREAD_STACKS * sizeof(struct thread_stacks);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        memset(&cur, 0, sizeof(cur));
        return;
    }
    thread_stacks = m;
}

/* Only what says which ways hold a stack is cleared: a way's other words are written before it
 * is used, so a thread that caches little makes little of its entry resident. */
static bool claim_stacks(struct thread_stacks *t, pid_t expected, pid_t tid)
{
    if (!atomic_compare_exchange_strong(&t->owner, &expected, tid))
        return false;
    memset(t->sp, 0, sizeof(t->sp));
    memset(t->recent, 0, sizeof(t->recent));
    t->misses = NR_MISSES_A_WALK;
    t->next_way = t->last_hit = 0;
    return true;
}

/* This thread's entry, claimed at its first capture: the first entry that is free or whose
 * thread has exited, so that threads that come and go reuse the same few entries (and their
 * resident pages) rather than touch new ones. */
static struct thread_stacks *my_stacks(void)
{
    if (tls_stacks > 0)
        return &thread_stacks[tls_stacks - 1];
    if (tls_stacks < 0 || !thread_stacks)
        return NULL;
    pid_t tid = (pid_t)syscall(SYS_gettid), pid = getpid();
    int saved_errno = errno;
    for (int i = 0; i < NR_THREAD_STACKS; i++) {
        struct thread_stacks *t = &thread_stacks[i];
        pid_t owner = atomic_load(&t->owner);
        if ((!owner && claim_stacks(t, 0, tid)) ||
            (owner && syscall(SYS_tgkill, pid, owner, 0) != 0 && errno == ESRCH &&
             claim_stacks(t, owner, tid))) {
            tls_stacks = (int16_t)(i + 1);
            errno = saved_errno;
            return t;
        }
    }
    errno = saved_errno;
    tls_stacks = -1;
    return NULL;
}

static bool is_self(uint64_t ip)
{
    return ip >= self_start && ip < self_end;
}

/* The slow walk, through libunwind's cursor: fills w (out, checks) and returns how many frames
 * it kept, or -1 when the cursor could not start. w->sp stays 0 when the stack cannot be
 * cached. Its caller must keep a frame pointer (so that its own frame is fixed by its stack
 * pointer) and call it from the same place as find_way(). */
__attribute__((noinline)) static int walk_way(struct stack_way *w, unsigned max)
{
    ucontext_t uc;
    _Alignas(16) uint64_t cursor[NR_CURSOR_WORDS];
    if (cur.getcontext(&uc) || cur.init_local(cursor, &uc) < 0)
        return -1;
    uintptr_t sp1 = (uintptr_t)__builtin_dwarf_cfa();
    bool cacheable = true, leading = true;
    unsigned nr_out = 0, nr_checks = 0;
    struct stack_word rbp = {0, 0}; /* the previous frame's rbp and where it was saved */
    for (int k = 1; nr_out < max && k < (int)max + NR_SKIP_ROOM; k++) {
        if (cur.step(cursor) <= 0)
            break;
        uint64_t ip = 0, sp = 0;
        if (cur.get_reg(cursor, UNW_X86_64_RIP, &ip) || cur.get_reg(cursor, UNW_X86_64_RSP, &sp))
            break;
        if ((k == 1 && sp != sp1) || cur.is_signal_frame(cursor) > 0)
            cacheable = false; /* not the frame the check looks at; a saved context */
        if (k >= 2 && cacheable) {
            /* The previous frame's CFA (sp) is rbp + 16 in a frame that keeps a frame pointer
             * (and in one the unwinder has no rules for): then the rbp it was found by, saved
             * in a frame inside it, is checked. Anywhere else rbp is one more register, which
             * the walk does not read. */
            if (rbp.value + 16 == sp && rbp.addr && nr_checks < NR_MAX_CHECKS)
                w->check[nr_checks++] = rbp;
            /* the return address this frame was found by */
            if (sp < 8 || *(const uint64_t *)(uintptr_t)(sp - 8) != ip ||
                nr_checks >= NR_MAX_CHECKS)
                cacheable = false;
            else
                w->check[nr_checks++] = (struct stack_word){sp - 8, ip};
        }
        /* this frame's rbp, where a frame inside ours saved it (else it is frame 1's, which
         * keeps a frame pointer: fixed by sp1) */
        struct {
            int type;
            uint64_t addr;
            char rest[48];
        } loc = {0};
        rbp = (struct stack_word){0, 0};
        if (cacheable && !cur.get_save_loc(cursor, UNW_X86_64_RBP, &loc) &&
            !cur.get_reg(cursor, UNW_X86_64_RBP, &rbp.value) && loc.type == UNW_SLT_MEMORY &&
            loc.addr >= sp1) {
            /* a slot in a frame inside this one that holds the value: anything else (another
             * libunwind's layout of the answer) is not a word to check later */
            if (loc.addr < sp && !(loc.addr & 7) &&
                *(const uint64_t *)(uintptr_t)loc.addr == rbp.value)
                rbp.addr = (uintptr_t)loc.addr;
            else
                cacheable = false;
        }
        if (leading && is_self(ip))
            continue;
        leading = false;
        w->out[nr_out++] = ip;
    }
    w->nr_out = (uint8_t)nr_out;
    w->nr_checks = (uint16_t)nr_checks;
    w->note = 0;
    w->max = (uint8_t)max;
    w->sp = cacheable ? sp1 : 0;
    return (int)nr_out;
}

static bool same_words(const struct stack_way *w)
{
    unsigned k = 0;
    while (k < w->nr_checks && *(const volatile uint64_t *)w->check[k].addr == w->check[k].value)
        k++;
    return k == w->nr_checks;
}

/* The cached stack that this capture has, or NULL. Called from the same place as walk_way. */
__attribute__((noinline)) static struct stack_way *find_way(struct thread_stacks *t, unsigned max)
{
    uintptr_t sp1 = (uintptr_t)__builtin_dwarf_cfa();
    struct stack_way *w = &t->way[t->last_hit];
    if (t->sp[t->last_hit] == sp1 && w->max == max && same_words(w))
        return w;
    for (unsigned i = 0; i < NR_STACK_WAYS; i++) {
        w = &t->way[i];
        if (t->sp[i] != sp1 || i == t->last_hit || w->max != max || !same_words(w))
            continue;
        t->last_hit = i;
        return w;
    }
    return NULL;
}

static uint64_t hash_frames(const uint64_t *f, unsigned n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (unsigned i = 0; i < n; i++)
        h = (h ^ f[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

__attribute__((noinline)) unsigned
cuheap_unwind_capture_cached(uint64_t *scratch, unsigned max, const uint64_t **ret_frames,
                             uint32_t *ret_tag, uint64_t **ret_note, pthread_rwlock_t *walk_lock)
{
    /* a frame pointer here: this frame is then fixed by its stack pointer (see above) */
    __asm__ volatile("" ::"r"(__builtin_frame_address(0)));
    struct thread_stacks *t = NULL;
    *ret_tag = 0;
    *ret_note = NULL;
    *ret_frames = scratch;
    bool cache = max && max <= CUHEAP_MAX_STACK_DEPTH && cur.step &&
                 atomic_load_explicit(&use_cache, memory_order_relaxed) && (t = my_stacks());
    if (cache) {
        struct stack_way *hit = find_way(t, max);
        if (hit) {
            *ret_frames = hit->out;
            *ret_tag = hit->tag;
            *ret_note = &hit->note;
            return hit->nr_out;
        }
    }
    pthread_rwlock_rdlock(walk_lock);
    unsigned n = cuheap_unwind_capture(scratch, max);
    if (!cache) {
        pthread_rwlock_unlock(walk_lock);
        return n;
    }
    uint64_t h = hash_frames(scratch, n), *seen = &t->recent[h % NR_RECENT];
    bool again = *seen == h;
    *seen = h;
    if (!again || t->misses < NR_MISSES_A_WALK) {
        t->misses++;
        pthread_rwlock_unlock(walk_lock);
        return n;
    }
    /* seen twice: walk it through the cursor, noting the stack words, and keep it if the
     * cursor found the frames the walk did */
    t->misses = 0;
    atomic_fetch_add_explicit(&nr_stack_walks, 1, memory_order_relaxed);
    struct stack_way *w = &t->spare;
    int m = walk_way(w, max);
    pthread_rwlock_unlock(walk_lock);
    if (m != (int)n || !w->sp || memcmp(w->out, scratch, n * sizeof(*scratch)))
        return n;
    unsigned i = t->next_way;
    struct stack_way *keep = &t->way[i];
    t->next_way = (i + 1) % NR_STACK_WAYS;
    t->sp[i] = w->sp;
    t->last_hit = i;
    if (++t->next_tag == 0)
        t->next_tag = 1;
    w->tag = t->next_tag;
    memcpy(keep, w, offsetof(struct stack_way, check) + w->nr_checks * sizeof(w->check[0]));
    *ret_frames = keep->out;
    *ret_tag = keep->tag;
    *ret_note = &keep->note;
    return n;
}

uint64_t cuheap_unwind_nr_stack_walks(void)
{
    return atomic_load_explicit(&nr_stack_walks, memory_order_relaxed);
}

void cuheap_unwind_atfork_child(void)
{
    /* this thread's entry keeps its stacks under its new thread id; the parent's other
     * threads do not exist here, so theirs can be taken back */
    if (tls_stacks <= 0)
        return;
    struct thread_stacks *t = &thread_stacks[tls_stacks - 1];
    atomic_store(&t->owner, (pid_t)syscall(SYS_gettid));
    /* the notes count what the parent did (the recorder's ring positions), which the child
     * starts anew */
    for (unsigned i = 0; i < NR_STACK_WAYS; i++)
        t->way[i].note = 0;
}

void cuheap_unwind_set_cache(bool on)
{
    atomic_store_explicit(&use_cache, on, memory_order_relaxed);
}

uint64_t cuheap_unwind_nr_rewalks(void)
{
    return atomic_load_explicit(&nr_rewalks, memory_order_relaxed);
}

const char *cuheap_unwinder_name(enum cuheap_unwinder u)
{
    switch (u) {
    case CUHEAP_UNWIND_LIBUNWIND:
        return "libunwind";
    case CUHEAP_UNWIND_GLIBC:
        return "glibc";
    default:
        return "none";
    }
}
