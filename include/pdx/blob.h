/* pdx metadata blobs: an agent's description (what a peer loads), any blob
 * decoded as text, and the free of what pdx returns as malloc'd bytes. */
#ifndef PDX_BLOB_H
#define PDX_BLOB_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Serialise the agent's public metadata (name, generation, host id, pid,
 * each backend's connection info, each region with its keys, invariants)
 * into a new blob. `*blob_p` is malloc'd; free it with pdx_blob_free. */
PDX_API pdx_status_t pdx_agent_describe(pdx_agent_h agent, void **blob_p,
                                        size_t *len_p);
PDX_API void pdx_blob_free(void *blob);

/* Decode a metadata blob into human-readable text (for pdx-info). On
 * success *text_p is malloc'd (free with pdx_blob_free); on failure `why`
 * names what is wrong and the status says how (PDX_ERR_CORRUPT, ...).
 * Pure function: no agent; thread-safe. */
PDX_API pdx_status_t pdx_blob_describe(const void *blob, size_t len,
                                       char **text_p, char *why,
                                       size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
