/* Progress: the progress pass (every backend, liveness, requests,
 * timeouts, removal acknowledgements), pidfd and same-process liveness,
 * the backends' callbacks, the progress thread, and the calls that drive
 * progress for the caller (pdx_progress, xfer post/check/release,
 * notif poll, deregister's wait). Above xfer, notif and ctl. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "mem_int.h"
#include "notif_int.h"
#include "peer_int.h"
#include "progress.h"
#include "stats_int.h"
#include "xfer_int.h"

#define LIVENESS_PERIOD_NS 1000000ull /* pidfd poll at most once a ms */

static void defer_event(pdx_agent_h agent, int kind, const char *peer,
                        pdx_status_t why, const void *msg, size_t len)
{
    pdx_deferred_t *d = malloc(sizeof(*d) + len);
    if (d == NULL) {
        pdx_error("agent %s: dropped a %s from %s: out of memory",
                  agent->name, kind == 0 ? "notification" : "peer error",
                  peer);
        return;
    }
    d->next = NULL;
    d->kind = kind;
    d->why = why;
    snprintf(d->peer, sizeof(d->peer), "%s", peer);
    d->len = len;
    if (len > 0) {
        memcpy(d->msg, msg, len);
    }
    if (agent->defer_tail != NULL) {
        agent->defer_tail->next = d;
    } else {
        agent->defer_head = d;
    }
    agent->defer_tail = d;
}

static void notif_recv_locked(pdx_agent_h agent, const char *peer,
                              const void *msg, size_t len);
static void peer_error_locked(pdx_agent_h agent, const char *peer_name,
                              pdx_status_t why);

/* Called by backends when a message arrives: under the agent lock, or
 * queued when the backend is progressed without it. */
void pdx_progress_notif_recv(void *ctx, const char *peer, const void *msg,
                             size_t len)
{
    pdx_agent_h agent = ctx;
    if (pdx_backend_unlocked_agent() == agent) {
        defer_event(agent, 0, peer, PDX_OK, msg, len);
        return;
    }
    notif_recv_locked(agent, peer, msg, len);
}

static void notif_recv_locked(pdx_agent_h agent, const char *peer,
                              const void *msg, size_t len)
{
    if (pdx_ctl_recv_locked(agent, peer, msg, len)) {
        return; /* ctl.c: a region-removal notice, not the app's */
    }
    pdx_notif_queue_locked(agent, peer, msg, len);
}

void pdx_progress_peer_error(void *ctx, const char *peer_name,
                             pdx_status_t why)
{
    pdx_agent_h agent = ctx;
    if (pdx_backend_unlocked_agent() == agent) {
        defer_event(agent, 1, peer_name, why, NULL, 0);
        return;
    }
    peer_error_locked(agent, peer_name, why);
}

static void peer_error_locked(pdx_agent_h agent, const char *peer_name,
                              pdx_status_t why)
{
    pdx_peer_t *peer = pdx_peer_find(agent, peer_name);
    if (peer == NULL || peer->dead != PDX_OK) {
        return;
    }
    if (pdx_peer_pid_exited(peer)) {
        /* The connection error is its exit seen another way. */
        pdx_xfer_peer_exited_locked(agent, peer, true);
    } else {
        pdx_xfer_peer_gone_locked(agent, peer, why, "connection error", true);
    }
}

/* Agents destroyed in this process, for peers in the same process (a pidfd
 * of our own pid never fires): a sequence and a ring of the last instance
 * ids, written without a lock (destroy) and read by every agent's liveness
 * pass when the sequence moved. Process-wide by nature, like the pid. A
 * burst of more than PDX_DESTROYED_RING destroys between two passes of an
 * agent can hide one from it (then UCX errors or timeouts still end its
 * requests). */
#define PDX_DESTROYED_RING 1024
static _Atomic uint64_t g_destroyed_seq;
static _Atomic uint64_t g_destroyed_ring[PDX_DESTROYED_RING];

uint64_t pdx_progress_destroyed_seq(void)
{
    return atomic_load(&g_destroyed_seq);
}

void pdx_progress_announce_destroyed(uint64_t instance)
{
    uint64_t seq = atomic_load(&g_destroyed_seq);
    atomic_store(&g_destroyed_ring[seq % PDX_DESTROYED_RING], instance);
    atomic_fetch_add(&g_destroyed_seq, 1);
}

static void check_same_process(pdx_agent_h agent)
{
    uint64_t now = atomic_load(&g_destroyed_seq);
    uint64_t from = agent->destroyed_seen;
    if (now == from) {
        return;
    }
    agent->destroyed_seen = now;
    if (now - from > PDX_DESTROYED_RING) {
        from = now - PDX_DESTROYED_RING;
    }
    pid_t self = getpid();
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->dead != PDX_OK || !p->same_host || p->pid != self) {
            continue;
        }
        for (uint64_t i = from; i < now; i++) {
            if (atomic_load(&g_destroyed_ring[i % PDX_DESTROYED_RING]) ==
                p->instance) {
                pdx_xfer_peer_gone_locked(agent, p,
                                          PDX_ERR_REMOTE_DISCONNECT,
                                          "agent destroyed in this process",
                                          false);
                p->dead_final = true;
                break;
            }
        }
    }
}

static void check_liveness(pdx_agent_h agent, uint64_t now)
{
    if (now - agent->last_liveness_ns < LIVENESS_PERIOD_NS) {
        return;
    }
    agent->last_liveness_ns = now;
    check_same_process(agent);
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->pidfd < 0 || p->dead != PDX_OK) {
            continue;
        }
        /* The pidfd alone here (a poll per peer and pass); the errors'
         * check (pdx_peer_pid_exited) also reads /proc. */
        struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0) {
            pdx_xfer_peer_exited_locked(agent, p, false);
        }
    }
}

/* Handle what callbacks queued during an unlocked progress call. */
static void run_deferred_locked(pdx_agent_h agent)
{
    while (agent->defer_head != NULL) {
        pdx_deferred_t *d = agent->defer_head;
        agent->defer_head = d->next;
        if (agent->defer_head == NULL) {
            agent->defer_tail = NULL;
        }
        if (d->kind == 0) {
            notif_recv_locked(agent, d->peer, d->msg, d->len);
        } else {
            peer_error_locked(agent, d->peer, d->why);
        }
        free(d);
    }
}

static bool backend_progress_unlocked(pdx_agent_h agent,
                                      struct pdx_backend *b, int *events_p)
{
    if (agent->be_busy) {
        return false; /* another thread is progressing a backend now */
    }
    /* Callers waiting for a backend go first: each waits for one call.
     * (One of them may start a progress of its own: wait for it too.) */
    while (agent->be_waiters > 0 || agent->be_busy) {
        pthread_cond_wait(&agent->be_cond, &agent->lock);
    }
    pdx_backend_unlock_begin(agent);
    int n = b->ops->progress(b->be);
    pdx_backend_unlock_end(agent);
    run_deferred_locked(agent);
    if (events_p != NULL) {
        *events_p += n > 0 ? n : 0;
    }
    return true;
}

/* Everything of a pass but the backends' own progress: liveness (pidfds,
 * same-process destroys), request states and timeouts, removal
 * acknowledgements. The progress thread runs it alone while a caller
 * progresses the backends itself. Lock held (pdx_agent_lock). Returns the
 * requests it saw end. */
static int housekeeping_locked(pdx_agent_h agent)
{
    int ended = 0;
    uint64_t now = pdx_now_ns();
    agent->last_full_progress_ns = now;
    check_liveness(agent, now);
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_progress_locked(agent, x);
            if (x->status != PDX_INPROGRESS) {
                ended++;
            }
        } else if (x->breq != NULL) {
            pdx_xfer_progress_locked(agent, x); /* sweep a failed one */
        }
    }
    pdx_xfer_timeouts_locked(agent, now);
    if (agent->ctl_acks != NULL) {
        pdx_ctl_progress_locked(agent); /* ctl.c: removal acks */
    }
    return ended;
}

/* One pass: every backend, then housekeeping_locked. Returns the events
 * seen (backend events and requests that ended); *ended_p (may be NULL)
 * gets the requests that ended. */
static int progress_pass_locked(pdx_agent_h agent, int *ended_p)
{
    int events = 0;
    if (ended_p != NULL) {
        *ended_p = 0;
    }
    if (agent->be_busy) {
        return 0; /* mid-pass in another thread: that pass covers it */
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if (!backend_progress_unlocked(agent, agent->backends[i],
                                           &events)) {
            return events;
        }
    }
    int ended = housekeeping_locked(agent);
    if (ended_p != NULL) {
        *ended_p = ended;
    }
    return events + ended;
}

int pdx_progress_locked(pdx_agent_h agent)
{
    return progress_pass_locked(agent, NULL);
}

/* Re-arm every backend's event fd; one with events already pending keeps
 * the agent's fd readable through the eventfd instead. */
static void arm_backends(pdx_agent_h agent)
{
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        struct pdx_backend *b = agent->backends[i];
        if (!(b->ops->caps & PDX_BACKEND_CAP_EVENT_FD)) {
            continue;
        }
        if (b->ops->arm(b->be) == PDX_ERR_BUSY) {
            pdx_agent_signal(agent);
        }
    }
}

int pdxi_progress(pdx_agent_h agent)
{
    pdx_agent_lock(agent);
    pdx_efd_drain(agent->event_fd);
    int n = pdx_progress_locked(agent);
    if (agent->nq_head != NULL) {
        /* Keep the fd readable while notifications wait for a poll. */
        pdx_agent_signal(agent);
    }
    arm_backends(agent);
    pthread_mutex_unlock(&agent->lock);
    if (!agent->thread_running) {
        pdx_stats_sock_serve(agent, 0);
    }
    return n;
}

/* Longest sleep of an idle progress thread: the housekeeping a backend may
 * need without an event (a UCX close whose flush deadline passes, a
 * same-process peer's destroy), and a safety net should an event be missed
 * (then it is late by this much, never lost). Ten wake-ups a second cost
 * well under a millisecond of CPU. */
#define PROGRESS_IDLE_MS 100
/* After a stream of activity (below), sleeps on events end within
 * PROGRESS_INFLIGHT_MS for this long: an event a backend failed to signal
 * while serving a stream costs 1 ms, not the idle bound. */
#define PROGRESS_STREAM_NS 10000000ull
/* A fast stream (two bursts of activity, a wait between them, within
 * this): the thread polls, without a system call between passes, until
 * this long after the last activity. A target serving a peer's requests one at
 * a time answers the next one at UCX's own latency instead of a
 * wake-up's (60-120 us on the 2-core VM). A lone message (a peer's UCX
 * keepalive) does not start one: an idle agent never polls. */
#define PROGRESS_POLL_NS 1000000ull
/* While callers poll their requests the thread naps (then looks whether
 * they still poll) PROGRESS_NAP_MIN_MS, twice as long after each nap in
 * which a caller spun (PROGRESS_NAP_SPIN_POLLS checks a ms, a check every
 * 50 us or more often: its own checks progress the backend that often),
 * up to PROGRESS_NAP_MAX_MS, so the thread's lag after a spin ends (the
 * backend then waits for it) stays under the spin's length so far. It
 * takes the lock for housekeeping at least every PROGRESS_HK_MAX_NS
 * (hk_due_locked). Each wake-up cost a spinning caller: on the 2-core VM,
 * 8448-byte READs over UCX sm measured 0.85-0.87x the raw UCP loop's GB/s
 * with 1 ms naps that took the lock, 0.90-0.91x with 1 ms naps without
 * it, 0.93-0.96x with naps up to 8 ms. */
#define PROGRESS_NAP_MIN_MS 1
#define PROGRESS_NAP_MAX_MS 8
#define PROGRESS_NAP_SPIN_POLLS 20
#define PROGRESS_HK_MAX_NS 10000000ull
/* Longest sleep with requests in flight on event-fd backends only: how
 * late a request timeout can be noticed (their unit is ms). */
#define PROGRESS_INFLIGHT_MS 1

/* How long the progress thread may sleep now, in ms: 0, progress again at
 * once (a backend has events pending); -1, a short fixed pause
 * (progress_interval_us): a request is in flight on a backend without an
 * event fd (cma completes in its own threads and is polled); else every
 * backend's event fd is armed and the thread sleeps until an event (a
 * message or completion for a backend, a peer's exit, a stats client, a
 * wake), or PROGRESS_INFLIGHT_MS with requests in flight (their timeouts)
 * or within PROGRESS_STREAM_NS of a stream, or PROGRESS_IDLE_MS. Lock
 * held, no backend busy. */
static int idle_timeout_locked(pdx_agent_h agent, uint64_t stream_ns)
{
    uint64_t now = pdx_now_ns();
    bool inflight = false;
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS || x->breq != NULL) {
            inflight = true;
            if (!(agent->backends[x->bindex]->ops->caps &
                  PDX_BACKEND_CAP_EVENT_FD)) {
                return -1;
            }
        }
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        struct pdx_backend *b = agent->backends[i];
        if ((b->ops->caps & PDX_BACKEND_CAP_EVENT_FD) &&
            b->ops->arm(b->be) == PDX_ERR_BUSY) {
            return 0;
        }
    }
    bool streaming = stream_ns != 0 && now - stream_ns < PROGRESS_STREAM_NS;
    return inflight || streaming ? PROGRESS_INFLIGHT_MS : PROGRESS_IDLE_MS;
}

/* What woke a nap (k events of nap_epoll_fd): the wake fd is drained; a
 * pidfd (a peer's exit) returns true, for a liveness check at once. */
static bool nap_events(pdx_agent_h agent, const struct epoll_event *evs,
                       int k)
{
    bool exited = false;
    for (int i = 0; i < k; i++) {
        if (evs[i].data.u64 & PDX_PIDFD_TAG) {
            exited = true;
        } else if (evs[i].data.u64 == (uint64_t)(uint32_t)agent->wake_fd) {
            uint64_t v;
            if (read(agent->wake_fd, &v, sizeof(v)) < 0) {
                /* EAGAIN: another reader took it */
            }
        }
    }
    return exited;
}

/* While callers poll their requests, when the thread's next housekeeping
 * (request states and timeouts, same-process liveness, removal acks, the
 * other backends) is due: at every nap (0, and naps stay short) while a
 * backend no caller polls has requests in flight or is event-driven (its
 * messages are the thread's to serve), while more than one request is in
 * flight (one no caller polls ends only here), or while removal acks
 * wait; else at the first request deadline, or PROGRESS_HK_MAX_NS on. A
 * nap that ends before it, without a peer's exit, takes no lock. Lock
 * held. */
static uint64_t hk_due_locked(pdx_agent_h agent, uint64_t polled)
{
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if ((agent->backends[i]->ops->caps & PDX_BACKEND_CAP_EVENT_FD) &&
            !(polled & (1ull << i))) {
            return 0;
        }
    }
    if (agent->ctl_acks != NULL) {
        return 0;
    }
    uint64_t now = agent->last_full_progress_ns;
    uint64_t due = now + PROGRESS_HK_MAX_NS;
    uint64_t limit = (uint64_t)agent->params.xfer_timeout_ms * 1000000ull;
    int inflight = 0;
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status != PDX_INPROGRESS && x->breq == NULL) {
            continue;
        }
        if (!(polled & (1ull << x->bindex)) || ++inflight > 1) {
            return 0;
        }
        if (limit != 0 && x->status == PDX_INPROGRESS && x->post_ns != 0 &&
            x->post_ns + limit < due) {
            due = x->post_ns + limit;
        }
    }
    return due;
}

/* Polling a fast stream, between full passes: the event-fd backends'
 * progress calls back to back without the lock, until one has activity,
 * a thread waits in pdx_agent_lock (be_waiters) or PROGRESS_SPIN_ROUNDS
 * calls. A full pass (the lock three times, every backend, liveness,
 * request states, the clock, the stats socket) took ~4x an idle UCX
 * progress call: in a profile of a target serving 8 KiB READs, the
 * thread spent half its time in the mutex and the clock and a fifth in
 * UCX's polling, and a message arriving waited for the rest of a pass.
 * Lock not held. Returns the events seen (counted as the next pass's). */
#define PROGRESS_SPIN_ROUNDS 64
static int spin_backends(pdx_agent_h agent)
{
    struct pdx_backend *bs[PDX_MAX_BACKENDS];
    uint32_t k = 0;
    pthread_mutex_lock(&agent->lock);
    if (agent->be_busy || agent->be_waiters > 0) {
        pthread_mutex_unlock(&agent->lock);
        return 0;
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if (agent->backends[i]->ops->caps & PDX_BACKEND_CAP_EVENT_FD) {
            bs[k++] = agent->backends[i];
        }
    }
    int n = 0;
    if (k > 0) {
        pdx_backend_unlock_begin(agent);
        for (int r = 0; r < PROGRESS_SPIN_ROUNDS && n == 0; r++) {
            for (uint32_t j = 0; j < k; j++) {
                int e = bs[j]->ops->progress(bs[j]->be);
                n += e > 0 ? e : 0;
            }
            if (__atomic_load_n(&agent->be_waiters, __ATOMIC_RELAXED) > 0) {
                break;
            }
        }
        pdx_backend_unlock_end(agent);
        run_deferred_locked(agent);
    }
    pthread_mutex_unlock(&agent->lock);
    return n;
}

/* The backends' event fds in the thread's epoll set (on) or out of it.
 * Out while the thread polls a stream or naps while callers poll: it
 * waits on no backend then, and an fd in a set costs each of the
 * backend's messages one more wake-up callback in the kernel (UCX over
 * TCP: each socket's data runs up the transport's epoll set, the
 * backend's and this one). A 64 KiB WRITE over TCP is 8 fragments and 8
 * acknowledgements: 5 us of 65 in pdx-bench latency, the gap to the raw
 * UCP loop. In again before the thread sleeps on them: a backend armed
 * with events pending makes the set readable at once (the add polls
 * the fd), so none is missed. A backend added while they are out is
 * in (backend_add) until the next time out. Progress thread only. */
static void backends_watch(pdx_agent_h agent, bool on)
{
    if (agent->be_unwatched != on) {
        return;
    }
    agent->be_unwatched = !on;
    uint32_t nb = __atomic_load_n(&agent->nbackends, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < nb; i++) {
        struct pdx_backend *b = agent->backends[i];
        if (!(b->ops->caps & PDX_BACKEND_CAP_EVENT_FD)) {
            continue;
        }
        int fd = b->ops->event_fd(b->be);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (fd >= 0 &&
            epoll_ctl(agent->prog_epoll_fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL,
                      fd, &ev) != 0 &&
            errno != EEXIST && errno != ENOENT) {
            pdx_warn("agent %s: backend %s event fd %s the progress "
                     "thread's set: %s", agent->name, b->name,
                     on ? "not put back in" : "not taken out of",
                     strerror(errno));
        }
    }
}

void *pdx_progress_main(void *arg)
{
    pdx_agent_h agent = arg;
    struct epoll_event evs[16];
    uint64_t stream_ns = 0;  /* last burst of a stream */
    uint64_t active_ns = 0;  /* last pass with activity */
    uint64_t poll_until = 0; /* a fast stream: poll, do not sleep, until */
    uint64_t wait_end_ns = 0; /* when the last wait (sleep, nap, spin) ended */
    bool waited = true;      /* a wait since the last active pass */
    int spun = 0;            /* events the spin saw, for the next pass */
    uint64_t hk_due = 0; /* callers poll: housekeeping due (0: each nap) */
    uint64_t hk_seq = 0; /* same-process destroys seen by it */
    int nap_ms = PROGRESS_NAP_MIN_MS; /* the last nap's length */
    uint64_t polls_seen[PDX_MAX_BACKENDS] = {0};
    while (!__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
        /* A caller polling its request progresses that backend itself
         * (pdx_xfer_check): keep out of its way (no second thread in the
         * backend, no core taken from it, no lock taken for nothing)
         * while it polls, napping (PROGRESS_NAP_MIN_MS, longer while a
         * caller spins) on the pidfds, the stats socket and the wake fd;
         * housekeeping (and the other backends) when due (hk_due_locked).
         * No lock to look: backends are published with a release store of
         * nbackends. */
        uint64_t polled = 0; /* bit i: backend i polled by a caller */
        uint64_t polls = 0;  /* their checks since the last look */
        uint32_t nb = __atomic_load_n(&agent->nbackends, __ATOMIC_ACQUIRE);
        for (uint32_t i = 0; i < nb; i++) {
            uint64_t cp = __atomic_load_n(&agent->backends[i]->caller_polls,
                                          __ATOMIC_ACQUIRE);
            if (cp != polls_seen[i]) {
                polls += cp - polls_seen[i];
                polls_seen[i] = cp;
                polled |= 1ull << i;
            }
        }
        if (polled != 0) {
            backends_watch(agent, false);
            uint64_t now = pdx_now_ns();
            if (hk_due == 0 ||
                polls < (uint64_t)nap_ms * PROGRESS_NAP_SPIN_POLLS) {
                nap_ms = PROGRESS_NAP_MIN_MS;
            } else if (nap_ms < PROGRESS_NAP_MAX_MS) {
                nap_ms *= 2;
            }
            int ms = nap_ms; /* not past housekeeping's due time */
            if (hk_due != 0 && hk_due <= now) {
                ms = 0;
            } else if (hk_due != 0 &&
                       (hk_due - now) / 1000000ull < (uint64_t)ms) {
                ms = (int)((hk_due - now) / 1000000ull) + 1;
            }
            int k = epoll_wait(agent->nap_epoll_fd, evs, 16, ms);
            bool exited = nap_events(agent, evs, k);
            waited = true;
            wait_end_ns = pdx_now_ns();
            if (k > 0) {
                pdx_stats_sock_serve(agent, 0); /* a stats client */
            }
            uint64_t seq = atomic_load_explicit(&g_destroyed_seq,
                                                memory_order_relaxed);
            if (!exited && hk_due != 0 && seq == hk_seq &&
                pdx_now_ns() < hk_due) {
                continue; /* nothing due: look at the callers again */
            }
            pdx_agent_lock(agent);
            if (exited || seq != hk_seq) {
                agent->last_liveness_ns = 0; /* liveness now */
            }
            hk_seq = seq;
            for (uint32_t i = 0; i < agent->nbackends; i++) {
                if (!(polled & (1ull << i))) {
                    backend_progress_unlocked(agent, agent->backends[i],
                                              NULL);
                }
            }
            if (housekeeping_locked(agent) > 0) {
                pdx_agent_signal(agent);
            }
            hk_due = hk_due_locked(agent, polled);
            uint64_t pass_ns = agent->last_full_progress_ns;
            pthread_mutex_unlock(&agent->lock);
            pdx_stats_sock_serve(agent, pass_ns);
            continue;
        }
        hk_due = 0;
        nap_ms = PROGRESS_NAP_MIN_MS;
        pdx_agent_lock(agent);
        int ended;
        int n = progress_pass_locked(agent, &ended) + spun;
        spun = 0;
        if (ended > 0) {
            /* Completions for a caller waiting on the agent's fd (a
             * notification, a peer's death signal it themselves). Not per
             * backend event: a target serving a stream would pay a write
             * per message (~1 us on the VM). */
            pdx_agent_signal(agent);
        }
        /* A burst ends only with a wait (a sleep, or a pass without
         * activity while polling): passes back to back, and one after a
         * busy arm, are one wake-up's work, not a stream. */
        bool in_burst = !waited;
        int timeout = 0;
        if (n == 0) {
            pdx_peer_watch_pidfds_locked(agent);
            /* The pass's clock: one read a pass while polling. */
            timeout = agent->last_full_progress_ns < poll_until
                          ? -2
                          : idle_timeout_locked(agent, stream_ns);
        } else {
            waited = false;
            uint64_t now = agent->last_full_progress_ns;
            if (!in_burst) {
                /* A new burst after a wait: a second one within
                 * PROGRESS_POLL_NS is a fast stream (a target serving a
                 * peer's emulated gets one at a time), within
                 * PROGRESS_STREAM_NS a stream. A lone message (a peer's
                 * keepalive) is served and the thread sleeps again. The
                 * gap is from the last active pass to the wait's end,
                 * not to this pass's clock: a pass that moves megabytes
                 * over TCP takes a millisecond, and a target serving
                 * 4 MiB READs back to back (65536 x 64) never started
                 * polling; it slept once a request. Every wait sets
                 * wait_end_ns after it, so it is past active_ns here. */
                uint64_t gap =
                    active_ns == 0 ? UINT64_MAX : wait_end_ns - active_ns;
                if (gap < PROGRESS_STREAM_NS) {
                    stream_ns = now;
                }
                if (gap < PROGRESS_POLL_NS) {
                    poll_until = now + PROGRESS_POLL_NS;
                }
            } else if (active_ns < poll_until) {
                /* A burst in a fast stream: poll until PROGRESS_POLL_NS
                 * after its end, not after its start. */
                poll_until = now + PROGRESS_POLL_NS;
            }
            active_ns = now;
        }
        /* Under the lock: a post or load after this sees it and wakes us
         * (one before it was seen by idle_timeout_locked). */
        __atomic_store_n(&agent->thread_sleeping, timeout > 0,
                         __ATOMIC_RELEASE);
        uint64_t pass_ns = agent->last_full_progress_ns;
        pthread_mutex_unlock(&agent->lock);
        pdx_stats_sock_serve(agent, pass_ns);
        if (timeout == 0) {
            continue; /* activity: progress again at once */
        }
        waited = true;
        if (timeout == -2) {
            /* Polling a fast stream: no system call between passes (a
             * sched_yield cost every message ~1.3 us on the VM, 40% of a
             * request); bounded by PROGRESS_POLL_NS after the last
             * activity. Between passes, the backends alone. */
            backends_watch(agent, false);
            spun = spin_backends(agent);
            wait_end_ns = pdx_now_ns();
            continue;
        }
        if (timeout < 0) {
            struct timespec pause = {
                0, (long)agent->params.progress_interval_us * 1000};
            nanosleep(&pause, NULL);
            wait_end_ns = pdx_now_ns();
            continue;
        }
        if (__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
            break;
        }
        backends_watch(agent, true);
        int k = epoll_wait(agent->prog_epoll_fd, evs, 16, timeout);
        __atomic_store_n(&agent->thread_sleeping, 0, __ATOMIC_RELEASE);
        wait_end_ns = pdx_now_ns();
        for (int i = 0; i < k; i++) {
            if (evs[i].data.fd == agent->nap_epoll_fd) {
                /* The wake fd, a pidfd or the stats socket: which? */
                struct epoll_event nevs[16];
                int nk = epoll_wait(agent->nap_epoll_fd, nevs, 16, 0);
                if (nap_events(agent, nevs, nk)) {
                    pthread_mutex_lock(&agent->lock);
                    agent->last_liveness_ns = 0; /* check the pidfds now */
                    pthread_mutex_unlock(&agent->lock);
                }
            }
        }
    }
    return NULL;
}

/* ---- the calls that drive progress for the caller ---- */

/* pdx_xfer_check of a request in flight without a progress thread runs a
 * full pass at most this often. */
#define FULL_PROGRESS_PERIOD_NS 100000ull

/* Progress `x`'s backend (without the agent lock: see struct pdx_agent),
 * then check `x`. Lock held, no backend busy; the lock is dropped and
 * retaken, so the caller keeps no pointer but `x`. When another thread
 * is progressing a backend, nothing is done: that thread's pass checks
 * every request. */
static void xfer_progress_own(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq == NULL || agent->be_busy) {
        return;
    }
    /* A polling caller progresses its request's backend at once (one
     * bounded call, without the lock), progress thread or not: waiting
     * for the thread to wake cost a request over UCX 60-120 us more than
     * UCX's own loop. The thread keeps out of the backends while callers
     * poll (the backend's caller_polls). */
    if (backend_progress_unlocked(agent, agent->backends[x->bindex], NULL)) {
        if (agent->thread_running) {
            /* Any change will do: a plain store, no locked add. */
            struct pdx_backend *b = agent->backends[x->bindex];
            __atomic_store_n(&b->caller_polls,
                             __atomic_load_n(&b->caller_polls,
                                             __ATOMIC_RELAXED) + 1,
                             __ATOMIC_RELEASE);
        }
    }
    pdx_xfer_progress_locked(agent, x);
}

pdx_status_t pdxi_xfer_post(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_status_t st;
    pdx_agent_lock(agent);
    if (x->status == PDX_INPROGRESS) {
        pdx_error("agent %s: xfer post: request still in progress",
                  agent->name);
        st = PDX_ERR_BUSY;
        goto out;
    }
    /* Ended (peer failed, timed out) but still being stopped: one more
     * look first (the lock is dropped in it, so before the peer lookup). */
    xfer_progress_own(agent, x);
    st = pdx_xfer_post_locked(agent, x);
    /* Callbacks the post made (a peer error) now that x is consistent
     * (none are queued when it returned before the backend's post). */
    run_deferred_locked(agent);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}

pdx_status_t pdxi_xfer_check(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    /* The plain lock: while another thread progresses a backend (the
     * progress thread, or a check on another thread) this returns the
     * state as it is, without waiting for that call. */
    pthread_mutex_lock(&agent->lock);
    if (!agent->be_busy && (x->status == PDX_INPROGRESS || x->breq != NULL)) {
        /* Its own backend, progressed without the lock: O(1) per call. */
        xfer_progress_own(agent, x);
        if (x->status == PDX_INPROGRESS && !agent->be_busy &&
            !agent->thread_running &&
            pdx_now_ns() - agent->last_full_progress_ns >=
                FULL_PROGRESS_PERIOD_NS) {
            /* Liveness, timeouts and the other requests: at most every
             * FULL_PROGRESS_PERIOD_NS, so a polling caller stays cheap. */
            pdx_progress_locked(agent);
        }
    }
    pdx_status_t st = x->status;
    if (st < 0) {
        /* Said once in the log when it happened; here for the caller. */
        pdx_peer_t *p = pdx_peer_find(agent, x->peer_name);
        bool same = p != NULL && p->epoch == x->peer_epoch;
        pdx_call_note("agent %s: request to %s (%s over %s): %s%s%s%s",
                      agent->name, x->peer_name,
                      x->op == PDX_XFER_READ ? "read" : "write",
                      agent->backends[x->bindex]->name,
                      pdx_status_string(st),
                      st == PDX_ERR_REMOTE_DISCONNECT && same ? ": peer "
                                                              : "",
                      st == PDX_ERR_REMOTE_DISCONNECT && same ? p->dead_how
                                                              : "",
                      st == PDX_ERR_STALE
                          ? x->stale ? ": the peer removed or changed a "
                                       "region it uses"
                                     : ": the peer was unloaded or reloaded "
                                       "since it was made"
                          : "");
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

/* pdx_xfer_release of a request still in flight waits (without the agent
 * lock) for the backend to say nothing more lands, at most this long. */
#define RELEASE_WAIT_MAX_NS 10000000000ull

void pdxi_xfer_release(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_agent_lock(agent);
    if (x->breq != NULL && x->status == PDX_INPROGRESS) {
        /* Still in flight: stop it and wait until the backend says no byte
         * of it can land, without the agent lock (other threads and peers
         * carry on). Bounded: backends give up on a silent peer (UCX fails
         * it after 1 s without progress). */
        if (!x->aborting) {
            x->aborting = true;
            if (!pdx_xfer_backend_abort_locked(agent, x)) {
                pdx_xfer_end_locked(agent, x, PDX_ERR_CANCELED);
            }
        }
        uint64_t start = pdx_now_ns();
        long sleep_ns = 2000;
        while (x->breq != NULL && x->status == PDX_INPROGRESS) {
            xfer_progress_own(agent, x);
            if (x->breq == NULL || x->status != PDX_INPROGRESS ||
                pdx_now_ns() - start > RELEASE_WAIT_MAX_NS) {
                break;
            }
            pthread_mutex_unlock(&agent->lock);
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns < 1000000 ? sleep_ns * 2 : 1000000;
            pdx_agent_lock(agent);
        }
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_end_locked(agent, x, PDX_ERR_CANCELED);
        }
    }
    pdx_xfer_free_locked(agent, x);
    pthread_mutex_unlock(&agent->lock);
}

int pdxi_notif_poll(pdx_agent_h agent, pdx_notif_cb_t cb, void *arg)
{
    /* The delivery lock keeps callbacks of concurrent polls in order; the
     * agent lock is dropped while callbacks run so they may call in. */
    pthread_mutex_lock(&agent->delivery);
    /* The plain lock: while a backend is progressed on another thread,
     * take what has arrived without waiting for that call. */
    pthread_mutex_lock(&agent->lock);
    if (!agent->thread_running) {
        pdx_progress_locked(agent); /* the thread does, if any */
    }
    pdx_notif_item_t *list = agent->nq_head;
    agent->nq_head = agent->nq_tail = NULL;
    uint64_t v;
    if (read(agent->event_fd, &v, sizeof(v)) < 0) {
        /* nothing pending */
    }
    pthread_mutex_unlock(&agent->lock);
    int n = 0;
    while (list != NULL) {
        pdx_notif_item_t *it = list;
        list = it->next;
        int depth = pdx_call_suspend();
        cb(arg, it->peer, it->msg, it->len);
        pdx_call_resume(depth);
        free(it);
        n++;
    }
    pthread_mutex_unlock(&agent->delivery);
    return n;
}

/* pdx_mem_deregister's notice (ctl.c): tell every live loaded peer that
 * carries notifications that `r` goes away and wait, dropping and
 * retaking the lock, until each acknowledged, died, or the bound passed.
 * `r` is out of agent->regs already and not freed. */
static void region_gone_wait_locked(pdx_agent_h agent,
                                    const struct pdx_mem_reg *r)
{
    pdx_ctl_wait_t w;
    if (!pdx_ctl_gone_begin_locked(agent, r, &w)) {
        return;
    }
    uint64_t start = pdx_now_ns();
    uint64_t deadline = start + pdx_ctl_wait_bound_ms(agent) * 1000000ull;
    while (w.left > 0) {
        pdx_progress_locked(agent);
        pdx_ctl_gone_check_locked(agent, &w);
        if (w.left == 0 || pdx_now_ns() >= deadline) {
            break;
        }
        pthread_mutex_unlock(&agent->lock);
        struct timespec ts = {0, 200000}; /* 0.2 ms between passes */
        nanosleep(&ts, NULL);
        pdx_agent_lock(agent);
    }
    pdx_ctl_gone_end_locked(agent, r, &w, start);
}

pdx_status_t pdxi_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg)
{
    pdx_agent_lock(agent);
    pdx_status_t st = pdx_mem_unlink_locked(agent, reg);
    if (st == PDX_OK) {
        /* Loaded peers are told and acknowledge (bounded) before the keys
         * go, so none reads the memory once this returns. */
        region_gone_wait_locked(agent, reg);
        pdx_mem_reg_free_locked(agent, reg);
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}
