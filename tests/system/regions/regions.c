/* Region changes on a target P while an initiator D reads (issue 21, items
 * 4 and 5), two processes over loopback (UCX shm or TCP, or cma):
 *
 *   churn:   P registers and deregisters an unrelated region once per
 *            period while D reads P's stable region through a prepared
 *            list made once, a request made once and reposted, and a fresh
 *            request each time; D loads each new blob (a new generation).
 *            Every READ must succeed byte-exact (0 failures), the prepared
 *            list and the old request must survive every reload, and D must
 *            have seen every generation.
 *   removed: P deregisters a region D has a prepared list, a request and a
 *            READ in flight on; after D loads P's new blob the list, the
 *            request and the READ end PDX_ERR_STALE while the stable
 *            region still reads byte-exact.
 *
 * Bounded: every wait has a deadline; the test has a ctest timeout. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define STABLE (16u << 20)
#define SCRATCH (1u << 20)

static ctl_pair_t g_pair = CTL_PAIR_INIT;

static unsigned char pattern(uint64_t off) { return (unsigned char)(off * 131 + (off >> 12)); }

static pdx_agent_h make_agent(const char *name)
{
    return ctl_pair_agent(&g_pair, name, 30000, NULL);
}

static unsigned char *alloc_region(size_t len)
{
    unsigned char *m = NULL;
    if (posix_memalign((void **)&m, 4096, len) != 0) {
        die("out of memory");
    }
    for (size_t o = 0; o < len; o++) {
        m[o] = pattern(o);
    }
    return m;
}

/* P: a stable region, and on command a scratch region registered
 * ("reg") or deregistered ("dereg"); a new blob after each. */
static int target_main(int ctl)
{
    pdx_agent_h a = make_agent("P");
    unsigned char *stable = alloc_region(STABLE);
    unsigned char *scratch = alloc_region(SCRATCH);
    pdx_mem_reg_h sreg, xreg = NULL;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)stable, STABLE, 0, 0,
                           &sreg));
    ctl_send_addrs(ctl, (uintptr_t)stable, (uintptr_t)scratch);
    ctl_send_blob(a, ctl);
    for (;;) {
        char *cmd = recv_msg(ctl, NULL);
        if (cmd == NULL || strcmp(cmd, "quit") == 0) {
            free(cmd);
            break;
        }
        if (strcmp(cmd, "reg") == 0 && xreg == NULL) {
            CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)scratch,
                                   SCRATCH, 0, 0, &xreg));
        } else if (strcmp(cmd, "dereg") == 0 && xreg != NULL) {
            CHECK(pdx_mem_deregister(a, xreg));
            xreg = NULL;
        } else {
            die("target: bad command '%s'", cmd);
        }
        free(cmd);
        ctl_send_blob(a, ctl);
    }
    pdx_agent_destroy(a);
    free(stable);
    free(scratch);
    return 0;
}

/* D's side of a command: send it, load the blob that comes back. */
static void change(pdx_agent_h a, int ctl, const char *cmd)
{
    uint32_t len;
    send_msg(ctl, cmd, (uint32_t)strlen(cmd));
    char *blob = recv_msg(ctl, &len);
    if (blob == NULL) {
        die("target closed the control socket after '%s'", cmd);
    }
    CHECK(pdx_peer_load(a, blob, len, NULL));
    free(blob);
}

typedef struct reader {
    pdx_agent_h a;
    unsigned char *mem; /* local, STABLE bytes */
    uint64_t rstable;
    atomic_int stop;
    unsigned long reads, failures, bad_bytes;
    char first_failure[160];
} reader_t;

static void note_failure(reader_t *r, const char *what, pdx_status_t st)
{
    if (r->failures++ == 0) {
        snprintf(r->first_failure, sizeof(r->first_failure), "%s: %s (%s)",
                 what, pdx_status_string(st), pdx_last_error());
    }
}

static void check_bytes(reader_t *r, uint64_t off, uint64_t len)
{
    for (uint64_t o = off; o < off + len; o++) {
        if (r->mem[o] != pattern(o)) {
            r->bad_bytes++;
            return;
        }
    }
    memset(r->mem + off, 0, len);
}

/* D's reader: three ways of reading P's stable region (a 1 MiB piece
 * of it, rotating), over and over. */
#define PIECE (1u << 20)
#define NPIECES (STABLE / PIECE)
static void *reader_main(void *arg)
{
    reader_t *r = arg;
    pdx_desc_t l[NPIECES], rd[NPIECES];
    for (uint32_t k = 0; k < NPIECES; k++) {
        l[k] = (pdx_desc_t){.addr = (uintptr_t)r->mem + k * PIECE,
                            .len = PIECE};
        rd[k] = (pdx_desc_t){.addr = r->rstable + k * PIECE, .len = PIECE};
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, l, NPIECES},
                    rl = {PDX_MEM_DRAM, rd, NPIECES};
    pdx_dlist_h dl, dr;
    CHECK(pdx_dlist_prepare(r->a, NULL, &ll, &dl));
    CHECK(pdx_dlist_prepare(r->a, "P", &rl, &dr));
    pdx_desc_list_t l1 = {PDX_MEM_DRAM, &l[0], 1}, r1 = {PDX_MEM_DRAM, &rd[0], 1};
    pdx_xfer_h kept;
    CHECK(pdx_xfer_create(r->a, PDX_XFER_READ, &l1, &r1, "P", NULL, 0,
                          &kept));
    memset(r->mem, 0, STABLE);
    for (unsigned long i = 0; !atomic_load(&r->stop) && i < 100000000; i++) {
        pdx_xfer_h x = NULL;
        pdx_status_t st = PDX_OK;
        const char *what;
        uint32_t idx = (uint32_t)((i / 3) % NPIECES);
        pdx_desc_list_t lk = {PDX_MEM_DRAM, &l[idx], 1},
                        rk = {PDX_MEM_DRAM, &rd[idx], 1};
        switch (i % 3) {
        case 0:
            what = "prepared list (made once)";
            st = pdx_xfer_make(r->a, PDX_XFER_READ, dl, &idx, dr, &idx, 1,
                               NULL, 0, &x);
            break;
        case 1:
            what = "request made once, reposted";
            x = kept;
            idx = 0;
            break;
        default:
            what = "fresh request";
            st = pdx_xfer_create(r->a, PDX_XFER_READ, &lk, &rk, "P", NULL, 0,
                                 &x);
        }
        if (st == PDX_OK) {
            st = ctl_xfer_run(x, 20000);
        }
        r->reads++;
        if (st != PDX_OK) {
            note_failure(r, what, st);
        } else {
            check_bytes(r, (uint64_t)idx * PIECE, PIECE);
        }
        if (x != NULL && x != kept) {
            pdx_xfer_release(x);
        }
    }
    pdx_xfer_release(kept);
    pdx_dlist_release(dr);
    pdx_dlist_release(dl);
    return NULL;
}

static uint32_t peer_generation(pdx_agent_h a)
{
    pdx_peer_info_t info;
    CHECK(pdx_peer_info(a, "P", &info, NULL, 0));
    return info.generation;
}

static int churn(pdx_agent_h a, int ctl, reader_t *r, unsigned seconds,
                 unsigned period_ms)
{
    pthread_t th;
    uint32_t gen0 = peer_generation(a);
    if (pthread_create(&th, NULL, reader_main, r) != 0) {
        die("pthread_create");
    }
    unsigned changes = 0;
    uint64_t end = pdx_now_ms() + (uint64_t)seconds * 1000;
    while (pdx_now_ms() < end) {
        change(a, ctl, "reg");
        usleep(period_ms * 500);
        change(a, ctl, "dereg");
        usleep(period_ms * 500);
        changes += 2;
    }
    atomic_store(&r->stop, 1);
    pthread_join(th, NULL);
    uint32_t gen1 = peer_generation(a);
    printf("churn over %s%s: %u changes (generation %u -> %u), %lu READs, "
           "%lu failed, %lu with wrong bytes\n", g_pair.tls,
           g_pair.cma ? "+cma" : "", changes, gen0, gen1, r->reads,
           r->failures, r->bad_bytes);
    if (gen1 - gen0 != changes) {
        die("D saw generation %u -> %u, want %u changes", gen0, gen1,
            changes);
    }
    if (r->failures != 0) {
        die("%lu of %lu READs of the unchanged region failed; first: %s",
            r->failures, r->reads, r->first_failure);
    }
    if (r->bad_bytes != 0 || r->reads < changes) {
        die("%lu READs with wrong bytes, %lu READs in all", r->bad_bytes,
            r->reads);
    }
    return 0;
}

static void expect_stale(const char *what, pdx_status_t st)
{
    if (st != PDX_ERR_STALE) {
        die("%s after the region went: %s, want STALE", what,
            pdx_status_string(st));
    }
    printf("  %s: STALE (%s)\n", what, pdx_last_error());
}

static int removed(pdx_agent_h a, int ctl, reader_t *r, uint64_t rscratch)
{
    change(a, ctl, "reg");
    pdx_desc_t l = {.addr = (uintptr_t)r->mem, .len = SCRATCH},
               rd = {.addr = rscratch, .len = SCRATCH};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &rd, 1};
    pdx_dlist_h dl, dr;
    CHECK(pdx_dlist_prepare(a, NULL, &ll, &dl));
    CHECK(pdx_dlist_prepare(a, "P", &rl, &dr));
    pdx_xfer_h x1, x2;
    CHECK(pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, "P", NULL, 0, &x1));
    pdx_status_t st = ctl_xfer_run(x1, 20000);
    CHECK(st);
    check_bytes(r, 0, SCRATCH);
    if (r->bad_bytes) {
        die("READ of the scratch region: wrong bytes");
    }
    uint32_t idx = 0;
    CHECK(pdx_xfer_make(a, PDX_XFER_READ, dl, &idx, dr, &idx, 1, NULL, 0,
                        &x2));
    change(a, ctl, "dereg");
    expect_stale("repost of a request made before",
                 pdx_xfer_post(x1));
    pdx_xfer_h x3 = NULL;
    expect_stale("make from a list prepared before",
                 pdx_xfer_make(a, PDX_XFER_READ, dl, &idx, dr, &idx, 1, NULL,
                               0, &x3));
    expect_stale("post of a request made from that list before",
                 pdx_xfer_post(x2));
    if (pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, "P", NULL, 0, &x3) !=
        PDX_ERR_NOT_FOUND) {
        die("a new request to the removed region was not refused");
    }
    pdx_xfer_release(x1);
    pdx_xfer_release(x2);
    pdx_dlist_release(dr);
    pdx_dlist_release(dl);
    /* The stable region still reads. */
    atomic_store(&r->stop, 1);
    l.len = rd.len = STABLE;
    rd.addr = r->rstable;
    CHECK(pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, "P", NULL, 0, &x1));
    st = ctl_xfer_run(x1, 20000);
    CHECK(st);
    check_bytes(r, 0, STABLE);
    pdx_xfer_release(x1);
    if (r->bad_bytes) {
        die("READ of the stable region: wrong bytes");
    }
    printf("removed over %s%s: ok\n", g_pair.tls, g_pair.cma ? "+cma" : "");
    return 0;
}

int main(int argc, char **argv)
{
    g_pair.self = argv[0];
    const char *mode = "churn";
    unsigned seconds = 12, period_ms = 1000;
    for (int i = 1; i < argc; i++) {
        if (ctl_pair_option(&g_pair, argc, argv, &i)) {
            continue;
        } else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            mode = argv[++i];
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--period-ms") == 0 && i + 1 < argc) {
            period_ms = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--long") == 0) {
            seconds = 30; /* the form: 30 s, one change a second */
        } else {
            die("usage: %s [--mode churn|removed] [--tls sm|tcp] [--cma] "
                "[--seconds N] [--period-ms N] [--long]", argv[0]);
        }
    }
    if (g_pair.target_fd >= 0) {
        return target_main(g_pair.target_fd);
    }
    if (period_ms == 0 || period_ms > 60000 || seconds > 3600) {
        die("--period-ms 1..60000, --seconds at most 3600");
    }
    int ctl;
    pid_t pid = ctl_pair_spawn(&g_pair, NULL, &ctl);
    pdx_agent_h a = make_agent("D");
    uint64_t rstable, rscratch;
    ctl_recv_addrs(ctl, "the target", &rstable, &rscratch);
    ctl_load_peer(a, ctl, NULL, "the target");
    reader_t r = {.a = a, .rstable = rstable};
    r.mem = alloc_region(STABLE);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)r.mem, STABLE, 0, 0,
                           &reg));
    int rc = strcmp(mode, "churn") == 0     ? churn(a, ctl, &r, seconds,
                                                    period_ms)
             : strcmp(mode, "removed") == 0 ? removed(a, ctl, &r, rscratch)
                                            : (die("unknown mode %s", mode), 1);
    send_msg(ctl, "quit", 4);
    int status = 0;
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            break;
        }
        usleep(50000);
        if (i == 199) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            die("target did not exit within 10 s");
        }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        die("target ended badly (status %d)", status);
    }
    CHECK(pdx_mem_deregister(a, reg));
    pdx_agent_destroy(a);
    free(r.mem);
    return rc;
}
