/* Private to the connector: its use of the agent's store (the `store`
 * section of the config): publication, discovery of the agents named by
 * handoff parameters, the block-owner registry of the offload pool and
 * cross-node offload hits. kv_connector.c calls these from small hooks.
 *
 * Locks: kv_store has its own mutex and never takes the connector's; the
 * connector may call in with its lock held (on_note, match, take_params,
 * progress) or without it (the rest). */
#ifndef PDX_KV_STORE_H
#define PDX_KV_STORE_H

#include <stdbool.h>

#include <pdx/kv_connector.h>

typedef struct kv_store kv_store_t;

/* Add the config's store to the agent's parameters (no-op without one). */
void kv_store_agent_params(const pdx_kv_config_t *cfg,
                           pdx_agent_params_t *ap);

/* Once the connector is complete: publish the agent, start the registry
 * thread. *s_p stays NULL without a store section. */
pdx_status_t kv_store_start(const pdx_kv_config_t *cfg, pdx_agent_h agent,
                            pdx_offload_pool_h pool, uint32_t block_tokens,
                            kv_store_t **s_p);
/* Before the agent and the pool are destroyed: stops the thread, releases
 * the leases of blocks it serves. NULL is a no-op. */
void kv_store_stop(kv_store_t *s);

/* A block was stored in the pool (save worker, no connector lock): its
 * owner registration is queued (one transaction per batch). */
void kv_store_saved(kv_store_t *s, const pdx_offload_key_t *key);
/* The pool evicted a block (save worker, no lock held: the pool's eviction
 * callback): its owner entry is queued for removal, batched like the
 * registrations. Never blocks on the store. */
void kv_store_evicted(kv_store_t *s, const pdx_offload_key_t *key);

/* The agent named by handoff parameters, loaded through the store when it
 * is not loaded yet (bounded by fetch_timeout_ms). Without the connector
 * lock. */
void kv_store_discover(kv_store_t *s, const char *params);

/* Lookup, under the connector lock, after the local pool gave `local`
 * blocks: PDX_INPROGRESS while an owner of a longer prefix is being asked
 * (ask again), PDX_OK with *m set to a REMOTE match of more than `local`
 * blocks when one offered them, else PDX_OK with *m untouched. */
pdx_status_t kv_store_match(kv_store_t *s, const pdx_kv_request_t *r,
                            size_t local, pdx_kv_match_t *m);
/* Load of a REMOTE match made by kv_store_match: its handoff parameters
 * (malloc'd, the caller frees), else NULL. */
char *kv_store_take_params(kv_store_t *s, const char *req_id);

/* A notification: true when it was one of the store's (fetch and offer
 * messages, and hb/done/reject of the blocks it serves). */
bool kv_store_on_note(kv_store_t *s, const char *peer, const void *msg,
                      size_t len);
/* Expire served leases and unanswered fetches; returns events. Whether
 * held handoffs should be checked for dead peers now (at most every
 * 50 ms) goes to *check_dead_p. */
int kv_store_progress(kv_store_t *s, bool *check_dead_p);
void kv_store_note_peer_gone(kv_store_t *s);

void kv_store_stats(kv_store_t *s, pdx_kv_store_stats_t *out);

#endif
