/* etcd store: the block-owner registry: owner keys in gRPC transactions
 * (etcd's Txn), several in parallel. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

typedef struct txn_job {
    size_t first, count; /* blocks */
    etcd_buf_t body;     /* gRPC frame: flag, length, TxnRequest */
    etcd_buf_t out;
    CURL *h;
    int grpc_status; /* -1 until a grpc-status header or trailer */
    char grpc_msg[160];
    pdx_status_t st;
} txn_job_t;

static size_t on_grpc_header(char *p, size_t size, size_t n, void *arg)
{
    txn_job_t *j = arg;
    size_t len = size * n;
    static const char gs[] = "grpc-status:", gm[] = "grpc-message:";
    if (len > sizeof(gs) - 1 && strncasecmp(p, gs, sizeof(gs) - 1) == 0) {
        j->grpc_status = atoi(p + sizeof(gs) - 1);
    } else if (len > sizeof(gm) - 1 &&
               strncasecmp(p, gm, sizeof(gm) - 1) == 0) {
        size_t m = len - (sizeof(gm) - 1);
        const char *v = p + sizeof(gm) - 1;
        while (m > 0 && (*v == ' ')) {
            v++;
            m--;
        }
        while (m > 0 && (v[m - 1] == '\r' || v[m - 1] == '\n')) {
            m--;
        }
        snprintf(j->grpc_msg, sizeof(j->grpc_msg), "%.*s", (int)m, v);
    }
    return len;
}

static size_t on_grpc_data(char *p, size_t size, size_t n, void *arg)
{
    etcd_buf_add(&((txn_job_t *)arg)->out, p, size * n);
    return size * n;
}

static pdx_status_t grpc_code_status(int code)
{
    switch (code) {
    case 3:
    case 9:
        return PDX_ERR_INVALID;
    case 4:
        return PDX_ERR_TIMEOUT;
    case 5:
        return PDX_ERR_NOT_FOUND; /* lease gone */
    case 8:
        return PDX_ERR_TOO_LARGE;
    case 14:
        return PDX_ERR_UNAVAILABLE;
    default:
        return PDX_ERR_IO;
    }
}

/* The TxnResponse of a finished job (after its 5-byte gRPC prefix). */
static bool job_msg(const txn_job_t *j, const uint8_t **p, size_t *n)
{
    const uint8_t *b = (const uint8_t *)j->out.data;
    size_t left = j->out.len;
    return b != NULL && etcd_grpc_next_frame(&b, &left, p, n);
}

static void grpc_setup(etcd_store_t *s, txn_job_t *j, CURL *h,
                       const char *endpoint)
{
    curl_easy_reset(h);
    etcd_grpc_easy_setup(s, h, endpoint, "/etcdserverpb.KV/Txn",
                         on_grpc_data, on_grpc_header, j);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, j->body.data);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)j->body.len);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_PRIVATE, j);
}

/* Run every job's transaction, up to ETCD_PARALLEL streams at once on one
 * HTTP/2 connection kept between calls. Each job ends PDX_OK with its
 * response in `out`, or an error. */
static pdx_status_t run_txns(etcd_store_t *s, txn_job_t *jobs, size_t njobs)
{
    uint64_t now = pdx_now_ns();
    pthread_mutex_lock(&s->lock);
    bool fast_fail = !s->reachable && s->unreach_mono_ns != 0 &&
                     now < s->probe_at_ns;
    const char *endpoint = s->endpoints[s->ep];
    pthread_mutex_unlock(&s->lock);
    if (fast_fail) {
        return PDX_ERR_UNAVAILABLE;
    }
    /* A multi per call, without CURLOPT_PIPEWAIT: with curl 7.88, streams
     * that waited to share one prior-knowledge h2c connection to etcd
     * failed ("Error in the HTTP2 framing layer"); a connection per
     * stream costs a loopback round trip. */
    CURLM *gm = curl_multi_init();
    if (gm == NULL) {
        return PDX_ERR_NOMEM;
    }
    curl_multi_setopt(gm, CURLMOPT_PIPELINING, (long)CURLPIPE_NOTHING);
    pthread_mutex_lock(&s->glock);
    CURL *free_h[ETCD_PARALLEL];
    size_t nfree = 0;
    for (size_t i = 0; i < ETCD_PARALLEL; i++) {
        if (s->gh[i] != NULL) {
            free_h[nfree++] = s->gh[i];
        }
    }
    size_t next = 0, active = 0, done = 0;
    pdx_status_t st = PDX_OK;
    /* Each transfer has its own timeout: the loop ends within
     * njobs / ETCD_PARALLEL + 1 timeouts. */
    for (uint64_t guard = 0; done < njobs && guard < 10000000; guard++) {
        while (nfree > 0 && next < njobs) {
            txn_job_t *j = &jobs[next++];
            j->h = free_h[--nfree];
            j->grpc_status = -1;
            grpc_setup(s, j, j->h, endpoint);
            curl_multi_add_handle(gm, j->h);
            active++;
        }
        int running = 0;
        curl_multi_perform(gm, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(gm, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE) {
                continue;
            }
            txn_job_t *j = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            CURLcode cc = msg->data.result;
            long code = 0;
            curl_easy_getinfo(j->h, CURLINFO_RESPONSE_CODE, &code);
            curl_multi_remove_handle(gm, j->h);
            free_h[nfree++] = j->h;
            j->h = NULL;
            pthread_mutex_lock(&s->lock);
            s->requests++;
            pthread_mutex_unlock(&s->lock);
            const uint8_t *p;
            size_t n;
            int64_t rev = 0;
            if (cc != CURLE_OK) {
                char what[256];
                snprintf(what, sizeof(what), "%s/etcdserverpb.KV/Txn: %s",
                         endpoint, curl_easy_strerror(cc));
                etcd_note_fail(s, what);
                j->st = PDX_ERR_UNAVAILABLE;
            } else if (j->grpc_status > 0 || code != 200) {
                if (j->grpc_status == 16) {
                    etcd_auth_invalidate(s); /* the next call re-authenticates */
                }
                j->st = code != 200 ? PDX_ERR_IO
                                    : grpc_code_status(j->grpc_status);
                if (j->st == PDX_ERR_UNAVAILABLE) {
                    etcd_note_fail(s, j->grpc_msg);
                } else {
                    etcd_note_ok(s, 0);
                    pdx_warn("store etcd: transaction of %zu blocks: HTTP "
                             "%ld, grpc-status %d: %s", j->count, code,
                             j->grpc_status, j->grpc_msg);
                }
            } else if (!job_msg(j, &p, &n) ||
                       etcd_pb_txn(p, n, &rev, NULL, NULL) < 0) {
                pdx_warn("store etcd: transaction of %zu blocks: malformed "
                         "answer (%zu bytes)", j->count, j->out.len);
                j->st = PDX_ERR_CORRUPT;
            } else {
                etcd_note_ok(s, rev);
                j->st = PDX_OK;
            }
            if (j->st != PDX_OK && st == PDX_OK) {
                st = j->st;
            }
            active--;
            done++;
        }
        if (done < njobs && active > 0) {
            curl_multi_poll(gm, NULL, 0, 100, NULL);
        }
    }
    pthread_mutex_unlock(&s->glock);
    curl_multi_cleanup(gm);
    return st;
}

static void jobs_free(txn_job_t *jobs, size_t njobs)
{
    for (size_t i = 0; i < njobs; i++) {
        etcd_buf_free(&jobs[i].body);
        etcd_buf_free(&jobs[i].out);
    }
    free(jobs);
}

/* `<ns>/blocks/<block>/` (or with the owner appended) as a full key. */
static char *block_key(etcd_store_t *s, const char *block, const char *owner)
{
    size_t n = strlen(s->ns) + strlen(block) + (owner ? strlen(owner) : 0) +
               16;
    char *k = malloc(n);
    if (k != NULL) {
        snprintf(k, n, "%s/blocks/%s/%s", s->ns, block, owner ? owner : "");
    }
    return k;
}

typedef enum { OWN_ADD, OWN_DEL, OWN_GET } own_kind_t;

/* Build the jobs of an owner op: `per` blocks a transaction. */
static pdx_status_t build_jobs(etcd_store_t *s, own_kind_t kind,
                               const char *owner, const char *const *blocks,
                               size_t n, int64_t lease, txn_job_t **jobs_p,
                               size_t *njobs_p)
{
    size_t per = kind == OWN_ADD ? s->max_txn_ops / 2 : s->max_txn_ops;
    if (per == 0) {
        per = 1;
    }
    size_t njobs = (n + per - 1) / per;
    txn_job_t *jobs = calloc(njobs ? njobs : 1, sizeof(*jobs));
    if (jobs == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (size_t j = 0; j < njobs; j++) {
        jobs[j].first = j * per;
        jobs[j].count = n - jobs[j].first < per ? n - jobs[j].first : per;
        etcd_buf_t txn = {0};
        bool ok = true;
        for (size_t i = 0; ok && i < jobs[j].count; i++) {
            const char *b = blocks[jobs[j].first + i];
            char *pfx = block_key(s, b, NULL);
            char *full = kind == OWN_GET ? NULL : block_key(s, b, owner);
            ok = pfx != NULL && (kind == OWN_GET || full != NULL);
            if (ok) {
                /* Keys are text: the prefix's last byte ('/') + 1. */
                char *end = strdup(pfx);
                ok = end != NULL;
                if (ok) {
                    end[strlen(end) - 1]++;
                    if (kind == OWN_ADD) {
                        etcd_pb_put(&txn, full, lease);
                        etcd_pb_range(&txn, pfx, end, true, false);
                    } else if (kind == OWN_DEL) {
                        etcd_pb_delete(&txn, full);
                    } else {
                        etcd_pb_range(&txn, pfx, end, false, true);
                    }
                }
                free(end);
            }
            free(pfx);
            free(full);
        }
        if (ok && txn.len > 0) {
            etcd_grpc_frame(&jobs[j].body, &txn);
            ok = jobs[j].body.len == txn.len + 5;
        }
        etcd_buf_free(&txn);
        if (!ok) {
            jobs_free(jobs, njobs);
            return PDX_ERR_NOMEM;
        }
    }
    *jobs_p = jobs;
    *njobs_p = njobs;
    return PDX_OK;
}

static pdx_status_t check_blocks(const char *owner, const char *const *blocks,
                                 size_t n, bool need_owner)
{
    if ((need_owner && !etcd_valid_owner(owner)) || (blocks == NULL && n > 0)) {
        pdx_error("store etcd: owner op: invalid owner or block list");
        return PDX_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (!etcd_valid_block(blocks[i])) {
            pdx_error("store etcd: block %zu '%s' is not 1-128 lowercase hex "
                      "digits", i, blocks[i] ? blocks[i] : "(null)");
            return PDX_ERR_INVALID;
        }
    }
    return PDX_OK;
}

typedef struct add_acc {
    uint32_t *counts; /* of the job's first block */
    size_t nblocks;
    size_t seen;
} add_acc_t;

static void on_add_op(void *arg, size_t index, uint32_t kind,
                      const uint8_t *p, size_t n)
{
    add_acc_t *a = arg;
    if (index % 2 == 1 && kind == 1 && index / 2 < a->nblocks) {
        a->counts[index / 2] = (uint32_t)etcd_pb_range_count(p, n);
        a->seen++;
    }
}

pdx_status_t etcd_owners_add(void *st, const char *owner,
                             const char *const *blocks, size_t n,
                             uint32_t *counts)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(owner, blocks, n, true);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    pthread_mutex_unlock(&s->lock);
    if (lease == 0) {
        return PDX_ERR_UNAVAILABLE; /* not reached yet, or lease lost */
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_ADD, owner, blocks, n, lease, &jobs, &njobs);
    if (r != PDX_OK) {
        return r;
    }
    r = run_txns(s, jobs, njobs);
    if (r == PDX_ERR_NOT_FOUND) {
        /* Our lease is gone: the thread grants a new one. */
        pthread_mutex_lock(&s->lock);
        if (s->lease == lease) {
            s->lease = 0;
            s->lease_retry_at_ns = pdx_now_ns();
        }
        pthread_mutex_unlock(&s->lock);
        etcd_lease_kick(s->client);
        r = PDX_ERR_UNAVAILABLE;
    }
    uint32_t *tmp = counts ? NULL : calloc(n, sizeof(*tmp));
    for (size_t j = 0; r == PDX_OK && j < njobs; j++) {
        const uint8_t *p;
        size_t len;
        add_acc_t a = {.counts = (counts ? counts : tmp) + jobs[j].first,
                       .nblocks = jobs[j].count};
        if (a.counts == NULL || !job_msg(&jobs[j], &p, &len) ||
            etcd_pb_txn(p, len, NULL, on_add_op, &a) < 0 ||
            a.seen != jobs[j].count) {
            r = PDX_ERR_CORRUPT;
        }
    }
    free(tmp);
    jobs_free(jobs, njobs);
    return r;
}

pdx_status_t etcd_owners_del(void *st, const char *owner,
                             const char *const *blocks, size_t n)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(owner, blocks, n, true);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_DEL, owner, blocks, n, 0, &jobs, &njobs);
    if (r == PDX_OK) {
        r = run_txns(s, jobs, njobs);
        jobs_free(jobs, njobs);
    }
    return r;
}

typedef struct get_acc {
    etcd_store_t *s;
    const char *const *blocks;
    size_t first, count;
    pdx_store_owner_cb_t cb;
    void *arg;
    size_t bi;
    size_t seen;
} get_acc_t;

static void on_owner_key(void *arg, const char *key, size_t len)
{
    get_acc_t *a = arg;
    char *pfx = block_key(a->s, a->blocks[a->bi], NULL);
    size_t plen = pfx ? strlen(pfx) : 0;
    if (pfx != NULL && len > plen && len - plen < 64 &&
        memcmp(key, pfx, plen) == 0 &&
        memchr(key + plen, '/', len - plen) == NULL) {
        char owner[64];
        memcpy(owner, key + plen, len - plen);
        owner[len - plen] = '\0';
        a->cb(a->arg, a->bi, owner);
    }
    free(pfx);
}

static void on_get_op(void *arg, size_t index, uint32_t kind,
                      const uint8_t *p, size_t n)
{
    get_acc_t *a = arg;
    if (kind != 1 || index >= a->count) {
        return;
    }
    a->bi = a->first + index;
    a->seen++;
    etcd_pb_range_keys(p, n, on_owner_key, a);
}

pdx_status_t etcd_owners_get(void *st, const char *const *blocks,
                             size_t n, pdx_store_owner_cb_t cb,
                             void *arg)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(NULL, blocks, n, false);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    if (cb == NULL) {
        return PDX_ERR_INVALID;
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_GET, NULL, blocks, n, 0, &jobs, &njobs);
    if (r != PDX_OK) {
        return r;
    }
    r = run_txns(s, jobs, njobs);
    /* Blocks in order: jobs are in block order. */
    for (size_t j = 0; r == PDX_OK && j < njobs; j++) {
        const uint8_t *p;
        size_t len;
        get_acc_t a = {.s = s, .blocks = blocks, .first = jobs[j].first,
                       .count = jobs[j].count, .cb = cb, .arg = arg};
        if (!job_msg(&jobs[j], &p, &len) ||
            etcd_pb_txn(p, len, NULL, on_get_op, &a) < 0 ||
            a.seen != jobs[j].count) {
            r = PDX_ERR_CORRUPT;
        }
    }
    jobs_free(jobs, njobs);
    return r;
}
