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
 * megabytes; docs/BENCH-LOG.md has what that took): other calls that need a
 * backend wait for that one call at most (their contracts say "on the
 * agent lock"); pdx_peer_state, pdx_notif_poll, the stats reads and
 * pdx_xfer_check never wait for it. What runs under the lock is
 * short: a request check (UCX O(1); cma copies at most one 512 KiB
 * half-chunk), a make, liveness and timeout sweeps. pdx_xfer_check
 * progresses its request's backend itself (one call, without the lock,
 * bounded to ~0.5 ms of UCX work) when no other thread is in a backend,
 * with or without a progress thread; pdx_notif_poll progresses every
 * backend only without a progress thread (the thread does, woken by
 * their events). Transfers to other peers carry on meanwhile;
 * tests/system/faults/stall.c checks the bound, and docs/BENCH-LOG.md ("Figures
 * from the public headers") has what it measured.
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
 * across fork (pthread_atfork), so a child never hangs on one.
 *
 * The objects an agent owns have a header each, included at the end of
 * this one: backend instances (pdx/backend_instance.h), memory
 * (pdx/mem.h), peers (pdx/peer.h), blobs (pdx/blob.h), counters
 * (pdx/stats.h); include/pdx/README.md lists every header and the form of
 * the contract block each function below carries. */
#ifndef PDX_AGENT_H
#define PDX_AGENT_H

#include <pdx/export.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_agent *pdx_agent_h;

enum pdx_agent_params_field {
    PDX_AGENT_PARAM_FLAGS = 1u << 0,
    PDX_AGENT_PARAM_XFER_TIMEOUT = 1u << 1,
    PDX_AGENT_PARAM_PROGRESS_INTERVAL = 1u << 2,
    PDX_AGENT_PARAM_PATH_POLICY = 1u << 3,
    PDX_AGENT_PARAM_STORE = 1u << 4, /* the store_* fields */
    PDX_AGENT_PARAM_CLUSTER_KEY = 1u << 5, /* the cluster_key* fields */
    PDX_AGENT_PARAM_STORE_OPTS = 1u << 6,  /* store_opts, store_nopts */
    PDX_AGENT_PARAM_PATH_BACKEND = 1u << 7, /* path_backend */
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
 * warning with the reason. Host memory of a same-host peer that cma cannot
 * map has two fallbacks, process_vm_readv/writev and UCX: each class of
 * requests (op, size, one or many descriptors) takes the one that measured
 * cheaper on this peer (a few posts of each at first use, then a probe now
 * and then), unless a backend is pinned (path_backend below). */
typedef enum pdx_path_policy {
    /* Fallbacks are allowed (the default). */
    PDX_PATH_POLICY_ANY = 0,
    /* Same-host peers must use the fast path: making a request that would
     * fall back fails with PDX_ERR_POLICY, and pdx_last_error() says why
     * the fast path was refused (e.g. "peer glm52-p-dp0 (same host):
     * region 0x7f..+1048576 is not shared memory: process_vm would carry
     * it"). */
    PDX_PATH_POLICY_SAME_HOST_FAST = 1,
    /* What SAME_HOST_FAST refuses, and GPU memory staged through host
     * memory to or from a peer on any host (a UCX without CUDA support):
     * only the GPU's native paths (cuda_ipc, UCX carrying CUDA memory). */
    PDX_PATH_POLICY_NATIVE = 2,
} pdx_path_policy_t;

/* Run a progress thread that drives every backend, checks peer liveness and
 * delivers notifications, so a peer that never polls still completes work.
 *
 * How it waits: idle, it sleeps on one epoll set (each backend's armed event
 * fd: UCX's ucp_worker_get_efd + ucp_worker_arm; peers' pidfds; the stats
 * socket; a wake fd for posts and loads), at most 100 ms (housekeeping), 1
 * ms with requests in flight (their timeouts). A message wakes it: a peer's
 * request is served without this process calling pdx. Two bursts of activity
 * within 1 ms (a peer's stream of small requests) make it poll without
 * system calls until 1 ms after the last, so the next one is served at UCX's
 * own latency rather than a wake-up's; a lone message (a keepalive) does
 * not. (What an idle agent and a wake-up cost: docs/BENCH-LOG.md.) While a
 * caller polls pdx_xfer_check, the caller progresses the request's backend
 * itself and the thread keeps out of that backend: it naps on the pidfds,
 * the stats socket and the wake fd, 1 ms at a time, doubling up to 8 ms
 * while a caller spins (20 or more checks a ms), and takes the agent lock
 * only when housekeeping is due (a request deadline, a peer's exit, every 10
 * ms; every nap while another backend or request needs it). So after a
 * spinning caller stops, a backend it progressed can wait up to 8 ms for the
 * thread (less than the spin had lasted). Requests in flight on a backend
 * without an event fd (cma, polled) make it pause progress_interval_us
 * between passes.
 *
 * Liveness: a peer on this host is watched through a pidfd (its death fails
 * its requests with PDX_ERR_REMOTE_DISCONNECT at the next progress, within
 * about a millisecond, and its connections are force-closed); a peer
 * elsewhere through its backend's connection errors (UCX peer error
 * handling: a killed process's RST over TCP; over RDMA, UCX keepalive, 5 s
 * by default: the ucx option keepalive_ms). A hung peer (alive but not
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
    /* Pin a backend (PDX_AGENT_PARAM_PATH_BACKEND): every request takes
     * the backend of this name ("ucx", "cma", ...) where it reaches the
     * peer and both regions and does the op, whatever it costs; others go
     * by the usual choice. Without the bit, $PDX_PATH_BACKEND in the
     * environment, if set. NULL or "": no pin. Copied at create. The path
     * policy still applies: a pinned fallback it forbids is refused. */
    const char *path_backend;
} pdx_agent_params_t;

/* Create an agent: its event fds, the stats socket, the progress thread
 * when PDX_AGENT_F_PROGRESS_THREAD is set, the cluster key and the store
 * when their params are set.
 *
 * @param [in]  name     1..PDX_NAME_MAX-1 bytes of [A-Za-z0-9._-]; the
 *                       agent's name in every blob and log line.
 * @param [in]  params   NULL for the defaults; fields outside
 *                       params->field_mask take theirs.
 * @param [out] agent_p  The new agent; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID (bad name or path policy, NULL agent_p,
 *         a cluster key out of range, a store without endpoints),
 *         PDX_ERR_CONFIG (unreadable cluster key file, bad store params),
 *         PDX_ERR_NOMEM, PDX_ERR_IO (an fd or the thread could not be
 *         made), or the store module's error (PDX_ERR_NOT_FOUND,
 *         PDX_ERR_VERSION, PDX_ERR_UNAVAILABLE) as pdx_backend_create
 *         reports a backend's.
 * Owns: the caller keeps `name` and `params` and all they point to (copied:
 *       strings and key bytes at create; store_opts only read during the
 *       call); *agent_p is the caller's, freed with pdx_agent_destroy.
 * Blocks: yes: system calls of the setup, reading the cluster key file,
 *       loading the store module and starting its threads (the store
 *       itself is not waited for), starting the progress thread.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_agent_create(const char *name,
                                      const pdx_agent_params_t *params,
                                      pdx_agent_h *agent_p);

/* Destroy an agent: stop the progress thread and the store, release every
 * request (aborting what is in flight), unload peers, deregister memory,
 * destroy backends. Agents of this process that loaded this one find it
 * dead at their next liveness pass. The process can exit normally
 * afterwards.
 *
 * @param [in] agent  The agent; NULL does nothing, and so does an agent
 *                    inherited across fork() (see "fork()" above).
 * Owns: frees the agent and everything it owns: its backend instances,
 *       registrations (the memory stays the caller's), peers, counters and
 *       the requests the caller did not release (logged). Prepared lists
 *       are not among them: release them before (pdx_dlist_release needs
 *       the agent). Every handle of the agent is dead afterwards.
 * Blocks: yes, bounded whatever the peers do (dead, hung or timed out):
 *       the progress thread's exit; each request still in flight waits
 *       until no byte of it can land (UCX gives a silent peer ~1 s without
 *       progress; 10 s at most, as pdx_xfer_release); then each backend at
 *       most ~1.2 s for its connections to close (UCX: an endpoint whose
 *       flush a hung peer never finishes is forced closed at that
 *       deadline); the store's lease revocation (store_timeout_ms).
 * Threads: any thread but a callback pdx runs for this agent (a
 *       notification callback of pdx_notif_poll); no other call on this
 *       agent, its requests or its lists may be in progress or follow.
 */
PDX_API void pdx_agent_destroy(pdx_agent_h agent);

/* The agent's name, as given to pdx_agent_create.
 *
 * @param [in] agent  The agent.
 * @return The name; NULL for a bad handle.
 * Owns: the name is the agent's, valid until pdx_agent_destroy.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_agent_name(pdx_agent_h agent);

/* Set an invariant: a key/value string pair that travels in the agent's
 * blob. When a peer is loaded, every key set on both sides must match, and
 * a key set on only one side is a mismatch too (PDX_ERR_MISMATCH from
 * pdx_peer_load). Set them before describing (pdx_agent_describe): each
 * set bumps the agent's generation, so a store publishes the agent again.
 * Setting a key again replaces its value.
 *
 * @param [in] agent  The agent.
 * @param [in] key    1..63 bytes of printable ASCII.
 * @param [in] value  0..255 bytes of printable ASCII.
 * @return PDX_OK; PDX_ERR_INVALID (empty, too long or not printable);
 *         PDX_ERR_TOO_LARGE when the agent already has 32 other keys.
 * Owns: the caller keeps `key` and `value` (copied).
 * Blocks: on the agent lock.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_agent_set_invariant(pdx_agent_h agent,
                                             const char *key,
                                             const char *value);

/* Drive the agent once: every backend's progress (its callbacks: messages,
 * a peer's connection errors), peer liveness, request completions and
 * timeouts, region-removal acknowledgements; re-arm the backends' event
 * fds; and answer `pdx-info --stats` when no progress thread does. A
 * caller without a progress thread calls it (or pdx_notif_poll, or
 * pdx_xfer_check) to make anything move; with one it is not needed.
 *
 * @param [in] agent  The agent.
 * @return Events handled (>= 0); PDX_ERR_INVALID (negative) for a bad
 *         handle.
 * Owns: nothing.
 * Blocks: on the agent lock; then one progress call of each backend, made
 *       without the lock (UCX: about 0.5 ms of work), and a check of each
 *       request in flight under it (cma copies at most one 512 KiB
 *       half-chunk each); no backend call when another thread is
 *       progressing one at that moment (its pass covers this one).
 * Threads: any thread, concurrently with any call on the agent.
 */
PDX_API int pdx_progress(pdx_agent_h agent);

/* An fd (an epoll fd over the agent's eventfd and every backend's event
 * fd) that becomes readable when the agent has notifications or
 * completions to report or a backend has work for pdx_progress; for stacks
 * that wait in epoll/poll, with a progress thread or without: wait, then
 * call pdx_progress and pdx_notif_poll (pdx_progress re-arms the
 * backends; with a thread, a caller that checks its request once and then
 * sleeps here wakes on the backend's event, not on the thread's next nap).
 *
 * @param [in] agent  The agent.
 * @return The fd; PDX_ERR_INVALID (negative) for a bad handle.
 * Owns: the fd is the agent's, open until pdx_agent_destroy: wait on it,
 *       do not read or close it.
 * Blocks: no.
 * Threads: any thread; any number may wait on the fd at once.
 */
PDX_API int pdx_agent_event_fd(pdx_agent_h agent);

/* The pdx release this library is ("0.1.0").
 *
 * @return The release string.
 * Owns: a static string of the library's; never freed.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_version(void);

#ifdef __cplusplus
}
#endif

/* The objects an agent owns, each in its own header (include/pdx/README.md):
 * including pdx/agent.h gives them all, as it did before they moved. */
#include <pdx/backend_instance.h>
#include <pdx/blob.h>
#include <pdx/mem.h>
#include <pdx/peer.h>
#include <pdx/stats.h>

#endif
