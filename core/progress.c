/* The progress pass: every backend (without the agent lock), the
 * callbacks they queued (a message: ctl's or the application's queue; a
 * peer error: peer_death.c), then liveness, request states and timeouts,
 * removal acknowledgements; and pdx_progress. Above requests in flight,
 * the peer's death and ctl; below the calls that drive it (xfer.c,
 * notif.c, mem.c) and its thread (progress_thread.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "peer_death_int.h"
#include "peer_int.h"
#include "progress_int.h"
#include "stats_int.h"
#include "xfer_int.h"

static void defer_event(pdx_agent_h agent, int kind, const char *peer,
                        pdx_status_t why, const void *msg, size_t len)
{
    pdx_deferred_t *d = malloc(sizeof(*d) + len);
    if (d == NULL) {
        pdx_error("agent %s: dropped a %s from %s: out of memory",
                  agent->name, kind == 0 ? "notification" : "peer error",
                  peer);
        return;
    }
    d->next = NULL;
    d->kind = kind;
    d->why = why;
    snprintf(d->peer, sizeof(d->peer), "%s", peer);
    d->len = len;
    if (len > 0) {
        memcpy(d->msg, msg, len);
    }
    if (agent->defer_tail != NULL) {
        agent->defer_tail->next = d;
    } else {
        agent->defer_head = d;
    }
    agent->defer_tail = d;
}

static void notif_recv_locked(pdx_agent_h agent, const char *peer,
                              const void *msg, size_t len);

/* Called by backends when a message arrives: under the agent lock, or
 * queued when the backend is progressed without it. */
void pdx_progress_notif_recv(void *ctx, const char *peer, const void *msg,
                             size_t len)
{
    pdx_agent_h agent = ctx;
    if (pdx_backend_unlocked_agent() == agent) {
        defer_event(agent, 0, peer, PDX_OK, msg, len);
        return;
    }
    notif_recv_locked(agent, peer, msg, len);
}

/* Queue a received application notification for pdx_notif_poll (counted
 * in the peer's stats) and make the agent's fd readable. */
static void queue_notif_locked(pdx_agent_h agent, const char *peer,
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

static void notif_recv_locked(pdx_agent_h agent, const char *peer,
                              const void *msg, size_t len)
{
    if (pdx_ctl_recv_locked(agent, peer, msg, len)) {
        return; /* ctl.c: a region-removal notice, not the app's */
    }
    queue_notif_locked(agent, peer, msg, len);
}

void pdx_progress_peer_error(void *ctx, const char *peer_name,
                             pdx_status_t why)
{
    pdx_agent_h agent = ctx;
    if (pdx_backend_unlocked_agent() == agent) {
        defer_event(agent, 1, peer_name, why, NULL, 0);
        return;
    }
    pdx_peer_error_locked(agent, peer_name, why);
}

void pdx_progress_run_deferred_locked(pdx_agent_h agent)
{
    while (agent->defer_head != NULL) {
        pdx_deferred_t *d = agent->defer_head;
        agent->defer_head = d->next;
        if (agent->defer_head == NULL) {
            agent->defer_tail = NULL;
        }
        if (d->kind == 0) {
            notif_recv_locked(agent, d->peer, d->msg, d->len);
        } else {
            pdx_peer_error_locked(agent, d->peer, d->why);
        }
        free(d);
    }
}

bool pdx_progress_backend_unlocked(pdx_agent_h agent, struct pdx_backend *b,
                                   int *events_p)
{
    if (agent->be_busy) {
        return false; /* another thread is progressing a backend now */
    }
    /* Callers waiting for a backend go first: each waits for one call.
     * (One of them may start a progress of its own: wait for it too.) */
    while (agent->be_waiters > 0 || agent->be_busy) {
        pthread_cond_wait(&agent->be_cond, &agent->lock);
    }
    pdx_backend_unlock_begin(agent);
    int n = b->ops->progress(b->be);
    pdx_backend_unlock_end(agent);
    pdx_progress_run_deferred_locked(agent);
    if (events_p != NULL) {
        *events_p += n > 0 ? n : 0;
    }
    return true;
}

int pdx_progress_housekeeping_locked(pdx_agent_h agent)
{
    int ended = 0;
    uint64_t now = pdx_now_ns();
    agent->last_full_progress_ns = now;
    pdx_peer_liveness_locked(agent, now);
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_progress_locked(agent, x);
            if (x->status != PDX_INPROGRESS) {
                ended++;
            }
        } else if (x->breq != NULL) {
            pdx_xfer_progress_locked(agent, x); /* sweep a failed one */
        }
    }
    pdx_xfer_timeouts_locked(agent, now);
    if (agent->ctl_acks != NULL) {
        pdx_ctl_progress_locked(agent); /* ctl.c: removal acks */
    }
    return ended;
}

int pdx_progress_pass_locked(pdx_agent_h agent, int *ended_p)
{
    int events = 0;
    if (ended_p != NULL) {
        *ended_p = 0;
    }
    if (agent->be_busy) {
        return 0; /* mid-pass in another thread: that pass covers it */
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if (!pdx_progress_backend_unlocked(agent, agent->backends[i],
                                           &events)) {
            return events;
        }
    }
    int ended = pdx_progress_housekeeping_locked(agent);
    if (ended_p != NULL) {
        *ended_p = ended;
    }
    return events + ended;
}

int pdx_progress_locked(pdx_agent_h agent)
{
    return pdx_progress_pass_locked(agent, NULL);
}

/* Re-arm every backend's event fd; one with events already pending keeps
 * the agent's fd readable through the eventfd instead. */
static void arm_backends(pdx_agent_h agent)
{
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        struct pdx_backend *b = agent->backends[i];
        if (!(b->ops->caps & PDX_BACKEND_CAP_EVENT_FD)) {
            continue;
        }
        if (b->ops->arm(b->be) == PDX_ERR_BUSY) {
            pdx_agent_signal(agent);
        }
    }
}

int pdxi_progress(pdx_agent_h agent)
{
    pdx_agent_lock(agent);
    pdx_efd_drain(agent->event_fd);
    int n = pdx_progress_locked(agent);
    if (agent->nq_head != NULL) {
        /* Keep the fd readable while notifications wait for a poll. */
        pdx_agent_signal(agent);
    }
    arm_backends(agent);
    pthread_mutex_unlock(&agent->lock);
    if (!agent->thread_running) {
        pdx_stats_sock_serve(agent, 0);
    }
    return n;
}
