/* test_backend_ucx --suite transfer: two instances in one process moving
 * pattern-filled memory both ways (1, 1,000 and 100,000 pieces, 1 MiB
 * pieces, a threaded run), the notification after the data, release of a
 * request in flight, notification order, the event fd, describe. */
#include "ucx_test.h"

/* ---- a connected pair ------------------------------------------------- */

typedef struct pair {
    fake_host_t ha, hb;
    void *a, *b;
    void *peer_ab, *peer_ba; /* a's handle of b, b's handle of a */
    uint8_t *mem_a, *mem_b;
    void *md_a, *md_b;
    void *rmd_ab, *rmd_ba; /* b's region loaded in a, a's in b */
} pair_t;

static void progress_both(pair_t *p)
{
    ops->progress(p->a);
    ops->progress(p->b);
}

int pair_setup(void **state)
{
    pair_t *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    fake_host_init(&p->ha, "test-agent-a");
    fake_host_init(&p->hb, "test-agent-b");
    assert_int_equal(create_instance(&p->ha, g_tls, &p->a), PDX_OK);
    assert_int_equal(create_instance(&p->hb, g_tls, &p->b), PDX_OK);

    void *ca, *cb;
    size_t la, lb;
    assert_int_equal(ops->conn_info(p->a, &ca, &la), PDX_OK);
    assert_int_equal(ops->conn_info(p->b, &cb, &lb), PDX_OK);
    assert_int_equal(
        ops->peer_connect(p->a, "test-agent-b", cb, lb, &p->peer_ab), PDX_OK);
    assert_int_equal(
        ops->peer_connect(p->b, "test-agent-a", ca, la, &p->peer_ba), PDX_OK);
    free(ca);
    free(cb);

    assert_int_equal(posix_memalign((void **)&p->mem_a, 4096, REGION_LEN), 0);
    assert_int_equal(posix_memalign((void **)&p->mem_b, 4096, REGION_LEN), 0);
    fill_pattern(p->mem_a, REGION_LEN, 1);
    fill_pattern(p->mem_b, REGION_LEN, 2);
    pdx_region_t ra = {.addr = (uint64_t)(uintptr_t)p->mem_a,
                       .len = REGION_LEN,
                       .mem_type = PDX_MEM_DRAM,
                       .shm_fd = -1};
    pdx_region_t rb = {.addr = (uint64_t)(uintptr_t)p->mem_b,
                       .len = REGION_LEN,
                       .mem_type = PDX_MEM_DRAM,
                       .shm_fd = -1};
    assert_int_equal(ops->mem_register(p->a, &ra, &p->md_a), PDX_OK);
    assert_int_equal(ops->mem_register(p->b, &rb, &p->md_b), PDX_OK);

    void *ka, *kb;
    size_t kla, klb;
    assert_int_equal(ops->mem_pack(p->a, p->md_a, &ka, &kla), PDX_OK);
    assert_int_equal(ops->mem_pack(p->b, p->md_b, &kb, &klb), PDX_OK);
    assert_int_equal(ops->rmem_load(p->a, p->peer_ab, &rb, kb, klb, &p->rmd_ab),
                     PDX_OK);
    assert_int_equal(ops->rmem_load(p->b, p->peer_ba, &ra, ka, kla, &p->rmd_ba),
                     PDX_OK);
    free(ka);
    free(kb);
    *state = p;
    return 0;
}

int pair_teardown(void **state)
{
    pair_t *p = *state;
    /* Let anything still queued drain before the endpoints close. */
    for (int i = 0; i < 100; i++) {
        progress_both(p);
    }
    /* Closing an endpoint flushes it, which may need the other side. */
    bg_t bg;
    ops->rmem_unload(p->a, p->rmd_ab);
    bg_start(&bg, p->b);
    ops->peer_disconnect(p->a, p->peer_ab);
    bg_stop(&bg);
    ops->rmem_unload(p->b, p->rmd_ba);
    bg_start(&bg, p->a);
    ops->peer_disconnect(p->b, p->peer_ba);
    bg_stop(&bg);
    /* Disconnect never waits for the peer (it may be hung): closes still
     * in flight finish with progress, as an agent's progress thread gives
     * them. Both sides progress until they are done (bounded). */
    for (int i = 0; i < 200; i++) {
        progress_both(p);
        usleep(500);
    }
    ops->mem_deregister(p->a, p->md_a);
    ops->mem_deregister(p->b, p->md_b);
    ops->destroy(p->a);
    ops->destroy(p->b);
    free(p->mem_a);
    free(p->mem_b);
    free(p);
    return 0;
}

/* Build `n` pieces of `len` bytes: source piece i takes block i mod nb,
 * destination a fixed permutation of it, so repeats write identical bytes. */
static pdx_backend_iov_t *make_iov(pair_t *p, pdx_xfer_op_t op, size_t n,
                                   uint64_t len, size_t *ncheck_p)
{
    uint64_t nb = REGION_LEN / len;
    pdx_backend_iov_t *iov = calloc(n, sizeof(*iov));
    assert_non_null(iov);
    /* 7919 is prime and larger than any nb here, hence coprime with nb
     * unless it divides it; the modular map is then a permutation. */
    for (size_t i = 0; i < n; i++) {
        uint64_t src_blk = i % nb;
        uint64_t dst_blk = (src_blk * 7919u + 13u) % nb;
        uint64_t a_off = (op == PDX_XFER_WRITE ? src_blk : dst_blk) * len;
        uint64_t b_off = (op == PDX_XFER_WRITE ? dst_blk : src_blk) * len;
        iov[i].local_addr = (uint64_t)(uintptr_t)p->mem_a + a_off;
        iov[i].remote_addr = (uint64_t)(uintptr_t)p->mem_b + b_off;
        iov[i].len = len;
        iov[i].local_md = p->md_a;
        iov[i].remote_md = p->rmd_ab;
    }
    *ncheck_p = n < nb ? n : (size_t)nb;
    return iov;
}

/* One transfer initiated by a, with a notification that b receives; the
 * callback checks the landed data. With `threaded`, b is progressed by its
 * own thread, as in a real deployment. Returns bytes per second. */
static double run_xfer_mode(pair_t *p, pdx_xfer_op_t op, size_t n, uint64_t len,
                            const char *label, int threaded)
{
    static unsigned next_id = 1;
    size_t ncheck;
    pdx_backend_iov_t *iov = make_iov(p, op, n, len, &ncheck);
    uint8_t *src = op == PDX_XFER_WRITE ? p->mem_a : p->mem_b;
    uint8_t *dst = op == PDX_XFER_WRITE ? p->mem_b : p->mem_a;
    uint64_t seed = op == PDX_XFER_WRITE ? 11 : 22;
    fill_pattern(src, REGION_LEN, seed);
    memset(dst, 0xee, REGION_LEN);

    expect_t e = {
        .active = 1,
        .id = next_id++,
        .iov = iov,
        .n = n,
        .ncheck = ncheck,
        .op = op,
        .src_seed = seed,
        .src_base_local = p->mem_a,
        .src_base_remote = p->mem_b,
    };
    p->hb.expect = &e;
    char msg[32];
    int ml = snprintf(msg, sizeof(msg), "xfer %u", e.id);

    bg_t bg;
    if (threaded) {
        bg_start(&bg, p->b);
    }
    uint64_t t0 = pdx_now_ns();
    void *req = NULL;
    pdx_status_t st =
        ops->xfer_post(p->a, p->peer_ab, op, iov, n, msg, (size_t)ml, &req);
    uint64_t deadline = t0 + DEADLINE_NS;
    while ((st == PDX_INPROGRESS ||
            !__atomic_load_n(&e.arrived, __ATOMIC_ACQUIRE)) &&
           pdx_now_ns() < deadline) {
        if (threaded) {
            ops->progress(p->a);
        } else {
            progress_both(p);
        }
        if (st == PDX_INPROGRESS) {
            st = ops->xfer_check(p->a, req);
        }
    }
    if (threaded) {
        bg_stop(&bg);
    }
    uint64_t t1 = e.arrived ? e.arrived_ns : pdx_now_ns();
    if (req != NULL) {
        ops->xfer_release(p->a, req);
    }
    p->hb.expect = NULL;
    assert_int_equal(st, PDX_OK);
    assert_true(e.arrived);
    assert_true(e.data_ok);
    assert_string_equal(p->hb.last_peer, "test-agent-a");
    /* Bytes outside the pieces were not touched. */
    uint64_t nb = REGION_LEN / len;
    uint8_t *hit = calloc(nb, 1);
    assert_non_null(hit);
    for (size_t i = 0; i < ncheck; i++) {
        hit[(i * 7919u + 13u) % nb] = 1;
    }
    for (uint64_t b = 0; b < nb; b++) {
        if (!hit[b]) {
            assert_true(dst[b * len] == 0xee && dst[b * len + len - 1] == 0xee);
        }
    }
    assert_true(nb * len == REGION_LEN || dst[REGION_LEN - 1] == 0xee);
    free(hit);
    free(iov);
    double secs = (double)(t1 - t0) / 1e9;
    double bps = secs > 0 ? (double)n * (double)len / secs : 0;
    printf("[ ucx %s%s tls=%s ] %-5s %6zu x %8" PRIu64 " B: %8.3f ms, "
           "%6.2f GB/s\n",
           label, threaded ? " threaded" : "", g_tls,
           op == PDX_XFER_WRITE ? "write" : "read", n, len, secs * 1e3,
           bps / 1e9);
    return bps;
}

static double run_xfer(pair_t *p, pdx_xfer_op_t op, size_t n, uint64_t len,
                       const char *label)
{
    return run_xfer_mode(p, op, n, len, label, 0);
}

/* Throughput with the target on its own progress thread (numbers only;
 * the machine is shared, so nothing is asserted about speed). */
void test_xfer_threaded(void **state)
{
    pair_t *p = *state;
    for (int op = 0; op < 2; op++) {
        run_xfer_mode(p, (pdx_xfer_op_t)op, 64, 1ull << 20, "1MiB", 1);
        run_xfer_mode(p, (pdx_xfer_op_t)op, g_quick ? 1000 : 20000, 8448,
                      "8448", 1);
    }
}

void test_xfer_small(void **state)
{
    pair_t *p = *state;
    for (int op = 0; op < 2; op++) {
        run_xfer(p, (pdx_xfer_op_t)op, 1, 8448, "8448");
        run_xfer(p, (pdx_xfer_op_t)op, 1000, 8448, "8448");
    }
    /* The first transfer gave a same-host peer over shared memory a worker
     * of its own (its replies then never queue behind another sender's
     * half-written message in a shared receive FIFO); over tcp alone
     * none. Only the initiator (a) made one. */
    int mm = strstr(g_tls, "posix") != NULL || strstr(g_tls, "sysv") != NULL;
    assert_int_equal(describe_count(p->a, "peer_workers=auto("), mm ? 1 : 0);
    assert_int_equal(describe_count(p->b, "peer_workers=auto("), 0);
}

void test_xfer_100k(void **state)
{
    pair_t *p = *state;
    size_t n = g_quick ? 10000 : 100000;
    run_xfer(p, PDX_XFER_WRITE, n, 8448, "8448");
    run_xfer(p, PDX_XFER_READ, n, 8448, "8448");
}

void test_xfer_large(void **state)
{
    pair_t *p = *state;
    for (int op = 0; op < 2; op++) {
        run_xfer(p, (pdx_xfer_op_t)op, 5, 41984, "41984");
        run_xfer(p, (pdx_xfer_op_t)op, 64, 1ull << 20, "1MiB");
        /* Bigger than max_chunk: the backend splits it. */
        run_xfer(p, (pdx_xfer_op_t)op, 1, 48ull << 20, "48MiB");
    }
}

/* Without a notification the request alone says when data is in. */
void test_xfer_no_notif(void **state)
{
    pair_t *p = *state;
    size_t ncheck;
    pdx_backend_iov_t *iov = make_iov(p, PDX_XFER_WRITE, 300, 41984, &ncheck);
    fill_pattern(p->mem_a, REGION_LEN, 5);
    memset(p->mem_b, 0, REGION_LEN);
    unsigned notifs = p->hb.notifs;
    void *req = NULL;
    pdx_status_t st = ops->xfer_post(p->a, p->peer_ab, PDX_XFER_WRITE, iov, 300,
                                     NULL, 0, &req);
    uint64_t deadline = pdx_now_ns() + DEADLINE_NS;
    while (st == PDX_INPROGRESS && pdx_now_ns() < deadline) {
        progress_both(p);
        st = ops->xfer_check(p->a, req);
    }
    assert_int_equal(st, PDX_OK);
    if (req != NULL) {
        ops->xfer_release(p->a, req);
    }
    expect_t e = {.iov = iov,
                  .n = 300,
                  .ncheck = ncheck,
                  .op = PDX_XFER_WRITE,
                  .src_seed = 5,
                  .src_base_local = p->mem_a,
                  .src_base_remote = p->mem_b};
    assert_true(verify_expect(&e));
    for (int i = 0; i < 100; i++) {
        progress_both(p);
    }
    assert_int_equal(p->hb.notifs, notifs);
    free(iov);
}

/* Releasing in-flight requests must not leak or crash, and the instance
 * keeps working afterwards. A READ release waits (bounded) until no byte
 * can land any more; the peer's progress thread lets it finish. */
/* Wait (bounded) until everything a posted to b before has landed: a
 * 64-byte WRITE without notification, whose flush covers every earlier
 * operation on the endpoint, released requests' included. */
static void fence(pair_t *p)
{
    pdx_backend_iov_t iov = {.local_addr = (uint64_t)(uintptr_t)p->mem_a,
                             .remote_addr = (uint64_t)(uintptr_t)p->mem_b,
                             .len = 64,
                             .local_md = p->md_a,
                             .remote_md = p->rmd_ab};
    void *req = NULL;
    pdx_status_t st = ops->xfer_post(p->a, p->peer_ab, PDX_XFER_WRITE, &iov,
                                     1, NULL, 0, &req);
    uint64_t deadline = pdx_now_ns() + DEADLINE_NS;
    while (st == PDX_INPROGRESS && pdx_now_ns() < deadline) {
        progress_both(p);
        st = ops->xfer_check(p->a, req);
    }
    if (req != NULL) {
        ops->xfer_release(p->a, req);
    }
    assert_int_equal(st, PDX_OK);
}

void test_xfer_release_inflight(void **state)
{
    pair_t *p = *state;
    size_t ncheck;
    unsigned before = p->hb.notifs;
    /* Small enough to drain well within the bound, even under valgrind. */
    size_t n = g_quick ? 100 : 500;
    for (int op = 0; op < 2; op++) {
        pdx_backend_iov_t *iov =
            make_iov(p, (pdx_xfer_op_t)op, n, 8448, &ncheck);
        void *req = NULL;
        pdx_status_t st = ops->xfer_post(p->a, p->peer_ab, (pdx_xfer_op_t)op,
                                         iov, n, "released", 8, &req);
        assert_true(st == PDX_OK || st == PDX_INPROGRESS);
        if (st == PDX_INPROGRESS) {
            bg_t bg;
            bg_start(&bg, p->b);
            uint64_t t0 = pdx_now_ns();
            ops->xfer_release(p->a, req);
            double ms = (double)(pdx_now_ns() - t0) / 1e6;
            bg_stop(&bg);
            printf("[ ucx release tls=%s ] %s in flight released in %.1f ms\n",
                   g_tls, op == PDX_XFER_READ ? "read" : "write", ms);
            assert_true(ms < 5000.0); /* drained, not timed out */
        }
        free(iov);
    }
    for (int i = 0; i < 2000; i++) {
        progress_both(p);
    }
    /* Released is not landed: UCX still carries the released requests'
     * puts and gets (more so when the endpoint was made by the first of
     * them, over tcp still connecting). A flush covers every operation
     * posted before it on the endpoint: after it, nothing of theirs can
     * land in the next transfer's buffers. */
    fence(p);
    /* A released request never sends its notification after release; an
     * already-complete one (PDX_OK at post) did. */
    assert_true(p->hb.notifs - before <= 2);
    assert_int_equal(p->ha.peer_errors, 0);
    assert_int_equal(p->hb.peer_errors, 0);
    run_xfer(p, PDX_XFER_WRITE, 10, 8448, "after-release");
}

/* Standalone notifications arrive in order, whatever their size (small
 * eager, large possibly rendezvous). */
void test_notif_order(void **state)
{
    pair_t *p = *state;
    static const size_t sizes[] = {16, 100, 5000, 100000, 16, 300000, 17};
    const unsigned count = 70;
    p->ha.nrecv = 0;
    for (unsigned t = 0; t < count; t++) {
        size_t len = sizes[t % (sizeof(sizes) / sizeof(sizes[0]))];
        uint8_t *msg = malloc(len);
        assert_non_null(msg);
        memset(msg, 0, 16);
        snprintf((char *)msg, 16, "note %u", t);
        for (size_t i = 16; i < len; i++) {
            msg[i] = (uint8_t)(t + i);
        }
        assert_int_equal(ops->notif_send(p->b, p->peer_ba, msg, len), PDX_OK);
        free(msg);
    }
    uint64_t deadline = pdx_now_ns() + DEADLINE_NS;
    while (p->ha.nrecv < count && pdx_now_ns() < deadline) {
        progress_both(p);
    }
    assert_int_equal(p->ha.nrecv, count);
    for (unsigned t = 0; t < count; t++) {
        assert_int_equal(p->ha.recv_tag[t], t);
        assert_true(p->ha.recv_ok[t]);
        assert_int_equal(p->ha.recv_len[t],
                         sizes[t % (sizeof(sizes) / sizeof(sizes[0]))]);
    }
    assert_string_equal(p->ha.last_peer, "test-agent-b");
}

/* The event fd wakes a waiter when a notification arrives. */
void test_event_fd(void **state)
{
    pair_t *p = *state;
    int fd = ops->event_fd(p->a);
    assert_true(fd >= 0);
    pdx_status_t st = PDX_ERR_BUSY;
    for (int i = 0; i < 1000 && st == PDX_ERR_BUSY; i++) {
        progress_both(p);
        st = ops->arm(p->a);
    }
    assert_int_equal(st, PDX_OK);
    unsigned before = p->ha.nrecv;
    char msg[16] = "note 7";
    for (size_t i = 16; i < sizeof(msg); i++) {
        msg[i] = 0;
    }
    assert_int_equal(ops->notif_send(p->b, p->peer_ba, msg, sizeof(msg)),
                     PDX_OK);
    uint64_t deadline = pdx_now_ns() + 5ull * 1000000000ull;
    int woke = 0;
    while (!woke && pdx_now_ns() < deadline) {
        ops->progress(p->b); /* tcp: the sender side must move too */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        woke = poll(&pfd, 1, 10) == 1;
    }
    assert_true(woke);
    deadline = pdx_now_ns() + DEADLINE_NS;
    while (p->ha.nrecv == before && pdx_now_ns() < deadline) {
        progress_both(p);
    }
    assert_int_equal(p->ha.nrecv, before + 1);
}

void test_describe(void **state)
{
    pair_t *p = *state;
    char line[512];
    ops->describe(p->a, line, sizeof(line));
    printf("[ ucx describe ] %s\n", line);
    assert_non_null(strstr(line, "ucx "));
    assert_null(strchr(line, '\n'));
    assert_null(strstr(line, "lanes=?"));
    /* Nothing used yet: no peer has a worker of its own. */
    assert_non_null(strstr(line, "peer_workers=auto(0)"));
}
