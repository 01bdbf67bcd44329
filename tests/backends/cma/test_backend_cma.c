/* cma backend, through its ops table, with this process as its own peer:
 * shared-memory regions are mapped and copied with memcpy (inline, or in
 * two-lane chunks by the worker and the checking thread), regions whose
 * key cannot be mapped fall back to process_vm_readv/writev (inline in
 * post with many pieces per call, or in the same chunks and lanes), a
 * fault fails a request cleanly, corrupt keys are refused, and an abort
 * of a chunked request ends it. Also cma_copy
 * (cma_copy.h) on its own: every variant byte-exact at every length up to
 * 300 and some large ones, every relative misalignment and destination
 * offset, nothing written outside the destination. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pdx/backend.h>

#include "cma_copy_int.h"
#include "pdx_clock.h"

#define MB (1ull << 20)
#define LEN (24 * MB)

static const pdx_backend_ops_t *ops;

static void host_notif(void *c, const char *p, const void *m, size_t l)
{
    (void)c, (void)p, (void)m, (void)l;
}
static void host_err(void *c, const char *p, pdx_status_t w)
{
    (void)c, (void)p, (void)w;
}

typedef struct side {
    void *be, *peer, *md, *rmd;
    int fd;         /* memfd behind `mem` (shared) or -1 */
    uint8_t *mem;   /* local: LEN bytes */
    uint8_t *other; /* the region the peer side exposes */
} side_t;

static pdx_backend_host_t g_host = {.agent_name = "t",
                                    .host_id = "cma-test-host",
                                    .notif_recv = host_notif,
                                    .peer_error = host_err};

/* An instance; `inline_max` is inline_max's value, or "key=value" for
 * another option (NULL: the defaults). */
static void *make_be(const char *inline_max)
{
    pdx_option_t opt = {"inline_max", inline_max};
    char key[32];
    const char *eq = inline_max ? strchr(inline_max, '=') : NULL;
    if (eq != NULL) {
        snprintf(key, sizeof(key), "%.*s", (int)(eq - inline_max),
                 inline_max);
        opt = (pdx_option_t){key, eq + 1};
    }
    void *be = NULL;
    assert_int_equal(ops->create(&g_host, inline_max ? &opt : NULL,
                                 inline_max ? 1 : 0, &be),
                     PDX_OK);
    return be;
}

/* A region of LEN bytes: memfd-backed and flagged shared, or private. */
static uint8_t *alloc_region(int shared, int *fd_p)
{
    *fd_p = -1;
    if (!shared) {
        uint8_t *p = aligned_alloc(4096, LEN);
        assert_non_null(p);
        return p;
    }
    int fd = memfd_create("cma-test", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)LEN), 0);
    uint8_t *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    *fd_p = fd;
    return p;
}

static void free_region(uint8_t *p, int fd)
{
    if (fd >= 0) {
        munmap(p, LEN);
        close(fd);
    } else {
        free(p);
    }
}

static pdx_region_t region_of(uint8_t *p, int fd)
{
    return (pdx_region_t){.addr = (uintptr_t)p,
                          .len = LEN,
                          .mem_type = PDX_MEM_DRAM,
                          .flags = fd >= 0 ? PDX_REGION_F_SHARED : 0,
                          .shm_fd = fd};
}

/* Initiator instance `be` connected to itself (pid = ours), the target
 * region registered on `tbe` and loaded on `be` from its (maybe edited)
 * key. */
typedef struct pair {
    void *be, *tbe, *peer;
    uint8_t *loc, *tgt;
    int loc_fd, tgt_fd;
    void *lmd, *tmd, *rmd;
} pair_t;

typedef void (*key_edit_t)(uint8_t *key, size_t *len);

/* Bytes of a shared target region the target writes before its key is
 * loaded (the pages its memfd has then; test_populate). */
static size_t g_touch_before_load;

static pdx_status_t pair_init(pair_t *p, int shared, const char *inline_max,
                              key_edit_t edit)
{
    memset(p, 0, sizeof(*p));
    p->be = make_be(inline_max);
    p->tbe = make_be(NULL);
    p->loc = alloc_region(0, &p->loc_fd);
    p->tgt = alloc_region(shared, &p->tgt_fd);
    pdx_region_t lr = region_of(p->loc, -1), tr = region_of(p->tgt, p->tgt_fd);
    assert_int_equal(ops->mem_register(p->be, &lr, &p->lmd), PDX_OK);
    assert_int_equal(ops->mem_register(p->tbe, &tr, &p->tmd), PDX_OK);
    void *conn, *key;
    size_t conn_len, key_len;
    assert_int_equal(ops->conn_info(p->tbe, &conn, &conn_len), PDX_OK);
    assert_int_equal(ops->peer_connect(p->be, "t", conn, conn_len, &p->peer),
                     PDX_OK);
    free(conn);
    assert_int_equal(ops->mem_pack(p->tbe, p->tmd, &key, &key_len), PDX_OK);
    /* addr, len (+ fd, inode, offset), then the revocation word's part */
    assert_int_equal(key_len, (shared ? 36 : 16) + 24);
    uint8_t kb[64];
    memcpy(kb, key, key_len);
    free(key);
    if (edit != NULL) {
        edit(kb, &key_len);
    }
    pdx_region_t peer_r = tr;
    peer_r.flags = 0;
    peer_r.shm_fd = -1;
    if (shared && g_touch_before_load > 0) {
        memset(p->tgt, 0x11, g_touch_before_load);
    }
    return ops->rmem_load(p->be, p->peer, &peer_r, kb, key_len, &p->rmd);
}

static void pair_fini(pair_t *p)
{
    if (p->rmd != NULL) {
        ops->rmem_unload(p->be, p->rmd);
    }
    ops->peer_disconnect(p->be, p->peer);
    ops->mem_deregister(p->be, p->lmd);
    ops->mem_deregister(p->tbe, p->tmd);
    ops->destroy(p->be);
    ops->destroy(p->tbe);
    free_region(p->loc, -1);
    free_region(p->tgt, p->tgt_fd);
}

/* Bytes moved by memcpy of mapped memory / by process_vm_*. */
static void moved(void *be, unsigned long long *map, unsigned long long *vm)
{
    char d[256];
    ops->describe(be, d, sizeof(d));
    assert_int_equal(sscanf(d, "same host: %llu bytes by memcpy into/out of "
                               "peers' shared memory, %llu by "
                               "process_vm_readv/writev",
                            map, vm),
                     2);
}

/* Check until done, at most 30 s. */
static pdx_status_t wait_req(pair_t *p, void *req, pdx_status_t st)
{
    uint64_t end = pdx_now_ms() + 30000;
    while (st == PDX_INPROGRESS && pdx_now_ms() < end) {
        st = ops->xfer_check(p->be, req);
    }
    return st;
}

static pdx_status_t run(pair_t *p, pdx_xfer_op_t op,
                        const pdx_backend_iov_t *iov, size_t n)
{
    void *req = NULL;
    pdx_status_t st = ops->xfer_post(p->be, p->peer, op, iov, n, NULL, 0, &req);
    st = wait_req(p, req, st);
    if (req != NULL) {
        ops->xfer_release(p->be, req);
    }
    return st;
}

static uint8_t pat(uint64_t off, unsigned salt)
{
    return (uint8_t)((off * 2654435761u >> 13) ^ salt);
}

/* Pieces of awkward sizes (1 B, odd, around the 64 B lane split and the
 * 1 MiB chunk, several MiB) at scattered offsets, WRITE then READ, every
 * byte checked, including the bytes around each piece (nothing outside
 * it is touched). */
static void transfer_mix(pair_t *p, unsigned salt)
{
    static const uint64_t sizes[] = {1,       63,          64,       65,
                                     127,     4095,        8448,     41984,
                                     MB - 1,  MB,          MB + 7,   3 * MB + 5,
                                     2,       3502592 / 7, 129,      5 * MB};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    pdx_backend_iov_t iov[N];
    uint64_t off = 100;
    for (size_t i = 0; i < N; i++) {
        iov[i] = (pdx_backend_iov_t){.local_addr = (uintptr_t)p->loc + off,
                                     .remote_addr = (uintptr_t)p->tgt + off + 3,
                                     .len = sizes[i],
                                     .local_md = p->lmd,
                                     .remote_md = p->rmd};
        off += sizes[i] + 131;
    }
    assert_true(off + 3 < LEN);
    for (uint64_t o = 0; o < LEN; o++) {
        p->loc[o] = pat(o, salt);
    }
    memset(p->tgt, 0xee, LEN);
    assert_int_equal(run(p, PDX_XFER_WRITE, iov, N), PDX_OK);
    size_t k = 0;
    for (uint64_t o = 0; o < LEN; o++) {
        int inside = 0;
        for (k = 0; k < N; k++) {
            uint64_t s = iov[k].remote_addr - (uintptr_t)p->tgt;
            if (o >= s && o < s + iov[k].len) {
                inside = 1;
                break;
            }
        }
        uint8_t want = inside ? pat(o - 3, salt) : 0xee;
        if (p->tgt[o] != want) {
            fail_msg("WRITE: target byte %llu is 0x%02x, want 0x%02x",
                     (unsigned long long)o, p->tgt[o], want);
        }
        if (!inside && o > off + 16) {
            break; /* the rest was never named */
        }
    }
    /* READ it back into a cleared local region. */
    memset(p->loc, 0, LEN);
    assert_int_equal(run(p, PDX_XFER_READ, iov, N), PDX_OK);
    for (size_t i = 0; i < N; i++) {
        uint64_t s = iov[i].local_addr - (uintptr_t)p->loc;
        for (uint64_t b = 0; b < iov[i].len; b++) {
            if (p->loc[s + b] != pat(s + b, salt)) {
                fail_msg("READ: piece %zu byte %llu differs", i,
                         (unsigned long long)b);
            }
        }
        assert_int_equal(p->loc[s - 1], 0);
        assert_int_equal(p->loc[s + iov[i].len], 0);
    }
}

/* One pair, the mixed transfer, and which way the bytes went. */
static void mix_case(int shared, const char *inline_max, key_edit_t edit,
                     unsigned salt, int want_mapped)
{
    pair_t p;
    assert_int_equal(pair_init(&p, shared, inline_max, edit), PDX_OK);
    transfer_mix(&p, salt);
    unsigned long long map, vm;
    moved(p.be, &map, &vm);
    if (want_mapped) {
        assert_true(map > 0);
        assert_int_equal(vm, 0);
    } else {
        assert_int_equal(map, 0);
        assert_true(vm > 0);
    }
    pair_fini(&p);
}

/* inline_max 0: every request goes through the chunks and lanes. */
static void test_shared_chunked(void **state)
{
    (void)state;
    mix_case(1, "0", NULL, 7, 1);
}

static void test_shared_inline(void **state)
{
    (void)state;
    mix_case(1, "1073741824", NULL, 9, 1);
}

static void test_private(void **state)
{
    (void)state;
    mix_case(0, NULL, NULL, 11, 0);
}

/* process_vm requests: every one in post (no thread), or every one in
 * chunks and lanes (worker and caller). */
static void test_private_inline(void **state)
{
    (void)state;
    mix_case(0, "pvm_inline_max=1073741824", NULL, 12, 0);
}

static void test_private_chunked(void **state)
{
    (void)state;
    mix_case(0, "pvm_inline_max=0", NULL, 13, 0);
}

/* A small process_vm request is done when post returns: PDX_OK, no
 * request to check or release, the bytes there; many pieces go in one
 * call (a 300-piece request); a larger one is in flight after post, and
 * the caller's checks copy part of it (lane 0) while the worker takes
 * the rest. */
static void test_private_post_inline(void **state)
{
    (void)state;
    pair_t p;
    assert_int_equal(pair_init(&p, 0, NULL, NULL), PDX_OK);
    enum { N = 300 };
    pdx_backend_iov_t iov[N];
    for (int i = 0; i < N; i++) {
        iov[i] = (pdx_backend_iov_t){
            .local_addr = (uintptr_t)p.loc + (uint64_t)i * 1000,
            .remote_addr = (uintptr_t)p.tgt + (uint64_t)i * 1000 + 1,
            .len = 777, .local_md = p.lmd, .remote_md = p.rmd};
    }
    for (uint64_t o = 0; o < 2 * MB; o++) {
        p.tgt[o] = pat(o, 5);
    }
    memset(p.loc, 0, 2 * MB);
    void *req = NULL;
    unsigned long long map, vm0, vm1;
    moved(p.be, &map, &vm0);
    assert_int_equal(ops->xfer_post(p.be, p.peer, PDX_XFER_READ, iov, N, NULL,
                                    0, &req),
                     PDX_OK);
    assert_null(req);
    moved(p.be, &map, &vm1);
    assert_int_equal(vm1 - vm0, (unsigned long long)N * 777);
    for (int i = 0; i < N; i++) {
        for (int b = 0; b < 777; b++) {
            if (p.loc[i * 1000 + b] != pat((uint64_t)i * 1000 + 1 + b, 5)) {
                fail_msg("piece %d byte %d differs", i, b);
            }
        }
        assert_int_equal(p.loc[i * 1000 + 777], 0);
    }
    /* 1 MiB + 1: over the 256 KiB default, so queued. */
    pdx_backend_iov_t big = {.local_addr = (uintptr_t)p.loc,
                             .remote_addr = (uintptr_t)p.tgt,
                             .len = MB + 1,
                             .local_md = p.lmd,
                             .remote_md = p.rmd};
    memset(p.loc, 0, 2 * MB);
    assert_int_equal(ops->xfer_post(p.be, p.peer, PDX_XFER_READ, &big, 1,
                                    NULL, 0, &req),
                     PDX_INPROGRESS);
    assert_int_equal(wait_req(&p, req, PDX_INPROGRESS), PDX_OK);
    ops->xfer_release(p.be, req);
    for (uint64_t o = 0; o < MB + 1; o++) {
        if (p.loc[o] != pat(o, 5)) {
            fail_msg("big READ: byte %llu differs", (unsigned long long)o);
        }
    }
    assert_int_equal(p.loc[MB + 1], 0);
    pair_fini(&p);
}

/* A process_vm request into a range the peer has not mapped fails with
 * the errno's status, inline or chunked, and later requests still work. */
static void test_private_fault(void **state)
{
    (void)state;
    const char *opts[] = {NULL, "pvm_inline_max=0"};
    for (int k = 0; k < 2; k++) {
        pair_t p;
        assert_int_equal(pair_init(&p, 0, opts[k], NULL), PDX_OK);
        pdx_backend_iov_t iov[2] = {
            {.local_addr = (uintptr_t)p.loc, .remote_addr = (uintptr_t)p.tgt,
             .len = 4096, .local_md = p.lmd, .remote_md = p.rmd},
            {.local_addr = (uintptr_t)p.loc + 8192, .remote_addr = 4096,
             .len = 4096, .local_md = p.lmd, .remote_md = p.rmd}};
        pdx_status_t st = run(&p, PDX_XFER_READ, iov, 2);
        printf("  unmapped remote range (%s): %s\n",
               k ? "chunked" : "inline", pdx_status_string(st));
        assert_true(st < 0);
        assert_int_equal(run(&p, PDX_XFER_READ, iov, 1), PDX_OK);
        pair_fini(&p);
    }
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void edit_inode(uint8_t *k, size_t *len)
{
    (void)len;
    k[20] ^= 0x5a; /* another file's inode */
}
static void edit_fd(uint8_t *k, size_t *len)
{
    (void)len;
    k[16] = 0xfe, k[17] = 0x7f, k[18] = 0, k[19] = 0; /* no such fd */
}
static void edit_offset(uint8_t *k, size_t *len)
{
    (void)len;
    put64(k + 28, 12345); /* not page-congruent with the address */
}
static void edit_huge_offset(uint8_t *k, size_t *len)
{
    (void)len;
    put64(k + 28, UINT64_MAX - 4095); /* wraps with the length */
}
static void edit_short(uint8_t *k, size_t *len)
{
    (void)k;
    *len = 20;
}
static void edit_addr(uint8_t *k, size_t *len)
{
    (void)len;
    k[0] ^= 1;
}

/* A key that cannot be mapped: loaded anyway, bytes go by process_vm_*,
 * still exact. */
static void test_unmappable_keys_fall_back(void **state)
{
    (void)state;
    key_edit_t edits[] = {edit_inode, edit_fd, edit_offset, edit_huge_offset};
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        mix_case(1, "0", edits[i], (unsigned)(20 + i), 0);
    }
}

static void test_corrupt_keys_refused(void **state)
{
    (void)state;
    key_edit_t edits[] = {edit_short, edit_addr};
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        pair_t p;
        assert_int_equal(pair_init(&p, 1, NULL, edits[i]), PDX_ERR_CORRUPT);
        p.rmd = NULL;
        pair_fini(&p);
    }
}

/* Abort a large chunked request right after post: it ends (canceled, or
 * done if it won the race) and release returns with nothing in flight. */
static void abort_chunked(int shared)
{
    pair_t p;
    assert_int_equal(pair_init(&p, shared, shared ? "0" : "pvm_inline_max=0",
                               NULL),
                     PDX_OK);
    pdx_backend_iov_t iov[20];
    for (int i = 0; i < 20; i++) {
        iov[i] = (pdx_backend_iov_t){.local_addr = (uintptr_t)p.loc + i * MB,
                                     .remote_addr = (uintptr_t)p.tgt + i * MB,
                                     .len = MB,
                                     .local_md = p.lmd,
                                     .remote_md = p.rmd};
    }
    int canceled = 0;
    for (int round = 0; round < 20; round++) {
        void *req = NULL;
        assert_int_equal(ops->xfer_post(p.be, p.peer, PDX_XFER_WRITE, iov, 20,
                                        NULL, 0, &req),
                         PDX_INPROGRESS);
        assert_int_equal(ops->xfer_abort(p.be, req), PDX_OK);
        pdx_status_t st = wait_req(&p, req, PDX_INPROGRESS);
        assert_true(st == PDX_ERR_CANCELED || st == PDX_OK);
        canceled += st == PDX_ERR_CANCELED;
        ops->xfer_release(p.be, req);
    }
    /* Released without a check, too. */
    void *req = NULL;
    assert_int_equal(ops->xfer_post(p.be, p.peer, PDX_XFER_READ, iov, 20, NULL,
                                    0, &req),
                     PDX_INPROGRESS);
    ops->xfer_release(p.be, req);
    printf("  %s: %d of 20 aborted requests ended canceled\n",
           shared ? "memcpy" : "process_vm", canceled);
    assert_true(canceled > 0);
    pair_fini(&p);
}

static void test_abort_chunked(void **state)
{
    (void)state;
    abort_chunked(1);
    abort_chunked(0);
}

/* What describe says of filling mapped regions ahead: bytes populated,
 * regions waiting; -1 when off, -2 when the kernel cannot. */
static int warm_state(void *be, unsigned long long *bytes)
{
    char d[512];
    ops->describe(be, d, sizeof(d));
    const char *s = strstr(d, "; ");
    unsigned waiting = 0;
    char how[64] = "";
    assert_non_null(s);
    if (sscanf(s, "; %llu bytes of peers' mapped memory populated ahead "
                  "(%u regions waiting)", bytes, &waiting) == 2) {
        return (int)waiting;
    }
    assert_int_equal(sscanf(s, "; %llu bytes of peers' mapped memory "
                               "populated ahead (%63[^)])", bytes, how), 2);
    return strcmp(how, "off") == 0 ? -1 : -2;
}

/* This process's other mapping of the target's memfd (the initiator's),
 * found in /proc/self/maps by inode: its start, or NULL. */
static uint8_t *peer_mapping(const pair_t *p)
{
    struct stat sb;
    assert_int_equal(fstat(p->tgt_fd, &sb), 0);
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    uint8_t *found = NULL;
    while (found == NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned long a, b, ino;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &a, &b, &ino) == 3 &&
            ino == (unsigned long)sb.st_ino && (uint8_t *)a != p->tgt) {
            found = (uint8_t *)a;
        }
    }
    fclose(f);
    return found;
}

/* Pages of [p, p + len) with a page table entry here (pagemap bit 63). */
static size_t present_pages(const uint8_t *p, size_t len)
{
    int fd = open("/proc/self/pagemap", O_RDONLY);
    assert_true(fd >= 0);
    size_t n = 0;
    for (size_t off = 0; off < len; off += 4096) {
        uint64_t e = 0;
        off_t at = (off_t)(((uintptr_t)p + off) / 4096 * 8);
        assert_int_equal(pread(fd, &e, 8, at), 8);
        n += (e >> 63) & 1;
    }
    close(fd);
    return n;
}

/* Once a peer's shared region is mapped, the worker fills its page
 * tables ahead of any copy: every page the target's memfd has is present
 * in this process's mapping, and none is added (the half the target never
 * wrote stays unallocated); populate=0 leaves the mapping to fault in; an
 * unload while the worker is at it waits for its step. */
static void test_populate(void **state)
{
    (void)state;
    pair_t p;
    unsigned long long bytes = 0;
    g_touch_before_load = LEN / 2;
    assert_int_equal(pair_init(&p, 1, NULL, NULL), PDX_OK);
    uint64_t end = pdx_now_ms() + 20000;
    int w;
    while ((w = warm_state(p.be, &bytes)) > 0 && pdx_now_ms() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (w == -2) {
        printf("populate: this kernel has no MADV_POPULATE_READ: skipped\n");
    } else {
        assert_int_equal(w, 0);
        assert_int_equal(bytes, LEN / 2);
        uint8_t *m = peer_mapping(&p);
        assert_non_null(m);
        assert_int_equal(present_pages(m, LEN / 2), LEN / 2 / 4096);
        assert_int_equal(present_pages(m + LEN / 2, LEN / 2), 0);
        struct stat sb;
        assert_int_equal(fstat(p.tgt_fd, &sb), 0);
        assert_int_equal((uint64_t)sb.st_blocks * 512, LEN / 2);
    }
    pair_fini(&p);

    g_touch_before_load = LEN;
    assert_int_equal(pair_init(&p, 1, "populate=0", NULL), PDX_OK);
    assert_int_equal(warm_state(p.be, &bytes), -1);
    assert_int_equal(bytes, 0);
    uint8_t *m = peer_mapping(&p);
    assert_non_null(m);
    assert_int_equal(present_pages(m, LEN), 0);
    pair_fini(&p);

    /* Unloaded at once, the worker maybe in a step of it. */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(pair_init(&p, 1, NULL, NULL), PDX_OK);
        pair_fini(&p);
    }
    g_touch_before_load = 0;
}

static void test_options(void **state)
{
    (void)state;
    void *be = NULL;
    pdx_option_t bad[] = {{"inline_max", "-1"}, {"inline_max", "12x"},
                      {"inline_max", ""}, {"speed", "1"},
                      {"pvm_inline_max", "x"}, {"pvm_inline_max", "-2"},
                      {"populate", "2"}, {"populate", "yes"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(ops->create(&g_host, &bad[i], 1, &be), PDX_ERR_CONFIG);
    }
}

/* cma_copy and its variants. */
typedef void (*copy_fn_t)(void *dst, const void *src, size_t len);

#define GUARD 64

/* `fn` copies `len` bytes for every source offset and destination offset
 * 0..63 (so every relative misalignment at every destination alignment):
 * the source is an allocation of exactly soff + len bytes (ASan sees an
 * over-read), the destination sits between GUARD guard bytes on each
 * side, and a byte that is not the source's or a guard that changed
 * fails. The source bytes are a non-periodic sequence, so a copy from a
 * shifted offset differs. */
static void copy_grid(copy_fn_t fn, const char *name, size_t len)
{
    size_t dcap = GUARD + 64 + len + GUARD;
    uint8_t *dbuf = NULL;
    uint8_t *guard = malloc(dcap);
    assert_int_equal(posix_memalign((void **)&dbuf, 64, dcap), 0);
    assert_non_null(guard);
    for (size_t i = 0; i < dcap; i++) {
        guard[i] = (uint8_t)(0xa5 ^ (i * 29));
    }
    for (size_t soff = 0; soff < 64; soff++) {
        uint8_t *sbuf = NULL;
        size_t slen = soff + len > 0 ? soff + len : 1;
        assert_int_equal(posix_memalign((void **)&sbuf, 64, slen), 0);
        uint8_t *src = sbuf + soff;
        uint32_t x = (uint32_t)(len * 64 + soff) * 2654435761u + 1;
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            src[i] = (uint8_t)(x >> 11);
        }
        for (size_t doff = 0; doff < 64; doff++) {
            memcpy(dbuf, guard, dcap);
            uint8_t *dst = dbuf + GUARD + doff;
            fn(dst, src, len);
            if (len > 0 && memcmp(dst, src, len) != 0) {
                size_t i = 0;
                while (dst[i] == src[i]) {
                    i++;
                }
                fail_msg("%s: len %zu, src offset %zu, dst offset %zu: "
                         "byte %zu is 0x%02x, want 0x%02x",
                         name, len, soff, doff, i, dst[i], src[i]);
            }
            size_t end = GUARD + doff + len;
            if (memcmp(dbuf, guard, GUARD + doff) != 0 ||
                memcmp(dbuf + end, guard + end, dcap - end) != 0) {
                fail_msg("%s: len %zu, src offset %zu, dst offset %zu: "
                         "a guard byte changed",
                         name, len, soff, doff);
            }
        }
        free(sbuf);
    }
    free(dbuf);
    free(guard);
}

typedef struct copy_variant {
    const char *name;
    copy_fn_t fn;
} copy_variant_t;

/* The variants this CPU can run: cma_copy (the dispatch) and each loop,
 * forward and backward. */
static size_t copy_variants(copy_variant_t *v)
{
    size_t n = 0;
    v[n++] = (copy_variant_t){"cma_copy", cma_copy};
#if defined(__x86_64__)
    v[n++] = (copy_variant_t){"cma_copy_sse2", cma_copy_sse2};
    v[n++] = (copy_variant_t){"cma_copy_sse2_bwd", cma_copy_sse2_bwd};
    if (cma_copy_have_avx2()) {
        v[n++] = (copy_variant_t){"cma_copy_avx2", cma_copy_avx2};
        v[n++] = (copy_variant_t){"cma_copy_avx2_bwd", cma_copy_avx2_bwd};
    } else {
        printf("cma_copy_avx2(_bwd) not tested: this CPU has no AVX2\n");
    }
#endif
    return n;
}

static void test_copy_small(void **state)
{
    (void)state;
    copy_variant_t v[5];
    size_t n = copy_variants(v);
    for (size_t k = 0; k < n; k++) {
        for (size_t len = 0; len <= 300; len++) {
            copy_grid(v[k].fn, v[k].name, len);
        }
    }
}

/* Around the dispatch threshold, odd multi-KiB sizes, and a piece larger
 * than a chunk. */
static void test_copy_large(void **state)
{
    (void)state;
    static const size_t lens[] = {
        CMA_COPY_MIN - 1, CMA_COPY_MIN, CMA_COPY_MIN + 1, 4096 + 13, 8448,
        65536 + 5,        MB + 37};
    copy_variant_t v[5];
    size_t n = copy_variants(v);
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            copy_grid(v[k].fn, v[k].name, lens[i]);
        }
    }
}

int main(void)
{
    void *h = dlopen(CMA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", CMA_MODULE, dlerror());
        return 1;
    }
    ops = dlsym(h, PDX_BACKEND_SYMBOL);
    if (ops == NULL) {
        fprintf(stderr, "no %s in %s\n", PDX_BACKEND_SYMBOL, CMA_MODULE);
        return 1;
    }
    /* The copy needs nothing from the system: run it everywhere. */
    const struct CMUnitTest copy_tests[] = {
        cmocka_unit_test(test_copy_small),
        cmocka_unit_test(test_copy_large),
    };
    int rc = cmocka_run_group_tests_name("cma_copy", copy_tests, NULL, NULL);
    char why[160];
    if (ops->query(why, sizeof(why)) != PDX_OK) {
        printf("skipped: cma unavailable here: %s\n", why);
        dlclose(h);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_chunked),
        cmocka_unit_test(test_shared_inline),
        cmocka_unit_test(test_private),
        cmocka_unit_test(test_private_inline),
        cmocka_unit_test(test_private_chunked),
        cmocka_unit_test(test_private_post_inline),
        cmocka_unit_test(test_private_fault),
        cmocka_unit_test(test_unmappable_keys_fall_back),
        cmocka_unit_test(test_corrupt_keys_refused),
        cmocka_unit_test(test_abort_chunked),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_populate),
    };
    rc |= cmocka_run_group_tests(tests, NULL, NULL);
    dlclose(h);
    return rc;
}
