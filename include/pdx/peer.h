/* pdx peers: another agent's blob loaded into this one (connected,
 * watched), unloaded, its state and its description as data. */
#ifndef PDX_PEER_H
#define PDX_PEER_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Load a peer's blob: validate it (PDX_ERR_CORRUPT, PDX_ERR_VERSION,
 * PDX_ERR_TOO_LARGE with a logged reason, never reading out of bounds),
 * compare invariants (PDX_ERR_MISMATCH naming the field and both values),
 * connect every backend that accepts the peer. A blob with the name of a
 * loaded peer and another instance (a restarted process) replaces it:
 * requests and prepared lists made against the old one end PDX_ERR_STALE.
 * The same instance with a new generation (the peer registered or
 * deregistered memory) updates it in place: requests and prepared lists
 * that use only regions the new blob still holds unchanged (same address,
 * length, type, flags and keys) keep working, in flight or not; those
 * touching a removed or changed region end PDX_ERR_STALE (in flight: at
 * once). The same instance again after the peer was found dead (its lease
 * expired, it was paused) revives it: its backends reconnect, its earlier
 * requests stay ended (STALE if posted again) and its prepared lists on
 * unchanged regions work again; unless its pidfd shows its process exited
 * (PDX_ERR_REMOTE_DISCONNECT, it stays dead). The same generation of a
 * live peer again is PDX_OK (no-op).
 * The peer's name goes into `name_out` (PDX_NAME_MAX bytes; may be NULL).
 * `blob` is only read during the call. Blocking (connection setup). */
PDX_API pdx_status_t pdx_peer_load(pdx_agent_h agent, const void *blob,
                                   size_t len, char *name_out);

/* Forget a peer: its requests end PDX_ERR_STALE; handles made from it fail
 * as stale. PDX_ERR_NOT_FOUND if unknown. Blocking for at most a few ms:
 * connections to the peer are closed in the background (a hung peer's is
 * forced closed after ~1 s by progress, or by destroy). */
PDX_API pdx_status_t pdx_peer_unload(pdx_agent_h agent, const char *name);

/* PDX_OK if the peer is loaded and alive, PDX_ERR_REMOTE_DISCONNECT if its
 * liveness check failed (pdx_last_error() says how), PDX_ERR_NOT_FOUND if
 * unknown. Non-blocking (see "Bounded calls" above). */
PDX_API pdx_status_t pdx_peer_state(pdx_agent_h agent, const char *name);

/* A loaded peer as data (for bindings: D learns P's region addresses). */
typedef struct pdx_peer_info {
    char name[PDX_NAME_MAX];
    char host_id[128];
    uint64_t instance;   /* the peer's random instance id */
    uint32_t generation; /* bumped by the peer at every change */
    int32_t pid;
    bool same_host;      /* same host id and a pidfd could be opened */
    pdx_status_t state;  /* as pdx_peer_state */
    size_t nregions;
    char backends[256];  /* connected backends, comma-separated */
} pdx_peer_info_t;

/* One region of a peer (address in the peer's address space). */
typedef struct pdx_region_info {
    uint64_t addr;
    uint64_t len;
    uint32_t dev_id;
    pdx_mem_type_t mem_type;
    uint64_t flags; /* PDX_REGION_F_SHARED when the peer's memory is shared */
} pdx_region_info_t;

/* Describe loaded peer `name` into *info_p (caller-owned) and, when
 * `regions` is not NULL, its first `max_regions` regions sorted by
 * (mem_type, addr). PDX_ERR_NOT_FOUND if unknown. Non-blocking (agent
 * lock only); any thread. */
PDX_API pdx_status_t pdx_peer_info(pdx_agent_h agent, const char *name,
                                   pdx_peer_info_t *info_p,
                                   pdx_region_info_t *regions,
                                   size_t max_regions);

#ifdef __cplusplus
}
#endif

#endif
