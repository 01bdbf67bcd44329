/* pdx agent: one per process or DP rank. Owns backends, registrations,
 * known peers, requests and notifications.
 *
 * Thread contract (whole agent): every function taking a pdx_agent_h is
 * thread-safe; calls are serialised by the agent's lock. A progress thread
 * (PDX_AGENT_F_PROGRESS_THREAD) shares that lock. Callbacks (notification
 * callback) run with the lock released and may call back into the agent.
 *
 * Bounded calls: nothing waits for a peer while holding the agent lock. A
 * dead peer's requests are failed and its connection force-closed without
 * waiting; a hung peer's (timed out, aborted) are stopped in the
 * background by progress. A backend's progress call and a post run
 * WITHOUT the agent lock (one UCX progress call over sm or tcp can copy
 * megabytes: 10-45 ms measured): other calls that need a backend wait
 * for that one call at most; pdx_peer_state, pdx_notif_poll, the stats
 * reads and pdx_xfer_check never wait for it. What runs under the lock is
 * short: a request check (UCX O(1); cma copies at most one 512 KiB
 * half-chunk), a make, liveness and timeout sweeps. pdx_xfer_check
 * progresses its request's backend itself (one call, without the lock,
 * bounded to ~0.5 ms of UCX work) when no other thread is in a backend,
 * with or without a progress thread; pdx_notif_poll progresses every
 * backend only without a progress thread (the thread does, woken by
 * their events).
 * Measured on a shared 2-core VM while a peer was killed or stopped
 * mid-transfer (tests/system/faults/stall.c): p99 0.002-0.003 ms, longest call
 * 1-5 ms alone; beside a pdx-bench run and two compiles (load 4-5), 134 of
 * 140 runs kept every call under 50 ms: the others were a lock holder
 * descheduled for 60-160 ms (waits quantized at the 10 ms tick), not work
 * under the lock. Transfers to other peers carried on.
 *
 * Handles: every function refuses a NULL handle with PDX_ERR_INVALID (a
 * void function does nothing) and a pdx_last_error() naming the argument.
 * Agents, requests and prepared lists carry a tag that release sets dead,
 * and their memory is kept a while (requests: until 64 later releases of
 * the same agent; agents and lists: until 64 later releases in the
 * process), so a handle used after release is refused with
 * PDX_ERR_INVALID and a log line instead of being read. Best effort: a
 * handle whose memory was reused for a new object of the same kind is
 * taken as that object, and a request handle used after its agent was
 * destroyed is not caught. A registration handle is only compared, never
 * read, so a stale one is always refused.
 *
 * fork(): agents, connectors, offload pools, prepared lists and requests
 * made before a fork are dead handles in the child (their threads,
 * connections and locks stayed in the parent). Every call on them there
 * fails with PDX_ERR_INVALID and a pdx_last_error() naming fork(); their
 * release and destroy do nothing, quietly (a child's exit may run them),
 * and touch nothing the parent owns. pdx_mem_free of inherited
 * pdx_mem_alloc memory (not mapped in the child: MADV_DONTFORK) just
 * forgets it. The child may create agents of its own (UCX in a forked
 * child works, but its endpoint closes may take the ~1 s close bound).
 * Layouts and hashers are plain data and keep working. No pdx lock is held
 * across fork (pthread_atfork), so a child never hangs on one. */
#ifndef PDX_AGENT_H
#define PDX_AGENT_H

#include <pdx/export.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_agent *pdx_agent_h;
typedef struct pdx_backend *pdx_backend_h;
typedef struct pdx_mem_reg *pdx_mem_reg_h;

#define PDX_NAME_MAX 64 /* agent and peer names, bytes incl. NUL */

enum pdx_agent_params_field {
    PDX_AGENT_PARAM_FLAGS = 1u << 0,
    PDX_AGENT_PARAM_XFER_TIMEOUT = 1u << 1,
    PDX_AGENT_PARAM_PROGRESS_INTERVAL = 1u << 2,
    PDX_AGENT_PARAM_PATH_POLICY = 1u << 3,
    PDX_AGENT_PARAM_STORE = 1u << 4, /* the store_* fields */
    PDX_AGENT_PARAM_CLUSTER_KEY = 1u << 5, /* the cluster_key* fields */
    PDX_AGENT_PARAM_STORE_OPTS = 1u << 6,  /* store_opts, store_nopts */
};

/* Which transfer paths an agent accepts (PDX_AGENT_PARAM_PATH_POLICY).
 *
 * A "fallback" is a request to a peer on this host (same host id and pid
 * namespace) that does not take the same-host fast path for its memory:
 * host memory not moved by the cma backend's memcpy of a mapped region
 * (cma missing on either side, the peer's memory not shared or not
 * mappable here, so process_vm_readv/writev or UCX carries it), or GPU
 * memory not moved by cuda_ipc. Requests to peers on other hosts are never
 * fallbacks. Fallbacks are counted (pdx_stats_peer, pdx_stats_backend),
 * reported per request (pdx_xfer_telemetry) and logged once per peer as a
 * warning with the reason. */
typedef enum pdx_path_policy {
    /* Fallbacks are allowed (the default). */
    PDX_PATH_POLICY_ANY = 0,
    /* Same-host peers must use the fast path: making a request that would
     * fall back fails with PDX_ERR_POLICY, and pdx_last_error() says why
     * the fast path was refused (e.g. "peer glm52-p-dp0 (same host):
     * region 0x7f..+1048576 is not shared memory: process_vm would carry
     * it"). */
    PDX_PATH_POLICY_SAME_HOST_FAST = 1,
} pdx_path_policy_t;

/* Run a progress thread that drives every backend, checks peer liveness and
 * delivers notifications, so a peer that never polls still completes work.
 *
 * How it waits (issue 19): idle, it sleeps on one epoll set (each
 * backend's armed event fd: UCX's ucp_worker_get_efd + ucp_worker_arm;
 * peers' pidfds; the stats socket; a wake fd for posts and loads), at most
 * 100 ms (housekeeping; ~10 wake-ups and ~1 ms of CPU a second), 1 ms with
 * requests in flight (their timeouts). A message wakes it: a peer's
 * request is served without this process calling pdx. Two bursts of
 * activity within 1 ms (a peer's stream of small requests) make it poll
 * without system calls until 1 ms after the last, so the next one is
 * served at UCX's own latency rather than a wake-up's (60-120 us on a
 * small VM); a lone message (a keepalive) does not. While a caller polls
 * pdx_xfer_check, the caller progresses the request's backend itself and
 * the thread keeps out of that backend: it naps on the pidfds, the stats
 * socket and the wake fd, 1 ms at a time, doubling up to 8 ms while a
 * caller spins (20 or more checks a ms), and takes the agent lock only
 * when housekeeping is due (a request deadline, a peer's exit, every 10 ms;
 * every nap while another backend or request needs it). So after a
 * spinning caller stops, a backend it progressed can wait up to 8 ms for
 * the thread (less than the spin had lasted). Requests in flight on a
 * backend without an event fd (cma, polled) make it pause
 * progress_interval_us between passes.
 *
 * Liveness: a peer on this host is watched through a pidfd (its death fails
 * its requests with PDX_ERR_REMOTE_DISCONNECT at the next progress, within
 * about a millisecond, and its connections are force-closed); a peer
 * elsewhere through its backend's connection errors (UCX peer error
 * handling: a killed process's RST within ~0.1 s over TCP; over RDMA,
 * UCX keepalive, 5 s by default: the ucx option keepalive_ms). A hung peer (alive but not
 * progressing) is caught by the request timeout; UCX then gives up on it
 * (marks it dead) after 1 more second without progress on the aborted
 * request, in the background.
 *
 * Also: every agent answers `pdx-info --stats` on an abstract unix socket
 * "pdx-stats.<pid>.<name>" (same uid or root only), served by progress;
 * PDX_STATS_SOCKET=0 in the environment turns it off. */
#define PDX_AGENT_F_PROGRESS_THREAD (1u << 0)
/* Record times per request for pdx_xfer_telemetry (start time, post and
 * transfer durations): two clock reads per post and one per completion,
 * off by default as NIXL's capture_telemetry. Backend, transport, bytes
 * and descriptor counts are reported either way. */
#define PDX_AGENT_F_TELEMETRY (1u << 1)

typedef struct pdx_agent_params {
    uint64_t field_mask; /* PDX_AGENT_PARAM_*; unset fields take defaults */
    uint32_t flags;      /* PDX_AGENT_F_*; default 0 */
    /* A posted request not complete after this long ends with
     * PDX_ERR_TIMEOUT (hung peer). 0 = never. Default 60000 ms. */
    uint32_t xfer_timeout_ms;
    /* Progress thread pause between passes while requests are in flight
     * on a backend without an event fd (cma), microseconds. Default 50.
     * Otherwise the thread sleeps on events (PDX_AGENT_F_PROGRESS_THREAD
     * says how), or polls briefly after a stream. */
    uint32_t progress_interval_us;
    /* pdx_path_policy_t; default PDX_PATH_POLICY_ANY. */
    uint32_t path_policy;
    /* Discovery store (PDX_AGENT_PARAM_STORE; pdx/store.h): the agent
     * watches `<store_namespace>/agents/`, and publishes its own blob there
     * under a lease once pdx_agent_publish is called. Without the bit,
     * peers meet only through blobs passed by hand. Strings are copied. */
    const char *store;           /* module libpdx_store_<store>.so; "etcd" */
    const char *store_endpoints; /* "http://10.0.0.1:2379,..."; required */
    const char *store_namespace; /* key prefix; default "pdx" */
    uint32_t store_lease_ttl_ms; /* a dead agent vanishes after it; 10000 */
    uint32_t store_timeout_ms;   /* one request to the store; 2000 */
    /* Most operations in one store transaction (etcd's --max-txn-ops);
     * default 128, etcd's default. */
    uint32_t store_max_txn_ops;
    /* Cluster key (PDX_AGENT_PARAM_CLUSTER_KEY; docs/SECURITY.md): exactly
     * one of `cluster_key` (cluster_key_len bytes, 16..4096) or
     * `cluster_key_file` (a file holding the key; one trailing newline is
     * dropped). Without the bit, the file named by PDX_CLUSTER_KEY_FILE in
     * the environment, if set; else no key. With a key, every blob the
     * agent describes or publishes is signed (HMAC-SHA-256), and
     * pdx_peer_load and the store watch refuse a blob that is not signed
     * with the same key: unsigned or signed with another key
     * PDX_ERR_MISMATCH, altered PDX_ERR_CORRUPT, pdx_last_error() saying
     * which. Without a key, signed and unsigned blobs are both accepted
     * (unverified). The key authenticates metadata only, not transfers.
     * Bytes are copied at create; an unreadable file or a key out of range
     * fails pdx_agent_create (PDX_ERR_CONFIG / PDX_ERR_INVALID). */
    const void *cluster_key;
    size_t cluster_key_len;
    const char *cluster_key_file;
    /* Store module options (PDX_AGENT_PARAM_STORE_OPTS, with
     * PDX_AGENT_PARAM_STORE), passed as pdx_store_params_t.opts; the etcd
     * store takes TLS and user/password auth options (pdx/store.h). Only
     * read during pdx_agent_create (the module copies what it keeps). */
    const pdx_option_t *store_opts;
    size_t store_nopts;
} pdx_agent_params_t;

/* Create an agent named `name` (1..PDX_NAME_MAX-1 bytes of [A-Za-z0-9._-]).
 * `params` may be NULL (defaults). Writes *agent_p only on success.
 * Blocking (starts the progress thread if asked); any thread. */
PDX_API pdx_status_t pdx_agent_create(const char *name,
                                      const pdx_agent_params_t *params,
                                      pdx_agent_h *agent_p);

/* Destroy: stops the progress thread, releases every request (aborting what
 * is in flight), unloads peers, deregisters memory, destroys backends.
 * Blocking, and bounded whatever the peers do (dead, hung or timed out):
 * releasing requests still in flight waits at most ~1 s for what can still
 * land, and each backend then at most ~1.2 s for its connections to close
 * (UCX: an endpoint whose flush a hung peer never finishes is forced closed
 * at that deadline); the process can exit normally afterwards. No other
 * call on this agent may be in progress or follow. */
PDX_API void pdx_agent_destroy(pdx_agent_h agent);

/* The agent's name; owned by the agent, valid until destroy. */
PDX_API const char *pdx_agent_name(pdx_agent_h agent);

/* Create backend `name` ("ucx", "cuda_ipc") with options, loading
 * libpdx_backend_<name>.so from PDX_PLUGIN_PATH (colon-separated), then from
 * <dir of libpdx.so>/pdx/ and <dir of libpdx.so>. PDX_ERR_NOT_FOUND when no
 * module is found, PDX_ERR_VERSION when only incompatible ones are (each
 * rejection logged with its path and reason), PDX_ERR_UNAVAILABLE when the
 * backend cannot run here (reason logged). Create backends before
 * registering memory or loading peers. `*be_p` may be NULL; the handle is
 * owned by the agent. Blocking. */
PDX_API pdx_status_t pdx_backend_create(pdx_agent_h agent, const char *name,
                                        const pdx_option_t *opts,
                                        size_t nopts, pdx_backend_h *be_p);

/* As pdx_backend_create, with an ops table the caller links in (tests,
 * static builds). `ops` must outlive the agent. */
PDX_API pdx_status_t pdx_backend_create_with_ops(pdx_agent_h agent,
                                                 const void *ops,
                                                 const pdx_option_t *opts,
                                                 size_t nopts,
                                                 pdx_backend_h *be_p);

/* Find a backend module without creating it: on PDX_OK, `why` is empty;
 * otherwise a reason ("not found in ...", "unavailable: no CUDA device").
 * `caps_p` (may be NULL) gets the caps. No agent needed; blocking. */
PDX_API pdx_status_t pdx_backend_probe(const char *name, uint64_t *caps_p,
                                       char *why, size_t why_len);

/* One line describing a backend instance (transports in use). */
PDX_API void pdx_backend_describe(pdx_backend_h be, char *buf, size_t len);

/* Register a region with every backend that supports its memory type.
 * `flags` are PDX_REGION_F_* of pdx/types.h (0 normally). A backend that
 * cannot take this region declines and the others carry it; at least one
 * must take it (PDX_ERR_UNSUPPORTED otherwise). Register whole
 * arenas, not blocks. Regions of one agent must not overlap. Writes *reg_p
 * only on success. Blocking. */
PDX_API pdx_status_t pdx_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                                      uint64_t addr, uint64_t len,
                                      uint32_t dev_id, uint64_t flags,
                                      pdx_mem_reg_h *reg_p);

/* Deregister. PDX_ERR_BUSY (nothing done) while a request uses it;
 * PDX_ERR_INVALID if `reg` is not a live registration of this agent.
 * Loaded peers are told at once (an internal message on the notification
 * channel, never seen by the application): a peer takes the region out of
 * its view, its prepared lists and requests on it are refused
 * PDX_ERR_STALE from then on, and it acknowledges once none of its
 * requests on the region is in flight. This call waits for those
 * acknowledgements, so that no loaded peer reads or writes the memory
 * after it returns and the caller may free it: blocking, at most the
 * agent's xfer timeout capped at 5 s (a peer that did not answer by then,
 * e.g. a paused one, is named in a warning; a dead peer counts as
 * answered). Agents of this same process are told but not waited for
 * (they may progress only on the calling thread). Peers this agent did not
 * load (it cannot reach them) are not waited for either: they learn it
 * from its next description (the store's republish, or the application's
 * reload), so keep memory such peers may still read mapped until then.
 * Progresses the agent while it waits (no progress thread needed); a peer
 * acknowledges from its own progress (its progress thread or its caller's
 * polling). Does not hold the agent lock while it waits. Thread-safe. */
PDX_API pdx_status_t pdx_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg);

/* Shared host memory: the fast path between processes on one host.
 *
 * Host memory from pdx_mem_alloc, or a caller's own MAP_SHARED mapping of a
 * file declared with pdx_mem_share, can be mapped by a peer on this host.
 * Register it with pdx_mem_register as usual (after allocating or sharing;
 * a region must lie inside one such range to count). The cma backend then
 * packs the memory's fd and offset in the region's key, the peer maps it
 * (pidfd_getfd, or /proc/<pid>/fd where that is refused) and a transfer
 * into or out of it is one memcpy by the initiator: no system call per
 * request, no CPU of the target. Where the peer cannot map it (another
 * user, a seccomp filter) it falls back to process_vm_readv/writev, and
 * over UCX nothing changes. Only the target side of a transfer needs to
 * be shared; the initiator's side may be any registered memory.
 *
 * A peer that maps the memory can read and write all of it until it
 * unloads this agent (as with process_vm_writev, only processes allowed to
 * ptrace this one can); the pages live until both sides unmap them.
 *
 * Thread-safe (one process-wide registry with its own lock); blocking
 * (system calls). None of these needs an agent. */

/* Allocate `len` bytes of zeroed shared memory (memfd_create, MAP_SHARED),
 * page aligned. `flags`: PDX_MEM_F_POPULATE faults every page in now.
 * The mapping is MADV_DONTFORK: a child made by fork() does not have it
 * (shared memory would otherwise be the parent's live bytes, not a copy).
 * The caller owns it: free with pdx_mem_free. PDX_ERR_NOMEM or
 * PDX_ERR_IO (with a log line) on failure; *ptr_p is written on success
 * only. */
PDX_API pdx_status_t pdx_mem_alloc(size_t len, uint64_t flags, void **ptr_p);
/* Free memory from pdx_mem_alloc (NULL is a no-op). PDX_ERR_BUSY (nothing
 * done) while any agent has a region registered inside it;
 * PDX_ERR_NOT_FOUND if `ptr` is not what pdx_mem_alloc returned. */
PDX_API pdx_status_t pdx_mem_free(void *ptr);
/* Declare that [addr, +len) is a MAP_SHARED mapping of `fd` whose byte at
 * `offset` is `addr` (so addr and offset agree modulo the page size). pdx
 * keeps its own dup of `fd`; the caller keeps the mapping alive until
 * pdx_mem_unshare. PDX_ERR_INVALID if fd is not a regular file that large,
 * PDX_ERR_EXISTS if the range overlaps one already known. */
PDX_API pdx_status_t pdx_mem_share(void *addr, size_t len, int fd,
                                   uint64_t offset);
/* Forget a range from pdx_mem_share (by its start). PDX_ERR_BUSY while a
 * region inside it is registered. */
PDX_API pdx_status_t pdx_mem_unshare(void *addr);

/* Serialise the agent's public metadata (name, generation, host id, pid,
 * each backend's connection info, each region with its keys, invariants)
 * into a new blob. `*blob_p` is malloc'd; free it with pdx_blob_free. */
PDX_API pdx_status_t pdx_agent_describe(pdx_agent_h agent, void **blob_p,
                                        size_t *len_p);
PDX_API void pdx_blob_free(void *blob);

/* pdx release string ("0.1.0"). */
PDX_API const char *pdx_version(void);

/* Decode a metadata blob into human-readable text (for pdx-info). On
 * success *text_p is malloc'd (free with pdx_blob_free); on failure `why`
 * names what is wrong and the status says how (PDX_ERR_CORRUPT, ...).
 * Pure function: no agent; thread-safe. */
PDX_API pdx_status_t pdx_blob_describe(const void *blob, size_t len,
                                       char **text_p, char *why,
                                       size_t why_len);

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

/* The file behind shared memory: the fd pdx keeps for [ptr, +len) (memory
 * from pdx_mem_alloc or declared with pdx_mem_share) and the file offset of
 * `ptr`, e.g. to hand the memory to a worker process (send the fd over a
 * unix socket, or /proc/<pid>/fd/<fd>) that maps it. The fd stays owned by
 * pdx (dup it to keep it past pdx_mem_free). PDX_ERR_NOT_FOUND if the range
 * is not such memory. Thread-safe; non-blocking. */
PDX_API pdx_status_t pdx_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                                uint64_t *offset_p);

/* Describe loaded peer `name` into *info_p (caller-owned) and, when
 * `regions` is not NULL, its first `max_regions` regions sorted by
 * (mem_type, addr). PDX_ERR_NOT_FOUND if unknown. Non-blocking (agent
 * lock only); any thread. */
PDX_API pdx_status_t pdx_peer_info(pdx_agent_h agent, const char *name,
                                   pdx_peer_info_t *info_p,
                                   pdx_region_info_t *regions,
                                   size_t max_regions);

/* Counters, per backend and per peer (a peer's survive its unloading and
 * reloading: they are kept by name for the agent's life). */
typedef struct pdx_stats {
    uint64_t requests;    /* posts */
    uint64_t completed;   /* posts that ended PDX_OK */
    uint64_t errors;      /* posts that ended in an error (not canceled) */
    uint64_t canceled;    /* aborted or released in flight */
    uint64_t timeouts;    /* ended PDX_ERR_TIMEOUT (also in errors) */
    uint64_t bytes;       /* bytes of completed posts */
    uint64_t fallbacks;   /* posts over a fallback path (see policy) */
    uint64_t refused;     /* requests refused by the path policy */
    uint64_t dead_events; /* times the peer was found dead */
    uint64_t notifs_sent;
    uint64_t notifs_recv;
    uint64_t reserved[5];
} pdx_stats_t;

/* Counters of backend `backend` ("ucx", "cma") or of peer `peer`.
 * PDX_ERR_NOT_FOUND if never seen. Non-blocking; any thread. */
PDX_API pdx_status_t pdx_stats_backend(pdx_agent_h agent, const char *backend,
                                       pdx_stats_t *stats_p);
PDX_API pdx_status_t pdx_stats_peer(pdx_agent_h agent, const char *peer,
                                    pdx_stats_t *stats_p);

/* Every counter of the agent, its peers (state, host, path of each
 * backend, last fallback reason) and backends as one JSON object, with a
 * "store" member when the agent has a store (reachable or unreachable
 * since when, lease, published generation, agents known, owner registry
 * calls; pdx/store.h) (malloc'd NUL-terminated text in *json_p; free with
 * pdx_blob_free). What `pdx-info --stats` prints for a running agent.
 * Non-blocking. */
PDX_API pdx_status_t pdx_stats_json(pdx_agent_h agent, char **json_p);

/* Invariants: key/value strings that travel in the blob; when a peer is
 * loaded every key set on both sides must match, and a key set on only one
 * side is a mismatch too. Set them before describing. Copies both strings.
 * Keys up to 63 bytes, values up to 255. */
PDX_API pdx_status_t pdx_agent_set_invariant(pdx_agent_h agent,
                                             const char *key,
                                             const char *value);

/* Drive every backend once, check liveness and timeouts, answer
 * `pdx-info --stats` when no progress thread does. Returns events handled
 * (>= 0), or PDX_ERR_INVALID (negative) for a bad handle. Non-blocking.
 * Any thread. */
PDX_API int pdx_progress(pdx_agent_h agent);

/* An fd (an epoll fd over the agent's eventfd and every backend's event
 * fd) that becomes readable when the agent has notifications or
 * completions to report or a backend has work for pdx_progress; for stacks
 * that wait in epoll/poll, with a progress thread or without: wait, then
 * call pdx_progress and pdx_notif_poll (pdx_progress re-arms the
 * backends; with a thread, a caller that checks its request once and then
 * sleeps here wakes on the backend's event, not on the thread's next nap).
 * Owned by the agent; do not read or close it. */
PDX_API int pdx_agent_event_fd(pdx_agent_h agent);

#ifdef __cplusplus
}
#endif
#endif
