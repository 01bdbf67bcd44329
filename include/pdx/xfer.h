/* pdx transfer requests: plain (descriptor lists) and prepared (lists
 * prepared once, requests made from index selections).
 *
 * Life cycle: create/make -> post -> check until not INPROGRESS -> release.
 * A request may be posted again after it completed (same lists). Release
 * aborts in-flight work. All calls are thread-safe (agent lock), but one
 * request must not be used by two threads at once. Prepared lists belong
 * to the agent they were prepared on: release them before it is destroyed
 * (pdx_agent_destroy frees the requests left, not the lists). */
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
 * other. Adjacent pairs that are contiguous on both sides are merged. One
 * backend carries each post of the request (chosen by the path rules:
 * cuda_ipc, cma's memcpy into a mapped peer region and a pinned backend
 * by fixed rules; where two paths compete, host memory of a same-host
 * peer that cma cannot map, by measured cost, so a post may take the
 * other of the two after the class of requests was measured; under the
 * path policy PDX_PATH_POLICY_SAME_HOST_FAST, pdx/agent.h, a fallback is
 * refused). A request may be posted again after it completed (same lists).
 *
 * @param [in]  agent      The agent.
 * @param [in]  op         PDX_XFER_READ (remote -> local) or
 *                         PDX_XFER_WRITE.
 * @param [in]  local      Descriptors in this agent's registered memory.
 * @param [in]  remote     Descriptors in the peer's regions (its
 *                         addresses); as many as `local`, with the same
 *                         length pairwise (> 0).
 * @param [in]  peer       A loaded peer's name.
 * @param [in]  notif      Delivered to the peer after every byte of each
 *                         post has landed; NULL for none. One that starts
 *                         with the 8 bytes "\0PDXCTL\1" (pdx's own
 *                         control messages) is refused.
 * @param [in]  notif_len  Bytes of `notif` (<= PDX_NOTIF_MAX).
 * @param [out] xfer_p     The request; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND naming an unknown peer or an
 *         unregistered address (also one in a region the peer has since
 *         deregistered: requests made before that end PDX_ERR_STALE);
 *         PDX_ERR_INVALID (counts or lengths that differ or are 0, a bad
 *         op, the reserved prefix, a transfer that would land in a region
 *         registered PDX_REGION_F_READONLY); PDX_ERR_TOO_LARGE (notif);
 *         PDX_ERR_UNSUPPORTED (no backend reaches the peer for all of this
 *         memory); PDX_ERR_POLICY with the reason the fast path was
 *         refused; PDX_ERR_NOMEM.
 * Owns: the caller keeps `local`, `remote`, their descriptors, `peer` and
 *       `notif` (copied); *xfer_p is the caller's, freed with
 *       pdx_xfer_release. The request holds its local registrations
 *       (pdx_mem_deregister is PDX_ERR_BUSY until it is released).
 * Blocks: on the agent lock.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_xfer_create(pdx_agent_h agent, pdx_xfer_op_t op,
                                     const pdx_desc_list_t *local,
                                     const pdx_desc_list_t *remote,
                                     const char *peer, const void *notif,
                                     size_t notif_len, pdx_xfer_h *xfer_p);

/* Post a request (again, once its last post ended). Progress moves it
 * (the progress thread, pdx_xfer_check, pdx_progress); its end is read with
 * pdx_xfer_check.
 *
 * @param [in] xfer  The request.
 * @return PDX_OK if already complete; PDX_INPROGRESS; or an error:
 *         PDX_ERR_STALE when the peer was reloaded since creation or
 *         removed a region the request uses (pdx_mem_deregister tells
 *         loaded peers), PDX_ERR_REMOTE_DISCONNECT when it is dead,
 *         PDX_ERR_BUSY while the previous post is still in flight or still
 *         being stopped after it failed, or the backend's error.
 * Owns: nothing.
 * Blocks: no peer is waited for (see "Bounded calls" in pdx/agent.h): on
 *       the agent lock, then the backend's post, which may copy what fits
 *       (UCX over sm or tcp) and runs without the agent lock for a request
 *       over 64 KiB.
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API pdx_status_t pdx_xfer_post(pdx_xfer_h xfer);

/* State of the last post. It progresses the request's backend itself (one
 * bounded call), progress thread or not, so a polling caller sees a
 * completion at the backend's own latency; without a progress thread it
 * also runs the rest of the agent's progress (liveness, timeouts, other
 * requests) at most every 0.1 ms. When another thread is in a backend at
 * that moment it only looks.
 *
 * @param [in] xfer  The request.
 * @return PDX_OK, PDX_INPROGRESS, or the error that ended it (then
 *         pdx_last_error() names the peer and why: "peer process exited",
 *         timed out, ...); PDX_ERR_CANCELED after pdx_xfer_abort.
 * Owns: nothing.
 * Blocks: no: it never waits for another thread's backend call (see
 *       "Bounded calls" in pdx/agent.h); its own backend call runs
 *       without the agent lock (UCX: about 0.5 ms of work; cma: one
 *       512 KiB half-chunk copied).
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API pdx_status_t pdx_xfer_check(pdx_xfer_h xfer);

/* Ask an in-flight request to stop, without waiting (the agent lock is
 * not held while the peer finishes): its notification is not sent, and
 * pdx_xfer_check keeps returning PDX_INPROGRESS until no byte of it can
 * land any more, then PDX_ERR_CANCELED (or PDX_OK if it had completed
 * first, or the error that ended it). Only then is the local memory of a
 * READ the caller's again.
 *
 * @param [in] xfer  The request.
 * @return PDX_OK, also when nothing is in flight.
 * Owns: nothing.
 * Blocks: on the agent lock; a backend without an abort op releases the
 *       request instead, under the lock (bounded: it never waits for the
 *       peer; cma waits for the chunk it is copying).
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API pdx_status_t pdx_xfer_abort(pdx_xfer_h xfer);

/* Free a request. A request still in flight (PDX_INPROGRESS) is aborted
 * and release waits until the backend says no byte of it can land any
 * more. A request that already ended (done, failed, timed out, peer dead)
 * is freed at once; for a READ that ended in an error, bytes from a hung
 * peer may still land in its local memory until that peer is unloaded
 * (UCX 1.13 cannot cancel emulated RMA): reload the peer before reusing
 * those buffers. To stop a request without blocking, pdx_xfer_abort then
 * pdx_xfer_check until it ends, then release.
 *
 * @param [in] xfer  The request; NULL does nothing; a released one is
 *                   refused (logged).
 * Owns: frees the request and its hold on its local registrations.
 * Blocks: at once for an ended request; for one in flight, until the
 *       backend lets go of it, without holding the agent lock (other
 *       threads and peers carry on): UCX gives a silent peer 1 s without
 *       progress, then fails it; 10 s at most in all.
 * Threads: any thread; no other call on the request may be in progress or
 *       follow.
 */
PDX_API void pdx_xfer_release(pdx_xfer_h xfer);

/* Replace the notification a request delivers before its next post
 * (NIXL's transfer(handle, notif_msg)).
 *
 * @param [in] xfer  The request.
 * @param [in] msg   The new notification; NULL for none.
 * @param [in] len   Bytes of `msg` (<= PDX_NOTIF_MAX).
 * @return PDX_OK; PDX_ERR_BUSY while the request is in flight;
 *         PDX_ERR_TOO_LARGE over PDX_NOTIF_MAX; PDX_ERR_INVALID for pdx's
 *         reserved prefix (see pdx_xfer_create); PDX_ERR_NOMEM.
 * Owns: the caller keeps `msg` (copied).
 * Blocks: on the agent lock.
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API pdx_status_t pdx_xfer_set_notif(pdx_xfer_h xfer, const void *msg,
                                        size_t len);

/* Descriptors after merging (for tools and tests).
 *
 * @param [in] xfer  The request.
 * @return The number of merged pieces; 0 for an invalid handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API size_t pdx_xfer_segments(pdx_xfer_h xfer);

/* What moved a request (NIXL's transfer telemetry, plus the path). */
typedef struct pdx_xfer_telemetry {
    char backend[16];    /* "ucx", "cma", "cuda_ipc" */
    /* How the backend moves it: cma "memcpy" (mapped shared memory) or
     * "process_vm" (or both, "memcpy+process_vm"); UCX the transports of
     * the endpoint's lanes ("sysv/memory,tcp/lo"); "cuda_ipc". */
    char transport[64];
    bool fallback;       /* see pdx_path_policy_t */
    /* Why the fast path was not taken, or ""; where two paths competed,
     * the measured costs first ("cost: cma (process_vm) 3.1 us < ucx
     * 9.8 us per up to 16 KiB read (8, 6 samples); ..."). */
    char fallback_why[160];
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

/* What moved a request, and when (times need PDX_AGENT_F_TELEMETRY).
 *
 * @param [in]  xfer   The request.
 * @param [out] tel_p  Filled.
 * @return PDX_OK.
 * Owns: the caller keeps *tel_p.
 * Blocks: on the agent lock (the backend's path report runs under it).
 * Threads: any thread; not concurrently with another call on the same
 *       request.
 */
PDX_API pdx_status_t pdx_xfer_telemetry(pdx_xfer_h xfer,
                                        pdx_xfer_telemetry_t *tel_p);

/* Prepare a descriptor list once: local (`peer` NULL: this agent's memory)
 * or remote (`peer`'s regions). Every descriptor is resolved to its region
 * now, so pdx_xfer_make costs no lookups. A remote list outlives reloads
 * of the same peer instance (pdx_peer_load: a new generation, a revival)
 * as long as the regions it uses are unchanged; pdx_xfer_make of a pair
 * in a region the peer removed or changed, or from a list of an unloaded
 * or restarted peer, is PDX_ERR_STALE.
 *
 * @param [in]  agent    The agent.
 * @param [in]  peer     A loaded peer's name for a remote list; NULL for a
 *                       local one.
 * @param [in]  list     The descriptors (each of length > 0).
 * @param [out] dlist_p  The prepared list; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND (unknown peer, or a descriptor not in
 *         registered memory); PDX_ERR_INVALID (a descriptor of length 0);
 *         PDX_ERR_STALE (the peer was unloaded or reloaded meanwhile);
 *         PDX_ERR_TOO_LARGE (over 2^32 - 1 descriptors); PDX_ERR_NOMEM.
 * Owns: the caller keeps `peer` and `list` (copied); *dlist_p is the
 *       caller's, freed with pdx_dlist_release before the agent is
 *       destroyed. A local list holds its registrations
 *       (pdx_mem_deregister is PDX_ERR_BUSY until it is released).
 * Blocks: on the agent lock, released and taken again every 16384
 *       descriptors so that other calls get in.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_dlist_prepare(pdx_agent_h agent, const char *peer,
                                       const pdx_desc_list_t *list,
                                       pdx_dlist_h *dlist_p);

/* Free a prepared list. Requests made from it are not affected.
 *
 * @param [in] dlist  The list; NULL does nothing.
 * Owns: frees the list and its hold on the registrations or regions it
 *       uses.
 * Blocks: on the agent lock.
 * Threads: any thread; no other call on the list (a pdx_xfer_make from
 *       it) may be in progress or follow.
 */
PDX_API void pdx_dlist_release(pdx_dlist_h dlist);

/* Make a request from `n` index pairs into two prepared lists: pair i moves
 * local entry local_idx[i] to or from remote entry remote_idx[i]. Runs of
 * pairs whose memory is contiguous on both sides are merged. Otherwise as
 * pdx_xfer_create.
 *
 * @param [in]  agent       The agent both lists were prepared on.
 * @param [in]  op          PDX_XFER_READ or PDX_XFER_WRITE.
 * @param [in]  local       A local prepared list.
 * @param [in]  local_idx   n indices into `local`.
 * @param [in]  remote      A remote prepared list.
 * @param [in]  remote_idx  n indices into `remote`.
 * @param [in]  n           Pairs (> 0).
 * @param [in]  notif       As pdx_xfer_create; NULL for none.
 * @param [in]  notif_len   Bytes of `notif` (<= PDX_NOTIF_MAX).
 * @param [out] xfer_p      The request; written only on success.
 * @return PDX_OK; PDX_ERR_STALE (the remote list's peer was unloaded or
 *         restarted, or a pair lies in a region it removed or changed);
 *         PDX_ERR_INVALID (lists swapped or of another agent, n 0, a bad
 *         op, an index out of range, entries of unequal length, the
 *         reserved prefix, a landing in a read-only region);
 *         PDX_ERR_TOO_LARGE (notif); PDX_ERR_UNSUPPORTED; PDX_ERR_POLICY;
 *         PDX_ERR_NOMEM.
 * Owns: the caller keeps the lists, the index arrays and `notif` (copied);
 *       *xfer_p is the caller's, freed with pdx_xfer_release.
 * Blocks: on the agent lock.
 * Threads: any thread.
 */
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
