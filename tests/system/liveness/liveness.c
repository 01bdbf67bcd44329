/* Liveness from the store matches reality (issue 21, item 6), on a private
 * etcd over loopback: an initiator D (this process) reads from two peers
 * found through the store, P1 on this host (D watches its pidfd) and P2 in
 * a new pid namespace (no pidfd: D knows it only through the store and
 * UCX/TCP), both with a short lease TTL.
 *
 *   freeze: etcd is SIGSTOPped for 2 TTLs, then resumed: the leases
 *           expire, P2 is failed by its vanished key and revived when it
 *           puts the same blob again, P1 (pidfd alive) is never failed.
 *           Both must be readable again within one TTL of the resume.
 *   pause:  both peers are SIGSTOPped for 3 TTLs (a GC pause, a debugger;
 *           D's reads to them time out meanwhile), then resumed: both must
 *           be readable again within one TTL (+ two xfer timeouts) of it.
 *
 * In both, lists prepared on each peer before are used at the end: they
 * survive P2's failure and revival (byte-exact READs).
 *
 * Exit 0 pass, 1 fail, 77 skip (no etcd, or no pid namespaces). */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "etcd_launch.h"
#include <pdx/pdx.h>

#define REGION (1u << 20)
#define TTL_MS 2000u
#define XFER_TIMEOUT_MS 1000u

static unsigned char pattern(uint64_t off, unsigned salt)
{
    return (unsigned char)(off * 7 + salt);
}

static pdx_agent_h make_agent(const char *name, const char *url)
{
    pdx_agent_params_t p = {
        .field_mask = PDX_AGENT_PARAM_FLAGS | PDX_AGENT_PARAM_XFER_TIMEOUT |
                      PDX_AGENT_PARAM_STORE,
        .flags = PDX_AGENT_F_PROGRESS_THREAD,
        .xfer_timeout_ms = XFER_TIMEOUT_MS,
        .store = "etcd",
        .store_endpoints = url,
        .store_namespace = "liveness",
        .store_lease_ttl_ms = TTL_MS,
        .store_timeout_ms = 500,
    };
    pdx_agent_h a;
    CHECK(pdx_agent_create(name, &p, &a));
    pdx_option_t opt = {"tls", "tcp"};
    CHECK(pdx_backend_create(a, "ucx", &opt, 1, NULL));
    return a;
}

/* A peer: one region of pattern(salt), published; lives until its parent
 * closes the pipe. */
static int peer_main(const char *name, const char *url, int fd)
{
    pdx_agent_h a = make_agent(name, url);
    unsigned char *m = NULL;
    if (posix_memalign((void **)&m, 4096, REGION) != 0) {
        die("out of memory");
    }
    for (uint64_t o = 0; o < REGION; o++) {
        m[o] = pattern(o, (unsigned)name[1]);
    }
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)m, REGION, 0, 0,
                           &reg));
    CHECK(pdx_agent_publish(a));
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR) {
    }
    pdx_agent_destroy(a);
    free(m);
    return 0;
}

/* Start a peer (in a new pid namespace when `newpid`): 0 ok, -1 when the
 * namespace is refused. */
static pid_t spawn_peer(const char *self, const char *name, const char *url,
                        bool newpid, int *wfd_p)
{
    int pfd[2];
    if (pipe(pfd) != 0) {
        die("pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        die("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(pfd[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (newpid) {
            if (unshare(CLONE_NEWPID) != 0) {
                _exit(77);
            }
            pid_t inner = fork(); /* pid 1 of the new namespace */
            if (inner < 0) {
                _exit(1);
            }
            if (inner > 0) {
                /* Stay as the outer pid the test signals: pass signals
                 * on by being in the same process group is not enough,
                 * so the inner process is the one stopped (see below). */
                int st;
                waitpid(inner, &st, 0);
                _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
            }
            prctl(PR_SET_PDEATHSIG, SIGKILL);
        }
        char fd[16];
        snprintf(fd, sizeof(fd), "%d", pfd[0]);
        execl(self, self, "--peer", name, url, fd, (char *)NULL);
        _exit(127);
    }
    close(pfd[0]);
    *wfd_p = pfd[1];
    return pid;
}

typedef struct peer {
    const char *name;
    pid_t pid;  /* the process to stop (inner one for P2: see pids) */
    pid_t outer;
    int wfd;
    uint64_t raddr;
    unsigned long reads, failed;
} peer_t;

static unsigned char *g_mem;

static pdx_status_t read_once(pdx_agent_h d, peer_t *p)
{
    pdx_status_t st = pdx_peer_fetch(d, p->name, 200);
    if (st != PDX_OK) {
        return st;
    }
    if (p->raddr == 0) {
        pdx_peer_info_t info;
        pdx_region_info_t r;
        CHECK(pdx_peer_info(d, p->name, &info, &r, 1));
        p->raddr = r.addr;
    }
    pdx_desc_t l = {.addr = (uintptr_t)g_mem, .len = REGION};
    pdx_desc_t rd = {.addr = p->raddr, .len = REGION};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &rd, 1};
    pdx_xfer_h x;
    memset(g_mem, 0, REGION);
    st = pdx_xfer_create(d, PDX_XFER_READ, &ll, &rl, p->name, NULL, 0, &x);
    if (st != PDX_OK) {
        return st;
    }
    st = pdx_xfer_post(x);
    uint64_t end = pdx_now_ms() + 3 * XFER_TIMEOUT_MS;
    while (st == PDX_INPROGRESS && pdx_now_ms() < end) {
        st = pdx_xfer_check(x);
        usleep(200);
    }
    pdx_xfer_release(x);
    if (st == PDX_OK) {
        for (uint64_t o = 0; o < REGION; o++) {
            if (g_mem[o] != pattern(o, (unsigned)p->name[1])) {
                die("READ of %s: wrong byte at %llu", p->name,
                    (unsigned long long)o);
            }
        }
    }
    return st == PDX_INPROGRESS ? PDX_ERR_TIMEOUT : st;
}

/* A prepared list on peer p's region (made at the start, used at the end:
 * it must survive the revival). */
static pdx_dlist_h prepare_remote(pdx_agent_h d, peer_t *p)
{
    pdx_desc_t rd = {.addr = p->raddr, .len = REGION};
    pdx_desc_list_t rl = {PDX_MEM_DRAM, &rd, 1};
    pdx_dlist_h dl;
    CHECK(pdx_dlist_prepare(d, p->name, &rl, &dl));
    return dl;
}

static pdx_status_t read_prepared(pdx_agent_h d, pdx_dlist_h local,
                                  pdx_dlist_h remote, peer_t *p)
{
    uint32_t idx = 0;
    pdx_xfer_h x;
    memset(g_mem, 0, REGION);
    pdx_status_t st = pdx_xfer_make(d, PDX_XFER_READ, local, &idx, remote,
                                    &idx, 1, NULL, 0, &x);
    if (st != PDX_OK) {
        return st;
    }
    st = pdx_xfer_post(x);
    uint64_t end = pdx_now_ms() + 3 * XFER_TIMEOUT_MS;
    while (st == PDX_INPROGRESS && pdx_now_ms() < end) {
        st = pdx_xfer_check(x);
        usleep(200);
    }
    pdx_xfer_release(x);
    if (st == PDX_OK && g_mem[REGION - 1] !=
                            pattern(REGION - 1, (unsigned)p->name[1])) {
        die("prepared READ of %s: wrong bytes", p->name);
    }
    return st == PDX_INPROGRESS ? PDX_ERR_TIMEOUT : st;
}

/* Read every peer until each one has read OK `need` times in a row, at
 * most `limit_ms`; the ms it took, or die. */
static uint64_t until_usable(pdx_agent_h d, peer_t *ps, int n,
                             uint64_t limit_ms, const char *when)
{
    uint64_t t0 = pdx_now_ms();
    int ok[4] = {0};
    for (unsigned guard = 0; guard < 100000; guard++) {
        int all = 1;
        for (int i = 0; i < n; i++) {
            if (ok[i] >= 3) {
                continue;
            }
            pdx_status_t st = read_once(d, &ps[i]);
            ps[i].reads++;
            ok[i] = st == PDX_OK ? ok[i] + 1 : 0;
            ps[i].failed += st != PDX_OK;
            all &= ok[i] >= 3;
        }
        if (all) {
            return pdx_now_ms() - t0;
        }
        if (pdx_now_ms() - t0 > limit_ms) {
            break;
        }
        usleep(20000);
    }
    die("%s: not every peer readable within %llu ms (%s %d ok in a row, %s "
        "%d): %s", when, (unsigned long long)limit_ms, ps[0].name, ok[0],
        ps[1].name, ok[1], pdx_last_error());
}

/* Keep reading (failures allowed: counted) for `ms`. */
static void read_for(pdx_agent_h d, peer_t *ps, int n, uint64_t ms)
{
    uint64_t end = pdx_now_ms() + ms;
    while (pdx_now_ms() < end) {
        for (int i = 0; i < n; i++) {
            ps[i].reads++;
            ps[i].failed += read_once(d, &ps[i]) != PDX_OK;
        }
        usleep(50000);
    }
}

/* The pid of P2's inner process (pid 1 of its namespace): the child of
 * the outer one. */
static pid_t child_of(pid_t parent)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)parent,
             (int)parent);
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(path, "r");
        int c = 0;
        if (f != NULL) {
            if (fscanf(f, "%d", &c) != 1) {
                c = 0;
            }
            fclose(f);
        }
        if (c > 0) {
            return c;
        }
        usleep(10000);
    }
    die("no inner process under %d", (int)parent);
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--peer") == 0) {
        return peer_main(argv[2], argv[3], atoi(argv[4]));
    }
    const char *mode = argc >= 3 && strcmp(argv[1], "--mode") == 0 ? argv[2]
                                                                   : "";
    if (strcmp(mode, "freeze") != 0 && strcmp(mode, "pause") != 0) {
        die("usage: %s --mode freeze|pause", argv[0]);
    }
    char why[256];
    if (!etcd_available(why, sizeof(why))) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    etcd_proc_t e;
    char err[256];
    if (etcd_start(&e, NULL, NULL, err, sizeof(err)) != 0) {
        die("etcd: %s", err);
    }
    peer_t ps[2] = {{.name = "P1"}, {.name = "P2"}};
    ps[0].pid = ps[0].outer = spawn_peer(argv[0], "P1", e.url, false,
                                         &ps[0].wfd);
    ps[1].outer = spawn_peer(argv[0], "P2", e.url, true, &ps[1].wfd);
    usleep(200000);
    int wst;
    if (waitpid(ps[1].outer, &wst, WNOHANG) == ps[1].outer &&
        WIFEXITED(wst) && WEXITSTATUS(wst) == 77) {
        printf("SKIP: no new pid namespace here (unshare: not root?)\n");
        kill(ps[0].pid, SIGKILL);
        etcd_cleanup(&e);
        return 77;
    }
    ps[1].pid = child_of(ps[1].outer);
    g_mem = malloc(REGION);
    pdx_agent_h d = make_agent("D", e.url);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(d, PDX_MEM_DRAM, (uintptr_t)g_mem, REGION, 0, 0,
                           &reg));
    uint64_t t = until_usable(d, ps, 2, 20000, "start");
    pdx_peer_info_t i1, i2;
    CHECK(pdx_peer_info(d, "P1", &i1, NULL, 0));
    CHECK(pdx_peer_info(d, "P2", &i2, NULL, 0));
    printf("start: both readable after %llu ms (P1 same host: %d, P2 same "
           "host: %d)\n", (unsigned long long)t, i1.same_host, i2.same_host);
    if (!i1.same_host || i2.same_host) {
        die("P1 must be on this host and P2 in another pid namespace");
    }
    pdx_desc_t ld = {.addr = (uintptr_t)g_mem, .len = REGION};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &ld, 1};
    pdx_dlist_h local, prepared[2];
    CHECK(pdx_dlist_prepare(d, NULL, &ll, &local));
    for (int i = 0; i < 2; i++) {
        prepared[i] = prepare_remote(d, &ps[i]);
        CHECK(read_prepared(d, local, prepared[i], &ps[i]));
    }
    uint64_t limit;
    if (strcmp(mode, "freeze") == 0) {
        kill(e.pid, SIGSTOP);
        read_for(d, ps, 2, 2 * TTL_MS);
        kill(e.pid, SIGCONT);
        /* The leases expire now; P1 keeps working (pidfd alive), P2 is
         * failed then revived from its blob put again. */
        limit = TTL_MS;
    } else {
        kill(ps[0].pid, SIGSTOP);
        kill(ps[1].pid, SIGSTOP);
        read_for(d, ps, 2, 3 * TTL_MS);
        kill(ps[0].pid, SIGCONT);
        kill(ps[1].pid, SIGCONT);
        limit = TTL_MS + 2 * XFER_TIMEOUT_MS;
    }
    unsigned long f1 = ps[0].failed, f2 = ps[1].failed;
    /* From the resume on, for 3 TTLs (the leases expire, keys come back):
     * the last failed READ of each peer must come within `limit`. */
    uint64_t t0 = pdx_now_ms(), last_fail[2] = {0, 0};
    int failed_after[2] = {0, 0};
    while (pdx_now_ms() - t0 < 3 * TTL_MS) {
        for (int i = 0; i < 2; i++) {
            pdx_status_t st = read_once(d, &ps[i]);
            ps[i].reads++;
            if (st != PDX_OK) {
                ps[i].failed++;
                failed_after[i] = 1;
                last_fail[i] = pdx_now_ms() - t0;
            }
        }
        usleep(20000);
    }
    t = until_usable(d, ps, 2, 1000, "at the end");
    printf("%s: READs failed while it lasted: P1 %lu, P2 %lu; after the "
           "resume: P1 %lu (last at +%llu ms), P2 %lu (last at +%llu ms); "
           "limit +%llu ms\n", mode, f1, f2, ps[0].failed - f1,
           (unsigned long long)last_fail[0], ps[1].failed - f2,
           (unsigned long long)last_fail[1], (unsigned long long)limit);
    for (int i = 0; i < 2; i++) {
        if (failed_after[i] && last_fail[i] > limit) {
            die("%s: %s failed a READ %llu ms after the resume (limit %llu)",
                mode, ps[i].name, (unsigned long long)last_fail[i],
                (unsigned long long)limit);
        }
    }
    if (strcmp(mode, "freeze") == 0 && ps[0].failed != 0) {
        die("freeze: %lu READs of P1 (same host, alive) failed",
            ps[0].failed);
    }
    /* Lists prepared before: usable again (P2 was failed and revived). */
    for (int i = 0; i < 2; i++) {
        pdx_status_t st = read_prepared(d, local, prepared[i], &ps[i]);
        if (st != PDX_OK) {
            die("%s: a list on %s prepared before the %s: %s (%s)", mode,
                ps[i].name, mode, pdx_status_string(st), pdx_last_error());
        }
        pdx_dlist_release(prepared[i]);
    }
    pdx_dlist_release(local);
    printf("%s: lists prepared before read byte-exact on both peers\n",
           mode);
    char *json = NULL;
    if (pdx_stats_json(d, &json) == PDX_OK && json != NULL) {
        const char *r = strstr(json, "\"peer_reloads\"");
        const char *k = strstr(json, "\"peer_deaths\"");
        printf("D's store: %.22s %.20s\n", r ? r : "-", k ? k : "-");
        pdx_blob_free(json);
    }
    pdx_agent_destroy(d);
    for (int i = 0; i < 2; i++) {
        close(ps[i].wfd);
        int st = 0;
        for (int k = 0; k < 100 && waitpid(ps[i].outer, &st, WNOHANG) == 0;
             k++) {
            usleep(50000);
        }
        kill(ps[i].outer, SIGKILL);
        waitpid(ps[i].outer, &st, 0);
    }
    etcd_cleanup(&e);
    free(g_mem);
    printf("ok\n");
    return 0;
}
