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
 * connect.
 *
 * This file holds the sessions and the run's steps, on top: it calls
 * report.c (the report), multinode.c (--multi-node), options.c (the
 * command line, both modes), nodes.c (the node processes) and names.c
 * (names and JSON helpers); none of them calls back (validate.h). */
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
#include "tool_version.h"
#include "validate.h"

/* ---- sessions ---- */

static int done_kind(const char *name)
{
    for (int k = 0; k < DONE_KINDS; k++) {
        if (strcmp(name, g_done_names[k]) == 0) {
            return k;
        }
    }
    return -1;
}

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
    r->t0 = pdx_now_ms_f();
    send_job(&g_p, "prefill", s, s->turn > 1 ? s->params_d : NULL, 0);
    s->state = S_P;
    return 0;
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
            total, inflight, (pdx_now_ms_f() - t0) / 1e3);
    fflush(stderr);
}

static void bar_end(void)
{
    if (g_bar) {
        fprintf(stderr, "\r%-72s\r", "");
        fflush(stderr);
    }
}

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

/* ---- plans ---- */

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

static session_t *g_ss;
static int g_nss, g_nturns;

/* ---- one run, step by step: parse_args, start_nodes, plan_sessions,
 * run_loop (admission, polling, on_reply per node message), drain_nodes,
 * final_checks and the report. Its state is one run_t. */

/* Spawn P and D, read their hellos and connect them both ways: 0, or the
 * exit code. */
static int start_nodes(run_t *run)
{
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    /* Backstop: whatever hangs, the run ends. */
    alarm((unsigned)ceil(run->o.timeout_s) + 30);
    run->t_start = pdx_now_ms_f();
    run->deadline = run->t_start + run->o.timeout_s * 1e3;
    char why[2048];

    if (spawn(&g_p, &run->o) != 0 || spawn(&g_d, &run->o) != 0) {
        kill_nodes();
        return EXIT_SETUP;
    }
    /* Both nodes start at once; each says hello with its blob. */
    double hello_deadline = pdx_now_ms_f() + 120e3;
    cJSON *hp = recv_one(&g_p, hello_deadline, why, sizeof(why));
    if (hp == NULL || read_hello(&g_p, hp, why, sizeof(why)) != 0) {
        fprintf(stderr, "pdx-validate: %s\n", why);
        cJSON_Delete(hp);
        kill_nodes();
        quit_nodes(pdx_now_ms_f() + 2000);
        return EXIT_SETUP;
    }
    cJSON *hd = recv_one(&g_d, hello_deadline, why, sizeof(why));
    if (hd == NULL || read_hello(&g_d, hd, why, sizeof(why)) != 0) {
        fprintf(stderr, "pdx-validate: %s\n", why);
        cJSON_Delete(hd);
        kill_nodes();
        quit_nodes(pdx_now_ms_f() + 2000);
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
        cJSON *r = recv_one(n, pdx_now_ms_f() + 60e3, why, sizeof(why));
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
        quit_nodes(pdx_now_ms_f() + 5000);
        return EXIT_REFUSED;
    }

    run->startup_ms = pdx_now_ms_f() - run->t_start;
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
            quit_nodes(pdx_now_ms_f() + 5000);
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
            quit_nodes(pdx_now_ms_f() + 5000);
            return EXIT_SETUP;
        }
    }
    run->planned = plan_aborts(run->ss, &run->o, &rng);
    if (run->planned < 0) {
        fprintf(stderr, "pdx-validate: out of memory\n");
        quit_nodes(pdx_now_ms_f() + 5000);
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
    r->ms = pdx_now_ms_f() - r->t0;
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
        if (pdx_now_ms_f() > run->deadline) {
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
    run->wall_ms = pdx_now_ms_f() - run->t_start;

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
            cJSON *r = recv_one(ns[i], pdx_now_ms_f() + 30e3, why, sizeof(why));
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
    quit_nodes(pdx_now_ms_f() + 15000);
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

static int validate(const opts_t *o)
{
    static run_t run_s;
    run_t *run = &run_s;
    int rc;
    run->o = *o;
    run->p_cfg = g_p.config = g_p_cfg;
    run->d_cfg = g_d.config = g_d_cfg;
    g_bar = !run->o.quiet && isatty(2);
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

int main(int argc, char **argv)
{
    if (pdx_tool_version(argc, argv, "pdx-validate")) {
        return 0;
    }
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    if (o.multi_node) {
        return multinode_run(&o);
    }
    rc = validate(&o);
    cleanup();
    return rc;
}
