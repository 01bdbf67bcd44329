/* The etcd store over TLS and with etcd's user/password auth (issue 21
 * item 2), driven by etcd_tls.sh, which makes the certificates (openssl)
 * and starts etcd. Usage:
 *   test_store_tls ok   ENDPOINT NS [KEY=VALUE...]  two agents (cma) with
 *       these store options: P publishes, D fetches P by name and loads it
 *       (a cluster key is set on both, so the signed path is exercised
 *       through the store too); then an agent without the key publishes
 *       an unsigned blob under P's name, and D must ignore it (P stays
 *       loaded, same instance); exits 0 on success.
 *   test_store_tls fail ENDPOINT NS [KEY=VALUE...]  one agent: publishing
 *       must not reach the store within 3 s (store unreachable, a
 *       last_error naming why); exits 0 when it does not.
 * Bounded: every wait has a deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pdx/pdx.h>
#include "pdx_clock.h"

static const char KEY[] = "tls-test-cluster-key-0123456789";

static pdx_agent_h make(const char *name, const char *ep, const char *ns,
                        const pdx_option_t *opts, size_t n, pdx_status_t *st_p)
{
    pdx_agent_params_t p = {
        .field_mask = PDX_AGENT_PARAM_STORE | PDX_AGENT_PARAM_STORE_OPTS |
                      PDX_AGENT_PARAM_CLUSTER_KEY,
        .store = "etcd", .store_endpoints = ep, .store_namespace = ns,
        .store_lease_ttl_ms = 5000, .store_timeout_ms = 2000,
        .store_opts = opts, .store_nopts = n,
        .cluster_key = KEY, .cluster_key_len = strlen(KEY)};
    pdx_agent_h a = NULL;
    *st_p = pdx_agent_create(name, &p, &a);
    if (*st_p != PDX_OK) {
        return NULL;
    }
    if (pdx_backend_create(a, "cma", NULL, 0, NULL) != PDX_OK) {
        fprintf(stderr, "cma backend: %s\n", pdx_last_error());
        exit(1);
    }
    return a;
}

static void count_owner(void *arg, size_t index, const char *owner)
{
    (void)index;
    if (strcmp(owner, "tls-p") == 0) {
        (*(size_t *)arg)++;
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s ok|fail ENDPOINT NS [KEY=VALUE...]\n",
                argv[0]);
        return 2;
    }
    pdx_option_t opts[8];
    size_t n = 0;
    for (int i = 4; i < argc && n < 8; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "bad option %s\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        opts[n].key = argv[i];
        opts[n].value = eq + 1;
        n++;
    }
    const char *ep = argv[2], *ns = argv[3];
    pdx_status_t st;
    char line[512];
    if (strcmp(argv[1], "ok") == 0) {
        pdx_agent_h p = make("tls-p", ep, ns, opts, n, &st);
        pdx_agent_h d = p ? make("tls-d", ep, ns, opts, n, &st) : NULL;
        if (d == NULL) {
            fprintf(stderr, "FAIL: create: %s (%s)\n", pdx_status_string(st),
                    pdx_last_error());
            return 1;
        }
        pdx_agent_publish(p);
        st = pdx_peer_fetch(d, "tls-p", 10000);
        pdx_store_describe(d, line, sizeof(line));
        printf("d: %s\n", line);
        if (st != PDX_OK || pdx_peer_state(d, "tls-p") != PDX_OK) {
            fprintf(stderr, "FAIL: fetch over the store: %s (%s)\n",
                    pdx_status_string(st), pdx_last_error());
            return 1;
        }
        pdx_store_status_t ss;
        pdx_store_status(p, &ss);
        if (!ss.reachable || ss.lease == 0) {
            fprintf(stderr, "FAIL: p's store: reachable %d lease %lld (%s)\n",
                    ss.reachable, (long long)ss.lease, ss.last_error);
            return 1;
        }
        printf("ok: d fetched and loaded p through %s\n", ep);
        /* The owner registry: gRPC transactions (TLS settings and the auth
         * token go there too). */
        const char *blocks[2] = {"00aa11bb22cc33dd", "00aa11bb22cc33ee"};
        uint32_t counts[2] = {0, 0};
        st = pdx_store_owners_add(p, blocks, 2, counts);
        size_t seen = 0;
        pdx_status_t gst = pdx_store_owners_get(d, blocks, 2, count_owner,
                                                &seen);
        if (st != PDX_OK || counts[0] != 1 || counts[1] != 1 ||
            gst != PDX_OK || seen != 2) {
            fprintf(stderr, "FAIL: owner registry: add %s (counts %u %u), "
                    "get %s (%zu owners) (%s)\n", pdx_status_string(st),
                    counts[0], counts[1], pdx_status_string(gst), seen,
                    pdx_last_error());
            return 1;
        }
        printf("ok: owner registry (gRPC) add and get through %s\n", ep);
        /* A forged put: an agent without the key publishes an unsigned
         * blob under p's name (its own lease), overwriting p's key. d's
         * watch must ignore it: p stays loaded as the same instance. */
        pdx_peer_info_t before, after;
        pdx_peer_info(d, "tls-p", &before, NULL, 0);
        pdx_agent_params_t fp = {
            .field_mask = PDX_AGENT_PARAM_STORE | PDX_AGENT_PARAM_STORE_OPTS,
            .store = "etcd", .store_endpoints = ep, .store_namespace = ns,
            .store_lease_ttl_ms = 5000, .store_timeout_ms = 2000,
            .store_opts = opts, .store_nopts = n};
        pdx_agent_h f = NULL;
        if (pdx_agent_create("tls-p", &fp, &f) != PDX_OK ||
            pdx_backend_create(f, "cma", NULL, 0, NULL) != PDX_OK) {
            fprintf(stderr, "FAIL: forger: %s\n", pdx_last_error());
            return 1;
        }
        pdx_agent_publish(f);
        pdx_store_status_t fs = {0};
        for (int i = 0; i < 50 && !(fs.lease != 0 && fs.unpublished == 0 &&
                                    fs.leased_keys > 0);
             i++) {
            usleep(100000);
            pdx_store_status(f, &fs);
        }
        usleep(1000000); /* d's watch sees the put */
        pdx_status_t ist = pdx_peer_info(d, "tls-p", &after, NULL, 0);
        if (!(fs.lease != 0 && fs.unpublished == 0) || ist != PDX_OK ||
            after.instance != before.instance ||
            after.state != PDX_OK) {
            fprintf(stderr, "FAIL: forged put: published %d, d's tls-p %s "
                    "instance %016llx (was %016llx) state %s\n",
                    fs.lease != 0 && fs.unpublished == 0,
                    pdx_status_string(ist),
                    (unsigned long long)after.instance,
                    (unsigned long long)before.instance,
                    pdx_status_string(after.state));
            return 1;
        }
        printf("ok: an unsigned put under p's name was ignored by d (p "
               "still instance %016llx)\n", (unsigned long long)after.instance);
        pdx_agent_destroy(f);
        pdx_agent_destroy(d);
        pdx_agent_destroy(p);
        return 0;
    }
    pdx_agent_h a = make("tls-x", ep, ns, opts, n, &st);
    if (a == NULL) {
        /* Refused at create (a bad option): also "not reaching". */
        printf("refused at create: %s (%s)\n", pdx_status_string(st),
               pdx_last_error());
        return st == PDX_ERR_CONFIG ? 0 : 1;
    }
    pdx_agent_publish(a);
    uint64_t t0 = pdx_now_ms();
    pdx_store_status_t ss = {0};
    int published = 0;
    do {
        usleep(100000);
        pdx_store_status(a, &ss);
        published = ss.lease != 0 && ss.unpublished == 0 && ss.reachable;
    } while (!published && pdx_now_ms() - t0 < 3000);
    pdx_store_describe(a, line, sizeof(line));
    printf("x: %s\n", line);
    pdx_agent_destroy(a);
    if (published) {
        fprintf(stderr, "FAIL: published although it should not reach the "
                "store\n");
        return 1;
    }
    if (ss.last_error[0] == '\0') {
        fprintf(stderr, "FAIL: no last_error saying why\n");
        return 1;
    }
    printf("ok: not published; last error: %s\n", ss.last_error);
    return 0;
}
