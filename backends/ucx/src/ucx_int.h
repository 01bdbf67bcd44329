/* ucx: the backend's private header: limits, the objects (instance, peer,
 * keys, requests, notifications) and the functions the files share. The
 * layers, bottom up: ucx_status, ucx_wire (a peer's address and keys
 * checked), ucx_am (notifications), ucx_request, ucx_peer (peers, their
 * endpoints and workers), ucx_mem and ucx_xfer, ucx_backend (the
 * instance), ucx_ops (the table); calls only point down. */
#ifndef PDX_UCX_INT_H
#define PDX_UCX_INT_H

#include <pdx/backend.h>
#include <pdx/log.h>

#include "ucx_wire_int.h"

#include <ucp/api/ucp.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdx_clock.h"
#include "pdx_opts.h"

#ifdef PDX_UCX_CUDA
#include "cu_api_int.h"
#endif

/* Active message ids; both sides are this module. Notifications, and the
 * staged VRAM protocol (ucx_stage.c). */
#define UCX_AM_ID_NOTIF 0x5d
#define UCX_AM_ID_STAGE 0x5e
/* Host memory served by its owner (ucx_dram.c, ucx_dsvc.c): requests and
 * their answers. */
#define UCX_AM_ID_DRAM 0x5f
/* A single tcp put of 32-64 MiB stalls with UCX 1.13; smaller pieces flow. */
#define UCX_DEFAULT_MAX_CHUNK (8ull << 20)
#define UCX_DEFAULT_KEEPALIVE_MS 5000ull /* see ucx_create */
/* GPU memory staged through host memory (ucx_vram.c): the pinned pool
 * (made at the first VRAM registration), its slots (a job's largest
 * piece) and the jobs a request keeps in flight. */
#define UCX_DEFAULT_STAGE_POOL (64ull << 20)
#define UCX_DEFAULT_STAGE_CHUNK (1ull << 20)
#define UCX_DEFAULT_STAGE_WINDOW 16u
#define UCX_MIN_MAX_CHUNK 4096ull
#define UCX_MAX_MAX_CHUNK (1ull << 30)
/* Notifications are control messages; the cap keeps a hostile or buggy peer
 * from making us allocate without bound. */
#define UCX_MAX_NOTIF (16u << 20)
/* Up to this size a notification is forced eager: it arrives whole in the
 * receive callback, with no rendezvous round trip. */
#define UCX_NOTIF_EAGER_MAX 4096u
/* Agent names travel as the AM header. */
#define UCX_MAX_NAME 255u
/* Bounds on waits inside an op: closing an endpoint, draining a READ. */
#define UCX_CLOSE_TIMEOUT_NS 1000000000ull
/* What disconnect spends progressing a close before leaving it to progress
 * (the agent lock is held). */
#define UCX_CLOSE_SPIN_NS 2000000ull
/* What destroy spends progressing closes it had to force. */
#define UCX_FORCE_REAP_NS 200000000ull
/* Draining a released READ gives up after this long without a get chunk
 * completing (a stalled peer), or after the cap even while data flows. */
#define UCX_DRAIN_IDLE_NS 1000000000ull
#define UCX_DRAIN_MAX_NS 5000000000ull
/* A worker that cannot be armed while its progress finds nothing is
 * polled at once for this long, then left unarmed (see ucx_arm_one), and
 * reported after UCX_STUCK_WARN_NS. */
#define UCX_STUCK_NS 10000000ull
#define UCX_STUCK_WARN_NS 1000000000ull
/* ucp_worker_progress calls per progress op; keeps one call short. */
#define UCX_PROGRESS_ROUNDS 64
#define UCX_PROGRESS_MAX_NS 500000ull
#define UCX_PROGRESS_CLOCK_EVERY 8 /* a power of two */

#define UCX_CONTAINER(ptr, type, member)                                       \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* Intrusive circular list: unlinking needs only the node, so a callback can
 * drop an object from whichever list holds it. */
typedef struct ucx_link {
    struct ucx_link *prev;
    struct ucx_link *next;
} ucx_link_t;

static inline void ucx_list_init(ucx_link_t *head)
{
    head->prev = head;
    head->next = head;
}

static inline int ucx_list_empty(const ucx_link_t *head)
{
    return head->next == head;
}

static inline void ucx_list_push(ucx_link_t *head, ucx_link_t *node)
{
    node->prev = head->prev;
    node->next = head;
    head->prev->next = node;
    head->prev = node;
}

static inline void ucx_list_del(ucx_link_t *node)
{
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node;
    node->next = node;
}

typedef struct ucx_be ucx_be_t;

/* What a worker's AM handlers get: the instance and the worker (a reply's
 * data is received on the worker it arrived on). */
typedef struct ucx_wctx {
    ucx_be_t *be;
    ucp_worker_h worker;
    /* Its address (a copy), which staged requests carry: a peer answers
     * on an endpoint of its own to it. */
    void *addr;
    size_t addr_len;
} ucx_wctx_t;

/* A worker's receive FIFO blocked by a half-written message (see
 * ucx_arm_one): what the last progress of the worker found, and since when
 * it cannot be armed with nothing to progress. */
typedef struct ucx_wstate {
    unsigned last_events;
    uint64_t stuck_since_ns;
    int stuck_warned;
} ucx_wstate_t;

typedef struct ucx_peer {
    ucx_link_t link; /* be->peers, or be->zombies after a timed-out close */
    ucx_be_t *be;
    /* The worker its endpoint lives on: the instance's main one, or (a
     * same-host peer over shared memory, ucx_peer_wants_worker) its own,
     * made with the endpoint and destroyed with the peer. A get's reply
     * comes back to the worker that posted it, into that worker's one
     * shared-memory receive FIFO, which every sender to it writes in
     * order: a sender stopped or killed between taking a FIFO slot and
     * filling it blocks every message behind it, for good if it died.
     * With a worker of its own per such peer, only that peer's replies
     * wait behind it. */
    ucp_worker_h worker;
    int own_worker;
    ucx_link_t wlink;         /* be->wpeers while it has its own worker */
    ucx_wstate_t ws;          /* its own worker's */
    ucx_wctx_t wctx;          /* its own worker's AM handler context */
    ucp_ep_h ep;              /* NULL until first use (lazy connect) and
                                 once force-closed */
    void *addr;               /* the validated worker address, kept until
                                 the endpoint is created (NULL after) */
    size_t addr_len;
    pdx_status_t connect_st;  /* a lazy connect that failed, or PDX_OK */
    char *name;
    ucs_status_t ep_status;   /* UCS_OK until the endpoint failed */
    int ucx_failed;           /* UCX reported it: close must be forced */
    int wired;                /* an operation completed: wireup is done */
    int error_pending;        /* failure not yet reported to the agent */
    ucx_link_t reqs;          /* live transfer requests */
    ucx_link_t sends;         /* standalone notifications in flight */
    void *close_req;          /* endpoint close in flight, or NULL */
    void *flush_req;          /* flush before a close in flight, or NULL */
    int abandoned;            /* a request was released still in flight */
    uint64_t close_deadline;  /* when a flush or close gives up (forced) */
    char transport[64];       /* lanes' transports, for the path report */
    ucx_vaddr_t vaddr;        /* its validated address (keys are checked
                                 against it) */
    ucx_link_t rmds;          /* its keys (ucx_rmd_t.plink): unpacked on
                                 its endpoint's worker, destroyed first */
    /* An aborted staged transfer waits on it past UCX_DRAIN_IDLE_NS
     * (ucx_stage.c): progress gives it up. */
    int stage_stalled;
    /* Its host memory is served (ucx_dram.c): -1 not known yet. */
    int served;
    /* Its service takes a WRITE's data in pieces (said in its answers). */
    int dsvc_wpieces;
} ucx_peer_t;

/* How this instance carries GPU memory (ucx_vram.c): not at all, staged
 * through its pinned pool, or natively (UCX maps CUDA memory). */
typedef enum ucx_vram_mode {
    UCX_VRAM_OFF = 0,
    UCX_VRAM_STAGED = 1,
    UCX_VRAM_NATIVE = 2,
} ucx_vram_mode_t;

/* The option vram=auto|native|staged|off. */
typedef enum ucx_vram_opt {
    UCX_VRAM_OPT_AUTO = 0,
    UCX_VRAM_OPT_NATIVE,
    UCX_VRAM_OPT_STAGED,
    UCX_VRAM_OPT_OFF,
} ucx_vram_opt_t;

typedef struct ucx_md {
    ucp_mem_h memh;  /* NULL: a staged VRAM region (UCX never sees it) */
    uint64_t addr;
    uint64_t len;
    pdx_mem_type_t type;
    int dev;         /* VRAM: the device ordinal here */
    int readonly;    /* registered PDX_REGION_F_READONLY */
    /* VRAM: what a peer's staged request must name (its capability, as
     * an rkey is one for RMA); random, never 0. */
    /* DRAM: what a peer's served request must name (ucx_dsvc.c); random,
     * never 0. */
    uint64_t token;
    ucx_link_t vlink; /* be->vregs while a VRAM region, be->dregs while a
                         DRAM one */
    uint32_t svc_busy; /* service jobs holding it (ucx_stage.c) */
} ucx_md_t;

typedef struct ucx_rmd {
    ucx_link_t plink; /* peer->rmds while the peer lives */
    ucp_rkey_h rkey;  /* NULL until first use (unpacking needs the
                         endpoint), and for a staged region */
    void *key;        /* the validated packed key until then */
    size_t key_len;
    ucx_peer_t *peer;
    uint64_t addr;
    uint64_t len;
    pdx_mem_type_t type;
    /* A peer's VRAM region its own staging serves (ucx_stage.c): the
     * token its requests name, the device, and the largest chunk (table
     * and data) its service slots take. */
    int staged;
    uint64_t token;
    uint32_t dev;
    uint32_t slot;
} ucx_rmd_t;

typedef enum ucx_stage {
    UCX_STAGE_FLUSH = 0, /* puts/gets posted, waiting for the ep flush */
    UCX_STAGE_NOTIF = 1, /* data landed, notification AM in flight */
    UCX_STAGE_DONE = 2,
} ucx_stage_t;

struct ucx_sreq; /* a staged request's jobs (ucx_stage.c) */

/* A transfer request. At most one UCX request (the flush, then the AM send)
 * points at it through user_data; after xfer_release the owner is gone and
 * that callback frees it ("detach"), so no callback sees freed memory. */
typedef struct ucx_req {
    ucx_link_t link; /* peer->reqs; be->orphans once detached */
    ucx_be_t *be;
    ucx_peer_t *peer; /* NULL once released or the peer went away */
    pdx_xfer_op_t op;
    ucx_stage_t stage;
    pdx_status_t status;
    void *ucs_req;  /* UCX request in flight (flush, notification), or NULL */
    ucp_worker_h worker; /* the worker its UCX requests are on */
    /* A READ's gets whose completion has not come: a READ ends on its
     * gets' own completions (no flush); their first failure. */
    uint32_t gets_left;
    ucs_status_t get_status;
    int aborted;    /* do not start the notification */
    int released;   /* owner gone: the callback frees */
    /* A request with pieces staged through host memory (GPU memory on
     * either side without native UCX support): its jobs, or NULL. */
    struct ucx_sreq *sreq;
    /* A request of host memory the peer serves (ucx_dram.c): its chunks,
     * or NULL. */
    struct ucx_dreq *dreq;
    /* Draining an aborted READ (see ucx_req_drain_check): when the last
     * get chunk completed, as far as this request can tell. */
    uint64_t drain_start_ns, drain_event_ns, drain_gets;
    int has_notif;
    size_t notif_len;
    size_t notif_cap; /* bytes of notif[] allocated */
    unsigned char notif[];
} ucx_req_t;

/* Ended requests kept for the next post (ucx_req_get / ucx_req_put): a
 * malloc and a free less per small request. Only those with room for a
 * notification of UCX_REQ_CACHE_NOTIF bytes, at most UCX_REQ_CACHE_MAX. */
#define UCX_REQ_CACHE_MAX 64
#define UCX_REQ_CACHE_NOTIF 64

/* A standalone notification; the AM buffer must outlive the send. */
typedef struct ucx_send {
    ucx_link_t link; /* peer->sends; be->orphans' send list */
    size_t len;
    unsigned char data[];
} ucx_send_t;

/* A received notification, queued so that host callbacks run only from
 * progress/xfer_check and in arrival order (a rendezvous one holds back
 * the ones behind it until its data is in). */
typedef struct ucx_inmsg {
    ucx_link_t link;
    ucx_be_t *be;
    int ready;
    int failed;
    char peer[UCX_MAX_NAME + 1];
    size_t len;
    unsigned char data[];
} ucx_inmsg_t;

struct ucx_be {
    pdx_backend_host_t host;
    size_t name_len;
    ucp_context_h ctx;
    ucp_worker_h worker; /* main: its address is the conn info; peers'
                            requests and notifications arrive here */
    /* One epoll set (UCX's external event fd) holding the wake-up fds of
     * every worker of the instance: the fd the agent sleeps on. */
    int efd;
    int peer_workers;    /* option peer_workers: 1 auto, 0 off */
    ucx_link_t wpeers;   /* peers with a worker of their own (wlink) */
    ucx_wstate_t main_ws; /* the main worker's */
    ucx_wctx_t main_wctx; /* the main worker's AM handler context */
    ucx_vaddr_t self;    /* the main worker's own address, parsed */
    uint64_t max_chunk;
    uint64_t keepalive_ms; /* UCX keepalive period; 0: UCX's own setting */
    int lazy;              /* endpoints at first use, not at connect */
    uint64_t gets_done; /* completed get chunks: drain progress indicator */
    /* transfer requests that ended (ucx_req_finish): a progress call
     * returns once one ends (ucx_worker_progress_bounded) */
    uint64_t reqs_done;
    char tls[128];
    ucx_link_t peers;
    ucx_link_t zombies;       /* peers whose close did not finish in time */
    ucx_link_t orphan_reqs;   /* released requests still owned by UCX */
    ucx_link_t req_cache;     /* ended requests to reuse (ucx_req_put) */
    uint32_t nreq_cache;
    ucx_link_t orphan_sends;
    ucx_link_t inbox;
    ucx_vlocal_t vlocal; /* local transports, to validate peer bytes */
    unsigned forced;     /* endpoints force-closed (a peer failed) */
    int errors_hint;     /* a peer's error_pending may be set: scan */
    int stalled_hint;    /* a peer's stage_stalled may be set: scan */
    unsigned lost;       /* peers that failed, timed out or died */
    /* Rendezvous receives (ucp_am_recv_data_nbx) UCX still holds: each
     * sits on one of UCX's endpoints until its data is in, and UCX 1.13
     * asserts destroying a worker that holds one (ucp_ep.c:437,
     * "ucs_hlist_is_empty(...proto_reqs)"). Raised where a receive is
     * left in flight, lowered first thing in its callback. */
    unsigned rx_rndv;
    ucx_be_t *leaked_next; /* g_leaked: a worker UCX could not destroy */

    /* GPU memory (ucx_vram.c, ucx_stage.c). */
    ucx_vram_opt_t vram_opt;
    ucx_vram_mode_t vram_mode; /* decided at create, staged made real at
                                  the first VRAM registration */
    char vram_why[160];        /* why this mode (and not a faster one) */
    uint64_t ucx_mem_types;    /* what ucp_context_query reported */
    uint64_t stage_pool;       /* option stage_pool: bytes of pinned pool */
    uint64_t stage_chunk;      /* option stage_chunk: bytes a slot holds */
    uint32_t stage_window;     /* option stage_window: jobs per request */
    ucx_link_t vregs;          /* VRAM regions (ucx_md_t.vlink) */
    struct ucx_vram *vram;     /* driver, devices, pool; NULL until used */
    struct ucx_stage_state *st; /* jobs and service; NULL until used */

    /* Host memory over transports where UCX would emulate RMA on the
     * target's CPU (tcp, shared memory): served by its owner, who checks
     * every request (ucx_dram.c, ucx_dsvc.c). */
    int rma_mode;              /* option rma: UCX_RMA_AUTO, _SERVED, _NATIVE */
    size_t max_am_header;      /* the main worker's */
    ucx_link_t dregs;          /* DRAM regions (ucx_md_t.vlink) */
    struct ucx_dram_state *dram; /* requests and service; NULL until used */
};

/* The option rma=auto|served|native: how host memory moves. */
enum { UCX_RMA_AUTO = 0, UCX_RMA_SERVED = 1, UCX_RMA_NATIVE = 2 };

/* ucx_status.c: the one translator from ucs_status_t, log levels, and
 * the fd headroom UCX needs (PDX_OK, or PDX_ERR_IO: too many open files,
 * logged naming `what`). */
pdx_status_t ucx_status(ucs_status_t s);
pdx_status_t ucx_fd_room(unsigned need, const char *what);
/* fds a context and its main worker take (measured: 9 to 14 with tcp and
 * shared memory), a peer's own worker and endpoint (4 to 9), an endpoint
 * alone; with room to spare for what UCX accepts for peers meanwhile. */
#define UCX_FDS_INSTANCE 32u
#define UCX_FDS_PEER_WORKER 16u
#define UCX_FDS_EP 8u
#define UCX_FDS_CLIENT 4u
pdx_log_level_t ucx_op_log_level(ucs_status_t s, ucs_status_t ep_status);

/* ucx_am.c: notifications as active messages: receive, inbox, send. */
ucs_status_t ucx_am_recv_cb(void *arg, const void *header,
                            size_t header_length, void *data,
                            size_t length,
                            const ucp_am_recv_param_t *param);
int ucx_deliver_inbox(ucx_be_t *be);
ucs_status_ptr_t ucx_am_send(ucx_be_t *be, ucp_ep_h ep,
                             const void *buf, size_t len,
                             ucp_send_nbx_callback_t cb, void *arg);

/* ucx_request.c: transfer requests: their end, flush and notification
 * stages. */
void ucx_req_finish(ucx_req_t *r, pdx_status_t st);
/* A zeroed request with room for `notif_len` notification bytes, or NULL;
 * back with ucx_req_put once neither UCX nor the agent holds it. */
ucx_req_t *ucx_req_get(ucx_be_t *be, size_t notif_len);
void ucx_req_put(ucx_be_t *be, ucx_req_t *r);
pdx_status_t ucx_req_send_notif(ucx_req_t *r);
/* A staged request's data stage ended (ucx_stage.c) with `st`: the
 * notification next, or its end; freed if released. */
void ucx_req_stage_done(ucx_req_t *r, pdx_status_t st);
/* A released request that UCX no longer holds (ucx_req_busy says no) is
 * freed; else nothing. */
void ucx_req_maybe_free(ucx_req_t *r);
void ucx_flush_cb(void *request, ucs_status_t status, void *user_data);
void ucx_get_cb(void *request, ucs_status_t status, void *user_data);

/* UCX still holds `r` (a flush, a notification or gets in flight): it
 * may not be freed before their callbacks. */
int ucx_stage_busy(const ucx_req_t *r);
int ucx_dram_busy(const ucx_req_t *r);
static inline int ucx_req_busy(const ucx_req_t *r)
{
    return r->ucs_req != NULL || r->gets_left > 0 ||
           (r->sreq != NULL && ucx_stage_busy(r)) ||
           (r->dreq != NULL && ucx_dram_busy(r));
}

/* ucx_peer.c: peers: endpoints, their errors and closes, path reports. */
int ucx_deliver_errors(ucx_be_t *be);
int ucx_close_done(ucx_peer_t *peer);
void ucx_peer_worker_destroy(ucx_be_t *be, ucx_peer_t *peer);
void ucx_peer_release(ucx_be_t *be, ucx_peer_t *peer);
void ucx_send_list_free(ucx_link_t *head);
pdx_status_t ucx_worker_open(ucx_be_t *be, const char *name,
                             ucx_wctx_t *wc, ucp_worker_h *w_p);
void ucx_ep_close_step(ucx_be_t *be, ucx_peer_t *peer, int now_force);
void ucx_peer_free(ucx_peer_t *peer);
pdx_status_t ucx_peer_connect(void *bev, const char *peer_name,
                              const void *conn, size_t conn_len,
                              void **peer_p);
void ucx_peer_disconnect(void *bev, void *peerv);
pdx_status_t ucx_peer_usable(const ucx_peer_t *peer);
pdx_status_t ucx_peer_ep(ucx_be_t *be, ucx_peer_t *peer);
void ucx_peer_give_up(ucx_be_t *be, ucx_peer_t *peer, const char *why);
void ucx_peer_failed(void *bev, void *peerv);
/* The transports of `peer`'s endpoint lanes into peer->transport (once
 * the endpoint exists). */
void ucx_peer_transport(ucx_peer_t *peer);
pdx_status_t ucx_path(void *bev, void *peerv, void *rmd,
                      char *transport, size_t tlen, char *why,
                      size_t wlen);
void ucx_describe_tls(FILE *in, int lanes, char *out, size_t outlen);

/* ucx_mem.c: local registrations and remote keys. */
pdx_status_t ucx_mem_register(void *bev, const pdx_region_t *region,
                              void **md_p);
void ucx_mem_deregister(void *bev, void *mdv);
pdx_status_t ucx_mem_pack(void *bev, void *mdv, void **buf_p,
                          size_t *len_p);
pdx_status_t ucx_rmem_load(void *bev, void *peerv,
                           const pdx_region_t *region, const void *key,
                           size_t key_len, void **rmd_p);
void ucx_rmem_unload(void *bev, void *rmdv);
pdx_status_t ucx_rmd_rkey(ucx_be_t *be, ucx_rmd_t *rmd);

/* ucx_xfer.c: transfers: post, check, abort, release, drain; standalone
 * notifications. */
pdx_status_t ucx_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                           const pdx_backend_iov_t *iov, size_t n,
                           const void *notif, size_t notif_len,
                           void **req_p);
pdx_status_t ucx_xfer_check(void *bev, void *reqv);
pdx_status_t ucx_xfer_abort(void *bev, void *reqv);
void ucx_xfer_release(void *bev, void *reqv);
pdx_status_t ucx_notif_send(void *bev, void *peerv, const void *msg,
                            size_t len);

/* ucx_backend.c: the instance: create, destroy, progress, event fd,
 * describe. */
pdx_status_t ucx_query(char *why, size_t why_len);
pdx_status_t ucx_create(const pdx_backend_host_t *host,
                        const pdx_option_t *opts, size_t nopts,
                        void **be_p);
void ucx_destroy(void *bev);
pdx_status_t ucx_conn_info(void *bev, void **buf_p, size_t *len_p);
int ucx_progress(void *bev);
int ucx_event_fd(void *bev);
pdx_status_t ucx_arm(void *bev);
void ucx_describe(void *bev, char *buf, size_t len);

/* ucx_vram.c: GPU memory: the mode, the driver and devices, the pinned
 * pool, VRAM regions and their keys. */
/* The mode for option `opt` given what UCX reports (`mem_types`, a mask
 * of 1 << ucs_memory_type_t) and whether the CUDA driver and a device are
 * there (`driver_why` NULL: yes; else why not). PDX_ERR_CONFIG when the
 * option asks for what is missing. *why gets the reason for the mode
 * (and, staged or off, why not a faster one). Pure: no UCX, no driver. */
pdx_status_t ucx_vram_choose(ucx_vram_opt_t opt, uint64_t mem_types,
                             const char *driver_why, ucx_vram_mode_t *mode_p,
                             char *why, size_t why_len);
pdx_status_t ucx_vram_parse_opt(const char *value, ucx_vram_opt_t *opt_p);
const char *ucx_vram_mode_name(ucx_vram_mode_t m);
/* At create: the mode from the option and UCX (the driver is asked only
 * when a VRAM region is registered, or by describe). */
pdx_status_t ucx_vram_init(ucx_be_t *be);
void ucx_vram_fini(ucx_be_t *be);
/* Register / deregister a VRAM region (after the mode allows it). */
pdx_status_t ucx_vram_register(ucx_be_t *be, const pdx_region_t *region,
                               ucx_md_t *md);
void ucx_vram_deregister(ucx_be_t *be, ucx_md_t *md);
pdx_status_t ucx_vram_pack(ucx_be_t *be, ucx_md_t *md, void **buf_p,
                           size_t *len_p);
/* A peer's VRAM key into `rmd` (staged: token, device, slot; native: the
 * packed rkey kept for ucx_rmd_rkey). Every byte checked. */
pdx_status_t ucx_vram_load_key(ucx_be_t *be, ucx_peer_t *peer,
                               const pdx_region_t *region, const void *key,
                               size_t key_len, ucx_rmd_t *rmd);
/* A registered VRAM region holding [addr, +len) with `token`, or NULL. */
ucx_md_t *ucx_vram_find(ucx_be_t *be, uint64_t token, uint64_t addr,
                        uint64_t len);
/* One line on GPU memory for describe (may load the driver to say). */
void ucx_vram_describe(ucx_be_t *be, char *buf, size_t len);
/* The staged path's pieces (for ucx_stage.c). ready: the driver, the
 * devices and the pinned pool, made at the first use (PDX_OK, or why not
 * logged). A slot of the pool, from the service's half (`svc`) or the
 * initiator's; UINT32_MAX when none is free. copy: device copies on
 * device `dev`'s staging stream, device to host (`to_host`) or host to
 * device, then an event recorded after them (*ev_p); copy_done: 1 when
 * they ended (the event is back in the pool), 0 not yet, <0 failed (the
 * event is back too); copy_wait: wait for them (bounded by the copies
 * themselves), the event back in the pool. */
typedef struct ucx_vseg {
    uint64_t dptr;
    void *host;
    uint64_t len;
} ucx_vseg_t;
pdx_status_t ucx_vram_ready(ucx_be_t *be);
uint32_t ucx_vram_slot_get(ucx_be_t *be, int svc);
void ucx_vram_slot_put(ucx_be_t *be, uint32_t slot);
void *ucx_vram_slot_ptr(ucx_be_t *be, uint32_t slot);
ucp_mem_h ucx_vram_pool_memh(ucx_be_t *be);
uint32_t ucx_vram_slot_size(const ucx_be_t *be);
/* Slots in use: the pool is whole again when this is 0. */
uint32_t ucx_vram_slots_used(const ucx_be_t *be);
pdx_status_t ucx_vram_copy(ucx_be_t *be, int dev, int to_host,
                           const ucx_vseg_t *segs, size_t n, void **ev_p);
int ucx_vram_copy_done(ucx_be_t *be, int dev, void *ev);
void ucx_vram_copy_wait(ucx_be_t *be, int dev, void *ev);

/* ucx_stage.c (below ucx_request.c): transfers with staged pieces;
 * ucx_svc.c: the service this instance gives peers' staged requests. */
/* Does this request need staging (a staged local or remote piece)? */
int ucx_stage_needed(const ucx_be_t *be, const pdx_backend_iov_t *iov,
                     size_t n);
/* Build and start `r`'s jobs (its pieces were checked); `done` is called
 * once with the data stage's end (every job over, the flush of any puts
 * ended). PDX_INPROGRESS, or an error with nothing in flight. */
typedef void (*ucx_stage_done_cb_t)(ucx_req_t *r, pdx_status_t st);
pdx_status_t ucx_stage_post(ucx_be_t *be, ucx_req_t *r,
                            const pdx_backend_iov_t *iov, size_t n,
                            ucx_stage_done_cb_t done);
/* Stop starting jobs of `r` (aborted or released). */
void ucx_stage_abort(ucx_req_t *r);
/* Free `r`'s jobs (none in flight). */
void ucx_stage_free(ucx_req_t *r);
/* Device copies polled, queued jobs started; the events handled. */
int ucx_stage_progress(ucx_be_t *be);
/* Jobs wait on device copies (no fd tells their end: keep polling). */
int ucx_stage_copying(const ucx_be_t *be);
/* The peer failed: its jobs waiting for it end with an error. */
void ucx_stage_peer_failed(ucx_be_t *be, ucx_peer_t *peer);
/* A VRAM region goes: service jobs on it stop (copies in flight are
 * waited for, bounded by the copy). */
void ucx_stage_region_gone(ucx_be_t *be, ucx_md_t *md);
/* The staged protocol's AM handler on the worker of `wc` (every worker of
 * the instance). */
pdx_status_t ucx_stage_set_handler(ucx_be_t *be, ucx_wctx_t *wc);
/* `peer` is freed: no job may point at it. */
void ucx_stage_peer_gone(ucx_be_t *be, ucx_peer_t *peer);
/* Worker `w` was destroyed: what UCX held on it calls back no more. */
void ucx_stage_worker_gone(ucx_be_t *be, ucp_worker_h w);
void ucx_stage_fini(ucx_be_t *be);

/* ucx_dram.c (below ucx_request.c): host memory the peer serves, this
 * instance's requests; ucx_dsvc.c: the service it gives peers' requests.
 * The protocol: ucx_dram_int.h; why: docs/SECURITY.md, "UCX's own
 * exposure". */
/* Start `r`'s chunks (its pieces were checked); `done` is called once
 * with the data stage's end, `unbusy` each time UCX lets go of the last
 * send or receive it held for `r` (ucx_req_busy turned false: a released
 * `r` is freed then). PDX_INPROGRESS, or an error with nothing in
 * flight. */
pdx_status_t ucx_dram_post(ucx_be_t *be, ucx_req_t *r,
                           const pdx_backend_iov_t *iov, size_t n,
                           ucx_stage_done_cb_t done,
                           void (*unbusy)(ucx_req_t *r));
/* Stop `r` (aborted or released): a READ ends at once (no byte of it
 * lands after this), a WRITE once its chunks were answered. */
void ucx_dram_abort(ucx_req_t *r);
/* Free `r`'s chunks (no UCX request holds them any more). */
void ucx_dram_free(ucx_req_t *r);
/* The AM handler of served requests and answers on the worker of `wc`
 * (every worker of the instance). */
pdx_status_t ucx_dram_set_handler(ucx_be_t *be, ucx_wctx_t *wc);
/* Worker `w` was destroyed: what UCX held on it calls back no more. */
void ucx_dram_worker_gone(ucx_be_t *be, ucp_worker_h w);
void ucx_dram_fini(ucx_be_t *be);
/* ucx_dsvc.c: progress: queued answers sent, failed or idle requesters'
 * endpoints closed; the events handled. pending: an answer can be sent
 * now. fini: the instance goes (its workers are gone). */
int ucx_dsvc_progress(ucx_be_t *be);
int ucx_dsvc_pending(const ucx_be_t *be);
/* One line on the service for describe. */
void ucx_dsvc_describe(const ucx_be_t *be, char *buf, size_t len);
void ucx_dsvc_fini(ucx_be_t *be);
/* A DRAM region of ours is being deregistered (it is off be->dregs):
 * served answers UCX still sends from it are copied out first, and
 * WRITE data still arriving for it is dropped (its answer says so). */
void ucx_dsvc_region_gone(ucx_be_t *be, const ucx_md_t *md);
/* Destroy: every requester's endpoint is forced closed. A rendezvous
 * answer in flight on it waits for its requester's word, and a WRITE's
 * rendezvous data may still be coming over it (UCX makes our endpoint to
 * a requester the far end of the requester's to us when it can): either
 * may never come (a stopped requester), and UCX 1.13 asserts destroying a
 * worker that holds one; a forced close ends them. Nonzero while closes
 * or answers are still under way (progress ends them). */
int ucx_dsvc_quiesce(ucx_be_t *be);
/* Destroy, the same for the staged service (ucx_svc.c): every requester's
 * endpoint forced closed (a staged READ's rendezvous answer waits for its
 * requester's word, a WRITE's data may be coming over it; a stopped
 * requester gives neither), no new one made. Nonzero while closes, sends
 * or receives are under way. */
int ucx_svc_quiesce(ucx_be_t *be);

#endif
