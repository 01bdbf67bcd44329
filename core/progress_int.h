/* Progress (progress.c): the pass (every backend, then liveness, request
 * states, timeouts, removal acknowledgements), the backends' callbacks
 * and pdx_progress; the thread that runs passes is progress_thread.c.
 * All _locked functions with the lock taken by pdx_agent_lock. */
#ifndef PDX_PROGRESS_H
#define PDX_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent_int.h"

struct pdx_backend;

/* A full pass: every backend progressed (without the lock, see struct
 * pdx_agent), then liveness, requests, timeouts. The lock is dropped and
 * retaken inside, so the caller must not keep pointers another thread may
 * free (its own handle is fine). Returns at once (0) when another thread
 * is mid-pass. */
int pdx_progress_locked(pdx_agent_h agent);
/* The same, saying how much happened: the events seen (backend events and
 * requests that ended); *ended_p (may be NULL) gets the requests that
 * ended. */
int pdx_progress_pass_locked(pdx_agent_h agent, int *ended_p);
/* Everything of a pass but the backends' own progress: liveness (pidfds,
 * same-process destroys), request states and timeouts, removal
 * acknowledgements. The progress thread runs it alone while a caller
 * progresses the backends itself. Returns the requests it saw end. */
int pdx_progress_housekeeping_locked(pdx_agent_h agent);
/* One bounded progress call of backend `b` without the lock (callers
 * waiting for a backend go first), then the callbacks it queued; adds its
 * events to *events_p (may be NULL). False, doing nothing, while another
 * thread progresses a backend. */
bool pdx_progress_backend_unlocked(pdx_agent_h agent, struct pdx_backend *b,
                                   int *events_p);
/* Run what the backends' callbacks queued while a backend ran without the
 * lock (messages, peer errors). */
void pdx_progress_run_deferred_locked(pdx_agent_h agent);

/* The progress thread (PDX_AGENT_F_PROGRESS_THREAD, progress_thread.c);
 * `arg` is the agent. */
void *pdx_progress_main(void *arg);

/* The backend host's callbacks (pdx_backend_host_t): a message arrived, a
 * peer failed. Under the agent lock, or queued when the backend runs
 * without it. Any thread a backend calls them on. */
void pdx_progress_notif_recv(void *ctx, const char *peer, const void *msg,
                             size_t len);
void pdx_progress_peer_error(void *ctx, const char *peer_name,
                             pdx_status_t why);

#endif
