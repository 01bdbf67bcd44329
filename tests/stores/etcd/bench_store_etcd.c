/* Measures the etcd store against a private etcd on this machine:
 *   registry   batched owner registrations per second (owners_add of
 *              batches of 2,000 blocks, 64 blocks per transaction at etcd's
 *              default --max-txn-ops 128, and with a larger limit)
 *   lookup     owners of a 128K-token prefix (2,000 blocks) with 1 and 3
 *              owners each
 *   death      a holder killed (SIGKILL, no revoke): time until a watcher
 *              sees its key deleted, with a 5 s lease TTL; NIXL's etcd
 *              backend keeps such a key until someone deletes it
 * Usage: bench_store_etcd [--blocks N] [--rounds R] [--json]. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pdx/pdx.h>
#include <pdx/store.h>

#include "etcd_launch.h"
#include "pdx_clock.h"

extern const pdx_store_ops_t pdx_store_v1;
static const pdx_store_ops_t *ops = &pdx_store_v1;

static void *open_client(const char *url, const char *name, uint32_t txn_ops,
                         uint32_t ttl_ms, pdx_store_host_t *host)
{
    *host = (pdx_store_host_t){.agent_name = name};
    pdx_store_params_t p = {.endpoints = url, .ns = "bench",
                            .lease_ttl_ms = ttl_ms, .timeout_ms = 5000,
                            .max_txn_ops = txn_ops};
    void *st = NULL;
    if (ops->create(host, &p, &st) != PDX_OK) {
        fprintf(stderr, "create failed\n");
        exit(1);
    }
    pdx_store_status_t s;
    for (int i = 0; i < 500; i++) {
        ops->status(st, &s);
        if (s.lease != 0) {
            break;
        }
        usleep(10000);
    }
    return st;
}

static char **make_blocks(size_t n, unsigned salt)
{
    char **b = malloc(n * sizeof(*b));
    for (size_t i = 0; i < n; i++) {
        /* 16-byte hashes, as xxhash_cbor's (sha256_cbor's are 32). */
        b[i] = malloc(33);
        unsigned long long x = (unsigned long long)i * 0x9e3779b97f4a7c15ull ^
                               salt;
        snprintf(b[i], 33, "%016llx%016llx", x, x * 7 + salt);
    }
    return b;
}

static void free_blocks(char **b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(b[i]);
    }
    free(b);
}

static size_t g_seen;
static double g_longest_ms;
static void on_owner(void *arg, size_t i, const char *owner)
{
    (void)arg;
    (void)i;
    (void)owner;
    g_seen++;
}

static double bench_register(const char *url, uint32_t txn_ops, size_t n,
                             int rounds, double *lookup1_ms,
                             double *lookup3_ms)
{
    pdx_store_host_t h1, h2, h3;
    void *a = open_client(url, "owner-a", txn_ops, 30000, &h1);
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        char **blocks = make_blocks(n, (unsigned)(txn_ops * 1000 + r));
        uint32_t *counts = malloc(n * sizeof(*counts));
        double t0 = pdx_now_s();
        pdx_status_t st = ops->owners_add(a, "owner-a",
                                          (const char *const *)blocks, n,
                                          counts);
        double dt = pdx_now_s() - t0;
        if (st != PDX_OK) {
            fprintf(stderr, "owners_add: %s\n", pdx_status_string(st));
            exit(1);
        }
        double rate = (double)n / dt;
        best = rate > best ? rate : best;
        printf("  registry: %zu blocks in %.1f ms = %.0f blocks/s "
               "(max_txn_ops %u, %zu transactions)\n", n, dt * 1e3, rate,
               txn_ops, (n + txn_ops / 2 - 1) / (txn_ops / 2));
        if (r == rounds - 1) {
            /* Lookup of a 2,000-block prefix: 1 owner, then 3. */
            double t1 = pdx_now_s();
            g_seen = 0;
            ops->owners_get(a, (const char *const *)blocks, n, on_owner, NULL);
            *lookup1_ms = (pdx_now_s() - t1) * 1e3;
            void *b = open_client(url, "owner-b", txn_ops, 30000, &h2);
            void *c = open_client(url, "owner-c", txn_ops, 30000, &h3);
            ops->owners_add(b, "owner-b", (const char *const *)blocks, n,
                            NULL);
            ops->owners_add(c, "owner-c", (const char *const *)blocks, n,
                            counts);
            double best3 = 1e9;
            for (int k = 0; k < 3; k++) {
                g_seen = 0;
                double t2 = pdx_now_s();
                ops->owners_get(a, (const char *const *)blocks, n, on_owner,
                                NULL);
                double ms = (pdx_now_s() - t2) * 1e3;
                best3 = ms < best3 ? ms : best3;
            }
            *lookup3_ms = best3;
            /* The connector's question: who holds the longest prefix
             * (sampled rounds), through an agent of this namespace. */
            pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_STORE,
                                     .store_endpoints = url,
                                     .store_namespace = "bench",
                                     .store_max_txn_ops = txn_ops};
            pdx_agent_h agent;
            if (pdx_agent_create("reader", &ap, &agent) == PDX_OK) {
                char owner[PDX_NAME_MAX];
                size_t prefix = 0;
                double bestl = 1e9;
                for (int k = 0; k < 5; k++) {
                    double t3 = pdx_now_s();
                    pdx_status_t lst = pdx_store_owners_longest(
                        agent, (const char *const *)blocks, n, owner,
                        &prefix);
                    double ms = (pdx_now_s() - t3) * 1e3;
                    if (lst == PDX_OK) {
                        bestl = ms < bestl ? ms : bestl;
                    }
                }
                g_longest_ms = bestl;
                printf("  longest prefix of %zu blocks: %s holds %zu, found "
                       "in %.2f ms (sampled)\n", n, owner, prefix, bestl);
                pdx_agent_destroy(agent);
            }
            printf("  lookup of %zu blocks: %.2f ms with 1 owner each, %.2f "
                   "ms with 3 (%zu owners seen, last count %u)\n", n,
                   *lookup1_ms, *lookup3_ms, g_seen, counts[n - 1]);
            ops->destroy(b);
            ops->destroy(c);
        }
        free(counts);
        free_blocks(blocks, n);
    }
    ops->destroy(a);
    return best;
}

typedef struct watch_rec {
    volatile int deleted;
    volatile int put;
} watch_rec_t;

static void on_ev(void *ctx, uint64_t id, const pdx_store_event_t *ev)
{
    (void)id;
    watch_rec_t *w = ctx;
    if (strcmp(ev->key, "agents/victim") == 0) {
        if (ev->type == PDX_STORE_EV_DELETE) {
            __atomic_store_n(&w->deleted, 1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&w->put, 1, __ATOMIC_RELEASE);
        }
    }
}

static double bench_death(const char *url, uint32_t ttl_ms)
{
    watch_rec_t rec = {0};
    pdx_store_host_t host = {.ctx = &rec, .agent_name = "watcher",
                             .watch_event = on_ev};
    pdx_store_params_t p = {.endpoints = url, .ns = "bench",
                            .lease_ttl_ms = 30000, .timeout_ms = 2000};
    void *w = NULL;
    ops->create(&host, &p, &w);
    uint64_t id;
    ops->watch(w, "agents/", 0, PDX_STORE_WATCH_INITIAL, &id);
    pid_t pid = fork();
    if (pid == 0) {
        pdx_store_host_t h;
        void *v = open_client(url, "victim", 128, ttl_ms, &h);
        ops->put(v, "agents/victim", "blob", 4, PDX_STORE_PUT_LEASED);
        for (int i = 0; i < 600; i++) {
            usleep(100000);
        }
        _exit(0);
    }
    for (int i = 0; i < 1000 && !__atomic_load_n(&rec.put, __ATOMIC_ACQUIRE);
         i++) {
        usleep(10000);
    }
    usleep(500000); /* a few keepalives */
    double t0 = pdx_now_s();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    while (!__atomic_load_n(&rec.deleted, __ATOMIC_ACQUIRE) &&
           pdx_now_s() - t0 < 30) {
        usleep(1000);
    }
    double dt = pdx_now_s() - t0;
    ops->destroy(w);
    return dt;
}

/* CPU seconds process `pid` has used (utime + stime). */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long ut = 0, stt = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                                   "%*u %lu %lu", &ut, &stt) != 2) {
        return 0;
    }
    return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

/* Point reads of one 600-byte key (a peer's blob, as pdx_peer_fetch
 * reads it), one at a time: microseconds each, and etcd's CPU each. */
static void bench_get(const char *url, pid_t etcd_pid, int n, double *us_p,
                      double *etcd_us_p)
{
    pdx_store_host_t h;
    void *a = open_client(url, "reader", 128, 30000, &h);
    char blob[600];
    memset(blob, 'b', sizeof(blob));
    if (ops->put(a, "agents/peer", blob, sizeof(blob), 0) != PDX_OK) {
        fprintf(stderr, "put failed\n");
        exit(1);
    }
    double c0 = proc_cpu_s(etcd_pid), t0 = pdx_now_s();
    for (int i = 0; i < n; i++) {
        void *v = NULL;
        size_t len = 0;
        if (ops->get(a, "agents/peer", &v, &len, NULL) != PDX_OK ||
            len != sizeof(blob)) {
            fprintf(stderr, "get failed\n");
            exit(1);
        }
        free(v);
    }
    *us_p = (pdx_now_s() - t0) / n * 1e6;
    *etcd_us_p = (proc_cpu_s(etcd_pid) - c0) / n * 1e6;
    ops->destroy(a);
}

int main(int argc, char **argv)
{
    size_t n = 2000;
    int rounds = 3;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--blocks") == 0) {
            n = strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--rounds") == 0) {
            rounds = atoi(argv[++i]);
        }
    }
    char why[256];
    if (!etcd_available(why, sizeof(why))) {
        printf("skipped: %s\n", why);
        return 77;
    }
    etcd_proc_t e;
    if (etcd_start(&e, NULL, "--max-txn-ops=4096", why, sizeof(why)) != 0) {
        fprintf(stderr, "etcd: %s\n", why);
        return 1;
    }
    printf("etcd %s (one member, data in %s)\n", e.url, e.dir);
    double l1 = 0, l3 = 0, l1b = 0, l3b = 0;
    double r128 = bench_register(e.url, 128, n, rounds, &l1, &l3);
    double r4k = bench_register(e.url, 4096, n, rounds, &l1b, &l3b);
    double death = bench_death(e.url, 5000);
    double get_us = 0, get_etcd_us = 0;
    bench_get(e.url, e.pid, 3000, &get_us, &get_etcd_us);
    printf("RESULT registry_blocks_per_s_txn128=%.0f\n", r128);
    printf("RESULT registry_blocks_per_s_txn4096=%.0f\n", r4k);
    printf("RESULT lookup_2000_ms_1owner=%.2f lookup_2000_ms_3owners=%.2f "
           "(txn 128)\n", l1, l3);
    printf("RESULT lookup_2000_ms_1owner=%.2f lookup_2000_ms_3owners=%.2f "
           "(txn 4096)\n", l1b, l3b);
    printf("RESULT longest_prefix_2000_ms=%.2f\n", g_longest_ms);
    printf("RESULT death_to_delete_s_ttl5=%.2f (NIXL etcd backend: never, "
           "until someone deletes the key)\n", death);
    printf("RESULT point_read_us=%.1f etcd_cpu_us_per_read=%.1f (one "
           "600-byte key, one at a time)\n", get_us, get_etcd_us);
    etcd_cleanup(&e);
    return 0;
}
