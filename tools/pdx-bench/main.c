/* pdx-bench: measures pdx against what a deployment would otherwise use,
 * on the same machine in the same run: transfers against ucx_perftest and
 * memcpy, P->D handoffs through the connector against memcpy, block
 * hashing against vLLM's Python recipe, the offload tier against memcpy.
 * Exit 0 ok, 1 a correctness check failed (e.g. hashes differ), 2 usage or
 * setup error. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "tool_version.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pdx-bench MODE [options]\n"
        "       pdx-bench --quick            every mode, small, in under 30 "
        "s on\n"
        "                                    2 idle cores: the summary first\n"
        "       pdx-bench plot RESULT.json [--out DIR]\n"
        "Measures pdx against what a deployment would otherwise use, on "
        "this machine\nin this run; prints a summary of every target "
        "(value, goal, verdict) and\nsays when the machine is too loaded "
        "for the figures to mean anything.\n"
        "modes:\n"
        "  idle       CPU and wake-ups of an idle agent (0 and 8 peers)\n"
        "  latency    one request at a time, pdx's ucx backend vs a raw UCP "
        "loop\n"
        "  transfer   READ/WRITE between two processes vs ucx_perftest and "
        "memcpy\n"
        "  handoff    GLM-5.2 request P->D through the KV connector vs "
        "memcpy\n"
        "  hash       vLLM block hashing vs the Python reference (same "
        "hashes)\n"
        "  offload    offload pool save/load vs memcpy, lookup at 1M "
        "blocks\n"
        "  vram       GPU memory staged over UCX vs host memory over the "
        "same UCX (shared memory, then TCP between namespaces; needs a "
        "CUDA driver: PDX_CUDA_DRIVER_LIB)\n"
        "  nixl       pdx and NIXL side by side in Python (--nixl PREFIX; "
        "not in all)\n"
        "  all        every mode above, in that order (the default with "
        "--quick)\n"
        "  plot       SVG plots of a --json result (transfer, latency, "
        "handoff,\n"
        "             targets) into --out DIR (default .), with gnuplot\n"
        "options:\n"
        "  --quick            every mode small (seconds, not minutes); the "
        "summary\n"
        "                     of ratios first, then the details\n"
        "  --json[=FILE]      JSON results to FILE, or to stdout (text "
        "then goes to stderr)\n"
        "  --plot FILE.svg    bandwidth vs size with the peers' curves "
        "(gnuplot)\n"
        "  --tls sm|tcp       UCX transports (default sm; vram: both unless given)\n"
        "  --netns            latency: the target in another network and pid namespace\n"
        "                     (UCX TCP over a veth pair: another host; needs root)\n"
        "  --path shm|cma|ucx how pdx moves same-host data: shm = cma "
        "backend + shared memory (pdx_mem_alloc / pdx_mem_share, memcpy "
        "into the peer's mapping; default), cma = cma backend on private "
        "memory (process_vm_readv/writev), ucx = UCX alone\n"
        "  --cma-inline BYTES cma's inline_max: shared-memory requests up "
        "to this are copied inside post (default 1M)\n"
        "  --sizes LIST       message sizes, e.g. 8448,41984,64K,1M,3502592\n"
        "  --batches LIST     descriptors per request (default 1,64,1024)\n"
        "  --ops read,write   operations (default both)\n"
        "  --inflight K       requests in flight (default 8)\n"
        "  --ws BYTES         cold working set per side (default 256M)\n"
        "  --seconds S        measured time per transfer case (default "
        "0.15)\n"
        "  --big N            descriptors of the big prepared request "
        "(default 100000, 0 skips)\n"
        "  --misalign N       transfer: local descriptors start N bytes "
        "(0..63) into their slots, the target's stay 64-byte aligned; "
        "memcpy copies with the same offsets (default 0)\n"
        "  --reps N           interleaved repetitions, best kept (default "
        "3); latency: interleaved rounds of at least 0.03 s (--seconds / N), "
        "medians kept (default 15, at most 15)\n"
        "  --no-perftest, --no-hot, --no-cold\n"
        "  --pdx-only         transfer: pdx cases alone (for profiling)\n"
        "  --tokens LIST      prompt tokens for handoff and hash (default "
        "8K,32K,128K)\n"
        "  --side-mem BYTES   handoff: physical KV bytes per side (default "
        "2G; larger requests alias)\n"
        "  --python PATH      hash, nixl: interpreter (hash: with cbor2 and "
        "xxhash; default /usr/bin/python3)\n"
        "  --nixl PREFIX      nixl: a NIXL build installed under PREFIX "
        "(PREFIX/nixl, PREFIX/absl); without it pdx's shim stands in\n"
        "  --index-blocks N   offload: blocks indexed for lookups (default "
        "1M)\n"
        "  --pool-blocks N    offload: GLM-5.2 blocks in the pool (default "
        "256)\n"
        "  --out DIR          plot: where the SVGs go (default .)\n"
        "  --version          pdx-bench's and libpdx.so's versions\n"
        "  -h, --help         this text\n"
        "pdx's warnings are said once each (and listed in the summary). "
        "Exit 0 ok,\n1 a correctness check failed (hashes differ, bytes "
        "wrong), 2 usage or setup\nerror; a target NOT MET is a finding, "
        "not an exit status.\n");
}

static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || v < 0) {
        die("bad number '%s'", s);
    }
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        end++;
        break;
    case 'm':
    case 'M':
        v *= 1048576;
        end++;
        break;
    case 'g':
    case 'G':
        v *= 1073741824.0;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0') {
        die("bad number '%s'", s);
    }
    return (uint64_t)v;
}

static size_t parse_list(const char *s, uint64_t *out, size_t max)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    size_t n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            die("list '%s' has more than %zu entries", s, max);
        }
        out[n++] = parse_size(t);
    }
    if (n == 0) {
        die("empty list");
    }
    return n;
}

static void defaults(bench_opts_t *o)
{
    snprintf(o->tls, sizeof(o->tls), "sm");
    static const uint64_t sizes[] = {8448, 41984, 65536, 1048576, 3502592};
    memcpy(o->sizes, sizes, sizeof(sizes));
    o->nsizes = 5;
    static const uint32_t batches[] = {1, 64, 1024};
    memcpy(o->batches, batches, sizeof(batches));
    o->nbatches = 3;
    o->ops = 3;
    o->inflight = 8;
    o->ws_bytes = 256ull << 20;
    o->case_s = 0.15;
    o->big_descs = 100000;
    static const uint64_t tokens[] = {8192, 32768, 131072};
    memcpy(o->tokens, tokens, sizeof(tokens));
    o->ntokens = 3;
    o->side_mem = 2ull << 30;
    o->python = "/usr/bin/python3";
    o->index_blocks = 1u << 20;
    o->pool_blocks = 256;
    o->target_fd = -1;
}

/* --quick changes the defaults that the user did not set. */
static void quick_defaults(bench_opts_t *o, const int *set)
{
    if (!set[0]) {
        o->sizes[0] = 8448;
        o->sizes[1] = 65536;
        o->nsizes = 2;
    }
    if (!set[1]) {
        o->batches[0] = 1;
        o->batches[1] = 64;
        o->nbatches = 2;
    }
    if (!set[2]) {
        o->ws_bytes = 32ull << 20;
    }
    if (!set[3]) {
        o->case_s = 0.05;
    }
    if (!set[4]) {
        o->big_descs = 10000;
    }
    if (!set[5]) {
        o->tokens[0] = 4096;
        o->ntokens = 1;
    }
    if (!set[6]) {
        o->index_blocks = 1u << 16;
        o->pool_blocks = 16;
    }
    if (!set[7]) {
        o->side_mem = 512ull << 20;
    }
    o->inflight = o->inflight > 4 ? 4 : o->inflight;
    if (o->reps == 0) {
        o->reps = 1;
    }
}

/* Option `a` if it is a flag (no value) into *o: 1, else 0. */
static int parse_flag(bench_opts_t *o, const char *a)
{
    if (strcmp(a, "--quick") == 0) {
        o->quick = 1;
    } else if (strcmp(a, "--json") == 0) {
        o->json_path = "-";
    } else if (strncmp(a, "--json=", 7) == 0) {
        o->json_path = a + 7;
    } else if (strcmp(a, "--netns") == 0) {
        o->netns = 1;
    } else if (strcmp(a, "--no-perftest") == 0) {
        o->no_perftest = 1;
    } else if (strcmp(a, "--no-hot") == 0) {
        o->no_hot = 1;
    } else if (strcmp(a, "--no-cold") == 0) {
        o->no_cold = 1;
    } else if (strcmp(a, "--pdx-only") == 0) {
        o->pdx_only = 1;
        o->no_perftest = 1;
    } else {
        return 0;
    }
    return 1;
}

/* Option `a` needs a value: `v`, the next argument, is none at the end. */
static void need_value(const char *a, const char *v)
{
    if (v == NULL) {
        die("%s needs a value", a);
    }
}

/* Option `a` if it takes a value (`v`, the next argument, NULL at the
 * end) into *o, set[] marking what --quick leaves alone: 1, else 0. A
 * missing or bad value ends the process (die). */
static int parse_valued(bench_opts_t *o, int set[8], const char *a,
                        const char *v)
{
    if (strcmp(a, "--plot") == 0) {
        need_value(a, v);
        o->plot_path = v;
    } else if (strcmp(a, "--tls") == 0) {
        need_value(a, v);
        if (strcmp(v, "sm") != 0 && strcmp(v, "tcp") != 0) {
            die("--tls: 'sm' or 'tcp'");
        }
        snprintf(o->tls, sizeof(o->tls), "%s", v);
        o->tls_given = 1;
    } else if (strcmp(a, "--sizes") == 0) {
        need_value(a, v);
        o->nsizes = parse_list(v, o->sizes, BENCH_MAX_LIST);
        set[0] = 1;
    } else if (strcmp(a, "--batches") == 0) {
        need_value(a, v);
        uint64_t b[BENCH_MAX_LIST];
        o->nbatches = parse_list(v, b, BENCH_MAX_LIST);
        for (size_t k = 0; k < o->nbatches; k++) {
            if (b[k] == 0 || b[k] > 1000000) {
                die("--batches: 1..1000000");
            }
            o->batches[k] = (uint32_t)b[k];
        }
        set[1] = 1;
    } else if (strcmp(a, "--ops") == 0) {
        need_value(a, v);
        o->ops = (strstr(v, "read") ? 1 : 0) | (strstr(v, "write") ? 2 : 0);
        if (o->ops == 0) {
            die("--ops: read, write or read,write");
        }
    } else if (strcmp(a, "--inflight") == 0) {
        need_value(a, v);
        o->inflight = (uint32_t)parse_size(v);
        if (o->inflight == 0 || o->inflight > 1024) {
            die("--inflight: 1..1024");
        }
    } else if (strcmp(a, "--ws") == 0) {
        need_value(a, v);
        o->ws_bytes = parse_size(v);
        set[2] = 1;
    } else if (strcmp(a, "--seconds") == 0) {
        need_value(a, v);
        o->case_s = strtod(v, NULL);
        if (o->case_s <= 0) {
            die("--seconds: > 0");
        }
        set[3] = 1;
    } else if (strcmp(a, "--big") == 0) {
        need_value(a, v);
        o->big_descs = (uint32_t)parse_size(v);
        set[4] = 1;
    } else if (strcmp(a, "--misalign") == 0) {
        need_value(a, v);
        char *end = NULL;
        unsigned long m = strtoul(v, &end, 10);
        if (*v == '\0' || *end != '\0' || m > 63) {
            die("--misalign: 0..63");
        }
        o->misalign = (uint32_t)m;
    } else if (strcmp(a, "--reps") == 0) {
        need_value(a, v);
        o->reps = (int)parse_size(v);
        if (o->reps < 1 || o->reps > 100) {
            die("--reps: 1..100");
        }
    } else if (strcmp(a, "--path") == 0) {
        need_value(a, v);
        if (strcmp(v, "shm") != 0 && strcmp(v, "cma") != 0 &&
            strcmp(v, "ucx") != 0) {
            die("--path: shm, cma or ucx, not '%s'", v);
        }
        setenv("PDX_BENCH_PATH", v, 1); /* targets inherit it */
    } else if (strcmp(a, "--cma-inline") == 0) {
        need_value(a, v);
        char b[32];
        snprintf(b, sizeof(b), "%llu", (unsigned long long)parse_size(v));
        setenv("PDX_BENCH_CMA_INLINE", b, 1); /* targets inherit it */
    } else if (strcmp(a, "--tokens") == 0) {
        need_value(a, v);
        o->ntokens = parse_list(v, o->tokens, BENCH_MAX_LIST);
        set[5] = 1;
    } else if (strcmp(a, "--side-mem") == 0) {
        need_value(a, v);
        o->side_mem = parse_size(v);
        set[7] = 1;
    } else if (strcmp(a, "--python") == 0) {
        need_value(a, v);
        o->python = v;
    } else if (strcmp(a, "--nixl") == 0) {
        need_value(a, v);
        o->nixl = v;
    } else if (strcmp(a, "--index-blocks") == 0) {
        need_value(a, v);
        o->index_blocks = parse_size(v);
        set[6] = 1;
    } else if (strcmp(a, "--pool-blocks") == 0) {
        need_value(a, v);
        o->pool_blocks = parse_size(v);
        set[6] = 1;
    } else if (strcmp(a, "--ho-blocks") == 0) {
        need_value(a, v);
        o->ho_blocks = parse_size(v);
    } else if (strcmp(a, "--ho-alias") == 0) {
        need_value(a, v);
        o->ho_alias = (uint32_t)parse_size(v);
    } else if (strcmp(a, "--ho-period") == 0) {
        need_value(a, v);
        o->ho_period = parse_size(v);
    } else if (strcmp(a, "--target") == 0) {
        need_value(a, v);
        o->target_kind = v;
    } else if (strcmp(a, "--out") == 0) {
        need_value(a, v);
        o->out_dir = v;
    } else if (strcmp(a, "--fd") == 0) {
        need_value(a, v);
        o->target_fd = (int)parse_size(v);
    } else {
        return 0;
    }
    return 1;
}

/* The command line into *o; a bad option or value ends the process (die).
 * set[] records the options --quick leaves alone. Returns -1 to go on, or
 * main's exit code (0 after --help). */
static int parse_args(int argc, char **argv, bench_opts_t *o, int set[8])
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (parse_flag(o, a)) {
            continue;
        } else if (parse_valued(o, set, a, v)) {
            i++; /* its value */
        } else if (a[0] == '-') {
            usage(stderr);
            die("unknown option %s", a);
        } else if (o->mode == NULL) {
            o->mode = a;
        } else if (strcmp(o->mode, "plot") == 0 && o->plot_in == NULL) {
            o->plot_in = a;
        } else {
            usage(stderr);
            die("unexpected argument %s", a);
        }
    }
    return -1;
}

/* --target KIND: this process is the other side of a mode. */
static int run_target(const bench_opts_t *o)
{
    out_txt = stderr;
    /* The initiator's agents say what both sides would: a target's
     * warnings would repeat them once per target started. */
    pdx_log_set_level(PDX_LOG_ERROR);
    if (strcmp(o->target_kind, "transfer") == 0) {
        return target_transfer(o);
    }
    if (strcmp(o->target_kind, "ucp") == 0) {
        return target_ucp(o, 0);
    }
    if (strcmp(o->target_kind, "ucp-err") == 0) {
        return target_ucp(o, 1);
    }
    if (strcmp(o->target_kind, "handoff") == 0) {
        return target_handoff(o);
    }
    if (strcmp(o->target_kind, "vram") == 0) {
        return target_vram(o);
    }
    die("unknown target kind %s", o->target_kind);
}

/* The mode asked for (or every mode, "all"), each into its object of
 * `root`: 0, or the last failed check's code. */
static int run_modes(const bench_opts_t *o, cJSON *root)
{
    struct {
        const char *name;
        int (*fn)(const bench_opts_t *, cJSON *);
    } modes[] = {{"transfer", mode_transfer},
                 {"handoff", mode_handoff},
                 {"hash", mode_hash},
                 {"offload", mode_offload},
                 {"idle", mode_idle},
                 {"latency", mode_latency},
                 {"vram", mode_vram},
                 {"nixl", mode_nixl}};
    int all = strcmp(o->mode, "all") == 0;
    int found = 0, rc = 0;
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (all ? strcmp(modes[i].name, "nixl") == 0
                : strcmp(o->mode, modes[i].name) != 0) {
            continue; /* nixl: minutes, and a NIXL build: not in all */
        }
        found = 1;
        /* Teardowns mute it: again at each mode. */
        bench_log_install(o->quick, modes[i].name);
        cJSON *m = cJSON_AddObjectToObject(root, modes[i].name);
        bench_opts_t mo = *o;
        if (all && strcmp(modes[i].name, "transfer") != 0) {
            mo.plot_path = NULL; /* one plot: the transfer curves */
        }
        uint64_t m0 = pdx_now_ns();
        int r = modes[i].fn(&mo, m);
        if (r != 0) {
            rc = r;
        }
        jnum(m, "wall_s", secs(pdx_now_ns() - m0));
        if (all) {
            say("# %s took %.1f s\n", modes[i].name, secs(pdx_now_ns() - m0));
        }
        say("\n");
    }
    if (!found) {
        usage(stderr);
        die("unknown mode %s", o->mode);
    }
    return rc;
}

/* --quick's details while the modes run (printed after the summary). */
static FILE *g_held;
static char *g_details;
static size_t g_dlen;

static void flush_held(void)
{
    if (g_held != NULL) {
        fclose(g_held);
        g_held = NULL;
        fprintf(stderr, "pdx-bench: stopped before its summary; the details "
                        "so far:\n");
        fwrite(g_details, 1, g_dlen, stderr);
    }
}

/* The JSON document to --json's file, or to stdout. */
static void write_json(const char *path, const cJSON *root)
{
    char *text = cJSON_Print(root);
    FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (f == NULL) {
        die("%s: %s", path, strerror(errno));
    }
    fprintf(f, "%s\n", text);
    if (f != stdout) {
        fclose(f);
    }
    free(text);
}

int main(int argc, char **argv)
{
    if (pdx_tool_version(argc, argv, "pdx-bench")) {
        return 0;
    }
    bench_opts_t o;
    memset(&o, 0, sizeof(o));
    defaults(&o);
    out_txt = stdout;
    int set[8] = {0};
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0) {
        die("readlink /proc/self/exe: %s", strerror(errno));
    }
    self[sl] = '\0';
    o.self_path = self;
    int rc = parse_args(argc, argv, &o, set);
    if (rc >= 0) {
        return rc;
    }
    if (o.quick) {
        quick_defaults(&o, set);
    }
    if (getenv("UCX_NET_DEVICES") == NULL) {
        /* Loopback unless told otherwise (targets inherit it). */
        setenv("UCX_NET_DEVICES", "lo", 1);
    }
    if (o.target_kind != NULL) {
        return run_target(&o);
    }
    if (o.mode == NULL && o.quick) {
        o.mode = "all";
    }
    if (o.mode == NULL) {
        usage(stderr);
        return 2;
    }
    if (strcmp(o.mode, "plot") == 0) {
        return bench_plot(o.plot_in, o.out_dir != NULL ? o.out_dir : ".");
    }
    FILE *final_txt = stdout;
    if (o.json_path != NULL && strcmp(o.json_path, "-") == 0) {
        final_txt = stderr;
    }
    out_txt = final_txt;
    pdx_log_set_level(PDX_LOG_WARN);
    bench_log_install(o.quick, o.mode);

    cJSON *root = cJSON_CreateObject();
    jstr(root, "tool", "pdx-bench");
    jstr(root, "mode", o.mode);
    cJSON_AddBoolToObject(root, "quick", o.quick);
    bench_load_t before, after;
    bench_load_probe(&before);
    /* --quick: the details are held and printed after the summary. */
    if (o.quick) {
        g_held = open_memstream(&g_details, &g_dlen);
        if (g_held != NULL) {
            out_txt = g_held;
            atexit(flush_held); /* die() on the way: the details still */
        }
    }
    uint64_t t0 = pdx_now_ns();
    rc = run_modes(&o, root);
    double wall = secs(pdx_now_ns() - t0);
    say("# %s done in %.1f s%s\n", o.mode, wall,
        rc ? " (a check FAILED)" : "");
    bench_load_probe(&after);
    jnum(root, "wall_s", wall);
    cJSON *jl = cJSON_AddObjectToObject(root, "load");
    jnum(jl, "cpus", (double)before.ncpu);
    jnum(jl, "load1_before", before.load1);
    jnum(jl, "load1_after", after.load1);
    jnum(jl, "probe_share_before", before.share);
    jnum(jl, "probe_share_after", after.share);
    jnum(jl, "other_cpus_during", bench_load_others(&before, &after, wall));
    cJSON_AddBoolToObject(jl, "too_loaded",
                          bench_too_loaded(&before, &after, wall));
    bench_summary_json(root);
    if (g_held != NULL) {
        fclose(g_held);
        g_held = NULL;
        out_txt = final_txt;
        bench_summary(final_txt, o.mode, 1, &before, &after, wall);
        fprintf(final_txt, "\ndetails\n\n");
        fwrite(g_details, 1, g_dlen, final_txt);
        free(g_details);
    } else {
        fprintf(final_txt, "\n");
        bench_summary(final_txt, o.mode, o.quick, &before, &after, wall);
    }
    fflush(final_txt);
    if (o.json_path != NULL) {
        write_json(o.json_path, root);
    }
    cJSON_Delete(root);
    return rc;
}
