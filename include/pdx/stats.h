/* pdx counters: per backend, per peer, and the whole agent as JSON (what
 * `pdx-info --stats` prints). */
#ifndef PDX_STATS_H
#define PDX_STATS_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Counters, per backend and per peer (a peer's survive its unloading and
 * reloading: they are kept by name for the agent's life). */
typedef struct pdx_stats {
    uint64_t requests;    /* posts */
    uint64_t completed;   /* posts that ended PDX_OK */
    uint64_t errors;      /* posts that ended in an error (not canceled) */
    uint64_t canceled;    /* aborted or released in flight */
    uint64_t timeouts;    /* ended PDX_ERR_TIMEOUT (also in errors) */
    uint64_t bytes;       /* bytes of completed posts */
    uint64_t fallbacks;   /* posts over a fallback path (see policy) */
    uint64_t refused;     /* requests refused by the path policy */
    uint64_t dead_events; /* times the peer was found dead */
    uint64_t notifs_sent;
    uint64_t notifs_recv;
    uint64_t reserved[5];
} pdx_stats_t;

/* Counters of one backend of the agent.
 *
 * @param [in]  agent    The agent.
 * @param [in]  backend  The backend's name ("ucx", "cma").
 * @param [out] stats_p  Its counters; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if the agent has no such backend.
 * Owns: the caller keeps `backend` and *stats_p.
 * Blocks: no (the agent's plain lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_stats_backend(pdx_agent_h agent, const char *backend,
                                       pdx_stats_t *stats_p);

/* Counters of one peer, loaded or not any more (kept by name for the
 * agent's life).
 *
 * @param [in]  agent    The agent.
 * @param [in]  peer     The peer's name.
 * @param [out] stats_p  Its counters; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if the agent never saw that peer.
 * Owns: the caller keeps `peer` and *stats_p.
 * Blocks: no (the agent's plain lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_stats_peer(pdx_agent_h agent, const char *peer,
                                    pdx_stats_t *stats_p);

/* Every counter of the agent, its peers (state, host, path of each
 * backend, last fallback reason, the measured costs behind each choice
 * between two paths: "path_costs") and backends as one JSON object, with a
 * "store" member when the agent has a store (reachable or unreachable
 * since when, lease, published generation, agents known, owner registry
 * calls; pdx/store.h). What `pdx-info --stats` prints for a running agent.
 *
 * @param [in]  agent   The agent.
 * @param [out] json_p  The JSON, NUL-terminated; written only on success.
 * @return PDX_OK; PDX_ERR_NOMEM.
 * Owns: *json_p is the caller's, malloc'd: free it with pdx_blob_free.
 * Blocks: on the agent lock (each backend's describe runs under it).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_stats_json(pdx_agent_h agent, char **json_p);

#ifdef __cplusplus
}
#endif

#endif
