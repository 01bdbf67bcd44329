/* Counters per backend and per peer, and their JSON dump (pdx_stats_*). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_int.h"
#include "api_int.h"

pdx_stats_entry_t *pdx_peer_stats_get(pdx_agent_h agent, const char *name)
{
    for (pdx_stats_entry_t *e = agent->peer_stats; e != NULL; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            return e;
        }
    }
    pdx_stats_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return NULL;
    }
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->next = agent->peer_stats;
    agent->peer_stats = e;
    return e;
}

pdx_status_t pdxi_stats_backend(pdx_agent_h agent, const char *backend,
                                pdx_stats_t *stats_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    pthread_mutex_lock(&agent->lock);
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (strcmp(agent->backends[b]->name, backend) == 0) {
            *stats_p = agent->backends[b]->stats;
            st = PDX_OK;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        pdx_error("agent %s: stats: no backend %s", agent->name, backend);
    }
    return st;
}

pdx_status_t pdxi_stats_peer(pdx_agent_h agent, const char *peer,
                             pdx_stats_t *stats_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    pthread_mutex_lock(&agent->lock);
    for (pdx_stats_entry_t *e = agent->peer_stats; e != NULL; e = e->next) {
        if (strcmp(e->name, peer) == 0) {
            *stats_p = e->s;
            st = PDX_OK;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        pdx_error("agent %s: stats: peer %s was never loaded", agent->name,
                  peer);
    }
    return st;
}

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

pdx_status_t pdxi_stats_json(pdx_agent_h agent, char **json_p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) {
        pdx_error("agent %s: stats: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_lock(&agent->lock);
    fputs("{\"agent\": ", f);
    json_str(f, agent->name);
    fprintf(f, ", \"pid\": %d, \"generation\": %u, \"host\": ", (int)getpid(),
            agent->generation);
    json_str(f, agent->host_id);
    fprintf(f, ", \"path_policy\": \"%s\", \"backends\": [",
            agent->params.path_policy == PDX_PATH_POLICY_SAME_HOST_FAST
                ? "same_host_fast"
                : "any");
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
        }
        fputs(", ", f);
        json_stats(f, &e->s);
        fputc('}', f);
    }
    fputs("]}\n", f);
    pthread_mutex_unlock(&agent->lock);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        pdx_error("agent %s: stats: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    *json_p = text;
    return PDX_OK;
}
