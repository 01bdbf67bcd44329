/* Notifications: sending one to a peer (standalone, or after a request's
 * data landed), and the queue of received ones that pdx_notif_poll
 * (progress.c) delivers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"
#include "backend_int.h"
#include "notif_int.h"
#include "stats_int.h"

/* pdx's control messages (ctl.c) start with these bytes. */
const unsigned char pdx_ctl_prefix[8] = {0, 'P', 'D', 'X', 'C', 'T', 'L', 1};

bool pdx_notif_reserved(const void *msg, size_t len)
{
    return msg != NULL && len >= sizeof(pdx_ctl_prefix) &&
           memcmp(msg, pdx_ctl_prefix, sizeof(pdx_ctl_prefix)) == 0;
}

/* A backend that carries messages to this peer, for notifications. */
static int notif_backend(pdx_agent_h agent, pdx_peer_t *peer)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (peer->bpeer[b] != NULL &&
            (agent->backends[b]->ops->caps & PDX_BACKEND_CAP_NOTIF)) {
            return (int)b;
        }
    }
    return -1;
}

pdx_status_t pdx_notif_send_locked(pdx_agent_h agent, pdx_peer_t *peer,
                                   const void *msg, size_t len)
{
    int b = notif_backend(agent, peer);
    if (b < 0) {
        pdx_error("agent %s: no backend carries notifications to %s",
                  agent->name, peer->name);
        return PDX_ERR_UNSUPPORTED;
    }
    return agent->backends[b]->ops->notif_send(agent->backends[b]->be,
                                               peer->bpeer[b], msg, len);
}

void pdx_notif_queue_locked(pdx_agent_h agent, const char *peer,
                            const void *msg, size_t len)
{
    pdx_stats_entry_t *ps = pdx_peer_stats_get(agent, peer);
    if (ps != NULL) {
        ps->s.notifs_recv++;
    }
    pdx_notif_item_t *it = malloc(sizeof(*it) + len);
    if (it == NULL) {
        pdx_error("agent %s: dropped a %zu-byte notification from %s: out "
                  "of memory", agent->name, len, peer);
        return;
    }
    it->next = NULL;
    it->len = len;
    snprintf(it->peer, sizeof(it->peer), "%s", peer);
    if (len > 0) {
        memcpy(it->msg, msg, len);
    }
    if (agent->nq_tail != NULL) {
        agent->nq_tail->next = it;
    } else {
        agent->nq_head = it;
    }
    agent->nq_tail = it;
    pdx_agent_signal(agent);
}

pdx_status_t pdxi_notif_send(pdx_agent_h agent, const char *peer,
                            const void *msg, size_t len)
{
    if (len > PDX_NOTIF_MAX) {
        pdx_error("agent %s: notification of %zu bytes over the %d limit",
                  agent->name, len, PDX_NOTIF_MAX);
        return PDX_ERR_TOO_LARGE;
    }
    if (pdx_notif_reserved(msg, len)) {
        pdx_error("agent %s: notification to %s starts with pdx's reserved "
                  "control prefix (\\0PDXCTL\\1)", agent->name, peer);
        return PDX_ERR_INVALID;
    }
    pdx_status_t st;
    pdx_agent_lock(agent);
    pdx_peer_t *p = pdx_peer_find(agent, peer);
    if (p == NULL) {
        pdx_error("agent %s: notif send: unknown peer %s", agent->name, peer);
        st = PDX_ERR_NOT_FOUND;
    } else if (p->dead != PDX_OK) {
        pdx_error("agent %s: notif send: peer %s is gone (%s)", agent->name,
                  peer, p->dead_how);
        st = p->dead;
    } else {
        st = pdx_notif_send_locked(agent, p, msg, len);
        if (st == PDX_OK && p->stats != NULL) {
            p->stats->s.notifs_sent++;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

