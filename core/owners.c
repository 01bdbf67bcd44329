/* The block-owner registry through the agent's store: which agents hold
 * which blocks (add, delete, look up) and the longest prefix of a block
 * list another agent owns (sampled: ceil(log64(n)) lookups). The store
 * module does the work; discovery.c holds the module and counts the
 * calls. */
#include <stdio.h>
#include <string.h>

#include "api_int.h"
#include "discovery_int.h"

pdx_status_t pdxi_store_owners_add(pdx_agent_h agent,
                                   const char *const *blocks, size_t n,
                                   uint32_t *counts)
{
    const pdx_store_ops_t *ops;
    void *st_mod;
    if (!pdx_store_agent_module(agent, "pdx_store_owners_add", &ops,
                                &st_mod)) {
        return PDX_ERR_UNSUPPORTED;
    }
    pdx_status_t st = ops->owners_add(st_mod, agent->name, blocks, n, counts);
    pdx_store_agent_count(agent, PDX_OWNERS_ADD, n, st);
    return st;
}

pdx_status_t pdxi_store_owners_del(pdx_agent_h agent,
                                   const char *const *blocks, size_t n)
{
    const pdx_store_ops_t *ops;
    void *st_mod;
    if (!pdx_store_agent_module(agent, "pdx_store_owners_del", &ops,
                                &st_mod)) {
        return PDX_ERR_UNSUPPORTED;
    }
    pdx_status_t st = ops->owners_del(st_mod, agent->name, blocks, n);
    pdx_store_agent_count(agent, PDX_OWNERS_DEL, n, st);
    return st;
}

pdx_status_t pdxi_store_owners_get(pdx_agent_h agent,
                                   const char *const *blocks, size_t n,
                                   pdx_store_owner_cb_t cb, void *arg)
{
    const pdx_store_ops_t *ops;
    void *st_mod;
    if (!pdx_store_agent_module(agent, "pdx_store_owners_get", &ops,
                                &st_mod)) {
        return PDX_ERR_UNSUPPORTED;
    }
    pdx_status_t st = ops->owners_get(st_mod, blocks, n, cb, arg);
    pdx_store_agent_count(agent, PDX_OWNERS_GET, n, st);
    return st;
}

typedef struct longest_acc {
    const char *self;
    size_t nsamples;
    /* Per sample: the first other owner seen (enough to pick one). */
    char (*first)[PDX_NAME_MAX];
} longest_acc_t;

static void on_sample_owner(void *arg, size_t i, const char *owner)
{
    longest_acc_t *a = arg;
    if (i < a->nsamples && strcmp(owner, a->self) != 0 &&
        a->first[i][0] == '\0') {
        snprintf(a->first[i], PDX_NAME_MAX, "%s", owner);
    }
}

pdx_status_t pdxi_store_owners_longest(pdx_agent_h agent,
                                       const char *const *blocks, size_t n,
                                       char *owner_out, size_t *prefix_p)
{
    const pdx_store_ops_t *ops;
    void *st_mod;
    if (!pdx_store_agent_module(agent, "pdx_store_owners_longest", &ops,
                                &st_mod)) {
        return PDX_ERR_UNSUPPORTED;
    }
    enum { S = 64 };
    const char *sample[S];
    size_t idx[S];
    char first[S][PDX_NAME_MAX];
    char best[PDX_NAME_MAX] = "";
    size_t lo = 0, hi = n, prefix = 0;
    pdx_status_t st = PDX_OK;
    /* Each round narrows [lo, hi) to the gap after the last sampled block
     * that someone else owns: ceil(log64(n)) rounds. */
    for (int round = 0; round < 16 && lo < hi; round++) {
        size_t span = hi - lo, ns = span < S ? span : S;
        for (size_t j = 0; j < ns; j++) {
            idx[j] = ns == 1 ? lo : lo + (span - 1) * j / (ns - 1);
            sample[j] = blocks[idx[j]];
            first[j][0] = '\0';
        }
        longest_acc_t acc = {agent->name, ns, first};
        st = ops->owners_get(st_mod, sample, ns, on_sample_owner, &acc);
        pdx_store_agent_count(agent, PDX_OWNERS_GET, ns, st);
        if (st != PDX_OK) {
            break;
        }
        if (round == 0 && first[0][0] == '\0') {
            break; /* nobody else has block 0: no prefix */
        }
        size_t last = ns;
        for (size_t j = 0; j < ns; j++) {
            if (first[j][0] != '\0') {
                last = j;
            }
        }
        if (last == ns) {
            break; /* nobody else past `lo - 1` */
        }
        prefix = idx[last] + 1;
        snprintf(best, sizeof(best), "%s", first[last]);
        if (last + 1 == ns) {
            break; /* the last sample is owned: as far as we can see */
        }
        lo = idx[last] + 1;
        hi = idx[last + 1];
    }
    if (st == PDX_OK) {
        snprintf(owner_out, PDX_NAME_MAX, "%s", best);
        *prefix_p = best[0] ? prefix : 0;
    }
    return st;
}
