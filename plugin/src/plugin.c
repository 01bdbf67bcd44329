/* The exported function table and blob decoding for tools. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <pdx/plugin.h>

#include "blob.h"
#include "sign.h"

#ifndef PDX_VERSION_STRING
#define PDX_VERSION_STRING "0.0.0"
#endif

const char *pdx_version(void) { return PDX_VERSION_STRING; }

pdx_status_t pdxi_blob_describe(const void *blob, size_t len, char **text_p,
                               char *why, size_t why_len)
{
    pdx_blob_t *b = NULL;
    const void *in = NULL;
    size_t in_len = 0;
    /* A signed blob (sign.h) is shown unverified: tools hold no key. */
    pdx_status_t st = pdxi_blob_open(NULL, blob, len, &in, &in_len, why,
                                     why_len);
    bool sealed = st == PDX_OK && in != blob;
    if (st == PDX_OK) {
        st = pdx_blob_parse(in, in_len, &b, why, why_len);
    }
    if (st != PDX_OK) {
        return st;
    }
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f == NULL) {
        pdx_blob_free_parsed(b);
        return PDX_ERR_NOMEM;
    }
    fprintf(f, "agent:      %s\n", b->name);
    fprintf(f, "instance:   %016llx\n", (unsigned long long)b->instance);
    fprintf(f, "generation: %u\n", b->generation);
    fprintf(f, "host:       %s\n", b->host_id);
    fprintf(f, "pid:        %d\n", (int)b->pid);
    fprintf(f, "blob:       %zu bytes, version %u%s\n", len, PDX_BLOB_VERSION,
            sealed ? ", signed (HMAC-SHA-256, not verified here)" : "");
    fprintf(f, "invariants: %u\n", b->ninv);
    for (uint16_t i = 0; i < b->ninv; i++) {
        fprintf(f, "  %s = %s\n", b->inv[i].key, b->inv[i].value);
    }
    fprintf(f, "backends:   %u\n", b->nbackends);
    for (uint16_t i = 0; i < b->nbackends; i++) {
        fprintf(f, "  [%u] %s (%u bytes of connection info)\n", i,
                b->backends[i].name, b->backends[i].conn_len);
    }
    fprintf(f, "regions:    %u\n", b->nregions);
    for (uint32_t i = 0; i < b->nregions; i++) {
        const pdx_blob_region_t *g = &b->regions[i];
        fprintf(f, "  %s 0x%llx +%llu dev %u keys:",
                g->region.mem_type == PDX_MEM_VRAM ? "VRAM" : "DRAM",
                (unsigned long long)g->region.addr,
                (unsigned long long)g->region.len, g->region.dev_id);
        for (uint16_t k = 0; k < g->nkeys; k++) {
            fprintf(f, " %s(%u B)", b->backends[g->keys[k].backend].name,
                    g->keys[k].len);
        }
        fprintf(f, "\n");
    }
    fclose(f);
    pdx_blob_free_parsed(b);
    if (text == NULL) {
        return PDX_ERR_NOMEM;
    }
    *text_p = text;
    return PDX_OK;
}

const pdx_plugin_v1_t pdx_plugin_v1 = {
    .abi_version = PDX_PLUGIN_ABI_VERSION,
    .size = sizeof(pdx_plugin_v1_t),
    .version = PDX_VERSION_STRING,
    .status_string = pdx_status_string,
    .log_set_handler = pdx_log_set_handler,
    .log_set_level = pdx_log_set_level,
    .agent_create = pdx_agent_create,
    .agent_destroy = pdx_agent_destroy,
    .agent_name = pdx_agent_name,
    .backend_create = pdx_backend_create,
    .backend_probe = pdx_backend_probe,
    .mem_register = pdx_mem_register,
    .mem_deregister = pdx_mem_deregister,
    .agent_describe = pdx_agent_describe,
    .blob_free = pdx_blob_free,
    .peer_load = pdx_peer_load,
    .peer_unload = pdx_peer_unload,
    .peer_state = pdx_peer_state,
    .agent_set_invariant = pdx_agent_set_invariant,
    .progress = pdx_progress,
    .agent_event_fd = pdx_agent_event_fd,
    .xfer_create = pdx_xfer_create,
    .xfer_post = pdx_xfer_post,
    .xfer_check = pdx_xfer_check,
    .xfer_release = pdx_xfer_release,
    .xfer_segments = pdx_xfer_segments,
    .dlist_prepare = pdx_dlist_prepare,
    .dlist_release = pdx_dlist_release,
    .xfer_make = pdx_xfer_make,
    .notif_send = pdx_notif_send,
    .notif_poll = pdx_notif_poll,
    .blob_describe = pdx_blob_describe,
    .kv_config_load = pdx_kv_config_load,
    .layout_glm52 = pdx_layout_glm52,
    .layout_carve_size = pdx_layout_carve_size,
    .layout_carve = pdx_layout_carve,
    .layout_destroy = pdx_layout_destroy,
    .hasher_hash_blocks = pdx_hasher_hash_blocks,
    .kv_connector_create = pdx_kv_connector_create,
    .kv_connector_destroy = pdx_kv_connector_destroy,
    .kv_connector_hasher = pdx_kv_connector_hasher,
    .kv_connector_describe = pdx_kv_connector_describe,
    .kv_connector_connect = pdx_kv_connector_connect,
    .kv_lookup = pdx_kv_lookup,
    .kv_load = pdx_kv_load,
    .kv_load_check = pdx_kv_load_check,
    .kv_save = pdx_kv_save,
    .kv_save_check = pdx_kv_save_check,
    .kv_request_finished = pdx_kv_request_finished,
    .kv_reject = pdx_kv_reject,
    .kv_progress = pdx_kv_progress,
    .kv_poll_freed = pdx_kv_poll_freed,
    .kv_free = pdx_kv_free,
    .xfer_abort = pdx_xfer_abort,
    .kv_load_abort = pdx_kv_load_abort,
    .mem_alloc = pdx_mem_alloc,
    .mem_free = pdx_mem_free,
    .mem_share = pdx_mem_share,
    .mem_unshare = pdx_mem_unshare,
    .last_error = pdx_last_error,
    .last_status = pdx_last_status,
    .xfer_telemetry = pdx_xfer_telemetry,
    .peer_info = pdx_peer_info,
    .stats_backend = pdx_stats_backend,
    .stats_peer = pdx_stats_peer,
    .stats_json = pdx_stats_json,
    .mem_fd = pdx_mem_fd,
    .xfer_set_notif = pdx_xfer_set_notif,
    .agent_publish = pdx_agent_publish,
    .peer_fetch = pdx_peer_fetch,
    .store_status = pdx_store_status,
    .store_describe = pdx_store_describe,
    .store_owners_add = pdx_store_owners_add,
    .store_owners_del = pdx_store_owners_del,
    .store_owners_get = pdx_store_owners_get,
    .store_owners_longest = pdx_store_owners_longest,
    .kv_store_stats = pdx_kv_store_stats,
};
