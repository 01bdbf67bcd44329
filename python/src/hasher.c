/* pdx.Hasher: vLLM-compatible block hashes. */
#include "pdxpy_int.h"

#include <string.h>

/* ----------------------------------------------------------------- Hasher */

typedef struct HasherObject {
    PyObject_HEAD pdx_hasher_h h;
} HasherObject;

static PyObject *hash_bytes(const pdx_block_hash_t *h)
{
    return PyBytes_FromStringAndSize((const char *)h->bytes, h->len);
}

int pdxpy_hash_from(PyObject *o, pdx_block_hash_t *h)
{
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (s == NULL) {
            return -1;
        }
        if (pdx_block_hash_from_hex(s, h) != PDX_OK) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "block hash: 32 or 64 hex digits, not %R", o);
            return -1;
        }
        return 0;
    }
    char *p;
    Py_ssize_t n;
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError,
                     "block hash: bytes (or hex str), not "
                     "%.80s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyBytes_AsStringAndSize(o, &p, &n);
    if (n != 16 && n != 32) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "block hash: 16 or 32 bytes, not %zd", n);
        return -1;
    }
    memset(h, 0, sizeof(*h));
    memcpy(h->bytes, p, (size_t)n);
    h->len = (uint8_t)n;
    return 0;
}

static PyObject *Hasher_new(PyTypeObject *t, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"algo", "seed", "block_size", NULL};
    const char *algo, *seed;
    unsigned int bs;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ssI", kwlist, &algo, &seed,
                                     &bs)) {
        return NULL;
    }
    pdx_hash_algo_t a;
    if (pdx_hash_algo_from_string(algo, &a) != PDX_OK) {
        return pdxpy_raise(PDX_ERR_INVALID, "Hasher", NULL);
    }
    pdx_hasher_h h;
    pdx_status_t st = pdx_hasher_create(a, seed, bs, &h);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "Hasher", NULL);
    }
    HasherObject *o = (HasherObject *)t->tp_alloc(t, 0);
    if (o == NULL) {
        pdx_hasher_destroy(h);
        return NULL;
    }
    o->h = h;
    return (PyObject *)o;
}

static void Hasher_dealloc(HasherObject *o)
{
    pdx_hasher_destroy(o->h);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static int parse_extra(PyObject *lora, PyObject *salt, pdx_hash_extra_t *e)
{
    memset(e, 0, sizeof(*e));
    if (lora != NULL && lora != Py_None) {
        e->lora_name = PyUnicode_AsUTF8(lora);
        if (e->lora_name == NULL) {
            return -1;
        }
        e->field_mask |= PDX_HASH_EXTRA_FIELD_LORA_NAME;
    }
    if (salt != NULL && salt != Py_None) {
        e->cache_salt = PyUnicode_AsUTF8(salt);
        if (e->cache_salt == NULL) {
            return -1;
        }
        e->field_mask |= PDX_HASH_EXTRA_FIELD_CACHE_SALT;
    }
    return 0;
}

static PyObject *Hasher_hash_blocks(HasherObject *o, PyObject *args,
                                    PyObject *kw)
{
    static char *kwlist[] = {"tokens", "lora_name", "cache_salt", "tail", NULL};
    PyObject *tok, *lora = Py_None, *salt = Py_None;
    int want_tail = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOp", kwlist, &tok, &lora,
                                     &salt, &want_tail)) {
        return NULL;
    }
    pdx_hash_extra_t extra;
    if (parse_extra(lora, salt, &extra) < 0) {
        return NULL;
    }
    uint64_t stack[256];
    void *t;
    size_t n;
    if (pdxpy_int_array(tok, 8, stack, 256, &t, &n) < 0) {
        return NULL;
    }
    uint32_t bs = pdx_hasher_block_size(o->h);
    size_t max = n / bs;
    pdx_block_hash_t *out = PyMem_Malloc((max ? max : 1) * sizeof(*out));
    PyObject *res = NULL;
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    pdx_block_hash_t tail;
    int has_tail = 0;
    size_t nb = 0;
    PDXPY_CALL_DECL(call, "hash_blocks");
    PDXPY_CALL(&call, pdx_hasher_hash_blocks(o->h, t, n, &extra, out, max, &nb,
                                             want_tail ? &tail : NULL,
                                             want_tail ? &has_tail : NULL));
    if (call.st != PDX_OK) {
        pdxpy_call_raise(&call);
        goto done;
    }
    PyObject *l = PyList_New((Py_ssize_t)nb);
    for (size_t i = 0; l != NULL && i < nb; i++) {
        PyObject *b = hash_bytes(&out[i]);
        if (b == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, b);
    }
    if (l == NULL || !want_tail) {
        res = l;
        goto done;
    }
    res = Py_BuildValue("(NN)", l,
                        has_tail ? hash_bytes(&tail) : Py_NewRef(Py_None));
done:
    PyMem_Free(out);
    if (t != stack) {
        PyMem_Free(t);
    }
    return res;
}

static PyObject *Hasher_hash_next(HasherObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"parent", "tokens", "lora_name", "cache_salt",
                             NULL};
    PyObject *parent, *tok, *lora = Py_None, *salt = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OO", kwlist, &parent, &tok,
                                     &lora, &salt)) {
        return NULL;
    }
    pdx_hash_extra_t extra;
    pdx_block_hash_t ph, out;
    if (parse_extra(lora, salt, &extra) < 0 ||
        (parent != Py_None && pdxpy_hash_from(parent, &ph) < 0)) {
        return NULL;
    }
    uint64_t stack[512];
    void *t;
    size_t n;
    if (pdxpy_int_array(tok, 8, stack, 512, &t, &n) < 0) {
        return NULL;
    }
    pdx_status_t st = pdx_hasher_hash_next(o->h, parent == Py_None ? NULL : &ph,
                                           t, n, &extra, &out);
    if (t != stack) {
        PyMem_Free(t);
    }
    if (st != PDX_OK) {
        return pdxpy_raise(st, "hash_next", NULL);
    }
    return hash_bytes(&out);
}

static PyObject *Hasher_get(HasherObject *o, void *which)
{
    switch ((intptr_t)which) {
    case 0: {
        pdx_block_hash_t h;
        pdx_hasher_none_hash(o->h, &h);
        return hash_bytes(&h);
    }
    case 1:
        return PyUnicode_FromString(
            pdx_hash_algo_to_string(pdx_hasher_algo(o->h)));
    default:
        return PyLong_FromUnsignedLong(pdx_hasher_block_size(o->h));
    }
}

static PyMethodDef Hasher_methods[] = {
    {"hash_blocks", (PyCFunction)(void (*)(void))Hasher_hash_blocks,
     METH_VARARGS | METH_KEYWORDS,
     "hash_blocks(tokens, *, lora_name=None, cache_salt=None, tail=False) "
     "-> [bytes] (or ([bytes], tail_or_None) with tail=True): vLLM's block "
     "hashes of the full blocks; tokens a list or integer array."},
    {"hash_next", (PyCFunction)(void (*)(void))Hasher_hash_next,
     METH_VARARGS | METH_KEYWORDS,
     "hash_next(parent, tokens, *, lora_name=None, cache_salt=None) -> "
     "bytes: one block given its parent (None for the first)."},
    {0},
};

static PyGetSetDef Hasher_getset[] = {
    {"none_hash", (getter)(void (*)(void))Hasher_get, NULL,
     "NONE_HASH of the seed", (void *)0},
    {"algo", (getter)(void (*)(void))Hasher_get, NULL, "vLLM's algorithm name",
     (void *)1},
    {"block_size", (getter)(void (*)(void))Hasher_get, NULL, "tokens per block",
     (void *)2},
    {0},
};

PyTypeObject pdxpy_HasherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.Hasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_dealloc = (destructor)(void (*)(void))Hasher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Hasher(algo, seed, block_size): vLLM prefix-cache block "
              "hashes ('xxhash_cbor' or 'sha256_cbor', seed as "
              "PYTHONHASHSEED).",
    .tp_methods = Hasher_methods,
    .tp_getset = Hasher_getset,
    .tp_new = Hasher_new,
};
