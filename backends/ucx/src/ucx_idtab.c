/* ucx: the id table of ucx_idtab_int.h (its ids are what a peer sends
 * back, so every lookup checks the index and the salt). */
#include "ucx_idtab_int.h"

#include <sys/random.h>

pdx_status_t ucx_idtab_add(ucx_idtab_t *t, void *obj, uint64_t *id_p)
{
    if (t->nfree == 0) {
        if (t->cap >= UCX_IDTAB_MAX) {
            return PDX_ERR_NOMEM;
        }
        uint32_t cap = t->cap ? t->cap * 2 : UCX_IDTAB_FIRST;
        ucx_idslot_t *s = realloc(t->slot, cap * sizeof(*s));
        if (s == NULL) {
            return PDX_ERR_NOMEM;
        }
        t->slot = s;
        uint32_t *f = realloc(t->free, cap * sizeof(*f));
        if (f == NULL) {
            return PDX_ERR_NOMEM;
        }
        t->free = f;
        for (uint32_t i = cap; i > t->cap; i--) {
            t->slot[i - 1] = (ucx_idslot_t){0};
            t->free[t->nfree++] = i - 1;
        }
        t->cap = cap;
    }
    uint32_t idx = t->free[--t->nfree];
    uint32_t salt = 0;
    if (getrandom(&salt, sizeof(salt), GRND_NONBLOCK) != sizeof(salt)) {
        salt = (uint32_t)pdx_now_ns();
    }
    uint64_t id = ((uint64_t)(salt | 1u) << 32) | idx;
    t->slot[idx] = (ucx_idslot_t){.id = id, .obj = obj};
    *id_p = id;
    return PDX_OK;
}

void ucx_idtab_del(ucx_idtab_t *t, const void *obj, uint64_t *id_p)
{
    uint64_t id = *id_p;
    if (id == 0) {
        return;
    }
    uint32_t idx = (uint32_t)id;
    if (idx < t->cap && t->slot[idx].obj == obj && t->slot[idx].id == id) {
        t->slot[idx] = (ucx_idslot_t){0};
        t->free[t->nfree++] = idx;
    }
    *id_p = 0;
}

void *ucx_idtab_find(const ucx_idtab_t *t, uint64_t id)
{
    uint32_t idx = (uint32_t)id;
    if (t == NULL || id == 0 || idx >= t->cap || t->slot[idx].obj == NULL ||
        t->slot[idx].id != id) {
        return NULL;
    }
    return t->slot[idx].obj;
}

void ucx_idtab_fini(ucx_idtab_t *t)
{
    free(t->slot);
    free(t->free);
    *t = (ucx_idtab_t){0};
}
