/* pdx-validate's report: aggregates per turn and over the run, the soak
 * summary, and the JSON document or the text table. */
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

void agg_add(agg_t *a, const turn_rec_t *r)
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
    a->load_ms += pd_json_num(r->p_phases, "load", 0) +
                  pd_json_num(r->d_phases, "load", 0);
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

/* Which path moved the bytes (each node's agent: bytes and requests per
 * backend, the transport to its peer) and how fast (bytes loaded over the
 * time of the nodes' load phases). */
static void print_paths_and_speed(const run_t *run)
{
    const agg_t *t = &run->tot;
    if (t->load_ms > 0) {
        printf("  speed: %.1f MiB loaded in %.1f ms of load phases (P and "
               "D): %.2f GB/s\n",
               (double)t->bytes / 1048576.0, t->load_ms,
               (double)t->bytes / (t->load_ms * 1e6));
    }
    node_t *ns[2] = {&g_p, &g_d};
    for (int i = 0; i < 2; i++) {
        const cJSON *as =
            cJSON_GetObjectItemCaseSensitive(ns[i]->stats, "agent_stats");
        const cJSON *b;
        printf("  path %s %s:", ns[i]->tag, ns[i]->agent);
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(as, "backends"))
        {
            printf(" %s %.1f MiB in %zu requests;",
                   pd_json_str(b, "name") ? pd_json_str(b, "name") : "?",
                   pd_json_num(b, "bytes", 0) / 1048576.0, jnum(b, "requests"));
        }
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(as, "peers"))
        {
            const cJSON *paths = cJSON_GetObjectItemCaseSensitive(p, "paths");
            const cJSON *pb;
            printf(" to %s:", pd_json_str(p, "name") ? pd_json_str(p, "name")
                                                     : "?");
            cJSON_ArrayForEach(pb, paths)
            {
                const char *tr = pd_json_str(pb, "transport");
                printf(" %s %s", pb->string, tr && *tr ? tr : "-");
            }
        }
        printf("\n");
    }
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

cJSON *soak_summary(run_t *run, bool pass)
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

void report_json(run_t *run, bool pass, cJSON *soak)
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

void report_text(run_t *run, bool pass, const cJSON *soak)
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
    printf("  (handoffs freed: done = the peer loaded them and said so; "
           "rejected = handed off and never\n"
           "  read, freed at once: each session's last handoff, which no "
           "later turn needs, or a\n"
           "  cancelled one; expired = the lease ran out)\n");
    print_paths_and_speed(run);
    printf("  P lookup: longest pdx_kv_lookup %.2f ms (a lookup kept "
           "pending by wait_for_full_prefix included)\n",
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
