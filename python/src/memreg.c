/* pdx.MemReg: one registration (Agent.register, Agent.deregister), and
 * the read-only regions transfers are checked against. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* The agent holds every registration (in its `regs` set) until it is
 * deregistered or the agent closes, as NIXL does; a MemReg refers back to
 * its agent weakly, so no reference cycle keeps an agent alive. */
typedef struct MemRegObject {
    PyObject_HEAD PyObject *agent_ref; /* weakref to the AgentObject */
    pdx_mem_reg_h h;
    pdxpy_mem_t mem;
} MemRegObject;

/* ----------------------------------------------------------------- MemReg */

static AgentObject *memreg_agent(MemRegObject *r)
{
    PyObject *a = r->agent_ref ? PyWeakref_GetObject(r->agent_ref) : NULL;
    if (a == NULL || a == Py_None || !pdxpy_agent_alive((AgentObject *)a)) {
        return NULL;
    }
    return (AgentObject *)a;
}

void pdxpy_memregs_forget(PyObject *regs)
{
    PyObject *it = PyObject_GetIter(regs);
    PyObject *o;
    while (it != NULL && (o = PyIter_Next(it)) != NULL) {
        MemRegObject *r = (MemRegObject *)o;
        r->h = NULL;
        pdxpy_mem_clear(&r->mem);
        Py_DECREF(o);
    }
    Py_XDECREF(it);
    PyErr_Clear();
}

PyObject *pdxpy_agent_register(AgentObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "mem_type", "device", "readonly", NULL};
    PyObject *obj, *mt = Py_None, *dev = Py_None;
    int readonly = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$p", kwlist, &obj, &mt,
                                     &dev, &readonly)) {
        return NULL;
    }
    MemRegObject *r = PyObject_New(MemRegObject, &pdxpy_MemRegType);
    if (r == NULL) {
        return NULL;
    }
    r->agent_ref = NULL;
    r->h = NULL;
    if (pdxpy_mem_from_object(obj, mt, dev, 1, &r->mem) < 0) {
        memset(&r->mem, 0, sizeof(r->mem));
        Py_DECREF(r);
        return NULL;
    }
    if (r->mem.readonly && !readonly) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "register: %.100s is read-only memory (a local READ or "
                     "a peer's WRITE would change it): pass readonly=True "
                     "to register it as a source only, or a writable buffer "
                     "(bytearray)",
                     Py_TYPE(obj)->tp_name);
        Py_DECREF(r);
        return NULL;
    }
    /* Declared read-only: local READs into it are refused here, and the
     * flag travels to peers, whose WRITEs into it are refused. */
    r->mem.readonly = readonly;
    if (readonly && self->n_readonly >= 64) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "register: at most 64 regions per agent are "
                        "registered readonly=True");
        Py_DECREF(r);
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    PDXPY_CALL_DECL(call, "register");
    PDXPY_CALL(&call,
               pdx_mem_register(self->h, r->mem.mem_type, r->mem.addr,
                                r->mem.len, r->mem.dev,
                                readonly ? PDX_REGION_F_READONLY : 0, &r->h));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        r->h = NULL;
        Py_DECREF(r);
        return pdxpy_call_raise(&call);
    }
    r->agent_ref = PyWeakref_NewRef((PyObject *)self, NULL);
    if (r->agent_ref != NULL && PySet_Add(self->regs, (PyObject *)r) == 0) {
        self->n_readonly += r->mem.readonly;
    } else {
        /* Undo: nothing else knows of it yet. */
        self->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_mem_deregister(self->h, r->h);
        Py_END_ALLOW_THREADS self->uses--;
        r->h = NULL;
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

/* Deregister; 0 done (or nothing to do), -1 with an exception set. */
static int memreg_release(MemRegObject *r)
{
    if (r->h == NULL) {
        pdxpy_mem_clear(&r->mem);
        return 0;
    }
    AgentObject *a = memreg_agent(r);
    if (a == NULL) {
        r->h = NULL; /* freed by the agent's destruction */
        pdxpy_mem_clear(&r->mem);
        return 0;
    }
    Py_INCREF(a);
    a->uses++;
    PDXPY_CALL_DECL(call, "deregister");
    pdx_mem_reg_h h = r->h;
    PDXPY_CALL(&call, pdx_mem_deregister(a->h, h));
    a->uses--;
    if (call.st != PDX_OK) {
        Py_DECREF(a);
        pdxpy_call_raise(&call);
        return -1; /* still registered: the buffer stays pinned */
    }
    r->h = NULL;
    a->n_readonly -= r->mem.readonly;
    pdxpy_mem_clear(&r->mem);
    int rc = a->regs ? PySet_Discard(a->regs, (PyObject *)r) : 0;
    Py_DECREF(a);
    return rc < 0 ? -1 : 0;
}

static void MemReg_dealloc(MemRegObject *r)
{
    /* Only reached once the agent no longer holds it: deregistered, or the
     * agent is gone. */
    pdxpy_mem_clear(&r->mem);
    Py_XDECREF(r->agent_ref);
    PyObject_Free(r);
}

static PyObject *MemReg_deregister(MemRegObject *r, PyObject *unused)
{
    if (memreg_release(r) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *pdxpy_agent_deregister(AgentObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &pdxpy_MemRegType)) {
        PyErr_SetString(PyExc_TypeError, "deregister: expected a pdx.MemReg");
        return NULL;
    }
    MemRegObject *r = (MemRegObject *)arg;
    if (r->h != NULL && memreg_agent(r) != NULL && memreg_agent(r) != self) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "deregister: registration of another agent");
        return NULL;
    }
    return MemReg_deregister(r, NULL);
}

static PyObject *MemReg_get(MemRegObject *r, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromUnsignedLongLong(r->mem.addr);
    case 1:
        return PyLong_FromUnsignedLongLong(r->mem.len);
    case 2:
        return PyUnicode_FromString(pdxpy_mem_name(r->mem.mem_type));
    case 3:
        return PyLong_FromUnsignedLong(r->mem.dev);
    case 5:
        return PyBool_FromLong(r->mem.readonly);
    default:
        return PyBool_FromLong(r->h != NULL && memreg_agent(r) != NULL);
    }
}

/* PyUnicode_FromFormat has no %llx: the numbers go through snprintf. */
static PyObject *MemReg_repr(MemRegObject *r)
{
    char buf[160];
    snprintf(buf, sizeof(buf), "<pdx.MemReg %s 0x%llx+%llu dev %u%s>",
             pdxpy_mem_name(r->mem.mem_type), (unsigned long long)r->mem.addr,
             (unsigned long long)r->mem.len, (unsigned)r->mem.dev,
             r->h ? "" : " deregistered");
    return PyUnicode_FromString(buf);
}

void pdxpy_readonly_ranges(AgentObject *a, pdxpy_ro_ranges_t *ro)
{
    ro->n = 0;
    if (a->n_readonly <= 0 || a->regs == NULL) {
        return;
    }
    PyObject *it = PyObject_GetIter(a->regs), *key;
    while (it != NULL && ro->n < RO_MAX && (key = PyIter_Next(it)) != NULL) {
        MemRegObject *r = (MemRegObject *)key;
        if (r->mem.readonly) {
            ro->lo[ro->n] = r->mem.addr;
            ro->hi[ro->n++] = r->mem.addr + r->mem.len;
        }
        Py_DECREF(key);
    }
    Py_XDECREF(it);
    PyErr_Clear();
}

int pdxpy_readonly_hit(const pdxpy_ro_ranges_t *ro, const pdx_desc_t *d)
{
    for (int k = 0; k < ro->n; k++) {
        if (d->len > 0 && d->addr < ro->hi[k] && ro->lo[k] < d->addr + d->len) {
            return 1;
        }
    }
    return 0;
}

/* Index of the first of `n` descriptors that overlaps a region registered
 * readonly=True, or -1 (also when none is). */
Py_ssize_t pdxpy_readonly_overlap(AgentObject *a, const pdx_desc_t *d, size_t n)
{
    pdxpy_ro_ranges_t ro;
    pdxpy_readonly_ranges(a, &ro);
    for (size_t i = 0; ro.n > 0 && i < n; i++) {
        if (pdxpy_readonly_hit(&ro, &d[i])) {
            return (Py_ssize_t)i;
        }
    }
    return -1;
}

PyObject *pdxpy_readonly_refused(const char *what, Py_ssize_t i,
                                 const pdx_desc_t *d)
{
    char range[64];
    snprintf(range, sizeof(range), "0x%llx+%llu", (unsigned long long)d->addr,
             (unsigned long long)d->len);
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "%s: local descriptor %zd (%s) lies in memory registered "
                 "readonly=True: it cannot be a READ's destination",
                 what, i, range);
    return NULL;
}

static PyGetSetDef MemReg_getset[] = {
    {"addr", (getter)(void (*)(void))MemReg_get, NULL, "start address",
     (void *)0},
    {"len", (getter)(void (*)(void))MemReg_get, NULL, "length in bytes",
     (void *)1},
    {"mem_type", (getter)(void (*)(void))MemReg_get, NULL, "'DRAM' or 'VRAM'",
     (void *)2},
    {"device", (getter)(void (*)(void))MemReg_get, NULL, "device id",
     (void *)3},
    {"registered", (getter)(void (*)(void))MemReg_get, NULL, "still registered",
     (void *)4},
    {"readonly", (getter)(void (*)(void))MemReg_get, NULL,
     "registered with readonly=True: never a local READ's destination",
     (void *)5},
    {0},
};

static PyMethodDef MemReg_methods[] = {
    {"deregister", (PyCFunction)(void (*)(void))MemReg_deregister, METH_NOARGS,
     "Deregister (pdx.Busy while a request uses it); idempotent."},
    {0},
};

PyTypeObject pdxpy_MemRegType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.MemReg",
    .tp_basicsize = sizeof(MemRegObject),
    .tp_dealloc = (destructor)(void (*)(void))MemReg_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))MemReg_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A registered region (from Agent.register). The agent holds "
              "it, and it keeps the registered object alive and its buffer "
              "exported, until deregister() or the agent's close().",
    .tp_methods = MemReg_methods,
    .tp_getset = MemReg_getset,
};
