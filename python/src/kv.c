/* The connector layer in Python: KVConfig (a loaded JSON config, kept in
 * C: pdx_kv_config_t points into itself), Hasher (vLLM-compatible block
 * hashes), Layout (arenas) and KVConnector (lookup, load, save, request
 * finished, progress, freed lists; handoff parameters as dicts). */
#include "pdxpy.h"

#include <string.h>

static PyObject *g_json_dumps, *g_json_loads;

static int json_init(void)
{
    if (g_json_dumps != NULL) {
        return 0;
    }
    PyObject *m = PyImport_ImportModule("json");
    if (m == NULL) {
        return -1;
    }
    g_json_dumps = PyObject_GetAttrString(m, "dumps");
    g_json_loads = PyObject_GetAttrString(m, "loads");
    Py_DECREF(m);
    return g_json_dumps && g_json_loads ? 0 : -1;
}

/* --------------------------------------------------------------- KVConfig */

typedef struct KVConfigObject {
    PyObject_HEAD pdx_kv_config_t *cfg;
} KVConfigObject;

static PyObject *config_wrap(PyTypeObject *cls, pdx_kv_config_t *cfg)
{
    KVConfigObject *c = (KVConfigObject *)cls->tp_alloc(cls, 0);
    if (c == NULL) {
        PyMem_Free(cfg);
        return NULL;
    }
    c->cfg = cfg;
    return (PyObject *)c;
}

static PyObject *KVConfig_load(PyTypeObject *cls, PyObject *arg)
{
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path)) {
        return NULL;
    }
    pdx_kv_config_t *cfg = PyMem_Calloc(1, sizeof(*cfg));
    if (cfg == NULL) {
        Py_DECREF(path);
        return PyErr_NoMemory();
    }
    char err[1024] = "";
    pdx_status_t st;
    const char *p = PyBytes_AS_STRING(path);
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_config_load(p, cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS Py_DECREF(path);
    if (st != PDX_OK) {
        PyMem_Free(cfg);
        return pdxpy_raise(st, "config load", err[0] ? err : NULL);
    }
    return config_wrap(cls, cfg);
}

static PyObject *KVConfig_parse(PyTypeObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"text", "name", NULL};
    const char *text, *name = "<string>";
    Py_ssize_t len;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s#|s", kwlist, &text, &len,
                                     &name)) {
        return NULL;
    }
    pdx_kv_config_t *cfg = PyMem_Calloc(1, sizeof(*cfg));
    if (cfg == NULL) {
        return PyErr_NoMemory();
    }
    char err[1024] = "";
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS /* up to 1 MiB of JSON; text is immutable */
        st =
            pdx_kv_config_parse(text, (size_t)len, name, cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS if (st != PDX_OK)
    {
        PyMem_Free(cfg);
        return pdxpy_raise(st, "config parse", err[0] ? err : NULL);
    }
    return config_wrap(cls, cfg);
}

static void KVConfig_dealloc(KVConfigObject *c)
{
    PyMem_Free(c->cfg);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *KVConfig_new(PyTypeObject *t, PyObject *a, PyObject *k)
{
    PyErr_SetString(PyExc_TypeError,
                    "use KVConfig.load(path) or KVConfig.parse(text)");
    return NULL;
}

enum {
    CF_SOURCE,
    CF_MODEL,
    CF_ROLE,
    CF_AGENT,
    CF_PEER,
    CF_PEER_ADDR,
    CF_DP_SIZE,
    CF_DP_RANK,
    CF_TP_SIZE,
    CF_TP_RANK,
    CF_DTYPE,
    CF_LAYERS,
    CF_MLA,
    CF_IDXK,
    CF_IDXK_LAYERS,
    CF_MTP,
    CF_BLOCK_TOKENS,
    CF_NUM_BLOCKS,
    CF_BPB,
    CF_MEM,
    CF_DEVICE,
    CF_ALGO,
    CF_SEED,
    CF_BACKENDS,
    CF_CHILDREN,
    CF_NARENAS,
};

static PyObject *children_list(const pdx_kv_config_t *c)
{
    static const char *modes[] = {"read_write", "save_only", "load_only"};
    PyObject *l = PyList_New(0);
    for (uint32_t i = 0; l != NULL && i < c->nchildren; i++) {
        const pdx_kv_child_config_t *ch = &c->children[i];
        PyObject *d;
        if (ch->type == PDX_KV_CHILD_REMOTE) {
            d = Py_BuildValue(
                "{s:s,s:I,s:I,s:s,s:O}", "type", "remote", "lease_ms",
                ch->lease_ms, "heartbeat_ms", ch->heartbeat_ms,
                "failure_policy",
                ch->failure_policy == PDX_KV_FAIL_FAIL ? "fail" : "recompute",
                "load_tail", ch->load_tail ? Py_True : Py_False);
        } else {
            d = Py_BuildValue(
                "{s:s,s:s,s:K,s:I,s:O,s:I,s:O}", "type", "offload", "mode",
                modes[ch->mode <= 2 ? ch->mode : 0], "budget_bytes",
                (unsigned long long)ch->budget_bytes, "ranks_per_host",
                ch->ranks_per_host, "wait_for_full_prefix",
                ch->wait_for_full_prefix ? Py_True : Py_False,
                "wait_timeout_ms", ch->wait_timeout_ms, "save_tail",
                ch->save_tail ? Py_True : Py_False);
        }
        if (d == NULL || PyList_Append(l, d) < 0) {
            Py_XDECREF(d);
            Py_CLEAR(l);
        } else {
            Py_DECREF(d);
        }
    }
    return l;
}

static PyObject *backends_list(const pdx_kv_config_t *c)
{
    PyObject *l = PyList_New(0);
    for (uint32_t b = 0; l != NULL && b < c->nbackends; b++) {
        pdx_kv_t opts[PDX_KV_MAX_BACKEND_OPTS];
        size_t n =
            pdx_kv_config_backend_opts(c, b, opts, PDX_KV_MAX_BACKEND_OPTS);
        PyObject *o = PyDict_New();
        for (size_t i = 0; o != NULL && i < n && i < PDX_KV_MAX_BACKEND_OPTS;
             i++) {
            PyObject *v = PyUnicode_FromString(opts[i].value);
            if (v == NULL || PyDict_SetItemString(o, opts[i].key, v) < 0) {
                Py_CLEAR(o);
            }
            Py_XDECREF(v);
        }
        PyObject *d =
            o ? Py_BuildValue("{s:s,s:N}", "name", c->backends[b], "options", o)
              : NULL;
        if (d == NULL || PyList_Append(l, d) < 0) {
            Py_CLEAR(l);
        }
        Py_XDECREF(d);
    }
    return l;
}

static PyObject *KVConfig_get(KVConfigObject *o, void *which)
{
    const pdx_kv_config_t *c = o->cfg;
    switch ((intptr_t)which) {
    case CF_SOURCE:
        return PyUnicode_FromString(c->source);
    case CF_MODEL:
        return PyUnicode_FromString(c->model_id);
    case CF_ROLE:
        return PyUnicode_FromString(c->role == PDX_KV_ROLE_PRODUCER ? "producer"
                                    : c->role == PDX_KV_ROLE_CONSUMER
                                        ? "consumer"
                                        : "both");
    case CF_AGENT:
        return PyUnicode_FromString(c->agent_name);
    case CF_PEER:
        return PyUnicode_FromString(c->peer_name);
    case CF_PEER_ADDR:
        return PyUnicode_FromString(c->peer_address);
    case CF_DP_SIZE:
        return PyLong_FromUnsignedLong(c->dp_size);
    case CF_DP_RANK:
        return PyLong_FromUnsignedLong(c->dp_rank);
    case CF_TP_SIZE:
        return PyLong_FromUnsignedLong(c->tp_size);
    case CF_TP_RANK:
        return PyLong_FromUnsignedLong(c->tp_rank);
    case CF_DTYPE:
        return PyUnicode_FromString(c->kv_dtype);
    case CF_LAYERS:
        return PyLong_FromUnsignedLong(c->num_layers);
    case CF_MLA:
        return PyLong_FromUnsignedLong(c->mla_bytes_per_token);
    case CF_IDXK:
        return PyLong_FromUnsignedLong(c->index_k_bytes_per_token);
    case CF_IDXK_LAYERS: {
        PyObject *l = PyList_New(c->n_index_k_layers);
        for (uint32_t i = 0; l != NULL && i < c->n_index_k_layers; i++) {
            PyList_SET_ITEM(l, i,
                            PyLong_FromUnsignedLong(c->index_k_layers[i]));
        }
        return l;
    }
    case CF_MTP:
        return PyLong_FromUnsignedLong(c->mtp_layers);
    case CF_BLOCK_TOKENS:
        return PyLong_FromUnsignedLong(c->block_tokens);
    case CF_NUM_BLOCKS:
        return PyLong_FromUnsignedLong(c->num_blocks);
    case CF_BPB:
        return PyLong_FromUnsignedLongLong(c->bytes_per_block);
    case CF_MEM:
        return PyUnicode_FromString(c->mem_type == PDX_MEM_VRAM ? "VRAM"
                                                                : "DRAM");
    case CF_DEVICE:
        return PyLong_FromUnsignedLong(c->device);
    case CF_ALGO:
        return PyUnicode_FromString(c->hash_algo);
    case CF_SEED:
        return PyUnicode_FromString(c->hash_seed);
    case CF_BACKENDS:
        return backends_list(c);
    case CF_CHILDREN:
        return children_list(c);
    default:
        return PyLong_FromUnsignedLong(pdx_kv_config_num_arenas(c));
    }
}

static int KVConfig_set(KVConfigObject *o, PyObject *v, void *which)
{
    pdx_kv_config_t *c = o->cfg;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete");
        return -1;
    }
    switch ((intptr_t)which) {
    case CF_NUM_BLOCKS: {
        unsigned long n = PyLong_AsUnsignedLong(v);
        if (PyErr_Occurred()) {
            return -1;
        }
        if (n == 0 || n > UINT32_MAX) {
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                            "num_blocks: 1..2**32-1");
            return -1;
        }
        c->num_blocks = (uint32_t)n;
        return 0;
    }
    case CF_MEM: {
        pdx_mem_type_t t;
        if (pdxpy_mem_type(v, c->mem_type, &t) < 0) {
            return -1;
        }
        c->mem_type = t;
        return 0;
    }
    case CF_DEVICE: {
        unsigned long n = PyLong_AsUnsignedLong(v);
        if (PyErr_Occurred()) {
            return -1;
        }
        c->device = (uint32_t)n;
        return 0;
    }
    case CF_AGENT:
    case CF_PEER: {
        const char *s = PyUnicode_AsUTF8(v);
        if (s == NULL) {
            return -1;
        }
        if (strlen(s) >= PDX_NAME_MAX) {
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID), "name too long");
            return -1;
        }
        char *dst = (intptr_t)which == CF_AGENT ? c->agent_name : c->peer_name;
        snprintf(dst, 64, "%s", s);
        return 0;
    }
    }
    PyErr_SetString(PyExc_AttributeError, "read-only");
    return -1;
}

#define CFG(name, id, doc)                                                     \
    {                                                                          \
        name, (getter)(void (*)(void))KVConfig_get, NULL, doc,                 \
            (void *)(intptr_t)(id)                                             \
    }
#define CFGW(name, id, doc)                                                    \
    {                                                                          \
        name, (getter)(void (*)(void))KVConfig_get,                            \
            (setter)(void (*)(void))KVConfig_set, doc, (void *)(intptr_t)(id)  \
    }

static PyGetSetDef KVConfig_getset[] = {
    CFG("source", CF_SOURCE, "file the config came from"),
    CFG("model_id", CF_MODEL, "model id"),
    CFG("role", CF_ROLE, "'producer', 'consumer' or 'both'"),
    CFGW("agent_name", CF_AGENT, "agent name"),
    CFGW("peer_name", CF_PEER, "peer agent name"),
    CFG("peer_address", CF_PEER_ADDR, "where the peer's blob is found"),
    CFG("dp_size", CF_DP_SIZE, NULL),
    CFG("dp_rank", CF_DP_RANK, NULL),
    CFG("tp_size", CF_TP_SIZE, NULL),
    CFG("tp_rank", CF_TP_RANK, NULL),
    CFG("kv_dtype", CF_DTYPE, NULL),
    CFG("num_layers", CF_LAYERS, NULL),
    CFG("mla_bytes_per_token", CF_MLA, NULL),
    CFG("index_k_bytes_per_token", CF_IDXK, NULL),
    CFG("index_k_layers", CF_IDXK_LAYERS, NULL),
    CFG("mtp_layers", CF_MTP, NULL),
    CFG("block_tokens", CF_BLOCK_TOKENS, NULL),
    CFGW("num_blocks", CF_NUM_BLOCKS, "KV blocks per arena (settable)"),
    CFG("bytes_per_block", CF_BPB, "KV bytes of one block over all arenas"),
    CFGW("mem_type", CF_MEM, "'DRAM' or 'VRAM' (settable)"),
    CFGW("device", CF_DEVICE, "CUDA device (settable)"),
    CFG("hash_algo", CF_ALGO, NULL),
    CFG("hash_seed", CF_SEED, NULL),
    CFG("backends", CF_BACKENDS, "[{'name', 'options'}]"),
    CFG("children", CF_CHILDREN, "the MultiConnector's children, in order"),
    CFG("num_arenas", CF_NARENAS, "arenas of the layout it describes"),
    {0},
};

static PyMethodDef KVConfig_methods[] = {
    {"load", (PyCFunction)(void (*)(void))KVConfig_load, METH_O | METH_CLASS,
     "KVConfig.load(path): load and validate a JSON config; "
     "pdx.ConfigError names the file and the JSON path."},
    {"parse", (PyCFunction)(void (*)(void))KVConfig_parse,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "KVConfig.parse(text, name='<string>'): the same from JSON text."},
    {0},
};

PyTypeObject pdxpy_KVConfigType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.KVConfig",
    .tp_basicsize = sizeof(KVConfigObject),
    .tp_dealloc = (destructor)(void (*)(void))KVConfig_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A deployment config (configs/README.md), held in C.",
    .tp_methods = KVConfig_methods,
    .tp_getset = KVConfig_getset,
    .tp_new = KVConfig_new,
};

/* ----------------------------------------------------------------- Hasher */

typedef struct HasherObject {
    PyObject_HEAD pdx_hasher_h h;
} HasherObject;

static PyObject *hash_bytes(const pdx_block_hash_t *h)
{
    return PyBytes_FromStringAndSize((const char *)h->bytes, h->len);
}

static int hash_from(PyObject *o, pdx_block_hash_t *h)
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
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_hasher_hash_blocks(
        o->h, t, n, &extra, out, max, &nb, want_tail ? &tail : NULL,
        want_tail ? &has_tail : NULL);
    Py_END_ALLOW_THREADS if (st != PDX_OK)
    {
        pdxpy_raise(st, "hash_blocks", NULL);
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
        (parent != Py_None && hash_from(parent, &ph) < 0)) {
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

/* ----------------------------------------------------------------- Layout */

typedef struct LayoutObject {
    PyObject_HEAD pdx_layout_h h;
    PyObject *keep; /* list: memory owners the arenas point into */
    int frozen;     /* in use by a connector */
} LayoutObject;

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

/* ------------------------------------------------------------ KVConnector */

typedef struct KVConnObject {
    PyObject_HEAD pdx_kv_connector_h h;
    int closing;
    int uses;
    PyObject *layout;
    PyObject *config;
    PyObject *name;
} KVConnObject;

static int conn_enter(KVConnObject *c)
{
    if (c->h == NULL || c->closing) {
        pdxpy_closed("connector is closed");
        return -1;
    }
    c->uses++;
    return 0;
}

#define conn_leave(c) ((c)->uses--)

static int KVConn_init(KVConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"config", "layout", "progress_thread",
                             "xfer_timeout", NULL};
    PyObject *cfg, *lay, *timeout = Py_None;
    int progress = 1;
    if (self->h != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!O!|$pO", kwlist, &pdxpy_KVConfigType, &cfg,
            &pdxpy_LayoutType, &lay, &progress, &timeout)) {
        return -1;
    }
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags =
                                 progress ? PDX_AGENT_F_PROGRESS_THREAD : 0};
    if (timeout != Py_None) {
        double t;
        if (pdxpy_timeout_arg(timeout, "xfer_timeout", 0, &t) < 0) {
            return -1;
        }
        if (t * 1000.0 > (double)UINT32_MAX) {
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                            "xfer_timeout: seconds, 0 (never) or more");
            return -1;
        }
        ap.field_mask |= PDX_AGENT_PARAM_XFER_TIMEOUT;
        ap.xfer_timeout_ms = (uint32_t)(t * 1000.0 + 0.5);
    }
    LayoutObject *l = (LayoutObject *)lay;
    pdx_kv_connector_params_t p = {.field_mask = PDX_KV_PARAM_CONFIG |
                                                 PDX_KV_PARAM_LAYOUT |
                                                 PDX_KV_PARAM_AGENT_PARAMS,
                                   .config = ((KVConfigObject *)cfg)->cfg,
                                   .layout = l->h,
                                   .agent_params = &ap};
    pdx_kv_connector_h h = NULL;
    pdx_status_t st;
    char err[2048];
    l->frozen++;
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_connector_create(&p, &h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "connector create");
    }
    Py_END_ALLOW_THREADS if (st != PDX_OK)
    {
        l->frozen--;
        pdxpy_raise(st, "connector create", err);
        return -1;
    }
    self->h = h;
    self->layout = Py_NewRef(lay);
    self->config = Py_NewRef(cfg);
    self->name =
        PyUnicode_FromString(pdx_agent_name(pdx_kv_connector_agent(h)));
    return self->name ? 0 : -1;
}

static void conn_close(KVConnObject *c)
{
    if (c->h == NULL) {
        return;
    }
    c->closing = 1;
    pdxpy_wait_unused(&c->uses);
    pdx_kv_connector_h h = c->h;
    c->h = NULL;
    Py_BEGIN_ALLOW_THREADS pdx_kv_connector_destroy(h);
    Py_END_ALLOW_THREADS if (c->layout != NULL)
    {
        ((LayoutObject *)c->layout)->frozen--;
    }
}

static void KVConn_dealloc(KVConnObject *c)
{
    conn_close(c);
    Py_XDECREF(c->layout);
    Py_XDECREF(c->config);
    Py_XDECREF(c->name);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *KVConn_close(KVConnObject *c, PyObject *u)
{
    conn_close(c);
    Py_RETURN_NONE;
}

static PyObject *KVConn_enter(KVConnObject *c, PyObject *u)
{
    if (c->h == NULL) {
        return pdxpy_closed("connector is closed");
    }
    return Py_NewRef(c);
}

static PyObject *KVConn_exit(KVConnObject *c, PyObject *a)
{
    conn_close(c);
    Py_RETURN_FALSE;
}

static PyObject *KVConn_describe(KVConnObject *c, PyObject *u)
{
    if (conn_enter(c) < 0) {
        return NULL;
    }
    void *blob;
    size_t len;
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_connector_describe(c->h, &blob, &len);
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "describe", NULL);
    }
    PyObject *r = PyBytes_FromStringAndSize(blob, (Py_ssize_t)len);
    pdx_blob_free(blob);
    return r;
}

static PyObject *KVConn_connect(KVConnObject *c, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (conn_enter(c) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char name[PDX_NAME_MAX] = "";
    char err[2048];
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st =
        pdx_kv_connector_connect(c->h, v.buf, (size_t)v.len, name);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "connect");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    PyBuffer_Release(&v);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "connect", err);
    }
    return PyUnicode_FromString(name);
}

static PyObject *KVConn_peer_state(KVConnObject *c, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || conn_enter(c) < 0) {
        return NULL;
    }
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st =
        pdx_peer_state(pdx_kv_connector_agent(c->h), name);
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st == PDX_OK) {
        return PyUnicode_FromString("alive");
    }
    if (st == PDX_ERR_REMOTE_DISCONNECT) {
        return PyUnicode_FromString("disconnected");
    }
    return pdxpy_raise(st, "peer_state", NULL);
}

/* A request from a dict or an object with the same attributes: req_id,
 * hashes, prompt_tokens, tail_hash (None), tail_tokens (0), params (dict,
 * str or None). */
typedef struct kvreq {
    pdx_kv_request_t r;
    pdx_block_hash_t *hashes;
    PyObject *id;     /* keeps r.req_id's UTF-8 alive */
    PyObject *params; /* str kept alive for r.params */
} kvreq_t;

static PyObject *field(PyObject *o, const char *name)
{
    if (PyDict_Check(o)) {
        PyObject *v = PyDict_GetItemString(o, name);
        return v ? Py_NewRef(v) : NULL;
    }
    PyObject *v = PyObject_GetAttrString(o, name);
    if (v == NULL) {
        PyErr_Clear();
    }
    return v;
}

static void kvreq_clear(kvreq_t *q)
{
    PyMem_Free(q->hashes);
    q->hashes = NULL;
    Py_CLEAR(q->params);
    Py_CLEAR(q->id);
}

static int params_text(PyObject *p, PyObject **out)
{
    *out = NULL;
    if (p == NULL || p == Py_None) {
        return 0;
    }
    if (PyUnicode_Check(p)) {
        *out = Py_NewRef(p);
        return 0;
    }
    if (PyBytes_Check(p)) {
        *out = PyUnicode_FromEncodedObject(p, "utf-8", "strict");
        return *out ? 0 : -1;
    }
    if (json_init() < 0) {
        return -1;
    }
    *out = PyObject_CallOneArg(g_json_dumps, p);
    return *out ? 0 : -1;
}

static int kvreq_parse(PyObject *o, kvreq_t *q)
{
    memset(q, 0, sizeof(*q));
    PyObject *id = field(o, "req_id"), *hashes = field(o, "hashes");
    PyObject *pt = field(o, "prompt_tokens"), *th = field(o, "tail_hash");
    PyObject *tt = field(o, "tail_tokens"), *pa = field(o, "params");
    int rc = -1;
    if (id == NULL || !PyUnicode_Check(id)) {
        PyErr_SetString(PyExc_TypeError, "request: req_id (str) missing");
        goto out;
    }
    q->r.req_id = PyUnicode_AsUTF8(id);
    if (q->r.req_id == NULL) {
        goto out;
    }
    if (hashes != NULL && hashes != Py_None) {
        PyObject *seq = PySequence_Fast(hashes, "request: hashes, a list of "
                                                "bytes");
        if (seq == NULL) {
            goto out;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        q->hashes = PyMem_Malloc(((size_t)n + 1) * sizeof(*q->hashes));
        if (q->hashes == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (hash_from(PySequence_Fast_GET_ITEM(seq, i), &q->hashes[i]) <
                0) {
                Py_DECREF(seq);
                goto out;
            }
        }
        Py_DECREF(seq);
        q->r.hashes = q->hashes;
        q->r.nfull = (size_t)n;
    }
    if (pt != NULL && pt != Py_None) {
        q->r.prompt_tokens = PyLong_AsSize_t(pt);
        if (PyErr_Occurred()) {
            goto out;
        }
    }
    if (th != NULL && th != Py_None) {
        if (hash_from(th, &q->r.tail_hash) < 0) {
            goto out;
        }
        q->r.has_tail = true;
        if (tt != NULL && tt != Py_None) {
            q->r.tail_tokens = (uint32_t)PyLong_AsUnsignedLong(tt);
            if (PyErr_Occurred()) {
                goto out;
            }
        }
    }
    if (params_text(pa, &q->params) < 0) {
        goto out;
    }
    if (q->params != NULL) {
        q->r.params = PyUnicode_AsUTF8(q->params);
        if (q->r.params == NULL) {
            goto out;
        }
    }
    q->id = id;
    id = NULL;
    rc = 0;
out:
    Py_XDECREF(id);
    Py_XDECREF(hashes);
    Py_XDECREF(pt);
    Py_XDECREF(th);
    Py_XDECREF(tt);
    Py_XDECREF(pa);
    if (rc < 0) {
        kvreq_clear(q);
    }
    return rc;
}

static const char *source_name(pdx_kv_source_t s)
{
    return s == PDX_KV_SOURCE_REMOTE    ? "remote"
           : s == PDX_KV_SOURCE_OFFLOAD ? "offload"
                                        : "none";
}

static PyObject *KVConn_lookup(KVConnObject *c, PyObject *arg)
{
    kvreq_t q;
    if (kvreq_parse(arg, &q) < 0) {
        return NULL;
    }
    if (conn_enter(c) < 0) {
        kvreq_clear(&q);
        return NULL;
    }
    pdx_kv_match_t m;
    memset(&m, 0, sizeof(m));
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_lookup(c->h, &q.r, &m);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "lookup");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    kvreq_clear(&q);
    if (st < 0) {
        return pdxpy_raise(st, "lookup", err);
    }
    if (st == PDX_INPROGRESS) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("{s:s,s:n,s:O,s:n}", "source", source_name(m.source),
                         "blocks", (Py_ssize_t)m.blocks, "tail",
                         m.tail ? Py_True : Py_False, "tokens",
                         (Py_ssize_t)m.tokens);
}

static int match_parse(PyObject *o, pdx_kv_match_t *m)
{
    memset(m, 0, sizeof(*m));
    PyObject *s = field(o, "source"), *b = field(o, "blocks");
    PyObject *t = field(o, "tail"), *k = field(o, "tokens");
    int rc = -1;
    if (s == NULL || b == NULL) {
        PyErr_SetString(PyExc_TypeError, "match: the dict lookup() returned");
        goto out;
    }
    if (PyUnicode_Check(s)) {
        m->source = PyUnicode_CompareWithASCIIString(s, "remote") == 0
                        ? PDX_KV_SOURCE_REMOTE
                    : PyUnicode_CompareWithASCIIString(s, "offload") == 0
                        ? PDX_KV_SOURCE_OFFLOAD
                        : PDX_KV_SOURCE_NONE;
    } else {
        m->source = (pdx_kv_source_t)PyLong_AsLong(s);
    }
    m->blocks = PyLong_AsSize_t(b);
    m->tail = t != NULL && PyObject_IsTrue(t) == 1;
    m->tokens = k != NULL ? PyLong_AsSize_t(k) : 0;
    rc = PyErr_Occurred() ? -1 : 0;
out:
    Py_XDECREF(s);
    Py_XDECREF(b);
    Py_XDECREF(t);
    Py_XDECREF(k);
    return rc;
}

static PyObject *KVConn_load(KVConnObject *c, PyObject *args)
{
    PyObject *req, *match, *ids;
    if (!PyArg_ParseTuple(args, "OOO", &req, &match, &ids)) {
        return NULL;
    }
    pdx_kv_match_t m;
    kvreq_t q;
    if (match_parse(match, &m) < 0 || kvreq_parse(req, &q) < 0) {
        return NULL;
    }
    uint64_t stack[256];
    void *v;
    size_t n;
    if (pdxpy_int_array(ids, 8, stack, 256, &v, &n) < 0) {
        kvreq_clear(&q);
        return NULL;
    }
    PyObject *res = NULL;
    if (n < m.blocks + (m.tail ? 1 : 0)) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "load: %zu block ids for %zu blocks%s", n, m.blocks,
                     m.tail ? " and a tail" : "");
        goto out;
    }
    if (conn_enter(c) < 0) {
        goto out;
    }
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_load(c->h, &q.r, &m, v);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "load");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st < 0) {
        pdxpy_raise(st, "load", err);
        goto out;
    }
    res = Py_NewRef(Py_None);
out:
    kvreq_clear(&q);
    if (v != stack) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *KVConn_load_check(KVConnObject *c, PyObject *arg)
{
    const char *id = PyUnicode_AsUTF8(arg);
    if (id == NULL || conn_enter(c) < 0) {
        return NULL;
    }
    size_t tokens = 0;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_load_check(c->h, id, &tokens);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "load_check");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st < 0) {
        return pdxpy_raise(st, "load_check", err);
    }
    if (st == PDX_INPROGRESS) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSize_t(tokens);
}

static PyObject *KVConn_str_call(KVConnObject *c, PyObject *arg, int which)
{
    const char *s = PyUnicode_AsUTF8(arg);
    PyObject *txt = NULL;
    if (s == NULL) {
        /* reject(params) also takes the dict request_finished returned */
        PyErr_Clear();
        if (which != 2 || params_text(arg, &txt) < 0 || txt == NULL ||
            (s = PyUnicode_AsUTF8(txt)) == NULL) {
            Py_XDECREF(txt);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "expected a str");
            }
            return NULL;
        }
    }
    if (conn_enter(c) < 0) {
        Py_XDECREF(txt);
        return NULL;
    }
    pdx_status_t st;
    char err[2048];
    static const char *names[] = {"load_abort", "save_check", "reject"};
    Py_BEGIN_ALLOW_THREADS st = which == 0   ? pdx_kv_load_abort(c->h, s)
                                : which == 1 ? pdx_kv_save_check(c->h, s)
                                             : pdx_kv_reject(c->h, s);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, names[which]);
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    Py_XDECREF(txt);
    if (st < 0) {
        return pdxpy_raise(st, names[which], err);
    }
    if (which == 1) {
        return PyBool_FromLong(st == PDX_OK);
    }
    Py_RETURN_NONE;
}

static PyObject *KVConn_load_abort(KVConnObject *c, PyObject *arg)
{
    return KVConn_str_call(c, arg, 0);
}

static PyObject *KVConn_save_check(KVConnObject *c, PyObject *arg)
{
    return KVConn_str_call(c, arg, 1);
}

static PyObject *KVConn_reject(KVConnObject *c, PyObject *arg)
{
    return KVConn_str_call(c, arg, 2);
}

static PyObject *KVConn_save(KVConnObject *c, PyObject *args)
{
    PyObject *req, *ids;
    if (!PyArg_ParseTuple(args, "OO", &req, &ids)) {
        return NULL;
    }
    kvreq_t q;
    if (kvreq_parse(req, &q) < 0) {
        return NULL;
    }
    uint64_t stack[256];
    void *v;
    size_t n;
    if (pdxpy_int_array(ids, 8, stack, 256, &v, &n) < 0) {
        kvreq_clear(&q);
        return NULL;
    }
    PyObject *res = NULL;
    if (n < q.r.nfull + (q.r.has_tail ? 1 : 0)) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "save: %zu block ids for %zu hashes%s", n, q.r.nfull,
                     q.r.has_tail ? " and a tail" : "");
        goto out;
    }
    if (conn_enter(c) < 0) {
        goto out;
    }
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_save(c->h, &q.r, v);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "save");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st < 0) {
        pdxpy_raise(st, "save", err);
        goto out;
    }
    res = Py_NewRef(Py_None);
out:
    kvreq_clear(&q);
    if (v != stack) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *KVConn_request_finished(KVConnObject *c, PyObject *args,
                                         PyObject *kw)
{
    static char *kwlist[] = {"req", "block_ids", "tokens", "source", NULL};
    PyObject *req, *ids = Py_None;
    Py_ssize_t tokens;
    const char *source = "arena";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOn|s", kwlist, &req, &ids,
                                     &tokens, &source)) {
        return NULL;
    }
    pdx_kv_handoff_from_t from;
    if (!strcmp(source, "arena")) {
        from = PDX_KV_FROM_ARENA;
    } else if (!strcmp(source, "pool")) {
        from = PDX_KV_FROM_POOL;
    } else {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "request_finished: source 'arena' or 'pool'");
        return NULL;
    }
    kvreq_t q;
    if (json_init() < 0 || kvreq_parse(req, &q) < 0) {
        return NULL;
    }
    uint64_t stack[256];
    void *v = NULL;
    size_t n = 0;
    if (ids != Py_None && pdxpy_int_array(ids, 8, stack, 256, &v, &n) < 0) {
        kvreq_clear(&q);
        return NULL;
    }
    PyObject *res = NULL;
    if (from == PDX_KV_FROM_ARENA && n < q.r.nfull + (q.r.has_tail ? 1 : 0)) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "request_finished: %zu block ids for %zu hashes%s", n,
                     q.r.nfull, q.r.has_tail ? " and a tail" : "");
        goto out;
    }
    if (conn_enter(c) < 0) {
        goto out;
    }
    char *params = NULL;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st =
        pdx_kv_request_finished(c->h, &q.r, v, (size_t)tokens, from, &params);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "request_finished");
    }
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st < 0) {
        pdxpy_raise(st, "request_finished", err);
        goto out;
    }
    if (params == NULL) {
        res = Py_NewRef(Py_None);
        goto out;
    }
    PyObject *txt = PyUnicode_FromString(params);
    pdx_kv_free(params);
    if (txt != NULL) {
        res = PyObject_CallOneArg(g_json_loads, txt);
        Py_DECREF(txt);
    }
out:
    kvreq_clear(&q);
    if (v != stack && v != NULL) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *KVConn_progress(KVConnObject *c, PyObject *u)
{
    if (conn_enter(c) < 0) {
        return NULL;
    }
    int n;
    Py_BEGIN_ALLOW_THREADS n = pdx_kv_progress(c->h);
    Py_END_ALLOW_THREADS conn_leave(c);
    return PyLong_FromLong(n);
}

typedef struct freed_vec {
    char (*ids)[PDX_KV_REQ_ID_MAX];
    int *why;
    size_t n, cap;
} freed_vec_t;

static void on_freed(void *arg, const char *id, pdx_kv_free_reason_t why)
{
    freed_vec_t *f = arg;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        void *a = realloc(f->ids, cap * sizeof(*f->ids));
        if (a == NULL) {
            return;
        }
        f->ids = a;
        void *b = realloc(f->why, cap * sizeof(*f->why));
        if (b == NULL) {
            return;
        }
        f->why = b;
        f->cap = cap;
    }
    snprintf(f->ids[f->n], PDX_KV_REQ_ID_MAX, "%s", id);
    f->why[f->n] = (int)why;
    f->n++;
}

static PyObject *KVConn_poll_freed(KVConnObject *c, PyObject *u)
{
    static const char *why[] = {"done", "reject", "expired"};
    if (conn_enter(c) < 0) {
        return NULL;
    }
    freed_vec_t f = {0};
    Py_BEGIN_ALLOW_THREADS pdx_kv_poll_freed(c->h, on_freed, &f);
    Py_END_ALLOW_THREADS conn_leave(c);
    PyObject *l = PyList_New(0);
    for (size_t i = 0; l != NULL && i < f.n; i++) {
        PyObject *t =
            Py_BuildValue("(ss)", f.ids[i],
                          why[f.why[i] >= 0 && f.why[i] <= 2 ? f.why[i] : 0]);
        if (t == NULL || PyList_Append(l, t) < 0) {
            Py_CLEAR(l);
        }
        Py_XDECREF(t);
    }
    free(f.ids);
    free(f.why);
    return l;
}

static PyObject *KVConn_held(KVConnObject *c, PyObject *u)
{
    if (conn_enter(c) < 0) {
        return NULL;
    }
    size_t n;
    Py_BEGIN_ALLOW_THREADS n = pdx_kv_held_requests(c->h);
    Py_END_ALLOW_THREADS conn_leave(c);
    return PyLong_FromSize_t(n);
}

static PyObject *KVConn_offload_stats(KVConnObject *c, PyObject *u)
{
    if (conn_enter(c) < 0) {
        return NULL;
    }
    pdx_offload_stats_t s;
    memset(&s, 0, sizeof(s));
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_kv_offload_stats(c->h, &s);
    Py_END_ALLOW_THREADS conn_leave(c);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "offload_stats", NULL);
    }
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
        "capacity_blocks", (unsigned long long)s.capacity_blocks, "block_bytes",
        (unsigned long long)s.block_bytes, "retained",
        (unsigned long long)s.blocks[PDX_OFFLOAD_RETAINED], "reclaimable",
        (unsigned long long)s.blocks[PDX_OFFLOAD_RECLAIMABLE], "leased_blocks",
        (unsigned long long)s.leased_blocks, "hits", (unsigned long long)s.hits,
        "misses", (unsigned long long)s.misses, "saves",
        (unsigned long long)s.saves, "dup_saves",
        (unsigned long long)s.dup_saves, "no_space",
        (unsigned long long)s.no_space, "dropped_saves",
        (unsigned long long)s.dropped_saves, "queued_saves",
        (unsigned long long)s.queued_saves, "bytes_saved",
        (unsigned long long)s.bytes_saved, "bytes_loaded",
        (unsigned long long)s.bytes_loaded);
}

static PyObject *KVConn_hasher(KVConnObject *c, PyObject *u)
{
    const pdx_kv_config_t *cfg = ((KVConfigObject *)c->config)->cfg;
    return PyObject_CallFunction((PyObject *)&pdxpy_HasherType, "ssI",
                                 cfg->hash_algo, cfg->hash_seed,
                                 cfg->block_tokens);
}

static PyObject *KVConn_check_params(KVConnObject *c, PyObject *arg)
{
    PyObject *txt;
    if (params_text(arg, &txt) < 0) {
        return NULL;
    }
    if (txt == NULL) {
        PyErr_SetString(PyExc_TypeError, "params: dict or str");
        return NULL;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(txt, &len);
    pdx_status_t st =
        s ? pdx_kv_params_check(
                s, (size_t)len,
                pdx_layout_num_arenas(((LayoutObject *)c->layout)->h))
          : PDX_ERR_INVALID;
    Py_DECREF(txt);
    if (s == NULL) {
        return NULL;
    }
    if (st != PDX_OK) {
        return pdxpy_raise(st, "check_params", NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *KVConn_get(KVConnObject *c, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return Py_NewRef(c->name ? c->name : Py_None);
    case 1:
        return Py_NewRef(c->layout ? c->layout : Py_None);
    case 2:
        return Py_NewRef(c->config ? c->config : Py_None);
    default:
        return PyBool_FromLong(c->h == NULL);
    }
}

static PyMethodDef KVConn_methods[] = {
    {"close", (PyCFunction)(void (*)(void))KVConn_close, METH_NOARGS,
     "Destroy (releases leases, aborts loads, waits for saves); "
     "idempotent."},
    {"__enter__", (PyCFunction)(void (*)(void))KVConn_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))KVConn_exit, METH_VARARGS, NULL},
    {"describe", (PyCFunction)(void (*)(void))KVConn_describe, METH_NOARGS,
     "describe() -> bytes: this node's blob for its peer."},
    {"connect", (PyCFunction)(void (*)(void))KVConn_connect, METH_O,
     "connect(blob) -> peer name (pdx.Mismatch names the field)."},
    {"peer_state", (PyCFunction)(void (*)(void))KVConn_peer_state, METH_O,
     "peer_state(name) -> 'alive' | 'disconnected'."},
    {"hasher", (PyCFunction)(void (*)(void))KVConn_hasher, METH_NOARGS,
     "hasher() -> Hasher with this config's algorithm, seed, block size."},
    {"lookup", (PyCFunction)(void (*)(void))KVConn_lookup, METH_O,
     "lookup(req) -> {'source', 'blocks', 'tail', 'tokens'}, or None while "
     "pending (ask again). req: a dict or object with req_id, hashes, "
     "prompt_tokens, tail_hash, tail_tokens, params."},
    {"load", (PyCFunction)(void (*)(void))KVConn_load, METH_VARARGS,
     "load(req, match, block_ids): start loading what lookup found."},
    {"load_check", (PyCFunction)(void (*)(void))KVConn_load_check, METH_O,
     "load_check(req_id) -> tokens loaded, or None in flight; raises on "
     "error (failure policy 'fail')."},
    {"load_abort", (PyCFunction)(void (*)(void))KVConn_load_abort, METH_O,
     "load_abort(req_id): then load_check until it is not None."},
    {"save", (PyCFunction)(void (*)(void))KVConn_save, METH_VARARGS,
     "save(req, block_ids): save to every child that saves (async)."},
    {"save_check", (PyCFunction)(void (*)(void))KVConn_save_check, METH_O,
     "save_check(req_id) -> True once saved, False before."},
    {"request_finished", (PyCFunction)(void (*)(void))KVConn_request_finished,
     METH_VARARGS | METH_KEYWORDS,
     "request_finished(req, block_ids, tokens, source='arena'|'pool') -> "
     "dict: the handoff parameters to carry to the peer."},
    {"reject", (PyCFunction)(void (*)(void))KVConn_reject, METH_O,
     "reject(params): the consumer will not read this handoff."},
    {"progress", (PyCFunction)(void (*)(void))KVConn_progress, METH_NOARGS,
     "Drive leases, heartbeats, notifications; returns events."},
    {"poll_freed", (PyCFunction)(void (*)(void))KVConn_poll_freed, METH_NOARGS,
     "poll_freed() -> [(req_id, 'done'|'reject'|'expired')]: held blocks "
     "freed since the last call (vLLM's finished_sending)."},
    {"held_requests", (PyCFunction)(void (*)(void))KVConn_held, METH_NOARGS,
     "Requests whose blocks are still held for a peer."},
    {"offload_stats", (PyCFunction)(void (*)(void))KVConn_offload_stats,
     METH_NOARGS, "The offload pool's counters."},
    {"check_params", (PyCFunction)(void (*)(void))KVConn_check_params, METH_O,
     "check_params(params): validate handoff parameters (pdx.Corrupt)."},
    {0},
};

static PyGetSetDef KVConn_getset[] = {
    {"name", (getter)(void (*)(void))KVConn_get, NULL, "agent name", (void *)0},
    {"layout", (getter)(void (*)(void))KVConn_get, NULL, NULL, (void *)1},
    {"config", (getter)(void (*)(void))KVConn_get, NULL, NULL, (void *)2},
    {"closed", (getter)(void (*)(void))KVConn_get, NULL, NULL, (void *)3},
    {0},
};

PyTypeObject pdxpy_KVConnectorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.KVConnector",
    .tp_basicsize = sizeof(KVConnObject),
    .tp_dealloc = (destructor)(void (*)(void))KVConn_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "KVConnector(config, layout, *, progress_thread=True, "
              "xfer_timeout=None): the KV connector (its own agent, "
              "backends and registrations from the config; layout with its "
              "bases set).",
    .tp_methods = KVConn_methods,
    .tp_getset = KVConn_getset,
    .tp_init = (initproc)(void (*)(void))KVConn_init,
    .tp_new = PyType_GenericNew,
};
