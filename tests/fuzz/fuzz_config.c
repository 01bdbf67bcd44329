/* libFuzzer harness for the JSON config parser: any bytes must give either
 * a config whose derived values agree with its layout, or an error message;
 * never a crash, a leak or undefined behaviour. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/kv_config.h>
#include <pdx/kv_layout.h>
#include <pdx/log.h>

#include "log_quiet.h"

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fuzz_config: check failed: %s\n", #cond);         \
            abort();                                                           \
        }                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_quiet(); /* rejections are the common case */
    /* A copy of exactly `size` bytes, no terminator: ASan then catches any
     * read past the end. */
    char *text = malloc(size ? size : 1);
    if (text == NULL)
        return 0;
    if (size)
        memcpy(text, data, size);

    pdx_kv_config_t *cfg = malloc(sizeof(*cfg));
    char err[256];
    if (cfg == NULL) {
        free(text);
        return 0;
    }
    pdx_status_t st =
        pdx_kv_config_parse(text, size, "fuzz.json", cfg, err, sizeof(err));
    CHECK(memchr(err, '\0', sizeof(err)) != NULL);
    if (st != PDX_OK) {
        CHECK(st == PDX_ERR_CONFIG);
        CHECK(strncmp(err, "fuzz.json: ", 11) == 0);
    } else {
        CHECK(err[0] == '\0');
        CHECK(cfg->num_blocks > 0 && cfg->block_tokens > 0);
        CHECK(cfg->dp_rank < cfg->dp_size && cfg->tp_rank < cfg->tp_size);
        CHECK(cfg->nchildren >= 1 && cfg->nchildren <= PDX_KV_MAX_CHILDREN);
        CHECK(cfg->nbackends >= 1 && cfg->nbackends <= PDX_KV_MAX_BACKENDS);
        CHECK(cfg->nbackend_opts <= PDX_KV_MAX_BACKEND_OPTS);
        CHECK(cfg->n_index_k_layers <= PDX_KV_MAX_INDEX_LAYERS);
        CHECK(cfg->bytes_per_block == pdx_kv_config_bytes_per_block(cfg));
        /* With a store, peers are found by name from handoffs. */
        CHECK(cfg->role != PDX_KV_ROLE_PRODUCER || cfg->peer_name[0] ||
              cfg->has_store);
        CHECK(cfg->role != PDX_KV_ROLE_CONSUMER || cfg->peer_name[0] ||
              cfg->has_store);
        CHECK(!cfg->has_store || (cfg->store_endpoints[0] &&
                                  cfg->store_namespace[0] &&
                                  cfg->store_demote_owners >= 1));
        for (uint32_t i = 0; i < cfg->nchildren; i++)
            if (cfg->children[i].type == PDX_KV_CHILD_OFFLOAD)
                CHECK(cfg->children[i].budget_bytes /
                          cfg->children[i].ranks_per_host >=
                      cfg->bytes_per_block);
        size_t nopts = 0;
        for (uint32_t b = 0; b < cfg->nbackends; b++)
            nopts += pdx_kv_config_backend_opts(cfg, b, NULL, 0);
        CHECK(nopts == cfg->nbackend_opts);

        pdx_layout_h l;
        CHECK(pdx_kv_config_layout(cfg, &l) == PDX_OK);
        CHECK(pdx_layout_num_arenas(l) == pdx_kv_config_num_arenas(cfg));
        CHECK(pdx_layout_bytes_per_block(l) == cfg->bytes_per_block);
        CHECK(pdx_layout_num_blocks(l) == cfg->num_blocks);
        pdx_layout_destroy(l);
    }
    free(cfg);
    free(text);
    return 0;
}
