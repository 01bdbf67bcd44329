/* Peer load and unload (peer_load.c): what the agent's destroy needs of
 * it (pdxi_peer_load/unload are api_int.h's). */
#ifndef PDX_PEER_LOAD_H
#define PDX_PEER_LOAD_H

#include "agent_int.h"
#include "peer_int.h"

/* Unload `peer`: its requests end STALE and are released, its regions
 * and connections go, it leaves agent->peers and is freed. Lock held. */
void pdx_peer_destroy_locked(pdx_agent_h agent, pdx_peer_t *peer);

#endif
