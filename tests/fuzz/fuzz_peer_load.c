/* libFuzzer harness: resealed blobs through pdx_peer_load with every
 * backend that runs here (ucx, cma; cuda_ipc where a GPU is). Each input
 * is a mutation script for a real blob of an agent with three regions
 * (tests/fixtures/reseal.h: flips, inner fields truncated, extended, spliced,
 * length prefixes at extremes), resealed so the header check passes. A
 * load must end OK (the peer is then unloaded) or with a clean error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/pdx.h>

#include "reseal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REG_LEN (1u << 16)

static pdx_agent_h g_p, g_d;
static void *g_blob;
static size_t g_blen;
static uint8_t *g_mut;
static size_t g_cap;
static unsigned g_runs;

static void add_backends(pdx_agent_h a)
{
    static const char *names[] = {"ucx", "cma", "cuda_ipc"};
    for (size_t i = 0; i < 3; i++) {
        pdx_backend_create(a, names[i], NULL, 0, NULL);
    }
}

static int setup(void)
{
    void *m1, *m2, *heap = malloc(REG_LEN);
    pdx_mem_reg_h r;
    if (heap == NULL || pdx_agent_create("fuzz-p", NULL, &g_p) != PDX_OK ||
        pdx_agent_create("fuzz-d", NULL, &g_d) != PDX_OK) {
        return -1;
    }
    add_backends(g_p);
    add_backends(g_d);
    if (pdx_mem_alloc(REG_LEN, 0, &m1) != PDX_OK ||
        pdx_mem_alloc(REG_LEN, 0, &m2) != PDX_OK ||
        pdx_mem_register(g_p, PDX_MEM_DRAM, (uintptr_t)m1, REG_LEN, 0, 0,
                         &r) != PDX_OK ||
        pdx_mem_register(g_p, PDX_MEM_DRAM, (uintptr_t)m2, REG_LEN, 0, 0,
                         &r) != PDX_OK ||
        pdx_mem_register(g_p, PDX_MEM_DRAM, (uintptr_t)heap, REG_LEN, 0, 0,
                         &r) != PDX_OK ||
        pdx_agent_describe(g_p, &g_blob, &g_blen) != PDX_OK) {
        return -1;
    }
    g_cap = g_blen + 8192;
    g_mut = malloc(g_cap);
    return g_mut != NULL ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (ready == 0) {
        ready = setup() == 0 ? 1 : -1;
        if (ready < 0) {
            fprintf(stderr, "fuzz_peer_load: setup failed\n");
            abort();
        }
    }
    size_t mlen = rs_mutate(g_blob, g_blen, data, size, g_mut, g_cap);
    char name[PDX_NAME_MAX] = "";
    pdx_status_t st = pdx_peer_load(g_d, g_mut, mlen, name);
    if (st > 0) {
        abort(); /* only OK or an error */
    }
    if (st == PDX_OK && pdx_peer_unload(g_d, name) != PDX_OK) {
        abort();
    }
    if (++g_runs % 16 == 0) {
        pdx_progress(g_d);
        pdx_progress(g_p);
    }
    return 0;
}
