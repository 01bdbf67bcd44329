/* The registration object: a local region registered with every backend
 * that takes its memory type (mem.c), kept sorted in agent->regs. */
#ifndef PDX_MEM_INT_H
#define PDX_MEM_INT_H

#include <stdbool.h>
#include <stdlib.h>

#include "agent_int.h"

struct pdx_mem_reg {
    pdx_region_t region;
    void *md[PDX_MAX_BACKENDS];
    uint32_t users; /* requests and prepared lists using it */
};

/* All with agent->lock held. */
struct pdx_mem_reg *pdx_reg_find(pdx_agent_h agent, pdx_mem_type_t t,
                                 uint64_t addr, uint64_t len);
/* Deregister `r` from every backend that took it, release its shared
 * range, free it. The caller has removed it from agent->regs. */
void pdx_mem_reg_free_locked(pdx_agent_h agent, struct pdx_mem_reg *r);
/* pdx_mem_deregister's first half: refuse (BUSY) a registration still in
 * use or (INVALID) one that is not the agent's, else take it out of
 * agent->regs and publish the new generation. The caller tells peers
 * (ctl.c) and frees it. */
pdx_status_t pdx_mem_unlink_locked(pdx_agent_h agent,
                                   struct pdx_mem_reg *reg);

/* Append a region to a distinct set kept small by checking the last few
 * (requests and prepared lists hold each region they use once). */
static inline pdx_status_t pdx_mem_reg_set_add(struct pdx_mem_reg ***set,
                                               size_t *n, size_t *cap,
                                               struct pdx_mem_reg *r)
{
    for (size_t i = 0; i < *n; i++) {
        if ((*set)[i] == r) {
            return PDX_OK;
        }
    }
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        void *p = realloc(*set, c * sizeof(**set));
        if (p == NULL) {
            return PDX_ERR_NOMEM;
        }
        *set = p;
        *cap = c;
    }
    (*set)[(*n)++] = r;
    return PDX_OK;
}

#endif
