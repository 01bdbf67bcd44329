/* pdx.Agent's store calls (pdx/store.h): publish, fetch_peer,
 * store_status. */
#include "pdxpy_int.h"
#include <math.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

/* ---- the store (pdx/store.h) */

PyObject *pdxpy_agent_publish(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require(PDXPY_HAS(agent_publish), "pdx_agent_publish") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "publish");
    PDXPY_CALL(&call, pdx_plugin_v1.agent_publish(self->h));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
}

PyObject *pdxpy_agent_fetch_peer(AgentObject *self, PyObject *args,
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
    if (pdxpy_require(PDXPY_HAS(peer_fetch), "pdx_peer_fetch") <
            0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    double ms = timeout * 1000.0 + 0.5;
    uint32_t timeout_ms = ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    PDXPY_CALL_DECL(call, "fetch_peer");
    /* waits up to timeout for a publisher */
    PDXPY_CALL(&call, pdx_plugin_v1.peer_fetch(self->h, name, timeout_ms));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    return PyUnicode_FromString(name);
}

PyObject *pdxpy_agent_store_status(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require(PDXPY_HAS(store_status), "pdx_store_status") < 0 ||
        pdxpy_require(PDXPY_HAS(store_describe), "pdx_store_describe") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_store_status_t s;
    char line[1024] = "";
    PDXPY_CALL_DECL(call, "store_status");
    Py_BEGIN_ALLOW_THREADS memset(&s, 0, sizeof(s));
    call.st = pdx_plugin_v1.store_status(self->h, &s);
    if (call.st == PDX_OK) {
        pdx_plugin_v1.store_describe(self->h, line, sizeof(line));
    }
    pdxpy_call_done(&call);
    Py_END_ALLOW_THREADS pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
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
