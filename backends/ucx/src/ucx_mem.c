/* ucx: memory: local registrations (memh and packed rkey; GPU memory
 * through ucx_vram.c) and remote keys (validated against the peer's
 * address before UCX unpacks them).
 *
 * A host-memory key: "PDXK", u8 version 1, u8 flags (0), u16 0, u64 the
 * region's token (what a served request names, ucx_dsvc.c), then UCX's
 * packed rkey. A key without that opening (pdx before served memory) is
 * UCX's rkey alone: RMA only. */
#include "ucx_int.h"

#include <sys/random.h>
#include <unistd.h>

#define DKEY_MAGIC "PDXK"
#define DKEY_LEN 16u

static void dkey_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint64_t dkey_get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* A random token, never 0: what a served request must name. */
static uint64_t dkey_token(void)
{
    uint64_t t = 0;
    while (t == 0) {
        if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
            t = pdx_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&t;
        }
    }
    return t;
}

pdx_status_t ucx_mem_register(void *bev, const pdx_region_t *region,
                              void **md_p)
{
    ucx_be_t *be = bev;
    if (be == NULL || region == NULL || md_p == NULL) {
        return PDX_ERR_INVALID;
    }
    if (region->mem_type != PDX_MEM_DRAM && region->mem_type != PDX_MEM_VRAM) {
        pdx_error("ucx: cannot register memory type %d at 0x%" PRIx64,
                  (int)region->mem_type, region->addr);
        return PDX_ERR_UNSUPPORTED;
    }
    if (region->addr == 0 || region->len == 0 ||
        region->addr + region->len < region->addr) {
        pdx_error("ucx: bad region 0x%" PRIx64 " +%" PRIu64, region->addr,
                  region->len);
        return PDX_ERR_INVALID;
    }
    ucx_md_t *md = calloc(1, sizeof(*md));
    if (md == NULL) {
        return PDX_ERR_NOMEM;
    }
    md->addr = region->addr;
    md->len = region->len;
    md->type = region->mem_type;
    md->readonly = (region->flags & PDX_REGION_F_READONLY) != 0;
    ucx_list_init(&md->vlink);
    if (region->mem_type == PDX_MEM_VRAM) {
        pdx_status_t st = ucx_vram_register(be, region, md);
        if (st != PDX_OK) {
            free(md);
            return st;
        }
        *md_p = md;
        return PDX_OK;
    }
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = (void *)(uintptr_t)region->addr,
        .length = region->len,
        .memory_type = UCS_MEMORY_TYPE_HOST,
    };
    if (region->flags & PDX_REGION_F_READONLY) {
        /* No remote write access (RDMA NICs enforce it). */
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_PROT;
        mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                  UCP_MEM_MAP_PROT_REMOTE_READ;
    }
    ucs_status_t s = ucp_mem_map(be->ctx, &mp, &md->memh);
    if (s != UCS_OK) {
        pdx_error("ucx: registering 0x%" PRIx64 " +%" PRIu64 " failed: %s",
                  region->addr, region->len, ucs_status_string(s));
        free(md);
        return ucx_status(s);
    }
    md->token = dkey_token();
    ucx_list_push(&be->dregs, &md->vlink); /* the service finds it */
    *md_p = md;
    return PDX_OK;
}

void ucx_mem_deregister(void *bev, void *mdv)
{
    ucx_be_t *be = bev;
    ucx_md_t *md = mdv;
    if (be == NULL || md == NULL) {
        return;
    }
    if (md->type == PDX_MEM_VRAM) {
        /* Peers' staged requests on it stop first (a copy in flight is
         * waited for), then it is no longer found. */
        ucx_stage_region_gone(be, md);
        ucx_vram_deregister(be, md);
        free(md);
        return;
    }
    /* No served request finds it from now on (requests and answers are
     * checked against be->dregs when they touch memory). */
    ucx_list_del(&md->vlink);
    ucx_dsvc_region_gone(be, md);
    ucs_status_t s = ucp_mem_unmap(be->ctx, md->memh);
    if (s != UCS_OK) {
        pdx_error("ucx: deregistering 0x%" PRIx64 " +%" PRIu64 " failed: %s",
                  md->addr, md->len, ucs_status_string(s));
    }
    free(md);
}

pdx_status_t ucx_mem_pack(void *bev, void *mdv, void **buf_p,
                          size_t *len_p)
{
    ucx_be_t *be = bev;
    ucx_md_t *md = mdv;
    void *rbuf = NULL;
    size_t rlen = 0;
    if (be == NULL || md == NULL || buf_p == NULL || len_p == NULL) {
        return PDX_ERR_INVALID;
    }
    if (md->type == PDX_MEM_VRAM) {
        return ucx_vram_pack(be, md, buf_p, len_p);
    }
    ucs_status_t s = ucp_rkey_pack(be->ctx, md->memh, &rbuf, &rlen);
    if (s != UCS_OK) {
        pdx_error("ucx: packing the key of 0x%" PRIx64 " +%" PRIu64
                  " failed: %s", md->addr, md->len, ucs_status_string(s));
        return ucx_status(s);
    }
    unsigned char *buf = malloc(DKEY_LEN + rlen);
    if (buf == NULL) {
        ucp_rkey_buffer_release(rbuf);
        return PDX_ERR_NOMEM;
    }
    memcpy(buf, DKEY_MAGIC, 4);
    buf[4] = 1;
    buf[5] = 0;
    buf[6] = buf[7] = 0;
    dkey_put64(buf + 8, md->token);
    memcpy(buf + DKEY_LEN, rbuf, rlen);
    ucp_rkey_buffer_release(rbuf);
    *buf_p = buf;
    *len_p = DKEY_LEN + rlen;
    return PDX_OK;
}

pdx_status_t ucx_rmem_load(void *bev, void *peerv,
                           const pdx_region_t *region, const void *key,
                           size_t key_len, void **rmd_p)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    if (be == NULL || peer == NULL || region == NULL || key == NULL ||
        key_len == 0 || rmd_p == NULL) {
        return PDX_ERR_INVALID;
    }
    pdx_status_t ust = ucx_peer_usable(peer);
    if (ust != PDX_OK) {
        return ust;
    }
    if (region->mem_type == PDX_MEM_VRAM) {
        ucx_rmd_t *v = calloc(1, sizeof(*v));
        if (v == NULL) {
            return PDX_ERR_NOMEM;
        }
        v->peer = peer;
        ucx_list_init(&v->plink);
        v->addr = region->addr;
        v->len = region->len;
        pdx_status_t st = ucx_vram_load_key(be, peer, region, key, key_len, v);
        if (st == PDX_OK && !v->staged && peer->ep != NULL) {
            st = ucx_rmd_rkey(be, v);
        }
        if (st != PDX_OK) {
            free(v->key);
            free(v);
            return st;
        }
        ucx_list_push(&peer->rmds, &v->plink);
        *rmd_p = v;
        return PDX_OK;
    }
    if (region->mem_type != PDX_MEM_DRAM) {
        pdx_error("ucx: peer %s: cannot load a key for memory type %d",
                  peer->name, (int)region->mem_type);
        return PDX_ERR_UNSUPPORTED;
    }
    char vwhy[256];
    uint64_t token = 0;
    const unsigned char *kb = key;
    if (key_len >= 4 && memcmp(kb, DKEY_MAGIC, 4) == 0) {
        if (key_len <= DKEY_LEN || kb[4] != 1 || kb[5] != 0 || kb[6] != 0 ||
            kb[7] != 0 || dkey_get64(kb + 8) == 0) {
            pdx_error("ucx: peer %s: malformed key of region 0x%" PRIx64
                      " +%" PRIu64 " (%zu bytes): a bad opening (version "
                      "%u, flags %u, or no token)", peer->name, region->addr,
                      region->len, key_len, key_len > 4 ? kb[4] : 0,
                      key_len > 5 ? kb[5] : 0);
            return PDX_ERR_CORRUPT;
        }
        token = dkey_get64(kb + 8);
        key = kb + DKEY_LEN;
        key_len -= DKEY_LEN;
    }
    pdx_status_t vst =
        ucx_validate_rkey(&be->vlocal, &peer->vaddr, key, key_len,
                          UCS_MEMORY_TYPE_HOST, vwhy, sizeof(vwhy));
    if (vst != PDX_OK) {
        pdx_error("ucx: peer %s: malformed key of region 0x%" PRIx64
                  " +%" PRIu64 " (%zu bytes): %s", peer->name, region->addr,
                  region->len, key_len, vwhy);
        return vst;
    }
    ucx_rmd_t *rmd = calloc(1, sizeof(*rmd));
    if (rmd == NULL) {
        return PDX_ERR_NOMEM;
    }
    rmd->peer = peer;
    ucx_list_init(&rmd->plink);
    rmd->addr = region->addr;
    rmd->len = region->len;
    rmd->type = PDX_MEM_DRAM;
    rmd->token = token;
    rmd->key_len = key_len;
    rmd->key = malloc(key_len);
    if (rmd->key == NULL) {
        free(rmd);
        return PDX_ERR_NOMEM;
    }
    memcpy(rmd->key, key, key_len);
    if (peer->ep != NULL) {
        /* Connected already: unpack now (else at first use). */
        pdx_status_t st = ucx_rmd_rkey(be, rmd);
        if (st != PDX_OK) {
            free(rmd->key);
            free(rmd);
            return st;
        }
    }
    ucx_list_push(&peer->rmds, &rmd->plink);
    *rmd_p = rmd;
    return PDX_OK;
}

/* The remote key of `rmd`, unpacked on first use (with its peer's
 * endpoint, created then if the instance connects lazily). The key bytes
 * were validated at load. Non-blocking. */
pdx_status_t ucx_rmd_rkey(ucx_be_t *be, ucx_rmd_t *rmd)
{
    if (rmd->rkey != NULL) {
        return PDX_OK;
    }
    pdx_status_t st = ucx_peer_ep(be, rmd->peer);
    if (st != PDX_OK) {
        return st;
    }
    ucs_status_t s = ucp_ep_rkey_unpack(rmd->peer->ep, rmd->key, &rmd->rkey);
    if (s != UCS_OK) {
        rmd->rkey = NULL;
        pdx_error("ucx: peer %s: unpacking the %zu-byte key of 0x%" PRIx64
                  " +%" PRIu64 " failed: %s", rmd->peer->name, rmd->key_len,
                  rmd->addr, rmd->len, ucs_status_string(s));
        return ucx_status(s);
    }
    free(rmd->key);
    rmd->key = NULL;
    return PDX_OK;
}

void ucx_rmem_unload(void *bev, void *rmdv)
{
    ucx_rmd_t *rmd = rmdv;
    (void)bev;
    if (rmd == NULL) {
        return;
    }
    ucx_list_del(&rmd->plink);
    if (rmd->rkey != NULL) {
        ucp_rkey_destroy(rmd->rkey);
    }
    free(rmd->key);
    free(rmd);
}
