/* The peer object: a loaded peer incarnation and its regions (peer.c).
 * Loading, reloading and unloading them is metadata.c. */
#ifndef PDX_PEER_INT_H
#define PDX_PEER_INT_H

#include <stdbool.h>

#include "agent_int.h"

struct pdx_stats_entry;
struct pdx_path_cost;

typedef struct pdx_peer_region {
    pdx_region_t region;
    void *rmd[PDX_MAX_BACKENDS];
    /* Per backend: the backend's path op said this region takes its
     * fallback (e.g. cma without a mapping: process_vm). */
    bool slow[PDX_MAX_BACKENDS];
    /* What the blob said of it (fields and keys): a reload keeps this
     * object, its keys and what uses it when the new blob says the same. */
    uint64_t key_hash;
    /* Prepared lists holding it. A region removed or changed by a reload
     * (or whose peer went) is `gone`: its keys are unloaded, lists using it
     * are refused (STALE), and the last list to let go frees it. */
    uint32_t users;
    bool gone;
} pdx_peer_region_t;

typedef struct pdx_peer {
    char name[PDX_NAME_MAX];
    uint64_t name_hash;     /* XXH3 of name: the agent's peer index */
    struct pdx_peer *hnext; /* next in its index bucket */
    uint64_t instance;   /* the peer's instance id from its blob */
    uint32_t generation; /* the peer's generation from its blob */
    uint64_t epoch;      /* this agent's id for this incarnation */
    char host_id[PDX_BLOB_HOST_MAX];
    int32_t pid;
    int pidfd; /* -1 when the peer is not on this host */
    bool pidfd_watched; /* in the progress thread's set (live peers) */
    bool same_host; /* same host id: fallbacks are counted for it */
    pdx_status_t dead; /* PDX_OK while alive */
    char dead_how[64]; /* how it was found dead */
    uint64_t dead_ns;  /* pdx_now_ns() when it was found dead */
    bool dead_final;   /* its process exited or its agent was destroyed:
                        * never revived (only a new instance replaces it) */
    struct pdx_stats_entry *stats;
    /* Path report: per backend its transport name for this peer, and why
     * host (dram_why) or GPU (vram_why) memory of this same-host peer does
     * not take the fast path ("" when it does or the peer is remote). */
    char transport[PDX_MAX_BACKENDS][64];
    char slow_why[PDX_MAX_BACKENDS][PDX_WHY_MAX];
    char dram_why[PDX_WHY_MAX];
    char vram_why[PDX_WHY_MAX];
    /* Measured costs of competing paths (path.c), NULL until needed. */
    struct pdx_path_cost *cost;
    void *bpeer[PDX_MAX_BACKENDS];
    /* hash of the blob's backend names and connection infos: a reload of
     * the same instance with the same hash keeps the connections */
    uint64_t conn_hash;
    pdx_peer_region_t **regions; /* sorted by (mem_type, addr) */
    size_t nregions;
    struct pdx_peer *next;
} pdx_peer_t;

/* All with agent->lock held. */
pdx_peer_t *pdx_peer_find(pdx_agent_h agent, const char *name);
/* The index of loaded peers by name (pdx_peer_find): add a peer before it
 * is linked into agent->peers, remove it before it is unlinked. Lock
 * held. */
void pdx_peer_index_add_locked(pdx_agent_h agent, pdx_peer_t *p);
void pdx_peer_index_del_locked(pdx_agent_h agent, pdx_peer_t *p);
/* The progress thread's set of peers' pidfds (agent->nap_epoll_fd), live
 * peers only. Watch: add those of peers loaded or revived since the last
 * look (a closed pidfd leaves by itself). Unwatch: a peer found dead (an
 * exited process's pidfd stays readable, and every wait would end at once
 * while the dead peer stays loaded); a revived one comes back at the next
 * watch. Lock held. */
void pdx_peer_watch_pidfds_locked(pdx_agent_h agent);
void pdx_peer_unwatch_pidfd_locked(pdx_agent_h agent, pdx_peer_t *p);
/* Has the same-host peer's process exited or begun to (its pidfd
 * readable, or PF_EXITING in /proc/PID/stat)? Never blocks; reads /proc
 * (an error path's check, not a poll's). */
bool pdx_peer_pid_exited(const pdx_peer_t *p);
/* Index of the last region of `peer` starting at or before (t, addr), or
 * SIZE_MAX. */
size_t pdx_peer_region_index(const pdx_peer_t *peer, pdx_mem_type_t t,
                             uint64_t addr);
pdx_peer_region_t *pdx_peer_region_find(pdx_peer_t *peer, pdx_mem_type_t t,
                                        uint64_t addr, uint64_t len);
/* Unload the keys of peer region `g` from every backend. */
void pdx_peer_region_unload_locked(pdx_agent_h agent, pdx_peer_region_t *g);
/* A prepared list lets go of peer region `g`: frees it when gone and
 * unused. */
void pdx_peer_region_put_locked(pdx_peer_region_t *g);
/* Take `g` out of its peer's region table (lists holding it are refused
 * STALE; its keys stay loaded), and later unload and free it (the region
 * left its peer: removed, changed or the peer went; freed unless prepared
 * lists hold it, then the last one frees it). */
void pdx_peer_region_retire_locked(pdx_peer_t *peer, pdx_peer_region_t *g);
void pdx_peer_region_drop_locked(pdx_agent_h agent, pdx_peer_region_t *g);

/* Send `msg` to `peer` over the first backend that carries messages to
 * it (an application's notification or pdx's own, ctl.c). Lock held, no
 * backend busy. */
pdx_status_t pdx_peer_send_locked(pdx_agent_h agent, pdx_peer_t *peer,
                                  const void *msg, size_t len);

#endif
