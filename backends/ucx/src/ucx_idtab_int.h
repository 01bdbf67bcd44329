/* ucx: live objects by the 64-bit id a peer echoes back (a served
 * request's in ucx_dram.c, a remote staged job's in ucx_stage.c): id =
 * slot index | (random salt, never 0) << 32, so an answer finds its
 * object in O(1) and a stale or forged id finds nothing. */
#ifndef PDX_UCX_IDTAB_INT_H
#define PDX_UCX_IDTAB_INT_H

#include "ucx_int.h"

/* The first slots, and the most: past that the doubling would wrap. */
#define UCX_IDTAB_FIRST 64u
#define UCX_IDTAB_MAX (1u << 31)

typedef struct ucx_idslot {
    uint64_t id;   /* 0: free */
    void *obj;
} ucx_idslot_t;

/* All zero is an empty table. Not locked: used where the objects it
 * holds are (progress and UCX's callbacks), never two at once. */
typedef struct ucx_idtab {
    ucx_idslot_t *slot;
    uint32_t cap;
    uint32_t *free, nfree;
} ucx_idtab_t;

/* Put `obj` (not owned) in the table: PDX_OK with its id (never 0) in
 * *id_p, or PDX_ERR_NOMEM (no memory, or UCX_IDTAB_MAX slots in use). */
pdx_status_t ucx_idtab_add(ucx_idtab_t *t, void *obj, uint64_t *id_p);
/* Take `obj` out under the id in *id_p, which is set to 0; nothing when it
 * is 0 already or that slot holds something else. */
void ucx_idtab_del(ucx_idtab_t *t, const void *obj, uint64_t *id_p);
/* The object of `id`, or NULL (never in the table, or no longer). */
void *ucx_idtab_find(const ucx_idtab_t *t, uint64_t id);
/* Free the slots (the objects are the caller's); the table is empty. */
void ucx_idtab_fini(ucx_idtab_t *t);

#endif
