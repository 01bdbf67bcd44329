/* The progress thread (PDX_AGENT_F_PROGRESS_THREAD): sleeps on one epoll
 * set (the backends' event fds, the wake fd, pidfds, the stats socket)
 * with a timeout only for timers, polls through a fast stream of
 * activity, and naps out of the way while callers poll their own
 * requests. Its passes are progress.c's. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "backend_int.h"
#include "peer_death_int.h"
#include "peer_int.h"
#include "progress_int.h"
#include "stats_int.h"
#include "xfer_int.h"

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
        pdx_progress_run_deferred_locked(agent);
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

/* The thread's state between passes. */
typedef struct thread_state {
    struct epoll_event evs[16];
    uint64_t stream_ns;   /* last burst of a stream */
    uint64_t active_ns;   /* last pass with activity */
    uint64_t poll_until;  /* a fast stream: poll, do not sleep, until */
    uint64_t wait_end_ns; /* when the last wait (sleep, nap, spin) ended */
    bool waited;          /* a wait since the last active pass */
    int spun;             /* events the spin saw, for the next pass */
    uint64_t hk_due;      /* callers poll: housekeeping due (0: each nap) */
    uint64_t hk_seq;      /* same-process destroys seen by it */
    int nap_ms;           /* the last nap's length */
    uint64_t polls_seen[PDX_MAX_BACKENDS];
} thread_state_t;

/* Which backends callers polled since the last look (bit i: backend i),
 * and how many checks they made (*polls_p). No lock: backends are
 * published with a release store of nbackends. */
static uint64_t callers_polled(pdx_agent_h agent, thread_state_t *t,
                               uint64_t *polls_p)
{
    uint64_t polled = 0;
    uint64_t polls = 0;
    uint32_t nb = __atomic_load_n(&agent->nbackends, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t cp = __atomic_load_n(&agent->backends[i]->caller_polls,
                                      __ATOMIC_ACQUIRE);
        if (cp != t->polls_seen[i]) {
            polls += cp - t->polls_seen[i];
            t->polls_seen[i] = cp;
            polled |= 1ull << i;
        }
    }
    *polls_p = polls;
    return polled;
}

/* A caller polling its request progresses that backend itself
 * (pdx_xfer_check): keep out of its way (no second thread in the
 * backend, no core taken from it, no lock taken for nothing) while it
 * polls, napping (PROGRESS_NAP_MIN_MS, longer while a caller spins) on
 * the pidfds, the stats socket and the wake fd; housekeeping (and the
 * other backends) when due (hk_due_locked). */
static void nap_while_callers_poll(pdx_agent_h agent, thread_state_t *t,
                                   uint64_t polled, uint64_t polls)
{
    backends_watch(agent, false);
    uint64_t now = pdx_now_ns();
    if (t->hk_due == 0 ||
        polls < (uint64_t)t->nap_ms * PROGRESS_NAP_SPIN_POLLS) {
        t->nap_ms = PROGRESS_NAP_MIN_MS;
    } else if (t->nap_ms < PROGRESS_NAP_MAX_MS) {
        t->nap_ms *= 2;
    }
    int ms = t->nap_ms; /* not past housekeeping's due time */
    if (t->hk_due != 0 && t->hk_due <= now) {
        ms = 0;
    } else if (t->hk_due != 0 &&
               (t->hk_due - now) / 1000000ull < (uint64_t)ms) {
        ms = (int)((t->hk_due - now) / 1000000ull) + 1;
    }
    int k = epoll_wait(agent->nap_epoll_fd, t->evs, 16, ms);
    bool exited = nap_events(agent, t->evs, k);
    t->waited = true;
    t->wait_end_ns = pdx_now_ns();
    if (k > 0) {
        pdx_stats_sock_serve(agent, 0); /* a stats client */
    }
    uint64_t seq = pdx_peer_destroyed_seq();
    if (!exited && t->hk_due != 0 && seq == t->hk_seq &&
        pdx_now_ns() < t->hk_due) {
        return; /* nothing due: look at the callers again */
    }
    pdx_agent_lock(agent);
    if (exited || seq != t->hk_seq) {
        agent->last_liveness_ns = 0; /* liveness now */
    }
    t->hk_seq = seq;
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if (!(polled & (1ull << i))) {
            pdx_progress_backend_unlocked(agent, agent->backends[i], NULL);
        }
    }
    if (pdx_progress_housekeeping_locked(agent) > 0) {
        pdx_agent_signal(agent);
    }
    t->hk_due = hk_due_locked(agent, polled);
    uint64_t pass_ns = agent->last_full_progress_ns;
    pthread_mutex_unlock(&agent->lock);
    pdx_stats_sock_serve(agent, pass_ns);
}

/* A pass with activity at `now`, after a wait (`in_burst` false) or in a
 * burst: streams and fast streams start and last from here. A new burst
 * after a wait: a second one within PROGRESS_POLL_NS is a fast stream (a
 * target serving a peer's emulated gets one at a time), within
 * PROGRESS_STREAM_NS a stream. A lone message (a peer's keepalive) is
 * served and the thread sleeps again. The gap is from the last active pass
 * to the wait's end, not to this pass's clock: a pass that moves megabytes
 * over TCP takes a millisecond, and a target serving 4 MiB READs back to
 * back (65536 x 64) never started polling; it slept once a request. Every
 * wait sets wait_end_ns after it, so it is past active_ns here. */
static void note_activity(thread_state_t *t, bool in_burst, uint64_t now)
{
    t->waited = false;
    if (!in_burst) {
        uint64_t gap =
            t->active_ns == 0 ? UINT64_MAX : t->wait_end_ns - t->active_ns;
        if (gap < PROGRESS_STREAM_NS) {
            t->stream_ns = now;
        }
        if (gap < PROGRESS_POLL_NS) {
            t->poll_until = now + PROGRESS_POLL_NS;
        }
    } else if (t->active_ns < t->poll_until) {
        /* A burst in a fast stream: poll until PROGRESS_POLL_NS after its
         * end, not after its start. */
        t->poll_until = now + PROGRESS_POLL_NS;
    }
    t->active_ns = now;
}

/* One full pass and what to do next: 0, progress again at once; -2, poll
 * a fast stream; -1, a short fixed pause; else sleep on events at most
 * that many ms (idle_timeout_locked). */
static int full_pass(pdx_agent_h agent, thread_state_t *t)
{
    pdx_agent_lock(agent);
    int ended;
    int n = pdx_progress_pass_locked(agent, &ended) + t->spun;
    t->spun = 0;
    if (ended > 0) {
        /* Completions for a caller waiting on the agent's fd (a
         * notification, a peer's death signal it themselves). Not per
         * backend event: a target serving a stream would pay a write per
         * message (~1 us on the VM). */
        pdx_agent_signal(agent);
    }
    /* A burst ends only with a wait (a sleep, or a pass without activity
     * while polling): passes back to back, and one after a busy arm, are
     * one wake-up's work, not a stream. */
    bool in_burst = !t->waited;
    int timeout = 0;
    if (n == 0) {
        pdx_peer_watch_pidfds_locked(agent);
        /* The pass's clock: one read a pass while polling. */
        timeout = agent->last_full_progress_ns < t->poll_until
                      ? -2
                      : idle_timeout_locked(agent, t->stream_ns);
    } else {
        note_activity(t, in_burst, agent->last_full_progress_ns);
    }
    /* Under the lock: a post or load after this sees it and wakes us (one
     * before it was seen by idle_timeout_locked). */
    __atomic_store_n(&agent->thread_sleeping, timeout > 0, __ATOMIC_RELEASE);
    uint64_t pass_ns = agent->last_full_progress_ns;
    pthread_mutex_unlock(&agent->lock);
    pdx_stats_sock_serve(agent, pass_ns);
    return timeout;
}

/* Sleep on the thread's set (the backends' event fds back in it) at most
 * `timeout` ms; a peer's exit seen there asks for liveness at once. */
static void sleep_on_events(pdx_agent_h agent, thread_state_t *t, int timeout)
{
    backends_watch(agent, true);
    int k = epoll_wait(agent->prog_epoll_fd, t->evs, 16, timeout);
    __atomic_store_n(&agent->thread_sleeping, 0, __ATOMIC_RELEASE);
    t->wait_end_ns = pdx_now_ns();
    for (int i = 0; i < k; i++) {
        if (t->evs[i].data.fd == agent->nap_epoll_fd) {
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

void *pdx_progress_main(void *arg)
{
    pdx_agent_h agent = arg;
    thread_state_t t = {.waited = true, .nap_ms = PROGRESS_NAP_MIN_MS};
    pdx_log_thread_agent(agent->name);
    while (!__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
        uint64_t polls;
        uint64_t polled = callers_polled(agent, &t, &polls);
        if (polled != 0) {
            nap_while_callers_poll(agent, &t, polled, polls);
            continue;
        }
        t.hk_due = 0;
        t.nap_ms = PROGRESS_NAP_MIN_MS;
        int timeout = full_pass(agent, &t);
        if (timeout == 0) {
            continue; /* activity: progress again at once */
        }
        t.waited = true;
        if (timeout == -2) {
            /* Polling a fast stream: no system call between passes (a
             * sched_yield cost every message ~1.3 us on the VM, 40% of a
             * request); bounded by PROGRESS_POLL_NS after the last
             * activity. Between passes, the backends alone. */
            backends_watch(agent, false);
            t.spun = spin_backends(agent);
            t.wait_end_ns = pdx_now_ns();
            continue;
        }
        if (timeout < 0) {
            struct timespec pause = {
                0, (long)agent->params.progress_interval_us * 1000};
            nanosleep(&pause, NULL);
            t.wait_end_ns = pdx_now_ns();
            continue;
        }
        if (__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
            break;
        }
        sleep_on_events(agent, &t, timeout);
    }
    return NULL;
}
