/* Region-removal notices in one process (issue 21, item 4), over the mock
 * backend (tests/core): a deregistration told to a loaded peer refuses its
 * lists and requests on that region (STALE) and nothing else; the notices
 * never reach the application's queue; the application cannot send one;
 * malformed or foreign notices from a peer are dropped without effect. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent_int.h"
#include "backend_int.h"
#include "peer_int.h"
#include "ctl.h"
#include "mock_backend.h"
#include <pdx/pdx.h>
#include "poll_until.h"

#define LEN 65536

typedef struct side {
    pdx_agent_h a;
    unsigned char *m1, *m2;
    pdx_mem_reg_h r1, r2;
} side_t;

static int g_notes;

static void on_note(void *arg, const char *peer, const void *msg, size_t len)
{
    (void)arg, (void)peer, (void)msg, (void)len;
    g_notes++;
}

static void side_init(side_t *s, const char *name)
{
    assert_int_equal(pdx_agent_create(name, NULL, &s->a), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(s->a, &mock_backend_ops,
                                                 NULL, 0, NULL),
                     PDX_OK);
    s->m1 = calloc(1, LEN);
    s->m2 = calloc(1, LEN);
    assert_non_null(s->m1);
    assert_non_null(s->m2);
    memset(s->m1, 0x11, LEN);
    memset(s->m2, 0x22, LEN);
    assert_int_equal(pdx_mem_register(s->a, PDX_MEM_DRAM, (uintptr_t)s->m1,
                                      LEN, 0, 0, &s->r1),
                     PDX_OK);
    assert_int_equal(pdx_mem_register(s->a, PDX_MEM_DRAM, (uintptr_t)s->m2,
                                      LEN, 0, 0, &s->r2),
                     PDX_OK);
}

static void load(side_t *into, side_t *from)
{
    assert_int_equal(ctl_load_agent(into->a, from->a, NULL), PDX_OK);
}

static pdx_status_t run(pdx_xfer_h x, side_t *other)
{
    pdx_status_t st = pdx_xfer_post(x);
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_xfer_check(x);
        pdx_progress(other->a);
    }
    return st;
}

/* B's READ of [off, +len) of A's region `addr` into B's m1. */
static pdx_status_t read_once(side_t *b, side_t *a, uint64_t addr)
{
    pdx_desc_t ld = {.addr = (uintptr_t)b->m1, .len = 4096};
    pdx_desc_t rd = {.addr = addr, .len = 4096};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &ld, 1}, rl = {PDX_MEM_DRAM, &rd, 1};
    pdx_xfer_h x;
    pdx_status_t st = pdx_xfer_create(b->a, PDX_XFER_READ, &ll, &rl, "A",
                                      NULL, 0, &x);
    if (st != PDX_OK) {
        return st;
    }
    st = run(x, a);
    pdx_xfer_release(x);
    return st;
}

/* What A's backend would carry to B, bypassing pdx_notif_send's check. */
static void raw_send(side_t *a, const void *msg, size_t len)
{
    pthread_mutex_lock(&a->a->lock);
    pdx_peer_t *p = pdx_peer_find(a->a, "B");
    assert_non_null(p);
    assert_int_equal(a->a->backends[0]->ops->notif_send(
                         a->a->backends[0]->be, p->bpeer[0], msg, len),
                     PDX_OK);
    pthread_mutex_unlock(&a->a->lock);
}

static void test_removal_told(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "A");
    side_init(&b, "B");
    load(&b, &a);
    load(&a, &b);
    pdx_desc_t ld[2] = {{.addr = (uintptr_t)b.m1, .len = 4096},
                        {.addr = (uintptr_t)b.m2, .len = 4096}};
    pdx_desc_t rd[2] = {{.addr = (uintptr_t)a.m1, .len = 4096},
                        {.addr = (uintptr_t)a.m2, .len = 4096}};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, ld, 2}, rl = {PDX_MEM_DRAM, rd, 2};
    pdx_dlist_h lh, rh;
    assert_int_equal(pdx_dlist_prepare(b.a, NULL, &ll, &lh), PDX_OK);
    assert_int_equal(pdx_dlist_prepare(b.a, "A", &rl, &rh), PDX_OK);
    uint32_t i0 = 0, i1 = 1;
    pdx_xfer_h x1, x2;
    assert_int_equal(pdx_xfer_make(b.a, PDX_XFER_READ, lh, &i0, rh, &i0, 1,
                                   NULL, 0, &x1),
                     PDX_OK);
    assert_int_equal(pdx_xfer_make(b.a, PDX_XFER_READ, lh, &i1, rh, &i1, 1,
                                   NULL, 0, &x2),
                     PDX_OK);
    assert_int_equal(run(x1, &a), PDX_OK);
    assert_int_equal(b.m1[0], 0x11);

    /* A deregisters its first region (B is in this process: told, not
     * waited for); B learns it at its next progress. */
    assert_int_equal(pdx_mem_deregister(a.a, a.r1), PDX_OK);
    pdx_progress(b.a);
    pdx_progress(a.a); /* B's acknowledgement: consumed, not queued */
    assert_int_equal(run(x1, &a), PDX_ERR_STALE);
    pdx_xfer_h x3 = NULL;
    assert_int_equal(pdx_xfer_make(b.a, PDX_XFER_READ, lh, &i0, rh, &i0, 1,
                                   NULL, 0, &x3),
                     PDX_ERR_STALE);
    assert_int_equal(read_once(&b, &a, (uintptr_t)a.m1), PDX_ERR_NOT_FOUND);
    /* The region that stays works, through the old list and request. */
    memset(b.m2, 0, 4096);
    assert_int_equal(run(x2, &a), PDX_OK);
    assert_int_equal(b.m2[0], 0x22);
    assert_int_equal(read_once(&b, &a, (uintptr_t)a.m2), PDX_OK);
    g_notes = 0;
    assert_int_equal(pdx_notif_poll(a.a, on_note, NULL), 0);
    assert_int_equal(pdx_notif_poll(b.a, on_note, NULL), 0);

    pdx_xfer_release(x1);
    pdx_xfer_release(x2);
    pdx_dlist_release(lh);
    pdx_dlist_release(rh);
    pdx_agent_destroy(b.a);
    pdx_agent_destroy(a.a);
    free(a.m1), free(a.m2), free(b.m1), free(b.m2);
}

/* A notice that arrives after a newer blob of the peer was loaded (the
 * region registered again at the same place) is not taken for it. */
static void test_notice_after_newer_blob(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "A");
    side_init(&b, "B");
    load(&b, &a);
    load(&a, &b);
    assert_int_equal(pdx_mem_deregister(a.a, a.r1), PDX_OK); /* queued */
    assert_int_equal(pdx_mem_register(a.a, PDX_MEM_DRAM, (uintptr_t)a.m1,
                                      LEN, 0, 0, &a.r1),
                     PDX_OK);
    load(&b, &a); /* B sees the newer blob before the notice */
    pdx_progress(b.a);
    pdx_progress(a.a);
    assert_int_equal(read_once(&b, &a, (uintptr_t)a.m1), PDX_OK);
    assert_int_equal(b.m1[0], 0x11);
    pdx_agent_destroy(b.a);
    pdx_agent_destroy(a.a);
    free(a.m1), free(a.m2), free(b.m1), free(b.m2);
}

static void test_app_cannot_send(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "A");
    side_init(&b, "B");
    load(&b, &a);
    load(&a, &b);
    static const unsigned char pfx[8] = {0, 'P', 'D', 'X', 'C', 'T', 'L', 1};
    unsigned char msg[64] = {0};
    memcpy(msg, pfx, sizeof(pfx));
    assert_int_equal(pdx_notif_send(a.a, "B", msg, sizeof(msg)),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_notif_send(a.a, "B", msg, 8), PDX_ERR_INVALID);
    /* Shorter than the prefix, or one byte off: an ordinary message. */
    assert_int_equal(pdx_notif_send(a.a, "B", msg, 7), PDX_OK);
    msg[7] = 2;
    assert_int_equal(pdx_notif_send(a.a, "B", msg, 8), PDX_OK);
    msg[7] = 1;
    pdx_desc_t ld = {.addr = (uintptr_t)a.m1, .len = 16};
    pdx_desc_t rd = {.addr = (uintptr_t)b.m1, .len = 16};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &ld, 1}, rl = {PDX_MEM_DRAM, &rd, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a.a, PDX_XFER_WRITE, &ll, &rl, "B", msg,
                                     sizeof(msg), &x),
                     PDX_ERR_INVALID);
    pdx_progress(a.a);
    pdx_progress(b.a);
    g_notes = 0;
    assert_int_equal(pdx_notif_poll(b.a, on_note, NULL), 2);
    pdx_agent_destroy(b.a);
    pdx_agent_destroy(a.a);
    free(a.m1), free(a.m2), free(b.m1), free(b.m2);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* Untrusted input: every malformed or foreign notice is dropped, reaches
 * no application queue and changes nothing. */
static void test_bad_notices(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "A");
    side_init(&b, "B");
    load(&b, &a);
    load(&a, &b);
    static const unsigned char pfx[8] = {0, 'P', 'D', 'X', 'C', 'T', 'L', 1};
    unsigned char m[64];
    uint64_t inst = a.a->instance;
    /* A GONE for A's region m1 but of another instance or of a generation
     * B has loaded, one for a range A never registered, truncated and
     * over-long ones, unknown types, an ACK nobody waits for. */
    uint32_t gen = a.a->generation; /* what B loaded */
    uint32_t newer = gen + 1;
    struct {
        int type;
        uint64_t inst, addr, len;
        uint32_t gen;
        size_t n;
    } cases[] = {
        {1, inst ^ 1, (uintptr_t)a.m1, LEN, newer, 46},
        /* A's own, but B loaded that generation already: nothing new. */
        {1, inst, (uintptr_t)a.m1, LEN, gen, 46},
        {1, inst, (uintptr_t)a.m1, LEN, gen - 5, 46},
        {1, inst, (uintptr_t)a.m1 + 4096, 4096, newer, 46},
        {1, inst, (uintptr_t)a.m1, LEN + 1, newer, 46},
        {1, inst, (uintptr_t)a.m1, LEN, newer, 45},
        {1, inst, (uintptr_t)a.m1, LEN, newer, 47},
        {1, inst, (uintptr_t)a.m1, LEN, newer, 8},
        {1, inst, (uintptr_t)a.m1, LEN, newer, 9},
        {9, inst, (uintptr_t)a.m1, LEN, newer, 46},
        {0, inst, (uintptr_t)a.m1, LEN, newer, 46},
        {2, inst, 0, 0, 0, 25},
        {2, inst, 0, 0, 0, 26},
        {1, inst, UINT64_MAX - 10, UINT64_MAX, newer, 46},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memset(m, 0xee, sizeof(m));
        memcpy(m, pfx, 8);
        m[8] = (unsigned char)cases[i].type;
        put64(m + 9, cases[i].inst);
        put64(m + 17, 777 + i);
        m[25] = PDX_MEM_DRAM;
        put64(m + 26, cases[i].addr);
        put64(m + 34, cases[i].len);
        for (int k = 0; k < 4; k++) {
            m[42 + k] = (unsigned char)(cases[i].gen >> (8 * k));
        }
        raw_send(&a, m, cases[i].n);
        pdx_progress(b.a);
        pdx_progress(a.a);
    }
    g_notes = 0;
    assert_int_equal(pdx_notif_poll(b.a, on_note, NULL), 0);
    assert_int_equal(pdx_notif_poll(a.a, on_note, NULL), 0);
    /* Both of A's regions still read. */
    assert_int_equal(read_once(&b, &a, (uintptr_t)a.m1), PDX_OK);
    assert_int_equal(read_once(&b, &a, (uintptr_t)a.m2), PDX_OK);
    pdx_agent_destroy(b.a);
    pdx_agent_destroy(a.a);
    free(a.m1), free(a.m2), free(b.m1), free(b.m2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_removal_told),
        cmocka_unit_test(test_notice_after_newer_blob),
        cmocka_unit_test(test_app_cannot_send),
        cmocka_unit_test(test_bad_notices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
