/* Argument helpers every binding shares: memory types, bytes, timeouts,
 * integer arrays, and the clock and the wait for a use count to drain. */
#include "pdxpy_int.h"

#include <math.h>
#include <string.h>
#include <time.h>


void pdxpy_wait_unused(int *uses)
{
    while (*uses > 0) {
        Py_BEGIN_ALLOW_THREADS struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
}

int pdxpy_mem_type(PyObject *o, pdx_mem_type_t dflt, pdx_mem_type_t *out)
{
    if (o == NULL || o == Py_None) {
        *out = dflt;
        return 0;
    }
    if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);
        if (v == PDX_MEM_DRAM || v == PDX_MEM_VRAM) {
            *out = (pdx_mem_type_t)v;
            return 0;
        }
    } else if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (s == NULL) {
            return -1;
        }
        if (!strcasecmp(s, "DRAM") || !strcasecmp(s, "cpu") ||
            !strcasecmp(s, "host")) {
            *out = PDX_MEM_DRAM;
            return 0;
        }
        if (!strcasecmp(s, "VRAM") || !strcasecmp(s, "cuda") ||
            !strcasecmp(s, "gpu")) {
            *out = PDX_MEM_VRAM;
            return 0;
        }
    }
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "memory type must be 'DRAM' or 'VRAM' (or pdx.DRAM, "
                 "pdx.VRAM), not %R",
                 o);
    return -1;
}

const char *pdxpy_mem_name(pdx_mem_type_t t)
{
    return t == PDX_MEM_VRAM ? "VRAM" : "DRAM";
}

int pdxpy_bytes_arg(PyObject *o, Py_buffer *view, const char **p,
                    Py_ssize_t *len)
{
    view->obj = NULL;
    if (o == NULL || o == Py_None) {
        *p = NULL;
        *len = 0;
        return 0;
    }
    if (PyUnicode_Check(o)) {
        *p = PyUnicode_AsUTF8AndSize(o, len);
        return *p == NULL ? -1 : 0;
    }
    if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    *p = view->buf;
    *len = view->len;
    return 0;
}

int pdxpy_timeout_arg(PyObject *o, const char *what, int inf_ok, double *out)
{
    if (PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: timeout must be a number of seconds, not %.100s",
                     what, Py_TYPE(o)->tp_name);
        return -1;
    }
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s: timeout must be a number of seconds, not "
                         "%.100s",
                         what, Py_TYPE(o)->tp_name);
        }
        return -1;
    }
    if (isnan(t) || t < 0 || (isinf(t) && !inf_ok)) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "%s: timeout %R: give seconds, 0 or more%s", what, o,
                     inf_ok ? " (inf: no limit)" : "");
        return -1;
    }
    *out = t;
    return 0;
}

/* Strip the byte-order/size prefix of a struct format; the integer kind
 * letter or 0. */
static char int_format(const char *fmt)
{
    if (fmt == NULL) {
        return 'B';
    }
    if (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '!' ||
        *fmt == '>') {
        if (*fmt == '>' || *fmt == '!') {
            return 0; /* big-endian: not on this machine */
        }
        fmt++;
    }
    if (fmt[0] == '\0' || fmt[1] != '\0') {
        return 0;
    }
    return strchr("bBhHiIlLqQnN", fmt[0]) != NULL ? fmt[0] : 0;
}

static int is_signed_format(char c)
{
    return c >= 'a' && c <= 'z';
}

/* Read element at p of a buffer of integer kind `c` and size `sz`. */
static int read_int(const char *p, char c, Py_ssize_t sz, uint64_t *v)
{
    if (is_signed_format(c)) {
        int64_t x;
        switch (sz) {
        case 1:
            x = *(const int8_t *)p;
            break;
        case 2: {
            int16_t t;
            memcpy(&t, p, 2);
            x = t;
            break;
        }
        case 4: {
            int32_t t;
            memcpy(&t, p, 4);
            x = t;
            break;
        }
        default:
            memcpy(&x, p, 8);
            break;
        }
        if (x < 0) {
            return -1;
        }
        *v = (uint64_t)x;
    } else {
        switch (sz) {
        case 1:
            *v = *(const uint8_t *)p;
            break;
        case 2: {
            uint16_t t;
            memcpy(&t, p, 2);
            *v = t;
            break;
        }
        case 4: {
            uint32_t t;
            memcpy(&t, p, 4);
            *v = t;
            break;
        }
        default:
            memcpy(v, p, 8);
            break;
        }
    }
    return 0;
}

int pdxpy_index_value(PyObject *item, uint64_t *v)
{
    if (PyLong_CheckExact(item)) {
        *v = PyLong_AsUnsignedLongLong(item);
    } else {
        PyObject *idx = PyNumber_Index(item);
        if (idx == NULL) {
            return -1;
        }
        *v = PyLong_AsUnsignedLongLong(idx);
        Py_DECREF(idx);
    }
    if (*v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "expected a non-negative integer below 2**64, got %R",
                     item);
        return -1;
    }
    return 0;
}

int pdxpy_int_array(PyObject *o, size_t elem, void *stack, size_t stack_n,
                    void **out, size_t *n)
{
    uint64_t max = elem == 4 ? UINT32_MAX : UINT64_MAX;
    *out = NULL;
    if (!PyList_Check(o) && !PyTuple_Check(o) && PyObject_CheckBuffer(o)) {
        Py_buffer v;
        if (PyObject_GetBuffer(o, &v, PyBUF_RECORDS_RO) < 0) {
            return -1;
        }
        char c = int_format(v.format);
        if (v.ndim > 1 || c == 0 ||
            !(v.itemsize == 1 || v.itemsize == 2 || v.itemsize == 4 ||
              v.itemsize == 8)) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "indices: expected a 1-D integer array, got "
                         "format %s with %d dimensions",
                         v.format ? v.format : "B", v.ndim);
            PyBuffer_Release(&v);
            return -1;
        }
        size_t cnt = v.ndim == 0 ? 1 : (size_t)v.shape[0];
        Py_ssize_t stride = v.ndim == 0 ? v.itemsize : v.strides[0];
        void *arr = cnt <= stack_n ? stack : PyMem_Malloc(cnt * elem + 1);
        if (arr == NULL) {
            PyBuffer_Release(&v);
            PyErr_NoMemory();
            return -1;
        }
        const char *p = v.buf;
        /* The common cases: contiguous int64 into uint32 or uint64. */
        if (elem == 4 && v.itemsize == 8 && stride == 8) {
            const int64_t *s = (const int64_t *)(const void *)p;
            uint32_t *d = arr;
            uint64_t bad = 0;
            for (size_t i = 0; i < cnt; i++) {
                bad |= (uint64_t)s[i] >> 32;
                d[i] = (uint32_t)s[i];
            }
            if (bad != 0) {
                goto range;
            }
        } else {
            for (size_t i = 0; i < cnt; i++) {
                uint64_t x;
                if (read_int(p + (Py_ssize_t)i * stride, c, v.itemsize, &x) <
                        0 ||
                    x > max) {
                    goto range;
                }
                if (elem == 4) {
                    ((uint32_t *)arr)[i] = (uint32_t)x;
                } else {
                    ((uint64_t *)arr)[i] = x;
                }
            }
        }
        PyBuffer_Release(&v);
        *out = arr;
        *n = cnt;
        return 0;
    range:
        PyBuffer_Release(&v);
        if (arr != stack) {
            PyMem_Free(arr);
        }
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "indices: a value is negative or above %llu",
                     (unsigned long long)max);
        return -1;
    }
    PyObject *seq = PySequence_Fast(o, "expected a sequence of integers or "
                                       "a 1-D integer array");
    if (seq == NULL) {
        return -1;
    }
    size_t cnt = (size_t)PySequence_Fast_GET_SIZE(seq);
    void *arr = cnt <= stack_n ? stack : PyMem_Malloc(cnt * elem + 1);
    if (arr == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t i = 0; i < cnt; i++) {
        uint64_t x;
        if (pdxpy_index_value(items[i], &x) < 0) {
            goto fail;
        }
        if (x > max) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID), "index %llu is above %llu",
                         (unsigned long long)x, (unsigned long long)max);
            goto fail;
        }
        if (elem == 4) {
            ((uint32_t *)arr)[i] = (uint32_t)x;
        } else {
            ((uint64_t *)arr)[i] = x;
        }
    }
    Py_DECREF(seq);
    *out = arr;
    *n = cnt;
    return 0;
fail:
    Py_DECREF(seq);
    if (arr != stack) {
        PyMem_Free(arr);
    }
    return -1;
}
