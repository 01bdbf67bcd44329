/* test_backend_ucx's run options, patterns and fake agent: the host an
 * instance reports notifications and peer errors to, and what it checks
 * when a transfer's notification arrives (ucx_test.h). */
#include "mix.h"
#include "ucx_test.h"

const pdx_backend_ops_t *ops = &pdx_backend_v1;

const char *g_tls = "posix,cma,sysv,self";
int g_quick;
char g_self[4096];

/* ---- patterns --------------------------------------------------------- */

/* Word at offset `off` (a multiple of 8) of the region with `seed`. */
static uint64_t pattern_word(uint64_t seed, uint64_t off)
{
    return splitmix64(seed * 0x100000001b3ull ^ off);
}

void fill_pattern(uint8_t *base, uint64_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)(void *)base;
    for (uint64_t i = 0; i < len / 8; i++) {
        w[i] = pattern_word(seed, i * 8);
    }
}

/* Does [dst, +len) hold the source pattern starting at src_off? */
int check_pattern(const uint8_t *dst, uint64_t len, uint64_t seed,
                  uint64_t src_off)
{
    const uint64_t *w = (const uint64_t *)(const void *)dst;
    for (uint64_t i = 0; i < len / 8; i++) {
        if (w[i] != pattern_word(seed, src_off + i * 8)) {
            return 0;
        }
    }
    return 1;
}

/* ---- fake agent ------------------------------------------------------- */

int verify_expect(const expect_t *e)
{
    for (size_t i = 0; i < e->ncheck; i++) {
        const pdx_backend_iov_t *v = &e->iov[i];
        const uint8_t *dst;
        uint64_t src_off;
        if (e->op == PDX_XFER_WRITE) {
            dst = e->src_base_remote +
                  (v->remote_addr - (uint64_t)(uintptr_t)e->src_base_remote);
            src_off = v->local_addr - (uint64_t)(uintptr_t)e->src_base_local;
        } else {
            dst = e->src_base_local +
                  (v->local_addr - (uint64_t)(uintptr_t)e->src_base_local);
            src_off = v->remote_addr - (uint64_t)(uintptr_t)e->src_base_remote;
        }
        if (!check_pattern(dst, v->len, e->src_seed, src_off)) {
            fprintf(stderr, "piece %zu of %zu (%" PRIu64 " bytes) differs\n", i,
                    e->n, v->len);
            return 0;
        }
    }
    return 1;
}

static void host_notif_recv(void *ctx, const char *peer, const void *msg,
                            size_t len)
{
    fake_host_t *h = ctx;
    h->notifs++;
    snprintf(h->last_peer, sizeof(h->last_peer), "%s", peer);
    unsigned id = 0;
    char text[64] = "";
    memcpy(text, msg, len < sizeof(text) - 1 ? len : sizeof(text) - 1);
    if (sscanf(text, "xfer %u", &id) == 1 && h->expect != NULL &&
        h->expect->active && h->expect->id == id) {
        /* The point of the test: data must be complete right now. */
        h->expect->data_ok = verify_expect(h->expect);
        h->expect->arrived_ns = pdx_now_ns();
        /* May run on the progress thread of a threaded run. */
        __atomic_store_n(&h->expect->arrived, 1, __ATOMIC_RELEASE);
        return;
    }
    unsigned tag = 0;
    if (sscanf(text, "note %u", &tag) == 1 && h->nrecv < 256) {
        /* Body after the 16-byte prefix is (tag + i) & 0xff. */
        const uint8_t *b = msg;
        int ok = len >= 16;
        for (size_t i = 16; ok && i < len; i++) {
            ok = b[i] == (uint8_t)(tag + i);
        }
        h->recv_len[h->nrecv] = len;
        h->recv_tag[h->nrecv] = tag;
        h->recv_ok[h->nrecv] = ok;
        h->nrecv++;
    }
}

static void host_peer_error(void *ctx, const char *peer, pdx_status_t why)
{
    fake_host_t *h = ctx;
    h->peer_errors++;
    h->last_error = why;
    snprintf(h->error_peer, sizeof(h->error_peer), "%s", peer);
}

void fake_host_init(fake_host_t *h, const char *name)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->host.agent_ctx = h;
    h->host.agent_name = h->name;
    h->host.host_id = "test-host";
    h->host.notif_recv = host_notif_recv;
    h->host.peer_error = host_peer_error;
}

pdx_status_t create_instance(fake_host_t *h, const char *tls, void **be_p)
{
    pdx_option_t opts[1];
    size_t n = 0;
    if (tls != NULL) {
        opts[n++] = (pdx_option_t){"tls", tls};
    }
    return ops->create(&h->host, opts, n, be_p);
}

static void *bg_main(void *arg)
{
    bg_t *bg = arg;
    while (!bg->stop) {
        if (ops->progress(bg->be) == 0) {
            sched_yield();
        }
    }
    return NULL;
}

void bg_start(bg_t *bg, void *be)
{
    bg->be = be;
    bg->stop = 0;
    assert_int_equal(pthread_create(&bg->tid, NULL, bg_main, bg), 0);
}

void bg_stop(bg_t *bg)
{
    bg->stop = 1;
    pthread_join(bg->tid, NULL);
}

/* What describe says after `key`= (a count), or -1. */
long describe_count(void *be, const char *key)
{
    char line[1024];
    ops->describe(be, line, sizeof(line));
    const char *k = strstr(line, key);
    return k != NULL ? strtol(k + strlen(key), NULL, 10) : -1;
}

int describe_has(void *be, const char *what)
{
    char line[1024];
    ops->describe(be, line, sizeof(line));
    return strstr(line, what) != NULL;
}
