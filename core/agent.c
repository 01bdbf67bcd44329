/* The agent's life cycle: create (event fds, stats socket, progress
 * thread, store), destroy, its name, event fd and invariants. The top room
 * of the core: it calls the rooms below and none calls it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "discovery_int.h"
#include "loader_int.h"
#include "metrics_int.h"
#include "mem_int.h"
#include "peer_load_int.h"
#include "peer_death_int.h"
#include "progress_int.h"
#include "stats_int.h"
#include "xfer_int.h"

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

/* The pinned backend: the path_backend param, else $PDX_PATH_BACKEND. */
static void agent_pin(pdx_agent_h a, const pdx_agent_params_t *params)
{
    const char *pin =
        params != NULL && (params->field_mask & PDX_AGENT_PARAM_PATH_BACKEND)
            ? params->path_backend
            : getenv("PDX_PATH_BACKEND");
    if (pin != NULL && pin[0] != '\0') {
        snprintf(a->path_backend, sizeof(a->path_backend), "%s", pin);
        pdx_info("agent %s: every request takes backend %s where it "
                 "reaches (path_backend)", a->name, a->path_backend);
    }
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
        params->path_policy > PDX_PATH_POLICY_NATIVE) {
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
    agent_pin(a, params);
    if (getrandom(&a->instance, sizeof(a->instance), 0) !=
        sizeof(a->instance)) {
        a->instance = pdx_now_ns() ^ ((uint64_t)getpid() << 32);
    }
    a->destroyed_seen = pdx_peer_destroyed_seq();
    a->generation = 1;
    a->next_epoch = 1;
    pdx_host_id(a->host_id, sizeof(a->host_id));
    a->host = (pdx_backend_host_t){
        .agent_ctx = a, .agent_name = a->name, .host_id = a->host_id,
        .notif_recv = pdx_progress_notif_recv,
        .peer_error = pdx_progress_peer_error};

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
    a->nap_epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    /* data.u64 in the nap set: pidfds are tagged in its high bits. */
    ev = (struct epoll_event){.events = EPOLLIN,
                              .data.u64 = (uint64_t)(uint32_t)a->wake_fd};
    struct epoll_event nev = {.events = EPOLLIN, .data.fd = a->nap_epoll_fd};
    if (a->wake_fd < 0 || a->prog_epoll_fd < 0 || a->nap_epoll_fd < 0 ||
        epoll_ctl(a->nap_epoll_fd, EPOLL_CTL_ADD, a->wake_fd, &ev) != 0 ||
        epoll_ctl(a->prog_epoll_fd, EPOLL_CTL_ADD, a->nap_epoll_fd, &nev) !=
            0) {
        pdx_error("agent %s: progress wait setup failed: %s", name,
                  strerror(errno));
        if (a->wake_fd >= 0) {
            close(a->wake_fd);
        }
        if (a->prog_epoll_fd >= 0) {
            close(a->prog_epoll_fd);
        }
        if (a->nap_epoll_fd >= 0) {
            close(a->nap_epoll_fd);
        }
        close(a->epoll_fd);
        close(a->event_fd);
        st = PDX_ERR_IO;
        goto err_free;
    }
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->be_cond, NULL);
    pthread_mutex_init(&a->delivery, NULL);
    a->stats_json = pdxi_stats_json;
    pdx_stats_sock_open(a);
    if (a->stats_fd >= 0) {
        ev = (struct epoll_event){
            .events = EPOLLIN, .data.u64 = (uint64_t)(uint32_t)a->stats_fd};
        (void)epoll_ctl(a->nap_epoll_fd, EPOLL_CTL_ADD, a->stats_fd, &ev);
    }
    if (a->params.flags & PDX_AGENT_F_PROGRESS_THREAD) {
        int rc = pthread_create(&a->progress_thread, NULL, pdx_progress_main,
                                a);
        if (rc != 0) {
            pdx_error("agent %s: progress thread: %s", name, strerror(rc));
            st = PDX_ERR_IO;
            goto err_mutex;
        }
        a->thread_running = true;
        /* A name for ps, top and /proc/PID/task/N/comm (15 chars). */
        (void)pthread_setname_np(a->progress_thread, "pdx-progress");
    }
    pdx_info("agent %s: created (host %s, instance %016llx)", a->name,
             a->host_id, (unsigned long long)a->instance);
    if (params != NULL && (params->field_mask & PDX_AGENT_PARAM_STORE) &&
        (st = pdx_store_agent_init(a, params)) != PDX_OK) {
        pdxi_agent_destroy(a);
        return st;
    }
    pdx_metrics_from_env(a); /* PDX_METRICS_LISTEN: the HTTP endpoint */
    *agent_p = a;
    return PDX_OK;

err_mutex:
    pdx_stats_sock_close(a);
    pthread_mutex_destroy(&a->delivery);
    pthread_cond_destroy(&a->be_cond);
    pthread_mutex_destroy(&a->lock);
    close(a->prog_epoll_fd);
    close(a->nap_epoll_fd);
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
    pdx_peer_announce_destroyed(a->instance);
    (void)pdxi_metrics_stop(a); /* no scrape after this (none: NOT_FOUND) */
    pdx_store_agent_fini(a); /* discovery.c: no store event after this */
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
        pdxi_xfer_release(x); /* progress.c, as pdx_xfer_release */
        pdx_agent_lock(a);
    }
    while (a->peers != NULL) {
        pdx_peer_destroy_locked(a, a->peers);
    }
    free(a->peer_buckets);
    a->peer_buckets = NULL;
    a->peer_nbuckets = 0;
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
            pdx_loader_close(be->dl);
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
    close(a->nap_epoll_fd);
    close(a->wake_fd);
    close(a->epoll_fd);
    close(a->event_fd);
    pdxi_ckey_clear(&a->ckey);
    pdx_handle_release(a);
}

const char *pdxi_agent_name(pdx_agent_h agent) { return agent->name; }

int pdxi_agent_event_fd(pdx_agent_h agent) { return agent->epoll_fd; }

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
    pdx_disc_changed_locked(agent);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}
