/* Out of file descriptors is a local error (issue 38, item 3): for every
 * RLIMIT_NOFILE from 20 to 300, a child process creates an agent with a
 * ucx backend, then same-host peers (agents of its own, each with a ucx
 * backend) one by one, loads each and READs 4 KiB from it, until
 * something is refused. Nothing aborts (UCX did in ucp_worker_create at
 * 37, 51, 65 and 79 fds); every refusal says "too many open files"
 * (before, most named another cause: an I/O error, shared memory, out
 * of memory); a READ refused for want of fds leaves its healthy peer
 * alive (before, it failed with RemoteDisconnect and marked the peer
 * disconnected).
 *
 *   fdlimit [--tls TLS] [--from N] [--to N] [--peers N]
 *
 * Loopback only; bounded (each child within 60 s). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pdx/pdx.h>

#include "ctl.h"

static const char *g_tls; /* NULL: UCX's default transports */
static int g_peers = 40;

/* Exit codes of a child. */
enum { C_OK = 0, C_WRONG_CAUSE = 3, C_PEER_DEAD = 4 };

/* A refusal must name the shortage. */
static const char *g_refused = "nothing";

static int names_fds(const char *what, pdx_status_t st, int limit)
{
    const char *e = pdx_last_error();
    g_refused = what;
    if (strcasestr(e, "open files") != NULL) {
        return 1;
    }
    printf("limit %d: %s refused with %s: '%s' (not 'too many open "
           "files')\n", limit, what, pdx_status_string(st), e);
    return 0;
}

static pdx_agent_h agent(const char *name, int thread, int limit, int *rc)
{
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                          PDX_AGENT_PARAM_XFER_TIMEOUT,
                            .flags = thread ? PDX_AGENT_F_PROGRESS_THREAD : 0,
                            .xfer_timeout_ms = 5000};
    pdx_agent_h a = NULL;
    pdx_status_t st = pdx_agent_create(name, &p, &a);
    if (st != PDX_OK) {
        *rc = names_fds("pdx_agent_create", st, limit) ? C_OK : C_WRONG_CAUSE;
        return NULL;
    }
    pdx_option_t o = {"tls", g_tls};
    st = pdx_backend_create(a, "ucx", &o, g_tls != NULL, NULL);
    if (st != PDX_OK) {
        *rc = names_fds("pdx_backend_create(ucx)", st, limit) ? C_OK
                                                              : C_WRONG_CAUSE;
        pdx_agent_destroy(a);
        return NULL;
    }
    return a;
}

static pdx_status_t read4k(pdx_agent_h a, const char *peer, void *dst,
                           uint64_t src)
{
    return ctl_read(a, peer, (uintptr_t)dst, src, 4096, 10000);
}

static int child(int limit)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)limit;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        printf("setrlimit %d: %s\n", limit, strerror(errno));
        return 1;
    }
    pdx_log_set_level(PDX_LOG_ERROR);
    int rc = C_OK;
    pdx_agent_h a = agent("fd-a", 1, limit, &rc);
    if (a == NULL) {
        return rc;
    }
    static unsigned char mem[64][4096];
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)mem[0], 4096, 0, 0,
                           &reg));
    /* The peers first (until one cannot be made), then each loaded and
     * read from: the READs, not the agents, run out of fds. */
    pdx_agent_h peers[64] = {0};
    int made = 0, n = 0;
    for (; made < g_peers && made < 63; made++) {
        char name[32];
        snprintf(name, sizeof(name), "fd-b%02d", made);
        peers[made] = agent(name, 1, limit, &rc);
        if (peers[made] == NULL) {
            break;
        }
        pdx_mem_reg_h r;
        CHECK(pdx_mem_register(peers[made], PDX_MEM_DRAM,
                               (uintptr_t)mem[made + 1], 4096, 0, 0, &r));
    }
    for (; rc == C_OK && n < made; n++) {
        char name[32];
        snprintf(name, sizeof(name), "fd-b%02d", n);
        pdx_status_t st = ctl_load_agent(a, peers[n], NULL);
        if (st != PDX_OK) {
            rc = names_fds("pdx_peer_load", st, limit) ? C_OK : C_WRONG_CAUSE;
            break;
        }
        st = read4k(a, name, mem[0], (uintptr_t)mem[n + 1]);
        if (st == PDX_OK) {
            continue;
        }
        if (!names_fds("a READ", st, limit)) {
            rc = C_WRONG_CAUSE;
        }
        pdx_peer_info_t info;
        if (pdx_peer_info(a, name, &info, NULL, 0) == PDX_OK &&
            info.state != PDX_OK) {
            printf("limit %d: peer %s marked %s after a READ refused for "
                   "want of local fds\n", limit, name,
                   pdx_status_string(info.state));
            rc = C_PEER_DEAD;
        }
        break;
    }
    printf("limit %d: %d peers made, %d read, then %s refused\n", limit,
           made, n, g_refused);
    for (int i = 0; i < made; i++) {
        if (peers[i] != NULL) {
            pdx_agent_destroy(peers[i]);
        }
    }
    pdx_agent_destroy(a);
    return rc;
}

int main(int argc, char **argv)
{
    int from = 20, to = 300;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tls") == 0 && i + 1 < argc) {
            g_tls = argv[++i];
        } else if (strcmp(argv[i], "--from") == 0 && i + 1 < argc) {
            from = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) {
            to = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--peers") == 0 && i + 1 < argc) {
            g_peers = atoi(argv[++i]);
        } else {
            die("usage: %s [--tls TLS] [--from N] [--to N] [--peers N]",
                argv[0]);
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int fails = 0;
    for (int limit = from; limit <= to; limit++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            _exit(child(limit));
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status)) {
            printf("FAIL: limit %d: the process died of signal %d\n", limit,
                   WTERMSIG(status));
            fails++;
        } else if (WEXITSTATUS(status) != 0) {
            printf("FAIL: limit %d: exit %d\n", limit, WEXITSTATUS(status));
            fails++;
        }
    }
    printf("fdlimit (%s): RLIMIT_NOFILE %d..%d, %d failed\n",
           g_tls ? g_tls : "default tls", from, to, fails);
    return fails ? 1 : 0;
}
