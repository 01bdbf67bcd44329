/* The backend object: one loaded backend of an agent (backend.c), and the
 * protocol that lets a backend op run without the agent lock. */
#ifndef PDX_BACKEND_INT_H
#define PDX_BACKEND_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <pdx/backend.h>
#include <pdx/stats.h>

#include "agent_int.h"
#include "metrics_int.h"

struct pdx_backend {
    uint32_t magic; /* PDX_MAGIC_BACKEND */
    pdx_agent_h agent;
    const pdx_backend_ops_t *ops;
    void *dl; /* dlopen handle, NULL when linked in */
    void *be; /* backend instance */
    uint32_t index;
    char name[PDX_BLOB_BACKEND_NAME_MAX];
    pdx_stats_t stats;
    pdx_be_metrics_t metrics; /* histograms, errors by status */
    /* atomic: moves each time a caller's pdx_xfer_check progressed this
     * backend itself; while it moves, the progress thread leaves this
     * backend to the callers (progress.c) */
    uint64_t caller_polls;
    /* A backend across hosts that moves this agent's GPU memory staged
     * through host memory (its path op without a peer says so), and why:
     * such pieces are a slower path (path.c). */
    bool vram_staged;
    char vram_why[PDX_WHY_MAX];
};

/* Optional ops of a backend table (appended after the first release). */
#define PDX_BE_HAS(ops, op)                                                    \
    ((ops)->size > offsetof(pdx_backend_ops_t, op) && (ops)->op != NULL)

/* Around one backend op that may take long (a post that copies data, a
 * progress call): begin (lock held, be_busy clear) marks the backends busy
 * and drops the lock; end retakes it and clears be_busy. Callbacks in
 * between are queued (progress.c) and run once the caller's state is
 * consistent again. While busy no other thread calls a backend op or frees
 * agent state (both need pdx_agent_lock). */
void pdx_backend_unlock_begin(pdx_agent_h agent);
void pdx_backend_unlock_end(pdx_agent_h agent);
/* The agent whose backend this thread is running without the agent lock
 * (between begin and end), or NULL: its callbacks must be queued. */
pdx_agent_h pdx_backend_unlocked_agent(void);

#endif
