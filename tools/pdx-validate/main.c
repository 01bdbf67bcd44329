/* pdx-validate: drives the GLM-5.2 P/D example (two glm52-pd-node
 * processes) through multi-turn sessions and checks the KV connector end to
 * end: P -> D handoff (partial tail included), D saving what it decoded to
 * its offload tier, the next turn on P reusing D's blocks instead of
 * recomputing them, P's own offload tier for a shared system prompt, and
 * every loaded block byte-exact against the model stand-in.
 *
 * It plays the router: starts both nodes, passes their metadata blobs to
 * each other, keeps up to --concurrency sessions in flight (admitted so the
 * in-flight sessions' blocks fit both nodes and D's pool), carries the
 * handoff parameters between P and D, and prints a per-turn report.
 *
 * --soak runs many sessions of random prompt lengths at concurrency 17 or
 * more and cancels some of them at random points (D rejecting P's handoff
 * unread, D aborting its load of it in flight, P aborting or rejecting D's
 * handoff in a later turn). Cancelled sessions are not errors; every load
 * that completed is still checked byte for byte, and at the end every
 * handoff must have been freed by done or reject (none by lease expiry),
 * every arena block be free and no pool lease be left.
 *
 * Exit 0 only when every check passed; 1 on a failed check; 2 on bad usage
 * or a node that could not start; 3 when a node refused its peer at
 * connect. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
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

#ifndef PDX_SOURCE_DIR
#define PDX_SOURCE_DIR "."
#endif
#ifndef PDX_NODE_PATH
#define PDX_NODE_PATH "glm52-pd-node"
#endif

#define MAX_PROMPTS 32
#define SOAK_MIN_CONCURRENCY 17
#define EXIT_FAIL 1
#define EXIT_SETUP 2
#define EXIT_REFUSED 3

/* ---- options ---- */

typedef struct opts {
    const char *p_config, *d_config, *node;
    int sessions, turns, concurrency;
    size_t prompts[MAX_PROMPTS];
    int nprompts;
    int gen;          /* tokens D decodes per turn */
    int user_tokens;  /* new user tokens per turn after the first */
    int shared;       /* system prompt tokens shared by every session */
    double timeout_s; /* whole run */
    double job_timeout_s;
    bool json, quiet, require_local;
    int min_inflight;
    /* Random first prompts in [range_lo, range_hi] (range_hi 0: --prompts) */
    size_t range_lo, range_hi;
    bool soak;
    uint64_t seed;
    double abort_rate; /* fraction of sessions cancelled */
} opts_t;

/* ---- nodes ---- */

typedef struct node {
    const char *tag; /* "P" or "D" */
    const char *config;
    pid_t pid;
    pd_chan_t chan;
    bool alive;
    cJSON *hello;
    cJSON *stats; /* from drain */
    char agent[64];
    uint64_t num_blocks, pool_blocks, bytes_per_block, block_tokens;
    bool load_tail;
    char fingerprint[24];
} node_t;

static node_t g_p = {.tag = "P"}, g_d = {.tag = "D"};

static void kill_nodes(void)
{
    if (g_p.pid > 0) {
        kill(g_p.pid, SIGKILL);
    }
    if (g_d.pid > 0) {
        kill(g_d.pid, SIGKILL);
    }
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] =
        "pdx-validate: FAIL: hard deadline passed, nodes killed\n";
    kill_nodes();
    ssize_t rc = write(2, msg, sizeof(msg) - 1);
    (void)rc;
    _exit(EXIT_FAIL);
}

static int spawn(node_t *n, const opts_t *o)
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
static void node_death(node_t *n, char *buf, size_t len)
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
static cJSON *recv_one(node_t *n, double deadline, char *why, size_t len)
{
    for (;;) {
        cJSON *m = pd_chan_next(&n->chan);
        if (m != NULL) {
            return m;
        }
        if (n->chan.error || n->chan.eof) {
            char d[128];
            node_death(n, d, sizeof(d));
            snprintf(why, len, "node %s (%s) %s", n->tag, n->config, d);
            return NULL;
        }
        double left = deadline - pd_now_ms();
        if (left <= 0) {
            snprintf(why, len, "node %s (%s) did not answer in time", n->tag,
                     n->config);
            return NULL;
        }
        struct pollfd pfd = {.fd = n->chan.fd, .events = POLLIN};
        if (pd_chan_pending(&n->chan)) {
            pfd.events |= POLLOUT;
        }
        int rc = poll(&pfd, 1, left > 100 ? 100 : (int)left + 1);
        if (rc > 0 && (pfd.revents & POLLOUT)) {
            pd_chan_flush(&n->chan);
        }
        if (rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
            pd_chan_fill(&n->chan);
        }
    }
}

static void send_to(node_t *n, cJSON *msg)
{
    if (pd_chan_send(&n->chan, msg) != 0 && n->chan.error != EAGAIN) {
        n->chan.eof = 1; /* reported as a dead node by the loop */
    }
    cJSON_Delete(msg);
}

static void quit_nodes(double deadline)
{
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        if (ns[i]->pid > 0 && ns[i]->alive) {
            cJSON *q = cJSON_CreateObject();
            cJSON_AddStringToObject(q, "op", "quit");
            send_to(ns[i], q);
            while (pd_chan_pending(&ns[i]->chan) && pd_now_ms() < deadline) {
                struct pollfd pfd = {.fd = ns[i]->chan.fd, .events = POLLOUT};
                poll(&pfd, 1, 10);
                if (pd_chan_flush(&ns[i]->chan) != 0) {
                    break;
                }
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        while (ns[i]->pid > 0) {
            int status;
            pid_t r = waitpid(ns[i]->pid, &status, WNOHANG);
            if (r == ns[i]->pid || r < 0) {
                ns[i]->pid = -1;
                break;
            }
            if (pd_now_ms() > deadline) {
                kill(ns[i]->pid, SIGKILL);
                waitpid(ns[i]->pid, &status, 0);
                ns[i]->pid = -1;
                break;
            }
            usleep(10000);
        }
    }
}

/* ---- sessions ---- */

typedef struct turn_rec {
    bool p_done, d_done, p_ok, d_ok;
    char p_err[1600], d_err[1600];
    size_t prompt;
    /* P */
    char p_source[16];
    size_t p_loaded, p_recomputed, p_match_blocks;
    bool p_tail_hit, p_load_failed;
    uint64_t p_bytes, p_verified_blocks, p_diff, p_saved;
    size_t p_nfull;
    bool p_has_tail;
    uint32_t p_tail_tokens;
    double p_ms, p_ms_lookup, p_ms_wait;
    /* D */
    char d_source[16];
    size_t d_loaded, d_recomputed, d_match_blocks, d_generated;
    bool d_tail_hit, d_load_failed;
    uint64_t d_bytes, d_verified_blocks, d_diff, d_saved;
    size_t d_nfull;     /* full blocks of D's history, saved and handed off */
    size_t d_handoff_n; /* hashes in D's handoff */
    double d_ms;
    double t0, ms;              /* driver-side wall time of the turn */
    cJSON *p_phases, *d_phases; /* nodes' per-phase times (ms) */
    /* A cancelled phase: what the node did ("load", "reject",
     * "after_load"), or "" */
    char p_aborted[16], d_aborted[16];
    double abort_ms; /* pdx_kv_load_abort -> load_check's final state */
} turn_rec_t;

/* Where a soak session is cancelled. */
typedef enum abort_plan {
    PLAN_NONE = 0,
    PLAN_D_LOAD,   /* D aborts its load of P's handoff in flight */
    PLAN_D_REJECT, /* D rejects P's handoff before reading it */
    PLAN_P_LOAD,   /* P (turn >= 2) aborts its load of D's handoff */
    PLAN_P_REJECT, /* P (turn >= 2) rejects D's handoff before reading */
} abort_plan_t;

static const char *plan_name(abort_plan_t k)
{
    static const char *const names[] = {"none", "d_load", "d_reject", "p_load",
                                        "p_reject"};
    return names[k];
}

/* What a node reported for a cancelled phase, by side: the abort kinds of
 * glm52-pd-node. */
enum { DONE_LOAD = 0, DONE_REJECT = 1, DONE_AFTER = 2, DONE_KINDS = 3 };
static const char *const g_done_names[DONE_KINDS] = {"load", "reject",
                                                     "after_load"};

static int done_kind(const char *name)
{
    for (int k = 0; k < DONE_KINDS; k++) {
        if (strcmp(name, g_done_names[k]) == 0) {
            return k;
        }
    }
    return -1;
}

typedef enum sess_state {
    S_WAITING,
    S_P,      /* prefill request out */
    S_D,      /* decode request out */
    S_REJECT, /* final handoff being rejected */
    S_DONE,
} sess_state_t;

typedef struct session {
    int id;
    size_t len0; /* first prompt */
    sess_state_t state;
    int turn; /* 1-based, current */
    uint64_t *hist;
    size_t n, cap;
    size_t prompt_n; /* the current turn's prompt: hist[0..prompt_n) */
    bool ended;      /* a phase failed: no further turns */
    char *params_p, *params_d; /* latest handoffs */
    size_t footprint;          /* blocks at its largest turn */
    turn_rec_t *recs;
    abort_plan_t plan; /* soak: where it is cancelled */
    int plan_turn;
    int plan_polls; /* load checks still in progress before aborting */
    bool aborted;   /* a node reported the cancellation */
    bool d_open;    /* D's last handoff is not settled by P yet */
} session_t;

typedef struct check_log {
    int passed, failed;
    cJSON *failures; /* array of strings */
} check_log_t;

static void check(check_log_t *c, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void check(check_log_t *c, bool ok, const char *fmt, ...)
{
    if (ok) {
        c->passed++;
        return;
    }
    c->failed++;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (cJSON_GetArraySize(c->failures) < 200) {
        cJSON_AddItemToArray(c->failures, cJSON_CreateString(buf));
    }
}

static int hist_reserve(session_t *s, size_t n)
{
    if (n <= s->cap) {
        return 0;
    }
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < n) {
        cap *= 2;
    }
    uint64_t *p = realloc(s->hist, cap * sizeof(*p));
    if (p == NULL) {
        return -1;
    }
    s->hist = p;
    s->cap = cap;
    return 0;
}

static cJSON *tokens_json(const uint64_t *t, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t[i]));
    }
    return a;
}

static void send_job(node_t *n, const char *op, session_t *s,
                     const char *params, int gen)
{
    char req[64];
    snprintf(req, sizeof(req), "s%d.t%d.%s", s->id, s->turn,
             n == &g_p ? "p" : "d");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", op);
    cJSON_AddNumberToObject(m, "sid", s->id);
    cJSON_AddNumberToObject(m, "turn", s->turn);
    cJSON_AddStringToObject(m, "req", req);
    cJSON_AddItemToObject(m, "tokens", tokens_json(s->hist, s->prompt_n));
    if (params != NULL) {
        cJSON_AddStringToObject(m, "params", params);
    }
    if (gen > 0) {
        cJSON_AddNumberToObject(m, "gen", gen);
    }
    bool on_p = s->plan == PLAN_P_LOAD || s->plan == PLAN_P_REJECT;
    if (s->plan != PLAN_NONE && s->plan_turn == s->turn &&
        on_p == (n == &g_p)) {
        bool load = s->plan == PLAN_D_LOAD || s->plan == PLAN_P_LOAD;
        cJSON_AddStringToObject(m, "abort", load ? "load" : "reject");
        cJSON_AddNumberToObject(m, "abort_polls", s->plan_polls);
    }
    send_to(n, m);
}

/* Build turn `s->turn`'s prompt into hist and send it to P. */
static int start_turn(session_t *s, const opts_t *o)
{
    size_t want;
    if (s->turn == 1) {
        want = s->len0;
        if (hist_reserve(s, want) != 0) {
            return -1;
        }
        for (size_t i = 0; i < want; i++) {
            /* A system prompt shared by every session, then its own text. */
            s->hist[i] = i < (size_t)o->shared
                             ? pd_user_token(0x5157ull, i)
                             : pd_user_token(((uint64_t)s->id << 8) | 1, i);
        }
    } else {
        want = s->n + (size_t)o->user_tokens;
        if (hist_reserve(s, want) != 0) {
            return -1;
        }
        for (size_t i = s->n; i < want; i++) {
            s->hist[i] =
                pd_user_token(((uint64_t)s->id << 8) | (uint64_t)s->turn, i);
        }
    }
    s->n = s->prompt_n = want;
    turn_rec_t *r = &s->recs[s->turn - 1];
    r->prompt = want;
    r->t0 = pd_now_ms();
    send_job(&g_p, "prefill", s, s->turn > 1 ? s->params_d : NULL, 0);
    s->state = S_P;
    return 0;
}

static size_t jnum(const cJSON *m, const char *k)
{
    double v = pd_json_num(m, k, 0);
    return v > 0 ? (size_t)v : 0;
}

static bool jbool(const cJSON *m, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, k));
}

static void copy_err(char *dst, size_t len, const cJSON *m)
{
    const char *e = pd_json_str(m, "error");
    snprintf(dst, len, "%s", e ? e : "(no error text)");
}

static size_t handoff_hashes(const char *params)
{
    cJSON *p = params ? cJSON_Parse(params) : NULL;
    size_t n = (size_t)cJSON_GetArraySize(
        cJSON_GetObjectItemCaseSensitive(p, "hashes"));
    cJSON_Delete(p);
    return n;
}

/* Checks of one finished turn. */
static void check_turn(check_log_t *c, const session_t *s, int turn, uint32_t B,
                       bool load_tail)
{
    const turn_rec_t *r = &s->recs[turn - 1];
    if (r->p_aborted[0] != '\0') {
        /* Cancelled on P: whatever it loaded first must still be exact. */
        check(c, r->p_diff == 0,
              "session %d turn %d: %llu bytes of the blocks P loaded before "
              "it was cancelled (%s) differ from recomputation",
              s->id, turn, (unsigned long long)r->p_diff, r->p_aborted);
        check(c, !r->p_load_failed,
              "session %d turn %d: P's load failed before it was cancelled",
              s->id, turn);
        return;
    }
    check(c, r->p_ok, "session %d turn %d: prefill on P failed: %s", s->id,
          turn, r->p_err);
    check(c, r->d_ok, "session %d turn %d: decode on D failed: %s", s->id, turn,
          r->d_err);
    if (!r->p_ok || !r->d_ok) {
        return;
    }
    check(c, r->p_diff == 0,
          "session %d turn %d: %llu bytes of the blocks P loaded differ from "
          "recomputation",
          s->id, turn, (unsigned long long)r->p_diff);
    check(c, r->d_diff == 0,
          "session %d turn %d: %llu bytes of the blocks D loaded differ from "
          "recomputation",
          s->id, turn, (unsigned long long)r->d_diff);
    check(c, !r->p_load_failed && !r->d_load_failed,
          "session %d turn %d: a load failed and was recomputed", s->id, turn);
    /* D must take everything P handed off (unless it was cancelled):
     * every full block, and the partial tail where load_tail is on, up to
     * prompt - 1 tokens. */
    if (r->d_aborted[0] == '\0') {
        size_t want = r->p_nfull * B +
                      (load_tail && r->p_has_tail ? r->p_tail_tokens : 0);
        if (want > r->prompt - 1) {
            want = r->prompt - 1;
        }
        check(
            c, strcmp(r->d_source, "remote") == 0 && r->d_loaded >= want,
            "session %d turn %d: D loaded %zu tokens from %s, P handed off %zu "
            "(%zu full blocks%s)",
            s->id, turn, r->d_loaded, r->d_source, want, r->p_nfull,
            load_tail && r->p_has_tail ? " + tail" : "");
        if (load_tail && r->p_has_tail) {
            check(c, r->d_tail_hit,
                  "session %d turn %d: P's partial tail (%u tokens) was not "
                  "loaded by D although load_tail is on",
                  s->id, turn, r->p_tail_tokens);
        }
    }
    if (turn >= 2) {
        /* D-to-P reuse: every full block D held after the previous turn. */
        const turn_rec_t *prev = &s->recs[turn - 2];
        size_t held = prev->d_nfull * B;
        if (held > r->prompt - 1) {
            held = r->prompt - 1;
        }
        check(c, strcmp(r->p_source, "remote") == 0 && r->p_loaded >= held,
              "session %d turn %d: P reused %zu tokens from %s, D held %zu "
              "full blocks (%zu tokens)",
              s->id, turn, r->p_loaded, r->p_source, prev->d_nfull, held);
        check(c, prev->d_handoff_n >= prev->d_nfull,
              "session %d turn %d: D handed off %zu of its %zu full blocks "
              "from its pool",
              s->id, turn - 1, prev->d_handoff_n, prev->d_nfull);
    }
}

/* ---- report ---- */

typedef struct agg {
    int sessions, n; /* sessions, turn records */
    uint64_t prompt, from_d, local, recomputed, tail_hits, to_d, bytes,
        verified, diff, generated, p_tail_hits;
    double ms_sum, ms_max, lookup_ms_max;
} agg_t;

static void agg_add(agg_t *a, const turn_rec_t *r)
{
    if (!r->p_done) {
        return;
    }
    a->sessions++;
    a->n++;
    a->prompt += r->prompt;
    if (strcmp(r->p_source, "remote") == 0) {
        a->from_d += r->p_loaded;
    } else if (strcmp(r->p_source, "offload") == 0) {
        a->local += r->p_loaded;
    }
    a->recomputed += r->p_recomputed;
    a->tail_hits += (r->d_tail_hit ? 1 : 0) + (r->p_tail_hit ? 1 : 0);
    a->p_tail_hits += r->p_tail_hit ? 1 : 0;
    a->to_d += r->d_loaded;
    a->bytes += r->p_bytes + r->d_bytes;
    a->verified += r->p_verified_blocks + r->d_verified_blocks;
    a->diff += r->p_diff + r->d_diff;
    a->generated += r->d_generated;
    a->ms_sum += r->ms;
    if (r->ms > a->ms_max) {
        a->ms_max = r->ms;
    }
    if (r->p_ms_lookup > a->lookup_ms_max) {
        a->lookup_ms_max = r->p_ms_lookup;
    }
}

static cJSON *agg_json(const agg_t *a)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "sessions", a->sessions);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)a->prompt);
    cJSON_AddNumberToObject(j, "reused_from_d", (double)a->from_d);
    cJSON_AddNumberToObject(j, "reused_local_tier", (double)a->local);
    cJSON_AddNumberToObject(j, "recomputed", (double)a->recomputed);
    cJSON_AddNumberToObject(j, "tail_hits", (double)a->tail_hits);
    cJSON_AddNumberToObject(j, "handoff_tokens_to_d", (double)a->to_d);
    cJSON_AddNumberToObject(j, "generated", (double)a->generated);
    cJSON_AddNumberToObject(j, "bytes_moved", (double)a->bytes);
    cJSON_AddNumberToObject(j, "verified_blocks", (double)a->verified);
    cJSON_AddNumberToObject(j, "diff_bytes", (double)a->diff);
    cJSON_AddNumberToObject(j, "ms_avg", a->n ? a->ms_sum / a->n : 0);
    cJSON_AddNumberToObject(j, "ms_max", a->ms_max);
    return j;
}

static void print_row(const char *label, const agg_t *a)
{
    printf("%-6s %8d %10llu %9llu %7llu %10llu %5llu %10llu %9.1f %9llu "
           "%7llu %8.0f %8.0f\n",
           label, a->sessions, (unsigned long long)a->prompt,
           (unsigned long long)a->from_d, (unsigned long long)a->local,
           (unsigned long long)a->recomputed, (unsigned long long)a->tail_hits,
           (unsigned long long)a->to_d, (double)a->bytes / (1u << 20),
           (unsigned long long)a->verified, (unsigned long long)a->diff,
           a->n ? a->ms_sum / a->n : 0, a->ms_max);
}

static cJSON *turn_json(const turn_rec_t *r, int turn)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "turn", turn);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->prompt);
    cJSON_AddBoolToObject(j, "ok", r->p_ok && r->d_ok);
    cJSON *p = cJSON_AddObjectToObject(j, "prefill");
    cJSON_AddStringToObject(p, "source", r->p_source);
    cJSON_AddNumberToObject(p, "reused_tokens", (double)r->p_loaded);
    cJSON_AddNumberToObject(p, "match_blocks", (double)r->p_match_blocks);
    cJSON_AddNumberToObject(p, "recomputed", (double)r->p_recomputed);
    cJSON_AddBoolToObject(p, "tail_hit", r->p_tail_hit);
    if (r->p_aborted[0] != '\0') {
        cJSON_AddStringToObject(p, "cancelled", r->p_aborted);
        cJSON_AddNumberToObject(p, "abort_to_final_ms", r->abort_ms);
    }
    cJSON_AddNumberToObject(p, "bytes_loaded", (double)r->p_bytes);
    cJSON_AddNumberToObject(p, "verified_blocks", (double)r->p_verified_blocks);
    cJSON_AddNumberToObject(p, "diff_bytes", (double)r->p_diff);
    cJSON_AddNumberToObject(p, "saved_bytes", (double)r->p_saved);
    cJSON_AddNumberToObject(p, "ms", r->p_ms);
    cJSON_AddNumberToObject(p, "lookup_ms", r->p_ms_lookup);
    cJSON_AddNumberToObject(p, "wait_blocks_ms", r->p_ms_wait);
    if (r->p_phases) {
        cJSON_AddItemToObject(p, "phases_ms", cJSON_Duplicate(r->p_phases, 1));
    }
    if (!r->p_ok && r->p_done) {
        cJSON_AddStringToObject(p, "error", r->p_err);
    }
    cJSON *d = cJSON_AddObjectToObject(j, "decode");
    cJSON_AddStringToObject(d, "source", r->d_source);
    cJSON_AddNumberToObject(d, "loaded_tokens", (double)r->d_loaded);
    cJSON_AddNumberToObject(d, "match_blocks", (double)r->d_match_blocks);
    cJSON_AddNumberToObject(d, "recomputed", (double)r->d_recomputed);
    cJSON_AddBoolToObject(d, "tail_hit", r->d_tail_hit);
    if (r->d_aborted[0] != '\0') {
        cJSON_AddStringToObject(d, "cancelled", r->d_aborted);
        cJSON_AddNumberToObject(d, "abort_to_final_ms", r->abort_ms);
    }
    cJSON_AddNumberToObject(d, "generated", (double)r->d_generated);
    cJSON_AddNumberToObject(d, "bytes_loaded", (double)r->d_bytes);
    cJSON_AddNumberToObject(d, "verified_blocks", (double)r->d_verified_blocks);
    cJSON_AddNumberToObject(d, "diff_bytes", (double)r->d_diff);
    cJSON_AddNumberToObject(d, "saved_bytes", (double)r->d_saved);
    cJSON_AddNumberToObject(d, "full_blocks_held", (double)r->d_nfull);
    cJSON_AddNumberToObject(d, "handoff_blocks", (double)r->d_handoff_n);
    cJSON_AddNumberToObject(d, "ms", r->d_ms);
    if (r->d_phases) {
        cJSON_AddItemToObject(d, "phases_ms", cJSON_Duplicate(r->d_phases, 1));
    }
    if (!r->d_ok && r->d_done) {
        cJSON_AddStringToObject(d, "error", r->d_err);
    }
    cJSON_AddNumberToObject(j, "ms", r->ms);
    return j;
}

/* ---- progress bar ---- */

static bool g_bar;

static void bar(int done, int total, int inflight, double t0)
{
    if (!g_bar) {
        return;
    }
    int w = 30, fill = total ? done * w / total : w;
    char b[64];
    for (int i = 0; i < w; i++) {
        b[i] = i < fill ? '#' : '.';
    }
    b[w] = '\0';
    fprintf(stderr, "\r[%s] %d/%d phases, %d in flight, %.1f s ", b, done,
            total, inflight, (pd_now_ms() - t0) / 1e3);
    fflush(stderr);
}

static void bar_end(void)
{
    if (g_bar) {
        fprintf(stderr, "\r%-72s\r", "");
        fflush(stderr);
    }
}

/* Loads aborted in flight: time from pdx_kv_load_abort to the final state
 * pdx_kv_load_check reported (the node's ms.abort_to_final), the abort
 * call itself, and how many had completed before the abort took. */
typedef struct abort_times {
    uint64_t n, completed;
    double final_max, final_sum, call_max;
} abort_times_t;

/* A node reported a phase of `s` cancelled (`side` 0: P, 1: D): count it
 * by what the node did, and check it is the one the plan asked for. */
static void note_abort(check_log_t *c, session_t *s, int side, const cJSON *m,
                       uint64_t aborts[2][DONE_KINDS], abort_times_t *at)
{
    const char *what = pd_json_str(m, "aborted");
    int k = done_kind(what);
    bool on_p = s->plan == PLAN_P_LOAD || s->plan == PLAN_P_REJECT;
    check(c,
          k >= 0 && s->plan != PLAN_NONE && s->plan_turn == s->turn &&
              on_p == (side == 0),
          "session %d turn %d: %s reported a cancellation (%s) the plan "
          "did not ask for (%s at turn %d)",
          s->id, s->turn, side == 0 ? "P" : "D", what, plan_name(s->plan),
          s->plan_turn);
    if (k >= 0) {
        aborts[side][k]++;
    }
    if (k == DONE_LOAD) {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(m, "ms");
        double fin = pd_json_num(ms, "abort_to_final", 0);
        double call = pd_json_num(ms, "abort_call", 0);
        const char *final = pd_json_str(m, "final");
        s->recs[s->turn - 1].abort_ms = fin;
        at->n++;
        at->final_sum += fin;
        at->final_max = fin > at->final_max ? fin : at->final_max;
        at->call_max = call > at->call_max ? call : at->call_max;
        at->completed += final != NULL && strcmp(final, "completed") == 0;
    }
    s->aborted = true;
}

/* What a soak run amounts to, for the report (JSON and text). */
typedef struct soak_in {
    const opts_t *o;
    int planned, peak;
    uint64_t completed, cancelled;
    uint64_t (*aborts)[DONE_KINDS];
    uint64_t handoffs[2];
    uint64_t loads_verified, blocks_verified, bytes, diff;
    abort_times_t at;
    int errors;
    bool pass;
} soak_in_t;

static cJSON *soak_json(const soak_in_t *in)
{
    const opts_t *o = in->o;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "result", in->pass ? "PASS" : "FAIL");
    char seed[24];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)o->seed);
    cJSON_AddStringToObject(j, "seed", seed); /* a double loses bits */
    cJSON_AddNumberToObject(j, "sessions", o->sessions);
    cJSON_AddNumberToObject(j, "turns", o->turns);
    cJSON_AddNumberToObject(j, "concurrency", o->concurrency);
    cJSON_AddNumberToObject(j, "peak_in_flight", in->peak);
    cJSON *pr = cJSON_AddArrayToObject(j, "prompt_range");
    size_t lo = o->range_lo, hi = o->range_hi;
    for (int i = 0; hi == 0 && i < o->nprompts; i++) { /* --prompts */
        lo = i == 0 || o->prompts[i] < lo ? o->prompts[i] : lo;
    }
    for (int i = 0; o->range_hi == 0 && i < o->nprompts; i++) {
        hi = o->prompts[i] > hi ? o->prompts[i] : hi;
    }
    cJSON_AddItemToArray(pr, cJSON_CreateNumber((double)lo));
    cJSON_AddItemToArray(pr, cJSON_CreateNumber((double)hi));
    cJSON_AddNumberToObject(j, "abort_rate", o->abort_rate);
    cJSON_AddNumberToObject(j, "completed", (double)in->completed);
    cJSON_AddNumberToObject(j, "cancelled", (double)in->cancelled);
    cJSON_AddNumberToObject(j, "cancel_planned", in->planned);
    cJSON *by = cJSON_AddObjectToObject(j, "cancelled_by");
    for (int side = 0; side < 2; side++) {
        cJSON *x = cJSON_AddObjectToObject(by, side ? "D" : "P");
        for (int k = 0; k < DONE_KINDS; k++) {
            cJSON_AddNumberToObject(x, g_done_names[k],
                                    (double)in->aborts[side][k]);
        }
    }
    cJSON_AddNumberToObject(j, "loads_verified", (double)in->loads_verified);
    cJSON_AddNumberToObject(j, "blocks_verified", (double)in->blocks_verified);
    cJSON_AddNumberToObject(j, "bytes_loaded", (double)in->bytes);
    cJSON_AddNumberToObject(j, "diff_bytes", (double)in->diff);
    cJSON *at = cJSON_AddObjectToObject(j, "load_aborts");
    cJSON_AddNumberToObject(at, "count", (double)in->at.n);
    cJSON_AddNumberToObject(at, "completed_first", (double)in->at.completed);
    cJSON_AddNumberToObject(at, "abort_to_final_ms_max", in->at.final_max);
    cJSON_AddNumberToObject(at, "abort_to_final_ms_mean",
                            in->at.n ? in->at.final_sum / in->at.n : 0);
    cJSON_AddNumberToObject(at, "abort_call_ms_max", in->at.call_max);
    cJSON *nj = cJSON_AddObjectToObject(j, "nodes");
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        const cJSON *st = ns[i]->stats;
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(st, "offload");
        cJSON *x = cJSON_AddObjectToObject(nj, ns[i]->tag);
        if (st == NULL) {
            continue; /* no drain: the run died or timed out */
        }
        cJSON_AddNumberToObject(x, "handoffs", (double)in->handoffs[i]);
        cJSON_AddNumberToObject(x, "freed_done", jnum(st, "freed_done"));
        cJSON_AddNumberToObject(x, "freed_reject", jnum(st, "freed_reject"));
        cJSON_AddNumberToObject(x, "freed_expired", jnum(st, "freed_expired"));
        cJSON_AddNumberToObject(x, "rejects_sent", jnum(st, "rejects_sent"));
        cJSON_AddNumberToObject(x, "free_blocks", jnum(st, "free_blocks"));
        cJSON_AddNumberToObject(x, "num_blocks", jnum(st, "num_blocks"));
        cJSON_AddNumberToObject(x, "held", jnum(st, "held"));
        cJSON_AddNumberToObject(x, "pool_leased_blocks",
                                jnum(of, "leased_blocks"));
        cJSON_AddNumberToObject(x, "canary_blocks", jnum(st, "canary_blocks"));
        cJSON_AddNumberToObject(x, "late_bytes", jnum(st, "late_bytes"));
        cJSON_AddNumberToObject(x, "abort_stuck", jnum(st, "abort_stuck"));
    }
    cJSON_AddNumberToObject(j, "errors", in->errors);
    return j;
}

static void soak_print(const cJSON *j)
{
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt_range");
    printf("soak: seed %s, %zu sessions x %zu turns, prompts %zu..%zu "
           "tokens, concurrency %zu (peak %zu), cancel rate %.2f\n",
           pd_json_str(j, "seed"), jnum(j, "sessions"), jnum(j, "turns"),
           (size_t)cJSON_GetArrayItem(pr, 0)->valuedouble,
           (size_t)cJSON_GetArrayItem(pr, 1)->valuedouble,
           jnum(j, "concurrency"), jnum(j, "peak_in_flight"),
           pd_json_num(j, "abort_rate", 0));
    printf("  sessions completed %zu, cancelled %zu (%zu planned)\n",
           jnum(j, "completed"), jnum(j, "cancelled"),
           jnum(j, "cancel_planned"));
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "cancelled_by");
    for (int side = 0; side < 2; side++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(by, side ? "D" : "P");
        printf("    on %s: %zu loads aborted in flight, %zu finished before "
               "the abort, %zu handoffs rejected unread\n",
               side ? "D" : "P", jnum(x, "load"), jnum(x, "after_load"),
               jnum(x, "reject"));
    }
    printf("  loads verified %zu (%zu blocks, %.1f MiB), %zu bytes differ\n",
           jnum(j, "loads_verified"), jnum(j, "blocks_verified"),
           pd_json_num(j, "bytes_loaded", 0) / (1u << 20),
           jnum(j, "diff_bytes"));
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(j, "load_aborts");
    printf("  loads aborted in flight %zu (%zu had completed first): abort -> "
           "final state mean %.1f ms, max %.1f ms; longest load_abort call "
           "%.2f ms\n",
           jnum(at, "count"), jnum(at, "completed_first"),
           pd_json_num(at, "abort_to_final_ms_mean", 0),
           pd_json_num(at, "abort_to_final_ms_max", 0),
           pd_json_num(at, "abort_call_ms_max", 0));
    const cJSON *nj = cJSON_GetObjectItemCaseSensitive(j, "nodes");
    const cJSON *x;
    cJSON_ArrayForEach(x, nj)
    {
        if (cJSON_GetArraySize(x) == 0) {
            printf("  %s: no drain (the run did not finish)\n", x->string);
            continue;
        }
        printf("  %s: %zu handoffs, freed %zu done + %zu reject + %zu "
               "expired; %zu/%zu blocks free, %zu held, %zu pool blocks "
               "leased; %zu aborted-load blocks canary-checked, %zu late "
               "bytes, %zu aborts with no final state\n",
               x->string, jnum(x, "handoffs"), jnum(x, "freed_done"),
               jnum(x, "freed_reject"), jnum(x, "freed_expired"),
               jnum(x, "free_blocks"), jnum(x, "num_blocks"), jnum(x, "held"),
               jnum(x, "pool_leased_blocks"), jnum(x, "canary_blocks"),
               jnum(x, "late_bytes"), jnum(x, "abort_stuck"));
    }
    printf("  errors %zu: %s\n\n", jnum(j, "errors"), pd_json_str(j, "result"));
}

/* ---- main ---- */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pdx-validate [options]\n"
        "Runs multi-turn sessions through the GLM-5.2 P/D example and checks\n"
        "reuse and every loaded byte. Exit 0 only if every check passed.\n"
        "  --p-config FILE     prefill node config (default: colocated-"
        "prefill.json)\n"
        "  --d-config FILE     decode node config (default: colocated-"
        "decode.json)\n"
        "  --node PATH         glm52-pd-node binary (default: next to this "
        "one)\n"
        "  --sessions N        sessions (default 4)\n"
        "  --turns N           turns per session (default 2)\n"
        "  --prompts L,L,...   first-turn prompt lengths, cycled over "
        "sessions\n"
        "                      (default 1200,12020: partial tails of 48 and "
        "52)\n"
        "  --decode N          tokens D decodes per turn (default 32)\n"
        "  --user-tokens N     new user tokens per later turn (default 96)\n"
        "  --shared-prefix N   system prompt tokens every session shares "
        "(default 512)\n"
        "  --concurrency N     sessions in flight at once (default 2)\n"
        "  --min-inflight N    fail unless N sessions were in flight at once\n"
        "  --require-local     fail unless P reused its own offload tier;\n"
        "                      session 0's first prefill runs alone so the\n"
        "                      shared prefix is saved before others look\n"
        "                      it up (otherwise a race: all may miss)\n"
        "  --timeout S         whole run (default 600)\n"
        "  --job-timeout S     one request on a node (default 120)\n"
        "  --json              one JSON document on stdout\n"
        "  --quiet             no progress bar\n"
        "  --prompt-range A,B  first-turn prompt lengths drawn uniformly "
        "from [A, B]\n"
        "                      (instead of --prompts)\n"
        "  --soak              soak: many sessions of random prompt lengths "
        "at\n"
        "                      concurrency >= 17, some cancelled at random "
        "points;\n"
        "                      checks parity and that every block and lease "
        "is\n"
        "                      returned. Defaults: --sessions 200 "
        "--concurrency 17\n"
        "                      --prompt-range 128,800 --decode 16 "
        "--user-tokens 64\n"
        "                      --shared-prefix 128 --abort-rate 0.15\n"
        "  --seed N            random generator seed (default: from the "
        "clock;\n"
        "                      printed, so a run can be repeated)\n"
        "  --abort-rate P      fraction of sessions cancelled, 0..1 (soak "
        "only)\n");
}

/* splitmix64: small, seedable, the same on every platform. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (n > 0; the bias is negligible for small n). */
static uint64_t rng_below(uint64_t *state, uint64_t n)
{
    return rng_next(state) % n;
}

static int parse_range(const char *arg, opts_t *o)
{
    char *end;
    unsigned long a = strtoul(arg, &end, 10);
    if (*end != ',') {
        return -1;
    }
    unsigned long b = strtoul(end + 1, &end, 10);
    if (*end != '\0' || a < 2 || b < a || b > 1000000) {
        return -1;
    }
    o->range_lo = a;
    o->range_hi = b;
    return 0;
}

/* Soak plan: round(rate * sessions) sessions, drawn at random, each
 * cancelled at a random turn where its kind applies. Kinds rotate over the
 * drawn sessions so that a handful of cancellations covers every kind, and
 * the first load abort of each side aborts before any progress check (in
 * flight for sure); later ones after 0 to 2 checks still in progress. */
static int plan_aborts(session_t *ss, const opts_t *o, uint64_t *rng)
{
    int n = (int)(o->abort_rate * o->sessions + 0.5);
    if (n == 0) {
        return 0;
    }
    int *idx = malloc((size_t)o->sessions * sizeof(*idx));
    if (idx == NULL) {
        return -1;
    }
    for (int i = 0; i < o->sessions; i++) {
        idx[i] = i;
    }
    static const abort_plan_t kinds[] = {PLAN_D_LOAD, PLAN_D_REJECT,
                                         PLAN_P_LOAD, PLAN_P_REJECT};
    int nk = o->turns >= 2 ? 4 : 2; /* P kinds need a later turn */
    for (int i = 0; i < n; i++) {
        int j = i + (int)rng_below(rng, (uint64_t)(o->sessions - i));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        session_t *s = &ss[idx[i]];
        s->plan = kinds[i % nk];
        bool on_p = s->plan == PLAN_P_LOAD || s->plan == PLAN_P_REJECT;
        s->plan_turn = on_p ? 2 + (int)rng_below(rng, (uint64_t)(o->turns - 1))
                            : 1 + (int)rng_below(rng, (uint64_t)o->turns);
        s->plan_polls = i < nk ? 0 : (int)rng_below(rng, 3);
    }
    free(idx);
    return n;
}

static int parse_prompts(const char *s, opts_t *o)
{
    o->nprompts = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long v = strtoul(t, &end, 10);
        if (*end != '\0' || v < 2 || v > 1000000 ||
            o->nprompts == MAX_PROMPTS) {
            free(copy);
            return -1;
        }
        o->prompts[o->nprompts++] = v;
    }
    free(copy);
    return o->nprompts > 0 ? 0 : -1;
}

static char g_p_cfg[PATH_MAX], g_d_cfg[PATH_MAX], g_node_bin[PATH_MAX];

/* Where the deployment configs are: $PDX_CONFIG_DIR, else an installed
 * tree's <bin>/../share/pdx/configs, else the checkout this was built
 * from. Used by multinode.c too. */
const char *pd_config_dir(void)
{
    static char dir[PATH_MAX];
    if (dir[0] != '\0') {
        return dir;
    }
    const char *env = getenv("PDX_CONFIG_DIR");
    if (env != NULL && env[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s", env);
        return dir;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            char cand[PATH_MAX];
            snprintf(cand, sizeof(cand), "%s/../share/pdx/configs", self);
            if (access(cand, R_OK) == 0) {
                snprintf(dir, sizeof(dir), "%s", cand);
                return dir;
            }
        }
    }
    snprintf(dir, sizeof(dir), "%s/configs", PDX_SOURCE_DIR);
    return dir;
}

static void default_path(char *buf, size_t len, const char *leaf)
{
    snprintf(buf, len, "%s/glm52-fp8-mtp/%s", pd_config_dir(), leaf);
}

/* The node binary next to this one (both land in <build>/bin), else the
 * path it was built at. */
static void default_node(char *buf, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            snprintf(slash + 1, sizeof(self) - (size_t)(slash + 1 - self),
                     "glm52-pd-node");
            if (access(self, X_OK) == 0) {
                snprintf(buf, len, "%s", self);
                return;
            }
        }
    }
    snprintf(buf, len, "%s", PDX_NODE_PATH);
}

static int read_hello(node_t *n, cJSON *m, char *why, size_t len)
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

static session_t *g_ss;
static int g_nss, g_nturns;

/* ---- one run, step by step: parse_args, start_nodes, plan_sessions,
 * run_loop (admission, polling, on_reply per node message), drain_nodes,
 * final_checks and the report. Its state is one run_t. */

typedef struct run {
    opts_t o;
    const char *p_cfg, *d_cfg;
    double t_start, deadline, startup_ms, wall_ms;
    uint32_t B;      /* tokens per block */
    uint64_t budget; /* admission: blocks the sessions in flight may use */
    session_t *ss;
    int planned; /* cancellations planned (soak) */
    check_log_t checks;
    /* Handoffs made (each must be freed by done or reject), rejects the
     * driver asked for, and what nodes reported as cancelled. */
    uint64_t p_handoffs, d_handoffs, rejects_to_p, rejects_to_d;
    uint64_t aborts[2][DONE_KINDS]; /* [P, D][kind] */
    uint64_t loads_verified;
    abort_times_t abort_times;
    int next, inflight, peak_inflight, finished;
    int phases_done, phases_total;
    uint64_t used;
    bool dead, timed_out;
    char dead_why[512];
    agg_t *per, tot; /* per turn, and over all */
    uint64_t completed, naborted, planned_now[2];
} run_t;

/* The options into *o_p: -1 to run, else the exit code (0 for --help). */
static int parse_args(int argc, char **argv, opts_t *o_p)
{
    /* -1: not given; the default depends on --soak. */
    opts_t o = {.sessions = -1,
                .turns = 2,
                .concurrency = -1,
                .gen = -1,
                .user_tokens = -1,
                .shared = -1,
                .abort_rate = -1,
                .timeout_s = 600,
                .job_timeout_s = 120};
    parse_prompts("1200,12020", &o);
    bool seed_set = false, prompts_set = false;
    static const struct option lo[] = {
        {"p-config", required_argument, NULL, 'P'},
        {"d-config", required_argument, NULL, 'D'},
        {"node", required_argument, NULL, 'n'},
        {"sessions", required_argument, NULL, 's'},
        {"turns", required_argument, NULL, 't'},
        {"prompts", required_argument, NULL, 'l'},
        {"decode", required_argument, NULL, 'g'},
        {"user-tokens", required_argument, NULL, 'u'},
        {"shared-prefix", required_argument, NULL, 'x'},
        {"concurrency", required_argument, NULL, 'c'},
        {"min-inflight", required_argument, NULL, 'm'},
        {"require-local", no_argument, NULL, 'L'},
        {"timeout", required_argument, NULL, 'T'},
        {"job-timeout", required_argument, NULL, 'J'},
        {"json", no_argument, NULL, 'j'},
        {"quiet", no_argument, NULL, 'q'},
        {"prompt-range", required_argument, NULL, 'R'},
        {"soak", no_argument, NULL, 'S'},
        {"seed", required_argument, NULL, 'r'},
        {"abort-rate", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'P':
            o.p_config = optarg;
            break;
        case 'D':
            o.d_config = optarg;
            break;
        case 'n':
            o.node = optarg;
            break;
        case 's':
            o.sessions = atoi(optarg);
            break;
        case 't':
            o.turns = atoi(optarg);
            break;
        case 'l':
            if (parse_prompts(optarg, &o) != 0) {
                fprintf(stderr, "pdx-validate: --prompts: comma-separated "
                                "lengths >= 2\n");
                return EXIT_SETUP;
            }
            prompts_set = true;
            break;
        case 'R':
            if (parse_range(optarg, &o) != 0) {
                fprintf(stderr, "pdx-validate: --prompt-range: A,B with "
                                "2 <= A <= B\n");
                return EXIT_SETUP;
            }
            break;
        case 'S':
            o.soak = true;
            break;
        case 'r': {
            char *end;
            o.seed = strtoull(optarg, &end, 0);
            if (*end != '\0' || optarg[0] == '\0') {
                fprintf(stderr, "pdx-validate: --seed: a number\n");
                return EXIT_SETUP;
            }
            seed_set = true;
            break;
        }
        case 'a':
            o.abort_rate = atof(optarg);
            break;
        case 'g':
            o.gen = atoi(optarg);
            break;
        case 'u':
            o.user_tokens = atoi(optarg);
            break;
        case 'x':
            o.shared = atoi(optarg);
            break;
        case 'c':
            o.concurrency = atoi(optarg);
            break;
        case 'm':
            o.min_inflight = atoi(optarg);
            break;
        case 'L':
            o.require_local = true;
            break;
        case 'T':
            o.timeout_s = atof(optarg);
            break;
        case 'J':
            o.job_timeout_s = atof(optarg);
            break;
        case 'j':
            o.json = true;
            break;
        case 'q':
            o.quiet = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_SETUP;
        }
    }
    /* Defaults: a soak is many short sessions at concurrency 17 whose
     * footprints fit the colocated configs' 254-block budget 17 times. */
    if (o.sessions < 0) {
        o.sessions = o.soak ? 200 : 4;
    }
    if (o.concurrency < 0) {
        o.concurrency = o.soak ? SOAK_MIN_CONCURRENCY : 2;
    }
    if (o.gen < 0) {
        o.gen = o.soak ? 16 : 32;
    }
    if (o.user_tokens < 0) {
        o.user_tokens = o.soak ? 64 : 96;
    }
    if (o.shared < 0) {
        o.shared = o.soak ? 128 : 512;
    }
    if (o.abort_rate < 0) {
        o.abort_rate = o.soak ? 0.15 : 0;
    }
    if (o.soak && o.range_hi == 0 && !prompts_set) {
        o.range_lo = 128;
        o.range_hi = 800;
    }
    if (!seed_set) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o.seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 32);
    }
    if (o.soak && o.concurrency < SOAK_MIN_CONCURRENCY) {
        fprintf(stderr, "pdx-validate: --soak needs --concurrency %d or more\n",
                SOAK_MIN_CONCURRENCY);
        return EXIT_SETUP;
    }
    if (o.abort_rate > 1 || (o.abort_rate > 0 && !o.soak)) {
        fprintf(stderr, "pdx-validate: --abort-rate: 0..1, with --soak\n");
        return EXIT_SETUP;
    }
    if (optind < argc || o.sessions < 1 || o.turns < 1 || o.concurrency < 1 ||
        o.gen < 0 || o.user_tokens < 1 || o.shared < 0 || o.timeout_s <= 0 ||
        o.job_timeout_s <= 0) {
        usage(stderr);
        return EXIT_SETUP;
    }
    if (o.p_config) {
        snprintf(g_p_cfg, sizeof(g_p_cfg), "%s", o.p_config);
    } else {
        default_path(g_p_cfg, sizeof(g_p_cfg), "colocated-prefill.json");
    }
    if (o.d_config) {
        snprintf(g_d_cfg, sizeof(g_d_cfg), "%s", o.d_config);
    } else {
        default_path(g_d_cfg, sizeof(g_d_cfg), "colocated-decode.json");
    }
    if (o.node) {
        snprintf(g_node_bin, sizeof(g_node_bin), "%s", o.node);
    } else {
        default_node(g_node_bin, sizeof(g_node_bin));
    }
    o.node = g_node_bin;
    g_p.config = g_p_cfg;
    g_d.config = g_d_cfg;
    g_bar = !o.quiet && isatty(2);
    *o_p = o;
    return -1;
}

/* Spawn P and D, read their hellos and connect them both ways: 0, or the
 * exit code. */
static int start_nodes(run_t *run)
{
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    /* Backstop: whatever hangs, the run ends. */
    alarm((unsigned)ceil(run->o.timeout_s) + 30);
    run->t_start = pd_now_ms();
    run->deadline = run->t_start + run->o.timeout_s * 1e3;
    char why[2048];

    if (spawn(&g_p, &run->o) != 0 || spawn(&g_d, &run->o) != 0) {
        kill_nodes();
        return EXIT_SETUP;
    }
    /* Both nodes start at once; each says hello with its blob. */
    double hello_deadline = pd_now_ms() + 120e3;
    cJSON *hp = recv_one(&g_p, hello_deadline, why, sizeof(why));
    if (hp == NULL || read_hello(&g_p, hp, why, sizeof(why)) != 0) {
        fprintf(stderr, "pdx-validate: %s\n", why);
        cJSON_Delete(hp);
        kill_nodes();
        quit_nodes(pd_now_ms() + 2000);
        return EXIT_SETUP;
    }
    cJSON *hd = recv_one(&g_d, hello_deadline, why, sizeof(why));
    if (hd == NULL || read_hello(&g_d, hd, why, sizeof(why)) != 0) {
        fprintf(stderr, "pdx-validate: %s\n", why);
        cJSON_Delete(hd);
        kill_nodes();
        quit_nodes(pd_now_ms() + 2000);
        return EXIT_SETUP;
    }

    /* Connect both ways: D reads P's arenas, P reads D's pool. */
    node_t *pair[2][2] = {{&g_p, &g_d}, {&g_d, &g_p}};
    for (int i = 0; i < 2; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "op", "connect");
        cJSON_AddStringToObject(m, "blob",
                                pd_json_str(pair[i][1]->hello, "blob"));
        send_to(pair[i][0], m);
    }
    int refused = 0;
    for (int i = 0; i < 2; i++) {
        node_t *n = pair[i][0];
        cJSON *r = recv_one(n, pd_now_ms() + 60e3, why, sizeof(why));
        if (r == NULL) {
            fprintf(stderr, "pdx-validate: connect: %s\n", why);
            refused++;
            continue;
        }
        if (!jbool(r, "ok")) {
            fprintf(stderr,
                    "pdx-validate: connect refused: %s (%s) loading "
                    "%s: %s\n",
                    n->agent, n->tag, pair[i][1]->agent,
                    pd_json_str(r, "error") ? pd_json_str(r, "error") : "?");
            refused++;
        }
        cJSON_Delete(r);
    }
    if (refused) {
        if (run->o.json) {
            printf("{\"result\":\"FAIL\",\"error\":\"connect refused\"}\n");
        }
        quit_nodes(pd_now_ms() + 5000);
        return EXIT_REFUSED;
    }

    run->startup_ms = pd_now_ms() - run->t_start;
    return 0;
}

/* The admission budget, the sessions (prompt lengths, footprints) and the
 * planned cancellations: 0, or the exit code. */
static int plan_sessions(run_t *run)
{
    run->B = (uint32_t)g_p.block_tokens;
    /* Admission: the blocks of the sessions in flight must fit P's and D's
     * arenas and D's pool (a decode's handoff leases its history there
     * until P reads it). */
    run->budget =
        g_p.num_blocks < g_d.num_blocks ? g_p.num_blocks : g_d.num_blocks;
    if (g_d.pool_blocks > 0 && g_d.pool_blocks < run->budget) {
        run->budget = g_d.pool_blocks;
    }
    run->budget = run->budget > 2 ? run->budget - 2 : run->budget;

    run->ss = calloc((size_t)run->o.sessions, sizeof(*run->ss));
    g_ss = run->ss;
    g_nss = run->o.sessions;
    g_nturns = run->o.turns;
    uint64_t rng = run->o.seed;
    for (int i = 0; i < run->o.sessions; i++) {
        session_t *s = &run->ss[i];
        s->id = i;
        s->len0 = run->o.range_hi > 0
                      ? run->o.range_lo +
                            (size_t)rng_below(&rng, run->o.range_hi -
                                                        run->o.range_lo + 1)
                      : run->o.prompts[i % run->o.nprompts];
        if ((size_t)run->o.shared > s->len0) {
            s->len0 = (size_t)run->o.shared; /* never shorter than the prefix */
        }
        s->recs = calloc((size_t)run->o.turns, sizeof(*s->recs));
        size_t last = s->len0 +
                      (size_t)(run->o.turns - 1) * run->o.user_tokens +
                      (size_t)run->o.turns * run->o.gen;
        s->footprint = (last + run->B - 1) / run->B;
        if (s->footprint > run->budget) {
            fprintf(stderr,
                    "pdx-validate: session %d needs %zu blocks (%zu tokens at "
                    "its last turn); the configs allow %llu (num_blocks %llu/"
                    "%llu, D pool %llu blocks)\n",
                    i, s->footprint, last, (unsigned long long)run->budget,
                    (unsigned long long)g_p.num_blocks,
                    (unsigned long long)g_d.num_blocks,
                    (unsigned long long)g_d.pool_blocks);
            quit_nodes(pd_now_ms() + 5000);
            return EXIT_SETUP;
        }
    }
    if (run->o.soak) {
        /* Concurrency 17 must be reachable: as many of the largest
         * sessions the range allows must fit the budget at once. */
        size_t top = run->o.range_hi > 0 ? run->o.range_hi : 0;
        for (int i = 0; run->o.range_hi == 0 && i < run->o.nprompts; i++) {
            top = run->o.prompts[i] > top ? run->o.prompts[i] : top;
        }
        top = top > (size_t)run->o.shared ? top : (size_t)run->o.shared;
        size_t last = top + (size_t)(run->o.turns - 1) * run->o.user_tokens +
                      (size_t)run->o.turns * run->o.gen;
        uint64_t need =
            (uint64_t)run->o.concurrency * ((last + run->B - 1) / run->B);
        if (need > run->budget) {
            fprintf(stderr,
                    "pdx-validate: --soak: %d sessions of up to %zu tokens "
                    "need %llu blocks in flight; the configs allow %llu "
                    "(lower the prompt range)\n",
                    run->o.concurrency, last, (unsigned long long)need,
                    (unsigned long long)run->budget);
            quit_nodes(pd_now_ms() + 5000);
            return EXIT_SETUP;
        }
    }
    run->planned = plan_aborts(run->ss, &run->o, &rng);
    if (run->planned < 0) {
        fprintf(stderr, "pdx-validate: out of memory\n");
        quit_nodes(pd_now_ms() + 5000);
        return EXIT_SETUP;
    }
    return 0;
}

/* A prefill reply: true when the session's turn is over (cancelled or
 * failed on P), false when it goes on to D. */
static bool on_prefill(run_t *run, session_t *s, turn_rec_t *r, const cJSON *m)
{
    bool ok = jbool(m, "ok");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(m, "ms");
    run->phases_done++;
    r->p_done = true;
    r->p_ok = ok;
    /* P settled D's handoff: read it (done), or the node
     * aborted or rejected it. */
    s->d_open = s->d_open && !ok;
    if (!ok) {
        copy_err(r->p_err, sizeof(r->p_err), m);
    } else {
        snprintf(r->p_source, sizeof(r->p_source), "%s",
                 pd_json_str(m, "source"));
        r->p_loaded = jnum(m, "loaded");
        r->p_recomputed = jnum(m, "recomputed");
        r->p_match_blocks = jnum(m, "match_blocks");
        r->p_tail_hit = jbool(m, "tail_hit");
        r->p_load_failed = jbool(m, "load_failed");
        r->p_bytes = jnum(m, "bytes_loaded");
        r->p_verified_blocks = jnum(m, "verified_blocks");
        r->p_diff = jnum(m, "diff_bytes");
        r->p_saved = jnum(m, "bytes_saved");
        r->p_nfull = jnum(m, "nfull");
        r->p_has_tail = jbool(m, "has_tail");
        r->p_tail_tokens = (uint32_t)jnum(m, "tail_tokens");
        r->p_ms = pd_json_num(ms, "total", 0);
        r->p_ms_lookup = pd_json_num(ms, "lookup", 0);
        r->p_ms_wait = pd_json_num(ms, "wait_blocks", 0);
        r->p_phases = cJSON_Duplicate(ms, 1);
        run->loads_verified += r->p_verified_blocks > 0;
        const char *ab = pd_json_str(m, "aborted");
        if (ab != NULL) {
            snprintf(r->p_aborted, sizeof(r->p_aborted), "%s", ab);
        } else {
            run->p_handoffs++;
            free(s->params_p);
            s->params_p = strdup(pd_json_str(m, "params"));
        }
    }
    if (ok && r->p_aborted[0] != '\0') {
        /* Cancelled on P: D's last handoff was settled by
         * P (load aborted, rejected or read). */
        note_abort(&run->checks, s, 0, m, run->aborts, &run->abort_times);
        run->phases_done++;
        r->d_done = r->d_ok = true;
        s->ended = true;
        return true;
    } else if (ok) {
        /* Hand off to D: the same prompt, P's params. */
        send_job(&g_d, "decode", s, s->params_p, run->o.gen);
        s->state = S_D;
    } else {
        run->phases_done++;
        r->d_done = true;
        snprintf(r->d_err, sizeof(r->d_err), "not run: prefill failed");
        s->ended = true;
        return true;
    }
    return false;
}

/* A decode reply (the turn is over either way). */
static void on_decode(run_t *run, session_t *s, turn_rec_t *r, const cJSON *m)
{
    bool ok = jbool(m, "ok");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(m, "ms");
    run->phases_done++;
    r->d_done = true;
    r->d_ok = ok;
    if (!ok) {
        copy_err(r->d_err, sizeof(r->d_err), m);
        /* D never read P's blocks: tell P to free them. */
        cJSON *rj = cJSON_CreateObject();
        cJSON_AddStringToObject(rj, "op", "reject");
        cJSON_AddNumberToObject(rj, "sid", -2);
        cJSON_AddStringToObject(rj, "params", s->params_p);
        send_to(&g_d, rj);
        run->rejects_to_p++;
        s->ended = true;
    } else {
        snprintf(r->d_source, sizeof(r->d_source), "%s",
                 pd_json_str(m, "source"));
        r->d_loaded = jnum(m, "loaded");
        r->d_recomputed = jnum(m, "recomputed");
        r->d_match_blocks = jnum(m, "match_blocks");
        r->d_tail_hit = jbool(m, "tail_hit");
        r->d_load_failed = jbool(m, "load_failed");
        r->d_bytes = jnum(m, "bytes_loaded");
        r->d_verified_blocks = jnum(m, "verified_blocks");
        r->d_diff = jnum(m, "diff_bytes");
        r->d_saved = jnum(m, "bytes_saved");
        r->d_nfull = jnum(m, "nfull");
        r->d_ms = pd_json_num(ms, "total", 0);
        r->d_phases = cJSON_Duplicate(ms, 1);
        run->loads_verified += r->d_verified_blocks > 0;
        const char *ab = pd_json_str(m, "aborted");
        if (ab != NULL) {
            /* Cancelled on D: P's handoff was settled by D
             * (load aborted, rejected or read); D made
             * none. */
            snprintf(r->d_aborted, sizeof(r->d_aborted), "%s", ab);
            note_abort(&run->checks, s, 1, m, run->aborts, &run->abort_times);
            s->ended = true;
            return;
        }
        run->d_handoffs++;
        s->d_open = true;
        free(s->params_d);
        s->params_d = strdup(pd_json_str(m, "params"));
        r->d_handoff_n = handoff_hashes(s->params_d);
        /* The history grows by what D generated. */
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(m, "generated");
        size_t ng = (size_t)cJSON_GetArraySize(g);
        r->d_generated = ng;
        hist_reserve(s, s->prompt_n + ng);
        size_t k = s->prompt_n;
        const cJSON *e;
        cJSON_ArrayForEach(e, g)
        {
            s->hist[k++] = (uint64_t)e->valuedouble;
        }
        s->n = k;
        /* The stand-in's sampler is deterministic: check
         * what D generated. */
        uint64_t h = PD_PREFIX_ROOT;
        for (size_t i2 = 0; i2 < s->prompt_n; i2++) {
            h = pd_prefix_step(h, s->hist[i2]);
        }
        size_t bad = 0;
        for (size_t i2 = s->prompt_n; i2 < s->n; i2++) {
            bad += s->hist[i2] != pd_next_token(h);
            h = pd_prefix_step(h, s->hist[i2]);
        }
        check(&run->checks, bad == 0 && ng == (size_t)run->o.gen,
              "session %d turn %d: D generated %zu tokens, "
              "%zu not what the stand-in samples",
              s->id, s->turn, ng, bad);
    }
}

/* A turn is over: check it, then the next turn, the reject of D's last
 * handoff, or the session is done. */
static void end_turn(run_t *run, session_t *s, turn_rec_t *r)
{
    r->ms = pd_now_ms() - r->t0;
    if (s->ended) {
        run->phases_done += 2 * (run->o.turns - s->turn);
    }
    check_turn(&run->checks, s, s->turn, run->B, g_d.load_tail && r->p_ok);
    if (!s->ended && s->turn < run->o.turns) {
        s->turn++;
        start_turn(s, &run->o);
    } else if (s->d_open) {
        /* Nobody will read D's last handoff: P rejects it
         * so D's pool lease goes now, not at expiry. */
        cJSON *rj = cJSON_CreateObject();
        cJSON_AddStringToObject(rj, "op", "reject");
        cJSON_AddNumberToObject(rj, "sid", s->id);
        cJSON_AddStringToObject(rj, "params", s->params_d);
        send_to(&g_p, rj);
        run->rejects_to_d++;
        s->d_open = false;
        s->state = S_REJECT;
    } else {
        s->state = S_DONE;
        run->finished++;
        run->inflight--;
        run->used -= s->footprint;
    }
}

/* One message from node n (consumed). */
static void on_reply(run_t *run, node_t *n, cJSON *m)
{
    const char *op = pd_json_str(m, "op");
    int sid = (int)pd_json_num(m, "sid", -1);
    session_t *s = sid >= 0 && sid < run->o.sessions ? &run->ss[sid] : NULL;
    if (op != NULL && strcmp(op, "reject") == 0 && sid == -2) {
        /* D's reject of a handoff it could not take: the
         * session already failed; nothing more to check. */
        cJSON_Delete(m);
        return;
    }
    if (op == NULL || s == NULL) {
        check(&run->checks, false, "node %s: unexpected message %s: %s", n->tag,
              op ? op : "?",
              pd_json_str(m, "error") ? pd_json_str(m, "error") : "");
        cJSON_Delete(m);
        return;
    }
    turn_rec_t *r = &s->recs[s->turn - 1];
    bool ok = jbool(m, "ok");
    if (strcmp(op, "prefill") == 0 && s->state == S_P) {
        if (on_prefill(run, s, r, m)) {
            end_turn(run, s, r);
        }
    } else if (strcmp(op, "decode") == 0 && s->state == S_D) {
        on_decode(run, s, r, m);
        end_turn(run, s, r);
    } else if (strcmp(op, "reject") == 0 && s->state == S_REJECT) {
        check(&run->checks, ok,
              "session %d: reject of D's last "
              "handoff failed: %s",
              s->id, pd_json_str(m, "error") ? pd_json_str(m, "error") : "?");
        s->state = S_DONE;
        run->finished++;
        run->inflight--;
        run->used -= s->footprint;
    } else {
        check(&run->checks, false,
              "node %s: unexpected %s reply for session %d in "
              "state %d: %s",
              n->tag, op, sid, (int)s->state,
              pd_json_str(m, "error") ? pd_json_str(m, "error") : "");
    }
    cJSON_Delete(m);
}

/* Admit sessions while they fit and handle the nodes' replies until every
 * session finished, a node died or the run timed out: 0, or the exit code
 * (out of memory). */
static int run_loop(run_t *run)
{
    while (run->finished < run->o.sessions && !run->dead) {
        /* Admit sessions in order while they fit. */
        /* With --require-local, the others wait for session 0's first
         * prefill: it saves the shared prefix to P's offload tier, so the
         * later lookups find it there (started at once, every session
         * could look up before any save and all miss: a race). Session 0
         * stays in flight (decode, turn 2), so the peak is unchanged. */
        while (run->next < run->o.sessions &&
               run->inflight < run->o.concurrency &&
               run->used + run->ss[run->next].footprint <= run->budget &&
               !(run->o.require_local && run->o.shared > 0 && run->next == 1 &&
                 !run->ss[0].recs[0].p_done)) {
            session_t *s = &run->ss[run->next++];
            s->turn = 1;
            if (start_turn(s, &run->o) != 0) {
                fprintf(stderr, "pdx-validate: out of memory\n");
                kill_nodes();
                return EXIT_SETUP;
            }
            run->used += s->footprint;
            run->inflight++;
            if (run->inflight > run->peak_inflight) {
                run->peak_inflight = run->inflight;
            }
        }
        bar(run->phases_done, run->phases_total, run->inflight, run->t_start);
        if (pd_now_ms() > run->deadline) {
            run->timed_out = true;
            break;
        }
        struct pollfd pfd[2];
        node_t *ns[2] = {&g_p, &g_d};
        for (int i = 0; i < 2; i++) {
            pfd[i] = (struct pollfd){.fd = ns[i]->chan.fd, .events = POLLIN};
            if (pd_chan_pending(&ns[i]->chan)) {
                pfd[i].events |= POLLOUT;
            }
        }
        int prc = poll(pfd, 2, 200);
        if (prc < 0 && errno != EINTR) {
            snprintf(run->dead_why, sizeof(run->dead_why), "poll: %s",
                     strerror(errno));
            run->dead = true;
            break;
        }
        for (int i = 0; i < 2 && !run->dead; i++) {
            node_t *n = ns[i];
            if (prc > 0 && (pfd[i].revents & POLLOUT)) {
                pd_chan_flush(&n->chan);
            }
            if (prc > 0 && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                pd_chan_fill(&n->chan);
            }
            cJSON *m;
            while ((m = pd_chan_next(&n->chan)) != NULL) {
                on_reply(run, n, m);
            }
            if (n->chan.error || n->chan.eof) {
                char d[128];
                node_death(n, d, sizeof(d));
                snprintf(run->dead_why, sizeof(run->dead_why),
                         "node %s (%s, %s) %s with %d sessions unfinished",
                         n->tag, n->agent, n->config, d,
                         run->o.sessions - run->finished);
                run->dead = true;
            }
        }
    }
    bar(run->phases_done, run->phases_total, run->inflight, run->t_start);
    bar_end();
    run->wall_ms = pd_now_ms() - run->t_start;

    if (run->timed_out) {
        snprintf(run->dead_why, sizeof(run->dead_why),
                 "timed out after %.0f s with %d of %d sessions unfinished",
                 run->o.timeout_s, run->o.sessions - run->finished,
                 run->o.sessions);
    }
    check(&run->checks, !run->dead && !run->timed_out, "%s", run->dead_why);
    return 0;
}

/* Every held block freed (D's reads done, last handoffs rejected), no lease
 * expired, nothing left running; then the nodes quit. */
static void drain_nodes(run_t *run)
{
    char why[2048];
    /* Drain: every held block freed (D's reads done, last handoffs
     * rejected), no lease expired, nothing left running. */
    if (!run->dead && !run->timed_out) {
        node_t *ns[2] = {&g_p, &g_d};
        for (int i = 0; i < 2; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "op", "drain");
            cJSON_AddNumberToObject(m, "timeout_ms", 15000);
            send_to(ns[i], m);
        }
        for (int i = 0; i < 2; i++) {
            cJSON *r = recv_one(ns[i], pd_now_ms() + 30e3, why, sizeof(why));
            if (r == NULL) {
                check(&run->checks, false, "drain: %s", why);
                continue;
            }
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "stats");
            check(&run->checks, jbool(r, "ok"),
                  "node %s: %llu requests still held after the run", ns[i]->tag,
                  (unsigned long long)jnum(st, "held"));
            check(&run->checks, jnum(st, "freed_expired") == 0,
                  "node %s: %zu handoff leases expired (the peer never read "
                  "them)",
                  ns[i]->tag, jnum(st, "freed_expired"));
            check(&run->checks, jnum(st, "free_blocks") == ns[i]->num_blocks,
                  "node %s: %zu of %llu blocks free after the run", ns[i]->tag,
                  jnum(st, "free_blocks"),
                  (unsigned long long)ns[i]->num_blocks);
            const cJSON *of = cJSON_GetObjectItemCaseSensitive(st, "offload");
            check(&run->checks, jnum(of, "leased_blocks") == 0,
                  "node %s: %zu offload pool blocks still leased after the run",
                  ns[i]->tag, jnum(of, "leased_blocks"));
            /* Every handoff a node made was freed by its peer's done or
             * reject, exactly once. */
            uint64_t made = i == 0 ? run->p_handoffs : run->d_handoffs;
            uint64_t freed = jnum(st, "freed_done") + jnum(st, "freed_reject");
            check(&run->checks, freed == made,
                  "node %s: %llu handoffs made, %llu freed by done or reject",
                  ns[i]->tag, (unsigned long long)made,
                  (unsigned long long)freed);
            check(&run->checks, jnum(st, "late_bytes") == 0,
                  "node %s: %zu bytes landed in %zu blocks after their "
                  "aborted load reported its final state",
                  ns[i]->tag, jnum(st, "late_bytes"),
                  jnum(st, "canary_blocks"));
            check(&run->checks, jnum(st, "abort_stuck") == 0,
                  "node %s: %zu aborted loads reported no final state "
                  "within the node's abort deadline",
                  ns[i]->tag, jnum(st, "abort_stuck"));
            ns[i]->stats = cJSON_Duplicate(st, 1);
            cJSON_Delete(r);
        }
    }
    quit_nodes(pd_now_ms() + 15000);
}

/* The aggregates per turn and over the run, and the checks on them. */
static void final_checks(run_t *run)
{
    run->per = calloc((size_t)run->o.turns, sizeof(*run->per));
    for (int i = 0; i < run->o.sessions; i++) {
        for (int t = 0; t < run->o.turns; t++) {
            agg_add(&run->per[t], &run->ss[i].recs[t]);
            agg_add(&run->tot, &run->ss[i].recs[t]);
        }
    }
    run->tot.sessions = 0;
    for (int i = 0; i < run->o.sessions; i++) {
        run->tot.sessions += run->ss[i].recs[0].p_done;
    }
    if (run->o.require_local) {
        check(&run->checks, run->tot.local > 0,
              "P never reused its own offload tier (shared prefix %d tokens)",
              run->o.shared);
    }
    if (run->o.min_inflight > 0) {
        check(&run->checks, run->peak_inflight >= run->o.min_inflight,
              "at most %d sessions were in flight, wanted %d (admission "
              "budget %llu blocks)",
              run->peak_inflight, run->o.min_inflight,
              (unsigned long long)run->budget);
    }
    /* Reuse must have happened where it must: checked per turn above; an
     * empty run proves nothing. */
    check(&run->checks, run->o.turns < 2 || run->tot.from_d > 0,
          "no token was reused from D in any later turn");
    for (int i = 0; i < run->o.sessions; i++) {
        bool all_ok = run->ss[i].turn == run->o.turns;
        for (int t = 0; t < run->o.turns; t++) {
            all_ok &= run->ss[i].recs[t].p_ok && run->ss[i].recs[t].d_ok;
        }
        run->completed += !run->ss[i].aborted && all_ok;
        run->naborted += run->ss[i].aborted;
        if ((run->ss[i].plan == PLAN_D_LOAD ||
             run->ss[i].plan == PLAN_P_LOAD) &&
            run->ss[i].plan_polls == 0) {
            run->planned_now[run->ss[i].plan == PLAN_D_LOAD]++;
        }
    }
    if (run->o.soak && !run->dead && !run->timed_out) {
        check(&run->checks, run->naborted == (uint64_t)run->planned,
              "%llu sessions were cancelled, %d planned",
              (unsigned long long)run->naborted, run->planned);
        int want = run->o.concurrency < run->o.sessions ? run->o.concurrency
                                                        : run->o.sessions;
        check(&run->checks, run->peak_inflight >= want,
              "at most %d sessions were in flight, the soak wants %d",
              run->peak_inflight, want);
        /* A load aborted before its first progress check is in flight for
         * sure: each must be reported as such, not as finished first. */
        for (int side = 0; side < 2; side++) {
            check(&run->checks,
                  run->aborts[side][DONE_LOAD] >= run->planned_now[side],
                  "%s: %llu loads aborted in flight, %llu planned before "
                  "any progress check",
                  side ? "D" : "P",
                  (unsigned long long)run->aborts[side][DONE_LOAD],
                  (unsigned long long)run->planned_now[side]);
        }
        /* Handoffs rejected unread must be freed by the reject, not by a
         * done nor (checked above) by lease expiry. */
        if (g_p.stats != NULL && g_d.stats != NULL) {
            uint64_t to_p = jnum(g_d.stats, "rejects_sent") + run->rejects_to_p;
            uint64_t to_d = jnum(g_p.stats, "rejects_sent") + run->rejects_to_d;
            check(&run->checks, jnum(g_p.stats, "freed_reject") >= to_p,
                  "node P: %zu handoffs freed by reject, %llu were rejected "
                  "unread",
                  jnum(g_p.stats, "freed_reject"), (unsigned long long)to_p);
            check(&run->checks, jnum(g_d.stats, "freed_reject") >= to_d,
                  "node D: %zu handoffs freed by reject, %llu were rejected "
                  "unread",
                  jnum(g_d.stats, "freed_reject"), (unsigned long long)to_d);
        }
    }
}

static cJSON *soak_summary(run_t *run, bool pass)
{
    soak_in_t in = {.o = &run->o,
                    .planned = run->planned,
                    .peak = run->peak_inflight,
                    .completed = run->completed,
                    .cancelled = run->naborted,
                    .aborts = run->aborts,
                    .handoffs = {run->p_handoffs, run->d_handoffs},
                    .loads_verified = run->loads_verified,
                    .blocks_verified = run->tot.verified,
                    .bytes = run->tot.bytes,
                    .diff = run->tot.diff,
                    .at = run->abort_times,
                    .errors = run->checks.failed,
                    .pass = pass};
    return soak_json(&in);
}

static void report_json(run_t *run, bool pass, cJSON *soak)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "result", pass ? "PASS" : "FAIL");
    cJSON *cf = cJSON_AddObjectToObject(doc, "run");
    cJSON_AddStringToObject(cf, "p_config", run->p_cfg);
    cJSON_AddStringToObject(cf, "d_config", run->d_cfg);
    cJSON_AddStringToObject(cf, "p_agent", g_p.agent);
    cJSON_AddStringToObject(cf, "d_agent", g_d.agent);
    cJSON_AddStringToObject(cf, "layout_fingerprint", g_p.fingerprint);
    cJSON_AddNumberToObject(cf, "bytes_per_block", (double)g_p.bytes_per_block);
    cJSON_AddNumberToObject(cf, "block_tokens", run->B);
    cJSON_AddNumberToObject(cf, "sessions", run->o.sessions);
    cJSON_AddNumberToObject(cf, "turns", run->o.turns);
    if (run->o.range_hi > 0) {
        cJSON *pr = cJSON_AddArrayToObject(cf, "prompt_range");
        cJSON_AddItemToArray(pr, cJSON_CreateNumber((double)run->o.range_lo));
        cJSON_AddItemToArray(pr, cJSON_CreateNumber((double)run->o.range_hi));
    }
    cJSON *pl = cJSON_AddArrayToObject(cf, "prompts");
    for (int i = 0; i < run->o.nprompts; i++) {
        cJSON_AddItemToArray(pl, cJSON_CreateNumber((double)run->o.prompts[i]));
    }
    cJSON_AddNumberToObject(cf, "decode_tokens", run->o.gen);
    cJSON_AddNumberToObject(cf, "user_tokens", run->o.user_tokens);
    cJSON_AddNumberToObject(cf, "shared_prefix", run->o.shared);
    cJSON_AddNumberToObject(cf, "concurrency", run->o.concurrency);
    cJSON_AddNumberToObject(cf, "peak_in_flight", run->peak_inflight);
    cJSON_AddNumberToObject(cf, "admission_budget_blocks", (double)run->budget);
    cJSON_AddNumberToObject(cf, "wall_ms", run->wall_ms);
    cJSON_AddNumberToObject(cf, "startup_ms", run->startup_ms);
    cJSON_AddNumberToObject(cf, "max_lookup_ms", run->tot.lookup_ms_max);
    if (soak != NULL) {
        cJSON_AddItemToObject(doc, "soak", soak);
        soak = NULL;
    }
    cJSON *tj = cJSON_AddArrayToObject(doc, "turns");
    for (int t = 0; t < run->o.turns; t++) {
        cJSON *a = agg_json(&run->per[t]);
        cJSON_AddNumberToObject(a, "turn", t + 1);
        cJSON_AddItemToArray(tj, a);
    }
    cJSON_AddItemToObject(doc, "total", agg_json(&run->tot));
    cJSON *sj = cJSON_AddArrayToObject(doc, "sessions");
    for (int i = 0; i < run->o.sessions; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", i);
        cJSON_AddNumberToObject(x, "first_prompt", (double)run->ss[i].len0);
        if (run->ss[i].plan != PLAN_NONE) {
            cJSON *pj = cJSON_AddObjectToObject(x, "cancel");
            cJSON_AddStringToObject(pj, "plan", plan_name(run->ss[i].plan));
            cJSON_AddNumberToObject(pj, "turn", run->ss[i].plan_turn);
            cJSON_AddNumberToObject(pj, "after_checks", run->ss[i].plan_polls);
            cJSON_AddBoolToObject(pj, "done", run->ss[i].aborted);
        }
        cJSON *xt = cJSON_AddArrayToObject(x, "turns");
        for (int t = 0; t < run->o.turns; t++) {
            if (run->ss[i].recs[t].p_done) {
                cJSON_AddItemToArray(xt, turn_json(&run->ss[i].recs[t], t + 1));
            }
        }
        cJSON_AddItemToArray(sj, x);
    }
    cJSON *nj = cJSON_AddObjectToObject(doc, "nodes");
    cJSON_AddItemToObject(nj, "P", g_p.stats ? g_p.stats : cJSON_CreateNull());
    cJSON_AddItemToObject(nj, "D", g_d.stats ? g_d.stats : cJSON_CreateNull());
    g_p.stats = g_d.stats = NULL;
    cJSON *cj = cJSON_AddObjectToObject(doc, "checks");
    cJSON_AddNumberToObject(cj, "passed", run->checks.passed);
    cJSON_AddNumberToObject(cj, "failed", run->checks.failed);
    cJSON_AddItemToObject(cj, "failures", run->checks.failures);
    run->checks.failures = NULL;
    char *text = cJSON_Print(doc);
    puts(text);
    free(text);
    cJSON_Delete(doc);
}

static void report_text(run_t *run, bool pass, const cJSON *soak)
{
    printf("pdx-validate: GLM-5.2 P/D example\n");
    printf("  P %s (%s), D %s (%s)\n", g_p.agent, run->p_cfg, g_d.agent,
           run->d_cfg);
    printf("  layout %s, %llu B per %u-token block; P/D %llu/%llu "
           "blocks, D pool %llu blocks\n",
           g_p.fingerprint, (unsigned long long)g_p.bytes_per_block, run->B,
           (unsigned long long)g_p.num_blocks,
           (unsigned long long)g_d.num_blocks,
           (unsigned long long)g_d.pool_blocks);
    printf("  %d sessions x %d turns, prompts", run->o.sessions, run->o.turns);
    if (run->o.range_hi > 0) {
        printf(" %zu..%zu (random, seed %llu)", run->o.range_lo,
               run->o.range_hi, (unsigned long long)run->o.seed);
    }
    for (int i = 0; run->o.range_hi == 0 && i < run->o.nprompts; i++) {
        printf("%s%zu", i ? "," : " ", run->o.prompts[i]);
    }
    printf(" (shared prefix %d), decode %d, user %d tokens/turn, "
           "concurrency %d (peak %d)\n\n",
           run->o.shared, run->o.gen, run->o.user_tokens, run->o.concurrency,
           run->peak_inflight);
    printf("%-6s %8s %10s %9s %7s %10s %5s %10s %9s %9s %7s %8s %8s\n", "turn",
           "sessions", "prompt_tok", "from_D", "local", "recomputed", "tail",
           "P->D_tok", "moved_MiB", "verif_blk", "diff_B", "ms_avg", "ms_max");
    for (int t = 0; t < run->o.turns; t++) {
        char label[16];
        snprintf(label, sizeof(label), "%d", t + 1);
        print_row(label, &run->per[t]);
    }
    print_row("total", &run->tot);
    printf("\n  from_D: prompt tokens P loaded from D's offload pool "
           "(D-to-P reuse); local: from P's own offload tier;\n"
           "  tail: partial tail blocks loaded; P->D_tok: tokens D "
           "loaded from P's arenas; moved: bytes loaded on P and D\n");
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        const cJSON *st = ns[i]->stats;
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(st, "offload");
        if (st == NULL) {
            continue;
        }
        printf("  %s %s: peak %zu/%llu blocks, handoffs freed: %zu done, "
               "%zu rejected, %zu expired; offload: %zu saves (%zu dup), "
               "%zu hits, %zu evictions, %zu refused\n",
               ns[i]->tag, ns[i]->agent, jnum(st, "peak_blocks"),
               (unsigned long long)ns[i]->num_blocks, jnum(st, "freed_done"),
               jnum(st, "freed_reject"), jnum(st, "freed_expired"),
               jnum(of, "saves"), jnum(of, "dup_saves"), jnum(of, "hits"),
               jnum(of, "evictions"), jnum(of, "no_space"));
    }
    printf("  P lookup latency at most %.0f ms (pending included: "
           "wait_for_full_prefix)\n",
           run->tot.lookup_ms_max);
    printf("  wall %.1f s (node start and connect %.1f s)\n\n",
           run->wall_ms / 1e3, run->startup_ms / 1e3);
    if (soak != NULL) {
        soak_print(soak);
    }
    printf("checks: %d passed, %d failed\n", run->checks.passed,
           run->checks.failed);
    const cJSON *f;
    cJSON_ArrayForEach(f, run->checks.failures)
    {
        printf("  FAIL: %s\n", f->valuestring);
    }
    printf("%s\n", pass ? "PASS" : "FAIL");
}

static int validate(int argc, char **argv)
{
    static run_t run_s;
    run_t *run = &run_s;
    int rc = parse_args(argc, argv, &run->o);
    if (rc >= 0) {
        return rc;
    }
    run->p_cfg = g_p_cfg;
    run->d_cfg = g_d_cfg;
    if ((rc = start_nodes(run)) != 0 || (rc = plan_sessions(run)) != 0) {
        return rc;
    }
    run->checks = (check_log_t){.failures = cJSON_CreateArray()};
    run->phases_total = run->o.sessions * run->o.turns * 2;
    if ((rc = run_loop(run)) != 0) {
        return rc;
    }
    drain_nodes(run);
    final_checks(run);
    bool pass = run->checks.failed == 0;
    rc = pass ? 0 : EXIT_FAIL;
    cJSON *soak = run->o.soak ? soak_summary(run, pass) : NULL;
    if (run->o.json) {
        report_json(run, pass, soak);
        soak = NULL; /* the document's */
    } else {
        report_text(run, pass, soak);
    }
    fflush(stdout);
    cJSON_Delete(soak);
    cJSON_Delete(run->checks.failures);
    free(run->per);
    return rc;
}
/* Everything main allocated, on every way out of it. */
static void cleanup(void)
{
    for (int i = 0; g_ss != NULL && i < g_nss; i++) {
        session_t *s = &g_ss[i];
        free(s->hist);
        free(s->params_p);
        free(s->params_d);
        for (int t = 0; s->recs != NULL && t < g_nturns; t++) {
            cJSON_Delete(s->recs[t].p_phases);
            cJSON_Delete(s->recs[t].d_phases);
        }
        free(s->recs);
    }
    free(g_ss);
    g_ss = NULL;
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        cJSON_Delete(ns[i]->hello);
        cJSON_Delete(ns[i]->stats);
        ns[i]->hello = ns[i]->stats = NULL;
        if (ns[i]->chan.fd > 0) {
            pd_chan_close(&ns[i]->chan);
        }
    }
}

int pd_multinode_main(int argc, char **argv); /* multinode.c */

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--multi-node") == 0) {
            return pd_multinode_main(argc, argv);
        }
    }
    int rc = validate(argc, argv);
    cleanup();
    return rc;
}
