/* Counters of backends and peers (stats.c), and the stats socket
 * (stats_sock.c) that serves stats_json.c's JSON. */
#ifndef PDX_STATS_INT_H
#define PDX_STATS_INT_H

#include <pdx/stats.h>

#include "agent_int.h"

/* Counters of one backend or one peer (by name, kept for the agent's
 * life: requests hold a pointer to their peer's). */
typedef struct pdx_stats_entry {
    struct pdx_stats_entry *next;
    char name[PDX_NAME_MAX];
    pdx_stats_t s;
} pdx_stats_entry_t;

/* The counters of peer `name`, made on first use (NULL only without
 * memory). Agent lock held. */
pdx_stats_entry_t *pdx_peer_stats_get(pdx_agent_h agent, const char *name);

/* The stats socket (stats_sock.c): open and close with the agent; serve
 * (without the lock) from the progress thread or pdx_progress; `now` is
 * the caller's pdx_now_ns() reading, or 0 to read the clock. */
void pdx_stats_sock_open(pdx_agent_h agent);
void pdx_stats_sock_serve(pdx_agent_h agent, uint64_t now);
void pdx_stats_sock_close(pdx_agent_h agent);

#endif
