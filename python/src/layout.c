/* pdx.Layout: the KV arenas (GLM-5.2 or from a config), their memory,
 * carving and block descriptors. */
#include "pdxpy_int.h"

#include <string.h>

/* ----------------------------------------------------------------- Layout */

static PyObject *layout_wrap(PyTypeObject *cls, pdx_layout_h h)
{
    LayoutObject *o = (LayoutObject *)cls->tp_alloc(cls, 0);
    if (o == NULL) {
        pdx_layout_destroy(h);
        return NULL;
    }
    o->h = h;
    o->keep = PyList_New(0);
    if (o->keep == NULL) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static PyObject *Layout_new(PyTypeObject *t, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"block_tokens", NULL};
    unsigned int bt;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I", kwlist, &bt)) {
        return NULL;
    }
    pdx_layout_h h;
    pdx_status_t st = pdx_layout_create(bt, &h);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "Layout", NULL);
    }
    return layout_wrap(t, h);
}

static void Layout_dealloc(LayoutObject *o)
{
    pdx_layout_destroy(o->h);
    Py_XDECREF(o->keep);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyObject *Layout_glm52(PyTypeObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"num_blocks", "mem_type", "device", NULL};
    unsigned long long nb;
    PyObject *mt = Py_None;
    unsigned int dev = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|OI", kwlist, &nb, &mt,
                                     &dev)) {
        return NULL;
    }
    pdx_mem_type_t t;
    if (pdxpy_mem_type(mt, PDX_MEM_DRAM, &t) < 0) {
        return NULL;
    }
    pdx_layout_h h;
    pdx_status_t st = pdx_layout_glm52(nb, t, dev, &h);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "Layout.glm52", NULL);
    }
    return layout_wrap(cls, h);
}

static PyObject *Layout_from_config(PyTypeObject *cls, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &pdxpy_KVConfigType)) {
        PyErr_SetString(PyExc_TypeError, "from_config: a pdx.KVConfig");
        return NULL;
    }
    pdx_layout_h h;
    pdx_status_t st = pdx_kv_config_layout(((KVConfigObject *)arg)->cfg, &h);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "Layout.from_config", NULL);
    }
    return layout_wrap(cls, h);
}

static int layout_mutable(LayoutObject *o)
{
    if (o->frozen) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_BUSY),
                        "layout is in use by a KVConnector: build a new one");
        return -1;
    }
    return 0;
}

static int kind_of(PyObject *o, pdx_kv_kind_t *k)
{
    if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);
        if (v >= 0 && v <= PDX_KV_KIND_KV) {
            *k = (pdx_kv_kind_t)v;
            return 0;
        }
    } else if (PyUnicode_Check(o)) {
        for (int i = 0; i <= PDX_KV_KIND_KV; i++) {
            if (PyUnicode_CompareWithASCIIString(
                    o, pdx_kv_kind_to_string((pdx_kv_kind_t)i)) == 0) {
                *k = (pdx_kv_kind_t)i;
                return 0;
            }
        }
    }
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "arena kind: 'mla', 'index_k' or 'kv', not %R", o);
    return -1;
}

/* base: an int address, or a memory object (kept alive by the layout). */
static int base_of(LayoutObject *o, PyObject *b, uint64_t need, uint64_t *addr,
                   int *dev_set, uint32_t *dev, pdx_mem_type_t *mt)
{
    *dev_set = 0;
    if (PyLong_Check(b)) {
        *addr = PyLong_AsUnsignedLongLong(b);
        return PyErr_Occurred() ? -1 : 0;
    }
    pdxpy_mem_t m;
    if (pdxpy_mem_from_object(b, NULL, NULL, 2, &m) < 0) {
        return -1;
    }
    if (m.len < need) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_NO_SPACE),
                     "arena memory: %llu bytes, need %llu",
                     (unsigned long long)m.len, (unsigned long long)need);
        pdxpy_mem_clear(&m);
        return -1;
    }
    *addr = m.addr;
    *dev = m.dev;
    *mt = m.mem_type;
    *dev_set = 1;
    pdxpy_mem_clear(&m);
    return PyList_Append(o->keep, b);
}

static PyObject *Layout_add_arena(LayoutObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {
        "name",       "layer",  "kind",   "bytes_per_token",
        "num_blocks", "is_mtp", "stride", "base",
        "mem_type",   "device", NULL};
    const char *name;
    unsigned int layer, bpt;
    unsigned long long nb;
    PyObject *kind, *stride = Py_None, *base = Py_None, *mt = Py_None,
                    *dev = Py_None;
    int is_mtp = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sIOIK|$pOOOO", kwlist, &name,
                                     &layer, &kind, &bpt, &nb, &is_mtp, &stride,
                                     &base, &mt, &dev) ||
        layout_mutable(o) < 0) {
        return NULL;
    }
    pdx_arena_t a = {.field_mask = PDX_ARENA_FIELD_IS_MTP,
                     .name = name,
                     .layer = layer,
                     .is_mtp = is_mtp,
                     .bytes_per_token = bpt,
                     .num_blocks = nb};
    if (kind_of(kind, &a.kind) < 0) {
        return NULL;
    }
    uint64_t block = (uint64_t)bpt * pdx_layout_block_tokens(o->h);
    a.stride = block;
    if (stride != Py_None) {
        a.stride = PyLong_AsUnsignedLongLong(stride);
        if (PyErr_Occurred()) {
            return NULL;
        }
        a.field_mask |= PDX_ARENA_FIELD_STRIDE;
    }
    if (base != Py_None) {
        int dev_set;
        pdx_mem_type_t bmt = PDX_MEM_DRAM;
        if (base_of(o, base, nb * a.stride, &a.base, &dev_set, &a.dev_id,
                    &bmt) < 0) {
            return NULL;
        }
        a.field_mask |= PDX_ARENA_FIELD_BASE;
        if (dev_set) {
            a.mem_type = bmt;
            a.field_mask |= PDX_ARENA_FIELD_MEM_TYPE | PDX_ARENA_FIELD_DEV_ID;
        }
    }
    if (mt != Py_None) {
        if (pdxpy_mem_type(mt, PDX_MEM_DRAM, &a.mem_type) < 0) {
            return NULL;
        }
        a.field_mask |= PDX_ARENA_FIELD_MEM_TYPE;
    }
    if (dev != Py_None) {
        a.dev_id = (uint32_t)PyLong_AsUnsignedLong(dev);
        if (PyErr_Occurred()) {
            return NULL;
        }
        a.field_mask |= PDX_ARENA_FIELD_DEV_ID;
    }
    size_t idx;
    pdx_status_t st = pdx_layout_add_arena(o->h, &a, &idx);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "add_arena", NULL);
    }
    return PyLong_FromSize_t(idx);
}

static int arena_index(LayoutObject *o, PyObject *which, size_t *idx)
{
    if (PyUnicode_Check(which)) {
        const char *s = PyUnicode_AsUTF8(which);
        if (s == NULL) {
            return -1;
        }
        pdx_status_t st = pdx_layout_find_arena(o->h, s, idx);
        if (st != PDX_OK) {
            pdxpy_raise(st, "arena", NULL);
            return -1;
        }
        return 0;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(which, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (i < 0 || (size_t)i >= pdx_layout_num_arenas(o->h)) {
        PyErr_SetString(PyExc_IndexError, "arena index out of range");
        return -1;
    }
    *idx = (size_t)i;
    return 0;
}

static PyObject *Layout_set_base(LayoutObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"arena", "base", "device", NULL};
    PyObject *which, *base, *dev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &which, &base,
                                     &dev) ||
        layout_mutable(o) < 0) {
        return NULL;
    }
    size_t idx;
    pdx_arena_t a;
    if (arena_index(o, which, &idx) < 0) {
        return NULL;
    }
    pdx_layout_get_arena(o->h, idx, &a);
    uint64_t addr;
    uint32_t d = 0;
    int dev_set;
    pdx_mem_type_t bmt;
    if (base_of(o, base, a.num_blocks * a.stride, &addr, &dev_set, &d, &bmt) <
        0) {
        return NULL;
    }
    if (dev != Py_None) {
        d = (uint32_t)PyLong_AsUnsignedLong(dev);
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    pdx_status_t st = pdx_layout_set_base(o->h, idx, addr, d);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "set_base", NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *Layout_carve_size(LayoutObject *o, PyObject *args,
                                   PyObject *kw)
{
    static char *kwlist[] = {"align", NULL};
    unsigned long long align = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|K", kwlist, &align)) {
        return NULL;
    }
    uint64_t n = pdx_layout_carve_size(o->h, align);
    if (n == UINT64_MAX) {
        return pdxpy_raise(PDX_ERR_INVALID, "carve_size",
                           "carve_size: bad align or size overflow");
    }
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *Layout_carve(LayoutObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"memory", "align", "device", NULL};
    PyObject *mem, *dev = Py_None;
    unsigned long long align = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|KO", kwlist, &mem, &align,
                                     &dev) ||
        layout_mutable(o) < 0) {
        return NULL;
    }
    pdxpy_mem_t m;
    if (pdxpy_mem_from_object(mem, NULL, dev, 2, &m) < 0) {
        return NULL;
    }
    pdx_status_t st = pdx_layout_carve(o->h, m.addr, m.len, align, m.dev);
    pdxpy_mem_clear(&m);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "carve", NULL);
    }
    if (!PyLong_Check(mem) && PyList_Append(o->keep, mem) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *arena_dict(const pdx_arena_t *a, uint32_t bt)
{
    return Py_BuildValue(
        "{s:s,s:I,s:s,s:O,s:I,s:I,s:K,s:K,s:K,s:K,s:s,s:I}", "name", a->name,
        "layer", a->layer, "kind", pdx_kv_kind_to_string(a->kind), "is_mtp",
        a->is_mtp ? Py_True : Py_False, "bytes_per_token", a->bytes_per_token,
        "block_tokens", a->block_tokens ? a->block_tokens : bt, "num_blocks",
        (unsigned long long)a->num_blocks, "block_bytes",
        (unsigned long long)a->bytes_per_token *
            (a->block_tokens ? a->block_tokens : bt),
        "base", (unsigned long long)a->base, "stride",
        (unsigned long long)a->stride, "mem_type",
        a->mem_type == PDX_MEM_VRAM ? "VRAM" : "DRAM", "device", a->dev_id);
}

static PyObject *Layout_arenas(LayoutObject *o, PyObject *u)
{
    size_t n = pdx_layout_num_arenas(o->h);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l != NULL && i < n; i++) {
        pdx_arena_t a;
        pdx_layout_get_arena(o->h, i, &a);
        PyObject *d = arena_dict(&a, pdx_layout_block_tokens(o->h));
        if (d == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    return l;
}

static PyObject *Layout_block_descs(LayoutObject *o, PyObject *args,
                                    PyObject *kw)
{
    static char *kwlist[] = {"ids", "merged", NULL};
    PyObject *ids;
    int merged = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p", kwlist, &ids, &merged)) {
        return NULL;
    }
    uint64_t stack[256];
    void *v;
    size_t n;
    if (pdxpy_int_array(ids, 8, stack, 256, &v, &n) < 0) {
        return NULL;
    }
    size_t cap = pdx_layout_num_arenas(o->h) * n, cnt = 0;
    PyObject *res = NULL;
    DescListObject *d = pdxpy_desclist_new(cap, pdx_layout_mem_type(o->h));
    if (d == NULL) {
        goto out;
    }
    pdx_desc_t *buf = d->descs;
    pdx_status_t st = merged
                          ? pdx_layout_merged_descs(o->h, v, n, buf, cap, &cnt)
                          : pdx_layout_block_descs(o->h, v, n, buf, cap, &cnt);
    if (st != PDX_OK) {
        Py_DECREF(d);
        pdxpy_raise(st, "block_descs", NULL);
        goto out;
    }
    d->count = cnt;
    res = (PyObject *)d;
out:
    if (v != stack) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *Layout_get(LayoutObject *o, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromSize_t(pdx_layout_num_arenas(o->h));
    case 1:
        return PyLong_FromUnsignedLong(pdx_layout_block_tokens(o->h));
    case 2:
        return PyLong_FromUnsignedLongLong(pdx_layout_num_blocks(o->h));
    case 3:
        return PyLong_FromUnsignedLongLong(pdx_layout_bytes_per_block(o->h));
    case 4:
        return PyLong_FromUnsignedLongLong(pdx_layout_fingerprint(o->h));
    default:
        return PyUnicode_FromString(
            pdx_layout_mem_type(o->h) == PDX_MEM_VRAM ? "VRAM" : "DRAM");
    }
}

static Py_ssize_t Layout_len(LayoutObject *o)
{
    return (Py_ssize_t)pdx_layout_num_arenas(o->h);
}

static PyMethodDef Layout_methods[] = {
    {"glm52", (PyCFunction)(void (*)(void))Layout_glm52,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Layout.glm52(num_blocks, mem_type='DRAM', device=0): the GLM-5.2 "
     "FP8+MTP reference layout (101 arenas)."},
    {"from_config", (PyCFunction)(void (*)(void))Layout_from_config,
     METH_O | METH_CLASS,
     "Layout.from_config(cfg): the layout a KVConfig describes (bases 0)."},
    {"add_arena", (PyCFunction)(void (*)(void))Layout_add_arena,
     METH_VARARGS | METH_KEYWORDS,
     "add_arena(name, layer, kind, bytes_per_token, num_blocks, *, "
     "is_mtp=False, stride=None, base=None, mem_type=None, device=None) -> "
     "index. base: an address or a memory object (buffer, tensor)."},
    {"set_base", (PyCFunction)(void (*)(void))Layout_set_base,
     METH_VARARGS | METH_KEYWORDS,
     "set_base(arena, base, device=None): arena by index or name; base an "
     "address or a memory object (kept alive)."},
    {"carve_size", (PyCFunction)(void (*)(void))Layout_carve_size,
     METH_VARARGS | METH_KEYWORDS, "carve_size(align=4096) -> bytes"},
    {"carve", (PyCFunction)(void (*)(void))Layout_carve,
     METH_VARARGS | METH_KEYWORDS,
     "carve(memory, align=4096, device=None): place every arena in one "
     "buffer (kept alive by the layout)."},
    {"arenas", (PyCFunction)(void (*)(void))Layout_arenas, METH_NOARGS,
     "arenas() -> [dict]"},
    {"block_descs", (PyCFunction)(void (*)(void))Layout_block_descs,
     METH_VARARGS | METH_KEYWORDS,
     "block_descs(ids, *, merged=False) -> DescList: per arena, per id."},
    {0},
};

static PyGetSetDef Layout_getset[] = {
    {"num_arenas", (getter)(void (*)(void))Layout_get, NULL, NULL, (void *)0},
    {"block_tokens", (getter)(void (*)(void))Layout_get, NULL, NULL, (void *)1},
    {"num_blocks", (getter)(void (*)(void))Layout_get, NULL, "usable block ids",
     (void *)2},
    {"bytes_per_block", (getter)(void (*)(void))Layout_get, NULL, NULL,
     (void *)3},
    {"fingerprint", (getter)(void (*)(void))Layout_get, NULL,
     "XXH3-64 of the shape", (void *)4},
    {"mem_type", (getter)(void (*)(void))Layout_get, NULL, NULL, (void *)5},
    {0},
};

static PySequenceMethods Layout_seq = {.sq_length =
                                           (lenfunc)(void (*)(void))Layout_len};

PyTypeObject pdxpy_LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.Layout",
    .tp_basicsize = sizeof(LayoutObject),
    .tp_dealloc = (destructor)(void (*)(void))Layout_dealloc,
    .tp_as_sequence = &Layout_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Layout(block_tokens): a model's KV as arenas sharing block "
              "ids.",
    .tp_methods = Layout_methods,
    .tp_getset = Layout_getset,
    .tp_new = Layout_new,
};
