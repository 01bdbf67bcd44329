/* pdx peers: another agent's blob loaded into this one (connected,
 * watched), unloaded, its state and its description as data. */
#ifndef PDX_PEER_H
#define PDX_PEER_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Load a peer's blob: validate it (never reading out of bounds), check its
 * cluster-key signature (pdx/agent.h, cluster_key), compare invariants,
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
 * live peer again is PDX_OK (no-op). A same-host peer's pidfd is watched
 * from then on (liveness); with a store, its key too.
 *
 * @param [in]  agent     The agent.
 * @param [in]  blob      A blob from the peer's pdx_agent_describe (or the
 *                        store).
 * @param [in]  len       Bytes of `blob`.
 * @param [out] name_out  The peer's name (PDX_NAME_MAX bytes); may be
 *                        NULL; written only on success.
 * @return PDX_OK; PDX_ERR_CORRUPT, PDX_ERR_VERSION, PDX_ERR_TOO_LARGE (a
 *         blob that does not parse, with a logged reason), PDX_ERR_MISMATCH
 *         (invariants differ, naming the field and both values; or a
 *         signature of another key, or none where one is required),
 *         PDX_ERR_INVALID (this agent's own blob), PDX_ERR_REMOTE_DISCONNECT
 *         (a revival whose process exited), PDX_ERR_NOMEM, or a backend's
 *         error connecting it.
 * Owns: the caller keeps `blob` (read during the call only) and the
 *       `name_out` buffer; the peer is the agent's until pdx_peer_unload
 *       or pdx_agent_destroy.
 * Blocks: yes: parsing and checking the blob without the lock, then, on the
 *       agent lock, each backend's connection setup (UCX: an endpoint;
 *       none with its connect=lazy).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_peer_load(pdx_agent_h agent, const void *blob,
                                   size_t len, char *name_out);

/* Forget a peer: its requests end PDX_ERR_STALE, and handles made from it
 * (requests, prepared lists) fail as stale. Connections to the peer are
 * closed in the background (a hung peer's is forced closed after ~1 s by
 * progress, or by destroy).
 *
 * @param [in] agent  The agent.
 * @param [in] name   The peer's name.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if unknown.
 * Owns: the caller keeps `name`; the caller's requests and prepared lists
 *       made from the peer stay the caller's to release.
 * Blocks: on the agent lock, then at most a few ms (the backends start
 *       closing their connections; nothing waits for the peer).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_peer_unload(pdx_agent_h agent, const char *name);

/* Is a loaded peer alive? What the agent knows now, without asking the
 * peer.
 *
 * @param [in] agent  The agent.
 * @param [in] name   The peer's name.
 * @return PDX_OK if the peer is loaded and alive; PDX_ERR_REMOTE_DISCONNECT
 *         if its liveness check failed (pdx_last_error() says how);
 *         PDX_ERR_NOT_FOUND if unknown.
 * Owns: the caller keeps `name`.
 * Blocks: no (the agent's plain lock: see "Bounded calls" in
 *       pdx/agent.h).
 * Threads: any thread.
 */
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

/* Describe a loaded peer as data, and its regions sorted by (mem_type,
 * addr).
 *
 * @param [in]  agent        The agent.
 * @param [in]  name         The peer's name.
 * @param [out] info_p       The peer; written only on success.
 * @param [out] regions      Its first max_regions regions (fewer when it
 *                           has fewer: info_p->nregions says how many it
 *                           has); may be NULL when max_regions is 0.
 * @param [in]  max_regions  Entries of `regions`.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if unknown.
 * Owns: the caller keeps `name`, *info_p and `regions`.
 * Blocks: on the agent lock.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_peer_info(pdx_agent_h agent, const char *name,
                                   pdx_peer_info_t *info_p,
                                   pdx_region_info_t *regions,
                                   size_t max_regions);

#ifdef __cplusplus
}
#endif

#endif
