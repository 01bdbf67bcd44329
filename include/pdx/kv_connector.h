/* pdx KV connector: what a P/D serving stack drives, modelled on vLLM's KV
 * connector API (scheduler side: lookup, load, request finished; worker
 * side: load/save progress, finished lists), in C.
 *
 * One connector is a MultiConnector over the children of its config, in
 * order: `remote` (P/D handoff over pdx: P keeps a finished request's blocks
 * under a lease and D reads them) and `offload` (a local host-memory pool,
 * content-addressed by block hash). Lookups load from the first child with
 * a hit; saves go to every child that saves. Every participant must share
 * the invariants (hash algorithm, NONE_HASH of the seed, block size, KV
 * dtype, layout fingerprint, model id, connector version): a peer that
 * differs is refused at connect with PDX_ERR_MISMATCH and a log line naming
 * the field and both values.
 *
 * Handoff parameters are a JSON string the stack carries from P to D (or D
 * to P for multi-turn reuse): {"agent", "req", "source": "arena"|"pool",
 * "tokens", "hashes": [hex...], "ids"/"addrs", "bases", "strides", "tail"}.
 *
 * Threads: every function is thread-safe (one connector lock, and the
 * agent's own). Loads and saves are asynchronous; pdx_kv_progress drives
 * leases, heartbeats and notifications (the agent's progress thread moves
 * the data). Strings returned through `char **` are malloc'd: free them
 * with pdx_kv_free.
 *
 * Bad handles and errors: a NULL connector, a NULL required pointer (a
 * request, its req_id, hashes when nfull > 0, block ids when blocks are
 * named, an output), or a connector already destroyed is refused without
 * being dereferenced: functions returning a status return PDX_ERR_INVALID,
 * the int ones PDX_ERR_INVALID (negative), the others NULL or 0, void ones
 * do nothing; pdx_last_error() (pdx/status.h) names the function and the
 * argument, e.g. "pdx_kv_lookup: conn is NULL". Every failure leaves its
 * reason there, naming the node and the request. Catching a destroyed
 * connector is best effort: it works while the released object is among
 * the 64 most recent releases kept in quarantine, not once its memory has
 * been reused or freed. The same holds for the hasher a connector handed
 * out (pdx_kv_connector_hasher), released with it; the agent it handed out
 * is the agent API's to check (pdx/agent.h), and a handle used after its
 * owner (agent or connector) was destroyed is not caught beyond that. */
#ifndef PDX_KV_CONNECTOR_H
#define PDX_KV_CONNECTOR_H

#include <stdbool.h>

#include <pdx/agent.h>
#include <pdx/kv_config.h>
#include <pdx/kv_hash.h>
#include <pdx/kv_layout.h>
#include <pdx/kv_offload.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_kv_connector *pdx_kv_connector_h;

#define PDX_KV_REQ_ID_MAX 64

enum pdx_kv_connector_params_field {
    PDX_KV_PARAM_CONFIG = 1u << 0,       /* required */
    PDX_KV_PARAM_LAYOUT = 1u << 1,       /* required */
    PDX_KV_PARAM_AGENT_PARAMS = 1u << 2, /* default: progress thread on */
};

typedef struct pdx_kv_connector_params {
    uint64_t field_mask;
    /* Copied. */
    const pdx_kv_config_t *config;
    /* Arenas with their bases set (pdx_layout_carve or set_base); the
     * caller owns the layout and its memory and keeps both alive until the
     * connector is destroyed. Its fingerprint is an invariant. */
    pdx_layout_h layout;
    const pdx_agent_params_t *agent_params;
} pdx_kv_connector_params_t;

/* Create: the agent (named by the config), its backends, one registration
 * per arena, the hasher, the invariants, the offload pool (registered too,
 * so a peer can read blocks saved in it). Logs NONE_HASH and the layout
 * fingerprint at info level. Blocking. *conn_p written only on success. */
PDX_API pdx_status_t
pdx_kv_connector_create(const pdx_kv_connector_params_t *params,
                        pdx_kv_connector_h *conn_p);

/* Destroy: releases leases (freeing held blocks), aborts loads, waits for
 * queued saves, destroys the pool and the agent. Blocking. NULL is a no-op;
 * a connector already destroyed is refused as above (best effort). */
PDX_API void pdx_kv_connector_destroy(pdx_kv_connector_h conn);

/* The connector's agent and hasher (owned by the connector; NULL for a
 * bad handle). */
PDX_API pdx_agent_h pdx_kv_connector_agent(pdx_kv_connector_h conn);
PDX_API pdx_hasher_h pdx_kv_connector_hasher(pdx_kv_connector_h conn);

/* This node's metadata blob, to give the peer (pdx_blob_free it). */
PDX_API pdx_status_t pdx_kv_connector_describe(pdx_kv_connector_h conn,
                                               void **blob_p, size_t *len_p);

/* Load a peer's blob: PDX_ERR_MISMATCH (field named in the log) when its
 * invariants differ, else as pdx_peer_load. `peer_name_out` may be NULL.
 * Blocking. */
PDX_API pdx_status_t pdx_kv_connector_connect(pdx_kv_connector_h conn,
                                              const void *blob, size_t len,
                                              char *peer_name_out);

/* A request's KV as block hashes: `nfull` full blocks and an optional
 * partial tail (PegaFlow key; has_tail false when none). */
typedef struct pdx_kv_request {
    const char *req_id; /* 1..PDX_KV_REQ_ID_MAX-1 chars */
    const pdx_block_hash_t *hashes;
    size_t nfull;
    bool has_tail;
    pdx_block_hash_t tail_hash;
    uint32_t tail_tokens;
    size_t prompt_tokens; /* tokens the engine must have KV for */
    const char *params;   /* handoff JSON from the peer, or NULL */
} pdx_kv_request_t;

typedef enum pdx_kv_source {
    PDX_KV_SOURCE_NONE = 0,
    PDX_KV_SOURCE_REMOTE = 1,
    PDX_KV_SOURCE_OFFLOAD = 2,
} pdx_kv_source_t;

typedef struct pdx_kv_match {
    pdx_kv_source_t source; /* the child that hit */
    size_t blocks;          /* full blocks it has, from block 0 */
    bool tail;              /* and the partial tail after them */
    /* Tokens the engine may skip: at most prompt_tokens - 1, so the last
     * prompt token is always recomputed (its logits are needed). */
    size_t tokens;
} pdx_kv_match_t;

/* Scheduler: how much of `req` can be loaded. PDX_OK with *match_p filled
 * (blocks 0 when nothing hits), or PDX_INPROGRESS when an offload child
 * with wait_for_full_prefix is still saving the first block this lookup
 * misses and its deadline has not passed (ask again); saves of other
 * blocks never make it wait. Non-blocking. */
PDX_API pdx_status_t pdx_kv_lookup(pdx_kv_connector_h conn,
                                   const pdx_kv_request_t *req,
                                   pdx_kv_match_t *match_p);

/* Start loading what `match` found into this node's blocks `block_ids`
 * (match->blocks ids, then one more for the tail when match->tail).
 * Remote loads READ from the peer (coalesced) and send it a done
 * notification after the data landed; offload loads copy from the pool in
 * the calling thread without holding the connector lock. Non-blocking for
 * remote loads. Handoffs from a pool carry full blocks only (no tail). */
PDX_API pdx_status_t pdx_kv_load(pdx_kv_connector_h conn,
                                 const pdx_kv_request_t *req,
                                 const pdx_kv_match_t *match,
                                 const uint64_t *block_ids);

/* State of a request's load: PDX_OK (and *tokens_p the tokens loaded),
 * PDX_INPROGRESS, or the error. A failed load with failure policy
 * `recompute` reports PDX_OK with *tokens_p 0 (the engine recomputes); with
 * `fail`, the error. The load's record is dropped once it has reported a
 * final state. Non-blocking. */
PDX_API pdx_status_t pdx_kv_load_check(pdx_kv_connector_h conn,
                                       const char *req_id, size_t *tokens_p);

/* Abort a load (request cancelled or timed out) without waiting: the READ
 * is asked to stop and the holder is told to free its blocks (reject).
 * Keep calling pdx_kv_load_check: it returns PDX_INPROGRESS while bytes may
 * still land, then PDX_ERR_CANCELED (or PDX_OK if the load had completed
 * first); only then are the blocks the caller's again. PDX_ERR_NOT_FOUND if
 * no load of that id is known (or it is already aborting). The final
 * PDX_ERR_CANCELED is logged like any error, for pdx_last_error(). */
PDX_API pdx_status_t pdx_kv_load_abort(pdx_kv_connector_h conn,
                                       const char *req_id);

/* Save blocks of `req` held in `block_ids` (nfull ids, then the tail's when
 * req->has_tail) to every child that saves (the offload pool unless
 * load_only). Asynchronous: the blocks must stay unchanged until
 * pdx_kv_save_check says PDX_OK. Already-present hashes cost nothing. */
PDX_API pdx_status_t pdx_kv_save(pdx_kv_connector_h conn,
                                 const pdx_kv_request_t *req,
                                 const uint64_t *block_ids);

/* PDX_OK once every child finished saving `req_id` (or it saved nothing),
 * PDX_INPROGRESS before, an error if a save failed. */
PDX_API pdx_status_t pdx_kv_save_check(pdx_kv_connector_h conn,
                                       const char *req_id);

/* Where a finished request's blocks are handed off from. */
typedef enum pdx_kv_handoff_from {
    PDX_KV_FROM_ARENA = 0, /* this node's arena blocks (P after prefill) */
    PDX_KV_FROM_POOL = 1,  /* this node's offload pool (D after decode) */
} pdx_kv_handoff_from_t;

/* Request finished on this node: keep its blocks for the peer under a lease
 * (renewed by the peer's heartbeats; freed on its done or reject
 * notification or at expiry) and return the handoff parameters in
 * *params_p. FROM_ARENA holds `block_ids` (the stack must not reuse them
 * until pdx_kv_poll_freed reports the request); FROM_POOL leases the
 * request's hashes in the pool (saved first: waits up to the offload
 * child's wait_timeout_ms for queued saves). `tokens` is the KV token count
 * covered. */
PDX_API pdx_status_t pdx_kv_request_finished(pdx_kv_connector_h conn,
                                             const pdx_kv_request_t *req,
                                             const uint64_t *block_ids,
                                             size_t tokens,
                                             pdx_kv_handoff_from_t from,
                                             char **params_p);

/* The consumer will not read a handoff: tell the holder to free now. */
PDX_API pdx_status_t pdx_kv_reject(pdx_kv_connector_h conn,
                                   const char *params);

/* Drive the connector: handle peers' notifications (heartbeat, done,
 * reject), expire leases, send heartbeats for loads in flight. Returns
 * events handled (PDX_ERR_INVALID for a bad handle). Non-blocking; call it
 * from the step loop. */
PDX_API int pdx_kv_progress(pdx_kv_connector_h conn);

/* Why held blocks were freed. */
typedef enum pdx_kv_free_reason {
    PDX_KV_FREED_DONE = 0,    /* the peer read them */
    PDX_KV_FREED_REJECT = 1,  /* the peer rejected or aborted */
    PDX_KV_FREED_EXPIRED = 2, /* the lease expired */
    /* The reader died (its store lease expired or its connection failed)
     * before reading them: only with a `store` section. */
    PDX_KV_FREED_PEER_GONE = 3,
} pdx_kv_free_reason_t;

typedef void (*pdx_kv_freed_cb_t)(void *arg, const char *req_id,
                                  pdx_kv_free_reason_t why);

/* Report each request whose held blocks were freed since the last call
 * (vLLM's finished_sending), once. Returns how many (PDX_ERR_INVALID for a
 * bad handle; then cb never runs). `cb` may be NULL (the reports are
 * dropped, counted only). It runs on the calling thread without the
 * connector lock, outside this call's error capture: pdx calls it makes
 * record their own errors. */
PDX_API int pdx_kv_poll_freed(pdx_kv_connector_h conn, pdx_kv_freed_cb_t cb,
                              void *arg);

/* Requests whose blocks are still held for a peer (0 for a bad handle). */
PDX_API size_t pdx_kv_held_requests(pdx_kv_connector_h conn);

/* Offload pool counters (PDX_ERR_NOT_FOUND without an offload child). */
PDX_API pdx_status_t pdx_kv_offload_stats(pdx_kv_connector_h conn,
                                          pdx_offload_stats_t *stats_p);

/* Validate handoff parameters (`len` bytes of JSON, not necessarily
 * NUL-terminated) for a layout of `narenas` arenas, as a load would parse
 * them: PDX_OK, or PDX_ERR_CORRUPT with the reason logged. Pure; for stacks
 * that want to check what they pass on, and for the fuzzer. */
PDX_API pdx_status_t pdx_kv_params_check(const char *params, size_t len,
                                         size_t narenas);

/* MultiConnector parameter merge, as request_finished does it for its
 * children (the remote child's handoff and the offload child's
 * "offload_blocks"): every key of `b` is added to `a`; a key both set is
 * PDX_ERR_EXISTS, logged with the key. *out_p is malloc'd (pdx_kv_free). */
PDX_API pdx_status_t pdx_kv_params_merge(const char *a, const char *b,
                                         char **out_p);

/* What the connector did with its `store` section (configs/README.md).
 * Append-only. */
typedef struct pdx_kv_store_stats {
    uint64_t registrations;         /* registration calls (batches) */
    uint64_t registered_blocks;     /* blocks registered as owned here */
    uint64_t registration_failures; /* batches that failed (retried) */
    uint64_t pending_registrations; /* blocks waiting to be registered */
    uint64_t demoted;     /* replicas made reclaimable: enough owners */
    uint64_t discovered;  /* peers loaded by name for handoff parameters */
    uint64_t remote_queries;    /* registry lookups after a local miss */
    uint64_t remote_hits;       /* cross-node offload hits matched */
    uint64_t remote_hit_blocks; /* blocks of those hits */
    uint64_t remote_served;     /* prefixes this pool pinned for others */
    uint64_t peers_gone; /* handoffs freed because their reader died */
    /* Evicted blocks whose owner entry was removed, the calls (batches)
     * that removed them, and the blocks waiting for it. */
    uint64_t unregistered_blocks;
    uint64_t unregistrations;
    uint64_t pending_unregistrations;
    /* Walks registering the whole pool again after the store granted a
     * new lease (the old one expired with its entries), and the blocks
     * they registered. */
    uint64_t lease_resyncs;
    uint64_t reregistered_blocks;
} pdx_kv_store_stats_t;

/* Snapshot of those counters. PDX_ERR_NOT_FOUND without a store section.
 * Non-blocking; any thread. */
PDX_API pdx_status_t pdx_kv_store_stats(pdx_kv_connector_h conn,
                                        pdx_kv_store_stats_t *stats_p);

/* Free a string the connector returned (NULL is a no-op). */
PDX_API void pdx_kv_free(void *p);

/* Connector version (an invariant): "pdx-kv/1". */
PDX_API const char *pdx_connector_version(void);

#ifdef __cplusplus
}
#endif
#endif
