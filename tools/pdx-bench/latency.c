/* pdx-bench latency: one request at a time, pdx's ucx backend against a
 * raw UCP loop in the same run (issue 19 item 2). The floor: two
 * processes, the target maps a region and spins on ucp_worker_progress
 * (as UCX's own examples do); the initiator posts `batch` ucp_get_nbx /
 * ucp_put_nbx of `size` bytes and flushes the endpoint, progressing its
 * worker until the flush completes. Two floors: the endpoint with peer
 * error handling (UCP_ERR_HANDLING_MODE_PEER, as pdx's endpoints, NIXL's
 * and UCX's ucp_client_server example have it: what it costs to notice a
 * peer's death; over shared memory the mm transports' error handling on,
 * UCX_MM_ERROR_HANDLING), the floor the ratios are taken against; and a
 * bare one without (UCX's fastest path, reported beside it). pdx: the
 * same sizes and batches as one prepared request (pdx_xfer_make once,
 * then post + poll pdx_xfer_check), both agents with their progress
 * thread on, UCX only (no cma). Per case: p50 and p99 of the request time
 * and GB/s over the timed requests; ratios pdx / UCP. --netns puts the
 * target in another network + pid namespace (UCX TCP over a veth pair).
 * PDX_BENCH_NO_THREAD=1 runs the initiating agent without a progress
 * thread (to tell its cost apart); PDX_BENCH_LAT_ROW=OP:SIZE:BATCH runs
 * one row; PDX_BENCH_LAT_DUMP=FILE appends each round's request times
 * (ns, sorted, "END" after each round; rounds in the order bare UCP, UCP
 * with peer errors, on READ rows UCP waiting on its gets, pdx) to FILE.
 * READ rows add a third floor: with peer error handling, waiting on each
 * get's own request instead of a flush; pdx's READs end that way (a
 * get's completion says its bytes landed), and the floor
 * flushes. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "bench.h"

/* Each side's region: 64 MiB, 8 MiB with --quick (its rows are small;
 * every round maps and prefaults one per side). */
static uint64_t lat_region(const bench_opts_t *o)
{
    return o->quick ? (8ull << 20) : (64ull << 20);
}

#define UCS_CHECK(call)                                                        \
    do {                                                                       \
        ucs_status_t s_ = (call);                                              \
        if (s_ != UCS_OK) {                                                    \
            die("%s: %s", #call, ucs_status_string(s_));                       \
        }                                                                      \
    } while (0)

typedef struct ucp_side {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    uint8_t *mem;
    uint64_t region;
} ucp_side_t;

/* Does a UCX transport list name shared memory (sm, posix, sysv, mm)? */
static int tls_has_mm(const char *tls)
{
    return strstr(tls, "sm") != NULL || strstr(tls, "posix") != NULL ||
           strstr(tls, "sysv") != NULL || strstr(tls, "mm") != NULL;
}

/* errmode: the context's shared memory transports may serve endpoints
 * with peer error handling (both sides need it, as pdx's backend sets). */
static void ucp_side_init(ucp_side_t *u, const char *tls, int errmode,
                          uint64_t region)
{
    ucp_config_t *cfg;
    UCS_CHECK(ucp_config_read(NULL, NULL, &cfg));
    UCS_CHECK(ucp_config_modify(cfg, "TLS", tls));
    if (errmode && tls_has_mm(tls)) {
        UCS_CHECK(ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y"));
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA};
    UCS_CHECK(ucp_init(&p, cfg, &u->ctx));
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    UCS_CHECK(ucp_worker_create(u->ctx, &wp, &u->worker));
    u->region = region;
    u->mem = big_alloc(region);
    memset(u->mem, 0x5a, region);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = u->mem,
        .length = region};
    UCS_CHECK(ucp_mem_map(u->ctx, &mp, &u->memh));
}

static void ucp_side_fini(ucp_side_t *u)
{
    ucp_mem_unmap(u->ctx, u->memh);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->ctx);
    big_free(u->mem, u->region);
}

/* The raw target (errmode: as the floor with peer error handling's):
 * address, rkey and region out; then progress until the
 * initiator says quit (the control socket is looked at every 4096 idle
 * calls, so it costs the loop nothing). */
int target_ucp(const bench_opts_t *o, int errmode)
{
    int fd = o->target_fd;
    ucp_side_t u;
    ucp_side_init(&u, o->tls, errmode, lat_region(o));
    ucp_address_t *addr;
    size_t alen;
    UCS_CHECK(ucp_worker_get_address(u.worker, &addr, &alen));
    ctl_send(fd, addr, (uint32_t)alen);
    ucp_worker_release_address(u.worker, addr);
    void *rkey;
    size_t rlen;
    UCS_CHECK(ucp_rkey_pack(u.ctx, u.memh, &rkey, &rlen));
    ctl_send(fd, rkey, (uint32_t)rlen);
    ucp_rkey_buffer_release(rkey);
    ctl_sendf(fd, "region %llx %llu", (unsigned long long)(uintptr_t)u.mem,
              (unsigned long long)u.region);
    for (unsigned n = 0;; n++) {
        if (ucp_worker_progress(u.worker) == 0 && (n & 4095) == 0) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (poll(&pfd, 1, 0) > 0) {
                char *m = ctl_recv(fd, NULL);
                int quit = m == NULL || strcmp(m, "quit") == 0;
                free(m);
                if (quit) {
                    break;
                }
            }
        }
    }
    ucp_side_fini(&u);
    return 0;
}

typedef struct lat_case {
    int write;
    uint64_t size;
    uint32_t batch;
} lat_case_t;

typedef struct lat_res {
    double p50_us, p99_us, gbps;
    size_t n;
} lat_res_t;

/* 15 rounds of at least 0.03 s per side: with 5, one round in a slow
 * phase of the VM (on tcp loopback it hits the floor's rounds as often
 * as pdx's: docs/BENCH-LOG.md) was a fifth of a median. */
#define LAT_DEFAULT_ROUNDS 15
#define LAT_MIN_ROUND_S 0.03
#define LAT_MAX_ROUNDS 15
/* --quick: two rows, 3 rounds of the floor with pdx's error handling and
 * of pdx (the bare and gets floors left out): a figure in seconds, not a
 * measurement to quote. */
#define LAT_QUICK_ROUNDS 3

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double lat_median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Each figure's median over `n` rounds. */
static void lat_median(const lat_res_t *r, int n, lat_res_t *out)
{
    double a[LAT_MAX_ROUNDS], b[LAT_MAX_ROUNDS], g[LAT_MAX_ROUNDS];
    out->n = 0;
    for (int i = 0; i < n; i++) {
        a[i] = r[i].p50_us;
        b[i] = r[i].p99_us;
        g[i] = r[i].gbps;
        out->n += r[i].n;
    }
    out->p50_us = lat_median_of(a, n);
    out->p99_us = lat_median_of(b, n);
    out->gbps = lat_median_of(g, n);
}

static void summarize(dvec_t *v, uint64_t bytes_per, lat_res_t *r)
{
    double sum = 0;
    for (size_t i = 0; i < v->n; i++) {
        sum += v->v[i];
    }
    r->n = v->n;
    r->p50_us = quantile(v->v, v->n, 0.5) / 1e3;
    r->p99_us = quantile(v->v, v->n, 0.99) / 1e3;
    r->gbps = sum > 0 ? (double)bytes_per * (double)v->n / sum : 0;
    const char *dump = getenv("PDX_BENCH_LAT_DUMP");
    if (dump != NULL) {
        FILE *f = fopen(dump, "a");
        for (size_t i = 0; f != NULL && i < v->n; i++) {
            fprintf(f, "%.0f\n", v->v[i]);
        }
        if (f != NULL) {
            fprintf(f, "END\n");
            fclose(f);
        }
    }
}

static void wait_req(ucp_worker_h w, ucs_status_ptr_t sp, const char *what)
{
    if (sp == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        die("ucp %s: %s", what, ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
        ucp_worker_progress(w);
    }
    ucp_request_free(sp);
}

/* One round of the floor; errmode: the endpoint with peer error handling
 * (as pdx's); gets: a READ waits on its gets' own requests instead of a
 * flush (a get completes when its bytes have landed; pdx's READs end so). */
static void run_ucp(const bench_opts_t *o, const lat_case_t *c, int errmode,
                    int gets, lat_res_t *r)
{
    int fd;
    static const char *const quick[] = {"--quick", NULL};
    int pid = spawn_target(o, errmode ? "ucp-err" : "ucp",
                           o->quick ? quick : NULL, &fd);
    ucp_side_t u;
    ucp_side_init(&u, o->tls, errmode, lat_region(o));
    uint32_t alen, rlen;
    char *addr = ctl_recv(fd, &alen), *rk = ctl_recv(fd, &rlen);
    char *m = ctl_recv(fd, NULL);
    unsigned long long base = 0, len = 0;
    if (addr == NULL || rk == NULL || m == NULL ||
        sscanf(m, "region %llx %llu", &base, &len) != 2) {
        die("latency: the UCP target did not start");
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                          .address = (const ucp_address_t *)addr};
    if (errmode) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    }
    ucp_ep_h e;
    UCS_CHECK(ucp_ep_create(u.worker, &ep, &e));
    ucp_rkey_h rkey;
    UCS_CHECK(ucp_ep_rkey_unpack(e, rk, &rkey));
    dvec_t v = {0};
    uint64_t span = c->size * c->batch;
    uint64_t warm_until = 0, end = 0, t_start = pdx_now_ns();
    warm_until = t_start + (uint64_t)((o->quick ? 0.02 : 0.1) * 1e9);
    end = warm_until + (uint64_t)(o->case_s * 1e9);
    ucp_request_param_t rp = {.op_attr_mask = 0};
    gets = gets && !c->write;
    void **held = calloc(c->batch, sizeof(*held));
    if (held == NULL) {
        die("latency: out of memory");
    }
    for (size_t it = 0;; it++) {
        uint64_t t0 = pdx_now_ns();
        if (t0 > end && v.n >= 20) {
            break;
        }
        uint64_t off = (it * span) % (u.region - span + 1);
        for (uint32_t j = 0; j < c->batch; j++) {
            uint64_t o2 = off + (uint64_t)j * c->size;
            ucs_status_ptr_t sp =
                c->write ? ucp_put_nbx(e, u.mem + o2, c->size, base + o2,
                                       rkey, &rp)
                         : ucp_get_nbx(e, u.mem + o2, c->size, base + o2,
                                       rkey, &rp);
            if (UCS_PTR_IS_ERR(sp)) {
                die("ucp %s: %s", c->write ? "put" : "get",
                    ucs_status_string(UCS_PTR_STATUS(sp)));
            }
            held[j] = sp;
            if (sp != NULL && !gets) {
                ucp_request_free(sp); /* completion is the flush's */
            }
        }
        if (gets) {
            for (uint32_t j = 0; j < c->batch; j++) {
                wait_req(u.worker, held[j], "get");
            }
        } else {
            wait_req(u.worker, ucp_ep_flush_nbx(e, &rp), "flush");
        }
        uint64_t t1 = pdx_now_ns();
        if (t0 >= warm_until) {
            dvec_push(&v, (double)(t1 - t0));
        }
    }
    summarize(&v, span, r);
    dvec_free(&v);
    free(held);
    ucp_rkey_destroy(rkey);
    /* A flush close: the target is alive (a forced close needs peer error
     * handling, which the floor does not pay for). */
    ucp_request_param_t cp = {.op_attr_mask = 0};
    wait_req(u.worker, ucp_ep_close_nbx(e, &cp), "close");
    ctl_sendf(fd, "quit");
    reap_target(pid, 10000);
    close(fd);
    ucp_side_fini(&u);
    free(addr);
    free(rk);
    free(m);
}

static void run_pdx(const bench_opts_t *o, const lat_case_t *c,
                    lat_res_t *r)
{
    int fd;
    const uint64_t region = lat_region(o);
    char ws[32];
    snprintf(ws, sizeof(ws), "%llu", (unsigned long long)region);
    const char *const extra[] = {"--ws", ws, NULL}; /* its region */
    int pid = spawn_target(o, "transfer", extra, &fd);
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                           PDX_AGENT_PARAM_XFER_TIMEOUT,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD,
                             .xfer_timeout_ms = 600000};
    if (getenv("PDX_BENCH_NO_THREAD") != NULL) {
        ap.flags &= ~PDX_AGENT_F_PROGRESS_THREAD; /* experiment */
    }
    pdx_agent_h a;
    CHECK(pdx_agent_create("bench-lat", &ap, &a));
    pdx_option_t opt = {"tls", o->tls};
    CHECK(pdx_backend_create(a, "ucx", &opt, 1, NULL));
    uint8_t *mem = big_alloc(region);
    memset(mem, 0xa5, region);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)mem, region, 0, 0,
                           &reg));
    char peer[PDX_NAME_MAX];
    exchange_blobs(a, fd, peer);
    char *m = ctl_recv(fd, NULL);
    unsigned long long base = 0, len = 0;
    if (m == NULL || sscanf(m, "region %llx %llu", &base, &len) != 2 ||
        len < region) {
        die("latency: the pdx target did not start (or its region is "
            "under %llu bytes: --ws)", (unsigned long long)region);
    }
    free(m);
    /* Prepared lists over the region in `size` slots; a request = `batch`
     * consecutive slots, moving along the region. */
    uint64_t nslots = region / c->size;
    pdx_desc_t *ld = calloc(nslots, sizeof(*ld)), *rd = calloc(nslots, sizeof(*rd));
    uint32_t *idx = calloc(c->batch, sizeof(*idx));
    if (ld == NULL || rd == NULL || idx == NULL) {
        die("latency: out of memory");
    }
    for (uint64_t i = 0; i < nslots; i++) {
        ld[i] = (pdx_desc_t){(uintptr_t)mem + i * c->size, c->size, 0, 0};
        rd[i] = (pdx_desc_t){base + i * c->size, c->size, 0, 0};
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, ld, nslots},
                    rl = {PDX_MEM_DRAM, rd, nslots};
    pdx_dlist_h dl, dr;
    CHECK(pdx_dlist_prepare(a, NULL, &ll, &dl));
    CHECK(pdx_dlist_prepare(a, peer, &rl, &dr));
    dvec_t v = {0};
    uint64_t t_start = pdx_now_ns();
    uint64_t warm_until = t_start + (uint64_t)((o->quick ? 0.02 : 0.1) * 1e9);
    uint64_t end = warm_until + (uint64_t)(o->case_s * 1e9);
    uint64_t groups = nslots / c->batch;
    for (size_t it = 0;; it++) {
        uint64_t g = it % groups;
        for (uint32_t j = 0; j < c->batch; j++) {
            idx[j] = (uint32_t)(g * c->batch + j);
        }
        pdx_xfer_h x;
        CHECK(pdx_xfer_make(a, c->write ? PDX_XFER_WRITE : PDX_XFER_READ, dl,
                            idx, dr, idx, c->batch, NULL, 0, &x));
        uint64_t t0 = pdx_now_ns();
        if (t0 > end && v.n >= 20) {
            pdx_xfer_release(x);
            break;
        }
        pdx_status_t st = pdx_xfer_post(x);
        while (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(x);
        }
        uint64_t t1 = pdx_now_ns();
        if (st != PDX_OK) {
            die("latency: pdx request: %s (%s)", pdx_status_string(st),
                pdx_last_error());
        }
        pdx_xfer_release(x);
        if (t0 >= warm_until) {
            dvec_push(&v, (double)(t1 - t0));
        }
    }
    summarize(&v, c->size * c->batch, r);
    dvec_free(&v);
    pdx_dlist_release(dl);
    pdx_dlist_release(dr);
    free(ld);
    free(rd);
    free(idx);
    /* Unloaded before the target goes: its exit is then no peer's death
     * (over tcp, UCX failed the endpoint with "Endpoint timeout"). */
    pdx_peer_unload(a, peer);
    ctl_sendf(fd, "quit");
    reap_target(pid, 10000);
    close(fd);
    pdx_agent_destroy(a);
    big_free(mem, region);
}

/* The worst ratios over the rows (the mode's two targets). */
typedef struct lat_worst {
    double x50, xbw;
    char where50[48], wherebw[48];
} lat_worst_t;

/* Is row `c` run? Not when it exceeds half the region; --quick: READ 8448
 * and WRITE 64 KiB at batch 1; PDX_BENCH_LAT_ROW=OP:SIZE:BATCH[,...]:
 * those rows only (to profile one, or a sequence). */
static int lat_row_wanted(const bench_opts_t *o, const lat_case_t *c)
{
    if (c->size * c->batch > lat_region(o) / 2) {
        return 0;
    }
    if (o->quick && (c->batch != 1 || c->size == 1048576 ||
                     (c->write != (c->size == 65536)))) {
        return 0;
    }
    const char *only = getenv("PDX_BENCH_LAT_ROW");
    char want[64], list[512];
    snprintf(want, sizeof(want), ",%s:%llu:%u,", c->write ? "WRITE" : "READ",
             (unsigned long long)c->size, c->batch);
    snprintf(list, sizeof(list), ",%s,", only != NULL ? only : "");
    return only == NULL || strstr(list, want) != NULL;
}

static void lat_row_json(cJSON *rows, const lat_case_t *c,
                         const lat_res_t *ru, const lat_res_t *rp,
                         const lat_res_t *rb, const lat_res_t *rg)
{
    cJSON *row = cJSON_CreateObject();
    jstr(row, "op", c->write ? "WRITE" : "READ");
    jnum(row, "size", (double)c->size);
    jnum(row, "batch", c->batch);
    jnum(row, "ucp_p50_us", ru->p50_us);
    jnum(row, "ucp_p99_us", ru->p99_us);
    jnum(row, "ucp_gbps", ru->gbps);
    jnum(row, "pdx_p50_us", rp->p50_us);
    jnum(row, "pdx_p99_us", rp->p99_us);
    jnum(row, "pdx_gbps", rp->gbps);
    jnum(row, "p50_ratio", ru->p50_us > 0 ? rp->p50_us / ru->p50_us : 0);
    jnum(row, "gbps_ratio", ru->gbps > 0 ? rp->gbps / ru->gbps : 0);
    jnum(row, "bare_p50_us", rb->p50_us);
    jnum(row, "bare_p99_us", rb->p99_us);
    jnum(row, "bare_gbps", rb->gbps);
    jnum(row, "gbps_ratio_bare", rb->gbps > 0 ? rp->gbps / rb->gbps : 0);
    if (!c->write) {
        jnum(row, "gets_p50_us", rg->p50_us);
        jnum(row, "gets_p99_us", rg->p99_us);
        jnum(row, "gets_gbps", rg->gbps);
        jnum(row, "gbps_ratio_gets", rg->gbps > 0 ? rp->gbps / rg->gbps : 0);
    }
    cJSON_AddItemToArray(rows, row);
}

/* One row: interleaved rounds (UCP, pdx, UCP, pdx, ...), the median of
 * each figure kept (the VM's speed drifts by tens of percent within
 * seconds, and a row measured in one block per side compared two
 * machines); printed, into `rows`, and into the worst ratios. */
static void lat_row(const bench_opts_t *o, const bench_opts_t *oo,
                    const lat_case_t *c, int rounds, cJSON *rows,
                    lat_worst_t *worst)
{
    lat_res_t rb = {0}, ru = {0}, rp = {0}, rg = {0};
    lat_res_t rbs[LAT_MAX_ROUNDS], rus[LAT_MAX_ROUNDS], rps[LAT_MAX_ROUNDS],
        rgs[LAT_MAX_ROUNDS];
    int floors = !o->quick; /* bare and gets */
    for (int k = 0; k < rounds; k++) {
        if (floors) {
            run_ucp(oo, c, 0, 0, &rbs[k]);
        }
        run_ucp(oo, c, 1, 0, &rus[k]);
        if (floors && !c->write) {
            run_ucp(oo, c, 1, 1, &rgs[k]);
        }
        run_pdx(oo, c, &rps[k]);
    }
    if (floors) {
        lat_median(rbs, rounds, &rb);
    }
    lat_median(rus, rounds, &ru);
    lat_median(rps, rounds, &rp);
    if (floors && !c->write) {
        lat_median(rgs, rounds, &rg);
    }
    double x50 = ru.p50_us > 0 ? rp.p50_us / ru.p50_us : 0;
    double xbw = ru.gbps > 0 ? rp.gbps / ru.gbps : 0;
    double xbare = rb.gbps > 0 ? rp.gbps / rb.gbps : 0;
    double xgets = rg.gbps > 0 ? rp.gbps / rg.gbps : 0;
    const char *op = c->write ? "WRITE" : "READ";
    if (c->batch == 1 && x50 > worst->x50) {
        worst->x50 = x50;
        snprintf(worst->where50, sizeof(worst->where50), "%s %llu", op,
                 (unsigned long long)c->size);
    }
    if (xbw < worst->xbw) {
        worst->xbw = xbw;
        snprintf(worst->wherebw, sizeof(worst->wherebw), "%s %llu batch %u",
                 op, (unsigned long long)c->size, c->batch);
    }
    char gcols[64] = "| -";
    if (floors && !c->write) {
        snprintf(gcols, sizeof(gcols), "| %8.1f %7.2f %7.2f", rg.p50_us,
                 rg.gbps, xgets);
    }
    say("%-5s %8llu %5u | %9.1f %9.1f %7.2f | %9.1f %9.1f %7.2f | %7.2f "
        "%7.2f | %8.1f %7.2f %7.2f %s\n",
        op, (unsigned long long)c->size, c->batch, ru.p50_us, ru.p99_us,
        ru.gbps, rp.p50_us, rp.p99_us, rp.gbps, x50, xbw, rb.p50_us, rb.gbps,
        xbare, gcols);
    lat_row_json(rows, c, &ru, &rp, &rb, &rg);
}

int mode_latency(const bench_opts_t *o, cJSON *root)
{
    /* UCX alone on both pdx sides (no cma), private memory. */
    setenv("PDX_BENCH_PATH", "ucx", 1);
    bench_opts_t oo = *o;
    if (oo.ws_bytes < lat_region(o)) {
        oo.ws_bytes = lat_region(o); /* the pdx target's region */
    }
    const char *where = "one host";
    if (o->netns) {
        /* Another host: both sides in their own network namespace, joined
         * by veth pairs; UCX over TCP on eth0. We enter host 0 before any
         * UCX context exists, so UCX's threads live there too. */
        char why[256];
        if (bench_lab_enter(why, sizeof(why)) != 0) {
            die("latency --netns: %s", why);
        }
        snprintf(oo.tls, sizeof(oo.tls), "tcp");
        setenv("UCX_NET_DEVICES", "eth0", 1);
        where = "two network namespaces (veth, tcp/eth0)";
    }
    int rounds = o->reps > 1 ? o->reps : LAT_DEFAULT_ROUNDS;
    if (o->quick && o->reps <= 1) {
        rounds = LAT_QUICK_ROUNDS;
    }
    rounds = rounds > LAT_MAX_ROUNDS ? LAT_MAX_ROUNDS : rounds;
    oo.case_s = o->case_s / rounds;
    if (!o->quick && oo.case_s < LAT_MIN_ROUND_S) {
        oo.case_s = LAT_MIN_ROUND_S;
    }
    static const uint64_t sizes[] = {8448, 65536, 1048576};
    static const uint32_t batches[] = {1, 64};
    say("# latency over UCX tls=%s, %s: one request at a time; raw UCP = %s "
        "ucp_get_nbx/ucp_put_nbx x batch + ucp_ep_flush_nbx, target "
        "spinning on ucp_worker_progress, the endpoint with peer error "
        "handling as pdx's (\"ucp\") or without (\"bare\"); pdx = ucx "
        "backend only, progress threads on, prepared request posted and "
        "polled; %d interleaved rounds of %.2f s per side after a warm-up "
        "(bare, ucp, pdx, bare, ...), medians of the rounds' figures; GB/s "
        "over a round's timed requests; ratios pdx / ucp, and GB/s pdx / "
        "bare; READ rows also \"gets\": the floor with error handling "
        "waiting on its gets' own requests, no flush (as pdx's READs end), "
        "and GB/s pdx / gets\n",
        oo.tls, where, "batch", rounds, oo.case_s);
    say("%-5s %8s %5s | %9s %9s %7s | %9s %9s %7s | %7s %7s | %8s %7s %7s "
        "| %8s %7s %7s\n",
        "op", "size", "batch", "ucp p50", "ucp p99", "GB/s", "pdx p50",
        "pdx p99", "GB/s", "p50 x", "GB/s x", "bare p50", "GB/s",
        "bare x", "gets p50", "GB/s", "gets x");
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    lat_worst_t worst = {.x50 = 0, .xbw = 1e9};
    for (int w = 0; w < 2; w++) {
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            for (size_t bi = 0; bi < 2; bi++) {
                lat_case_t c = {w, sizes[si], batches[bi]};
                if (lat_row_wanted(o, &c)) {
                    lat_row(o, &oo, &c, rounds, rows, &worst);
                }
            }
        }
    }
    say("# targets (issue 19): pdx p50 <= 1.3x UCP at batch 1, GB/s >= 0.9x "
        "at every row (against the floor with pdx's error handling)\n");
    bench_target("latency", "pdx p50 <= 1.3 x raw UCP, batch 1 (worst row)",
                 worst.where50[0] != '\0', worst.x50, 1.3, 1, worst.where50);
    bench_target("latency", "pdx GB/s >= 0.9 x raw UCP (worst row)",
                 worst.wherebw[0] != '\0', worst.xbw, 0.9, 0, worst.wherebw);
    return 0;
}
