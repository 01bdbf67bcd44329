/* Agent.bench: a transfer loop timed in C, so the numbers are pdx's and
 * not the interpreter's. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ benchmark */

/* _bench_make_post_check(op, local, local_idx, remote, remote_idx, iters,
 * notif=None) -> [ns per iteration]: the C baseline of python_bench.py,
 * the loop a C stack runs per request (make, post, check until done,
 * release), timed per iteration with the GIL released throughout. */
PyObject *pdxpy_agent_bench(AgentObject *self, PyObject *args)
{
    PyObject *opo, *lo, *lio, *ro, *rio, *notif = Py_None;
    Py_ssize_t iters;
    if (!PyArg_ParseTuple(args, "OO!OO!On|O", &opo, &pdxpy_DListType, &lo, &lio,
                          &pdxpy_DListType, &ro, &rio, &iters, &notif)) {
        return NULL;
    }
    pdx_xfer_op_t op;
    if (pdxpy_parse_op(opo, &op) < 0 || iters <= 0) {
        return NULL;
    }
    DListObject *ld = (DListObject *)lo, *rd = (DListObject *)ro;
    void *li = NULL, *ri = NULL;
    size_t ln, rn;
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    uint64_t *ns = PyMem_Malloc((size_t)iters * sizeof(*ns));
    PyObject *res = NULL;
    if (ns == NULL) {
        return PyErr_NoMemory();
    }
    if (pdxpy_int_array(lio, 4, NULL, 0, &li, &ln) < 0 ||
        pdxpy_int_array(rio, 4, NULL, 0, &ri, &rn) < 0 ||
        pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0) {
        goto out;
    }
    if (ln != rn) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID), "index counts");
        goto out;
    }
    if (pdxpy_dlist_pair_enter(self, ld, rd) < 0) {
        goto out;
    }
    pdx_status_t st = PDX_OK;
    PDXPY_CALL_DECL(call, "bench");
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < iters && st >= 0; i++)
    {
        uint64_t t0 = pdx_now_ns();
        pdx_xfer_h h;
        st = pdx_xfer_make(self->h, op, ld->h, li, rd->h, ri, ln, np,
                           (size_t)nlen, &h);
        if (st != PDX_OK) {
            break;
        }
        st = pdx_xfer_post(h);
        while (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(h);
        }
        pdx_xfer_release(h);
        ns[i] = pdx_now_ns() - t0;
    }
    call.st = st;
    pdxpy_call_done(&call);
    Py_END_ALLOW_THREADS pdxpy_dlist_pair_leave(self, ld, rd);
    if (st < 0) {
        pdxpy_call_raise(&call);
        goto out;
    }
    res = PyList_New(iters);
    for (Py_ssize_t i = 0; res != NULL && i < iters; i++) {
        PyList_SET_ITEM(res, i, PyLong_FromUnsignedLongLong(ns[i]));
    }
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    PyMem_Free(li);
    PyMem_Free(ri);
    PyMem_Free(ns);
    return res;
}
