/* A request in flight: its backend request checked once, and what its
 * end brings (the notification sent when the data backend carries none, a
 * peer's death when the backend saw it gone). The progress pass runs it
 * for every request, a polling caller for its own. Agent lock held. */
#include <stdio.h>

#include "backend_int.h"
#include "peer_death_int.h"
#include "xfer_int.h"

pdx_status_t pdx_xfer_finish_locked(pdx_agent_h agent, struct pdx_xfer *x,
                                    pdx_peer_t *peer)
{
    if (x->notif == NULL ||
        (agent->backends[x->bindex]->ops->caps & PDX_BACKEND_CAP_NOTIF)) {
        return PDX_OK;
    }
    return pdx_peer_send_locked(agent, peer, x->notif, x->notif_len);
}

void pdx_xfer_progress_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq == NULL) {
        return;
    }
    struct pdx_backend *b = agent->backends[x->bindex];
    pdx_status_t st = b->ops->xfer_check(b->be, x->breq);
    if (x->status != PDX_INPROGRESS) {
        /* Ended already (peer failed, timed out): the backend request
         * was aborted and is released once the backend says it ended. */
        if (st != PDX_INPROGRESS) {
            b->ops->xfer_release(b->be, x->breq);
            x->breq = NULL;
        }
        return;
    }
    if (st == PDX_INPROGRESS) {
        return;
    }
    b->ops->xfer_release(b->be, x->breq);
    x->breq = NULL;
    if (st == PDX_ERR_REMOTE_DISCONNECT) {
        /* A backend saw the peer gone (e.g. cma's ESRCH): every other
         * request to it fails too, and new posts are refused. */
        pdx_peer_t *p = pdx_xfer_peer(agent, x);
        if (p != NULL && p->epoch == x->peer_epoch) {
            pdx_xfer_end_locked(agent, x, st);
            pdx_peer_gone_locked(agent, p, st, "transfer failed", false);
            return;
        }
    }
    if (st == PDX_OK && !x->aborting) {
        pdx_peer_t *p = pdx_xfer_peer(agent, x);
        if (p == NULL || p->epoch != x->peer_epoch) {
            st = PDX_ERR_STALE;
        } else {
            st = pdx_xfer_finish_locked(agent, x, p);
        }
    }
    if (st < 0 && st != PDX_ERR_STALE && st != PDX_ERR_REMOTE_DISCONNECT) {
        /* Another error from a same-host peer whose process exited (e.g.
         * the notification's UCX connect found its shared memory gone):
         * the request ends as its exit's, like the others to it, rather
         * than with whatever the backend saw on the way. */
        pdx_peer_t *p = pdx_xfer_peer(agent, x);
        if (p != NULL && p->epoch == x->peer_epoch && p->dead == PDX_OK &&
            pdx_peer_pid_exited(p)) {
            pdx_xfer_end_locked(agent, x, PDX_ERR_REMOTE_DISCONNECT);
            pdx_peer_exited_locked(agent, p, false);
            return;
        }
    }
    pdx_xfer_end_locked(agent, x, st);
}
