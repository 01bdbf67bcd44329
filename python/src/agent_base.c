/* What an Agent's children (registrations, lists, requests, the store
 * and bench calls) use of their agent: a call begins on it (its use
 * count) or finds it closed, and a polling loop waits on its event fd.
 * Below agent.c, whose Agent type gathers the methods of those files. */
#include "pdxpy_int.h"

#include <poll.h>
#include <time.h>

int pdxpy_agent_enter(AgentObject *a)
{
    if (a->h == NULL || a->closing) {
        pdxpy_closed("agent is closed");
        return -1;
    }
    a->uses++;
    return 0;
}

int pdxpy_agent_alive(AgentObject *a)
{
    return a->h != NULL && !__atomic_load_n(&a->closing, __ATOMIC_RELAXED);
}

/* Sleep on the agent's event fd for at most `ms` (with the GIL released by
 * the caller), then let the agent progress if it woke. */
void pdxpy_agent_sleep(pdx_agent_h h, int ms, int *spins)
{
    struct pollfd p = {.fd = pdx_agent_event_fd(h), .events = POLLIN};
    if (*spins > 2) {
        /* The fd stayed readable without news for us (e.g. queued
         * notifications keep it so): back off instead of spinning. */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    int r = p.fd >= 0 ? poll(&p, 1, ms) : 0;
    if (r > 0) {
        (*spins)++;
        pdx_progress(h);
    } else {
        *spins = 0;
    }
}

