/* glm52-pd-node: one prefill (producer) or decode (consumer) node of the
 * GLM-5.2 P/D example, built on the pdx KV connector. A single-threaded
 * event loop serves many requests at once, each a small state machine
 * (blocks -> lookup -> load -> verify -> compute/decode -> save -> handoff),
 * doing a bounded slice of work per turn of the loop so that connector
 * progress, freed-block reports and driver messages are never starved.
 *
 * The driver (tools/pdx-validate) starts it with `--config FILE --fd N`
 * and speaks the framed JSON of pd_wire.h on fd N.
 *
 * This file is its top: the command line, the arenas (host memory, or GPU
 * memory for kv.memory "vram": gpu.c), the connector, the hello, then the
 * loop (msg.c) and teardown (node.h lists the layers). */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <pdx/blob.h>
#include <pdx/mem.h>

#include "node.h"
#include "tool_version.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: glm52-pd-node --config FILE --fd N [--job-timeout S]\n"
            "  One P or D node of the GLM-5.2 P/D example (role from the\n"
            "  config), driven over fd N by pdx-validate (which starts it;\n"
            "  run pdx-validate, not this).\n"
            "  -c, --config FILE     the node's JSON config (configs/: its\n"
            "                        agent, backends, arenas, store)\n"
            "  -f, --fd N            the socket pdx-validate drives it over\n"
            "  -t, --job-timeout S   one request's bound (default 120)\n"
            "  --version             the node's and libpdx.so's versions\n"
            "  -h, --help            this text\n");
}

static int hello_error(node_t *nd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int hello_error(node_t *nd, const char *fmt, ...)
{
    char buf[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    say("%s", buf);
    cJSON *r = reply_head("hello", false);
    cJSON_AddStringToObject(r, "error", buf);
    send_msg(nd, r);
    pd_chan_drain(&nd->chan, pdx_now_ms_f() + 2000);
    return 2;
}

/* The command line: -1 to run, else main's exit code (0 for --help). */
static int parse_args(int argc, char **argv, const char **config_p, int *fd_p,
                      double *job_timeout_s_p)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"fd", required_argument, NULL, 'f'},
        {"job-timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "c:f:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            *config_p = optarg;
            break;
        case 'f':
            *fd_p = atoi(optarg);
            break;
        case 't':
            *job_timeout_s_p = atof(optarg);
            break;
        default:
            usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? 0 : 2;
        }
    }
    if (*config_p == NULL || *fd_p < 0) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The config loaded, the arenas laid out, allocated and carved, every
 * block free; whether the layout is the reference one in *reference_p.
 * 0, or main's exit code (the failure sent as the hello). */
static int node_arenas(node_t *nd, const char *config, int *reference_p)
{
    char err[1024] = "";
    pdx_status_t st = pdx_kv_config_load(config, &nd->cfg, err, sizeof(err));
    if (st != PDX_OK) {
        return hello_error(nd, "config: %s: %s", pdx_status_string(st), err);
    }
    log_set_tag(nd->cfg.role == PDX_KV_ROLE_PRODUCER   ? "P"
                : nd->cfg.role == PDX_KV_ROLE_CONSUMER ? "D"
                                                       : "PD");
    bool vram = nd->cfg.mem_type == PDX_MEM_VRAM;
    st = pd_layout_from_config(&nd->cfg, vram ? PDX_MEM_VRAM : PDX_MEM_DRAM,
                               &nd->layout, reference_p, err, sizeof(err));
    if (st != PDX_OK) {
        return hello_error(nd, "layout: %s", err);
    }
    uint64_t size = pdx_layout_carve_size(nd->layout, ARENA_ALIGN);
    if (size == UINT64_MAX || size > SIZE_MAX) {
        return hello_error(nd, "layout too large to carve");
    }
    nd->mem_len = (size_t)size;
    uint64_t base = 0;
    if (vram) {
        /* GPU memory of the config's device, registered as VRAM by the
         * connector; the stand-in works on a host mirror (gpu.c). */
        if (gpu_arenas(nd, nd->mem_len, &base, err, sizeof(err)) != 0) {
            return hello_error(nd,
                               "arenas in GPU memory (kv.memory \"vram\", "
                               "device %u): %s; kv.memory \"dram\" puts "
                               "them in host memory",
                               nd->cfg.device, err);
        }
    } else {
        /* Populated up front, as an engine allocates its KV pool at
         * start: first-touch faults inside the step loop cost far more
         * (28 us each on the VM this was measured on, 0.7 us each with
         * MAP_POPULATE). Shared memory (pdx_mem_alloc): a peer on this
         * host with the cma backend maps it and copies with memcpy;
         * elsewhere it is plain memory. */
        void *mem = NULL;
        st = pdx_mem_alloc(nd->mem_len, PDX_MEM_F_POPULATE, &mem);
        if (st != PDX_OK) {
            return hello_error(nd, "arenas: pdx_mem_alloc of %zu bytes: %s",
                               nd->mem_len, pdx_status_string(st));
        }
        nd->mem = mem;
        base = (uint64_t)(uintptr_t)mem;
    }
    st = pdx_layout_carve(nd->layout, base, size, ARENA_ALIGN,
                          vram ? nd->cfg.device : 0);
    if (st != PDX_OK || pd_model_init(&nd->model, nd->layout) != 0) {
        return hello_error(nd, "carve: %s", pdx_status_string(st));
    }
    gpu_rebase(nd);
    nd->B = nd->model.block_tokens;
    nd->free_ids = calloc(nd->cfg.num_blocks, sizeof(*nd->free_ids));
    if (nd->free_ids == NULL) {
        return hello_error(nd, "out of memory");
    }
    for (uint32_t i = 0; i < nd->cfg.num_blocks; i++) {
        nd->free_ids[nd->nfree++] = nd->cfg.num_blocks - 1 - i;
    }
    return 0;
}

/* The connector over the arenas, and this node's metadata blob as hex
 * (malloc'd) in *hex_p. 0, or main's exit code (the failure sent as the
 * hello). */
static int node_connector(node_t *nd, char **hex_p)
{
    uint64_t mark = log_mark();
    pdx_kv_connector_params_t cp = {.field_mask = PDX_KV_PARAM_CONFIG |
                                                  PDX_KV_PARAM_LAYOUT,
                                    .config = &nd->cfg,
                                    .layout = nd->layout};
    pdx_status_t st = pdx_kv_connector_create(&cp, &nd->conn);
    if (st != PDX_OK) {
        char lines[1024];
        log_since(mark, lines, sizeof(lines));
        return hello_error(nd, "connector: %s: %s", pdx_status_string(st),
                           lines);
    }
    nd->hasher = pdx_kv_connector_hasher(nd->conn);
    void *blob = NULL;
    size_t blob_len = 0;
    st = pdx_kv_connector_describe(nd->conn, &blob, &blob_len);
    char *hex = st == PDX_OK ? pd_hex_encode(blob, blob_len) : NULL;
    if (blob) {
        pdx_blob_free(blob);
    }
    if (hex == NULL) {
        pdx_kv_connector_destroy(nd->conn);
        return hello_error(nd, "describe: %s", pdx_status_string(st));
    }
    *hex_p = hex;
    return 0;
}

/* The hello: the blob (`hex`, freed here) and what the driver needs to
 * size sessions and to know which reuse must happen. */
static void send_hello(node_t *nd, char *hex, int reference)
{
    cJSON *h = reply_head("hello", true);
    cJSON_AddStringToObject(h, "agent", nd->cfg.agent_name);
    cJSON_AddStringToObject(h, "role", role_name(nd->cfg.role));
    cJSON_AddStringToObject(h, "blob", hex);
    free(hex);
    cJSON_AddNumberToObject(h, "num_blocks", nd->cfg.num_blocks);
    cJSON_AddNumberToObject(h, "block_tokens", nd->B);
    cJSON_AddNumberToObject(h, "bytes_per_block",
                            (double)nd->model.bytes_per_block);
    cJSON_AddNumberToObject(h, "arenas", (double)nd->model.narenas);
    cJSON_AddBoolToObject(h, "reference_layout", reference);
    char fp[24];
    snprintf(fp, sizeof(fp), "%016" PRIx64, pdx_layout_fingerprint(nd->layout));
    cJSON_AddStringToObject(h, "layout_fingerprint", fp);
    cJSON_AddNumberToObject(h, "arena_bytes", (double)nd->mem_len);
    cJSON_AddStringToObject(h, "memory", nd->gpu != NULL ? "vram" : "dram");
    cJSON_AddNumberToObject(h, "device", nd->gpu != NULL ? nd->cfg.device : 0);
    /* The pool's capacity and the children's tail settings. */
    pdx_offload_stats_t os;
    cJSON_AddNumberToObject(h, "pool_blocks",
                            pdx_kv_offload_stats(nd->conn, &os) == PDX_OK
                                ? (double)os.capacity_blocks
                                : 0);
    for (uint32_t i = 0; i < nd->cfg.nchildren; i++) {
        const pdx_kv_child_config_t *ch = &nd->cfg.children[i];
        if (ch->type == PDX_KV_CHILD_REMOTE) {
            cJSON_AddBoolToObject(h, "load_tail", ch->load_tail);
            cJSON_AddNumberToObject(h, "lease_ms", ch->lease_ms);
        } else {
            cJSON_AddBoolToObject(h, "save_tail", ch->save_tail);
            cJSON_AddStringToObject(
                h, "offload_mode",
                ch->mode == PDX_KV_OFFLOAD_SAVE_ONLY   ? "save_only"
                : ch->mode == PDX_KV_OFFLOAD_LOAD_ONLY ? "load_only"
                                                       : "read_write");
        }
    }
    send_msg(nd, h);
    char where[32] = "DRAM";
    if (nd->gpu != NULL) {
        snprintf(where, sizeof(where), "VRAM of device %u", nd->cfg.device);
    }
    say("%s (%s): %zu arenas, %u blocks of %" PRIu64 " B (%.1f GiB %s), "
        "layout %s",
        nd->cfg.agent_name, role_name(nd->cfg.role), nd->model.narenas,
        nd->cfg.num_blocks, nd->model.bytes_per_block,
        (double)nd->mem_len / (1u << 30), where, fp);
}

/* Everything the node holds, released; main's exit code (3: the peer
 * refused us, 1: the driver's channel broke). */
static int node_teardown(node_t *nd)
{
    pd_chan_drain(&nd->chan, pdx_now_ms_f() + 2000);
    int rc = nd->refused ? 3 : nd->chan.eof || nd->chan.error ? 1 : 0;
    pdx_kv_connector_destroy(nd->conn);
    pd_model_fini(&nd->model);
    pdx_layout_destroy(nd->layout);
    if (nd->mem != NULL) {
        pdx_mem_free(nd->mem);
    }
    gpu_close(nd);
    while (nd->jobs) {
        job_t *j = nd->jobs;
        nd->jobs = j->next;
        job_free(nd, j);
    }
    while (nd->quarantine) {
        quarantine_t *q = nd->quarantine;
        nd->quarantine = q->next;
        free(q->blocks);
        free(q);
    }
    while (nd->held) {
        held_blocks_t *hb = nd->held;
        nd->held = hb->next;
        free(hb->blocks);
        free(hb);
    }
    free(nd->free_ids);
    pd_chan_close(&nd->chan);
    return rc;
}

int main(int argc, char **argv)
{
    if (pdx_tool_version(argc, argv, "glm52-pd-node")) {
        return 0;
    }
    const char *config = NULL;
    int fd = -1;
    double job_timeout_s = 120;
    int rc = parse_args(argc, argv, &config, &fd, &job_timeout_s);
    if (rc >= 0) {
        return rc;
    }
    signal(SIGPIPE, SIG_IGN);
    pdx_log_set_handler(log_sink, NULL);

    static node_t node;
    node_t *nd = &node;
    nd->job_timeout_ms = job_timeout_s * 1000;
    if (pd_chan_init(&nd->chan, fd) != 0) {
        say("fd %d: %s", fd, strerror(nd->chan.error));
        return 2;
    }
    int reference = 0;
    char *hex = NULL;
    if ((rc = node_arenas(nd, config, &reference)) != 0 ||
        (rc = node_connector(nd, &hex)) != 0) {
        return rc;
    }
    send_hello(nd, hex, reference);
    run(nd);
    return node_teardown(nd);
}
