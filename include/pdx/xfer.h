/* pdx transfer requests: plain (descriptor lists) and prepared (lists
 * prepared once, requests made from index selections).
 *
 * Life cycle: create/make -> post -> check until not INPROGRESS -> release.
 * A request may be posted again after it completed (same lists). Release
 * aborts in-flight work. All calls are thread-safe (agent lock), but one
 * request must not be used by two threads at once. */
#ifndef PDX_XFER_H
#define PDX_XFER_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_xfer *pdx_xfer_h;
typedef struct pdx_dlist *pdx_dlist_h;

#define PDX_NOTIF_MAX 4096 /* bytes of one notification message */

/* Build a request: `op` between `local` (this agent's registered memory) and
 * `remote` (regions of peer `peer`), element i of one with element i of the
 * other; lengths must match pairwise. Adjacent pairs that are contiguous on
 * both sides are merged. `notif` (may be NULL, <= PDX_NOTIF_MAX bytes) is
 * delivered to the peer after every byte has landed; one that starts with
 * the 8 bytes "\0PDXCTL\1" (pdx's own control messages) is refused
 * (PDX_ERR_INVALID). Copies what it needs. Fails with PDX_ERR_NOT_FOUND
 * naming the unregistered address (also one in a region the peer has
 * since deregistered: requests made before that end PDX_ERR_STALE),
 * PDX_ERR_INVALID, or, under the path policy
 * PDX_PATH_POLICY_SAME_HOST_FAST (pdx/agent.h), PDX_ERR_POLICY with the
 * reason the fast path was refused. Blocking only on the agent lock. */
PDX_API pdx_status_t pdx_xfer_create(pdx_agent_h agent, pdx_xfer_op_t op,
                                     const pdx_desc_list_t *local,
                                     const pdx_desc_list_t *remote,
                                     const char *peer, const void *notif,
                                     size_t notif_len, pdx_xfer_h *xfer_p);

/* Post; never blocks (see "Bounded calls" in pdx/agent.h). PDX_OK if
 * already complete, PDX_INPROGRESS, or an error (PDX_ERR_STALE when the
 * peer was reloaded since creation or removed a region the request uses
 * (pdx_mem_deregister tells loaded peers), PDX_ERR_REMOTE_DISCONNECT when
 * it is dead, PDX_ERR_BUSY while the previous post is still in flight or
 * still being stopped after it failed). */
PDX_API pdx_status_t pdx_xfer_post(pdx_xfer_h xfer);

/* State of the last post: PDX_OK, PDX_INPROGRESS or the error (then
 * pdx_last_error() names the peer and why: "peer process exited", timed
 * out, ...). It progresses the request's backend itself (one bounded
 * call), progress thread or not, so a polling caller sees a completion at
 * the backend's own latency; without a progress thread it also runs the
 * rest of the agent's progress at most every 0.1 ms. When another thread
 * is in a backend at that moment it only looks. Never blocks: it never
 * waits for another thread's backend call (see "Bounded calls" in
 * pdx/agent.h). */
PDX_API pdx_status_t pdx_xfer_check(pdx_xfer_h xfer);

/* Ask an in-flight request to stop, without waiting (the agent lock is
 * not held while the peer finishes): its notification is not sent, and
 * pdx_xfer_check keeps returning PDX_INPROGRESS until no byte of it can
 * land any more, then PDX_ERR_CANCELED (or PDX_OK if it had completed
 * first, or the error that ended it). Only then is the local memory of a
 * READ the caller's again. PDX_OK also when nothing is in flight.
 * Non-blocking (backends without the op fall back to a blocking release). */
PDX_API pdx_status_t pdx_xfer_abort(pdx_xfer_h xfer);

/* Free the request. A request still in flight (PDX_INPROGRESS) is aborted
 * and release blocks until the backend says no byte of it can land any
 * more, without holding the agent lock (other threads and peers carry
 * on); bounded: UCX gives a silent peer 1 s without progress, then fails
 * it; 10 s at most in all. A request that already ended (done, failed,
 * timed out, peer dead) is freed at once; for a READ that ended in an
 * error, bytes from a hung peer may still land in its local memory until
 * that peer is unloaded (UCX 1.13 cannot cancel emulated RMA): reload the
 * peer before reusing those buffers. To stop a request without blocking,
 * pdx_xfer_abort then pdx_xfer_check until it ends, then release. A NULL
 * handle is a no-op; a released one is refused (logged). */
PDX_API void pdx_xfer_release(pdx_xfer_h xfer);

/* Replace the notification a request delivers (NULL: none) before its next
 * post (NIXL's transfer(handle, notif_msg)). PDX_ERR_BUSY while the
 * request is in flight; PDX_ERR_TOO_LARGE over PDX_NOTIF_MAX;
 * PDX_ERR_INVALID for pdx's reserved prefix (see pdx_xfer_create). Copies
 * `msg`. Non-blocking. */
PDX_API pdx_status_t pdx_xfer_set_notif(pdx_xfer_h xfer, const void *msg,
                                        size_t len);

/* Descriptors after merging (for tools and tests); 0 for an invalid
 * handle. */
PDX_API size_t pdx_xfer_segments(pdx_xfer_h xfer);

/* What moved a request (NIXL's transfer telemetry, plus the path). */
typedef struct pdx_xfer_telemetry {
    char backend[16];    /* "ucx", "cma", "cuda_ipc" */
    /* How the backend moves it: cma "memcpy" (mapped shared memory) or
     * "process_vm" (or both, "memcpy+process_vm"); UCX the transports of
     * the endpoint's lanes ("sysv/memory,tcp/lo"); "cuda_ipc". */
    char transport[64];
    bool fallback;       /* see pdx_path_policy_t */
    char fallback_why[160]; /* why the fast path was not taken, or "" */
    pdx_status_t status; /* as pdx_xfer_check last reported */
    uint64_t descs;      /* descriptors the request was made from */
    uint64_t segments;   /* after merging */
    uint64_t bytes;
    uint64_t posts;      /* times posted */
    /* Of the last post: wall clock (CLOCK_REALTIME, ns since the epoch)
     * when it started, how long pdx_xfer_post took, and post to the
     * completion pdx observed (0 while in flight or never posted). */
    uint64_t start_time_ns;
    uint64_t post_duration_ns;
    uint64_t xfer_duration_ns;
} pdx_xfer_telemetry_t;

/* Fill *tel_p (caller-owned). Non-blocking; any thread (agent lock). */
PDX_API pdx_status_t pdx_xfer_telemetry(pdx_xfer_h xfer,
                                        pdx_xfer_telemetry_t *tel_p);

/* Prepare a descriptor list once: local (`peer` NULL: this agent's memory)
 * or remote (`peer`'s regions). Every descriptor is resolved to its region
 * now, so make costs no lookups. A remote list outlives reloads of the
 * same peer instance (pdx_peer_load: a new generation, a revival) as long
 * as the regions it uses are unchanged; pdx_xfer_make of a pair in a
 * region the peer removed or changed, or from a list of an unloaded or
 * restarted peer, is PDX_ERR_STALE. Blocking only on the agent lock. */
PDX_API pdx_status_t pdx_dlist_prepare(pdx_agent_h agent, const char *peer,
                                       const pdx_desc_list_t *list,
                                       pdx_dlist_h *dlist_p);
PDX_API void pdx_dlist_release(pdx_dlist_h dlist);

/* Make a request from `n` indices into two prepared lists (the local
 * prepared list `local` and the remote one `remote`); runs of indices whose
 * memory is contiguous on both sides are merged. */
PDX_API pdx_status_t pdx_xfer_make(pdx_agent_h agent, pdx_xfer_op_t op,
                                   pdx_dlist_h local,
                                   const uint32_t *local_idx,
                                   pdx_dlist_h remote,
                                   const uint32_t *remote_idx, size_t n,
                                   const void *notif, size_t notif_len,
                                   pdx_xfer_h *xfer_p);

#ifdef __cplusplus
}
#endif
#endif
