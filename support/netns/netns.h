/* "Hosts" for multi-node tests: network namespaces joined by veth pairs to
 * a bridge in a hub namespace, on a private subnet (10.77.0.0/24), and
 * processes started in one of them inside a new pid namespace. Nothing is
 * created in the caller's own namespaces. Needs CAP_SYS_ADMIN/CAP_NET_ADMIN
 * (root) and the `ip` tool (iproute2); netns_init says why not otherwise. */
#ifndef PDX_TEST_NETNS_H
#define PDX_TEST_NETNS_H

#include <stdbool.h>
#include <sys/types.h>

#define NETNS_MAX_HOSTS 8

typedef struct netns_lab {
    char tag[24];  /* prefix of every name this lab made */
    char hub[40];  /* hub namespace (bridge, 10.77.0.1) */
    char host[NETNS_MAX_HOSTS][40];
    char ip[NETNS_MAX_HOSTS][20]; /* 10.77.0.(11 + i) */
    int nhosts;
    int root_fd; /* the caller's own network namespace */
} netns_lab_t;

/* Make the hub and `nhosts` hosts. 0 on success; -1 with `why` when the
 * machine refuses (no privileges, no ip tool, no veth/bridge support):
 * callers skip then. */
int netns_init(netns_lab_t *lab, int nhosts, char *why, size_t why_len);
/* Remove every namespace (and so every veth and the bridge). */
void netns_cleanup(netns_lab_t *lab);
/* The hub's address, where shared services (etcd) listen. */
const char *netns_hub_ip(void);
/* Enter (for the calling thread) the hub's or a host's network namespace,
 * or go back to the caller's own (host -1, hub -2). 0 on success. */
int netns_enter(netns_lab_t *lab, int host);
/* Cut or restore host i's link to the hub (no RST reaches anyone: a host
 * that died or was partitioned). */
int netns_link(netns_lab_t *lab, int host, bool up);
/* Start argv in host i's network namespace as pid 1 of a new pid
 * namespace, with `env` entries ("K=V", NULL-terminated, may be NULL)
 * added to the environment and fd `keep_fd` left open (others above 2 are
 * closed). Returns its pid (in the caller's pid namespace) or -1. It dies
 * with the caller (PR_SET_PDEATHSIG). */
pid_t netns_spawn(netns_lab_t *lab, int host, char *const argv[],
                  char *const env[], int keep_fd);

#endif
