/*
 * LD_PRELOAD-ed allocation counter for the steady-state test: counts every
 * malloc-family call, and separately those made from a stagelink library
 * (by the caller's shared object).  glibc's __libc_* entry points serve the
 * calls, so nothing here allocates.  SPDX-License-Identifier: MIT
 */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static unsigned long sl_total, sl_ours;
static __thread int  sl_inside;

static void sl_count(const void *caller)
{
    Dl_info info;

    __atomic_add_fetch(&sl_total, 1, __ATOMIC_RELAXED);
    if (sl_inside) {
        return;
    }
    sl_inside = 1;
    if (dladdr(caller, &info) && info.dli_fname != NULL &&
        strstr(info.dli_fname, "libstagelink") != NULL) {
        __atomic_add_fetch(&sl_ours, 1, __ATOMIC_RELAXED);
    }
    sl_inside = 0;
}

__attribute__((visibility("default"))) void *malloc(size_t n)
{
    sl_count(__builtin_return_address(0));
    return __libc_malloc(n);
}

__attribute__((visibility("default"))) void *calloc(size_t a, size_t b)
{
    sl_count(__builtin_return_address(0));
    return __libc_calloc(a, b);
}

__attribute__((visibility("default"))) void *realloc(void *p, size_t n)
{
    sl_count(__builtin_return_address(0));
    return __libc_realloc(p, n);
}

__attribute__((visibility("default"))) int posix_memalign(void **p, size_t a,
                                                          size_t n)
{
    sl_count(__builtin_return_address(0));
    *p = __libc_memalign(a, n);
    return (*p == NULL) ? 12 /* ENOMEM */ : 0;
}

__attribute__((visibility("default"))) void *aligned_alloc(size_t a, size_t n)
{
    sl_count(__builtin_return_address(0));
    return __libc_memalign(a, n);
}

__attribute__((visibility("default"))) void *memalign(size_t a, size_t n)
{
    sl_count(__builtin_return_address(0));
    return __libc_memalign(a, n);
}

/** Allocations so far: all of them, and those from stagelink libraries. */
__attribute__((visibility("default"))) void sl_alloc_counts(unsigned long *total,
                                                            unsigned long *ours)
{
    *total = __atomic_load_n(&sl_total, __ATOMIC_RELAXED);
    *ours  = __atomic_load_n(&sl_ours, __ATOMIC_RELAXED);
}
