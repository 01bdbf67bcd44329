/* The stats socket: every agent answers `pdx-info --stats` with its
 * pdx_stats_json over an abstract unix socket "pdx-stats.<pid>.<agent>"
 * (per network namespace; only the same uid or root may read it). Served
 * by the progress thread, or by pdx_progress without one, at most every
 * 10 ms and never under the agent lock while writing. PDX_STATS_SOCKET=0
 * in the environment turns it off. The JSON comes from agent->stats_json
 * (stats_json.c, set by agent create): the socket sits below the progress
 * thread, the JSON above everything it shows.
 *
 * The answer is a line "pdx-stats <bytes>\n", then that many bytes of
 * JSON, whole: a reader knows when it got all of it (the answer of an
 * agent with hundreds of peers is larger than a socket buffer; sending
 * what fitted cut it mid-object). Writing it waits for the reader for at
 * most STATS_SEND_NS per serve, then gives up on that reader. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "stats_int.h"

#define STATS_SERVE_PERIOD_NS 10000000ull
#define STATS_SEND_NS 1000000000ull

/* Send all of `buf` to non-blocking `c` by `deadline` (pdx_now_ns()):
 * 0, or -1 when the reader went or was too slow. */
static int send_all(int c, const char *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(c, buf + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
            errno != EINTR) {
            return -1;
        }
        uint64_t now = pdx_now_ns();
        if (now >= deadline) {
            return -1;
        }
        struct pollfd pfd = {.fd = c, .events = POLLOUT};
        int ms = (int)((deadline - now) / 1000000ull) + 1;
        (void)poll(&pfd, 1, ms);
    }
    return 0;
}

void pdx_stats_sock_open(pdx_agent_h agent)
{
    agent->stats_fd = -1;
    const char *env = getenv("PDX_STATS_SOCKET");
    if (env != NULL && strcmp(env, "0") == 0) {
        return;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        pdx_debug("agent %s: no stats socket: %s", agent->name,
                  strerror(errno));
        return;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    /* Abstract: sun_path[0] is NUL; nothing on disk to clean up. */
    int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1,
                     "pdx-stats.%d.%s", (int)getpid(), agent->name);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                (size_t)n);
    if (bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, 4) != 0) {
        pdx_debug("agent %s: no stats socket: %s", agent->name,
                  strerror(errno));
        close(fd);
        return;
    }
    agent->stats_fd = fd;
}

void pdx_stats_sock_close(pdx_agent_h agent)
{
    if (agent->stats_fd >= 0) {
        close(agent->stats_fd);
        agent->stats_fd = -1;
    }
}

/* Answer waiting `pdx-info --stats` clients. Called without the lock. */
void pdx_stats_sock_serve(pdx_agent_h agent, uint64_t now)
{
    if (agent->stats_fd < 0) {
        return;
    }
    if (now == 0) {
        now = pdx_now_ns();
    }
    uint64_t last = __atomic_load_n(&agent->stats_served_ns, __ATOMIC_RELAXED);
    if (now - last < STATS_SERVE_PERIOD_NS ||
        !__atomic_compare_exchange_n(&agent->stats_served_ns, &last, now,
                                     false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED)) {
        return;
    }
    /* Look before accepting: an accept4 that finds nobody still makes and
     * frees a socket, file and inode (a quarter of an idle agent's CPU,
     * its housekeeping wake-ups being most of the rest); a poll makes
     * nothing. */
    struct pollfd lp = {.fd = agent->stats_fd, .events = POLLIN};
    if (poll(&lp, 1, 0) != 1 || !(lp.revents & POLLIN)) {
        return;
    }
    uint64_t deadline = now + STATS_SEND_NS;
    for (int i = 0; i < 4; i++) {
        int c = accept4(agent->stats_fd, NULL, NULL,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) {
            return; /* EAGAIN: nobody waiting */
        }
        struct ucred cr;
        socklen_t crl = sizeof(cr);
        char *json = NULL;
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crl) == 0 &&
            (cr.uid == getuid() || cr.uid == 0) &&
            agent->stats_json(agent, &json) == PDX_OK) {
            size_t len = strlen(json);
            char head[48];
            int hl = snprintf(head, sizeof(head), "pdx-stats %zu\n", len);
            if (send_all(c, head, (size_t)hl, deadline) != 0 ||
                send_all(c, json, len, deadline) != 0) {
                pdx_debug("agent %s: a stats reader took more than %llu ms "
                          "or went: its answer cut", agent->name,
                          STATS_SEND_NS / 1000000ull);
            }
            free(json);
        }
        close(c);
    }
}
