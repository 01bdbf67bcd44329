/* pdx.Xfer (pdx_xfer_h): Agent.make_xfer, Agent.create_xfer, and post,
 * check, wait, abort, release, telemetry. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

typedef struct XferObject {
    PyObject_HEAD AgentObject *agent;
    pdx_xfer_h h;
    int uses;
    int released;
    pdx_status_t last;
    PyObject *error; /* text of the last failure, or None */
} XferObject;

/* ------------------------------------------------------------------- Xfer */

int pdxpy_parse_op(PyObject *o, pdx_xfer_op_t *op)
{
    if (PyUnicode_Check(o)) {
        if (PyUnicode_CompareWithASCIIString(o, "READ") == 0 ||
            PyUnicode_CompareWithASCIIString(o, "read") == 0) {
            *op = PDX_XFER_READ;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(o, "WRITE") == 0 ||
            PyUnicode_CompareWithASCIIString(o, "write") == 0) {
            *op = PDX_XFER_WRITE;
            return 0;
        }
    } else if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);
        if (v == PDX_XFER_READ || v == PDX_XFER_WRITE) {
            *op = (pdx_xfer_op_t)v;
            return 0;
        }
    }
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "operation must be 'READ' or 'WRITE', not %R", o);
    return -1;
}

static XferObject *xfer_wrap(AgentObject *a, pdx_xfer_h h)
{
    XferObject *x = PyObject_New(XferObject, &pdxpy_XferType);
    if (x == NULL) {
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_xfer_release(h);
        Py_END_ALLOW_THREADS a->uses--;
        return NULL;
    }
    x->agent = (AgentObject *)Py_NewRef(a);
    x->h = h;
    x->uses = 0;
    x->released = 0;
    x->last = PDX_INPROGRESS;
    x->error = Py_NewRef(Py_None);
    return x;
}

/* make_xfer(op, local, local_idx, remote, remote_idx, notif=None) */
PyObject *pdxpy_agent_make_xfer(AgentObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *notif = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw < 5 || nargs + nkw > 6 || nargs < 5) {
        PyErr_SetString(PyExc_TypeError,
                        "make_xfer(op, local, local_idx, remote, remote_idx, "
                        "notif=None)");
        return NULL;
    }
    if (nargs == 6) {
        notif = args[5];
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i),
                                             "notif") != 0 ||
            nargs == 6) {
            PyErr_SetString(PyExc_TypeError,
                            "make_xfer: the only keyword is notif");
            return NULL;
        }
        notif = args[nargs + i];
    }
    pdx_xfer_op_t op;
    if (pdxpy_parse_op(args[0], &op) < 0) {
        return NULL;
    }
    if (!PyObject_TypeCheck(args[1], &pdxpy_DListType) ||
        !PyObject_TypeCheck(args[3], &pdxpy_DListType)) {
        PyErr_SetString(PyExc_TypeError, "make_xfer: local and remote must be "
                                         "pdx.PreparedList");
        return NULL;
    }
    DListObject *ld = (DListObject *)args[1], *rd = (DListObject *)args[3];
    uint32_t lstack[128], rstack[128];
    void *li = NULL, *ri = NULL;
    size_t ln = 0, rn = 0;
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    PyObject *res = NULL;
    if (pdxpy_int_array(args[2], 4, lstack, 128, &li, &ln) < 0) {
        return NULL;
    }
    if (pdxpy_int_array(args[4], 4, rstack, 128, &ri, &rn) < 0) {
        goto out;
    }
    if (ln != rn) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "make_xfer: %zu local indices but %zu remote ones", ln,
                     rn);
        goto out;
    }
    if (op == PDX_XFER_READ && ld->ro != NULL) {
        const uint32_t *idx = li;
        for (size_t k = 0; k < ln; k++) {
            if (idx[k] < ld->count && ld->ro[idx[k]]) {
                PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                             "make_xfer: local entry %u lies in memory "
                             "registered readonly=True: it cannot be a "
                             "READ's destination",
                             (unsigned)idx[k]);
                goto out;
            }
        }
    }
    if (pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0) {
        goto out;
    }
    if (pdxpy_dlist_pair_enter(self, ld, rd) < 0) {
        goto out;
    }
    pdx_xfer_h h = NULL;
    PDXPY_CALL_DECL(call, "make_xfer");
    /* Released even for small requests: make waits on the agent lock,
     * which the progress thread may hold. */
    PDXPY_CALL(&call, pdx_xfer_make(self->h, op, ld->h, li, rd->h, ri, ln, np,
                                    (size_t)nlen, &h));
    pdxpy_dlist_pair_leave(self, ld, rd);
    if (call.st != PDX_OK) {
        pdxpy_call_raise(&call);
        goto out;
    }
    res = (PyObject *)xfer_wrap(self, h);
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    if (li != lstack) {
        PyMem_Free(li);
    }
    if (ri != rstack && ri != NULL) {
        PyMem_Free(ri);
    }
    return res;
}

PyObject *pdxpy_agent_create_xfer(AgentObject *self, PyObject *args,
                                  PyObject *kw)
{
    static char *kwlist[] = {"op",    "local",    "remote",          "peer",
                             "notif", "mem_type", "remote_mem_type", NULL};
    PyObject *opo, *lo, *ro, *notif = Py_None, *mt = Py_None, *rmt = Py_None;
    const char *peer;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOs|OOO", kwlist, &opo, &lo,
                                     &ro, &peer, &notif, &mt, &rmt)) {
        return NULL;
    }
    pdx_xfer_op_t op;
    if (pdxpy_parse_op(opo, &op) < 0) {
        return NULL;
    }
    DescListObject *l = pdxpy_desclist_from(lo, mt);
    if (l == NULL) {
        return NULL;
    }
    DescListObject *r = pdxpy_desclist_from(ro, rmt);
    if (r == NULL) {
        Py_DECREF(l);
        return NULL;
    }
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    PyObject *res = NULL;
    if (op == PDX_XFER_READ) {
        Py_ssize_t bad = pdxpy_readonly_overlap(self, l->descs, l->count);
        if (bad >= 0) {
            pdxpy_readonly_refused("create_xfer", bad, &l->descs[bad]);
            goto out;
        }
    }
    if (pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0 ||
        pdxpy_agent_enter(self) < 0) {
        goto out;
    }
    pdx_desc_list_t ll = {l->mem_type, l->descs, l->count};
    pdx_desc_list_t rl = {r->mem_type, r->descs, r->count};
    pdx_xfer_h h = NULL;
    PDXPY_CALL_DECL(call, "create_xfer");
    PDXPY_CALL(&call, pdx_xfer_create(self->h, op, &ll, &rl, peer, np,
                                      (size_t)nlen, &h));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        pdxpy_call_raise(&call);
        goto out;
    }
    res = (PyObject *)xfer_wrap(self, h);
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    Py_DECREF(l);
    Py_DECREF(r);
    return res;
}

static int xfer_enter(XferObject *x)
{
    if (x->h == NULL || x->released) {
        pdxpy_closed("request is released");
        return -1;
    }
    if (!pdxpy_agent_alive(x->agent)) {
        pdxpy_closed("request's agent is closed");
        return -1;
    }
    if (x->uses > 0) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_BUSY),
                        "request in use by another thread (one request must "
                        "not be used by two threads at once)");
        return -1;
    }
    x->uses++;
    x->agent->uses++;
    return 0;
}

static void xfer_leave(XferObject *x)
{
    x->uses--;
    x->agent->uses--;
}

static void xfer_note_error(XferObject *x, pdx_status_t st, const char *err)
{
    PyObject *e = PyUnicode_DecodeUTF8(err, (Py_ssize_t)strlen(err), "replace");
    if (e != NULL) {
        Py_SETREF(x->error, e);
    } else {
        PyErr_Clear();
    }
}

/* Raw post/check: the status code, never raising for a pdx error (the text
 * is kept in .error). For pdx.nixl's DONE/PROC/ERR. */
static PyObject *xfer_raw(XferObject *x, int post)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, post ? "post" : "check");
    PDXPY_CALL(&call, post ? pdx_xfer_post(x->h) : pdx_xfer_check(x->h));
    xfer_leave(x);
    x->last = call.st;
    if (call.st < 0) {
        xfer_note_error(x, call.st, call.err);
    }
    return PyLong_FromLong((long)call.st);
}

static PyObject *Xfer_post_raw(XferObject *x, PyObject *u)
{
    return xfer_raw(x, 1);
}

static PyObject *Xfer_check_raw(XferObject *x, PyObject *u)
{
    return xfer_raw(x, 0);
}

static PyObject *xfer_bool(XferObject *x, int post)
{
    PyObject *r = xfer_raw(x, post);
    if (r == NULL) {
        return NULL;
    }
    long st = PyLong_AsLong(r);
    Py_DECREF(r);
    if (st < 0) {
        const char *m = PyUnicode_AsUTF8(x->error);
        return pdxpy_raise((pdx_status_t)st, post ? "post" : "check", m);
    }
    return PyBool_FromLong(st == PDX_OK);
}

static PyObject *Xfer_post(XferObject *x, PyObject *u)
{
    return xfer_bool(x, 1);
}

static PyObject *Xfer_check(XferObject *x, PyObject *u)
{
    return xfer_bool(x, 0);
}

static PyObject *Xfer_abort(XferObject *x, PyObject *u)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "abort");
    PDXPY_CALL(&call, pdx_xfer_abort(x->h));
    xfer_leave(x);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
}

/* Xfer.wait: a check longer than this did copy work; spin this long
 * after the last one before sleeping on the event fd. */
#define WAIT_WORK_S 2e-6
#define WAIT_SPIN_S 30e-6

static PyObject *Xfer_wait(XferObject *x, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *to = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &to)) {
        return NULL;
    }
    double timeout = -1; /* None or inf: no limit */
    if (to != Py_None) {
        if (pdxpy_timeout_arg(to, "wait", 1, &timeout) < 0) {
            return NULL;
        }
        if (isinf(timeout)) {
            timeout = -1;
        }
    }
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    AgentObject *a = x->agent;
    PDXPY_CALL_DECL(call, "wait");
    pdx_status_t st;
    int closed = 0;
    Py_BEGIN_ALLOW_THREADS double start = pdx_now_s();
    double end = start + timeout, busy = start;
    int spins = 0;
    for (;;) {
        double t0 = pdx_now_s();
        st = pdx_xfer_check(x->h);
        if (st != PDX_INPROGRESS) {
            break;
        }
        double t1 = pdx_now_s();
        double left = timeout < 0 ? 1.0 : end - t1;
        if (left <= 0) {
            break;
        }
        if (__atomic_load_n(&a->closing, __ATOMIC_RELAXED)) {
            closed = 1;
            break;
        }
        /* A check that took a while did work (cma copies half of each
         * piece of a large request in the caller's check): keep calling
         * it, as a C caller would, and allow a short spin after the last
         * such check. Otherwise sleep on the agent's fd: the progress
         * thread signals it when it completes work; at most 1 ms, since
         * a copy finished by a backend's worker may not signal it. */
        if (t1 - t0 > WAIT_WORK_S) {
            busy = t1;
            continue;
        }
        if (t1 - busy < WAIT_SPIN_S) {
            continue;
        }
        pdxpy_agent_sleep(a->h, left > 0.001 ? 1 : 0, &spins);
    }
    call.st = st;
    pdxpy_call_done(&call);
    Py_END_ALLOW_THREADS xfer_leave(x);
    x->last = st;
    if (closed) {
        return pdxpy_closed("agent closed while waiting");
    }
    if (st < 0) {
        xfer_note_error(x, st, call.err);
        return pdxpy_call_raise(&call);
    }
    if (st == PDX_INPROGRESS) {
        char buf[160];
        snprintf(buf, sizeof(buf),
                 "wait: request still in flight after %.3f s (it is not "
                 "aborted)",
                 timeout);
        return pdxpy_raise(PDX_ERR_TIMEOUT, "wait", buf);
    }
    Py_RETURN_NONE;
}

static void xfer_release(XferObject *x)
{
    if (x->released || x->h == NULL) {
        x->released = 1;
        return;
    }
    x->released = 1;
    pdxpy_wait_unused(&x->uses);
    pdx_xfer_h h = x->h;
    x->h = NULL;
    if (pdxpy_agent_alive(x->agent)) {
        AgentObject *a = x->agent;
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_xfer_release(h);
        Py_END_ALLOW_THREADS a->uses--;
    }
}

static PyObject *Xfer_release(XferObject *x, PyObject *u)
{
    xfer_release(x);
    Py_RETURN_NONE;
}

static PyObject *Xfer_telemetry(XferObject *x, PyObject *u)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    if (pdxpy_require(PDXPY_HAS(xfer_telemetry), "pdx_xfer_telemetry") < 0) {
        xfer_leave(x);
        return NULL;
    }
    pdx_xfer_telemetry_t t;
    memset(&t, 0, sizeof(t));
    PDXPY_CALL_DECL(call, "telemetry");
    PDXPY_CALL(&call, pdx_plugin_v1.xfer_telemetry(x->h, &t));
    xfer_leave(x);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    t.backend[sizeof(t.backend) - 1] = '\0';
    t.transport[sizeof(t.transport) - 1] = '\0';
    t.fallback_why[sizeof(t.fallback_why) - 1] = '\0';
    return Py_BuildValue(
        "{s:s,s:s,s:O,s:s,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "backend",
        t.backend, "transport", t.transport, "fallback",
        t.fallback ? Py_True : Py_False, "fallback_why", t.fallback_why,
        "status", (int)t.status, "descs", (unsigned long long)t.descs,
        "segments", (unsigned long long)t.segments, "bytes",
        (unsigned long long)t.bytes, "posts", (unsigned long long)t.posts,
        "start_time_ns", (unsigned long long)t.start_time_ns,
        "post_duration_ns", (unsigned long long)t.post_duration_ns,
        "xfer_duration_ns", (unsigned long long)t.xfer_duration_ns);
}

static void Xfer_dealloc(XferObject *x)
{
    xfer_release(x);
    Py_XDECREF(x->agent);
    Py_XDECREF(x->error);
    PyObject_Free(x);
}

static PyObject *Xfer_get(XferObject *x, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromLong((long)x->last);
    case 1:
        return Py_NewRef(x->error);
    case 2:
        if (xfer_enter(x) < 0) {
            return NULL;
        } else {
            size_t n = pdx_xfer_segments(x->h);
            xfer_leave(x);
            return PyLong_FromSize_t(n);
        }
    default:
        return PyBool_FromLong(!x->released && x->h != NULL &&
                               pdxpy_agent_alive(x->agent));
    }
}

static PyObject *Xfer_enter_ctx(XferObject *x, PyObject *u)
{
    return Py_NewRef(x);
}

static PyObject *Xfer_exit_ctx(XferObject *x, PyObject *args)
{
    xfer_release(x);
    Py_RETURN_FALSE;
}

static PyObject *Xfer_repr(XferObject *x)
{
    return PyUnicode_FromFormat("<pdx.Xfer status %s%s>",
                                pdx_status_string(x->last),
                                x->released ? " released" : "");
}

static PyMethodDef Xfer_methods[] = {
    {"post", (PyCFunction)(void (*)(void))Xfer_post, METH_NOARGS,
     "Post (never blocks): True if already complete, False in flight; "
     "raises the status's exception on error."},
    {"check", (PyCFunction)(void (*)(void))Xfer_check, METH_NOARGS,
     "True when complete, False in flight; raises on error. Drives "
     "progress."},
    {"wait", (PyCFunction)(void (*)(void))Xfer_wait,
     METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): sleep on the agent's event fd until complete; "
     "raises on error, pdx.Timeout if still in flight after timeout s "
     "(None or inf: no limit; nan or negative: pdx.InvalidArgument)."},
    {"abort", (PyCFunction)(void (*)(void))Xfer_abort, METH_NOARGS,
     "Ask an in-flight request to stop (check/wait until it ends)."},
    {"release", (PyCFunction)(void (*)(void))Xfer_release, METH_NOARGS,
     "Free the request (aborting in-flight work); idempotent."},
    {"telemetry", (PyCFunction)(void (*)(void))Xfer_telemetry, METH_NOARGS,
     "dict: backend, transport, fallback, bytes, descs, times (ns)."},
    {"_post_raw", (PyCFunction)(void (*)(void))Xfer_post_raw, METH_NOARGS,
     "post, returning the status code (errors kept in .error)."},
    {"_check_raw", (PyCFunction)(void (*)(void))Xfer_check_raw, METH_NOARGS,
     "check, returning the status code (errors kept in .error)."},
    {"__enter__", (PyCFunction)(void (*)(void))Xfer_enter_ctx, METH_NOARGS,
     NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Xfer_exit_ctx, METH_VARARGS,
     NULL},
    {0},
};

static PyGetSetDef Xfer_getset[] = {
    {"status", (getter)(void (*)(void))Xfer_get, NULL, "last status code",
     (void *)0},
    {"error", (getter)(void (*)(void))Xfer_get, NULL,
     "text of the last failure or None", (void *)1},
    {"segments", (getter)(void (*)(void))Xfer_get, NULL,
     "descriptors after merging", (void *)2},
    {"valid", (getter)(void (*)(void))Xfer_get, NULL, "not released",
     (void *)3},
    {0},
};

PyTypeObject pdxpy_XferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.Xfer",
    .tp_basicsize = sizeof(XferObject),
    .tp_dealloc = (destructor)(void (*)(void))Xfer_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))Xfer_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A transfer request (Agent.make_xfer / create_xfer). One "
              "request must not be used by two threads at once (pdx.Busy).",
    .tp_methods = Xfer_methods,
    .tp_getset = Xfer_getset,
};
