/* Cluster key: authenticated metadata blobs (docs/SECURITY.md).
 *
 * An agent with a cluster key seals every blob it describes in an envelope
 * that carries an HMAC-SHA-256 (libcrypto) of the envelope header and the
 * unchanged inner blob (blob.h), and refuses blobs that are not sealed with
 * the same key. An agent without a key accepts both (it strips an envelope
 * unverified). Envelope, little-endian:
 *
 *   u32 magic "PDXS"  u16 version (1)  u16 algorithm (1: HMAC-SHA-256)
 *   u32 inner_len     u32 reserved (0)  u64 key id
 *   inner blob (inner_len bytes)        32-byte MAC
 *
 * The key id is the first 8 bytes of HMAC-SHA-256(key, "pdx cluster key
 * id"): it names the key in errors without revealing it. */
#ifndef PDX_SIGN_H
#define PDX_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/agent.h>
#include <pdx/status.h>

#define PDX_SIG_MAGIC 0x53584450u /* "PDXS" little-endian */
#define PDX_SIG_VERSION 1u
#define PDX_SIG_ALG_HMAC_SHA256 1u
#define PDX_SIG_HEADER_LEN 24u
#define PDX_SIG_MAC_LEN 32u
#define PDX_CLUSTER_KEY_MIN 16u   /* bytes; shorter keys are refused */
#define PDX_CLUSTER_KEY_MAX 4096u /* bytes */

typedef struct pdx_ckey {
    uint8_t *bytes; /* NULL: no key */
    size_t len;
    uint64_t id;
} pdx_ckey_t;

/* Set up an agent's key from its params (PDX_AGENT_PARAM_CLUSTER_KEY:
 * cluster_key bytes or cluster_key_file), else from the file named by
 * PDX_CLUSTER_KEY_FILE in the environment, else none (PDX_OK, no key).
 * PDX_ERR_INVALID / PDX_ERR_CONFIG with a logged reason naming the file.
 * Blocking (reads the file); any thread. */
pdx_status_t pdxi_ckey_init(pdx_ckey_t *k, const char *agent,
                            const pdx_agent_params_t *params);
/* Wipe and free the key; k may be unset. */
void pdxi_ckey_clear(pdx_ckey_t *k);

/* Seal the blob [*buf_p, +*len_p) (malloc'd) in place: on success the
 * buffer was replaced by the envelope (the old one freed). */
pdx_status_t pdxi_blob_seal(const pdx_ckey_t *k, uint8_t **buf_p,
                            size_t *len_p);

/* Open what a peer sent: `k` NULL or unset accepts a plain blob or strips
 * an envelope unverified; with a key, a plain blob or one sealed with
 * another key is PDX_ERR_MISMATCH and a wrong MAC (altered in transit or
 * forged) PDX_ERR_CORRUPT, each with the reason in `why`. On success the
 * inner blob is [*inner_p, +*inner_len_p), inside `buf`. Never reads
 * outside [buf, buf+len); constant-time MAC comparison. Non-blocking. */
pdx_status_t pdxi_blob_open(const pdx_ckey_t *k, const void *buf, size_t len,
                            const void **inner_p, size_t *inner_len_p,
                            char *why, size_t why_len);

#endif
