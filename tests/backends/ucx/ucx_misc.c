/* test_backend_ucx --suite misc, in one process: the table, options good
 * and bad, connection modes, bad arguments. */
#include "ucx_test.h"

/* ---- misc: options and errors ----------------------------------------- */

void test_query_and_table(void **state)
{
    (void)state;
    char why[128] = "";
    assert_int_equal(ops->query(why, sizeof(why)), PDX_OK);
    assert_int_equal(ops->abi_version, PDX_BACKEND_ABI_VERSION);
    assert_int_equal(ops->size, sizeof(pdx_backend_ops_t));
    assert_string_equal(ops->name, "ucx");
    assert_true(ops->caps & PDX_BACKEND_CAP_NOTIF);
    /* CAP_VRAM: set where pdx was built with cuda.h (GPU memory natively
     * or staged; tests/system/vram covers it). */
    const void *const *fn = (const void *const *)&ops->query;
    size_t nfn =
        (sizeof(*ops) - offsetof(pdx_backend_ops_t, query)) / sizeof(void *);
    for (size_t i = 0; i < nfn; i++) {
        assert_non_null(fn[i]);
    }
}

void test_bad_options(void **state)
{
    (void)state;
    static const pdx_option_t bad[][1] = {
        {{"bogus", "1"}},      {{"max_chunk", "0"}},  {{"max_chunk", "12q"}},
        {{"max_chunk", "-5"}}, {{"max_chunk", "4g"}}, {{"tls", ""}},
        {{"allocate", "y"}},   {{"tls", NULL}},
        {{"keepalive_ms", "-1"}}, {{"keepalive_ms", "5s"}},
        {{"keepalive_ms", "3600001"}}, {{"keepalive_ms", ""}},
        {{"connect", "later"}}, {{"connect", ""}},
        {{"peer_workers", "on"}}, {{"peer_workers", ""}},
    };
    fake_host_t h;
    fake_host_init(&h, "test-opts");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        void *be = (void *)0x1;
        assert_int_equal(ops->create(&h.host, bad[i], 1, &be), PDX_ERR_CONFIG);
        assert_ptr_equal(be, (void *)0x1); /* untouched on failure */
    }
    /* Good ones work, and the instance says what it is. */
    pdx_option_t good[] = {{"tls", "tcp"}, {"max_chunk", "1m"},
                       {"keepalive_ms", "2500"}};
    void *be = NULL;
    assert_int_equal(ops->create(&h.host, good, 3, &be), PDX_OK);
    char line[512];
    ops->describe(be, line, sizeof(line));
    assert_non_null(strstr(line, "max_chunk=1048576"));
    assert_non_null(strstr(line, "tls=tcp"));
    assert_non_null(strstr(line, "keepalive_ms=2500"));
    ops->destroy(be);
    pdx_option_t off[] = {{"tls", "posix,sysv,self"}, {"peer_workers", "off"}};
    assert_int_equal(ops->create(&h.host, off, 2, &be), PDX_OK);
    assert_true(describe_has(be, "peer_workers=off(0)"));
    ops->destroy(be);
    /* The default: 5 s (idle cost, see ucx_create). */
    assert_int_equal(ops->create(&h.host, good, 1, &be), PDX_OK);
    ops->describe(be, line, sizeof(line));
    assert_non_null(strstr(line, "keepalive_ms=5000"));
    ops->destroy(be);
}

/* Endpoints at a peer's first use (connect=lazy, the default with tcp) or
 * at its load (connect=eager, the default without tcp). A peer no local
 * transport reaches (tcp here, shared memory alone there) is declined at
 * load when eager; when lazy it loads, and its first use fails with
 * PDX_ERR_UNSUPPORTED, the same at every use, without calling it dead. */
void test_connect_modes(void **state)
{
    (void)state;
    enum { LEN = 1 << 20, PIECE = 65536 };
    fake_host_t ha, he, hb, hc;
    fake_host_init(&ha, "test-lazy");
    fake_host_init(&he, "test-eager");
    fake_host_init(&hb, "test-target");
    fake_host_init(&hc, "test-sm-only");
    pdx_option_t tcp[] = {{"tls", "tcp"}, {"connect", "eager"}};
    pdx_option_t sm[] = {{"tls", "posix,sysv,self"}};
    void *a = NULL, *e = NULL, *b = NULL, *c = NULL;
    assert_int_equal(ops->create(&ha.host, tcp, 1, &a), PDX_OK);
    assert_int_equal(ops->create(&he.host, tcp, 2, &e), PDX_OK);
    assert_int_equal(ops->create(&hb.host, tcp, 1, &b), PDX_OK);
    assert_int_equal(ops->create(&hc.host, sm, 1, &c), PDX_OK);
    assert_true(describe_has(a, "connect=lazy"));
    assert_true(describe_has(e, "connect=eager"));
    assert_true(describe_has(c, "connect=eager"));

    /* The target's region, and the initiators' landing buffer. */
    uint8_t *mb = NULL, *ma = NULL;
    assert_int_equal(posix_memalign((void **)&mb, 4096, LEN), 0);
    assert_int_equal(posix_memalign((void **)&ma, 4096, LEN), 0);
    fill_pattern(mb, LEN, 7);
    memset(ma, 0, LEN);
    pdx_region_t rb = {.addr = (uint64_t)(uintptr_t)mb, .len = LEN,
                       .mem_type = PDX_MEM_DRAM, .shm_fd = -1};
    pdx_region_t ra = {.addr = (uint64_t)(uintptr_t)ma, .len = LEN,
                       .mem_type = PDX_MEM_DRAM, .shm_fd = -1};
    void *md_b = NULL, *md_c = NULL, *md_a = NULL;
    assert_int_equal(ops->mem_register(b, &rb, &md_b), PDX_OK);
    assert_int_equal(ops->mem_register(c, &rb, &md_c), PDX_OK);
    assert_int_equal(ops->mem_register(a, &ra, &md_a), PDX_OK);
    void *cb, *cc, *kb, *kc;
    size_t lb, lc, klb, klc;
    assert_int_equal(ops->conn_info(b, &cb, &lb), PDX_OK);
    assert_int_equal(ops->conn_info(c, &cc, &lc), PDX_OK);
    assert_int_equal(ops->mem_pack(b, md_b, &kb, &klb), PDX_OK);
    assert_int_equal(ops->mem_pack(c, md_c, &kc, &klc), PDX_OK);

    /* Lazy: loading the peer and its key makes no endpoint. */
    void *pab = NULL, *rmd_ab = NULL;
    assert_int_equal(ops->peer_connect(a, "test-target", cb, lb, &pab),
                     PDX_OK);
    assert_int_equal(ops->rmem_load(a, pab, &rb, kb, klb, &rmd_ab), PDX_OK);
    assert_int_equal(describe_count(a, "endpoints="), 0);
    assert_int_equal(describe_count(a, "peers="), 1);
    /* The first READ makes it, and lands byte for byte. */
    pdx_backend_iov_t iov = {.local_addr = ra.addr + PIECE,
                             .remote_addr = rb.addr + 3 * PIECE,
                             .len = PIECE,
                             .local_md = md_a,
                             .remote_md = rmd_ab};
    void *req = NULL;
    pdx_status_t st =
        ops->xfer_post(a, pab, PDX_XFER_READ, &iov, 1, NULL, 0, &req);
    uint64_t deadline = pdx_now_ns() + DEADLINE_NS;
    while (st == PDX_INPROGRESS && pdx_now_ns() < deadline) {
        ops->progress(b);
        ops->progress(a);
        st = ops->xfer_check(a, req);
    }
    if (req != NULL) {
        ops->xfer_release(a, req);
    }
    assert_int_equal(st, PDX_OK);
    assert_true(check_pattern(ma + PIECE, PIECE, 7, 3 * PIECE));
    assert_int_equal(ma[0], 0);
    assert_int_equal(describe_count(a, "endpoints="), 1);

    /* Eager: the endpoint comes with the load. */
    void *peb = NULL;
    assert_int_equal(ops->peer_connect(e, "test-target", cb, lb, &peb),
                     PDX_OK);
    assert_int_equal(describe_count(e, "endpoints="), 1);

    /* A peer with shared memory only: eager declines it at load... */
    void *pec = (void *)0x1;
    assert_int_equal(ops->peer_connect(e, "test-sm-only", cc, lc, &pec),
                     PDX_ERR_UNSUPPORTED);
    assert_int_equal(describe_count(e, "peers="), 1);
    /* ...lazy loads it, and its first use says why, every time. */
    void *pac = NULL, *rmd_ac = NULL;
    assert_int_equal(ops->peer_connect(a, "test-sm-only", cc, lc, &pac),
                     PDX_OK);
    assert_int_equal(ops->rmem_load(a, pac, &rb, kc, klc, &rmd_ac), PDX_OK);
    iov.remote_md = rmd_ac;
    for (int i = 0; i < 2; i++) {
        req = NULL;
        assert_int_equal(ops->xfer_post(a, pac, PDX_XFER_READ, &iov, 1, NULL,
                                        0, &req),
                         PDX_ERR_UNSUPPORTED);
        assert_null(req);
        assert_int_equal(ops->notif_send(a, pac, "x", 1),
                         PDX_ERR_UNSUPPORTED);
    }
    ops->progress(a);
    assert_int_equal(ha.peer_errors, 0);
    assert_int_equal(describe_count(a, "endpoints="), 1);
    /* A key loaded after the failure is refused the same way. */
    void *rmd2 = NULL;
    assert_int_equal(ops->rmem_load(a, pac, &rb, kc, klc, &rmd2),
                     PDX_ERR_UNSUPPORTED);

    ops->rmem_unload(a, rmd_ac);
    ops->peer_disconnect(a, pac);
    ops->rmem_unload(a, rmd_ab);
    bg_t bg;
    bg_start(&bg, b);
    ops->peer_disconnect(a, pab);
    ops->peer_disconnect(e, peb);
    bg_stop(&bg);
    for (int i = 0; i < 200; i++) {
        ops->progress(a);
        ops->progress(e);
        ops->progress(b);
        usleep(500);
    }
    free(cb);
    free(cc);
    free(kb);
    free(kc);
    ops->mem_deregister(a, md_a);
    ops->mem_deregister(b, md_b);
    ops->mem_deregister(c, md_c);
    ops->destroy(a);
    ops->destroy(e);
    ops->destroy(b);
    ops->destroy(c);
    free(ma);
    free(mb);
}

void test_bad_args(void **state)
{
    (void)state;
    fake_host_t h;
    fake_host_init(&h, "test-args");
    void *be = NULL;
    assert_int_equal(create_instance(&h, "tcp", &be), PDX_OK);
    uint8_t buf[64];
    pdx_region_t vram = {.addr = (uint64_t)(uintptr_t)buf,
                         .len = sizeof(buf),
                         .mem_type = PDX_MEM_VRAM,
                         .shm_fd = -1};
    pdx_region_t empty = {.addr = (uint64_t)(uintptr_t)buf,
                          .len = 0,
                          .mem_type = PDX_MEM_DRAM,
                          .shm_fd = -1};
    void *md = NULL;
    assert_int_equal(ops->mem_register(be, &vram, &md), PDX_ERR_UNSUPPORTED);
    assert_int_equal(ops->mem_register(be, &empty, &md), PDX_ERR_INVALID);
    assert_null(md);
    ops->destroy(be);
}
