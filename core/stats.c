/* Counters per backend and per peer (pdx_stats_backend, _peer); the
 * JSON of everything is stats_json.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"
#include "backend_int.h"
#include "stats_int.h"

pdx_stats_entry_t *pdx_peer_stats_get(pdx_agent_h agent, const char *name)
{
    for (pdx_stats_entry_t *e = agent->peer_stats; e != NULL; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            return e;
        }
    }
    pdx_stats_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return NULL;
    }
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->next = agent->peer_stats;
    agent->peer_stats = e;
    return e;
}

pdx_status_t pdxi_stats_backend(pdx_agent_h agent, const char *backend,
                                pdx_stats_t *stats_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    pthread_mutex_lock(&agent->lock); /* state only: no backend call */
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (strcmp(agent->backends[b]->name, backend) == 0) {
            *stats_p = agent->backends[b]->stats;
            st = PDX_OK;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        pdx_error("agent %s: stats: no backend %s", agent->name, backend);
    }
    return st;
}

pdx_status_t pdxi_stats_peer(pdx_agent_h agent, const char *peer,
                             pdx_stats_t *stats_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    pthread_mutex_lock(&agent->lock); /* state only: no backend call */
    for (pdx_stats_entry_t *e = agent->peer_stats; e != NULL; e = e->next) {
        if (strcmp(e->name, peer) == 0) {
            *stats_p = e->s;
            st = PDX_OK;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        pdx_error("agent %s: stats: peer %s was never loaded", agent->name,
                  peer);
    }
    return st;
}

