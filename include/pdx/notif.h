/* pdx notifications: short messages between agents, delivered in order per
 * peer, after the data of the request that carries them. */
#ifndef PDX_NOTIF_H
#define PDX_NOTIF_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Send `msg` (<= PDX_NOTIF_MAX bytes) to a loaded peer. Non-blocking: the
 * message is queued and goes out with progress. Copies `msg`. A message
 * starting with the 8 bytes "\0PDXCTL\1" is refused (PDX_ERR_INVALID):
 * pdx's own control messages (region-removal notices, pdx_mem_deregister)
 * travel on this channel and are never delivered to the application. */
PDX_API pdx_status_t pdx_notif_send(pdx_agent_h agent, const char *peer,
                                    const void *msg, size_t len);

/* Called once per received message, in arrival order. `peer` and `msg` are
 * valid only for the call. Runs without the agent lock held. */
typedef void (*pdx_notif_cb_t)(void *arg, const char *peer, const void *msg,
                               size_t len);

/* Progress, then hand every queued notification to `cb` and drop it.
 * Returns the number delivered. Non-blocking; any thread (deliveries from
 * concurrent polls are not interleaved: a poll holds the delivery lock). */
PDX_API int pdx_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
