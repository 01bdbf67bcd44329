/* Handles that cannot crash the caller, and pdx_last_error():
 *   - every function of pdx.h called with NULL handles (and NULL required
 *     pointers) returns PDX_ERR_INVALID (void ones do nothing) and
 *     pdx_last_error() names the argument;
 *   - request and prepared-list functions called with a released handle
 *     are refused the same way (the object is in quarantine, tagged dead);
 *   - pdx_last_error() is per thread: two threads fail different calls at
 *     once, each reads its own message; a success leaves it alone;
 *   - telemetry and counters of a request over the in-process mock. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/pdx.h>

#include "ctl.h"
#include "mock_backend.h"
#include "poll_until.h"

#define MB (1u << 20)

/* The last error names `what`. */
#define ASSERT_ERR_NAMES(what)                                                 \
    do {                                                                       \
        if (strstr(pdx_last_error(), (what)) == NULL) {                        \
            fail_msg("pdx_last_error() '%s' does not name '%s'",               \
                     pdx_last_error(), (what));                                \
        }                                                                      \
    } while (0)

#define EXPECT_INVALID(call, what)                                             \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        assert_int_equal((call), PDX_ERR_INVALID);                             \
        assert_int_equal(pdx_last_status(), PDX_ERR_INVALID);                  \
        ASSERT_ERR_NAMES(what);                                                \
    } while (0)

#define EXPECT_VOID_REFUSED(call, what)                                        \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        call;                                                                  \
        ASSERT_ERR_NAMES(what);                                                \
    } while (0)

static void quiet(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg, (void)level, (void)msg;
}

static void on_note(void *arg, const char *peer, const void *msg, size_t len)
{
    (void)arg, (void)peer, (void)msg, (void)len;
}

static void on_note_keep(void *arg, const char *peer, const void *msg,
                         size_t len)
{
    struct {
        int n;
        char last[16];
    } *g = arg;
    (void)peer;
    g->n++;
    snprintf(g->last, sizeof(g->last), "%.*s", (int)len, (const char *)msg);
}

typedef struct side {
    pdx_agent_h agent;
    unsigned char *mem;
    pdx_mem_reg_h reg;
    char peer[PDX_NAME_MAX];
} side_t;

static void side_init(side_t *s, const char *name, uint32_t flags)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = flags};
    assert_int_equal(pdx_agent_create(name, &ap, &s->agent), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(s->agent, &mock_backend_ops,
                                                 NULL, 0, NULL),
                     PDX_OK);
    s->mem = calloc(1, MB);
    assert_non_null(s->mem);
    assert_int_equal(pdx_mem_register(s->agent, PDX_MEM_DRAM,
                                      (uintptr_t)s->mem, MB, 0, 0, &s->reg),
                     PDX_OK);
}

static void connect_pair(side_t *a, side_t *b)
{
    assert_int_equal(ctl_load_agent(a->agent, b->agent, a->peer), PDX_OK);
    assert_int_equal(ctl_load_agent(b->agent, a->agent, b->peer), PDX_OK);
}

static void side_fini(side_t *s)
{
    pdx_agent_destroy(s->agent);
    free(s->mem);
}

/* Every function of pdx.h that takes a handle or a required pointer. */
static void test_null_handles(void **state)
{
    (void)state;
    pdx_agent_h a = NULL;
    pdx_xfer_h x = NULL;
    pdx_dlist_h d = NULL;
    pdx_desc_t desc = {0x1000, 64, 0, 0};
    pdx_desc_list_t list = {PDX_MEM_DRAM, &desc, 1};
    uint32_t idx = 0;
    void *blob = NULL;
    size_t len = 0;
    char buf[64];
    pdx_stats_t stats;
    pdx_peer_info_t info;
    pdx_xfer_telemetry_t tel;
    char *json = NULL;

    /* agent.h */
    EXPECT_INVALID(pdx_agent_create("ok-name", NULL, NULL), "agent_p");
    EXPECT_VOID_REFUSED(assert_null(pdx_agent_name(a)), "agent");
    EXPECT_INVALID(pdx_agent_event_fd(a), "agent");
    EXPECT_INVALID(pdx_backend_create(a, "ucx", NULL, 0, NULL), "agent");
    EXPECT_INVALID(pdx_backend_create_with_ops(a, &mock_backend_ops, NULL, 0,
                                               NULL),
                   "agent");
    EXPECT_INVALID(pdx_backend_probe(NULL, NULL, buf, sizeof(buf)), "name");
    EXPECT_VOID_REFUSED(pdx_backend_describe(NULL, buf, sizeof(buf)),
                        "backend");
    assert_string_equal(buf, "");
    EXPECT_INVALID(pdx_mem_register(a, PDX_MEM_DRAM, 0x1000, 4096, 0, 0,
                                    (pdx_mem_reg_h *)&blob),
                   "agent");
    EXPECT_INVALID(pdx_mem_deregister(a, (pdx_mem_reg_h)&desc), "agent");
    EXPECT_INVALID(pdx_mem_alloc(4096, 0, NULL), "ptr_p");
    EXPECT_INVALID(pdx_mem_share(NULL, 4096, 0, 0), "addr");
    EXPECT_INVALID(pdx_mem_unshare(NULL), "addr");
    int fd;
    uint64_t off;
    EXPECT_INVALID(pdx_mem_fd(NULL, 1, &fd, &off), "ptr");
    EXPECT_INVALID(pdx_mem_fd(&desc, 1, NULL, &off), "fd_p");
    /* The real thing: the memfd behind pdx_mem_alloc memory. */
    unsigned char *shm;
    assert_int_equal(pdx_mem_alloc(3 * 4096, 0, (void **)&shm), PDX_OK);
    assert_int_equal(pdx_mem_fd(shm + 4096, 100, &fd, &off), PDX_OK);
    assert_int_equal(off, 4096);
    shm[4096] = 0x5a;
    unsigned char byte = 0;
    assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
    assert_int_equal(byte, 0x5a);
    assert_int_equal(pdx_mem_fd(&desc, 1, &fd, &off), PDX_ERR_NOT_FOUND);
    ASSERT_ERR_NAMES("not in memory from pdx_mem_alloc");
    assert_int_equal(pdx_mem_free(shm), PDX_OK);
    EXPECT_INVALID(pdx_agent_describe(a, &blob, &len), "agent");
    EXPECT_INVALID(pdx_peer_load(a, "x", 1, NULL), "agent");
    EXPECT_INVALID(pdx_peer_unload(a, "p"), "agent");
    EXPECT_INVALID(pdx_peer_state(a, "p"), "agent");
    EXPECT_INVALID(pdx_peer_info(a, "p", &info, NULL, 0), "agent");
    EXPECT_INVALID(pdx_agent_set_invariant(a, "k", "v"), "agent");
    EXPECT_INVALID(pdx_progress(a), "agent");
    EXPECT_INVALID(pdx_stats_backend(a, "ucx", &stats), "agent");
    EXPECT_INVALID(pdx_stats_peer(a, "p", &stats), "agent");
    EXPECT_INVALID(pdx_stats_json(a, &json), "agent");
    EXPECT_VOID_REFUSED(pdx_agent_destroy(a), ""); /* a no-op, like free */
    /* notif.h */
    EXPECT_INVALID(pdx_notif_send(a, "p", "m", 1), "agent");
    EXPECT_INVALID(pdx_notif_poll(a, on_note, NULL), "agent");
    /* xfer.h */
    EXPECT_INVALID(pdx_xfer_create(a, PDX_XFER_READ, &list, &list, "p", NULL,
                                   0, &x),
                   "agent");
    EXPECT_INVALID(pdx_xfer_post(x), "xfer");
    EXPECT_INVALID(pdx_xfer_check(x), "xfer");
    EXPECT_INVALID(pdx_xfer_abort(x), "xfer");
    EXPECT_VOID_REFUSED(assert_int_equal(pdx_xfer_segments(x), 0), "xfer");
    EXPECT_INVALID(pdx_xfer_telemetry(x, &tel), "xfer");
    EXPECT_INVALID(pdx_xfer_set_notif(x, "m", 1), "xfer");
    EXPECT_VOID_REFUSED(pdx_xfer_release(x), ""); /* a no-op, like free */
    EXPECT_INVALID(pdx_dlist_prepare(a, NULL, &list, &d), "agent");
    EXPECT_VOID_REFUSED(pdx_dlist_release(d), "");
    EXPECT_INVALID(pdx_xfer_make(a, PDX_XFER_READ, d, &idx, d, &idx, 1, NULL,
                                 0, &x),
                   "agent");
    /* plugin.h */
    EXPECT_INVALID(pdx_blob_describe(NULL, 10, (char **)&blob, buf,
                                     sizeof(buf)),
                   "blob");
    EXPECT_INVALID(pdx_blob_describe("x", 1, NULL, buf, sizeof(buf)),
                   "text_p");
    pdx_blob_free(NULL);

    /* A live agent, NULL other arguments. */
    side_t s;
    side_init(&s, "api-a", 0);
    EXPECT_INVALID(pdx_agent_set_invariant(s.agent, NULL, "v"), "key");
    EXPECT_INVALID(pdx_agent_describe(s.agent, NULL, &len), "blob_p");
    EXPECT_INVALID(pdx_peer_load(s.agent, NULL, 10, NULL), "blob");
    EXPECT_INVALID(pdx_peer_state(s.agent, NULL), "name");
    EXPECT_INVALID(pdx_peer_unload(s.agent, NULL), "name");
    EXPECT_INVALID(pdx_peer_info(s.agent, "p", NULL, NULL, 0), "info_p");
    EXPECT_INVALID(pdx_mem_register(s.agent, PDX_MEM_DRAM, 0x1000, 4096, 0,
                                    0, NULL),
                   "reg_p");
    EXPECT_INVALID(pdx_mem_deregister(s.agent, NULL), "reg");
    EXPECT_INVALID(pdx_backend_create(s.agent, NULL, NULL, 0, NULL), "name");
    EXPECT_INVALID(pdx_notif_send(s.agent, NULL, "m", 1), "peer");
    EXPECT_INVALID(pdx_notif_send(s.agent, "p", NULL, 4), "msg");
    EXPECT_INVALID(pdx_notif_poll(s.agent, NULL, NULL), "cb");
    EXPECT_INVALID(pdx_xfer_create(s.agent, PDX_XFER_READ, NULL, &list, "p",
                                   NULL, 0, &x),
                   "local");
    EXPECT_INVALID(pdx_xfer_create(s.agent, PDX_XFER_READ, &list, &list,
                                   NULL, NULL, 0, &x),
                   "peer");
    EXPECT_INVALID(pdx_xfer_create(s.agent, PDX_XFER_READ, &list, &list, "p",
                                   NULL, 0, NULL),
                   "xfer_p");
    pdx_desc_list_t hollow = {PDX_MEM_DRAM, NULL, 3};
    EXPECT_INVALID(pdx_xfer_create(s.agent, PDX_XFER_READ, &hollow, &list,
                                   "p", NULL, 0, &x),
                   "local->descs");
    EXPECT_INVALID(pdx_dlist_prepare(s.agent, NULL, NULL, &d), "list");
    EXPECT_INVALID(pdx_dlist_prepare(s.agent, NULL, &list, NULL), "dlist_p");
    EXPECT_INVALID(pdx_xfer_make(s.agent, PDX_XFER_READ, NULL, &idx, NULL,
                                 &idx, 1, NULL, 0, &x),
                   "local");
    EXPECT_INVALID(pdx_stats_backend(s.agent, NULL, &stats), "backend");
    EXPECT_INVALID(pdx_stats_json(s.agent, NULL), "json_p");
    side_fini(&s);
}

/* Released requests and lists (and a destroyed agent) are refused. */
static void test_released_handles(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "api-p", 0);
    side_init(&b, "api-d", 0);
    connect_pair(&a, &b);
    pdx_desc_t l = {(uintptr_t)a.mem, 4096, 0, 0};
    pdx_desc_t r = {(uintptr_t)b.mem, 4096, 0, 0};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl,
                                     a.peer, NULL, 0, &x),
                     PDX_OK);
    pdx_xfer_release(x);
    pdx_xfer_telemetry_t tel;
    EXPECT_INVALID(pdx_xfer_post(x), "xfer");
    EXPECT_INVALID(pdx_xfer_check(x), "xfer");
    EXPECT_INVALID(pdx_xfer_abort(x), "xfer");
    EXPECT_INVALID(pdx_xfer_telemetry(x, &tel), "xfer");
    EXPECT_INVALID(pdx_xfer_set_notif(x, "m", 1), "xfer");
    EXPECT_VOID_REFUSED(assert_int_equal(pdx_xfer_segments(x), 0), "xfer");
    EXPECT_VOID_REFUSED(pdx_xfer_release(x), "not a live xfer");

    pdx_dlist_h dl, dr;
    assert_int_equal(pdx_dlist_prepare(a.agent, NULL, &ll, &dl), PDX_OK);
    assert_int_equal(pdx_dlist_prepare(a.agent, a.peer, &rl, &dr), PDX_OK);
    pdx_dlist_release(dr);
    uint32_t idx = 0;
    EXPECT_INVALID(pdx_xfer_make(a.agent, PDX_XFER_WRITE, dl, &idx, dr, &idx,
                                 1, NULL, 0, &x),
                   "remote");
    EXPECT_VOID_REFUSED(pdx_dlist_release(dr), "not a live dlist");
    pdx_dlist_release(dl);
    EXPECT_INVALID(pdx_xfer_make(a.agent, PDX_XFER_WRITE, dl, &idx, dr, &idx,
                                 1, NULL, 0, &x),
                   "local");

    /* Requests made after many releases still work (reuse after the
     * quarantine), and each stale one stays refused until then. */
    pdx_xfer_h olds[8];
    for (int i = 0; i < 8; i++) {
        assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl,
                                         a.peer, NULL, 0, &olds[i]),
                         PDX_OK);
    }
    for (int i = 0; i < 8; i++) {
        pdx_xfer_release(olds[i]);
    }
    for (int i = 0; i < 8; i++) {
        EXPECT_INVALID(pdx_xfer_check(olds[i]), "xfer");
    }
    for (int round = 0; round < 200; round++) {
        assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl,
                                         a.peer, NULL, 0, &x),
                         PDX_OK);
        assert_true(pdx_xfer_post(x) >= 0);
        pdx_status_t st = PDX_INPROGRESS;
        PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
            st = pdx_xfer_check(x);
        }
        assert_int_equal(st, PDX_OK);
        pdx_xfer_release(x);
    }

    /* A deregistered region is refused by comparison, never read. (After
     * the requests above: its removal notice reaches a's next progress,
     * and a then refuses requests into it.) */
    pdx_mem_reg_h reg = b.reg;
    assert_int_equal(pdx_mem_deregister(b.agent, reg), PDX_OK);
    EXPECT_INVALID(pdx_mem_deregister(b.agent, reg), "reg");
    side_fini(&a);
    side_fini(&b);

    /* A destroyed agent (quarantined) is refused too. */
    pdx_agent_h gone;
    assert_int_equal(pdx_agent_create("api-gone", NULL, &gone), PDX_OK);
    pdx_agent_destroy(gone);
    EXPECT_INVALID(pdx_progress(gone), "agent");
    EXPECT_INVALID(pdx_peer_state(gone, "p"), "agent");
    EXPECT_VOID_REFUSED(pdx_agent_destroy(gone), "not a live agent");
}

typedef struct thread_arg {
    pdx_agent_h agent;
    const char *mine;   /* a name only this thread's failures mention */
    const char *theirs; /* the other thread's */
    int use_create;
    pthread_barrier_t *go;
    int mismatches;
} thread_arg_t;

static void *fail_loop(void *p)
{
    thread_arg_t *t = p;
    pdx_desc_t d = {0x1000, 64, 0, 0};
    pdx_desc_list_t dl = {PDX_MEM_DRAM, &d, 1};
    if (pdx_last_error()[0] != '\0') {
        t->mismatches++; /* a new thread starts with "" */
    }
    pthread_barrier_wait(t->go);
    for (int i = 0; i < 2000; i++) {
        pdx_status_t st;
        if (t->use_create) {
            pdx_xfer_h x;
            st = pdx_xfer_create(t->agent, PDX_XFER_READ, &dl, &dl, t->mine,
                                 NULL, 0, &x);
        } else {
            st = pdx_peer_state(t->agent, t->mine);
        }
        if (st != PDX_ERR_NOT_FOUND) {
            t->mismatches++;
        }
        /* A success in between leaves the text alone. */
        if (pdx_progress(t->agent) < 0) {
            t->mismatches++;
        }
        const char *e = pdx_last_error();
        if (strstr(e, t->mine) == NULL || strstr(e, t->theirs) != NULL ||
            pdx_last_status() != PDX_ERR_NOT_FOUND) {
            t->mismatches++;
        }
    }
    return NULL;
}

static void test_last_error_per_thread(void **state)
{
    (void)state;
    pdx_agent_h agent;
    assert_int_equal(pdx_agent_create("api-threads", NULL, &agent), PDX_OK);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    thread_arg_t a = {agent, "ghost-peer-alpha", "ghost-peer-beta", 1, &go, 0};
    thread_arg_t b = {agent, "ghost-peer-beta", "ghost-peer-alpha", 0, &go, 0};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, fail_loop, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, fail_loop, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(a.mismatches, 0);
    assert_int_equal(b.mismatches, 0);
    /* The text is the log line: pdx_xfer_create's names the peer. */
    pdx_desc_t d = {0x1000, 64, 0, 0};
    pdx_desc_list_t dl = {PDX_MEM_DRAM, &d, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(agent, PDX_XFER_READ, &dl, &dl,
                                     "nobody-here", NULL, 0, &x),
                     PDX_ERR_NOT_FOUND);
    assert_string_equal(pdx_last_error(),
                        "agent api-threads: xfer create: unknown peer "
                        "nobody-here");
    pdx_agent_destroy(agent);
}

/* Per-request telemetry and counters, checked against what happened. */
static void test_telemetry_and_stats(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "tel-p", PDX_AGENT_F_TELEMETRY);
    side_init(&b, "tel-d", 0);
    connect_pair(&a, &b);
    pdx_desc_t l[8], r[8];
    for (int i = 0; i < 8; i++) {
        /* pairs of contiguous pieces: 8 descriptors, 4 segments */
        l[i] = (pdx_desc_t){(uintptr_t)a.mem + (i / 2) * 8192 + (i % 2) * 4096,
                            4096, 0, 0};
        r[i] = (pdx_desc_t){(uintptr_t)b.mem + (i / 2) * 16384 + (i % 2) * 4096,
                            4096, 0, 0};
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, l, 8}, rl = {PDX_MEM_DRAM, r, 8};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl,
                                     a.peer, "n", 1, &x),
                     PDX_OK);
    pdx_xfer_telemetry_t t;
    assert_int_equal(pdx_xfer_telemetry(x, &t), PDX_OK);
    assert_int_equal(t.posts, 0);
    for (int k = 0; k < 3; k++) {
        assert_true(pdx_xfer_post(x) >= 0);
        pdx_status_t st = PDX_INPROGRESS;
        PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
            st = pdx_xfer_check(x);
        }
        assert_int_equal(st, PDX_OK);
    }
    assert_int_equal(pdx_xfer_telemetry(x, &t), PDX_OK);
    assert_string_equal(t.backend, mock_backend_ops.name);
    assert_int_equal(t.descs, 8);
    assert_int_equal(t.segments, 4);
    assert_int_equal(t.bytes, 8 * 4096);
    assert_int_equal(t.posts, 3);
    assert_int_equal(t.status, PDX_OK);
    assert_true(t.start_time_ns > 1600000000ull * 1000000000ull);
    /* A new message for the next post (NIXL's transfer(h, notif_msg)). */
    struct {
        int n;
        char last[16];
    } got = {0, ""};
    while (pdx_notif_poll(b.agent, on_note, NULL) > 0) {
    }
    assert_int_equal(pdx_xfer_set_notif(x, "second", 6), PDX_OK);
    assert_true(pdx_xfer_post(x) >= 0);
    pdx_status_t st2 = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st2 == PDX_INPROGRESS, 30000) {
        st2 = pdx_xfer_check(x);
    }
    assert_int_equal(st2, PDX_OK);
    for (int i = 0; i < 1000 && got.n == 0; i++) {
        pdx_notif_poll(b.agent, on_note_keep, &got);
    }
    assert_int_equal(got.n, 1);
    assert_string_equal(got.last, "second");
    pdx_xfer_release(x);

    pdx_stats_t s;
    assert_int_equal(pdx_stats_peer(a.agent, a.peer, &s), PDX_OK);
    assert_int_equal(s.requests, 4);
    assert_int_equal(s.completed, 4);
    assert_int_equal(s.bytes, 4 * 8 * 4096);
    assert_int_equal(s.errors, 0);
    assert_int_equal(pdx_stats_backend(a.agent, mock_backend_ops.name, &s),
                     PDX_OK);
    assert_int_equal(s.completed, 4);
    assert_int_equal(pdx_stats_backend(a.agent, "nope", &s),
                     PDX_ERR_NOT_FOUND);
    ASSERT_ERR_NAMES("nope");
    /* An aborted post counts as canceled. */
    mock_hold_completion = 1;
    assert_int_equal(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &ll, &rl,
                                     a.peer, NULL, 0, &x),
                     PDX_OK);
    assert_int_equal(pdx_xfer_post(x), PDX_INPROGRESS);
    pdx_xfer_release(x);
    mock_hold_completion = 0;
    assert_int_equal(pdx_stats_peer(a.agent, a.peer, &s), PDX_OK);
    assert_int_equal(s.requests, 5);
    assert_int_equal(s.canceled, 1);
    char *json = NULL;
    assert_int_equal(pdx_stats_json(a.agent, &json), PDX_OK);
    assert_non_null(strstr(json, "\"name\": \"tel-d\""));
    assert_non_null(strstr(json, "\"completed\": 4"));
    pdx_blob_free(json);
    pdx_peer_info_t info;
    pdx_region_info_t reg[2];
    assert_int_equal(pdx_peer_info(a.agent, a.peer, &info, reg, 2), PDX_OK);
    assert_int_equal(info.nregions, 1);
    assert_int_equal(reg[0].addr, (uintptr_t)b.mem);
    assert_int_equal(reg[0].len, MB);
    assert_true(info.same_host);
    assert_int_equal(info.state, PDX_OK);
    side_fini(&a);
    side_fini(&b);
}

/* PDX_REGION_F_READONLY: the flag travels in the description; no transfer
 * lands in such a region (a peer's WRITE, a local READ), both refused at
 * create and make naming the region; READs from it and WRITEs from it
 * work. Unknown registration flags are refused. */
static void test_readonly_regions(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "ro-a", 0);
    side_init(&b, "ro-b", 0);
    unsigned char *bro = malloc(4096), *aro = malloc(4096);
    assert_non_null(bro);
    assert_non_null(aro);
    for (int i = 0; i < 4096; i++) {
        bro[i] = (unsigned char)(i * 7 + 1);
        aro[i] = (unsigned char)(i * 5 + 3);
    }
    pdx_mem_reg_h rb, ra, bad;
    assert_int_equal(pdx_mem_register(b.agent, PDX_MEM_DRAM,
                                      (uintptr_t)bro, 4096, 0,
                                      PDX_REGION_F_READONLY, &rb),
                     PDX_OK);
    assert_int_equal(pdx_mem_register(a.agent, PDX_MEM_DRAM,
                                      (uintptr_t)aro, 4096, 0,
                                      PDX_REGION_F_READONLY, &ra),
                     PDX_OK);
    EXPECT_INVALID(pdx_mem_register(a.agent, PDX_MEM_DRAM,
                                    (uintptr_t)(aro + 1), 1, 0, 1ull << 40,
                                    &bad),
                   "unknown flags");
    connect_pair(&a, &b);

    pdx_desc_t mine = {(uintptr_t)a.mem, 4096, 0, 0};
    pdx_desc_t theirs_ro = {(uintptr_t)bro, 4096, 0, 0};
    pdx_desc_t theirs = {(uintptr_t)b.mem, 4096, 0, 0};
    pdx_desc_t mine_ro = {(uintptr_t)aro, 4096, 0, 0};
    pdx_desc_list_t l = {PDX_MEM_DRAM, &mine, 1};
    pdx_desc_list_t r_ro = {PDX_MEM_DRAM, &theirs_ro, 1};
    pdx_desc_list_t r = {PDX_MEM_DRAM, &theirs, 1};
    pdx_desc_list_t l_ro = {PDX_MEM_DRAM, &mine_ro, 1};
    pdx_xfer_h x;
    EXPECT_INVALID(pdx_xfer_create(a.agent, PDX_XFER_WRITE, &l, &r_ro,
                                   a.peer, NULL, 0, &x),
                   "read-only");
    EXPECT_INVALID(pdx_xfer_create(a.agent, PDX_XFER_READ, &l_ro, &r,
                                   a.peer, NULL, 0, &x),
                   "read-only");
    /* Prepared lists: the same refusals at make. */
    pdx_dlist_h dl, dr_ro, dl_ro, dr;
    assert_int_equal(pdx_dlist_prepare(a.agent, NULL, &l, &dl), PDX_OK);
    assert_int_equal(pdx_dlist_prepare(a.agent, a.peer, &r_ro, &dr_ro),
                     PDX_OK);
    assert_int_equal(pdx_dlist_prepare(a.agent, NULL, &l_ro, &dl_ro),
                     PDX_OK);
    assert_int_equal(pdx_dlist_prepare(a.agent, a.peer, &r, &dr), PDX_OK);
    uint32_t idx = 0;
    EXPECT_INVALID(pdx_xfer_make(a.agent, PDX_XFER_WRITE, dl, &idx, dr_ro,
                                 &idx, 1, NULL, 0, &x),
                   "read-only");
    EXPECT_INVALID(pdx_xfer_make(a.agent, PDX_XFER_READ, dl_ro, &idx, dr,
                                 &idx, 1, NULL, 0, &x),
                   "read-only");
    /* Reading from b's read-only region and writing from a's work. */
    pdx_xfer_h ok[2];
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_READ, dl, &idx, dr_ro,
                                   &idx, 1, NULL, 0, &ok[0]),
                     PDX_OK);
    assert_int_equal(pdx_xfer_make(a.agent, PDX_XFER_WRITE, dl_ro, &idx, dr,
                                   &idx, 1, NULL, 0, &ok[1]),
                     PDX_OK);
    for (int k = 0; k < 2; k++) {
        assert_true(pdx_xfer_post(ok[k]) >= 0);
        pdx_status_t st = PDX_INPROGRESS;
        PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
            st = pdx_xfer_check(ok[k]);
        }
        assert_int_equal(st, PDX_OK);
        pdx_xfer_release(ok[k]);
    }
    assert_memory_equal(a.mem, bro, 4096);
    assert_memory_equal(b.mem, aro, 4096);
    pdx_dlist_release(dl);
    pdx_dlist_release(dr_ro);
    pdx_dlist_release(dl_ro);
    pdx_dlist_release(dr);
    side_fini(&a);
    side_fini(&b);
    free(bro);
    free(aro);
}

int main(void)
{
    pdx_log_set_handler(quiet, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_handles),
        cmocka_unit_test(test_released_handles),
        cmocka_unit_test(test_readonly_regions),
        cmocka_unit_test(test_last_error_per_thread),
        cmocka_unit_test(test_telemetry_and_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
