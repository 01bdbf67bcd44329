/* This agent described: its public metadata (name, generation, host id,
 * each backend's connection info, each region's public keys, the
 * connector's invariants) as a blob, sealed with the cluster key when one
 * is set; and any blob as text for tools (pdx-info --blob). The blob's
 * format is blob.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "mem_int.h"
#include "sign_int.h"

pdx_status_t pdxi_agent_describe(pdx_agent_h agent, void **blob_p,
                                size_t *len_p)
{
    pdx_wbuf_t w = {0};
    pdx_status_t st = PDX_OK;
    pdx_agent_lock(agent);
    pdx_blob_begin(&w);
    pdx_wbuf_str(&w, agent->name);
    pdx_wbuf_u64(&w, agent->instance);
    pdx_wbuf_u32(&w, agent->generation);
    pdx_wbuf_u32(&w, (uint32_t)getpid());
    pdx_wbuf_str(&w, agent->host_id);
    pdx_wbuf_u16(&w, (uint16_t)agent->ninvariants);
    for (uint32_t i = 0; i < agent->ninvariants; i++) {
        pdx_wbuf_str(&w, agent->invariants[i].key);
        pdx_wbuf_str(&w, agent->invariants[i].value);
    }
    pdx_wbuf_u16(&w, (uint16_t)agent->nbackends);
    for (uint32_t b = 0; b < agent->nbackends && st == PDX_OK; b++) {
        struct pdx_backend *be = agent->backends[b];
        void *conn = NULL;
        size_t clen = 0;
        st = be->ops->conn_info(be->be, &conn, &clen);
        if (st != PDX_OK) {
            pdx_error("agent %s: backend %s conn info: %s", agent->name,
                      be->name, pdx_status_string(st));
            break;
        }
        pdx_wbuf_str(&w, be->name);
        pdx_wbuf_bytes32(&w, conn, (uint32_t)clen);
        free(conn);
    }
    pdx_wbuf_u32(&w, (uint32_t)agent->nregs);
    for (size_t i = 0; i < agent->nregs && st == PDX_OK; i++) {
        struct pdx_mem_reg *r = agent->regs[i];
        pdx_wbuf_u64(&w, r->region.addr);
        pdx_wbuf_u64(&w, r->region.len);
        pdx_wbuf_u32(&w, r->region.dev_id);
        pdx_wbuf_u8(&w, (uint8_t)r->region.mem_type);
        pdx_wbuf_u64(&w, r->region.flags);
        uint16_t nkeys = 0;
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            nkeys += r->md[b] != NULL;
        }
        pdx_wbuf_u16(&w, nkeys);
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            if (r->md[b] == NULL) {
                continue;
            }
            void *key = NULL;
            size_t klen = 0;
            st = agent->backends[b]->ops->mem_pack(agent->backends[b]->be,
                                                   r->md[b], &key, &klen);
            if (st != PDX_OK) {
                pdx_error("agent %s: backend %s pack key: %s", agent->name,
                          agent->backends[b]->name, pdx_status_string(st));
                break;
            }
            pdx_wbuf_u16(&w, (uint16_t)b);
            pdx_wbuf_bytes32(&w, key, (uint32_t)klen);
            free(key);
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st == PDX_OK) {
        st = pdx_blob_finish(&w);
    }
    if (st == PDX_OK && agent->ckey.bytes != NULL) {
        st = pdxi_blob_seal(&agent->ckey, &w.data, &w.len); /* sign.h */
    }
    if (st != PDX_OK) {
        free(w.data);
        return st;
    }
    *blob_p = w.data;
    *len_p = w.len;
    return PDX_OK;
}

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
