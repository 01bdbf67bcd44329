/* pdx._pdx: the CPython extension over libpdx.so's public C API. This file
 * holds the module, the exception classes (one per pdx status) and the
 * argument helpers the object files share. */
#include "pdxpy.h"
#include <math.h>

#include <dlfcn.h>
#include <string.h>
#include <time.h>

pdxpy_optional_t pdxpy_opt;
PyObject *pdxpy_Error;
static PyObject *g_closed;
/* Index -status: PDX_ERR_INVALID (-1) .. PDX_ERR_POLICY (-20). */
#define NSTATUS 21
static PyObject *g_exc[NSTATUS];

static const struct {
    pdx_status_t st;
    const char *name;
    const char *mixin; /* builtin also subclassed, or NULL */
    const char *doc;
} g_exc_defs[] = {
    {PDX_ERR_INVALID, "InvalidArgument", "ValueError", "bad argument"},
    {PDX_ERR_NOMEM, "NoMemory", "MemoryError", "allocation failed"},
    {PDX_ERR_NOT_FOUND, "NotFound", "LookupError",
     "no such peer, backend, region or key"},
    {PDX_ERR_UNSUPPORTED, "Unsupported", NULL,
     "backend lacks the operation or memory type (or this libpdx.so lacks "
     "the function)"},
    {PDX_ERR_BACKEND, "BackendError", NULL, "backend library failed"},
    {PDX_ERR_REMOTE_DISCONNECT, "RemoteDisconnect", "ConnectionError",
     "peer died or its connection broke"},
    {PDX_ERR_STALE, "Stale", NULL, "peer was unloaded or reloaded"},
    {PDX_ERR_MISMATCH, "Mismatch", NULL, "peer invariants differ"},
    {PDX_ERR_CORRUPT, "Corrupt", NULL, "blob checksum, bounds or framing"},
    {PDX_ERR_VERSION, "VersionError", NULL,
     "blob or ABI version not understood"},
    {PDX_ERR_TOO_LARGE, "TooLarge", NULL, "input over a documented limit"},
    {PDX_ERR_TIMEOUT, "Timeout", "TimeoutError", "deadline passed"},
    {PDX_ERR_BUSY, "Busy", NULL, "resource in use"},
    {PDX_ERR_EXISTS, "Exists", NULL, "already present"},
    {PDX_ERR_UNAVAILABLE, "Unavailable", NULL, "backend cannot run here"},
    {PDX_ERR_CANCELED, "Canceled", NULL, "released or aborted by caller"},
    {PDX_ERR_IO, "IOFailure", "OSError", "system call failed"},
    {PDX_ERR_CONFIG, "ConfigError", NULL, "configuration is wrong"},
    {PDX_ERR_NO_SPACE, "NoSpace", NULL, "pool full of unevictable blocks"},
    {PDX_ERR_POLICY, "PolicyError", NULL,
     "the path policy forbids the only path"},
};

PyObject *pdxpy_exc_for(pdx_status_t st)
{
    int i = -(int)st;
    if (i > 0 && i < NSTATUS && g_exc[i] != NULL) {
        return g_exc[i];
    }
    return pdxpy_Error;
}

void pdxpy_last_error(char *buf, size_t len, pdx_status_t st, const char *what)
{
    const char *e = pdx_last_error();
    if (e != NULL && e[0] != '\0' && pdx_last_status() == st) {
        snprintf(buf, len, "%s", e);
    } else {
        snprintf(buf, len, "%s: %s", what, pdx_status_string(st));
    }
}

static PyObject *raise_with(PyObject *cls, pdx_status_t st, const char *msg)
{
    PyObject *text =
        PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (text == NULL) {
        return NULL;
    }
    PyObject *exc = PyObject_CallOneArg(cls, text);
    if (exc == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    PyObject *code = PyLong_FromLong((long)st);
    PyObject *name = PyUnicode_FromString(pdx_status_string(st));
    int bad = code == NULL || name == NULL ||
              PyObject_SetAttrString(exc, "status", code) < 0 ||
              PyObject_SetAttrString(exc, "status_name", name) < 0 ||
              PyObject_SetAttrString(exc, "reason", text) < 0;
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_DECREF(text);
    if (!bad) {
        PyErr_SetObject(cls, exc);
    }
    Py_DECREF(exc);
    return NULL;
}

PyObject *pdxpy_raise(pdx_status_t st, const char *what, const char *msg)
{
    char buf[2048];
    if (msg == NULL) {
        pdxpy_last_error(buf, sizeof(buf), st, what);
        msg = buf;
    }
    return raise_with(pdxpy_exc_for(st), st, msg);
}

void pdxpy_call_done(pdxpy_call_t *c)
{
    if (c->st < 0 && c->err[0] == '\0') {
        pdxpy_last_error(c->err, sizeof(c->err), c->st, c->what);
    }
}

PyObject *pdxpy_call_raise(const pdxpy_call_t *c)
{
    return pdxpy_raise(c->st, c->what, c->err[0] ? c->err : NULL);
}

PyObject *pdxpy_closed(const char *what)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", what);
    return raise_with(g_closed, PDX_ERR_INVALID, buf);
}

int pdxpy_require(const void *fn, const char *name)
{
    if (fn != NULL) {
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof(buf),
             "%s: not exported by this libpdx.so (built before it landed)",
             name);
    raise_with(g_exc[-PDX_ERR_UNSUPPORTED], PDX_ERR_UNSUPPORTED, buf);
    return -1;
}

double pdxpy_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
    PyErr_Format(g_exc[-PDX_ERR_INVALID],
                 "memory type must be 'DRAM' or 'VRAM' (or pdx.DRAM, "
                 "pdx.VRAM), not %R",
                 o);
    return -1;
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
        PyErr_Format(g_exc[-PDX_ERR_INVALID],
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

static int index_value(PyObject *item, uint64_t *v)
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
        PyErr_Format(g_exc[-PDX_ERR_INVALID],
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
            PyErr_Format(g_exc[-PDX_ERR_INVALID],
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
        PyErr_Format(g_exc[-PDX_ERR_INVALID],
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
        if (index_value(items[i], &x) < 0) {
            goto fail;
        }
        if (x > max) {
            PyErr_Format(g_exc[-PDX_ERR_INVALID], "index %llu is above %llu",
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
    int rc = index_value(r, v);
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
        PyErr_SetString(g_exc[-PDX_ERR_INVALID],
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
        PyErr_SetString(g_exc[-PDX_ERR_INVALID],
                        "__cuda_array_interface__: data, shape or typestr "
                        "missing");
        return -1;
    }
    if (index_value(PyTuple_GET_ITEM(data, 0), &m->addr) < 0) {
        return -1;
    }
    const char *ts = PyUnicode_AsUTF8(typestr);
    long itemsize = ts != NULL && strlen(ts) >= 3 ? atol(ts + 2) : 0;
    if (itemsize <= 0) {
        PyErr_Format(g_exc[-PDX_ERR_INVALID],
                     "__cuda_array_interface__: bad typestr %R", typestr);
        return -1;
    }
    uint64_t len = (uint64_t)itemsize;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    int packed = strides == NULL || strides == Py_None;
    for (Py_ssize_t i = 0; i < nd; i++) {
        uint64_t dim;
        if (index_value(PyTuple_GET_ITEM(shape, i), &dim) < 0) {
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
                index_value(PyTuple_GET_ITEM(strides, i), &st) < 0) {
                PyErr_Clear();
                PyErr_SetString(g_exc[-PDX_ERR_INVALID],
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
            PyErr_SetString(g_exc[-PDX_ERR_INVALID],
                            "memory tuple: expected (addr, len[, mem_type"
                            "[, device]])");
            return -1;
        }
        uint64_t dev = 0;
        if (index_value(PyTuple_GET_ITEM(o, 0), &m->addr) < 0 ||
            index_value(PyTuple_GET_ITEM(o, 1), &m->len) < 0) {
            return -1;
        }
        if (pdxpy_mem_type(n >= 3 ? PyTuple_GET_ITEM(o, 2) : mem_type,
                           PDX_MEM_DRAM, &m->mem_type) < 0) {
            return -1;
        }
        if (n == 4 && index_value(PyTuple_GET_ITEM(o, 3), &dev) < 0) {
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
                PyErr_Format(g_exc[-PDX_ERR_INVALID],
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
        if (index_value(device, &d) < 0) {
            pdxpy_mem_clear(m);
            return -1;
        }
        m->dev = (uint32_t)d;
    }
    return 0;
}

/* ---- module functions */

static PyObject *py_status_string(PyObject *self, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyUnicode_FromString(pdx_status_string((pdx_status_t)v));
}

static PyObject *py_last_error(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(is)", (int)pdx_last_status(), pdx_last_error());
}

static PyObject *py_version(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(pdx_version());
}

static PyObject *py_set_log_level(PyObject *self, PyObject *arg)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    long lvl = -1;
    if (PyUnicode_Check(arg)) {
        const char *s = PyUnicode_AsUTF8(arg);
        for (int i = 0; s != NULL && i < 5; i++) {
            if (!strcasecmp(s, names[i])) {
                lvl = i;
            }
        }
    } else if (PyLong_Check(arg)) {
        lvl = PyLong_AsLong(arg);
    }
    if (lvl < 0 || lvl > 4) {
        PyErr_Format(g_exc[-PDX_ERR_INVALID],
                     "log level: error|warn|info|debug|trace, not %R", arg);
        return NULL;
    }
    pdx_log_set_level((pdx_log_level_t)lvl);
    Py_RETURN_NONE;
}

static PyObject *py_blob_describe(PyObject *self, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    char *text = NULL;
    /* The blob's own reason (at most 512 bytes), else pdx_last_error(). */
    PDXPY_CALL_DECL(call, "blob_describe");
    PDXPY_CALL(&call,
               pdx_blob_describe(v.buf, (size_t)v.len, &text, call.err, 512));
    PyBuffer_Release(&v);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    PyObject *r = PyUnicode_FromString(text);
    pdx_blob_free(text);
    return r;
}

static PyObject *py_backend_probe(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL) {
        return NULL;
    }
    uint64_t caps = 0;
    char why[512] = "";
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st =
        pdx_backend_probe(name, &caps, why, sizeof(why));
    Py_END_ALLOW_THREADS return Py_BuildValue(
        "{s:O,s:K,s:s}", "available", st == PDX_OK ? Py_True : Py_False, "caps",
        (unsigned long long)caps, "why", why);
}

static PyObject *py_mem_info(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "mem_type", "device", NULL};
    PyObject *o, *mt = Py_None, *dev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO", kwlist, &o, &mt, &dev)) {
        return NULL;
    }
    pdxpy_mem_t m;
    if (pdxpy_mem_from_object(o, mt, dev, 0, &m) < 0) {
        return NULL;
    }
    PyObject *r = Py_BuildValue(
        "(KKsI)", (unsigned long long)m.addr, (unsigned long long)m.len,
        m.mem_type == PDX_MEM_VRAM ? "VRAM" : "DRAM", (unsigned)m.dev);
    pdxpy_mem_clear(&m);
    return r;
}

static PyMethodDef module_methods[] = {
    {"mem_info", (PyCFunction)(void (*)(void))py_mem_info,
     METH_VARARGS | METH_KEYWORDS,
     "mem_info(obj, mem_type=None, device=None) -> (addr, len, mem_type, "
     "device) of anything Agent.register takes."},
    {"status_string", py_status_string, METH_O,
     "status_string(code) -> str: pdx_status_string."},
    {"last_error", py_last_error, METH_NOARGS,
     "last_error() -> (status, text) of this thread's last failing call."},
    {"version", py_version, METH_NOARGS, "libpdx.so release string."},
    {"set_log_level", py_set_log_level, METH_O,
     "set_log_level('error'|'warn'|'info'|'debug'|'trace')."},
    {"blob_describe", py_blob_describe, METH_O,
     "blob_describe(blob) -> str, or raises with what is wrong with it."},
    {"backend_probe", py_backend_probe, METH_O,
     "backend_probe(name) -> {'available', 'caps', 'why'}."},
    {"mem_alloc", (PyCFunction)(void (*)(void))pdxpy_mem_alloc,
     METH_VARARGS | METH_KEYWORDS,
     "mem_alloc(nbytes, populate=False) -> SharedMemory: zeroed shared host "
     "memory (memfd, MAP_SHARED) a same-host peer maps: transfers into or "
     "out of it are one memcpy."},
    {"mem_attach", (PyCFunction)(void (*)(void))pdxpy_mem_attach,
     METH_VARARGS | METH_KEYWORDS,
     "mem_attach(fd, nbytes) -> SharedMemory: map memory another process "
     "shared (its SharedMemory.fd, passed with pass_fds or pickled through "
     "multiprocessing); takes ownership of fd."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pdx._pdx",
    .m_doc = "Native core of the pdx package (libpdx.so bindings).",
    .m_size = -1,
    .m_methods = module_methods,
};

static void load_optional(void)
{
    Dl_info info;
    if (dladdr((void *)pdx_agent_create, &info) == 0 ||
        info.dli_fname == NULL) {
        return;
    }
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) {
        return;
    }
    pdxpy_opt.peer_info = (pdxpy_peer_info_fn)dlsym(h, "pdx_peer_info");
    pdxpy_opt.xfer_telemetry =
        (pdxpy_telemetry_fn)dlsym(h, "pdx_xfer_telemetry");
    pdxpy_opt.stats_backend = (pdxpy_stats_fn)dlsym(h, "pdx_stats_backend");
    pdxpy_opt.stats_peer = (pdxpy_stats_fn)dlsym(h, "pdx_stats_peer");
    pdxpy_opt.stats_json = (pdxpy_stats_json_fn)dlsym(h, "pdx_stats_json");
    pdxpy_opt.agent_publish = (pdxpy_publish_fn)dlsym(h, "pdx_agent_publish");
    pdxpy_opt.peer_fetch = (pdxpy_peer_fetch_fn)dlsym(h, "pdx_peer_fetch");
    pdxpy_opt.store_status =
        (pdxpy_store_status_fn)dlsym(h, "pdx_store_status");
    pdxpy_opt.store_describe =
        (pdxpy_store_describe_fn)dlsym(h, "pdx_store_describe");
    dlclose(h); /* still loaded: the extension links it */
}

static int add_type(PyObject *m, PyTypeObject *t, const char *name)
{
    if (PyType_Ready(t) < 0) {
        return -1;
    }
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__pdx(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    load_optional();
    pdxpy_Error = PyErr_NewExceptionWithDoc(
        "pdx.Error",
        "Base of every pdx error. Attributes: status (the pdx_status_t "
        "code), status_name, reason (pdx_last_error() text).",
        PyExc_Exception, NULL);
    if (pdxpy_Error == NULL ||
        PyModule_AddObjectRef(m, "Error", pdxpy_Error) < 0) {
        goto fail;
    }
    PyObject *builtins = PyEval_GetBuiltins();
    for (size_t i = 0; i < sizeof(g_exc_defs) / sizeof(g_exc_defs[0]); i++) {
        char qual[96];
        snprintf(qual, sizeof(qual), "pdx.%s", g_exc_defs[i].name);
        PyObject *bases;
        if (g_exc_defs[i].mixin != NULL) {
            PyObject *mix = PyDict_GetItemString(builtins, g_exc_defs[i].mixin);
            bases = PyTuple_Pack(2, pdxpy_Error, mix);
        } else {
            bases = PyTuple_Pack(1, pdxpy_Error);
        }
        if (bases == NULL) {
            goto fail;
        }
        PyObject *cls =
            PyErr_NewExceptionWithDoc(qual, g_exc_defs[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (cls == NULL) {
            goto fail;
        }
        g_exc[-(int)g_exc_defs[i].st] = cls;
        if (PyModule_AddObjectRef(m, g_exc_defs[i].name, cls) < 0) {
            goto fail;
        }
    }
    {
        PyObject *bases = PyTuple_Pack(2, pdxpy_Error, PyExc_ValueError);
        g_closed = bases ? PyErr_NewExceptionWithDoc(
                               "pdx.Closed",
                               "The object was closed or released (or its "
                               "agent was closed).",
                               bases, NULL)
                         : NULL;
        Py_XDECREF(bases);
        if (g_closed == NULL ||
            PyModule_AddObjectRef(m, "Closed", g_closed) < 0) {
            goto fail;
        }
    }
    if (add_type(m, &pdxpy_AgentType, "Agent") < 0 ||
        add_type(m, &pdxpy_MemRegType, "MemReg") < 0 ||
        add_type(m, &pdxpy_DescListType, "DescList") < 0 ||
        add_type(m, &pdxpy_DListType, "PreparedList") < 0 ||
        add_type(m, &pdxpy_XferType, "Xfer") < 0 ||
        add_type(m, &pdxpy_SharedMemoryType, "SharedMemory") < 0 ||
        add_type(m, &pdxpy_KVConfigType, "KVConfig") < 0 ||
        add_type(m, &pdxpy_HasherType, "Hasher") < 0 ||
        add_type(m, &pdxpy_LayoutType, "Layout") < 0 ||
        add_type(m, &pdxpy_KVConnectorType, "KVConnector") < 0) {
        goto fail;
    }
    PyModule_AddIntConstant(m, "DRAM", PDX_MEM_DRAM);
    PyModule_AddIntConstant(m, "VRAM", PDX_MEM_VRAM);
    PyModule_AddIntConstant(m, "READ", PDX_XFER_READ);
    PyModule_AddIntConstant(m, "WRITE", PDX_XFER_WRITE);
    PyModule_AddIntConstant(m, "OK", PDX_OK);
    PyModule_AddIntConstant(m, "INPROGRESS", PDX_INPROGRESS);
    PyModule_AddIntConstant(m, "NOTIF_MAX", PDX_NOTIF_MAX);
    PyModule_AddIntConstant(m, "NAME_MAX", PDX_NAME_MAX - 1);
    int store = pdxpy_opt.agent_publish && pdxpy_opt.peer_fetch &&
                pdxpy_opt.store_status && pdxpy_opt.store_describe;
    PyObject *have = Py_BuildValue(
        "{s:O,s:O,s:O,s:O,s:O}", "peer_info",
        pdxpy_opt.peer_info ? Py_True : Py_False, "xfer_telemetry",
        pdxpy_opt.xfer_telemetry ? Py_True : Py_False, "stats",
        pdxpy_opt.stats_backend && pdxpy_opt.stats_peer ? Py_True : Py_False,
        "stats_json", pdxpy_opt.stats_json ? Py_True : Py_False, "store",
        store ? Py_True : Py_False);
    if (have == NULL || PyModule_AddObject(m, "HAVE", have) < 0) {
        Py_XDECREF(have);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
