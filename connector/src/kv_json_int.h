/* Private to the connector: a strict JSON reader over cJSON for the
 * deployment config (kv_config.c holds the schema). The text is checked
 * for what cJSON lets through (UTF-8, NUL, control characters, \u0000,
 * trailing text); objects for unknown and repeated keys (with a "did you
 * mean"); every value for its type and range. Each refusal is one message
 * naming the file, the JSON path and what was expected, logged and copied
 * into the caller's buffer. */
#ifndef PDX_KV_JSON_H
#define PDX_KV_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include <pdx/status.h>

/* Integers JSON carries exactly (IEEE doubles): 2^53. */
#define KVJ_INT_MAX 9007199254740992ull
#define KVJ_PATH_MAX 192

typedef struct kvj_ctx {
    const char *name; /* file name for messages */
    char *err;
    size_t err_len;
    char path[KVJ_PATH_MAX]; /* the JSON path being read, "$.a.b[2]" */
    size_t path_len;
} kvj_ctx_t;

/* The message goes to `err` and, as an error line, to the log (and so to
 * pdx_last_error()), whether or not the caller gave a buffer. Returns st. */
pdx_status_t kvj_fail_st(kvj_ctx_t *c, pdx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define kvj_fail(c, ...) kvj_fail_st((c), PDX_ERR_CONFIG, __VA_ARGS__)
/* An error at the current JSON path. */
#define kvj_fail_at(c, fmt, ...)                                               \
    kvj_fail_st((c), PDX_ERR_CONFIG, "%s: " fmt, (c)->path, __VA_ARGS__)

enum kvj_str_rule {
    KVJ_STR_ANY = 0,  /* any text without control characters */
    KVJ_STR_SEED = 1, /* anything (control characters come only as escapes) */
    KVJ_STR_NAME = 2, /* [A-Za-z0-9._-] */
    KVJ_STR_LOWER = 3 /* [a-z0-9_] */
};

size_t kvj_push_key(kvj_ctx_t *c, const char *key);

size_t kvj_push_index(kvj_ctx_t *c, size_t i);

void kvj_pop(kvj_ctx_t *c, size_t old);

/* "string \"abc\"", "number 1.5", ... for "got ..." in messages. */
void kvj_describe(const cJSON *v, char *out, size_t len);

pdx_status_t kvj_fail_type(kvj_ctx_t *c, const cJSON *v, const char *expected);

/* `obj` must be an object whose keys are all in `known` (n <= 32), each
 * once. `what` names the object in the unknown-key message. */
pdx_status_t kvj_check_keys(kvj_ctx_t *c, const cJSON *obj,
                            const char *const *known, size_t n,
                            const char *what);

/* The member called `key` (case-sensitive; kvj_check_keys ruled out
 * repeats). */
const cJSON *kvj_member(const cJSON *obj, const char *key);

/* Enters obj.key, which must be an object (absent: *out NULL, unless
 * required). The caller pops the path with the returned length. */
pdx_status_t kvj_get_object(kvj_ctx_t *c, const cJSON *obj, const char *key,
                            int required, const cJSON **out, size_t *old_p);

/* An integer JSON number in [lo, hi] (hi <= 2^53) at the current path. */
pdx_status_t kvj_read_uint(kvj_ctx_t *c, const cJSON *v, uint64_t lo,
                           uint64_t hi, uint64_t *out);

pdx_status_t kvj_get_uint(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          uint64_t lo, uint64_t hi, int required, uint64_t def,
                          uint64_t *out);

pdx_status_t kvj_get_u32(kvj_ctx_t *c, const cJSON *obj, const char *key,
                         uint32_t lo, uint32_t hi, int required, uint32_t def,
                         uint32_t *out);

pdx_status_t kvj_get_bool(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          bool def, bool *out);

int kvj_str_ok(const char *s, enum kvj_str_rule rule);

/* A string at the current path into buf[size]. */
pdx_status_t kvj_read_str(kvj_ctx_t *c, const cJSON *v, char *buf, size_t size,
                          size_t min, enum kvj_str_rule rule);

pdx_status_t kvj_get_str(kvj_ctx_t *c, const cJSON *obj, const char *key,
                         char *buf, size_t size, size_t min,
                         enum kvj_str_rule rule, int required, const char *def);

/* One of names[0..n-1] (index into *out), default `def` when absent. */
pdx_status_t kvj_get_enum(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          const char *const *names, size_t n, int required,
                          size_t def, size_t *out);

pdx_status_t kvj_get_size(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          uint64_t *out);

pdx_status_t kvj_parse(kvj_ctx_t *c, const char *json, size_t len,
                       cJSON **root_p);

#endif
