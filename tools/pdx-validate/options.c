/* pdx-validate's command line, one parser for both modes: the options each
 * mode accepts (--multi-node anywhere picks the multi-node run and its own
 * options), their defaults (a soak's and a multi-node run's differ), and
 * the configs and node binary it finds by default. */
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "validate.h"

#ifndef PDX_SOURCE_DIR
#define PDX_SOURCE_DIR "."
#endif
#ifndef PDX_NODE_PATH
#define PDX_NODE_PATH "glm52-pd-node"
#endif

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pdx-validate [options]\n"
        "Runs multi-turn sessions through the GLM-5.2 P/D example and checks\n"
        "reuse and every loaded byte. Exit 0 only if every check passed.\n"
        "  --p-config FILE     prefill node config (default: colocated-"
        "prefill.json)\n"
        "  --d-config FILE     decode node config (default: colocated-"
        "decode.json)\n"
        "  --node PATH         glm52-pd-node binary (default: next to this "
        "one)\n"
        "  --sessions N        sessions (default 4)\n"
        "  --turns N           turns per session (default 2)\n"
        "  --prompts L,L,...   first-turn prompt lengths, cycled over "
        "sessions\n"
        "                      (default 1200,12020: partial tails of 48 and "
        "52)\n"
        "  --decode N          tokens D decodes per turn (default 32)\n"
        "  --user-tokens N     new user tokens per later turn (default 96)\n"
        "  --shared-prefix N   system prompt tokens every session shares "
        "(default 512)\n"
        "  --concurrency N     sessions in flight at once (default 2)\n"
        "  --min-inflight N    fail unless N sessions were in flight at once\n"
        "  --require-local     fail unless P reused its own offload tier;\n"
        "                      session 0's first prefill runs alone so the\n"
        "                      shared prefix is saved before others look\n"
        "                      it up (otherwise a race: all may miss)\n"
        "  --timeout S         whole run (default 600)\n"
        "  --job-timeout S     one request on a node (default 120)\n"
        "  --json              one JSON document on stdout\n"
        "  --quiet             no progress bar\n"
        "  --prompt-range A,B  first-turn prompt lengths drawn uniformly "
        "from [A, B]\n"
        "                      (instead of --prompts)\n"
        "  --soak              soak: many sessions of random prompt lengths "
        "at\n"
        "                      concurrency >= 17, some cancelled at random "
        "points;\n"
        "                      checks parity and that every block and lease "
        "is\n"
        "                      returned. Defaults: --sessions 200 "
        "--concurrency 17\n"
        "                      --prompt-range 128,800 --decode 16 "
        "--user-tokens 64\n"
        "                      --shared-prefix 128 --abort-rate 0.15\n"
        "  --seed N            random generator seed (default: from the "
        "clock;\n"
        "                      printed, so a run can be repeated)\n"
        "  --abort-rate P      fraction of sessions cancelled, 0..1 (soak "
        "only)\n"
        "  --multi-node        two P and two D \"hosts\" (network and pid\n"
        "                      namespaces, one private etcd; needs root and\n"
        "                      etcd): sessions routed across hosts, each\n"
        "                      peer's path and the D-to-P reuse across hosts\n"
        "                      reported. Takes --sessions, --turns, --prompts,\n"
        "                      --decode, --user-tokens, --shared-prefix,\n"
        "                      --node, --p-config, --d-config\n"
        "                      (pdx-validate --multi-node --help)\n"
        "  --version           pdx-validate's and libpdx.so's versions\n"
        "  -h, --help          this text\n");
}

/* --multi-node's one line of usage, on stdout for --help and a bad option
 * alike. */
static void usage_multinode(void)
{
    printf("usage: pdx-validate --multi-node [--sessions N] [--turns "
           "T] [--prompts A,B,..] [--decode G] [--user-tokens U] "
           "[--shared-prefix X] [--node PATH] [--p-config F] "
           "[--d-config F] [--vram]\n"
           "  --vram: every node's arenas in GPU memory (kv.memory "
           "\"vram\", P on device 0, D on device 1) through the CUDA "
           "driver\n  (PDX_CUDA_DRIVER_LIB, else libcuda.so.1)\n");
}

static int parse_range(const char *arg, opts_t *o)
{
    char *end;
    unsigned long a = strtoul(arg, &end, 10);
    if (*end != ',') {
        return -1;
    }
    unsigned long b = strtoul(end + 1, &end, 10);
    if (*end != '\0' || a < 2 || b < a || b > 1000000) {
        return -1;
    }
    o->range_lo = a;
    o->range_hi = b;
    return 0;
}

static int parse_prompts(const char *s, opts_t *o)
{
    o->nprompts = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long v = strtoul(t, &end, 10);
        if (*end != '\0' || v < 2 || v > 1000000 ||
            o->nprompts == MAX_PROMPTS) {
            free(copy);
            return -1;
        }
        o->prompts[o->nprompts++] = v;
    }
    free(copy);
    return o->nprompts > 0 ? 0 : -1;
}

/* --multi-node's --prompts: up to 16 lengths, taken as they come (no bounds
 * checked, unlike parse_prompts; a bad length shows in the run). */
static void parse_prompts_multinode(const char *s, opts_t *o)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    o->nprompts = 0;
    for (char *t = strtok_r(buf, ",", &save);
         t != NULL && o->nprompts < MULTINODE_MAX_PROMPTS;
         t = strtok_r(NULL, ",", &save)) {
        o->prompts[o->nprompts++] = strtoul(t, NULL, 10);
    }
}

char g_p_cfg[PATH_MAX], g_d_cfg[PATH_MAX];
static char g_node_bin[PATH_MAX];

/* Where the deployment configs are: $PDX_CONFIG_DIR, else an installed
 * tree's <bin>/../share/pdx/configs, else the checkout this was built
 * from. */
static const char *pd_config_dir(void)
{
    static char dir[PATH_MAX];
    if (dir[0] != '\0') {
        return dir;
    }
    const char *env = getenv("PDX_CONFIG_DIR");
    if (env != NULL && env[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s", env);
        return dir;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            char cand[PATH_MAX];
            snprintf(cand, sizeof(cand), "%s/../share/pdx/configs", self);
            if (access(cand, R_OK) == 0) {
                snprintf(dir, sizeof(dir), "%s", cand);
                return dir;
            }
        }
    }
    snprintf(dir, sizeof(dir), "%s/configs", PDX_SOURCE_DIR);
    return dir;
}

static void default_path(char *buf, size_t len, const char *leaf)
{
    snprintf(buf, len, "%s/glm52-fp8-mtp/%s", pd_config_dir(), leaf);
}

/* The node binary next to this one (both land in <build>/bin), else the
 * path it was built at. */
static void default_node(char *buf, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            snprintf(slash + 1, sizeof(self) - (size_t)(slash + 1 - self),
                     "glm52-pd-node");
            if (access(self, X_OK) == 0) {
                snprintf(buf, len, "%s", self);
                return;
            }
        }
    }
    snprintf(buf, len, "%s", PDX_NODE_PATH);
}

/* The options each mode accepts (getopt_long also takes any unambiguous
 * prefix of a name, so each mode keeps exactly its own list). */
static const struct option g_single_opts[] = {
    {"p-config", required_argument, NULL, 'P'},
    {"d-config", required_argument, NULL, 'D'},
    {"node", required_argument, NULL, 'n'},
    {"sessions", required_argument, NULL, 's'},
    {"turns", required_argument, NULL, 't'},
    {"prompts", required_argument, NULL, 'l'},
    {"decode", required_argument, NULL, 'g'},
    {"user-tokens", required_argument, NULL, 'u'},
    {"shared-prefix", required_argument, NULL, 'x'},
    {"concurrency", required_argument, NULL, 'c'},
    {"min-inflight", required_argument, NULL, 'm'},
    {"require-local", no_argument, NULL, 'L'},
    {"timeout", required_argument, NULL, 'T'},
    {"job-timeout", required_argument, NULL, 'J'},
    {"json", no_argument, NULL, 'j'},
    {"quiet", no_argument, NULL, 'q'},
    {"prompt-range", required_argument, NULL, 'R'},
    {"soak", no_argument, NULL, 'S'},
    {"seed", required_argument, NULL, 'r'},
    {"abort-rate", required_argument, NULL, 'a'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};
static const struct option g_multinode_opts[] = {
    {"multi-node", no_argument, NULL, 'M'},
    {"sessions", required_argument, NULL, 's'},
    {"turns", required_argument, NULL, 't'},
    {"prompts", required_argument, NULL, 'l'},
    {"decode", required_argument, NULL, 'g'},
    {"user-tokens", required_argument, NULL, 'u'},
    {"shared-prefix", required_argument, NULL, 'x'},
    {"node", required_argument, NULL, 'n'},
    {"p-config", required_argument, NULL, 'P'},
    {"d-config", required_argument, NULL, 'D'},
    {"vram", no_argument, NULL, 'V'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

/* The defaults before any option. A single run's -1s are settled after
 * them (settle_single: a soak's differ). */
static void defaults(opts_t *o, bool multi_node)
{
    if (multi_node) {
        *o = (opts_t){.multi_node = true,
                      .sessions = 6,
                      .turns = 2,
                      .gen = 64,
                      .user_tokens = 64,
                      .shared = 512};
        parse_prompts_multinode("1200,2600,700", o);
        return;
    }
    *o = (opts_t){.sessions = -1,
                  .turns = 2,
                  .concurrency = -1,
                  .gen = -1,
                  .user_tokens = -1,
                  .shared = -1,
                  .abort_rate = -1,
                  .timeout_s = 600,
                  .job_timeout_s = 120};
    parse_prompts("1200,12020", o);
}

/* Options given that change what settle_single does. */
typedef struct opts_seen {
    bool seed, prompts;
} opts_seen_t;

/* One option (getopt_long's `ch`, its argument `arg`) into *o: -1, or the
 * exit code (0 for --help). */
static int parse_option(int ch, const char *arg, opts_t *o, opts_seen_t *seen)
{
    switch (ch) {
    case 'M': /* --multi-node: the mode, already chosen */
        break;
    case 'V':
        o->vram = true;
        break;
    case 'P':
        o->p_config = arg;
        break;
    case 'D':
        o->d_config = arg;
        break;
    case 'n':
        o->node = arg;
        break;
    case 's':
        o->sessions = atoi(arg);
        break;
    case 't':
        o->turns = atoi(arg);
        break;
    case 'l':
        if (o->multi_node) {
            parse_prompts_multinode(arg, o);
        } else if (parse_prompts(arg, o) != 0) {
            fprintf(stderr, "pdx-validate: --prompts: comma-separated "
                            "lengths >= 2\n");
            return EXIT_SETUP;
        }
        seen->prompts = true;
        break;
    case 'R':
        if (parse_range(arg, o) != 0) {
            fprintf(stderr, "pdx-validate: --prompt-range: A,B with "
                            "2 <= A <= B\n");
            return EXIT_SETUP;
        }
        break;
    case 'S':
        o->soak = true;
        break;
    case 'r': {
        char *end;
        o->seed = strtoull(arg, &end, 0);
        if (*end != '\0' || arg[0] == '\0') {
            fprintf(stderr, "pdx-validate: --seed: a number\n");
            return EXIT_SETUP;
        }
        seen->seed = true;
        break;
    }
    case 'a':
        o->abort_rate = atof(arg);
        break;
    case 'g':
        o->gen = atoi(arg);
        break;
    case 'u':
        o->user_tokens = atoi(arg);
        break;
    case 'x':
        o->shared = atoi(arg);
        break;
    case 'c':
        o->concurrency = atoi(arg);
        break;
    case 'm':
        o->min_inflight = atoi(arg);
        break;
    case 'L':
        o->require_local = true;
        break;
    case 'T':
        o->timeout_s = atof(arg);
        break;
    case 'J':
        o->job_timeout_s = atof(arg);
        break;
    case 'j':
        o->json = true;
        break;
    case 'q':
        o->quiet = true;
        break;
    case 'h':
        if (o->multi_node) {
            usage_multinode();
        } else {
            usage(stdout);
        }
        return 0;
    default:
        if (o->multi_node) {
            usage_multinode();
        } else {
            usage(stderr);
        }
        return EXIT_SETUP;
    }
    return -1;
}

/* A single run's defaults that depend on --soak, its seed, and the checks
 * across options: -1, or the exit code. */
static int settle_single(opts_t *o, const opts_seen_t *seen, bool extra_args)
{
    /* Defaults: a soak is many short sessions at concurrency 17 whose
     * footprints fit the colocated configs' 254-block budget 17 times. */
    if (o->sessions < 0) {
        o->sessions = o->soak ? 200 : 4;
    }
    if (o->concurrency < 0) {
        o->concurrency = o->soak ? SOAK_MIN_CONCURRENCY : 2;
    }
    if (o->gen < 0) {
        o->gen = o->soak ? 16 : 32;
    }
    if (o->user_tokens < 0) {
        o->user_tokens = o->soak ? 64 : 96;
    }
    if (o->shared < 0) {
        o->shared = o->soak ? 128 : 512;
    }
    if (o->abort_rate < 0) {
        o->abort_rate = o->soak ? 0.15 : 0;
    }
    if (o->soak && o->range_hi == 0 && !seen->prompts) {
        o->range_lo = 128;
        o->range_hi = 800;
    }
    if (!seen->seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o->seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                  ((uint64_t)getpid() << 32);
    }
    if (o->soak && o->concurrency < SOAK_MIN_CONCURRENCY) {
        fprintf(stderr, "pdx-validate: --soak needs --concurrency %d or more\n",
                SOAK_MIN_CONCURRENCY);
        return EXIT_SETUP;
    }
    if (o->abort_rate > 1 || (o->abort_rate > 0 && !o->soak)) {
        fprintf(stderr, "pdx-validate: --abort-rate: 0..1, with --soak\n");
        return EXIT_SETUP;
    }
    if (extra_args || o->sessions < 1 || o->turns < 1 || o->concurrency < 1 ||
        o->gen < 0 || o->user_tokens < 1 || o->shared < 0 ||
        o->timeout_s <= 0 || o->job_timeout_s <= 0) {
        usage(stderr);
        return EXIT_SETUP;
    }
    return -1;
}

/* A multi-node run's checks (arguments after the options are ignored):
 * -1, or the exit code. */
static int settle_multinode(const opts_t *o)
{
    if (o->sessions < 1 || o->turns < 2 || o->nprompts < 1 || o->gen < 1) {
        fprintf(stderr, "pdx-validate: --multi-node needs at least 1 "
                        "session, 2 turns, a prompt and a decode length\n");
        return EXIT_SETUP;
    }
    return -1;
}

/* The configs and the node binary: as given, else the defaults. */
static void settle_paths(opts_t *o)
{
    if (o->p_config) {
        snprintf(g_p_cfg, sizeof(g_p_cfg), "%s", o->p_config);
    } else {
        default_path(g_p_cfg, sizeof(g_p_cfg), "colocated-prefill.json");
    }
    if (o->d_config) {
        snprintf(g_d_cfg, sizeof(g_d_cfg), "%s", o->d_config);
    } else {
        default_path(g_d_cfg, sizeof(g_d_cfg), "colocated-decode.json");
    }
    if (o->node) {
        snprintf(g_node_bin, sizeof(g_node_bin), "%s", o->node);
    } else {
        default_node(g_node_bin, sizeof(g_node_bin));
    }
    o->node = g_node_bin;
}

/* The options into *o_p: -1 to run, else the exit code (0 for --help). */
int parse_args(int argc, char **argv, opts_t *o_p)
{
    bool multi_node = false;
    for (int i = 1; i < argc; i++) {
        multi_node = multi_node || strcmp(argv[i], "--multi-node") == 0;
    }
    opts_t o;
    defaults(&o, multi_node);
    opts_seen_t seen = {false, false};
    const struct option *lo = multi_node ? g_multinode_opts : g_single_opts;
    int ch, rc;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if ((rc = parse_option(ch, optarg, &o, &seen)) >= 0) {
            return rc;
        }
    }
    rc = multi_node ? settle_multinode(&o)
                    : settle_single(&o, &seen, optind < argc);
    if (rc >= 0) {
        return rc;
    }
    settle_paths(&o);
    *o_p = o;
    return -1;
}
