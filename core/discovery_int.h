/* Discovery (discovery.c): the agent's store module, its watch thread,
 * publishing and fetching peers; the block-owner registry (owners.c) uses
 * its module. Above the agent's other rooms: they reach it only through
 * the hooks of agent_int.h (pdx_disc_*_locked). */
#ifndef PDX_DISCOVERY_H
#define PDX_DISCOVERY_H

#include <pdx/store.h>

#include "agent_int.h"

/* init: load the agent's store module and start watching
 * (PDX_AGENT_PARAM_STORE); called last in agent create, which destroys the
 * agent if it fails. fini: stop publishing and watching, revoke the lease;
 * called first in agent destroy, without the lock. */
pdx_status_t pdx_store_agent_init(pdx_agent_h agent,
                                  const pdx_agent_params_t *params);
void pdx_store_agent_fini(pdx_agent_h agent);

/* What pdx_stats_json shows of the agent's store. */
typedef struct pdx_store_snapshot {
    char module[32];
    char endpoints[512];
    char ns[128];
    pdx_store_status_t status;
    bool publishing;               /* pdx_agent_publish was called */
    bool published;                /* a generation was handed to the store */
    uint32_t published_generation;
    uint32_t agents_known;         /* blobs cached of the names watched */
    uint64_t reloads, deaths;      /* peers reloaded / failed by the watch */
    /* pdx_store_owners_* calls, the blocks of those that succeeded, and
     * the failed calls. */
    uint64_t owners_add_calls, owners_add_blocks, owners_add_failures;
    uint64_t owners_del_calls, owners_del_blocks, owners_del_failures;
    uint64_t owners_get_calls, owners_get_blocks, owners_get_failures;
} pdx_store_snapshot_t;
/* false without a store. With the agent lock held (the store is attached
 * and detached under it). Non-blocking. */
bool pdx_store_agent_snapshot(pdx_agent_h agent, pdx_store_snapshot_t *out);

/* Does the agent have a store? false, logged naming the exported function
 * `fn`, when not. */
bool pdx_store_agent_need(pdx_agent_h agent, const char *fn);
/* The agent's store module and its instance, for the block-owner registry
 * (owners.c); false (logged) without a store. */
bool pdx_store_agent_module(pdx_agent_h agent, const char *fn,
                            const pdx_store_ops_t **ops_p, void **st_p);
/* Count one owner-registry call of `n` blocks that ended `st` (shown by
 * pdx_stats_json). Any thread. */
typedef enum pdx_owners_call {
    PDX_OWNERS_ADD,
    PDX_OWNERS_DEL,
    PDX_OWNERS_GET,
} pdx_owners_call_t;
void pdx_store_agent_count(pdx_agent_h agent, pdx_owners_call_t which,
                           size_t n, pdx_status_t st);

#endif
