/* pdx_metrics_text: an agent's counters, histograms, peers and backend
 * gauges in Prometheus's text exposition format (0.0.4). The families are
 * listed in docs/METRICS.md; every sample names the agent, per-path ones
 * the backend ("path"). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "discovery_int.h"
#include "metrics_int.h"
#include "peer_int.h"
#include "stats_int.h"
#include "xfer_int.h"

#ifndef PDX_VERSION_STRING
#define PDX_VERSION_STRING "0.0.0"
#endif

/* Error class labels, by -status (metrics_int.h's PDX_ERR_CLASSES). */
static const char *const g_err_class[PDX_ERR_CLASSES] = {
    "other",       "invalid",           "nomem",   "not_found", "unsupported",
    "backend",     "remote_disconnect", "stale",   "mismatch",  "corrupt",
    "version",     "too_large",         "timeout", "busy",      "exists",
    "unavailable", "canceled",          "io",      "config",    "no_space",
    "policy"};

/* A label value: backslash, double quote and newline escaped. */
static void label(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            fputc('\\', f);
            fputc(*s, f);
        } else if (*s == '\n') {
            fputs("\\n", f);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

static void family(FILE *f, const char *name, const char *type,
                   const char *help)
{
    fprintf(f, "# HELP pdx_%s %s\n# TYPE pdx_%s %s\n", name, help, name, type);
}

/* `pdx_<name>{agent="...",path="..."<extra>} ` (path when non-NULL). */
static void sample(FILE *f, const char *name, const char *agent,
                   const char *path)
{
    fprintf(f, "pdx_%s{agent=", name);
    label(f, agent);
    if (path != NULL) {
        fputs(",path=", f);
        label(f, path);
    }
}

static void counter_per_path(FILE *f, pdx_agent_h agent, const char *name,
                             const char *help, size_t off)
{
    family(f, name, "counter", help);
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        const struct pdx_backend *be = agent->backends[b];
        uint64_t v;
        memcpy(&v, (const char *)&be->stats + off, sizeof(v));
        sample(f, name, agent->name, be->name);
        fprintf(f, "} %" PRIu64 "\n", v);
    }
}

static void histogram(FILE *f, pdx_agent_h agent, const char *name,
                      const char *help, int done)
{
    static const uint64_t bounds[PDX_HIST_BOUNDS] = PDX_HIST_BOUNDS_NS;
    family(f, name, "histogram", help);
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        const struct pdx_backend *be = agent->backends[b];
        const pdx_hist_t *h = done ? &be->metrics.done : &be->metrics.post;
        uint64_t cum = 0;
        char bucket[64];
        snprintf(bucket, sizeof(bucket), "%s_bucket", name);
        for (unsigned i = 0; i <= PDX_HIST_BOUNDS; i++) {
            cum += h->bucket[i];
            sample(f, bucket, agent->name, be->name);
            if (i < PDX_HIST_BOUNDS) {
                fprintf(f, ",le=\"%g\"} %" PRIu64 "\n", (double)bounds[i] / 1e9,
                        cum);
            } else {
                fprintf(f, ",le=\"+Inf\"} %" PRIu64 "\n", cum);
            }
        }
        char sub[64];
        snprintf(sub, sizeof(sub), "%s_sum", name);
        sample(f, sub, agent->name, be->name);
        fprintf(f, "} %.9f\n", (double)h->sum_ns / 1e9);
        snprintf(sub, sizeof(sub), "%s_count", name);
        sample(f, sub, agent->name, be->name);
        fprintf(f, "} %" PRIu64 "\n", h->count);
    }
}

/* A number after `key` in a backend's describe line ("slots in use 3",
 * "staging pool 256 MiB"): what the backend reports of its pinned pool. */
static bool describe_number(const char *desc, const char *key,
                            unsigned long long *v_p)
{
    const char *p = strstr(desc, key);
    return p != NULL && sscanf(p + strlen(key), " %llu", v_p) == 1;
}

static void backend_gauges(FILE *f, pdx_agent_h agent)
{
    uint64_t inflight[PDX_MAX_BACKENDS] = {0};
    for (const struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS && x->posted && x->bindex >= 0 &&
            (uint32_t)x->bindex < agent->nbackends) {
            inflight[x->bindex]++;
        }
    }
    family(f, "requests_in_flight", "gauge",
           "Requests posted and not ended yet.");
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        sample(f, "requests_in_flight", agent->name, agent->backends[b]->name);
        fprintf(f, "} %" PRIu64 "\n", inflight[b]);
    }
    /* The pinned staging pool, as the backend's describe line reports it
     * (the ucx backend once it stages GPU memory: "staging pool N MiB,
     * slots in use M"); no sample for a backend that reports none. */
    char desc[PDX_MAX_BACKENDS][256];
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        struct pdx_backend *be = agent->backends[b];
        desc[b][0] = '\0';
        be->ops->describe(be->be, desc[b], sizeof(desc[b]));
    }
    family(f, "staging_pool_bytes", "gauge",
           "Pinned host memory a backend stages GPU memory through.");
    unsigned long long v;
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (describe_number(desc[b], "staging pool", &v)) {
            sample(f, "staging_pool_bytes", agent->name,
                   agent->backends[b]->name);
            fprintf(f, "} %llu\n", v << 20);
        }
    }
    family(f, "staging_slots_in_use", "gauge",
           "Slots of the pinned staging pool in use.");
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (describe_number(desc[b], "slots in use", &v)) {
            sample(f, "staging_slots_in_use", agent->name,
                   agent->backends[b]->name);
            fprintf(f, "} %llu\n", v);
        }
    }
}

static void errors_by_class(FILE *f, pdx_agent_h agent)
{
    family(f, "errors_total", "counter",
           "Posts that ended in an error or were refused (peer gone, "
           "stale), by class (the pdx status: remote_disconnect, timeout, "
           "stale, ...).");
    /* Every class from the start, at 0: a series born at 1 hides the
     * first error from rate() and increase(). */
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        const struct pdx_backend *be = agent->backends[b];
        for (int c = 0; c < PDX_ERR_CLASSES; c++) {
            sample(f, "errors_total", agent->name, be->name);
            fprintf(f, ",class=\"%s\"} %" PRIu64 "\n", g_err_class[c],
                    be->metrics.errors[c]);
        }
    }
}

static void peers(FILE *f, pdx_agent_h agent)
{
    uint64_t alive = 0, dead = 0, unloaded = 0;
    for (const pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->dead == PDX_OK) {
            alive++;
        } else {
            dead++;
        }
    }
    for (const pdx_stats_entry_t *e = agent->peer_stats; e != NULL;
         e = e->next) {
        unloaded += pdx_peer_find(agent, e->name) == NULL;
    }
    family(f, "peers", "gauge",
           "Peers by state: alive and dead are loaded; unloaded ones were "
           "loaded once (their counters are kept).");
    const char *names[] = {"alive", "dead", "unloaded"};
    uint64_t counts[] = {alive, dead, unloaded};
    for (int i = 0; i < 3; i++) {
        sample(f, "peers", agent->name, NULL);
        fprintf(f, ",state=\"%s\"} %" PRIu64 "\n", names[i], counts[i]);
    }
}

static void agent_gauges(FILE *f, pdx_agent_h agent)
{
    family(f, "agent_info", "gauge",
           "The agent: pdx version, host id and process (always 1).");
    sample(f, "agent_info", agent->name, NULL);
    fprintf(f, ",version=\"%s\",host=", PDX_VERSION_STRING);
    label(f, agent->host_id);
    fprintf(f, ",pid=\"%d\"} 1\n", (int)getpid());
    family(f, "agent_generation", "gauge",
           "The agent's metadata generation (moves at every change peers "
           "see).");
    sample(f, "agent_generation", agent->name, NULL);
    fprintf(f, "} %u\n", agent->generation);
    family(f, "registered_regions", "gauge", "Memory regions registered.");
    sample(f, "registered_regions", agent->name, NULL);
    fprintf(f, "} %zu\n", agent->nregs);
    pdx_store_snapshot_t st;
    if (pdx_store_agent_snapshot(agent, &st)) {
        family(f, "store_reachable", "gauge",
               "1 while the agent's store (etcd) answers.");
        sample(f, "store_reachable", agent->name, NULL);
        fprintf(f, "} %d\n", st.status.reachable ? 1 : 0);
    }
}

static void per_path_counters(FILE *f, pdx_agent_h agent)
{
    counter_per_path(f, agent, "requests_total", "Posts of requests.",
                     offsetof(pdx_stats_t, requests));
    counter_per_path(f, agent, "completed_total",
                     "Posts that ended successfully.",
                     offsetof(pdx_stats_t, completed));
    counter_per_path(f, agent, "bytes_total", "Bytes of completed posts.",
                     offsetof(pdx_stats_t, bytes));
    counter_per_path(f, agent, "canceled_total",
                     "Posts aborted or released in flight.",
                     offsetof(pdx_stats_t, canceled));
    counter_per_path(f, agent, "fallbacks_total",
                     "Posts over a same-host fallback path (not the "
                     "fastest one).",
                     offsetof(pdx_stats_t, fallbacks));
    counter_per_path(f, agent, "refused_total",
                     "Requests the path policy refused.",
                     offsetof(pdx_stats_t, refused));
    counter_per_path(f, agent, "notifs_sent_total", "Notifications sent.",
                     offsetof(pdx_stats_t, notifs_sent));
    counter_per_path(f, agent, "notifs_received_total",
                     "Notifications received.",
                     offsetof(pdx_stats_t, notifs_recv));
    counter_per_path(f, agent, "dead_peer_events_total",
                     "Times a peer was found dead.",
                     offsetof(pdx_stats_t, dead_events));
}

pdx_status_t pdxi_metrics_text(pdx_agent_h agent, char **text_p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) {
        pdx_error("agent %s: metrics: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    pdx_agent_lock(agent);
    agent->metrics_timed = true;
    agent_gauges(f, agent);
    per_path_counters(f, agent);
    errors_by_class(f, agent);
    histogram(f, agent, "post_duration_seconds",
              "Time pdx_xfer_post took (timed requests).", 0);
    histogram(f, agent, "completion_duration_seconds",
              "From a post to the request's successful end (timed "
              "requests).",
              1);
    backend_gauges(f, agent);
    peers(f, agent);
    pthread_mutex_unlock(&agent->lock);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        pdx_error("agent %s: metrics: out of memory", agent->name);
        return PDX_ERR_NOMEM;
    }
    *text_p = text;
    return PDX_OK;
}
