/* An in-process memcpy backend for testing the agent without a transport:
 * two agents in one process reach each other through pointers. Completion
 * is deferred to the next check so the in-progress paths run. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mock_backend.h"

typedef struct mock_msg {
    struct mock_msg *next;
    char from[64];
    size_t len;
    unsigned char data[];
} mock_msg_t;

typedef struct mock_be {
    pdx_backend_host_t host;
    /* The inbox is written by the peer's agent (under its own lock), so it
     * has a lock of its own. */
    pthread_mutex_t inbox_lock;
    mock_msg_t *inbox, *inbox_tail;
} mock_be_t;

typedef struct mock_req {
    mock_be_t *peer;
    pdx_xfer_op_t op;
    pdx_backend_iov_t *iov;
    size_t n;
    unsigned char *notif;
    size_t notif_len;
    int checks;
} mock_req_t;

int mock_fail_next_post;
int mock_hold_completion; /* requests stay in progress while set */

static pdx_status_t m_query(char *why, size_t len) { return PDX_OK; }

static pdx_status_t m_create(const pdx_backend_host_t *host,
                             const pdx_option_t *opts, size_t n, void **be_p)
{
    for (size_t i = 0; i < n; i++) {
        pdx_error("mock: unknown option %s", opts[i].key);
        return PDX_ERR_CONFIG;
    }
    mock_be_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    b->host = *host;
    pthread_mutex_init(&b->inbox_lock, NULL);
    *be_p = b;
    return PDX_OK;
}

static void m_destroy(void *be)
{
    mock_be_t *b = be;
    while (b->inbox != NULL) {
        mock_msg_t *m = b->inbox;
        b->inbox = m->next;
        free(m);
    }
    pthread_mutex_destroy(&b->inbox_lock);
    free(b);
}

static pdx_status_t m_conn_info(void *be, void **buf_p, size_t *len_p)
{
    void **p = malloc(sizeof(void *));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    *p = be;
    *buf_p = p;
    *len_p = sizeof(void *);
    return PDX_OK;
}

pdx_region_t mock_last_region;

static pdx_status_t m_reg(void *be, const pdx_region_t *r, void **md_p)
{
    pdx_region_t *c = malloc(sizeof(*c));
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    *c = *r;
    mock_last_region = *r;
    *md_p = c;
    return PDX_OK;
}

static void m_dereg(void *be, void *md) { free(md); }

static pdx_status_t m_pack(void *be, void *md, void **buf_p, size_t *len_p)
{
    uint64_t *k = malloc(8);
    if (k == NULL) {
        return PDX_ERR_NOMEM;
    }
    *k = ((pdx_region_t *)md)->addr ^ 0x5a5a5a5aull;
    *buf_p = k;
    *len_p = 8;
    return PDX_OK;
}

static pdx_status_t m_connect(void *be, const char *name, const void *conn,
                              size_t len, void **peer_p)
{
    if (len != sizeof(void *)) {
        return PDX_ERR_CORRUPT;
    }
    memcpy(peer_p, conn, sizeof(void *));
    return PDX_OK;
}

static void m_disconnect(void *be, void *peer) {}

static pdx_status_t m_rload(void *be, void *peer, const pdx_region_t *r,
                            const void *key, size_t len, void **rmd_p)
{
    uint64_t k;
    if (len != 8) {
        return PDX_ERR_CORRUPT;
    }
    memcpy(&k, key, 8);
    if ((k ^ 0x5a5a5a5aull) != r->addr) {
        return PDX_ERR_CORRUPT;
    }
    return m_reg(be, r, rmd_p);
}

static void m_runload(void *be, void *rmd) { free(rmd); }

static void deliver(mock_be_t *to, const char *from, const void *msg,
                    size_t len)
{
    mock_msg_t *m = malloc(sizeof(*m) + len);
    if (m == NULL) {
        return;
    }
    m->next = NULL;
    m->len = len;
    snprintf(m->from, sizeof(m->from), "%s", from);
    memcpy(m->data, msg, len);
    pthread_mutex_lock(&to->inbox_lock);
    if (to->inbox_tail) {
        to->inbox_tail->next = m;
    } else {
        to->inbox = m;
    }
    to->inbox_tail = m;
    pthread_mutex_unlock(&to->inbox_lock);
}

static pdx_status_t m_post(void *be, void *peer, pdx_xfer_op_t op,
                           const pdx_backend_iov_t *iov, size_t n,
                           const void *notif, size_t nlen, void **req_p)
{
    if (mock_fail_next_post) {
        mock_fail_next_post = 0;
        return PDX_ERR_BACKEND;
    }
    mock_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return PDX_ERR_NOMEM;
    }
    r->iov = malloc(n * sizeof(*iov));
    r->notif = notif ? malloc(nlen ? nlen : 1) : NULL;
    if (r->iov == NULL || (notif && r->notif == NULL)) {
        free(r->iov);
        free(r->notif);
        free(r);
        return PDX_ERR_NOMEM;
    }
    memcpy(r->iov, iov, n * sizeof(*iov));
    if (notif) {
        memcpy(r->notif, notif, nlen);
    }
    r->n = n;
    r->notif_len = nlen;
    r->op = op;
    r->peer = peer;
    *req_p = r;
    return PDX_INPROGRESS;
}

static pdx_status_t m_check(void *be, void *req)
{
    mock_be_t *b = be;
    mock_req_t *r = req;
    if (r->checks < 0) {
        return PDX_ERR_CANCELED;
    }
    if (mock_hold_completion) {
        return PDX_INPROGRESS;
    }
    if (r->checks++ == 0) {
        for (size_t i = 0; i < r->n; i++) {
            void *l = (void *)(uintptr_t)r->iov[i].local_addr;
            void *rm = (void *)(uintptr_t)r->iov[i].remote_addr;
            if (r->op == PDX_XFER_WRITE) {
                memcpy(rm, l, r->iov[i].len);
            } else {
                memcpy(l, rm, r->iov[i].len);
            }
        }
        if (r->notif) {
            deliver(r->peer, b->host.agent_name, r->notif, r->notif_len);
        }
    }
    return PDX_OK;
}

static void m_release(void *be, void *req)
{
    mock_req_t *r = req;
    free(r->iov);
    free(r->notif);
    free(r);
}

static pdx_status_t m_notif(void *be, void *peer, const void *msg, size_t len)
{
    deliver(peer, ((mock_be_t *)be)->host.agent_name, msg, len);
    return PDX_OK;
}

static int m_progress(void *be)
{
    mock_be_t *b = be;
    int n = 0;
    pthread_mutex_lock(&b->inbox_lock);
    mock_msg_t *list = b->inbox;
    b->inbox = b->inbox_tail = NULL;
    pthread_mutex_unlock(&b->inbox_lock);
    while (list != NULL) {
        mock_msg_t *m = list;
        list = m->next;
        b->host.notif_recv(b->host.agent_ctx, m->from, m->data, m->len);
        free(m);
        n++;
    }
    return n;
}

/* Copies happen at the first check; an abort before it skips them. */
static pdx_status_t m_abort(void *be, void *req)
{
    mock_req_t *r = req;
    if (r->checks == 0) {
        r->checks = -1;
    }
    return PDX_OK;
}

static int m_efd(void *be) { return -1; }
static pdx_status_t m_arm(void *be) { return PDX_ERR_UNSUPPORTED; }
static void m_describe(void *be, char *buf, size_t len)
{
    snprintf(buf, len, "in-process memcpy");
}

const pdx_backend_ops_t mock_backend_ops = {
    .abi_version = PDX_BACKEND_ABI_VERSION,
    .size = sizeof(pdx_backend_ops_t),
    .name = "mock",
    .caps = PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_READ |
            PDX_BACKEND_CAP_WRITE | PDX_BACKEND_CAP_NOTIF,
    .query = m_query, .create = m_create, .destroy = m_destroy,
    .conn_info = m_conn_info, .mem_register = m_reg,
    .mem_deregister = m_dereg, .mem_pack = m_pack, .peer_connect = m_connect,
    .peer_disconnect = m_disconnect, .rmem_load = m_rload,
    .rmem_unload = m_runload, .xfer_post = m_post, .xfer_check = m_check,
    .xfer_release = m_release, .notif_send = m_notif,
    .progress = m_progress, .event_fd = m_efd, .arm = m_arm,
    .describe = m_describe,
    .xfer_abort = m_abort,
};
