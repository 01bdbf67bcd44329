/* pdx Python binding: declarations shared by the extension's C files.
 *
 * Every object that wraps a pdx handle counts the calls in progress on it
 * ("uses", changed only with the GIL held) and is closed in two steps:
 * mark it closing (new calls raise pdx.Closed), wait with the GIL released
 * until no call is running, then free the handle. Children (registrations,
 * prepared lists, requests) hold a strong reference to their Agent and are
 * dead once it is closed: pdx_agent_destroy freed their handles, so they
 * never touch them again. */
#ifndef PDXPY_H
#define PDXPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#include "pdx_clock.h"

#include <pdx/kv_connector.h>
#include <pdx/pdx.h>
#include <pdx/store.h>

/* ---- layers (each file calls only the ones above it in this list):
 *   errors.c      exceptions, raising, the call block's helpers, the
 *                 library's optional functions
 *   args.c        argument helpers, the clock
 *   buffer.c      the memory an object stands for
 *   agent_base.c  what an Agent's children use of it
 *   desclist.c, mem.c, kvconfig.c, hasher.c
 *   memreg.c, layout.c
 *   dlist.c, kvconnector.c
 *   xfer.c
 *   agent_store.c, agent_metrics.c, bench.c
 *   agent.c       the Agent type, with its children's methods
 *   module.c      module functions and init */

/* ---- errors.c: the optional C API
 *
 * Functions added to libpdx.so after its first release are called through
 * its exported table (pdx/plugin.h), never linked: an older libpdx.so
 * lacks them. PDXPY_HAS(field) says whether this library's table holds
 * `field` (its size reaches past the field's offset, the ABI's rule); a
 * binding checks it with pdxpy_require, then calls pdx_plugin_v1.field. */
int pdxpy_has(size_t offset);
#define PDXPY_HAS(field) pdxpy_has(offsetof(pdx_plugin_v1_t, field))

/* Raise pdx.Unsupported naming `name` unless `have`; 0 or -1. */
int pdxpy_require(int have, const char *name);

/* ---- errors.c: errors */

/* Raise the exception class of `st` with `msg` (NULL: pdx_last_error(),
 * else "<what>: <status string>"). Always returns NULL. */
PyObject *pdxpy_raise(pdx_status_t st, const char *what, const char *msg);
/* ---- one pdx call with the GIL released
 *
 * Every binding of a pdx call that may block does the same: release the
 * GIL, call, take the error text on this thread before the GIL is back
 * (once Python code can run, a buffer release or a finalizer, a pdx call
 * it makes would replace pdx_last_error()), then raise from it:
 *
 *     PDXPY_CALL_DECL(call, "describe");
 *     PDXPY_CALL(&call, pdx_agent_describe(self->h, &blob, &len));
 *     pdxpy_agent_leave(self);
 *     if (call.st != PDX_OK) {
 *         return pdxpy_call_raise(&call);
 *     }
 */
typedef struct pdxpy_call {
    const char *what; /* names the call where pdx gave no error text */
    pdx_status_t st;
    char err[2048]; /* a call that writes its own message may fill it */
} pdxpy_call_t;

/* Declares `name`, a pdxpy_call_t for the call `what_` (a string that
 * outlives it). Only err[0] is set: a call on a hot path (Xfer.check)
 * does not clear 2 KiB each time. */
#define PDXPY_CALL_DECL(name, what_)                                           \
    pdxpy_call_t name;                                                         \
    name.what = (what_);                                                       \
    name.st = PDX_OK;                                                          \
    name.err[0] = '\0'

/* Runs `expr`, a pdx call returning pdx_status_t that touches no Python
 * object, into c->st with the GIL released. */
#define PDXPY_CALL(c, expr)                                                    \
    do {                                                                       \
        Py_BEGIN_ALLOW_THREADS(c)->st = (expr);                                \
        pdxpy_call_done(c);                                                    \
        Py_END_ALLOW_THREADS                                                   \
    } while (0)

/* PDXPY_CALL's tail, without the GIL (also for a loop of calls run under
 * one Py_BEGIN_ALLOW_THREADS): when c->st < 0 and c->err is empty, the
 * error text (pdxpy_last_error) into c->err. */
void pdxpy_call_done(pdxpy_call_t *c);
/* Raise c->st's exception with c->err (empty: pdx_last_error() now).
 * Always returns NULL. */
PyObject *pdxpy_call_raise(const pdxpy_call_t *c);

/* The exception for using a closed or released object. */
PyObject *pdxpy_closed(const char *what);
/* Copy pdx_last_error() (or a fallback) into buf. */
void pdxpy_last_error(char *buf, size_t len, pdx_status_t st, const char *what);
extern PyObject *pdxpy_Error;
PyObject *pdxpy_exc_for(pdx_status_t st);
/* Creates the exception classes into module m; 0 or -1. */
int pdxpy_errors_init(PyObject *m);

/* ---- args.c: argument helpers */

/* "DRAM"/"VRAM"/"cpu"/"cuda"/0/1/None(default) -> mem type. */
int pdxpy_mem_type(PyObject *o, pdx_mem_type_t dflt, pdx_mem_type_t *out);
/* The name of a memory type. */
const char *pdxpy_mem_name(pdx_mem_type_t t);
/* A non-negative integer below 2**64 (an int or __index__); -1 raised. */
int pdxpy_index_value(PyObject *item, uint64_t *v);
/* Wait with the GIL released until *uses is 0. */
void pdxpy_wait_unused(int *uses);
/* The bytes-like or str argument `o` as (ptr, len); `view` must be
 * released with PyBuffer_Release when view->obj is set. */
int pdxpy_bytes_arg(PyObject *o, Py_buffer *view, const char **p,
                    Py_ssize_t *len);
/* A sequence of ints or a 1-D integer buffer as a malloc'd (or `stack`)
 * array of uint32 or uint64 (elem 4 or 8). */
int pdxpy_int_array(PyObject *o, size_t elem, void *stack, size_t stack_n,
                    void **out, size_t *n);
/* ---- buffer.c: (addr, len) of an object: buffer, tuple,
 * data_ptr()/CUDA interface. */
typedef struct pdxpy_mem {
    uint64_t addr;
    uint64_t len;
    pdx_mem_type_t mem_type;
    uint32_t dev;
    Py_buffer view;  /* held when view.obj != NULL */
    PyObject *owner; /* new reference to keep alive, or NULL */
    int readonly;    /* a read-only buffer (bytes, read-only memoryview) */
} pdxpy_mem_t;
/* `writable`: 0 any buffer; 1 a writable one, else a read-only one with
 * m->readonly set; 2 writable only (a read-only buffer raises BufferError). */
int pdxpy_mem_from_object(PyObject *o, PyObject *mem_type, PyObject *device,
                          int writable, pdxpy_mem_t *m);
void pdxpy_mem_clear(pdxpy_mem_t *m);
/* A timeout argument `o` (an int or float, seconds) into *out: 0 or more,
 * +inf allowed (no limit) when `inf_ok`. nan, negative values (-inf too)
 * and +inf where not allowed raise pdx.InvalidArgument naming `what` and
 * the value; a non-number raises TypeError. Returns 0 or -1. */
int pdxpy_timeout_arg(PyObject *o, const char *what, int inf_ok, double *out);

/* ---- types */

typedef struct AgentObject {
    PyObject_HEAD pdx_agent_h h;
    int closing;
    int uses;
    int progress_thread;
    PyObject *name;
    PyObject *regs; /* set of live MemReg objects */
    int n_readonly; /* of those, registered with readonly=True */
    PyObject *weakreflist;
} AgentObject;

typedef struct DescListObject {
    PyObject_HEAD pdx_desc_t
        *descs; /* owned, or view.buf when view.obj is set */
    size_t count;
    pdx_mem_type_t mem_type;
    Py_buffer view;
} DescListObject;

extern PyTypeObject pdxpy_AgentType;
extern PyTypeObject pdxpy_MemRegType;
extern PyTypeObject pdxpy_DescListType;
extern PyTypeObject pdxpy_DListType;
extern PyTypeObject pdxpy_XferType;
extern PyTypeObject pdxpy_SharedMemoryType;
extern PyTypeObject pdxpy_KVConfigType;
extern PyTypeObject pdxpy_HasherType;
extern PyTypeObject pdxpy_LayoutType;
extern PyTypeObject pdxpy_KVConnectorType;

/* DescList from a DescList, a list of (addr, len[, dev[, ...]]) tuples or
 * an N x 3 integer buffer. New reference. */
DescListObject *pdxpy_desclist_from(PyObject *o, PyObject *mem_type);
/* An uninitialised DescList of n descriptors. */
DescListObject *pdxpy_desclist_new(size_t n, pdx_mem_type_t mt);

/* agent_base.c: a call on the agent begins (-1 raised when closed). */
int pdxpy_agent_enter(AgentObject *a);
#define pdxpy_agent_leave(a) ((a)->uses--)

/* ---- the Agent's family across files (agent.c, agent_store.c, memreg.c,
 * desclist.c, dlist.c, xfer.c, bench.c) */

/* Regions registered readonly=True (at most RO_MAX per agent). */
enum { RO_MAX = 64 };
typedef struct ro_ranges {
    int n;
    uint64_t lo[RO_MAX], hi[RO_MAX];
} pdxpy_ro_ranges_t;

/* The PreparedList type (dlist.c). */
typedef struct DListObject {
    PyObject_HEAD AgentObject *agent;
    pdx_dlist_h h;
    size_t count;
    int uses;
    PyObject *peer;
    uint8_t *ro; /* local lists: 1 per entry in readonly memory, or NULL */
} DListObject;

/* agent_base.c: alive (not closing; no reference taken), and a wait of a
 * polling loop: on the agent's event fd for at most `ms` (the caller
 * released the GIL), then progress if it woke. */
int pdxpy_agent_alive(AgentObject *a);
void pdxpy_agent_sleep(pdx_agent_h h, int ms, int *spins);

/* memreg.c: the agent's read-only regions; whether a descriptor (or which
 * of n descriptors, -1 none) lands in one, and the exception saying so. */
void pdxpy_memregs_forget(PyObject *regs);
void pdxpy_readonly_ranges(AgentObject *a, pdxpy_ro_ranges_t *ro);
int pdxpy_readonly_hit(const pdxpy_ro_ranges_t *ro, const pdx_desc_t *d);
Py_ssize_t pdxpy_readonly_overlap(AgentObject *a, const pdx_desc_t *d,
                                  size_t n);
PyObject *pdxpy_readonly_refused(const char *what, Py_ssize_t i,
                                 const pdx_desc_t *d);

/* dlist.c: a call on a prepared list begins (-1 raised when released). */
int pdxpy_dlist_enter(DListObject *d, const char *which);
/* dlist.c: a call on a local and a remote prepared list of agent `a`
 * begins: the agent, then each list (-1 raised, nothing held, when one is
 * closed or released); and ends. */
int pdxpy_dlist_pair_enter(AgentObject *a, DListObject *ld, DListObject *rd);
void pdxpy_dlist_pair_leave(AgentObject *a, DListObject *ld, DListObject *rd);
/* xfer.c: "READ"/"WRITE" (or the ints) into *op. */
int pdxpy_parse_op(PyObject *o, pdx_xfer_op_t *op);

/* Agent methods defined with what they make or use. */
PyObject *pdxpy_agent_register(AgentObject *self, PyObject *args, PyObject *kw);
PyObject *pdxpy_agent_deregister(AgentObject *self, PyObject *arg);
PyObject *pdxpy_agent_prep_dlist(AgentObject *self, PyObject *args,
                                 PyObject *kw);
PyObject *pdxpy_agent_make_xfer(AgentObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames);
PyObject *pdxpy_agent_create_xfer(AgentObject *self, PyObject *args,
                                  PyObject *kw);
PyObject *pdxpy_agent_publish(AgentObject *self, PyObject *unused);
PyObject *pdxpy_agent_fetch_peer(AgentObject *self, PyObject *args,
                                 PyObject *kw);
PyObject *pdxpy_agent_store_status(AgentObject *self, PyObject *unused);
PyObject *pdxpy_agent_bench(AgentObject *self, PyObject *args);
PyObject *pdxpy_agent_metrics_text(AgentObject *self, PyObject *unused);
PyObject *pdxpy_agent_serve_metrics(AgentObject *self, PyObject *args,
                                    PyObject *kw);
PyObject *pdxpy_agent_stop_metrics(AgentObject *self, PyObject *unused);

/* ---- the connector's types across files (kvconfig.c, hasher.c, layout.c,
 * kvconnector.c) */

typedef struct KVConfigObject {
    PyObject_HEAD pdx_kv_config_t *cfg;
} KVConfigObject;

typedef struct LayoutObject {
    PyObject_HEAD pdx_layout_h h;
    PyObject *keep; /* list: memory owners the arenas point into */
    int frozen;     /* in use by a connector */
} LayoutObject;

/* hasher.c: a block hash from its bytes or hex string. */
int pdxpy_hash_from(PyObject *o, pdx_block_hash_t *h);

PyObject *pdxpy_mem_alloc(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pdxpy_mem_attach(PyObject *self, PyObject *args, PyObject *kw);

#endif
