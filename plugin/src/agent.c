/* Agent life cycle, backends, invariants, progress (explicit and thread),
 * liveness checks and the event fd. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"
#include "api_int.h"

#define LIVENESS_PERIOD_NS 1000000ull /* pidfd poll at most once a ms */

static int valid_agent_name(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= PDX_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            return 0;
        }
    }
    return 1;
}

void pdx_agent_signal(pdx_agent_h agent)
{
    uint64_t one = 1;
    if (write(agent->event_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is saturated, the fd is readable anyway */
    }
}

static void drain_event_fd(pdx_agent_h agent)
{
    uint64_t v;
    if (read(agent->event_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing to drain */
    }
}

/* The agent whose backend this thread is progressing without the agent
 * lock (pdx_backend_progress_unlocked): its callbacks are queued. */
static __thread pdx_agent_h t_unlocked;

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
static void host_notif_recv(void *ctx, const char *peer, const void *msg,
                            size_t len)
{
    pdx_agent_h agent = ctx;
    if (t_unlocked == agent) {
        defer_event(agent, 0, peer, PDX_OK, msg, len);
        return;
    }
    notif_recv_locked(agent, peer, msg, len);
}

static void notif_recv_locked(pdx_agent_h agent, const char *peer,
                              const void *msg, size_t len)
{
    if (pdx_ctl_recv_locked(agent, peer, msg, len)) {
        return; /* notif.c: a region-removal notice, not the app's */
    }
    pdx_stats_entry_t *ps = pdx_peer_stats_get(agent, peer);
    if (ps != NULL) {
        ps->s.notifs_recv++;
    }
    pdx_notif_item_t *it = malloc(sizeof(*it) + len);
    if (it == NULL) {
        pdx_error("agent %s: dropped a %zu-byte notification from %s: out "
                  "of memory", agent->name, len, peer);
        return;
    }
    it->next = NULL;
    it->len = len;
    snprintf(it->peer, sizeof(it->peer), "%s", peer);
    if (len > 0) {
        memcpy(it->msg, msg, len);
    }
    if (agent->nq_tail != NULL) {
        agent->nq_tail->next = it;
    } else {
        agent->nq_head = it;
    }
    agent->nq_tail = it;
    pdx_agent_signal(agent);
}

void pdx_peer_mark_dead_locked(pdx_agent_h agent, pdx_peer_t *peer,
                               pdx_status_t why, const char *how,
                               bool in_backend)
{
    if (peer->dead != PDX_OK) {
        return;
    }
    peer->dead = why;
    snprintf(peer->dead_how, sizeof(peer->dead_how), "%s", how);
    peer->dead_ns = pdx_now_ns();
    if (peer->stats != NULL) {
        peer->stats->s.dead_events++;
    }
    pdx_warn("agent %s: peer %s (pid %d) is gone (%s): failing its requests",
             agent->name, peer->name, (int)peer->pid, how);
    if (!in_backend) {
        /* Backends drop the connection without waiting (UCX force-closes
         * the endpoint), so its requests end now, not after a drain. */
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            const pdx_backend_ops_t *ops = agent->backends[b]->ops;
            if (peer->bpeer[b] != NULL && PDX_BE_HAS(ops, peer_failed)) {
                ops->peer_failed(agent->backends[b]->be, peer->bpeer[b]);
            }
        }
    }
    pdx_xfer_fail_peer_locked(agent, peer->epoch, why,
                              in_backend ? PDX_FAIL_MARK : PDX_FAIL_ABORT);
    pdx_agent_signal(agent);
}

static void host_peer_error(void *ctx, const char *peer_name, pdx_status_t why)
{
    pdx_agent_h agent = ctx;
    if (t_unlocked == agent) {
        defer_event(agent, 1, peer_name, why, NULL, 0);
        return;
    }
    peer_error_locked(agent, peer_name, why);
}

static void peer_error_locked(pdx_agent_h agent, const char *peer_name,
                              pdx_status_t why)
{
    pdx_peer_t *peer = pdx_peer_find(agent, peer_name);
    if (peer != NULL) {
        pdx_peer_mark_dead_locked(agent, peer, why, "connection error", true);
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

static void announce_destroyed(uint64_t instance)
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
                pdx_peer_mark_dead_locked(agent, p,
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
        struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0) {
            pdx_peer_mark_dead_locked(agent, p, PDX_ERR_REMOTE_DISCONNECT,
                           "process exited", false);
            p->dead_final = true;
        }
    }
}

void pdx_agent_lock(pdx_agent_h agent)
{
    pthread_mutex_lock(&agent->lock);
    if (!agent->be_busy) {
        return;
    }
    agent->be_waiters++;
    while (agent->be_busy) {
        pthread_cond_wait(&agent->be_cond, &agent->lock);
    }
    if (--agent->be_waiters == 0) {
        pthread_cond_broadcast(&agent->be_cond); /* the progressing thread */
    }
}

/* Handle what callbacks queued during an unlocked progress call. */
void pdx_agent_run_deferred_locked(pdx_agent_h agent)
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

void pdx_backend_unlock_begin(pdx_agent_h agent)
{
    agent->be_busy = true;
    pthread_mutex_unlock(&agent->lock);
    t_unlocked = agent;
}

void pdx_backend_unlock_end(pdx_agent_h agent)
{
    t_unlocked = NULL;
    pthread_mutex_lock(&agent->lock);
    agent->be_busy = false;
    pthread_cond_broadcast(&agent->be_cond); /* waiters, and a progress */
}

bool pdx_backend_progress_unlocked(pdx_agent_h agent, struct pdx_backend *b,
                                   int *events_p)
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
    pdx_agent_run_deferred_locked(agent);
    if (events_p != NULL) {
        *events_p += n > 0 ? n : 0;
    }
    return true;
}

int pdx_agent_progress_locked(pdx_agent_h agent)
{
    int events = 0;
    if (agent->be_busy) {
        return 0; /* mid-pass in another thread: that pass covers it */
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        if (!pdx_backend_progress_unlocked(agent, agent->backends[i],
                                           &events)) {
            return events;
        }
    }
    uint64_t now = pdx_now_ns();
    agent->last_full_progress_ns = now;
    check_liveness(agent, now);
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_progress_locked(agent, x);
            if (x->status != PDX_INPROGRESS) {
                events++;
            }
        } else if (x->breq != NULL) {
            pdx_xfer_progress_locked(agent, x); /* sweep a failed one */
        }
    }
    pdx_xfer_timeouts_locked(agent, now);
    if (agent->ctl_acks != NULL) {
        pdx_ctl_progress_locked(agent); /* notif.c: removal acks */
    }
    return events;
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
    drain_event_fd(agent);
    int n = pdx_agent_progress_locked(agent);
    if (agent->nq_head != NULL) {
        /* Keep the fd readable while notifications wait for a poll. */
        pdx_agent_signal(agent);
    }
    arm_backends(agent);
    pthread_mutex_unlock(&agent->lock);
    if (!agent->thread_running) {
        pdx_stats_sock_serve(agent);
    }
    return n;
}

void pdx_agent_wake(pdx_agent_h agent)
{
    if (__atomic_load_n(&agent->thread_sleeping, __ATOMIC_ACQUIRE)) {
        uint64_t one = 1;
        if (write(agent->wake_fd, &one, sizeof(one)) < 0) {
            /* EAGAIN: the counter is full, so it is readable anyway. */
        }
    }
}

/* Longest sleep of an idle progress thread: the housekeeping a backend may
 * need without an event (a UCX close whose flush deadline passes, a
 * same-process peer's destroy), and a safety net should an event be missed
 * (then it is late by this much, never lost). Ten wake-ups a second cost
 * well under a millisecond of CPU. */
#define PROGRESS_IDLE_MS 100
#define PROGRESS_SPIN_NS 10000000ull
/* Longest sleep with requests in flight on event-fd backends only: how
 * late a request timeout can be noticed (their unit is ms). */
#define PROGRESS_INFLIGHT_MS 1

/* Add pidfds of peers loaded since the last pass to the progress thread's
 * set (a closed pidfd leaves it by itself). Lock held. */
static void watch_pidfds_locked(pdx_agent_h agent)
{
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->pidfd >= 0 && !p->pidfd_watched) {
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = p->pidfd};
            if (epoll_ctl(agent->prog_epoll_fd, EPOLL_CTL_ADD, p->pidfd,
                          &ev) != 0 && errno != EEXIST) {
                pdx_debug("agent %s: pidfd of %s not watched: %s",
                          agent->name, p->name, strerror(errno));
            }
            p->pidfd_watched = true;
        }
    }
}

/* How long the progress thread may sleep now, in ms: 0, progress again at
 * once (a backend has events pending); -1, a short fixed pause
 * (progress_interval_us): a request is in flight on a backend without an
 * event fd (cma completes in its own threads and is polled), or, with no
 * request in flight, there was activity shortly ago (PROGRESS_SPIN_NS: a
 * target serving a peer's stream serves the next message at once); else
 * every backend's event fd is armed and the thread sleeps
 * until an event (a message or completion for a backend, a peer's exit, a
 * stats client, a wake), or PROGRESS_INFLIGHT_MS with requests in flight
 * (their timeouts), or PROGRESS_IDLE_MS. Lock held, no backend busy. */
static int idle_timeout_locked(pdx_agent_h agent, uint64_t *busy_ns)
{
    uint64_t now = pdx_now_ns();
    bool inflight = false, polled = false;
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS || x->breq != NULL) {
            inflight = true;
            if (!(agent->backends[x->bindex]->ops->caps &
                  PDX_BACKEND_CAP_EVENT_FD)) {
                polled = true;
                break;
            }
        }
    }
    if (polled) {
        *busy_ns = now;
        return -1;
    }
    if (!inflight && now - *busy_ns < PROGRESS_SPIN_NS) {
        return -1; /* activity shortly ago: the next message may follow */
    }
    for (uint32_t i = 0; i < agent->nbackends; i++) {
        struct pdx_backend *b = agent->backends[i];
        if ((b->ops->caps & PDX_BACKEND_CAP_EVENT_FD) &&
            b->ops->arm(b->be) == PDX_ERR_BUSY) {
            return 0;
        }
    }
    return inflight ? PROGRESS_INFLIGHT_MS : PROGRESS_IDLE_MS;
}

static void *progress_main(void *arg)
{
    pdx_agent_h agent = arg;
    struct epoll_event evs[16];
    uint64_t busy_ns = 0; /* last pass with activity or a polled request */
    while (!__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
        pdx_agent_lock(agent);
        int n = pdx_agent_progress_locked(agent);
        if (n > 0) {
            pdx_agent_signal(agent);
        }
        int timeout = 0;
        if (n == 0) {
            watch_pidfds_locked(agent);
            timeout = idle_timeout_locked(agent, &busy_ns);
        } else {
            /* Activity (a target serving a peer's emulated gets): keep
             * short passes for PROGRESS_SPIN_NS before sleeping on events.
             * Without it a target waited on UCX's event fd per message,
             * and a missed event cost the 100 ms idle bound: a READ to a
             * live peer timed out (1.5 s) in CI's stall_ucx_kill. */
            busy_ns = pdx_now_ns();
        }
        /* Under the lock: a post or load after this sees it and wakes us
         * (one before it was seen by idle_timeout_locked). */
        __atomic_store_n(&agent->thread_sleeping, timeout > 0,
                         __ATOMIC_RELEASE);
        pthread_mutex_unlock(&agent->lock);
        pdx_stats_sock_serve(agent);
        if (timeout == 0) {
            continue; /* activity: progress again at once */
        }
        if (timeout < 0) {
            struct timespec pause = {
                0, (long)agent->params.progress_interval_us * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        if (__atomic_load_n(&agent->stop, __ATOMIC_ACQUIRE)) {
            break;
        }
        int k = epoll_wait(agent->prog_epoll_fd, evs, 16, timeout);
        __atomic_store_n(&agent->thread_sleeping, 0, __ATOMIC_RELEASE);
        for (int i = 0; i < k; i++) {
            if (evs[i].data.fd == agent->wake_fd) {
                uint64_t v;
                if (read(agent->wake_fd, &v, sizeof(v)) < 0) {
                    /* EAGAIN: another reader took it */
                }
            }
        }
    }
    return NULL;
}

pdx_status_t pdxi_agent_create(const char *name,
                              const pdx_agent_params_t *params,
                              pdx_agent_h *agent_p)
{
    if (!valid_agent_name(name) || agent_p == NULL) {
        pdx_error("agent create: invalid name '%s' (1-%d chars of "
                  "[A-Za-z0-9._-])", name ? name : "(null)", PDX_NAME_MAX - 1);
        return PDX_ERR_INVALID;
    }
    if (params != NULL &&
        (params->field_mask & PDX_AGENT_PARAM_PATH_POLICY) &&
        params->path_policy > PDX_PATH_POLICY_SAME_HOST_FAST) {
        pdx_error("agent create %s: unknown path policy %u", name,
                  params->path_policy);
        return PDX_ERR_INVALID;
    }
    pdx_agent_h a = pdx_handle_alloc(sizeof(*a), PDX_MAGIC_AGENT);
    if (a == NULL) {
        return PDX_ERR_NOMEM;
    }
    snprintf(a->name, sizeof(a->name), "%s", name);
    a->params.xfer_timeout_ms = 60000;
    a->params.progress_interval_us = 50;
    if (params != NULL) {
        if (params->field_mask & PDX_AGENT_PARAM_FLAGS) {
            a->params.flags = params->flags;
        }
        if (params->field_mask & PDX_AGENT_PARAM_XFER_TIMEOUT) {
            a->params.xfer_timeout_ms = params->xfer_timeout_ms;
        }
        if (params->field_mask & PDX_AGENT_PARAM_PROGRESS_INTERVAL) {
            a->params.progress_interval_us = params->progress_interval_us;
        }
        if (params->field_mask & PDX_AGENT_PARAM_PATH_POLICY) {
            a->params.path_policy = params->path_policy;
        }
    }
    if (getrandom(&a->instance, sizeof(a->instance), 0) !=
        sizeof(a->instance)) {
        a->instance = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
    }
    a->destroyed_seen = atomic_load(&g_destroyed_seq);
    a->generation = 1;
    a->next_epoch = 1;
    pdx_host_id(a->host_id, sizeof(a->host_id));
    a->host = (pdx_backend_host_t){
        .agent_ctx = a, .agent_name = a->name, .host_id = a->host_id,
        .notif_recv = host_notif_recv, .peer_error = host_peer_error};

    pdx_status_t st = pdxi_ckey_init(&a->ckey, a->name, params);
    if (st != PDX_OK) {
        goto err_free;
    }
    a->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->event_fd < 0) {
        pdx_error("agent %s: eventfd failed: %s", name, strerror(errno));
        st = PDX_ERR_IO;
        goto err_free;
    }
    /* One fd for epoll users: readable when the agent has something queued
     * or a backend has work for pdx_progress. */
    a->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = a->event_fd};
    if (a->epoll_fd < 0 ||
        epoll_ctl(a->epoll_fd, EPOLL_CTL_ADD, a->event_fd, &ev) != 0) {
        pdx_error("agent %s: epoll setup failed: %s", name, strerror(errno));
        if (a->epoll_fd >= 0) {
            close(a->epoll_fd);
        }
        close(a->event_fd);
        st = PDX_ERR_IO;
        goto err_free;
    }
    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    a->prog_epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = a->wake_fd};
    if (a->wake_fd < 0 || a->prog_epoll_fd < 0 ||
        epoll_ctl(a->prog_epoll_fd, EPOLL_CTL_ADD, a->wake_fd, &ev) != 0) {
        pdx_error("agent %s: progress wait setup failed: %s", name,
                  strerror(errno));
        if (a->wake_fd >= 0) {
            close(a->wake_fd);
        }
        if (a->prog_epoll_fd >= 0) {
            close(a->prog_epoll_fd);
        }
        close(a->epoll_fd);
        close(a->event_fd);
        st = PDX_ERR_IO;
        goto err_free;
    }
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->be_cond, NULL);
    pthread_mutex_init(&a->delivery, NULL);
    pdx_stats_sock_open(a);
    if (a->stats_fd >= 0) {
        ev = (struct epoll_event){.events = EPOLLIN, .data.fd = a->stats_fd};
        (void)epoll_ctl(a->prog_epoll_fd, EPOLL_CTL_ADD, a->stats_fd, &ev);
    }
    if (a->params.flags & PDX_AGENT_F_PROGRESS_THREAD) {
        int rc = pthread_create(&a->progress_thread, NULL, progress_main, a);
        if (rc != 0) {
            pdx_error("agent %s: progress thread: %s", name, strerror(rc));
            st = PDX_ERR_IO;
            goto err_mutex;
        }
        a->thread_running = true;
    }
    pdx_info("agent %s: created (host %s, instance %016llx)", a->name,
             a->host_id, (unsigned long long)a->instance);
    if (params != NULL && (params->field_mask & PDX_AGENT_PARAM_STORE) &&
        (st = pdx_store_agent_init(a, params)) != PDX_OK) {
        pdxi_agent_destroy(a);
        return st;
    }
    *agent_p = a;
    return PDX_OK;

err_mutex:
    pdx_stats_sock_close(a);
    pthread_mutex_destroy(&a->delivery);
    pthread_cond_destroy(&a->be_cond);
    pthread_mutex_destroy(&a->lock);
    close(a->prog_epoll_fd);
    close(a->wake_fd);
    close(a->epoll_fd);
    close(a->event_fd);
err_free:
    pdxi_ckey_clear(&a->ckey);
    pdx_handle_release(a);
    return st;
}

void pdxi_agent_destroy(pdx_agent_h a)
{
    if (a == NULL) {
        return;
    }
    /* Agents of this process that loaded this one fail their requests to
     * it at their next liveness pass instead of waiting for a timeout. */
    announce_destroyed(a->instance);
    pdx_store_agent_fini(a); /* store.c: no store event after this */
    if (a->thread_running) {
        __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        if (write(a->wake_fd, &one, sizeof(one)) < 0) {
            /* full counter: readable anyway */
        }
        pthread_join(a->progress_thread, NULL);
    }
    pdx_agent_lock(a);
    /* Requests the caller did not release: abort and free them. */
    while (a->xfers != NULL) {
        struct pdx_xfer *x = a->xfers;
        pthread_mutex_unlock(&a->lock);
        pdx_warn("agent %s: destroying an unreleased request to %s", a->name,
                 x->peer_name);
        pdx_xfer_release(x);
        pdx_agent_lock(a);
    }
    while (a->peers != NULL) {
        pdx_peer_destroy_locked(a, a->peers);
    }
    for (size_t i = 0; i < a->nregs; i++) {
        pdx_mem_reg_free_locked(a, a->regs[i]);
    }
    free(a->regs);
    while (a->xfer_cache != NULL) {
        struct pdx_xfer *x = a->xfer_cache;
        a->xfer_cache = x->next;
        free(x);
    }
    a->xfer_cache_tail = NULL;
    while (a->peer_stats != NULL) {
        pdx_stats_entry_t *e = a->peer_stats;
        a->peer_stats = e->next;
        free(e);
    }
    /* Progress once more so backends can complete queued sends. */
    for (uint32_t b = a->nbackends; b-- > 0;) {
        struct pdx_backend *be = a->backends[b];
        be->ops->destroy(be->be);
        if (be->dl != NULL) {
            dlclose_backend(be->dl);
        }
        free(be);
    }
    while (a->nq_head != NULL) {
        pdx_notif_item_t *it = a->nq_head;
        a->nq_head = it->next;
        free(it);
    }
    pthread_mutex_unlock(&a->lock);
    pdx_stats_sock_close(a);
    pthread_mutex_destroy(&a->delivery);
    pthread_cond_destroy(&a->be_cond);
    pthread_mutex_destroy(&a->lock);
    close(a->prog_epoll_fd);
    close(a->wake_fd);
    close(a->epoll_fd);
    close(a->event_fd);
    pdxi_ckey_clear(&a->ckey);
    pdx_handle_release(a);
}

const char *pdxi_agent_name(pdx_agent_h agent) { return agent->name; }

int pdxi_agent_event_fd(pdx_agent_h agent) { return agent->epoll_fd; }


static pdx_status_t backend_add(pdx_agent_h a, const pdx_backend_ops_t *ops,
                                void *dl, const pdx_kv_t *opts, size_t nopts,
                                pdx_backend_h *be_p)
{
    pdx_status_t st;
    char why[256] = "";
    if (a->nbackends == PDX_MAX_BACKENDS) {
        pdx_error("agent %s: at most %d backends", a->name, PDX_MAX_BACKENDS);
        return PDX_ERR_TOO_LARGE;
    }
    for (uint32_t i = 0; i < a->nbackends; i++) {
        if (strcmp(a->backends[i]->name, ops->name) == 0) {
            pdx_error("agent %s: backend %s already created", a->name,
                      ops->name);
            return PDX_ERR_EXISTS;
        }
    }
    if (a->nregs > 0 || a->peers != NULL) {
        pdx_error("agent %s: create backend %s before registering memory or "
                  "loading peers", a->name, ops->name);
        return PDX_ERR_INVALID;
    }
    st = ops->query(why, sizeof(why));
    if (st != PDX_OK) {
        pdx_warn("agent %s: backend %s unavailable: %s", a->name, ops->name,
                 why);
        return PDX_ERR_UNAVAILABLE;
    }
    struct pdx_backend *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    b->magic = PDX_MAGIC_BACKEND;
    b->agent = a;
    b->ops = ops;
    b->dl = dl;
    b->index = a->nbackends;
    snprintf(b->name, sizeof(b->name), "%s", ops->name);
    st = ops->create(&a->host, opts, nopts, &b->be);
    if (st != PDX_OK) {
        pdx_error("agent %s: backend %s create failed: %s", a->name,
                  ops->name, pdx_status_string(st));
        free(b);
        return st;
    }
    int bfd = (ops->caps & PDX_BACKEND_CAP_EVENT_FD) ? ops->event_fd(b->be)
                                                     : -1;
    if (bfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = bfd};
        if (epoll_ctl(a->epoll_fd, EPOLL_CTL_ADD, bfd, &ev) != 0 ||
            epoll_ctl(a->prog_epoll_fd, EPOLL_CTL_ADD, bfd, &ev) != 0) {
            pdx_warn("agent %s: backend %s event fd not watched: %s",
                     a->name, ops->name, strerror(errno));
        }
        pdx_agent_wake(a);
        if (ops->arm(b->be) == PDX_ERR_BUSY) {
            pdx_agent_signal(a);
        }
    }
    a->backends[a->nbackends++] = b;
    a->generation++;
    pdx_store_agent_changed_locked(a);
    char desc[256] = "";
    ops->describe(b->be, desc, sizeof(desc));
    pdx_info("agent %s: backend %s ready: %s", a->name, b->name, desc);
    if (be_p != NULL) {
        *be_p = b;
    }
    return PDX_OK;
}

pdx_status_t pdxi_backend_create(pdx_agent_h agent, const char *name,
                                const pdx_kv_t *opts, size_t nopts,
                                pdx_backend_h *be_p)
{
    const pdx_backend_ops_t *ops;
    void *dl;
    char why[512];
    pdx_status_t st = pdx_loader_open(name, &ops, &dl, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("agent %s: backend %s: %s", agent->name,
                  name ? name : "(null)", why);
        return st;
    }
    pdx_agent_lock(agent);
    st = backend_add(agent, ops, dl, opts, nopts, be_p);
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        dlclose_backend(dl);
    }
    return st;
}

pdx_status_t pdxi_backend_create_with_ops(pdx_agent_h agent, const void *ops,
                                         const pdx_kv_t *opts, size_t nopts,
                                         pdx_backend_h *be_p)
{
    const pdx_backend_ops_t *o = ops;
    if (o == NULL || o->abi_version != PDX_BACKEND_ABI_VERSION ||
        o->size < PDX_BACKEND_OPS_MIN_SIZE) {
        pdx_error("agent %s: backend ops table rejected (abi or size)",
                  agent->name);
        return PDX_ERR_VERSION;
    }
    pdx_agent_lock(agent);
    pdx_status_t st = backend_add(agent, o, NULL, opts, nopts, be_p);
    pthread_mutex_unlock(&agent->lock);
    return st;
}

void pdxi_backend_describe(pdx_backend_h be, char *buf, size_t len)
{
    pdx_agent_lock(be->agent);
    int n = snprintf(buf, len, "%s: ", be->name);
    if (n >= 0 && (size_t)n < len) {
        be->ops->describe(be->be, buf + n, len - (size_t)n);
    }
    pthread_mutex_unlock(&be->agent->lock);
}

pdx_status_t pdxi_agent_set_invariant(pdx_agent_h agent, const char *key,
                                     const char *value)
{
    if (key == NULL || value == NULL || key[0] == '\0' ||
        strlen(key) >= PDX_INV_KEY_MAX || strlen(value) >= PDX_INV_VAL_MAX) {
        pdx_error("agent %s: invariant key or value empty or too long",
                  agent->name);
        return PDX_ERR_INVALID;
    }
    for (const char *c = key; *c; c++) {
        if (*c < 0x20 || *c > 0x7e) {
            return PDX_ERR_INVALID;
        }
    }
    for (const char *c = value; *c; c++) {
        if (*c < 0x20 || *c > 0x7e) {
            return PDX_ERR_INVALID;
        }
    }
    pdx_status_t st = PDX_OK;
    pdx_agent_lock(agent);
    pdx_invariant_t *slot = NULL;
    for (uint32_t i = 0; i < agent->ninvariants; i++) {
        if (strcmp(agent->invariants[i].key, key) == 0) {
            slot = &agent->invariants[i];
        }
    }
    if (slot == NULL) {
        if (agent->ninvariants == PDX_MAX_INVARIANTS) {
            st = PDX_ERR_TOO_LARGE;
            goto out;
        }
        slot = &agent->invariants[agent->ninvariants++];
        snprintf(slot->key, sizeof(slot->key), "%s", key);
    }
    snprintf(slot->value, sizeof(slot->value), "%s", value);
    agent->generation++;
    pdx_store_agent_changed_locked(agent);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}
