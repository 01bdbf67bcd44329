/* glm52-pd-node's arena blocks: a stack of free ids, the blocks of
 * prefills held for the peer until pdx_kv_poll_freed reports them, and the
 * quarantine of blocks whose load was aborted (canary-filled, checked and
 * freed once nothing can land in them any more; in GPU memory, through
 * the mirror: gpu.c). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"

int blocks_take(node_t *nd, size_t n, uint64_t *out)
{
    if (nd->nfree < n) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = nd->free_ids[--nd->nfree];
    }
    uint64_t used = nd->cfg.num_blocks - nd->nfree;
    if (used > nd->peak_used) {
        nd->peak_used = used;
    }
    return 0;
}

void blocks_put(node_t *nd, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        nd->free_ids[nd->nfree++] = ids[i];
    }
}

void canary_fill(node_t *nd, uint64_t id)
{
    for (size_t a = 0; a < nd->model.narenas; a++) {
        const pd_arena_view_t *v = &nd->model.arenas[a];
        memset(v->base + id * v->stride, CANARY_BYTE,
               (size_t)v->bytes_per_token * nd->B);
    }
}

/* Bytes of block `id` (all arenas) that are no longer the canary. */
static uint64_t canary_diff(const node_t *nd, uint64_t id)
{
    uint64_t bad = 0;
    for (size_t a = 0; a < nd->model.narenas; a++) {
        const pd_arena_view_t *v = &nd->model.arenas[a];
        const uint8_t *p = v->base + id * v->stride;
        size_t len = (size_t)v->bytes_per_token * nd->B;
        for (size_t i = 0; i < len; i++) {
            bad += p[i] != CANARY_BYTE;
        }
    }
    return bad;
}

/* Check and free quarantined blocks whose time is up. */
void quarantine_step(node_t *nd)
{
    double now = pdx_now_ms_f();
    for (quarantine_t **pp = &nd->quarantine; *pp != NULL;) {
        quarantine_t *q = *pp;
        if (++q->passes < QUARANTINE_PASSES || now < q->release_at) {
            pp = &q->next;
            continue;
        }
        uint64_t bad = 0;
        if (gpu_pull(nd, q->blocks, q->ncanary) != 0) {
            /* Unreadable: counted as changed, the blocks still freed. */
            bad = q->ncanary;
        } else {
            for (size_t i = 0; i < q->ncanary; i++) {
                bad += canary_diff(nd, q->blocks[i]);
            }
        }
        nd->canary_blocks += q->ncanary;
        if (bad != 0) {
            say("%s: %" PRIu64 " bytes of its %zu blocks changed after its "
                "load was aborted",
                q->req, bad, q->ncanary);
            nd->late_bytes += bad;
        }
        blocks_put(nd, q->blocks, q->n);
        free(q->blocks);
        *pp = q->next;
        free(q);
    }
}

void on_freed(void *arg, const char *req_id, pdx_kv_free_reason_t why)
{
    node_t *nd = arg;
    if ((unsigned)why < 3) {
        nd->freed[why]++;
    }
    if (why == PDX_KV_FREED_EXPIRED) {
        say("%s: held blocks freed by lease expiry (the peer never read "
            "them)",
            req_id);
    }
    for (held_blocks_t **pp = &nd->held; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->req, req_id) == 0) {
            held_blocks_t *h = *pp;
            *pp = h->next;
            blocks_put(nd, h->blocks, h->n);
            free(h->blocks);
            free(h);
            return;
        }
    }
}
