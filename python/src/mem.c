/* pdx.SharedMemory: shared host memory for the same-host fast path.
 *
 * The mapping is a memfd mapped MAP_SHARED and declared to pdx with
 * pdx_mem_share, the same memory pdx_mem_alloc makes; the binding creates
 * the memfd itself so that it holds the fd and can hand it to a worker
 * process (SharedMemory.fd, pickling through multiprocessing, or
 * pdx.mem_attach in the worker). The buffer protocol gives numpy (or
 * anything else) the memory without a copy. */
#include "pdxpy_int.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ShmObject {
    PyObject_HEAD void *addr;
    size_t len;    /* bytes exposed */
    size_t maplen; /* bytes mapped (page multiple) */
    int fd;
    int exports;
    int shared; /* declared with pdx_mem_share */
} ShmObject;

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* Map `fd` (ownership taken) and declare it; a new SharedMemory. */
static PyObject *shm_map(int fd, size_t len, int populate, int created)
{
    size_t maplen = page_round(len);
    void *p;
    int err = 0;
    PDXPY_CALL_DECL(call, "mem_share");
    Py_BEGIN_ALLOW_THREADS if (created && ftruncate(fd, (off_t)maplen) != 0)
    {
        err = errno;
        p = MAP_FAILED;
    }
    else
    {
        p = mmap(NULL, maplen, PROT_READ | PROT_WRITE,
                 MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
        if (p == MAP_FAILED) {
            err = errno;
        }
    }
    if (p != MAP_FAILED) {
        /* As pdx_mem_alloc: a fork()ed child must not get live KV bytes. */
        (void)madvise(p, maplen, MADV_DONTFORK);
        call.st = pdx_mem_share(p, maplen, fd, 0);
        pdxpy_call_done(&call);
        if (call.st != PDX_OK) {
            munmap(p, maplen);
            p = MAP_FAILED;
        }
    }
    Py_END_ALLOW_THREADS if (p == MAP_FAILED)
    {
        close(fd);
        if (err != 0) {
            char msg[256];
            snprintf(msg, sizeof(msg), "shared memory of %zu bytes: %s", len,
                     strerror(err));
            return pdxpy_raise(err == ENOMEM ? PDX_ERR_NOMEM : PDX_ERR_IO,
                               "mem_alloc", msg);
        }
        return pdxpy_call_raise(&call);
    }
    ShmObject *s = PyObject_New(ShmObject, &pdxpy_SharedMemoryType);
    if (s == NULL) {
        pdx_mem_unshare(p);
        munmap(p, maplen);
        close(fd);
        return NULL;
    }
    s->addr = p;
    s->len = len;
    s->maplen = maplen;
    s->fd = fd;
    s->exports = 0;
    s->shared = 1;
    return (PyObject *)s;
}

PyObject *pdxpy_mem_alloc(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nbytes", "populate", NULL};
    Py_ssize_t n;
    int populate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|p", kwlist, &n, &populate)) {
        return NULL;
    }
    if (n <= 0) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "mem_alloc: nbytes must be positive");
        return NULL;
    }
    int fd = memfd_create("pdx-py", MFD_CLOEXEC);
    if (fd < 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "memfd_create: %s", strerror(errno));
        return pdxpy_raise(PDX_ERR_IO, "mem_alloc", msg);
    }
    return shm_map(fd, (size_t)n, populate, 1);
}

PyObject *pdxpy_mem_attach(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"fd", "nbytes", NULL};
    int fd;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "in", kwlist, &fd, &n)) {
        return NULL;
    }
    struct stat stt;
    if (n <= 0 || fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode) ||
        (uint64_t)stt.st_size < (uint64_t)n) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "mem_attach: fd %d is not a shared memory file of at least "
                 "%zd bytes",
                 fd, n);
        return pdxpy_raise(PDX_ERR_INVALID, "mem_attach", msg);
    }
    return shm_map(fd, (size_t)n, 0, 0);
}

static int shm_close(ShmObject *s, int raise)
{
    if (s->addr == NULL) {
        return 0;
    }
    if (s->exports > 0) {
        if (raise) {
            PyErr_Format(PyExc_BufferError,
                         "SharedMemory: %d buffer export(s) still alive "
                         "(numpy arrays or memoryviews of it)",
                         s->exports);
        }
        return -1;
    }
    if (s->shared) {
        pdx_status_t st = pdx_mem_unshare(s->addr);
        if (st != PDX_OK) {
            if (raise) {
                pdxpy_raise(st, "SharedMemory.close", NULL);
            }
            return -1;
        }
        s->shared = 0;
    }
    void *addr = s->addr;
    size_t len = s->maplen;
    int fd = s->fd;
    s->addr = NULL;
    s->fd = -1;
    Py_BEGIN_ALLOW_THREADS /* unmapping gigabytes takes milliseconds */
        munmap(addr, len);
    close(fd);
    Py_END_ALLOW_THREADS return 0;
}

static void Shm_dealloc(ShmObject *s)
{
    if (shm_close(s, 0) < 0) {
        /* Still registered with an agent: keep the mapping (a leak, never
         * a use after free). */
        PyErr_Clear();
    }
    PyObject_Free(s);
}

static PyObject *Shm_close(ShmObject *s, PyObject *u)
{
    if (shm_close(s, 1) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int Shm_getbuffer(ShmObject *s, Py_buffer *view, int flags)
{
    if (s->addr == NULL) {
        pdxpy_closed("SharedMemory is closed");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)s, s->addr, (Py_ssize_t)s->len, 0,
                          flags) < 0) {
        return -1;
    }
    s->exports++;
    return 0;
}

static void Shm_releasebuffer(ShmObject *s, Py_buffer *view)
{
    s->exports--;
}

static PyBufferProcs Shm_buffer = {
    .bf_getbuffer = (getbufferproc)(void (*)(void))Shm_getbuffer,
    .bf_releasebuffer = (releasebufferproc)(void (*)(void))Shm_releasebuffer,
};

static Py_ssize_t Shm_len(ShmObject *s)
{
    return (Py_ssize_t)s->len;
}

static PyObject *Shm_get(ShmObject *s, void *which)
{
    if (s->addr == NULL && (intptr_t)which != 3) {
        return pdxpy_closed("SharedMemory is closed");
    }
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromUnsignedLongLong((uintptr_t)s->addr);
    case 1:
        return PyLong_FromSize_t(s->len);
    case 2:
        return PyLong_FromLong(s->fd);
    default:
        return PyBool_FromLong(s->addr == NULL);
    }
}

static PyObject *Shm_reduce(ShmObject *s, PyObject *u)
{
    if (s->addr == NULL) {
        return pdxpy_closed("SharedMemory is closed");
    }
    PyObject *mod = PyImport_ImportModule("pdx");
    if (mod == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_CallMethod(mod, "_shm_reduce", "in", s->fd,
                                      (Py_ssize_t)s->len);
    Py_DECREF(mod);
    return r;
}

static PyObject *Shm_enter(ShmObject *s, PyObject *u)
{
    return Py_NewRef(s);
}

static PyObject *Shm_exit(ShmObject *s, PyObject *a)
{
    if (shm_close(s, 1) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *Shm_repr(ShmObject *s)
{
    if (s->addr == NULL) {
        return PyUnicode_FromString("<pdx.SharedMemory closed>");
    }
    return PyUnicode_FromFormat("<pdx.SharedMemory %zu bytes at %p, fd %d>",
                                s->len, s->addr, s->fd);
}

static PyMethodDef Shm_methods[] = {
    {"close", (PyCFunction)(void (*)(void))Shm_close, METH_NOARGS,
     "Unmap (BufferError while exported, pdx.Busy while registered); "
     "idempotent."},
    {"__reduce__", (PyCFunction)(void (*)(void))Shm_reduce, METH_NOARGS,
     "Pickled through multiprocessing, the receiver maps the same pages."},
    {"__enter__", (PyCFunction)(void (*)(void))Shm_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Shm_exit, METH_VARARGS, NULL},
    {0},
};

static PyGetSetDef Shm_getset[] = {
    {"addr", (getter)(void (*)(void))Shm_get, NULL, "start address", (void *)0},
    {"nbytes", (getter)(void (*)(void))Shm_get, NULL, "length in bytes",
     (void *)1},
    {"fd", (getter)(void (*)(void))Shm_get, NULL,
     "the memfd (owned by this object: dup it to pass it on)", (void *)2},
    {"closed", (getter)(void (*)(void))Shm_get, NULL, "True after close()",
     (void *)3},
    {0},
};

static PySequenceMethods Shm_seq = {.sq_length =
                                        (lenfunc)(void (*)(void))Shm_len};

PyTypeObject pdxpy_SharedMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.SharedMemory",
    .tp_basicsize = sizeof(ShmObject),
    .tp_dealloc = (destructor)(void (*)(void))Shm_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))Shm_repr,
    .tp_as_sequence = &Shm_seq,
    .tp_as_buffer = &Shm_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Shared host memory from pdx.mem_alloc or pdx.mem_attach: a "
              "writable buffer (numpy.frombuffer wraps it without a copy).",
    .tp_methods = Shm_methods,
    .tp_getset = Shm_getset,
};
