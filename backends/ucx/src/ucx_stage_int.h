/* ucx: the staged VRAM protocol's private header: its wire (the staged
 * AM's header and segment table), the jobs of this instance's requests
 * (ucx_stage.c) and the service it gives peers' (ucx_svc.c). The protocol:
 * backends/ucx/README.md, "GPU memory". */
#ifndef PDX_UCX_STAGE_INT_H
#define PDX_UCX_STAGE_INT_H

#include "ucx_client_int.h"
#include "ucx_idtab_int.h"
#include "ucx_int.h"

#define SHDR_MAGIC 0x53584450u /* "PDXS" */
#define SHDR_VERSION 1u
#define SHDR_LEN 32u
#define SEG_LEN 24u
/* Segments in one job (one SW/SR table): 6 KiB of table at most. */
#define STAGE_MAX_SEGS 256u
/* Service requests queued for a slot before new ones are refused busy. */
#define SVC_QUEUE_MAX 4096u
/* SW and SR headers carry the requester's worker address after its name:
 * the service answers on an endpoint of its own to it, one per requester
 * (its error handler drops what would go to it). */
#define STAGE_MAX_ADDR 4096u
#define SVC_MAX_CLIENTS 4096u

enum { OP_SW = 1, OP_SR = 2, OP_SA = 3, OP_SD = 4 };
enum { KIND_DIRECT, KIND_LOCAL, KIND_REMOTE };
/* A job's phase; UCX requests and device copies in flight are counted
 * apart (ucx_pending, ev), so a callback that comes late finds it. */
enum {
    PH_IDLE,   /* not started */
    PH_D2H,    /* our VRAM into the slot */
    PH_UCX,    /* puts, gets, or the AM send in flight */
    PH_PEER,   /* waiting for the peer's SA or SD */
    PH_RECV,   /* SD's data arriving */
    PH_H2D,    /* the slot into our VRAM */
    PH_END,
};

typedef struct ucx_seg {
    uint64_t laddr, raddr, len;
    ucx_md_t *md;
    ucx_rmd_t *rmd;
} ucx_seg_t;

typedef struct ucx_job {
    ucx_link_t link;         /* st->jobs while started and not freed */
    struct ucx_sreq *sreq;
    uint64_t rid;            /* remote jobs: the id the peer echoes */
    uint8_t kind, phase;
    uint8_t lstaged;         /* our side is staged VRAM (device `dev`) */
    uint8_t ended;           /* counted in its request */
    int dev;
    uint32_t slot;
    uint32_t ucx_pending;    /* UCX requests pointing at it */
    void *ev;                /* device copy in flight, or NULL */
    pdx_status_t status;
    uint64_t peer_ns;        /* when it began to wait for the peer */
    uint64_t bytes;
    uint32_t nseg;
    /* Remote jobs: the SW/SR payload's opening, our worker's address and
     * the segment table, `table_len` bytes. */
    unsigned char *table;
    size_t table_len;
    ucp_dt_iov_t *iov;       /* remote jobs from host memory: the data */
    size_t hdr_len;
    unsigned char *hdr;      /* the SW/SR header (name and our address) */
    ucx_seg_t seg[];
} ucx_job_t;

typedef struct ucx_sreq {
    ucx_req_t *req;
    ucx_peer_t *peer;        /* NULL once the peer failed or went */
    ucp_worker_h worker;
    const ucx_wctx_t *wctx;  /* its worker's (the address answers go to) */
    ucx_link_t link;         /* st->sreqs */
    ucx_job_t **jobs;
    uint32_t njobs, next, active, ended;
    pdx_status_t status;     /* the first failure */
    int puts;                /* puts were posted: a flush ends the data */
    int flushing, finished;
    int pumping;             /* inside sreq_pump (no recursion into it) */
    /* The data stage's end, told to the request layer above (a pointer
     * it gave: ucx_stage.c calls nothing of ucx_request.c). */
    ucx_stage_done_cb_t done;
} ucx_sreq_t;

/* A service request's phase (after PH_*: the answer is to be sent). */
enum { SVC_LANDED = PH_END + 1, SVC_ANSWER };

typedef struct ucx_svc {
    ucx_link_t link;         /* st->svc_wait, then st->svc_active */
    ucx_be_t *be;
    uint8_t op, phase;
    ucx_client_t *client;    /* where the answer went (held) */
    ucp_worker_h worker;     /* the worker it arrived on */
    const void *via;         /* the connection it came over (identity) */
    uint64_t rid;
    char peer[UCX_MAX_NAME + 1];
    void *desc;              /* SW: the rendezvous data, until received */
    uint64_t payload;        /* SW: table and data bytes; SR: data bytes */
    uint64_t bytes;          /* data bytes */
    uint32_t slot;
    void *ev;
    int dev;
    uint32_t ucx_pending;
    pdx_status_t status;
    uint32_t nseg;
    int held;                /* the segments' regions are held (svc_busy) */
    size_t hdr_len;
    unsigned char hdr[SHDR_LEN + UCX_MAX_NAME];
    unsigned char *addr;     /* the requester's worker address (a copy) */
    size_t addr_len;
    struct {
        uint64_t addr, len;
        ucx_md_t *md;
    } seg[];
} ucx_svc_t;

struct ucx_stage_state {
    ucx_link_t sreqs;        /* requests with jobs to start or running */
    ucx_link_t jobs;         /* started jobs */
    ucx_link_t svc_wait;     /* service requests waiting for a slot */
    ucx_link_t svc_active;
    uint32_t nsvc;
    ucx_clients_t clients;   /* requesters' endpoints */
    uint32_t copies;         /* device copies in flight */
    /* Work a progress call can do now (a slot back while something waits
     * for one, a service request to move on or free): arm says busy. */
    int kick;
    ucx_idtab_t ids;         /* remote jobs, by rid */
};

static inline void ucx_put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline uint64_t ucx_get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline struct ucx_stage_state *ucx_stage_state(ucx_be_t *be)
{
    if (be->st == NULL) {
        be->st = calloc(1, sizeof(*be->st));
        if (be->st != NULL) {
            ucx_list_init(&be->st->sreqs);
            ucx_list_init(&be->st->jobs);
            ucx_list_init(&be->st->svc_wait);
            ucx_list_init(&be->st->svc_active);
            ucx_clients_init(&be->st->clients, be, SVC_MAX_CLIENTS,
                             "staged", 0, &be->st->kick);
        }
    }
    return be->st;
}

/* The header of a staged AM: op, the segments of its table, a status, the
 * job id, the data bytes; then the sender's agent name. */
static inline size_t ucx_shdr_make(ucx_be_t *be, unsigned char *h, int op,
                                   uint32_t nseg, pdx_status_t st,
                                   uint64_t rid, uint64_t bytes,
                                   const void *addr, size_t addr_len)
{
    ucx_put_le(h, SHDR_MAGIC, 4);
    h[4] = (unsigned char)op;
    h[5] = SHDR_VERSION;
    ucx_put_le(h + 6, nseg, 2);
    ucx_put_le(h + 8, (uint64_t)(uint32_t)st, 4);
    ucx_put_le(h + 12, be->name_len, 2);
    ucx_put_le(h + 14, addr_len, 2);
    ucx_put_le(h + 16, rid, 8);
    ucx_put_le(h + 24, bytes, 8);
    memcpy(h + SHDR_LEN, be->host.agent_name, be->name_len);
    if (addr_len > 0) {
        memcpy(h + SHDR_LEN + be->name_len, addr, addr_len);
    }
    return SHDR_LEN + be->name_len + addr_len;
}

/* A parsed header; `addr` points into the header (valid in the AM
 * callback only). */
typedef struct shdr {
    int op;
    uint32_t nseg;
    pdx_status_t status;
    uint64_t rid, bytes;
    char name[UCX_MAX_NAME + 1];
    const unsigned char *addr;
    size_t addr_len;
} shdr_t;

static inline int ucx_shdr_parse(const void *header, size_t len, shdr_t *h)
{
    const unsigned char *p = header;
    if (header == NULL || len <= SHDR_LEN ||
        len > SHDR_LEN + UCX_MAX_NAME + STAGE_MAX_ADDR ||
        ucx_get_le(p, 4) != SHDR_MAGIC || p[5] != SHDR_VERSION ||
        p[4] < OP_SW || p[4] > OP_SD) {
        return -1;
    }
    size_t nlen = (size_t)ucx_get_le(p + 12, 2);
    size_t alen = (size_t)ucx_get_le(p + 14, 2);
    if (nlen == 0 || nlen > UCX_MAX_NAME || alen > STAGE_MAX_ADDR ||
        SHDR_LEN + nlen + alen != len) {
        return -1;
    }
    h->op = p[4];
    h->nseg = (uint32_t)ucx_get_le(p + 6, 2);
    h->status = (pdx_status_t)(int32_t)(uint32_t)ucx_get_le(p + 8, 4);
    h->rid = ucx_get_le(p + 16, 8);
    h->bytes = ucx_get_le(p + 24, 8);
    memcpy(h->name, p + SHDR_LEN, nlen);
    h->name[nlen] = '\0';
    if (strlen(h->name) != nlen) {
        return -1; /* a NUL inside the name */
    }
    h->addr = alen > 0 ? p + SHDR_LEN + nlen : NULL;
    h->addr_len = alen;
    return 0;
}

/* A status a peer sent: one of ours, else a plain backend error. */
static inline pdx_status_t ucx_peer_status(pdx_status_t st)
{
    return st <= 0 && st > -100 ? st : PDX_ERR_BACKEND;
}

/* ucx_svc.c: the service. request: a peer's SW or SR arrived on worker
 * `w` (the header parsed; `data`, `length` and `rndv` as UCX gave them);
 * returns what the AM callback returns. progress: device copies polled,
 * answers sent, waiting requests given slots; the events handled.
 * worker_gone: nothing UCX held on `w` calls back any more. fini: the
 * instance goes (its workers are gone). */
ucs_status_t ucx_svc_request(ucx_be_t *be, ucp_worker_h w, const shdr_t *h,
                             void *data, size_t length,
                             const ucp_am_recv_param_t *param, int rndv);
int ucx_svc_progress(ucx_be_t *be);
void ucx_svc_worker_gone(ucx_be_t *be, ucp_worker_h w);
void ucx_svc_fini(ucx_be_t *be);

#endif
