/* pdx notifications: short messages between agents, delivered in order per
 * peer, after the data of the request that carries them. */
#ifndef PDX_NOTIF_H
#define PDX_NOTIF_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Send a standalone notification to a loaded peer: queued, it goes out
 * with progress. A request's own notification (pdx_xfer_create) goes out
 * after its data, so one sent here after a post may arrive first. A message
 * starting with the 8 bytes "\0PDXCTL\1" is refused: pdx's own control
 * messages (region-removal notices, pdx_mem_deregister) travel on this
 * channel and are never delivered to the application.
 *
 * @param [in] agent  The agent.
 * @param [in] peer   A loaded peer's name.
 * @param [in] msg    The message; may be NULL when len is 0.
 * @param [in] len    Bytes of `msg` (<= PDX_NOTIF_MAX, pdx/xfer.h).
 * @return PDX_OK; PDX_ERR_TOO_LARGE; PDX_ERR_INVALID (the reserved
 *         prefix); PDX_ERR_NOT_FOUND (unknown peer);
 *         PDX_ERR_REMOTE_DISCONNECT (a dead peer); or the backend's error.
 * Owns: the caller keeps `peer` and `msg` (copied).
 * Blocks: on the agent lock; the backend queues the message and never
 *       waits for the peer.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_notif_send(pdx_agent_h agent, const char *peer,
                                    const void *msg, size_t len);

/* Called once per received message, in arrival order. `peer` and `msg` are
 * valid only for the call. Runs without the agent lock held. */
typedef void (*pdx_notif_cb_t)(void *arg, const char *peer, const void *msg,
                               size_t len);

/* Progress (without a progress thread: the thread does otherwise), then
 * hand every queued notification to `cb` and drop it. Deliveries of
 * concurrent polls are not interleaved: a poll holds the agent's delivery
 * lock while its callbacks run.
 *
 * @param [in] agent  The agent.
 * @param [in] cb     Called once per message, on the calling thread,
 *                    without the agent lock: it may call into the agent,
 *                    but not pdx_notif_poll or pdx_agent_destroy of this
 *                    agent (the delivery lock is held). Its pdx calls
 *                    record their own errors, not this call's.
 * @param [in] arg    Passed to `cb`.
 * @return The number delivered; PDX_ERR_INVALID (negative) for a bad
 *         handle or a NULL cb.
 * Owns: the caller keeps `arg`; what `cb` is given is pdx's, valid for the
 *       call only.
 * Blocks: on the delivery lock while another poll's callbacks run; the
 *       agent's plain lock; without a progress thread, one progress pass
 *       (as pdx_progress, skipped while another thread is in a backend);
 *       then as long as the callbacks take.
 * Threads: any thread.
 */
PDX_API int pdx_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
