/* Private to the connector objects: the entry/exit of every exported
 * function (per-call error capture, pdx_call.h) and the refusal of NULL or
 * released handles and NULL required pointers, each logged once with the
 * function and the argument named so it becomes pdx_last_error(). */
#ifndef PDX_KV_CALL_H
#define PDX_KV_CALL_H

#include <stdbool.h>
#include <stddef.h>

#include <pdx/log.h>
#include <pdx/status.h>

#include "call.h"

#define KV_ENTER() pdx_call_enter()
/* `return` is part of these: the function ends with the leave. */
#define KV_LEAVE(st) return pdx_call_leave(__func__, (st))
#define KV_LEAVE_INT(n) return pdx_call_leave_int(__func__, (n))
#define KV_LEAVE_VOID(st)                                                      \
    do {                                                                       \
        pdx_call_leave(__func__, (st));                                        \
        return;                                                                \
    } while (0)
/* Leave with `st` and return `value` (pointers, sizes, scalars). */
#define KV_LEAVE_VAL(st, value)                                                \
    do {                                                                       \
        pdx_call_leave(__func__, (st));                                        \
        return (value);                                                        \
    } while (0)

/* A required pointer argument: false (logged) when NULL. */
static inline bool kv_arg_ok(const void *p, const char *fn, const char *what)
{
    if (p != NULL) {
        return true;
    }
    pdx_call_fail(PDX_ERR_INVALID, "%s: %s is NULL", fn, what);
    return false;
}
#define KV_ARG_OK(p, what) kv_arg_ok((p), __func__, (what))

#define KV_LAYOUT_OK(l, what)                                                  \
    pdx_handle_check((l), PDX_MAGIC_LAYOUT, __func__, (what))
#define KV_HASHER_OK(h)                                                        \
    pdx_handle_check((h), PDX_MAGIC_HASHER, __func__, "hasher")
#define KV_POOL_OK(p) pdx_handle_check((p), PDX_MAGIC_POOL, __func__, "pool")
#define KV_CONN_OK(c) pdx_handle_check((c), PDX_MAGIC_CONN, __func__, "conn")
/* Destroy: a handle inherited across fork() is left alone quietly. */
#define KV_POOL_REL_OK(p)                                                      \
    pdx_handle_check_release((p), PDX_MAGIC_POOL, __func__, "pool")
#define KV_CONN_REL_OK(c)                                                      \
    pdx_handle_check_release((c), PDX_MAGIC_CONN, __func__, "conn")

#endif
