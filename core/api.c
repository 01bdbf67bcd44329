/* The exported functions of the core (agent, memory, peer, transfer,
 * notification, discovery and owner registry): each checks the handles and arguments that would
 * otherwise be dereferenced (PDX_ERR_INVALID, with a line naming the
 * argument that becomes pdx_last_error()) and runs the implementation
 * (pdxi_*, api_int.h) inside the per-call error capture. */
#include <string.h>

#include "api_int.h"
#include "call_int.h"
#include "metrics_int.h"
#include "xfer_int.h"

/* A live agent's name goes on the call's log lines (agent=<name>). */
static inline bool log_agent(pdx_agent_h agent)
{
    pdx_log_call_agent(agent->name);
    return true;
}

#define AGENT_OK(a)                                                            \
    (PDX_HANDLE_OK((a), PDX_MAGIC_AGENT, "agent") && log_agent(a))
/* A request is refused with its agent (inherited across fork()). */
#define XFER_OK(x)                                                             \
    (pdx_handle_check((x), PDX_MAGIC_XFER, __func__, "xfer") &&              \
     pdx_handle_check((x)->agent, PDX_MAGIC_AGENT, __func__,                 \
                      "xfer's agent") &&                                      \
     log_agent((x)->agent))
#define DLIST_OK(d, what) pdx_handle_check((d), PDX_MAGIC_DLIST, __func__, what)
/* Release and destroy: a handle inherited across fork() is left alone
 * quietly (a child's exit runs finalisers). */
#define AGENT_REL_OK(a)                                                        \
    pdx_handle_check_release((a), PDX_MAGIC_AGENT, __func__, "agent")
#define XFER_REL_OK(x)                                                         \
    (pdx_handle_check((x), PDX_MAGIC_XFER, __func__, "xfer") &&              \
     pdx_handle_check_release((x)->agent, PDX_MAGIC_AGENT, __func__,         \
                              "xfer's agent"))
#define DLIST_REL_OK(d)                                                        \
    pdx_handle_check_release((d), PDX_MAGIC_DLIST, __func__, "dlist")

#ifndef PDX_VERSION_STRING
#define PDX_VERSION_STRING "0.0.0"
#endif

const char *pdx_version(void) { return PDX_VERSION_STRING; }


pdx_status_t pdx_agent_create(const char *name,
                              const pdx_agent_params_t *params,
                              pdx_agent_h *agent_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(agent_p, "agent_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_log_call_agent(name);
    PDX_LEAVE(pdxi_agent_create(name, params, agent_p));
}

void pdx_agent_destroy(pdx_agent_h agent)
{
    PDX_ENTER();
    if (agent == NULL) { /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!AGENT_REL_OK(agent)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    char name[PDX_NAME_MAX]; /* the call's log lines outlive the agent */
    memcpy(name, agent->name, sizeof(name));
    pdx_log_call_agent(name);
    pdxi_agent_destroy(agent);
    PDX_LEAVE_VOID(PDX_OK);
}

const char *pdx_agent_name(pdx_agent_h agent)
{
    PDX_ENTER();
    const char *n = AGENT_OK(agent) ? pdxi_agent_name(agent) : NULL;
    pdx_call_leave(__func__, n ? PDX_OK : PDX_ERR_INVALID);
    return n;
}

int pdx_agent_event_fd(pdx_agent_h agent)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE_INT(PDX_ERR_INVALID);
    }
    PDX_LEAVE_INT(pdxi_agent_event_fd(agent));
}

pdx_status_t pdx_agent_set_invariant(pdx_agent_h agent, const char *key,
                                     const char *value)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(key, "key") ||
        !PDX_ARG_OK(value, "value")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_agent_set_invariant(agent, key, value));
}

pdx_status_t pdx_agent_describe(pdx_agent_h agent, void **blob_p,
                                size_t *len_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(blob_p, "blob_p") ||
        !PDX_ARG_OK(len_p, "len_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_agent_describe(agent, blob_p, len_p));
}

pdx_status_t pdx_backend_create(pdx_agent_h agent, const char *name,
                                const pdx_option_t *opts, size_t nopts,
                                pdx_backend_h *be_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(name, "name") ||
        (nopts > 0 && !PDX_ARG_OK(opts, "opts"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_backend_create(agent, name, opts, nopts, be_p));
}

pdx_status_t pdx_backend_create_with_ops(pdx_agent_h agent, const void *ops,
                                         const pdx_option_t *opts,
                                         size_t nopts, pdx_backend_h *be_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(ops, "ops") ||
        (nopts > 0 && !PDX_ARG_OK(opts, "opts"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_backend_create_with_ops(agent, ops, opts, nopts, be_p));
}

void pdx_backend_describe(pdx_backend_h be, char *buf, size_t len)
{
    PDX_ENTER();
    if (buf == NULL || len == 0) {
        pdx_log(PDX_LOG_ERROR, "%s: buf is NULL or empty", __func__);
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    buf[0] = '\0';
    if (!pdx_handle_check(be, PDX_MAGIC_BACKEND, __func__, "backend")) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pdxi_backend_describe(be, buf, len);
    PDX_LEAVE_VOID(PDX_OK);
}

pdx_status_t pdx_backend_probe(const char *name, uint64_t *caps_p, char *why,
                               size_t why_len)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(name, "name") || (why_len > 0 && !PDX_ARG_OK(why, "why"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_backend_probe(name, caps_p, why, why_len));
}

pdx_status_t pdx_blob_describe(const void *blob, size_t len, char **text_p,
                               char *why, size_t why_len)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(blob, "blob") || !PDX_ARG_OK(text_p, "text_p") ||
        (why_len > 0 && !PDX_ARG_OK(why, "why"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_blob_describe(blob, len, text_p, why, why_len));
}

pdx_status_t pdx_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                              uint64_t addr, uint64_t len, uint32_t dev_id,
                              uint64_t flags, pdx_mem_reg_h *reg_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(reg_p, "reg_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_register(agent, type, addr, len, dev_id, flags, reg_p));
}

pdx_status_t pdx_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg)
{
    PDX_ENTER();
    /* `reg` is only compared with the agent's registrations, never read,
     * so a stale one is refused safely. */
    if (!AGENT_REL_OK(agent) || !PDX_ARG_OK(reg, "reg")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_deregister(agent, reg));
}

pdx_status_t pdx_mem_alloc(size_t len, uint64_t flags, void **ptr_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(ptr_p, "ptr_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_alloc(len, flags, ptr_p));
}

pdx_status_t pdx_mem_free(void *ptr)
{
    PDX_ENTER();
    PDX_LEAVE(pdxi_mem_free(ptr));
}

pdx_status_t pdx_mem_share(void *addr, size_t len, int fd, uint64_t offset)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(addr, "addr")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_share(addr, len, fd, offset));
}

pdx_status_t pdx_mem_unshare(void *addr)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(addr, "addr")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_unshare(addr));
}

pdx_status_t pdx_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                        uint64_t *offset_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(ptr, "ptr") || !PDX_ARG_OK(fd_p, "fd_p") ||
        !PDX_ARG_OK(offset_p, "offset_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_mem_fd(ptr, len, fd_p, offset_p));
}

pdx_status_t pdx_peer_load(pdx_agent_h agent, const void *blob, size_t len,
                           char *name_out)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(blob, "blob")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_status_t st = pdxi_peer_load(agent, blob, len, name_out);
    if (st == PDX_OK) {
        pdx_agent_wake(agent); /* the progress thread watches its pidfd */
    }
    PDX_LEAVE(st);
}

pdx_status_t pdx_peer_unload(pdx_agent_h agent, const char *name)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(name, "name")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_peer_unload(agent, name));
}

pdx_status_t pdx_peer_state(pdx_agent_h agent, const char *name)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(name, "name")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_peer_state(agent, name));
}

pdx_status_t pdx_peer_info(pdx_agent_h agent, const char *name,
                           pdx_peer_info_t *info_p,
                           pdx_region_info_t *regions, size_t max_regions)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(name, "name") ||
        !PDX_ARG_OK(info_p, "info_p") ||
        (max_regions > 0 && !PDX_ARG_OK(regions, "regions"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_peer_info(agent, name, info_p, regions, max_regions));
}

int pdx_progress(pdx_agent_h agent)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE_INT(PDX_ERR_INVALID);
    }
    PDX_LEAVE_INT(pdxi_progress(agent));
}

pdx_status_t pdx_notif_send(pdx_agent_h agent, const char *peer,
                            const void *msg, size_t len)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(peer, "peer") ||
        (len > 0 && !PDX_ARG_OK(msg, "msg"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_notif_send(agent, peer, msg, len));
}

int pdx_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK((const void *)(uintptr_t)cb, "cb")) {
        PDX_LEAVE_INT(PDX_ERR_INVALID);
    }
    PDX_LEAVE_INT(pdxi_notif_poll(agent, cb, arg));
}

pdx_status_t pdx_xfer_create(pdx_agent_h agent, pdx_xfer_op_t op,
                             const pdx_desc_list_t *local,
                             const pdx_desc_list_t *remote, const char *peer,
                             const void *notif, size_t notif_len,
                             pdx_xfer_h *xfer_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(local, "local") ||
        !PDX_ARG_OK(remote, "remote") || !PDX_ARG_OK(peer, "peer") ||
        !PDX_ARG_OK(xfer_p, "xfer_p") ||
        (local->count > 0 && !PDX_ARG_OK(local->descs, "local->descs")) ||
        (remote->count > 0 && !PDX_ARG_OK(remote->descs, "remote->descs"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_create(agent, op, local, remote, peer, notif, notif_len,
                           xfer_p));
}

pdx_status_t pdx_xfer_post(pdx_xfer_h xfer)
{
    PDX_ENTER();
    if (!XFER_OK(xfer)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_status_t st = pdxi_xfer_post(xfer);
    if (st == PDX_INPROGRESS) {
        /* A sleeping progress thread takes the request's period now. */
        pdx_agent_wake(xfer->agent);
    }
    PDX_LEAVE(st);
}

pdx_status_t pdx_xfer_check(pdx_xfer_h xfer)
{
    /* A request whose last post ended PDX_OK and that holds nothing of
     * its backend any more: nothing to progress, log or lock (a sixth of
     * a small request's CPU was this call's lock, call record and
     * checks). Anything else, a bad handle included, takes the full way. */
    if (xfer != NULL && *(const volatile uint32_t *)xfer == PDX_MAGIC_XFER &&
        pdx_xfer_settled(xfer) && xfer->agent != NULL &&
        !pdx_handle_inherited(xfer->agent)) {
        return PDX_OK;
    }
    PDX_ENTER();
    if (!XFER_OK(xfer)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_check(xfer));
}

pdx_status_t pdx_xfer_abort(pdx_xfer_h xfer)
{
    PDX_ENTER();
    if (!XFER_OK(xfer)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_abort(xfer));
}

void pdx_xfer_release(pdx_xfer_h xfer)
{
    PDX_ENTER();
    if (xfer == NULL) { /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!XFER_REL_OK(xfer)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pdxi_xfer_release(xfer);
    PDX_LEAVE_VOID(PDX_OK);
}

size_t pdx_xfer_segments(pdx_xfer_h xfer)
{
    PDX_ENTER();
    size_t n = 0;
    if (XFER_OK(xfer)) {
        n = pdxi_xfer_segments(xfer);
        pdx_call_leave(__func__, PDX_OK);
    } else {
        pdx_call_leave(__func__, PDX_ERR_INVALID);
    }
    return n;
}

pdx_status_t pdx_xfer_set_notif(pdx_xfer_h xfer, const void *msg, size_t len)
{
    PDX_ENTER();
    if (!XFER_OK(xfer) || (len > 0 && !PDX_ARG_OK(msg, "msg"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_set_notif(xfer, msg, len));
}

pdx_status_t pdx_xfer_telemetry(pdx_xfer_h xfer, pdx_xfer_telemetry_t *tel_p)
{
    PDX_ENTER();
    if (!XFER_OK(xfer) || !PDX_ARG_OK(tel_p, "tel_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_telemetry(xfer, tel_p));
}

pdx_status_t pdx_dlist_prepare(pdx_agent_h agent, const char *peer,
                               const pdx_desc_list_t *list,
                               pdx_dlist_h *dlist_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(list, "list") ||
        !PDX_ARG_OK(dlist_p, "dlist_p") ||
        (list->count > 0 && !PDX_ARG_OK(list->descs, "list->descs"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_dlist_prepare(agent, peer, list, dlist_p));
}

void pdx_dlist_release(pdx_dlist_h dlist)
{
    PDX_ENTER();
    if (dlist == NULL) {
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!DLIST_REL_OK(dlist)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pdxi_dlist_release(dlist);
    PDX_LEAVE_VOID(PDX_OK);
}

pdx_status_t pdx_xfer_make(pdx_agent_h agent, pdx_xfer_op_t op,
                           pdx_dlist_h local, const uint32_t *local_idx,
                           pdx_dlist_h remote, const uint32_t *remote_idx,
                           size_t n, const void *notif, size_t notif_len,
                           pdx_xfer_h *xfer_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !DLIST_OK(local, "local") ||
        !DLIST_OK(remote, "remote") || !PDX_ARG_OK(local_idx, "local_idx") ||
        !PDX_ARG_OK(remote_idx, "remote_idx") ||
        !PDX_ARG_OK(xfer_p, "xfer_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_xfer_make(agent, op, local, local_idx, remote, remote_idx, n,
                         notif, notif_len, xfer_p));
}

pdx_status_t pdx_stats_backend(pdx_agent_h agent, const char *backend,
                               pdx_stats_t *stats_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(backend, "backend") ||
        !PDX_ARG_OK(stats_p, "stats_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_stats_backend(agent, backend, stats_p));
}

pdx_status_t pdx_stats_peer(pdx_agent_h agent, const char *peer,
                            pdx_stats_t *stats_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(peer, "peer") ||
        !PDX_ARG_OK(stats_p, "stats_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_stats_peer(agent, peer, stats_p));
}

pdx_status_t pdx_stats_json(pdx_agent_h agent, char **json_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(json_p, "json_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_stats_json(agent, json_p));
}

pdx_status_t pdx_metrics_text(pdx_agent_h agent, char **text_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || !PDX_ARG_OK(text_p, "text_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_metrics_text(agent, text_p));
}

pdx_status_t pdx_metrics_start(pdx_agent_h agent,
                               const pdx_metrics_params_t *params,
                               uint16_t *port_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_metrics_start(agent, params, port_p));
}

pdx_status_t pdx_metrics_stop(pdx_agent_h agent)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_status_t st = pdxi_metrics_stop(agent);
    if (st == PDX_ERR_NOT_FOUND) {
        pdx_error("agent %s: metrics: no HTTP endpoint to stop",
                  agent->name);
    }
    PDX_LEAVE(st);
}

/* ---- discovery and the block-owner registry (pdx/store.h) ---- */

pdx_status_t pdx_agent_publish(pdx_agent_h agent)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_agent_publish(agent));
}

pdx_status_t pdx_peer_fetch(pdx_agent_h agent, const char *name,
                            uint32_t timeout_ms)
{
    PDX_ENTER();
    if (!AGENT_OK(agent)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_peer_fetch(agent, name, timeout_ms));
}

pdx_status_t pdx_store_status(pdx_agent_h agent, pdx_store_status_t *status_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || status_p == NULL) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_status(agent, status_p));
}

pdx_status_t pdx_store_counters(pdx_agent_h agent, pdx_store_counters_t *c_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || c_p == NULL ||
        c_p->size < offsetof(pdx_store_counters_t, events)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_counters(agent, c_p));
}

pdx_status_t pdx_store_describe(pdx_agent_h agent, char *buf, size_t len)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || buf == NULL || len == 0) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_describe(agent, buf, len));
}

pdx_status_t pdx_store_owners_add(pdx_agent_h agent, const char *const *blocks,
                                  size_t n, uint32_t *counts)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || (blocks == NULL && n > 0)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_owners_add(agent, blocks, n, counts));
}

pdx_status_t pdx_store_owners_del(pdx_agent_h agent, const char *const *blocks,
                                  size_t n)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || (blocks == NULL && n > 0)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_owners_del(agent, blocks, n));
}

pdx_status_t pdx_store_owners_get(pdx_agent_h agent, const char *const *blocks,
                                  size_t n, pdx_store_owner_cb_t cb, void *arg)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || (blocks == NULL && n > 0) || cb == NULL) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_owners_get(agent, blocks, n, cb, arg));
}

pdx_status_t pdx_store_owners_longest(pdx_agent_h agent,
                                      const char *const *blocks, size_t n,
                                      char *owner_out, size_t *prefix_p)
{
    PDX_ENTER();
    if (!AGENT_OK(agent) || (blocks == NULL && n > 0) || owner_out == NULL ||
        prefix_p == NULL) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdxi_store_owners_longest(agent, blocks, n, owner_out, prefix_p));
}
