/* An agent's metrics in Prometheus's text exposition format (0.0.4): per
 * path (the backend a request took) requests, bytes, errors by class, post
 * and completion latency histograms, requests in flight, the backends'
 * staging pools; peers by state; registrations. Served over HTTP on an
 * endpoint the application opts into, or handed to an application that
 * already runs a Prometheus client.
 *
 * Every sample carries the label agent="<name>"; per-path samples also
 * path="<backend>" ("ucx", "cma", "cuda_ipc"). The families (all prefixed
 * pdx_) and their labels are listed in docs/METRICS.md.
 *
 * The latency histograms count requests posted while the agent times its
 * requests: from its first pdx_metrics_text or pdx_metrics_start (or from
 * its creation with PDX_AGENT_F_TELEMETRY); timing costs two clock reads
 * per post and one per completion. */
#ifndef PDX_METRICS_H
#define PDX_METRICS_H

#include <stdint.h>

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* field_mask bits of pdx_metrics_params_t. */
#define PDX_METRICS_PARAM_ADDR (1ull << 0)
#define PDX_METRICS_PARAM_PORT (1ull << 1)

/* Where the HTTP endpoint listens. Fields outside field_mask take their
 * defaults. */
typedef struct pdx_metrics_params {
    uint64_t field_mask;
    /* PDX_METRICS_PARAM_ADDR: a numeric IPv4 or IPv6 address to listen on
     * ("0.0.0.0" or "::" for every address). Default "127.0.0.1". */
    const char *addr;
    /* PDX_METRICS_PARAM_PORT: the TCP port; 0 (the default) picks a free
     * one, returned by pdx_metrics_start. */
    uint16_t port;
} pdx_metrics_params_t;

/* The agent's metrics as Prometheus text (what its endpoint serves at
 * /metrics), from the agent's counters at the time of the call. The first
 * call turns request timing on (the histograms count from then).
 *
 * @param [in]  agent   The agent.
 * @param [out] text_p  The text, NUL-terminated; written only on success.
 * @return PDX_OK; PDX_ERR_NOMEM.
 * Owns: *text_p is the caller's, malloc'd: free it with pdx_blob_free.
 * Blocks: on the agent lock (each backend's describe runs under it).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_metrics_text(pdx_agent_h agent, char **text_p);

/* Serve the agent's metrics over HTTP (libmicrohttpd, its own thread):
 * GET /metrics answers pdx_metrics_text's text, as Prometheus scrapes it;
 * any other path 404. One endpoint per agent; it turns request timing on
 * and stops with pdx_metrics_stop or the agent's destroy. Also started at
 * pdx_agent_create when the environment sets PDX_METRICS_LISTEN=[ADDR:]PORT
 * (a failure there is a warning, not a failed create). Anyone who can
 * reach the address reads the metrics (agent and peer names, counters):
 * the default address is loopback.
 *
 * @param [in]  agent   The agent.
 * @param [in]  params  Address and port; NULL: 127.0.0.1, a free port.
 * @param [out] port_p  The port it listens on (useful with port 0); may
 *                      be NULL; written only on success.
 * @return PDX_OK; PDX_ERR_EXISTS if the agent already serves its
 *         metrics; PDX_ERR_INVALID for an address that is not numeric;
 *         PDX_ERR_IO if it cannot listen there (the reason logged: the
 *         port in use, ...); PDX_ERR_UNSUPPORTED where libpdx.so was built
 *         without libmicrohttpd.
 * Owns: the caller keeps `params` and its address (copied).
 * Blocks: on the agent lock; binding the socket and starting a thread.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_metrics_start(pdx_agent_h agent,
                                       const pdx_metrics_params_t *params,
                                       uint16_t *port_p);

/* Stop the agent's HTTP endpoint: the socket is closed and its thread
 * gone when this returns (a scrape in progress is finished first).
 *
 * @param [in] agent  The agent.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if it serves none.
 * Owns: nothing.
 * Blocks: until a scrape in progress ends (it takes the agent lock for
 *       a moment) and the endpoint's thread exits.
 * Threads: any thread but the endpoint's own; not concurrently with
 *       pdx_metrics_start on the same agent.
 */
PDX_API pdx_status_t pdx_metrics_stop(pdx_agent_h agent);

#ifdef __cplusplus
}
#endif

#endif
