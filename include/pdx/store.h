/* pdx store ABI: the one table a metadata store module exports, and the
 * agent-side API built on it (discovery by name, liveness through leases,
 * the block-owner registry).
 *
 * A store module is `libpdx_store_<name>.so`, found like a backend
 * (PDX_PLUGIN_PATH, then <dir of libpdx.so>/pdx/, then that dir), and
 * exports exactly one symbol, `pdx_store_v1`, a `const pdx_store_ops_t`. The
 * loader checks `abi_version` and `size` before anything else. The table is
 * append-only: a newer loader checks `size > offsetof(pdx_store_ops_t, op)`
 * before calling an op added later. Every op is wired; one a store cannot
 * do returns PDX_ERR_UNSUPPORTED.
 *
 * Model. One instance is one client of one namespace: every key passed to
 * or reported by an op is relative to the namespace (`agents/glm52-p-dp0`
 * is stored as `<namespace>/agents/glm52-p-dp0`). The instance owns one
 * lease, granted when it first reaches the store and kept alive by the
 * module's own thread; keys put with PDX_STORE_PUT_LEASED live as long as
 * it does, so a crashed client's keys vanish within the lease TTL. The
 * module remembers every leased key it was given (until deleted) and puts
 * it again whenever it holds a new lease (the old one expired while it
 * could not reach the store), so publication survives outages.
 *
 * The store is never on the data path: ops that need the store fail fast
 * with PDX_ERR_UNAVAILABLE while it is unreachable (after one try within
 * `timeout_ms`), never retry on the caller's thread, and the module's
 * thread retries keepalives, watches and leased puts with exponential
 * backoff. pdx_store_status_t says since when it is unreachable.
 *
 * Threading. Ops may be called from any thread, concurrently (the module
 * locks what it shares); blocking ops block the calling thread for at most
 * their timeout. The module runs threads of its own (the etcd store: one
 * client per process and endpoint list, shared by every instance created
 * without module options: one thread for watch streams, republication and
 * event delivery, one for lease grants and renewals only, so a slow
 * listing, put or callback never delays a keepalive). Host callbacks
 * (pdx_store_host_t) run on the module's thread only, one at a time, in
 * order, with no module lock held; a callback may call status, get, put,
 * del and the owner ops of the same instance (they use their own
 * connections, so a blocking call delays later events, of this and of the
 * other instances sharing the thread, nothing else), but never destroy,
 * watch or unwatch. A callback must not wait on anything that waits for
 * the module's thread. Every retry waits an exponential backoff with
 * jitter (between half and all of it), renewals come every TTL/3 +-10 %:
 * clients started or failed together do not retry in step.
 *
 * Growth (etcd store; N agents in the namespace, K names an agent uses, P
 * processes, A agents in a process). No operation of an agent costs in N:
 * - publish (put, leased): 1 request, again only when the lease was lost;
 * - renewal: 1 request per process per TTL/3 for all its agents' leases;
 * - get / pdx_peer_fetch: 1 point read, cached while watched;
 * - key watch (PDX_STORE_WATCH_KEY): events of that key only; all key
 *   watches of a process share one stream (one connection); a key joining
 *   or leaving is one create or cancel frame on it (O(1) per change; the
 *   stream is reopened with every key only when it breaks), and etcd
 *   sends each change of a key once per process watching it;
 * - prefix watch: events of every key under it; its (re)listing is paged
 *   (512 keys a request, one revision), so it grows with the prefix;
 * - owner ops: the blocks asked for (max_txn_ops per transaction).
 * Connections to etcd per process: the watch stream, the lease thread's,
 * the client thread's, up to 8 pooled for callers' JSON requests and up
 * to 8 kept for gRPC point reads and renewals (plus one per in-flight
 * owner transaction).
 *
 * Memory: buffers returned through `void **` are malloc'd, freed by the
 * caller with free(). Strings in events are valid for the callback only. */
#ifndef PDX_STORE_H
#define PDX_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/agent.h>
#include <pdx/export.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_STORE_ABI_VERSION 1u
#define PDX_STORE_SYMBOL "pdx_store_v1"

#define PDX_STORE_KEY_MAX 512 /* bytes of a relative key, incl. NUL */

/* What the agent gives a store instance. Strings are copied by create. */
typedef struct pdx_store_params {
    /* Comma-separated endpoints, e.g. "http://10.0.0.1:2379,
     * http://10.0.0.2:2379"; tried in order, moving on at each failure,
     * each process starting at its own (the etcd store: pid modulo their
     * number), so a fleet spreads over the members. */
    const char *endpoints;
    /* Key prefix of every key, without a trailing '/': "pdx" or
     * "/pdx/glm52-prod". 1..127 bytes of [A-Za-z0-9._/-]. */
    const char *ns;
    /* Lease TTL in ms (rounded up to whole seconds for etcd). */
    uint32_t lease_ttl_ms;
    /* Deadline of one request to the store, connection included. */
    uint32_t timeout_ms;
    /* Backoff of the module's retries: from min, doubling, up to max. */
    uint32_t retry_min_ms;
    uint32_t retry_max_ms;
    /* Most operations in one transaction (etcd's --max-txn-ops, 128 by
     * default): the owner ops split batches to fit. */
    uint32_t max_txn_ops;
    /* Module-specific options (an unknown key is PDX_ERR_CONFIG). The etcd
     * store takes (docs/SECURITY.md):
     *   ca_file     PEM CA bundle that signs etcd's server certificate
     *               (https:// endpoints; default: the system's CAs)
     *   cert_file, key_file  client certificate and key (PEM), together
     *               (etcd's --client-cert-auth)
     *   user, and password or password_file  etcd v3 auth: the module
     *               authenticates (/v3/auth/authenticate) before its first
     *               request and again when etcd refuses the token, and
     *               sends it on every request (gateway and gRPC). The
     *               user's role must cover <ns>/ read-write.
     * Files are read by path at each connection (ca/cert/key) or at create
     * (password_file, one trailing newline dropped). */
    const pdx_option_t *opts;
    size_t nopts;
} pdx_store_params_t;

/* Reachability and lease state of an instance. Append-only. */
typedef struct pdx_store_status {
    bool reachable;         /* the last request reached the store */
    /* When it became unreachable (CLOCK_REALTIME, ns since the epoch; 0
     * while reachable), and for how long (ms, CLOCK_MONOTONIC). */
    uint64_t unreachable_since_ns;
    uint64_t unreachable_ms;
    int64_t lease;          /* current lease id; 0 while none */
    uint32_t lease_ttl_s;   /* as granted */
    uint64_t leases_granted; /* > 1: a lease was lost and replaced */
    int64_t revision;       /* newest store revision seen */
    uint64_t requests;      /* requests sent (all threads) */
    uint64_t failures;      /* requests that did not reach the store */
    uint32_t leased_keys;   /* keys kept under the lease */
    uint32_t unpublished;   /* of those, not yet put under this lease */
    uint32_t watches;       /* watches open */
    uint32_t watches_down;  /* of those, waiting to reconnect */
    char endpoint[128];     /* endpoint in use */
    char last_error[256];   /* the last failure, "" if none */
} pdx_store_status_t;

/* Traffic and lease counters of an instance (store_counters op). The
 * caller sets `size` to sizeof(pdx_store_counters_t) as it was built; the
 * module writes only the fields that fit, so either side may be newer.
 * Append-only. */
typedef struct pdx_store_counters {
    uint32_t size;
    uint64_t events;        /* watch events reported to the host */
    uint64_t event_bytes;   /* their key and value bytes */
    uint64_t keepalives;    /* lease renewals sent */
    uint64_t lease_late_ms; /* worst delay of a renewal past its schedule */
    /* Opens of the key-watch stream this instance's keys ride on (shared
     * by the instances of a process): keys join and leave an open stream,
     * so this grows only when the stream breaks. */
    uint64_t key_stream_opens;
} pdx_store_counters_t;

typedef enum pdx_store_event_type {
    PDX_STORE_EV_PUT = 1,
    PDX_STORE_EV_DELETE = 2, /* deleted, or its lease expired */
} pdx_store_event_type_t;

/* Set on events made up by the module rather than read from the watch
 * stream: after the store compacted past a watch's revision (or lost its
 * history), the module lists the prefix and reports what changed. */
#define PDX_STORE_EVF_RESYNC (1u << 0)

typedef struct pdx_store_event {
    pdx_store_event_type_t type;
    uint32_t flags;      /* PDX_STORE_EVF_* */
    const char *key;     /* relative key, NUL-terminated */
    const void *value;   /* PUT: the value (value_len bytes); DELETE: NULL */
    size_t value_len;
    int64_t revision;    /* the store revision of this change */
    int64_t lease;       /* PUT: lease the key is attached to, 0 if none */
} pdx_store_event_t;

typedef struct pdx_store_host {
    void *ctx;
    const char *agent_name; /* for log lines */
    /* An event of watch `watch_id`. Events of one watch come in revision
     * order, each once: after a reconnect the watch resumes from the
     * revision after the last one reported. */
    void (*watch_event)(void *ctx, uint64_t watch_id,
                        const pdx_store_event_t *ev);
    /* Reachability changed, or the lease was replaced. May be NULL. */
    void (*state_change)(void *ctx, const pdx_store_status_t *status);
} pdx_store_host_t;

/* pdx_store_ops_t.put flags. */
/* Attach the key to the instance's lease and keep it there (see Model).
 * While no lease is held (store unreachable), put returns PDX_INPROGRESS:
 * the key is remembered and published when the store is back. */
#define PDX_STORE_PUT_LEASED (1u << 0)

/* pdx_store_ops_t.watch flags. */
/* Report every key under the prefix as a PUT first (PDX_STORE_EVF_RESYNC
 * set), then the changes after that listing. */
#define PDX_STORE_WATCH_INITIAL (1u << 0)
/* Watch exactly the key `prefix`, not every key starting with it. With
 * INITIAL: its current value first (a PUT, RESYNC set), if it has one.
 * The etcd store carries every key watch of a process on one stream. */
#define PDX_STORE_WATCH_KEY (1u << 1)

/* Owners of one block, for owners_get. */
typedef void (*pdx_store_owner_cb_t)(void *arg, size_t index,
                                     const char *owner);

typedef struct pdx_store_ops {
    uint32_t abi_version; /* PDX_STORE_ABI_VERSION */
    uint32_t size;        /* sizeof(pdx_store_ops_t) of the module */
    const char *name;     /* "etcd" */

    /* Can this store run here? Needs no instance; may be called before
     * create.
     *
     * @param [out] why      The reason when it cannot ("" otherwise).
     * @param [in]  why_len  Bytes of `why`.
     * @return PDX_OK, or PDX_ERR_UNAVAILABLE with the reason in `why`.
     * Owns: the caller keeps `why`.
     * Blocks: no.
     * Threads: any thread.
     */
    pdx_status_t (*query)(char *why, size_t why_len);

    /* Make an instance and start its thread. Does not wait for the store:
     * an unreachable store is not an error (status says so, the thread
     * retries).
     *
     * @param [in]  host    The agent's callbacks and names.
     * @param [in]  params  Endpoints, namespace, timings, options.
     * @param [out] st_p    The instance; written only on success.
     * @return PDX_OK; PDX_ERR_CONFIG (logged) for bad params;
     *         PDX_ERR_UNAVAILABLE when query would fail; PDX_ERR_NOMEM.
     * Owns: `host` is borrowed until destroy returns; `params` and its
     *       strings are copied (opts read during the call; files they
     *       name are read by path later); *st_p is the caller's, freed
     *       with destroy.
     * Blocks: no network wait; reading password_file; starting the
     *       module's thread (or joining the process's shared client).
     * Threads: any thread.
     */
    pdx_status_t (*create)(const pdx_store_host_t *host,
                           const pdx_store_params_t *params, void **st_p);

    /* Stop the instance's watches and callbacks (none runs after this
     * returns), revoke the lease (its keys vanish at once) and free.
     *
     * @param [in] st  The instance.
     * Owns: frees the instance; `host` is the caller's again.
     * Blocks: yes: a callback in progress; the lease revocation, at most
     *       timeout_ms.
     * Threads: any thread but a host callback; no other op on the
     *       instance may be in progress or follow.
     */
    void (*destroy)(void *st);

    /* Snapshot of the instance's state.
     *
     * @param [in]  st        The instance.
     * @param [out] status_p  Filled.
     * Owns: the caller keeps *status_p.
     * Blocks: no.
     * Threads: any thread, host callbacks included.
     */
    void (*status)(void *st, pdx_store_status_t *status_p);

    /* Put `key` = value.
     *
     * @param [in] st     The instance.
     * @param [in] key    A relative key (< PDX_STORE_KEY_MAX bytes).
     * @param [in] value  The value (len bytes).
     * @param [in] len    Bytes of `value`.
     * @param [in] flags  0 or PDX_STORE_PUT_LEASED.
     * @return PDX_OK stored; PDX_INPROGRESS (leased only) remembered, to be
     *         published when a lease is held; PDX_ERR_UNAVAILABLE
     *         unreachable.
     * Owns: the caller keeps `key` and `value` (a leased key and its value
     *       are copied, remembered until deleted).
     * Blocks: yes: one request, at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*put)(void *st, const char *key, const void *value,
                        size_t len, uint32_t flags);

    /* Get `key`.
     *
     * @param [in]  st       The instance.
     * @param [in]  key      A relative key.
     * @param [out] value_p  The value; may be NULL when len is 0; written
     *                       on PDX_OK only.
     * @param [out] len_p    Its length; written on PDX_OK only.
     * @param [out] rev_p    The key's mod revision; may be NULL; written on
     *                       PDX_OK only.
     * @return PDX_OK; PDX_ERR_NOT_FOUND; PDX_ERR_UNAVAILABLE.
     * Owns: the caller keeps `key`; *value_p is the caller's, malloc'd:
     *       free() it.
     * Blocks: yes: one request, at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*get)(void *st, const char *key, void **value_p,
                        size_t *len_p, int64_t *rev_p);

    /* Delete `key` (and forget it if leased).
     *
     * @param [in] st   The instance.
     * @param [in] key  A relative key.
     * @return PDX_OK, also when absent; PDX_ERR_UNAVAILABLE.
     * Owns: the caller keeps `key`.
     * Blocks: yes: one request, at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*del)(void *st, const char *key);

    /* Watch every key starting with `prefix` (or the key itself, with
     * PDX_STORE_WATCH_KEY) from store revision `start_revision` and report
     * events through host->watch_event. The module's thread opens (and
     * reopens) the stream.
     *
     * @param [in]  st              The instance.
     * @param [in]  prefix          A relative key or prefix.
     * @param [in]  start_revision  The first revision to report; 0: from
     *                              now.
     * @param [in]  flags           PDX_STORE_WATCH_*.
     * @param [out] id_p            The watch's id (> 0).
     * @return PDX_OK; PDX_ERR_INVALID; PDX_ERR_NOMEM.
     * Owns: the caller keeps `prefix` (copied).
     * Blocks: no.
     * Threads: any thread but a host callback.
     */
    pdx_status_t (*watch)(void *st, const char *prefix, int64_t start_revision,
                          uint32_t flags, uint64_t *id_p);

    /* Stop a watch; no event of it is reported after this returns.
     *
     * @param [in] st  The instance.
     * @param [in] id  What watch returned.
     * @return PDX_OK; PDX_ERR_NOT_FOUND for an unknown id.
     * Owns: nothing.
     * Blocks: yes: until a callback of the instance in progress returns.
     * Threads: any thread but a host callback.
     */
    pdx_status_t (*unwatch)(void *st, uint64_t id);

    /* Block-owner registry. A block is named by `blocks[i]` (a hash in
     * hex: 1..128 bytes of [0-9a-f]); its owners are the keys
     * `blocks/<block>/<owner>`, put under the lease. */

    /* Register `owner` as an owner of each of the n blocks, in as few
     * transactions as the store allows (max_txn_ops), and write each
     * block's live owner count after the registration (this owner
     * included).
     *
     * @param [in]  st      The instance.
     * @param [in]  owner   The owner's name (an agent's).
     * @param [in]  blocks  n block names.
     * @param [in]  n       Blocks.
     * @param [out] counts  n counts; may be NULL.
     * @return PDX_OK; PDX_ERR_UNAVAILABLE (unreachable); or the store's
     *         refusal (PDX_ERR_INVALID for a bad name, ...; logged).
     * Owns: the caller keeps `owner`, `blocks` and `counts`.
     * Blocks: yes: one request per transaction (several at once), each
     *       at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*owners_add)(void *st, const char *owner,
                               const char *const *blocks, size_t n,
                               uint32_t *counts);

    /* Remove `owner` from each block.
     *
     * @param [in] st      The instance.
     * @param [in] owner   The owner's name.
     * @param [in] blocks  n block names.
     * @param [in] n       Blocks.
     * @return PDX_OK; PDX_ERR_UNAVAILABLE (unreachable); or the store's
     *         refusal (logged).
     * Owns: the caller keeps `owner` and `blocks`.
     * Blocks: yes: one request per transaction (several at once), each
     *       at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*owners_del)(void *st, const char *owner,
                               const char *const *blocks, size_t n);

    /* Report every live owner of each block: cb(arg, i, owner) once per
     * (block, owner), on the calling thread, blocks in order.
     *
     * @param [in] st      The instance.
     * @param [in] blocks  n block names.
     * @param [in] n       Blocks.
     * @param [in] cb      Called per (block, owner), before this returns.
     * @param [in] arg     Passed to `cb`.
     * @return PDX_OK; PDX_ERR_UNAVAILABLE (unreachable); or the store's
     *         refusal (logged).
     * Owns: the caller keeps `blocks`; `owner` is the module's, valid for
     *       the callback only.
     * Blocks: yes: one request per transaction (several at once), each
     *       at most timeout_ms.
     * Threads: any thread, host callbacks included.
     */
    pdx_status_t (*owners_get)(void *st, const char *const *blocks, size_t n,
                               pdx_store_owner_cb_t cb, void *arg);

    /* The instance's counters. Added after the first table: a loader
     * checks size > offsetof(pdx_store_ops_t, counters) before calling it.
     *
     * @param [in]     st  The instance.
     * @param [in,out] c   c->size is read (set by the caller); the fields
     *                     within it are written.
     * Owns: the caller keeps *c.
     * Blocks: no.
     * Threads: any thread, host callbacks included.
     */
    void (*counters)(void *st, pdx_store_counters_t *c);
} pdx_store_ops_t;

/* Oldest table a loader accepts: everything up to owners_get. */
#define PDX_STORE_OPS_MIN_SIZE                                                 \
    (offsetof(pdx_store_ops_t, owners_get) + sizeof(void (*)(void)))

_Static_assert(offsetof(pdx_store_ops_t, abi_version) == 0,
               "abi_version first");
_Static_assert(offsetof(pdx_store_ops_t, size) == 4, "size second");

/* ---- Agent side: discovery and the registry through the agent's store.
 *
 * An agent created with a store (PDX_AGENT_PARAM_STORE in
 * pdx_agent_params_t) loads libpdx_store_<store>.so and watches only the
 * names it uses, each key by itself (`agents/<name>`): every peer it has
 * loaded (fetched, by hand, through the connector), the names it was
 * asked to fetch (the 256 most recent not loaded) and its own. It keeps
 * the newest blob of each in a local cache (so lookups of those names
 * work while the store is down). What an agent receives from the store
 * grows with the peers it uses, never with the namespace: a fleet's total
 * traffic is linear in its size. Once pdx_agent_publish is called, it
 * keeps its own blob under `agents/<name>` on its lease, publishing again
 * whenever its generation changes. For every loaded peer, the watch:
 * - reloads it when its key gets another instance or generation (requests
 *   against the old one end PDX_ERR_STALE, as with pdx_peer_load);
 * - marks it dead when its key is deleted or its lease expires: its
 *   requests end PDX_ERR_REMOTE_DISCONNECT and new ones are refused until
 *   it is loaded again.
 * Peers loaded by hand (pdx_peer_load) are treated the same when their
 * name is in the namespace.
 *
 * While the store is unreachable: loaded peers keep transferring (nothing
 * on the data path touches the store); pdx_peer_fetch of a cached
 * (watched) name works, of another one fails PDX_ERR_UNAVAILABLE; the death
 * of a peer is seen only through the transports (pidfd, UCX keepalive),
 * not through its lease, until the watch resumes (from its revision:
 * changes made meanwhile are reported then, none lost); this agent's lease
 * is not renewed, so after the TTL other agents see it as dead; its blob is
 * published again (under a new lease if the old one expired) when the
 * store is back. */

/* Start publishing this agent's blob: now, in the background, and again
 * at every generation change, under the agent's lease. Call it once the
 * agent is complete (backends, memory, invariants): a peer that loads it
 * before would see an incomplete agent.
 *
 * @param [in] agent  An agent created with a store.
 * @return PDX_OK; PDX_ERR_UNSUPPORTED without a store.
 * Owns: nothing.
 * Blocks: no (the store's thread puts it).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_agent_publish(pdx_agent_h agent);

/* Make peer `name` loaded: PDX_OK at once if it is loaded and alive;
 * otherwise its blob is taken from the cache, else from the store (one
 * point read; its key is watched from then on), else waited for (it may
 * not have published yet) until `timeout_ms` has passed, and loaded with
 * pdx_peer_load (invariants checked: a peer of another layout or seed is
 * refused with PDX_ERR_MISMATCH naming the field). A loaded but dead peer
 * is reloaded only from a newer blob (another instance or generation) or
 * its own blob put again after it was found dead (it re-published:
 * revived, see pdx_peer_load); else PDX_ERR_REMOTE_DISCONNECT. The watch
 * does the same by itself: a peer whose key comes back is revived, and a
 * same-host peer whose process lives (pidfd) is not failed when only its
 * key goes (lease expired while it or the store was paused).
 *
 * @param [in] agent       An agent created with a store.
 * @param [in] name        The peer's name (1..PDX_NAME_MAX-1 bytes of
 *                         [A-Za-z0-9._-]).
 * @param [in] timeout_ms  How long to wait for it to be published.
 * @return PDX_OK; PDX_ERR_NOT_FOUND (not published by the deadline),
 *         PDX_ERR_UNAVAILABLE (store unreachable and nothing cached),
 *         PDX_ERR_REMOTE_DISCONNECT (dead, and no newer blob),
 *         PDX_ERR_UNSUPPORTED (no store), PDX_ERR_INVALID (a bad name),
 *         PDX_ERR_NOMEM, or pdx_peer_load's error.
 * Owns: the caller keeps `name`; the peer is the agent's, as after
 *       pdx_peer_load.
 * Blocks: yes: at most about timeout_ms, plus one point read of the store
 *       (at most its store_timeout_ms) and the connection setup of
 *       pdx_peer_load.
 * Threads: any thread but a callback of pdx's.
 */
PDX_API pdx_status_t pdx_peer_fetch(pdx_agent_h agent, const char *name,
                                    uint32_t timeout_ms);

/* The agent's store state: reachability, lease, revision, traffic.
 *
 * @param [in]  agent     The agent.
 * @param [out] status_p  Filled on PDX_OK.
 * @return PDX_OK; PDX_ERR_UNSUPPORTED without a store.
 * Owns: the caller keeps *status_p.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_status(pdx_agent_h agent,
                                      pdx_store_status_t *status_p);

/* The agent's store counters.
 *
 * @param [in]     agent  The agent.
 * @param [in,out] c_p    c_p->size set to sizeof(pdx_store_counters_t) by
 *                        the caller; the fields within it are written.
 * @return PDX_OK; PDX_ERR_UNSUPPORTED without a store or with a module
 *         that has no counters; PDX_ERR_INVALID for a size too small for
 *         any counter.
 * Owns: the caller keeps *c_p.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_counters(pdx_agent_h agent,
                                        pdx_store_counters_t *c_p);

/* One line for people: "etcd http://127.0.0.1:2379 ns pdx: reachable,
 * lease 7587..(5 s), 3 agents known" or "...: unreachable since
 * 2025-01-02T10:00:00Z (12.3 s): <last error>".
 *
 * @param [in]  agent  The agent.
 * @param [out] buf    The line, NUL-terminated and truncated to `len`
 *                     ("no store" without one).
 * @param [in]  len    Bytes of `buf` (> 0).
 * @return PDX_OK; PDX_ERR_UNSUPPORTED without a store.
 * Owns: the caller keeps `buf`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_describe(pdx_agent_h agent, char *buf,
                                        size_t len);

/* Register this agent as an owner of each block in the agent's store
 * (pdx_store_ops_t.owners_add).
 *
 * @param [in]  agent   An agent created with a store.
 * @param [in]  blocks  n block names (hex hashes).
 * @param [in]  n       Blocks.
 * @param [out] counts  Each block's live owner count after this
 *                      registration; may be NULL.
 * @return PDX_OK; PDX_ERR_UNSUPPORTED without a store;
 *         PDX_ERR_UNAVAILABLE while it is unreachable; or the store's
 *         refusal.
 * Owns: the caller keeps `blocks` and `counts`.
 * Blocks: yes: the store's transactions, each at most store_timeout_ms.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_owners_add(pdx_agent_h agent,
                                          const char *const *blocks, size_t n,
                                          uint32_t *counts);

/* Remove this agent as an owner of each block
 * (pdx_store_ops_t.owners_del).
 *
 * @param [in] agent   An agent created with a store.
 * @param [in] blocks  n block names.
 * @param [in] n       Blocks.
 * @return As pdx_store_owners_add.
 * Owns: the caller keeps `blocks`.
 * Blocks: yes: the store's transactions, each at most store_timeout_ms.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_owners_del(pdx_agent_h agent,
                                          const char *const *blocks,
                                          size_t n);

/* Report every live owner of each block: cb(arg, i, owner) once per
 * (block, owner), blocks in order (pdx_store_ops_t.owners_get).
 *
 * @param [in] agent   An agent created with a store.
 * @param [in] blocks  n block names.
 * @param [in] n       Blocks.
 * @param [in] cb      Called on the calling thread before this returns.
 * @param [in] arg     Passed to `cb`.
 * @return As pdx_store_owners_add.
 * Owns: the caller keeps `blocks` and `arg`; `owner` is valid for the
 *       callback only.
 * Blocks: yes: the store's transactions, each at most store_timeout_ms.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_owners_get(pdx_agent_h agent,
                                          const char *const *blocks, size_t n,
                                          pdx_store_owner_cb_t cb, void *arg);

/* Which agent (other than this one) holds the longest prefix of
 * blocks[0..n): its name in owner_out (PDX_NAME_MAX bytes) and the prefix
 * length in *prefix_p (0, owner_out "", when nobody else holds block 0).
 * Samples owners in rounds of up to 64 blocks (two rounds for 2,000
 * blocks) instead of asking for every block, on the assumption that an
 * owner of block i owns blocks 0..i (prefixes are saved whole and pools
 * evict tails first); the owner's pool has the last word when asked for
 * the blocks.
 *
 * @param [in]  agent      An agent created with a store.
 * @param [in]  blocks     n block names, in prefix order.
 * @param [in]  n          Blocks.
 * @param [out] owner_out  The owner's name (PDX_NAME_MAX bytes); written
 *                         only on success.
 * @param [out] prefix_p   The prefix length; written only on success.
 * @return As pdx_store_owners_add.
 * Owns: the caller keeps `blocks` and `owner_out`.
 * Blocks: yes: one owners_get per round (about log64(n) rounds, 16 at
 *       most), each at most store_timeout_ms per transaction.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_store_owners_longest(pdx_agent_h agent,
                                              const char *const *blocks,
                                              size_t n, char *owner_out,
                                              size_t *prefix_p);

#ifdef __cplusplus
}
#endif
#endif
