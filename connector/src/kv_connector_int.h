/* Private to the connector: the connector object, its children behind one
 * ops table, and the records they share. Calls go one way: the router
 * (kv_multi.c) and the lifecycle (kv_connector.c) call the children
 * (kv_child_remote.c, kv_child_offload.c), which call the handoff format
 * (kv_handoff.c), the pending lookups (kv_pending.c) and the pool, store
 * and agent below; no child calls the router.
 *
 * Locks: c->lock guards every list here and is held across every op
 * except where an op's comment says otherwise. */
#ifndef PDX_KV_CONNECTOR_INT_H
#define PDX_KV_CONNECTOR_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pdx/kv_connector.h>
#include <pdx/xfer.h>

#include "kv_store_int.h"
#include "pdx_clock.h"

typedef struct kv_child kv_child_t;

/* A load the connector started (pdx_kv_load) until pdx_kv_load_check
 * reports it final. */
typedef struct kv_load {
    struct kv_load *next;
    kv_child_t *child; /* the child that loads it; NULL when nothing to */
    char req[PDX_KV_REQ_ID_MAX];
    char peer[PDX_NAME_MAX];
    char peer_req[PDX_KV_REQ_ID_MAX];
    pdx_xfer_h xfer; /* NULL once final or for offload loads */
    pdx_status_t status;
    size_t tokens;
    uint64_t last_hb_ns;
    bool aborted; /* pdx_kv_load_abort asked; ends PDX_ERR_CANCELED */
    /* Layer by layer (kv_layer_*): layer_ok[i] once layer index i landed;
     * NULL for a whole load. A layered READ has one transfer per layer
     * (lxfer[i], NULL once final); a push (D asked the holder to write,
     * kv_push.c) has none: the holder's messages set layer_ok, and it
     * ends by `deadline_ns`. */
    uint8_t *layer_ok;
    pdx_xfer_h *lxfer;
    bool push;
    size_t push_end; /* push: a layer is in once written below this */
    uint64_t deadline_ns;
} kv_load_t;

/* Is a transfer of l on its way (heartbeats keep the holder's lease)? */
static inline bool kv_load_busy(const kv_load_t *l, uint32_t nlayers)
{
    if (l->xfer != NULL || (l->push && l->status == PDX_INPROGRESS)) {
        return true;
    }
    for (uint32_t i = 0; l->lxfer != NULL && i < nlayers; i++) {
        if (l->lxfer[i] != NULL) {
            return true;
        }
    }
    return false;
}

/* A request whose blocks were freed, until pdx_kv_poll_freed reports it. */
typedef struct kv_freed {
    struct kv_freed *next;
    char req[PDX_KV_REQ_ID_MAX];
    pdx_kv_free_reason_t why;
} kv_freed_t;

/* A lookup pending on a save in flight, until its deadline (kv_pending.c). */
typedef struct kv_pending {
    struct kv_pending *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t deadline_ns;
} kv_pending_t;

/* pdx_kv_request_finished in the making: the inputs, what the offload
 * child adds (asked first) and what the remote child makes of it. */
typedef struct kv_finish {
    const pdx_kv_request_t *r;
    const uint64_t *ids;
    size_t tokens;
    pdx_kv_handoff_from_t from;
    /* Offload child, from the pool: the lease of the first n_addrs full
     * blocks and their slot addresses (the remote child takes the lease). */
    pdx_offload_lease_h lease;
    uint64_t *addrs;
    size_t n_addrs;
    /* Offload child: how many of the request's full blocks the pool holds. */
    bool has_offload_blocks;
    size_t offload_blocks;
    char *params; /* remote child: the handoff parameters, malloc'd */
} kv_finish_t;

/* How a load goes (pdx_kv_load_ex): from block `first` on, and one
 * transfer per layer when `layered`. */
typedef struct kv_load_opts {
    size_t first;
    bool layered;
} kv_load_opts_t;

/* One child of the MultiConnector. Every op is optional (NULL: the child
 * has no part in it) and, unless said otherwise, runs under c->lock. */
typedef struct kv_child_ops {
    const char *name;
    /* PDX_OK with *m set when this child matches (untouched when not),
     * PDX_INPROGRESS to be asked again, < 0 on error. */
    pdx_status_t (*lookup)(kv_child_t *ch, const pdx_kv_request_t *r,
                           pdx_kv_match_t *m);
    /* Without c->lock, before the load is recorded: the part of a load
     * that may take long (a copy) without stalling progress. */
    pdx_status_t (*load_prepare)(kv_child_t *ch, const pdx_kv_request_t *r,
                                 const pdx_kv_match_t *m,
                                 const kv_load_opts_t *o,
                                 const uint64_t *ids);
    /* Start the load of match m into l; `prepared` is load_prepare's
     * status (PDX_OK without one). PDX_ERR_NOT_FOUND is recorded in l and
     * reported by pdx_kv_load_check; other errors drop l. */
    pdx_status_t (*load)(kv_child_t *ch, const pdx_kv_request_t *r,
                         const pdx_kv_match_t *m, const kv_load_opts_t *o,
                         const uint64_t *ids, pdx_status_t prepared,
                         kv_load_t *l);
    /* The status of l now: PDX_INPROGRESS while bytes are on their way. */
    pdx_status_t (*load_check)(kv_child_t *ch, kv_load_t *l);
    pdx_status_t (*save)(kv_child_t *ch, const pdx_kv_request_t *r,
                         const uint64_t *ids);
    /* PDX_INPROGRESS while the saves of req_id are being copied, else
     * their final status (PDX_OK when none are known). */
    pdx_status_t (*save_check)(kv_child_t *ch, const char *req_id);
    /* Its part of the handoff parameters (kv_finish_t). */
    pdx_status_t (*request_finished)(kv_child_t *ch, kv_finish_t *f);
    /* A connector message (kv_handoff.h) `verb` about request `req` from
     * `peer`, with the text after them in `rest` ("" when none): true when
     * this child took it. */
    bool (*on_message)(kv_child_t *ch, const char *peer, const char *verb,
                       const char *req, const char *rest);
    /* Layer-wise save (pdx_kv_save_layer): its part of it. */
    pdx_status_t (*save_layer)(kv_child_t *ch, const pdx_kv_request_t *r,
                               const pdx_kv_layer_save_t *s,
                               const uint64_t *ids);
    /* pdx_kv_request_dropped: forget the request's layer-wise state. */
    void (*request_dropped)(kv_child_t *ch, const char *req_id);
    /* Timers (leases, heartbeats); returns events. check_dead: whether the
     * readers of held blocks should be checked for death now. */
    int (*progress)(kv_child_t *ch, uint64_t now, bool check_dead);
    /* First in the connector's teardown: threads stopped, state freed
     * (c->pool, c->store and the agent still exist). Without c->lock. */
    void (*destroy)(kv_child_t *ch);
} kv_child_ops_t;

struct kv_child {
    const kv_child_ops_t *ops;
    pdx_kv_connector_h conn;
    const pdx_kv_child_config_t *cfg;
};

struct pdx_kv_connector {
    uint32_t magic; /* PDX_MAGIC_CONN; first, as pdx_call.h requires */
    pthread_mutex_t lock;
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    size_t narenas;
    pdx_arena_t *arenas;
    uint64_t *arena_off; /* offset of each arena's slice in a pool block */
    uint64_t block_bytes;
    uint32_t block_tokens;
    /* The layout's layers: nlayers distinct arena layer numbers in
     * ascending order, and arena a's index among them, arena_li[a]. */
    uint32_t nlayers;
    uint32_t *layers;
    uint32_t *arena_li;
    pdx_agent_h agent;
    pdx_hasher_h hasher;
    /* The config of the last child of each type (the schema allows one);
     * the remote one's failure policy is the connector's. */
    const pdx_kv_child_config_t *remote, *offload;
    kv_child_t *remote_child, *offload_child;
    kv_child_t *order[PDX_KV_MAX_CHILDREN]; /* config order, for lookup */
    pdx_offload_pool_h pool; /* made by the offload child; NULL without */
    kv_load_t *loads;
    kv_freed_t *freed, *freed_tail;
    kv_pending_t *pending;
    kv_store_t *store; /* kv_store.c: the `store` section; NULL without */
};


static inline uint64_t kv_arena_block_bytes(const pdx_arena_t *a)
{
    return (uint64_t)a->bytes_per_token * a->block_tokens;
}

/* kv_child_remote.c: the remote P/D child. */
pdx_status_t kv_remote_create(pdx_kv_connector_h c,
                              const pdx_kv_child_config_t *cfg,
                              kv_child_t **ch_p);
size_t kv_remote_held(kv_child_t *ch);
/* The READ of handoff parameters r->params into the local blocks `ids`
 * (the remote child's loads and the cross-node offload hits): blocks from
 * o->first on, into ids[0...], one transfer per layer when o->layered.
 * Its check: l->status now (a push's too), transfers released once
 * final, the holder told "done" once a layered READ all landed. */
pdx_status_t kv_remote_read(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                            const pdx_kv_match_t *m, const kv_load_opts_t *o,
                            const uint64_t *ids, kv_load_t *l);
pdx_status_t kv_remote_read_check(kv_child_t *ch, kv_load_t *l);

/* The index of layout layer `layer` in c->layers, or -1 when the layout
 * has none. */
static inline int kv_layer_index(pdx_kv_connector_h c, uint32_t layer)
{
    for (uint32_t i = 0; i < c->nlayers; i++) {
        if (c->layers[i] == layer) {
            return (int)i;
        }
    }
    return -1;
}

/* A load record freed with its transfers (released: aborted if still in
 * flight) and its layer marks. */
static inline void kv_load_free(pdx_kv_connector_h c, kv_load_t *l)
{
    if (l->xfer != NULL) {
        pdx_xfer_release(l->xfer);
    }
    for (uint32_t i = 0; l->lxfer != NULL && i < c->nlayers; i++) {
        if (l->lxfer[i] != NULL) {
            pdx_xfer_release(l->lxfer[i]);
        }
    }
    free(l->lxfer);
    free(l->layer_ok);
    free(l);
}

/* kv_push.c: layer-wise pushes, the remote child's. A prefill node keeps
 * one record per request it saved layer by layer or that a decode node
 * asked for (`list`, the remote child's); a decode node's asks are load
 * records (c->loads). */
typedef struct kv_push kv_push_t;
typedef enum kv_push_state {
    KV_PUSH_NONE = 0,    /* no record, or one still going */
    KV_PUSH_DONE = 1,    /* every layer of the last step written */
    KV_PUSH_REFUSED = 2, /* the decode node rejected it, or it failed */
} kv_push_state_t;
/* Called when a push ends (each once), under c->lock. */
typedef void (*kv_push_end_cb_t)(void *arg, const char *req,
                                 kv_push_state_t how);
pdx_status_t kv_push_expect(pdx_kv_connector_h c, const char *req_id,
                            const pdx_kv_push_expect_t *e,
                            const uint64_t *ids, kv_load_t *l);
pdx_status_t kv_push_save_layer(pdx_kv_connector_h c, kv_push_t **list,
                                const pdx_kv_request_t *r,
                                const pdx_kv_layer_save_t *s,
                                const uint64_t *ids);
/* P: want/arena/reject about its records; D: lyr/pushed/nopush about its
 * loads. True when taken. */
bool kv_push_on_message(pdx_kv_connector_h c, kv_push_t **list,
                        const char *peer, const char *verb, const char *req,
                        const char *rest);
/* Writes checked, ends reported through `cb`; D's asks timed out or
 * their holder dead. Returns events. */
int kv_push_progress(pdx_kv_connector_h c, kv_push_t **list, uint64_t now,
                     kv_push_end_cb_t cb, void *arg);
/* The state of req's record, and whether one exists. */
kv_push_state_t kv_push_state(kv_push_t *list, const char *req,
                              bool *exists_p);
/* Drop req's record (a decode node that asked is told "nopush" when
 * `tell`). */
void kv_push_forget(pdx_kv_connector_h c, kv_push_t **list, const char *req,
                    bool tell);
void kv_push_free_all(pdx_kv_connector_h c, kv_push_t **list);
/* P: the request finished here with these `n` blocks: what was not saved
 * layer by layer is pushed whole now (the last step). */
void kv_push_finished(pdx_kv_connector_h c, kv_push_t *list, const char *req,
                      const uint64_t *ids, size_t n);
/* The D side of a push: its layer check (l->push), in kv_push.c. */
pdx_status_t kv_push_load_check(pdx_kv_connector_h c, kv_load_t *l);

/* kv_child_offload.c: the offload child (the host pool, its save worker).
 * Creates c->pool and registers its slab with the agent. */
pdx_status_t kv_offload_child_create(pdx_kv_connector_h c,
                                     const pdx_kv_child_config_t *cfg,
                                     kv_child_t **ch_p);

/* kv_pending.c: lookups pending on a save in flight. */
/* True while `req` may still wait (its deadline, set the first time from
 * timeout_ms, is ahead); false when it passed or memory ran out. */
bool kv_pending_wait(kv_pending_t **list, const char *req,
                     uint32_t timeout_ms);
void kv_pending_forget(kv_pending_t **list, const char *req);
void kv_pending_free(kv_pending_t **list);

#endif
