/* etcd store module against a private etcd: keys, leases that expire when
 * their holder dies, watches that resume after an etcd restart without
 * losing or repeating an event (and resync after compaction), a lease lost
 * while the store was frozen and replaced with its keys published again,
 * batched owner registrations, and the unreachable state. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/store.h>

#include "etcd_int.h"
#include "etcd_fixture.h"
#include "pdx_clock.h"

extern const pdx_store_ops_t pdx_store_v1;
static const pdx_store_ops_t *ops = &pdx_store_v1;

/* ---- events recorded by a host ---- */

#define MAX_EV 256
typedef struct rec_ev {
    pdx_store_event_type_t type;
    uint32_t flags;
    char key[128];
    char value[64];
    int64_t rev;
    uint64_t id;
} rec_ev_t;

typedef struct recorder {
    pthread_mutex_t lock;
    rec_ev_t ev[MAX_EV];
    int n;
    int state_changes;
    bool last_reachable;
} recorder_t;

static void on_event(void *ctx, uint64_t id, const pdx_store_event_t *ev)
{
    recorder_t *r = ctx;
    pthread_mutex_lock(&r->lock);
    if (r->n < MAX_EV) {
        rec_ev_t *e = &r->ev[r->n++];
        e->type = ev->type;
        e->flags = ev->flags;
        snprintf(e->key, sizeof(e->key), "%s", ev->key);
        snprintf(e->value, sizeof(e->value), "%.*s",
                 (int)(ev->value_len < 63 ? ev->value_len : 63),
                 ev->value ? (const char *)ev->value : "");
        e->rev = ev->revision;
        e->id = id;
    }
    pthread_mutex_unlock(&r->lock);
}

static void on_state(void *ctx, const pdx_store_status_t *s)
{
    recorder_t *r = ctx;
    pthread_mutex_lock(&r->lock);
    r->state_changes++;
    r->last_reachable = s->reachable;
    pthread_mutex_unlock(&r->lock);
}

static int rec_count(recorder_t *r)
{
    pthread_mutex_lock(&r->lock);
    int n = r->n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* Index of the first event of `key` of `type` at or after `from`, or -1. */
static int rec_find(recorder_t *r, int from, pdx_store_event_type_t type,
                    const char *key)
{
    pthread_mutex_lock(&r->lock);
    int found = -1;
    for (int i = from; i < r->n && found < 0; i++) {
        if (r->ev[i].type == type && strcmp(r->ev[i].key, key) == 0) {
            found = i;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

static int rec_wait(recorder_t *r, int from, pdx_store_event_type_t type,
                    const char *key, int timeout_ms)
{
    uint64_t end = pdx_now_ms() + (uint64_t)timeout_ms;
    int i;
    while ((i = rec_find(r, from, type, key)) < 0 && pdx_now_ms() < end) {
        usleep(10000);
    }
    return i;
}

/* Index of the first event at or after `from` of watch `id` (0: any) on
 * `key` of `type` with `value` (NULL: any), waiting up to timeout_ms; -1. */
static int rec_wait_of(recorder_t *r, int from, uint64_t id,
                       pdx_store_event_type_t type, const char *key,
                       const char *value, int timeout_ms)
{
    uint64_t end = pdx_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int found = -1;
        pthread_mutex_lock(&r->lock);
        for (int i = from; i < r->n && found < 0; i++) {
            const rec_ev_t *e = &r->ev[i];
            if ((id == 0 || e->id == id) && e->type == type &&
                strcmp(e->key, key) == 0 &&
                (value == NULL || strcmp(e->value, value) == 0)) {
                found = i;
            }
        }
        pthread_mutex_unlock(&r->lock);
        if (found >= 0 || pdx_now_ms() >= end) {
            return found;
        }
        usleep(10000);
    }
}

typedef struct client {
    recorder_t rec;
    pdx_store_host_t host;
    void *st;
} client_t;

static void client_open(client_t *c, const char *name, const char *endpoints,
                        const char *ns, uint32_t ttl_ms, uint32_t retry_min,
                        uint32_t txn_ops)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->rec.lock, NULL);
    c->host = (pdx_store_host_t){.ctx = &c->rec, .agent_name = name,
                                 .watch_event = on_event,
                                 .state_change = on_state};
    pdx_store_params_t p = {.endpoints = endpoints, .ns = ns,
                            .lease_ttl_ms = ttl_ms, .timeout_ms = 1000,
                            .retry_min_ms = retry_min, .retry_max_ms = 1000,
                            .max_txn_ops = txn_ops};
    assert_int_equal(ops->create(&c->host, &p, &c->st), PDX_OK);
}

static void client_close(client_t *c)
{
    ops->destroy(c->st);
    pthread_mutex_destroy(&c->rec.lock);
}

static bool wait_lease(client_t *c, int timeout_ms)
{
    uint64_t end = pdx_now_ms() + (uint64_t)timeout_ms;
    pdx_store_status_t s;
    do {
        ops->status(c->st, &s);
        if (s.lease != 0 && s.unpublished == 0) {
            return true;
        }
        usleep(10000);
    } while (pdx_now_ms() < end);
    return false;
}

/* Compact the store's history up to the newest revision c has seen. */
static void compact_all(client_t *c)
{
    pdx_store_status_t s;
    ops->status(c->st, &s);
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    etcd_json_add_i64(req, "revision", s.revision);
    CURL *h = etcd_handle_get(c->st);
    assert_int_equal(etcd_call(c->st, h, "/v3/kv/compaction", req, &resp,
                               true, NULL, 0),
                     PDX_OK);
    etcd_handle_put(c->st, h);
    cJSON_Delete(req);
    cJSON_Delete(resp);
}

/* ---- tests ---- */

static void test_abi(void **state)
{
    (void)state;
    assert_int_equal(ops->abi_version, PDX_STORE_ABI_VERSION);
    assert_int_equal(ops->size, sizeof(pdx_store_ops_t));
    assert_true(ops->size >= PDX_STORE_OPS_MIN_SIZE);
    assert_string_equal(ops->name, "etcd");
    char why[64];
    assert_int_equal(ops->query(why, sizeof(why)), PDX_OK);
}

static void test_bad_params(void **state)
{
    (void)state;
    pdx_store_host_t host = {.agent_name = "t"};
    void *st = NULL;
    pdx_store_params_t p = {.endpoints = "127.0.0.1:2379", .ns = "pdx"};
    assert_int_equal(ops->create(&host, &p, &st), PDX_ERR_CONFIG);
    p.endpoints = "http://127.0.0.1:1";
    p.ns = "pdx/";
    assert_int_equal(ops->create(&host, &p, &st), PDX_ERR_CONFIG);
    p.ns = "p dx";
    assert_int_equal(ops->create(&host, &p, &st), PDX_ERR_CONFIG);
    pdx_option_t opt = {"bogus", "1"};
    p.ns = "pdx";
    p.opts = &opt;
    p.nopts = 1;
    assert_int_equal(ops->create(&host, &p, &st), PDX_ERR_CONFIG);
    assert_null(st);
}

static void test_b64_and_range_end(void **state)
{
    (void)state;
    const char *cases[] = {"", "a", "ab", "abc", "abcd", "\x01\xff\x80"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *e = etcd_b64_enc(cases[i], strlen(cases[i]));
        size_t n = 99;
        char *d = etcd_b64_dec(e, &n);
        assert_non_null(d);
        assert_int_equal(n, strlen(cases[i]));
        assert_memory_equal(d, cases[i], n);
        free(e);
        free(d);
    }
    size_t n;
    assert_null(etcd_b64_dec("abc", &n)); /* not a multiple of 4 */
    char *end = etcd_prefix_end_b64("pdx/agents/");
    size_t len;
    char *raw = etcd_b64_dec(end, &len);
    assert_string_equal(raw, "pdx/agents0");
    free(end);
    free(raw);
}

static void test_kv(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t c;
    client_open(&c, "kv", fx_etcd.url, "t-kv", 5000, 100, 128);
    assert_int_equal(ops->put(c.st, "a/x", "hello", 5, 0), PDX_OK);
    void *v = NULL;
    size_t len = 0;
    int64_t rev = 0;
    assert_int_equal(ops->get(c.st, "a/x", &v, &len, &rev), PDX_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(v, "hello", 5);
    assert_true(rev > 0);
    free(v);
    /* Binary values survive. */
    unsigned char bin[300];
    for (int i = 0; i < 300; i++) {
        bin[i] = (unsigned char)(i * 7);
    }
    assert_int_equal(ops->put(c.st, "a/bin", bin, sizeof(bin), 0), PDX_OK);
    assert_int_equal(ops->get(c.st, "a/bin", &v, &len, NULL), PDX_OK);
    assert_int_equal(len, sizeof(bin));
    assert_memory_equal(v, bin, sizeof(bin));
    free(v);
    assert_int_equal(ops->del(c.st, "a/x"), PDX_OK);
    assert_int_equal(ops->get(c.st, "a/x", &v, &len, NULL), PDX_ERR_NOT_FOUND);
    assert_int_equal(ops->put(c.st, "bad key", "x", 1, 0), PDX_ERR_INVALID);
    pdx_store_status_t s;
    ops->status(c.st, &s);
    assert_true(s.reachable);
    assert_int_equal(s.unreachable_since_ns, 0);
    client_close(&c);
}

/* Children are a fresh exec of this binary (argv[0] with a mode), never a
 * bare fork of this multithreaded process: a lock another thread held at
 * fork() (curl's, libc's, the store's) would hang the child forever. The
 * child reports one byte ('y' or 'n') on fd 3; the parent waits for it with a
 * bound and kills the child when it does not come. */
static const char *g_argv0;
#define OWN_N 300

static void owners_hex(char *hex[OWN_N])
{
    for (int i = 0; i < OWN_N; i++) {
        hex[i] = malloc(65);
        snprintf(hex[i], 65, "%064x", i * 2654435761u);
    }
}

static void child_report(char ok)
{
    if (write(3, &ok, 1) != 1) {
        _exit(3);
    }
    close(3);
    for (int i = 0; i < 600; i++) { /* until killed (bounded) */
        usleep(100000);
    }
    _exit(0);
}

/* mode "lease": hold a leased key; mode "owners": register OWN_N blocks. */
static int child_main(const char *mode, const char *url, const char *ns,
                      const char *key, uint32_t ttl_ms)
{
    pdx_store_host_t host = {.agent_name = key};
    pdx_store_params_t p = {.endpoints = url, .ns = ns,
                            .lease_ttl_ms = ttl_ms, .timeout_ms = 1000};
    void *st = NULL;
    if (ops->create(&host, &p, &st) != PDX_OK) {
        child_report('c');
    }
    pdx_store_status_t s;
    if (strcmp(mode, "lease") == 0) {
        pdx_status_t r = ops->put(st, key, "alive", 5, PDX_STORE_PUT_LEASED);
        uint64_t end = pdx_now_ms() + 10000;
        do {
            ops->status(st, &s);
            usleep(10000);
        } while ((s.lease == 0 || s.unpublished) && pdx_now_ms() < end);
        child_report((r == PDX_OK || r == PDX_INPROGRESS) && !s.unpublished
                         ? 'y' : 'n');
    }
    for (int i = 0; i < 500; i++) {
        ops->status(st, &s);
        if (s.lease) {
            break;
        }
        usleep(10000);
    }
    char *hex[OWN_N];
    owners_hex(hex);
    uint32_t cc[OWN_N];
    child_report(ops->owners_add(st, key, (const char *const *)hex, OWN_N,
                                 cc) == PDX_OK &&
                         cc[0] == 3 && cc[OWN_N - 1] == 3
                     ? 'y' : 'n');
    return 0;
}

/* Starts a child; returns its pid once it reported, or fails the test
 * (after killing and reaping it) when the report is not 'y' within
 * timeout_ms. */
static pid_t spawn_child(const char *mode, const char *ns, const char *key,
                         uint32_t ttl_ms, int timeout_ms)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        if (dup2(pfd[1], 3) != 3) {
            _exit(4);
        }
        execl(g_argv0, g_argv0, "--child", mode, fx_etcd.url, ns, key, ttl,
              (char *)NULL);
        _exit(5);
    }
    close(pfd[1]);
    char ok = 0;
    struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
    int r;
    do {
        r = poll(&pf, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    ssize_t n = r == 1 ? read(pfd[0], &ok, 1) : 0;
    close(pfd[0]);
    if (n != 1 || ok != 'y') {
        kill(pid, SIGKILL);
        int ws = 0;
        waitpid(pid, &ws, 0);
        print_error("child %s/%s: %s (report '%c', exit status %d)\n", mode,
                    key, r == 0 ? "no report within the bound" : "failed",
                    n == 1 ? ok : '-', WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        fail();
    }
    return pid;
}

static void test_lease_expiry(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t w;
    client_open(&w, "watcher", fx_etcd.url, "t-lease", 5000, 100, 128);
    uint64_t id = 0;
    assert_int_equal(ops->watch(w.st, "agents/", 0, PDX_STORE_WATCH_INITIAL,
                                &id),
                     PDX_OK);
    pid_t pid = spawn_child("lease", "t-lease", "agents/p0", 2000, 20000);
    assert_true(rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "agents/p0", 5000) >= 0);
    uint64_t t0 = pdx_now_ms();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int i = rec_wait(&w.rec, 0, PDX_STORE_EV_DELETE, "agents/p0", 8000);
    uint64_t dt = pdx_now_ms() - t0;
    print_message("lease expiry: key of a killed holder (TTL 2 s) deleted "
                  "after %llu ms\n", (unsigned long long)dt);
    assert_true(i >= 0);
    assert_true(dt <= 2000 + 1500); /* TTL + etcd's expiry check + watch */
    /* A clean destroy revokes: the key goes at once. */
    client_t a;
    client_open(&a, "a", fx_etcd.url, "t-lease", 5000, 100, 128);
    assert_true(ops->put(a.st, "agents/a", "x", 1, PDX_STORE_PUT_LEASED) >= 0);
    assert_true(wait_lease(&a, 5000));
    int from = rec_count(&w.rec);
    t0 = pdx_now_ms();
    client_close(&a);
    assert_true(rec_wait(&w.rec, from, PDX_STORE_EV_DELETE, "agents/a", 3000) >=
                0);
    print_message("revoked at destroy: deleted after %llu ms\n",
                  (unsigned long long)(pdx_now_ms() - t0));
    assert_int_equal(ops->unwatch(w.st, id), PDX_OK);
    assert_int_equal(ops->unwatch(w.st, id), PDX_ERR_NOT_FOUND);
    client_close(&w);
}

static void test_watch_resume_after_restart(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t w, pub;
    client_open(&w, "watcher", fx_etcd.url, "t-resume", 5000, 300, 128);
    client_open(&pub, "pub", fx_etcd.url, "t-resume", 3000, 100, 128);
    uint64_t id;
    assert_int_equal(ops->put(pub.st, "k/1", "v1", 2, 0), PDX_OK);
    assert_int_equal(ops->watch(w.st, "k/", 0, PDX_STORE_WATCH_INITIAL, &id),
                     PDX_OK);
    assert_true(rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "k/1", 5000) >= 0);
    /* A leased key of a live client must survive the restart. */
    assert_true(ops->put(pub.st, "k/leased", "L", 1, PDX_STORE_PUT_LEASED) >=
                0);
    assert_true(wait_lease(&pub, 5000));
    assert_true(rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "k/leased", 5000) >= 0);
    /* A point read leaves a connection in the process's pool (gRPC on
     * h2c): the read while etcd is down must fail fast on it, the read
     * after the restart must get through on a new one. */
    void *v;
    size_t len;
    assert_int_equal(ops->get(pub.st, "k/1", &v, &len, NULL), PDX_OK);
    free(v);

    etcd_kill(&fx_etcd, SIGKILL);
    /* Both clients notice; status says since when. */
    uint64_t end = pdx_now_ms() + 5000;
    pdx_store_status_t s;
    do {
        usleep(20000);
        ops->status(w.st, &s);
    } while (s.reachable && pdx_now_ms() < end);
    assert_false(s.reachable);
    assert_true(s.unreachable_since_ns > 0);
    assert_true(strlen(s.last_error) > 0);
    print_message("while down: %s\n", s.last_error);
    /* Leased put while down: remembered, published when etcd is back. */
    assert_int_equal(ops->put(pub.st, "k/late", "late", 4,
                              PDX_STORE_PUT_LEASED),
                     PDX_INPROGRESS);
    uint64_t t0 = pdx_now_ms();
    assert_int_equal(ops->get(w.st, "k/1", &v, &len, NULL),
                     PDX_ERR_UNAVAILABLE);
    assert_true(pdx_now_ms() - t0 < 1500);

    char err[256];
    assert_int_equal(etcd_restart(&fx_etcd, err, sizeof(err)), 0);
    /* Changes made before the watcher reconnects must all be reported. */
    client_t other;
    client_open(&other, "other", fx_etcd.url, "t-resume", 5000, 100, 128);
    assert_int_equal(ops->put(other.st, "k/2", "v2", 2, 0), PDX_OK);
    assert_int_equal(ops->del(other.st, "k/1"), PDX_OK);
    assert_int_equal(ops->put(other.st, "k/3", "v3", 2, 0), PDX_OK);
    assert_int_equal(ops->put(other.st, "k/2", "v2b", 3, 0), PDX_OK);
    int i2 = rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "k/2", 10000);
    int d1 = rec_wait(&w.rec, 0, PDX_STORE_EV_DELETE, "k/1", 10000);
    int i3 = rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "k/3", 10000);
    int i2b = i2 >= 0 ? rec_wait(&w.rec, i2 + 1, PDX_STORE_EV_PUT, "k/2", 10000)
                      : -1;
    int il = rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "k/late", 10000);
    assert_true(i2 >= 0 && d1 > i2 && i3 > d1 && i2b > i3);
    assert_true(il >= 0);
    assert_int_equal(ops->get(pub.st, "k/3", &v, &len, NULL), PDX_OK);
    assert_true(len == 2 && memcmp(v, "v3", 2) == 0);
    free(v);
    /* In revision order, each once. */
    pthread_mutex_lock(&w.rec.lock);
    for (int i = 1; i < w.rec.n; i++) {
        assert_true(w.rec.ev[i].rev >= w.rec.ev[i - 1].rev);
        if (w.rec.ev[i].rev == w.rec.ev[i - 1].rev) {
            assert_true(strcmp(w.rec.ev[i].key, w.rec.ev[i - 1].key) != 0);
        }
    }
    assert_string_equal(w.rec.ev[i2b].value, "v2b");
    pthread_mutex_unlock(&w.rec.lock);
    /* The leased key of the live client is still there. */
    assert_int_equal(ops->get(other.st, "k/leased", &v, &len, NULL), PDX_OK);
    free(v);
    ops->status(w.st, &s);
    assert_true(s.reachable);
    assert_int_equal(s.watches, 1);
    client_close(&other);
    client_close(&pub);
    client_close(&w);
}

static void test_watch_resync_after_compaction(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t c, w;
    client_open(&c, "c", fx_etcd.url, "t-compact", 5000, 100, 128);
    assert_int_equal(ops->put(c.st, "x/a", "1", 1, 0), PDX_OK);
    void *v;
    size_t len;
    int64_t rev_a;
    assert_int_equal(ops->get(c.st, "x/a", &v, &len, &rev_a), PDX_OK);
    free(v);
    assert_int_equal(ops->put(c.st, "x/b", "2", 1, 0), PDX_OK);
    assert_int_equal(ops->del(c.st, "x/a"), PDX_OK);
    assert_int_equal(ops->put(c.st, "x/c", "3", 1, 0), PDX_OK);
    compact_all(&c); /* a raw request */
    /* A watch from before the compaction lists the prefix instead. */
    client_open(&w, "w", fx_etcd.url, "t-compact", 5000, 100, 128);
    uint64_t id;
    assert_int_equal(ops->watch(w.st, "x/", rev_a, 0, &id), PDX_OK);
    int ib = rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "x/b", 5000);
    int ic = rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "x/c", 5000);
    assert_true(ib >= 0 && ic >= 0);
    pthread_mutex_lock(&w.rec.lock);
    assert_true(w.rec.ev[ib].flags & PDX_STORE_EVF_RESYNC);
    pthread_mutex_unlock(&w.rec.lock);
    assert_true(rec_find(&w.rec, 0, PDX_STORE_EV_PUT, "x/a") < 0);
    /* Then live events. */
    int from = rec_count(&w.rec);
    assert_int_equal(ops->put(c.st, "x/d", "4", 1, 0), PDX_OK);
    int id_ = rec_wait(&w.rec, from, PDX_STORE_EV_PUT, "x/d", 5000);
    assert_true(id_ >= 0);
    pthread_mutex_lock(&w.rec.lock);
    assert_false(w.rec.ev[id_].flags & PDX_STORE_EVF_RESYNC);
    pthread_mutex_unlock(&w.rec.lock);
    client_close(&w);
    client_close(&c);
}

/* Key watches share one stream that keys join and leave while it stays
 * open: history from a start revision, a second watch of a key wanting
 * older history than the stream is at, a key leaving (nothing of it
 * reported after unwatch), deletes; and the stream opened once. */
static void test_key_watch_stream(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t c, w;
    client_open(&c, "c", fx_etcd.url, "t-keys", 5000, 100, 128);
    client_open(&w, "w", fx_etcd.url, "t-keys", 5000, 100, 128);
    void *v;
    size_t len;
    int64_t rev_a1, rev_b1;
    assert_int_equal(ops->put(c.st, "k/a", "a1", 2, 0), PDX_OK);
    assert_int_equal(ops->get(c.st, "k/a", &v, &len, &rev_a1), PDX_OK);
    free(v);
    uint64_t ia, ib, ib2;
    assert_int_equal(ops->watch(w.st, "k/a", rev_a1, PDX_STORE_WATCH_KEY,
                                &ia),
                     PDX_OK);
    assert_true(rec_wait_of(&w.rec, 0, ia, PDX_STORE_EV_PUT, "k/a", "a1",
                            5000) >= 0);
    /* A second key joins the open stream, from its first revision. */
    assert_int_equal(ops->put(c.st, "k/b", "b1", 2, 0), PDX_OK);
    assert_int_equal(ops->get(c.st, "k/b", &v, &len, &rev_b1), PDX_OK);
    free(v);
    assert_int_equal(ops->watch(w.st, "k/b", rev_b1, PDX_STORE_WATCH_KEY,
                                &ib),
                     PDX_OK);
    assert_true(rec_wait_of(&w.rec, 0, ib, PDX_STORE_EV_PUT, "k/b", "b1",
                            5000) >= 0);
    assert_int_equal(ops->put(c.st, "k/b", "b2", 2, 0), PDX_OK);
    int at_b2 = rec_wait_of(&w.rec, 0, ib, PDX_STORE_EV_PUT, "k/b", "b2",
                            5000);
    assert_true(at_b2 >= 0);
    /* Another watch of k/b from before the stream's position: both of its
     * events come again for it, and none twice for the first. */
    assert_int_equal(ops->watch(w.st, "k/b", rev_b1, PDX_STORE_WATCH_KEY,
                                &ib2),
                     PDX_OK);
    int h1 = rec_wait_of(&w.rec, 0, ib2, PDX_STORE_EV_PUT, "k/b", "b1", 5000);
    int h2 = rec_wait_of(&w.rec, 0, ib2, PDX_STORE_EV_PUT, "k/b", "b2", 5000);
    assert_true(h1 >= 0 && h2 > h1);
    /* k/a leaves; k/b's next put reaches both of its watches. */
    assert_int_equal(ops->unwatch(w.st, ia), PDX_OK);
    int from = rec_count(&w.rec);
    assert_int_equal(ops->put(c.st, "k/a", "a2", 2, 0), PDX_OK);
    assert_int_equal(ops->put(c.st, "k/b", "b3", 2, 0), PDX_OK);
    assert_true(rec_wait_of(&w.rec, from, ib, PDX_STORE_EV_PUT, "k/b", "b3",
                            5000) >= 0);
    assert_true(rec_wait_of(&w.rec, from, ib2, PDX_STORE_EV_PUT, "k/b", "b3",
                            5000) >= 0);
    assert_int_equal(ops->del(c.st, "k/b"), PDX_OK);
    assert_true(rec_wait_of(&w.rec, from, ib, PDX_STORE_EV_DELETE, "k/b",
                            NULL, 5000) >= 0);
    assert_true(rec_wait_of(&w.rec, from, ib2, PDX_STORE_EV_DELETE, "k/b",
                            NULL, 5000) >= 0);
    assert_true(rec_wait_of(&w.rec, 0, 0, PDX_STORE_EV_PUT, "k/a", "a2", 0) <
                0);
    /* Each event of k/b once per watch. */
    pthread_mutex_lock(&w.rec.lock);
    int nb = 0, nb2 = 0;
    for (int i = 0; i < w.rec.n; i++) {
        nb += w.rec.ev[i].id == ib;
        nb2 += w.rec.ev[i].id == ib2;
    }
    pthread_mutex_unlock(&w.rec.lock);
    assert_int_equal(nb, 4);  /* b1 b2 b3 delete */
    assert_int_equal(nb2, 4);
    /* A watch from now and, right after, one from history on a new key:
     * the second gets the history (usually both reach the client thread
     * before the key's create is sent; kw_behind covers the other order,
     * which this cannot force). */
    int64_t rev_c1;
    assert_int_equal(ops->put(c.st, "k/c", "c1", 2, 0), PDX_OK);
    assert_int_equal(ops->get(c.st, "k/c", &v, &len, &rev_c1), PDX_OK);
    free(v);
    assert_int_equal(ops->put(c.st, "k/c", "c2", 2, 0), PDX_OK);
    uint64_t ic, ic2;
    assert_int_equal(ops->watch(w.st, "k/c", 0, PDX_STORE_WATCH_KEY, &ic),
                     PDX_OK);
    assert_int_equal(ops->watch(w.st, "k/c", rev_c1, PDX_STORE_WATCH_KEY,
                                &ic2),
                     PDX_OK);
    assert_true(rec_wait_of(&w.rec, 0, ic2, PDX_STORE_EV_PUT, "k/c", "c1",
                            5000) >= 0);
    assert_true(rec_wait_of(&w.rec, 0, ic2, PDX_STORE_EV_PUT, "k/c", "c2",
                            5000) >= 0);
    pdx_store_counters_t k = {.size = sizeof(k)};
    ops->counters(w.st, &k);
    print_message("key-watch stream opened %llu time(s)\n",
                  (unsigned long long)k.key_stream_opens);
    assert_int_equal(k.key_stream_opens, 1);
    client_close(&w);
    client_close(&c);
}

/* A key watch from a compacted revision, on a stream already open: the
 * key is read instead (a RESYNC event), then live events follow. */
static void test_key_watch_compacted(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t c, w;
    client_open(&c, "c", fx_etcd.url, "t-kcomp", 5000, 100, 128);
    client_open(&w, "w", fx_etcd.url, "t-kcomp", 5000, 100, 128);
    void *v;
    size_t len;
    int64_t rev1;
    assert_int_equal(ops->put(c.st, "k/y", "y1", 2, 0), PDX_OK);
    uint64_t iy, ix;
    assert_int_equal(ops->watch(w.st, "k/y", 0, PDX_STORE_WATCH_KEY, &iy),
                     PDX_OK); /* opens the stream */
    assert_int_equal(ops->put(c.st, "k/x", "x1", 2, 0), PDX_OK);
    assert_int_equal(ops->get(c.st, "k/x", &v, &len, &rev1), PDX_OK);
    free(v);
    assert_int_equal(ops->put(c.st, "k/x", "x2", 2, 0), PDX_OK);
    compact_all(&c);
    assert_int_equal(ops->watch(w.st, "k/x", rev1, PDX_STORE_WATCH_KEY, &ix),
                     PDX_OK);
    int r = rec_wait_of(&w.rec, 0, ix, PDX_STORE_EV_PUT, "k/x", "x2", 5000);
    assert_true(r >= 0);
    pthread_mutex_lock(&w.rec.lock);
    assert_true(w.rec.ev[r].flags & PDX_STORE_EVF_RESYNC);
    pthread_mutex_unlock(&w.rec.lock);
    assert_int_equal(ops->put(c.st, "k/x", "x3", 2, 0), PDX_OK);
    assert_int_equal(ops->put(c.st, "k/y", "y2", 2, 0), PDX_OK);
    assert_true(rec_wait_of(&w.rec, r, ix, PDX_STORE_EV_PUT, "k/x", "x3",
                            5000) >= 0);
    assert_true(rec_wait_of(&w.rec, 0, iy, PDX_STORE_EV_PUT, "k/y", "y2",
                            5000) >= 0);
    assert_true(rec_wait_of(&w.rec, 0, ix, PDX_STORE_EV_PUT, "k/x", "x1", 0) <
                0);
    client_close(&w);
    client_close(&c);
}

/* etcd frozen (SIGSTOP) longer than the TTL: requests time out (no RST,
 * like a partition), the lease expires when it wakes, and the client gets
 * a new one and publishes its keys again. */
static void test_lease_lost_and_replaced(void **state)
{
    (void)state;
    NEED_ETCD();
    client_t c, w;
    client_open(&c, "c", fx_etcd.url, "t-lost", 2000, 100, 128);
    client_open(&w, "w", fx_etcd.url, "t-lost", 30000, 100, 128);
    assert_true(ops->put(c.st, "agents/c", "blob1", 5, PDX_STORE_PUT_LEASED) >=
                0);
    assert_true(wait_lease(&c, 5000));
    pdx_store_status_t s0;
    ops->status(c.st, &s0);
    assert_int_equal(s0.leases_granted, 1);
    uint64_t id;
    assert_int_equal(ops->watch(w.st, "agents/", 0, PDX_STORE_WATCH_INITIAL,
                                &id),
                     PDX_OK);
    assert_true(rec_wait(&w.rec, 0, PDX_STORE_EV_PUT, "agents/c", 5000) >= 0);
    kill(fx_etcd.pid, SIGSTOP);
    sleep(4);
    pdx_store_status_t s;
    ops->status(c.st, &s);
    assert_false(s.reachable);
    print_message("frozen: %s\n", s.last_error);
    kill(fx_etcd.pid, SIGCONT);
    /* The old lease expired while frozen (etcd checks on wake), so the key
     * is deleted, then published again under a new lease. */
    int d = rec_wait(&w.rec, 0, PDX_STORE_EV_DELETE, "agents/c", 10000);
    int p = d >= 0 ? rec_wait(&w.rec, d, PDX_STORE_EV_PUT, "agents/c", 10000)
                   : -1;
    uint64_t end = pdx_now_ms() + 10000;
    do {
        usleep(20000);
        ops->status(c.st, &s);
    } while ((s.leases_granted < 2 || s.unpublished) && pdx_now_ms() < end);
    print_message("lease lost: delete event %d, republished %d, leases %llu\n",
                  d, p, (unsigned long long)s.leases_granted);
    if (d < 0) {
        /* etcd renews every lease when it regains leadership after a
         * stall; then the old lease simply lives on. */
        assert_int_equal(s.lease, s0.lease);
    } else {
        assert_true(p > d);
        assert_true(s.leases_granted >= 2);
        assert_true(s.lease != s0.lease);
    }
    assert_true(s.reachable);
    assert_int_equal(s.unpublished, 0);
    client_close(&w);
    client_close(&c);
}

typedef struct owners_acc {
    uint32_t *n;
    char (*first)[64];
} owners_acc_t;

static void on_owner(void *arg, size_t i, const char *owner)
{
    owners_acc_t *a = arg;
    if (a->n[i] == 0) {
        snprintf(a->first[i], 64, "%s", owner);
    }
    a->n[i]++;
}

static void test_owners_batched(void **state)
{
    (void)state;
    NEED_ETCD();
    enum { N = OWN_N };
    char *hex[N];
    owners_hex(hex);
    client_t a, b;
    client_open(&a, "own-a", fx_etcd.url, "t-own", 5000, 100, 128);
    client_open(&b, "own-b", fx_etcd.url, "t-own", 5000, 100, 128);
    assert_true(wait_lease(&a, 5000) && wait_lease(&b, 5000));
    uint32_t counts[N];
    pdx_store_status_t s0, s1;
    ops->status(a.st, &s0);
    assert_int_equal(ops->owners_add(a.st, "own-a", (const char *const *)hex,
                                     N, counts),
                     PDX_OK);
    ops->status(a.st, &s1);
    for (int i = 0; i < N; i++) {
        assert_int_equal(counts[i], 1);
    }
    /* One transaction per 64 blocks (128 ops: put + count each). */
    assert_int_equal(s1.requests - s0.requests, (N + 63) / 64);
    assert_int_equal(ops->owners_add(b.st, "own-b", (const char *const *)hex,
                                     N, counts),
                     PDX_OK);
    assert_int_equal(counts[0], 2);
    assert_int_equal(counts[N - 1], 2);
    /* A third owner in a child, killed later: its entries vanish. */
    pid_t pid = spawn_child("owners", "t-own", "own-c", 2000, 30000);
    uint32_t n[N];
    char first[N][64];
    owners_acc_t acc = {n, first};
    memset(n, 0, sizeof(n));
    assert_int_equal(ops->owners_get(a.st, (const char *const *)hex, N,
                                     on_owner, &acc),
                     PDX_OK);
    for (int i = 0; i < N; i++) {
        if (n[i] != 3) {
            kill(pid, SIGKILL);
        }
        assert_int_equal(n[i], 3);
    }
    assert_string_equal(first[0], "own-a");
    uint64_t t0 = pdx_now_ms();
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    do {
        usleep(50000);
        memset(n, 0, sizeof(n));
        assert_int_equal(ops->owners_get(a.st, (const char *const *)hex, N,
                                         on_owner, &acc),
                         PDX_OK);
    } while (n[0] > 2 && pdx_now_ms() - t0 < 8000);
    print_message("owner killed: its entries gone after %llu ms\n",
                  (unsigned long long)(pdx_now_ms() - t0));
    for (int i = 0; i < N; i++) {
        assert_int_equal(n[i], 2);
    }
    /* Unregistering b leaves a alone. */
    assert_int_equal(ops->owners_del(b.st, "own-b", (const char *const *)hex,
                                     N),
                     PDX_OK);
    memset(n, 0, sizeof(n));
    assert_int_equal(ops->owners_get(a.st, (const char *const *)hex, N,
                                     on_owner, &acc),
                     PDX_OK);
    assert_int_equal(n[7], 1);
    assert_string_equal(first[7], "own-a");
    const char *bad[] = {"XYZ"};
    assert_int_equal(ops->owners_add(a.st, "own-a", bad, 1, counts),
                     PDX_ERR_INVALID);
    client_close(&b);
    client_close(&a);
    for (int i = 0; i < N; i++) {
        free(hex[i]);
    }
}

static void test_unreachable_from_start(void **state)
{
    (void)state;
    /* A port nobody listens on: create succeeds, status says why. */
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", 1);
    client_t c;
    client_open(&c, "lonely", url, "t-none", 2000, 100, 128);
    assert_int_equal(ops->put(c.st, "agents/x", "b", 1, PDX_STORE_PUT_LEASED),
                     PDX_INPROGRESS);
    uint64_t end = pdx_now_ms() + 3000;
    pdx_store_status_t s;
    do {
        usleep(20000);
        ops->status(c.st, &s);
    } while (s.unreachable_since_ns == 0 && pdx_now_ms() < end);
    assert_false(s.reachable);
    assert_true(s.unreachable_since_ns > 0);
    assert_int_equal(s.lease, 0);
    assert_int_equal(s.leased_keys, 1);
    assert_int_equal(s.unpublished, 1);
    assert_non_null(strstr(s.last_error, "127.0.0.1:1"));
    void *v;
    size_t len;
    uint64_t t0 = pdx_now_ms();
    for (int i = 0; i < 20; i++) { /* fail fast: no timeout each */
        assert_int_equal(ops->get(c.st, "agents/x", &v, &len, NULL),
                         PDX_ERR_UNAVAILABLE);
    }
    assert_true(pdx_now_ms() - t0 < 2000);
    const char *blk[] = {"ab"};
    assert_int_equal(ops->owners_add(c.st, "lonely", blk, 1, NULL),
                     PDX_ERR_UNAVAILABLE);
    int changes;
    pthread_mutex_lock(&c.rec.lock);
    changes = c.rec.state_changes;
    pthread_mutex_unlock(&c.rec.lock);
    assert_true(changes >= 1);
    client_close(&c);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    g_argv0 = argv[0];
    if (argc == 7 && strcmp(argv[1], "--child") == 0) {
        return child_main(argv[2], argv[3], argv[4], argv[5],
                          (uint32_t)strtoul(argv[6], NULL, 10));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abi),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_b64_and_range_end),
        cmocka_unit_test(test_unreachable_from_start),
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_owners_batched),
        cmocka_unit_test(test_watch_resync_after_compaction),
        cmocka_unit_test(test_key_watch_stream),
        cmocka_unit_test(test_key_watch_compacted),
        cmocka_unit_test(test_watch_resume_after_restart),
        cmocka_unit_test(test_lease_lost_and_replaced),
    };
    return cmocka_run_group_tests(tests, fx_etcd_setup, fx_etcd_teardown);
}
