/* Region-removal notices between agents (ctl.c): pdx_mem_deregister tells
 * every live loaded peer that carries notifications that a region goes
 * away and waits (progress.c drives the wait) until each acknowledged,
 * died, or the bound passed. All with the agent lock held. */
#ifndef PDX_CTL_INT_H
#define PDX_CTL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "agent_int.h"
#include "peer_int.h"

struct pdx_mem_reg;

/* One deregistration waiting for acknowledgements (on its caller's
 * stack, linked in agent->ctl_waits). */
typedef struct pdx_ctl_wait {
    struct pdx_ctl_wait *next;
    uint64_t seq;
    size_t n, left;
    struct {
        uint64_t epoch;
        char name[PDX_NAME_MAX];
        bool done;
    } *peers;
} pdx_ctl_wait_t;

/* recv: true when `msg` was such a message (consumed). progress: send
 * the acknowledgements whose regions have no request of ours in flight
 * left. peer_destroyed: forget (and unload) what waits on `peer`. */
bool pdx_ctl_recv_locked(pdx_agent_h agent, const char *peer,
                         const void *msg, size_t len);
void pdx_ctl_progress_locked(pdx_agent_h agent);
void pdx_ctl_peer_destroyed_locked(pdx_agent_h agent, pdx_peer_t *peer);

/* The deregister wait, in three steps around progress passes: begin
 * sends the notice for `r` (out of agent->regs already, not freed) and
 * links `w` (false: nobody to wait for, nothing linked); check marks the
 * peers that died or were unloaded and returns how many are still
 * awaited; end warns of those, unlinks and frees `w` (`start`: the
 * pdx_now_ns() the wait began). The bound: the agent's request timeout,
 * at most 5 s. */
bool pdx_ctl_gone_begin_locked(pdx_agent_h agent,
                               const struct pdx_mem_reg *r, pdx_ctl_wait_t *w);
size_t pdx_ctl_gone_check_locked(pdx_agent_h agent, pdx_ctl_wait_t *w);
void pdx_ctl_gone_end_locked(pdx_agent_h agent, const struct pdx_mem_reg *r,
                             pdx_ctl_wait_t *w, uint64_t start);
uint64_t pdx_ctl_wait_bound_ms(pdx_agent_h agent);

/* pdx's own messages ride the notification channel behind this prefix,
 * which applications may not send; reserved: does `msg` start with it? */
extern const unsigned char pdx_ctl_prefix[8];
bool pdx_ctl_reserved(const void *msg, size_t len);

#endif
