/* pdx-validate --multi-node: two prefill and two decode "hosts" (network +
 * pid namespaces joined by veth pairs, support/netns/netns.h), one etcd
 * on the hub, four glm52-pd-node processes whose configs carry a `store`
 * section and no peer: they find each other only through etcd, by the
 * names in handoff parameters. GLM-5.2 sessions are routed across the
 * hosts (turn k on one P and one D, turn k+1 on the other P, which reuses
 * what the previous D decoded from that D's pool), every loaded block is
 * checked byte for byte by the nodes, and the report shows each peer's
 * path (UCX over tcp between hosts, never same-host) and the store's work.
 *
 * Exit 0 when every check passes, 1 on a failed check, 2 on a setup error,
 * 77 when the machine refuses namespaces or etcd is missing (reason
 * printed). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "etcd_launch.h"
#include "netns.h"
#include "pd_model.h"
#include "pd_wire.h"
#include "validate.h"

#ifndef PDX_SOURCE_DIR
#define PDX_SOURCE_DIR "."
#endif

#define NNODES 4
#define MN_MAX_PROMPTS 16

typedef struct mnode {
    const char *role; /* "P" or "D" */
    char name[64];
    int host;
    pid_t pid;
    pd_chan_t chan;
    bool up;
    char config[320];
    uint64_t num_blocks;
    uint32_t block_tokens;
    bool load_tail;
    uint64_t handoffs; /* made by this node (to be freed by done/reject) */
    cJSON *stats;      /* from drain */
} mnode_t;

static netns_lab_t g_lab;
static etcd_proc_t g_etcd;
static bool g_etcd_up;
static char g_dir[256];
static mnode_t g_nodes[NNODES];
static int g_passed, g_failed;

static void mn_cleanup(void)
{
    for (int i = 0; i < NNODES; i++) {
        if (g_nodes[i].pid > 0) {
            kill(g_nodes[i].pid, SIGKILL);
            waitpid(g_nodes[i].pid, NULL, 0);
            g_nodes[i].pid = -1;
        }
    }
    if (g_etcd_up) {
        etcd_cleanup(&g_etcd);
        g_etcd_up = false;
    }
    netns_cleanup(&g_lab);
    if (g_dir[0] != '\0') {
        char cmd[320];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) {
            /* best effort */
        }
        g_dir[0] = '\0';
    }
}

static void mn_signal(int sig)
{
    (void)sig;
    mn_cleanup();
    _exit(1);
}

static void check(bool ok, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "  FAILED: ");
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\n");
    va_end(ap);
}

/* A node's config: the colocated one of its role, renamed, its peer
 * removed (found by name), UCX over tcp, smaller arenas and pool (four
 * nodes on one machine) and the store section. */
static int write_config(mnode_t *n, const char *base, int sessions_ns)
{
    FILE *f = fopen(base, "r");
    if (f == NULL) {
        fprintf(stderr, "pdx-validate: %s: %s\n", base, strerror(errno));
        return -1;
    }
    char *text = malloc(1 << 20);
    size_t len = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[len] = '\0';
    cJSON *c = cJSON_Parse(text);
    free(text);
    if (c == NULL) {
        fprintf(stderr, "pdx-validate: %s: not JSON\n", base);
        return -1;
    }
    cJSON *agent = cJSON_GetObjectItemCaseSensitive(c, "agent");
    cJSON_ReplaceItemInObjectCaseSensitive(agent, "name",
                                           cJSON_CreateString(n->name));
    cJSON_DeleteItemFromObjectCaseSensitive(agent, "peer");
    cJSON_DeleteItemFromObjectCaseSensitive(agent, "peer_address");
    cJSON *kv = cJSON_GetObjectItemCaseSensitive(c, "kv");
    cJSON_ReplaceItemInObjectCaseSensitive(kv, "num_blocks",
                                           cJSON_CreateNumber(128));
    cJSON *kids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c, "connector"), "children");
    cJSON *ch;
    cJSON_ArrayForEach(ch, kids)
    {
        if (cJSON_GetObjectItemCaseSensitive(ch, "budget_bytes") != NULL) {
            cJSON_ReplaceItemInObjectCaseSensitive(
                ch, "budget_bytes", cJSON_CreateString("512MiB"));
        }
    }
    cJSON_DeleteItemFromObjectCaseSensitive(c, "backends");
    cJSON *bes = cJSON_AddArrayToObject(c, "backends");
    cJSON *ucx = cJSON_CreateObject();
    cJSON_AddStringToObject(ucx, "name", "ucx");
    cJSON *opts = cJSON_AddObjectToObject(ucx, "options");
    cJSON_AddStringToObject(opts, "tls", "tcp");
    cJSON_AddItemToArray(bes, ucx);
    cJSON *store = cJSON_AddObjectToObject(c, "store");
    cJSON *eps = cJSON_AddArrayToObject(store, "endpoints");
    cJSON_AddItemToArray(eps, cJSON_CreateString(g_etcd.url));
    char ns[64];
    snprintf(ns, sizeof(ns), "pdx-validate-%d", sessions_ns);
    cJSON_AddStringToObject(store, "namespace", ns);
    cJSON_AddNumberToObject(store, "lease_ttl_ms", 5000);
    snprintf(n->config, sizeof(n->config), "%s/%s.json", g_dir, n->name);
    char *out = cJSON_Print(c);
    cJSON_Delete(c);
    f = fopen(n->config, "w");
    if (f == NULL || fputs(out, f) < 0) {
        free(out);
        if (f) {
            fclose(f);
        }
        return -1;
    }
    fclose(f);
    free(out);
    return 0;
}

static int spawn_node(mnode_t *n, const char *node_bin)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        return -1;
    }
    char fdarg[16];
    snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
    char *argv[] = {(char *)node_bin, "--config", n->config, "--fd", fdarg,
                    "--job-timeout", "120", NULL};
    char *env[] = {"UCX_NET_DEVICES=eth0", "UCX_WARN_UNUSED_ENV_VARS=n",
                   NULL};
    n->pid = netns_spawn(&g_lab, n->host, argv, env, sv[1]);
    close(sv[1]);
    if (n->pid < 0) {
        close(sv[0]);
        return -1;
    }
    n->up = true;
    return pd_chan_init(&n->chan, sv[0]);
}

/* The next message from `n` within `ms`, or NULL (why printed). */
static cJSON *recv_from(mnode_t *n, double ms)
{
    cJSON *m = pd_chan_recv(&n->chan, pdx_now_ms_f() + ms);
    if (m == NULL && (n->chan.error || n->chan.eof)) {
        fprintf(stdout, "  node %s closed its channel\n", n->name);
        n->up = false;
    } else if (m == NULL) {
        fprintf(stdout, "  node %s did not answer in %.0f ms\n", n->name, ms);
    }
    return m;
}

static void send_node(mnode_t *n, cJSON *m)
{
    pd_chan_send(&n->chan, m);
    cJSON_Delete(m);
    pd_chan_drain(&n->chan, pdx_now_ms_f() + 10000);
}

/* One job on a node, waited for. */
static cJSON *job(mnode_t *n, const char *op, int sid, int turn,
                  const uint64_t *hist, size_t nt, const char *params,
                  int gen)
{
    char req[64];
    snprintf(req, sizeof(req), "s%d.t%d.%s", sid, turn, n->role);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", op);
    cJSON_AddNumberToObject(m, "sid", sid);
    cJSON_AddNumberToObject(m, "turn", turn);
    cJSON_AddStringToObject(m, "req", req);
    cJSON_AddItemToObject(m, "tokens", tokens_json(hist, nt));
    if (params != NULL) {
        cJSON_AddStringToObject(m, "params", params);
    }
    if (gen > 0) {
        cJSON_AddNumberToObject(m, "gen", gen);
    }
    send_node(n, m);
    for (int guard = 0; guard < 64; guard++) {
        cJSON *r = recv_from(n, 180000);
        if (r == NULL) {
            return NULL;
        }
        const char *rop = pd_json_str(r, "op");
        if (rop != NULL && strcmp(rop, op) == 0 &&
            (int)pd_json_num(r, "sid", -1) == sid) {
            return r;
        }
        cJSON_Delete(r);
    }
    return NULL;
}

typedef struct turn_row {
    int sid, turn;
    const char *p, *d;
    size_t prompt, p_from_d, p_local, d_from_p, generated;
    uint64_t diff;
    double ms;
    char p_source[16];
} turn_row_t;

static int parse_prompts(const char *s, size_t *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok(buf, ","); t != NULL && n < max;
         t = strtok(NULL, ",")) {
        out[n++] = strtoul(t, NULL, 10);
    }
    return n;
}

static void print_paths(mnode_t *n)
{
    const cJSON *peers = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(n->stats, "agent_stats"), "peers");
    const cJSON *p;
    cJSON_ArrayForEach(p, peers)
    {
        const cJSON *ucx = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(p, "paths"), "ucx");
        const char *tr = pd_json_str(ucx, "transport");
        bool same = jbool(p, "same_host");
        printf("  %-12s -> %-12s %s, ucx %s, %s\n", n->name,
               pd_json_str(p, "name") ? pd_json_str(p, "name") : "?",
               same ? "same host" : "another host", tr ? tr : "(none)",
               pd_json_str(p, "state") ? pd_json_str(p, "state") : "?");
        if (strcmp(pd_json_str(p, "state") ? pd_json_str(p, "state") : "",
                   "unloaded") == 0) {
            continue;
        }
        check(!same, "%s sees %s as the same host (pid namespaces differ)",
              n->name, pd_json_str(p, "name"));
        check(tr != NULL && strstr(tr, "tcp") != NULL,
              "%s -> %s: expected UCX over tcp, got %s", n->name,
              pd_json_str(p, "name"), tr ? tr : "nothing");
    }
}


int pd_multinode_main(int argc, char **argv)
{
    int sessions = 6, turns = 2, gen = 64, user_tokens = 64, shared = 512;
    size_t prompts[MN_MAX_PROMPTS];
    int nprompts = parse_prompts("1200,2600,700", prompts, MN_MAX_PROMPTS);
    char node_bin[PATH_MAX] = "";
    static char p_def[PATH_MAX], d_def[PATH_MAX];
    snprintf(p_def, sizeof(p_def), "%s/glm52-fp8-mtp/colocated-prefill.json",
             pd_config_dir());
    snprintf(d_def, sizeof(d_def), "%s/glm52-fp8-mtp/colocated-decode.json",
             pd_config_dir());
    const char *p_base = p_def;
    const char *d_base = d_def;
    static struct option lo[] = {
        {"multi-node", no_argument, NULL, 'M'},
        {"sessions", required_argument, NULL, 's'},
        {"turns", required_argument, NULL, 't'},
        {"prompts", required_argument, NULL, 'l'},
        {"decode", required_argument, NULL, 'g'},
        {"user-tokens", required_argument, NULL, 'u'},
        {"shared-prefix", required_argument, NULL, 'x'},
        {"node", required_argument, NULL, 'n'},
        {"p-config", required_argument, NULL, 'P'},
        {"d-config", required_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'M':
            break;
        case 's':
            sessions = atoi(optarg);
            break;
        case 't':
            turns = atoi(optarg);
            break;
        case 'l':
            nprompts = parse_prompts(optarg, prompts, MN_MAX_PROMPTS);
            break;
        case 'g':
            gen = atoi(optarg);
            break;
        case 'u':
            user_tokens = atoi(optarg);
            break;
        case 'x':
            shared = atoi(optarg);
            break;
        case 'n':
            snprintf(node_bin, sizeof(node_bin), "%s", optarg);
            break;
        case 'P':
            p_base = optarg;
            break;
        case 'D':
            d_base = optarg;
            break;
        default:
            printf("usage: pdx-validate --multi-node [--sessions N] [--turns "
                   "T] [--prompts A,B,..] [--decode G] [--user-tokens U] "
                   "[--shared-prefix X] [--node PATH] [--p-config F] "
                   "[--d-config F]\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (sessions < 1 || turns < 2 || nprompts < 1 || gen < 1) {
        fprintf(stderr, "pdx-validate: --multi-node needs at least 1 "
                        "session, 2 turns, a prompt and a decode length\n");
        return 2;
    }
    if (node_bin[0] == '\0') {
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (k > 0) {
            self[k] = '\0';
            char *slash = strrchr(self, '/');
            if (slash != NULL) {
                *slash = '\0';
            }
            snprintf(node_bin, sizeof(node_bin), "%s/glm52-pd-node", self);
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    char why[512];
    if (!etcd_available(why, sizeof(why))) {
        printf("pdx-validate --multi-node: skipped: %s\n", why);
        return 77;
    }
    if (netns_init(&g_lab, NNODES, why, sizeof(why)) != 0) {
        printf("pdx-validate --multi-node: skipped: %s\n", why);
        return 77;
    }
    atexit(mn_cleanup);
    signal(SIGINT, mn_signal);
    signal(SIGTERM, mn_signal);
    snprintf(g_dir, sizeof(g_dir), "/tmp/pdx-validate-XXXXXX");
    if (mkdtemp(g_dir) == NULL || netns_enter(&g_lab, -2) != 0 ||
        etcd_start(&g_etcd, netns_hub_ip(), NULL, why, sizeof(why)) != 0) {
        fprintf(stderr, "pdx-validate: setup: %s\n", why);
        return 2;
    }
    g_etcd_up = true;
    netns_enter(&g_lab, -1);
    printf("multi-node: 4 hosts (network + pid namespaces on 10.77.0.0/24), "
           "etcd %s; nodes meet only through the store\n", g_etcd.url);
    static const char *const names[NNODES] = {"glm52-p-h0", "glm52-p-h1",
                                              "glm52-d-h2", "glm52-d-h3"};
    for (int i = 0; i < NNODES; i++) {
        mnode_t *n = &g_nodes[i];
        n->role = i < 2 ? "P" : "D";
        n->host = i;
        snprintf(n->name, sizeof(n->name), "%s", names[i]);
        if (write_config(n, i < 2 ? p_base : d_base, (int)getpid()) != 0 ||
            spawn_node(n, node_bin) != 0) {
            fprintf(stderr, "pdx-validate: cannot start %s\n", n->name);
            return 2;
        }
    }
    for (int i = 0; i < NNODES; i++) {
        mnode_t *n = &g_nodes[i];
        cJSON *h = recv_from(n, 120000);
        if (h == NULL || !jbool(h, "ok")) {
            fprintf(stderr, "pdx-validate: node %s: %s\n", n->name,
                    h && pd_json_str(h, "error") ? pd_json_str(h, "error")
                                                 : "did not start");
            cJSON_Delete(h);
            return 2;
        }
        n->num_blocks = jnum(h, "num_blocks");
        n->block_tokens = (uint32_t)jnum(h, "block_tokens");
        n->load_tail = jbool(h, "load_tail");
        cJSON_Delete(h);
        printf("  %s on host %d (%s), %llu blocks\n", n->name, n->host,
               g_lab.ip[n->host], (unsigned long long)n->num_blocks);
    }
    uint32_t B = g_nodes[0].block_tokens;
    turn_row_t *rows = calloc((size_t)sessions * (size_t)turns, sizeof(*rows));
    size_t nrows = 0, reuse_tokens = 0, cross_reuse = 0;
    double t_start = pdx_now_ms_f();
    for (int sid = 0; sid < sessions; sid++) {
        size_t cap = 1 << 16;
        uint64_t *hist = malloc(cap * sizeof(*hist));
        size_t n = 0;
        char *params_d = NULL;
        size_t prev_d_nfull = 0;
        mnode_t *prev_d = NULL;
        for (int t = 1; t <= turns; t++) {
            mnode_t *P = &g_nodes[(sid + t - 1) % 2];
            mnode_t *D = &g_nodes[2 + (sid / 2 + t - 1) % 2];
            size_t want = t == 1 ? prompts[sid % nprompts]
                                 : n + (size_t)user_tokens;
            if (want + (size_t)gen > cap) {
                check(false, "session %d: history too long", sid);
                break;
            }
            for (size_t i = n; i < want; i++) {
                hist[i] = t == 1 && i < (size_t)shared
                              ? pd_user_token(0x5157ull, i)
                              : pd_user_token(((uint64_t)sid << 8) |
                                                  (uint64_t)t,
                                              i);
            }
            n = want;
            turn_row_t *row = &rows[nrows++];
            *row = (turn_row_t){.sid = sid, .turn = t, .p = P->name,
                                .d = D->name, .prompt = want};
            double t0 = pdx_now_ms_f();
            cJSON *rp = job(P, "prefill", sid, t, hist, n, params_d, 0);
            if (rp == NULL || !jbool(rp, "ok")) {
                check(false, "session %d turn %d: prefill on %s failed: %s",
                      sid, t, P->name,
                      rp && pd_json_str(rp, "error") ? pd_json_str(rp, "error")
                                                     : "no answer");
                cJSON_Delete(rp);
                break;
            }
            P->handoffs++;
            snprintf(row->p_source, sizeof(row->p_source), "%s",
                     pd_json_str(rp, "source") ? pd_json_str(rp, "source")
                                               : "?");
            size_t p_loaded = jnum(rp, "loaded");
            uint64_t p_diff = jnum(rp, "diff_bytes");
            size_t p_nfull = jnum(rp, "nfull");
            bool p_has_tail = jbool(rp, "has_tail");
            size_t p_tail = jnum(rp, "tail_tokens");
            check(p_diff == 0, "session %d turn %d: %llu bytes P (%s) loaded "
                  "differ", sid, t, (unsigned long long)p_diff, P->name);
            check(!jbool(rp, "load_failed"), "session %d turn %d: P's load "
                  "failed and was recomputed", sid, t);
            if (t >= 2) {
                size_t held = prev_d_nfull * B;
                held = held > want - 1 ? want - 1 : held;
                check(strcmp(row->p_source, "remote") == 0 &&
                          p_loaded >= held,
                      "session %d turn %d: %s reused %zu tokens from %s, %s "
                      "held %zu", sid, t, P->name, p_loaded, row->p_source,
                      prev_d ? prev_d->name : "D", held);
                row->p_from_d = strcmp(row->p_source, "remote") == 0
                                    ? p_loaded : 0;
                reuse_tokens += row->p_from_d;
                cross_reuse += row->p_from_d > 0;
            } else {
                row->p_local = p_loaded;
            }
            char *params_p = strdup(pd_json_str(rp, "params")
                                        ? pd_json_str(rp, "params") : "");
            row->diff += p_diff;
            cJSON_Delete(rp);
            free(params_d);
            params_d = NULL;
            cJSON *rd = job(D, "decode", sid, t, hist, n, params_p, gen);
            free(params_p);
            if (rd == NULL || !jbool(rd, "ok")) {
                check(false, "session %d turn %d: decode on %s failed: %s",
                      sid, t, D->name,
                      rd && pd_json_str(rd, "error") ? pd_json_str(rd, "error")
                                                     : "no answer");
                cJSON_Delete(rd);
                break;
            }
            D->handoffs++;
            size_t d_loaded = jnum(rd, "loaded");
            uint64_t d_diff = jnum(rd, "diff_bytes");
            size_t wantd = p_nfull * B +
                           (D->load_tail && p_has_tail ? p_tail : 0);
            wantd = wantd > want - 1 ? want - 1 : wantd;
            check(d_diff == 0, "session %d turn %d: %llu bytes D (%s) loaded "
                  "differ", sid, t, (unsigned long long)d_diff, D->name);
            check(strcmp(pd_json_str(rd, "source") ? pd_json_str(rd, "source")
                                                   : "",
                         "remote") == 0 &&
                      d_loaded >= wantd,
                  "session %d turn %d: %s loaded %zu tokens from %s, wanted "
                  "%zu", sid, t, D->name, d_loaded, P->name, wantd);
            row->d_from_p = d_loaded;
            row->diff += d_diff;
            prev_d_nfull = jnum(rd, "nfull");
            prev_d = D;
            params_d = strdup(pd_json_str(rd, "params")
                                  ? pd_json_str(rd, "params") : "");
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(rd, "generated");
            size_t ng = (size_t)cJSON_GetArraySize(g);
            row->generated = ng;
            uint64_t h = PD_PREFIX_ROOT;
            for (size_t i = 0; i < n; i++) {
                h = pd_prefix_step(h, hist[i]);
            }
            size_t bad = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, g)
            {
                uint64_t tok = (uint64_t)e->valuedouble;
                bad += tok != pd_next_token(h);
                h = pd_prefix_step(h, tok);
                hist[n++] = tok;
            }
            check(bad == 0 && ng == (size_t)gen,
                  "session %d turn %d: %s generated %zu tokens, %zu not what "
                  "the stand-in samples", sid, t, D->name, ng, bad);
            cJSON_Delete(rd);
            row->ms = pdx_now_ms_f() - t0;
        }
        if (params_d != NULL) {
            /* Nobody reads D's last handoff: a P rejects it (finding D by
             * name), so D's pool lease goes now. */
            mnode_t *P = &g_nodes[(sid + turns) % 2];
            cJSON *rj = cJSON_CreateObject();
            cJSON_AddStringToObject(rj, "op", "reject");
            cJSON_AddNumberToObject(rj, "sid", sid);
            cJSON_AddStringToObject(rj, "params", params_d);
            send_node(P, rj);
            cJSON *r = NULL;
            for (int guard = 0; guard < 64 && r == NULL; guard++) {
                r = recv_from(P, 60000);
                if (r == NULL) {
                    break;
                }
                if (strcmp(pd_json_str(r, "op") ? pd_json_str(r, "op") : "",
                           "reject") != 0) {
                    cJSON_Delete(r);
                    r = NULL;
                }
            }
            check(r != NULL && jbool(r, "ok"),
                  "session %d: %s could not reject D's last handoff: %s", sid,
                  P->name,
                  r && pd_json_str(r, "error") ? pd_json_str(r, "error")
                                               : "no answer");
            cJSON_Delete(r);
        }
        free(params_d);
        free(hist);
    }
    double wall = pdx_now_ms_f() - t_start;
    /* Drain: nothing held, no lease expired, every block free, every
     * handoff freed by its reader's done or a reject. */
    for (int i = 0; i < NNODES; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "op", "drain");
        cJSON_AddNumberToObject(m, "timeout_ms", 15000);
        send_node(&g_nodes[i], m);
    }
    for (int i = 0; i < NNODES; i++) {
        mnode_t *n = &g_nodes[i];
        cJSON *r = NULL;
        for (int guard = 0; guard < 64 && r == NULL; guard++) {
            r = recv_from(n, 30000);
            if (r == NULL) {
                break;
            }
            if (strcmp(pd_json_str(r, "op") ? pd_json_str(r, "op") : "",
                       "drain") != 0) {
                cJSON_Delete(r);
                r = NULL;
            }
        }
        if (r == NULL) {
            check(false, "drain: %s did not answer", n->name);
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "stats");
        check(jbool(r, "ok"), "%s: %zu requests still held after the run",
              n->name, jnum(st, "held"));
        check(jnum(st, "freed_expired") == 0,
              "%s: %zu handoff leases expired", n->name,
              jnum(st, "freed_expired"));
        check(jnum(st, "free_blocks") == n->num_blocks,
              "%s: %zu of %llu blocks free after the run", n->name,
              jnum(st, "free_blocks"), (unsigned long long)n->num_blocks);
        check(jnum(cJSON_GetObjectItemCaseSensitive(st, "offload"),
                   "leased_blocks") == 0,
              "%s: pool blocks still leased after the run", n->name);
        size_t freed = jnum(st, "freed_done") + jnum(st, "freed_reject");
        check(freed == n->handoffs,
              "%s: %llu handoffs made, %zu freed by done or reject", n->name,
              (unsigned long long)n->handoffs, freed);
        n->stats = cJSON_Duplicate(st, 1);
        cJSON_Delete(r);
    }

    printf("\n sess turn  P            D            prompt  P_turn1  "
           "P_from_D  D_from_P  diff_B     ms\n");
    for (size_t i = 0; i < nrows; i++) {
        const turn_row_t *r = &rows[i];
        printf(" %4d %4d  %-12s %-12s %6zu  %7zu  %8zu  %8zu  %6llu  "
               "%5.0f\n", r->sid, r->turn, r->p, r->d, r->prompt, r->p_local,
               r->p_from_d, r->d_from_p, (unsigned long long)r->diff, r->ms);
    }
    printf("\npaths (from each node's agent):\n");
    for (int i = 0; i < NNODES; i++) {
        if (g_nodes[i].stats != NULL) {
            print_paths(&g_nodes[i]);
        }
    }
    printf("\nstore:\n");
    size_t discovered = 0;
    for (int i = 0; i < NNODES; i++) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(g_nodes[i].stats,
                                                          "store");
        discovered += jnum(k, "discovered");
        printf("  %-12s found %zu peers by name, registered %zu blocks, %zu "
               "cross-node hits (%zu blocks), served %zu; %s\n",
               g_nodes[i].name, jnum(k, "discovered"),
               jnum(k, "registered_blocks"), jnum(k, "remote_hits"),
               jnum(k, "remote_hit_blocks"), jnum(k, "remote_served"),
               pd_json_str(k, "describe") ? pd_json_str(k, "describe") : "");
    }
    check(discovered >= 4, "only %zu peers were found through the store",
          discovered);
    check(cross_reuse > 0 && reuse_tokens > 0,
          "no D-to-P reuse across hosts happened");
    printf("\nD-to-P reuse across hosts: %zu turns, %zu tokens; %zu turns in "
           "%.1f s\n", cross_reuse, reuse_tokens, nrows, wall / 1000.0);
    for (int i = 0; i < NNODES; i++) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "op", "quit");
        send_node(&g_nodes[i], q);
    }
    double quit_deadline = pdx_now_ms_f() + 5000;
    for (int i = 0; i < NNODES; i++) {
        if (g_nodes[i].pid > 0) {
            reap_child(g_nodes[i].pid, quit_deadline);
            g_nodes[i].pid = -1;
        }
        cJSON_Delete(g_nodes[i].stats);
    }
    free(rows);
    printf("%s: %d checks passed, %d failed\n", g_failed ? "FAIL" : "PASS",
           g_passed, g_failed);
    mn_cleanup();
    return g_failed ? 1 : 0;
}
