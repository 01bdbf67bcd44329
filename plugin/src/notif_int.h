/* Notifications (notif.c): sending one to a peer over a backend that
 * carries messages, and the queue of received ones the caller polls. */
#ifndef PDX_NOTIF_INT_H
#define PDX_NOTIF_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "agent_int.h"
#include "peer_int.h"

typedef struct pdx_notif_item {
    struct pdx_notif_item *next;
    size_t len;
    char peer[PDX_NAME_MAX];
    unsigned char msg[];
} pdx_notif_item_t;

/* Send `msg` to `peer` over the first backend that carries messages to
 * it. Agent lock held, no backend busy. */
pdx_status_t pdx_notif_send_locked(pdx_agent_h agent, pdx_peer_t *peer,
                                   const void *msg, size_t len);
/* Queue a received application notification for pdx_notif_poll (counted
 * in the peer's stats) and make the agent's fd readable. Lock held. */
void pdx_notif_queue_locked(pdx_agent_h agent, const char *peer,
                            const void *msg, size_t len);

/* pdx's own messages (ctl.c) ride the notification channel behind this
 * prefix, which applications may not send. */
extern const unsigned char pdx_ctl_prefix[8];
/* Does an application notification start with pdx's control prefix? */
bool pdx_notif_reserved(const void *msg, size_t len);

#endif
