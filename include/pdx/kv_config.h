/* Deployment configuration: one JSON file per role (cJSON), loaded into
 * plain structs the connector and the example take. Every key, its type and
 * default is listed in configs/README.md.
 *
 * NULL arguments: a NULL config or a NULL required pointer is refused
 * without being dereferenced (PDX_ERR_INVALID, or 0 from the functions that
 * return a size), and pdx_last_error() (pdx/status.h) names the function
 * and the argument, e.g. "pdx_kv_config_layout: cfg is NULL". Every failure
 * leaves its reason there (a load or parse error is also logged, with the
 * text it writes to `err`). There are no handles here; the layout built by
 * pdx_kv_config_layout follows pdx/kv_layout.h. */
#ifndef PDX_KV_CONFIG_H
#define PDX_KV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/export.h>
#include <pdx/kv_layout.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdx_kv_role {
    PDX_KV_ROLE_PRODUCER = 1, /* prefill: "producer" */
    PDX_KV_ROLE_CONSUMER = 2, /* decode: "consumer" */
    PDX_KV_ROLE_BOTH = 3,     /* colocated: "both" */
} pdx_kv_role_t;

typedef enum pdx_kv_offload_mode {
    PDX_KV_OFFLOAD_READ_WRITE = 0, /* "read_write": save and load */
    PDX_KV_OFFLOAD_SAVE_ONLY = 1,  /* "save_only": save, never load */
    PDX_KV_OFFLOAD_LOAD_ONLY = 2,  /* "load_only" */
} pdx_kv_offload_mode_t;

typedef enum pdx_kv_failure_policy {
    PDX_KV_FAIL_RECOMPUTE = 0, /* "recompute": a failed load is recomputed */
    PDX_KV_FAIL_FAIL = 1,      /* "fail": the request fails */
} pdx_kv_failure_policy_t;

typedef enum pdx_kv_child_type {
    PDX_KV_CHILD_REMOTE = 0,  /* "remote": P/D handoff over pdx */
    PDX_KV_CHILD_OFFLOAD = 1, /* "offload": local host-memory tier */
} pdx_kv_child_type_t;

#define PDX_KV_MAX_CHILDREN 4
#define PDX_KV_MAX_INDEX_LAYERS 128
#define PDX_KV_MAX_BACKEND_OPTS 8
#define PDX_KV_MAX_BACKENDS 4

typedef struct pdx_kv_child_config {
    pdx_kv_child_type_t type;
    /* remote */
    uint32_t lease_ms;      /* P holds finished blocks this long; 30000 */
    uint32_t heartbeat_ms;  /* D renews leases this often; 2000 */
    pdx_kv_failure_policy_t failure_policy; /* recompute */
    bool load_tail;         /* D loads P's partial tail block; true */
    /* offload */
    pdx_kv_offload_mode_t mode;   /* read_write */
    uint64_t budget_bytes;        /* host pool bytes for the host; required */
    uint32_t ranks_per_host;      /* budget split evenly; default dp_size */
    bool wait_for_full_prefix;    /* lookup pending till saved; false */
    uint32_t wait_timeout_ms;     /* deadline of that wait; 2000 */
    bool save_tail;               /* save partial tail blocks; true */
} pdx_kv_child_config_t;

typedef struct pdx_kv_config {
    char source[256];   /* file the config came from */
    char model_id[128]; /* "zai-org/GLM-5.2-FP8" */
    pdx_kv_role_t role;
    /* Default "<model short>-<p|d|pd>-dp<rank>" (plus "-tp<rank>" when
     * tp_size > 1); configs/README.md gives the model short name rule. */
    char agent_name[64];
    char peer_name[64];   /* required for producer and consumer */
    char peer_address[128]; /* where the peer's blob is found (example) */
    uint32_t dp_size, dp_rank, tp_size, tp_rank; /* 1,0,1,0 */
    char kv_dtype[32];    /* "fp8_ds_mla" */

    /* Model shape, from which the layout is generated and checked. */
    uint32_t num_layers;            /* 78 */
    uint32_t mla_bytes_per_token;   /* 656 */
    uint32_t index_k_bytes_per_token; /* 132 */
    uint32_t index_k_layers[PDX_KV_MAX_INDEX_LAYERS];
    uint32_t n_index_k_layers;      /* 21 for GLM-5.2 */
    uint32_t mtp_layers;            /* 1 */
    uint32_t block_tokens;          /* 64 */
    uint32_t num_blocks;            /* KV blocks in this rank's arenas */
    /* Always the derived pdx_kv_config_bytes_per_block (3502592); a
     * kv.bytes_per_block in the file is checked against it. */
    uint64_t bytes_per_block;
    pdx_mem_type_t mem_type;        /* "dram" | "vram"; dram */
    uint32_t device;                /* CUDA device for vram; 0 */

    char hash_algo[32]; /* "xxhash_cbor" | "sha256_cbor"; sha256_cbor */
    char hash_seed[128]; /* required; "" is a valid seed (as in vLLM) */

    pdx_kv_child_config_t children[PDX_KV_MAX_CHILDREN];
    uint32_t nchildren; /* MultiConnector order */

    char backends[PDX_KV_MAX_BACKENDS][16]; /* e.g. "ucx", "cuda_ipc" */
    uint32_t nbackends;
    /* Every backend's options, backend by backend. They point into the
     * opt_buf of the struct the config was loaded into: a copy of the
     * struct must take them from pdx_kv_config_backend_opts instead. */
    pdx_option_t backend_opts[PDX_KV_MAX_BACKEND_OPTS];
    uint32_t nbackend_opts;
    char opt_buf[PDX_KV_MAX_BACKEND_OPTS][2][64];
    /* backend_opts[i] belongs to backends[backend_opt_owner[i]]. */
    uint32_t backend_opt_owner[PDX_KV_MAX_BACKEND_OPTS];
    /* backends[i] has "required": true: the connector refuses to start
     * when it cannot be created here (otherwise: one warning naming the
     * config and the reason, and the connector goes on without it). */
    bool backend_required[PDX_KV_MAX_BACKENDS];
    /* agent.path_policy: "any" (0, default), "same_host_fast" (1) or
     * "native" (2), a pdx_path_policy_t for the connector's agent
     * (pdx/agent.h). */
    uint32_t path_policy;

    /* `store` section (configs/README.md): discovery, liveness and the
     * block-owner registry on a store such as etcd. has_store false: no
     * store, peers meet through blobs passed by hand. */
    bool has_store;
    char store_type[16];         /* module name; "etcd" */
    char store_endpoints[512];   /* comma-separated URLs; required */
    char store_namespace[128];   /* key prefix; "pdx" */
    uint32_t store_lease_ttl_ms; /* 10000 */
    uint32_t store_timeout_ms;   /* one request; 2000 */
    uint32_t store_fetch_timeout_ms; /* wait for a peer named by handoff
                                      * parameters; 5000 */
    uint32_t store_max_txn_ops;  /* 128 */
    bool store_registry;         /* register saved blocks' owners; true */
    uint32_t store_demote_owners; /* owners that make a replica
                                   * reclaimable; 3 */
    bool store_remote_offload;   /* a local miss asks the registry; true */
    uint32_t store_remote_offload_timeout_ms; /* owner's answer; 1000 */
    /* agent.cluster_key_file: the connector's agent signs its blobs and
     * accepts only blobs signed with this key (PDX_AGENT_PARAM_CLUSTER_KEY
     * in pdx/agent.h; docs/SECURITY.md). "" (default): none, unless
     * PDX_CLUSTER_KEY_FILE is set in the environment. */
    char cluster_key_file[256];
    /* store.ca_file, cert_file, key_file, user, password_file: the etcd
     * store's TLS and auth options (pdx/store.h, docs/SECURITY.md); ""
     * when absent. */
    char store_ca_file[256], store_cert_file[256], store_key_file[256];
    char store_user[128], store_password_file[256];
} pdx_kv_config_t;

/* Largest config text accepted, in bytes. */
#define PDX_KV_CONFIG_MAX_BYTES (1u << 20)

/* Load and validate a config file. Unknown keys, repeated keys and wrong
 * types are errors; the text must be UTF-8 of at most
 * PDX_KV_CONFIG_MAX_BYTES. A failure is also logged at error level, with
 * the text written to `err`.
 *
 * @param [in]  path     The file.
 * @param [out] cfg      The config; written only on success.
 * @param [out] err      "" on success; otherwise a message naming the
 *                       file, the JSON path and what was expected, e.g.
 *                       "configs/x.json: $.connector.children[1].
 *                       budget_bytes: 1024 is smaller than one block
 *                       (3502592 bytes)"; may be NULL when err_len is 0.
 * @param [in]  err_len  Bytes of `err`.
 * @return PDX_OK; PDX_ERR_CONFIG; PDX_ERR_NOT_FOUND for a missing file;
 *         PDX_ERR_IO for one that cannot be read; PDX_ERR_INVALID for NULL
 *         arguments; PDX_ERR_NOMEM.
 * Owns: the caller keeps `path`, *cfg and `err`. cfg->backend_opts points
 *       into cfg itself (see pdx_kv_config_backend_opts for copies).
 * Blocks: yes: reading the file.
 * Threads: any thread (pdx keeps no state; cJSON records its last parse
 *       error in a global that pdx never reads).
 */
PDX_API pdx_status_t pdx_kv_config_load(const char *path,
                                        pdx_kv_config_t *cfg, char *err,
                                        size_t err_len);

/* As pdx_kv_config_load, from a JSON text in memory (used by the fuzzer).
 *
 * @param [in]  json     The text (len bytes, not necessarily
 *                       NUL-terminated); may be NULL when len is 0.
 * @param [in]  len      Bytes of `json`.
 * @param [in]  name     Used in messages in place of a file name.
 * @param [out] cfg      The config; written only on success.
 * @param [out] err      As pdx_kv_config_load.
 * @param [in]  err_len  Bytes of `err`.
 * @return As pdx_kv_config_load, without the file errors.
 * Owns: the caller keeps every argument.
 * Blocks: no.
 * Threads: any thread, as pdx_kv_config_load.
 */
PDX_API pdx_status_t pdx_kv_config_parse(const char *json, size_t len,
                                         const char *name,
                                         pdx_kv_config_t *cfg, char *err,
                                         size_t err_len);

/* Bytes of one KV block over all arenas for the shape in `cfg`:
 * (num_layers * mla + n_index_k_layers * index_k
 *  + mtp_layers * (mla + index_k)) * block_tokens.
 *
 * @param [in] cfg  The config.
 * @return The bytes; 0 for NULL.
 * Owns: the caller keeps `cfg`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API uint64_t pdx_kv_config_bytes_per_block(const pdx_kv_config_t *cfg);

/* Arenas of that shape: num_layers + n_index_k_layers + mtp_layers (times 2
 * when index_k_bytes_per_token > 0). 101 for GLM-5.2.
 *
 * @param [in] cfg  The config.
 * @return The count; 0 for NULL.
 * Owns: the caller keeps `cfg`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API uint32_t pdx_kv_config_num_arenas(const pdx_kv_config_t *cfg);

/* Build the layout `cfg` describes, in the arena order and names of
 * pdx_layout_glm52 (so the GLM-5.2 configs have its fingerprint): for each
 * layer L, "layer<L>.mla" then, on an index-K layer, "layer<L>.index_k";
 * then for each MTP layer M = num_layers + i, "mtp<M>.mla" and, when
 * index_k_bytes_per_token > 0, "mtp<M>.index_k" (is_mtp = 1). num_blocks,
 * memory type and device come from cfg; strides are packed, bases 0.
 *
 * @param [in]  cfg       The config.
 * @param [out] layout_p  The layout; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for NULL or a shape
 *         pdx_layout_add_arena refuses; PDX_ERR_NOMEM.
 * Owns: the caller keeps `cfg`; *layout_p is the caller's, freed with
 *       pdx_layout_destroy.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_kv_config_layout(const pdx_kv_config_t *cfg,
                                          pdx_layout_h *layout_p);

/* Options of backends[backend] as key/value pairs pointing into
 * cfg->opt_buf. Works on any copy of a loaded config.
 *
 * @param [in]  cfg      The config.
 * @param [in]  backend  An index into cfg->backends.
 * @param [out] out      Up to `max` options; NULL: count only.
 * @param [in]  max      Entries of `out`.
 * @return How many options that backend has; 0 for a NULL cfg or an index
 *         out of range (both errors recorded in pdx_last_error()).
 * Owns: the caller keeps `cfg` and `out`; the strings `out` points to are
 *       in cfg->opt_buf, valid while *cfg lives unchanged.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API size_t pdx_kv_config_backend_opts(const pdx_kv_config_t *cfg,
                                          uint32_t backend, pdx_option_t *out,
                                          size_t max);

#ifdef __cplusplus
}
#endif
#endif
