/* Fault tests with a real second process holding one side of a handoff:
 *   d_killed  D dies after P finished a request: P frees at lease expiry,
 *             nothing else stays held, and P serves a new D.
 *   p_killed  P dies while D reads: D's load fails with a disconnect within
 *             the timeout, and D loads byte-exact from a restarted P.
 *   p_hung    P is stopped (SIGSTOP) while D reads: the load times out
 *             instead of hanging; after SIGCONT a new load is byte-exact.
 * The child speaks a tiny line protocol over a socketpair. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kv_freed.h"
#include <pdx/kv_connector.h>
#include <pdx/log.h>

#define NBLOCKS 48
#define REQ_BLOCKS 16

static const char *g_self;

typedef struct node {
    pdx_kv_connector_h conn;
    pdx_layout_h layout;
    void *mem;
} node_t;

static void node_make(node_t *n, const char *name, const char *peer,
                      const char *tls, uint32_t lease_ms, uint32_t timeout_ms)
{
    pdx_kv_config_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.model_id, sizeof(c.model_id), "zai-org/GLM-5.2-FP8");
    snprintf(c.agent_name, sizeof(c.agent_name), "%s", name);
    snprintf(c.peer_name, sizeof(c.peer_name), "%s", peer);
    snprintf(c.kv_dtype, sizeof(c.kv_dtype), "fp8_ds_mla");
    snprintf(c.hash_algo, sizeof(c.hash_algo), "xxhash_cbor");
    snprintf(c.hash_seed, sizeof(c.hash_seed), "0");
    c.block_tokens = 64;
    c.num_blocks = NBLOCKS;
    c.nchildren = 1;
    c.children[0] = (pdx_kv_child_config_t){
        .type = PDX_KV_CHILD_REMOTE, .lease_ms = lease_ms,
        .heartbeat_ms = 50, .failure_policy = PDX_KV_FAIL_FAIL,
        .load_tail = true};
    snprintf(c.backends[0], 16, "ucx");
    c.nbackends = 1;
    snprintf(c.opt_buf[0][0], 64, "tls");
    snprintf(c.opt_buf[0][1], 64, "%s", tls);
    c.nbackend_opts = 1;
    if (pdx_layout_glm52(NBLOCKS, PDX_MEM_DRAM, 0, &n->layout) != PDX_OK) {
        die("layout");
    }
    uint64_t size = pdx_layout_carve_size(n->layout, 4096);
    if (posix_memalign(&n->mem, 4096, size) != 0) {
        die("alloc");
    }
    memset(n->mem, 0, size);
    pdx_layout_carve(n->layout, (uintptr_t)n->mem, size, 4096, 0);
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                           PDX_AGENT_PARAM_XFER_TIMEOUT,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD,
                             .xfer_timeout_ms = timeout_ms};
    pdx_kv_connector_params_t p = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT |
                      PDX_KV_PARAM_AGENT_PARAMS,
        .config = &c, .layout = n->layout, .agent_params = &ap};
    if (pdx_kv_connector_create(&p, &n->conn) != PDX_OK) {
        die("connector %s", name);
    }
}

static void node_free(node_t *n)
{
    pdx_kv_connector_destroy(n->conn);
    pdx_layout_destroy(n->layout);
    free(n->mem);
}

static void fill(node_t *n, uint64_t id, uint64_t seed)
{
    for (size_t a = 0; a < pdx_layout_num_arenas(n->layout); a++) {
        pdx_arena_t ar;
        pdx_layout_get_arena(n->layout, a, &ar);
        uint64_t *p = (uint64_t *)(uintptr_t)(ar.base + id * ar.stride);
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + a + 1;
        for (size_t i = 0; i < (size_t)ar.bytes_per_token * 64 / 8; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[i] = x;
        }
    }
}

/* Block hashes of a request: deterministic tokens from `salt`. */
static void hashes(pdx_kv_connector_h c, uint64_t salt, pdx_block_hash_t *hs)
{
    uint64_t tok[REQ_BLOCKS * 64];
    for (size_t i = 0; i < REQ_BLOCKS * 64; i++) {
        tok[i] = (i * 2654435761u + salt) % 151552;
    }
    size_t nb;
    pdx_hasher_hash_blocks(pdx_kv_connector_hasher(c), tok, REQ_BLOCKS * 64,
                           NULL, hs, REQ_BLOCKS, &nb, NULL, NULL);
}

static void exchange(node_t *n, int fd)
{
    void *blob;
    size_t len;
    uint32_t plen;
    pdx_kv_connector_describe(n->conn, &blob, &len);
    send_msg(fd, blob, (uint32_t)len);
    pdx_blob_free(blob);
    char *pb = recv_msg(fd, &plen);
    if (pb == NULL) {
        die("peer closed during exchange");
    }
    if (pdx_kv_connector_connect(n->conn, pb, plen, NULL) != PDX_OK) {
        die("connect refused");
    }
    free(pb);
}

static pdx_status_t d_load(node_t *d, char *params, uint64_t salt,
                           pid_t kill_pid, int sig, uint64_t limit_ms);

/* The child: a P node (finishes requests on command), or a D node (loads
 * handoffs it is sent). */
static int child_main(const char *role, int fd, const char *tls)
{
    node_t n;
    int is_p = strcmp(role, "P") == 0;
    node_make(&n, is_p ? "f-p" : "f-d", is_p ? "f-d" : "f-p", tls, 60000,
              10000);
    exchange(&n, fd);
    for (;;) {
        char *cmd = recv_msg(fd, NULL);
        if (cmd == NULL || strcmp(cmd, "quit") == 0) {
            free(cmd);
            break;
        }
        unsigned long long salt;
        int off = 0;
        if (strcmp(cmd, "reconnect") == 0) {
            /* The peer gave up on us (we were stopped): connect afresh. */
            uint32_t plen;
            char *pb = recv_msg(fd, &plen);
            if (pb == NULL ||
                pdx_kv_connector_connect(n.conn, pb, plen, NULL) != PDX_OK) {
                die("reconnect refused");
            }
            free(pb);
            void *blob;
            size_t blen;
            pdx_kv_connector_describe(n.conn, &blob, &blen);
            send_msg(fd, blob, (uint32_t)blen);
            pdx_blob_free(blob);
        } else if (sscanf(cmd, "load %llu %n", &salt, &off) == 1 && off > 0) {
            pdx_status_t st = d_load(&n, cmd + off, salt, 0, 0, 30000);
            const char *ans = pdx_status_string(st);
            send_msg(fd, ans, (uint32_t)strlen(ans));
        } else if (sscanf(cmd, "finish %llu", &salt) == 1) {
            pdx_block_hash_t hs[REQ_BLOCKS];
            hashes(n.conn, salt, hs);
            uint64_t ids[REQ_BLOCKS];
            for (uint64_t i = 0; i < REQ_BLOCKS; i++) {
                ids[i] = i;
                fill(&n, i, salt * 1000 + i);
            }
            char req[32];
            snprintf(req, sizeof(req), "r%llu", salt);
            pdx_kv_request_t r = {.req_id = req, .hashes = hs,
                                  .nfull = REQ_BLOCKS,
                                  .prompt_tokens = REQ_BLOCKS * 64 + 1};
            char *params;
            if (pdx_kv_request_finished(n.conn, &r, ids, REQ_BLOCKS * 64,
                                        PDX_KV_FROM_ARENA, &params) != PDX_OK) {
                die("finish");
            }
            send_msg(fd, params, (uint32_t)strlen(params));
            pdx_kv_free(params);
        }
        free(cmd);
        pdx_kv_progress(n.conn);
    }
    node_free(&n);
    return 0;
}

static pid_t spawn(const char *role, const char *tls, int *fd_p)
{
    char *args[] = {(char *)g_self, "--child", (char *)role, CTL_FD,
                    (char *)tls, NULL};
    return ctl_spawn(args, fd_p);
}

/* D side: load handoff `params` (of salt `salt`), optionally signalling
 * the holder right after the load starts; checks the bytes on success. */
static pdx_status_t d_load(node_t *d, char *params, uint64_t salt,
                           pid_t kill_pid, int sig, uint64_t limit_ms)
{
    pdx_block_hash_t hs[REQ_BLOCKS];
    hashes(d->conn, salt, hs);
    char req[32];
    snprintf(req, sizeof(req), "d%llu", (unsigned long long)salt);
    pdx_kv_request_t r = {.req_id = req, .hashes = hs, .nfull = REQ_BLOCKS,
                          .prompt_tokens = REQ_BLOCKS * 64 + 1,
                          .params = params};
    pdx_kv_match_t m;
    if (pdx_kv_lookup(d->conn, &r, &m) != PDX_OK || m.blocks != REQ_BLOCKS) {
        die("lookup found %zu blocks", m.blocks);
    }
    uint64_t ids[REQ_BLOCKS];
    for (uint64_t i = 0; i < REQ_BLOCKS; i++) {
        ids[i] = 16 + i;
    }
    if (pdx_kv_load(d->conn, &r, &m, ids) != PDX_OK) {
        die("load start");
    }
    if (kill_pid > 0) {
        kill(kill_pid, sig);
    }
    uint64_t end = pdx_now_ms() + limit_ms;
    size_t tokens = 0;
    pdx_status_t st = PDX_INPROGRESS;
    while (st == PDX_INPROGRESS && pdx_now_ms() < end) {
        st = pdx_kv_load_check(d->conn, req, &tokens);
        pdx_kv_progress(d->conn);
    }
    if (st == PDX_OK) {
        /* Byte-exact against P's deterministic contents. */
        for (uint64_t i = 0; i < REQ_BLOCKS; i++) {
            for (size_t a = 0; a < pdx_layout_num_arenas(d->layout); a++) {
                pdx_arena_t ar;
                pdx_layout_get_arena(d->layout, a, &ar);
                size_t bb = (size_t)ar.bytes_per_token * 64;
                uint64_t *got = (uint64_t *)(uintptr_t)(ar.base +
                                                        ids[i] * ar.stride);
                uint64_t x = (salt * 1000 + i) * 0x9e3779b97f4a7c15ull + a + 1;
                for (size_t k = 0; k < bb / 8; k++) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if (got[k] != x) {
                        die("block %llu arena %zu word %zu differs",
                            (unsigned long long)i, a, k);
                    }
                }
            }
        }
    }
    return st;
}

/* D side: ask the child P to finish request `salt`, then load it. */
static pdx_status_t load(node_t *d, int fd, uint64_t salt, pid_t kill_pid,
                         int sig, uint64_t limit_ms)
{
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "finish %llu", (unsigned long long)salt);
    send_msg(fd, cmd, (uint32_t)strlen(cmd));
    char *params = recv_msg(fd, NULL);
    if (params == NULL) {
        die("P sent no parameters");
    }
    pdx_status_t st = d_load(d, params, salt, kill_pid, sig, limit_ms);
    free(params);
    return st;
}

static int run_p_fault(const char *tls, int sig)
{
    node_t d;
    node_make(&d, "f-d", "f-p", tls, 60000, sig == SIGSTOP ? 15000 : 30000);
    int fd;
    pid_t pid = spawn("P", tls, &fd);
    exchange(&d, fd);
    /* A healthy load first. */
    if (load(&d, fd, 1, 0, 0, 30000) != PDX_OK) {
        die("healthy load failed");
    }
    uint64_t t0 = pdx_now_ms();
    pdx_status_t st = load(&d, fd, 2, pid, sig, 30000);
    uint64_t dt = pdx_now_ms() - t0;
    pdx_status_t want = sig == SIGKILL ? PDX_ERR_REMOTE_DISCONNECT
                                       : PDX_ERR_TIMEOUT;
    if (st == PDX_OK && sig == SIGKILL) {
        /* The READ won the race with the kill: data was checked above; the
         * disconnect path must still show on the next request. */
        printf("read finished before the kill landed; checking the dead "
               "peer is refused\n");
        st = pdx_peer_state(pdx_kv_connector_agent(d.conn), "f-p");
        for (int i = 0; i < 5000 && st == PDX_OK; i++) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
            pdx_kv_progress(d.conn);
            st = pdx_peer_state(pdx_kv_connector_agent(d.conn), "f-p");
        }
    }
    if (st != want) {
        die("after %s: got '%s', want '%s'", sig == SIGKILL ? "kill" : "stop",
            pdx_status_string(st), pdx_status_string(want));
    }
    printf("%s P: load ended '%s' after %llu ms\n",
           sig == SIGKILL ? "killed" : "stopped", pdx_status_string(st),
           (unsigned long long)dt);
    int status;
    if (sig == SIGSTOP) {
        kill(pid, SIGCONT);
        /* D failed the hung peer (its endpoint is gone); the resumed P is
         * connected afresh, and a new load is byte-exact. */
        send_msg(fd, "reconnect", 9);
        void *blob;
        size_t blen;
        uint32_t plen;
        pdx_kv_connector_describe(d.conn, &blob, &blen);
        send_msg(fd, blob, (uint32_t)blen);
        pdx_blob_free(blob);
        char *pb = recv_msg(fd, &plen);
        if (pb == NULL ||
            pdx_kv_connector_connect(d.conn, pb, plen, NULL) != PDX_OK) {
            die("could not reconnect to the resumed P");
        }
        free(pb);
        if (load(&d, fd, 3, 0, 0, 30000) != PDX_OK) {
            die("load after SIGCONT failed");
        }
        send_msg(fd, "quit", 4);
        waitpid(pid, &status, 0);
    } else {
        waitpid(pid, &status, 0);
        close(fd);
        pid = spawn("P", tls, &fd);
        exchange(&d, fd); /* new instance replaces the dead peer */
        if (load(&d, fd, 4, 0, 0, 30000) != PDX_OK) {
            die("load from the restarted P failed");
        }
        send_msg(fd, "quit", 4);
        waitpid(pid, &status, 0);
    }
    close(fd);
    node_free(&d);
    printf("ok\n");
    return 0;
}

static int run_d_killed(void)
{
    node_t p;
    node_make(&p, "f-p", "f-d", "sm", 300, 10000);
    int fd;
    pid_t pid = spawn("D", "sm", &fd);
    exchange(&p, fd);
    pdx_block_hash_t hs[REQ_BLOCKS];
    hashes(p.conn, 9, hs);
    uint64_t ids[REQ_BLOCKS];
    for (uint64_t i = 0; i < REQ_BLOCKS; i++) {
        ids[i] = i;
    }
    pdx_kv_request_t r = {.req_id = "orphan", .hashes = hs,
                          .nfull = REQ_BLOCKS,
                          .prompt_tokens = REQ_BLOCKS * 64 + 1};
    char *params;
    if (pdx_kv_request_finished(p.conn, &r, ids, REQ_BLOCKS * 64, PDX_KV_FROM_ARENA,
                                &params) != PDX_OK) {
        die("finish");
    }
    pdx_kv_free(params);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    close(fd);
    kv_freed_t f = {0};
    uint64_t t0 = pdx_now_ms();
    while (f.n == 0 && pdx_now_ms() - t0 < 5000) {
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    if (f.n != 1 || f.why != PDX_KV_FREED_EXPIRED) {
        die("blocks of the dead D's request were not freed at lease expiry");
    }
    if (pdx_kv_held_requests(p.conn) != 0) {
        die("something is still held");
    }
    if (pdx_peer_state(pdx_kv_connector_agent(p.conn), "f-d") !=
        PDX_ERR_REMOTE_DISCONNECT) {
        die("dead D not seen as disconnected");
    }
    printf("dead D: blocks freed at lease expiry after %llu ms\n",
           (unsigned long long)(pdx_now_ms() - t0));
    /* P serves a new D: it reads a new request byte-exact, and its done
     * notification frees the blocks. */
    pid = spawn("D", "sm", &fd);
    exchange(&p, fd);
    for (uint64_t i = 0; i < REQ_BLOCKS; i++) {
        fill(&p, i, 5 * 1000 + i);
    }
    hashes(p.conn, 5, hs);
    r.req_id = "served";
    if (pdx_kv_request_finished(p.conn, &r, ids, REQ_BLOCKS * 64, PDX_KV_FROM_ARENA,
                                &params) != PDX_OK) {
        die("finish for the new D");
    }
    char *cmd = malloc(strlen(params) + 32);
    sprintf(cmd, "load 5 %s", params);
    pdx_kv_free(params);
    send_msg(fd, cmd, (uint32_t)strlen(cmd));
    free(cmd);
    char *ans = NULL;
    for (uint64_t end = pdx_now_ms() + 30000;
         ans == NULL && pdx_now_ms() < end;) {
        /* P must progress for tcp; here it drains the done notification. */
        pdx_kv_progress(p.conn);
        struct timeval tv = {0, 1000};
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(fd, &rs);
        if (select(fd + 1, &rs, NULL, NULL, &tv) > 0) {
            ans = recv_msg(fd, NULL);
            break;
        }
    }
    if (ans == NULL || strcmp(ans, "success") != 0) {
        die("new D could not load: %s", ans ? ans : "(no answer)");
    }
    free(ans);
    f.n = 0;
    for (uint64_t end = pdx_now_ms() + 5000; f.n == 0 && pdx_now_ms() < end;) {
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    if (f.n != 1 || f.why != PDX_KV_FREED_DONE) {
        die("new D's done notification did not free the blocks");
    }
    send_msg(fd, "quit", 4);
    waitpid(pid, &status, 0);
    close(fd);
    node_free(&p);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && strcmp(argv[1], "--child") == 0) {
        alarm(170);
        return child_main(argv[2], atoi(argv[3]), argv[4]);
    }
    alarm(170);
    if (argc == 2 && strcmp(argv[1], "d_killed") == 0) {
        return run_d_killed();
    }
    if (argc == 2 && strcmp(argv[1], "p_killed") == 0) {
        return run_p_fault("tcp", SIGKILL);
    }
    if (argc == 2 && strcmp(argv[1], "p_hung") == 0) {
        return run_p_fault("tcp", SIGSTOP);
    }
    die("usage: %s d_killed|p_killed|p_hung", argv[0]);
    return 2;
}
