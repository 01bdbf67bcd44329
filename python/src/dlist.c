/* pdx.PreparedList (pdx_dlist_h): Agent.prep_dlist and the list. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ PreparedList */

PyObject *pdxpy_agent_prep_dlist(AgentObject *self, PyObject *args,
                                 PyObject *kw)
{
    static char *kwlist[] = {"descs", "peer", "mem_type", NULL};
    PyObject *o, *mt = Py_None;
    const char *peer = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|zO", kwlist, &o, &peer,
                                     &mt)) {
        return NULL;
    }
    DescListObject *d = pdxpy_desclist_from(o, mt);
    if (d == NULL) {
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    pdx_desc_list_t l = {
        .mem_type = d->mem_type, .descs = d->descs, .count = d->count};
    pdx_dlist_h h = NULL;
    PDXPY_CALL_DECL(call, "prep_dlist");
    PDXPY_CALL(&call, pdx_dlist_prepare(self->h, peer, &l, &h));
    pdxpy_agent_leave(self);
    size_t count = d->count;
    uint8_t *ro = NULL;
    int nomem = 0;
    if (call.st == PDX_OK && peer == NULL &&
        pdxpy_readonly_overlap(self, d->descs, d->count) >= 0) {
        pdxpy_ro_ranges_t rr;
        pdxpy_readonly_ranges(self, &rr);
        ro = PyMem_Calloc(count, 1);
        nomem = ro == NULL;
        for (size_t i = 0; ro != NULL && i < count; i++) {
            ro[i] = (uint8_t)pdxpy_readonly_hit(&rr, &d->descs[i]);
        }
    }
    Py_DECREF(d);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    DListObject *r = nomem ? NULL : PyObject_New(DListObject, &pdxpy_DListType);
    if (r == NULL) {
        PyMem_Free(ro);
        self->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_dlist_release(h);
        Py_END_ALLOW_THREADS self->uses--;
        return nomem ? PyErr_NoMemory() : NULL;
    }
    r->ro = ro;
    r->agent = (AgentObject *)Py_NewRef(self);
    r->h = h;
    r->count = count;
    r->uses = 0;
    r->peer = peer ? PyUnicode_FromString(peer) : Py_NewRef(Py_None);
    return (PyObject *)r;
}

static void dlist_release(DListObject *r)
{
    if (r->h == NULL) {
        return;
    }
    pdxpy_wait_unused(&r->uses);
    pdx_dlist_h h = r->h;
    r->h = NULL;
    if (pdxpy_agent_alive(r->agent)) {
        AgentObject *a = r->agent;
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_dlist_release(h);
        Py_END_ALLOW_THREADS a->uses--;
    }
}

static void DList_dealloc(DListObject *r)
{
    dlist_release(r);
    Py_XDECREF(r->agent);
    Py_XDECREF(r->peer);
    PyMem_Free(r->ro);
    PyObject_Free(r);
}

static PyObject *DList_release(DListObject *r, PyObject *unused)
{
    dlist_release(r);
    Py_RETURN_NONE;
}

static Py_ssize_t DList_len(DListObject *r)
{
    return (Py_ssize_t)r->count;
}

static PyObject *DList_get(DListObject *r, void *which)
{
    if (which == NULL) {
        return Py_NewRef(r->peer);
    }
    return PyBool_FromLong(r->h != NULL && pdxpy_agent_alive(r->agent));
}

static PyObject *DList_repr(DListObject *r)
{
    return PyUnicode_FromFormat("<pdx.PreparedList %zu descriptors, peer "
                                "%R%s>",
                                r->count, r->peer, r->h ? "" : " released");
}

static PyMethodDef DList_methods[] = {
    {"release", (PyCFunction)(void (*)(void))DList_release, METH_NOARGS,
     "Release the prepared list; idempotent."},
    {0},
};

static PyGetSetDef DList_getset[] = {
    {"peer", (getter)(void (*)(void))DList_get, NULL,
     "peer name, or None for local", NULL},
    {"valid", (getter)(void (*)(void))DList_get, NULL, "not released",
     (void *)1},
    {0},
};

static PySequenceMethods DList_seq = {.sq_length =
                                          (lenfunc)(void (*)(void))DList_len};

PyTypeObject pdxpy_DListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.PreparedList",
    .tp_basicsize = sizeof(DListObject),
    .tp_dealloc = (destructor)(void (*)(void))DList_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))DList_repr,
    .tp_as_sequence = &DList_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prepared descriptor list (Agent.prep_dlist): requests are "
              "made from indices into it.",
    .tp_methods = DList_methods,
    .tp_getset = DList_getset,
};

int pdxpy_dlist_enter(DListObject *d, const char *which)
{
    if (d->h == NULL || !pdxpy_agent_alive(d->agent)) {
        char buf[96];
        snprintf(buf, sizeof(buf), "%s prepared list is released", which);
        pdxpy_closed(buf);
        return -1;
    }
    d->uses++;
    return 0;
}

int pdxpy_dlist_pair_enter(AgentObject *a, DListObject *ld, DListObject *rd)
{
    if (pdxpy_agent_enter(a) < 0) {
        return -1;
    }
    if (pdxpy_dlist_enter(ld, "local") < 0) {
        pdxpy_agent_leave(a);
        return -1;
    }
    if (pdxpy_dlist_enter(rd, "remote") < 0) {
        ld->uses--;
        pdxpy_agent_leave(a);
        return -1;
    }
    return 0;
}

void pdxpy_dlist_pair_leave(AgentObject *a, DListObject *ld, DListObject *rd)
{
    ld->uses--;
    rd->uses--;
    pdxpy_agent_leave(a);
}
