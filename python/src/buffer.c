/* The memory an object stands for (pdx.mem_info, Agent.register, Layout
 * arenas): a buffer, an (addr, len[, mem_type[, device]]) tuple, a tensor
 * with data_ptr() or an object with __cuda_array_interface__. */
#include "pdxpy_int.h"

#include <stdlib.h>
#include <string.h>

void pdxpy_mem_clear(pdxpy_mem_t *m)
{
    if (m->view.obj != NULL) {
        PyBuffer_Release(&m->view);
        m->view.obj = NULL;
    }
    Py_CLEAR(m->owner);
}

static int get_u64_attr_call(PyObject *o, const char *meth, uint64_t *v)
{
    PyObject *r = PyObject_CallMethod(o, meth, NULL);
    if (r == NULL) {
        return -1;
    }
    int rc = pdxpy_index_value(r, v);
    Py_DECREF(r);
    return rc;
}

/* torch.device / cupy Device -> (is_cuda, index). */
static int device_of(PyObject *o, int *is_cuda, uint32_t *dev)
{
    *is_cuda = 0;
    *dev = 0;
    PyObject *d = PyObject_GetAttrString(o, "device");
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *type = PyObject_GetAttrString(d, "type");
    if (type != NULL && PyUnicode_Check(type)) {
        *is_cuda = PyUnicode_CompareWithASCIIString(type, "cuda") == 0;
    } else {
        PyErr_Clear();
    }
    Py_XDECREF(type);
    PyObject *idx = PyObject_GetAttrString(d, "index");
    if (idx == NULL) {
        PyErr_Clear();
        idx = PyObject_GetAttrString(d, "id"); /* CuPy */
        if (idx != NULL) {
            *is_cuda = 1;
        }
    }
    if (idx == NULL) {
        PyErr_Clear();
    } else if (PyLong_Check(idx)) {
        long v = PyLong_AsLong(idx);
        *dev = v < 0 ? 0 : (uint32_t)v;
    }
    Py_XDECREF(idx);
    Py_DECREF(d);
    return 0;
}

static int mem_from_cai(PyObject *o, PyObject *cai, pdxpy_mem_t *m)
{
    if (!PyDict_Check(cai)) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "__cuda_array_interface__ is not a dict");
        return -1;
    }
    PyObject *data = PyDict_GetItemString(cai, "data");
    PyObject *shape = PyDict_GetItemString(cai, "shape");
    PyObject *typestr = PyDict_GetItemString(cai, "typestr");
    PyObject *strides = PyDict_GetItemString(cai, "strides");
    if (data == NULL || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) < 1 ||
        shape == NULL || !PyTuple_Check(shape) || typestr == NULL ||
        !PyUnicode_Check(typestr)) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "__cuda_array_interface__: data, shape or typestr "
                        "missing");
        return -1;
    }
    if (pdxpy_index_value(PyTuple_GET_ITEM(data, 0), &m->addr) < 0) {
        return -1;
    }
    const char *ts = PyUnicode_AsUTF8(typestr);
    long itemsize = ts != NULL && strlen(ts) >= 3 ? atol(ts + 2) : 0;
    if (itemsize <= 0) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "__cuda_array_interface__: bad typestr %R", typestr);
        return -1;
    }
    uint64_t len = (uint64_t)itemsize;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    int packed = strides == NULL || strides == Py_None;
    for (Py_ssize_t i = 0; i < nd; i++) {
        uint64_t dim;
        if (pdxpy_index_value(PyTuple_GET_ITEM(shape, i), &dim) < 0) {
            return -1;
        }
        if (dim == 0) {
            len = 0;
            break;
        }
        if (packed) {
            len *= dim;
        } else {
            uint64_t st;
            if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != nd ||
                pdxpy_index_value(PyTuple_GET_ITEM(strides, i), &st) < 0) {
                PyErr_Clear();
                PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                                "__cuda_array_interface__: strides must be "
                                "non-negative and match shape");
                return -1;
            }
            len += (dim - 1) * st;
        }
    }
    m->len = len;
    m->mem_type = PDX_MEM_VRAM;
    int is_cuda;
    device_of(o, &is_cuda, &m->dev);
    return 0;
}

int pdxpy_mem_from_object(PyObject *o, PyObject *mem_type, PyObject *device,
                          int writable, pdxpy_mem_t *m)
{
    memset(m, 0, sizeof(*m));
    if (PyTuple_Check(o)) {
        Py_ssize_t n = PyTuple_GET_SIZE(o);
        if (n < 2 || n > 4) {
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                            "memory tuple: expected (addr, len[, mem_type"
                            "[, device]])");
            return -1;
        }
        uint64_t dev = 0;
        if (pdxpy_index_value(PyTuple_GET_ITEM(o, 0), &m->addr) < 0 ||
            pdxpy_index_value(PyTuple_GET_ITEM(o, 1), &m->len) < 0) {
            return -1;
        }
        if (pdxpy_mem_type(n >= 3 ? PyTuple_GET_ITEM(o, 2) : mem_type,
                           PDX_MEM_DRAM, &m->mem_type) < 0) {
            return -1;
        }
        if (n == 4 && pdxpy_index_value(PyTuple_GET_ITEM(o, 3), &dev) < 0) {
            return -1;
        }
        m->dev = (uint32_t)dev;
    } else if (PyObject_HasAttrString(o, "data_ptr") &&
               !PyObject_CheckBuffer(o)) {
        /* torch.Tensor (without importing torch). */
        uint64_t numel, esize;
        if (get_u64_attr_call(o, "data_ptr", &m->addr) < 0 ||
            get_u64_attr_call(o, "numel", &numel) < 0 ||
            get_u64_attr_call(o, "element_size", &esize) < 0) {
            return -1;
        }
        m->len = numel * esize;
        int is_cuda;
        device_of(o, &is_cuda, &m->dev);
        m->mem_type = is_cuda ? PDX_MEM_VRAM : PDX_MEM_DRAM;
        if (!is_cuda) {
            m->dev = 0;
        }
        m->owner = Py_NewRef(o);
    } else if (PyObject_HasAttrString(o, "__cuda_array_interface__")) {
        PyObject *cai = PyObject_GetAttrString(o, "__cuda_array_interface__");
        if (cai == NULL) {
            return -1;
        }
        int rc = mem_from_cai(o, cai, m);
        Py_DECREF(cai);
        if (rc < 0) {
            return -1;
        }
        m->owner = Py_NewRef(o);
    } else if (PyObject_CheckBuffer(o)) {
        int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o, &m->view, flags) < 0) {
            if (writable == 2 && PyErr_ExceptionMatches(PyExc_BufferError)) {
                PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                             "%.100s is read-only memory: this memory is "
                             "written (KV loads), pass a writable buffer "
                             "(bytearray, numpy array, pdx.mem_alloc)",
                             Py_TYPE(o)->tp_name);
                return -1;
            }
            if (writable != 1 || !PyErr_ExceptionMatches(PyExc_BufferError)) {
                return -1;
            }
            /* Read-only memory is fine as a WRITE source or READ target of
             * a peer. */
            PyErr_Clear();
            if (PyObject_GetBuffer(o, &m->view, PyBUF_ANY_CONTIGUOUS) < 0) {
                return -1;
            }
            m->readonly = 1;
        }
        m->addr = (uint64_t)(uintptr_t)m->view.buf;
        m->len = (uint64_t)m->view.len;
        m->mem_type = PDX_MEM_DRAM;
    } else {
        PyErr_Format(PyExc_TypeError,
                     "cannot register %.100s: expected a buffer (bytearray, "
                     "numpy array, mmap, pdx.SharedMemory), an (addr, len, "
                     "mem_type, device) tuple, or an object with data_ptr() "
                     "or __cuda_array_interface__",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (mem_type != NULL && mem_type != Py_None && !PyTuple_Check(o) &&
        pdxpy_mem_type(mem_type, m->mem_type, &m->mem_type) < 0) {
        pdxpy_mem_clear(m);
        return -1;
    }
    if (device != NULL && device != Py_None) {
        uint64_t d;
        if (pdxpy_index_value(device, &d) < 0) {
            pdxpy_mem_clear(m);
            return -1;
        }
        m->dev = (uint32_t)d;
    }
    return 0;
}
