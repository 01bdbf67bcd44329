/* ucx: the endpoints a service answers its requesters on (ucx_svc.c:
 * staged VRAM; ucx_dsvc.c: served host memory): one per requester's
 * worker address (validated before UCX sees it), made once and kept, most
 * recently used first, at most `max` (the least recently used idle one is
 * closed first); closes are forced. Each has an error handler: what UCX
 * sends on it for a requester that died is dropped, never fatal. */
#ifndef PDX_UCX_CLIENT_INT_H
#define PDX_UCX_CLIENT_INT_H

#include "ucx_int.h"

#include <sys/types.h>

/* A service's requesters. Not locked: used from the service's progress
 * and UCX's callbacks, as the service is. */
typedef struct ucx_clients {
    ucx_be_t *be;
    ucx_link_t live;       /* most recently used first */
    uint32_t n;            /* in `live` */
    uint32_t max;
    ucx_link_t closing;    /* their endpoint close is running */
    const char *what;      /* "served", "staged": for logs */
    /* A requester whose endpoint failed keeps it (its answers dropped)
     * until the service closes it; else a new one is made at once. */
    int keep_failed;
    int *kick;             /* set when one fails (progress closes it), or
                              NULL */
    int shut;              /* the instance is going: no new endpoint */
} ucx_clients_t;

/* A requester of the service: an endpoint of ours to its address. */
typedef struct ucx_client {
    ucx_link_t link;       /* set->live, or set->closing */
    ucx_clients_t *set;
    ucp_ep_h ep;           /* NULL once its close started */
    const void *via;       /* the requester's connection when it was made
                              (identity: a new one retires this one), or
                              NULL */
    int failed;            /* its endpoint failed: answers are dropped */
    int closing, closed;   /* its close started, ended */
    uint32_t users;        /* answers in flight to it (ucx_client_done) */
    uint64_t bytes;        /* served: their data */
    pid_t pid;             /* served: a same-host requester's, else 0 */
    int shm;               /* on this host, over UCX shared memory */
    size_t addr_len;
    unsigned char addr[];
} ucx_client_t;

/* An empty set of at most `max` requesters of `be`; `what`, `keep_failed`
 * and `kick` as above (static strings and fields of the service, which
 * outlive the set). */
void ucx_clients_init(ucx_clients_t *cs, ucx_be_t *be, uint32_t max,
                      const char *what, int keep_failed, int *kick);
/* The endpoint to the requester at `addr`, made once and kept (with
 * keep_failed, a failed one is returned as it is). `via`: the connection
 * its request came over (compared, never used), or NULL where the service
 * does not look. `pid`: its pid where the service found it in our pid
 * namespace (else 0), kept only if its address is of this host. `who`
 * names it in logs. NULL, logged, when it cannot be made. Never from
 * inside a UCX callback. */
ucx_client_t *ucx_client_get(ucx_clients_t *cs, const void *addr,
                             size_t addr_len, const void *via, pid_t pid,
                             const char *who);
/* `c` takes no more answers: closed once the service sees it (`why`, if
 * not NULL, logged at debug). */
void ucx_client_retire(ucx_client_t *c, const char *why);
/* Close `c` without waiting: forced (a requester that went needs no
 * flush, one that lives reconnects), which ends the answers UCX still
 * holds for it; freed once the close and they ended. */
void ucx_client_close(ucx_client_t *c);
/* An answer to `c` (counted in users) ended: freed if closed and unused. */
void ucx_client_done(ucx_client_t *c);
/* Free every requester without closing its endpoint: the worker they were
 * on is gone, and with it what UCX held for them. */
void ucx_clients_drop(ucx_clients_t *cs);
/* The instance is going: every requester's endpoint is forced closed (its
 * sends and receives end with errors, through their callbacks), and no
 * new one is made (ucx_client_get returns NULL: an answer that comes to
 * be sent after this is dropped; a new endpoint would wire up to a
 * requester that may be stopped, and UCX 1.13 asserts destroying a worker
 * with its wireup still queued). Nonzero while closes are under way. */
int ucx_clients_shut(ucx_clients_t *cs);

#endif
