/* Test helper: an etcd of the test's own, on 127.0.0.1 (or a given
 * address) with free ports and a temporary data directory; killed,
 * restarted on the same ports and data, stopped and removed. */
#ifndef PDX_TEST_ETCD_LAUNCH_H
#define PDX_TEST_ETCD_LAUNCH_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct etcd_proc {
    pid_t pid;
    char ip[64];
    int client_port, peer_port;
    char dir[256];  /* temporary directory (data in dir/data, log) */
    char url[128];  /* http://ip:client_port */
    char extra[256]; /* extra etcd flags, space-separated */
} etcd_proc_t;

/* Is an etcd binary installed? (tests skip with this reason if not) */
bool etcd_available(char *why, size_t len);

/* Start a new etcd (new directory, free ports) on `ip` (NULL:
 * 127.0.0.1), with `extra` flags (NULL: none), and wait until it answers
 * (at most 15 s). 0 on success, else -1 with `err` filled. */
int etcd_start(etcd_proc_t *e, const char *ip, const char *extra, char *err,
               size_t err_len);
/* Start an n-member cluster (m[0..n), 127.0.0.1, free ports, a directory
 * each) and wait until every member is healthy (quorum); `endpoints` gets
 * their client URLs, comma-separated. 0 on success, else -1 with `err`
 * (stop each member with etcd_cleanup). */
int etcd_start_cluster(etcd_proc_t *m, int n, char *endpoints,
                       size_t endpoints_len, char *err, size_t err_len);
/* Start it again on the same ports and data after a kill. */
int etcd_restart(etcd_proc_t *e, char *err, size_t err_len);
/* Send `sig` and reap it (SIGKILL: a crash; SIGTERM: a clean stop). */
void etcd_kill(etcd_proc_t *e, int sig);
/* Kill if running and remove the directory. */
void etcd_cleanup(etcd_proc_t *e);
/* Wait until it answers on its client URL; 0 when it does. */
int etcd_wait_ready(const etcd_proc_t *e, int timeout_ms);
/* POST a JSON `body` to the v3 gateway `path` (e.g. "/v3/lease/revoke")
 * over a plain socket (1 s timeouts); the response body into `out`. 0 on
 * HTTP 200, else -1. For tests that act on etcd behind a client's back. */
int etcd_post(const etcd_proc_t *e, const char *path, const char *body,
              char *out, size_t out_len);

#endif
