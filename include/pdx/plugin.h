/* The exported, versioned function table of libpdx.so, for stacks that
 * dlopen pdx and call through one symbol (`pdx_plugin_v1`).
 *
 * Rules: `abi_version` and `size` come first; fields are only ever
 * appended. Before calling a field added after the first release, check
 * `table->size > offsetof(pdx_plugin_v1_t, field)`. Every function has the
 * contract of the plain C function of the same name (the header of its
 * object: pdx/agent.h, mem.h, peer.h, xfer.h, ..., the connector's). */
#ifndef PDX_PLUGIN_H
#define PDX_PLUGIN_H

#include <stddef.h>

#include <pdx/agent.h>
#include <pdx/backend_instance.h>
#include <pdx/blob.h>
#include <pdx/kv_config.h>
#include <pdx/kv_connector.h>
#include <pdx/log.h>
#include <pdx/mem.h>
#include <pdx/metrics.h>
#include <pdx/notif.h>
#include <pdx/peer.h>
#include <pdx/stats.h>
#include <pdx/store.h>
#include <pdx/xfer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_PLUGIN_ABI_VERSION 1u
#define PDX_PLUGIN_SYMBOL "pdx_plugin_v1"

typedef struct pdx_plugin_v1 {
    uint32_t abi_version;
    uint32_t size;
    const char *version; /* pdx release, e.g. "0.1.0" */

    const char *(*status_string)(pdx_status_t);
    void (*log_set_handler)(pdx_log_cb_t, void *);
    void (*log_set_level)(pdx_log_level_t);

    pdx_status_t (*agent_create)(const char *, const pdx_agent_params_t *,
                                 pdx_agent_h *);
    void (*agent_destroy)(pdx_agent_h);
    const char *(*agent_name)(pdx_agent_h);
    pdx_status_t (*backend_create)(pdx_agent_h, const char *,
                                   const pdx_option_t *, size_t,
                                   pdx_backend_h *);
    pdx_status_t (*backend_probe)(const char *, uint64_t *, char *, size_t);
    pdx_status_t (*mem_register)(pdx_agent_h, pdx_mem_type_t, uint64_t,
                                 uint64_t, uint32_t, uint64_t,
                                 pdx_mem_reg_h *);
    pdx_status_t (*mem_deregister)(pdx_agent_h, pdx_mem_reg_h);
    pdx_status_t (*agent_describe)(pdx_agent_h, void **, size_t *);
    void (*blob_free)(void *);
    pdx_status_t (*peer_load)(pdx_agent_h, const void *, size_t, char *);
    pdx_status_t (*peer_unload)(pdx_agent_h, const char *);
    pdx_status_t (*peer_state)(pdx_agent_h, const char *);
    pdx_status_t (*agent_set_invariant)(pdx_agent_h, const char *,
                                        const char *);
    int (*progress)(pdx_agent_h);
    int (*agent_event_fd)(pdx_agent_h);

    pdx_status_t (*xfer_create)(pdx_agent_h, pdx_xfer_op_t,
                                const pdx_desc_list_t *,
                                const pdx_desc_list_t *, const char *,
                                const void *, size_t, pdx_xfer_h *);
    pdx_status_t (*xfer_post)(pdx_xfer_h);
    pdx_status_t (*xfer_check)(pdx_xfer_h);
    void (*xfer_release)(pdx_xfer_h);
    size_t (*xfer_segments)(pdx_xfer_h);
    pdx_status_t (*dlist_prepare)(pdx_agent_h, const char *,
                                  const pdx_desc_list_t *, pdx_dlist_h *);
    void (*dlist_release)(pdx_dlist_h);
    pdx_status_t (*xfer_make)(pdx_agent_h, pdx_xfer_op_t, pdx_dlist_h,
                              const uint32_t *, pdx_dlist_h,
                              const uint32_t *, size_t, const void *, size_t,
                              pdx_xfer_h *);
    pdx_status_t (*notif_send)(pdx_agent_h, const char *, const void *,
                               size_t);
    int (*notif_poll)(pdx_agent_h, pdx_notif_cb_t, void *);
    pdx_status_t (*blob_describe)(const void *, size_t, char **, char *,
                                  size_t);

    /* KV connector (pdx/kv_connector.h, kv_config.h, kv_layout.h,
     * kv_hash.h). */
    pdx_status_t (*kv_config_load)(const char *, pdx_kv_config_t *, char *,
                                   size_t);
    pdx_status_t (*layout_glm52)(uint64_t, pdx_mem_type_t, uint32_t,
                                 pdx_layout_h *);
    uint64_t (*layout_carve_size)(pdx_layout_h, uint64_t);
    pdx_status_t (*layout_carve)(pdx_layout_h, uint64_t, uint64_t, uint64_t,
                                 uint32_t);
    void (*layout_destroy)(pdx_layout_h);
    pdx_status_t (*hasher_hash_blocks)(pdx_hasher_h, const uint64_t *, size_t,
                                       const pdx_hash_extra_t *,
                                       pdx_block_hash_t *, size_t, size_t *,
                                       pdx_block_hash_t *, int *);
    pdx_status_t (*kv_connector_create)(const pdx_kv_connector_params_t *,
                                        pdx_kv_connector_h *);
    void (*kv_connector_destroy)(pdx_kv_connector_h);
    pdx_hasher_h (*kv_connector_hasher)(pdx_kv_connector_h);
    pdx_status_t (*kv_connector_describe)(pdx_kv_connector_h, void **,
                                          size_t *);
    pdx_status_t (*kv_connector_connect)(pdx_kv_connector_h, const void *,
                                         size_t, char *);
    pdx_status_t (*kv_lookup)(pdx_kv_connector_h, const pdx_kv_request_t *,
                              pdx_kv_match_t *);
    pdx_status_t (*kv_load)(pdx_kv_connector_h, const pdx_kv_request_t *,
                            const pdx_kv_match_t *, const uint64_t *);
    pdx_status_t (*kv_load_check)(pdx_kv_connector_h, const char *, size_t *);
    pdx_status_t (*kv_save)(pdx_kv_connector_h, const pdx_kv_request_t *,
                            const uint64_t *);
    pdx_status_t (*kv_save_check)(pdx_kv_connector_h, const char *);
    pdx_status_t (*kv_request_finished)(pdx_kv_connector_h,
                                        const pdx_kv_request_t *,
                                        const uint64_t *, size_t,
                                        pdx_kv_handoff_from_t, char **);
    pdx_status_t (*kv_reject)(pdx_kv_connector_h, const char *);
    int (*kv_progress)(pdx_kv_connector_h);
    int (*kv_poll_freed)(pdx_kv_connector_h, pdx_kv_freed_cb_t, void *);
    void (*kv_free)(void *);
    pdx_status_t (*xfer_abort)(pdx_xfer_h);
    pdx_status_t (*kv_load_abort)(pdx_kv_connector_h, const char *);
    pdx_status_t (*mem_alloc)(size_t, uint64_t, void **);
    pdx_status_t (*mem_free)(void *);
    pdx_status_t (*mem_share)(void *, size_t, int, uint64_t);
    pdx_status_t (*mem_unshare)(void *);
    /* Appended for the error, telemetry and stats API (pdx/status.h,
     * agent.h, xfer.h). */
    const char *(*last_error)(void);
    pdx_status_t (*last_status)(void);
    pdx_status_t (*xfer_telemetry)(pdx_xfer_h, pdx_xfer_telemetry_t *);
    pdx_status_t (*peer_info)(pdx_agent_h, const char *, pdx_peer_info_t *,
                              pdx_region_info_t *, size_t);
    pdx_status_t (*stats_backend)(pdx_agent_h, const char *, pdx_stats_t *);
    pdx_status_t (*stats_peer)(pdx_agent_h, const char *, pdx_stats_t *);
    pdx_status_t (*stats_json)(pdx_agent_h, char **);
    pdx_status_t (*mem_fd)(const void *, uint64_t, int *, uint64_t *);
    pdx_status_t (*xfer_set_notif)(pdx_xfer_h, const void *, size_t);
    /* Appended for multi-node on a store (pdx/store.h,
     * pdx/kv_connector.h). */
    pdx_status_t (*agent_publish)(pdx_agent_h);
    pdx_status_t (*peer_fetch)(pdx_agent_h, const char *, uint32_t);
    pdx_status_t (*store_status)(pdx_agent_h, pdx_store_status_t *);
    pdx_status_t (*store_describe)(pdx_agent_h, char *, size_t);
    pdx_status_t (*store_owners_add)(pdx_agent_h, const char *const *,
                                     size_t, uint32_t *);
    pdx_status_t (*store_owners_del)(pdx_agent_h, const char *const *,
                                     size_t);
    pdx_status_t (*store_owners_get)(pdx_agent_h, const char *const *, size_t,
                                     pdx_store_owner_cb_t, void *);
    pdx_status_t (*store_owners_longest)(pdx_agent_h, const char *const *,
                                         size_t, char *, size_t *);
    pdx_status_t (*kv_store_stats)(pdx_kv_connector_h,
                                   pdx_kv_store_stats_t *);
    /* Appended for metrics and quiet logging (pdx/metrics.h,
     * pdx/log.h). */
    pdx_status_t (*metrics_text)(pdx_agent_h, char **);
    pdx_status_t (*metrics_start)(pdx_agent_h, const pdx_metrics_params_t *,
                                  uint16_t *);
    pdx_status_t (*metrics_stop)(pdx_agent_h);
    void (*log_set_quiet_failures)(int);
} pdx_plugin_v1_t;

_Static_assert(offsetof(pdx_plugin_v1_t, abi_version) == 0, "abi first");
_Static_assert(offsetof(pdx_plugin_v1_t, size) == 4, "size second");
_Static_assert(offsetof(pdx_plugin_v1_t, version) == 8, "v1 layout");

/* The table, the one symbol a dlopen'ing stack needs (PDX_PLUGIN_SYMBOL);
 * its `size` is sizeof(pdx_plugin_v1_t) of this build. (A variable: its
 * block has no parameters and no return value.)
 *
 * Owns: the table and every string in it are the library's, constant,
 *       valid while libpdx.so is loaded.
 * Blocks: no (reading it; each function has its own contract).
 * Threads: any thread.
 */
PDX_API extern const pdx_plugin_v1_t pdx_plugin_v1;

/* pdx_version: pdx/agent.h; pdx_blob_describe: pdx/blob.h (included
 * above). */

#ifdef __cplusplus
}
#endif
#endif
