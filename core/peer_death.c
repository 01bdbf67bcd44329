/* A peer's death, found by its name: the one sink every source of death
 * calls (pdx_peer_gone_locked) and the sources it has below the store:
 * its process exited (pidfd, or PF_EXITING on an error path), an agent of
 * this process destroyed, a backend's connection error. The store's lease
 * (discovery.c) and a failed transfer (xfer_progress.c) call the sink from
 * above. Dead is a state a peer leaves again (peer_load.c revives it).
 * Agent lock held unless said otherwise. */
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "backend_int.h"
#include "peer_death_int.h"
#include "xfer_int.h"

void pdx_peer_gone_locked(pdx_agent_h agent, pdx_peer_t *peer,
                               pdx_status_t why, const char *how,
                               bool in_backend)
{
    if (peer->dead != PDX_OK) {
        return;
    }
    peer->dead = why;
    snprintf(peer->dead_how, sizeof(peer->dead_how), "%s", how);
    peer->dead_ns = pdx_now_ns();
    if (peer->stats != NULL) {
        peer->stats->s.dead_events++;
    }
    pdx_warn("agent %s: peer %s (pid %d) is gone (%s): failing its requests",
             agent->name, peer->name, (int)peer->pid, how);
    pdx_peer_unwatch_pidfd_locked(agent, peer);
    if (!in_backend) {
        /* Backends drop the connection without waiting (UCX force-closes
         * the endpoint), so its requests end now, not after a drain. */
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            const pdx_backend_ops_t *ops = agent->backends[b]->ops;
            if (peer->bpeer[b] != NULL && PDX_BE_HAS(ops, peer_failed)) {
                ops->peer_failed(agent->backends[b]->be, peer->bpeer[b]);
            }
        }
    }
    pdx_xfer_fail_peer_locked(agent, peer->epoch, why,
                              in_backend ? PDX_FAIL_MARK : PDX_FAIL_ABORT);
    pdx_agent_signal(agent);
}

void pdx_peer_exited_locked(pdx_agent_h agent, pdx_peer_t *p,
                                 bool in_backend)
{
    pdx_peer_gone_locked(agent, p, PDX_ERR_REMOTE_DISCONNECT,
                              "process exited", in_backend);
    p->dead_final = true;
}

void pdx_peer_error_locked(pdx_agent_h agent, const char *peer_name,
                           pdx_status_t why)
{
    pdx_peer_t *peer = pdx_peer_find(agent, peer_name);
    if (peer == NULL || peer->dead != PDX_OK) {
        return;
    }
    if (pdx_peer_pid_exited(peer)) {
        /* The connection error is its exit seen another way. */
        pdx_peer_exited_locked(agent, peer, true);
    } else {
        pdx_peer_gone_locked(agent, peer, why, "connection error", true);
    }
}

#define LIVENESS_PERIOD_NS 1000000ull /* pidfd poll at most once a ms */

/* Agents destroyed in this process, for peers in the same process (a pidfd
 * of our own pid never fires): a sequence and a ring of the last instance
 * ids, written without a lock (destroy) and read by every agent's liveness
 * pass when the sequence moved. Process-wide by nature, like the pid. A
 * burst of more than PDX_DESTROYED_RING destroys between two passes of an
 * agent can hide one from it (then UCX errors or timeouts still end its
 * requests). */
#define PDX_DESTROYED_RING 1024
static _Atomic uint64_t g_destroyed_seq;
static _Atomic uint64_t g_destroyed_ring[PDX_DESTROYED_RING];

uint64_t pdx_peer_destroyed_seq(void)
{
    return atomic_load(&g_destroyed_seq);
}

void pdx_peer_announce_destroyed(uint64_t instance)
{
    uint64_t seq = atomic_load(&g_destroyed_seq);
    atomic_store(&g_destroyed_ring[seq % PDX_DESTROYED_RING], instance);
    atomic_fetch_add(&g_destroyed_seq, 1);
}

static void check_same_process(pdx_agent_h agent)
{
    uint64_t now = atomic_load(&g_destroyed_seq);
    uint64_t from = agent->destroyed_seen;
    if (now == from) {
        return;
    }
    agent->destroyed_seen = now;
    if (now - from > PDX_DESTROYED_RING) {
        from = now - PDX_DESTROYED_RING;
    }
    pid_t self = getpid();
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->dead != PDX_OK || !p->same_host || p->pid != self) {
            continue;
        }
        for (uint64_t i = from; i < now; i++) {
            if (atomic_load(&g_destroyed_ring[i % PDX_DESTROYED_RING]) ==
                p->instance) {
                pdx_peer_gone_locked(agent, p,
                                          PDX_ERR_REMOTE_DISCONNECT,
                                          "agent destroyed in this process",
                                          false);
                p->dead_final = true;
                break;
            }
        }
    }
}

void pdx_peer_liveness_locked(pdx_agent_h agent, uint64_t now)
{
    if (now - agent->last_liveness_ns < LIVENESS_PERIOD_NS) {
        return;
    }
    agent->last_liveness_ns = now;
    check_same_process(agent);
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->pidfd < 0 || p->dead != PDX_OK) {
            continue;
        }
        /* The pidfd alone here (a poll per peer and pass); the errors'
         * check (pdx_peer_pid_exited) also reads /proc. */
        struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0) {
            pdx_peer_exited_locked(agent, p, false);
        }
    }
}
