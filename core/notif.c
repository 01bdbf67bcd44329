/* Notifications as the application sees them: send one to a peer, and
 * poll the received ones (queued by the progress pass) with callbacks.
 * A request's own notification goes with its data (xfer_progress.c);
 * pdx's control messages share the channel behind a reserved prefix
 * (ctl.c). Above the progress pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "progress_int.h"
#include "stats_int.h"

pdx_status_t pdxi_notif_send(pdx_agent_h agent, const char *peer,
                            const void *msg, size_t len)
{
    if (len > PDX_NOTIF_MAX) {
        pdx_error("agent %s: notification of %zu bytes over the %d limit",
                  agent->name, len, PDX_NOTIF_MAX);
        return PDX_ERR_TOO_LARGE;
    }
    if (pdx_ctl_reserved(msg, len)) {
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
        st = pdx_peer_send_locked(agent, p, msg, len);
        if (st == PDX_OK && p->stats != NULL) {
            p->stats->s.notifs_sent++;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

int pdxi_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg)
{
    /* The delivery lock keeps callbacks of concurrent polls in order; the
     * agent lock is dropped while callbacks run so they may call in. */
    pthread_mutex_lock(&agent->delivery);
    /* The plain lock: while a backend is progressed on another thread,
     * take what has arrived without waiting for that call. */
    pthread_mutex_lock(&agent->lock);
    if (!agent->thread_running) {
        pdx_progress_locked(agent); /* the thread does, if any */
    }
    pdx_notif_item_t *list = agent->nq_head;
    agent->nq_head = agent->nq_tail = NULL;
    uint64_t v;
    if (read(agent->event_fd, &v, sizeof(v)) < 0) {
        /* nothing pending */
    }
    pthread_mutex_unlock(&agent->lock);
    int n = 0;
    while (list != NULL) {
        pdx_notif_item_t *it = list;
        list = it->next;
        int depth = pdx_call_suspend();
        cb(arg, it->peer, it->msg, it->len);
        pdx_call_resume(depth);
        free(it);
        n++;
    }
    pthread_mutex_unlock(&agent->delivery);
    return n;
}
