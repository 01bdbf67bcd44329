/* Deployment configuration: one JSON file per role (cJSON), loaded into
 * plain structs the connector and the example take. Every key, its type and
 * default is listed in configs/README.md. */
#ifndef PDX_KV_CONFIG_H
#define PDX_KV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/export.h>
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
    bool wait_for_full_prefix;    /* lookup pending until prefix saved */
    uint32_t wait_timeout_ms;     /* deadline of that wait; 2000 */
    bool save_tail;               /* save partial tail blocks; true */
} pdx_kv_child_config_t;

typedef struct pdx_kv_config {
    char source[256];   /* file the config came from */
    char model_id[128]; /* "zai-org/GLM-5.2-FP8" */
    pdx_kv_role_t role;
    char agent_name[64];  /* default "<model short>-<p|d|pd>-dp<rank>" */
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
    uint64_t bytes_per_block;       /* optional check: 3502592; 0 = none */
    pdx_mem_type_t mem_type;        /* "dram" | "vram"; dram */
    uint32_t device;                /* CUDA device for vram */

    char hash_algo[32]; /* "xxhash_cbor" | "sha256_cbor" */
    char hash_seed[128];

    pdx_kv_child_config_t children[PDX_KV_MAX_CHILDREN];
    uint32_t nchildren; /* MultiConnector order */

    char backends[4][16]; /* e.g. "ucx", "cuda_ipc" */
    uint32_t nbackends;
    pdx_kv_t backend_opts[PDX_KV_MAX_BACKEND_OPTS]; /* point into opt_buf */
    uint32_t nbackend_opts;
    char opt_buf[PDX_KV_MAX_BACKEND_OPTS][2][64];
} pdx_kv_config_t;

/* Load and validate `path`. On failure returns PDX_ERR_CONFIG (or
 * PDX_ERR_IO / PDX_ERR_NOT_FOUND for the file) and writes into `err` a
 * message naming the file, the JSON path and what was expected, e.g.
 * "configs/x.json: $.connector.children[1].budget_bytes: 1024 is smaller
 * than one block (3502592 bytes)". Unknown keys and wrong types are errors.
 * Pure (no global state); thread-safe; blocking (file read). */
PDX_API pdx_status_t pdx_kv_config_load(const char *path,
                                        pdx_kv_config_t *cfg, char *err,
                                        size_t err_len);

/* The same from a JSON text in memory (`name` is used in messages).
 * Used by the fuzzer. */
PDX_API pdx_status_t pdx_kv_config_parse(const char *json, size_t len,
                                         const char *name,
                                         pdx_kv_config_t *cfg, char *err,
                                         size_t err_len);

/* Bytes of one KV block over all arenas for the shape in `cfg`. */
PDX_API uint64_t pdx_kv_config_bytes_per_block(const pdx_kv_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif
