/* Private to the etcd store module: the instance, its requests to etcd's v3
 * JSON gateway (libcurl + cJSON) and the helpers the ops share. */
#ifndef PDX_ETCD_INT_H
#define PDX_ETCD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include <pdx/log.h>
#include <pdx/store.h>

#include "pdx_clock.h"
#include "pdx_opts.h"

#define ETCD_MAX_ENDPOINTS 8
#define ETCD_HANDLE_POOL 8
#define ETCD_PARALLEL 8 /* owner transactions in flight per call */

typedef struct etcd_buf {
    char *data;
    size_t len, cap;
} etcd_buf_t;

/* A key kept under the lease (PDX_STORE_PUT_LEASED). */
typedef struct etcd_leased {
    struct etcd_leased *next;
    char *key; /* relative */
    void *value;
    size_t len;
    int64_t lease_put; /* lease it was last stored under; 0 none */
} etcd_leased_t;

/* A key a watch has reported present, for resyncs. */
typedef struct etcd_known {
    char *key;
    int64_t rev;
} etcd_known_t;

/* An event parsed from a stream, waiting to be delivered. */
typedef struct etcd_event {
    struct etcd_event *next;
    uint64_t watch_id;
    pdx_store_event_t ev; /* key and value point into `mem` */
    char mem[];
} etcd_event_t;

struct etcd_kw;
typedef struct etcd_h2 etcd_h2_t;

/* A watch of an instance. A prefix watch has a stream of its own; a key
 * watch (PDX_STORE_WATCH_KEY) is one subscriber of a key of the client's
 * multiplexed stream (etcd_client_t), which carries every watched key of
 * every instance sharing the client. */
typedef struct etcd_watch {
    struct etcd_watch *next;
    struct etcd_store *owner;
    uint64_t id;
    char *prefix; /* relative; the key of a key watch */
    uint32_t flags;
    bool keyed;
    int64_t next_rev;  /* resume (prefix) or report (key) from here; 0 now */
    bool need_resync;  /* list the prefix (read the key) before reporting */
    bool removed;
    CURL *h;           /* open stream, or NULL */
    etcd_buf_t rx;     /* partial line */
    char *body;        /* request body of the open stream */
    bool created;
    bool broken;       /* the stream must be closed and reopened */
    bool up;           /* stream open and created (under the lock) */
    uint64_t retry_at_ns;
    uint32_t backoff_ms;
    etcd_known_t *known;
    size_t nknown, known_cap;
    /* Key watch: its key on the client's stream (client thread only). */
    struct etcd_kw *kw;
    struct etcd_watch *kw_next;
    int64_t known_rev; /* mod revision of the PUT last reported; 0 none */
} etcd_watch_t;

/* A key on the multiplexed stream and the watches that want it. */
typedef struct etcd_kw {
    struct etcd_kw *next;
    char *full;       /* full key */
    uint64_t wid;     /* etcd watch id on the open stream */
    int64_t pos;      /* next revision the stream reports; 0 unknown */
    bool created;
    bool recreate;    /* wants a create on the open stream (new key, older
                       * history, after a compaction) */
    uint64_t sent_ns; /* its create was queued then (acknowledgement wait) */
    etcd_watch_t *subs;
} etcd_kw_t;

struct etcd_store;

/* One client of etcd per process and endpoint list (instances without
 * module options share it; one with TLS or auth options has its own):
 * its thread runs every member's watch streams, republication and event
 * delivery; its lease thread renews every member's lease, all in one
 * request, on its own schedule, never behind them. */
typedef struct etcd_client {
    struct etcd_client *next; /* process-wide list */
    char *key;                /* endpoints; NULL: private */
    int pid;                  /* a forked child never uses its parent's */
    unsigned refs;            /* under the list lock */
    pthread_mutex_t lock;     /* members, stop, busy flags, pool */
    pthread_cond_t cv;        /* detach handshake, lease thread wake-up */
    struct etcd_store *members;
    bool stop;
    pthread_t thread, lthread;
    bool thread_running, lthread_running;
    bool lease_kick;          /* a member needs the lease thread now */
    CURLM *multi;
    CURL *th;                 /* client thread's blocking handle */
    CURL *lh;                 /* lease thread's */
    CURL *pool[ETCD_HANDLE_POOL]; /* callers' handles (connections kept) */
    uint32_t npool;
    etcd_h2_t *h2[ETCD_HANDLE_POOL]; /* idle h2c connections (etcd_h2.c) */
    uint32_t nh2;
    /* Multiplexed key-watch stream (client thread only). */
    etcd_kw_t *keys;
    uint32_t nkeys;
    CURL *mh;
    struct etcd_store *mrep;  /* member whose settings opened it */
    etcd_buf_t mrx;
    etcd_buf_t mtx;           /* gRPC frames not yet taken by curl */
    size_t mtx_off;
    bool mpaused;             /* the upload waits for frames */
    uint64_t mnext_wid;       /* watch ids, never reused by a client */
    bool mdirty, mbroken;     /* a key wants a create / the stream a reopen */
    uint64_t mretry_at_ns;
    uint32_t mbackoff_ms;
    uint64_t mopens;          /* streams opened (under lock: counters) */
    uint64_t rx_bytes;        /* bytes received on watch streams */
} etcd_client_t;

typedef struct etcd_store {
    pdx_store_host_t host;
    char *endpoints[ETCD_MAX_ENDPOINTS];
    uint32_t nendpoints;
    char ns[128];
    uint32_t ttl_s, timeout_ms, retry_min_ms, retry_max_ms, max_txn_ops;

    pthread_mutex_t lock; /* everything below unless said otherwise */
    uint32_t ep;          /* endpoint in use */
    /* Reachability. */
    bool reachable;
    uint64_t unreach_rt_ns, unreach_mono_ns;
    uint64_t probe_at_ns; /* caller ops fail fast before this */
    uint32_t probe_backoff_ms;
    char last_error[256];
    uint64_t requests, failures;
    int64_t revision;
    bool ever_reached;
    bool state_dirty; /* reachability or lease changed: tell the host */
    struct curl_slist *hdrs; /* request headers, shared, read-only */
    /* Lease. */
    int64_t lease;
    uint32_t lease_ttl_s;
    uint64_t leases_granted;
    uint64_t keepalive_at_ns, lease_retry_at_ns;
    uint32_t lease_backoff_ms;
    uint64_t keepalives;  /* renewals sent */
    uint64_t lease_late_ms; /* worst lateness of a renewal vs its schedule */
    etcd_leased_t *leased;
    uint64_t republish_at_ns; /* next try after a failed republication */
    uint32_t republish_backoff_ms;
    pthread_mutex_t pub_lock; /* serialises puts of leased keys */
    /* Watches (list shared; their streams are the client's thread's). */
    etcd_watch_t *watches;
    uint64_t next_watch_id;
    bool restart_watches; /* a keepalive failed: streams may be dead */
    uint64_t events, event_bytes; /* reported to the host */

    /* The shared client (under client->lock: the flags). */
    etcd_client_t *client;
    struct etcd_store *cnext;
    bool detaching, detached, lease_busy;

    /* Owner transactions over gRPC (etcd_pb.c): handles for the streams
     * of one call; calls serialised by glock. */
    pthread_mutex_t glock;
    CURL *gh[ETCD_PARALLEL];
    struct curl_slist *ghdrs;

    /* Client thread only. */
    etcd_event_t *evq, *evq_tail;
    pthread_mutex_t deliver; /* held while callbacks run */

    /* TLS (options ca_file, cert_file, key_file; NULL: libcurl's
     * defaults) and etcd v3 user/password auth (user, password or
     * password_file): immutable after create. */
    char *ca_file, *cert_file, *key_file;
    char *user, *password;
    /* Auth token (under `lock`): hdrs and ghdrs carry it once known; a
     * replaced header list is kept in `retired` until destroy (a transfer
     * may still read it). auth_lock serialises authentications. */
    pthread_mutex_t auth_lock;
    bool token_ok;
    /* After a failed authentication, none before auth_retry_at_ns
     * (backoff 1 s doubling to 30 s: etcd checks passwords with bcrypt). */
    uint64_t auth_retry_at_ns;
    uint32_t auth_backoff_ms;
    struct curl_slist **retired;
    size_t nretired;
} etcd_store_t;

/* ---- etcd_auth.c ---- */

/* Parse the module options into `s` (PDX_ERR_CONFIG naming the option). */
pdx_status_t etcd_opts_parse(etcd_store_t *s, const pdx_option_t *opts,
                             size_t nopts);
/* TLS options on a handle (after curl_easy_reset). */
void etcd_tls_setup(const etcd_store_t *s, CURL *h);
/* With a user: authenticate at `endpoint` unless a token is known and
 * good (blocking, at most the store timeout), then install the token in
 * the header lists. Without one: nothing. */
void etcd_auth_ensure(etcd_store_t *s, const char *endpoint);
/* A request was refused for its token (expired, revoked): authenticate
 * again before the next request. */
void etcd_auth_invalidate(etcd_store_t *s);
/* Free what etcd_opts_parse and authentications allocated. */
void etcd_auth_free(etcd_store_t *s);

/* ---- etcd_codec.c ---- */

/* A uniform random number in [lo, hi] (per-thread xorshift, seeded from
 * the clock, pid and thread): jitter, so that many clients restarted
 * together do not retry in step. */
uint64_t etcd_rand_range(uint64_t lo, uint64_t hi);

void etcd_buf_add(etcd_buf_t *b, const void *p, size_t n);
void etcd_buf_free(etcd_buf_t *b);

/* Base64 (OpenSSL's EVP_EncodeBlock/DecodeBlock). b64_enc returns a
 * malloc'd string; b64_dec a malloc'd buffer (NUL-terminated for
 * convenience) and its length in *len_p, NULL on bad input. */
char *etcd_b64_enc(const void *p, size_t n);
void *etcd_b64_dec(const char *s, size_t *len_p);

/* Full key (namespace + "/" + rel) in base64, malloc'd. */
char *etcd_key_b64(etcd_store_t *s, const char *rel);
/* Base64 of the end of the range of keys starting with `full` (etcd's
 * range_end: the prefix with its last byte plus one). */
char *etcd_prefix_end_b64(const char *full);
/* Full key of `rel`, malloc'd. */
char *etcd_full_key(etcd_store_t *s, const char *rel);

/* int64 fields arrive as strings ("revision":"12") or numbers. */
int64_t etcd_json_i64(const cJSON *obj, const char *name);
void etcd_json_add_i64(cJSON *obj, const char *name, int64_t v);

/* Parse a response body; NULL (and `why`) when it is not a JSON object. */
cJSON *etcd_parse_body(const etcd_buf_t *b);
void etcd_fmt_time(uint64_t rt_ns, char *buf, size_t len);

/* ---- etcd_http.c ---- */

/* Prepare `h` for a POST of `body` to <endpoint><path>; the response is
 * appended to `out`. */
void etcd_easy_setup(etcd_store_t *s, CURL *h, const char *endpoint,
                     const char *path, const char *body, etcd_buf_t *out,
                     long timeout_ms);

/* One request from a caller's thread (fail fast while unreachable unless
 * `force`; the module's thread passes force). Tries each endpoint once
 * within timeout_ms. On PDX_OK, *resp_p is the parsed response (cJSON
 * delete it). A gRPC error from etcd maps to a status (NOT_FOUND for
 * code 5) and its message goes into `err` when not NULL. */
/* A gRPC call of s's on handle h (after curl_easy_reset or on a new
 * one): endpoint + path over HTTP/2 (prior knowledge on http), s's gRPC
 * headers (with its token), TLS options, response data and headers to
 * on_data/on_header with `arg`, a new connection (never reused), connect
 * timeout the store timeout. The caller sets the body and the rest. */
void etcd_grpc_easy_setup(etcd_store_t *s, CURL *h, const char *endpoint,
                          const char *path, curl_write_callback on_data,
                          curl_write_callback on_header, void *arg);
pdx_status_t etcd_call(etcd_store_t *s, CURL *h, const char *path,
                       cJSON *req, cJSON **resp_p, bool force, char *err,
                       size_t err_len);

/* Handles for callers (from the pool, else new) and back. */
CURL *etcd_handle_get(etcd_store_t *s);
void etcd_handle_put(etcd_store_t *s, CURL *h);

/* Record the outcome of a request (caller holds no lock). */
void etcd_note_ok(etcd_store_t *s, int64_t revision);
void etcd_note_fail(etcd_store_t *s, const char *what);

/* ---- etcd_pb.c: TxnRequest ops and TxnResponse decoding ---- */

/* Append one RequestOp to a TxnRequest being built in `txn`. */
void etcd_pb_put(etcd_buf_t *txn, const char *key, int64_t lease);
void etcd_pb_range(etcd_buf_t *txn, const char *key, const char *end,
                   bool count_only, bool keys_only);
void etcd_pb_delete(etcd_buf_t *txn, const char *key);
/* Each ResponseOp of a TxnResponse: its index, which one (1 range, 2 put,
 * 3 delete) and its bytes. */
typedef void (*etcd_pb_op_cb_t)(void *arg, size_t index, uint32_t kind,
                                const uint8_t *p, size_t n);
typedef void (*etcd_pb_key_cb_t)(void *arg, const char *key, size_t len);
/* Returns the number of ResponseOps, -1 when malformed; *rev_p gets the
 * header's revision. */
int etcd_pb_txn(const uint8_t *p, size_t n, int64_t *rev_p,
                etcd_pb_op_cb_t cb, void *arg);
int64_t etcd_pb_range_count(const uint8_t *p, size_t n);
void etcd_pb_range_keys(const uint8_t *p, size_t n, etcd_pb_key_cb_t cb,
                        void *arg);

/* Watch over gRPC (the key-watch stream): a WatchRequest with one
 * create_request appended to `out` as a gRPC frame; a WatchResponse
 * decoded into w, cb(arg, ev) per event (key and value point into p).
 * Returns the number of events, -1 when malformed. */
typedef struct etcd_pb_watch {
    int64_t revision, watch_id, compact_revision;
    bool created, canceled;
} etcd_pb_watch_t;
typedef struct etcd_pb_event {
    bool is_delete;
    const uint8_t *key, *value;
    size_t key_len, value_len;
    int64_t mod_revision, lease;
} etcd_pb_event_t;
typedef void (*etcd_pb_event_cb_t)(void *arg, const etcd_pb_event_t *ev);
/* gRPC framing (etcd_pb.c). Append message `msg` with gRPC's 5-byte prefix. */
void etcd_grpc_frame(etcd_buf_t *out, const etcd_buf_t *msg);
/* The next frame of untrusted gRPC bytes (*p, *left advance); false at
 * the end or on a bad prefix or length. */
bool etcd_grpc_next_frame(const uint8_t **p, size_t *left,
                          const uint8_t **msg, size_t *len);
void etcd_pb_watch_create(etcd_buf_t *out, const char *key, int64_t start,
                          int64_t watch_id);
/* A WatchCancelRequest frame for watch_id (a key leaving the stream). */
void etcd_pb_watch_cancel(etcd_buf_t *out, int64_t watch_id);
int etcd_pb_watch_resp(const uint8_t *p, size_t n, etcd_pb_watch_t *w,
                       etcd_pb_event_cb_t cb, void *arg);
/* RangeRequest of one key; RangeResponse: header revision and the first
 * KeyValue (pointing into p). 1 found, 0 none, -1 malformed. */
void etcd_pb_range_req(etcd_buf_t *out, const char *key);
int etcd_pb_range_resp(const uint8_t *p, size_t n, int64_t *rev_p,
                       etcd_pb_event_t *kv);
/* LeaseKeepAliveRequest of lease `id`; LeaseKeepAliveResponse: header
 * revision, ID and TTL (0 when not found). 0, or -1 malformed. */
void etcd_pb_lease_ka_req(etcd_buf_t *out, int64_t id);
int etcd_pb_lease_ka_resp(const uint8_t *p, size_t n, int64_t *rev_p,
                          int64_t *id_p, int64_t *ttl_p);


/* ---- etcd_http.c: point reads ---- */

/* A key as one point read found it. */
typedef struct etcd_kv_read {
    int64_t rev;     /* the store's revision when read */
    bool present;
    void *value;     /* malloc'd, NUL-terminated; NULL when absent */
    size_t len;
    int64_t mod_rev, lease;
} etcd_kv_read_t;
/* Read full key `full` (linearizable): gRPC on the client's h2c
 * connections where the endpoint is plain http and there is no user,
 * else the JSON gateway with handle h (NULL: one from the pool).
 * Reachability bookkeeping and fail-fast as etcd_call (force: no
 * fail-fast). PDX_OK with o filled (absent or present), or an error.
 * Blocking, at most the store timeout. */
pdx_status_t etcd_read_key(etcd_store_t *s, CURL *h, const char *full,
                           bool force, etcd_kv_read_t *o);
void etcd_kv_read_free(etcd_kv_read_t *o);
/* A gRPC status code as a pdx status. */
pdx_status_t etcd_grpc_status(int code);

/* ---- etcd_h2.c: unary gRPC over persistent h2c connections ---- */

/* Whether `endpoint` can be reached this way (plain http://host:port). */
bool etcd_h2_usable(const char *endpoint);
/* Call `path` with protobuf message `msg` on a pooled connection of
 * client cl to `endpoint` (opened when none; blocking until `deadline`,
 * CLOCK_MONOTONIC ns). PDX_OK: the call ended; *grpc_p is its grpc-status,
 * and with 0 the response message is appended to `out`. Otherwise the
 * connection is closed and `err` says why (PDX_ERR_TIMEOUT, PDX_ERR_IO,
 * PDX_ERR_CORRUPT for a malformed response). Any thread; a connection
 * carries one call at a time. */
pdx_status_t etcd_h2_unary(etcd_client_t *cl, const char *endpoint,
                           const char *path, const etcd_buf_t *msg,
                           uint64_t deadline, etcd_buf_t *out, int *grpc_p,
                           char *err, size_t elen);
/* The same for a call whose request is several messages (a client
 * stream, ended after them): `frames` are gRPC-framed (etcd_grpc_frame)
 * and the response's frames come back raw in `raw`
 * (etcd_grpc_next_frame). */
pdx_status_t etcd_h2_stream(etcd_client_t *cl, const char *endpoint,
                            const char *path, const etcd_buf_t *frames,
                            uint64_t deadline, etcd_buf_t *raw, int *grpc_p,
                            char *err, size_t elen);
void etcd_h2_close(etcd_h2_t *c);
/* Close the idle connections (client teardown). */
void etcd_h2_pool_free(etcd_client_t *cl);

/* ---- the instance's parts (etcd_store.c and the files below it) ----
 * Calls point down: store (glue: create/destroy, keys) above client (the
 * thread), above lease and watch; watch above keywatch; those above
 * events, above common. Below them all: http above auth above codec, and
 * pb above codec. The owners registry sits beside the client, under the
 * ops table. (scripts/check_calls.py checks that no file loops back.) */

#define DEFAULT_TIMEOUT_MS 2000
#define DEFAULT_RETRY_MIN_MS 100
#define DEFAULT_RETRY_MAX_MS 5000
#define DEFAULT_TXN_OPS 128
#define LIST_PAGE 512    /* keys a listing request */
#define LEASE_BATCH 64   /* renewals in one keepalive request */
#define MUX_CREATE_WAIT_MS 5000 /* every key acknowledged by then */
#define MUX_MSG_MAX (64u << 20) /* largest WatchResponse taken */
#define IDLE_WAIT_MS 600000 /* an idle client thread sleeps at most this */

/* ---- etcd_common.c ---- */

bool etcd_valid_key(const char *k);
bool etcd_valid_block(const char *b);
bool etcd_valid_owner(const char *o);
void etcd_wake(etcd_store_t *s);
uint32_t etcd_backoff_next(etcd_store_t *s, uint32_t cur);
uint64_t etcd_backoff_ns(uint32_t ms);
void etcd_lease_kick(etcd_client_t *c);
void etcd_fill_status_locked(etcd_store_t *s, pdx_store_status_t *o);

/* ---- etcd_events.c ---- */

void etcd_queue_event(etcd_store_t *s, uint64_t watch_id,
                      pdx_store_event_type_t type, uint32_t flags,
                      const char *key, const void *value, size_t vlen,
                      int64_t rev, int64_t lease);
etcd_watch_t *etcd_find_watch_locked(etcd_store_t *s, uint64_t id);
void etcd_deliver(etcd_store_t *s);

/* ---- etcd_keywatch.c ---- */

void etcd_mux_close(etcd_client_t *c);
void etcd_mux_retry_later(etcd_client_t *c, etcd_store_t *s);
void etcd_kw_free(etcd_kw_t *kw);
void etcd_kw_unsub(etcd_client_t *c, etcd_watch_t *w);
void etcd_kw_sub(etcd_client_t *c, etcd_watch_t *w);
void etcd_mux_step(etcd_client_t *c, uint64_t now);
void etcd_mux_drain(etcd_client_t *c);
bool etcd_mux_pending_reads(etcd_client_t *c);
/* A subscriber of kw waits for a read of the key. */
bool etcd_kw_resyncing(const etcd_kw_t *kw);

/* ---- etcd_watch.c ---- */

void etcd_stream_drain(etcd_watch_t *w);
void etcd_stream_close(etcd_client_t *c, etcd_watch_t *w);
void etcd_stream_retry_later(etcd_store_t *s, etcd_watch_t *w);
etcd_watch_t *etcd_watch_head(etcd_store_t *s);
void etcd_watch_free(etcd_watch_t *w);
void etcd_watches_step(etcd_store_t *s, uint64_t now);
pdx_status_t etcd_watch(void *st, const char *prefix,
                        int64_t start_revision, uint32_t flags,
                        uint64_t *id_p);
pdx_status_t etcd_unwatch(void *st, uint64_t id);

/* ---- etcd_lease.c ---- */

void etcd_lease_grant(etcd_store_t *s, CURL *h);
void etcd_lease_keepalive_batch(etcd_client_t *c, etcd_store_t **ms,
                                const int64_t *ids, size_t n);
pdx_status_t etcd_put_raw(etcd_store_t *s, CURL *h, const char *key,
                          const void *value, size_t len, int64_t lease,
                          bool force);
void etcd_republish_step(etcd_store_t *s, uint64_t now);

/* ---- etcd_client.c ---- */

pdx_status_t etcd_client_attach(etcd_store_t *s, const char *key);
void etcd_client_detach(etcd_store_t *s);
void etcd_client_release(etcd_client_t *c);

/* ---- etcd_owners.c ---- */

pdx_status_t etcd_owners_add(void *st, const char *owner,
                             const char *const *blocks, size_t n,
                             uint32_t *counts);
pdx_status_t etcd_owners_del(void *st, const char *owner,
                             const char *const *blocks, size_t n);
pdx_status_t etcd_owners_get(void *st, const char *const *blocks,
                             size_t n, pdx_store_owner_cb_t cb,
                             void *arg);

/* ---- etcd_store.c ---- */

pdx_status_t etcd_query(char *why, size_t why_len);
void etcd_counters(void *st, pdx_store_counters_t *c);
void etcd_status(void *st, pdx_store_status_t *o);
pdx_status_t etcd_create(const pdx_store_host_t *host,
                         const pdx_store_params_t *p, void **st_p);
void etcd_destroy(void *st);
pdx_status_t etcd_put(void *st, const char *key, const void *value,
                      size_t len, uint32_t flags);
pdx_status_t etcd_get(void *st, const char *key, void **value_p,
                      size_t *len_p, int64_t *rev_p);
pdx_status_t etcd_del(void *st, const char *key);

#endif
