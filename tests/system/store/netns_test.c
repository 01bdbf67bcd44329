/* Multi-node on etcd, with "hosts" that are network + pid namespaces
 * joined by veth pairs (netns.h), one etcd on the hub, and KV connector
 * nodes (this program with --node) that meet only through the store:
 *
 *   discovery  D loads P's handoff by name, no blob passed by hand; the
 *              path report says UCX over tcp, not same host
 *   restart    P killed and started again: D reloads it through the watch
 *              and its transfers resume byte-exact
 *   etcd down  transfers between loaded peers go on byte-exact, P's new
 *              generation is published when etcd is back and D gets it
 *   death      P's link cut and P killed (a host that dies: no RST):
 *              D fails P and frees what it held for P within the lease TTL
 *              plus a watch round trip (times printed)
 *   owners     three nodes save one prefix: the third replica is
 *              reclaimable; killing an owner removes its entries
 *   cross-node a node with an empty pool loads the prefix from an owner's
 *              pool (a cross-node offload hit), byte-exact
 *   mismatch   agents of another seed or layout found through the store
 *              are refused with the field named
 *
 * Exit 0 when all pass, 1 on a failure, 77 (skipped, reason printed) where
 * the machine refuses namespaces or etcd is missing. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <pdx/kv_connector.h>
#include <pdx/pdx.h>
#include <pdx/store.h>

#include "ctl.h"
#include "etcd_launch.h"
#include "mix.h"
#include "netns.h"

/* PDX_TEST_LEASE_TTL_MS overrides it (e.g. 60000 to see how long the
 * transport alone takes to notice a dead host). */
static int g_ttl_ms = 5000;
#define LEASE_TTL_MS g_ttl_ms
#define BLOCK_TOKENS 16
#define NUM_BLOCKS 256
#define NLAYERS 2
#define BYTES_PER_TOKEN 1024

/* ======================= node (inside a host) ======================= */

typedef struct node {
    int fd;
    pdx_kv_connector_h conn;
    pdx_layout_h layout;
    void *mem;
    size_t narenas;
    pdx_arena_t arenas[16];
    int freed[4];
    void *extra;
} node_t;

static void on_freed(void *arg, const char *req, pdx_kv_free_reason_t why)
{
    node_t *n = arg;
    (void)req;
    if ((int)why >= 0 && (int)why < 4) {
        n->freed[why]++;
    }
}

static void tokens_of(uint64_t seed, size_t nblocks, uint64_t *t)
{
    for (size_t i = 0; i < nblocks * BLOCK_TOKENS; i++) {
        t[i] = splitmix64(seed * 1000003ull + i) % 150000;
    }
}

static size_t hashes_of(node_t *n, uint64_t seed, size_t nblocks,
                        pdx_block_hash_t *h)
{
    uint64_t *t = malloc(nblocks * BLOCK_TOKENS * sizeof(*t));
    tokens_of(seed, nblocks, t);
    size_t got = 0;
    pdx_status_t st = pdx_hasher_hash_blocks(
        pdx_kv_connector_hasher(n->conn), t, nblocks * BLOCK_TOKENS, NULL, h,
        nblocks, &got, NULL, NULL);
    free(t);
    if (st != PDX_OK) {
        die("hash: %s", pdx_last_error());
    }
    return got;
}

static uint64_t word_of(const pdx_block_hash_t *h, size_t arena, size_t w)
{
    uint64_t h64;
    memcpy(&h64, h->bytes, 8);
    return splitmix64(h64 ^ ((uint64_t)arena << 48) ^ w);
}

static uint64_t *block_ptr(node_t *n, size_t a, uint64_t id)
{
    return (uint64_t *)(uintptr_t)(n->arenas[a].base +
                                   id * n->arenas[a].stride);
}

static void fill_blocks(node_t *n, const pdx_block_hash_t *h, size_t nb,
                        uint64_t first)
{
    size_t words = (size_t)BYTES_PER_TOKEN * BLOCK_TOKENS / 8;
    for (size_t a = 0; a < n->narenas; a++) {
        for (size_t b = 0; b < nb; b++) {
            uint64_t *p = block_ptr(n, a, first + b);
            for (size_t w = 0; w < words; w++) {
                p[w] = word_of(&h[b], a, w);
            }
        }
    }
}

static uint64_t diff_blocks(node_t *n, const pdx_block_hash_t *h, size_t nb,
                            uint64_t first)
{
    size_t words = (size_t)BYTES_PER_TOKEN * BLOCK_TOKENS / 8;
    uint64_t diff = 0;
    for (size_t a = 0; a < n->narenas; a++) {
        for (size_t b = 0; b < nb; b++) {
            const uint64_t *p = block_ptr(n, a, first + b);
            for (size_t w = 0; w < words; w++) {
                diff += (p[w] != word_of(&h[b], a, w)) * 8;
            }
        }
    }
    return diff;
}

static void reply(node_t *n, cJSON *r)
{
    char *text = cJSON_PrintUnformatted(r);
    send_msg(n->fd, text, (uint32_t)strlen(text));
    free(text);
    cJSON_Delete(r);
}

static double ms_since(uint64_t t0) { return (double)(pdx_now_ms() - t0); }

static void node_progress(node_t *n)
{
    pdx_kv_progress(n->conn);
    pdx_kv_poll_freed(n->conn, on_freed, n);
}

static pdx_kv_request_t mkreq(const char *id, pdx_block_hash_t *h, size_t nb)
{
    return (pdx_kv_request_t){.req_id = id, .hashes = h, .nfull = nb,
                              .prompt_tokens = nb * BLOCK_TOKENS + 1};
}

static void wait_saved(node_t *n, const char *req)
{
    pdx_status_t st = PDX_INPROGRESS;
    uint64_t end = pdx_now_ms() + 20000;
    while ((st = pdx_kv_save_check(n->conn, req)) == PDX_INPROGRESS &&
           pdx_now_ms() < end) {
        node_progress(n);
        usleep(1000);
    }
    if (st != PDX_OK) {
        die("save %s: %s", req, pdx_status_string(st));
    }
}

static cJSON *cmd_save(node_t *n, const cJSON *c, bool finish)
{
    const char *req = cJSON_GetObjectItem(c, "req")->valuestring;
    uint64_t seed = (uint64_t)cJSON_GetObjectItem(c, "seed")->valuedouble;
    size_t nb = (size_t)cJSON_GetObjectItem(c, "nblocks")->valuedouble;
    uint64_t first = (uint64_t)cJSON_GetObjectItem(c, "first")->valuedouble;
    const cJSON *from = cJSON_GetObjectItem(c, "from");
    pdx_block_hash_t *h = calloc(nb, sizeof(*h));
    hashes_of(n, seed, nb, h);
    fill_blocks(n, h, nb, first);
    uint64_t *ids = malloc(nb * sizeof(*ids));
    for (size_t i = 0; i < nb; i++) {
        ids[i] = first + i;
    }
    pdx_kv_request_t r = mkreq(req, h, nb);
    cJSON *out = cJSON_CreateObject();
    pdx_status_t st = pdx_kv_save(n->conn, &r, ids);
    if (st == PDX_OK) {
        wait_saved(n, req);
    }
    if (st == PDX_OK && finish) {
        char *params = NULL;
        bool pool = cJSON_IsString(from) &&
                    strcmp(from->valuestring, "pool") == 0;
        st = pdx_kv_request_finished(n->conn, &r, ids, nb * BLOCK_TOKENS,
                                     pool ? PDX_KV_FROM_POOL
                                          : PDX_KV_FROM_ARENA,
                                     &params);
        if (st == PDX_OK) {
            cJSON_AddStringToObject(out, "params", params);
            pdx_kv_free(params);
        }
    }
    cJSON_AddNumberToObject(out, "st", st);
    cJSON_AddStringToObject(out, "err", st ? pdx_last_error() : "");
    free(ids);
    free(h);
    return out;
}

static cJSON *cmd_load(node_t *n, const cJSON *c)
{
    const char *req = cJSON_GetObjectItem(c, "req")->valuestring;
    uint64_t seed = (uint64_t)cJSON_GetObjectItem(c, "seed")->valuedouble;
    size_t nb = (size_t)cJSON_GetObjectItem(c, "nblocks")->valuedouble;
    uint64_t first = (uint64_t)cJSON_GetObjectItem(c, "first")->valuedouble;
    const cJSON *params = cJSON_GetObjectItem(c, "params");
    pdx_block_hash_t *h = calloc(nb, sizeof(*h));
    hashes_of(n, seed, nb, h);
    for (size_t a = 0; a < n->narenas; a++) {
        for (size_t b = 0; b < nb; b++) {
            memset(block_ptr(n, a, first + b), 0xee,
                   (size_t)BYTES_PER_TOKEN * BLOCK_TOKENS);
        }
    }
    pdx_kv_request_t r = mkreq(req, h, nb);
    r.params = cJSON_IsString(params) ? params->valuestring : NULL;
    uint64_t t0 = pdx_now_ms();
    pdx_kv_match_t m = {0};
    pdx_status_t st;
    int pending = 0;
    while ((st = pdx_kv_lookup(n->conn, &r, &m)) == PDX_INPROGRESS &&
           pdx_now_ms() - t0 < 20000) {
        pending++;
        node_progress(n);
        usleep(2000);
    }
    double lookup_ms = ms_since(t0);
    cJSON *out = cJSON_CreateObject();
    size_t tokens = 0;
    if (st == PDX_OK && (m.blocks > 0 || m.tail)) {
        uint64_t *ids = malloc((nb + 1) * sizeof(*ids));
        for (size_t i = 0; i <= nb; i++) {
            ids[i] = first + i;
        }
        st = pdx_kv_load(n->conn, &r, &m, ids);
        uint64_t end = pdx_now_ms() + 20000;
        if (st == PDX_OK) {
            while ((st = pdx_kv_load_check(n->conn, req, &tokens)) ==
                       PDX_INPROGRESS &&
                   pdx_now_ms() < end) {
                node_progress(n);
                usleep(500);
            }
        }
        free(ids);
        if (st == PDX_OK && tokens > 0) {
            cJSON_AddNumberToObject(out, "diff",
                                    (double)diff_blocks(n, h, m.blocks,
                                                        first));
        }
    }
    cJSON_AddNumberToObject(out, "st", st);
    cJSON_AddStringToObject(out, "err", st ? pdx_last_error() : "");
    cJSON_AddStringToObject(out, "source",
                            m.source == PDX_KV_SOURCE_REMOTE    ? "remote"
                            : m.source == PDX_KV_SOURCE_OFFLOAD ? "offload"
                                                                : "none");
    cJSON_AddNumberToObject(out, "blocks", (double)m.blocks);
    cJSON_AddNumberToObject(out, "tokens", (double)tokens);
    cJSON_AddNumberToObject(out, "pending", pending);
    cJSON_AddNumberToObject(out, "lookup_ms", lookup_ms);
    cJSON_AddNumberToObject(out, "ms", ms_since(t0));
    free(h);
    return out;
}

static cJSON *cmd_stats(node_t *n)
{
    cJSON *out = cJSON_CreateObject();
    pdx_offload_stats_t os;
    if (pdx_kv_offload_stats(n->conn, &os) == PDX_OK) {
        cJSON_AddNumberToObject(out, "retained",
                                (double)os.blocks[PDX_OFFLOAD_RETAINED]);
        cJSON_AddNumberToObject(out, "reclaimable",
                                (double)os.blocks[PDX_OFFLOAD_RECLAIMABLE]);
    }
    pdx_kv_store_stats_t ss;
    if (pdx_kv_store_stats(n->conn, &ss) == PDX_OK) {
        cJSON_AddNumberToObject(out, "registered",
                                (double)ss.registered_blocks);
        cJSON_AddNumberToObject(out, "registrations",
                                (double)ss.registrations);
        cJSON_AddNumberToObject(out, "demoted", (double)ss.demoted);
        cJSON_AddNumberToObject(out, "discovered", (double)ss.discovered);
        cJSON_AddNumberToObject(out, "remote_hits", (double)ss.remote_hits);
        cJSON_AddNumberToObject(out, "remote_served",
                                (double)ss.remote_served);
        cJSON_AddNumberToObject(out, "peers_gone", (double)ss.peers_gone);
    }
    cJSON_AddNumberToObject(out, "held",
                            (double)pdx_kv_held_requests(n->conn));
    cJSON_AddNumberToObject(out, "freed_done", n->freed[PDX_KV_FREED_DONE]);
    cJSON_AddNumberToObject(out, "freed_gone",
                            n->freed[PDX_KV_FREED_PEER_GONE]);
    char *json = NULL;
    if (pdx_stats_json(pdx_kv_connector_agent(n->conn), &json) == PDX_OK) {
        cJSON_AddItemToObject(out, "agent", cJSON_Parse(json));
        pdx_blob_free(json);
    }
    char line[512];
    pdx_store_describe(pdx_kv_connector_agent(n->conn), line, sizeof(line));
    cJSON_AddStringToObject(out, "store", line);
    return out;
}

typedef struct owner_count {
    int *n;
} owner_count_t;

static void count_owner(void *arg, size_t i, const char *owner)
{
    (void)owner;
    ((int *)arg)[i]++;
}

static cJSON *cmd_owners(node_t *n, const cJSON *c)
{
    uint64_t seed = (uint64_t)cJSON_GetObjectItem(c, "seed")->valuedouble;
    size_t nb = (size_t)cJSON_GetObjectItem(c, "nblocks")->valuedouble;
    pdx_block_hash_t *h = calloc(nb, sizeof(*h));
    hashes_of(n, seed, nb, h);
    char **hex = calloc(nb, sizeof(*hex));
    for (size_t i = 0; i < nb; i++) {
        hex[i] = malloc(PDX_BLOCK_HASH_HEX_MAX);
        pdx_block_hash_to_hex(&h[i], hex[i], PDX_BLOCK_HASH_HEX_MAX);
    }
    int *cnt = calloc(nb, sizeof(*cnt));
    pdx_status_t st = pdx_store_owners_get(pdx_kv_connector_agent(n->conn),
                                           (const char *const *)hex, nb,
                                           count_owner, cnt);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "st", st);
    int lo = INT_MAX, hi = 0;
    for (size_t i = 0; i < nb; i++) {
        lo = cnt[i] < lo ? cnt[i] : lo;
        hi = cnt[i] > hi ? cnt[i] : hi;
        free(hex[i]);
    }
    cJSON_AddNumberToObject(out, "min", lo);
    cJSON_AddNumberToObject(out, "max", hi);
    free(hex);
    free(cnt);
    free(h);
    return out;
}

static int node_main(int fd, const char *config)
{
    node_t n = {.fd = fd};
    pdx_kv_config_t cfg;
    char err[512];
    if (pdx_kv_config_load(config, &cfg, err, sizeof(err)) != PDX_OK) {
        die("config: %s", err);
    }
    if (pdx_kv_config_layout(&cfg, &n.layout) != PDX_OK) {
        die("layout: %s", pdx_last_error());
    }
    uint64_t size = pdx_layout_carve_size(n.layout, 4096);
    if (pdx_mem_alloc(size, PDX_MEM_F_POPULATE, &n.mem) != PDX_OK ||
        pdx_layout_carve(n.layout, (uintptr_t)n.mem, size, 4096, 0) !=
            PDX_OK) {
        die("arenas: %s", pdx_last_error());
    }
    n.narenas = pdx_layout_num_arenas(n.layout);
    for (size_t a = 0; a < n.narenas && a < 16; a++) {
        pdx_layout_get_arena(n.layout, a, &n.arenas[a]);
    }
    pdx_kv_connector_params_t cp = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT,
        .config = &cfg, .layout = n.layout};
    pdx_status_t st = pdx_kv_connector_create(&cp, &n.conn);
    cJSON *hello = cJSON_CreateObject();
    cJSON_AddNumberToObject(hello, "st", st);
    cJSON_AddStringToObject(hello, "err", st ? pdx_last_error() : "");
    cJSON_AddNumberToObject(hello, "pid", getpid());
    reply(&n, hello);
    if (st != PDX_OK) {
        return 3;
    }
    for (uint64_t guard = 0; guard < 100000000ull; guard++) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, 5);
        node_progress(&n);
        if (rc <= 0) {
            continue;
        }
        char *msg = recv_msg(fd, NULL);
        if (msg == NULL) {
            break; /* driver gone */
        }
        cJSON *c = cJSON_Parse(msg);
        free(msg);
        const char *op = cJSON_GetObjectItem(c, "op")->valuestring;
        cJSON *out = NULL;
        if (strcmp(op, "quit") == 0) {
            cJSON_Delete(c);
            break;
        } else if (strcmp(op, "prefill") == 0) {
            out = cmd_save(&n, c, true);
        } else if (strcmp(op, "save") == 0) {
            out = cmd_save(&n, c, false);
        } else if (strcmp(op, "load") == 0) {
            out = cmd_load(&n, c);
        } else if (strcmp(op, "stats") == 0) {
            out = cmd_stats(&n);
        } else if (strcmp(op, "owners") == 0) {
            out = cmd_owners(&n, c);
        } else if (strcmp(op, "state") == 0) {
            out = cJSON_CreateObject();
            cJSON_AddNumberToObject(
                out, "st",
                pdx_peer_state(pdx_kv_connector_agent(n.conn),
                               cJSON_GetObjectItem(c, "peer")->valuestring));
        } else if (strcmp(op, "fetch") == 0) {
            out = cJSON_CreateObject();
            st = pdx_peer_fetch(pdx_kv_connector_agent(n.conn),
                                cJSON_GetObjectItem(c, "peer")->valuestring,
                                3000);
            cJSON_AddNumberToObject(out, "st", st);
            cJSON_AddStringToObject(out, "err", st ? pdx_last_error() : "");
        } else if (strcmp(op, "bump") == 0) {
            /* A new region: the agent's generation changes. */
            out = cJSON_CreateObject();
            pdx_mem_reg_h reg;
            if (n.extra == NULL) {
                n.extra = aligned_alloc(4096, 1 << 20);
            }
            st = pdx_mem_register(pdx_kv_connector_agent(n.conn),
                                  PDX_MEM_DRAM, (uintptr_t)n.extra, 1 << 20,
                                  0, 0, &reg);
            cJSON_AddNumberToObject(out, "st", st);
        } else {
            die("unknown op %s", op);
        }
        cJSON_Delete(c);
        reply(&n, out);
    }
    pdx_kv_connector_destroy(n.conn);
    pdx_layout_destroy(n.layout);
    pdx_mem_free(n.mem);
    free(n.extra);
    return 0;
}

/* ======================= driver ======================= */

static netns_lab_t g_lab;
static etcd_proc_t g_etcd;
static bool g_etcd_up;
static char g_dir[256];
static char g_self[PATH_MAX];
static int g_failed;

typedef struct proc {
    pid_t pid;
    int fd;
    char name[64];
    int host;
} proc_t;

static void cleanup(void)
{
    if (g_etcd_up) {
        etcd_cleanup(&g_etcd);
        g_etcd_up = false;
    }
    netns_cleanup(&g_lab);
    if (g_dir[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) {
            /* best effort */
        }
        g_dir[0] = '\0';
    }
}

static void on_signal(int sig)
{
    (void)sig;
    cleanup();
    _exit(1);
}

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            g_failed++;                                                        \
        }                                                                      \
    } while (0)

static void write_config(const char *path, const char *name, const char *peer,
                         const char *seed, uint32_t bytes_per_token)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        die("%s: %s", path, strerror(errno));
    }
    fprintf(f,
            "{\"version\": 1,\n"
            " \"model\": {\"id\": \"test/netns\", \"kv_dtype\": \"fp8\",\n"
            "   \"num_layers\": %d, \"mla_bytes_per_token\": %u},\n"
            " \"kv\": {\"block_tokens\": %d, \"num_blocks\": %d},\n"
            " \"hashing\": {\"algorithm\": \"xxhash_cbor\", \"seed\": \"%s\"},\n"
            " \"agent\": {\"role\": \"both\", \"name\": \"%s\"%s%s%s},\n"
            " \"connector\": {\"children\": [\n"
            "   {\"type\": \"remote\", \"lease_ms\": 30000},\n"
            "   {\"type\": \"offload\", \"budget_bytes\": \"64MiB\"}]},\n"
            " \"backends\": [{\"name\": \"ucx\", \"options\": {\"tls\": "
            "\"tcp\"}}],\n"
            " \"store\": {\"endpoints\": [\"%s\"], \"namespace\": "
            "\"netns-%d\",\n"
            "   \"lease_ttl_ms\": %d, \"timeout_ms\": 1000,\n"
            "   \"fetch_timeout_ms\": 5000, \"remote_offload_timeout_ms\": "
            "5000}}\n",
            NLAYERS, bytes_per_token, BLOCK_TOKENS, NUM_BLOCKS, seed, name,
            peer ? ", \"peer\": \"" : "", peer ? peer : "", peer ? "\"" : "",
            g_etcd.url, (int)getpid(), LEASE_TTL_MS);
    fclose(f);
}

static cJSON *call(proc_t *p, cJSON *cmd, int timeout_ms)
{
    char *text = cJSON_PrintUnformatted(cmd);
    cJSON_Delete(cmd);
    send_msg(p->fd, text, (uint32_t)strlen(text));
    free(text);
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0) {
        die("node %s did not answer in %d ms", p->name, timeout_ms);
    }
    char *msg = recv_msg(p->fd, NULL);
    if (msg == NULL) {
        die("node %s closed its channel", p->name);
    }
    cJSON *r = cJSON_Parse(msg);
    free(msg);
    return r;
}

static cJSON *op(const char *name)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "op", name);
    return c;
}

static cJSON *op_blocks(const char *name, const char *req, int seed, int nb,
                        int first)
{
    cJSON *c = op(name);
    cJSON_AddStringToObject(c, "req", req);
    cJSON_AddNumberToObject(c, "seed", seed);
    cJSON_AddNumberToObject(c, "nblocks", nb);
    cJSON_AddNumberToObject(c, "first", first);
    return c;
}

static double num(const cJSON *r, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(r, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *str(const cJSON *r, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(r, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int start_node(proc_t *p, int host, const char *name,
                      const char *peer, const char *seed, uint32_t bpt)
{
    char config[400];
    snprintf(config, sizeof(config), "%s/%s.json", g_dir, name);
    write_config(config, name, peer, seed, bpt);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        die("socketpair: %s", strerror(errno));
    }
    char fdarg[16];
    snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
    char *argv[] = {g_self, "--node", fdarg, config, NULL};
    char *env[] = {"UCX_NET_DEVICES=eth0", "UCX_WARN_UNUSED_ENV_VARS=n",
                   NULL};
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->host = host;
    p->pid = netns_spawn(&g_lab, host, argv, env, sv[1]);
    close(sv[1]);
    if (p->pid < 0) {
        die("spawn %s: %s", name, strerror(errno));
    }
    p->fd = sv[0];
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
    if (poll(&pfd, 1, 30000) <= 0) {
        die("node %s did not start", name);
    }
    char *msg = recv_msg(p->fd, NULL);
    cJSON *h = msg ? cJSON_Parse(msg) : NULL;
    free(msg);
    int st = h ? (int)num(h, "st") : -1;
    if (st != 0) {
        fprintf(stderr, "node %s: %s\n", name, h ? str(h, "err") : "died");
    }
    cJSON_Delete(h);
    return st;
}

static void stop_node(proc_t *p, bool kill_it)
{
    if (p->pid <= 0) {
        return;
    }
    if (!kill_it) {
        cJSON *q = op("quit");
        char *text = cJSON_PrintUnformatted(q);
        cJSON_Delete(q);
        send_msg(p->fd, text, (uint32_t)strlen(text));
        free(text);
        for (int i = 0; i < 200 && waitpid(p->pid, NULL, WNOHANG) == 0; i++) {
            usleep(50000);
        }
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    close(p->fd);
    p->pid = -1;
}

/* The peer entry of `peer` in a node's stats. */
static const cJSON *peer_entry(const cJSON *stats, const char *peer)
{
    const cJSON *peers =
        cJSON_GetObjectItem(cJSON_GetObjectItem(stats, "agent"), "peers");
    const cJSON *e;
    cJSON_ArrayForEach(e, peers)
    {
        if (strcmp(str(e, "name"), peer) == 0) {
            return e;
        }
    }
    return NULL;
}

static int wait_state(proc_t *d, const char *peer, int want, int timeout_ms,
                      uint64_t *ms_p)
{
    uint64_t t0 = pdx_now_ms();
    int st = 1;
    while (pdx_now_ms() - t0 < (uint64_t)timeout_ms) {
        cJSON *c = op("state");
        cJSON_AddStringToObject(c, "peer", peer);
        cJSON *r = call(d, c, 10000);
        st = (int)num(r, "st");
        cJSON_Delete(r);
        if (st == want) {
            break;
        }
        usleep(20000);
    }
    if (ms_p != NULL) {
        *ms_p = pdx_now_ms() - t0;
    }
    return st;
}

static void run_cases(void)
{
    proc_t p, d, o1, o2, o3, z, y;
    /* -- discovery by name, path report -- */
    printf("== discovery: P on host 0, D on host 1, blobs only in etcd\n");
    if (start_node(&p, 0, "p1", NULL, "s", BYTES_PER_TOKEN) != 0 ||
        start_node(&d, 1, "d1", "p1", "s", BYTES_PER_TOKEN) != 0) {
        die("nodes did not start");
    }
    cJSON *r = call(&p, op_blocks("prefill", "r1", 1, 32, 0), 30000);
    char *params = strdup(str(r, "params"));
    EXPECT(num(r, "st") == 0 && params[0], "prefill: %s", str(r, "err"));
    cJSON_Delete(r);
    cJSON *c = op_blocks("load", "r1", 1, 32, 100);
    cJSON_AddStringToObject(c, "params", params);
    r = call(&d, c, 60000);
    EXPECT(num(r, "st") == 0 && strcmp(str(r, "source"), "remote") == 0 &&
              num(r, "blocks") == 32 && num(r, "diff") == 0,
          "load by name: st %g source %s blocks %g diff %g: %s",
          num(r, "st"), str(r, "source"), num(r, "blocks"), num(r, "diff"),
          str(r, "err"));
    printf("discovery: first transfer to a peer known only by name, from "
           "cold: %.0f ms (lookup with discovery %.0f ms, 32 blocks, %d "
           "KiB)\n",
           num(r, "ms"), num(r, "lookup_ms"),
           32 * NLAYERS * BYTES_PER_TOKEN * BLOCK_TOKENS / 1024);
    cJSON_Delete(r);
    r = call(&d, op("stats"), 10000);
    const cJSON *pe = peer_entry(r, "p1");
    const cJSON *ucx = cJSON_GetObjectItem(cJSON_GetObjectItem(pe, "paths"),
                                           "ucx");
    printf("path report: p1 same_host %s, ucx transport %s; D's store: %s\n",
           cJSON_IsTrue(cJSON_GetObjectItem(pe, "same_host")) ? "true"
                                                               : "false",
           str(ucx, "transport"), str(r, "store"));
    EXPECT(pe != NULL && cJSON_IsFalse(cJSON_GetObjectItem(pe, "same_host")),
          "P and D must not be the same host");
    EXPECT(strstr(str(ucx, "transport"), "tcp") != NULL,
          "UCX over tcp expected, got '%s'", str(ucx, "transport"));
    EXPECT(num(r, "discovered") >= 1, "discovered %g", num(r, "discovered"));
    cJSON_Delete(r);

    /* -- P restarted -- */
    printf("== restart: P killed (RST reaches D) and started again\n");
    uint64_t t0 = pdx_now_ms();
    stop_node(&p, true);
    uint64_t dead_ms;
    int st = wait_state(&d, "p1", PDX_ERR_REMOTE_DISCONNECT, 15000, &dead_ms);
    EXPECT(st == PDX_ERR_REMOTE_DISCONNECT, "D did not see P die (%d)", st);
    r = call(&d, op("stats"), 10000);
    printf("P killed: D failed it after %llu ms (%s)\n",
           (unsigned long long)(pdx_now_ms() - t0),
           str(peer_entry(r, "p1"), "dead_how"));
    cJSON_Delete(r);
    if (start_node(&p, 0, "p1", NULL, "s", BYTES_PER_TOKEN) != 0) {
        die("P did not restart");
    }
    uint64_t back_ms;
    st = wait_state(&d, "p1", 0, 15000, &back_ms);
    EXPECT(st == 0, "D did not reload the restarted P through the watch");
    printf("restarted P reloaded by D through the watch %llu ms after its "
           "start\n", (unsigned long long)back_ms);
    r = call(&p, op_blocks("prefill", "r2", 2, 32, 0), 30000);
    free(params);
    params = strdup(str(r, "params"));
    cJSON_Delete(r);
    c = op_blocks("load", "r2", 2, 32, 100);
    cJSON_AddStringToObject(c, "params", params);
    r = call(&d, c, 60000);
    EXPECT(num(r, "st") == 0 && num(r, "blocks") == 32 && num(r, "diff") == 0,
          "load after restart: st %g blocks %g diff %g: %s", num(r, "st"),
          num(r, "blocks"), num(r, "diff"), str(r, "err"));
    cJSON_Delete(r);

    /* -- etcd down -- */
    printf("== etcd killed mid-run\n");
    etcd_kill(&g_etcd, SIGKILL);
    for (int i = 0; i < 5; i++) {
        char req[16];
        snprintf(req, sizeof(req), "r3-%d", i);
        r = call(&p, op_blocks("prefill", req, 30 + i, 16, 0), 30000);
        free(params);
        params = strdup(str(r, "params"));
        cJSON_Delete(r);
        c = op_blocks("load", req, 30 + i, 16, 100);
        cJSON_AddStringToObject(c, "params", params);
        r = call(&d, c, 60000);
        EXPECT(num(r, "st") == 0 && num(r, "blocks") == 16 &&
                  num(r, "diff") == 0,
              "load with etcd down: st %g blocks %g diff %g: %s",
              num(r, "st"), num(r, "blocks"), num(r, "diff"), str(r, "err"));
        cJSON_Delete(r);
    }
    r = call(&p, op("bump"), 10000); /* new generation while down */
    cJSON_Delete(r);
    r = call(&d, op("stats"), 10000);
    printf("while down, D says: %s\n", str(r, "store"));
    EXPECT(strstr(str(r, "store"), "unreachable since") != NULL,
          "D's store status should say unreachable");
    double gen0 = num(peer_entry(r, "p1"), "generation");
    cJSON_Delete(r);
    netns_enter(&g_lab, -2);
    char err[256];
    if (etcd_restart(&g_etcd, err, sizeof(err)) != 0) {
        die("etcd restart: %s", err);
    }
    netns_enter(&g_lab, -1);
    t0 = pdx_now_ms();
    double gen = gen0;
    while (gen <= gen0 && pdx_now_ms() - t0 < 20000) {
        usleep(50000);
        r = call(&d, op("stats"), 10000);
        gen = num(peer_entry(r, "p1"), "generation");
        cJSON_Delete(r);
    }
    EXPECT(gen > gen0, "P's new generation never reached D (%g)", gen);
    printf("etcd back: P's generation %g -> %g reached D %llu ms after the "
           "restart\n", gen0, gen, (unsigned long long)(pdx_now_ms() - t0));
    r = call(&p, op_blocks("prefill", "r4", 4, 16, 0), 30000);
    free(params);
    params = strdup(str(r, "params"));
    cJSON_Delete(r);
    c = op_blocks("load", "r4", 4, 16, 100);
    cJSON_AddStringToObject(c, "params", params);
    r = call(&d, c, 60000);
    EXPECT(num(r, "st") == 0 && num(r, "diff") == 0, "load after etcd back");
    cJSON_Delete(r);

    /* -- death of a host: no RST -- */
    printf("== P's host dies (link cut, P killed): lease TTL %d ms\n",
           LEASE_TTL_MS);
    r = call(&d, op_blocks("prefill", "r5", 5, 8, 50), 30000);
    cJSON_Delete(r);
    /* D holds blocks for P (its configured peer) from its pool. */
    c = op_blocks("prefill", "r6", 6, 8, 60);
    cJSON_AddStringToObject(c, "from", "pool");
    r = call(&d, c, 30000);
    EXPECT(num(r, "st") == 0, "pool handoff: %s", str(r, "err"));
    cJSON_Delete(r);
    r = call(&d, op("stats"), 10000);
    double held0 = num(r, "held");
    cJSON_Delete(r);
    netns_link(&g_lab, p.host, false);
    t0 = pdx_now_ms();
    stop_node(&p, true);
    st = wait_state(&d, "p1", PDX_ERR_REMOTE_DISCONNECT, LEASE_TTL_MS + 15000,
                    &dead_ms);
    uint64_t t_dead = pdx_now_ms() - t0;
    EXPECT(st == PDX_ERR_REMOTE_DISCONNECT, "D never failed P");
    double held = held0, gone = 0;
    while (held >= held0 &&
           pdx_now_ms() - t0 < (uint64_t)LEASE_TTL_MS + 15000) {
        r = call(&d, op("stats"), 10000);
        held = num(r, "held");
        gone = num(r, "freed_gone");
        if (held < held0) {
            printf("P's host dead: D failed P after %llu ms (%s), freed what "
                   "it held for P after %llu ms (freed as peer gone: %g)\n",
                   (unsigned long long)t_dead,
                   str(peer_entry(r, "p1"), "dead_how"),
                   (unsigned long long)(pdx_now_ms() - t0), gone);
        }
        cJSON_Delete(r);
        usleep(20000);
    }
    EXPECT(held < held0 && gone >= 1, "D did not free P's handoff");
    EXPECT(t_dead <= (uint64_t)LEASE_TTL_MS + 2500,
          "P failed after %llu ms: more than the TTL plus a watch round trip",
          (unsigned long long)t_dead);
    c = op_blocks("load", "r4b", 4, 16, 100);
    cJSON_AddStringToObject(c, "params", params);
    t0 = pdx_now_ms();
    r = call(&d, c, 60000);
    EXPECT(num(r, "tokens") == 0, "a load from dead P must load nothing");
    printf("a request to dead P: answered in %llu ms, %g tokens (the engine "
           "recomputes)\n", (unsigned long long)(pdx_now_ms() - t0),
           num(r, "tokens"));
    cJSON_Delete(r);
    netns_link(&g_lab, 0, true);
    free(params);

    /* -- three owners, cross-node hit -- */
    printf("== block-owner registry: three owners, then a cross-node hit\n");
    if (start_node(&o1, 0, "o1", NULL, "s", BYTES_PER_TOKEN) != 0 ||
        start_node(&o2, 2, "o2", NULL, "s", BYTES_PER_TOKEN) != 0 ||
        start_node(&o3, 3, "o3", NULL, "s", BYTES_PER_TOKEN) != 0) {
        die("owner nodes did not start");
    }
    proc_t *owners[3] = {&o1, &o2, &o3};
    for (int i = 0; i < 3; i++) {
        r = call(owners[i], op_blocks("save", "s7", 7, 24, 0), 30000);
        EXPECT(num(r, "st") == 0, "save on %s: %s", owners[i]->name,
              str(r, "err"));
        cJSON_Delete(r);
        t0 = pdx_now_ms();
        double reg = 0;
        while (reg < 24 && pdx_now_ms() - t0 < 10000) {
            r = call(owners[i], op("stats"), 10000);
            reg = num(r, "registered");
            cJSON_Delete(r);
            usleep(10000);
        }
        EXPECT(reg >= 24, "%s registered %g blocks", owners[i]->name, reg);
    }
    r = call(&o3, op("stats"), 10000);
    printf("third owner: %g reclaimable, %g retained, %g demoted, in %g "
           "registration call(s)\n", num(r, "reclaimable"),
           num(r, "retained"), num(r, "demoted"), num(r, "registrations"));
    EXPECT(num(r, "reclaimable") == 24 && num(r, "demoted") == 24,
          "the third replica should be reclaimable");
    cJSON_Delete(r);
    r = call(&o1, op("stats"), 10000);
    EXPECT(num(r, "reclaimable") == 0 && num(r, "retained") == 24,
          "the first replica stays retained");
    cJSON_Delete(r);
    c = op("owners");
    cJSON_AddNumberToObject(c, "seed", 7);
    cJSON_AddNumberToObject(c, "nblocks", 24);
    r = call(&o2, c, 10000);
    EXPECT(num(r, "min") == 3 && num(r, "max") == 3, "owners %g..%g",
          num(r, "min"), num(r, "max"));
    cJSON_Delete(r);
    t0 = pdx_now_ms();
    stop_node(&o1, true);
    double mx = 3;
    while (mx > 2 && pdx_now_ms() - t0 < 15000) {
        c = op("owners");
        cJSON_AddNumberToObject(c, "seed", 7);
        cJSON_AddNumberToObject(c, "nblocks", 24);
        r = call(&o2, c, 10000);
        mx = num(r, "max");
        cJSON_Delete(r);
        usleep(50000);
    }
    EXPECT(mx == 2, "killed owner's entries still there (%g owners)", mx);
    printf("owner o1 killed: its entries gone after %llu ms\n",
           (unsigned long long)(pdx_now_ms() - t0));
    /* D (host 1) has none of these blocks: a cross-node offload hit. */
    r = call(&d, op_blocks("load", "x1", 7, 24, 120), 60000);
    EXPECT(num(r, "st") == 0 && strcmp(str(r, "source"), "remote") == 0 &&
              num(r, "blocks") == 24 && num(r, "diff") == 0,
          "cross-node hit: st %g source %s blocks %g diff %g: %s",
          num(r, "st"), str(r, "source"), num(r, "blocks"), num(r, "diff"),
          str(r, "err"));
    printf("cross-node offload hit: 24 blocks from another node's pool, "
           "byte-exact (diff %g B), %.0f ms (lookup %.0f ms)\n",
           num(r, "diff"), num(r, "ms"), num(r, "lookup_ms"));
    cJSON_Delete(r);
    r = call(&d, op("stats"), 10000);
    EXPECT(num(r, "remote_hits") >= 1, "no cross-node hit counted");
    cJSON_Delete(r);

    /* -- mismatch through the store -- */
    printf("== peers of another seed or layout, found through the store\n");
    if (start_node(&z, 2, "pz", NULL, "other-seed", BYTES_PER_TOKEN) != 0 ||
        start_node(&y, 3, "py", NULL, "s", BYTES_PER_TOKEN / 2) != 0) {
        die("mismatch nodes did not start");
    }
    c = op("fetch");
    cJSON_AddStringToObject(c, "peer", "pz");
    r = call(&d, c, 10000);
    EXPECT(num(r, "st") == PDX_ERR_MISMATCH &&
              strstr(str(r, "err"), "none_hash") != NULL,
          "seed: st %g: %s", num(r, "st"), str(r, "err"));
    printf("other seed: %s\n", str(r, "err"));
    cJSON_Delete(r);
    c = op("fetch");
    cJSON_AddStringToObject(c, "peer", "py");
    r = call(&d, c, 10000);
    EXPECT(num(r, "st") == PDX_ERR_MISMATCH &&
              strstr(str(r, "err"), "layout_fingerprint") != NULL,
          "layout: st %g: %s", num(r, "st"), str(r, "err"));
    printf("other layout: %s\n", str(r, "err"));
    cJSON_Delete(r);
    stop_node(&z, false);
    stop_node(&y, false);
    stop_node(&o2, false);
    stop_node(&o3, false);
    stop_node(&d, false);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--node") == 0) {
        signal(SIGPIPE, SIG_IGN);
        return node_main(atoi(argv[2]), argv[3]);
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("PDX_TEST_LEASE_TTL_MS") != NULL) {
        g_ttl_ms = atoi(getenv("PDX_TEST_LEASE_TTL_MS"));
    }
    char why[512];
    if (!etcd_available(why, sizeof(why))) {
        printf("skipped: %s\n", why);
        return 77;
    }
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
    if (n <= 0) {
        die("readlink /proc/self/exe: %s", strerror(errno));
    }
    g_self[n] = '\0';
    if (netns_init(&g_lab, 4, why, sizeof(why)) != 0) {
        printf("skipped: %s\n", why);
        return 77;
    }
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    snprintf(g_dir, sizeof(g_dir), "/tmp/pdx-netns-XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        die("mkdtemp: %s", strerror(errno));
    }
    /* etcd lives on the hub, reachable from every host. */
    if (netns_enter(&g_lab, -2) != 0) {
        die("cannot enter the hub namespace");
    }
    if (etcd_start(&g_etcd, netns_hub_ip(), NULL, why, sizeof(why)) != 0) {
        die("etcd: %s", why);
    }
    g_etcd_up = true;
    netns_enter(&g_lab, -1);
    printf("hosts: 4 network + pid namespaces on 10.77.0.0/24, etcd at %s\n",
           g_etcd.url);
    run_cases();
    cleanup();
    if (g_failed) {
        printf("FAIL: %d check(s) failed\n", g_failed);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
