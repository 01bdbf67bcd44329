/* glm52-pd-node's event loop: connector progress, freed-block reports,
 * the jobs' slices, and the driver's messages (connect, prefill, decode,
 * reject, drain, stats, quit). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"

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
    j->t0 = j->t_phase = pdx_now_ms_f();
    j->deadline = j->t0 + nd->job_timeout_ms;
    j->state = J_ALLOC;
    if (nd->jobs_tail) {
        nd->jobs_tail->next = j;
    } else {
        nd->jobs = j;
    }
    nd->jobs_tail = j;
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
            pdx_now_ms_f() + pd_json_num(msg, "timeout_ms", 10000);
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

void run(node_t *nd)
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
            } else if (pdx_now_ms_f() > nd->drain_deadline) {
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
