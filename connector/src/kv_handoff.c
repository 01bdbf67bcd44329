/* Handoff parameters: their parser (every field checked before it is
 * used: they come from another node), the MultiConnector's merge of
 * children's parameters, and the connector's messages about a handoff. */
#include "kv_handoff_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/log.h>
#include <pdx/notif.h>
#include <pdx/xfer.h>

#include "kv_call_int.h"

bool kv_valid_req(const char *req)
{
    size_t n = req ? strlen(req) : 0;
    if (n == 0 || n >= PDX_KV_REQ_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (req[i] <= ' ' || req[i] > '~') {
            return false;
        }
    }
    return true;
}

void kv_handoff_free(kv_handoff_t *h)
{
    free(h->hashes);
    free(h->ids);
    free(h->bases);
    free(h->strides);
    free(h->devs);
}

static int json_u64_array(const cJSON *arr, uint64_t **out, size_t *n_p)
{
    if (!cJSON_IsArray(arr)) {
        return 0;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    *out = calloc(n ? n : 1, sizeof(uint64_t));
    if (*out == NULL) {
        return 0;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        /* Addresses and ids travel as decimal strings: a double cannot
         * hold every 64-bit value. */
        if (!cJSON_IsString(e)) {
            return 0;
        }
        char *end;
        (*out)[i++] = strtoull(e->valuestring, &end, 10);
        if (*end != '\0') {
            return 0;
        }
    }
    *n_p = n;
    return 1;
}

/* A JSON number that is a whole count in [0, max]; anything else (negative,
 * fractional, NaN, huge) is refused before it is converted. */
static int json_count(const cJSON *n, double max)
{
    return cJSON_IsNumber(n) && n->valuedouble >= 0 &&
           n->valuedouble <= max &&
           n->valuedouble == (double)(uint64_t)n->valuedouble;
}

/* An arena handoff's memory: "memory" "dram" (also when absent) or
 * "vram" with "devices", one per arena (each a device ordinal). */
static int handoff_memory(const cJSON *root, size_t narenas, kv_handoff_t *h)
{
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "memory");
    h->mem = PDX_MEM_DRAM;
    if (mem == NULL || h->pool) {
        return 1;
    }
    if (!cJSON_IsString(mem) || (strcmp(mem->valuestring, "dram") != 0 &&
                                 strcmp(mem->valuestring, "vram") != 0)) {
        pdx_error("kv: handoff memory is neither \"dram\" nor \"vram\"");
        return 0;
    }
    if (strcmp(mem->valuestring, "dram") == 0) {
        return 1;
    }
    size_t nd = 0;
    if (!json_u64_array(cJSON_GetObjectItemCaseSensitive(root, "devices"),
                        &h->devs, &nd) ||
        nd != narenas) {
        pdx_error("kv: handoff in GPU memory without a device per arena "
                  "(%zu)", narenas);
        return 0;
    }
    for (size_t a = 0; a < nd; a++) {
        if (h->devs[a] > KV_HANDOFF_DEVICE_MAX) {
            pdx_error("kv: handoff device %" PRIu64 " of arena %zu out of "
                      "range (at most %u)",
                      h->devs[a], a, KV_HANDOFF_DEVICE_MAX);
            return 0;
        }
    }
    h->mem = PDX_MEM_VRAM;
    return 1;
}

pdx_status_t kv_handoff_parse(const char *json, size_t narenas,
                              kv_handoff_t *h)
{
    memset(h, 0, sizeof(*h));
    cJSON *root = cJSON_Parse(json);
    pdx_status_t st = PDX_ERR_CORRUPT;
    if (root == NULL) {
        pdx_error("kv: handoff parameters are not JSON");
        return st;
    }
    const cJSON *agent = cJSON_GetObjectItemCaseSensitive(root, "agent");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(root, "req");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(root, "hashes");
    size_t nids = 0, nb = 0, ns = 0;
    if (!cJSON_IsString(agent) || strlen(agent->valuestring) >= PDX_NAME_MAX ||
        !cJSON_IsString(req) || !kv_valid_req(req->valuestring) ||
        !cJSON_IsString(src) || !json_count(tok, 9007199254740992.0) ||
        !cJSON_IsArray(hs)) {
        pdx_error("kv: handoff parameters lack agent, req, source, tokens or "
                  "hashes");
        goto out;
    }
    snprintf(h->agent, sizeof(h->agent), "%s", agent->valuestring);
    snprintf(h->req, sizeof(h->req), "%s", req->valuestring);
    h->pool = strcmp(src->valuestring, "pool") == 0;
    h->tokens = (size_t)tok->valuedouble;
    h->n = (size_t)cJSON_GetArraySize(hs);
    h->hashes = calloc(h->n ? h->n : 1, sizeof(*h->hashes));
    if (h->hashes == NULL) {
        pdx_error("kv: handoff of %s: out of memory for %zu hashes", h->req,
                  h->n);
        st = PDX_ERR_NOMEM;
        goto out;
    }
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, hs)
    {
        if (!cJSON_IsString(e) ||
            pdx_block_hash_from_hex(e->valuestring, &h->hashes[i++]) !=
                PDX_OK) {
            pdx_error("kv: handoff hash %zu is not hex", i - 1);
            goto out;
        }
    }
    if (!json_u64_array(cJSON_GetObjectItemCaseSensitive(
                            root, h->pool ? "addrs" : "ids"),
                        &h->ids, &nids) ||
        nids != h->n) {
        pdx_error("kv: handoff block list missing or of the wrong length");
        goto out;
    }
    if (!h->pool &&
        (!json_u64_array(cJSON_GetObjectItemCaseSensitive(root, "bases"),
                         &h->bases, &nb) ||
         !json_u64_array(cJSON_GetObjectItemCaseSensitive(root, "strides"),
                         &h->strides, &ns) ||
         nb != narenas || ns != narenas)) {
        pdx_error("kv: handoff arena bases/strides missing or not %zu",
                  narenas);
        goto out;
    }
    if (!handoff_memory(root, narenas, h)) {
        goto out;
    }
    const cJSON *tail = cJSON_GetObjectItemCaseSensitive(root, "tail");
    if (cJSON_IsObject(tail)) {
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(tail, "hash");
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(tail, "id");
        const cJSON *tt = cJSON_GetObjectItemCaseSensitive(tail, "tokens");
        if (!cJSON_IsString(th) || !cJSON_IsString(tid) ||
            !json_count(tt, PDX_HASH_BLOCK_SIZE_MAX) ||
            pdx_block_hash_from_hex(th->valuestring, &h->tail_hash) !=
                PDX_OK) {
            pdx_error("kv: handoff tail malformed");
            goto out;
        }
        h->tail_id = strtoull(tid->valuestring, NULL, 10);
        h->tail_tokens = (uint32_t)tt->valuedouble;
        h->has_tail = true;
    }
    st = PDX_OK;
out:
    cJSON_Delete(root);
    if (st != PDX_OK) {
        kv_handoff_free(h);
    }
    return st;
}

pdx_status_t pdx_kv_params_check(const char *params, size_t len,
                                 size_t narenas)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(params, "params")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    char *text = len < SIZE_MAX ? malloc(len + 1) : NULL;
    if (text == NULL) {
        pdx_error("kv: params check: out of memory for %zu bytes", len);
        PDX_LEAVE(PDX_ERR_NOMEM);
    }
    memcpy(text, params, len);
    text[len] = '\0';
    kv_handoff_t h;
    pdx_status_t st = kv_handoff_parse(text, narenas, &h);
    if (st == PDX_OK) {
        kv_handoff_free(&h);
    }
    free(text);
    PDX_LEAVE(st);
}

void kv_json_add_u64s(cJSON *obj, const char *name, const uint64_t *v,
                      size_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, name);
    char buf[24];
    for (size_t i = 0; arr != NULL && i < n; i++) {
        snprintf(buf, sizeof(buf), "%" PRIu64, v[i]);
        cJSON_AddItemToArray(arr, cJSON_CreateString(buf));
    }
}

pdx_status_t kv_params_merge(cJSON *a, const cJSON *b, const char *an,
                             const char *bn)
{
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) {
        pdx_error("kv: transfer parameters of %s and %s must be objects", an,
                  bn);
        return PDX_ERR_INVALID;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, b)
    {
        if (cJSON_GetObjectItemCaseSensitive(a, e->string) != NULL) {
            pdx_error("kv: transfer parameters clash: children %s and %s "
                      "both set \"%s\"", an, bn, e->string);
            return PDX_ERR_EXISTS;
        }
    }
    cJSON_ArrayForEach(e, b)
    {
        cJSON *dup = cJSON_Duplicate(e, 1);
        if (dup == NULL) {
            return PDX_ERR_NOMEM;
        }
        cJSON_AddItemToObject(a, e->string, dup);
    }
    return PDX_OK;
}

pdx_status_t pdx_kv_params_merge(const char *a, const char *b, char **out_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(a, "a") || !PDX_ARG_OK(b, "b") ||
        !PDX_ARG_OK(out_p, "out_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
    pdx_status_t st = PDX_ERR_CORRUPT;
    if (ja != NULL && jb != NULL) {
        st = kv_params_merge(ja, jb, "first", "second");
    } else {
        pdx_error("kv: params merge: the %s parameters are not JSON",
                  ja == NULL ? "first" : "second");
    }
    if (st == PDX_OK) {
        char *text = cJSON_PrintUnformatted(ja);
        st = text ? PDX_OK : PDX_ERR_NOMEM;
        if (text) {
            *out_p = text;
        } else {
            pdx_error("kv: params merge: out of memory");
        }
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    PDX_LEAVE(st);
}

void kv_msg_format(char *buf, size_t len, const char *verb, const char *req)
{
    snprintf(buf, len, KV_MSG_PREFIX "%s %s", verb, req);
}

pdx_status_t kv_msg_send(pdx_agent_h agent, const char *peer,
                         const char *verb, const char *req)
{
    char note[128];
    kv_msg_format(note, sizeof(note), verb, req);
    return pdx_notif_send(agent, peer, note, strlen(note));
}

pdx_status_t kv_msg_send_rest(pdx_agent_h agent, const char *peer,
                              const char *verb, const char *req,
                              const char *rest)
{
    char note[PDX_NOTIF_MAX];
    int n = snprintf(note, sizeof(note), KV_MSG_PREFIX "%s %s %s", verb, req,
                     rest);
    if (n < 0 || (size_t)n >= sizeof(note)) {
        pdx_error("kv: a %s message about %s is too long (%d bytes)", verb,
                  req, n);
        return PDX_ERR_TOO_LARGE;
    }
    return pdx_notif_send(agent, peer, note, (size_t)n);
}

int kv_msg_parse_rest(const void *msg, size_t len, char *verb, char *req,
                      char *rest, size_t rest_len)
{
    size_t pre = sizeof(KV_MSG_PREFIX) - 1;
    if (len < pre || memcmp(msg, KV_MSG_PREFIX, pre) != 0) {
        return -1;
    }
    const char *p = (const char *)msg + pre, *end = (const char *)msg + len;
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    if (sp == NULL || sp == p || (size_t)(sp - p) >= 16) {
        return 0;
    }
    memcpy(verb, p, (size_t)(sp - p));
    verb[sp - p] = '\0';
    p = sp + 1;
    sp = memchr(p, ' ', (size_t)(end - p));
    const char *req_end = sp ? sp : end;
    if (req_end == p || (size_t)(req_end - p) >= PDX_KV_REQ_ID_MAX) {
        return 0;
    }
    memcpy(req, p, (size_t)(req_end - p));
    req[req_end - p] = '\0';
    size_t n = sp ? (size_t)(end - sp - 1) : 0;
    if (n >= rest_len || memchr(sp ? sp + 1 : end, '\0', n) != NULL ||
        !kv_valid_req(req)) {
        return 0;
    }
    memcpy(rest, sp ? sp + 1 : end, n);
    rest[n] = '\0';
    return 1;
}

int kv_msg_parse(const void *msg, size_t len, char *verb, char *req)
{
    char text[160];
    if (len >= sizeof(text) || len < sizeof(KV_MSG_PREFIX) - 1 ||
        memcmp(msg, KV_MSG_PREFIX, sizeof(KV_MSG_PREFIX) - 1) != 0) {
        return -1;
    }
    memcpy(text, msg, len);
    text[len] = '\0';
    _Static_assert(PDX_KV_REQ_ID_MAX == 64, "the %63s below");
    if (sscanf(text + sizeof(KV_MSG_PREFIX) - 1, "%15s %63s", verb, req) !=
        2) {
        return 0;
    }
    return 1;
}
