/* pdx.Agent: creation (backends, store), peers, notifications, stats,
 * close. Its methods that make children live with the child's type:
 * register (memreg.c), prep_dlist (dlist.c), make/create_xfer (xfer.c),
 * the store calls (agent_store.c) and bench (bench.c). Every call that can
 * take more than a few microseconds runs with the GIL released. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ Agent */

typedef struct backend_spec {
    char name[32];
    pdx_option_t opts[16];
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
#define STORE_NOPTS 5 /* the etcd store's TLS and auth options */

typedef struct store_spec {
    char type[32];
    char endpoints[512];
    char ns[128];
    char optval[STORE_NOPTS][256];
    pdx_option_t opts[STORE_NOPTS];
    size_t nopts;
} store_spec_t;

#define STORE_KEYS                                                             \
    "type, endpoints, namespace, lease_ttl_ms, timeout_ms, max_txn_ops, "      \
    "ca_file, cert_file, key_file, user, password_file"

/* The store module's own options (pdx/store.h: TLS and etcd auth). */
static const char *const g_store_opt_keys[STORE_NOPTS] = {
    "ca_file", "cert_file", "key_file", "user", "password_file"};

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

/* One of the store module's options (ca_file, ...): 0 taken, 1 not one
 * of them, -1 a bad value. */
static int store_opt(PyObject *v, const char *key, store_spec_t *sp)
{
    for (size_t i = 0; i < STORE_NOPTS; i++) {
        if (strcmp(key, g_store_opt_keys[i]) != 0) {
            continue;
        }
        size_t n = sp->nopts;
        if (store_str(v, key, sp->optval[n], sizeof(sp->optval[n])) < 0) {
            return -1;
        }
        sp->opts[n] = (pdx_option_t){g_store_opt_keys[i], sp->optval[n]};
        sp->nopts++;
        return 0;
    }
    return 1;
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
    if (pdxpy_require(PDXPY_HAS(agent_publish), "pdx_agent_publish") < 0) {
        return -1;
    }
    memset(sp, 0, sizeof(*sp));
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
        } else if ((rc = store_opt(v, key, sp)) != 1) {
            /* 0 taken, -1 a bad value */
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
    if (sp->nopts > 0) {
        ap->field_mask |= PDX_AGENT_PARAM_STORE_OPTS;
        ap->store_opts = sp->opts;
        ap->store_nopts = sp->nopts;
    }
    ap->store = sp->type;
    ap->store_endpoints = sp->endpoints;
    ap->store_namespace = sp->ns;
    return 0;
}

/* The agent's xfer_timeout (seconds), progress_interval_us and path_policy
 * arguments into `ap` (None: the default). -1 with an exception set. */
static int parse_params(PyObject *timeout, PyObject *interval,
                        PyObject *policy, pdx_agent_params_t *ap)
{
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
        ap->field_mask |= PDX_AGENT_PARAM_XFER_TIMEOUT;
        ap->xfer_timeout_ms = (uint32_t)(t * 1000.0 + 0.5);
        if (t > 0 && ap->xfer_timeout_ms == 0) {
            ap->xfer_timeout_ms = 1;
        }
    }
    if (interval != Py_None) {
        long us = PyLong_AsLong(interval);
        if (us == -1 && PyErr_Occurred()) {
            return -1;
        }
        ap->field_mask |= PDX_AGENT_PARAM_PROGRESS_INTERVAL;
        ap->progress_interval_us = (uint32_t)us;
    }
    if (policy != Py_None) {
        const char *p =
            PyUnicode_Check(policy) ? PyUnicode_AsUTF8(policy) : NULL;
        if (p != NULL && !strcmp(p, "any")) {
            ap->path_policy = PDX_PATH_POLICY_ANY;
        } else if (p != NULL && !strcmp(p, "same_host_fast")) {
            ap->path_policy = PDX_PATH_POLICY_SAME_HOST_FAST;
        } else if (p != NULL && !strcmp(p, "native")) {
            ap->path_policy = PDX_PATH_POLICY_NATIVE;
        } else {
            PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                         "path_policy: 'any', 'same_host_fast' or 'native', "
                         "not %R",
                         policy);
            return -1;
        }
        ap->field_mask |= PDX_AGENT_PARAM_PATH_POLICY;
    }
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
    if (parse_params(timeout, interval, policy, &ap) < 0) {
        return -1;
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
    PDXPY_CALL_DECL(call, "agent create");
    Py_BEGIN_ALLOW_THREADS call.st = pdx_agent_create(name, &ap, &h);
    pdxpy_call_done(&call);
    for (Py_ssize_t i = 0; call.st == PDX_OK && i < nb; i++) {
        call.st = pdx_backend_create(h, specs[i].name, specs[i].opts,
                                     specs[i].nopts, NULL);
        if (call.st != PDX_OK) {
            char e[1800];
            pdxpy_last_error(e, sizeof(e), call.st, "backend create");
            snprintf(call.err, sizeof(call.err), "agent %s: backend %s: %s",
                     name, specs[i].name, e);
            pdx_agent_destroy(h);
            h = NULL;
        }
    }
    Py_END_ALLOW_THREADS PyMem_Free(specs);
    if (call.st != PDX_OK) {
        pdxpy_call_raise(&call);
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
        pdxpy_memregs_forget(regs);
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
    PDXPY_CALL_DECL(call, "describe");
    PDXPY_CALL(&call, pdx_agent_describe(self->h, &blob, &len));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
    PDXPY_CALL_DECL(call, "load_peer");
    PDXPY_CALL(&call, pdx_peer_load(self->h, v.buf, (size_t)v.len, name));
    pdxpy_agent_leave(self);
    PyBuffer_Release(&v);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    return PyUnicode_FromString(name);
}

static PyObject *Agent_unload_peer(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "unload_peer");
    PDXPY_CALL(&call, pdx_peer_unload(self->h, name));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
}

static PyObject *Agent_peer_state(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "peer_state");
    PDXPY_CALL(&call, pdx_peer_state(self->h, name)); /* takes the lock */
    pdxpy_agent_leave(self);
    if (call.st == PDX_OK) {
        return PyUnicode_FromString("alive");
    }
    if (call.st == PDX_ERR_REMOTE_DISCONNECT) {
        return PyUnicode_FromString("disconnected");
    }
    return pdxpy_call_raise(&call);
}

static PyObject *Agent_peer_info(AgentObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL ||
        pdxpy_require(PDXPY_HAS(peer_info), "pdx_peer_info") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_peer_info_t info;
    pdx_region_info_t *regs = NULL;
    PDXPY_CALL_DECL(call, "peer_info");
    pdx_status_t st;
    size_t cap = 0;
    Py_BEGIN_ALLOW_THREADS memset(&info, 0, sizeof(info));
    st = pdx_plugin_v1.peer_info(self->h, name, &info, NULL, 0);
    /* Regions may be added between the two calls: retry until they fit. */
    while (st == PDX_OK) {
        cap = info.nregions + 16;
        free(regs);
        regs = calloc(cap, sizeof(*regs));
        if (regs == NULL) {
            st = PDX_ERR_NOMEM;
            break;
        }
        st = pdx_plugin_v1.peer_info(self->h, name, &info, regs, cap);
        if (st != PDX_OK || info.nregions <= cap) {
            break;
        }
    }
    call.st = st;
    pdxpy_call_done(&call);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (st != PDX_OK) {
        free(regs);
        return pdxpy_call_raise(&call);
    }
    size_t n = info.nregions < cap ? info.nregions : cap;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = Py_BuildValue(
            "{s:K,s:K,s:s,s:I,s:O,s:K}", "addr",
            (unsigned long long)regs[i].addr, "len",
            (unsigned long long)regs[i].len, "mem_type",
            pdxpy_mem_name(regs[i].mem_type), "device",
            (unsigned)regs[i].dev_id, "shared",
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
    PDXPY_CALL_DECL(call, "set_invariant");
    PDXPY_CALL(&call, pdx_agent_set_invariant(self->h, k, v));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
    Py_BEGIN_ALLOW_THREADS double end = pdx_now_s() + timeout;
    int spins = 0;
    for (;;) {
        pdx_notif_poll(self->h, notif_collect, &v);
        if (v.n > 0 || timeout <= 0) {
            break;
        }
        double left = end - pdx_now_s();
        if (left <= 0) {
            break;
        }
        if (__atomic_load_n(&self->closing, __ATOMIC_RELAXED)) {
            closed = 1;
            break;
        }
        pdxpy_agent_sleep(self->h, left > 0.05 ? 50 : (int)(left * 1000) + 1,
                          &spins);
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
    if (msg == Py_None ||
        (!PyUnicode_Check(msg) && !PyObject_CheckBuffer(msg))) {
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
    PDXPY_CALL_DECL(call, "send_notif");
    PDXPY_CALL(&call, pdx_notif_send(self->h, peer, p, (size_t)len));
    pdxpy_agent_leave(self);
    if (v.obj) {
        PyBuffer_Release(&v);
    }
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
    int have = backend ? PDXPY_HAS(stats_backend) : PDXPY_HAS(stats_peer);
    if (pdxpy_require(have,
                      backend ? "pdx_stats_backend" : "pdx_stats_peer") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_stats_t s;
    memset(&s, 0, sizeof(s));
    PDXPY_CALL_DECL(call, "stats");
    const char *which = backend ? backend : peer;
    PDXPY_CALL(&call, backend ? pdx_plugin_v1.stats_backend(self->h, which, &s)
                              : pdx_plugin_v1.stats_peer(self->h, which, &s));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    return stats_dict(&s);
}

static PyObject *Agent_stats_json(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require(PDXPY_HAS(stats_json), "pdx_stats_json") <
            0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    char *json = NULL;
    PDXPY_CALL_DECL(call, "stats_json");
    PDXPY_CALL(&call, pdx_plugin_v1.stats_json(self->h, &json));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    PyObject *r = PyUnicode_FromString(json);
    pdx_blob_free(json);
    return r;
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
    {"register", (PyCFunction)(void (*)(void))pdxpy_agent_register,
     METH_VARARGS | METH_KEYWORDS,
     "register(obj, mem_type=None, device=None, *, readonly=False) -> "
     "MemReg. obj: a buffer (bytearray, numpy array, mmap, SharedMemory), "
     "(addr, len, mem_type, device), or an object with data_ptr() / "
     "__cuda_array_interface__. A read-only buffer (bytes) is refused "
     "unless readonly=True: then it is never a local READ's destination "
     "(refused here) and, the flag travelling in the description, a "
     "peer's WRITE into it is refused at the peer's create/make (at most "
     "64 such regions per agent)."},
    {"deregister", (PyCFunction)(void (*)(void))pdxpy_agent_deregister, METH_O,
     "deregister(reg): as reg.deregister()."},
    {"prep_dlist", (PyCFunction)(void (*)(void))pdxpy_agent_prep_dlist,
     METH_VARARGS | METH_KEYWORDS,
     "prep_dlist(descs, peer=None, mem_type=None) -> PreparedList: descs a "
     "DescList, list of (addr, len, device) or N x 3 array; peer None for "
     "this agent's memory."},
    {"make_xfer", (PyCFunction)(void (*)(void))pdxpy_agent_make_xfer,
     METH_FASTCALL | METH_KEYWORDS,
     "make_xfer(op, local, local_idx, remote, remote_idx, notif=None) -> "
     "Xfer from two prepared lists; indices lists or integer arrays."},
    {"create_xfer", (PyCFunction)(void (*)(void))pdxpy_agent_create_xfer,
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
    {"metrics_text", (PyCFunction)(void (*)(void))pdxpy_agent_metrics_text,
     METH_NOARGS,
     "metrics_text() -> str: the agent's metrics in Prometheus's text "
     "format (requests, bytes, errors by class, latency histograms per "
     "path; peers by state; docs/METRICS.md). The first call turns "
     "request timing on. pdx.metrics.Collector serves it through "
     "prometheus_client."},
    {"serve_metrics", (PyCFunction)(void (*)(void))pdxpy_agent_serve_metrics,
     METH_VARARGS | METH_KEYWORDS,
     "serve_metrics(addr='127.0.0.1', port=0) -> port: serve "
     "metrics_text() at http://addr:port/metrics (libmicrohttpd, its own "
     "thread) until stop_metrics() or close(); port 0 picks a free one. "
     "pdx.Exists if already served, pdx.IOFailure if it cannot listen, "
     "pdx.Unsupported without libmicrohttpd."},
    {"stop_metrics", (PyCFunction)(void (*)(void))pdxpy_agent_stop_metrics,
     METH_NOARGS, "stop_metrics(): stop serve_metrics' endpoint."},
    {"publish", (PyCFunction)(void (*)(void))pdxpy_agent_publish, METH_NOARGS,
     "publish(): keep this agent's description in the store under "
     "<namespace>/agents/<name>, on its lease, again at every change. Call "
     "it once the agent is complete (memory registered, invariants set). "
     "pdx.Unsupported without store=."},
    {"fetch_peer", (PyCFunction)(void (*)(void))pdxpy_agent_fetch_peer,
     METH_VARARGS | METH_KEYWORDS,
     "fetch_peer(name, timeout=5.0) -> name: load a peer known only by name "
     "through the store (its cached description, else the store's, else "
     "waiting up to timeout s for it to be published; invariants checked). "
     "Returns at once when it is loaded and alive. pdx.NotFound (not "
     "published in time), pdx.Unavailable (store unreachable, name never "
     "seen), pdx.Mismatch, pdx.Unsupported (no store)."},
    {"store_status", (PyCFunction)(void (*)(void))pdxpy_agent_store_status,
     METH_NOARGS,
     "store_status() -> dict: reachable, unreachable_since (epoch s or "
     "None), lease, lease_ttl_s, leases_granted, revision, requests, "
     "failures, leased_keys, unpublished, watches, endpoint, last_error and "
     "'describe' (one line for people). pdx.Unsupported without store=."},
    {"_bench_make_post_check", (PyCFunction)(void (*)(void))pdxpy_agent_bench,
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
              "'same_host_fast' | 'native'), backend_options=None ({backend: {k: v}}), "
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
