/* Progress (progress.c): what the agent's life cycle needs of it. */
#ifndef PDX_PROGRESS_H
#define PDX_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "agent_int.h"

/* A full pass: every backend progressed (without the lock, see struct
 * pdx_agent), then liveness, requests, timeouts. Called with the lock
 * taken by pdx_agent_lock; the lock is dropped and retaken inside, so the
 * caller must not keep pointers another thread may free (its own handle
 * is fine). Returns at once (0) when another thread is mid-pass. */
int pdx_progress_locked(pdx_agent_h agent);
/* The progress thread (PDX_AGENT_F_PROGRESS_THREAD); `arg` is the agent. */
void *pdx_progress_main(void *arg);
/* The backend host's callbacks (pdx_backend_host_t): a message arrived, a
 * peer failed. Under the agent lock, or queued when the backend runs
 * without it. */
void pdx_progress_notif_recv(void *ctx, const char *peer, const void *msg,
                             size_t len);
void pdx_progress_peer_error(void *ctx, const char *peer_name,
                             pdx_status_t why);
/* Agents destroyed in this process (their same-process peers see them
 * gone at the next liveness pass): announce one; the sequence a new agent
 * starts from. */
void pdx_progress_announce_destroyed(uint64_t instance);
uint64_t pdx_progress_destroyed_seq(void);

#endif
