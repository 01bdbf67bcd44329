/* pdx backend ABI: the one table a transport module exports.
 *
 * A backend module is `libpdx_backend_<name>.so` and exports exactly one
 * symbol, `pdx_backend_v1`, a `const pdx_backend_ops_t`. The loader checks
 * `abi_version` and `size` before touching anything else. The table is
 * append-only: a newer loader checks `size > offsetof(pdx_backend_ops_t, op)`
 * before calling an op added later. Every op is wired (an op the backend
 * cannot do returns PDX_ERR_UNSUPPORTED), and `caps` matches what is wired.
 *
 * Threading: the agent serialises every call into one backend instance, so
 * a backend needs no locking of its own for calls made through this table;
 * it may be called from different threads (the caller's and the progress
 * thread), never from two at once. Every op but `progress` and
 * `xfer_post` is called with the agent's lock held; `progress`, and
 * `xfer_post` of a request over 64 KiB, are called without it (so a long
 * call, UCX copying megabytes, stalls no other thread's agent calls), but
 * still never at the same time as any other op of any backend of that
 * agent. Callbacks made during a call without the lock are queued by the
 * agent and handled once it returns; those made during other ops are
 * handled at once. `query` alone is also called without any agent
 * (pdx_backend_probe). Callbacks
 * in pdx_backend_host_t must be invoked only from inside a call the agent
 * made into the backend (typically progress), never from a thread of the
 * backend's own. A callback may call back into the backend (peer_error
 * releases that peer's requests from inside progress): ops must tolerate
 * that re-entry.
 *
 * Memory: buffers a backend returns through `void **buf_p` are malloc'd and
 * freed by the agent with free(). */
#ifndef PDX_BACKEND_H
#define PDX_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/log.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_BACKEND_ABI_VERSION 1u
#define PDX_BACKEND_SYMBOL "pdx_backend_v1"

/* Capabilities; a backend advertises exactly what it wires. */
#define PDX_BACKEND_CAP_DRAM (1ull << 0)      /* registers host memory */
#define PDX_BACKEND_CAP_VRAM (1ull << 1)      /* registers GPU memory */
#define PDX_BACKEND_CAP_READ (1ull << 2)      /* xfer_post with READ */
#define PDX_BACKEND_CAP_WRITE (1ull << 3)     /* xfer_post with WRITE */
#define PDX_BACKEND_CAP_NOTIF (1ull << 4)     /* carries notifications */
#define PDX_BACKEND_CAP_SAME_HOST (1ull << 5) /* peers on this host only */
#define PDX_BACKEND_CAP_EVENT_FD (1ull << 6)  /* event_fd/arm work */

/* pdx_region_t (a region to register, or a peer's region to load) is in
 * pdx/types.h, included above. */

/* One merged piece of a transfer. `local_md` is what mem_register returned
 * for the local region holding [local_addr, +len); `remote_md` what
 * rmem_load returned for the peer's region holding [remote_addr, +len). */
typedef struct pdx_backend_iov {
    uint64_t local_addr;
    uint64_t remote_addr;
    uint64_t len;
    void *local_md;
    void *remote_md;
} pdx_backend_iov_t;

/* What the agent gives a backend at creation. All pointers stay valid until
 * destroy returns. */
typedef struct pdx_backend_host {
    void *agent_ctx;
    const char *agent_name;
    const char *host_id; /* stable id of this host (boot id based) */
    /* A notification from `peer_name` arrived; `msg` is valid for the call
     * only. Call only from within progress/xfer_check. */
    void (*notif_recv)(void *agent_ctx, const char *peer_name,
                       const void *msg, size_t len);
    /* The connection to `peer_name` failed (endpoint error): the agent fails
     * that peer's requests with `why`. Call only from within an op. */
    void (*peer_error)(void *agent_ctx, const char *peer_name,
                       pdx_status_t why);
} pdx_backend_host_t;

typedef struct pdx_backend_ops {
    uint32_t abi_version; /* PDX_BACKEND_ABI_VERSION */
    uint32_t size;        /* sizeof(pdx_backend_ops_t) of the module */
    const char *name;     /* "ucx", "cuda_ipc" */
    uint64_t caps;        /* PDX_BACKEND_CAP_* */

    /* Can this backend run here? Needs no instance: called before create,
     * and by pdx_backend_probe without any agent.
     *
     * @param [out] why      The reason when it cannot (e.g. "no CUDA
     *                       driver").
     * @param [in]  why_len  Bytes of `why`.
     * @return PDX_OK, or PDX_ERR_UNAVAILABLE with the reason in `why`.
     * Owns: the caller keeps `why`.
     * Blocks: no.
     * Threads: any thread, concurrently with anything.
     */
    pdx_status_t (*query)(char *why, size_t why_len);

    /* Make an instance.
     *
     * @param [in]  host   The agent's callbacks and names.
     * @param [in]  opts   Backend-specific key/values (nopts of them); an
     *                     unknown key is PDX_ERR_CONFIG with a log line
     *                     naming it.
     * @param [in]  nopts  Number of opts.
     * @param [out] be_p   The instance.
     * @return PDX_OK; PDX_ERR_CONFIG for a bad option; any other error
     *         (its library failed: PDX_ERR_BACKEND, PDX_ERR_NOMEM, ...)
     *         fails pdx_backend_create with it.
     * Owns: `host` and what it points to stay valid until destroy returns;
     *       `opts` is read during the call only; *be_p is the module's,
     *       freed by destroy.
     * Blocks: may (setting up its library: UCX's context and worker).
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*create)(const pdx_backend_host_t *host,
                           const pdx_option_t *opts, size_t nopts,
                           void **be_p);

    /* Destroy an instance; every md, peer, rmd and request was released
     * before.
     *
     * @param [in] be  The instance.
     * Owns: frees the instance.
     * Blocks: bounded whatever the peers do (UCX: at most ~1.2 s for its
     *       connections to close, forcing those a hung peer keeps open).
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*destroy)(void *be);

    /* Connection info a peer needs to reach us (opaque, portable bytes),
     * for the agent's blob.
     *
     * @param [in]  be     The instance.
     * @param [out] buf_p  The bytes.
     * @param [out] len_p  Their length.
     * @return PDX_OK, or an error that fails the description.
     * Owns: *buf_p is malloc'd by the module and freed by the agent with
     *       free().
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*conn_info)(void *be, void **buf_p, size_t *len_p);

    /* Register a local region once.
     *
     * @param [in]  be      The instance.
     * @param [in]  region  The region; with PDX_REGION_F_SHARED its shm_fd
     *                      stays open while it is registered.
     * @param [out] md_p    The module's private handle of it.
     * @return PDX_OK; PDX_ERR_UNSUPPORTED means "not this region" (the
     *         agent registers it with the other backends); other errors
     *         fail the registration.
     * Owns: `region` is read during the call (the module copies what it
     *       keeps); *md_p is the module's, freed by mem_deregister.
     * Blocks: may (registering memory with its library: pinning, IPC
     *       handles).
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*mem_register)(void *be, const pdx_region_t *region,
                                 void **md_p);

    /* Drop a registration; requests using it were released before.
     *
     * @param [in] be  The instance.
     * @param [in] md  What mem_register returned.
     * Owns: frees `md`.
     * Blocks: may (deregistering with its library); never waits for a
     *       peer.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*mem_deregister)(void *be, void *md);

    /* Public key of a registered region for the peer (e.g. packed rkey).
     *
     * @param [in]  be     The instance.
     * @param [in]  md     What mem_register returned.
     * @param [out] buf_p  The key's bytes.
     * @param [out] len_p  Their length.
     * @return PDX_OK, or an error that fails the description.
     * Owns: *buf_p is malloc'd by the module and freed by the agent with
     *       free().
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*mem_pack)(void *be, void *md, void **buf_p, size_t *len_p);

    /* Connect to a peer from its conn_info. A backend may validate the
     * bytes here and connect at the peer's first use instead (ucx with
     * connect=lazy); a peer it then cannot reach fails xfer_post,
     * notif_send and later rmem_load calls with PDX_ERR_UNSUPPORTED,
     * without a peer_error (it is not dead).
     *
     * @param [in]  be         The instance.
     * @param [in]  peer_name  The peer's name (for log lines and
     *                         callbacks).
     * @param [in]  conn       The peer's conn_info bytes.
     * @param [in]  conn_len   Their length.
     * @param [out] peer_p     The module's handle of the peer.
     * @return PDX_OK; PDX_ERR_UNSUPPORTED means the backend declines this
     *         peer (other host): the agent uses another; other errors
     *         refuse the peer.
     * Owns: `peer_name` and `conn` are read during the call (copied);
     *       *peer_p is the module's, freed by peer_disconnect.
     * Blocks: may, for connection setup (UCX: creating the endpoint), but
     *       never waits for the peer to answer.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*peer_connect)(void *be, const char *peer_name,
                                 const void *conn, size_t conn_len,
                                 void **peer_p);

    /* Drop a peer; every request and rmd on it was released before.
     *
     * @param [in] be    The instance.
     * @param [in] peer  What peer_connect returned.
     * Owns: the agent never uses `peer` again; the module frees it,
     *       closing its connection in the background if it must (at
     *       destroy at the latest).
     * Blocks: no: closing the connection must not wait for the peer.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*peer_disconnect)(void *be, void *peer);

    /* Load a peer's region key (from mem_pack on the peer's side).
     *
     * @param [in]  be       The instance.
     * @param [in]  peer     What peer_connect returned.
     * @param [in]  region   The peer's region (its addresses; shm_fd -1:
     *                       the key says more).
     * @param [in]  key      The key's bytes.
     * @param [in]  key_len  Their length.
     * @param [out] rmd_p    The module's handle of the remote region.
     * @return PDX_OK; PDX_ERR_UNSUPPORTED means this backend cannot reach
     *         that region (the agent leaves it to others); other errors
     *         refuse the peer.
     * Owns: `region` and `key` are read during the call; *rmd_p is the
     *       module's, freed by rmem_unload.
     * Blocks: may (unpacking a key, mapping shared memory); never waits
     *       for the peer.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*rmem_load)(void *be, void *peer, const pdx_region_t *region,
                              const void *key, size_t key_len, void **rmd_p);

    /* Drop a remote region; requests using it were released before.
     *
     * @param [in] be   The instance.
     * @param [in] rmd  What rmem_load returned.
     * Owns: frees `rmd`.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*rmem_unload)(void *be, void *rmd);

    /* Start a transfer of `n` merged pieces with `peer`. If `notif` is not
     * NULL and the backend has CAP_NOTIF, deliver it to the peer after every
     * byte has landed; without CAP_NOTIF it is ignored (the agent sends it).
     * A request's notification goes out after its data, so a standalone
     * notif_send made after xfer_post may arrive first.
     *
     * @param [in]  be         The instance.
     * @param [in]  peer       What peer_connect returned.
     * @param [in]  op         PDX_XFER_READ or PDX_XFER_WRITE.
     * @param [in]  iov        The pieces (n of them).
     * @param [in]  n          Number of pieces.
     * @param [in]  notif      The notification, or NULL.
     * @param [in]  notif_len  Its length.
     * @param [out] req_p      The module's request, with PDX_INPROGRESS.
     * @return PDX_OK when already complete (no request); PDX_INPROGRESS
     *         with `*req_p` set; or an error: nothing in flight for READ;
     *         for WRITE, pieces posted before the failure may still land.
     * Owns: `iov` is read during the call only; `notif` stays valid until
     *       the agent releases the request (for the call only when it
     *       returns PDX_OK); *req_p is the module's, freed by
     *       xfer_release.
     * Blocks: never waits for the peer; may copy what fits (UCX over sm or
     *       tcp).
     * Threads: the agent's, never with another op of its backends at the
     *       same time; with the agent lock held for a request of up to
     *       64 KiB, without it for a larger one (callbacks are then queued,
     *       as during progress).
     */
    pdx_status_t (*xfer_post)(void *be, void *peer, pdx_xfer_op_t op,
                              const pdx_backend_iov_t *iov, size_t n,
                              const void *notif, size_t notif_len,
                              void **req_p);

    /* A request's state. The agent calls `progress` before it when it
     * wants completions moved along, so a check need not progress (UCX's
     * does not: it is O(1) under the agent lock). For an aborted request,
     * the end means no byte of it can land any more: a backend that waits
     * for that (UCX draining gets) gives up after a bounded time by
     * failing the peer and force-closing its connection, and reports that.
     *
     * @param [in] be   The instance.
     * @param [in] req  What xfer_post returned.
     * @return PDX_OK (done, notification sent), PDX_INPROGRESS, or an
     *         error.
     * Owns: nothing.
     * Blocks: no (cma copies at most one 512 KiB half-chunk of the
     *       request here).
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*xfer_check)(void *be, void *req);

    /* Free a request; aborts it if still in flight. The agent releases an
     * in-flight request only after xfer_abort and xfer_check reported its
     * end, unless the peer failed or the request failed: then bytes of a
     * READ may still land until the connection is closed (UCX 1.13 cannot
     * cancel emulated RMA).
     *
     * @param [in] be   The instance.
     * @param [in] req  What xfer_post returned.
     * Owns: frees `req`.
     * Blocks: bounded, never waiting for the peer (cma waits at most for
     *       the chunk or system call being copied).
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*xfer_release)(void *be, void *req);

    /* Send a standalone notification; it may be queued.
     *
     * @param [in] be    The instance.
     * @param [in] peer  What peer_connect returned.
     * @param [in] msg   The message.
     * @param [in] len   Its length.
     * @return PDX_OK (sent or queued), or an error.
     * Owns: `msg` is read during the call only (the module copies what it
     *       queues).
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*notif_send)(void *be, void *peer, const void *msg,
                               size_t len);

    /* Make progress: move requests along, receive messages (notif_recv)
     * and connection errors (peer_error), close connections in the
     * background.
     *
     * @param [in] be  The instance.
     * @return The number of events handled (0 if idle).
     * Owns: nothing.
     * Blocks: no; one call should stay short (UCX stops after about 0.5 ms
     *       of work).
     * Threads: the agent's, WITHOUT its lock, never with another op of its
     *       backends at the same time; callbacks made during it are queued
     *       and handled once it returns.
     */
    int (*progress)(void *be);

    /* An fd that becomes readable when progress has work.
     *
     * @param [in] be  The instance.
     * @return The fd, or -1 without CAP_EVENT_FD.
     * Owns: the fd is the module's, open until destroy; the agent only
     *       waits on it.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    int (*event_fd)(void *be);

    /* Arm the event fd before waiting on it.
     *
     * @param [in] be  The instance.
     * @return PDX_OK armed; PDX_ERR_BUSY if events are pending (call
     *         progress first); PDX_ERR_UNSUPPORTED.
     * Owns: nothing.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*arm)(void *be);

    /* One line of human-readable detail about the instance (e.g. the UCX
     * transports in use).
     *
     * @param [in]  be   The instance.
     * @param [out] buf  The line, NUL-terminated, truncated to `len`.
     * @param [in]  len  Bytes of `buf`.
     * Owns: the caller keeps `buf`.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*describe)(void *be, char *buf, size_t len);

    /* Added after the first table (check size > offsetof before use). */

    /* Ask an in-flight request to stop, without waiting: no notification
     * is sent for it, and xfer_check goes on returning PDX_INPROGRESS until
     * no byte of it can land any more, then PDX_ERR_CANCELED (or the error
     * that ended it).
     *
     * @param [in] be   The instance.
     * @param [in] req  What xfer_post returned.
     * @return PDX_OK (asked); an error makes the agent release the request
     *         instead.
     * Owns: nothing.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*xfer_abort)(void *be, void *req);

    /* How transfers with region `rmd` of `peer` move, for the path report
     * and the path policy.
     *
     * @param [in]  be         The instance.
     * @param [in]  peer       What peer_connect returned.
     * @param [in]  rmd        What rmem_load returned; NULL: the peer as a
     *                         whole.
     * @param [out] transport  A short transport name ("memcpy",
     *                         "process_vm", "sysv/memory,tcp/lo",
     *                         "cuda_ipc").
     * @param [in]  tlen       Bytes of `transport`.
     * @param [out] why        With PDX_ERR_UNAVAILABLE, the reason ("region
     *                         not in shared memory on the peer",
     *                         "pidfd_getfd: Operation not permitted").
     * @param [in]  wlen       Bytes of `why`.
     * @return PDX_OK when that is this backend's fast path;
     *         PDX_ERR_UNAVAILABLE when it is its fallback.
     * Owns: the caller keeps `transport` and `why`.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    pdx_status_t (*path)(void *be, void *peer, void *rmd, char *transport,
                         size_t tlen, char *why, size_t wlen);

    /* The agent knows `peer` is gone (its process exited): end its
     * requests with PDX_ERR_REMOTE_DISCONNECT and drop or force-close its
     * connection without waiting for anything.
     *
     * @param [in] be    The instance.
     * @param [in] peer  What peer_connect returned; it stays valid until
     *                   peer_disconnect.
     * Owns: nothing.
     * Blocks: no.
     * Threads: the agent's, with its lock held, never with another op of
     *       its backends at the same time.
     */
    void (*peer_failed)(void *be, void *peer);
} pdx_backend_ops_t;

/* Oldest table a loader accepts: everything up to `describe`. */
#define PDX_BACKEND_OPS_MIN_SIZE                                               \
    (offsetof(pdx_backend_ops_t, describe) + sizeof(void (*)(void)))

_Static_assert(offsetof(pdx_backend_ops_t, abi_version) == 0,
               "abi_version first");
_Static_assert(offsetof(pdx_backend_ops_t, size) == 4, "size second");

#ifdef __cplusplus
}
#endif
#endif
