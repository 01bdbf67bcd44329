/* Resealed blobs through pdx_peer_load (issue 21 item 1): a real blob of an
 * agent with the ucx and cma backends and three regions, mutated in its
 * body (reseal.h) with the header's length and xxh3 recomputed, is loaded
 * by another agent with every backend that runs here, N times in this
 * process. Each load must return OK (then the peer is unloaded) or a clean
 * error; a crash or abort fails the test. Then the good blob must still
 * load and a READ from it must be byte-exact.
 *   test_reseal [mutations] [seed]            (default 1000, 1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pdx/pdx.h>

#include "die.h"
#include "pdx_clock.h"
#include "reseal.h"

#define REG_LEN (1u << 16)

static void add_backends(pdx_agent_h a, int *ncreated)
{
    static const char *names[] = {"ucx", "cma", "cuda_ipc"};
    for (size_t i = 0; i < 3; i++) {
        pdx_status_t st = pdx_backend_create(a, names[i], NULL, 0, NULL);
        if (st == PDX_OK) {
            (*ncreated)++;
        } else {
            REQUIRE(i == 2); /* cuda_ipc without a GPU: skipped */
            printf("backend %s not created here (%s): skipped\n", names[i],
                   pdx_status_string(st));
        }
    }
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 0) : 1000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    pdx_agent_h p, d;
    int np = 0, nd = 0;
    REQUIRE(pdx_agent_create("reseal-p", NULL, &p) == PDX_OK);
    REQUIRE(pdx_agent_create("reseal-d", NULL, &d) == PDX_OK);
    add_backends(p, &np);
    add_backends(d, &nd);
    REQUIRE(np >= 2 && nd >= 2);

    /* Shared (cma maps it), shared again, and plain heap memory. */
    void *m1, *m2;
    uint8_t *heap = malloc(REG_LEN);
    REQUIRE(heap != NULL);
    REQUIRE(pdx_mem_alloc(REG_LEN, 0, &m1) == PDX_OK);
    REQUIRE(pdx_mem_alloc(REG_LEN, 0, &m2) == PDX_OK);
    for (size_t i = 0; i < REG_LEN; i++) {
        ((uint8_t *)m1)[i] = (uint8_t)(i * 7 + 1);
        heap[i] = (uint8_t)(i * 13 + 5);
    }
    pdx_mem_reg_h r1, r2, r3, rl;
    REQUIRE(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)m1, REG_LEN, 0, 0,
                             &r1) == PDX_OK);
    REQUIRE(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)m2, REG_LEN, 0, 0,
                             &r2) == PDX_OK);
    REQUIRE(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)heap, REG_LEN, 0, 0,
                             &r3) == PDX_OK);
    uint8_t *local = calloc(1, REG_LEN);
    REQUIRE(local != NULL);
    REQUIRE(pdx_mem_register(d, PDX_MEM_DRAM, (uintptr_t)local, REG_LEN, 0, 0,
                             &rl) == PDX_OK);
    void *blob;
    size_t blen;
    REQUIRE(pdx_agent_describe(p, &blob, &blen) == PDX_OK);
    rs_field_t f[RS_MAX_FIELDS];
    size_t nf = rs_fields(blob, blen, f);
    printf("blob of %zu bytes, %zu conn infos and keys\n", blen, nf);
    REQUIRE(nf >= 2 + 3 * 2);

    size_t cap = blen + 8192;
    uint8_t *mut = malloc(cap);
    REQUIRE(mut != NULL);
    unsigned counts[64] = {0};
    unsigned ok = 0;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    double t0 = pdx_now_s();
    for (unsigned i = 0; i < n; i++) {
        uint8_t script[32];
        for (size_t k = 0; k < sizeof(script); k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            script[k] = (uint8_t)(x >> 29);
        }
        size_t mlen = rs_mutate(blob, blen, script, sizeof(script), mut, cap);
        char name[PDX_NAME_MAX] = "";
        pdx_status_t st = pdx_peer_load(d, mut, mlen, name);
        REQUIRE(st == PDX_OK || st < 0);
        counts[(unsigned)(-st) & 63]++;
        if (st == PDX_OK) {
            ok++;
            REQUIRE(name[0] != '\0');
            REQUIRE(pdx_peer_unload(d, name) == PDX_OK);
        }
        if (i % 16 == 0) {
            pdx_progress(d);
            pdx_progress(p);
        }
    }
    double dt = pdx_now_s() - t0;
    printf("%u resealed mutations in %.1f s: %u loaded (then unloaded), "
           "%u refused; 0 crashes\n", n, dt, ok, n - ok);
    for (unsigned s = 1; s < 64; s++) {
        if (counts[s]) {
            printf("  %-28s %u\n", pdx_status_string(-(pdx_status_t)s),
                   counts[s]);
        }
    }
    /* Not a test that cannot fail: the mutations must reach deep (some
     * load, most are refused as corrupt). */
    REQUIRE(n < 100 || (ok > 0 && counts[(unsigned)-PDX_ERR_CORRUPT] > n / 4));

    /* The good blob still loads and reads byte-exact. */
    char pname[PDX_NAME_MAX];
    REQUIRE(pdx_peer_load(d, blob, blen, pname) == PDX_OK);
    REQUIRE(strcmp(pname, "reseal-p") == 0);
    REQUIRE(pdx_peer_state(d, pname) == PDX_OK);
    pdx_desc_t ld[2] = {{(uintptr_t)local, REG_LEN / 2, 0, 0},
                        {(uintptr_t)local + REG_LEN / 2, REG_LEN / 2, 0, 0}};
    pdx_desc_t rd[2] = {{(uintptr_t)m1, REG_LEN / 2, 0, 0},
                        {(uintptr_t)heap + REG_LEN / 2, REG_LEN / 2, 0, 0}};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, ld, 2}, rl2 = {PDX_MEM_DRAM, rd, 2};
    pdx_xfer_h x1;
    REQUIRE(pdx_xfer_create(d, PDX_XFER_READ, &ll, &rl2, pname, NULL, 0, &x1) ==
            PDX_OK);
    pdx_status_t st = pdx_xfer_post(x1);
    for (double t = pdx_now_s();
         st == PDX_INPROGRESS && pdx_now_s() - t < 20;) {
        pdx_progress(p);
        pdx_progress(d);
        st = pdx_xfer_check(x1);
    }
    REQUIRE(st == PDX_OK);
    REQUIRE(memcmp(local, m1, REG_LEN / 2) == 0);
    REQUIRE(memcmp(local + REG_LEN / 2, heap + REG_LEN / 2, REG_LEN / 2) == 0);
    pdx_xfer_release(x1);
    printf("good blob: loaded, READ of 2 regions byte-exact\n");

    pdx_blob_free(blob);
    free(mut);
    /* Let wireup traffic of the mutated loads settle first (bounded): in
     * 2 of 30 runs without this, UCX 1.13's ucp_worker_destroy aborted
     * purging a pending wireup REP of a closed endpoint ("got REP
     * message", ucp_request.c:684), a destroy-path issue of its own,
     * reported apart from what this test checks (loads never crash). */
    for (double t = pdx_now_s(); pdx_now_s() - t < 0.3;) {
        pdx_progress(p);
        pdx_progress(d);
    }
    pdx_agent_destroy(d);
    pdx_agent_destroy(p);
    pdx_mem_free(m1);
    pdx_mem_free(m2);
    free(heap);
    free(local);
    return 0;
}
