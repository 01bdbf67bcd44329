/* pdx.Agent's metrics calls (pdx/metrics.h): metrics_text, serve_metrics,
 * stop_metrics. pdx.metrics (Python) turns the text into a Prometheus
 * client's collector. */
#include "pdxpy_int.h"

PyObject *pdxpy_agent_metrics_text(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require(PDXPY_HAS(metrics_text), "pdx_metrics_text") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    char *text = NULL;
    PDXPY_CALL_DECL(call, "metrics_text");
    PDXPY_CALL(&call, pdx_plugin_v1.metrics_text(self->h, &text));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    PyObject *r = PyUnicode_FromString(text);
    pdx_blob_free(text);
    return r;
}

PyObject *pdxpy_agent_serve_metrics(AgentObject *self, PyObject *args,
                                    PyObject *kw)
{
    static char *kwlist[] = {"addr", "port", NULL};
    const char *addr = "127.0.0.1";
    int port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|si", kwlist, &addr, &port)) {
        return NULL;
    }
    if (port < 0 || port > 65535) {
        return PyErr_Format(pdxpy_exc_for(PDX_ERR_INVALID),
                            "serve_metrics: port %d is not in 0..65535", port);
    }
    if (pdxpy_require(PDXPY_HAS(metrics_start), "pdx_metrics_start") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    pdx_metrics_params_t p = {.field_mask = PDX_METRICS_PARAM_ADDR |
                                            PDX_METRICS_PARAM_PORT,
                              .addr = addr,
                              .port = (uint16_t)port};
    uint16_t bound = 0;
    PDXPY_CALL_DECL(call, "serve_metrics");
    PDXPY_CALL(&call, pdx_plugin_v1.metrics_start(self->h, &p, &bound));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    return PyLong_FromLong(bound);
}

PyObject *pdxpy_agent_stop_metrics(AgentObject *self, PyObject *unused)
{
    if (pdxpy_require(PDXPY_HAS(metrics_stop), "pdx_metrics_stop") < 0 ||
        pdxpy_agent_enter(self) < 0) {
        return NULL;
    }
    PDXPY_CALL_DECL(call, "stop_metrics");
    PDXPY_CALL(&call, pdx_plugin_v1.metrics_stop(self->h));
    pdxpy_agent_leave(self);
    if (call.st != PDX_OK) {
        return pdxpy_call_raise(&call);
    }
    Py_RETURN_NONE;
}
