/* pdx_stats_json: the agent, its backends, peers, requests and store as
 * JSON (pdx-info --stats reads it through the stats socket). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "discovery_int.h"
#include "path_int.h"
#include "peer_int.h"
#include "stats_int.h"
#include "xfer_int.h"

/* JSON string of `s` (names, host ids and reasons: printable ASCII). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

/* The peer's cost classes (path.c): which of two paths carries each, and
 * what each measured. */
static void json_costs(FILE *f, pdx_agent_h agent, const pdx_peer_t *p)
{
    fputs(", \"path_costs\": [", f);
    bool first = true;
    for (int i = 0; p->cost != NULL && i < PDX_PATH_CLASSES; i++) {
        const pdx_path_class_t *c = &p->cost->c[i];
        if (c->key == 0) {
            continue;
        }
        char why[PDX_WHY_MAX];
        pdx_path_cost_why(agent, p, i, c->key, why, sizeof(why));
        fputs(first ? "{\"choice\": " : ", {\"choice\": ", f);
        first = false;
        json_str(f, why);
        fprintf(f, ", \"posts\": %llu, \"switches\": %u}",
                (unsigned long long)c->posts, c->switches);
    }
    fputc(']', f);
}

static void json_stats(FILE *f, const pdx_stats_t *s)
{
    fprintf(f,
            "\"requests\": %llu, \"completed\": %llu, \"errors\": %llu, "
            "\"canceled\": %llu, \"timeouts\": %llu, \"bytes\": %llu, "
            "\"fallbacks\": %llu, \"refused\": %llu, \"dead_events\": %llu, "
            "\"notifs_sent\": %llu, \"notifs_recv\": %llu",
            (unsigned long long)s->requests, (unsigned long long)s->completed,
            (unsigned long long)s->errors, (unsigned long long)s->canceled,
            (unsigned long long)s->timeouts, (unsigned long long)s->bytes,
            (unsigned long long)s->fallbacks, (unsigned long long)s->refused,
            (unsigned long long)s->dead_events,
            (unsigned long long)s->notifs_sent,
            (unsigned long long)s->notifs_recv);
}

/* The agent's store (discovery.c's snapshot) as the "store" member. */
static void json_store(FILE *f, const pdx_store_snapshot_t *sn)
{
    const pdx_store_status_t *s = &sn->status;
    char since[32] = "";
    if (!s->reachable && s->unreachable_since_ns != 0) {
        time_t t = (time_t)(s->unreachable_since_ns / 1000000000ull);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    char state[512];
    if (s->reachable) {
        snprintf(state, sizeof(state), "reachable");
    } else {
        snprintf(state, sizeof(state), "unreachable since %s (%.1f s): %s",
                 since[0] ? since : "start",
                 (double)s->unreachable_ms / 1000.0,
                 s->last_error[0] ? s->last_error : "no answer yet");
    }
    char lease[24];
    snprintf(lease, sizeof(lease), "%llx", (unsigned long long)s->lease);
    fputs(", \"store\": {\"module\": ", f);
    json_str(f, sn->module);
    fputs(", \"endpoints\": ", f);
    json_str(f, sn->endpoints);
    fputs(", \"endpoint\": ", f);
    json_str(f, s->endpoint);
    fputs(", \"namespace\": ", f);
    json_str(f, sn->ns);
    fputs(", \"state\": ", f);
    json_str(f, state);
    fprintf(f, ", \"reachable\": %s, \"unreachable_since\": ",
            s->reachable ? "true" : "false");
    if (since[0]) {
        json_str(f, since);
    } else {
        fputs("null", f);
    }
    fprintf(f, ", \"unreachable_ms\": %llu, \"last_error\": ",
            (unsigned long long)s->unreachable_ms);
    json_str(f, s->last_error);
    /* The lease id in hex, as the logs and pdx_store_describe write it. */
    fputs(", \"lease\": ", f);
    json_str(f, lease);
    fprintf(f,
            ", \"lease_ttl_s\": %u, \"leases_granted\": %llu, "
            "\"revision\": %lld, \"requests\": %llu, \"failures\": %llu, "
            "\"leased_keys\": %u, \"unpublished\": %u, \"watches\": %u, "
            "\"watches_down\": %u, \"publishing\": %s, "
            "\"published_generation\": ",
            s->lease_ttl_s, (unsigned long long)s->leases_granted,
            (long long)s->revision, (unsigned long long)s->requests,
            (unsigned long long)s->failures, s->leased_keys, s->unpublished,
            s->watches, s->watches_down, sn->publishing ? "true" : "false");
    if (sn->published) {
        fprintf(f, "%u", sn->published_generation);
    } else {
        fputs("null", f);
    }
    fprintf(f,
            ", \"agents_known\": %u, \"peer_reloads\": %llu, "
            "\"peer_deaths\": %llu, \"registry\": {\"add_calls\": %llu, "
            "\"added_blocks\": %llu, \"add_failures\": %llu, "
            "\"del_calls\": %llu, \"deleted_blocks\": %llu, "
            "\"del_failures\": %llu, \"get_calls\": %llu, "
            "\"looked_up_blocks\": %llu, \"get_failures\": %llu}}",
            sn->agents_known, (unsigned long long)sn->reloads,
            (unsigned long long)sn->deaths,
            (unsigned long long)sn->owners_add_calls,
            (unsigned long long)sn->owners_add_blocks,
            (unsigned long long)sn->owners_add_failures,
            (unsigned long long)sn->owners_del_calls,
            (unsigned long long)sn->owners_del_blocks,
            (unsigned long long)sn->owners_del_failures,
            (unsigned long long)sn->owners_get_calls,
            (unsigned long long)sn->owners_get_blocks,
            (unsigned long long)sn->owners_get_failures);
}

pdx_status_t pdxi_stats_json(pdx_agent_h agent, char **json_p)
{
    pdx_store_snapshot_t store;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) {
        pdx_error("agent %s: stats: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    pdx_agent_lock(agent);
    fputs("{\"agent\": ", f);
    json_str(f, agent->name);
    fprintf(f, ", \"pid\": %d, \"generation\": %u, \"host\": ", (int)getpid(),
            agent->generation);
    json_str(f, agent->host_id);
    fprintf(f, ", \"path_policy\": \"%s\", \"path_backend\": ",
            agent->params.path_policy == PDX_PATH_POLICY_SAME_HOST_FAST
                ? "same_host_fast"
                : "any");
    json_str(f, agent->path_backend);
    fputs(", \"backends\": [", f);
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        struct pdx_backend *be = agent->backends[b];
        char desc[256] = "";
        be->ops->describe(be->be, desc, sizeof(desc));
        fputs(b ? ", {\"name\": " : "{\"name\": ", f);
        json_str(f, be->name);
        fputs(", \"describe\": ", f);
        json_str(f, desc);
        fputs(", ", f);
        json_stats(f, &be->stats);
        fputc('}', f);
    }
    fputs("], \"peers\": [", f);
    bool first = true;
    for (pdx_stats_entry_t *e = agent->peer_stats; e != NULL; e = e->next) {
        pdx_peer_t *p = pdx_peer_find(agent, e->name);
        fputs(first ? "{\"name\": " : ", {\"name\": ", f);
        first = false;
        json_str(f, e->name);
        fprintf(f, ", \"state\": \"%s\"",
                p == NULL            ? "unloaded"
                : p->dead == PDX_OK ? "alive"
                                     : "dead");
        if (p != NULL) {
            fprintf(f, ", \"generation\": %u, \"pid\": %d, \"same_host\": %s",
                    p->generation, (int)p->pid,
                    p->same_host ? "true" : "false");
            if (p->dead != PDX_OK) {
                fputs(", \"dead_how\": ", f);
                json_str(f, p->dead_how);
            }
            fputs(", \"paths\": {", f);
            bool pf = true;
            for (uint32_t b = 0; b < agent->nbackends; b++) {
                if (p->bpeer[b] == NULL) {
                    continue;
                }
                fputs(pf ? "" : ", ", f);
                pf = false;
                pdx_path_transport(agent, p, b);
                json_str(f, agent->backends[b]->name);
                fputs(": {\"transport\": ", f);
                json_str(f, p->transport[b]);
                fputs(", \"fallback_why\": ", f);
                json_str(f, p->slow_why[b]);
                fputc('}', f);
            }
            fputs("}, \"dram_fallback_why\": ", f);
            json_str(f, p->dram_why);
            fputs(", \"vram_fallback_why\": ", f);
            json_str(f, p->vram_why);
            json_costs(f, agent, p);
        }
        fputs(", ", f);
        json_stats(f, &e->s);
        fputc('}', f);
    }
    fputc(']', f);
    if (pdx_store_agent_snapshot(agent, &store)) {
        json_store(f, &store);
    }
    fputs("}\n", f);
    pthread_mutex_unlock(&agent->lock);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        pdx_error("agent %s: stats: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    *json_p = text;
    return PDX_OK;
}
