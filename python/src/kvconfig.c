/* pdx.KVConfig: a loaded JSON deployment config, kept in C
 * (pdx_kv_config_t points into itself). */
#include "pdxpy_int.h"

#include <string.h>

/* --------------------------------------------------------------- KVConfig */

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
    /* The config's own message (at most 1 KiB), else pdx_last_error(). */
    PDXPY_CALL_DECL(call, "config load");
    const char *p = PyBytes_AS_STRING(path);
    PDXPY_CALL(&call, pdx_kv_config_load(p, cfg, call.err, 1024));
    Py_DECREF(path);
    if (call.st != PDX_OK) {
        PyMem_Free(cfg);
        return pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "config parse");
    /* Up to 1 MiB of JSON; text is immutable. */
    PDXPY_CALL(&call, pdx_kv_config_parse(text, (size_t)len, name, cfg,
                                          call.err, 1024));
    if (call.st != PDX_OK) {
        PyMem_Free(cfg);
        return pdxpy_call_raise(&call);
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
        pdx_option_t opts[PDX_KV_MAX_BACKEND_OPTS];
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
