/* Private to the connector: handoff parameters (the JSON a prefill node
 * gives with a finished request and a decode node loads from) and the
 * connector's messages about them ("pdxkv:<verb> <req>": done, reject,
 * hb). Pure format: no connector state. */
#ifndef PDX_KV_HANDOFF_H
#define PDX_KV_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include <pdx/kv_connector.h>

#define KV_MSG_PREFIX "pdxkv:"
/* The largest device ordinal a handoff may name (as the config's). */
#define KV_HANDOFF_DEVICE_MAX 1023u

/* Handoff parameters, parsed. */
typedef struct kv_handoff {
    char agent[PDX_NAME_MAX];
    char req[PDX_KV_REQ_ID_MAX];
    bool pool;
    size_t tokens;
    size_t n; /* full blocks */
    pdx_block_hash_t *hashes;
    uint64_t *ids;   /* arena: block ids; pool: slot addresses */
    uint64_t *bases; /* arena only: per arena */
    uint64_t *strides;
    /* arena only: the holder's memory ("memory" in the JSON; DRAM when
     * absent) and, for GPU memory, each arena's device */
    pdx_mem_type_t mem;
    uint64_t *devs;
    bool has_tail;
    pdx_block_hash_t tail_hash;
    uint64_t tail_id;
    uint32_t tail_tokens;
} kv_handoff_t;

/* A request id: 1..PDX_KV_REQ_ID_MAX-1 printable ASCII characters. */
bool kv_valid_req(const char *req);

/* Parse `json` for a connector of `narenas` arenas (logged when refused:
 * PDX_ERR_CORRUPT, PDX_ERR_NOMEM). On success *h holds memory that
 * kv_handoff_free releases; on failure nothing is held. */
pdx_status_t kv_handoff_parse(const char *json, size_t narenas,
                              kv_handoff_t *h);
void kv_handoff_free(kv_handoff_t *h);

/* An array `name` of the decimal strings of v[0..n) added to obj. */
void kv_json_add_u64s(cJSON *obj, const char *name, const uint64_t *v,
                      size_t n);

/* MultiConnector: merge child b's transfer parameters into a's; a key
 * both set is a clash (PDX_ERR_EXISTS). an, bn name them in the log. */
pdx_status_t kv_params_merge(cJSON *a, const cJSON *b, const char *an,
                             const char *bn);

/* "pdxkv:<verb> <req>" into buf (the payload of a transfer's notification
 * or of pdx_notif_send). */
void kv_msg_format(char *buf, size_t len, const char *verb, const char *req);
/* kv_msg_format's message sent to `peer`. */
pdx_status_t kv_msg_send(pdx_agent_h agent, const char *peer,
                         const char *verb, const char *req);
/* A message: 1 with verb[16] and req[PDX_KV_REQ_ID_MAX] set, 0 when it is
 * a connector message that does not parse, -1 when it is not one. */
int kv_msg_parse(const void *msg, size_t len, char *verb, char *req);
/* "pdxkv:<verb> <req> <rest>" sent to `peer` (at most PDX_NOTIF_MAX
 * bytes: PDX_ERR_TOO_LARGE, logged, beyond). */
pdx_status_t kv_msg_send_rest(pdx_agent_h agent, const char *peer,
                              const char *verb, const char *req,
                              const char *rest);
/* As kv_msg_parse, for any message up to PDX_NOTIF_MAX bytes: the text
 * after "<verb> <req> " is copied into rest[rest_len] ("" when none). */
int kv_msg_parse_rest(const void *msg, size_t len, char *verb, char *req,
                      char *rest, size_t rest_len);

#endif
