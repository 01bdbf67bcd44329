/* glm52-pd-node's messages to the driver: reply heads, names, and the
 * stats a drain or stats request returns. */
#include <stdio.h>
#include <string.h>

#include <pdx/blob.h>
#include <pdx/stats.h>
#include <pdx/store.h>

#include "node.h"

const char *const g_abort_names[ABORTED_KINDS] = {"load", "reject",
                                                  "after_load"};

const char *role_name(pdx_kv_role_t r)
{
    return r == PDX_KV_ROLE_PRODUCER   ? "producer"
           : r == PDX_KV_ROLE_CONSUMER ? "consumer"
                                       : "both";
}

const char *source_name(pdx_kv_source_t s)
{
    return s == PDX_KV_SOURCE_REMOTE    ? "remote"
           : s == PDX_KV_SOURCE_OFFLOAD ? "offload"
                                        : "none";
}

void send_msg(node_t *nd, cJSON *msg)
{
    if (pd_chan_send(&nd->chan, msg) != 0) {
        say("driver channel failed: %s", strerror(nd->chan.error));
        nd->quit = true;
    }
    cJSON_Delete(msg);
}

cJSON *reply_head(const char *op, bool ok)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "op", op);
    cJSON_AddBoolToObject(r, "ok", ok);
    return r;
}

cJSON *stats_json(node_t *nd)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "agent", nd->cfg.agent_name);
    cJSON_AddNumberToObject(s, "held", (double)pdx_kv_held_requests(nd->conn));
    cJSON_AddNumberToObject(s, "free_blocks", (double)nd->nfree);
    /* GPU arenas: block copies between them and the mirror (gpu.c). */
    cJSON_AddStringToObject(s, "memory", nd->gpu != NULL ? "vram" : "dram");
    cJSON_AddNumberToObject(s, "gpu_block_copies", (double)nd->gpu_copies);
    cJSON_AddNumberToObject(s, "num_blocks", nd->cfg.num_blocks);
    cJSON_AddNumberToObject(s, "peak_blocks", (double)nd->peak_used);
    cJSON_AddNumberToObject(s, "jobs_ok", (double)nd->jobs_ok);
    cJSON_AddNumberToObject(s, "jobs_failed", (double)nd->jobs_failed);
    cJSON_AddNumberToObject(s, "freed_done", (double)nd->freed[0]);
    cJSON_AddNumberToObject(s, "freed_reject", (double)nd->freed[1]);
    cJSON_AddNumberToObject(s, "freed_expired", (double)nd->freed[2]);
    cJSON *ab = cJSON_AddObjectToObject(s, "aborted");
    for (int k = 0; k < ABORTED_KINDS; k++) {
        cJSON_AddNumberToObject(ab, g_abort_names[k], (double)nd->aborted[k]);
    }
    cJSON_AddNumberToObject(s, "rejects_sent", (double)nd->rejects_sent);
    cJSON_AddNumberToObject(s, "abort_call_ms_max", nd->abort_call_ms_max);
    cJSON_AddNumberToObject(s, "abort_final_ms_max", nd->abort_final_ms_max);
    cJSON_AddNumberToObject(s, "abort_completed", (double)nd->abort_completed);
    cJSON_AddNumberToObject(s, "abort_stuck", (double)nd->abort_stuck);
    cJSON_AddNumberToObject(s, "canary_blocks", (double)nd->canary_blocks);
    cJSON_AddNumberToObject(s, "late_bytes", (double)nd->late_bytes);
    size_t nq = 0;
    for (const quarantine_t *q = nd->quarantine; q != NULL; q = q->next) {
        nq++;
    }
    cJSON_AddNumberToObject(s, "quarantined", (double)nq);
    pdx_offload_stats_t os;
    if (pdx_kv_offload_stats(nd->conn, &os) == PDX_OK) {
        cJSON *o = cJSON_AddObjectToObject(s, "offload");
        cJSON_AddNumberToObject(o, "capacity_blocks",
                                (double)os.capacity_blocks);
        cJSON_AddNumberToObject(o, "blocks",
                                (double)(os.blocks[0] + os.blocks[1]));
        cJSON_AddNumberToObject(o, "leased_blocks", (double)os.leased_blocks);
        cJSON_AddNumberToObject(o, "saves", (double)os.saves);
        cJSON_AddNumberToObject(o, "dup_saves", (double)os.dup_saves);
        cJSON_AddNumberToObject(o, "hits", (double)os.hits);
        cJSON_AddNumberToObject(o, "misses", (double)os.misses);
        cJSON_AddNumberToObject(o, "evictions",
                                (double)(os.evictions[0] + os.evictions[1]));
        cJSON_AddNumberToObject(o, "no_space", (double)os.no_space);
        cJSON_AddNumberToObject(o, "bytes_saved", (double)os.bytes_saved);
        cJSON_AddNumberToObject(o, "bytes_loaded", (double)os.bytes_loaded);
    }
    /* The agent's peers and their paths (pdx-validate --multi-node shows
     * the cross-host path), and what the store section did. */
    char *aj = NULL;
    if (pdx_stats_json(pdx_kv_connector_agent(nd->conn), &aj) == PDX_OK) {
        cJSON_AddItemToObject(s, "agent_stats", cJSON_Parse(aj));
        pdx_blob_free(aj);
    }
    pdx_kv_store_stats_t ks;
    if (nd->cfg.has_store && pdx_kv_store_stats(nd->conn, &ks) == PDX_OK) {
        cJSON *k = cJSON_AddObjectToObject(s, "store");
        cJSON_AddNumberToObject(k, "discovered", (double)ks.discovered);
        cJSON_AddNumberToObject(k, "registered_blocks",
                                (double)ks.registered_blocks);
        cJSON_AddNumberToObject(k, "demoted", (double)ks.demoted);
        cJSON_AddNumberToObject(k, "remote_hits", (double)ks.remote_hits);
        cJSON_AddNumberToObject(k, "remote_hit_blocks",
                                (double)ks.remote_hit_blocks);
        cJSON_AddNumberToObject(k, "remote_served", (double)ks.remote_served);
        char line[512];
        pdx_store_describe(pdx_kv_connector_agent(nd->conn), line,
                           sizeof(line));
        cJSON_AddStringToObject(k, "describe", line);
    }
    return s;
}
