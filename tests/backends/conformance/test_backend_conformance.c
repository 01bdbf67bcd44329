/* Backend conformance: one suite that any libpdx_backend_*.so must pass,
 * loaded by path (argv[1]) and driven through its ops table alone, with
 * two instances in this process as each other's peer:
 *
 *   the table      abi_version, size, name, caps; every op up to describe
 *                  wired; the later ones used where size has them and they
 *                  are wired (as the loader does; which are absent is said)
 *   create         an unknown option is PDX_ERR_CONFIG
 *   connect        conn_info both ways, peer_connect, describe, path
 *   memory         mem_register, mem_pack, rmem_load of the peer's key
 *   READ, WRITE    byte-exact pieces at odd offsets and lengths, nothing
 *                  written outside them
 *   notifications  with a request and standalone, exact bytes, the
 *                  sender's name (CAP_NOTIF only)
 *   abort          an in-flight request ends (PDX_ERR_CANCELED, or PDX_OK
 *                  when it finished first) in bounded time
 *   peer failure   peer_failed ends the peer's requests in bounded time
 *                  (PDX_ERR_REMOTE_DISCONNECT, or PDX_OK when done first)
 *
 * Usage: test_backend_conformance LIB [--vram] [--opt KEY=VALUE]...
 * --vram: the regions are GPU memory (PDX_MEM_VRAM, device 0), allocated
 * and checked through the CUDA driver (PDX_CUDA_DRIVER_LIB, else
 * libcuda.so.1; the fake driver of tests/fixtures without a GPU); --opt:
 * options for every instance (ucx's vram=staged, say).
 *
 * Exits 77 (skipped, with the reason) when the backend cannot run here
 * (query: no GPU for cuda_ipc), declines a same-process peer, or takes no
 * memory of the kind asked for (or --vram finds no driver or device). */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <pdx/backend.h> /* and pdx/types.h: PDX_NAME_MAX */

#include "die.h"
#include "pdx_clock.h"

#define SKIP_RC 77
#define REGION (8u << 20)
#define REGION_BYTES ((size_t)REGION)
#define DEADLINE_S 20.0

static const pdx_backend_ops_t *ops;
static const char *g_path;

/* What the host (the agent, here the test) was told by one instance. */
typedef struct host_ctx {
    int notes;
    char from[PDX_NAME_MAX];
    unsigned char msg[256];
    size_t len;
    int errors;
} host_ctx_t;

typedef struct side {
    const char *name;
    host_ctx_t ctx;
    pdx_backend_host_t host;
    void *be;
    void *peer; /* the other side, connected from this one */
    uint8_t *mem;  /* the region's bytes as the test sees them */
    uint64_t addr; /* the region: mem, or GPU memory (--vram) */
    void *md;      /* this side's region */
    void *rmd; /* the other side's region, loaded here */
} side_t;

static side_t A = {.name = "conf-A"}, B = {.name = "conf-B"};

static pdx_option_t g_opts[8];
static size_t g_nopts;
static int g_vram;

/* ---- --vram: GPU memory through the driver, by dlopen ----------------- */

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_dev_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(uint64_t *, size_t);
typedef int (*cu_free_t)(uint64_t);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, uint64_t, size_t);
static struct {
    cu_alloc_t alloc;
    cu_free_t free;
    cu_htod_t htod;
    cu_dtoh_t dtoh;
} cu;

static void skip_all(const char *fmt, ...);

/* Load the driver, make device 0's primary context current. */
static void cu_open(void)
{
    const char *lib = getenv("PDX_CUDA_DRIVER_LIB");
    void *h = dlopen(lib != NULL ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        skip_all("--vram: no CUDA driver (%s)", dlerror());
    }
    cu_init_t init = (cu_init_t)dlsym(h, "cuInit");
    cu_dev_get_t dev_get = (cu_dev_get_t)dlsym(h, "cuDeviceGet");
    cu_ctx_retain_t retain =
        (cu_ctx_retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_t set = (cu_ctx_set_t)dlsym(h, "cuCtxSetCurrent");
    cu.alloc = (cu_alloc_t)dlsym(h, "cuMemAlloc_v2");
    cu.free = (cu_free_t)dlsym(h, "cuMemFree_v2");
    cu.htod = (cu_htod_t)dlsym(h, "cuMemcpyHtoD_v2");
    cu.dtoh = (cu_dtoh_t)dlsym(h, "cuMemcpyDtoH_v2");
    int dev = 0;
    void *ctx = NULL;
    if (!init || !dev_get || !retain || !set || !cu.alloc || !cu.free ||
        !cu.htod || !cu.dtoh) {
        skip_all("--vram: the CUDA driver lacks an entry point");
    }
    if (init(0) != 0 || dev_get(&dev, 0) != 0 || retain(&ctx, dev) != 0 ||
        set(ctx) != 0) {
        skip_all("--vram: no CUDA device");
    }
}

/* The test's bytes to the region, and back (DRAM: the same bytes). */
static void push(const side_t *s)
{
    if (g_vram && cu.htod(s->addr, s->mem, REGION_BYTES) != 0) {
        fail_msg("cuMemcpyHtoD to %s's region failed", s->name);
    }
}

static void pull(const side_t *s)
{
    if (g_vram && cu.dtoh(s->mem, s->addr, REGION_BYTES) != 0) {
        fail_msg("cuMemcpyDtoH from %s's region failed", s->name);
    }
}

static void host_notif(void *c, const char *peer, const void *msg, size_t len)
{
    host_ctx_t *h = c;
    h->notes++;
    snprintf(h->from, sizeof(h->from), "%s", peer);
    h->len = len < sizeof(h->msg) ? len : sizeof(h->msg);
    memcpy(h->msg, msg, h->len);
}

static void host_err(void *c, const char *peer, pdx_status_t why)
{
    (void)peer, (void)why;
    ((host_ctx_t *)c)->errors++;
}

/* An op added after the first table (after describe): used, as the loader
 * does, only when the module's table is long enough to hold it and wires
 * it (one such op left NULL is how a backend says it has none). */
#define HAS(op) (ops->size > offsetof(pdx_backend_ops_t, op) && ops->op != NULL)

static void progress_both(void)
{
    ops->progress(A.be);
    ops->progress(B.be);
}

/* Progress both sides until `req` of A is final (bounded). */
static pdx_status_t drive(void *req)
{
    double end = pdx_now_s() + DEADLINE_S;
    pdx_status_t st;
    do {
        progress_both();
        st = ops->xfer_check(A.be, req);
    } while (st == PDX_INPROGRESS && pdx_now_s() < end);
    return st;
}

static pdx_status_t post(pdx_xfer_op_t op, const pdx_backend_iov_t *iov,
                         size_t n, const char *notif, void **req_p)
{
    *req_p = NULL;
    return ops->xfer_post(A.be, A.peer, op, iov, n, notif,
                          notif ? strlen(notif) : 0, req_p);
}

/* Post, drive to the end, release: the final status. */
static pdx_status_t run_xfer(pdx_xfer_op_t op, const pdx_backend_iov_t *iov,
                             size_t n, const char *notif)
{
    void *req;
    pdx_status_t st = post(op, iov, n, notif, &req);
    if (st == PDX_INPROGRESS) {
        st = drive(req);
        ops->xfer_release(A.be, req);
    }
    return st;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Three pieces at odd offsets and lengths, local on A, remote on B. */
typedef struct piece {
    size_t loc, rem, len;
} piece_t;
static const piece_t PIECES[3] = {{0, 4096, 1u << 20},
                                  {(2u << 20) + 7, (3u << 20) + 13, 65537},
                                  {5u << 20, 6u << 20, 3 * 4096}};

static void make_iov(pdx_backend_iov_t iov[3])
{
    for (int i = 0; i < 3; i++) {
        iov[i] =
            (pdx_backend_iov_t){.local_addr = A.addr + PIECES[i].loc,
                                .remote_addr = B.addr + PIECES[i].rem,
                                .len = PIECES[i].len,
                                .local_md = A.md,
                                .remote_md = A.rmd};
    }
}

/* dst must equal `want` except where the pieces put src's bytes. */
static void check_pieces(const uint8_t *dst, const uint8_t *want,
                         const uint8_t *src, int dst_is_local)
{
    uint8_t *exp = malloc(REGION);
    assert_non_null(exp);
    memcpy(exp, want, REGION);
    for (int i = 0; i < 3; i++) {
        size_t d = dst_is_local ? PIECES[i].loc : PIECES[i].rem;
        size_t s = dst_is_local ? PIECES[i].rem : PIECES[i].loc;
        memcpy(exp + d, src + s, PIECES[i].len);
    }
    size_t bad = REGION;
    for (size_t i = 0; i < REGION && bad == REGION; i++) {
        bad = dst[i] != exp[i] ? i : REGION;
    }
    uint8_t want_b = bad < REGION ? exp[bad] : 0;
    free(exp);
    if (bad < REGION) {
        fail_msg("byte %zu differs (got %02x, want %02x)", bad, dst[bad],
                 want_b);
    }
}

/* ---- the tests ------------------------------------------------------- */

static void test_table(void **state)
{
    (void)state;
    assert_int_equal(ops->abi_version, PDX_BACKEND_ABI_VERSION);
    assert_true(ops->size >= PDX_BACKEND_OPS_MIN_SIZE);
    assert_non_null(ops->name);
    assert_true(ops->name[0] != '\0');
    assert_true(ops->caps & (PDX_BACKEND_CAP_READ | PDX_BACKEND_CAP_WRITE));
    /* Every op up to describe is wired: an unsupported one returns
     * PDX_ERR_UNSUPPORTED, it is never NULL. */
    const void *const must[] = {
        (const void *)ops->query,           (const void *)ops->create,
        (const void *)ops->destroy,         (const void *)ops->conn_info,
        (const void *)ops->mem_register,    (const void *)ops->mem_deregister,
        (const void *)ops->mem_pack,        (const void *)ops->peer_connect,
        (const void *)ops->peer_disconnect, (const void *)ops->rmem_load,
        (const void *)ops->rmem_unload,     (const void *)ops->xfer_post,
        (const void *)ops->xfer_check,      (const void *)ops->xfer_release,
        (const void *)ops->notif_send,      (const void *)ops->progress,
        (const void *)ops->event_fd,        (const void *)ops->arm,
        (const void *)ops->describe};
    for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++) {
        if (must[i] == NULL) {
            fail_msg("%s: op %zu of the table is NULL", ops->name, i);
        }
    }
    printf("optional ops: xfer_abort %s, path %s, peer_failed %s\n",
           HAS(xfer_abort) ? "wired" : "absent", HAS(path) ? "wired" : "absent",
           HAS(peer_failed) ? "wired" : "absent");
    /* An event fd is advertised exactly when there is one. */
    int fd = ops->event_fd(A.be);
    if (ops->caps & PDX_BACKEND_CAP_EVENT_FD) {
        assert_true(fd >= 0);
    } else {
        assert_int_equal(fd, -1);
    }
}

static void test_unknown_option(void **state)
{
    (void)state;
    pdx_option_t opt = {"pdx_conformance_no_such_option", "1"};
    void *be = NULL;
    pdx_status_t st = ops->create(&A.host, &opt, 1, &be);
    if (st == PDX_OK) {
        ops->destroy(be);
    }
    assert_int_equal(st, PDX_ERR_CONFIG);
}

static void test_describe_path(void **state)
{
    (void)state;
    char buf[512] = "";
    ops->describe(A.be, buf, sizeof(buf));
    assert_true(buf[0] != '\0');
    if (HAS(path)) {
        char tr[64] = "", why[256] = "";
        pdx_status_t st =
            ops->path(A.be, A.peer, A.rmd, tr, sizeof(tr), why, sizeof(why));
        assert_true(st == PDX_OK || st == PDX_ERR_UNAVAILABLE);
        assert_true(tr[0] != '\0');
        if (st == PDX_ERR_UNAVAILABLE) {
            assert_true(why[0] != '\0'); /* a fallback says why */
        }
    }
}

static void test_read(void **state)
{
    (void)state;
    if (!(ops->caps & PDX_BACKEND_CAP_READ)) {
        skip();
    }
    uint8_t *before = malloc(REGION);
    assert_non_null(before);
    fill(A.mem, REGION, 1);
    fill(B.mem, REGION, 2);
    memcpy(before, A.mem, REGION);
    push(&A);
    push(&B);
    pdx_backend_iov_t iov[3];
    make_iov(iov);
    assert_int_equal(run_xfer(PDX_XFER_READ, iov, 3, NULL), PDX_OK);
    pull(&A);
    check_pieces(A.mem, before, B.mem, 1);
    free(before);
}

static void test_write(void **state)
{
    (void)state;
    if (!(ops->caps & PDX_BACKEND_CAP_WRITE)) {
        skip();
    }
    uint8_t *before = malloc(REGION);
    assert_non_null(before);
    fill(A.mem, REGION, 3);
    fill(B.mem, REGION, 4);
    memcpy(before, B.mem, REGION);
    push(&A);
    push(&B);
    pdx_backend_iov_t iov[3];
    make_iov(iov);
    assert_int_equal(run_xfer(PDX_XFER_WRITE, iov, 3, NULL), PDX_OK);
    pull(&B);
    check_pieces(B.mem, before, A.mem, 0);
    free(before);
}

/* B has heard `msg` from A (bounded wait). */
static void expect_note(const char *msg)
{
    double end = pdx_now_s() + DEADLINE_S;
    while (B.ctx.notes == 0 && pdx_now_s() < end) {
        progress_both();
    }
    assert_int_equal(B.ctx.notes, 1);
    assert_string_equal(B.ctx.from, A.name);
    assert_int_equal(B.ctx.len, strlen(msg));
    assert_memory_equal(B.ctx.msg, msg, strlen(msg));
    B.ctx.notes = 0;
}

static void test_notifications(void **state)
{
    (void)state;
    if (!(ops->caps & PDX_BACKEND_CAP_NOTIF)) {
        skip(); /* the agent sends them itself */
    }
    B.ctx.notes = 0;
    pdx_xfer_op_t op =
        (ops->caps & PDX_BACKEND_CAP_READ) ? PDX_XFER_READ : PDX_XFER_WRITE;
    pdx_backend_iov_t iov[3];
    make_iov(iov);
    assert_int_equal(run_xfer(op, iov, 3, "pdx-conformance done 1"), PDX_OK);
    expect_note("pdx-conformance done 1");
    const char *m = "pdx-conformance standalone";
    assert_int_equal(ops->notif_send(A.be, A.peer, m, strlen(m)), PDX_OK);
    expect_note(m);
}

/* The whole region in one piece: large enough to be in flight a while. */
static pdx_status_t post_big(void **req_p)
{
    pdx_backend_iov_t iov = {.local_addr = A.addr,
                             .remote_addr = B.addr,
                             .len = REGION,
                             .local_md = A.md,
                             .remote_md = A.rmd};
    pdx_xfer_op_t op =
        (ops->caps & PDX_BACKEND_CAP_READ) ? PDX_XFER_READ : PDX_XFER_WRITE;
    return post(op, &iov, 1, NULL, req_p);
}

static void test_abort(void **state)
{
    (void)state;
    if (!HAS(xfer_abort)) {
        skip();
    }
    void *req;
    pdx_status_t st = post_big(&req);
    if (st == PDX_OK) {
        printf("abort: the request completed at once, nothing to abort\n");
        return;
    }
    assert_int_equal(st, PDX_INPROGRESS);
    pdx_status_t ast = ops->xfer_abort(A.be, req);
    assert_true(ast == PDX_OK || ast == PDX_INPROGRESS);
    st = drive(req);
    ops->xfer_release(A.be, req);
    printf("abort: in flight, ended %s\n", st == PDX_ERR_CANCELED ? "canceled"
                                           : st == PDX_OK         ? "done first"
                                                          : "otherwise");
    if (st != PDX_ERR_CANCELED && st != PDX_OK) {
        fail_msg("aborted request ended %d, not PDX_ERR_CANCELED (%d) or "
                 "PDX_OK",
                 (int)st, (int)PDX_ERR_CANCELED);
    }
}

/* Last: the peer is failed for good afterwards. */
static void test_peer_failed(void **state)
{
    (void)state;
    if (!HAS(peer_failed)) {
        skip();
    }
    void *req;
    pdx_status_t st = post_big(&req);
    ops->peer_failed(A.be, A.peer);
    if (st == PDX_INPROGRESS) {
        st = drive(req);
        ops->xfer_release(A.be, req);
        printf("peer failure: in flight, ended %s\n",
               st == PDX_ERR_REMOTE_DISCONNECT ? "disconnected"
               : st == PDX_OK                  ? "done first"
                                               : "otherwise");
        if (st != PDX_ERR_REMOTE_DISCONNECT && st != PDX_OK) {
            fail_msg("request of a failed peer ended %d, not "
                     "PDX_ERR_REMOTE_DISCONNECT (%d) or PDX_OK",
                     (int)st, (int)PDX_ERR_REMOTE_DISCONNECT);
        }
    } else {
        assert_int_equal(st, PDX_OK);
    }
}

/* ---- setup: load, query, two connected instances with a region each --- */

static void skip_all(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP %s: ", g_path);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    exit(SKIP_RC);
}

static void op_failed(const char *what, pdx_status_t st)
    __attribute__((noreturn));
static void op_failed(const char *what, pdx_status_t st)
{
    die("%s: %s: %s failed: %d", g_path, ops->name, what, (int)st);
}

static void side_init(side_t *s)
{
    s->host = (pdx_backend_host_t){.agent_ctx = &s->ctx,
                                   .agent_name = s->name,
                                   .host_id = "pdx-conformance-host",
                                   .notif_recv = host_notif,
                                   .peer_error = host_err};
    pdx_status_t st = ops->create(&s->host, g_opts, g_nopts, &s->be);
    if (st != PDX_OK) {
        op_failed("create", st);
    }
    s->mem = aligned_alloc(4096, REGION);
    if (s->mem == NULL) {
        op_failed("aligned_alloc", PDX_ERR_NOMEM);
    }
    memset(s->mem, 0, REGION);
    s->addr = (uintptr_t)s->mem;
    if (g_vram) {
        if (cu.alloc(&s->addr, REGION) != 0) {
            op_failed("cuMemAlloc", PDX_ERR_NOMEM);
        }
        if (cu.htod(s->addr, s->mem, REGION) != 0) {
            op_failed("cuMemcpyHtoD", PDX_ERR_INVALID);
        }
    }
}

static pdx_region_t region_of(const side_t *s)
{
    return (pdx_region_t){.addr = s->addr,
                          .len = REGION,
                          .mem_type = g_vram ? PDX_MEM_VRAM : PDX_MEM_DRAM,
                          .shm_fd = -1};
}

static void connect_to(side_t *s, side_t *o)
{
    void *conn = NULL;
    size_t len = 0;
    pdx_status_t st = ops->conn_info(o->be, &conn, &len);
    if (st != PDX_OK) {
        op_failed("conn_info", st);
    }
    st = ops->peer_connect(s->be, o->name, conn, len, &s->peer);
    free(conn);
    if (st == PDX_ERR_UNSUPPORTED) {
        skip_all("%s declines a peer in the same process", ops->name);
    }
    if (st != PDX_OK) {
        op_failed("peer_connect", st);
    }
}

static void load_region(side_t *s, side_t *o)
{
    void *key = NULL;
    size_t len = 0;
    pdx_status_t st = ops->mem_pack(o->be, o->md, &key, &len);
    if (st != PDX_OK) {
        op_failed("mem_pack", st);
    }
    pdx_region_t r = region_of(o);
    st = ops->rmem_load(s->be, s->peer, &r, key, len, &s->rmd);
    free(key);
    if (st != PDX_OK) {
        op_failed("rmem_load", st);
    }
}

static void setup_pair(void)
{
    side_init(&A);
    side_init(&B);
    connect_to(&A, &B);
    connect_to(&B, &A);
    side_t *sides[2] = {&A, &B};
    for (int i = 0; i < 2; i++) {
        pdx_region_t r = region_of(sides[i]);
        pdx_status_t st = ops->mem_register(sides[i]->be, &r, &sides[i]->md);
        if (st == PDX_ERR_UNSUPPORTED) {
            skip_all("%s registers no %s memory", ops->name,
                     g_vram ? "GPU (VRAM)" : "host (DRAM)");
        }
        if (st != PDX_OK) {
            op_failed("mem_register", st);
        }
    }
    load_region(&A, &B);
    load_region(&B, &A);
}

static void teardown_pair(void)
{
    side_t *sides[2] = {&A, &B};
    for (int i = 0; i < 2; i++) {
        ops->rmem_unload(sides[i]->be, sides[i]->rmd);
    }
    for (int i = 0; i < 2; i++) {
        ops->mem_deregister(sides[i]->be, sides[i]->md);
        ops->peer_disconnect(sides[i]->be, sides[i]->peer);
    }
    for (int i = 0; i < 2; i++) {
        ops->destroy(sides[i]->be);
        if (g_vram) {
            cu.free(sides[i]->addr);
        }
        free(sides[i]->mem);
    }
}

int main(int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        char *eq;
        if (strcmp(argv[i], "--vram") == 0) {
            g_vram = 1;
        } else if (strcmp(argv[i], "--opt") == 0 && i + 1 < argc &&
                   g_nopts < sizeof(g_opts) / sizeof(g_opts[0]) &&
                   (eq = strchr(argv[i + 1], '=')) != NULL) {
            *eq = '\0';
            g_opts[g_nopts++] = (pdx_option_t){argv[i + 1], eq + 1};
            i++;
        } else {
            argc = 0; /* usage */
        }
    }
    if (argc < 2) {
        fprintf(stderr,
                "usage: test_backend_conformance path/to/"
                "libpdx_backend_NAME.so [--vram] [--opt KEY=VALUE]...\n");
        return 2;
    }
    g_path = argv[1];
    void *h = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", g_path, dlerror());
        return 1;
    }
    ops = dlsym(h, PDX_BACKEND_SYMBOL);
    if (ops == NULL) {
        fprintf(stderr, "%s: no %s\n", g_path, PDX_BACKEND_SYMBOL);
        return 1;
    }
    char why[512] = "";
    pdx_status_t st = ops->query(why, sizeof(why));
    if (st != PDX_OK) {
        skip_all("%s cannot run here: %s", ops->name,
                 why[0] ? why : "no reason given");
    }
    if (g_vram) {
        cu_open();
    }
    setup_pair();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_describe_path),
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_write),
        cmocka_unit_test(test_notifications),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_peer_failed),
    };
    printf("backend %s (%s), caps 0x%llx, table %u bytes, %s regions\n",
           ops->name, g_path, (unsigned long long)ops->caps, ops->size,
           g_vram ? "VRAM" : "DRAM");
    int rc = cmocka_run_group_tests_name(ops->name, tests, NULL, NULL);
    teardown_pair();
    dlclose(h);
    return rc;
}
