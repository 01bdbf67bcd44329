/* A poisoned etcd key (issue 21 item 1): two publishers p1, p2 and two
 * watchers d1, d2 in one namespace of a private etcd; d1 and d2 read from
 * both. Then p1's key is overwritten behind its back (same lease) with a
 * resealed blob of p1 whose generation is one higher and whose UCX worker
 * address claims address version 3 (before the validator, UCX aborted on
 * its assertion in every watching agent). Every watcher must refuse it,
 * not crash, never take that generation, and keep reading from p2. The
 * watch delivers in key-revision order, so p2's next generation seen by a
 * watcher means p1's poisoned put was handled before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pdx/pdx.h>

#include "ctl.h"
#include "etcd_launch.h"
#include "reseal.h"
#include "store_node.h"

#define REGION (1u << 20)

static etcd_proc_t g_etcd;

typedef store_node_t node_t;

static void node_open(node_t *n, const char *name, const char *ns,
                      uint8_t fill)
{
    REQUIRE(store_node_open(n, name, g_etcd.url, ns, 5000, REGION, fill) ==
            PDX_OK);
}

static pdx_status_t read_from(node_t *dst, const char *peer, node_t *src)
{
    memset(dst->mem, 0, 4096);
    pdx_status_t st = ctl_read(dst->agent, peer, (uintptr_t)dst->mem,
                               (uintptr_t)src->mem + 4096, 4096, 10000);
    if (st == PDX_OK && memcmp(dst->mem, src->mem + 4096, 4096) != 0) {
        return PDX_ERR_CORRUPT;
    }
    return st;
}

static char *b64(const uint8_t *p, size_t n)
{
    static const char t[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *q = o;
    REQUIRE(o != NULL);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        v |= i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0;
        v |= i + 2 < n ? p[i + 2] : 0;
        *q++ = t[v >> 18];
        *q++ = t[(v >> 12) & 63];
        *q++ = i + 1 < n ? t[(v >> 6) & 63] : '=';
        *q++ = i + 2 < n ? t[v & 63] : '=';
    }
    *q = '\0';
    return o;
}

static uint32_t generation(node_t *d, const char *peer, pdx_status_t *st_p)
{
    pdx_peer_info_t info;
    pdx_status_t st = pdx_peer_info(d->agent, peer, &info, NULL, 0);
    if (st_p != NULL) {
        *st_p = st;
    }
    return st == PDX_OK ? info.generation : 0;
}

int main(void)
{
    char why[256], err[512];
    if (!etcd_available(why, sizeof(why))) {
        printf("skipped: %s\n", why);
        return 0;
    }
    REQUIRE(etcd_start(&g_etcd, NULL, NULL, err, sizeof(err)) == 0);
    char ns[64];
    snprintf(ns, sizeof(ns), "t-poison-%d", (int)getpid());
    node_t p1, p2, d1, d2;
    node_open(&p1, "p1", ns, 1);
    node_open(&p2, "p2", ns, 2);
    node_open(&d1, "d1", ns, 3);
    node_open(&d2, "d2", ns, 4);
    REQUIRE(pdx_agent_publish(p1.agent) == PDX_OK);
    REQUIRE(pdx_agent_publish(p2.agent) == PDX_OK);
    node_t *ds[2] = {&d1, &d2};
    for (int i = 0; i < 2; i++) {
        REQUIRE(pdx_peer_fetch(ds[i]->agent, "p1", 5000) == PDX_OK);
        REQUIRE(pdx_peer_fetch(ds[i]->agent, "p2", 5000) == PDX_OK);
        REQUIRE(read_from(ds[i], "p1", &p1) == PDX_OK);
        REQUIRE(read_from(ds[i], "p2", &p2) == PDX_OK);
    }
    uint32_t g1 = generation(&d1, "p1", NULL);
    uint32_t g2 = generation(&d1, "p2", NULL);
    REQUIRE(g1 == generation(&d2, "p1", NULL) && g1 > 0);

    /* p1's blob, generation + 1, UCX address version 3, resealed. */
    void *blob;
    size_t blen;
    REQUIRE(pdx_agent_describe(p1.agent, &blob, &blen) == PDX_OK);
    uint8_t *b = blob;
    size_t gen_off = RS_HDR + 2 + rs_get(b + RS_HDR, 2) + 8;
    REQUIRE(rs_get(b + gen_off, 4) == g1);
    rs_put(b + gen_off, g1 + 1, 4);
    rs_field_t f[RS_MAX_FIELDS];
    REQUIRE(rs_fields(b, blen, f) >= 2); /* ucx conn info, the region key */
    b[f[0].off + 4] = (uint8_t)((b[f[0].off + 4] & 0xf0) | 3);
    rs_reseal(b, blen);

    /* Put it under p1's key with p1's lease, as a writer of etcd could. */
    char key[128], body[8192], out[8192];
    snprintf(key, sizeof(key), "%s/agents/p1", ns);
    char *kb = b64((const uint8_t *)key, strlen(key));
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
    REQUIRE(etcd_post(&g_etcd, "/v3/kv/range", body, out, sizeof(out)) == 0);
    const char *lp = strstr(out, "\"lease\":\"");
    REQUIRE(lp != NULL);
    unsigned long long lease = strtoull(lp + 9, NULL, 10);
    REQUIRE(lease != 0);
    char *vb = b64(b, blen);
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"value\":\"%s\","
             "\"lease\":\"%llu\"}", kb, vb, lease);
    REQUIRE(etcd_post(&g_etcd, "/v3/kv/put", body, out, sizeof(out)) == 0);
    printf("poisoned p1 (generation %u -> %u, UCX address version 3) put "
           "under its key with lease %llx\n", g1, g1 + 1, lease);
    free(kb);
    free(vb);
    pdx_blob_free(blob);

    /* A later event of p2 marks that the watchers handled p1's. */
    uint8_t *more = aligned_alloc(4096, REGION);
    REQUIRE(more != NULL);
    pdx_mem_reg_h reg2;
    REQUIRE(pdx_mem_register(p2.agent, PDX_MEM_DRAM, (uintptr_t)more, REGION, 0,
                             0, &reg2) == PDX_OK);
    for (int i = 0; i < 2; i++) {
        uint64_t end = pdx_now_ms() + 10000;
        while (generation(ds[i], "p2", NULL) <= g2 && pdx_now_ms() < end) {
            usleep(10000);
        }
        REQUIRE(generation(ds[i], "p2", NULL) > g2);
        pdx_status_t st;
        uint32_t g = generation(ds[i], "p1", &st);
        printf("d%d: p2 at generation %u and readable; p1: %s, "
               "generation %u (poisoned %u refused)\n", i + 1,
               generation(ds[i], "p2", NULL),
               st == PDX_OK ? "loaded" : pdx_status_string(st), g, g1 + 1);
        REQUIRE(st == PDX_OK || st == PDX_ERR_NOT_FOUND);
        REQUIRE(g != g1 + 1);
        REQUIRE(read_from(ds[i], "p2", &p2) == PDX_OK);
    }
    /* p1 republishes its real blob (new generations, past the poisoned
     * one): the watchers load it again and read from it. */
    pdx_mem_reg_h reg3, reg4;
    uint8_t *more1 = aligned_alloc(4096, 2 * REGION);
    REQUIRE(more1 != NULL);
    REQUIRE(pdx_mem_register(p1.agent, PDX_MEM_DRAM, (uintptr_t)more1, REGION,
                             0, 0, &reg3) == PDX_OK);
    REQUIRE(pdx_mem_register(p1.agent, PDX_MEM_DRAM, (uintptr_t)more1 + REGION,
                             REGION, 0, 0, &reg4) == PDX_OK);
    /* A watcher dropped p1 when its poisoned description failed to load
     * (the old connection was replaced first), and the watch reloads only
     * loaded peers: fetch it again by name, which waits for a generation
     * past the poisoned one. */
    for (int i = 0; i < 2; i++) {
        uint64_t end = pdx_now_ms() + 10000;
        while (generation(ds[i], "p1", NULL) <= g1 + 1 && pdx_now_ms() < end) {
            pdx_peer_fetch(ds[i]->agent, "p1", 1000);
            usleep(50000);
        }
        REQUIRE(generation(ds[i], "p1", NULL) > g1 + 1);
        REQUIRE(pdx_peer_state(ds[i]->agent, "p1") == PDX_OK);
        REQUIRE(read_from(ds[i], "p1", &p1) == PDX_OK);
    }
    printf("p1's next real generation loaded and readable on d1 and d2\n");
    pdx_mem_deregister(p1.agent, reg4);
    pdx_mem_deregister(p1.agent, reg3);
    pdx_mem_deregister(p2.agent, reg2);
    store_node_close(&d1);
    store_node_close(&d2);
    store_node_close(&p1);
    store_node_close(&p2);
    free(more);
    free(more1);
    etcd_cleanup(&g_etcd);
    return 0;
}
