/* pdx.DescList: a descriptor list in C memory, from tuples or an N x 3
 * integer buffer. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* --------------------------------------------------------------- DescList */

DescListObject *pdxpy_desclist_new(size_t n, pdx_mem_type_t mt)
{
    DescListObject *d = PyObject_New(DescListObject, &pdxpy_DescListType);
    if (d == NULL) {
        return NULL;
    }
    d->count = n;
    d->mem_type = mt;
    d->view.obj = NULL;
    d->descs = PyMem_Malloc((n ? n : 1) * sizeof(pdx_desc_t));
    if (d->descs == NULL) {
        d->count = 0;
        Py_DECREF(d);
        return (DescListObject *)PyErr_NoMemory();
    }
    return d;
}

static int read_u64(PyObject *o, uint64_t *v)
{
    if (PyLong_CheckExact(o)) {
        *v = PyLong_AsUnsignedLongLong(o);
    } else {
        PyObject *i = PyNumber_Index(o);
        if (i == NULL) {
            return -1;
        }
        *v = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
    }
    if (*v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "descriptor field must be an integer in 0..2**64-1, "
                     "not %R",
                     o);
        return -1;
    }
    return 0;
}

static DescListObject *desclist_from_buffer(PyObject *o, pdx_mem_type_t mt)
{
    Py_buffer v;
    if (PyObject_GetBuffer(o, &v, PyBUF_RECORDS_RO) < 0) {
        return NULL;
    }
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    int sgn = 0;
    if (v.ndim != 2 || v.shape[1] != 3 || v.itemsize != 8 || f[1] != '\0' ||
        !strchr("qQlLnN", f[0])) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "descriptor array: expected N x 3 of 64-bit integers "
                     "(addr, len, device), got %d dimensions, format %s",
                     v.ndim, v.format ? v.format : "B");
        PyBuffer_Release(&v);
        return NULL;
    }
    sgn = f[0] == 'q' || f[0] == 'l' || f[0] == 'n';
    size_t n = (size_t)v.shape[0];
    _Static_assert(sizeof(pdx_desc_t) == 24 && offsetof(pdx_desc_t, len) == 8 &&
                       offsetof(pdx_desc_t, dev_id) == 16,
                   "pdx_desc_t is three little-endian u64 words");
    if (v.strides[1] == 8 && v.strides[0] == 24 && n > 0) {
        /* A C-contiguous N x 3 array of 64-bit integers has pdx_desc_t's
         * layout (dev_id, reserved = the low and high halves of the third
         * word): view it without a copy once every device fits 32 bits.
         * Addresses and lengths are pdx's to check. */
        const uint64_t *p = v.buf;
        uint64_t high = 0;
        Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < n; i++)
        {
            high |= p[3 * i + 2];
        }
        Py_END_ALLOW_THREADS if ((high >> 32) != 0)
        {
            PyBuffer_Release(&v);
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                            "descriptor array: device above 2**32-1 or "
                            "negative");
            return NULL;
        }
        DescListObject *d = PyObject_New(DescListObject, &pdxpy_DescListType);
        if (d == NULL) {
            PyBuffer_Release(&v);
            return NULL;
        }
        d->count = n;
        d->mem_type = mt;
        d->view = v; /* keeps the array exported (unresizable) */
        d->descs = (pdx_desc_t *)v.buf;
        return d;
    }
    DescListObject *d = pdxpy_desclist_new(n, mt);
    if (d == NULL) {
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_ssize_t s0 = v.strides[0], s1 = v.strides[1];
    const char *base = v.buf;
    int64_t neg = 0;
    uint64_t bigdev = 0;
    Py_BEGIN_ALLOW_THREADS pdx_desc_t *out = d->descs;
    if (s1 == 8 && s0 == 24) {
        const uint64_t *p = (const uint64_t *)(const void *)base;
        for (size_t i = 0; i < n; i++) {
            uint64_t a = p[3 * i], l = p[3 * i + 1], dv = p[3 * i + 2];
            neg |= (int64_t)(a | l | dv);
            bigdev |= dv >> 32;
            out[i].addr = a;
            out[i].len = l;
            out[i].dev_id = (uint32_t)dv;
            out[i].reserved = 0;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            const char *row = base + (Py_ssize_t)i * s0;
            uint64_t a, l, dv;
            memcpy(&a, row, 8);
            memcpy(&l, row + s1, 8);
            memcpy(&dv, row + 2 * s1, 8);
            neg |= (int64_t)(a | l | dv);
            bigdev |= dv >> 32;
            out[i].addr = a;
            out[i].len = l;
            out[i].dev_id = (uint32_t)dv;
            out[i].reserved = 0;
        }
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&v);
    if ((sgn && neg < 0) || bigdev != 0) {
        Py_DECREF(d);
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "descriptor array: negative value or device above "
                        "2**32-1");
        return NULL;
    }
    return d;
}

DescListObject *pdxpy_desclist_from(PyObject *o, PyObject *mem_type)
{
    pdx_mem_type_t mt;
    if (PyObject_TypeCheck(o, &pdxpy_DescListType)) {
        DescListObject *src = (DescListObject *)o;
        if (mem_type == NULL || mem_type == Py_None) {
            return (DescListObject *)Py_NewRef(o);
        }
        if (pdxpy_mem_type(mem_type, src->mem_type, &mt) < 0) {
            return NULL;
        }
        if (mt == src->mem_type) {
            return (DescListObject *)Py_NewRef(o);
        }
        DescListObject *d = pdxpy_desclist_new(src->count, mt);
        if (d != NULL) {
            memcpy(d->descs, src->descs, src->count * sizeof(pdx_desc_t));
        }
        return d;
    }
    if (pdxpy_mem_type(mem_type, PDX_MEM_DRAM, &mt) < 0) {
        return NULL;
    }
    if (!PyList_Check(o) && !PyTuple_Check(o) && PyObject_CheckBuffer(o)) {
        return desclist_from_buffer(o, mt);
    }
    PyObject *seq = PySequence_Fast(o, "descriptors: a list of (addr, len, "
                                       "device) tuples or an N x 3 array");
    if (seq == NULL) {
        return NULL;
    }
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    DescListObject *d = pdxpy_desclist_new(n, mt);
    if (d == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        PyObject *f[3] = {NULL, NULL, NULL};
        Py_ssize_t k;
        if (PyTuple_Check(t)) {
            k = PyTuple_GET_SIZE(t);
            for (Py_ssize_t j = 0; j < k && j < 3; j++) {
                f[j] = PyTuple_GET_ITEM(t, j);
            }
        } else if (PyList_Check(t)) {
            k = PyList_GET_SIZE(t);
            for (Py_ssize_t j = 0; j < k && j < 3; j++) {
                f[j] = PyList_GET_ITEM(t, j);
            }
        } else {
            k = 0;
        }
        uint64_t a, l, dv = 0;
        if (k < 2 || k > 4) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "descriptor %zu: expected (addr, len[, device[, "
                         "meta]]), got %R",
                         i, t);
            goto fail;
        }
        if (read_u64(f[0], &a) < 0 || read_u64(f[1], &l) < 0 ||
            (k >= 3 && read_u64(f[2], &dv) < 0)) {
            goto fail;
        }
        if (dv > UINT32_MAX) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "descriptor %zu: device %llu too large", i,
                         (unsigned long long)dv);
            goto fail;
        }
        d->descs[i] = (pdx_desc_t){.addr = a, .len = l, .dev_id = (uint32_t)dv};
    }
    Py_DECREF(seq);
    return d;
fail:
    Py_DECREF(seq);
    Py_DECREF(d);
    return NULL;
}

static PyObject *DescList_new(PyTypeObject *t, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"descs", "mem_type", NULL};
    PyObject *o, *mt = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &o, &mt)) {
        return NULL;
    }
    return (PyObject *)pdxpy_desclist_from(o, mt);
}

static void DescList_dealloc(DescListObject *d)
{
    if (d->view.obj != NULL) {
        PyBuffer_Release(&d->view);
    } else {
        PyMem_Free(d->descs);
    }
    PyObject_Free(d);
}

static Py_ssize_t DescList_len(DescListObject *d)
{
    return (Py_ssize_t)d->count;
}

static PyObject *DescList_item(DescListObject *d, Py_ssize_t i)
{
    if (i < 0 || (size_t)i >= d->count) {
        PyErr_SetString(PyExc_IndexError, "descriptor index out of range");
        return NULL;
    }
    return Py_BuildValue("(KKI)", (unsigned long long)d->descs[i].addr,
                         (unsigned long long)d->descs[i].len,
                         (unsigned)d->descs[i].dev_id);
}

static PyObject *DescList_get_mem_type(DescListObject *d, void *c)
{
    return PyUnicode_FromString(pdxpy_mem_name(d->mem_type));
}

static PyObject *DescList_total(DescListObject *d, void *c)
{
    uint64_t t = 0;
    for (size_t i = 0; i < d->count; i++) {
        t += d->descs[i].len;
    }
    return PyLong_FromUnsignedLongLong(t);
}

static PyObject *DescList_repr(DescListObject *d)
{
    return PyUnicode_FromFormat("<pdx.DescList %s, %zu descriptors>",
                                pdxpy_mem_name(d->mem_type), d->count);
}

static PySequenceMethods DescList_seq = {
    .sq_length = (lenfunc)(void (*)(void))DescList_len,
    .sq_item = (ssizeargfunc)(void (*)(void))DescList_item,
};

static PyGetSetDef DescList_getset[] = {
    {"mem_type", (getter)(void (*)(void))DescList_get_mem_type, NULL,
     "'DRAM' or 'VRAM'", NULL},
    {"total_bytes", (getter)(void (*)(void))DescList_total, NULL,
     "sum of the lengths", NULL},
    {0},
};

PyTypeObject pdxpy_DescListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.DescList",
    .tp_basicsize = sizeof(DescListObject),
    .tp_dealloc = (destructor)(void (*)(void))DescList_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))DescList_repr,
    .tp_as_sequence = &DescList_seq,
    .tp_getset = DescList_getset,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DescList(descs, mem_type='DRAM'): descriptors (addr, len, "
              "device) held in C, from a list of tuples or an N x 3 integer "
              "array (converted without a Python loop; a C-contiguous "
              "64-bit one is used in place, without a copy: do not modify "
              "it while the DescList lives).",
    .tp_new = DescList_new,
};
