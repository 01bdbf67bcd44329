/* pdx-bench vram: GPU memory over UCX's staged path (pinned host bounce
 * buffers, backends/ucx/README.md) against host memory over the same UCX,
 * in one run: shared memory on one host, then TCP between two network
 * namespaces (another host as pdx sees it; needs root). Rows: READ and
 * WRITE, 64 KiB / 1 MiB / 16 MiB pieces, batch 1 and 64; one request at a
 * time (prepared, posted, polled), GB/s over a round's requests and p50;
 * DRAM and VRAM rounds interleaved, medians kept. Only ucx is created (no
 * cma, no cuda_ipc), with vram=staged.
 *
 * GPU memory comes from the CUDA driver (PDX_CUDA_DRIVER_LIB, else
 * libcuda.so.1). With the fake driver of tests/fixtures the device copies
 * are memcpy, so the ratio is the pipeline's own cost. */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define VR_ROUNDS_MAX 15

/* ---- the driver, by dlopen -------------------------------------------- */

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_dev_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(uint64_t *, size_t);
typedef int (*cu_free_t)(uint64_t);
typedef int (*cu_memset_t)(uint64_t, unsigned char, size_t);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t);

static struct {
    cu_alloc_t alloc;
    cu_free_t free;
    cu_memset_t memset8;
    cu_htod_t htod;
} cu;

/* 0, or -1 with the reason in `why`. Device 0's primary context made
 * current on the calling thread. */
int bench_cu_open(char *why, size_t len)
{
    const char *lib = getenv("PDX_CUDA_DRIVER_LIB");
    void *h = dlopen(lib != NULL ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, len, "no CUDA driver (%s)", dlerror());
        return -1;
    }
    cu_init_t init = (cu_init_t)dlsym(h, "cuInit");
    cu_dev_get_t dev_get = (cu_dev_get_t)dlsym(h, "cuDeviceGet");
    cu_ctx_retain_t retain =
        (cu_ctx_retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_t set = (cu_ctx_set_t)dlsym(h, "cuCtxSetCurrent");
    cu.alloc = (cu_alloc_t)dlsym(h, "cuMemAlloc_v2");
    cu.free = (cu_free_t)dlsym(h, "cuMemFree_v2");
    cu.memset8 = (cu_memset_t)dlsym(h, "cuMemsetD8_v2");
    cu.htod = (cu_htod_t)dlsym(h, "cuMemcpyHtoD_v2");
    int dev = 0;
    void *ctx = NULL;
    if (!init || !dev_get || !retain || !set || !cu.alloc || !cu.free) {
        snprintf(why, len, "the CUDA driver lacks an entry point");
        return -1;
    }
    if (init(0) != 0 || dev_get(&dev, 0) != 0 || retain(&ctx, dev) != 0 ||
        set(ctx) != 0) {
        snprintf(why, len, "no CUDA device");
        return -1;
    }
    return 0;
}

uint64_t bench_vram_alloc(uint64_t len)
{
    uint64_t p = 0;
    if (cu.alloc(&p, len) != 0) {
        die("vram: cuMemAlloc of %llu bytes failed",
            (unsigned long long)len);
    }
    /* Written before any timed request, as the DRAM side is (big_alloc):
     * memory never written costs its first touch inside a request (the
     * fake driver's memfd: ~3.5 ms a MiB on the VM, which made small
     * staged READs, whose rounds touch fresh megabytes, 40x slower than
     * DRAM). */
    int rc = -1;
    if (cu.memset8 != NULL) {
        rc = cu.memset8(p, 0x5a, len);
    } else if (cu.htod != NULL) {
        static unsigned char pat[1 << 20];
        memset(pat, 0x5a, sizeof(pat));
        rc = 0;
        for (uint64_t off = 0; off < len && rc == 0; off += sizeof(pat)) {
            uint64_t n = len - off < sizeof(pat) ? len - off : sizeof(pat);
            rc = cu.htod(p + off, pat, n);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "pdx-bench vram: the VRAM could not be written "
                        "before the runs (no cuMemsetD8 nor cuMemcpyHtoD, "
                        "or they failed): first touches may be timed\n");
    }
    return p;
}

/* ---- one side -------------------------------------------------------- */

typedef struct vr_side {
    pdx_agent_h a;
    uint8_t *dram;
    uint64_t vram;
    uint64_t len;
} vr_side_t;

static void side_open(vr_side_t *s, const char *name, const char *tls,
                      uint64_t len)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                           PDX_AGENT_PARAM_XFER_TIMEOUT,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD,
                             .xfer_timeout_ms = 600000};
    CHECK(pdx_agent_create(name, &ap, &s->a));
    /* PDX_BENCH_UCX_OPTS="k=v,k=v": more ucx backend options on both
     * sides (stage_chunk, stage_window, ...), for trying the pipeline's
     * settings; the defaults are what is measured otherwise. */
    pdx_option_t opts[10] = {{"tls", tls}, {"vram", "staged"}};
    size_t nopt = 2;
    char extra[256] = "";
    const char *env = getenv("PDX_BENCH_UCX_OPTS");
    if (env != NULL &&
        (size_t)snprintf(extra, sizeof(extra), "%s", env) >= sizeof(extra)) {
        die("PDX_BENCH_UCX_OPTS: over %zu bytes", sizeof(extra) - 1);
    }
    char *save = NULL;
    for (char *kv = strtok_r(extra, ",", &save); kv != NULL;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL) {
            die("PDX_BENCH_UCX_OPTS: '%s' is not key=value", kv);
        }
        if (nopt == sizeof(opts) / sizeof(opts[0])) {
            die("PDX_BENCH_UCX_OPTS: more than %zu options",
                sizeof(opts) / sizeof(opts[0]) - 2);
        }
        *eq = '\0';
        opts[nopt++] = (pdx_option_t){kv, eq + 1};
    }
    CHECK(pdx_backend_create(s->a, "ucx", opts, nopt, NULL));
    s->len = len;
    s->dram = big_alloc(len);
    memset(s->dram, 0x5a, len);
    s->vram = bench_vram_alloc(len);
    pdx_mem_reg_h r;
    CHECK(pdx_mem_register(s->a, PDX_MEM_DRAM, (uintptr_t)s->dram, len, 0, 0,
                           &r));
    CHECK(pdx_mem_register(s->a, PDX_MEM_VRAM, s->vram, len, 0, 0, &r));
}

static void side_close(vr_side_t *s)
{
    pdx_agent_destroy(s->a);
    big_free(s->dram, s->len);
    cu.free(s->vram);
}

int target_vram(const bench_opts_t *o)
{
    char why[256];
    if (bench_cu_open(why, sizeof(why)) != 0) {
        die("vram target: %s", why);
    }
    vr_side_t s;
    side_open(&s, "bench-vram-target", o->tls, o->ws_bytes);
    char peer[PDX_NAME_MAX];
    exchange_blobs(s.a, o->target_fd, peer);
    ctl_sendf(o->target_fd, "region %llx %llx %llu",
              (unsigned long long)(uintptr_t)s.dram,
              (unsigned long long)s.vram, (unsigned long long)s.len);
    for (;;) {
        char *m = ctl_recv(o->target_fd, NULL);
        if (m == NULL || strcmp(m, "quit") == 0) {
            free(m);
            break;
        }
        free(m);
    }
    side_close(&s);
    return 0;
}

/* ---- the measurement ---------------------------------------------------- */

typedef struct vr_case {
    int write;
    uint64_t size;
    uint32_t batch;
} vr_case_t;

typedef struct vr_res {
    double p50_us, gbps;
    char transport[64], why[160];
} vr_res_t;

typedef struct vr_run {
    vr_side_t me;
    char peer[PDX_NAME_MAX];
    uint64_t r_dram, r_vram, r_len;
    int fd, pid;
} vr_run_t;

/* One round of one case in one memory type: requests of `batch` pieces
 * moving along the regions (aliasing once past their end), one at a time,
 * for `secs` after a warm-up. */
static void round_of(vr_run_t *R, const vr_case_t *c, pdx_mem_type_t mt,
                     double secs, int quick, vr_res_t *res)
{
    uint64_t len = R->me.len < R->r_len ? R->me.len : R->r_len;
    uint64_t nslots = len / c->size;
    uint64_t lbase = mt == PDX_MEM_VRAM ? R->me.vram : (uintptr_t)R->me.dram;
    uint64_t rbase = mt == PDX_MEM_VRAM ? R->r_vram : R->r_dram;
    pdx_desc_t *ld = calloc(nslots, sizeof(*ld));
    pdx_desc_t *rd = calloc(nslots, sizeof(*rd));
    uint32_t *idx = calloc(c->batch, sizeof(*idx));
    if (ld == NULL || rd == NULL || idx == NULL) {
        die("vram: out of memory");
    }
    for (uint64_t i = 0; i < nslots; i++) {
        ld[i] = (pdx_desc_t){lbase + i * c->size, c->size, 0, 0};
        rd[i] = (pdx_desc_t){rbase + i * c->size, c->size, 0, 0};
    }
    pdx_desc_list_t ll = {mt, ld, nslots}, rl = {mt, rd, nslots};
    pdx_dlist_h dl, dr;
    CHECK(pdx_dlist_prepare(R->me.a, NULL, &ll, &dl));
    CHECK(pdx_dlist_prepare(R->me.a, R->peer, &rl, &dr));
    dvec_t v = {0};
    uint64_t bytes = 0, busy = 0;
    uint64_t warm_until = pdx_now_ns() + (uint64_t)((quick ? 0.02 : 0.1) * 1e9);
    uint64_t end = warm_until + (uint64_t)(secs * 1e9);
    res->transport[0] = res->why[0] = '\0';
    for (uint64_t it = 0;; it++) {
        for (uint32_t j = 0; j < c->batch; j++) {
            idx[j] = (uint32_t)((it * c->batch + j) % nslots);
        }
        uint64_t t0 = pdx_now_ns();
        if (t0 > end && v.n >= 3) {
            break;
        }
        pdx_xfer_h x;
        CHECK(pdx_xfer_make(R->me.a, c->write ? PDX_XFER_WRITE : PDX_XFER_READ,
                            dl, idx, dr, idx, c->batch, NULL, 0, &x));
        pdx_status_t st = pdx_xfer_post(x);
        while (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(x);
        }
        uint64_t t1 = pdx_now_ns();
        if (st != PDX_OK) {
            die("vram: %s request: %s (%s)", mt == PDX_MEM_VRAM ? "VRAM" : "DRAM",
                pdx_status_string(st), pdx_last_error());
        }
        if (res->transport[0] == '\0') {
            pdx_xfer_telemetry_t tel;
            pdx_xfer_telemetry(x, &tel);
            snprintf(res->transport, sizeof(res->transport), "%s %s",
                     tel.backend, tel.transport);
            snprintf(res->why, sizeof(res->why), "%s", tel.fallback_why);
        }
        pdx_xfer_release(x);
        if (t0 >= warm_until) {
            dvec_push(&v, (double)(t1 - t0));
            bytes += c->size * c->batch;
            busy += t1 - t0;
        }
    }
    res->p50_us = median_of(v.v, v.n) / 1e3;
    res->gbps = gbps(bytes, busy);
    dvec_free(&v);
    pdx_dlist_release(dl);
    pdx_dlist_release(dr);
    free(ld);
    free(rd);
    free(idx);
}

static void run_open(vr_run_t *R, const bench_opts_t *o)
{
    const char *extra[] = {"--ws", NULL, NULL};
    char ws[32];
    snprintf(ws, sizeof(ws), "%llu", (unsigned long long)o->ws_bytes);
    extra[1] = ws;
    R->pid = spawn_target(o, "vram", extra, &R->fd);
    side_open(&R->me, "bench-vram", o->tls, o->ws_bytes);
    exchange_blobs(R->me.a, R->fd, R->peer);
    char *m = ctl_recv(R->fd, NULL);
    unsigned long long d = 0, v = 0, len = 0;
    if (m == NULL || sscanf(m, "region %llx %llx %llu", &d, &v, &len) != 3) {
        die("vram: the target did not start (see its error above)");
    }
    free(m);
    R->r_dram = d;
    R->r_vram = v;
    R->r_len = len;
}

static void run_close(vr_run_t *R)
{
    /* Unloaded before the target goes: its exit is no peer's death. */
    pdx_peer_unload(R->me.a, R->peer);
    ctl_sendf(R->fd, "quit");
    reap_target(R->pid, 10000);
    close(R->fd);
    side_close(&R->me);
}

static void med(vr_res_t *rs, int n, vr_res_t *out)
{
    double p[VR_ROUNDS_MAX], g[VR_ROUNDS_MAX];
    for (int i = 0; i < n; i++) {
        p[i] = rs[i].p50_us;
        g[i] = rs[i].gbps;
    }
    *out = rs[0];
    out->p50_us = median_of(p, (size_t)n);
    out->gbps = median_of(g, (size_t)n);
}

/* Every row over one transport; 0, or 1 when a target row fell short. */
static int rows_of(const bench_opts_t *o, const char *where, cJSON *rows)
{
    static const uint64_t sizes[] = {65536, 1048576, 16777216};
    static const uint32_t batches[] = {1, 64};
    /* --quick: the 1 MiB rows only (a smoke run). */
    size_t s0 = o->quick ? 1 : 0, s1 = o->quick ? 2 : 3;
    int rounds = o->reps > VR_ROUNDS_MAX ? VR_ROUNDS_MAX : o->reps;
    double secs = o->case_s;
    vr_run_t R;
    run_open(&R, o);
    int shortfall = 0;
    char path[256] = "";
    say("%-5s %9s %5s | %9s %8s | %9s %8s | %6s %6s | %-16s | %s\n", "op",
        "size", "batch", "DRAM p50", "GB/s", "VRAM p50", "GB/s", "GB/s x",
        "p50 x", "paired (min-max)", where);
    for (int w = 0; w < 2; w++) {
        if (!(o->ops & (1 << w))) {
            continue;
        }
        for (size_t si = s0; si < s1; si++) {
            for (size_t bi = 0; bi < 2; bi++) {
                vr_case_t c = {w, sizes[si], batches[bi]};
                if (c.size > o->ws_bytes) {
                    continue;
                }
                vr_res_t d[VR_ROUNDS_MAX], v[VR_ROUNDS_MAX], dm, vm;
                for (int k = 0; k < rounds; k++) {
                    round_of(&R, &c, PDX_MEM_DRAM, secs, o->quick, &d[k]);
                    round_of(&R, &c, PDX_MEM_VRAM, secs, o->quick, &v[k]);
                }
                med(d, rounds, &dm);
                med(v, rounds, &vm);
                /* Each round's VRAM against the DRAM round just before
                 * it: the spread within this run (this VM's TCP moves
                 * 2x between runs). Said, not judged. */
                double pr[VR_ROUNDS_MAX];
                for (int k = 0; k < rounds; k++) {
                    pr[k] = d[k].gbps > 0 ? v[k].gbps / d[k].gbps : 0;
                }
                /* median_of sorts pr: its ends are the range. */
                double pmed = median_of(pr, (size_t)rounds);
                double plo = pr[0], phi = pr[rounds - 1];
                if (path[0] == '\0') {
                    snprintf(path, sizeof(path), "%s (%s)", vm.transport,
                             vm.why);
                }
                double xg = dm.gbps > 0 ? vm.gbps / dm.gbps : 0;
                double xp = dm.p50_us > 0 ? vm.p50_us / dm.p50_us : 0;
                int target = c.size >= 1048576;
                int low = target && xg < 0.8;
                shortfall |= low;
                char pcol[32];
                snprintf(pcol, sizeof(pcol), "%.2f (%.2f-%.2f)", pmed, plo,
                         phi);
                say("%-5s %9llu %5u | %9.1f %8.2f | %9.1f %8.2f | %6.2f "
                    "%6.2f | %-16s |%s\n",
                    w ? "WRITE" : "READ", (unsigned long long)c.size, c.batch,
                    dm.p50_us, dm.gbps, vm.p50_us, vm.gbps, xg, xp, pcol,
                    low ? " < 0.8x" : "");
                cJSON *row = cJSON_CreateObject();
                jstr(row, "transport", where);
                jstr(row, "op", w ? "WRITE" : "READ");
                jnum(row, "size", (double)c.size);
                jnum(row, "batch", c.batch);
                jnum(row, "dram_p50_us", dm.p50_us);
                jnum(row, "dram_gbps", dm.gbps);
                jnum(row, "vram_p50_us", vm.p50_us);
                jnum(row, "vram_gbps", vm.gbps);
                jnum(row, "gbps_ratio", xg);
                jnum(row, "p50_ratio", xp);
                jnum(row, "paired_gbps_ratio_median", pmed);
                jnum(row, "paired_gbps_ratio_min", plo);
                jnum(row, "paired_gbps_ratio_max", phi);
                jstr(row, "vram_path", vm.transport);
                jstr(row, "vram_why", vm.why);
                cJSON_AddItemToArray(rows, row);
            }
        }
    }
    say("# VRAM went over %s\n", path);
    run_close(&R);
    return shortfall;
}

int mode_vram(const bench_opts_t *o, cJSON *root)
{
    char why[256];
    if (bench_cu_open(why, sizeof(why)) != 0) {
        say("# vram: skipped: %s (PDX_CUDA_DRIVER_LIB names a driver; the "
            "fake one of tests/fixtures without a GPU)\n",
            why);
        jstr(root, "skipped", why);
        return 0;
    }
    setenv("PDX_BENCH_PATH", "ucx", 1);
    bench_opts_t oo = *o;
    if (oo.reps < 1) {
        oo.reps = 1;
    }
    say("# vram: GPU memory staged through pinned host memory vs host "
        "memory, over the same UCX (ucx backend only, vram=staged, progress "
        "threads on); one prepared request at a time, posted and polled; "
        "%d interleaved rounds (DRAM, VRAM, ...) of %.2f s after a warm-up, "
        "medians (paired: each round's VRAM GB/s over the DRAM round "
        "before it, median and range); %llu MiB per side and kind; "
        "driver %s\n",
        oo.reps, oo.case_s, (unsigned long long)(oo.ws_bytes >> 20),
        getenv("PDX_CUDA_DRIVER_LIB") ? getenv("PDX_CUDA_DRIVER_LIB")
                                      : "libcuda.so.1");
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    /* Both transports, or the one --tls names. */
    int rc = 0;
    if (!o->tls_given || strcmp(o->tls, "sm") == 0) {
        snprintf(oo.tls, sizeof(oo.tls), "sm");
        rc = rows_of(&oo, "shared memory (tls sm), one host", rows);
    }
    if (!o->tls_given || strcmp(o->tls, "tcp") == 0) {
        /* Another host: both sides in network namespaces, UCX over TCP. */
        if (bench_lab_enter(why, sizeof(why)) != 0) {
            say("# vram over TCP between namespaces: skipped: %s\n", why);
            jstr(root, "tcp_skipped", why);
            return 0;
        }
        snprintf(oo.tls, sizeof(oo.tls), "tcp");
        char *old = getenv("UCX_NET_DEVICES")
                        ? strdup(getenv("UCX_NET_DEVICES"))
                        : NULL;
        setenv("UCX_NET_DEVICES", "eth0", 1);
        rc |= rows_of(&oo, "TCP between two network namespaces (veth)", rows);
        if (old != NULL) {
            setenv("UCX_NET_DEVICES", old, 1);
            free(old);
        }
        bench_lab_leave();
    }
    say("# target (issue 37): VRAM GB/s >= 0.8x DRAM's at 1 MiB and 16 MiB, "
        "both batches%s\n",
        rc ? "; rows marked < 0.8x fall short" : "");
    return 0;
}
