/* The example backend: the smallest complete pdx backend, for reading. It
 * moves bytes with memcpy between instances in one process (a "loopback":
 * two agents of a test, or an agent and itself), so every op of
 * pdx/backend.h is here without a transport in the way:
 *
 *   query        can it run here? (always)
 *   create       an instance; unknown options are PDX_ERR_CONFIG
 *   conn_info    what a peer needs to reach us: our pid and instance id
 *   peer_connect decline (PDX_ERR_UNSUPPORTED) any other process
 *   mem_register a local region; VRAM is declined (PDX_ERR_UNSUPPORTED)
 *   mem_pack     the key a peer loads: the region's address and length
 *   rmem_load    a peer's key, checked against the region it describes
 *   xfer_post    never blocks: queues the request (PDX_INPROGRESS)
 *   progress     copies queued requests, then hands their notifications
 *                to the peer, and delivers the notifications that arrived
 *   xfer_check   the request's state (progress moves it; check does not)
 *   xfer_abort   a queued request ends PDX_ERR_CANCELED, no notification
 *   peer_failed  the peer's requests end PDX_ERR_REMOTE_DISCONNECT
 *
 * Threading as the ABI says: the agent serialises calls into an instance;
 * what another instance touches (the inbox of notifications, the list of
 * instances) is under one process-wide mutex. Callbacks into the host are
 * made only from inside progress. The module exports `pdx_backend_v1` and
 * nothing else (pdx_backend_example.map). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pdx/backend.h> /* and pdx/types.h: PDX_NAME_MAX */
#include <pdx/export.h>

#define EX_MAGIC 0x78656470u /* "pdex" */
#define EX_CAPS                                                                \
    (PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_READ | PDX_BACKEND_CAP_WRITE |     \
     PDX_BACKEND_CAP_NOTIF | PDX_BACKEND_CAP_SAME_HOST)

/* What conn_info gives and mem_pack packs: fixed-size, checked on load. */
typedef struct ex_conn {
    uint32_t magic;
    uint32_t pid;
    uint64_t id;
} ex_conn_t;

typedef struct ex_key {
    uint32_t magic;
    uint32_t reserved;
    uint64_t addr;
    uint64_t len;
} ex_key_t;

/* A local region (md) or a peer's (rmd). */
typedef struct ex_mem {
    uint64_t addr, len;
} ex_mem_t;

typedef struct ex_note {
    struct ex_note *next;
    char from[PDX_NAME_MAX];
    size_t len;
    unsigned char msg[];
} ex_note_t;

typedef struct ex_peer {
    uint64_t id; /* the peer instance; looked up, never held */
    char name[PDX_NAME_MAX];
    int failed;
} ex_peer_t;

typedef struct ex_req {
    struct ex_req *next, *prev;
    ex_peer_t *peer;
    pdx_xfer_op_t op;
    pdx_status_t st; /* PDX_INPROGRESS until copied, aborted or failed */
    size_t n;
    pdx_backend_iov_t *iov;
    size_t notif_len;
    unsigned char *notif; /* NULL: none */
} ex_req_t;

typedef struct ex_be {
    struct ex_be *next; /* the process's instances (g_lock) */
    uint64_t id;
    const pdx_backend_host_t *host;
    ex_req_t *queue;               /* this instance's requests, oldest first */
    ex_note_t *inbox, *inbox_tail; /* g_lock: filled by other instances */
    size_t posted, copied;
} ex_be_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ex_be_t *g_instances;
static uint64_t g_next_id = 1;

/* ---- the instance ---------------------------------------------------- */

static pdx_status_t ex_query(char *why, size_t why_len)
{
    (void)why, (void)why_len;
    return PDX_OK;
}

static pdx_status_t ex_create(const pdx_backend_host_t *host,
                              const pdx_option_t *opts, size_t nopts,
                              void **be_p)
{
    if (nopts > 0) {
        (void)opts;
        return PDX_ERR_CONFIG; /* it takes no option */
    }
    ex_be_t *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return PDX_ERR_NOMEM;
    }
    be->host = host;
    pthread_mutex_lock(&g_lock);
    be->id = g_next_id++;
    be->next = g_instances;
    g_instances = be;
    pthread_mutex_unlock(&g_lock);
    *be_p = be;
    return PDX_OK;
}

static void ex_destroy(void *bev)
{
    ex_be_t *be = bev;
    pthread_mutex_lock(&g_lock);
    for (ex_be_t **pp = &g_instances; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == be) {
            *pp = be->next;
            break;
        }
    }
    ex_note_t *n = be->inbox;
    pthread_mutex_unlock(&g_lock);
    while (n != NULL) {
        ex_note_t *next = n->next;
        free(n);
        n = next;
    }
    free(be); /* the agent released every request before */
}

static pdx_status_t ex_conn_info(void *bev, void **buf_p, size_t *len_p)
{
    ex_be_t *be = bev;
    ex_conn_t *c = malloc(sizeof(*c)); /* the agent frees it */
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    *c =
        (ex_conn_t){.magic = EX_MAGIC, .pid = (uint32_t)getpid(), .id = be->id};
    *buf_p = c;
    *len_p = sizeof(*c);
    return PDX_OK;
}

static void ex_describe(void *bev, char *buf, size_t len)
{
    ex_be_t *be = bev;
    snprintf(buf, len,
             "memcpy loopback, instance %llu, %zu posted, %zu "
             "copied",
             (unsigned long long)be->id, be->posted, be->copied);
}

static int ex_event_fd(void *bev)
{
    (void)bev;
    return -1;
}

static pdx_status_t ex_arm(void *bev)
{
    (void)bev;
    return PDX_ERR_UNSUPPORTED; /* no event fd: not advertised in caps */
}

/* ---- memory ---------------------------------------------------------- */

static pdx_status_t ex_mem_register(void *bev, const pdx_region_t *region,
                                    void **md_p)
{
    (void)bev;
    if (region->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED; /* another backend's */
    }
    ex_mem_t *m = malloc(sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    *m = (ex_mem_t){.addr = region->addr, .len = region->len};
    *md_p = m;
    return PDX_OK;
}

static void ex_mem_deregister(void *bev, void *md)
{
    (void)bev;
    free(md);
}

static pdx_status_t ex_mem_pack(void *bev, void *md, void **buf_p,
                                size_t *len_p)
{
    (void)bev;
    const ex_mem_t *m = md;
    ex_key_t *k = malloc(sizeof(*k));
    if (k == NULL) {
        return PDX_ERR_NOMEM;
    }
    *k = (ex_key_t){.magic = EX_MAGIC, .addr = m->addr, .len = m->len};
    *buf_p = k;
    *len_p = sizeof(*k);
    return PDX_OK;
}

static pdx_status_t ex_rmem_load(void *bev, void *peer,
                                 const pdx_region_t *region, const void *key,
                                 size_t key_len, void **rmd_p)
{
    (void)bev, (void)peer;
    ex_key_t k;
    if (region->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    if (key_len != sizeof(k)) {
        return PDX_ERR_CORRUPT;
    }
    memcpy(&k, key, sizeof(k));
    /* A key from elsewhere is never trusted: it must be ours and describe
     * exactly the region the peer's blob gave. */
    if (k.magic != EX_MAGIC || k.addr != region->addr || k.len != region->len) {
        return PDX_ERR_CORRUPT;
    }
    ex_mem_t *m = malloc(sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    *m = (ex_mem_t){.addr = k.addr, .len = k.len};
    *rmd_p = m;
    return PDX_OK;
}

static void ex_rmem_unload(void *bev, void *rmd)
{
    (void)bev;
    free(rmd);
}

/* ---- peers ----------------------------------------------------------- */

static pdx_status_t ex_peer_connect(void *bev, const char *peer_name,
                                    const void *conn, size_t conn_len,
                                    void **peer_p)
{
    (void)bev;
    ex_conn_t c;
    if (conn_len != sizeof(c)) {
        return PDX_ERR_CORRUPT;
    }
    memcpy(&c, conn, sizeof(c));
    if (c.magic != EX_MAGIC) {
        return PDX_ERR_CORRUPT;
    }
    if (c.pid != (uint32_t)getpid()) {
        return PDX_ERR_UNSUPPORTED; /* another process: another backend's */
    }
    ex_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    p->id = c.id;
    snprintf(p->name, sizeof(p->name), "%s", peer_name);
    *peer_p = p;
    return PDX_OK;
}

static void ex_peer_disconnect(void *bev, void *peer)
{
    (void)bev;
    free(peer); /* its requests were released before */
}

static void ex_peer_failed(void *bev, void *peerv)
{
    ex_be_t *be = bev;
    ex_peer_t *peer = peerv;
    peer->failed = 1;
    for (ex_req_t *r = be->queue; r != NULL; r = r->next) {
        if (r->peer == peer && r->st == PDX_INPROGRESS) {
            r->st = PDX_ERR_REMOTE_DISCONNECT;
        }
    }
}

static pdx_status_t ex_path(void *bev, void *peer, void *rmd, char *transport,
                            size_t tlen, char *why, size_t wlen)
{
    (void)bev, (void)peer, (void)rmd, (void)why, (void)wlen;
    snprintf(transport, tlen, "memcpy");
    return PDX_OK;
}

/* ---- notifications --------------------------------------------------- */

/* Into the inbox of instance `id` (delivered by its progress). */
static pdx_status_t deliver(const ex_be_t *from, uint64_t id, const void *msg,
                            size_t len)
{
    ex_note_t *n = malloc(sizeof(*n) + (len ? len : 1));
    if (n == NULL) {
        return PDX_ERR_NOMEM;
    }
    n->next = NULL;
    snprintf(n->from, sizeof(n->from), "%s", from->host->agent_name);
    n->len = len;
    memcpy(n->msg, msg, len);
    pthread_mutex_lock(&g_lock);
    ex_be_t *to = g_instances;
    while (to != NULL && to->id != id) {
        to = to->next;
    }
    if (to != NULL) {
        if (to->inbox_tail != NULL) {
            to->inbox_tail->next = n;
        } else {
            to->inbox = n;
        }
        to->inbox_tail = n;
    }
    pthread_mutex_unlock(&g_lock);
    if (to == NULL) {
        free(n);
        return PDX_ERR_REMOTE_DISCONNECT; /* that instance is gone */
    }
    return PDX_OK;
}

static pdx_status_t ex_notif_send(void *bev, void *peerv, const void *msg,
                                  size_t len)
{
    ex_peer_t *peer = peerv;
    if (peer->failed) {
        return PDX_ERR_REMOTE_DISCONNECT;
    }
    return deliver(bev, peer->id, msg, len);
}

/* ---- transfers ------------------------------------------------------- */

static int inside(const ex_mem_t *m, uint64_t addr, uint64_t len)
{
    return m != NULL && addr >= m->addr && len <= m->len &&
           addr - m->addr <= m->len - len;
}

static pdx_status_t ex_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                                 const pdx_backend_iov_t *iov, size_t n,
                                 const void *notif, size_t notif_len,
                                 void **req_p)
{
    ex_be_t *be = bev;
    ex_peer_t *peer = peerv;
    if (op != PDX_XFER_READ && op != PDX_XFER_WRITE) {
        return PDX_ERR_INVALID;
    }
    if (peer->failed) {
        return PDX_ERR_REMOTE_DISCONNECT;
    }
    for (size_t i = 0; i < n; i++) { /* nothing is posted on a bad piece */
        if (!inside(iov[i].local_md, iov[i].local_addr, iov[i].len) ||
            !inside(iov[i].remote_md, iov[i].remote_addr, iov[i].len)) {
            return PDX_ERR_INVALID;
        }
    }
    ex_req_t *r = calloc(1, sizeof(*r));
    pdx_backend_iov_t *copy = malloc((n ? n : 1) * sizeof(*copy));
    unsigned char *nb =
        notif != NULL ? malloc(notif_len ? notif_len : 1) : NULL;
    if (r == NULL || copy == NULL || (notif != NULL && nb == NULL)) {
        free(r);
        free(copy);
        free(nb);
        return PDX_ERR_NOMEM;
    }
    memcpy(copy, iov, n * sizeof(*copy)); /* iov is only read now */
    if (nb != NULL) {
        memcpy(nb, notif, notif_len);
    }
    *r = (ex_req_t){.peer = peer,
                    .op = op,
                    .st = PDX_INPROGRESS,
                    .n = n,
                    .iov = copy,
                    .notif_len = notif_len,
                    .notif = nb};
    /* Appended: requests complete in order, so a notification never
     * overtakes the data of a request posted before it. */
    ex_req_t **pp = &be->queue;
    while (*pp != NULL) {
        r->prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = r;
    be->posted++;
    *req_p = r;
    return PDX_INPROGRESS;
}

static pdx_status_t ex_xfer_check(void *bev, void *reqv)
{
    (void)bev;
    return ((ex_req_t *)reqv)->st;
}

static pdx_status_t ex_xfer_abort(void *bev, void *reqv)
{
    (void)bev;
    ex_req_t *r = reqv;
    if (r->st == PDX_INPROGRESS) {
        r->st = PDX_ERR_CANCELED; /* not a byte copied, no notification */
    }
    return PDX_OK;
}

static void ex_xfer_release(void *bev, void *reqv)
{
    ex_be_t *be = bev;
    ex_req_t *r = reqv;
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        be->queue = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    free(r->iov);
    free(r->notif);
    free(r);
}

static int ex_progress(void *bev)
{
    ex_be_t *be = bev;
    int events = 0;
    for (ex_req_t *r = be->queue; r != NULL; r = r->next) {
        if (r->st != PDX_INPROGRESS) {
            continue;
        }
        for (size_t i = 0; i < r->n; i++) {
            void *l = (void *)(uintptr_t)r->iov[i].local_addr;
            void *m = (void *)(uintptr_t)r->iov[i].remote_addr;
            if (r->op == PDX_XFER_READ) {
                memcpy(l, m, r->iov[i].len);
            } else {
                memcpy(m, l, r->iov[i].len);
            }
        }
        /* After every byte landed, as the ABI asks of CAP_NOTIF. */
        r->st = r->notif != NULL
                    ? deliver(be, r->peer->id, r->notif, r->notif_len)
                    : PDX_OK;
        be->copied++;
        events++;
    }
    pthread_mutex_lock(&g_lock);
    ex_note_t *n = be->inbox;
    be->inbox = be->inbox_tail = NULL;
    pthread_mutex_unlock(&g_lock);
    while (n != NULL) { /* from inside progress, as the ABI asks */
        ex_note_t *next = n->next;
        be->host->notif_recv(be->host->agent_ctx, n->from, n->msg, n->len);
        free(n);
        n = next;
        events++;
    }
    return events;
}

/* ---- the table: the module's one exported symbol --------------------- */

PDX_API extern const pdx_backend_ops_t pdx_backend_v1;

const pdx_backend_ops_t pdx_backend_v1 = {
    .abi_version = PDX_BACKEND_ABI_VERSION,
    .size = sizeof(pdx_backend_ops_t),
    .name = "example",
    .caps = EX_CAPS,
    .query = ex_query,
    .create = ex_create,
    .destroy = ex_destroy,
    .conn_info = ex_conn_info,
    .mem_register = ex_mem_register,
    .mem_deregister = ex_mem_deregister,
    .mem_pack = ex_mem_pack,
    .peer_connect = ex_peer_connect,
    .peer_disconnect = ex_peer_disconnect,
    .rmem_load = ex_rmem_load,
    .rmem_unload = ex_rmem_unload,
    .xfer_post = ex_xfer_post,
    .xfer_check = ex_xfer_check,
    .xfer_release = ex_xfer_release,
    .notif_send = ex_notif_send,
    .progress = ex_progress,
    .event_fd = ex_event_fd,
    .arm = ex_arm,
    .describe = ex_describe,
    .xfer_abort = ex_xfer_abort,
    .path = ex_path,
    .peer_failed = ex_peer_failed,
};
