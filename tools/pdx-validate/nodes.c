/* pdx-validate's two nodes: the glm52-pd-node processes (spawned on a
 * socketpair, killed, reaped), their channel (one JSON message at a time,
 * with a deadline) and their hello. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "pd_model.h"
#include "pd_wire.h"
#include "validate.h"

node_t g_p = {.tag = "P"}, g_d = {.tag = "D"};

void kill_nodes(void)
{
    if (g_p.pid > 0) {
        kill(g_p.pid, SIGKILL);
    }
    if (g_d.pid > 0) {
        kill(g_d.pid, SIGKILL);
    }
}

void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] =
        "pdx-validate: FAIL: hard deadline passed, nodes killed\n";
    kill_nodes();
    ssize_t rc = write(2, msg, sizeof(msg) - 1);
    (void)rc;
    _exit(EXIT_FAIL);
}

int spawn(node_t *n, const opts_t *o)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        fprintf(stderr, "pdx-validate: socketpair: %s\n", strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pdx-validate: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* A node never outlives the driver. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        /* stdout is the report (--json): the node's logs, UCX's included,
         * go to stderr. */
        if (dup2(sv[1], 3) < 0 || dup2(2, 1) < 0) {
            _exit(127);
        }
        char jt[32];
        snprintf(jt, sizeof(jt), "%g", o->job_timeout_s);
        execl(o->node, o->node, "--config", n->config, "--fd", "3",
              "--job-timeout", jt, (char *)NULL);
        fprintf(stderr, "pdx-validate: exec %s: %s\n", o->node,
                strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    n->pid = pid;
    n->alive = true;
    return pd_chan_init(&n->chan, sv[0]);
}

/* Why a node is gone, for messages. */
void node_death(node_t *n, char *buf, size_t len)
{
    int status = 0;
    pid_t r = n->pid > 0 ? waitpid(n->pid, &status, 0) : -1;
    if (r == n->pid) {
        n->pid = -1;
        if (WIFEXITED(status)) {
            snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
        } else if (WIFSIGNALED(status)) {
            snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
        } else {
            snprintf(buf, len, "stopped");
        }
    } else {
        snprintf(buf, len, "closed its channel");
    }
    n->alive = false;
}

/* Wait for one message from `n` until `deadline` (ms). NULL on death or
 * timeout, with `why` filled. */
cJSON *recv_one(node_t *n, double deadline, char *why, size_t len)
{
    cJSON *m = pd_chan_recv(&n->chan, deadline);
    if (m == NULL && (n->chan.error || n->chan.eof)) {
        char d[128];
        node_death(n, d, sizeof(d));
        snprintf(why, len, "node %s (%s) %s", n->tag, n->config, d);
    } else if (m == NULL) {
        snprintf(why, len, "node %s (%s) did not answer in time", n->tag,
                 n->config);
    }
    return m;
}

void send_to(node_t *n, cJSON *msg)
{
    if (pd_chan_send(&n->chan, msg) != 0 && n->chan.error != EAGAIN) {
        n->chan.eof = 1; /* reported as a dead node by the loop */
    }
    cJSON_Delete(msg);
}

void quit_nodes(double deadline)
{
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        if (ns[i]->pid > 0 && ns[i]->alive) {
            cJSON *q = cJSON_CreateObject();
            cJSON_AddStringToObject(q, "op", "quit");
            send_to(ns[i], q);
            pd_chan_drain(&ns[i]->chan, deadline);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (ns[i]->pid > 0) {
            reap_child(ns[i]->pid, deadline);
            ns[i]->pid = -1;
        }
    }
}

void reap_child(pid_t pid, double deadline)
{
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid || r < 0) {
            return;
        }
        if (pdx_now_ms_f() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return;
        }
        usleep(10000);
    }
}

int read_hello(node_t *n, cJSON *m, char *why, size_t len)
{
    if (!jbool(m, "ok")) {
        const char *e = pd_json_str(m, "error");
        snprintf(why, len, "node %s (%s) could not start: %s", n->tag,
                 n->config, e ? e : "?");
        return -1;
    }
    n->hello = m;
    snprintf(n->agent, sizeof(n->agent), "%s",
             pd_json_str(m, "agent") ? pd_json_str(m, "agent") : "?");
    n->num_blocks = jnum(m, "num_blocks");
    n->pool_blocks = jnum(m, "pool_blocks");
    n->bytes_per_block = jnum(m, "bytes_per_block");
    n->block_tokens = jnum(m, "block_tokens");
    n->load_tail = jbool(m, "load_tail");
    snprintf(n->fingerprint, sizeof(n->fingerprint), "%s",
             pd_json_str(m, "layout_fingerprint")
                 ? pd_json_str(m, "layout_fingerprint")
                 : "?");
    return 0;
}
