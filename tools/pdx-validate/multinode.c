/* pdx-validate --multi-node: two prefill and two decode "hosts" (network +
 * pid namespaces joined by veth pairs, support/netns/netns.h), one etcd
 * on the hub, four glm52-pd-node processes whose configs carry a `store`
 * section and no peer: they find each other only through etcd, by the
 * names in handoff parameters. GLM-5.2 sessions are routed across the
 * hosts (turn k on one P and one D, turn k+1 on the other P, which reuses
 * what the previous D decoded from that D's pool), every loaded block is
 * checked byte for byte by the nodes, and the report shows each peer's
 * path (UCX over tcp between hosts, never same-host) and the store's work.
 * With --vram every node's arenas are in GPU memory (through the CUDA
 * driver PDX_CUDA_DRIVER_LIB names, the tests' fake one, else
 * libcuda.so.1): the nodes check the bytes they read back from it, and
 * every request must have been staged through pinned host memory.
 *
 * Exit 0 when every check passes, 1 on a failed check, 2 on a setup error,
 * 77 when the machine refuses namespaces or etcd is missing (reason
 * printed). The options are parsed with the single run's (options.c).
 *
 * The run's steps, top down: multinode_run -> mn_start_lab, mn_start_nodes,
 * run_session per session (run_turn: extend_prompt, turn_prefill,
 * turn_decode; reject_last_handoff), mn_drain, the report, mn_quit. */
#include <errno.h>
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
    char memory[8];    /* its arenas': "dram" or "vram" (hello) */
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
 * nodes on one machine) and the store section. With `vram`, the arenas in
 * GPU memory (P's on device 0, D's on device 1) and cuda_ipc created too
 * (it declines peers on other hosts: UCX stages their GPU memory). */
static int write_config(mnode_t *n, const char *base, int sessions_ns,
                        bool vram)
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
    if (vram) {
        cJSON_DeleteItemFromObjectCaseSensitive(kv, "memory");
        cJSON_DeleteItemFromObjectCaseSensitive(kv, "device");
        cJSON_AddStringToObject(kv, "memory", "vram");
        cJSON_AddNumberToObject(kv, "device", n->role[0] == 'P' ? 0 : 1);
    }
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
    if (vram) {
        cJSON *cipc = cJSON_CreateObject();
        cJSON_AddStringToObject(cipc, "name", "cuda_ipc");
        cJSON_AddItemToArray(bes, cipc);
    }
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
                    "--job-timeout",  "120",      NULL};
    char *env[] = {"UCX_NET_DEVICES=eth0", "UCX_WARN_UNUSED_ENV_VARS=n", NULL};
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
                  const uint64_t *hist, size_t nt, const char *params, int gen)
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

/* The next message of `op` from `n` within `ms` each, others dropped;
 * NULL when none came (why printed). */
static cJSON *recv_op(mnode_t *n, const char *op, double ms)
{
    cJSON *r = NULL;
    for (int guard = 0; guard < 64 && r == NULL; guard++) {
        r = recv_from(n, ms);
        if (r == NULL) {
            break;
        }
        if (strcmp(pd_json_str(r, "op") ? pd_json_str(r, "op") : "", op) != 0) {
            cJSON_Delete(r);
            r = NULL;
        }
    }
    return r;
}

typedef struct turn_row {
    int sid, turn;
    const char *p, *d;
    size_t prompt, p_from_d, p_local, d_from_p, generated;
    uint64_t diff;
    double ms;
    char p_source[16];
} turn_row_t;

/* One run: its options, the turns' rows and the D-to-P reuse seen. */
typedef struct mn_run {
    const opts_t *o;
    uint32_t B; /* tokens per block */
    turn_row_t *rows;
    size_t nrows, reuse_tokens, cross_reuse;
    double wall_ms;
} mn_run_t;

/* One session: its history and what the previous turn's D left. */
typedef struct mn_session {
    int sid;
    uint64_t *hist;
    size_t n, cap;
    char *params_d; /* D's latest handoff, not read yet */
    size_t prev_d_nfull;
    const mnode_t *prev_d;
} mn_session_t;

/* What a prefill handed to the turn's decode. */
typedef struct prefill_out {
    char *params;
    size_t nfull, tail_tokens;
    bool has_tail;
} prefill_out_t;

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
        if (strcmp(n->memory, "vram") == 0) {
            /* GPU memory on both sides, across hosts, a UCX without CUDA:
             * every request staged through pinned host memory. */
            const char *fw = pd_json_str(ucx, "fallback_why");
            size_t req = jnum(p, "requests"), fb = jnum(p, "fallbacks");
            printf("  %-12s    %zu requests, %zu staged: %.70s\n", "", req, fb,
                   fw ? fw : "");
            check(fw != NULL && strstr(fw, "staged") != NULL,
                  "%s -> %s: the path report does not say staged: %s",
                  n->name, pd_json_str(p, "name"), fw ? fw : "nothing");
            check(fb == req, "%s -> %s: %zu of %zu requests staged", n->name,
                  pd_json_str(p, "name"), fb, req);
        }
    }
    if (strcmp(n->memory, "vram") == 0) {
        check(jnum(n->stats, "gpu_block_copies") > 0,
              "%s: no block went between its GPU arenas and the checks",
              n->name);
    }
}

/* The hosts, the private etcd on the hub and the temporary directory of
 * the configs: 0, or the exit code (77: the machine refuses them). */
static int mn_start_lab(void)
{
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
           "etcd %s; nodes meet only through the store\n",
           g_etcd.url);
    return 0;
}

/* The four nodes, one per host, each up and saying hello: 0, or 2. */
static int mn_start_nodes(const opts_t *o)
{
    static const char *const names[NNODES] = {"glm52-p-h0", "glm52-p-h1",
                                              "glm52-d-h2", "glm52-d-h3"};
    for (int i = 0; i < NNODES; i++) {
        mnode_t *n = &g_nodes[i];
        n->role = i < 2 ? "P" : "D";
        n->host = i;
        snprintf(n->name, sizeof(n->name), "%s", names[i]);
        if (write_config(n, i < 2 ? g_p_cfg : g_d_cfg, (int)getpid(),
                         o->vram) != 0 ||
            spawn_node(n, o->node) != 0) {
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
        const char *mem = pd_json_str(h, "memory");
        snprintf(n->memory, sizeof(n->memory), "%s", mem ? mem : "dram");
        if (o->vram && strcmp(n->memory, "vram") != 0) {
            fprintf(stderr, "pdx-validate: node %s: arenas in %s, not vram\n",
                    n->name, n->memory);
            cJSON_Delete(h);
            return 2;
        }
        printf("  %s on host %d (%s), %llu blocks in %s %d\n", n->name,
               n->host, g_lab.ip[n->host], (unsigned long long)n->num_blocks,
               strcmp(n->memory, "vram") == 0 ? "GPU memory of device"
                                              : "host memory, device",
               (int)jnum(h, "device"));
        cJSON_Delete(h);
    }
    return 0;
}

/* Turn `t`'s prompt in s->hist: the first turn's is the session's first
 * prompt (its first --shared-prefix tokens common to every session), a
 * later one's the history so far and --user-tokens new tokens. false when
 * the history has no room for it and its decode. */
static bool extend_prompt(const opts_t *o, mn_session_t *s, int t)
{
    int sid = s->sid;
    size_t want =
        t == 1 ? o->prompts[sid % o->nprompts] : s->n + (size_t)o->user_tokens;
    if (want + (size_t)o->gen > s->cap) {
        check(false, "session %d: history too long", sid);
        return false;
    }
    for (size_t i = s->n; i < want; i++) {
        s->hist[i] = t == 1 && i < (size_t)o->shared
                         ? pd_user_token(0x5157ull, i)
                         : pd_user_token(((uint64_t)sid << 8) | (uint64_t)t, i);
    }
    s->n = want;
    return true;
}

/* Turn `t`'s prefill on `P`, from the previous D's handoff after the
 * first turn, checked: P's bytes, and its reuse of what that D held.
 * false when it failed (the handoff it had is still s->params_d). */
static bool turn_prefill(mn_run_t *run, mn_session_t *s, int t, mnode_t *P,
                         turn_row_t *row, prefill_out_t *out)
{
    int sid = s->sid;
    size_t want = row->prompt;
    cJSON *rp = job(P, "prefill", sid, t, s->hist, s->n, s->params_d, 0);
    if (rp == NULL || !jbool(rp, "ok")) {
        check(false, "session %d turn %d: prefill on %s failed: %s", sid, t,
              P->name,
              rp && pd_json_str(rp, "error") ? pd_json_str(rp, "error")
                                             : "no answer");
        cJSON_Delete(rp);
        return false;
    }
    P->handoffs++;
    snprintf(row->p_source, sizeof(row->p_source), "%s",
             pd_json_str(rp, "source") ? pd_json_str(rp, "source") : "?");
    size_t p_loaded = jnum(rp, "loaded");
    uint64_t p_diff = jnum(rp, "diff_bytes");
    out->nfull = jnum(rp, "nfull");
    out->has_tail = jbool(rp, "has_tail");
    out->tail_tokens = jnum(rp, "tail_tokens");
    check(p_diff == 0, "session %d turn %d: %llu bytes P (%s) loaded differ",
          sid, t, (unsigned long long)p_diff, P->name);
    check(!jbool(rp, "load_failed"),
          "session %d turn %d: P's load failed and was recomputed", sid, t);
    if (t >= 2) {
        size_t held = s->prev_d_nfull * run->B;
        held = held > want - 1 ? want - 1 : held;
        check(strcmp(row->p_source, "remote") == 0 && p_loaded >= held,
              "session %d turn %d: %s reused %zu tokens from %s, %s "
              "held %zu",
              sid, t, P->name, p_loaded, row->p_source,
              s->prev_d ? s->prev_d->name : "D", held);
        row->p_from_d = strcmp(row->p_source, "remote") == 0 ? p_loaded : 0;
        run->reuse_tokens += row->p_from_d;
        run->cross_reuse += row->p_from_d > 0;
    } else {
        row->p_local = p_loaded;
    }
    out->params =
        strdup(pd_json_str(rp, "params") ? pd_json_str(rp, "params") : "");
    row->diff += p_diff;
    cJSON_Delete(rp);
    free(s->params_d);
    s->params_d = NULL;
    return true;
}

/* The tokens `D` generated (reply `rd`): each what the stand-in samples
 * after the history so far, appended to it. Returns how many. */
static size_t take_generated(const opts_t *o, mn_session_t *s, int t,
                             const mnode_t *D, const cJSON *rd)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(rd, "generated");
    size_t ng = (size_t)cJSON_GetArraySize(g);
    uint64_t h = PD_PREFIX_ROOT;
    for (size_t i = 0; i < s->n; i++) {
        h = pd_prefix_step(h, s->hist[i]);
    }
    size_t bad = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, g)
    {
        uint64_t tok = (uint64_t)e->valuedouble;
        bad += tok != pd_next_token(h);
        h = pd_prefix_step(h, tok);
        s->hist[s->n++] = tok;
    }
    check(bad == 0 && ng == (size_t)o->gen,
          "session %d turn %d: %s generated %zu tokens, %zu not what the "
          "stand-in samples",
          s->sid, t, D->name, ng, bad);
    return ng;
}

/* Turn `t`'s decode on `D` from P's handoff, checked: D's bytes, how much
 * of P's handoff it loaded, and what it generated. false when it failed. */
static bool turn_decode(mn_run_t *run, mn_session_t *s, int t, const mnode_t *P,
                        mnode_t *D, turn_row_t *row, const prefill_out_t *pf)
{
    int sid = s->sid;
    size_t want = row->prompt;
    cJSON *rd =
        job(D, "decode", sid, t, s->hist, s->n, pf->params, run->o->gen);
    if (rd == NULL || !jbool(rd, "ok")) {
        check(false, "session %d turn %d: decode on %s failed: %s", sid, t,
              D->name,
              rd && pd_json_str(rd, "error") ? pd_json_str(rd, "error")
                                             : "no answer");
        cJSON_Delete(rd);
        return false;
    }
    D->handoffs++;
    size_t d_loaded = jnum(rd, "loaded");
    uint64_t d_diff = jnum(rd, "diff_bytes");
    size_t wantd = pf->nfull * run->B +
                   (D->load_tail && pf->has_tail ? pf->tail_tokens : 0);
    wantd = wantd > want - 1 ? want - 1 : wantd;
    check(d_diff == 0, "session %d turn %d: %llu bytes D (%s) loaded differ",
          sid, t, (unsigned long long)d_diff, D->name);
    check(strcmp(pd_json_str(rd, "source") ? pd_json_str(rd, "source") : "",
                 "remote") == 0 &&
              d_loaded >= wantd,
          "session %d turn %d: %s loaded %zu tokens from %s, wanted "
          "%zu",
          sid, t, D->name, d_loaded, P->name, wantd);
    row->d_from_p = d_loaded;
    row->diff += d_diff;
    s->prev_d_nfull = jnum(rd, "nfull");
    s->prev_d = D;
    s->params_d =
        strdup(pd_json_str(rd, "params") ? pd_json_str(rd, "params") : "");
    row->generated = take_generated(run->o, s, t, D, rd);
    cJSON_Delete(rd);
    return true;
}

/* Turn `t` of session `s`: on one P and one D of its own (the next turn
 * goes to the other P, which reuses what this D decoded). false when the
 * session can go no further. */
static bool run_turn(mn_run_t *run, mn_session_t *s, int t)
{
    mnode_t *P = &g_nodes[(s->sid + t - 1) % 2];
    mnode_t *D = &g_nodes[2 + (s->sid / 2 + t - 1) % 2];
    if (!extend_prompt(run->o, s, t)) {
        return false;
    }
    turn_row_t *row = &run->rows[run->nrows++];
    *row = (turn_row_t){
        .sid = s->sid, .turn = t, .p = P->name, .d = D->name, .prompt = s->n};
    double t0 = pdx_now_ms_f();
    prefill_out_t pf;
    if (!turn_prefill(run, s, t, P, row, &pf)) {
        return false;
    }
    bool ok = turn_decode(run, s, t, P, D, row, &pf);
    free(pf.params);
    if (ok) {
        row->ms = pdx_now_ms_f() - t0;
    }
    return ok;
}

/* Nobody reads D's last handoff of session `sid`: a P rejects it (finding
 * D by name), so D's pool lease goes now. */
static void reject_last_handoff(int sid, int turns, const char *params)
{
    mnode_t *P = &g_nodes[(sid + turns) % 2];
    cJSON *rj = cJSON_CreateObject();
    cJSON_AddStringToObject(rj, "op", "reject");
    cJSON_AddNumberToObject(rj, "sid", sid);
    cJSON_AddStringToObject(rj, "params", params);
    send_node(P, rj);
    cJSON *r = recv_op(P, "reject", 60000);
    check(r != NULL && jbool(r, "ok"),
          "session %d: %s could not reject D's last handoff: %s", sid, P->name,
          r && pd_json_str(r, "error") ? pd_json_str(r, "error") : "no answer");
    cJSON_Delete(r);
}

static void run_session(mn_run_t *run, int sid)
{
    mn_session_t s = {.sid = sid, .cap = 1 << 16};
    s.hist = malloc(s.cap * sizeof(*s.hist));
    for (int t = 1; t <= run->o->turns; t++) {
        if (!run_turn(run, &s, t)) {
            break;
        }
    }
    if (s.params_d != NULL) {
        reject_last_handoff(sid, run->o->turns, s.params_d);
    }
    free(s.params_d);
    free(s.hist);
}

/* Node `n`'s drain reply `r`: nothing held, no lease expired, every block
 * free, every handoff freed by its reader's done or a reject. */
static void check_drained(mnode_t *n, const cJSON *r)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "stats");
    check(jbool(r, "ok"), "%s: %zu requests still held after the run", n->name,
          jnum(st, "held"));
    check(jnum(st, "freed_expired") == 0, "%s: %zu handoff leases expired",
          n->name, jnum(st, "freed_expired"));
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
}

/* Every node drained and checked; their stats kept for the report. */
static void mn_drain(void)
{
    for (int i = 0; i < NNODES; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "op", "drain");
        cJSON_AddNumberToObject(m, "timeout_ms", 15000);
        send_node(&g_nodes[i], m);
    }
    for (int i = 0; i < NNODES; i++) {
        mnode_t *n = &g_nodes[i];
        cJSON *r = recv_op(n, "drain", 30000);
        if (r == NULL) {
            check(false, "drain: %s did not answer", n->name);
            continue;
        }
        check_drained(n, r);
        cJSON_Delete(r);
    }
}

/* The turns, each peer's path, the store's work, and the checks on the
 * last two: peers found through the store, D-to-P reuse across hosts. */
static void mn_report(const mn_run_t *run)
{
    printf("\n sess turn  P            D            prompt  P_turn1  "
           "P_from_D  D_from_P  diff_B     ms\n");
    for (size_t i = 0; i < run->nrows; i++) {
        const turn_row_t *r = &run->rows[i];
        printf(" %4d %4d  %-12s %-12s %6zu  %7zu  %8zu  %8zu  %6llu  "
               "%5.0f\n",
               r->sid, r->turn, r->p, r->d, r->prompt, r->p_local, r->p_from_d,
               r->d_from_p, (unsigned long long)r->diff, r->ms);
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
        const cJSON *k =
            cJSON_GetObjectItemCaseSensitive(g_nodes[i].stats, "store");
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
    check(run->cross_reuse > 0 && run->reuse_tokens > 0,
          "no D-to-P reuse across hosts happened");
    printf("\nD-to-P reuse across hosts: %zu turns, %zu tokens; %zu turns in "
           "%.1f s\n",
           run->cross_reuse, run->reuse_tokens, run->nrows,
           run->wall_ms / 1000.0);
}

/* Every node told to quit, given 5 s, then killed. */
static void mn_quit(void)
{
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
}

int multinode_run(const opts_t *o)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    int rc = mn_start_lab();
    if (rc != 0 || (rc = mn_start_nodes(o)) != 0) {
        return rc;
    }
    mn_run_t run = {.o = o, .B = g_nodes[0].block_tokens};
    run.rows =
        calloc((size_t)o->sessions * (size_t)o->turns, sizeof(*run.rows));
    double t_start = pdx_now_ms_f();
    for (int sid = 0; sid < o->sessions; sid++) {
        run_session(&run, sid);
    }
    run.wall_ms = pdx_now_ms_f() - t_start;
    mn_drain();
    mn_report(&run);
    mn_quit();
    free(run.rows);
    printf("%s: %d checks passed, %d failed\n", g_failed ? "FAIL" : "PASS",
           g_passed, g_failed);
    mn_cleanup();
    return g_failed ? 1 : 0;
}
