/* Agent core tests over the in-process mock backend: metadata blob
 * defects, transfers with merging and notifications, prepared lists,
 * stale peers, invariants, registration rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/pdx.h>

#include "blob_int.h"
#include "ctl.h"
#include "mock_backend.h"
#include "peer_int.h"
#include "poll_until.h"

#define MB (1u << 20)

typedef struct side {
    pdx_agent_h agent;
    unsigned char *mem;
    size_t len;
    pdx_mem_reg_h reg;
    char peer[PDX_NAME_MAX];
} side_t;

typedef struct notes {
    int count;
    char last[256];
    char from[PDX_NAME_MAX];
    /* checked inside the callback: the data is there when the note is */
    const unsigned char *watch;
    unsigned char expect;
    int data_was_ready;
} notes_t;

static void on_note(void *arg, const char *peer, const void *msg, size_t len)
{
    notes_t *n = arg;
    n->count++;
    snprintf(n->from, sizeof(n->from), "%s", peer);
    size_t c = len < sizeof(n->last) - 1 ? len : sizeof(n->last) - 1;
    memcpy(n->last, msg, c);
    n->last[c] = '\0';
    if (n->watch != NULL) {
        n->data_was_ready = n->watch[0] == n->expect;
    }
}

static void side_init(side_t *s, const char *name, size_t len)
{
    assert_int_equal(pdx_agent_create(name, NULL, &s->agent), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(s->agent, &mock_backend_ops,
                                                 NULL, 0, NULL),
                     PDX_OK);
    s->len = len;
    s->mem = calloc(1, len);
    assert_non_null(s->mem);
    assert_int_equal(pdx_mem_register(s->agent, PDX_MEM_DRAM,
                                      (uintptr_t)s->mem, len, 0, 0, &s->reg),
                     PDX_OK);
}

static void side_fini(side_t *s)
{
    pdx_agent_destroy(s->agent);
    free(s->mem);
}

static void connect_pair(side_t *a, side_t *b)
{
    assert_int_equal(ctl_load_agent(a->agent, b->agent, a->peer), PDX_OK);
    assert_int_equal(ctl_load_agent(b->agent, a->agent, b->peer), PDX_OK);
}

static pdx_status_t wait_xfer(pdx_xfer_h x, side_t *other)
{
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_xfer_check(x);
        pdx_progress(other->agent);
    }
    return st;
}

static void test_status_strings(void **state)
{
    assert_string_equal(pdx_status_string(PDX_OK), "success");
    assert_string_equal(pdx_status_string(PDX_ERR_REMOTE_DISCONNECT),
                        "remote disconnected");
    assert_string_equal(pdx_status_string((pdx_status_t)-999),
                        "unknown status");
}

static void test_agent_names(void **state)
{
    pdx_agent_h a = NULL;
    assert_int_equal(pdx_agent_create("", NULL, &a), PDX_ERR_INVALID);
    assert_int_equal(pdx_agent_create("bad name", NULL, &a), PDX_ERR_INVALID);
    char longname[100];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[99] = '\0';
    assert_int_equal(pdx_agent_create(longname, NULL, &a), PDX_ERR_INVALID);
    assert_null(a);
    assert_int_equal(pdx_agent_create("glm52-p-dp0", NULL, &a), PDX_OK);
    assert_string_equal(pdx_agent_name(a), "glm52-p-dp0");
    assert_true(pdx_agent_event_fd(a) >= 0);
    pdx_agent_destroy(a);
}

/* A described agent's blob, for defect tests. */
static void make_blob(side_t *s, void **blob, size_t *len)
{
    side_init(s, "blob-src", MB);
    assert_int_equal(pdx_agent_set_invariant(s->agent, "hash_algo",
                                             "xxhash_cbor"), PDX_OK);
    assert_int_equal(pdx_agent_describe(s->agent, blob, len), PDX_OK);
}

static void test_blob_roundtrip(void **state)
{
    side_t s;
    void *blob;
    size_t len;
    make_blob(&s, &blob, &len);
    char why[256];
    pdx_blob_t *b = NULL;
    assert_int_equal(pdx_blob_parse(blob, len, &b, why, sizeof(why)), PDX_OK);
    assert_string_equal(b->name, "blob-src");
    assert_int_equal(b->nregions, 1);
    assert_int_equal(b->regions[0].region.addr, (uintptr_t)s.mem);
    assert_int_equal(b->ninv, 1);
    assert_string_equal(b->inv[0].value, "xxhash_cbor");
    pdx_blob_free_parsed(b);
    char *text = NULL;
    assert_int_equal(pdx_blob_describe(blob, len, &text, why, sizeof(why)),
                     PDX_OK);
    assert_non_null(strstr(text, "agent:      blob-src"));
    assert_non_null(strstr(text, "hash_algo = xxhash_cbor"));
    pdx_blob_free(text);
    pdx_blob_free(blob);
    side_fini(&s);
}

static void test_blob_truncated(void **state)
{
    side_t s, t;
    void *blob;
    size_t len;
    make_blob(&s, &blob, &len);
    side_init(&t, "blob-dst", MB);
    for (size_t cut = 0; cut < len; cut++) {
        /* A fresh copy of exactly `cut` bytes so ASan sees any overread. */
        unsigned char *copy = malloc(cut ? cut : 1);
        memcpy(copy, blob, cut);
        char why[256] = "";
        pdx_blob_t *b = NULL;
        pdx_status_t st = pdx_blob_parse(copy, cut, &b, why, sizeof(why));
        assert_int_equal(st, PDX_ERR_CORRUPT);
        assert_null(b);
        assert_true(strlen(why) > 0);
        assert_int_equal(pdx_peer_load(t.agent, copy, cut, NULL),
                         PDX_ERR_CORRUPT);
        free(copy);
    }
    pdx_blob_free(blob);
    side_fini(&t);
    side_fini(&s);
}

static void test_blob_flipped(void **state)
{
    side_t s;
    void *blob;
    size_t len;
    make_blob(&s, &blob, &len);
    unsigned char *copy = malloc(len);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(copy, blob, len);
            copy[i] ^= (unsigned char)(1u << bit);
            char why[256] = "";
            pdx_blob_t *b = NULL;
            pdx_status_t st = pdx_blob_parse(copy, len, &b, why, sizeof(why));
            if (st == PDX_OK) {
                pdx_blob_free_parsed(b);
                fail_msg("flip of byte %zu bit %d was accepted", i, bit);
            }
            assert_true(st == PDX_ERR_CORRUPT || st == PDX_ERR_VERSION ||
                        st == PDX_ERR_TOO_LARGE);
        }
    }
    free(copy);
    pdx_blob_free(blob);
    side_fini(&s);
}

static void test_blob_version_and_size(void **state)
{
    side_t s;
    void *blob;
    size_t len;
    make_blob(&s, &blob, &len);
    unsigned char *copy = malloc(len);
    memcpy(copy, blob, len);
    copy[4] = 2; /* version 2, checksum covers the body only */
    char why[256] = "";
    pdx_blob_t *b = NULL;
    assert_int_equal(pdx_blob_parse(copy, len, &b, why, sizeof(why)),
                     PDX_ERR_VERSION);
    assert_non_null(strstr(why, "version 2"));
    /* Oversized: rejected before a single byte is read. */
    assert_int_equal(pdx_blob_parse(copy, (size_t)PDX_BLOB_MAX_LEN + 1, &b,
                                    why, sizeof(why)),
                     PDX_ERR_TOO_LARGE);
    free(copy);
    pdx_blob_free(blob);
    side_fini(&s);
}

/* Well-formed framing and checksum around a lying body. */
static void test_blob_crafted_counts(void **state)
{
    pdx_wbuf_t w = {0};
    pdx_blob_begin(&w);
    pdx_wbuf_str(&w, "evil");
    pdx_wbuf_u64(&w, 1);
    pdx_wbuf_u32(&w, 1);
    pdx_wbuf_u32(&w, 1);
    pdx_wbuf_str(&w, "host");
    pdx_wbuf_u16(&w, 0);          /* invariants */
    pdx_wbuf_u16(&w, 0);          /* backends */
    pdx_wbuf_u32(&w, 0x7fffffff); /* regions the blob cannot hold */
    assert_int_equal(pdx_blob_finish(&w), PDX_OK);
    char why[256] = "";
    pdx_blob_t *b = NULL;
    assert_int_equal(pdx_blob_parse(w.data, w.len, &b, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    assert_non_null(strstr(why, "region count"));
    free(w.data);

    memset(&w, 0, sizeof(w));
    pdx_blob_begin(&w);
    pdx_wbuf_str(&w, "evil");
    pdx_wbuf_u64(&w, 1);
    pdx_wbuf_u32(&w, 1);
    pdx_wbuf_u32(&w, 1);
    pdx_wbuf_str(&w, "host");
    pdx_wbuf_u16(&w, 0);
    pdx_wbuf_u16(&w, 1);
    pdx_wbuf_str(&w, "mock");
    pdx_wbuf_u32(&w, 1000); /* connection info longer than the blob */
    assert_int_equal(pdx_blob_finish(&w), PDX_OK);
    assert_int_equal(pdx_blob_parse(w.data, w.len, &b, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    assert_non_null(strstr(why, "truncated"));
    free(w.data);
}

static void test_write_read_notif(void **state)
{
    side_t a, b;
    side_init(&a, "p0", 4 * MB);
    side_init(&b, "d0", 4 * MB);
    connect_pair(&a, &b);
    assert_string_equal(a.peer, "d0");
    for (size_t i = 0; i < a.len; i++) {
        a.mem[i] = (unsigned char)(i * 7 + 1);
    }
    /* 64 contiguous descriptors merge into one piece. */
    pdx_desc_t l[64], r[64];
    for (int i = 0; i < 64; i++) {
        l[i] = (pdx_desc_t){.addr = (uintptr_t)a.mem + i * 8448u, .len = 8448};
        r[i] = (pdx_desc_t){.addr = (uintptr_t)b.mem + i * 8448u, .len = 8448};
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, l, 64}, rl = {PDX_MEM_DRAM, r, 64};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d0",
                                     "done-1", 6, &x), PDX_OK);
    assert_int_equal(pdx_xfer_segments(x), 1);
    notes_t notes = {.watch = b.mem + 63 * 8448, .expect = a.mem[63 * 8448]};
    assert_int_equal(pdx_notif_poll(b.agent, on_note, &notes), 0);
    pdx_status_t st = pdx_xfer_post(x);
    assert_true(st == PDX_OK || st == PDX_INPROGRESS);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    assert_memory_equal(a.mem, b.mem, 64 * 8448);
    assert_int_equal(pdx_notif_poll(b.agent, on_note, &notes), 1);
    assert_string_equal(notes.last, "done-1");
    assert_string_equal(notes.from, "p0");
    assert_true(notes.data_was_ready);
    /* Repost the same request after completion. */
    assert_true(pdx_xfer_post(x) >= PDX_OK);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    pdx_xfer_release(x);

    /* READ back into another place, non-contiguous: no merging. */
    for (int i = 0; i < 64; i++) {
        l[i].addr = (uintptr_t)a.mem + 2 * MB + i * 16896u;
        r[i].addr = (uintptr_t)b.mem + i * 8448u;
    }
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_READ, &ll, &rl, "d0",
                                     NULL, 0, &x), PDX_OK);
    assert_int_equal(pdx_xfer_segments(x), 64);
    pdx_xfer_post(x);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    for (int i = 0; i < 64; i++) {
        assert_memory_equal(a.mem + 2 * MB + i * 16896u, b.mem + i * 8448u,
                            8448);
    }
    pdx_xfer_release(x);

    /* Standalone notifications keep their order. */
    assert_int_equal(pdx_notif_send(b.agent, "p0", "one", 3), PDX_OK);
    assert_int_equal(pdx_notif_send(b.agent, "p0", "two", 3), PDX_OK);
    notes_t n2 = {0};
    assert_int_equal(pdx_notif_poll(a.agent, on_note, &n2), 2);
    assert_string_equal(n2.last, "two");
    assert_int_equal(pdx_notif_send(b.agent, "nobody", "x", 1),
                     PDX_ERR_NOT_FOUND);
    char big[PDX_NOTIF_MAX + 1];
    memset(big, 'x', sizeof(big));
    assert_int_equal(pdx_notif_send(b.agent, "p0", big, sizeof(big)),
                     PDX_ERR_TOO_LARGE);
    side_fini(&a);
    side_fini(&b);
}

static void test_prepared_lists(void **state)
{
    enum { N = 100000, SZ = 64 };
    side_t a, b;
    side_init(&a, "p1", (size_t)N * SZ);
    side_init(&b, "d1", (size_t)N * SZ);
    connect_pair(&a, &b);
    pdx_desc_t *d = malloc(N * sizeof(*d));
    for (size_t i = 0; i < N; i++) {
        d[i] = (pdx_desc_t){.addr = (uintptr_t)a.mem + i * SZ, .len = SZ};
        a.mem[i * SZ] = (unsigned char)i;
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, d, N};
    pdx_dlist_h lp, rp;
    assert_int_equal(pdx_dlist_prepare(a.agent, NULL, &ll, &lp), PDX_OK);
    for (size_t i = 0; i < N; i++) {
        d[i].addr = (uintptr_t)b.mem + i * SZ;
    }
    assert_int_equal(pdx_dlist_prepare(a.agent, "d1", &ll, &rp), PDX_OK);
    uint32_t *li = malloc(N * sizeof(*li)), *ri = malloc(N * sizeof(*ri));
    /* Blocks 0..N/2 in order (one run), then reversed pairs (no merge). */
    for (uint32_t i = 0; i < N; i++) {
        li[i] = i;
        ri[i] = i < N / 2 ? i : (uint32_t)(N - 1 - (i - N / 2));
    }
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_WRITE, lp, li, rp, ri, N,
                                   NULL, 0, &x), PDX_OK);
    assert_int_equal(pdx_xfer_segments(x), 1 + N / 2);
    pdx_xfer_post(x);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(b.mem[(size_t)ri[i] * SZ], (unsigned char)li[i]);
    }
    pdx_xfer_release(x);
    /* Out-of-range index. */
    li[0] = N;
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_WRITE, lp, li, rp, ri, 1,
                                   NULL, 0, &x), PDX_ERR_INVALID);
    /* A region used by a prepared list cannot be deregistered. */
    assert_int_equal(pdx_mem_deregister(a.agent, a.reg), PDX_ERR_BUSY);
    pdx_dlist_release(lp);
    pdx_dlist_release(rp);
    assert_int_equal(pdx_mem_deregister(a.agent, a.reg), PDX_OK);
    free(li);
    free(ri);
    free(d);
    side_fini(&a);
    side_fini(&b);
}

/* Many peers loaded (the agent's index of peers by name grows past its
 * first buckets), unloaded in part, one reloaded: every lookup (state,
 * a request's make and post) finds the right one, and only it. */
#define MANY_PEERS 40
static void test_many_peers(void **state)
{
    (void)state;
    side_t hub;
    side_init(&hub, "hub", MB);
    side_t *sp = calloc(MANY_PEERS, sizeof(*sp));
    assert_non_null(sp);
    char name[32];
    for (int i = 0; i < MANY_PEERS; i++) {
        snprintf(name, sizeof(name), "spoke%02d", i);
        side_init(&sp[i], name, 4096);
        void *blob;
        size_t len;
        char got[PDX_NAME_MAX];
        assert_int_equal(pdx_agent_describe(sp[i].agent, &blob, &len),
                         PDX_OK);
        assert_int_equal(pdx_peer_load(hub.agent, blob, len, got), PDX_OK);
        assert_string_equal(got, name);
        pdx_blob_free(blob);
    }
    for (int i = 0; i < MANY_PEERS; i += 2) {
        snprintf(name, sizeof(name), "spoke%02d", i);
        assert_int_equal(pdx_peer_unload(hub.agent, name), PDX_OK);
    }
    for (int i = 0; i < MANY_PEERS; i++) {
        snprintf(name, sizeof(name), "spoke%02d", i);
        assert_int_equal(pdx_peer_state(hub.agent, name),
                         i % 2 ? PDX_OK : PDX_ERR_NOT_FOUND);
    }
    assert_int_equal(pdx_peer_state(hub.agent, "spoke"), PDX_ERR_NOT_FOUND);
    void *blob;
    size_t len;
    assert_int_equal(pdx_agent_describe(sp[0].agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(hub.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    assert_int_equal(pdx_peer_state(hub.agent, "spoke00"), PDX_OK);
    /* A WRITE to each of two peers lands in that peer's memory only. */
    int to[2] = {0, MANY_PEERS - 1};
    for (int k = 0; k < 2; k++) {
        memset(hub.mem, 0x40 + k, 4096);
        pdx_desc_t l = {.addr = (uintptr_t)hub.mem, .len = 4096};
        pdx_desc_t r = {.addr = (uintptr_t)sp[to[k]].mem, .len = 4096};
        pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1},
                        rl = {PDX_MEM_DRAM, &r, 1};
        snprintf(name, sizeof(name), "spoke%02d", to[k]);
        pdx_xfer_h x;
        assert_int_equal(pdx_xfer_create(hub.agent, PDX_XFER_WRITE, &ll, &rl,
                                         name, NULL, 0, &x), PDX_OK);
        assert_true(pdx_xfer_post(x) >= PDX_OK);
        assert_int_equal(wait_xfer(x, &sp[to[k]]), PDX_OK);
        pdx_xfer_release(x);
    }
    for (int i = 0; i < MANY_PEERS; i++) {
        unsigned char want = i == to[0] ? 0x40 : i == to[1] ? 0x41 : 0;
        for (size_t o = 0; o < 4096; o++) {
            assert_int_equal(sp[i].mem[o], want);
        }
    }
    side_fini(&hub);
    for (int i = 0; i < MANY_PEERS; i++) {
        side_fini(&sp[i]);
    }
    free(sp);
}

static void test_stale_peer(void **state)
{
    side_t a, b;
    side_init(&a, "p2", MB);
    side_init(&b, "d2", MB);
    connect_pair(&a, &b);
    pdx_desc_t l = {.addr = (uintptr_t)a.mem, .len = 4096};
    pdx_desc_t r = {.addr = (uintptr_t)b.mem, .len = 4096};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d2",
                                     NULL, 0, &x), PDX_OK);
    pdx_dlist_h rp;
    assert_int_equal(pdx_dlist_prepare(a.agent, "d2", &rl, &rp), PDX_OK);
    /* Loading the same description again changes nothing. */
    void *blob;
    size_t len;
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    assert_true(pdx_xfer_post(x) >= PDX_OK);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    /* Settled (its post ended OK, nothing held): answered without the
     * agent lock, the same every time. */
    assert_int_equal(pdx_xfer_check(x), PDX_OK);
    assert_int_equal(pdx_xfer_check(x), PDX_OK);
    /* The peer adds a region (new generation): handles on the regions it
     * kept keep working. */
    unsigned char *more = malloc(4096);
    pdx_mem_reg_h reg2;
    assert_int_equal(pdx_mem_register(b.agent, PDX_MEM_DRAM, (uintptr_t)more,
                                      4096, 0, 0, &reg2), PDX_OK);
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    assert_true(pdx_xfer_post(x) >= PDX_OK);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    pdx_xfer_h y;
    uint32_t zero = 0;
    pdx_dlist_h lp;
    assert_int_equal(pdx_dlist_prepare(a.agent, NULL, &ll, &lp), PDX_OK);
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_WRITE, lp, &zero, rp,
                                   &zero, 1, NULL, 0, &y), PDX_OK);
    pdx_xfer_release(y);
    /* The region they use goes (and comes back): they are stale. */
    assert_int_equal(pdx_mem_deregister(b.agent, b.reg), PDX_OK);
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    assert_int_equal(pdx_mem_register(b.agent, PDX_MEM_DRAM,
                                      (uintptr_t)b.mem, b.len, 0, 0, &b.reg),
                     PDX_OK);
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    /* Its last post had landed: that stays PDX_OK; the next post is
     * refused, and then that is what check says. */
    assert_int_equal(pdx_xfer_check(x), PDX_OK);
    assert_int_equal(pdx_xfer_post(x), PDX_ERR_STALE);
    assert_int_equal(pdx_xfer_check(x), PDX_ERR_STALE);
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_WRITE, lp, &zero, rp,
                                   &zero, 1, NULL, 0, &y), PDX_ERR_STALE);
    pdx_xfer_release(x);
    pdx_dlist_release(rp);
    /* Unload: requests fail as stale too. */
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d2",
                                     NULL, 0, &x), PDX_OK);
    mock_hold_completion = 1;
    assert_int_equal(pdx_xfer_post(x), PDX_INPROGRESS);
    assert_int_equal(pdx_peer_unload(a.agent, "d2"), PDX_OK);
    mock_hold_completion = 0;
    assert_int_equal(pdx_xfer_check(x), PDX_ERR_STALE);
    assert_int_equal(pdx_xfer_post(x), PDX_ERR_STALE);
    assert_int_equal(pdx_peer_unload(a.agent, "d2"), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_peer_state(a.agent, "d2"), PDX_ERR_NOT_FOUND);
    pdx_xfer_release(x);
    pdx_dlist_release(lp);
    side_fini(&a);
    side_fini(&b);
    free(more);
}

static void test_invariants(void **state)
{
    side_t a, b;
    side_init(&a, "p3", MB);
    side_init(&b, "d3", MB);
    pdx_agent_set_invariant(a.agent, "none_hash", "1ebe3657");
    pdx_agent_set_invariant(b.agent, "none_hash", "a9d2e634");
    void *blob;
    size_t len;
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL),
                     PDX_ERR_MISMATCH);
    pdx_blob_free(blob);
    /* Equal now, but a key only one side has is a mismatch too. */
    pdx_agent_set_invariant(b.agent, "none_hash", "1ebe3657");
    pdx_agent_set_invariant(b.agent, "block_size", "64");
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL),
                     PDX_ERR_MISMATCH);
    pdx_blob_free(blob);
    pdx_agent_set_invariant(a.agent, "block_size", "64");
    assert_int_equal(pdx_agent_describe(b.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_OK);
    pdx_blob_free(blob);
    assert_int_equal(pdx_agent_set_invariant(a.agent, "", "x"),
                     PDX_ERR_INVALID);
    side_fini(&a);
    side_fini(&b);
}

static void test_bad_requests(void **state)
{
    side_t a, b;
    side_init(&a, "p4", MB);
    side_init(&b, "d4", MB);
    connect_pair(&a, &b);
    unsigned char other[64];
    pdx_desc_t l = {.addr = (uintptr_t)other, .len = 64};
    pdx_desc_t r = {.addr = (uintptr_t)b.mem, .len = 64};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x = NULL;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d4",
                                     NULL, 0, &x), PDX_ERR_NOT_FOUND);
    l.addr = (uintptr_t)a.mem;
    r.addr = (uintptr_t)b.mem + MB - 32; /* runs past the peer's region */
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d4",
                                     NULL, 0, &x), PDX_ERR_NOT_FOUND);
    r.addr = (uintptr_t)b.mem;
    r.len = 32;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d4",
                                     NULL, 0, &x), PDX_ERR_INVALID);
    r.len = 64;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "zz",
                                     NULL, 0, &x), PDX_ERR_NOT_FOUND);
    assert_null(x);
    /* A piece longer than the region cached from the previous piece must
     * not be matched against it (the containment check once wrapped). */
    {
        unsigned char *small = calloc(1, 4096);
        pdx_mem_reg_h sreg;
        assert_int_equal(pdx_mem_register(a.agent, PDX_MEM_DRAM,
                                          (uintptr_t)small, 4096, 0, 0,
                                          &sreg), PDX_OK);
        pdx_desc_t l2[2] = {{.addr = (uintptr_t)small, .len = 64},
                            {.addr = (uintptr_t)small + 64, .len = 8192}};
        pdx_desc_t r2[2] = {{.addr = (uintptr_t)b.mem, .len = 64},
                            {.addr = (uintptr_t)b.mem + 4096, .len = 8192}};
        pdx_desc_list_t l2l = {PDX_MEM_DRAM, l2, 2}, r2l = {PDX_MEM_DRAM, r2, 2};
        pdx_xfer_h y = NULL;
        assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &l2l, &r2l,
                                         "d4", NULL, 0, &y), PDX_ERR_NOT_FOUND);
        assert_null(y);
        assert_int_equal(pdx_mem_deregister(a.agent, sreg), PDX_OK);
        free(small);
    }
    /* Overlapping registration is refused. */
    pdx_mem_reg_h reg;
    assert_int_equal(pdx_mem_register(a.agent, PDX_MEM_DRAM,
                                      (uintptr_t)a.mem + 100, 10, 0, 0, &reg),
                     PDX_ERR_EXISTS);
    /* A backend failure at post is reported, and the request reusable. */
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d4",
                                     NULL, 0, &x), PDX_OK);
    mock_fail_next_post = 1;
    assert_int_equal(pdx_xfer_post(x), PDX_ERR_BACKEND);
    assert_true(pdx_xfer_post(x) >= PDX_OK);
    assert_int_equal(wait_xfer(x, &b), PDX_OK);
    /* Aborted while in flight: no data, no notification, CANCELED. */
    mock_hold_completion = 1;
    memset(a.mem, 0xab, 64);
    memset(b.mem, 0, 64);
    assert_int_equal(pdx_xfer_post(x), PDX_INPROGRESS);
    assert_int_equal(pdx_xfer_abort(x), PDX_OK);
    mock_hold_completion = 0;
    assert_int_equal(wait_xfer(x, &b), PDX_ERR_CANCELED);
    assert_int_equal(b.mem[0], 0);
    assert_int_equal(pdx_xfer_abort(x), PDX_OK); /* nothing in flight */
    /* Released while in flight: nothing leaks (valgrind/ASan check). */
    mock_hold_completion = 1;
    assert_int_equal(pdx_xfer_post(x), PDX_INPROGRESS);
    assert_int_equal(pdx_xfer_post(x), PDX_ERR_BUSY);
    pdx_xfer_release(x);
    mock_hold_completion = 0;
    /* Own blob is not a peer. */
    void *blob;
    size_t len;
    assert_int_equal(pdx_agent_describe(a.agent, &blob, &len), PDX_OK);
    assert_int_equal(pdx_peer_load(a.agent, blob, len, NULL), PDX_ERR_INVALID);
    pdx_blob_free(blob);
    side_fini(&a);
    side_fini(&b);
}

static void test_timeout(void **state)
{
    side_t a, b;
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_XFER_TIMEOUT,
                            .xfer_timeout_ms = 20};
    assert_int_equal(pdx_agent_create("p5", &p, &a.agent), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(a.agent, &mock_backend_ops,
                                                 NULL, 0, NULL), PDX_OK);
    a.len = MB;
    a.mem = calloc(1, MB);
    assert_int_equal(pdx_mem_register(a.agent, PDX_MEM_DRAM, (uintptr_t)a.mem,
                                      MB, 0, 0, &a.reg), PDX_OK);
    side_init(&b, "d5", MB);
    connect_pair(&a, &b);
    pdx_desc_t l = {.addr = (uintptr_t)a.mem, .len = 64};
    pdx_desc_t r = {.addr = (uintptr_t)b.mem, .len = 64};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl, "d5",
                                     NULL, 0, &x), PDX_OK);
    mock_hold_completion = 1; /* a hung peer */
    assert_int_equal(pdx_xfer_post(x), PDX_INPROGRESS);
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        st = pdx_xfer_check(x);
    }
    mock_hold_completion = 0;
    assert_int_equal(st, PDX_ERR_TIMEOUT);
    pdx_xfer_release(x);
    side_fini(&a);
    side_fini(&b);
}

/* pdx_mem_alloc/free and pdx_mem_share/unshare: what registration hands
 * the backends (flag, fd, file offset), and every refusal. */
static void test_shared_memory(void **state)
{
    (void)state;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    void *m = NULL;
    assert_int_equal(pdx_mem_alloc(0, 0, &m), PDX_ERR_INVALID);
    assert_int_equal(pdx_mem_alloc(pg, 1u << 7, &m), PDX_ERR_INVALID);
    assert_null(m);
    assert_int_equal(pdx_mem_alloc(3 * pg, PDX_MEM_F_POPULATE, &m), PDX_OK);
    assert_int_equal((uintptr_t)m % pg, 0);
    unsigned char *b = m;
    assert_int_equal(b[0] | b[3 * pg - 1], 0);
    memset(b + pg, 0xa7, pg);
    b[pg + 5] = 0x11;
    /* A forked child does not inherit it (MADV_DONTFORK): touching it
     * there is a fault, not a write into the parent's memory. */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        signal(SIGSEGV, SIG_DFL);
        b[pg] = 0x55;
        _exit(0);
    }
    int wst = 0;
    assert_int_equal(waitpid(child, &wst, 0), child);
    assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGSEGV);
    assert_int_equal(b[pg], 0xa7);

    pdx_agent_h a;
    assert_int_equal(pdx_agent_create("shm", NULL, &a), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(a, &mock_backend_ops, NULL,
                                                 0, NULL), PDX_OK);
    pdx_mem_reg_h reg, reg2;
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)b + pg, pg,
                                      0, PDX_REGION_F_SHARED, &reg),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)b + pg, pg,
                                      0, 0, &reg), PDX_OK);
    assert_true(mock_last_region.flags & PDX_REGION_F_SHARED);
    assert_true(mock_last_region.shm_fd >= 0);
    assert_int_equal(mock_last_region.shm_offset, pg);
    /* The fd and offset name the very bytes of the region. */
    unsigned char got[8];
    assert_int_equal(pread(mock_last_region.shm_fd, got, sizeof(got),
                           (off_t)mock_last_region.shm_offset),
                     (ssize_t)sizeof(got));
    assert_int_equal(got[0], 0xa7);
    assert_int_equal(got[5], 0x11);
    /* Registered inside: free refuses and leaves it usable. */
    assert_int_equal(pdx_mem_free(b), PDX_ERR_BUSY);
    b[2 * pg] = 1;
    assert_int_equal(pdx_mem_free(b + pg), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_mem_deregister(a, reg), PDX_OK);
    assert_int_equal(pdx_mem_free(b), PDX_OK);
    assert_int_equal(pdx_mem_free(b), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_mem_free(NULL), PDX_OK);

    /* A caller's own shared mapping. */
    int fd = memfd_create("test", 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(4 * pg)), 0);
    unsigned char *s = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED,
                            fd, (off_t)(2 * pg));
    assert_true(s != MAP_FAILED);
    assert_int_equal(pdx_mem_share(s + 1, pg, fd, 2 * pg), PDX_ERR_INVALID);
    assert_int_equal(pdx_mem_share(s, 3 * pg, fd, 2 * pg), PDX_ERR_INVALID);
    assert_int_equal(pdx_mem_share(s, pg, -1, 0), PDX_ERR_INVALID);
    assert_int_equal(pdx_mem_share(s, 2 * pg, fd, 2 * pg), PDX_OK);
    assert_int_equal(pdx_mem_share(s + pg, pg, fd, 3 * pg), PDX_ERR_EXISTS);
    s[pg] = 0x5c;
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)s + pg, pg,
                                      0, 0, &reg2), PDX_OK);
    assert_true(mock_last_region.flags & PDX_REGION_F_SHARED);
    assert_true(mock_last_region.shm_fd != fd); /* pdx's own dup */
    assert_int_equal(mock_last_region.shm_offset, 3 * pg);
    assert_int_equal(pread(mock_last_region.shm_fd, got, 1, (off_t)(3 * pg)),
                     1);
    assert_int_equal(got[0], 0x5c);
    assert_int_equal(pdx_mem_unshare(s), PDX_ERR_BUSY);
    close(fd); /* pdx's dup keeps the file */
    assert_int_equal(pdx_mem_deregister(a, reg2), PDX_OK);
    assert_int_equal(pdx_mem_unshare(s), PDX_OK);
    assert_int_equal(pdx_mem_unshare(s), PDX_ERR_NOT_FOUND);
    munmap(s, 2 * pg);

    /* Private memory is not shared. */
    void *priv = aligned_alloc(pg, pg);
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)priv, pg,
                                      0, 0, &reg), PDX_OK);
    assert_false(mock_last_region.flags & PDX_REGION_F_SHARED);
    assert_int_equal(pdx_mem_deregister(a, reg), PDX_OK);
    free(priv);
    pdx_agent_destroy(a);
}

/* A same-host peer whose process has begun to exit counts as exited
 * (pdx_peer_pid_exited): an exiting process has closed its fds and
 * unmapped its memory before its pidfd turns readable, and a backend's
 * error seen in that window (a UCX connect to its shared memory) must end
 * requests as its death's. Held in that window here: the child's main
 * thread exits (a zombie leader, PF_EXITING) while another thread lives
 * on, so the pidfd stays unreadable until the pipe closes. */
static void *exit_helper_wait(void *arg)
{
    char c;
    (void)!read(*(int *)arg, &c, 1); /* until the parent closes its end */
    return NULL;
}

static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return '?';
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *q = strrchr(buf, ')');
    return q != NULL && q[1] == ' ' ? q[2] : '?';
}

static void test_peer_exiting(void **state)
{
    (void)state;
    int pfd[2], rfd[2];
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(pipe(rfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[1]);
        close(rfd[0]);
        pthread_t t;
        if (pthread_create(&t, NULL, exit_helper_wait, &pfd[0]) != 0) {
            _exit(2);
        }
        (void)!write(rfd[1], "r", 1);
        pthread_exit(NULL); /* the process lives while `t` does */
    }
    close(pfd[0]);
    close(rfd[1]);
    char c;
    assert_int_equal(read(rfd[0], &c, 1), 1);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        close(pfd[1]);
        waitpid(pid, NULL, 0);
        skip(); /* a kernel without pidfd_open: pdx has no pidfd either */
    }
    pdx_peer_t p = {.pid = pid, .pidfd = pidfd};
    /* The leader becomes a zombie once its pthread_exit is done. */
    int i = 0;
    for (; i < 2000 && proc_state(pid) != 'Z'; i++) {
        usleep(1000);
    }
    assert_true(i < 2000);
    struct pollfd pp = {.fd = pidfd, .events = POLLIN};
    assert_int_equal(poll(&pp, 1, 0), 0); /* the pidfd: not yet */
    assert_true(pdx_peer_pid_exited(&p));  /* but exiting */
    close(pfd[1]); /* the last thread ends, and the process */
    assert_int_equal(poll(&pp, 1, 10000), 1);
    assert_true(pdx_peer_pid_exited(&p));
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    close(pidfd);
    close(rfd[0]);

    /* A live process is not exiting; nor is a peer without a pidfd. */
    pdx_peer_t self = {.pid = getpid(),
                       .pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0)};
    assert_true(self.pidfd >= 0);
    assert_false(pdx_peer_pid_exited(&self));
    close(self.pidfd);
    pdx_peer_t remote = {.pid = getpid(), .pidfd = -1};
    assert_false(pdx_peer_pid_exited(&remote));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_agent_names),
        cmocka_unit_test(test_blob_roundtrip),
        cmocka_unit_test(test_blob_truncated),
        cmocka_unit_test(test_blob_flipped),
        cmocka_unit_test(test_blob_version_and_size),
        cmocka_unit_test(test_blob_crafted_counts),
        cmocka_unit_test(test_write_read_notif),
        cmocka_unit_test(test_prepared_lists),
        cmocka_unit_test(test_many_peers),
        cmocka_unit_test(test_stale_peer),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_shared_memory),
        cmocka_unit_test(test_peer_exiting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
