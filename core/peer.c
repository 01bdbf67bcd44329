/* The peer object: finding a loaded peer and its regions, holding and
 * letting go of peer regions, and what pdx_peer_state/info report.
 * Loading and unloading peers is metadata.c; the progress thread's pidfd
 * set (which peers it watches) is kept here. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "peer_int.h"

#include <xxhash.h>

/* Peers by name: every request looks its peer up (make, post, end), and a
 * walk of the loaded peers touched two cache lines of each (a pdx_peer_t
 * spans kilobytes): with tens of peers loaded that was microseconds a
 * request. A chained hash on XXH3 of the name (written here: glibc's
 * hsearch_r cannot delete; nothing else in Debian that pdx links fits),
 * one bucket a peer or more. */
static uint64_t peer_name_hash(const char *name)
{
    return XXH3_64bits(name, strlen(name));
}

pdx_peer_t *pdx_peer_find(pdx_agent_h agent, const char *name)
{
    if (agent->peer_buckets == NULL) {
        for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
            if (strcmp(p->name, name) == 0) {
                return p;
            }
        }
        return NULL;
    }
    uint64_t h = peer_name_hash(name);
    for (pdx_peer_t *p =
             agent->peer_buckets[h & (agent->peer_nbuckets - 1)];
         p != NULL; p = p->hnext) {
        if (p->name_hash == h && strcmp(p->name, name) == 0) {
            return p;
        }
    }
    return NULL;
}

static void peer_bucket_put(pdx_agent_h agent, pdx_peer_t *p)
{
    pdx_peer_t **b = &agent->peer_buckets[p->name_hash &
                                          (agent->peer_nbuckets - 1)];
    p->hnext = *b;
    *b = p;
}

void pdx_peer_index_add_locked(pdx_agent_h agent, pdx_peer_t *p)
{
    p->name_hash = peer_name_hash(p->name);
    p->hnext = NULL;
    agent->npeers++;
    if (agent->npeers > agent->peer_nbuckets) {
        /* Rebuilt from the list (p is not in it yet); without memory the
         * old buckets stay (longer chains), or none (a walk). */
        uint32_t n = agent->peer_nbuckets ? agent->peer_nbuckets * 2 : 16;
        pdx_peer_t **nb = n > agent->peer_nbuckets
                              ? calloc(n, sizeof(*nb))
                              : NULL;
        if (nb != NULL) {
            free(agent->peer_buckets);
            agent->peer_buckets = nb;
            agent->peer_nbuckets = n;
            for (pdx_peer_t *q = agent->peers; q != NULL; q = q->next) {
                peer_bucket_put(agent, q);
            }
        }
    }
    if (agent->peer_buckets != NULL) {
        peer_bucket_put(agent, p);
    }
}

void pdx_peer_index_del_locked(pdx_agent_h agent, pdx_peer_t *p)
{
    agent->npeers--;
    agent->peer_del_gen++; /* requests' cached peers are looked up again */
    if (agent->peer_buckets == NULL) {
        return;
    }
    pdx_peer_t **pp = &agent->peer_buckets[p->name_hash &
                                           (agent->peer_nbuckets - 1)];
    while (*pp != NULL && *pp != p) {
        pp = &(*pp)->hnext;
    }
    if (*pp == p) {
        *pp = p->hnext;
    }
}

/* Index of the last region of `peer` starting at or before (t, addr), or
 * SIZE_MAX. */
size_t pdx_peer_region_index(const pdx_peer_t *peer, pdx_mem_type_t t,
                             uint64_t addr)
{
    size_t lo = 0, hi = peer->nregions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const pdx_region_t *r = &peer->regions[mid]->region;
        if (r->mem_type < t || (r->mem_type == t && r->addr <= addr)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo == 0 ? SIZE_MAX : lo - 1;
}

pdx_peer_region_t *pdx_peer_region_find(pdx_peer_t *peer, pdx_mem_type_t t,
                                        uint64_t addr, uint64_t len)
{
    size_t i = pdx_peer_region_index(peer, t, addr);
    if (i == SIZE_MAX) {
        return NULL;
    }
    pdx_peer_region_t *g = peer->regions[i];
    const pdx_region_t *r = &g->region;
    if (r->mem_type != t || !pdx_region_holds(r, addr, len)) {
        return NULL;
    }
    return g;
}

void pdx_peer_region_unload_locked(pdx_agent_h agent, pdx_peer_region_t *g)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (g->rmd[b] != NULL) {
            agent->backends[b]->ops->rmem_unload(agent->backends[b]->be,
                                                 g->rmd[b]);
            g->rmd[b] = NULL;
        }
    }
}

/* The region left its peer (removed, changed or the peer went): unload
 * its keys; free it unless prepared lists hold it (then they are refused
 * and the last one frees it). No request may use its keys any more. */
static void region_drop(pdx_agent_h agent, pdx_peer_region_t *g)
{
    pdx_peer_region_unload_locked(agent, g);
    g->gone = true;
    if (g->users == 0) {
        free(g);
    }
}

void pdx_peer_region_put_locked(pdx_peer_region_t *g)
{
    if (--g->users == 0 && g->gone) {
        free(g);
    }
}

pdx_status_t pdxi_peer_state(pdx_agent_h agent, const char *name)
{
    pthread_mutex_lock(&agent->lock); /* state only: no backend call */
    pdx_peer_t *p = pdx_peer_find(agent, name);
    pdx_status_t st = p == NULL ? PDX_ERR_NOT_FOUND : p->dead;
    if (p == NULL) {
        pdx_call_note("agent %s: peer %s is not loaded", agent->name, name);
    } else if (st != PDX_OK) {
        pdx_call_note("agent %s: peer %s is gone (%s)", agent->name, name,
                      p->dead_how);
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

pdx_status_t pdxi_peer_info(pdx_agent_h agent, const char *name,
                            pdx_peer_info_t *info, pdx_region_info_t *regions,
                            size_t max_regions)
{
    pdx_agent_lock(agent);
    pdx_peer_t *p = pdx_peer_find(agent, name);
    if (p == NULL) {
        pthread_mutex_unlock(&agent->lock);
        pdx_error("agent %s: peer info: unknown peer %s", agent->name, name);
        return PDX_ERR_NOT_FOUND;
    }
    memset(info, 0, sizeof(*info));
    snprintf(info->name, sizeof(info->name), "%s", p->name);
    snprintf(info->host_id, sizeof(info->host_id), "%s", p->host_id);
    info->instance = p->instance;
    info->generation = p->generation;
    info->pid = p->pid;
    info->same_host = p->same_host;
    info->state = p->dead;
    info->nregions = p->nregions;
    size_t off = 0;
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (p->bpeer[b] == NULL || off >= sizeof(info->backends)) {
            continue;
        }
        int n = snprintf(info->backends + off, sizeof(info->backends) - off,
                         "%s%s", off ? "," : "", agent->backends[b]->name);
        off += n > 0 ? (size_t)n : 0;
    }
    for (size_t i = 0; regions != NULL && i < max_regions && i < p->nregions;
         i++) {
        const pdx_region_t *r = &p->regions[i]->region;
        regions[i] = (pdx_region_info_t){.addr = r->addr, .len = r->len,
                                         .dev_id = r->dev_id,
                                         .mem_type = r->mem_type,
                                         .flags = r->flags};
    }
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}

/* A region-removal notice (ctl.c): the region leaves the peer's table
 * now (lists holding it are refused STALE), its keys stay loaded until our
 * requests in flight on it have ended. */
void pdx_peer_region_retire_locked(pdx_peer_t *peer, pdx_peer_region_t *g)
{
    for (size_t i = 0; i < peer->nregions; i++) {
        if (peer->regions[i] == g) {
            memmove(&peer->regions[i], &peer->regions[i + 1],
                    (peer->nregions - i - 1) * sizeof(*peer->regions));
            peer->nregions--;
            break;
        }
    }
    g->gone = true;
}

void pdx_peer_region_drop_locked(pdx_agent_h agent, pdx_peer_region_t *g)
{
    region_drop(agent, g);
}

void pdx_peer_watch_pidfds_locked(pdx_agent_h agent)
{
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->pidfd >= 0 && !p->pidfd_watched && p->dead == PDX_OK) {
            struct epoll_event ev = {
                .events = EPOLLIN,
                .data.u64 = PDX_PIDFD_TAG | (uint32_t)p->pidfd};
            if (epoll_ctl(agent->nap_epoll_fd, EPOLL_CTL_ADD, p->pidfd,
                          &ev) != 0 && errno != EEXIST) {
                pdx_debug("agent %s: pidfd of %s not watched: %s",
                          agent->name, p->name, strerror(errno));
            }
            p->pidfd_watched = true;
        }
    }
}

/* Is `pid` being torn down (PF_EXITING in /proc/PID/stat's flags)? An
 * exiting process closes its fds and unmaps its memory (a UCX connect to
 * its shared memory then fails) before its pidfd turns readable, which
 * takes as long as unmapping does (tens of ms for a large heap). */
static bool pid_exiting(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return false;
    }
    buf[n] = '\0';
    /* "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": the
     * name may hold spaces and parentheses, so fields count from the last
     * ')'. */
    const char *q = strrchr(buf, ')');
    unsigned long flags = 0;
    if (q == NULL || sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %lu",
                            &flags) != 1) {
        return false;
    }
    return (flags & 0x4ul) != 0; /* PF_EXITING */
}

bool pdx_peer_pid_exited(const pdx_peer_t *p)
{
    if (p->pidfd < 0) {
        return false;
    }
    /* /proc first, the pidfd after: if the pidfd is still not readable,
     * the pid was still this process's when /proc was read (a pid is
     * reused only after its process exited and was reaped). */
    bool exiting = pid_exiting(p->pid);
    struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
    return poll(&pfd, 1, 0) > 0 || exiting;
}

void pdx_peer_unwatch_pidfd_locked(pdx_agent_h agent, pdx_peer_t *p)
{
    if (p->pidfd_watched && p->pidfd >= 0) {
        (void)epoll_ctl(agent->nap_epoll_fd, EPOLL_CTL_DEL, p->pidfd, NULL);
    }
    p->pidfd_watched = false;
}

/* A backend that carries messages to this peer, for notifications. */
static int notif_backend(pdx_agent_h agent, pdx_peer_t *peer)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (peer->bpeer[b] != NULL &&
            (agent->backends[b]->ops->caps & PDX_BACKEND_CAP_NOTIF)) {
            return (int)b;
        }
    }
    return -1;
}

pdx_status_t pdx_peer_send_locked(pdx_agent_h agent, pdx_peer_t *peer,
                                   const void *msg, size_t len)
{
    int b = notif_backend(agent, peer);
    if (b < 0) {
        pdx_error("agent %s: no backend carries notifications to %s",
                  agent->name, peer->name);
        return PDX_ERR_UNSUPPORTED;
    }
    return agent->backends[b]->ops->notif_send(agent->backends[b]->be,
                                               peer->bpeer[b], msg, len);
}
