/* glm52-pd-node's jobs: each request a small state machine (blocks ->
 * lookup -> load -> verify -> compute/decode -> save -> handoff), one
 * bounded slice of work per turn of the loop, and its cancellations
 * (soak runs): a rejected handoff, an aborted load and its quarantine. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"

void job_free(node_t *nd, job_t *j)
{
    free(j->tok);
    free(j->ph);
    free(j->params);
    free(j->blocks);
    free(j->hashes);
    free(j);
}

const char *job_op(const job_t *j)
{
    return j->kind == JOB_PREFILL ? "prefill" : "decode";
}

void job_fail(node_t *nd, job_t *j, uint64_t mark, const char *fmt, ...)
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
        double t = pdx_now_ms_f();
        if (pdx_kv_load_abort(nd->conn, j->req) == PDX_OK) {
            j->abort_call_ms = pdx_now_ms_f() - t;
            j->abort_t0 = pdx_now_ms_f();
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
    double now = pdx_now_ms_f();
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
    cJSON_AddNumberToObject(ms, "total", pdx_now_ms_f() - j->t0);
    send_msg(nd, r);
    j->state = J_END;
    nd->jobs_ok++;
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
    double final_ms = how == ABORTED_LOAD ? pdx_now_ms_f() - j->abort_t0 : 0;
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
        if (gpu_push(nd, j->blocks, ncanary) != 0) {
            free(q);
            job_fail(nd, j, mark, "canary: copy to the GPU failed");
            return;
        }
        snprintf(q->req, sizeof(q->req), "%s", j->req);
        q->blocks = j->blocks;
        q->n = j->nblocks;
        q->ncanary = ncanary;
        q->release_at = pdx_now_ms_f() + QUARANTINE_MS;
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
    cJSON_AddNumberToObject(ms, "total", pdx_now_ms_f() - j->t0);
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
    double t = pdx_now_ms_f();
    pdx_status_t st = pdx_kv_load_abort(nd->conn, j->req);
    j->abort_call_ms = pdx_now_ms_f() - t;
    if (j->abort_call_ms > nd->abort_call_ms_max) {
        nd->abort_call_ms_max = j->abort_call_ms;
    }
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "load_abort: %s", pdx_status_string(st));
        return;
    }
    j->abort_t0 = pdx_now_ms_f();
    j->abort_deadline = j->abort_t0 + ABORT_DEADLINE_MS;
    j->state = J_ABORTING; /* blocks_busy stays true */
}

/* J_ABORTING: poll pdx_kv_load_check until the final state. */
static bool job_aborting(node_t *nd, job_t *j, uint64_t mark)
{
    size_t tokens = 0;
    pdx_status_t st = pdx_kv_load_check(nd->conn, j->req, &tokens);
    double now = pdx_now_ms_f();
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

/* J_ALLOC: the job's blocks (`alloc_blocked` keeps allocation FIFO: once
 * a job waits for blocks, later ones wait behind it) and its prompt's
 * hashes. true when it may go on to the lookup. */
static bool job_alloc(node_t *nd, job_t *j, uint64_t mark, bool *alloc_blocked)
{
    uint32_t B = nd->B;
    if (*alloc_blocked) {
        return false;
    }
    size_t need = (j->prompt + j->gen + B - 1) / B;
    if (need > nd->cfg.num_blocks) {
        job_fail(nd, j, mark, "needs %zu blocks, the node has %u (num_blocks)",
                 need, nd->cfg.num_blocks);
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
    pdx_status_t st = job_hash(nd, j, j->prompt);
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "hash: %s", pdx_status_string(st));
        return false;
    }
    j->state = J_LOOKUP;
    return true;
}

/* J_LOOKUP: what the connector has of the prompt; its load posted, or the
 * prompt computed when nothing matched (or the handoff rejected). */
static bool job_lookup(node_t *nd, job_t *j, uint64_t mark)
{
    pdx_kv_request_t req = job_req(j, j->prompt);
    pdx_status_t st = pdx_kv_lookup(nd->conn, &req, &j->match);
    if (st == PDX_INPROGRESS) {
        return false; /* part of the prefix still being saved */
    }
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "lookup: %s", pdx_status_string(st));
        return false;
    }
    phase_end(j, &j->ms_lookup);
    if (j->abort_at == ABORT_REJECT ||
        (j->abort_at == ABORT_LOAD && j->match.blocks == 0 && !j->match.tail)) {
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

/* J_LOAD: the load polled (or aborted in flight, as the driver asked);
 * once done, the loaded tokens verified, or the prompt recomputed when
 * the load failed. */
static bool job_load(node_t *nd, job_t *j, uint64_t mark)
{
    if (j->abort_at == ABORT_LOAD && j->polls >= j->abort_polls &&
        j->match.source == PDX_KV_SOURCE_REMOTE) {
        job_abort(nd, j, ABORTED_LOAD);
        return true;
    }
    size_t tokens = 0;
    pdx_status_t st = pdx_kv_load_check(nd->conn, j->req, &tokens);
    if (st == PDX_INPROGRESS) {
        j->polls++;
        return false;
    }
    j->blocks_busy = false; /* final either way */
    if (st != PDX_OK) {
        job_fail(nd, j, mark, "load from %s: %s", source_name(j->match.source),
                 pdx_status_string(st));
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
    /* GPU arenas: the loaded blocks to the mirror the checks read. */
    if (gpu_pull(nd, j->blocks, j->match.blocks + (j->match.tail ? 1 : 0)) !=
        0) {
        job_fail(nd, j, mark, "loaded blocks: copy from the GPU failed");
        return false;
    }
    j->state = J_VERIFY;
    j->cursor = 0;
    j->vend = j->match.blocks * nd->B + (j->match.tail ? j->tail_tokens : 0);
    return true;
}

/* J_VERIFY: a slice of the loaded tokens compared with recomputation. */
static bool job_verify(node_t *nd, job_t *j)
{
    uint32_t B = nd->B;
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

/* J_COMPUTE: a slice of the prompt's KV written by the stand-in. */
static bool job_compute(node_t *nd, job_t *j)
{
    uint32_t B = nd->B;
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

/* J_DECODE: each step samples the next token from the prefix so far, then
 * writes its KV into the request's current block, moving on to the next
 * reserved block when one fills up. */
static bool job_decode(node_t *nd, job_t *j)
{
    uint32_t B = nd->B;
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

/* J_SAVE_START: the whole history saved: what was loaded, recomputed and
 * (on D) decoded, partial tail included. */
static bool job_save_start(node_t *nd, job_t *j, uint64_t mark)
{
    /* GPU arenas: what the stand-in wrote to the GPU before pdx sees it
     * (the save reads the arenas, a handoff lets the peer read them). */
    if (gpu_push(nd, j->blocks, (j->n + nd->B - 1) / nd->B) != 0) {
        job_fail(nd, j, mark, "KV: copy to the GPU failed");
        return false;
    }
    pdx_status_t st = job_hash(nd, j, j->n);
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

/* J_SAVE: the save polled; once done, the job finished (its reply and
 * handoff). */
static bool job_save(node_t *nd, job_t *j, uint64_t mark)
{
    pdx_status_t st = pdx_kv_save_check(nd->conn, j->req);
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
}

/* One bounded slice of a job's work. Returns true when it did CPU work (the
 * loop should not sleep), false when it only waits. `alloc_blocked` keeps
 * allocation FIFO: once a job waits for blocks, later ones wait behind it. */
bool job_step(node_t *nd, job_t *j, bool *alloc_blocked)
{
    uint64_t mark = log_mark();
    if (j->state != J_END && j->state != J_ABORTING &&
        pdx_now_ms_f() > j->deadline) {
        job_fail(nd, j, mark, "timed out after %.0f ms in state %d",
                 nd->job_timeout_ms, (int)j->state);
        return false;
    }
    switch (j->state) {
    case J_ALLOC:
        if (!job_alloc(nd, j, mark, alloc_blocked)) {
            return false;
        }
        /* fall through */
    case J_LOOKUP:
        return job_lookup(nd, j, mark);
    case J_LOAD:
        return job_load(nd, j, mark);
    case J_ABORTING:
        return job_aborting(nd, j, mark);
    case J_VERIFY:
        return job_verify(nd, j);
    case J_COMPUTE:
        return job_compute(nd, j);
    case J_DECODE:
        return job_decode(nd, j);
    case J_SAVE_START:
        return job_save_start(nd, j, mark);
    case J_SAVE:
        return job_save(nd, j, mark);
    case J_END:
        return false;
    }
    return false;
}
