/* pdx.KVConnector: lookup, load, save, request finished, progress,
 * freed lists; handoff parameters as dicts. */
#include "pdxpy_int.h"

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
    PDXPY_CALL_DECL(call, "connector create");
    l->frozen++;
    PDXPY_CALL(&call, pdx_kv_connector_create(&p, &h));
    if (call.st != PDX_OK) {
        l->frozen--;
        pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "describe");
    PDXPY_CALL(&call, pdx_kv_connector_describe(c->h, &blob, &len));
    conn_leave(c);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "connect");
    PDXPY_CALL(&call,
               pdx_kv_connector_connect(c->h, v.buf, (size_t)v.len, name));
    conn_leave(c);
    PyBuffer_Release(&v);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    return PyUnicode_FromString(name);
}

static PyObject *KVConn_peer_state(KVConnObject *c, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || conn_enter(c) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "peer_state");
    PDXPY_CALL(&call, pdx_peer_state(pdx_kv_connector_agent(c->h), name));
    conn_leave(c);
    if (call.st == PDX_OK) {
        return PyUnicode_FromString("alive");
    }
    if (call.st == PDX_ERR_REMOTE_DISCONNECT) {
        return PyUnicode_FromString("disconnected");
    }
    return pdxpy_call_raise(&call);
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
            if (pdxpy_hash_from(PySequence_Fast_GET_ITEM(seq, i),
                                &q->hashes[i]) < 0) {
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
        if (pdxpy_hash_from(th, &q->r.tail_hash) < 0) {
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
    PDXPY_CALL_DECL(call, "lookup");
    PDXPY_CALL(&call, pdx_kv_lookup(c->h, &q.r, &m));
    conn_leave(c);
    kvreq_clear(&q);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    if (call.st == PDX_INPROGRESS) {
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

static PyObject *KVConn_load(KVConnObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req", "match", "block_ids", "first_block",
                             "layered", NULL};
    PyObject *req, *match, *ids;
    Py_ssize_t first = 0;
    int layered = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$np", kwlist, &req,
                                     &match, &ids, &first, &layered)) {
        return NULL;
    }
    if (first < 0) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "load: first_block must be >= 0");
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
    size_t want = m.blocks + (m.tail ? 1 : 0);
    want = want > (size_t)first ? want - (size_t)first : 0;
    if (n < want) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "load: %zu block ids for %zu blocks from block %zd", n,
                     want, first);
        goto out;
    }
    if (conn_enter(c) < 0) {
        goto out;
    }
    pdx_kv_load_params_t lp = {
        .field_mask = PDX_KV_LOAD_PARAM_FIRST_BLOCK | PDX_KV_LOAD_PARAM_FLAGS,
        .first_block = (size_t)first,
        .flags = layered ? PDX_KV_LOAD_F_LAYERED : 0};
    PDXPY_CALL_DECL(call, "load");
    PDXPY_CALL(&call, pdx_kv_load_ex(c->h, &q.r, &m, &lp, n ? v : NULL));
    conn_leave(c);
    if (call.st < 0) {
        pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "load_check");
    PDXPY_CALL(&call, pdx_kv_load_check(c->h, id, &tokens));
    conn_leave(c);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    if (call.st == PDX_INPROGRESS) {
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
    static const char *names[] = {"load_abort", "save_check", "reject"};
    PDXPY_CALL_DECL(call, names[which]);
    PDXPY_CALL(&call, which == 0   ? pdx_kv_load_abort(c->h, s)
                      : which == 1 ? pdx_kv_save_check(c->h, s)
                                   : pdx_kv_reject(c->h, s));
    conn_leave(c);
    Py_XDECREF(txt);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    if (which == 1) {
        return PyBool_FromLong(call.st == PDX_OK);
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
    PDXPY_CALL_DECL(call, "save");
    PDXPY_CALL(&call, pdx_kv_save(c->h, &q.r, v));
    conn_leave(c);
    if (call.st < 0) {
        pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "request_finished");
    PDXPY_CALL(&call, pdx_kv_request_finished(c->h, &q.r, v, (size_t)tokens,
                                              from, &params));
    conn_leave(c);
    if (call.st < 0) {
        pdxpy_call_raise(&call);
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

static PyObject *KVConn_load_layer_check(KVConnObject *c, PyObject *args)
{
    const char *id;
    unsigned int layer;
    if (!PyArg_ParseTuple(args, "sI", &id, &layer) || conn_enter(c) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "load_layer_check");
    PDXPY_CALL(&call, pdx_kv_load_layer_check(c->h, id, layer));
    conn_leave(c);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    return PyBool_FromLong(call.st == PDX_OK);
}

static PyObject *KVConn_push_expect(KVConnObject *c, PyObject *args,
                                    PyObject *kw)
{
    static char *kwlist[] = {"req_id", "holder", "holder_req", "block_ids",
                             "first_block", "tokens", "timeout", NULL};
    const char *id, *holder, *hreq;
    PyObject *ids, *timeout = Py_None;
    Py_ssize_t first = 0, tokens = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sssO|$nnO", kwlist, &id,
                                     &holder, &hreq, &ids, &first, &tokens,
                                     &timeout)) {
        return NULL;
    }
    pdx_kv_push_expect_t e = {
        .field_mask = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                      PDX_KV_PUSH_NBLOCKS | PDX_KV_PUSH_FIRST_BLOCK |
                      PDX_KV_PUSH_TOKENS,
        .holder = holder,
        .holder_req = hreq,
        .first_block = first > 0 ? (size_t)first : 0,
        .tokens = tokens > 0 ? (size_t)tokens : 0};
    if (timeout != Py_None) {
        double t;
        if (pdxpy_timeout_arg(timeout, "timeout", 0, &t) < 0) {
            return NULL;
        }
        e.field_mask |= PDX_KV_PUSH_TIMEOUT;
        e.timeout_ms = t * 1000.0 > (double)UINT32_MAX
                           ? UINT32_MAX
                           : (uint32_t)(t * 1000.0 + 0.5);
    }
    uint64_t stack[256];
    void *v;
    size_t n;
    if (pdxpy_int_array(ids, 8, stack, 256, &v, &n) < 0) {
        return NULL;
    }
    e.nblocks = n;
    PyObject *res = NULL;
    if (conn_enter(c) == 0) {
        PDXPY_CALL_DECL(call, "push_expect");
        PDXPY_CALL(&call, pdx_kv_push_expect(c->h, id, &e, v));
        conn_leave(c);
        res = call.st < 0 ? pdxpy_call_raise(&call) : Py_NewRef(Py_None);
    }
    if (v != stack) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *KVConn_save_layer(KVConnObject *c, PyObject *args,
                                   PyObject *kw)
{
    static char *kwlist[] = {"req", "layer", "block_ids", "tokens",
                             "first_block", "last", NULL};
    PyObject *req, *ids;
    unsigned int layer;
    Py_ssize_t tokens, first = 0;
    int last = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIOn|$np", kwlist, &req,
                                     &layer, &ids, &tokens, &first, &last)) {
        return NULL;
    }
    if (tokens < 0 || first < 0) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "save_layer: tokens and first_block must be >= 0");
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
    pdx_kv_layer_save_t ls = {
        .field_mask = PDX_KV_LAYER_SAVE_LAYER | PDX_KV_LAYER_SAVE_NBLOCKS |
                      PDX_KV_LAYER_SAVE_TOKENS |
                      PDX_KV_LAYER_SAVE_FIRST_BLOCK | PDX_KV_LAYER_SAVE_LAST,
        .layer = layer,
        .first_block = (size_t)first,
        .nblocks = n,
        .tokens = (size_t)tokens,
        .last = last != 0};
    PyObject *res = NULL;
    if (conn_enter(c) == 0) {
        PDXPY_CALL_DECL(call, "save_layer");
        PDXPY_CALL(&call, pdx_kv_save_layer(c->h, &q.r, &ls, n ? v : NULL));
        conn_leave(c);
        res = call.st < 0 ? pdxpy_call_raise(&call) : Py_NewRef(Py_None);
    }
    kvreq_clear(&q);
    if (v != stack) {
        PyMem_Free(v);
    }
    return res;
}

static PyObject *KVConn_request_dropped(KVConnObject *c, PyObject *arg)
{
    const char *id = PyUnicode_AsUTF8(arg);
    if (id == NULL || conn_enter(c) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "request_dropped");
    PDXPY_CALL(&call, pdx_kv_request_dropped(c->h, id));
    conn_leave(c);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
}

static PyObject *KVConn_set_invariant(KVConnObject *c, PyObject *args)
{
    const char *key, *value;
    if (!PyArg_ParseTuple(args, "ss", &key, &value) || conn_enter(c) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "set_invariant");
    PDXPY_CALL(&call, pdx_agent_set_invariant(pdx_kv_connector_agent(c->h),
                                              key, value));
    conn_leave(c);
    if (call.st < 0) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
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
    static const char *why[] = {"done", "reject", "expired", "peer_gone"};
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
                          why[f.why[i] >= 0 && f.why[i] <= 3 ? f.why[i] : 0]);
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
    PDXPY_CALL_DECL(call, "offload_stats");
    PDXPY_CALL(&call, pdx_kv_offload_stats(c->h, &s));
    conn_leave(c);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
    {"load", (PyCFunction)(void (*)(void))KVConn_load,
     METH_VARARGS | METH_KEYWORDS,
     "load(req, match, block_ids, *, first_block=0, layered=False): start "
     "loading what lookup found, from block first_block on (block_ids[0] "
     "receives it); layered: one transfer per layer (load_layer_check)."},
    {"load_layer_check", (PyCFunction)(void (*)(void))KVConn_load_layer_check,
     METH_VARARGS,
     "load_layer_check(req_id, layer) -> True once that layer landed, False "
     "before; raises once the load failed."},
    {"push_expect", (PyCFunction)(void (*)(void))KVConn_push_expect,
     METH_VARARGS | METH_KEYWORDS,
     "push_expect(req_id, holder, holder_req, block_ids, *, first_block=0, "
     "tokens=0, timeout=None): ask the holder to write its request's blocks "
     "here layer by layer; then load_layer_check / load_check(req_id)."},
    {"save_layer", (PyCFunction)(void (*)(void))KVConn_save_layer,
     METH_VARARGS | METH_KEYWORDS,
     "save_layer(req, layer, block_ids, tokens, *, first_block=0, "
     "last=False): one layer of a step computed (offload, push)."},
    {"request_dropped", (PyCFunction)(void (*)(void))KVConn_request_dropped,
     METH_O, "request_dropped(req_id): forget its layer-wise state."},
    {"set_invariant", (PyCFunction)(void (*)(void))KVConn_set_invariant,
     METH_VARARGS,
     "set_invariant(key, value): one more key peers must agree on."},
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
