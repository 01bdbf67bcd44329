/* The prepared list object (dlist.c): descriptors resolved once to their
 * regions, for pdx_xfer_make's index selection. */
#ifndef PDX_DLIST_INT_H
#define PDX_DLIST_INT_H

#include <stdbool.h>

#include <pdx/xfer.h>

#include "agent_int.h"
#include "peer_int.h"

typedef struct pdx_dlist_entry {
    uint64_t addr;
    uint64_t len;
    void *region; /* struct pdx_mem_reg * or pdx_peer_region_t * */
} pdx_dlist_entry_t;

struct pdx_dlist {
    uint32_t magic; /* PDX_MAGIC_DLIST */
    pdx_agent_h agent;
    bool remote;
    char peer_name[PDX_NAME_MAX];
    uint64_t peer_epoch;
    pdx_mem_type_t mem_type;
    pdx_dlist_entry_t *entries;
    size_t entries_map_len; /* mmapped (huge pages) when > 0 */
    size_t count;
    struct pdx_mem_reg **regs; /* local: distinct regions, users held */
    size_t nregs;
    pdx_peer_region_t **rregs; /* remote: distinct regions, users held */
    size_t nrregs;
};

#endif
