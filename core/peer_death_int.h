/* A peer's death (peer_death.c): the sink every source of death calls,
 * and the sources below the store. All with the agent lock held unless
 * said otherwise. */
#ifndef PDX_PEER_DEATH_H
#define PDX_PEER_DEATH_H

#include <stdbool.h>
#include <stdint.h>

#include "agent_int.h"
#include "peer_int.h"

/* The sink of every peer death (a pidfd, an agent destroyed in this
 * process, a backend's peer error, the store's lease, a failed transfer):
 * the peer is gone, its requests fail (released now unless called from
 * inside a backend call, `in_backend`) and new ones are refused until it
 * is loaded again. */
void pdx_peer_gone_locked(pdx_agent_h agent, pdx_peer_t *peer,
                          pdx_status_t why, const char *how, bool in_backend);
/* `p`'s process exited (its pidfd) or began to (pdx_peer_pid_exited): it
 * is gone for good (remote disconnected, "process exited", dead_final).
 * in_backend: as pdx_peer_gone_locked's. */
void pdx_peer_exited_locked(pdx_agent_h agent, pdx_peer_t *p,
                            bool in_backend);
/* A backend saw the connection to `peer_name` fail (its peer_error
 * callback, run under the lock): an exited process, else a connection
 * error. Unknown or dead peers are ignored. */
void pdx_peer_error_locked(pdx_agent_h agent, const char *peer_name,
                           pdx_status_t why);
/* Liveness, at most once a millisecond: same-host peers whose pidfd is
 * readable, and peers in this process whose agent was destroyed. */
void pdx_peer_liveness_locked(pdx_agent_h agent, uint64_t now);
/* Agents destroyed in this process (their same-process peers see them
 * gone at the next liveness pass): announce one (agent destroy, any
 * thread, no lock); the sequence a new agent starts from, or the progress
 * thread compares (any thread, no lock). */
void pdx_peer_announce_destroyed(uint64_t instance);
uint64_t pdx_peer_destroyed_seq(void);

#endif
