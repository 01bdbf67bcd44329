/* glm52-pd-node: one prefill (producer) or decode (consumer) node of the
 * GLM-5.2 P/D example, built on the pdx KV connector. A single-threaded
 * event loop serves many requests at once, each a small state machine
 * (blocks -> lookup -> load -> verify -> compute/decode -> save -> handoff),
 * doing a bounded slice of work per turn of the loop so that connector
 * progress, freed-block reports and driver messages are never starved.
 *
 * The driver (tools/pdx-validate) starts it with `--config FILE --fd N`
 * and speaks the framed JSON of pd_wire.h on fd N. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <pdx/kv_config.h>
#include <pdx/kv_connector.h>
#include <pdx/store.h>
#include <pdx/log.h>

#include "pd_model.h"
#include "pd_wire.h"

#define QUANTUM_TOKENS 512 /* tokens computed or verified per job per turn */
#define ARENA_ALIGN 4096
/* Blocks of an aborted load are filled with this byte and kept out of use
 * for a while; a byte that changed meanwhile landed after the abort. */
#define CANARY_BYTE 0xa5
#define QUARANTINE_MS 50.0
#define QUARANTINE_PASSES 3
/* How long a job waits, after pdx_kv_load_abort, for pdx_kv_load_check to
 * report the final state; past it the blocks are never reused (leaked) and
 * the job fails. */
#define ABORT_DEADLINE_MS 10000.0

/* ---- logging: pdx lines to stderr, error lines kept for the driver ---- */

#define ERR_RING 8
static struct {
    pthread_mutex_t mu;
    char tag[16];
    char lines[ERR_RING][512];
    uint64_t seq; /* error lines seen */
} g_log = {.mu = PTHREAD_MUTEX_INITIALIZER, .tag = "node"};

static void log_sink(void *arg, pdx_log_level_t level, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    pthread_mutex_lock(&g_log.mu);
    if (level == PDX_LOG_ERROR) {
        snprintf(g_log.lines[g_log.seq % ERR_RING], sizeof(g_log.lines[0]),
                 "%s", msg);
        g_log.seq++;
    }
    fprintf(stderr, "[%s] pdx %s: %s\n", g_log.tag,
            level <= PDX_LOG_TRACE ? names[level] : "?", msg);
    pthread_mutex_unlock(&g_log.mu);
}

static uint64_t log_mark(void)
{
    pthread_mutex_lock(&g_log.mu);
    uint64_t s = g_log.seq;
    pthread_mutex_unlock(&g_log.mu);
    return s;
}

/* The pdx error lines logged since `mark`, joined by "; ". */
static void log_since(uint64_t mark, char *buf, size_t len)
{
    buf[0] = '\0';
    pthread_mutex_lock(&g_log.mu);
    if (g_log.seq - mark > ERR_RING) {
        mark = g_log.seq - ERR_RING;
    }
    size_t off = 0;
    for (uint64_t s = mark; s < g_log.seq && off < len; s++) {
        int n = snprintf(buf + off, len - off, "%s%s", off ? "; " : "",
                         g_log.lines[s % ERR_RING]);
        off += n > 0 ? (size_t)n : 0;
    }
    pthread_mutex_unlock(&g_log.mu);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log.mu);
    fprintf(stderr, "[%s] %s\n", g_log.tag, buf);
    pthread_mutex_unlock(&g_log.mu);
}

/* ---- node state ---- */

typedef enum job_kind { JOB_PREFILL = 0, JOB_DECODE = 1 } job_kind_t;

/* Where the driver asked a job to be cancelled (soak runs). */
typedef enum job_abort {
    ABORT_NONE = 0,
    ABORT_REJECT, /* after the lookup, before reading: reject the handoff */
    ABORT_LOAD,   /* while the load is in flight: pdx_kv_load_abort */
} job_abort_t;

/* What an aborted job actually did; also the stats' index. */
typedef enum abort_done {
    ABORTED_LOAD = 0,   /* load aborted in flight */
    ABORTED_REJECT = 1, /* handoff rejected unread */
    ABORTED_AFTER = 2,  /* the load had finished: cancelled after it */
    ABORTED_KINDS = 3,
} abort_done_t;

static const char *const g_abort_names[ABORTED_KINDS] = {"load", "reject",
                                                         "after_load"};

typedef enum job_state {
    J_ALLOC,   /* waiting for free blocks */
    J_LOOKUP,  /* asking the connector (may be pending) */
    J_LOAD,    /* load in flight */
    J_ABORTING, /* load_abort asked; load_check not final yet: blocks busy */
    J_VERIFY,  /* comparing loaded blocks with recomputation */
    J_COMPUTE, /* the stand-in writes the prompt tokens not loaded */
    J_DECODE,  /* generating tokens (decode only) */
    J_SAVE_START,
    J_SAVE, /* saving to the offload child */
    J_END,
} job_state_t;

typedef struct job {
    struct job *next;
    job_kind_t kind;
    job_state_t state;
    char req[PDX_KV_REQ_ID_MAX];
    int sid, turn;
    uint64_t *tok, *ph; /* tokens and their prefix hashes */
    size_t n, cap;      /* tokens with KV written or given; capacity */
    size_t prompt;
    uint32_t gen;
    char *params; /* the peer's handoff, or NULL */
    uint64_t *blocks;
    size_t nblocks;
    pdx_block_hash_t *hashes;
    size_t nfull;
    int has_tail;
    pdx_block_hash_t tail;
    uint32_t tail_tokens;
    pdx_kv_match_t match;
    size_t loaded, cursor, vend;
    bool load_failed;
    bool blocks_busy; /* a load or save still uses them */
    job_abort_t abort_at;
    uint32_t abort_polls; /* load checks still in progress before aborting */
    uint32_t polls;
    /* J_ABORTING: the abort call's time, when it was asked, the deadline,
     * and whether the job had already failed (reply sent, only the blocks
     * left to release) rather than been cancelled by the driver. */
    double abort_call_ms, abort_t0, abort_deadline;
    bool abort_after_fail;
    bool abort_completed; /* the load had completed before the abort */
    uint64_t verified_blocks, verified_bytes, diff_bytes;
    double t0, t_phase, deadline;
    double ms_alloc, ms_lookup, ms_load, ms_verify, ms_compute, ms_decode,
        ms_save;
} job_t;

typedef struct held_blocks {
    struct held_blocks *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t *blocks;
    size_t n;
} held_blocks_t;

/* Blocks of an aborted load, canary-filled, waiting to be checked and
 * returned to the free list. */
typedef struct quarantine {
    struct quarantine *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t *blocks; /* all the job's blocks */
    size_t n;
    size_t ncanary; /* the first ncanary were targets of the load */
    double release_at;
    int passes;
} quarantine_t;

typedef struct node {
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    void *mem;
    size_t mem_len;
    pd_model_t model;
    pdx_kv_connector_h conn;
    pdx_hasher_h hasher;
    uint32_t B;
    pd_chan_t chan;
    uint64_t *free_ids;
    size_t nfree;
    job_t *jobs, *jobs_tail;
    held_blocks_t *held;
    quarantine_t *quarantine;
    double job_timeout_ms;
    bool quit;
    bool refused; /* the peer's connect was refused */
    /* drain request in progress */
    bool draining;
    double drain_deadline;
    /* counters */
    uint64_t freed[3];
    uint64_t jobs_ok, jobs_failed;
    uint64_t peak_used;
    uint64_t aborted[ABORTED_KINDS];
    uint64_t rejects_sent;  /* handoffs this node rejected itself */
    uint64_t late_bytes;    /* canary bytes changed after a load abort */
    uint64_t canary_blocks; /* blocks checked after a load abort */
    double abort_call_ms_max;  /* longest pdx_kv_load_abort call */
    double abort_final_ms_max; /* longest abort -> final load_check state */
    uint64_t abort_completed;  /* aborted loads that had completed first */
    uint64_t abort_stuck; /* aborts with no final state by the deadline */
} node_t;

static const char *role_name(pdx_kv_role_t r)
{
    return r == PDX_KV_ROLE_PRODUCER   ? "producer"
           : r == PDX_KV_ROLE_CONSUMER ? "consumer"
                                       : "both";
}

static const char *source_name(pdx_kv_source_t s)
{
    return s == PDX_KV_SOURCE_REMOTE    ? "remote"
           : s == PDX_KV_SOURCE_OFFLOAD ? "offload"
                                        : "none";
}

/* ---- block allocator: a stack of free ids ---- */

static int blocks_take(node_t *nd, size_t n, uint64_t *out)
{
    if (nd->nfree < n) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = nd->free_ids[--nd->nfree];
    }
    uint64_t used = nd->cfg.num_blocks - nd->nfree;
    if (used > nd->peak_used) {
        nd->peak_used = used;
    }
    return 0;
}

static void blocks_put(node_t *nd, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        nd->free_ids[nd->nfree++] = ids[i];
    }
}

/* ---- replies ---- */

static void send_msg(node_t *nd, cJSON *msg)
{
    if (pd_chan_send(&nd->chan, msg) != 0) {
        say("driver channel failed: %s", strerror(nd->chan.error));
        nd->quit = true;
    }
    cJSON_Delete(msg);
}

static cJSON *reply_head(const char *op, bool ok)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "op", op);
    cJSON_AddBoolToObject(r, "ok", ok);
    return r;
}

static void job_free(node_t *nd, job_t *j)
{
    free(j->tok);
    free(j->ph);
    free(j->params);
    free(j->blocks);
    free(j->hashes);
    free(j);
}

static const char *job_op(const job_t *j)
{
    return j->kind == JOB_PREFILL ? "prefill" : "decode";
}

static void job_fail(node_t *nd, job_t *j, uint64_t mark, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void job_fail(node_t *nd, job_t *j, uint64_t mark, const char *fmt, ...)
{
    char what[512], pdx_lines[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    log_since(mark, pdx_lines, sizeof(pdx_lines));
    char msg[1600];
    snprintf(msg, sizeof(msg), "%s %s: %s%s%s", job_op(j), j->req, what,
             pdx_lines[0] ? ": " : "", pdx_lines);
    say("%s", msg);
    cJSON *r = reply_head(job_op(j), false);
    cJSON_AddNumberToObject(r, "sid", j->sid);
    cJSON_AddNumberToObject(r, "turn", j->turn);
    cJSON_AddStringToObject(r, "req", j->req);
    cJSON_AddStringToObject(r, "error", msg);
    send_msg(nd, r);
    nd->jobs_failed++;
    /* A load still in flight is aborted (the holder is told to free); its
     * blocks stay busy until pdx_kv_load_check reports the final state
     * (J_ABORTING, polled by the loop). */
    if (j->state == J_LOAD && j->blocks_busy) {
        double t = pd_now_ms();
        if (pdx_kv_load_abort(nd->conn, j->req) == PDX_OK) {
            j->abort_call_ms = pd_now_ms() - t;
            j->abort_t0 = pd_now_ms();
            j->abort_deadline = j->abort_t0 + ABORT_DEADLINE_MS;
            j->abort_after_fail = true;
            j->state = J_ABORTING;
            return;
        }
    }
    /* Blocks a load (or save) may still use are never reused. */
    if (!j->blocks_busy && j->blocks != NULL) {
        blocks_put(nd, j->blocks, j->nblocks);
    }
    j->state = J_END;
}

/* Hashes of the job's first `n` tokens (the prompt for lookups, the whole
 * history for saves). */
static pdx_status_t job_hash(node_t *nd, job_t *j, size_t n)
{
    size_t nfull = 0;
    int has_tail = 0;
    pdx_status_t st =
        pdx_hasher_hash_blocks(nd->hasher, j->tok, n, NULL, j->hashes,
                               n / nd->B + 1, &nfull, &j->tail, &has_tail);
    if (st == PDX_OK) {
        j->nfull = nfull;
        j->has_tail = has_tail;
        j->tail_tokens = has_tail ? (uint32_t)(n % nd->B) : 0;
    }
    return st;
}

static pdx_kv_request_t job_req(const job_t *j, size_t prompt_tokens)
{
    return (pdx_kv_request_t){.req_id = j->req,
                              .hashes = j->hashes,
                              .nfull = j->nfull,
                              .has_tail = j->has_tail != 0,
                              .tail_hash = j->tail,
                              .tail_tokens = j->tail_tokens,
                              .prompt_tokens = prompt_tokens,
                              .params = j->params};
}

static void phase_end(job_t *j, double *acc)
{
    double now = pd_now_ms();
    *acc += now - j->t_phase;
    j->t_phase = now;
}

static void job_finish(node_t *nd, job_t *j)
{
    uint64_t mark = log_mark();
    pdx_kv_request_t req = job_req(j, j->n);
    char *params = NULL;
    pdx_status_t st = pdx_kv_request_finished(
        nd->conn, &req, j->blocks, j->n,
        j->kind == JOB_PREFILL ? PDX_KV_FROM_ARENA : PDX_KV_FROM_POOL, &params);
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "request_finished: %s", pdx_status_string(st));
        return;
    }
    if (j->kind == JOB_PREFILL) {
        /* Held for the peer until pdx_kv_poll_freed reports the request. */
        held_blocks_t *h = calloc(1, sizeof(*h));
        if (h == NULL) {
            pdx_kv_free(params);
            job_fail(nd, j, mark, "out of memory");
            return;
        }
        snprintf(h->req, sizeof(h->req), "%s", j->req);
        h->blocks = j->blocks;
        h->n = j->nblocks;
        j->blocks = NULL;
        h->next = nd->held;
        nd->held = h;
    } else {
        /* The handoff comes from the pool: the arena blocks are free. */
        blocks_put(nd, j->blocks, j->nblocks);
        free(j->blocks);
        j->blocks = NULL;
    }
    uint64_t bpb = nd->model.bytes_per_block;
    size_t nloaded =
        j->loaded > 0 ? j->match.blocks + (j->match.tail ? 1 : 0) : 0;
    cJSON *r = reply_head(job_op(j), true);
    cJSON_AddNumberToObject(r, "sid", j->sid);
    cJSON_AddNumberToObject(r, "turn", j->turn);
    cJSON_AddStringToObject(r, "req", j->req);
    cJSON_AddStringToObject(r, "params", params);
    pdx_kv_free(params);
    cJSON_AddNumberToObject(r, "prompt", (double)j->prompt);
    cJSON_AddStringToObject(r, "source", source_name(j->match.source));
    cJSON_AddNumberToObject(r, "match_blocks", (double)j->match.blocks);
    cJSON_AddBoolToObject(r, "match_tail", j->match.tail);
    cJSON_AddNumberToObject(r, "match_tokens", (double)j->match.tokens);
    cJSON_AddNumberToObject(r, "loaded", (double)j->loaded);
    cJSON_AddBoolToObject(r, "load_failed", j->load_failed);
    cJSON_AddNumberToObject(r, "recomputed", (double)(j->prompt - j->loaded));
    cJSON_AddBoolToObject(r, "tail_hit", j->loaded > 0 && j->match.tail);
    cJSON_AddNumberToObject(r, "bytes_loaded", (double)(nloaded * bpb));
    cJSON_AddNumberToObject(r, "verified_blocks", (double)j->verified_blocks);
    cJSON_AddNumberToObject(r, "verified_bytes", (double)j->verified_bytes);
    cJSON_AddNumberToObject(r, "diff_bytes", (double)j->diff_bytes);
    cJSON_AddNumberToObject(r, "history", (double)j->n);
    cJSON_AddNumberToObject(r, "nfull", (double)j->nfull);
    cJSON_AddBoolToObject(r, "has_tail", j->has_tail);
    cJSON_AddNumberToObject(r, "tail_tokens", j->tail_tokens);
    cJSON_AddNumberToObject(r, "bytes_saved",
                            (double)((j->nfull + (j->has_tail ? 1 : 0)) * bpb));
    if (j->kind == JOB_DECODE) {
        cJSON *g = cJSON_AddArrayToObject(r, "generated");
        for (size_t i = j->prompt; i < j->n; i++) {
            cJSON_AddItemToArray(g, cJSON_CreateNumber((double)j->tok[i]));
        }
    }
    cJSON *ms = cJSON_AddObjectToObject(r, "ms");
    cJSON_AddNumberToObject(ms, "wait_blocks", j->ms_alloc);
    cJSON_AddNumberToObject(ms, "lookup", j->ms_lookup);
    cJSON_AddNumberToObject(ms, "load", j->ms_load);
    cJSON_AddNumberToObject(ms, "verify", j->ms_verify);
    cJSON_AddNumberToObject(ms, "compute", j->ms_compute);
    cJSON_AddNumberToObject(ms, "decode", j->ms_decode);
    cJSON_AddNumberToObject(ms, "save", j->ms_save);
    cJSON_AddNumberToObject(ms, "total", pd_now_ms() - j->t0);
    send_msg(nd, r);
    j->state = J_END;
    nd->jobs_ok++;
}

/* ---- cancelled requests (soak runs) ---- */

static void canary_fill(node_t *nd, uint64_t id)
{
    for (size_t a = 0; a < nd->model.narenas; a++) {
        const pd_arena_view_t *v = &nd->model.arenas[a];
        memset(v->base + id * v->stride, CANARY_BYTE,
               (size_t)v->bytes_per_token * nd->B);
    }
}

/* Bytes of block `id` (all arenas) that are no longer the canary. */
static uint64_t canary_diff(const node_t *nd, uint64_t id)
{
    uint64_t bad = 0;
    for (size_t a = 0; a < nd->model.narenas; a++) {
        const pd_arena_view_t *v = &nd->model.arenas[a];
        const uint8_t *p = v->base + id * v->stride;
        size_t len = (size_t)v->bytes_per_token * nd->B;
        for (size_t i = 0; i < len; i++) {
            bad += p[i] != CANARY_BYTE;
        }
    }
    return bad;
}

/* Check and free quarantined blocks whose time is up. */
static void quarantine_step(node_t *nd)
{
    double now = pd_now_ms();
    for (quarantine_t **pp = &nd->quarantine; *pp != NULL;) {
        quarantine_t *q = *pp;
        if (++q->passes < QUARANTINE_PASSES || now < q->release_at) {
            pp = &q->next;
            continue;
        }
        uint64_t bad = 0;
        for (size_t i = 0; i < q->ncanary; i++) {
            bad += canary_diff(nd, q->blocks[i]);
        }
        nd->canary_blocks += q->ncanary;
        if (bad != 0) {
            say("%s: %" PRIu64 " bytes of its %zu blocks changed after its "
                "load was aborted",
                q->req, bad, q->ncanary);
            nd->late_bytes += bad;
        }
        blocks_put(nd, q->blocks, q->n);
        free(q->blocks);
        *pp = q->next;
        free(q);
    }
}

/* A cancelled job's end, once nothing can land in its blocks any more
 * (for ABORTED_LOAD: pdx_kv_load_check reported the final state after
 * pdx_kv_load_abort). A handoff not read is rejected (pdx_kv_reject); a job
 * whose load had finished just stops (the holder was told done, or reject
 * if the load failed; an aborted load told it reject). The blocks of an
 * aborted load are canary-filled and quarantined, so a byte landing after
 * the final state is caught. */
static void job_cancelled(node_t *nd, job_t *j, abort_done_t how)
{
    uint64_t mark = log_mark();
    double final_ms = how == ABORTED_LOAD ? pd_now_ms() - j->abort_t0 : 0;
    /* Whether the connector already told the holder (done or reject). */
    bool told = false;
    if (how == ABORTED_LOAD || how == ABORTED_AFTER) {
        told = j->match.source == PDX_KV_SOURCE_REMOTE;
    }
    bool rejected = false;
    if (!told && j->params != NULL) {
        pdx_status_t st = pdx_kv_reject(nd->conn, j->params);
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "reject of the handoff: %s",
                     pdx_status_string(st));
            return;
        }
        rejected = true;
        nd->rejects_sent++;
    }
    size_t ncanary = 0;
    if (how == ABORTED_LOAD) {
        ncanary = j->match.blocks + (j->match.tail ? 1 : 0);
        quarantine_t *q = calloc(1, sizeof(*q));
        if (q == NULL) {
            job_fail(nd, j, mark, "out of memory");
            return;
        }
        for (size_t i = 0; i < ncanary; i++) {
            canary_fill(nd, j->blocks[i]);
        }
        snprintf(q->req, sizeof(q->req), "%s", j->req);
        q->blocks = j->blocks;
        q->n = j->nblocks;
        q->ncanary = ncanary;
        q->release_at = pd_now_ms() + QUARANTINE_MS;
        q->next = nd->quarantine;
        nd->quarantine = q;
        j->blocks = NULL;
    } else {
        blocks_put(nd, j->blocks, j->nblocks);
        free(j->blocks);
        j->blocks = NULL;
    }
    nd->aborted[how]++;
    if (how == ABORTED_LOAD) {
        say("%s: cancelled (load; %s %.1f ms after the abort)", j->req,
            j->abort_completed ? "had completed" : "canceled", final_ms);
    } else {
        say("%s: cancelled (%s%s)", j->req, g_abort_names[how],
            rejected ? ", handoff rejected" : "");
    }
    bool loaded = how == ABORTED_AFTER && j->loaded > 0;
    size_t nloaded = loaded ? j->match.blocks + (j->match.tail ? 1 : 0) : 0;
    cJSON *r = reply_head(job_op(j), true);
    cJSON_AddStringToObject(r, "aborted", g_abort_names[how]);
    cJSON_AddNumberToObject(r, "sid", j->sid);
    cJSON_AddNumberToObject(r, "turn", j->turn);
    cJSON_AddStringToObject(r, "req", j->req);
    cJSON_AddNumberToObject(r, "prompt", (double)j->prompt);
    cJSON_AddStringToObject(r, "source", source_name(j->match.source));
    cJSON_AddNumberToObject(r, "match_blocks", (double)j->match.blocks);
    cJSON_AddNumberToObject(r, "loaded", loaded ? (double)j->loaded : 0);
    cJSON_AddBoolToObject(r, "load_failed", j->load_failed);
    cJSON_AddNumberToObject(r, "bytes_loaded",
                            (double)(nloaded * nd->model.bytes_per_block));
    cJSON_AddNumberToObject(r, "verified_blocks", (double)j->verified_blocks);
    cJSON_AddNumberToObject(r, "verified_bytes", (double)j->verified_bytes);
    cJSON_AddNumberToObject(r, "diff_bytes", (double)j->diff_bytes);
    cJSON_AddNumberToObject(r, "load_checks", j->polls);
    cJSON_AddNumberToObject(r, "canary_blocks", (double)ncanary);
    cJSON_AddBoolToObject(r, "rejected", rejected);
    if (how == ABORTED_LOAD) {
        cJSON_AddStringToObject(r, "final",
                                j->abort_completed ? "completed" : "canceled");
    }
    cJSON *ms = cJSON_AddObjectToObject(r, "ms");
    cJSON_AddNumberToObject(ms, "abort_call", j->abort_call_ms);
    cJSON_AddNumberToObject(ms, "abort_to_final", final_ms);
    cJSON_AddNumberToObject(ms, "total", pd_now_ms() - j->t0);
    send_msg(nd, r);
    j->state = J_END;
}

/* Cancel a job as the driver asked. A load in flight is aborted
 * (pdx_kv_load_abort asks the READ to stop, tells the holder to free and
 * returns at once); the job then waits in J_ABORTING, its blocks busy,
 * until pdx_kv_load_check reports the final state. Anything else ends at
 * once (job_cancelled). */
static void job_abort(node_t *nd, job_t *j, abort_done_t how)
{
    if (how != ABORTED_LOAD) {
        job_cancelled(nd, j, how);
        return;
    }
    uint64_t mark = log_mark();
    double t = pd_now_ms();
    pdx_status_t st = pdx_kv_load_abort(nd->conn, j->req);
    j->abort_call_ms = pd_now_ms() - t;
    if (j->abort_call_ms > nd->abort_call_ms_max) {
        nd->abort_call_ms_max = j->abort_call_ms;
    }
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "load_abort: %s", pdx_status_string(st));
        return;
    }
    j->abort_t0 = pd_now_ms();
    j->abort_deadline = j->abort_t0 + ABORT_DEADLINE_MS;
    j->state = J_ABORTING; /* blocks_busy stays true */
}

/* J_ABORTING: poll pdx_kv_load_check until the final state. */
static bool job_aborting(node_t *nd, job_t *j, uint64_t mark)
{
    size_t tokens = 0;
    pdx_status_t st = pdx_kv_load_check(nd->conn, j->req, &tokens);
    double now = pd_now_ms();
    if (st == PDX_INPROGRESS) {
        if (now <= j->abort_deadline) {
            return false;
        }
        /* Bytes may still land: the blocks stay out of use for good. */
        nd->abort_stuck++;
        if (j->abort_after_fail) {
            say("%s: load still in progress %.0f ms after its abort; %zu "
                "blocks never reused",
                j->req, now - j->abort_t0, j->nblocks);
            j->state = J_END;
            return false;
        }
        job_fail(nd, j, mark,
                 "load still in progress %.0f ms after load_abort; %zu "
                 "blocks never reused",
                 now - j->abort_t0, j->nblocks);
        return false;
    }
    /* Final: nothing more can land; the blocks are ours again. */
    j->blocks_busy = false;
    double final_ms = now - j->abort_t0;
    if (final_ms > nd->abort_final_ms_max) {
        nd->abort_final_ms_max = final_ms;
    }
    if (j->abort_after_fail) {
        blocks_put(nd, j->blocks, j->nblocks);
        j->state = J_END;
        return false;
    }
    if (st == PDX_OK) {
        /* The load completed before the abort took: data valid, the holder
         * was told reject all the same. Still an abort in flight. */
        j->abort_completed = true;
        j->loaded = tokens;
        nd->abort_completed++;
    } else if (st != PDX_ERR_CANCELED) {
        job_fail(nd, j, mark, "load_check after load_abort: %s",
                 pdx_status_string(st));
        return false;
    }
    job_cancelled(nd, j, ABORTED_LOAD);
    return true;
}

/* One bounded slice of a job's work. Returns true when it did CPU work (the
 * loop should not sleep), false when it only waits. `alloc_blocked` keeps
 * allocation FIFO: once a job waits for blocks, later ones wait behind it. */
static bool job_step(node_t *nd, job_t *j, bool *alloc_blocked)
{
    uint32_t B = nd->B;
    uint64_t mark = log_mark();
    pdx_status_t st;
    if (j->state != J_END && j->state != J_ABORTING &&
        pd_now_ms() > j->deadline) {
        job_fail(nd, j, mark, "timed out after %.0f ms in state %d",
                 nd->job_timeout_ms, (int)j->state);
        return false;
    }
    switch (j->state) {
    case J_ALLOC: {
        if (*alloc_blocked) {
            return false;
        }
        size_t need = (j->prompt + j->gen + B - 1) / B;
        if (need > nd->cfg.num_blocks) {
            job_fail(nd, j, mark,
                     "needs %zu blocks, the node has %u (num_blocks)", need,
                     nd->cfg.num_blocks);
            return false;
        }
        j->blocks = calloc(need, sizeof(*j->blocks));
        if (j->blocks == NULL) {
            job_fail(nd, j, mark, "out of memory");
            return false;
        }
        if (blocks_take(nd, need, j->blocks) != 0) {
            free(j->blocks);
            j->blocks = NULL;
            *alloc_blocked = true;
            return false;
        }
        j->nblocks = need;
        phase_end(j, &j->ms_alloc);
        st = job_hash(nd, j, j->prompt);
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "hash: %s", pdx_status_string(st));
            return false;
        }
        j->state = J_LOOKUP;
    }
    /* fall through */
    case J_LOOKUP: {
        pdx_kv_request_t req = job_req(j, j->prompt);
        st = pdx_kv_lookup(nd->conn, &req, &j->match);
        if (st == PDX_INPROGRESS) {
            return false; /* part of the prefix still being saved */
        }
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "lookup: %s", pdx_status_string(st));
            return false;
        }
        phase_end(j, &j->ms_lookup);
        if (j->abort_at == ABORT_REJECT ||
            (j->abort_at == ABORT_LOAD && j->match.blocks == 0 &&
             !j->match.tail)) {
            job_abort(nd, j, ABORTED_REJECT);
            return false;
        }
        if (j->match.blocks == 0 && !j->match.tail) {
            j->state = J_COMPUTE;
            j->cursor = 0;
            return true;
        }
        st = pdx_kv_load(nd->conn, &req, &j->match, j->blocks);
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "load (%s, %zu blocks%s): %s",
                     source_name(j->match.source), j->match.blocks,
                     j->match.tail ? " + tail" : "", pdx_status_string(st));
            return false;
        }
        j->state = J_LOAD;
        j->blocks_busy = true;
        return true;
    }
    case J_LOAD: {
        if (j->abort_at == ABORT_LOAD && j->polls >= j->abort_polls &&
            j->match.source == PDX_KV_SOURCE_REMOTE) {
            job_abort(nd, j, ABORTED_LOAD);
            return true;
        }
        size_t tokens = 0;
        st = pdx_kv_load_check(nd->conn, j->req, &tokens);
        if (st == PDX_INPROGRESS) {
            j->polls++;
            return false;
        }
        j->blocks_busy = false; /* final either way */
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "load from %s: %s",
                     source_name(j->match.source), pdx_status_string(st));
            return false;
        }
        phase_end(j, &j->ms_load);
        j->loaded = tokens;
        j->load_failed = tokens == 0;
        if (tokens == 0 && j->abort_at == ABORT_LOAD) {
            job_abort(nd, j, ABORTED_AFTER);
            return true;
        }
        if (tokens == 0) {
            say("%s: load from %s failed; recomputing %zu tokens", j->req,
                source_name(j->match.source), j->prompt);
            j->state = J_COMPUTE;
            j->cursor = 0;
            return true;
        }
        j->state = J_VERIFY;
        j->cursor = 0;
        j->vend = j->match.blocks * B + (j->match.tail ? j->tail_tokens : 0);
        return true;
    }
    case J_ABORTING:
        return job_aborting(nd, j, mark);
    case J_VERIFY: {
        size_t end = j->cursor + QUANTUM_TOKENS;
        if (end > j->vend) {
            end = j->vend;
        }
        for (size_t p = j->cursor; p < end; p++) {
            j->diff_bytes += pd_model_diff(&nd->model, j->blocks[p / B],
                                           (uint32_t)(p % B), j->ph[p]);
        }
        j->cursor = end;
        if (end == j->vend) {
            j->verified_blocks = j->match.blocks + (j->match.tail ? 1 : 0);
            j->verified_bytes = j->vend * nd->model.bytes_per_token;
            if (j->diff_bytes != 0) {
                say("%s: %" PRIu64 " of %" PRIu64 " loaded bytes differ from "
                    "recomputation",
                    j->req, j->diff_bytes, j->verified_bytes);
            }
            phase_end(j, &j->ms_verify);
            if (j->abort_at == ABORT_LOAD) {
                /* The load won the race: cancelled after it. */
                job_abort(nd, j, ABORTED_AFTER);
                return true;
            }
            j->state = J_COMPUTE;
            j->cursor = j->loaded;
        }
        return true;
    }
    case J_COMPUTE: {
        size_t end = j->cursor + QUANTUM_TOKENS;
        if (end > j->prompt) {
            end = j->prompt;
        }
        for (size_t p = j->cursor; p < end; p++) {
            pd_model_write(&nd->model, j->blocks[p / B], (uint32_t)(p % B),
                           j->ph[p]);
        }
        j->cursor = end;
        if (end == j->prompt) {
            phase_end(j, &j->ms_compute);
            j->state =
                j->kind == JOB_DECODE && j->gen > 0 ? J_DECODE : J_SAVE_START;
        }
        return true;
    }
    case J_DECODE: {
        /* Each step samples the next token from the prefix so far, then
         * writes its KV into the request's current block, moving on to the
         * next reserved block when one fills up. */
        size_t stop = j->prompt + j->gen;
        for (int k = 0; k < QUANTUM_TOKENS / 4 && j->n < stop; k++) {
            size_t p = j->n;
            j->tok[p] = pd_next_token(j->ph[p - 1]);
            j->ph[p] = pd_prefix_step(j->ph[p - 1], j->tok[p]);
            pd_model_write(&nd->model, j->blocks[p / B], (uint32_t)(p % B),
                           j->ph[p]);
            j->n++;
        }
        if (j->n == stop) {
            phase_end(j, &j->ms_decode);
            j->state = J_SAVE_START;
        }
        return true;
    }
    case J_SAVE_START: {
        /* Save the whole history: what was loaded, recomputed and (on D)
         * decoded, partial tail included. */
        st = job_hash(nd, j, j->n);
        if (st == PDX_OK) {
            pdx_kv_request_t req = job_req(j, j->n);
            st = pdx_kv_save(nd->conn, &req, j->blocks);
        }
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "save: %s", pdx_status_string(st));
            return false;
        }
        j->state = J_SAVE;
        j->blocks_busy = true; /* the save worker reads them */
        return true;
    }
    case J_SAVE:
        st = pdx_kv_save_check(nd->conn, j->req);
        if (st == PDX_INPROGRESS) {
            return false;
        }
        j->blocks_busy = false;
        if (st != PDX_OK) {
            job_fail(nd, j, mark, "save to the offload tier: %s",
                     pdx_status_string(st));
            return false;
        }
        phase_end(j, &j->ms_save);
        job_finish(nd, j);
        return true;
    case J_END:
        return false;
    }
    return false;
}

/* ---- driver messages ---- */

static int json_tokens(const cJSON *arr, job_t *j, size_t extra)
{
    if (!cJSON_IsArray(arr)) {
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0) {
        return -1;
    }
    j->cap = n + extra;
    j->tok = calloc(j->cap, sizeof(*j->tok));
    j->ph = calloc(j->cap, sizeof(*j->ph));
    if (j->tok == NULL || j->ph == NULL) {
        return -1;
    }
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0) {
            return -1;
        }
        j->tok[i++] = (uint64_t)e->valuedouble;
    }
    j->n = j->prompt = n;
    return 0;
}

static void bad_request(node_t *nd, const char *op, const char *why)
{
    say("bad %s request: %s", op, why);
    cJSON *r = reply_head(op, false);
    cJSON_AddStringToObject(r, "error", why);
    send_msg(nd, r);
}

static void start_job(node_t *nd, const cJSON *msg, job_kind_t kind)
{
    const char *op = kind == JOB_PREFILL ? "prefill" : "decode";
    const char *req = pd_json_str(msg, "req");
    const char *params = pd_json_str(msg, "params");
    job_t *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        bad_request(nd, op, "out of memory");
        return;
    }
    j->kind = kind;
    j->sid = (int)pd_json_num(msg, "sid", -1);
    j->turn = (int)pd_json_num(msg, "turn", 0);
    double gen = kind == JOB_DECODE ? pd_json_num(msg, "gen", 0) : 0;
    j->gen = gen > 0 && gen < 1e6 ? (uint32_t)gen : 0;
    if (req == NULL || strlen(req) == 0 || strlen(req) >= sizeof(j->req) ||
        json_tokens(cJSON_GetObjectItemCaseSensitive(msg, "tokens"), j,
                    j->gen) != 0) {
        job_free(nd, j);
        bad_request(nd, op, "needs req and a non-empty token list");
        return;
    }
    snprintf(j->req, sizeof(j->req), "%s", req);
    const char *abort_at = pd_json_str(msg, "abort");
    if (abort_at != NULL) {
        if (strcmp(abort_at, "reject") == 0) {
            j->abort_at = ABORT_REJECT;
        } else if (strcmp(abort_at, "load") == 0) {
            j->abort_at = ABORT_LOAD;
        } else {
            job_free(nd, j);
            bad_request(nd, op, "abort must be \"reject\" or \"load\"");
            return;
        }
        double polls = pd_json_num(msg, "abort_polls", 0);
        j->abort_polls = polls > 0 && polls < 1e6 ? (uint32_t)polls : 0;
    }
    if (params != NULL && (j->params = strdup(params)) == NULL) {
        job_free(nd, j);
        bad_request(nd, op, "out of memory");
        return;
    }
    j->hashes = calloc(j->cap / nd->B + 2, sizeof(*j->hashes));
    if (j->hashes == NULL) {
        job_free(nd, j);
        bad_request(nd, op, "out of memory");
        return;
    }
    pd_prefix_hashes(j->tok, 0, j->n, j->ph);
    j->t0 = j->t_phase = pd_now_ms();
    j->deadline = j->t0 + nd->job_timeout_ms;
    j->state = J_ALLOC;
    if (nd->jobs_tail) {
        nd->jobs_tail->next = j;
    } else {
        nd->jobs = j;
    }
    nd->jobs_tail = j;
}

static cJSON *stats_json(node_t *nd)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "agent", nd->cfg.agent_name);
    cJSON_AddNumberToObject(s, "held", (double)pdx_kv_held_requests(nd->conn));
    cJSON_AddNumberToObject(s, "free_blocks", (double)nd->nfree);
    cJSON_AddNumberToObject(s, "num_blocks", nd->cfg.num_blocks);
    cJSON_AddNumberToObject(s, "peak_blocks", (double)nd->peak_used);
    cJSON_AddNumberToObject(s, "jobs_ok", (double)nd->jobs_ok);
    cJSON_AddNumberToObject(s, "jobs_failed", (double)nd->jobs_failed);
    cJSON_AddNumberToObject(s, "freed_done", (double)nd->freed[0]);
    cJSON_AddNumberToObject(s, "freed_reject", (double)nd->freed[1]);
    cJSON_AddNumberToObject(s, "freed_expired", (double)nd->freed[2]);
    cJSON *ab = cJSON_AddObjectToObject(s, "aborted");
    for (int k = 0; k < ABORTED_KINDS; k++) {
        cJSON_AddNumberToObject(ab, g_abort_names[k], (double)nd->aborted[k]);
    }
    cJSON_AddNumberToObject(s, "rejects_sent", (double)nd->rejects_sent);
    cJSON_AddNumberToObject(s, "abort_call_ms_max", nd->abort_call_ms_max);
    cJSON_AddNumberToObject(s, "abort_final_ms_max", nd->abort_final_ms_max);
    cJSON_AddNumberToObject(s, "abort_completed", (double)nd->abort_completed);
    cJSON_AddNumberToObject(s, "abort_stuck", (double)nd->abort_stuck);
    cJSON_AddNumberToObject(s, "canary_blocks", (double)nd->canary_blocks);
    cJSON_AddNumberToObject(s, "late_bytes", (double)nd->late_bytes);
    size_t nq = 0;
    for (const quarantine_t *q = nd->quarantine; q != NULL; q = q->next) {
        nq++;
    }
    cJSON_AddNumberToObject(s, "quarantined", (double)nq);
    pdx_offload_stats_t os;
    if (pdx_kv_offload_stats(nd->conn, &os) == PDX_OK) {
        cJSON *o = cJSON_AddObjectToObject(s, "offload");
        cJSON_AddNumberToObject(o, "capacity_blocks",
                                (double)os.capacity_blocks);
        cJSON_AddNumberToObject(o, "blocks",
                                (double)(os.blocks[0] + os.blocks[1]));
        cJSON_AddNumberToObject(o, "leased_blocks", (double)os.leased_blocks);
        cJSON_AddNumberToObject(o, "saves", (double)os.saves);
        cJSON_AddNumberToObject(o, "dup_saves", (double)os.dup_saves);
        cJSON_AddNumberToObject(o, "hits", (double)os.hits);
        cJSON_AddNumberToObject(o, "misses", (double)os.misses);
        cJSON_AddNumberToObject(o, "evictions",
                                (double)(os.evictions[0] + os.evictions[1]));
        cJSON_AddNumberToObject(o, "no_space", (double)os.no_space);
        cJSON_AddNumberToObject(o, "bytes_saved", (double)os.bytes_saved);
        cJSON_AddNumberToObject(o, "bytes_loaded", (double)os.bytes_loaded);
    }
    /* The agent's peers and their paths (pdx-validate --multi-node shows
     * the cross-host path), and what the store section did. */
    char *aj = NULL;
    if (pdx_stats_json(pdx_kv_connector_agent(nd->conn), &aj) == PDX_OK) {
        cJSON_AddItemToObject(s, "agent_stats", cJSON_Parse(aj));
        pdx_blob_free(aj);
    }
    pdx_kv_store_stats_t ks;
    if (nd->cfg.has_store && pdx_kv_store_stats(nd->conn, &ks) == PDX_OK) {
        cJSON *k = cJSON_AddObjectToObject(s, "store");
        cJSON_AddNumberToObject(k, "discovered", (double)ks.discovered);
        cJSON_AddNumberToObject(k, "registered_blocks",
                                (double)ks.registered_blocks);
        cJSON_AddNumberToObject(k, "demoted", (double)ks.demoted);
        cJSON_AddNumberToObject(k, "remote_hits", (double)ks.remote_hits);
        cJSON_AddNumberToObject(k, "remote_hit_blocks",
                                (double)ks.remote_hit_blocks);
        cJSON_AddNumberToObject(k, "remote_served", (double)ks.remote_served);
        char line[512];
        pdx_store_describe(pdx_kv_connector_agent(nd->conn), line,
                           sizeof(line));
        cJSON_AddStringToObject(k, "describe", line);
    }
    return s;
}

static void finish_drain(node_t *nd, bool ok)
{
    cJSON *r = reply_head("drain", ok);
    if (!ok) {
        cJSON_AddStringToObject(r, "error",
                                "requests still held or running at the "
                                "drain deadline");
    }
    cJSON_AddItemToObject(r, "stats", stats_json(nd));
    send_msg(nd, r);
    nd->draining = false;
}

/* Connect to the peer's blob; a refusal ends the node (exit 3) after the
 * reply naming the field has gone out. */
static void handle_connect(node_t *nd, const cJSON *msg)
{
    const char *hex = pd_json_str(msg, "blob");
    size_t len = 0;
    void *blob = hex ? pd_hex_decode(hex, &len) : NULL;
    if (blob == NULL) {
        bad_request(nd, "connect", "blob missing or not hex");
        return;
    }
    char peer[PDX_NAME_MAX] = "";
    uint64_t mark = log_mark();
    pdx_status_t st = pdx_kv_connector_connect(nd->conn, blob, len, peer);
    free(blob);
    cJSON *r = reply_head("connect", st == PDX_OK);
    if (st == PDX_OK) {
        say("connected to %s", peer);
        cJSON_AddStringToObject(r, "peer", peer);
        send_msg(nd, r);
        return;
    }
    char lines[1024], err[1400];
    log_since(mark, lines, sizeof(lines));
    snprintf(err, sizeof(err), "%s: %s", pdx_status_string(st),
             lines[0] ? lines : "(no pdx error line)");
    say("connect refused: %s", err);
    cJSON_AddStringToObject(r, "error", err);
    cJSON_AddStringToObject(r, "status", pdx_status_string(st));
    send_msg(nd, r);
    nd->refused = true;
    nd->quit = true;
}

static void handle_msg(node_t *nd, cJSON *msg)
{
    const char *op = pd_json_str(msg, "op");
    if (op == NULL) {
        bad_request(nd, "?", "message without op");
    } else if (strcmp(op, "connect") == 0) {
        handle_connect(nd, msg);
    } else if (strcmp(op, "prefill") == 0) {
        start_job(nd, msg, JOB_PREFILL);
    } else if (strcmp(op, "decode") == 0) {
        start_job(nd, msg, JOB_DECODE);
    } else if (strcmp(op, "reject") == 0) {
        const char *params = pd_json_str(msg, "params");
        uint64_t mark = log_mark();
        pdx_status_t st =
            params ? pdx_kv_reject(nd->conn, params) : PDX_ERR_INVALID;
        cJSON *r = reply_head("reject", st == PDX_OK);
        cJSON_AddNumberToObject(r, "sid", pd_json_num(msg, "sid", -1));
        if (st != PDX_OK) {
            char lines[1024], err[1200];
            log_since(mark, lines, sizeof(lines));
            snprintf(err, sizeof(err), "reject: %s %s", pdx_status_string(st),
                     lines);
            cJSON_AddStringToObject(r, "error", err);
        }
        send_msg(nd, r);
    } else if (strcmp(op, "drain") == 0) {
        nd->draining = true;
        nd->drain_deadline =
            pd_now_ms() + pd_json_num(msg, "timeout_ms", 10000);
    } else if (strcmp(op, "stats") == 0) {
        cJSON *r = reply_head("stats", true);
        cJSON_AddItemToObject(r, "stats", stats_json(nd));
        send_msg(nd, r);
    } else if (strcmp(op, "quit") == 0) {
        nd->quit = true;
    } else {
        bad_request(nd, op, "unknown op");
    }
}

static void on_freed(void *arg, const char *req_id, pdx_kv_free_reason_t why)
{
    node_t *nd = arg;
    if ((unsigned)why < 3) {
        nd->freed[why]++;
    }
    if (why == PDX_KV_FREED_EXPIRED) {
        say("%s: held blocks freed by lease expiry (the peer never read "
            "them)",
            req_id);
    }
    for (held_blocks_t **pp = &nd->held; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->req, req_id) == 0) {
            held_blocks_t *h = *pp;
            *pp = h->next;
            blocks_put(nd, h->blocks, h->n);
            free(h->blocks);
            free(h);
            return;
        }
    }
}

/* ---- main loop ---- */

static void run(node_t *nd)
{
    while (!nd->quit) {
        pdx_kv_progress(nd->conn);
        pdx_kv_poll_freed(nd->conn, on_freed, nd);

        bool busy = false, alloc_blocked = false;
        for (job_t *j = nd->jobs; j != NULL; j = j->next) {
            busy |= job_step(nd, j, &alloc_blocked);
        }
        quarantine_step(nd);
        /* Drop finished jobs. */
        job_t *prev = NULL;
        for (job_t *j = nd->jobs; j != NULL;) {
            job_t *next = j->next;
            if (j->state == J_END) {
                if (prev) {
                    prev->next = next;
                } else {
                    nd->jobs = next;
                }
                if (nd->jobs_tail == j) {
                    nd->jobs_tail = prev;
                }
                job_free(nd, j);
            } else {
                prev = j;
            }
            j = next;
        }
        if (nd->draining) {
            if (nd->jobs == NULL && pdx_kv_held_requests(nd->conn) == 0 &&
                nd->held == NULL && nd->quarantine == NULL) {
                finish_drain(nd, true);
            } else if (pd_now_ms() > nd->drain_deadline) {
                finish_drain(nd, false);
            }
        }

        struct pollfd pfd = {.fd = nd->chan.fd, .events = POLLIN};
        if (pd_chan_pending(&nd->chan)) {
            pfd.events |= POLLOUT;
        }
        int timeout = busy ? 0
                      : (nd->jobs || nd->held || nd->quarantine || nd->draining)
                          ? 1
                          : 5;
        int rc = poll(&pfd, 1, timeout);
        if (rc < 0 && errno != EINTR) {
            say("poll: %s", strerror(errno));
            break;
        }
        if (rc > 0 && (pfd.revents & POLLOUT) && pd_chan_flush(&nd->chan)) {
            say("driver channel write: %s", strerror(nd->chan.error));
            break;
        }
        if (rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
            if (pd_chan_fill(&nd->chan) != 0) {
                say("driver channel read: %s", strerror(nd->chan.error));
                break;
            }
            cJSON *msg;
            while (!nd->quit && (msg = pd_chan_next(&nd->chan)) != NULL) {
                handle_msg(nd, msg);
                cJSON_Delete(msg);
            }
            if (nd->chan.error) {
                say("driver channel: bad frame");
                break;
            }
            if (nd->chan.eof) {
                say("driver went away");
                break;
            }
        }
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: glm52-pd-node --config FILE --fd N [--job-timeout S]\n"
            "  One P or D node of the GLM-5.2 P/D example (role from the\n"
            "  config), driven over fd N by pdx-validate.\n");
}

static int hello_error(node_t *nd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int hello_error(node_t *nd, const char *fmt, ...)
{
    char buf[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    say("%s", buf);
    cJSON *r = reply_head("hello", false);
    cJSON_AddStringToObject(r, "error", buf);
    send_msg(nd, r);
    pd_chan_drain(&nd->chan, pd_now_ms() + 2000);
    return 2;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"fd", required_argument, NULL, 'f'},
        {"job-timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *config = NULL;
    int fd = -1;
    double job_timeout_s = 120;
    int c;
    while ((c = getopt_long(argc, argv, "c:f:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'f':
            fd = atoi(optarg);
            break;
        case 't':
            job_timeout_s = atof(optarg);
            break;
        default:
            usage();
            return c == 'h' ? 0 : 2;
        }
    }
    if (config == NULL || fd < 0) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    pdx_log_set_handler(log_sink, NULL);

    static node_t node;
    node_t *nd = &node;
    nd->job_timeout_ms = job_timeout_s * 1000;
    if (pd_chan_init(&nd->chan, fd) != 0) {
        say("fd %d: %s", fd, strerror(nd->chan.error));
        return 2;
    }

    char err[1024] = "";
    pdx_status_t st = pdx_kv_config_load(config, &nd->cfg, err, sizeof(err));
    if (st != PDX_OK) {
        return hello_error(nd, "config: %s: %s", pdx_status_string(st), err);
    }
    snprintf(g_log.tag, sizeof(g_log.tag), "%s",
             nd->cfg.role == PDX_KV_ROLE_PRODUCER   ? "P"
             : nd->cfg.role == PDX_KV_ROLE_CONSUMER ? "D"
                                                    : "PD");
    if (nd->cfg.mem_type == PDX_MEM_VRAM) {
        /* TODO: GPU arenas (cudaMalloc per arena, registered for cuda_ipc)
         * once this example runs where a GPU is present. */
        say("vram arenas need the cuda_ipc backend and a GPU; this example "
            "uses dram arenas instead");
    }
    int reference = 0;
    st = pd_layout_from_config(&nd->cfg, PDX_MEM_DRAM, &nd->layout, &reference,
                               err, sizeof(err));
    if (st != PDX_OK) {
        return hello_error(nd, "layout: %s", err);
    }
    uint64_t size = pdx_layout_carve_size(nd->layout, ARENA_ALIGN);
    if (size == UINT64_MAX || size > SIZE_MAX) {
        return hello_error(nd, "layout too large to carve");
    }
    nd->mem_len = (size_t)size;
    /* Populated up front, as an engine allocates its KV pool at start:
     * first-touch faults inside the step loop cost far more (28 us each
     * on the VM this was measured on, 0.7 us each with MAP_POPULATE).
     * Shared memory (pdx_mem_alloc): a peer on this host with the cma
     * backend maps it and copies with memcpy; elsewhere it is plain
     * memory. */
    void *mem = NULL;
    st = pdx_mem_alloc(nd->mem_len, PDX_MEM_F_POPULATE, &mem);
    if (st != PDX_OK) {
        return hello_error(nd, "arenas: pdx_mem_alloc of %zu bytes: %s",
                           nd->mem_len, pdx_status_string(st));
    }
    nd->mem = mem;
    st = pdx_layout_carve(nd->layout, (uint64_t)(uintptr_t)nd->mem, size,
                          ARENA_ALIGN, 0);
    if (st != PDX_OK || pd_model_init(&nd->model, nd->layout) != 0) {
        return hello_error(nd, "carve: %s", pdx_status_string(st));
    }
    nd->B = nd->model.block_tokens;
    nd->free_ids = calloc(nd->cfg.num_blocks, sizeof(*nd->free_ids));
    if (nd->free_ids == NULL) {
        return hello_error(nd, "out of memory");
    }
    for (uint32_t i = 0; i < nd->cfg.num_blocks; i++) {
        nd->free_ids[nd->nfree++] = nd->cfg.num_blocks - 1 - i;
    }

    uint64_t mark = log_mark();
    pdx_kv_connector_params_t cp = {.field_mask = PDX_KV_PARAM_CONFIG |
                                                  PDX_KV_PARAM_LAYOUT,
                                    .config = &nd->cfg,
                                    .layout = nd->layout};
    st = pdx_kv_connector_create(&cp, &nd->conn);
    if (st != PDX_OK) {
        char lines[1024];
        log_since(mark, lines, sizeof(lines));
        return hello_error(nd, "connector: %s: %s", pdx_status_string(st),
                           lines);
    }
    nd->hasher = pdx_kv_connector_hasher(nd->conn);
    void *blob = NULL;
    size_t blob_len = 0;
    st = pdx_kv_connector_describe(nd->conn, &blob, &blob_len);
    char *hex = st == PDX_OK ? pd_hex_encode(blob, blob_len) : NULL;
    if (blob) {
        pdx_blob_free(blob);
    }
    if (hex == NULL) {
        pdx_kv_connector_destroy(nd->conn);
        return hello_error(nd, "describe: %s", pdx_status_string(st));
    }
    cJSON *h = reply_head("hello", true);
    cJSON_AddStringToObject(h, "agent", nd->cfg.agent_name);
    cJSON_AddStringToObject(h, "role", role_name(nd->cfg.role));
    cJSON_AddStringToObject(h, "blob", hex);
    free(hex);
    cJSON_AddNumberToObject(h, "num_blocks", nd->cfg.num_blocks);
    cJSON_AddNumberToObject(h, "block_tokens", nd->B);
    cJSON_AddNumberToObject(h, "bytes_per_block",
                            (double)nd->model.bytes_per_block);
    cJSON_AddNumberToObject(h, "arenas", (double)nd->model.narenas);
    cJSON_AddBoolToObject(h, "reference_layout", reference);
    char fp[24];
    snprintf(fp, sizeof(fp), "%016" PRIx64, pdx_layout_fingerprint(nd->layout));
    cJSON_AddStringToObject(h, "layout_fingerprint", fp);
    cJSON_AddNumberToObject(h, "arena_bytes", (double)size);
    /* What the driver needs to size sessions and to know which reuse must
     * happen: the pool's capacity and the children's tail settings. */
    pdx_offload_stats_t os;
    cJSON_AddNumberToObject(h, "pool_blocks",
                            pdx_kv_offload_stats(nd->conn, &os) == PDX_OK
                                ? (double)os.capacity_blocks
                                : 0);
    for (uint32_t i = 0; i < nd->cfg.nchildren; i++) {
        const pdx_kv_child_config_t *ch = &nd->cfg.children[i];
        if (ch->type == PDX_KV_CHILD_REMOTE) {
            cJSON_AddBoolToObject(h, "load_tail", ch->load_tail);
            cJSON_AddNumberToObject(h, "lease_ms", ch->lease_ms);
        } else {
            cJSON_AddBoolToObject(h, "save_tail", ch->save_tail);
            cJSON_AddStringToObject(
                h, "offload_mode",
                ch->mode == PDX_KV_OFFLOAD_SAVE_ONLY   ? "save_only"
                : ch->mode == PDX_KV_OFFLOAD_LOAD_ONLY ? "load_only"
                                                       : "read_write");
        }
    }
    send_msg(nd, h);
    say("%s (%s): %zu arenas, %u blocks of %" PRIu64 " B (%.1f GiB DRAM), "
        "layout %s",
        nd->cfg.agent_name, role_name(nd->cfg.role), nd->model.narenas,
        nd->cfg.num_blocks, nd->model.bytes_per_block,
        (double)size / (1u << 30), fp);

    run(nd);
    pd_chan_drain(&nd->chan, pd_now_ms() + 2000);
    int rc = nd->refused ? 3 : nd->chan.eof || nd->chan.error ? 1 : 0;
    pdx_kv_connector_destroy(nd->conn);
    pd_model_fini(&nd->model);
    pdx_layout_destroy(nd->layout);
    pdx_mem_free(nd->mem);
    while (nd->jobs) {
        job_t *j = nd->jobs;
        nd->jobs = j->next;
        job_free(nd, j);
    }
    while (nd->quarantine) {
        quarantine_t *q = nd->quarantine;
        nd->quarantine = q->next;
        free(q->blocks);
        free(q);
    }
    while (nd->held) {
        held_blocks_t *hb = nd->held;
        nd->held = hb->next;
        free(hb->blocks);
        free(hb);
    }
    free(nd->free_ids);
    pd_chan_close(&nd->chan);
    return rc;
}
