/* Private to libpdx.so (core/ and connector/ objects): per-call error
 * capture behind pdx_last_error(), and handle validity tags.
 *
 * Every public entry point runs between pdx_call_enter() and
 * pdx_call_leave(): error and warning lines logged on the calling thread
 * in between (by pdx, the connector or a backend) are collected, and if the
 * outermost call fails they become that thread's pdx_last_error() text. A
 * failure that logged nothing gets "<function>: <status string>". Nested
 * public calls (the connector calling the agent) count as one call. */
#ifndef PDX_CORE_CALL_H
#define PDX_CORE_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/log.h>
#include <pdx/status.h>

void pdx_call_enter(void);
/* Ends the call; returns `st` unchanged. `fn` names the public function. */
pdx_status_t pdx_call_leave(const char *fn, pdx_status_t st);
/* Leave for functions returning an int count where negative is a status. */
int pdx_call_leave_int(const char *fn, int n);
/* Log `fmt` at error level (it is captured like any error line) and
 * return `st`: for refusals found in the entry point itself. */
pdx_status_t pdx_call_fail(pdx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Record `fmt` as this call's error text without logging it: for states a
 * caller polls (a request that failed earlier, already logged once). */
void pdx_call_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Called by pdx_log for every error/warn line, before level filtering
 * (through the hook of base.h that call.c installs at load); nonzero when
 * the line was logged inside a public call. */
int pdx_call_capture(pdx_log_level_t level, const char *line);
/* Around user callbacks run inside a call (notification and freed
 * callbacks): the callback's own pdx calls are outermost calls again. */
int pdx_call_suspend(void);
void pdx_call_resume(int saved_depth);

/* The one entry gate of every exported function, core (api.c) and
 * connector alike: PDX_ENTER() first, then a PDX_LEAVE form as the
 * function's return (`return` is part of PDX_LEAVE and PDX_LEAVE_INT;
 * the others return themselves). Argument and handle checks log once,
 * naming the function and the argument, so the line becomes
 * pdx_last_error(). */
#define PDX_ENTER() pdx_call_enter()
#define PDX_LEAVE(st) return pdx_call_leave(__func__, (st))
#define PDX_LEAVE_INT(n) return pdx_call_leave_int(__func__, (n))
/* A void function: leave with `st` (PDX_ERR_INVALID: refused). */
#define PDX_LEAVE_VOID(st)                                                     \
    do {                                                                       \
        pdx_call_leave(__func__, (st));                                        \
        return;                                                                \
    } while (0)
/* Leave with `st` and return `value` (pointers, sizes, scalars). */
#define PDX_LEAVE_VAL(st, value)                                               \
    do {                                                                       \
        pdx_call_leave(__func__, (st));                                        \
        return (value);                                                        \
    } while (0)
/* A required pointer argument: false (logged) when NULL. */
#define PDX_ARG_OK(p, what) pdx_arg_ok((p), __func__, (what))
/* A live handle of kind `magic`; the release form leaves a handle
 * inherited across fork() alone quietly (a child's exit runs them). */
#define PDX_HANDLE_OK(h, magic, what)                                          \
    pdx_handle_check((h), (magic), __func__, (what))
#define PDX_HANDLE_REL_OK(h, magic, what)                                      \
    pdx_handle_check_release((h), (magic), __func__, (what))

/* Handle tags: the first field of every object a handle points to. A
 * released object keeps its memory (on a free list or in quarantine) with
 * the tag PDX_MAGIC_DEAD, so a stale handle reads a wrong tag instead of
 * freed memory. */
#define PDX_MAGIC_AGENT 0x70644147u   /* "pdAG" */
#define PDX_MAGIC_XFER 0x70645846u    /* "pdXF" */
#define PDX_MAGIC_DLIST 0x7064444cu   /* "pdDL" */
#define PDX_MAGIC_REG 0x70645247u     /* "pdRG" */
#define PDX_MAGIC_BACKEND 0x70644245u /* "pdBE" */
#define PDX_MAGIC_CONN 0x70644b43u    /* "pdKC" */
#define PDX_MAGIC_LAYOUT 0x70644c59u  /* "pdLY" */
#define PDX_MAGIC_HASHER 0x70644853u  /* "pdHS" */
#define PDX_MAGIC_POOL 0x7064504cu    /* "pdPL" */
#define PDX_MAGIC_DEAD 0xdeadbeefu

/* Is `h` non-NULL with tag `magic`? On failure logs (and so captures)
 * "<fn>: <what> is NULL" or "<fn>: <what> %p is not a live <what> (used
 * after release?)" and returns false. */
bool pdx_handle_check(const void *h, uint32_t magic, const char *fn,
                      const char *what);

/* The same for release and destroy functions: a handle inherited across
 * fork() is refused without an error line (a child's exit runs them). */
bool pdx_handle_check_release(const void *h, uint32_t magic, const char *fn,
                              const char *what);

/* Was the pdx_handle_alloc object `h` made before this process was forked
 * from its parent? Such objects are dead handles here: their threads,
 * connections and locks belong to the parent (pthread_atfork bumps an
 * epoch in the child). Cheap: one relaxed load. */
bool pdx_handle_inherited(const void *h);

static inline bool pdx_arg_ok(const void *p, const char *fn,
                              const char *what)
{
    if (p != NULL) {
        return true;
    }
    pdx_call_fail(PDX_ERR_INVALID, "%s: %s is NULL", fn, what);
    return false;
}

static inline bool pdx_handle_live(const void *h, uint32_t magic)
{
    return h != NULL && *(const volatile uint32_t *)h == magic;
}

/* Objects whose handles are rare to make (agents, connectors, layouts,
 * hashers, pools, prepared lists): allocated zeroed with their tag, and on
 * release tagged dead and kept in a process-wide quarantine (FIFO) for
 * PDX_QUARANTINE_MIN later releases before the memory is really freed, so
 * a handle used shortly after release is refused, not dereferenced. */
#define PDX_QUARANTINE_MIN 64
void *pdx_handle_alloc(size_t size, uint32_t magic);
void pdx_handle_release(void *h);

#endif
