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
 * the data). The connector lock is held across the agent calls a call
 * makes (a post in pdx_kv_load, a progress pass in pdx_kv_progress), so a
 * call "on the connector lock" may wait that long, never for a peer.
 * Strings returned through `char **` are malloc'd: free them with
 * pdx_kv_free.
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

/* Create a connector: the agent (named by the config), its backends, one
 * registration per arena, the hasher, the invariants, the offload pool
 * (registered too, so a peer can read blocks saved in it), the store
 * section's registry thread. Logs NONE_HASH and the layout fingerprint at
 * info level. With VRAM arenas (of one device), the offload child copies
 * between them and its host pool through the CUDA driver
 * (PDX_CUDA_DRIVER_LIB, else libcuda.so.1), synchronously, the device's
 * primary context made current for each copy.
 *
 * @param [in]  params  The config and the layout (required) and the
 *                      agent's params (default: progress thread on).
 * @param [out] conn_p  The connector; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID (params missing or bad);
 *         PDX_ERR_CONFIG; PDX_ERR_UNAVAILABLE (VRAM arenas and an offload
 *         child, and no CUDA driver); or the error of the agent, a
 *         required backend, a registration, the pool or the store it
 *         could not set up (logged).
 * Owns: the config is copied; the layout and its memory are borrowed:
 *       the caller keeps both alive until the connector is destroyed;
 *       params->agent_params is read during the call only; *conn_p is the
 *       caller's, freed with pdx_kv_connector_destroy.
 * Blocks: yes: pdx_agent_create, pdx_backend_create and pdx_mem_register
 *       of each arena, the pool's creation (faulting its slab in), the
 *       store and the threads it starts.
 * Threads: any thread.
 */
PDX_API pdx_status_t
pdx_kv_connector_create(const pdx_kv_connector_params_t *params,
                        pdx_kv_connector_h *conn_p);

/* Destroy a connector: release leases (freeing held blocks), abort loads,
 * wait for queued saves, stop the store, destroy the agent, the pool and
 * the hasher.
 *
 * @param [in] conn  The connector; NULL does nothing; one already destroyed
 *                   is refused as above (best effort).
 * Owns: frees the connector and all it made (its agent and hasher
 *       included); the layout and its memory are the caller's again.
 * Blocks: yes: the save worker's queue, the store's stop, then as
 *       pdx_agent_destroy (bounded).
 * Threads: any thread but a callback of the connector's; no other call on
 *       the connector (or on the agent and hasher it handed out) may be in
 *       progress or follow.
 */
PDX_API void pdx_kv_connector_destroy(pdx_kv_connector_h conn);

/* The connector's agent, for the agent API (pdx/agent.h): stats, peers,
 * the event fd.
 *
 * @param [in] conn  The connector.
 * @return The agent; NULL for a bad handle.
 * Owns: the agent is the connector's, valid until
 *       pdx_kv_connector_destroy: never destroy it.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_agent_h pdx_kv_connector_agent(pdx_kv_connector_h conn);

/* The connector's hasher (the config's algorithm, seed and block size).
 *
 * @param [in] conn  The connector.
 * @return The hasher; NULL for a bad handle.
 * Owns: the hasher is the connector's, valid until
 *       pdx_kv_connector_destroy: never destroy it.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_hasher_h pdx_kv_connector_hasher(pdx_kv_connector_h conn);

/* This node's metadata blob, to give the peer (pdx_agent_describe of the
 * connector's agent).
 *
 * @param [in]  conn    The connector.
 * @param [out] blob_p  The blob; written only on success.
 * @param [out] len_p   Its length; written only on success.
 * @return As pdx_agent_describe.
 * Owns: *blob_p is the caller's: free it with pdx_blob_free.
 * Blocks: as pdx_agent_describe (on the agent lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_connector_describe(pdx_kv_connector_h conn,
                                               void **blob_p, size_t *len_p);

/* Load a peer's blob into the connector's agent (pdx_peer_load).
 *
 * @param [in]  conn           The connector.
 * @param [in]  blob           The peer's blob.
 * @param [in]  len            Its length.
 * @param [out] peer_name_out  The peer's name (PDX_NAME_MAX bytes); may be
 *                             NULL.
 * @return As pdx_peer_load: PDX_ERR_MISMATCH (field named in the log) when
 *         its invariants differ, ...
 * Owns: the caller keeps `blob` (read during the call only).
 * Blocks: yes: as pdx_peer_load (connection setup).
 * Threads: any thread.
 */
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

/* Scheduler: how much of `req` can be loaded, from the first child in
 * config order that has any of it.
 *
 * @param [in]  conn     The connector.
 * @param [in]  req      The request (req_id, its hashes; params: the
 *                       handoff from the peer, or NULL).
 * @param [out] match_p  The match (blocks 0 when nothing hits); written
 *                       on PDX_OK only.
 * @return PDX_OK; PDX_INPROGRESS (ask again) while an offload child with
 *         wait_for_full_prefix is still saving the first block this lookup
 *         misses and its deadline has not passed (saves of other blocks
 *         never make it wait), or, with a store section, while another
 *         node's pool is asked for a longer prefix (until
 *         store_remote_offload_timeout_ms); PDX_ERR_INVALID.
 * Owns: the caller keeps `req` and all it points to (read during the call
 *       only).
 * Blocks: on the connector lock; with a store section and handoff
 *       parameters naming a peer the agent has not loaded, first (without
 *       the connector lock) for that peer through the store: at most
 *       store_fetch_timeout_ms plus a store read and the connection setup
 *       (pdx_peer_fetch).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_lookup(pdx_kv_connector_h conn,
                                   const pdx_kv_request_t *req,
                                   pdx_kv_match_t *match_p);

/* Start loading what `match` found into this node's blocks. Remote loads
 * READ from the peer (coalesced) and send it a done notification after the
 * data landed; offload loads copy from the pool in the calling thread
 * without holding the connector lock. Handoffs from a pool carry full
 * blocks only (no tail).
 *
 * @param [in] conn       The connector.
 * @param [in] req        The request, as given to pdx_kv_lookup.
 * @param [in] match      What pdx_kv_lookup returned for it.
 * @param [in] block_ids  match->blocks ids, then one more for the tail when
 *                        match->tail; may be NULL when nothing matched.
 * @return PDX_OK (started; pdx_kv_load_check says how it ends);
 *         PDX_ERR_EXISTS (already loading that req_id); PDX_ERR_INVALID (a
 *         match larger than the request, an id out of range, no child to
 *         load from); PDX_ERR_NOMEM; the transfer's error (logged).
 * Owns: the caller keeps `req`, `match` and `block_ids` (read during the
 *       call only); the blocks are written until pdx_kv_load_check
 *       reports an end.
 * Blocks: on the connector lock, and the post of the READ (as
 *       pdx_xfer_post: never waits for the peer); an offload load copies
 *       every block first (memcpy time).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_load(pdx_kv_connector_h conn,
                                 const pdx_kv_request_t *req,
                                 const pdx_kv_match_t *match,
                                 const uint64_t *block_ids);

/* State of a request's load. A failed load with failure policy
 * `recompute` reports PDX_OK with *tokens_p 0 (the engine recomputes);
 * with `fail`, the error. The load's record is dropped once it has
 * reported a final state.
 *
 * @param [in]  conn      The connector.
 * @param [in]  req_id    The request's id.
 * @param [out] tokens_p  The tokens loaded; written on PDX_OK only.
 * @return PDX_OK; PDX_INPROGRESS; PDX_ERR_CANCELED after
 *         pdx_kv_load_abort; PDX_ERR_NOT_FOUND if no load of that id is
 *         known; or the load's error.
 * Owns: the caller keeps `req_id`.
 * Blocks: on the connector lock; the READ's check (as pdx_xfer_check:
 *       never waits for another thread's backend call).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_load_check(pdx_kv_connector_h conn,
                                       const char *req_id, size_t *tokens_p);

/* Abort a load (request cancelled or timed out) without waiting: the READ
 * is asked to stop and the holder is told to free its blocks (reject).
 * Keep calling pdx_kv_load_check: it returns PDX_INPROGRESS while bytes may
 * still land, then PDX_ERR_CANCELED (or PDX_OK if the load had completed
 * first); only then are the blocks the caller's again. The final
 * PDX_ERR_CANCELED is logged like any error, for pdx_last_error().
 *
 * @param [in] conn    The connector.
 * @param [in] req_id  The request's id.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if no load of that id is known (or it
 *         is already aborting).
 * Owns: the caller keeps `req_id`.
 * Blocks: on the connector lock; pdx_xfer_abort and a notification send
 *       (neither waits for the peer).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_load_abort(pdx_kv_connector_h conn,
                                       const char *req_id);

/* Options of pdx_kv_load_ex. Fields outside field_mask take their
 * defaults. */
enum pdx_kv_load_params_field {
    PDX_KV_LOAD_PARAM_FIRST_BLOCK = 1u << 0, /* default 0 */
    PDX_KV_LOAD_PARAM_FLAGS = 1u << 1,       /* default 0 */
};

/* One transfer per layer, each followed by pdx_kv_load_layer_check, so the
 * engine may start layer L while later layers are still on their way. */
#define PDX_KV_LOAD_F_LAYERED 1u

typedef struct pdx_kv_load_params {
    uint64_t field_mask;
    /* Blocks [0, first_block) of the match are present on this node
     * already (a local prefix hit): only blocks from first_block on are
     * loaded, block_ids[0] receiving block first_block. */
    size_t first_block;
    uint32_t flags; /* PDX_KV_LOAD_F_* */
} pdx_kv_load_params_t;

/* pdx_kv_load with options: a first block (the engine's own prefix hit is
 * not loaded again) and layer-wise transfers (PDX_KV_LOAD_F_LAYERED: one
 * READ per layer of the layout, each reported by
 * pdx_kv_load_layer_check; the done notification goes to the holder once
 * every layer has landed). Offload loads copy every block before
 * returning, layered or not. pdx_kv_load_check, pdx_kv_load_abort and the
 * failure policy are as for pdx_kv_load.
 *
 * @param [in] conn       The connector.
 * @param [in] req        The request, as given to pdx_kv_lookup.
 * @param [in] match      What pdx_kv_lookup returned for it.
 * @param [in] params     The options; NULL: all defaults (= pdx_kv_load).
 * @param [in] block_ids  One id per block from params->first_block to
 *                        match->blocks - 1, then one for the tail when
 *                        match->tail; may be NULL when there are none.
 * @return As pdx_kv_load; PDX_ERR_INVALID for a first_block past the
 *         match, or unknown flags.
 * Owns: the caller keeps `req`, `match`, `params` and `block_ids` (read
 *       during the call only); the blocks are written until
 *       pdx_kv_load_check reports an end.
 * Blocks: as pdx_kv_load (a layered READ posts one transfer per layer).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_load_ex(pdx_kv_connector_h conn,
                                    const pdx_kv_request_t *req,
                                    const pdx_kv_match_t *match,
                                    const pdx_kv_load_params_t *params,
                                    const uint64_t *block_ids);

/* Has layer `layer` of a load landed? For a layered load (pdx_kv_load_ex
 * with PDX_KV_LOAD_F_LAYERED, or pdx_kv_push_expect) each layer is
 * reported as it lands; any other load reports every layer at once, when
 * the whole load has. Unlike pdx_kv_load_check it never drops the load's
 * record: keep calling pdx_kv_load_check for the end.
 *
 * @param [in] conn    The connector.
 * @param [in] req_id  The request's id.
 * @param [in] layer   An arena layer number of the layout (pdx_arena_t's
 *                     `layer`).
 * @return PDX_OK when that layer's bytes are in place; PDX_INPROGRESS
 *         before; the load's error once it failed (whatever the failure
 *         policy: the engine must not use the layer); PDX_ERR_CANCELED
 *         after pdx_kv_load_abort; PDX_ERR_NOT_FOUND for a request with
 *         no load, or a layer the layout does not have.
 * Owns: the caller keeps `req_id`.
 * Blocks: on the connector lock; a check of each READ in flight (as
 *       pdx_xfer_check: never waits for another thread's backend call).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_load_layer_check(pdx_kv_connector_h conn,
                                             const char *req_id,
                                             uint32_t layer);

/* Required fields of pdx_kv_push_expect_t, and its optional ones. */
enum pdx_kv_push_expect_field {
    PDX_KV_PUSH_HOLDER = 1u << 0,      /* required */
    PDX_KV_PUSH_HOLDER_REQ = 1u << 1,  /* required */
    PDX_KV_PUSH_NBLOCKS = 1u << 2,     /* required */
    PDX_KV_PUSH_FIRST_BLOCK = 1u << 3, /* default 0 */
    PDX_KV_PUSH_TOKENS = 1u << 4,      /* default 0 */
    PDX_KV_PUSH_TIMEOUT = 1u << 5,     /* default: the remote lease_ms */
};

/* A push this node asks a holder for. */
typedef struct pdx_kv_push_expect {
    uint64_t field_mask;
    const char *holder;     /* the holder's agent name (a loaded peer) */
    const char *holder_req; /* the holder's id of the request */
    size_t first_block;     /* the first block of the request wanted */
    size_t nblocks;         /* blocks wanted, into block_ids (>= 1) */
    size_t tokens;          /* tokens they give; pdx_kv_load_check's */
    uint32_t timeout_ms;    /* give up when not all landed by then */
} pdx_kv_push_expect_t;

/* Decode side of a layer-wise handoff: ask the holder (the prefill node,
 * which may still be computing the request) to write blocks
 * [first_block, first_block + nblocks) of its request into this node's
 * `block_ids`, layer by layer as it saves them (pdx_kv_save_layer). The
 * ask travels as connector messages (this node's arena table and the ids);
 * the request's load record follows it: pdx_kv_load_layer_check reports
 * each layer as its bytes land, pdx_kv_load_check the end: PDX_OK once
 * the holder wrote every layer, else, under the failure policy, the
 * holder's death (PDX_ERR_REMOTE_DISCONNECT), its refusal
 * (PDX_ERR_NOT_FOUND: it does not know the request, or dropped it) or the
 * timeout (PDX_ERR_TIMEOUT). Heartbeats keep the holder's lease on its
 * blocks meanwhile; pdx_kv_load_abort tells it to stop (reject). Drive it
 * with pdx_kv_progress.
 *
 * @param [in] conn       The connector (with a remote child).
 * @param [in] req_id     This node's id of the request
 *                        (1..PDX_KV_REQ_ID_MAX-1 printable characters).
 * @param [in] e          The holder, its request, the blocks.
 * @param [in] block_ids  e->nblocks ids of this node's blocks.
 * @return PDX_OK (asked; a load record made); PDX_ERR_INVALID (a field
 *         missing or out of range, an id past the arenas);
 *         PDX_ERR_UNSUPPORTED (no remote child); PDX_ERR_EXISTS (a load
 *         of req_id is known); PDX_ERR_NOT_FOUND (the holder is not a
 *         loaded peer); the send's error (logged); PDX_ERR_NOMEM.
 * Owns: the caller keeps `req_id`, `e`, its strings and `block_ids` (read
 *       during the call only); the blocks are written until
 *       pdx_kv_load_check reports an end.
 * Blocks: on the connector lock; a few notification sends (never waits
 *       for the peer).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_push_expect(pdx_kv_connector_h conn,
                                        const char *req_id,
                                        const pdx_kv_push_expect_t *e,
                                        const uint64_t *block_ids);

/* Required fields of pdx_kv_layer_save_t, and its optional ones. */
enum pdx_kv_layer_save_field {
    PDX_KV_LAYER_SAVE_LAYER = 1u << 0,       /* required */
    PDX_KV_LAYER_SAVE_NBLOCKS = 1u << 1,     /* required */
    PDX_KV_LAYER_SAVE_TOKENS = 1u << 2,      /* required */
    PDX_KV_LAYER_SAVE_FIRST_BLOCK = 1u << 3, /* default 0 */
    PDX_KV_LAYER_SAVE_LAST = 1u << 4,        /* default false */
};

/* One layer of one step of a request, computed. */
typedef struct pdx_kv_layer_save {
    uint64_t field_mask;
    uint32_t layer;     /* an arena layer number of the layout */
    size_t first_block; /* block_ids[0] is this block of the request */
    size_t nblocks;     /* the blocks this step wrote (the last may be
                         * partial) */
    /* Tokens of the request computed once this step ends: a block wholly
     * below it is complete. */
    size_t tokens;
    /* The request's last step: nothing follows (prefill done). */
    bool last;
} pdx_kv_layer_save_t;

/* Layer-wise save: layer s->layer of the blocks a step wrote is computed.
 * The offload child copies that layer's slices of each block this step
 * completed (a full block whose hash req names, and on the last step the
 * partial tail) into a pool slot reserved at its first layer, and
 * publishes the block once every layer of the layout has been given
 * (pdx_kv_save_check follows them, as for pdx_kv_save). The remote child,
 * when a decode node asked for this request (pdx_kv_push_expect on its
 * side), writes the layer's slices of the blocks it asked for at once,
 * while later layers still compute; a layer saved before the ask is
 * written when it arrives. Once the last step's every layer is written,
 * the decode node is told, and the request's held blocks (its handoff,
 * pdx_kv_request_finished) are freed as PDX_KV_FREED_DONE. Give every
 * layer of the layout for each step; a layer given twice in a step is
 * copied and written twice.
 *
 * @param [in] conn       The connector.
 * @param [in] req        The request (req_id; hashes name its full
 *                        blocks, tail_hash its partial one).
 * @param [in] s          The layer, the blocks and the progress.
 * @param [in] block_ids  s->nblocks ids.
 * @return PDX_OK (queued: copies run on the save worker, writes in the
 *         background); PDX_ERR_INVALID (a field missing, a layer the
 *         layout lacks, an id past the arenas); PDX_ERR_NOMEM; a write's
 *         error (logged; the push is then given up and the decode node
 *         told).
 * Owns: the caller keeps `req`, `s` and `block_ids` (copied); the blocks
 *       are read until pdx_kv_save_check says PDX_OK and, with a push,
 *       until the request's blocks are reported freed.
 * Blocks: on the connector lock; the posts of the writes (as
 *       pdx_xfer_post); while the save queue is full, as pdx_kv_save.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_save_layer(pdx_kv_connector_h conn,
                                       const pdx_kv_request_t *req,
                                       const pdx_kv_layer_save_t *s,
                                       const uint64_t *block_ids);

/* The request ended on this node without a handoff (aborted, preempted
 * for good, failed): its layer-wise state goes: pool slots reserved for
 * blocks whose layers are not all saved are given back, and a push is
 * given up (a decode node that asked is told, and fails its load). Saves
 * queued whole (pdx_kv_save) and held handoffs are left as they are.
 * Harmless for a request the connector does not know.
 *
 * @param [in] conn    The connector.
 * @param [in] req_id  The request's id.
 * @return PDX_OK.
 * Owns: the caller keeps `req_id`.
 * Blocks: on the connector lock, until the save worker finished the copy
 *       it is making for the request, if any; one notification send.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_request_dropped(pdx_kv_connector_h conn,
                                            const char *req_id);

/* Save blocks of `req` to every child that saves (the offload pool unless
 * load_only). Asynchronous: the blocks must stay unchanged until
 * pdx_kv_save_check says PDX_OK. Already-present hashes cost nothing.
 *
 * @param [in] conn       The connector.
 * @param [in] req        The request (its hashes name the blocks).
 * @param [in] block_ids  req->nfull ids, then the tail's when
 *                        req->has_tail; may be NULL when there are none.
 * @return PDX_OK (queued; an id out of range is reported by
 *         pdx_kv_save_check); PDX_ERR_NOMEM; PDX_ERR_INVALID.
 * Owns: the caller keeps `req` and `block_ids` (copied); the blocks'
 *       memory is read by the save worker until pdx_kv_save_check says
 *       PDX_OK.
 * Blocks: on the connector lock; while the save queue is full, until the
 *       worker takes an entry (the lock released meanwhile).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_save(pdx_kv_connector_h conn,
                                 const pdx_kv_request_t *req,
                                 const uint64_t *block_ids);

/* Has every child finished saving `req_id`?
 *
 * @param [in] conn    The connector.
 * @param [in] req_id  The request's id.
 * @return PDX_OK once done (or nothing was saved); PDX_INPROGRESS before;
 *         the error if a save failed (logged).
 * Owns: the caller keeps `req_id`.
 * Blocks: on the connector lock.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_save_check(pdx_kv_connector_h conn,
                                       const char *req_id);

/* Where a finished request's blocks are handed off from. */
typedef enum pdx_kv_handoff_from {
    PDX_KV_FROM_ARENA = 0, /* this node's arena blocks (P after prefill) */
    PDX_KV_FROM_POOL = 1,  /* this node's offload pool (D after decode) */
} pdx_kv_handoff_from_t;

/* Request finished on this node: keep its blocks for the peer under a lease
 * (renewed by the peer's heartbeats; freed on its done or reject
 * notification or at expiry) and return the handoff parameters.
 * FROM_ARENA holds `block_ids` (the stack must not reuse them until
 * pdx_kv_poll_freed reports the request); FROM_POOL leases the request's
 * hashes in the pool (saved first).
 *
 * @param [in]  conn       The connector.
 * @param [in]  req        The request.
 * @param [in]  block_ids  FROM_ARENA: req->nfull ids, then the tail's when
 *                         req->has_tail; ignored FROM_POOL.
 * @param [in]  tokens     The KV token count covered.
 * @param [in]  from       PDX_KV_FROM_ARENA or PDX_KV_FROM_POOL.
 * @param [out] params_p   The handoff parameters (JSON); written only on
 *                         success.
 * @return PDX_OK; PDX_ERR_UNSUPPORTED (no remote child, or FROM_POOL
 *         without an offload child); PDX_ERR_INVALID; PDX_ERR_NOMEM.
 * Owns: the caller keeps `req` and `block_ids` (copied); *params_p is the
 *       caller's: free it with pdx_kv_free.
 * Blocks: on the connector lock; FROM_POOL, up to the offload child's
 *       wait_timeout_ms for this request's queued saves (the lock released
 *       meanwhile).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_request_finished(pdx_kv_connector_h conn,
                                             const pdx_kv_request_t *req,
                                             const uint64_t *block_ids,
                                             size_t tokens,
                                             pdx_kv_handoff_from_t from,
                                             char **params_p);

/* The consumer will not read a handoff: tell the holder to free now.
 *
 * @param [in] conn    The connector.
 * @param [in] params  The handoff parameters it was given.
 * @return PDX_OK; PDX_ERR_CORRUPT (parameters that do not parse); the
 *         send's error (logged).
 * Owns: the caller keeps `params`.
 * Blocks: with a store section and a holder not loaded, as pdx_kv_lookup
 *       (pdx_peer_fetch, at most store_fetch_timeout_ms and the setup);
 *       then one notification send (never waits for the peer).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_reject(pdx_kv_connector_h conn,
                                   const char *params);

/* Drive the connector: handle peers' notifications (heartbeat, done,
 * reject), expire leases, send heartbeats for loads in flight. Call it
 * from the step loop.
 *
 * @param [in] conn  The connector.
 * @return Events handled; PDX_ERR_INVALID (negative) for a bad handle.
 * Owns: nothing.
 * Blocks: on the connector lock, held throughout: pdx_notif_poll of the
 *       agent (without a progress thread, one progress pass) and the
 *       children's timers.
 * Threads: any thread.
 */
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
 * (vLLM's finished_sending), once.
 *
 * @param [in] conn  The connector.
 * @param [in] cb    Called once per request, on the calling thread,
 *                   without the connector lock, outside this call's error
 *                   capture (pdx calls it makes record their own errors);
 *                   NULL drops the reports (counted only).
 * @param [in] arg   Passed to `cb`.
 * @return How many; PDX_ERR_INVALID (negative) for a bad handle (then cb
 *         never runs).
 * Owns: the caller keeps `arg`; `req_id` is valid for the callback only.
 * Blocks: on the connector lock, briefly; then as long as the callbacks
 *       take.
 * Threads: any thread.
 */
PDX_API int pdx_kv_poll_freed(pdx_kv_connector_h conn, pdx_kv_freed_cb_t cb,
                              void *arg);

/* Requests whose blocks are still held for a peer.
 *
 * @param [in] conn  The connector.
 * @return The count; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: on the connector lock.
 * Threads: any thread.
 */
PDX_API size_t pdx_kv_held_requests(pdx_kv_connector_h conn);

/* The offload pool's counters (pdx_offload_stats).
 *
 * @param [in]  conn     The connector.
 * @param [out] stats_p  Filled on PDX_OK.
 * @return PDX_OK; PDX_ERR_NOT_FOUND without an offload child.
 * Owns: the caller keeps *stats_p.
 * Blocks: no (the pool's locks).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_offload_stats(pdx_kv_connector_h conn,
                                          pdx_offload_stats_t *stats_p);

/* Validate handoff parameters as a load would parse them: for stacks that
 * want to check what they pass on, and for the fuzzer. Pure.
 *
 * @param [in] params   `len` bytes of JSON, not necessarily
 *                      NUL-terminated.
 * @param [in] len      Bytes of `params`.
 * @param [in] narenas  Arenas of the layout they are for.
 * @return PDX_OK; PDX_ERR_CORRUPT with the reason logged.
 * Owns: the caller keeps `params`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_params_check(const char *params, size_t len,
                                         size_t narenas);

/* MultiConnector parameter merge, as request_finished does it for its
 * children (the remote child's handoff and the offload child's
 * "offload_blocks"): every key of `b` is added to `a`.
 *
 * @param [in]  a      A JSON object.
 * @param [in]  b      Another.
 * @param [out] out_p  The merged object; written only on success.
 * @return PDX_OK; PDX_ERR_EXISTS for a key both set (logged with the
 *         key); PDX_ERR_CORRUPT for text that is not JSON;
 *         PDX_ERR_INVALID for JSON that is not an object; PDX_ERR_NOMEM.
 * Owns: the caller keeps `a` and `b`; *out_p is the caller's: free it with
 *       pdx_kv_free.
 * Blocks: no.
 * Threads: any thread.
 */
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

/* Snapshot of the store section's counters.
 *
 * @param [in]  conn     The connector.
 * @param [out] stats_p  Filled on PDX_OK.
 * @return PDX_OK; PDX_ERR_NOT_FOUND without a store section.
 * Owns: the caller keeps *stats_p.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_store_stats(pdx_kv_connector_h conn,
                                        pdx_kv_store_stats_t *stats_p);

/* Free a string the connector returned (handoff parameters, a merge).
 *
 * @param [in] p  The string; NULL does nothing.
 * Owns: frees `p`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API void pdx_kv_free(void *p);

/* The connector's version, an invariant peers compare: "pdx-kv/1".
 *
 * @return A static string.
 * Owns: the string is the library's.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_connector_version(void);

#ifdef __cplusplus
}
#endif
#endif
