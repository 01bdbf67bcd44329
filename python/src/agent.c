/* pdx.Agent and its children: MemReg (a registration), DescList (a
 * descriptor list in C memory), PreparedList (pdx_dlist_h) and Xfer
 * (pdx_xfer_h). Every call that can take more than a few microseconds runs
 * with the GIL released. */
#include "pdxpy.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ Agent */

int pdxpy_agent_enter(AgentObject *a)
{
    if (a->h == NULL || a->closing) {
        pdxpy_closed("agent is closed");
        return -1;
    }
    a->uses++;
    return 0;
}

static int agent_alive(AgentObject *a)
{
    return a->h != NULL && !__atomic_load_n(&a->closing, __ATOMIC_RELAXED);
}

typedef struct backend_spec {
    char name[32];
    pdx_kv_t opts[16];
    char keys[16][64];
    char vals[16][256];
    size_t nopts;
} backend_spec_t;

static int parse_backend_opts(PyObject *opts, backend_spec_t *b)
{
    if (opts == NULL || opts == Py_None) {
        return 0;
    }
    if (!PyDict_Check(opts)) {
        PyErr_SetString(PyExc_TypeError,
                        "backend_options values must be dicts of str");
        return -1;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(opts, &pos, &k, &v)) {
        if (b->nopts >= 16) {
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_TOO_LARGE),
                            "at most 16 options per backend");
            return -1;
        }
        PyObject *vs = PyObject_Str(v);
        const char *ks = PyUnicode_AsUTF8(k);
        const char *vv = vs ? PyUnicode_AsUTF8(vs) : NULL;
        if (ks == NULL || vv == NULL) {
            Py_XDECREF(vs);
            return -1;
        }
        snprintf(b->keys[b->nopts], 64, "%s", ks);
        snprintf(b->vals[b->nopts], 256, "%s", vv);
        Py_DECREF(vs);
        b->opts[b->nopts].key = b->keys[b->nopts];
        b->opts[b->nopts].value = b->vals[b->nopts];
        b->nopts++;
    }
    return 0;
}

/* Agent(store={...}): the PDX_AGENT_PARAM_STORE fields, with the key names
 * of the config's `store` section. Strings are copied here: they must live
 * until pdx_agent_create returns. */
typedef struct store_spec {
    char type[32];
    char endpoints[512];
    char ns[128];
} store_spec_t;

#define STORE_KEYS                                                             \
    "type, endpoints, namespace, lease_ttl_ms, timeout_ms, max_txn_ops"

static int store_str(PyObject *v, const char *key, char *buf, size_t len)
{
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "store['%s']: a str, not %R", key, v);
        }
        return -1;
    }
    if (s[0] == '\0' || strlen(s) >= len) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "store['%s']: 1 to %zu bytes, got %R", key, len - 1, v);
        return -1;
    }
    snprintf(buf, len, "%s", s);
    return 0;
}

static int store_u32(PyObject *v, const char *key, uint32_t *out)
{
    unsigned long long x = PyLong_Check(v) && !PyBool_Check(v)
                               ? PyLong_AsUnsignedLongLong(v)
                               : (unsigned long long)-1;
    if (x > UINT32_MAX) {
        PyErr_Clear();
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "store['%s']: an integer 0..%u (0: the default), not %R",
                     key, (unsigned)UINT32_MAX, v);
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

/* `endpoints`: "http://a:2379,http://b:2379" or a list of URLs. */
static int store_endpoints(PyObject *v, store_spec_t *sp)
{
    if (PyUnicode_Check(v)) {
        return store_str(v, "endpoints", sp->endpoints, sizeof(sp->endpoints));
    }
    PyObject *seq = PySequence_Fast(v, "store['endpoints']: a str or a list "
                                       "of str");
    if (seq == NULL) {
        return -1;
    }
    size_t used = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        char one[512];
        if (store_str(PySequence_Fast_GET_ITEM(seq, i), "endpoints", one,
                      sizeof(one)) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        int w = snprintf(sp->endpoints + used, sizeof(sp->endpoints) - used,
                         "%s%s", i ? "," : "", one);
        if (w < 0 || (size_t)w >= sizeof(sp->endpoints) - used) {
            Py_DECREF(seq);
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "store['endpoints']: %zu bytes at most in all",
                         sizeof(sp->endpoints) - 1);
            return -1;
        }
        used += (size_t)w;
    }
    Py_DECREF(seq);
    return 0;
}

static int parse_store(PyObject *o, store_spec_t *sp, pdx_agent_params_t *ap)
{
    if (!PyDict_Check(o)) {
        PyErr_SetString(PyExc_TypeError,
                        "store: a dict such as {'type': 'etcd', 'endpoints': "
                        "'http://127.0.0.1:2379', 'namespace': 'pdx', "
                        "'lease_ttl_ms': 10000}");
        return -1;
    }
    if (pdxpy_require((const void *)pdxpy_opt.agent_publish,
                      "pdx_agent_publish") < 0) {
        return -1;
    }
    snprintf(sp->type, sizeof(sp->type), "etcd");
    snprintf(sp->ns, sizeof(sp->ns), "pdx");
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &k, &v)) {
        const char *key = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        int rc;
        if (key == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "store: keys are str, not %R", k);
            }
            return -1;
        }
        if (!strcmp(key, "type")) {
            rc = store_str(v, key, sp->type, sizeof(sp->type));
        } else if (!strcmp(key, "endpoints")) {
            rc = store_endpoints(v, sp);
        } else if (!strcmp(key, "namespace")) {
            rc = store_str(v, key, sp->ns, sizeof(sp->ns));
        } else if (!strcmp(key, "lease_ttl_ms")) {
            rc = store_u32(v, key, &ap->store_lease_ttl_ms);
        } else if (!strcmp(key, "timeout_ms")) {
            rc = store_u32(v, key, &ap->store_timeout_ms);
        } else if (!strcmp(key, "max_txn_ops")) {
            rc = store_u32(v, key, &ap->store_max_txn_ops);
        } else {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "store: unknown key %R (known: " STORE_KEYS ")", k);
            rc = -1;
        }
        if (rc < 0) {
            return -1;
        }
    }
    if (sp->endpoints[0] == '\0') {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "store: 'endpoints' is required (e.g. "
                        "'http://127.0.0.1:2379')");
        return -1;
    }
    ap->field_mask |= PDX_AGENT_PARAM_STORE;
    ap->store = sp->type;
    ap->store_endpoints = sp->endpoints;
    ap->store_namespace = sp->ns;
    return 0;
}

static int Agent_init(AgentObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name",
                             "progress_thread",
                             "backends",
                             "xfer_timeout",
                             "progress_interval_us",
                             "path_policy",
                             "backend_options",
                             "telemetry",
                             "store",
                             NULL};
    const char *name;
    int progress = 1, telemetry = 0;
    PyObject *backends = Py_None, *timeout = Py_None, *interval = Py_None;
    PyObject *policy = Py_None, *bopts = Py_None, *store = Py_None;
    store_spec_t store_spec;
    if (self->h != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Agent already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|$pOOOOOpO", kwlist, &name,
                                     &progress, &backends, &timeout, &interval,
                                     &policy, &bopts, &telemetry, &store)) {
        return -1;
    }
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags =
                                 progress ? PDX_AGENT_F_PROGRESS_THREAD : 0};
    memset(&store_spec, 0, sizeof(store_spec));
    if (store != Py_None && parse_store(store, &store_spec, &ap) < 0) {
        return -1;
    }
    if (telemetry) {
#ifdef PDX_AGENT_F_TELEMETRY
        ap.flags |= PDX_AGENT_F_TELEMETRY;
#endif
    }
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
        if (t > 0 && ap.xfer_timeout_ms == 0) {
            ap.xfer_timeout_ms = 1;
        }
    }
    if (interval != Py_None) {
        long us = PyLong_AsLong(interval);
        if (us == -1 && PyErr_Occurred()) {
            return -1;
        }
        ap.field_mask |= PDX_AGENT_PARAM_PROGRESS_INTERVAL;
        ap.progress_interval_us = (uint32_t)us;
    }
    if (policy != Py_None) {
        const char *p =
            PyUnicode_Check(policy) ? PyUnicode_AsUTF8(policy) : NULL;
        if (p != NULL && !strcmp(p, "any")) {
            ap.path_policy = PDX_PATH_POLICY_ANY;
        } else if (p != NULL && !strcmp(p, "same_host_fast")) {
            ap.path_policy = PDX_PATH_POLICY_SAME_HOST_FAST;
        } else {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "path_policy: 'any' or 'same_host_fast', not %R",
                         policy);
            return -1;
        }
        ap.field_mask |= PDX_AGENT_PARAM_PATH_POLICY;
    }
    /* Backends: default ucx + cma (same-host memcpy path). */
    backend_spec_t *specs = NULL;
    Py_ssize_t nb = 0;
    PyObject *seq = NULL;
    if (backends == Py_None) {
        nb = 2;
    } else {
        seq = PySequence_Fast(backends, "backends: a list of names");
        if (seq == NULL) {
            return -1;
        }
        nb = PySequence_Fast_GET_SIZE(seq);
    }
    specs = PyMem_Calloc((size_t)nb + 1, sizeof(*specs));
    if (specs == NULL) {
        Py_XDECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        const char *bn;
        if (seq == NULL) {
            bn = i == 0 ? "ucx" : "cma";
        } else {
            PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
            bn = PyUnicode_Check(it) ? PyUnicode_AsUTF8(it) : NULL;
            if (bn == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError,
                                    "backends: a list of names");
                }
                goto fail_specs;
            }
        }
        snprintf(specs[i].name, sizeof(specs[i].name), "%s", bn);
        if (bopts != Py_None) {
            if (!PyDict_Check(bopts)) {
                PyErr_SetString(PyExc_TypeError,
                                "backend_options: {backend: {key: value}}");
                goto fail_specs;
            }
            if (parse_backend_opts(PyDict_GetItemString(bopts, bn), &specs[i]) <
                0) {
                goto fail_specs;
            }
        }
    }
    Py_CLEAR(seq);

    pdx_agent_h h = NULL;
    pdx_status_t st;
    char err[2048] = "";
    const char *what = "agent create";
    Py_BEGIN_ALLOW_THREADS st = pdx_agent_create(name, &ap, &h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, what);
    }
    for (Py_ssize_t i = 0; st == PDX_OK && i < nb; i++) {
        st = pdx_backend_create(h, specs[i].name, specs[i].opts, specs[i].nopts,
                                NULL);
        if (st != PDX_OK) {
            char e[1800];
            pdxpy_last_error(e, sizeof(e), st, "backend create");
            snprintf(err, sizeof(err), "agent %s: backend %s: %s", name,
                     specs[i].name, e);
            pdx_agent_destroy(h);
            h = NULL;
        }
    }
    Py_END_ALLOW_THREADS PyMem_Free(specs);
    if (st != PDX_OK) {
        pdxpy_raise(st, what, err);
        return -1;
    }
    self->h = h;
    self->progress_thread = progress;
    self->name = PyUnicode_FromString(name);
    self->regs = PySet_New(NULL);
    return self->name == NULL || self->regs == NULL ? -1 : 0;
fail_specs:
    Py_XDECREF(seq);
    PyMem_Free(specs);
    return -1;
}

static void memregs_forget(PyObject *regs);

static void agent_close_impl(AgentObject *self)
{
    if (self->h == NULL) {
        return;
    }
    __atomic_store_n(&self->closing, 1, __ATOMIC_RELAXED);
    pdxpy_wait_unused(&self->uses);
    pdx_agent_h h = self->h;
    self->h = NULL;
    Py_BEGIN_ALLOW_THREADS pdx_agent_destroy(h);
    Py_END_ALLOW_THREADS
        /* The registrations died with the agent: unpin their memory. */
        PyObject *regs = self->regs;
    self->regs = NULL;
    if (regs != NULL) {
        memregs_forget(regs);
        Py_DECREF(regs);
    }
}

static void Agent_dealloc(AgentObject *self)
{
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    agent_close_impl(self);
    Py_XDECREF(self->name);
    Py_XDECREF(self->regs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Agent_close(AgentObject *self, PyObject *unused)
{
    agent_close_impl(self);
    Py_RETURN_NONE;
}

static PyObject *Agent_enter(AgentObject *self, PyObject *unused)
{
    if (self->h == NULL) {
        return pdxpy_closed("agent is closed");
    }
    return Py_NewRef(self);
}

static PyObject *Agent_exit(AgentObject *self, PyObject *args)
{
    agent_close_impl(self);
    Py_RETURN_FALSE;
}

static PyObject *Agent_describe(AgentObject *self, PyObject *unused)
{
    if (pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    void *blob = NULL;
    size_t len = 0;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_agent_describe(self->h, &blob, &len);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "describe");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "describe", err);
    }
    PyObject *r = PyBytes_FromStringAndSize(blob, (Py_ssize_t)len);
    pdx_blob_free(blob);
    return r;
}

static PyObject *Agent_load_peer(AgentObject *self, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char name[PDX_NAME_MAX] = "";
    char err[2048];
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st =
        pdx_peer_load(self->h, v.buf, (size_t)v.len, name);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "load_peer");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    PyBuffer_Release(&v);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "load_peer", err);
    }
    return PyUnicode_FromString(name);
}

static PyObject *Agent_unload_peer(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    char err[2048];
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_peer_unload(self->h, name);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "unload_peer");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "unload_peer", err);
    }
    Py_RETURN_NONE;
}

static PyObject *Agent_peer_state(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS /* waits on the agent lock */
        st = pdx_peer_state(self->h, name);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st == PDX_OK) {
        return PyUnicode_FromString("alive");
    }
    if (st == PDX_ERR_REMOTE_DISCONNECT) {
        return PyUnicode_FromString("disconnected");
    }
    return pdxpy_raise(st, "peer_state", NULL);
}

static const char *mem_name(pdx_mem_type_t t)
{
    return t == PDX_MEM_VRAM ? "VRAM" : "DRAM";
}

static PyObject *Agent_peer_info(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL ||
        pdxpy_require((const void *)pdxpy_opt.peer_info, "pdx_peer_info") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_peer_info_t info;
    pdx_region_info_t *regs = NULL;
    pdx_status_t st;
    char err[2048];
    size_t cap = 0;
    Py_BEGIN_ALLOW_THREADS memset(&info, 0, sizeof(info));
    st = pdxpy_opt.peer_info(self->h, name, &info, NULL, 0);
    /* Regions may be added between the two calls: retry until they fit. */
    while (st == PDX_OK) {
        cap = info.nregions + 16;
        free(regs);
        regs = calloc(cap, sizeof(*regs));
        if (regs == NULL) {
            st = PDX_ERR_NOMEM;
            break;
        }
        st = pdxpy_opt.peer_info(self->h, name, &info, regs, cap);
        if (st != PDX_OK || info.nregions <= cap) {
            break;
        }
    }
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "peer_info");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        free(regs);
        return pdxpy_raise(st, "peer_info", err);
    }
    size_t n = info.nregions < cap ? info.nregions : cap;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = Py_BuildValue(
            "{s:K,s:K,s:s,s:I,s:O,s:K}", "addr",
            (unsigned long long)regs[i].addr, "len",
            (unsigned long long)regs[i].len, "mem_type",
            mem_name(regs[i].mem_type), "device", (unsigned)regs[i].dev_id,
            "shared",
            (regs[i].flags & PDX_REGION_F_SHARED) ? Py_True : Py_False, "flags",
            (unsigned long long)regs[i].flags);
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    free(regs);
    if (list == NULL) {
        return NULL;
    }
    PyObject *backends = PyUnicode_FromString(info.backends);
    PyObject *comma = PyUnicode_FromString(",");
    PyObject *bl =
        backends && comma ? PyUnicode_Split(backends, comma, -1) : NULL;
    Py_XDECREF(backends);
    Py_XDECREF(comma);
    if (bl == NULL) {
        Py_DECREF(list);
        return NULL;
    }
    if (info.backends[0] == '\0') {
        Py_SETREF(bl, PyList_New(0));
    }
    const char *state = info.state == PDX_OK ? "alive"
                        : info.state == PDX_ERR_REMOTE_DISCONNECT
                            ? "disconnected"
                            : pdx_status_string(info.state);
    return Py_BuildValue("{s:s,s:s,s:K,s:I,s:i,s:O,s:s,s:N,s:N}", "name",
                         info.name, "host_id", info.host_id, "instance",
                         (unsigned long long)info.instance, "generation",
                         (unsigned)info.generation, "pid", (int)info.pid,
                         "same_host", info.same_host ? Py_True : Py_False,
                         "state", state, "backends", bl, "regions", list);
}

static PyObject *Agent_set_invariant(AgentObject *self, PyObject *args)
{
    const char *k, *v;
    if (!PyArg_ParseTuple(args, "ss", &k, &v) || pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_agent_set_invariant(self->h, k, v);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "set_invariant", NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *Agent_progress(AgentObject *self, PyObject *unused)
{
    if (pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    int n;
    Py_BEGIN_ALLOW_THREADS n = pdx_progress(self->h);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    return PyLong_FromLong(n);
}

static PyObject *Agent_event_fd(AgentObject *self, PyObject *unused)
{
    if (pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    int fd = pdx_agent_event_fd(self->h);
    pdxpy_agent_leave(self);
    return PyLong_FromLong(fd);
}

/* Sleep on the agent's event fd for at most `ms` (with the GIL released by
 * the caller), then let the agent progress if it woke. */
static void agent_sleep(pdx_agent_h h, int ms, int *spins)
{
    struct pollfd p = {.fd = pdx_agent_event_fd(h), .events = POLLIN};
    if (*spins > 2) {
        /* The fd stayed readable without news for us (e.g. queued
         * notifications keep it so): back off instead of spinning. */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    int r = p.fd >= 0 ? poll(&p, 1, ms) : 0;
    if (r > 0) {
        (*spins)++;
        pdx_progress(h);
    } else {
        *spins = 0;
    }
}

/* Notifications, collected without the GIL then turned into a dict. */
typedef struct notif_item {
    char peer[PDX_NAME_MAX];
    size_t len;
    char *msg;
} notif_item_t;

typedef struct notif_vec {
    notif_item_t *items;
    size_t n, cap;
    int oom;
} notif_vec_t;

static void notif_collect(void *arg, const char *peer, const void *msg,
                          size_t len)
{
    notif_vec_t *v = arg;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        notif_item_t *ni = realloc(v->items, cap * sizeof(*ni));
        if (ni == NULL) {
            v->oom = 1;
            return;
        }
        v->items = ni;
        v->cap = cap;
    }
    notif_item_t *it = &v->items[v->n];
    it->msg = malloc(len ? len : 1);
    if (it->msg == NULL) {
        v->oom = 1;
        return;
    }
    memcpy(it->msg, msg, len);
    it->len = len;
    snprintf(it->peer, sizeof(it->peer), "%s", peer);
    v->n++;
}

static PyObject *notif_dict(notif_vec_t *v)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < v->n; i++) {
        PyObject *l = PyDict_GetItemString(d, v->items[i].peer);
        if (l == NULL) {
            l = PyList_New(0);
            if (l == NULL || PyDict_SetItemString(d, v->items[i].peer, l) < 0) {
                Py_XDECREF(l);
                Py_CLEAR(d);
                break;
            }
            Py_DECREF(l);
        }
        PyObject *b = PyBytes_FromStringAndSize(v->items[i].msg,
                                                (Py_ssize_t)v->items[i].len);
        if (b == NULL || PyList_Append(l, b) < 0) {
            Py_XDECREF(b);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(b);
    }
    for (size_t i = 0; i < v->n; i++) {
        free(v->items[i].msg);
    }
    free(v->items);
    if (d != NULL && v->oom) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    return d;
}

static PyObject *Agent_get_notifs(AgentObject *self, PyObject *args,
                                  PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *to = NULL;
    double timeout = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &to) ||
        (to != NULL && to != Py_None &&
         pdxpy_timeout_arg(to, "get_notifs", 1, &timeout) < 0) ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    notif_vec_t v = {0};
    int closed = 0;
    Py_BEGIN_ALLOW_THREADS double end = pdxpy_now() + timeout;
    int spins = 0;
    for (;;) {
        pdx_notif_poll(self->h, notif_collect, &v);
        if (v.n > 0 || timeout <= 0) {
            break;
        }
        double left = end - pdxpy_now();
        if (left <= 0) {
            break;
        }
        if (__atomic_load_n(&self->closing, __ATOMIC_RELAXED)) {
            closed = 1;
            break;
        }
        agent_sleep(self->h, left > 0.05 ? 50 : (int)(left * 1000) + 1, &spins);
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    PyObject *d = notif_dict(&v);
    if (closed && d != NULL && PyDict_GET_SIZE(d) == 0) {
        Py_DECREF(d);
        return pdxpy_closed("agent closed while waiting");
    }
    return d;
}

static PyObject *Agent_send_notif(AgentObject *self, PyObject *args)
{
    const char *peer;
    PyObject *msg;
    if (!PyArg_ParseTuple(args, "sO", &peer, &msg)) {
        return NULL;
    }
    Py_buffer v;
    const char *p;
    Py_ssize_t len;
    /* bytes-like, or str sent UTF-8 encoded (as NIXL's genNotif takes
     * either); anything else is a TypeError naming the type. */
    if (msg == Py_None || (!PyUnicode_Check(msg) && !PyObject_CheckBuffer(msg))) {
        PyErr_Format(PyExc_TypeError,
                     "send_notif: the message must be bytes, a bytes-like "
                     "object or str (sent UTF-8 encoded), not %.100s",
                     Py_TYPE(msg)->tp_name);
        return NULL;
    }
    if (pdxpy_bytes_arg(msg, &v, &p, &len) < 0) {
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        if (v.obj) {
            PyBuffer_Release(&v);
        }
        return NULL;
    }
    char err[2048];
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_notif_send(self->h, peer, p, (size_t)len);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "send_notif");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (v.obj) {
        PyBuffer_Release(&v);
    }
    if (st != PDX_OK) {
        return pdxpy_raise(st, "send_notif", err);
    }
    Py_RETURN_NONE;
}

static PyObject *stats_dict(const pdx_stats_t *s)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
                         "requests", (unsigned long long)s->requests,
                         "completed", (unsigned long long)s->completed,
                         "errors", (unsigned long long)s->errors, "canceled",
                         (unsigned long long)s->canceled, "timeouts",
                         (unsigned long long)s->timeouts, "bytes",
                         (unsigned long long)s->bytes, "fallbacks",
                         (unsigned long long)s->fallbacks, "refused",
                         (unsigned long long)s->refused, "dead_events",
                         (unsigned long long)s->dead_events, "notifs_sent",
                         (unsigned long long)s->notifs_sent, "notifs_recv",
                         (unsigned long long)s->notifs_recv);
}

static PyObject *Agent_stats(AgentObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"backend", "peer", NULL};
    const char *backend = NULL, *peer = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$zz", kwlist, &backend,
                                     &peer)) {
        return NULL;
    }
    if ((backend == NULL) == (peer == NULL)) {
        PyErr_SetString(PyExc_TypeError,
                        "stats: give exactly one of backend= or peer=");
        return NULL;
    }
    pdxpy_stats_fn fn =
        backend ? pdxpy_opt.stats_backend : pdxpy_opt.stats_peer;
    if (pdxpy_require((const void *)fn,
                      backend ? "pdx_stats_backend" : "pdx_stats_peer") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_stats_t s;
    memset(&s, 0, sizeof(s));
    pdx_status_t st;
    const char *which = backend ? backend : peer;
    Py_BEGIN_ALLOW_THREADS st = fn(self->h, which, &s);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "stats", NULL);
    }
    return stats_dict(&s);
}

static PyObject *Agent_stats_json(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require((const void *)pdxpy_opt.stats_json, "pdx_stats_json") <
            0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    char *json = NULL;
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdxpy_opt.stats_json(self->h, &json);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "stats_json", NULL);
    }
    PyObject *r = PyUnicode_FromString(json);
    pdx_blob_free(json);
    return r;
}

/* ---- the store (pdx/store.h) */

static PyObject *Agent_publish(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require((const void *)pdxpy_opt.agent_publish,
                      "pdx_agent_publish") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdxpy_opt.agent_publish(self->h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "publish");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "publish", err);
    }
    Py_RETURN_NONE;
}

static PyObject *Agent_fetch_peer(AgentObject *self, PyObject *args,
                                  PyObject *kw)
{
    static char *kwlist[] = {"name", "timeout", NULL};
    const char *name;
    PyObject *to = NULL;
    double timeout = 5.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O", kwlist, &name, &to)) {
        return NULL;
    }
    if (to != NULL && to != Py_None &&
        pdxpy_timeout_arg(to, "fetch_peer", 1, &timeout) < 0) {
        return NULL;
    }
    if (pdxpy_require((const void *)pdxpy_opt.peer_fetch, "pdx_peer_fetch") <
            0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    double ms = timeout * 1000.0 + 0.5;
    uint32_t timeout_ms = ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS /* waits up to timeout for a publisher */
        st = pdxpy_opt.peer_fetch(self->h, name, timeout_ms);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "fetch_peer");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "fetch_peer", err);
    }
    return PyUnicode_FromString(name);
}

static PyObject *Agent_store_status(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require((const void *)pdxpy_opt.store_status,
                      "pdx_store_status") < 0 ||
        pdxpy_require((const void *)pdxpy_opt.store_describe,
                      "pdx_store_describe") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_store_status_t s;
    char line[1024] = "";
    char err[2048];
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS memset(&s, 0, sizeof(s));
    st = pdxpy_opt.store_status(self->h, &s);
    if (st == PDX_OK) {
        pdxpy_opt.store_describe(self->h, line, sizeof(line));
    } else {
        pdxpy_last_error(err, sizeof(err), st, "store_status");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "store_status", err);
    }
    PyObject *since =
        s.unreachable_since_ns == 0
            ? Py_NewRef(Py_None)
            : PyFloat_FromDouble((double)s.unreachable_since_ns / 1e9);
    if (since == NULL) {
        return NULL;
    }
    return Py_BuildValue(
        "{s:O,s:N,s:d,s:s,s:K,s:I,s:K,s:L,s:K,s:K,s:I,s:I,s:I,s:I,s:s,s:s}",
        "reachable", s.reachable ? Py_True : Py_False, "unreachable_since",
        since, "unreachable_s", (double)s.unreachable_ms / 1000.0, "describe",
        line, "lease", (unsigned long long)s.lease, "lease_ttl_s",
        (unsigned)s.lease_ttl_s, "leases_granted",
        (unsigned long long)s.leases_granted, "revision", (long long)s.revision,
        "requests", (unsigned long long)s.requests, "failures",
        (unsigned long long)s.failures, "leased_keys", (unsigned)s.leased_keys,
        "unpublished", (unsigned)s.unpublished, "watches", (unsigned)s.watches,
        "watches_down", (unsigned)s.watches_down, "endpoint", s.endpoint,
        "last_error", s.last_error);
}

static PyObject *Agent_repr(AgentObject *self)
{
    return PyUnicode_FromFormat("<pdx.Agent %R%s>",
                                self->name ? self->name : Py_None,
                                self->h ? "" : " closed");
}

static PyObject *Agent_get_name(AgentObject *self, void *c)
{
    return Py_NewRef(self->name ? self->name : Py_None);
}

static PyObject *Agent_get_closed(AgentObject *self, void *c)
{
    return PyBool_FromLong(self->h == NULL);
}

/* ----------------------------------------------------------------- MemReg */

/* The agent holds every registration (in its `regs` set) until it is
 * deregistered or the agent closes, as NIXL does; a MemReg refers back to
 * its agent weakly, so no reference cycle keeps an agent alive. */
typedef struct MemRegObject {
    PyObject_HEAD PyObject *agent_ref; /* weakref to the AgentObject */
    pdx_mem_reg_h h;
    pdxpy_mem_t mem;
} MemRegObject;

static AgentObject *memreg_agent(MemRegObject *r)
{
    PyObject *a = r->agent_ref ? PyWeakref_GetObject(r->agent_ref) : NULL;
    if (a == NULL || a == Py_None || !agent_alive((AgentObject *)a)) {
        return NULL;
    }
    return (AgentObject *)a;
}

static void memregs_forget(PyObject *regs)
{
    PyObject *it = PyObject_GetIter(regs);
    PyObject *o;
    while (it != NULL && (o = PyIter_Next(it)) != NULL) {
        MemRegObject *r = (MemRegObject *)o;
        r->h = NULL;
        pdxpy_mem_clear(&r->mem);
        Py_DECREF(o);
    }
    Py_XDECREF(it);
    PyErr_Clear();
}

static PyObject *Agent_register(AgentObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "mem_type", "device", "readonly", NULL};
    PyObject *obj, *mt = Py_None, *dev = Py_None;
    int readonly = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$p", kwlist, &obj, &mt,
                                     &dev, &readonly)) {
        return NULL;
    }
    MemRegObject *r = PyObject_New(MemRegObject, &pdxpy_MemRegType);
    if (r == NULL) {
        return NULL;
    }
    r->agent_ref = NULL;
    r->h = NULL;
    if (pdxpy_mem_from_object(obj, mt, dev, 1, &r->mem) < 0) {
        memset(&r->mem, 0, sizeof(r->mem));
        Py_DECREF(r);
        return NULL;
    }
    if (r->mem.readonly && !readonly) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "register: %.100s is read-only memory (a local READ or "
                     "a peer's WRITE would change it): pass readonly=True "
                     "to register it as a source only, or a writable buffer "
                     "(bytearray)",
                     Py_TYPE(obj)->tp_name);
        Py_DECREF(r);
        return NULL;
    }
    /* Declared read-only: local READs into it are refused here, and the
     * flag travels to peers, whose WRITEs into it are refused. */
    r->mem.readonly = readonly;
    if (readonly && self->n_readonly >= 64) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "register: at most 64 regions per agent are "
                        "registered readonly=True");
        Py_DECREF(r);
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st =
        pdx_mem_register(self->h, r->mem.mem_type, r->mem.addr, r->mem.len,
                         r->mem.dev, readonly ? PDX_REGION_F_READONLY : 0,
                         &r->h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "register");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        r->h = NULL;
        Py_DECREF(r);
        return pdxpy_raise(st, "register", err);
    }
    r->agent_ref = PyWeakref_NewRef((PyObject *)self, NULL);
    if (r->agent_ref != NULL && PySet_Add(self->regs, (PyObject *)r) == 0) {
        self->n_readonly += r->mem.readonly;
    } else {
        /* Undo: nothing else knows of it yet. */
        self->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_mem_deregister(self->h, r->h);
        Py_END_ALLOW_THREADS self->uses--;
        r->h = NULL;
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

/* Deregister; 0 done (or nothing to do), -1 with an exception set. */
static int memreg_release(MemRegObject *r)
{
    if (r->h == NULL) {
        pdxpy_mem_clear(&r->mem);
        return 0;
    }
    AgentObject *a = memreg_agent(r);
    if (a == NULL) {
        r->h = NULL; /* freed by the agent's destruction */
        pdxpy_mem_clear(&r->mem);
        return 0;
    }
    Py_INCREF(a);
    a->uses++;
    pdx_status_t st;
    char err[2048];
    pdx_mem_reg_h h = r->h;
    Py_BEGIN_ALLOW_THREADS st = pdx_mem_deregister(a->h, h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "deregister");
    }
    Py_END_ALLOW_THREADS a->uses--;
    if (st != PDX_OK) {
        Py_DECREF(a);
        pdxpy_raise(st, "deregister", err);
        return -1; /* still registered: the buffer stays pinned */
    }
    r->h = NULL;
    a->n_readonly -= r->mem.readonly;
    pdxpy_mem_clear(&r->mem);
    int rc = a->regs ? PySet_Discard(a->regs, (PyObject *)r) : 0;
    Py_DECREF(a);
    return rc < 0 ? -1 : 0;
}

static void MemReg_dealloc(MemRegObject *r)
{
    /* Only reached once the agent no longer holds it: deregistered, or the
     * agent is gone. */
    pdxpy_mem_clear(&r->mem);
    Py_XDECREF(r->agent_ref);
    PyObject_Free(r);
}

static PyObject *MemReg_deregister(MemRegObject *r, PyObject *unused)
{
    if (memreg_release(r) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Agent_deregister(AgentObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &pdxpy_MemRegType)) {
        PyErr_SetString(PyExc_TypeError, "deregister: expected a pdx.MemReg");
        return NULL;
    }
    MemRegObject *r = (MemRegObject *)arg;
    if (r->h != NULL && memreg_agent(r) != NULL && memreg_agent(r) != self) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "deregister: registration of another agent");
        return NULL;
    }
    return MemReg_deregister(r, NULL);
}

static PyObject *MemReg_get(MemRegObject *r, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromUnsignedLongLong(r->mem.addr);
    case 1:
        return PyLong_FromUnsignedLongLong(r->mem.len);
    case 2:
        return PyUnicode_FromString(mem_name(r->mem.mem_type));
    case 3:
        return PyLong_FromUnsignedLong(r->mem.dev);
    case 5:
        return PyBool_FromLong(r->mem.readonly);
    default:
        return PyBool_FromLong(r->h != NULL && memreg_agent(r) != NULL);
    }
}

static PyObject *MemReg_repr(MemRegObject *r)
{
    return PyUnicode_FromFormat(
        "<pdx.MemReg %s 0x%llx+%llu dev %u%s>", mem_name(r->mem.mem_type),
        (unsigned long long)r->mem.addr, (unsigned long long)r->mem.len,
        (unsigned)r->mem.dev, r->h ? "" : " deregistered");
}

/* Regions registered readonly=True (at most RO_MAX per agent). */
enum { RO_MAX = 64 };
typedef struct ro_ranges {
    int n;
    uint64_t lo[RO_MAX], hi[RO_MAX];
} ro_ranges_t;

static void readonly_ranges(AgentObject *a, ro_ranges_t *ro)
{
    ro->n = 0;
    if (a->n_readonly <= 0 || a->regs == NULL) {
        return;
    }
    PyObject *it = PyObject_GetIter(a->regs), *key;
    while (it != NULL && ro->n < RO_MAX && (key = PyIter_Next(it)) != NULL) {
        MemRegObject *r = (MemRegObject *)key;
        if (r->mem.readonly) {
            ro->lo[ro->n] = r->mem.addr;
            ro->hi[ro->n++] = r->mem.addr + r->mem.len;
        }
        Py_DECREF(key);
    }
    Py_XDECREF(it);
    PyErr_Clear();
}

static int readonly_hit(const ro_ranges_t *ro, const pdx_desc_t *d)
{
    for (int k = 0; k < ro->n; k++) {
        if (d->len > 0 && d->addr < ro->hi[k] && ro->lo[k] < d->addr + d->len) {
            return 1;
        }
    }
    return 0;
}

/* Index of the first of `n` descriptors that overlaps a region registered
 * readonly=True, or -1 (also when none is). */
static Py_ssize_t readonly_overlap(AgentObject *a, const pdx_desc_t *d,
                                   size_t n)
{
    ro_ranges_t ro;
    readonly_ranges(a, &ro);
    for (size_t i = 0; ro.n > 0 && i < n; i++) {
        if (readonly_hit(&ro, &d[i])) {
            return (Py_ssize_t)i;
        }
    }
    return -1;
}

static PyObject *readonly_refused(const char *what, Py_ssize_t i,
                                  const pdx_desc_t *d)
{
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "%s: local descriptor %zd (0x%llx+%llu) lies in memory "
                 "registered readonly=True: it cannot be a READ's "
                 "destination",
                 what, i, (unsigned long long)d->addr,
                 (unsigned long long)d->len);
    return NULL;
}

static PyGetSetDef MemReg_getset[] = {
    {"addr", (getter)(void (*)(void))MemReg_get, NULL, "start address",
     (void *)0},
    {"len", (getter)(void (*)(void))MemReg_get, NULL, "length in bytes",
     (void *)1},
    {"mem_type", (getter)(void (*)(void))MemReg_get, NULL, "'DRAM' or 'VRAM'",
     (void *)2},
    {"device", (getter)(void (*)(void))MemReg_get, NULL, "device id",
     (void *)3},
    {"registered", (getter)(void (*)(void))MemReg_get, NULL, "still registered",
     (void *)4},
    {"readonly", (getter)(void (*)(void))MemReg_get, NULL,
     "registered with readonly=True: never a local READ's destination",
     (void *)5},
    {0},
};

static PyMethodDef MemReg_methods[] = {
    {"deregister", (PyCFunction)(void (*)(void))MemReg_deregister, METH_NOARGS,
     "Deregister (pdx.Busy while a request uses it); idempotent."},
    {0},
};

PyTypeObject pdxpy_MemRegType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.MemReg",
    .tp_basicsize = sizeof(MemRegObject),
    .tp_dealloc = (destructor)(void (*)(void))MemReg_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))MemReg_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A registered region (from Agent.register). The agent holds "
              "it, and it keeps the registered object alive and its buffer "
              "exported, until deregister() or the agent's close().",
    .tp_methods = MemReg_methods,
    .tp_getset = MemReg_getset,
};

/* --------------------------------------------------------------- DescList */

DescListObject *pdxpy_desclist_new(size_t n, pdx_mem_type_t mt)
{
    DescListObject *d = PyObject_New(DescListObject, &pdxpy_DescListType);
    if (d == NULL) {
        return NULL;
    }
    d->count = n;
    d->mem_type = mt;
    d->view.obj = NULL;
    d->descs = PyMem_Malloc((n ? n : 1) * sizeof(pdx_desc_t));
    if (d->descs == NULL) {
        d->count = 0;
        Py_DECREF(d);
        return (DescListObject *)PyErr_NoMemory();
    }
    return d;
}

static int read_u64(PyObject *o, uint64_t *v)
{
    if (PyLong_CheckExact(o)) {
        *v = PyLong_AsUnsignedLongLong(o);
    } else {
        PyObject *i = PyNumber_Index(o);
        if (i == NULL) {
            return -1;
        }
        *v = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
    }
    if (*v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "descriptor field must be an integer in 0..2**64-1, "
                     "not %R",
                     o);
        return -1;
    }
    return 0;
}

static DescListObject *desclist_from_buffer(PyObject *o, pdx_mem_type_t mt)
{
    Py_buffer v;
    if (PyObject_GetBuffer(o, &v, PyBUF_RECORDS_RO) < 0) {
        return NULL;
    }
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    int sgn = 0;
    if (v.ndim != 2 || v.shape[1] != 3 || v.itemsize != 8 || f[1] != '\0' ||
        !strchr("qQlLnN", f[0])) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "descriptor array: expected N x 3 of 64-bit integers "
                     "(addr, len, device), got %d dimensions, format %s",
                     v.ndim, v.format ? v.format : "B");
        PyBuffer_Release(&v);
        return NULL;
    }
    sgn = f[0] == 'q' || f[0] == 'l' || f[0] == 'n';
    size_t n = (size_t)v.shape[0];
    _Static_assert(sizeof(pdx_desc_t) == 24 && offsetof(pdx_desc_t, len) == 8 &&
                       offsetof(pdx_desc_t, dev_id) == 16,
                   "pdx_desc_t is three little-endian u64 words");
    if (v.strides[1] == 8 && v.strides[0] == 24 && n > 0) {
        /* A C-contiguous N x 3 array of 64-bit integers has pdx_desc_t's
         * layout (dev_id, reserved = the low and high halves of the third
         * word): view it without a copy once every device fits 32 bits.
         * Addresses and lengths are pdx's to check. */
        const uint64_t *p = v.buf;
        uint64_t high = 0;
        Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < n; i++)
        {
            high |= p[3 * i + 2];
        }
        Py_END_ALLOW_THREADS if ((high >> 32) != 0)
        {
            PyBuffer_Release(&v);
            PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                            "descriptor array: device above 2**32-1 or "
                            "negative");
            return NULL;
        }
        DescListObject *d = PyObject_New(DescListObject, &pdxpy_DescListType);
        if (d == NULL) {
            PyBuffer_Release(&v);
            return NULL;
        }
        d->count = n;
        d->mem_type = mt;
        d->view = v; /* keeps the array exported (unresizable) */
        d->descs = (pdx_desc_t *)v.buf;
        return d;
    }
    DescListObject *d = pdxpy_desclist_new(n, mt);
    if (d == NULL) {
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_ssize_t s0 = v.strides[0], s1 = v.strides[1];
    const char *base = v.buf;
    int64_t neg = 0;
    uint64_t bigdev = 0;
    Py_BEGIN_ALLOW_THREADS pdx_desc_t *out = d->descs;
    if (s1 == 8 && s0 == 24) {
        const uint64_t *p = (const uint64_t *)(const void *)base;
        for (size_t i = 0; i < n; i++) {
            uint64_t a = p[3 * i], l = p[3 * i + 1], dv = p[3 * i + 2];
            neg |= (int64_t)(a | l | dv);
            bigdev |= dv >> 32;
            out[i].addr = a;
            out[i].len = l;
            out[i].dev_id = (uint32_t)dv;
            out[i].reserved = 0;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            const char *row = base + (Py_ssize_t)i * s0;
            uint64_t a, l, dv;
            memcpy(&a, row, 8);
            memcpy(&l, row + s1, 8);
            memcpy(&dv, row + 2 * s1, 8);
            neg |= (int64_t)(a | l | dv);
            bigdev |= dv >> 32;
            out[i].addr = a;
            out[i].len = l;
            out[i].dev_id = (uint32_t)dv;
            out[i].reserved = 0;
        }
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&v);
    if ((sgn && neg < 0) || bigdev != 0) {
        Py_DECREF(d);
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID),
                        "descriptor array: negative value or device above "
                        "2**32-1");
        return NULL;
    }
    return d;
}

DescListObject *pdxpy_desclist_from(PyObject *o, PyObject *mem_type)
{
    pdx_mem_type_t mt;
    if (PyObject_TypeCheck(o, &pdxpy_DescListType)) {
        DescListObject *src = (DescListObject *)o;
        if (mem_type == NULL || mem_type == Py_None) {
            return (DescListObject *)Py_NewRef(o);
        }
        if (pdxpy_mem_type(mem_type, src->mem_type, &mt) < 0) {
            return NULL;
        }
        if (mt == src->mem_type) {
            return (DescListObject *)Py_NewRef(o);
        }
        DescListObject *d = pdxpy_desclist_new(src->count, mt);
        if (d != NULL) {
            memcpy(d->descs, src->descs, src->count * sizeof(pdx_desc_t));
        }
        return d;
    }
    if (pdxpy_mem_type(mem_type, PDX_MEM_DRAM, &mt) < 0) {
        return NULL;
    }
    if (!PyList_Check(o) && !PyTuple_Check(o) && PyObject_CheckBuffer(o)) {
        return desclist_from_buffer(o, mt);
    }
    PyObject *seq = PySequence_Fast(o, "descriptors: a list of (addr, len, "
                                       "device) tuples or an N x 3 array");
    if (seq == NULL) {
        return NULL;
    }
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    DescListObject *d = pdxpy_desclist_new(n, mt);
    if (d == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        PyObject *f[3] = {NULL, NULL, NULL};
        Py_ssize_t k;
        if (PyTuple_Check(t)) {
            k = PyTuple_GET_SIZE(t);
            for (Py_ssize_t j = 0; j < k && j < 3; j++) {
                f[j] = PyTuple_GET_ITEM(t, j);
            }
        } else if (PyList_Check(t)) {
            k = PyList_GET_SIZE(t);
            for (Py_ssize_t j = 0; j < k && j < 3; j++) {
                f[j] = PyList_GET_ITEM(t, j);
            }
        } else {
            k = 0;
        }
        uint64_t a, l, dv = 0;
        if (k < 2 || k > 4) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "descriptor %zu: expected (addr, len[, device[, "
                         "meta]]), got %R",
                         i, t);
            goto fail;
        }
        if (read_u64(f[0], &a) < 0 || read_u64(f[1], &l) < 0 ||
            (k >= 3 && read_u64(f[2], &dv) < 0)) {
            goto fail;
        }
        if (dv > UINT32_MAX) {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "descriptor %zu: device %llu too large", i,
                         (unsigned long long)dv);
            goto fail;
        }
        d->descs[i] = (pdx_desc_t){.addr = a, .len = l, .dev_id = (uint32_t)dv};
    }
    Py_DECREF(seq);
    return d;
fail:
    Py_DECREF(seq);
    Py_DECREF(d);
    return NULL;
}

static PyObject *DescList_new(PyTypeObject *t, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"descs", "mem_type", NULL};
    PyObject *o, *mt = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &o, &mt)) {
        return NULL;
    }
    return (PyObject *)pdxpy_desclist_from(o, mt);
}

static void DescList_dealloc(DescListObject *d)
{
    if (d->view.obj != NULL) {
        PyBuffer_Release(&d->view);
    } else {
        PyMem_Free(d->descs);
    }
    PyObject_Free(d);
}

static Py_ssize_t DescList_len(DescListObject *d)
{
    return (Py_ssize_t)d->count;
}

static PyObject *DescList_item(DescListObject *d, Py_ssize_t i)
{
    if (i < 0 || (size_t)i >= d->count) {
        PyErr_SetString(PyExc_IndexError, "descriptor index out of range");
        return NULL;
    }
    return Py_BuildValue("(KKI)", (unsigned long long)d->descs[i].addr,
                         (unsigned long long)d->descs[i].len,
                         (unsigned)d->descs[i].dev_id);
}

static PyObject *DescList_get_mem_type(DescListObject *d, void *c)
{
    return PyUnicode_FromString(mem_name(d->mem_type));
}

static PyObject *DescList_total(DescListObject *d, void *c)
{
    uint64_t t = 0;
    for (size_t i = 0; i < d->count; i++) {
        t += d->descs[i].len;
    }
    return PyLong_FromUnsignedLongLong(t);
}

static PyObject *DescList_repr(DescListObject *d)
{
    return PyUnicode_FromFormat("<pdx.DescList %s, %zu descriptors>",
                                mem_name(d->mem_type), d->count);
}

static PySequenceMethods DescList_seq = {
    .sq_length = (lenfunc)(void (*)(void))DescList_len,
    .sq_item = (ssizeargfunc)(void (*)(void))DescList_item,
};

static PyGetSetDef DescList_getset[] = {
    {"mem_type", (getter)(void (*)(void))DescList_get_mem_type, NULL,
     "'DRAM' or 'VRAM'", NULL},
    {"total_bytes", (getter)(void (*)(void))DescList_total, NULL,
     "sum of the lengths", NULL},
    {0},
};

PyTypeObject pdxpy_DescListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.DescList",
    .tp_basicsize = sizeof(DescListObject),
    .tp_dealloc = (destructor)(void (*)(void))DescList_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))DescList_repr,
    .tp_as_sequence = &DescList_seq,
    .tp_getset = DescList_getset,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DescList(descs, mem_type='DRAM'): descriptors (addr, len, "
              "device) held in C, from a list of tuples or an N x 3 integer "
              "array (converted without a Python loop; a C-contiguous "
              "64-bit one is used in place, without a copy: do not modify "
              "it while the DescList lives).",
    .tp_new = DescList_new,
};

/* ------------------------------------------------------------ PreparedList */

typedef struct DListObject {
    PyObject_HEAD AgentObject *agent;
    pdx_dlist_h h;
    size_t count;
    int uses;
    PyObject *peer;
    uint8_t *ro; /* local lists: 1 per entry in readonly memory, or NULL */
} DListObject;

static PyObject *Agent_prep_dlist(AgentObject *self, PyObject *args,
                                  PyObject *kw)
{
    static char *kwlist[] = {"descs", "peer", "mem_type", NULL};
    PyObject *o, *mt = Py_None;
    const char *peer = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|zO", kwlist, &o, &peer,
                                     &mt)) {
        return NULL;
    }
    DescListObject *d = pdxpy_desclist_from(o, mt);
    if (d == NULL) {
        return NULL;
    }
    if (pdxpy_agent_enter(self) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    pdx_desc_list_t l = {
        .mem_type = d->mem_type, .descs = d->descs, .count = d->count};
    pdx_dlist_h h = NULL;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st = pdx_dlist_prepare(self->h, peer, &l, &h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "prep_dlist");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    size_t count = d->count;
    uint8_t *ro = NULL;
    int nomem = 0;
    if (st == PDX_OK && peer == NULL &&
        readonly_overlap(self, d->descs, d->count) >= 0) {
        ro_ranges_t rr;
        readonly_ranges(self, &rr);
        ro = PyMem_Calloc(count, 1);
        nomem = ro == NULL;
        for (size_t i = 0; ro != NULL && i < count; i++) {
            ro[i] = (uint8_t)readonly_hit(&rr, &d->descs[i]);
        }
    }
    Py_DECREF(d);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "prep_dlist", err);
    }
    DListObject *r = nomem ? NULL : PyObject_New(DListObject, &pdxpy_DListType);
    if (r == NULL) {
        PyMem_Free(ro);
        self->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_dlist_release(h);
        Py_END_ALLOW_THREADS self->uses--;
        return nomem ? PyErr_NoMemory() : NULL;
    }
    r->ro = ro;
    r->agent = (AgentObject *)Py_NewRef(self);
    r->h = h;
    r->count = count;
    r->uses = 0;
    r->peer = peer ? PyUnicode_FromString(peer) : Py_NewRef(Py_None);
    return (PyObject *)r;
}

static void dlist_release(DListObject *r)
{
    if (r->h == NULL) {
        return;
    }
    pdxpy_wait_unused(&r->uses);
    pdx_dlist_h h = r->h;
    r->h = NULL;
    if (agent_alive(r->agent)) {
        AgentObject *a = r->agent;
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_dlist_release(h);
        Py_END_ALLOW_THREADS a->uses--;
    }
}

static void DList_dealloc(DListObject *r)
{
    dlist_release(r);
    Py_XDECREF(r->agent);
    Py_XDECREF(r->peer);
    PyMem_Free(r->ro);
    PyObject_Free(r);
}

static PyObject *DList_release(DListObject *r, PyObject *unused)
{
    dlist_release(r);
    Py_RETURN_NONE;
}

static Py_ssize_t DList_len(DListObject *r)
{
    return (Py_ssize_t)r->count;
}

static PyObject *DList_get(DListObject *r, void *which)
{
    if (which == NULL) {
        return Py_NewRef(r->peer);
    }
    return PyBool_FromLong(r->h != NULL && agent_alive(r->agent));
}

static PyObject *DList_repr(DListObject *r)
{
    return PyUnicode_FromFormat("<pdx.PreparedList %zu descriptors, peer "
                                "%R%s>",
                                r->count, r->peer, r->h ? "" : " released");
}

static PyMethodDef DList_methods[] = {
    {"release", (PyCFunction)(void (*)(void))DList_release, METH_NOARGS,
     "Release the prepared list; idempotent."},
    {0},
};

static PyGetSetDef DList_getset[] = {
    {"peer", (getter)(void (*)(void))DList_get, NULL,
     "peer name, or None for local", NULL},
    {"valid", (getter)(void (*)(void))DList_get, NULL, "not released",
     (void *)1},
    {0},
};

static PySequenceMethods DList_seq = {.sq_length =
                                          (lenfunc)(void (*)(void))DList_len};

PyTypeObject pdxpy_DListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.PreparedList",
    .tp_basicsize = sizeof(DListObject),
    .tp_dealloc = (destructor)(void (*)(void))DList_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))DList_repr,
    .tp_as_sequence = &DList_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prepared descriptor list (Agent.prep_dlist): requests are "
              "made from indices into it.",
    .tp_methods = DList_methods,
    .tp_getset = DList_getset,
};

/* ------------------------------------------------------------------- Xfer */

typedef struct XferObject {
    PyObject_HEAD AgentObject *agent;
    pdx_xfer_h h;
    int uses;
    int released;
    pdx_status_t last;
    PyObject *error; /* text of the last failure, or None */
} XferObject;

static int parse_op(PyObject *o, pdx_xfer_op_t *op)
{
    if (PyUnicode_Check(o)) {
        if (PyUnicode_CompareWithASCIIString(o, "READ") == 0 ||
            PyUnicode_CompareWithASCIIString(o, "read") == 0) {
            *op = PDX_XFER_READ;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(o, "WRITE") == 0 ||
            PyUnicode_CompareWithASCIIString(o, "write") == 0) {
            *op = PDX_XFER_WRITE;
            return 0;
        }
    } else if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);
        if (v == PDX_XFER_READ || v == PDX_XFER_WRITE) {
            *op = (pdx_xfer_op_t)v;
            return 0;
        }
    }
    PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                 "operation must be 'READ' or 'WRITE', not %R", o);
    return -1;
}

static XferObject *xfer_wrap(AgentObject *a, pdx_xfer_h h)
{
    XferObject *x = PyObject_New(XferObject, &pdxpy_XferType);
    if (x == NULL) {
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_xfer_release(h);
        Py_END_ALLOW_THREADS a->uses--;
        return NULL;
    }
    x->agent = (AgentObject *)Py_NewRef(a);
    x->h = h;
    x->uses = 0;
    x->released = 0;
    x->last = PDX_INPROGRESS;
    x->error = Py_NewRef(Py_None);
    return x;
}

static int dlist_enter(DListObject *d, const char *which)
{
    if (d->h == NULL || !agent_alive(d->agent)) {
        char buf[96];
        snprintf(buf, sizeof(buf), "%s prepared list is released", which);
        pdxpy_closed(buf);
        return -1;
    }
    d->uses++;
    return 0;
}

/* make_xfer(op, local, local_idx, remote, remote_idx, notif=None) */
static PyObject *Agent_make_xfer(AgentObject *self, PyObject *const *args,
                                 Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *notif = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw < 5 || nargs + nkw > 6 || nargs < 5) {
        PyErr_SetString(PyExc_TypeError,
                        "make_xfer(op, local, local_idx, remote, remote_idx, "
                        "notif=None)");
        return NULL;
    }
    if (nargs == 6) {
        notif = args[5];
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i),
                                             "notif") != 0 ||
            nargs == 6) {
            PyErr_SetString(PyExc_TypeError,
                            "make_xfer: the only keyword is notif");
            return NULL;
        }
        notif = args[nargs + i];
    }
    pdx_xfer_op_t op;
    if (parse_op(args[0], &op) < 0) {
        return NULL;
    }
    if (!PyObject_TypeCheck(args[1], &pdxpy_DListType) ||
        !PyObject_TypeCheck(args[3], &pdxpy_DListType)) {
        PyErr_SetString(PyExc_TypeError, "make_xfer: local and remote must be "
                                         "pdx.PreparedList");
        return NULL;
    }
    DListObject *ld = (DListObject *)args[1], *rd = (DListObject *)args[3];
    uint32_t lstack[128], rstack[128];
    void *li = NULL, *ri = NULL;
    size_t ln = 0, rn = 0;
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    PyObject *res = NULL;
    if (pdxpy_int_array(args[2], 4, lstack, 128, &li, &ln) < 0) {
        return NULL;
    }
    if (pdxpy_int_array(args[4], 4, rstack, 128, &ri, &rn) < 0) {
        goto out;
    }
    if (ln != rn) {
        PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                     "make_xfer: %zu local indices but %zu remote ones", ln,
                     rn);
        goto out;
    }
    if (op == PDX_XFER_READ && ld->ro != NULL) {
        const uint32_t *idx = li;
        for (size_t k = 0; k < ln; k++) {
            if (idx[k] < ld->count && ld->ro[idx[k]]) {
                PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                             "make_xfer: local entry %u lies in memory "
                             "registered readonly=True: it cannot be a "
                             "READ's destination",
                             (unsigned)idx[k]);
                goto out;
            }
        }
    }
    if (pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0) {
        goto out;
    }
    if (pdxpy_agent_enter(self) < 0) {
        goto out;
    }
    if (dlist_enter(ld, "local") < 0) {
        pdxpy_agent_leave(self);
        goto out;
    }
    if (dlist_enter(rd, "remote") < 0) {
        ld->uses--;
        pdxpy_agent_leave(self);
        goto out;
    }
    pdx_xfer_h h = NULL;
    pdx_status_t st;
    char err[2048];
    /* Released even for small requests: make waits on the agent lock,
     * which the progress thread may hold. */
    Py_BEGIN_ALLOW_THREADS st = pdx_xfer_make(self->h, op, ld->h, li, rd->h, ri,
                                              ln, np, (size_t)nlen, &h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "make_xfer");
    }
    Py_END_ALLOW_THREADS ld->uses--;
    rd->uses--;
    pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        pdxpy_raise(st, "make_xfer", err);
        goto out;
    }
    res = (PyObject *)xfer_wrap(self, h);
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    if (li != lstack) {
        PyMem_Free(li);
    }
    if (ri != rstack && ri != NULL) {
        PyMem_Free(ri);
    }
    return res;
}

static PyObject *Agent_create_xfer(AgentObject *self, PyObject *args,
                                   PyObject *kw)
{
    static char *kwlist[] = {"op",    "local",    "remote",          "peer",
                             "notif", "mem_type", "remote_mem_type", NULL};
    PyObject *opo, *lo, *ro, *notif = Py_None, *mt = Py_None, *rmt = Py_None;
    const char *peer;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOs|OOO", kwlist, &opo, &lo,
                                     &ro, &peer, &notif, &mt, &rmt)) {
        return NULL;
    }
    pdx_xfer_op_t op;
    if (parse_op(opo, &op) < 0) {
        return NULL;
    }
    DescListObject *l = pdxpy_desclist_from(lo, mt);
    if (l == NULL) {
        return NULL;
    }
    DescListObject *r = pdxpy_desclist_from(ro, rmt);
    if (r == NULL) {
        Py_DECREF(l);
        return NULL;
    }
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    PyObject *res = NULL;
    if (op == PDX_XFER_READ) {
        Py_ssize_t bad = readonly_overlap(self, l->descs, l->count);
        if (bad >= 0) {
            readonly_refused("create_xfer", bad, &l->descs[bad]);
            goto out;
        }
    }
    if (pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0 ||
        pdxpy_agent_enter(self) < 0) {
        goto out;
    }
    pdx_desc_list_t ll = {l->mem_type, l->descs, l->count};
    pdx_desc_list_t rl = {r->mem_type, r->descs, r->count};
    pdx_xfer_h h = NULL;
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st =
        pdx_xfer_create(self->h, op, &ll, &rl, peer, np, (size_t)nlen, &h);
    if (st != PDX_OK) {
        pdxpy_last_error(err, sizeof(err), st, "create_xfer");
    }
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        pdxpy_raise(st, "create_xfer", err);
        goto out;
    }
    res = (PyObject *)xfer_wrap(self, h);
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    Py_DECREF(l);
    Py_DECREF(r);
    return res;
}

static int xfer_enter(XferObject *x)
{
    if (x->h == NULL || x->released) {
        pdxpy_closed("request is released");
        return -1;
    }
    if (!agent_alive(x->agent)) {
        pdxpy_closed("request's agent is closed");
        return -1;
    }
    if (x->uses > 0) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_BUSY),
                        "request in use by another thread (one request must "
                        "not be used by two threads at once)");
        return -1;
    }
    x->uses++;
    x->agent->uses++;
    return 0;
}

static void xfer_leave(XferObject *x)
{
    x->uses--;
    x->agent->uses--;
}

static void xfer_note_error(XferObject *x, pdx_status_t st, const char *err)
{
    PyObject *e = PyUnicode_DecodeUTF8(err, (Py_ssize_t)strlen(err), "replace");
    if (e != NULL) {
        Py_SETREF(x->error, e);
    } else {
        PyErr_Clear();
    }
}

/* Raw post/check: the status code, never raising for a pdx error (the text
 * is kept in .error). For pdx.nixl's DONE/PROC/ERR. */
static PyObject *xfer_raw(XferObject *x, int post)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    pdx_status_t st;
    char err[2048];
    Py_BEGIN_ALLOW_THREADS st =
        post ? pdx_xfer_post(x->h) : pdx_xfer_check(x->h);
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, post ? "post" : "check");
    }
    Py_END_ALLOW_THREADS xfer_leave(x);
    x->last = st;
    if (st < 0) {
        xfer_note_error(x, st, err);
    }
    return PyLong_FromLong((long)st);
}

static PyObject *Xfer_post_raw(XferObject *x, PyObject *u)
{
    return xfer_raw(x, 1);
}

static PyObject *Xfer_check_raw(XferObject *x, PyObject *u)
{
    return xfer_raw(x, 0);
}

static PyObject *xfer_bool(XferObject *x, int post)
{
    PyObject *r = xfer_raw(x, post);
    if (r == NULL) {
        return NULL;
    }
    long st = PyLong_AsLong(r);
    Py_DECREF(r);
    if (st < 0) {
        const char *m = PyUnicode_AsUTF8(x->error);
        return pdxpy_raise((pdx_status_t)st, post ? "post" : "check", m);
    }
    return PyBool_FromLong(st == PDX_OK);
}

static PyObject *Xfer_post(XferObject *x, PyObject *u)
{
    return xfer_bool(x, 1);
}

static PyObject *Xfer_check(XferObject *x, PyObject *u)
{
    return xfer_bool(x, 0);
}

static PyObject *Xfer_abort(XferObject *x, PyObject *u)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdx_xfer_abort(x->h);
    Py_END_ALLOW_THREADS xfer_leave(x);
    if (st < 0) {
        return pdxpy_raise(st, "abort", NULL);
    }
    Py_RETURN_NONE;
}

/* Xfer.wait: a check longer than this did copy work; spin this long
 * after the last one before sleeping on the event fd. */
#define WAIT_WORK_S 2e-6
#define WAIT_SPIN_S 30e-6

static PyObject *Xfer_wait(XferObject *x, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *to = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &to)) {
        return NULL;
    }
    double timeout = -1; /* None or inf: no limit */
    if (to != Py_None) {
        if (pdxpy_timeout_arg(to, "wait", 1, &timeout) < 0) {
            return NULL;
        }
        if (isinf(timeout)) {
            timeout = -1;
        }
    }
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    AgentObject *a = x->agent;
    pdx_status_t st;
    char err[2048];
    int closed = 0;
    Py_BEGIN_ALLOW_THREADS double start = pdxpy_now();
    double end = start + timeout, busy = start;
    int spins = 0;
    for (;;) {
        double t0 = pdxpy_now();
        st = pdx_xfer_check(x->h);
        if (st != PDX_INPROGRESS) {
            break;
        }
        double t1 = pdxpy_now();
        double left = timeout < 0 ? 1.0 : end - t1;
        if (left <= 0) {
            break;
        }
        if (__atomic_load_n(&a->closing, __ATOMIC_RELAXED)) {
            closed = 1;
            break;
        }
        /* A check that took a while did work (cma copies half of each
         * piece of a large request in the caller's check): keep calling
         * it, as a C caller would, and allow a short spin after the last
         * such check. Otherwise sleep on the agent's fd: the progress
         * thread signals it when it completes work; at most 1 ms, since
         * a copy finished by a backend's worker may not signal it. */
        if (t1 - t0 > WAIT_WORK_S) {
            busy = t1;
            continue;
        }
        if (t1 - busy < WAIT_SPIN_S) {
            continue;
        }
        agent_sleep(a->h, left > 0.001 ? 1 : 0, &spins);
    }
    if (st < 0) {
        pdxpy_last_error(err, sizeof(err), st, "wait");
    }
    Py_END_ALLOW_THREADS xfer_leave(x);
    x->last = st;
    if (closed) {
        return pdxpy_closed("agent closed while waiting");
    }
    if (st < 0) {
        xfer_note_error(x, st, err);
        return pdxpy_raise(st, "wait", err);
    }
    if (st == PDX_INPROGRESS) {
        char buf[160];
        snprintf(buf, sizeof(buf),
                 "wait: request still in flight after %.3f s (it is not "
                 "aborted)",
                 timeout);
        return pdxpy_raise(PDX_ERR_TIMEOUT, "wait", buf);
    }
    Py_RETURN_NONE;
}

static void xfer_release(XferObject *x)
{
    if (x->released || x->h == NULL) {
        x->released = 1;
        return;
    }
    x->released = 1;
    pdxpy_wait_unused(&x->uses);
    pdx_xfer_h h = x->h;
    x->h = NULL;
    if (agent_alive(x->agent)) {
        AgentObject *a = x->agent;
        a->uses++;
        Py_BEGIN_ALLOW_THREADS pdx_xfer_release(h);
        Py_END_ALLOW_THREADS a->uses--;
    }
}

static PyObject *Xfer_release(XferObject *x, PyObject *u)
{
    xfer_release(x);
    Py_RETURN_NONE;
}

static PyObject *Xfer_telemetry(XferObject *x, PyObject *u)
{
    if (xfer_enter(x) < 0) {
        return NULL;
    }
    if (pdxpy_require((const void *)pdxpy_opt.xfer_telemetry,
                      "pdx_xfer_telemetry") < 0) {
        xfer_leave(x);
        return NULL;
    }
    pdx_xfer_telemetry_t t;
    memset(&t, 0, sizeof(t));
    pdx_status_t st;
    Py_BEGIN_ALLOW_THREADS st = pdxpy_opt.xfer_telemetry(x->h, &t);
    Py_END_ALLOW_THREADS xfer_leave(x);
    if (st != PDX_OK) {
        return pdxpy_raise(st, "telemetry", NULL);
    }
    t.backend[sizeof(t.backend) - 1] = '\0';
    t.transport[sizeof(t.transport) - 1] = '\0';
    t.fallback_why[sizeof(t.fallback_why) - 1] = '\0';
    return Py_BuildValue(
        "{s:s,s:s,s:O,s:s,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "backend",
        t.backend, "transport", t.transport, "fallback",
        t.fallback ? Py_True : Py_False, "fallback_why", t.fallback_why,
        "status", (int)t.status, "descs", (unsigned long long)t.descs,
        "segments", (unsigned long long)t.segments, "bytes",
        (unsigned long long)t.bytes, "posts", (unsigned long long)t.posts,
        "start_time_ns", (unsigned long long)t.start_time_ns,
        "post_duration_ns", (unsigned long long)t.post_duration_ns,
        "xfer_duration_ns", (unsigned long long)t.xfer_duration_ns);
}

static void Xfer_dealloc(XferObject *x)
{
    xfer_release(x);
    Py_XDECREF(x->agent);
    Py_XDECREF(x->error);
    PyObject_Free(x);
}

static PyObject *Xfer_get(XferObject *x, void *which)
{
    switch ((intptr_t)which) {
    case 0:
        return PyLong_FromLong((long)x->last);
    case 1:
        return Py_NewRef(x->error);
    case 2:
        if (xfer_enter(x) < 0) {
            return NULL;
        } else {
            size_t n = pdx_xfer_segments(x->h);
            xfer_leave(x);
            return PyLong_FromSize_t(n);
        }
    default:
        return PyBool_FromLong(!x->released && x->h != NULL &&
                               agent_alive(x->agent));
    }
}

static PyObject *Xfer_enter_ctx(XferObject *x, PyObject *u)
{
    return Py_NewRef(x);
}

static PyObject *Xfer_exit_ctx(XferObject *x, PyObject *args)
{
    xfer_release(x);
    Py_RETURN_FALSE;
}

static PyObject *Xfer_repr(XferObject *x)
{
    return PyUnicode_FromFormat("<pdx.Xfer status %s%s>",
                                pdx_status_string(x->last),
                                x->released ? " released" : "");
}

static PyMethodDef Xfer_methods[] = {
    {"post", (PyCFunction)(void (*)(void))Xfer_post, METH_NOARGS,
     "Post (never blocks): True if already complete, False in flight; "
     "raises the status's exception on error."},
    {"check", (PyCFunction)(void (*)(void))Xfer_check, METH_NOARGS,
     "True when complete, False in flight; raises on error. Drives "
     "progress."},
    {"wait", (PyCFunction)(void (*)(void))Xfer_wait,
     METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): sleep on the agent's event fd until complete; "
     "raises on error, pdx.Timeout if still in flight after timeout s "
     "(None or inf: no limit; nan or negative: pdx.InvalidArgument)."},
    {"abort", (PyCFunction)(void (*)(void))Xfer_abort, METH_NOARGS,
     "Ask an in-flight request to stop (check/wait until it ends)."},
    {"release", (PyCFunction)(void (*)(void))Xfer_release, METH_NOARGS,
     "Free the request (aborting in-flight work); idempotent."},
    {"telemetry", (PyCFunction)(void (*)(void))Xfer_telemetry, METH_NOARGS,
     "dict: backend, transport, fallback, bytes, descs, times (ns)."},
    {"_post_raw", (PyCFunction)(void (*)(void))Xfer_post_raw, METH_NOARGS,
     "post, returning the status code (errors kept in .error)."},
    {"_check_raw", (PyCFunction)(void (*)(void))Xfer_check_raw, METH_NOARGS,
     "check, returning the status code (errors kept in .error)."},
    {"__enter__", (PyCFunction)(void (*)(void))Xfer_enter_ctx, METH_NOARGS,
     NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Xfer_exit_ctx, METH_VARARGS,
     NULL},
    {0},
};

static PyGetSetDef Xfer_getset[] = {
    {"status", (getter)(void (*)(void))Xfer_get, NULL, "last status code",
     (void *)0},
    {"error", (getter)(void (*)(void))Xfer_get, NULL,
     "text of the last failure or None", (void *)1},
    {"segments", (getter)(void (*)(void))Xfer_get, NULL,
     "descriptors after merging", (void *)2},
    {"valid", (getter)(void (*)(void))Xfer_get, NULL, "not released",
     (void *)3},
    {0},
};

PyTypeObject pdxpy_XferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.Xfer",
    .tp_basicsize = sizeof(XferObject),
    .tp_dealloc = (destructor)(void (*)(void))Xfer_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))Xfer_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A transfer request (Agent.make_xfer / create_xfer). One "
              "request must not be used by two threads at once (pdx.Busy).",
    .tp_methods = Xfer_methods,
    .tp_getset = Xfer_getset,
};

/* ------------------------------------------------------------ benchmark */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* _bench_make_post_check(op, local, local_idx, remote, remote_idx, iters,
 * notif=None) -> [ns per iteration]: the C baseline of python_bench.py,
 * the loop a C stack runs per request (make, post, check until done,
 * release), timed per iteration with the GIL released throughout. */
static PyObject *Agent_bench(AgentObject *self, PyObject *args)
{
    PyObject *opo, *lo, *lio, *ro, *rio, *notif = Py_None;
    Py_ssize_t iters;
    if (!PyArg_ParseTuple(args, "OO!OO!On|O", &opo, &pdxpy_DListType, &lo, &lio,
                          &pdxpy_DListType, &ro, &rio, &iters, &notif)) {
        return NULL;
    }
    pdx_xfer_op_t op;
    if (parse_op(opo, &op) < 0 || iters <= 0) {
        return NULL;
    }
    DListObject *ld = (DListObject *)lo, *rd = (DListObject *)ro;
    void *li = NULL, *ri = NULL;
    size_t ln, rn;
    Py_buffer nv = {0};
    const char *np = NULL;
    Py_ssize_t nlen = 0;
    uint64_t *ns = PyMem_Malloc((size_t)iters * sizeof(*ns));
    PyObject *res = NULL;
    if (ns == NULL) {
        return PyErr_NoMemory();
    }
    if (pdxpy_int_array(lio, 4, NULL, 0, &li, &ln) < 0 ||
        pdxpy_int_array(rio, 4, NULL, 0, &ri, &rn) < 0 ||
        pdxpy_bytes_arg(notif, &nv, &np, &nlen) < 0) {
        goto out;
    }
    if (ln != rn) {
        PyErr_SetString(pdxpy_exc_for(PDX_ERR_INVALID), "index counts");
        goto out;
    }
    if (pdxpy_agent_enter(self) < 0) {
        goto out;
    }
    if (dlist_enter(ld, "local") < 0) {
        pdxpy_agent_leave(self);
        goto out;
    }
    if (dlist_enter(rd, "remote") < 0) {
        ld->uses--;
        pdxpy_agent_leave(self);
        goto out;
    }
    pdx_status_t st = PDX_OK;
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < iters && st >= 0; i++)
    {
        uint64_t t0 = now_ns();
        pdx_xfer_h h;
        st = pdx_xfer_make(self->h, op, ld->h, li, rd->h, ri, ln, np,
                           (size_t)nlen, &h);
        if (st != PDX_OK) {
            break;
        }
        st = pdx_xfer_post(h);
        while (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(h);
        }
        pdx_xfer_release(h);
        ns[i] = now_ns() - t0;
    }
    Py_END_ALLOW_THREADS ld->uses--;
    rd->uses--;
    pdxpy_agent_leave(self);
    if (st < 0) {
        pdxpy_raise(st, "bench", NULL);
        goto out;
    }
    res = PyList_New(iters);
    for (Py_ssize_t i = 0; res != NULL && i < iters; i++) {
        PyList_SET_ITEM(res, i, PyLong_FromUnsignedLongLong(ns[i]));
    }
out:
    if (nv.obj) {
        PyBuffer_Release(&nv);
    }
    PyMem_Free(li);
    PyMem_Free(ri);
    PyMem_Free(ns);
    return res;
}

/* ------------------------------------------------------------ Agent type */

static PyMethodDef Agent_methods[] = {
    {"close", (PyCFunction)(void (*)(void))Agent_close, METH_NOARGS,
     "Destroy the agent (waits for calls in progress); idempotent. Its "
     "registrations, lists and requests are dead afterwards."},
    {"__enter__", (PyCFunction)(void (*)(void))Agent_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Agent_exit, METH_VARARGS, NULL},
    {"describe", (PyCFunction)(void (*)(void))Agent_describe, METH_NOARGS,
     "describe() -> bytes: this agent's metadata blob for its peers."},
    {"load_peer", (PyCFunction)(void (*)(void))Agent_load_peer, METH_O,
     "load_peer(blob) -> name: validate and connect a peer (pdx.Corrupt, "
     "pdx.VersionError, pdx.Mismatch with the reason)."},
    {"unload_peer", (PyCFunction)(void (*)(void))Agent_unload_peer, METH_O,
     "unload_peer(name): forget a peer (its requests end pdx.Stale)."},
    {"peer_state", (PyCFunction)(void (*)(void))Agent_peer_state, METH_O,
     "peer_state(name) -> 'alive' | 'disconnected' (pdx.NotFound if "
     "unknown)."},
    {"peer_info", (PyCFunction)(void (*)(void))Agent_peer_info, METH_O,
     "peer_info(name) -> dict with the peer's regions (addr, len, "
     "mem_type, device, shared)."},
    {"set_invariant", (PyCFunction)(void (*)(void))Agent_set_invariant,
     METH_VARARGS, "set_invariant(key, value): must match on every peer."},
    {"progress", (PyCFunction)(void (*)(void))Agent_progress, METH_NOARGS,
     "Drive backends once; returns events handled."},
    {"event_fd", (PyCFunction)(void (*)(void))Agent_event_fd, METH_NOARGS,
     "An fd readable when the agent has work: for selectors/asyncio "
     "(then call progress() and get_notifs()). Do not read or close it."},
    {"register", (PyCFunction)(void (*)(void))Agent_register,
     METH_VARARGS | METH_KEYWORDS,
     "register(obj, mem_type=None, device=None, *, readonly=False) -> "
     "MemReg. obj: a buffer (bytearray, numpy array, mmap, SharedMemory), "
     "(addr, len, mem_type, device), or an object with data_ptr() / "
     "__cuda_array_interface__. A read-only buffer (bytes) is refused "
     "unless readonly=True: then it is never a local READ's destination "
     "(refused here), but pdx does not stop a peer's WRITE into it, so "
     "register read-only memory only for peers that do not WRITE to it "
     "(at most 64 such regions per agent)."},
    {"deregister", (PyCFunction)(void (*)(void))Agent_deregister, METH_O,
     "deregister(reg): as reg.deregister()."},
    {"prep_dlist", (PyCFunction)(void (*)(void))Agent_prep_dlist,
     METH_VARARGS | METH_KEYWORDS,
     "prep_dlist(descs, peer=None, mem_type=None) -> PreparedList: descs a "
     "DescList, list of (addr, len, device) or N x 3 array; peer None for "
     "this agent's memory."},
    {"make_xfer", (PyCFunction)(void (*)(void))Agent_make_xfer,
     METH_FASTCALL | METH_KEYWORDS,
     "make_xfer(op, local, local_idx, remote, remote_idx, notif=None) -> "
     "Xfer from two prepared lists; indices lists or integer arrays."},
    {"create_xfer", (PyCFunction)(void (*)(void))Agent_create_xfer,
     METH_VARARGS | METH_KEYWORDS,
     "create_xfer(op, local, remote, peer, notif=None, mem_type=None, "
     "remote_mem_type=None) -> Xfer from two descriptor lists."},
    {"get_notifs", (PyCFunction)(void (*)(void))Agent_get_notifs,
     METH_VARARGS | METH_KEYWORDS,
     "get_notifs(timeout=0) -> {peer: [bytes, ...]}: waits up to timeout s "
     "(on the event fd) for at least one; inf: until one comes or the "
     "agent closes; nan or negative: pdx.InvalidArgument."},
    {"send_notif", (PyCFunction)(void (*)(void))Agent_send_notif, METH_VARARGS,
     "send_notif(peer, msg): queue a notification: bytes-like, or str "
     "(sent UTF-8 encoded, as NIXL does); other types: TypeError."},
    {"stats", (PyCFunction)(void (*)(void))Agent_stats,
     METH_VARARGS | METH_KEYWORDS,
     "stats(backend=None, peer=None) -> dict of counters."},
    {"stats_json", (PyCFunction)(void (*)(void))Agent_stats_json, METH_NOARGS,
     "stats_json() -> str: every counter as JSON (with a 'store' member "
     "when the agent has a store)."},
    {"publish", (PyCFunction)(void (*)(void))Agent_publish, METH_NOARGS,
     "publish(): keep this agent's description in the store under "
     "<namespace>/agents/<name>, on its lease, again at every change. Call "
     "it once the agent is complete (memory registered, invariants set). "
     "pdx.Unsupported without store=."},
    {"fetch_peer", (PyCFunction)(void (*)(void))Agent_fetch_peer,
     METH_VARARGS | METH_KEYWORDS,
     "fetch_peer(name, timeout=5.0) -> name: load a peer known only by name "
     "through the store (its cached description, else the store's, else "
     "waiting up to timeout s for it to be published; invariants checked). "
     "Returns at once when it is loaded and alive. pdx.NotFound (not "
     "published in time), pdx.Unavailable (store unreachable, name never "
     "seen), pdx.Mismatch, pdx.Unsupported (no store)."},
    {"store_status", (PyCFunction)(void (*)(void))Agent_store_status,
     METH_NOARGS,
     "store_status() -> dict: reachable, unreachable_since (epoch s or "
     "None), lease, lease_ttl_s, leases_granted, revision, requests, "
     "failures, leased_keys, unpublished, watches, endpoint, last_error and "
     "'describe' (one line for people). pdx.Unsupported without store=."},
    {"_bench_make_post_check", (PyCFunction)(void (*)(void))Agent_bench,
     METH_VARARGS,
     "The C loop python_bench.py compares against: [ns per request]."},
    {0},
};

static PyGetSetDef Agent_getset[] = {
    {"name", (getter)(void (*)(void))Agent_get_name, NULL, "agent name", NULL},
    {"closed", (getter)(void (*)(void))Agent_get_closed, NULL,
     "True after close()", NULL},
    {0},
};

PyTypeObject pdxpy_AgentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pdx.Agent",
    .tp_basicsize = sizeof(AgentObject),
    .tp_dealloc = (destructor)(void (*)(void))Agent_dealloc,
    .tp_repr = (reprfunc)(void (*)(void))Agent_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Agent(name, *, progress_thread=True, backends=None "
              "(['ucx', 'cma']), xfer_timeout=None (s), "
              "progress_interval_us=None, path_policy=None ('any' | "
              "'same_host_fast'), backend_options=None ({backend: {k: v}}), "
              "telemetry=False (per-request times in Xfer.telemetry()), "
              "store=None ({'type': 'etcd', 'endpoints': URL or [URL, ...], "
              "'namespace': 'pdx', 'lease_ttl_ms': 10000, 'timeout_ms': "
              "2000, 'max_txn_ops': 128}: discovery by name and liveness "
              "through the store; then publish(), fetch_peer(), "
              "store_status())). A context manager; close() destroys it.",
    .tp_weaklistoffset = offsetof(AgentObject, weakreflist),
    .tp_methods = Agent_methods,
    .tp_getset = Agent_getset,
    .tp_init = (initproc)(void (*)(void))Agent_init,
    .tp_new = PyType_GenericNew,
};
