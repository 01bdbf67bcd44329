/* The exceptions of pdx._pdx (pdx.Error, one class per pdx status,
 * pdx.Closed) and the raising half of every binding: a status and pdx's
 * error text into the exception; also which optional functions this
 * libpdx.so's table holds. The bottom of the extension: calls only pdx. */
#include "pdxpy_int.h"

#include <string.h>

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
int pdxpy_has(size_t offset)
{
    return pdx_plugin_v1.abi_version == PDX_PLUGIN_ABI_VERSION &&
           pdx_plugin_v1.size > offset;
}

int pdxpy_require(int have, const char *name)
{
    if (have) {
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof(buf),
             "%s: not exported by this libpdx.so (built before it landed)",
             name);
    raise_with(g_exc[-PDX_ERR_UNSUPPORTED], PDX_ERR_UNSUPPORTED, buf);
    return -1;
}

int pdxpy_errors_init(PyObject *m)
{
    pdxpy_Error = PyErr_NewExceptionWithDoc(
        "pdx.Error",
        "Base of every pdx error. Attributes: status (the pdx_status_t "
        "code), status_name, reason (pdx_last_error() text).",
        PyExc_Exception, NULL);
    if (pdxpy_Error == NULL ||
        PyModule_AddObjectRef(m, "Error", pdxpy_Error) < 0) {
        return -1;
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
            return -1;
        }
        PyObject *cls =
            PyErr_NewExceptionWithDoc(qual, g_exc_defs[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (cls == NULL) {
            return -1;
        }
        g_exc[-(int)g_exc_defs[i].st] = cls;
        if (PyModule_AddObjectRef(m, g_exc_defs[i].name, cls) < 0) {
            return -1;
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
            return -1;
        }
    }
    return 0;
}
