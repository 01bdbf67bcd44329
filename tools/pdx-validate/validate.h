/* Private to pdx-validate: the options, the two nodes, the sessions and
 * turns, the checks and the state of one run, shared by main.c (the run's
 * steps, on top), report.c (aggregates and the JSON or text report),
 * multinode.c (--multi-node runs), options.c (the command line, both
 * modes), nodes.c (the node processes and their channel) and names.c (the
 * names of abort plans and kinds, and JSON field helpers, at the bottom).
 * Each calls only those after it. */
#ifndef PDX_VALIDATE_H
#define PDX_VALIDATE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "pd_wire.h"

#define MAX_PROMPTS 32
#define MULTINODE_MAX_PROMPTS 16 /* --multi-node --prompts */
#define SOAK_MIN_CONCURRENCY 17
#define EXIT_FAIL 1
#define EXIT_SETUP 2
#define EXIT_REFUSED 3

/* What a node reported for a cancelled phase, by side: the abort kinds of
 * glm52-pd-node (g_done_names). */
enum { DONE_LOAD = 0, DONE_REJECT = 1, DONE_AFTER = 2, DONE_KINDS = 3 };

/* The command line (options.c). --multi-node reads sessions, turns,
 * prompts, gen, user_tokens, shared, vram and node (and the config paths,
 * g_p_cfg and g_d_cfg); the rest are the single run's. */
typedef struct opts {
    bool multi_node; /* --multi-node */
    bool vram;       /* --multi-node --vram: the arenas in GPU memory */
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

typedef struct agg {
    int sessions, n; /* sessions, turn records */
    uint64_t prompt, from_d, local, recomputed, tail_hits, to_d, bytes,
        verified, diff, generated, p_tail_hits;
    double ms_sum, ms_max, lookup_ms_max;
    double load_ms; /* time in the nodes' load phase, P and D */
} agg_t;

/* Loads aborted in flight: time from pdx_kv_load_abort to the final state
 * pdx_kv_load_check reported (the node's ms.abort_to_final), the abort
 * call itself, and how many had completed before the abort took. */
typedef struct abort_times {
    uint64_t n, completed;
    double final_max, final_sum, call_max;
} abort_times_t;

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

/* names.c (the bottom): the names of abort plans and of what a node did,
 * and the fields of a node's JSON messages. */
extern const char *const g_done_names[DONE_KINDS];
const char *plan_name(abort_plan_t k);
size_t jnum(const cJSON *m, const char *k);
bool jbool(const cJSON *m, const char *k);
cJSON *tokens_json(const uint64_t *t, size_t n);

/* nodes.c: P and D, their processes and channel. */
extern node_t g_p, g_d;
void kill_nodes(void);
void on_alarm(int sig);
int spawn(node_t *n, const opts_t *o);
void node_death(node_t *n, char *buf, size_t len);
cJSON *recv_one(node_t *n, double deadline, char *why, size_t len);
void send_to(node_t *n, cJSON *msg);
void quit_nodes(double deadline);
/* Wait until `deadline` (pdx_now_ms_f) for child `pid` to exit, then SIGKILL
 * and reap it. */
void reap_child(pid_t pid, double deadline);
int read_hello(node_t *n, cJSON *m, char *why, size_t len);

/* options.c: the command line into *o_p, for either mode (o_p->multi_node
 * when --multi-node is among the arguments): -1 to run, else the exit code
 * (0 for --help); the config paths it settled on. */
extern char g_p_cfg[PATH_MAX], g_d_cfg[PATH_MAX];
int parse_args(int argc, char **argv, opts_t *o_p);

/* multinode.c: a --multi-node run of the options parse_args settled;
 * returns the exit code (77: namespaces refused or etcd missing). */
int multinode_run(const opts_t *o);


/* report.c */
void agg_add(agg_t *a, const turn_rec_t *r);
cJSON *soak_summary(run_t *run, bool pass);
void report_json(run_t *run, bool pass, cJSON *soak);
void report_text(run_t *run, bool pass, const cJSON *soak);

#endif
