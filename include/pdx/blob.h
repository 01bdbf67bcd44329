/* pdx metadata blobs: an agent's description (what a peer loads), any blob
 * decoded as text, and the free of what pdx returns as malloc'd bytes. */
#ifndef PDX_BLOB_H
#define PDX_BLOB_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Serialise the agent's public metadata (name, instance, generation, host
 * id, pid, invariants, each backend's connection info, each region with
 * its keys) into a new blob, for a peer's pdx_peer_load. With a cluster
 * key (pdx/agent.h) the blob is signed.
 *
 * @param [in]  agent   The agent.
 * @param [out] blob_p  The blob; written only on success.
 * @param [out] len_p   Its length in bytes; written only on success.
 * @return PDX_OK; PDX_ERR_NOMEM, PDX_ERR_TOO_LARGE (over the blob's 64 MiB
 *         limit), or the error of a backend asked for its connection info
 *         or a region's key (logged).
 * Owns: *blob_p is the caller's, malloc'd: free it with pdx_blob_free.
 * Blocks: on the agent lock (each backend's connection info and key
 *       packing run under it); signing runs without it.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_agent_describe(pdx_agent_h agent, void **blob_p,
                                        size_t *len_p);

/* Free what pdx returned as malloc'd bytes: a blob (pdx_agent_describe,
 * pdx_kv_connector_describe), pdx_blob_describe's text, pdx_stats_json's
 * JSON. It is free(): it records no error and leaves pdx_last_error()
 * alone.
 *
 * @param [in] blob  What one of those returned; NULL does nothing.
 * Owns: frees `blob`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API void pdx_blob_free(void *blob);

/* Decode a metadata blob into text for people (pdx-info --blob). A signed
 * blob is shown unverified (no key is needed or used). Needs no agent.
 *
 * @param [in]  blob     The blob.
 * @param [in]  len      Bytes of `blob`.
 * @param [out] text_p   The text, NUL-terminated; written only on success.
 * @param [out] why      On failure, what is wrong with the blob; may be
 *                       NULL when why_len is 0.
 * @param [in]  why_len  Bytes of `why`.
 * @return PDX_OK; PDX_ERR_CORRUPT, PDX_ERR_VERSION or PDX_ERR_TOO_LARGE
 *         for a blob that does not parse (never read out of bounds),
 *         PDX_ERR_NOMEM.
 * Owns: the caller keeps `blob` and `why`; *text_p is the caller's,
 *       malloc'd: free it with pdx_blob_free.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_blob_describe(const void *blob, size_t len,
                                       char **text_p, char *why,
                                       size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
