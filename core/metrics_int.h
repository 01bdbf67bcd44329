/* Metrics (metrics.c, metrics_http.c): what each backend of an agent keeps
 * for them beyond its pdx_stats_t (latency histograms, errors by status),
 * kept by the request rooms through the inline helpers below (no call
 * edge), the Prometheus text and the HTTP endpoint. */
#ifndef PDX_METRICS_INT_H
#define PDX_METRICS_INT_H

#include <stdint.h>

#include <pdx/metrics.h>
#include <pdx/status.h>

/* Upper bounds of the histograms' buckets, in ns (Prometheus "le"; one
 * more bucket, +Inf, after them): 1 us to 10 s. */
#define PDX_HIST_BOUNDS 22
#define PDX_HIST_BOUNDS_NS                                                     \
    {                                                                          \
        1000ull, 2500ull, 5000ull, 10000ull, 25000ull, 50000ull, 100000ull,    \
            250000ull, 500000ull, 1000000ull, 2500000ull, 5000000ull,          \
            10000000ull, 25000000ull, 50000000ull, 100000000ull, 250000000ull, \
            500000000ull, 1000000000ull, 2500000000ull, 5000000000ull,         \
            10000000000ull                                                     \
    }

typedef struct pdx_hist {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t bucket[PDX_HIST_BOUNDS + 1]; /* per bucket, not cumulative */
} pdx_hist_t;

static inline void pdx_hist_add(pdx_hist_t *h, uint64_t ns)
{
    static const uint64_t bounds[PDX_HIST_BOUNDS] = PDX_HIST_BOUNDS_NS;
    unsigned i = 0;
    while (i < PDX_HIST_BOUNDS && ns > bounds[i]) {
        i++;
    }
    h->bucket[i]++;
    h->count++;
    h->sum_ns += ns;
}

/* Errors by status: [-st] for PDX_ERR_INVALID (-1) .. PDX_ERR_POLICY
 * (-20); [0] any other. */
#define PDX_ERR_CLASSES 21

/* A backend's metrics beyond its counters; agent lock held to touch. */
typedef struct pdx_be_metrics {
    pdx_hist_t post; /* pdx_xfer_post: the call's own duration */
    pdx_hist_t done; /* post to the end of the request, ended PDX_OK */
    uint64_t errors[PDX_ERR_CLASSES];
} pdx_be_metrics_t;

static inline void pdx_be_metrics_error(pdx_be_metrics_t *m, pdx_status_t st)
{
    int i = -(int)st;
    m->errors[i > 0 && i < PDX_ERR_CLASSES ? i : 0]++;
}

struct pdx_agent;

/* metrics.c: the text of pdx_metrics_text (agent lock taken inside). */
pdx_status_t pdxi_metrics_text(struct pdx_agent *agent, char **text_p);

/* metrics_http.c: the endpoint. Start and stop take no agent lock of
 * their own; stop waits for a scrape in progress, which takes it. */
pdx_status_t pdxi_metrics_start(struct pdx_agent *agent,
                                const pdx_metrics_params_t *params,
                                uint16_t *port_p);
pdx_status_t pdxi_metrics_stop(struct pdx_agent *agent);
/* At agent create: PDX_METRICS_LISTEN=[ADDR:]PORT starts the endpoint (a
 * warning when it cannot). */
void pdx_metrics_from_env(struct pdx_agent *agent);

#endif
