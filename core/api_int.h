/* The implementations behind the exported functions of api.c. Each pdxi_
 * function has the contract of the pdx_ function of the same name; api.c
 * checks handles and arguments that would crash, and runs each call inside
 * the error capture of pdx_call.h. */
#ifndef PDX_API_INT_H
#define PDX_API_INT_H

#include <pdx/agent.h>
#include <pdx/backend_instance.h>
#include <pdx/blob.h>
#include <pdx/log.h>
#include <pdx/mem.h>
#include <pdx/notif.h>
#include <pdx/peer.h>
#include <pdx/stats.h>
#include <pdx/status.h>
#include <pdx/store.h>
#include <pdx/types.h>
#include <pdx/xfer.h>

pdx_status_t pdxi_agent_create(const char *name,
                               const pdx_agent_params_t *params,
                               pdx_agent_h *agent_p);
void pdxi_agent_destroy(pdx_agent_h agent);
const char *pdxi_agent_name(pdx_agent_h agent);
int pdxi_agent_event_fd(pdx_agent_h agent);
pdx_status_t pdxi_agent_set_invariant(pdx_agent_h agent, const char *key,
                                      const char *value);
pdx_status_t pdxi_agent_describe(pdx_agent_h agent, void **blob_p,
                                 size_t *len_p);
pdx_status_t pdxi_backend_create(pdx_agent_h agent, const char *name,
                                 const pdx_option_t *opts, size_t nopts,
                                 pdx_backend_h *be_p);
pdx_status_t pdxi_backend_create_with_ops(pdx_agent_h agent, const void *ops,
                                          const pdx_option_t *opts,
                                          size_t nopts, pdx_backend_h *be_p);
void pdxi_backend_describe(pdx_backend_h be, char *buf, size_t len);
pdx_status_t pdxi_backend_probe(const char *name, uint64_t *caps_p,
                                char *why, size_t why_len);
pdx_status_t pdxi_blob_describe(const void *blob, size_t len, char **text_p,
                                char *why, size_t why_len);
pdx_status_t pdxi_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                               uint64_t addr, uint64_t len, uint32_t dev_id,
                               uint64_t flags, pdx_mem_reg_h *reg_p);
pdx_status_t pdxi_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg);
pdx_status_t pdxi_mem_alloc(size_t len, uint64_t flags, void **ptr_p);
pdx_status_t pdxi_mem_free(void *ptr);
pdx_status_t pdxi_mem_share(void *addr, size_t len, int fd, uint64_t offset);
pdx_status_t pdxi_mem_unshare(void *addr);
pdx_status_t pdxi_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                         uint64_t *offset_p);
pdx_status_t pdxi_xfer_set_notif(pdx_xfer_h xfer, const void *msg,
                                 size_t len);
pdx_status_t pdxi_peer_load(pdx_agent_h agent, const void *blob, size_t len,
                            char *name_out);
pdx_status_t pdxi_peer_unload(pdx_agent_h agent, const char *name);
pdx_status_t pdxi_peer_state(pdx_agent_h agent, const char *name);
pdx_status_t pdxi_peer_info(pdx_agent_h agent, const char *name,
                            pdx_peer_info_t *info_p,
                            pdx_region_info_t *regions, size_t max_regions);
int pdxi_progress(pdx_agent_h agent);
pdx_status_t pdxi_notif_send(pdx_agent_h agent, const char *peer,
                             const void *msg, size_t len);
int pdxi_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg);
pdx_status_t pdxi_xfer_create(pdx_agent_h agent, pdx_xfer_op_t op,
                              const pdx_desc_list_t *local,
                              const pdx_desc_list_t *remote, const char *peer,
                              const void *notif, size_t notif_len,
                              pdx_xfer_h *xfer_p);
pdx_status_t pdxi_xfer_post(pdx_xfer_h xfer);
pdx_status_t pdxi_xfer_check(pdx_xfer_h xfer);
pdx_status_t pdxi_xfer_abort(pdx_xfer_h xfer);
void pdxi_xfer_release(pdx_xfer_h xfer);
size_t pdxi_xfer_segments(pdx_xfer_h xfer);
pdx_status_t pdxi_xfer_telemetry(pdx_xfer_h xfer, pdx_xfer_telemetry_t *tel);
pdx_status_t pdxi_dlist_prepare(pdx_agent_h agent, const char *peer,
                                const pdx_desc_list_t *list,
                                pdx_dlist_h *dlist_p);
void pdxi_dlist_release(pdx_dlist_h dlist);
pdx_status_t pdxi_xfer_make(pdx_agent_h agent, pdx_xfer_op_t op,
                            pdx_dlist_h local, const uint32_t *local_idx,
                            pdx_dlist_h remote, const uint32_t *remote_idx,
                            size_t n, const void *notif, size_t notif_len,
                            pdx_xfer_h *xfer_p);
pdx_status_t pdxi_stats_backend(pdx_agent_h agent, const char *backend,
                                pdx_stats_t *stats_p);
pdx_status_t pdxi_stats_peer(pdx_agent_h agent, const char *peer,
                             pdx_stats_t *stats_p);
pdx_status_t pdxi_stats_json(pdx_agent_h agent, char **json_p);
/* discovery.c */
pdx_status_t pdxi_agent_publish(pdx_agent_h agent);
pdx_status_t pdxi_peer_fetch(pdx_agent_h agent, const char *name,
                             uint32_t timeout_ms);
pdx_status_t pdxi_store_status(pdx_agent_h agent, pdx_store_status_t *status_p);
pdx_status_t pdxi_store_counters(pdx_agent_h agent, pdx_store_counters_t *c_p);
pdx_status_t pdxi_store_describe(pdx_agent_h agent, char *buf, size_t len);
/* owners.c */
pdx_status_t pdxi_store_owners_add(pdx_agent_h agent,
                                   const char *const *blocks, size_t n,
                                   uint32_t *counts);
pdx_status_t pdxi_store_owners_del(pdx_agent_h agent,
                                   const char *const *blocks, size_t n);
pdx_status_t pdxi_store_owners_get(pdx_agent_h agent,
                                   const char *const *blocks, size_t n,
                                   pdx_store_owner_cb_t cb, void *arg);
pdx_status_t pdxi_store_owners_longest(pdx_agent_h agent,
                                       const char *const *blocks, size_t n,
                                       char *owner_out, size_t *prefix_p);

#endif
