/* ucx: served host memory's private header: the wire (one header for
 * requests and answers), this instance's requests (ucx_dram.c) and the
 * service it gives peers' (ucx_dsvc.c).
 *
 * Why: over tcp and shared memory UCX 1.13 emulates a get or put on the
 * target's CPU, at whatever address the initiator names (no key is
 * checked), and aborts the target when the reply to a get cannot be sent
 * (its initiator died). Served, the target checks each request against
 * the regions it has now (a token, the range, read-only) before it
 * touches a byte, copies under that check, and answers on an endpoint of
 * its own with an error handler. */
#ifndef PDX_UCX_DRAM_INT_H
#define PDX_UCX_DRAM_INT_H

#include "ucx_client_int.h"
#include "ucx_idtab_int.h"
#include "ucx_int.h"

#define DHDR_MAGIC 0x44584450u /* "PDXD" */
#define DHDR_VERSION 1u
#define DHDR_LEN 64u
/* The requester's worker address travels in every request: answers go to
 * an endpoint of the service's own to it. */
#define DRAM_MAX_ADDR 4096u
/* A request's chunks: at most DRAM_CHUNK bytes each (the instance's
 * max_chunk if smaller), DRAM_WINDOW of them in flight per request. */
#define DRAM_CHUNK (1ull << 20)
#define DRAM_WINDOW 8u
/* A chunk's data (a WRITE's, a READ's answer) of at most DRAM_EAGER_MAX
 * bytes goes eagerly (with its header: UCX copies it into a buffer of
 * its own on the receiver, then pdx copies it where it goes); a larger
 * one by rendezvous (the header first, the data on the receiver's word,
 * unpacked by pdx straight where it goes: one copy a side). A requester
 * says it takes rendezvous answers (DREQ_RNDV_ANSWERS in a request's
 * status field, unused in requests before): an older one is answered
 * eagerly. Not between processes of one host over UCX shared memory:
 * there a rendezvous makes the receiver write to the sender's receive
 * FIFO (its word to go) while data flows, and a requester killed in the
 * middle of that write leaves the target's FIFO blocked (the oneway test
 * saw it in 1 of 2 runs of 250 kills: the target's main worker stuck for
 * seconds, a new requester's READ timing out); eager, the requester
 * writes to it only when it posts. */
#define DRAM_EAGER_MAX (64ull << 10)
#define DREQ_RNDV_ANSWERS 1
/* Between processes of one host over UCX shared memory, a READ's answer
 * larger than DRAM_FRAG_DATA goes as pieces (DOP_FRAG) of at most that
 * many bytes, each one message that fits a shared-memory segment of UCX
 * (UCX_MM_SEG_SIZE, 8256 bytes by default, less UCX's and pdx's
 * headers): the owner copies each straight from its region into UCX's
 * FIFO and the requester each out of it to where it goes, two copies in
 * all and pipelined over both processes. As one eager message it took
 * four (the owner's copy out under the check, UCX's into the FIFO,
 * UCX's reassembly on the requester, pdx's copy where it goes): a 1 MiB
 * READ of numpy memory took 2.2x NIXL's time, whose UCX emulates the
 * get in two (BENCH-LOG, session 24). A requester says it takes them
 * (DREQ_FRAG_ANSWERS in a request's status field); an older one is
 * answered in one message. */
#define DRAM_FRAG_DATA 8128u
#define DREQ_FRAG_ANSWERS 2
/* The same for a WRITE's data, from the requester: the request goes
 * without data (DREQ_WRITE_PIECES in its status field), then the data in
 * pieces (DOP_WPIECE), each naming the request (its id, job, seq and
 * sender's pid) and the region's token, which the owner copies into the
 * region as it comes (checked against the request, and the region again
 * when one was deregistered meanwhile); the ACK goes once every byte is
 * in. A requester sends them only to an owner that said in an answer it
 * takes them (DSVC_FEAT_WRITE_PIECES in its answers' token field); a
 * request whose pieces stop coming for DSVC_PIECES_IDLE_NS is answered
 * PDX_ERR_TIMEOUT (its requester died or was stopped). */
#define DREQ_WRITE_PIECES 4
/* ... for chunks of at least this: 64 KiB WRITEs, 64 in a request, took a
 * quarter longer in pieces (UCX's own fragments of one message cost less
 * per byte there), 1 MiB ones a fifth less (BENCH-LOG, session 24). */
#define DRAM_WPIECES_MIN (256ull << 10)
#define DSVC_FEAT_WRITE_PIECES 1
#define DSVC_PIECES_IDLE_NS 10000000000ull
/* What the service takes: one chunk of at most this, a queue of answers
 * of at most DSVC_MAX_ANSWERS (more are dropped: their requests time
 * out), READ data copied out of regions for answers in flight up to
 * DSVC_MAX_BYTES, DSVC_CLIENT_BYTES of it to one requester (its answers
 * wait beyond: one that stopped reading holds no more), requesters'
 * endpoints up to DSVC_MAX_CLIENTS (the least recently used idle one
 * goes); a same-host requester's process is looked at every
 * DSVC_PID_CHECK_NS (in progress passes; DSVC_PID_CHECK_STUCK_NS while
 * the main worker cannot sleep). An idle
 * requester's endpoint is kept, not closed after a while: UCX pairs it
 * with the requester's own endpoint to us (both made between the same two
 * workers), so closing it reset the requester's connection to us (its
 * keepalive found our side gone): a peer that reads us through cma and
 * only now and then through ucx lost us every 10 s. */
#define DSVC_MAX_CHUNK (16ull << 20)
#define DSVC_MAX_ANSWERS 65536u
#define DSVC_MAX_BYTES (128ull << 20)
#define DSVC_CLIENT_BYTES (8ull << 20)
#define DSVC_PID_CHECK_NS 100000000ull
#define DSVC_PID_CHECK_STUCK_NS 1000000ull
#define DSVC_MAX_CLIENTS 1024u
/* Bounce buffers of DRAM_CHUNK kept for the next answers. */
#define DSVC_SPARE_MAX 16u

enum {
    DOP_READ = 1,
    DOP_WRITE = 2,
    DOP_DATA = 3,
    DOP_ACK = 4,
    DOP_FRAG = 5,
    DOP_WPIECE = 6
};

/* Little endian, DHDR_LEN bytes, then (requests) the sender's name and
 * worker address:
 *   0 u32 magic  4 u8 version  5 u8 op  6 u16 name_len  8 u16 addr_len
 *  10 u16 job   12 i32 status  16 u64 request id  24 u32 seq  28 u32 pid
 *  32 u64 token 40 u64 remote address  48 u64 length
 *  56 u64 the sender's pid namespace (the inode of /proc/self/ns/pid)
 * A READ carries no data, its answer (DATA) `length` bytes, or (FRAG)
 * pieces, each `length` bytes at offset `remote address` of the chunk; a
 * WRITE `length` bytes (or none, then WPIECEs: `length` bytes at offset
 * `remote address`, with the request's id, job, seq, pid and token), its
 * answer (ACK) none. Answers say in their token field what the service
 * takes (DSVC_FEAT_*). An answer repeats the request's
 * id, job and seq, and says its status. A request names its sender's pid
 * and pid namespace: a requester on this host (its address says so) in
 * our pid namespace that exited is given up at once, not after UCX's
 * keepalive. */
typedef struct dhdr {
    int op;
    uint32_t job, seq, pid;
    pdx_status_t status;
    uint64_t id, token, raddr, len, pidns;
    char name[UCX_MAX_NAME + 1];
    const unsigned char *addr; /* into the header: the callback's only */
    size_t addr_len;
} dhdr_t;

static inline void ucx_dput(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline uint64_t ucx_dget(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Write a header into `h` (DHDR_LEN + name_len + addr_len bytes). */
static inline size_t ucx_dhdr_make(unsigned char *h, const dhdr_t *d,
                                   const char *name, size_t name_len)
{
    memset(h, 0, DHDR_LEN);
    ucx_dput(h, DHDR_MAGIC, 4);
    h[4] = DHDR_VERSION;
    h[5] = (unsigned char)d->op;
    ucx_dput(h + 6, name_len, 2);
    ucx_dput(h + 8, d->addr_len, 2);
    ucx_dput(h + 10, d->job, 2);
    ucx_dput(h + 12, (uint64_t)(uint32_t)d->status, 4);
    ucx_dput(h + 16, d->id, 8);
    ucx_dput(h + 24, d->seq, 4);
    ucx_dput(h + 28, d->pid, 4);
    ucx_dput(h + 32, d->token, 8);
    ucx_dput(h + 40, d->raddr, 8);
    ucx_dput(h + 48, d->len, 8);
    ucx_dput(h + 56, d->pidns, 8);
    if (name_len > 0) {
        memcpy(h + DHDR_LEN, name, name_len);
    }
    if (d->addr_len > 0) {
        memcpy(h + DHDR_LEN + name_len, d->addr, d->addr_len);
    }
    return DHDR_LEN + name_len + d->addr_len;
}

/* Parse a header a peer sent: 0, or -1 for anything malformed (a request
 * without a name or an address, an answer with either, a NUL inside the
 * name, lengths that do not add up). */
static inline int ucx_dhdr_parse(const void *header, size_t len, dhdr_t *d)
{
    const unsigned char *p = header;
    if (header == NULL || len < DHDR_LEN ||
        len > DHDR_LEN + UCX_MAX_NAME + DRAM_MAX_ADDR ||
        ucx_dget(p, 4) != DHDR_MAGIC || p[4] != DHDR_VERSION ||
        p[5] < DOP_READ || p[5] > DOP_WPIECE) {
        return -1;
    }
    size_t nlen = (size_t)ucx_dget(p + 6, 2);
    size_t alen = (size_t)ucx_dget(p + 8, 2);
    int request = p[5] == DOP_READ || p[5] == DOP_WRITE;
    if (DHDR_LEN + nlen + alen != len || nlen > UCX_MAX_NAME ||
        alen > DRAM_MAX_ADDR ||
        (request ? (nlen == 0 || alen == 0) : (nlen != 0 || alen != 0))) {
        return -1;
    }
    d->op = p[5];
    d->job = (uint32_t)ucx_dget(p + 10, 2);
    d->status = (pdx_status_t)(int32_t)(uint32_t)ucx_dget(p + 12, 4);
    d->id = ucx_dget(p + 16, 8);
    d->seq = (uint32_t)ucx_dget(p + 24, 4);
    d->pid = (uint32_t)ucx_dget(p + 28, 4);
    d->token = ucx_dget(p + 32, 8);
    d->raddr = ucx_dget(p + 40, 8);
    d->len = ucx_dget(p + 48, 8);
    d->pidns = ucx_dget(p + 56, 8);
    memcpy(d->name, p + DHDR_LEN, nlen);
    d->name[nlen] = '\0';
    if (strlen(d->name) != nlen) {
        return -1;
    }
    d->addr = alen > 0 ? p + DHDR_LEN + nlen : NULL;
    d->addr_len = alen;
    return 0;
}

/* Data UCX packs through ucx_dsvc_dt (a generic datatype: always
 * copied into UCX's buffers, never sent from ours by zero copy, which
 * UCX 1.13's tcp completes twice, and aborts on, when the peer goes in
 * the middle of it). What the send's buffer points to, kept until the
 * send's end. */
typedef struct ucx_dsrc ucx_dsrc_t;
struct ucx_dsrc {
    const unsigned char *p; /* a send's bytes (NULL: zeros) */
    size_t len;
    /* A send: when set and it says no, zeros go instead of p's bytes (a
     * WRITE's request was aborted or released: its buffer is no longer
     * pdx's to read). */
    int (*live)(const ucx_dsrc_t *s);
    /* A receive: each fragment, at `off` of `len` (UCX unpacks into
     * this; nothing is received into memory directly). */
    void (*put)(ucx_dsrc_t *s, size_t off, const void *src, size_t n);
    void *arg;              /* the request (requester) or answer (service) */
    uint32_t k, seq;        /* requester: the job and its seq */
};

/* One chunk of a request in flight (a slot of its window). */
typedef struct ucx_djob {
    uint32_t seq;        /* 0: free */
    uint64_t laddr, len;
    uint64_t got;        /* a READ's bytes in from answer pieces */
    ucx_dsrc_t *wsrc;    /* a WRITE in pieces: each piece's bytes */
    unsigned char *whdr; /* ... and header (DHDR_LEN each) */
    uint32_t wpending;   /* ... pieces UCX still holds (the slot waits) */
    ucx_dsrc_t src;      /* a WRITE's data; a READ's rendezvous answer */
    unsigned char *hdr;  /* its header (the request's hdr_len bytes) */
} ucx_djob_t;

typedef struct ucx_dreq {
    ucx_link_t link;        /* dram->live */
    ucx_be_t *be;
    ucx_req_t *req;         /* NULL once detached (an answer is dropped);
                               its peer is the request's */
    ucp_worker_h worker;    /* the worker its sends are on */
    uint64_t id;            /* its key in dram->ids (0: not in it) */
    pdx_xfer_op_t op;
    ucx_stage_done_cb_t done;
    void (*unbusy)(ucx_req_t *r); /* UCX let go of its last send or
                                     receive (a released request is
                                     freed then) */
    int ended;              /* `done` was called */
    int posting;            /* inside post: `done` is not called */
    int aborted;
    int shm;                /* its peer is on this host, over UCX shared
                               memory: its data goes eagerly */
    int wpieces;            /* a WRITE whose chunks go in pieces */
    uint32_t wper;          /* ... at most this many a chunk */
    ucx_dsrc_t *wsrcs;      /* ... DRAM_WINDOW x wper of them */
    unsigned char *whdrs;
    pdx_status_t status;    /* the first failure */
    uint64_t chunk;
    size_t npieces, piece;  /* the cursor: piece and offset in it */
    uint64_t off;
    uint64_t left;          /* bytes not yet answered */
    uint32_t seq;
    uint32_t inflight;      /* jobs sent, not answered */
    uint32_t ucx_pending;   /* sends and receives UCX still holds */
    size_t hdr_len;
    ucx_djob_t job[DRAM_WINDOW];
    struct {
        uint64_t laddr, raddr, len, token;
    } *pieces;
    unsigned char *hdrs;    /* DRAM_WINDOW headers */
} ucx_dreq_t;

/* An answer to be sent from progress. */
typedef struct ucx_dans {
    ucx_link_t link;        /* dram->answers, then dram->sending */
    ucx_be_t *be;
    ucx_client_t *client;   /* held while its send is in flight */
    dhdr_t h;               /* the request (addr: see below) */
    unsigned char *bounce;  /* READ: the data copied out of the region
                               (eager answers, or a rendezvous answer's
                               region deregistered while it is sent) */
    uint64_t bytes;         /* READ data bytes counted in dram->bytes */
    uint64_t sent_bytes;    /* ... and in its client's, while UCX holds it */
    ucx_dsrc_t src;         /* READ: the bounce or the region, for
                               ucx_dsvc_dt; WRITE: where a rendezvous
                               request's data is unpacked */
    int spare;              /* the bounce is a spare (DRAM_CHUNK bytes) */
    int rndv_ok;            /* READ: its requester takes a rendezvous
                               answer */
    int rndv;               /* READ: answered by rendezvous, from the
                               region */
    int wpieces;            /* WRITE: its data comes in pieces */
    uint64_t got;           /* ... bytes of it in */
    uint64_t last_ns;       /* ... when the last came */
    int frag_ok;            /* READ: its requester takes answer pieces */
    int frag;               /* READ: answered in pieces, from the region */
    int frags_posted;       /* ... every piece handed to UCX */
    uint32_t frag_pending;  /* ... pieces UCX still holds */
    ucx_dsrc_t *fsrc;       /* ... each piece's bytes */
    unsigned char *fhdr;    /* ... and header (DHDR_LEN each) */
    uint64_t gen;           /* dram->gen when its region was last checked */
    unsigned char hdr[DHDR_LEN];
    unsigned char addr[];   /* the requester's address (h.addr_len) */
} ucx_dans_t;

struct ucx_dram_state {
    ucx_idtab_t ids;        /* this instance's requests, by id */
    ucx_link_t live;        /* every dreq not freed */
    /* The service. */
    ucx_link_t answers;     /* queued, oldest first */
    uint32_t nanswers;
    ucx_link_t sending;     /* sent, UCX holds them */
    ucx_link_t receiving;   /* WRITEs whose rendezvous data is arriving */
    uint32_t nreceiving;
    uint64_t gen;           /* bumped at each DRAM region's deregistration */
    uint64_t bytes;         /* READ data of answers in flight */
    ucx_clients_t clients;  /* requesters' endpoints */
    int blocked;            /* every queued answer waits for bytes */
    uint64_t pidns;         /* ours (0: unknown) */
    ucp_datatype_t dt;      /* ucx_dsvc_dt's */
    int has_dt;
    void *spare[DSVC_SPARE_MAX];
    uint32_t nspare;
    uint64_t served, refused, dropped; /* counts, for describe */
    uint64_t frag_chunks, wpiece_chunks; /* this instance's chunks moved in
                                            pieces (READ answers, WRITEs) */
    uint64_t idle_check_ns;
    uint64_t refused_log_ns; /* refusals are logged once a second */
    unsigned refused_quiet;
};

/* ucx_dsvc.c: this process's pid namespace (the inode of
 * /proc/self/ns/pid), or 0. */
uint64_t ucx_dsvc_pidns(void);

static inline struct ucx_dram_state *ucx_dram_state(ucx_be_t *be)
{
    if (be->dram == NULL) {
        be->dram = calloc(1, sizeof(*be->dram));
        if (be->dram != NULL) {
            ucx_list_init(&be->dram->live);
            ucx_list_init(&be->dram->answers);
            ucx_list_init(&be->dram->sending);
            ucx_list_init(&be->dram->receiving);
            ucx_clients_init(&be->dram->clients, be, DSVC_MAX_CLIENTS,
                             "served", 1, NULL);
            be->dram->pidns = ucx_dsvc_pidns();
        }
    }
    return be->dram;
}

/* A status a peer sent: one of ours, else a plain backend error. */
static inline pdx_status_t ucx_dram_peer_status(pdx_status_t st)
{
    return st <= 0 && st > -100 ? st : PDX_ERR_BACKEND;
}

/* ucx_dsvc.c: the generic datatype of served data (a ucx_dsrc_t as the
 * buffer, its length as the count), made once per instance: PDX_OK with
 * it. */
pdx_status_t ucx_dsvc_dt(ucx_be_t *be, ucp_datatype_t *dt_p);

/* ucx_dram.c: an answer to one of this instance's requests, on worker
 * `w` (a rendezvous one's data is received there). */
ucs_status_t ucx_dram_answer(ucx_be_t *be, ucp_worker_h w, const dhdr_t *h,
                             void *data, size_t length, int rndv);
/* ucx_dsvc.c: a peer's request arrived on worker `w` (the header parsed;
 * `data`, `length` and `rndv` as UCX gave them): checked, a WRITE's data
 * copied in (eager) or its receive started (rendezvous), its answer
 * queued for progress once the data is in. What the AM callback
 * returns. */
ucs_status_t ucx_dsvc_request(ucx_be_t *be, ucp_worker_h w, const dhdr_t *h,
                              void *data, size_t length, int rndv);
/* ucx_dsvc.c: a piece of a WRITE's data (DOP_WPIECE; `data`, `length`
 * and `rndv` as UCX gave them). What the AM callback returns. */
ucs_status_t ucx_dsvc_piece(ucx_be_t *be, const dhdr_t *h, const void *data,
                            size_t length, int rndv);

#endif
