/* pdx._pdx: the CPython extension over libpdx.so's public C API. This file
 * is its top: the module functions and the module's init, which readies
 * the exceptions (errors.c) and every type. */
#include "pdxpy_int.h"

#include <string.h>

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
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
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
    if (pdxpy_errors_init(m) < 0) {
        goto fail;
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
    /* Every failure raises with pdx_last_error()'s text: its log lines
     * are not written a second time (PDX_LOG_LEVEL=info and above still
     * writes them; pdx/log.h). */
    if (PDXPY_HAS(log_set_quiet_failures)) {
        pdx_plugin_v1.log_set_quiet_failures(1);
    }
    PyModule_AddIntConstant(m, "DRAM", PDX_MEM_DRAM);
    PyModule_AddIntConstant(m, "VRAM", PDX_MEM_VRAM);
    PyModule_AddIntConstant(m, "READ", PDX_XFER_READ);
    PyModule_AddIntConstant(m, "WRITE", PDX_XFER_WRITE);
    PyModule_AddIntConstant(m, "OK", PDX_OK);
    PyModule_AddIntConstant(m, "INPROGRESS", PDX_INPROGRESS);
    PyModule_AddIntConstant(m, "NOTIF_MAX", PDX_NOTIF_MAX);
    PyModule_AddIntConstant(m, "NAME_MAX", PDX_NAME_MAX - 1);
    int store = PDXPY_HAS(agent_publish) && PDXPY_HAS(peer_fetch) &&
                PDXPY_HAS(store_status) && PDXPY_HAS(store_describe);
    int stats = PDXPY_HAS(stats_backend) && PDXPY_HAS(stats_peer);
    PyObject *have = Py_BuildValue(
        "{s:O,s:O,s:O,s:O,s:O,s:O}", "metrics",
        PDXPY_HAS(metrics_start) ? Py_True : Py_False, "peer_info",
        PDXPY_HAS(peer_info) ? Py_True : Py_False, "xfer_telemetry",
        PDXPY_HAS(xfer_telemetry) ? Py_True : Py_False, "stats",
        stats ? Py_True : Py_False, "stats_json",
        PDXPY_HAS(stats_json) ? Py_True : Py_False, "store",
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
