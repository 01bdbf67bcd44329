/* cuda_ipc on a real GPU, through the pdx agent API: a P process and a D
 * process (this program forked and re-executed with --role d) on one GPU.
 * P registers GLM-5.2-shaped KV arenas in VRAM; D reads and writes them
 * through CUDA IPC, byte-exact for 1, 1000 and 100000 descriptors, then
 * measures bandwidth against in-process cuMemcpy* (the limit), and VRAM <->
 * pinned DRAM. Notifications go through the UCX backend (cuda_ipc carries
 * none).
 *
 * The driver is loaded with dlopen, so this builds without it. Exit codes:
 * 0 all passed, 1 a check failed, 2 CUDA IPC refused between processes
 * (sandbox, container), 3 setup failed, 77 no GPU (with --skip-without-gpu).
 *
 *   cuda_ipc_gpu_test [--mib N] [--alloc arena|one] [--quick]
 *                     [--ucx-tls TLS] [--skip-without-gpu]
 *                     [--path cuda_ipc|ucx-staged|ucx-native]
 * --path ucx-*: no cuda_ipc backend; VRAM moves over UCX, staged through
 * pinned host memory or natively (UCX built with CUDA). */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <pdx/backend.h> /* PDX_REGION_F_PIN */
#include <pdx/pdx.h>

#include "ctl.h"
#include "mix.h"
#include "pdx_clock.h"

/* ---- the driver, by dlopen ------------------------------------------ */

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocHost)(void **, size_t);
    CUresult (*MemFreeHost)(void *);
    CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*DtoH)(void *, CUdeviceptr, size_t);
    CUresult (*DtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
} cu;

static const char *g_role = "p";

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("[%s] ", g_role);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

static const char *errname(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorName == NULL || cu.GetErrorName(r, &s) != CUDA_SUCCESS ||
        s == NULL) {
        return "CUDA_ERROR_?";
    }
    return s;
}

#define CK(call)                                                               \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS)                                                \
            die_rc(3, "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
                   errname(r_));                                               \
    } while (0)

#define PK(call)                                                               \
    do {                                                                       \
        pdx_status_t s_ = (call);                                              \
        if (s_ != PDX_OK)                                                      \
            die_rc(3, "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
                   pdx_status_string(s_));                                     \
    } while (0)

/* 0, or a reason in `why`. */
static int cu_load(char *why, size_t len)
{
    /* PDX_CUDA_DRIVER_LIB as the backend reads it: lets the test run
     * against the fake driver of tests/fixtures on a machine without a
     * GPU. */
    const char *lib = getenv("PDX_CUDA_DRIVER_LIB");
    lib = lib != NULL && lib[0] != '\0' ? lib : "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, len, "no CUDA driver (%s)", dlerror());
        return -1;
    }
#define L(field, sym)                                                          \
    do {                                                                       \
        void *f = dlsym(h, sym);                                               \
        if (f == NULL) {                                                       \
            snprintf(why, len, "driver lacks %s", sym);                        \
            return -1;                                                         \
        }                                                                      \
        memcpy(&cu.field, &f, sizeof(f));                                      \
    } while (0)
    L(Init, "cuInit");
    L(GetErrorName, "cuGetErrorName");
    L(DeviceGetCount, "cuDeviceGetCount");
    L(DeviceGet, "cuDeviceGet");
    L(DeviceGetName, "cuDeviceGetName");
    L(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    L(CtxSetCurrent, "cuCtxSetCurrent");
    L(CtxSynchronize, "cuCtxSynchronize");
    L(MemAlloc, "cuMemAlloc_v2");
    L(MemFree, "cuMemFree_v2");
    L(MemAllocHost, "cuMemAllocHost_v2");
    L(MemFreeHost, "cuMemFreeHost");
    L(HtoD, "cuMemcpyHtoD_v2");
    L(DtoH, "cuMemcpyDtoH_v2");
    L(DtoDAsync, "cuMemcpyDtoDAsync_v2");
    L(IpcGetMemHandle, "cuIpcGetMemHandle");
    L(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    L(IpcCloseMemHandle, "cuIpcCloseMemHandle");
#undef L
    CUresult r = cu.Init(0);
    int n = 0;
    if (r == CUDA_SUCCESS) {
        r = cu.DeviceGetCount(&n);
    }
    if (r != CUDA_SUCCESS || n == 0) {
        snprintf(why, len, "no CUDA device (%s, %d devices)", errname(r), n);
        return -1;
    }
    return 0;
}

static void cu_start(void)
{
    CUdevice d;
    CUcontext c;
    char name[128];
    CK(cu.DeviceGet(&d, 0));
    CK(cu.PrimaryCtxRetain(&c, d));
    CK(cu.CtxSetCurrent(c));
    CK(cu.DeviceGetName(name, sizeof(name), d));
    say("device 0: %s", name);
}

/* ---- GLM-5.2 layout --------------------------------------------------- */

/* 101 arenas, 64-token blocks: 79 MLA (78 layers + MTP) at 656 B/token and
 * 22 index-K (21 layers + MTP) at 132 B/token = 3,502,592 B per block. */
#define NARENA 101
#define N_MLA 79
#define BLK_MLA (656u * 64u)
#define BLK_IDX (132u * 64u)
#define PER_BLOCK 3502592u
#define QUARTERS 4 /* descriptors are quarter blocks */

typedef struct {
    size_t nblocks, total;
    size_t blk[NARENA], off[NARENA];
    CUdeviceptr base[NARENA];
    CUdeviceptr alloc[NARENA];
    int nalloc;
} layout_t;

static void layout_init(layout_t *L, size_t bytes, int one_alloc)
{
    memset(L, 0, sizeof(*L));
    L->nblocks = bytes / PER_BLOCK;
    if (L->nblocks < 8) {
        die_rc(3, "--mib too small");
    }
    size_t off = 0;
    for (int a = 0; a < NARENA; a++) {
        L->blk[a] = a < N_MLA ? BLK_MLA : BLK_IDX;
        L->off[a] = off;
        off += L->blk[a] * L->nblocks;
    }
    L->total = off;
    if (one_alloc) {
        CK(cu.MemAlloc(&L->alloc[0], L->total));
        L->nalloc = 1;
        for (int a = 0; a < NARENA; a++) {
            L->base[a] = L->alloc[0] + L->off[a];
        }
    } else {
        /* one cudaMalloc per arena, as per-layer KV tensors get */
        for (int a = 0; a < NARENA; a++) {
            CK(cu.MemAlloc(&L->alloc[a], L->blk[a] * L->nblocks));
            L->base[a] = L->alloc[a];
        }
        L->nalloc = NARENA;
    }
}

static void layout_free(layout_t *L)
{
    for (int i = 0; i < L->nalloc; i++) {
        CK(cu.MemFree(L->alloc[i]));
    }
}

/* Deterministic content: 8-byte words of a hash of (seed, word index in
 * the concatenated arenas). */
static void fill(void *dst, uint64_t seed, size_t off, size_t len)
{
    uint64_t *w = dst;
    for (size_t i = 0; i < len / 8; i++) {
        w[i] = splitmix64(seed * 0x100000001b3ull + off / 8 + i);
    }
}

static void upload(const layout_t *L, const uint8_t *host)
{
    for (int a = 0; a < NARENA; a++) {
        CK(cu.HtoD(L->base[a], host + L->off[a], L->blk[a] * L->nblocks));
    }
}

static void download(const layout_t *L, uint8_t *host)
{
    for (int a = 0; a < NARENA; a++) {
        CK(cu.DtoH(host + L->off[a], L->base[a], L->blk[a] * L->nblocks));
    }
}

/* n descriptors: distinct remote quarter-blocks in a shuffled order, each
 * paired with the same quarter of a permuted block of the same arena on the
 * local side (block ids differ between P and D, as they do in serving). */
typedef struct {
    size_t n;
    pdx_desc_t *local, *remote; /* addresses on each side */
    size_t *loff, *roff;        /* offsets in the concatenated arenas */
} descs_t;

static void descs_make(descs_t *D, size_t n, const layout_t *mine,
                       const layout_t *peer_like, const CUdeviceptr *peer_base)
{
    size_t total = (size_t)NARENA * mine->nblocks * QUARTERS;
    if (n > total) {
        die_rc(3, "%zu descriptors asked, layout has %zu", n, total);
    }
    uint32_t *ids = malloc(total * sizeof(*ids));
    for (size_t i = 0; i < total; i++) {
        ids[i] = (uint32_t)i;
    }
    uint64_t s = n * 7919;
    for (size_t i = total - 1; i > 0; i--) {
        s = splitmix64(s);
        size_t j = s % (i + 1);
        uint32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    D->n = n;
    D->local = calloc(n, sizeof(pdx_desc_t));
    D->remote = calloc(n, sizeof(pdx_desc_t));
    D->loff = calloc(n, sizeof(size_t));
    D->roff = calloc(n, sizeof(size_t));
    size_t nb = mine->nblocks;
    for (size_t i = 0; i < n; i++) {
        size_t id = ids[i], q = id % QUARTERS, b = (id / QUARTERS) % nb,
               a = id / QUARTERS / nb;
        size_t lb = (b * 7 + 3) % nb; /* gcd(7, nb) == 1 checked at start */
        size_t piece = mine->blk[a] / QUARTERS;
        size_t rin = b * mine->blk[a] + q * piece;
        size_t lin = lb * mine->blk[a] + q * piece;
        D->roff[i] = peer_like->off[a] + rin;
        D->loff[i] = mine->off[a] + lin;
        D->remote[i] = (pdx_desc_t){peer_base[a] + rin, piece, 0, 0};
        D->local[i] = (pdx_desc_t){mine->base[a] + lin, piece, 0, 0};
    }
    free(ids);
}

static void descs_free(descs_t *D)
{
    free(D->local);
    free(D->remote);
    free(D->loff);
    free(D->roff);
}

/* Compare what `got` holds with `base` overwritten at dst offsets by the
 * `src_seed` pattern of the src offsets. Returns mismatching bytes. */
static size_t verify(const uint8_t *got, const uint8_t *base, uint8_t *exp,
                     size_t total, const size_t *dst_off, const size_t *src_off,
                     const pdx_desc_t *len_from, size_t n, uint64_t src_seed,
                     char *msg, size_t msg_len)
{
    memcpy(exp, base, total);
    for (size_t i = 0; i < n; i++) {
        fill(exp + dst_off[i], src_seed, src_off[i], len_from[i].len);
    }
    size_t bad = 0, first = SIZE_MAX;
    for (size_t off = 0; off < total; off += 4096) {
        size_t len = total - off < 4096 ? total - off : 4096;
        if (memcmp(got + off, exp + off, len) != 0) {
            for (size_t j = 0; j < len; j++) {
                if (got[off + j] != exp[off + j]) {
                    first = first == SIZE_MAX ? off + j : first;
                    bad++;
                }
            }
        }
    }
    if (bad) {
        snprintf(msg, msg_len, "%zu bytes differ, first at offset %zu", bad,
                 first);
    }
    return bad;
}

/* ---- pipes ------------------------------------------------------------ */

static void send_str(int fd, const char *s)
{
    send_msg(fd, s, (uint32_t)strlen(s) + 1);
}

/* The next message (free it), or an exit (3) when the peer went away. */
static void *recv_or_die(int fd, uint32_t *len_p)
{
    char *m = recv_msg(fd, len_p);
    if (m == NULL) {
        die_rc(3, "peer process went away");
    }
    return m;
}

/* ---- agent helpers ---------------------------------------------------- */

typedef struct {
    char msgs[64][64];
    int n;
} notifs_t;

static void on_notif(void *arg, const char *peer, const void *msg, size_t len)
{
    notifs_t *N = arg;
    if (N->n < 64) {
        snprintf(N->msgs[N->n++], 64, "%.*s", (int)len, (const char *)msg);
    }
}

static int g_have_ucx;
static const char *g_tls = "sm";
/* --path: "cuda_ipc" (default), or "ucx-staged" / "ucx-native": no cuda_ipc
 * backend, VRAM over UCX through pinned host memory or natively (a UCX
 * built with CUDA). */
static const char *g_path = "cuda_ipc";

static pdx_agent_h agent_start(const char *name)
{
    pdx_agent_params_t prm = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                            PDX_AGENT_PARAM_XFER_TIMEOUT,
                              .flags = PDX_AGENT_F_PROGRESS_THREAD,
                              .xfer_timeout_ms = 120000};
    pdx_agent_h a;
    PK(pdx_agent_create(name, &prm, &a));
    pdx_backend_h be;
    char desc[512];
    if (strcmp(g_path, "cuda_ipc") == 0) {
        /* cuda_ipc first: it is the one for VRAM on this host. */
        PK(pdx_backend_create(a, "cuda_ipc", NULL, 0, &be));
        pdx_backend_describe(be, desc, sizeof(desc));
        say("%s", desc);
        pdx_option_t opt = {"tls", g_tls};
        pdx_status_t st = pdx_backend_create(a, "ucx", &opt, 1, NULL);
        g_have_ucx = st == PDX_OK;
        if (!g_have_ucx) {
            say("WARNING: ucx backend unavailable (%s): notifications not "
                "checked",
                pdx_status_string(st));
        }
        return a;
    }
    /* VRAM over UCX only: the path under test must carry it. */
    pdx_option_t opts[2] = {
        {"tls", g_tls},
        {"vram", strcmp(g_path, "ucx-native") == 0 ? "native" : "staged"}};
    PK(pdx_backend_create(a, "ucx", opts, 2, &be));
    pdx_backend_describe(be, desc, sizeof(desc));
    say("%s", desc);
    g_have_ucx = 1;
    return a;
}

static void register_arenas(pdx_agent_h a, const layout_t *L)
{
    for (int i = 0; i < NARENA; i++) {
        pdx_mem_reg_h r;
        PK(pdx_mem_register(a, PDX_MEM_VRAM, L->base[i], L->blk[i] * L->nblocks,
                            0, 0, &r));
    }
}

/* post + check to completion; seconds, or < 0 on error */
static double run(pdx_xfer_h x, pdx_status_t *st_p)
{
    double t0 = pdx_now_s();
    pdx_status_t st = pdx_xfer_post(x);
    while (st == PDX_INPROGRESS) {
        st = pdx_xfer_check(x);
        if (pdx_now_s() - t0 > 120) {
            st = PDX_ERR_TIMEOUT;
        }
    }
    *st_p = st;
    return pdx_now_s() - t0;
}

/* ---- P ---------------------------------------------------------------- */

static uint8_t *g_pat, *g_got, *g_exp;

static int p_main(int rfd, int wfd, size_t bytes, int one_alloc)
{
    cu_start();
    layout_t L;
    layout_init(&L, bytes, one_alloc);
    CK(cu.MemAllocHost((void **)&g_got, L.total));
    g_pat = malloc(L.total);
    g_exp = malloc(L.total);
    fill(g_pat, 1, 0, L.total);
    upload(&L, g_pat);
    say("%d arenas x %zu blocks = %zu B in %d allocation(s)", NARENA, L.nblocks,
        L.total, L.nalloc);

    /* Raw CUDA IPC first: a refusal here is the sandbox, not pdx. */
    CUipcMemHandle ih;
    CK(cu.IpcGetMemHandle(&ih, L.alloc[0]));
    send_msg(wfd, &ih, sizeof(ih));
    char *m = recv_or_die(rfd, NULL);
    if (strncmp(m, "IPCFAIL", 7) == 0) {
        fprintf(stderr, "[p] CUDA IPC between processes is refused here: %s\n",
                m + 8);
        return 2;
    }
    free(m);

    pdx_agent_h a = agent_start("gpu-p");
    register_arenas(a, &L);
    /* D needs the arena bases: they travel in the blob, and also here. */
    send_msg(wfd, L.base, sizeof(L.base));
    void *blob;
    size_t blen;
    PK(pdx_agent_describe(a, &blob, &blen));
    send_msg(wfd, blob, (uint32_t)blen);
    pdx_blob_free(blob);
    uint32_t dl;
    void *dblob = recv_or_die(rfd, &dl);
    char dname[PDX_NAME_MAX];
    PK(pdx_peer_load(a, dblob, dl, dname));
    free(dblob);
    free(recv_or_die(rfd, NULL)); /* D's arena bases: not needed here */

    notifs_t N = {.n = 0};
    int failures = 0;
    for (;;) {
        struct pollfd pf = {rfd, POLLIN, 0};
        if (poll(&pf, 1, 10) == 0) {
            pdx_notif_poll(a, on_notif, &N);
            continue;
        }
        char *cmd = recv_or_die(rfd, NULL);
        char reply[256] = "OK";
        size_t n;
        if (strcmp(cmd, "DONE") == 0) {
            free(cmd);
            break;
        } else if (sscanf(cmd, "VERIFY %zu", &n) == 1) {
            /* D wrote its pieces into ours: check every byte, then put
             * our content back for the next case. */
            descs_t Dd;
            layout_t Dl = L; /* same shape on D */
            descs_make(&Dd, n, &Dl, &L, L.base);
            download(&L, g_got);
            char why[128];
            /* D's local pieces (seed 2) landed at our (remote) pieces */
            if (verify(g_got, g_pat, g_exp, L.total, Dd.roff, Dd.loff,
                       Dd.remote, n, 2, why, sizeof(why))) {
                snprintf(reply, sizeof(reply), "FAIL WRITE %zu: %s", n, why);
            }
            upload(&L, g_pat);
            descs_free(&Dd);
        } else if (strncmp(cmd, "EXPECT ", 7) == 0) {
            const char *want = cmd + 7;
            double t0 = pdx_now_s();
            int found = 0;
            while (!found && pdx_now_s() - t0 < 10) {
                pdx_notif_poll(a, on_notif, &N);
                for (int i = 0; i < N.n && !found; i++) {
                    found = strcmp(N.msgs[i], want) == 0;
                }
                if (!found) {
                    usleep(1000);
                }
            }
            if (!found) {
                snprintf(reply, sizeof(reply),
                         "FAIL notification '%s' not received in 10 s", want);
            }
        } else {
            snprintf(reply, sizeof(reply), "FAIL unknown command '%s'", cmd);
        }
        failures += strcmp(reply, "OK") != 0;
        send_str(wfd, reply);
        free(cmd);
    }
    pdx_agent_destroy(a);
    layout_free(&L);
    CK(cu.MemFreeHost(g_got));
    free(g_pat);
    free(g_exp);
    return failures ? 1 : 0;
}

/* ---- D ---------------------------------------------------------------- */

static int g_fail;

static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("[d] %s: ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    g_fail += !ok;
}

static char *ask(int rfd, int wfd, const char *cmd)
{
    send_str(wfd, cmd);
    return recv_or_die(rfd, NULL);
}

static double gbps(size_t bytes, double s)
{
    return s > 0 ? (double)bytes / s / 1e9 : 0;
}

static pdx_xfer_h make(pdx_agent_h a, pdx_xfer_op_t op, pdx_mem_type_t lt,
                       const pdx_desc_t *l, const pdx_desc_t *r, size_t n,
                       const char *notif, double *t_p)
{
    pdx_desc_list_t ll = {lt, l, n}, rl = {PDX_MEM_VRAM, r, n};
    pdx_xfer_h x;
    double t0 = pdx_now_s();
    PK(pdx_xfer_create(a, op, &ll, &rl, "gpu-p", notif,
                       notif ? strlen(notif) + 1 : 0, &x));
    if (t_p) {
        *t_p = pdx_now_s() - t0;
    }
    return x;
}

/* Time `iters` posts of one request; GB/s of the best. */
static double bench(pdx_xfer_h x, size_t bytes, int iters)
{
    double best = 1e30;
    for (int i = 0; i < iters + 1; i++) {
        pdx_status_t st;
        double t = run(x, &st);
        if (st != PDX_OK) {
            check(0, "bench transfer: %s", pdx_status_string(st));
            return 0;
        }
        if (i > 0 && t < best) {
            best = t; /* the first is a warm-up */
        }
    }
    return gbps(bytes, best);
}

static double bench_cu(int kind, CUdeviceptr dst_base, CUdeviceptr src_base,
                       void *host, const layout_t *L, const descs_t *blocks,
                       int iters)
{
    double best = 1e30;
    for (int i = 0; i < iters + 1; i++) {
        double t0 = pdx_now_s();
        if (kind == 0) { /* DtoD per arena */
            for (int a = 0; a < NARENA; a++) {
                CK(cu.DtoDAsync(dst_base + L->off[a], L->base[a],
                                L->blk[a] * L->nblocks, NULL));
            }
            CK(cu.CtxSynchronize());
        } else if (kind == 1) { /* DtoD per block, KV-shaped */
            for (size_t k = 0; k < blocks->n; k++) {
                CK(cu.DtoDAsync(dst_base + blocks->loff[k],
                                blocks->remote[k].addr, blocks->remote[k].len,
                                NULL));
            }
            CK(cu.CtxSynchronize());
        } else if (kind == 2) { /* DtoH pinned */
            for (int a = 0; a < NARENA; a++) {
                CK(cu.DtoH((uint8_t *)host + L->off[a], L->base[a],
                           L->blk[a] * L->nblocks));
            }
        } else { /* HtoD pinned */
            for (int a = 0; a < NARENA; a++) {
                CK(cu.HtoD(L->base[a], (uint8_t *)host + L->off[a],
                           L->blk[a] * L->nblocks));
            }
        }
        double t = pdx_now_s() - t0;
        if (i > 0 && t < best) {
            best = t;
        }
    }
    (void)src_base;
    return gbps(L->total, best);
}

static int d_main(int rfd, int wfd, size_t bytes, int one_alloc, int quick)
{
    cu_start();
    layout_t L;
    layout_init(&L, bytes, one_alloc);
    CK(cu.MemAllocHost((void **)&g_got, L.total));
    g_pat = malloc(L.total);
    g_exp = malloc(L.total);
    fill(g_pat, 2, 0, L.total);
    upload(&L, g_pat);

    CUipcMemHandle ih;
    uint32_t hl;
    void *hm = recv_or_die(rfd, &hl);
    memcpy(&ih, hm, sizeof(ih));
    free(hm);
    CUdeviceptr probe;
    CUresult r =
        cu.IpcOpenMemHandle(&probe, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
        char msg[160];
        snprintf(msg, sizeof(msg), "IPCFAIL cuIpcOpenMemHandle: %s",
                 errname(r));
        send_str(wfd, msg);
        fprintf(stderr,
                "[d] CUDA IPC between processes is refused here: "
                "cuIpcOpenMemHandle: %s\n",
                errname(r));
        return 2;
    }
    CK(cu.IpcCloseMemHandle(probe));
    send_str(wfd, "IPCOK");
    say("raw CUDA IPC between the two processes works");

    pdx_agent_h a = agent_start("gpu-d");
    register_arenas(a, &L);
    CUdeviceptr pbase[NARENA];
    void *pb = recv_or_die(rfd, NULL);
    memcpy(pbase, pb, sizeof(pbase));
    free(pb);
    uint32_t pl;
    void *pblob = recv_or_die(rfd, &pl);
    char pname[PDX_NAME_MAX];
    double t0 = pdx_now_s();
    PK(pdx_peer_load(a, pblob, pl, pname));
    say("loaded peer %s (%u B blob, %d regions) in %.1f ms", pname, pl, NARENA,
        (pdx_now_s() - t0) * 1e3);
    free(pblob);
    void *blob;
    size_t blen;
    PK(pdx_agent_describe(a, &blob, &blen));
    send_msg(wfd, blob, (uint32_t)blen);
    pdx_blob_free(blob);
    send_msg(wfd, L.base, sizeof(L.base));

    layout_t P = L; /* P has the same shape; its addresses: */
    for (int i = 0; i < NARENA; i++) {
        P.base[i] = pbase[i];
    }

    size_t counts[] = {1, 1000, 100000};
    size_t ncounts = quick ? 2 : 3;
    size_t pieces = (size_t)NARENA * L.nblocks * QUARTERS;
    for (size_t c = 0; c < ncounts; c++) {
        size_t n = counts[c];
        if (n > pieces) {
            say("SKIP: %zu descriptors need more arena memory than --mib %zu "
                "gives (%zu quarter blocks)",
                n, bytes >> 20, pieces);
            continue;
        }
        descs_t Ds;
        descs_make(&Ds, n, &L, &P, pbase);
        size_t bytes_moved = 0;
        for (size_t i = 0; i < n; i++) {
            bytes_moved += Ds.local[i].len;
        }
        /* READ: P's pieces (seed 1) into ours */
        char note[32];
        snprintf(note, sizeof(note), "r%zu", n);
        double tc;
        pdx_xfer_h x = make(a, PDX_XFER_READ, PDX_MEM_VRAM, Ds.local, Ds.remote,
                            n, g_have_ucx ? note : NULL, &tc);
        pdx_status_t st;
        double t = run(x, &st);
        size_t segs = pdx_xfer_segments(x);
        pdx_xfer_telemetry_t tel;
        pdx_xfer_telemetry(x, &tel);
        pdx_xfer_release(x);
        /* The path asked for is the one taken. */
        const char *want_be = strcmp(g_path, "cuda_ipc") == 0 ? "cuda_ipc"
                                                              : "ucx";
        check(strcmp(tel.backend, want_be) == 0,
              "READ %zu descriptors went over %s (%s%s%s), want %s", n,
              tel.backend, tel.transport, tel.fallback ? "; " : "",
              tel.fallback_why, want_be);
        char why[128] = "";
        if (st == PDX_OK) {
            download(&L, g_got);
            if (verify(g_got, g_pat, g_exp, L.total, Ds.loff, Ds.roff, Ds.local,
                       n, 1, why, sizeof(why)) == 0) {
                snprintf(why, sizeof(why), "byte-exact");
            }
            upload(&L, g_pat);
        } else {
            snprintf(why, sizeof(why), "%s", pdx_status_string(st));
        }
        check(strcmp(why, "byte-exact") == 0,
              "READ  %6zu descriptors (%zu segments, %zu B): %s; create "
              "%.2f ms, transfer %.2f ms",
              n, segs, bytes_moved, why, tc * 1e3, t * 1e3);
        if (g_have_ucx) {
            char cmd[48], *rep;
            snprintf(cmd, sizeof(cmd), "EXPECT %s", note);
            rep = ask(rfd, wfd, cmd);
            check(strcmp(rep, "OK") == 0, "notification after READ %zu: %s", n,
                  rep);
            free(rep);
        }

        /* WRITE: our pieces (seed 2) into P's; P checks */
        snprintf(note, sizeof(note), "w%zu", n);
        x = make(a, PDX_XFER_WRITE, PDX_MEM_VRAM, Ds.local, Ds.remote, n,
                 g_have_ucx ? note : NULL, &tc);
        t = run(x, &st);
        pdx_xfer_release(x);
        if (st == PDX_OK) {
            char cmd[48], *rep;
            snprintf(cmd, sizeof(cmd), "VERIFY %zu", n);
            rep = ask(rfd, wfd, cmd);
            check(strcmp(rep, "OK") == 0,
                  "WRITE %6zu descriptors: %s; transfer %.2f ms", n,
                  strcmp(rep, "OK") == 0 ? "byte-exact (checked by P)" : rep,
                  t * 1e3);
            free(rep);
            if (g_have_ucx) {
                snprintf(cmd, sizeof(cmd), "EXPECT %s", note);
                rep = ask(rfd, wfd, cmd);
                check(strcmp(rep, "OK") == 0,
                      "notification after WRITE %zu: %s", n, rep);
                free(rep);
            }
        } else {
            check(0, "WRITE %zu descriptors: %s", n, pdx_status_string(st));
        }
        descs_free(&Ds);
    }

    /* VRAM <-> pinned DRAM: a host copy of P's arenas, read and written
     * through cuda_ipc (registered with PDX_REGION_F_PIN). Registered after
     * our blob went out: P never targets it. */
    uint8_t *dram = aligned_alloc(4096, (L.total + 4095) / 4096 * 4096);
    memset(dram, 0, L.total);
    pdx_mem_reg_h dreg;
    PK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)dram, L.total, 0,
                        PDX_REGION_F_PIN, &dreg));
    pdx_desc_t *hl_d = calloc(NARENA, sizeof(pdx_desc_t));
    pdx_desc_t *pr_d = calloc(NARENA, sizeof(pdx_desc_t));
    pdx_desc_t *lv_d = calloc(NARENA, sizeof(pdx_desc_t));
    for (int i = 0; i < NARENA; i++) {
        size_t len = L.blk[i] * L.nblocks;
        hl_d[i] = (pdx_desc_t){(uintptr_t)dram + L.off[i], len, 0, 0};
        pr_d[i] = (pdx_desc_t){pbase[i], len, 0, 0};
        lv_d[i] = (pdx_desc_t){L.base[i], len, 0, 0};
    }
    pdx_xfer_h xr_dram =
        make(a, PDX_XFER_READ, PDX_MEM_DRAM, hl_d, pr_d, NARENA, NULL, NULL);
    pdx_status_t st;
    run(xr_dram, &st);
    if (st == PDX_OK) {
        fill(g_exp, 1, 0, L.total);
        check(memcmp(dram, g_exp, L.total) == 0,
              "READ  P VRAM -> D pinned DRAM, %zu B: %s", L.total,
              memcmp(dram, g_exp, L.total) == 0 ? "byte-exact" : "DIFFERS");
    } else {
        check(0, "READ P VRAM -> D pinned DRAM: %s", pdx_status_string(st));
    }

    if (!quick) {
        /* Bandwidth. "arenas": 101 descriptors, one per arena; "blocks":
         * one descriptor per block (nblocks x 101), block ids permuted. */
        descs_t B;
        B.n = (size_t)NARENA * L.nblocks;
        B.local = calloc(B.n, sizeof(pdx_desc_t));
        B.remote = calloc(B.n, sizeof(pdx_desc_t));
        B.loff = calloc(B.n, sizeof(size_t));
        B.roff = NULL;
        size_t k = 0;
        for (int ar = 0; ar < NARENA; ar++) {
            for (size_t b = 0; b < L.nblocks; b++, k++) {
                size_t lb = (b * 7 + 3) % L.nblocks;
                B.local[k] =
                    (pdx_desc_t){L.base[ar] + lb * L.blk[ar], L.blk[ar], 0, 0};
                B.remote[k] =
                    (pdx_desc_t){pbase[ar] + b * L.blk[ar], L.blk[ar], 0, 0};
                B.loff[k] = L.off[ar] + lb * L.blk[ar];
            }
        }
        int it = 5;
        pdx_xfer_h x;
        x = make(a, PDX_XFER_READ, PDX_MEM_VRAM, lv_d, pr_d, NARENA, NULL,
                 NULL);
        double r_ar = bench(x, L.total, it);
        pdx_xfer_release(x);
        x = make(a, PDX_XFER_WRITE, PDX_MEM_VRAM, lv_d, pr_d, NARENA, NULL,
                 NULL);
        double w_ar = bench(x, L.total, it);
        pdx_xfer_release(x);
        double tcb;
        x = make(a, PDX_XFER_READ, PDX_MEM_VRAM, B.local, B.remote, B.n, NULL,
                 &tcb);
        double r_bl = bench(x, L.total, it);
        pdx_xfer_release(x);
        x = make(a, PDX_XFER_WRITE, PDX_MEM_VRAM, B.local, B.remote, B.n, NULL,
                 NULL);
        double w_bl = bench(x, L.total, it);
        pdx_xfer_release(x);
        double r_dr = bench(xr_dram, L.total, it);
        x = make(a, PDX_XFER_WRITE, PDX_MEM_DRAM, hl_d, pr_d, NARENA, NULL,
                 NULL);
        double w_dr = bench(x, L.total, it);
        pdx_xfer_release(x);

        /* The limits, inside this process. For the "blocks" shape the
         * source is our own arenas at P's block order (same shape). */
        CUdeviceptr scratch;
        CK(cu.MemAlloc(&scratch, L.total));
        descs_t Bself = B;
        Bself.remote = calloc(B.n, sizeof(pdx_desc_t));
        for (size_t i = 0; i < B.n; i++) {
            Bself.remote[i] = B.local[i];
        }
        void *pinned;
        CK(cu.MemAllocHost(&pinned, L.total));
        double c_ar = bench_cu(0, scratch, 0, NULL, &L, NULL, it);
        double c_bl = bench_cu(1, scratch, 0, NULL, &L, &Bself, it);
        double c_dh = bench_cu(2, 0, 0, pinned, &L, NULL, it);
        double c_hd = bench_cu(3, 0, 0, pinned, &L, NULL, it);
        CK(cu.MemFreeHost(pinned));
        CK(cu.MemFree(scratch));
        free(Bself.remote);

        printf("\n[d] bandwidth, %zu B per transfer, best of %d (GB/s = 1e9 "
               "B/s)\n",
               L.total, it);
        printf("  %-34s %10s %10s   %-30s %8s\n", "shape", "pdx READ",
               "pdx WRITE", "limit in one process", "GB/s");
        printf("  %-34s %10.1f %10.1f   %-30s %8.1f\n",
               "VRAM<->VRAM, 101 arena descs", r_ar, w_ar,
               "cuMemcpyDtoDAsync x101", c_ar);
        char shape[64], lim[64];
        snprintf(shape, sizeof(shape), "VRAM<->VRAM, %zu block descs", B.n);
        snprintf(lim, sizeof(lim), "cuMemcpyDtoDAsync x%zu", B.n);
        printf("  %-34s %10.1f %10.1f   %-30s %8.1f\n", shape, r_bl, w_bl, lim,
               c_bl);
        printf("  %-34s %10.1f %10s   %-30s %8.1f\n",
               "P VRAM -> D pinned DRAM (READ)", r_dr, "-",
               "cuMemcpyDtoH pinned", c_dh);
        printf("  %-34s %10s %10.1f   %-30s %8.1f\n",
               "D pinned DRAM -> P VRAM (WRITE)", "-", w_dr,
               "cuMemcpyHtoD pinned", c_hd);
        printf("  (request of %zu block descriptors built in %.1f ms)\n\n", B.n,
               tcb * 1e3);
        fflush(stdout);
        free(B.local);
        free(B.remote);
        free(B.loff);
    }
    pdx_xfer_release(xr_dram);
    PK(pdx_mem_deregister(a, dreg));
    free(dram);
    free(hl_d);
    free(pr_d);
    free(lv_d);
    send_str(wfd, "DONE");
    pdx_agent_destroy(a);
    layout_free(&L);
    CK(cu.MemFreeHost(g_got));
    free(g_pat);
    free(g_exp);
    return g_fail ? 1 : 0;
}

/* ---- main ------------------------------------------------------------- */

static size_t gcd(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int main(int argc, char **argv)
{
    size_t mib = 1024;
    int one_alloc = 0, quick = 0, skip_no_gpu = 0, rfd = -1, wfd = -1;
    const char *role = "p";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            mib = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--alloc") == 0 && i + 1 < argc) {
            one_alloc = strcmp(argv[++i], "one") == 0;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--ucx-tls") == 0 && i + 1 < argc) {
            g_tls = argv[++i];
        } else if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            g_path = argv[++i];
        } else if (strcmp(argv[i], "--skip-without-gpu") == 0) {
            skip_no_gpu = 1;
        } else if (strcmp(argv[i], "--role") == 0 && i + 3 < argc) {
            role = argv[++i];
            rfd = atoi(argv[++i]);
            wfd = atoi(argv[++i]);
        } else {
            fprintf(stderr,
                    "usage: %s [--mib N] [--alloc arena|one] [--quick] "
                    "[--ucx-tls TLS] [--path cuda_ipc|ucx-staged|ucx-native] "
                    "[--skip-without-gpu]\n",
                    argv[0]);
            return 3;
        }
    }
    g_role = role;
    test_name = strcmp(role, "d") == 0 ? "cuda_ipc_gpu_test (D)"
                                       : "cuda_ipc_gpu_test (P)";
    setvbuf(stdout, NULL, _IOLBF, 0);
    char why[256];
    if (cu_load(why, sizeof(why)) != 0) {
        fprintf(stderr, "cuda_ipc_gpu_test: %s\n", why);
        return skip_no_gpu ? 77 : 3;
    }
    size_t bytes = mib << 20;
    if (gcd(7, bytes / PER_BLOCK) != 1) {
        bytes -= PER_BLOCK; /* keep the block permutation a bijection */
    }
    if (strcmp(role, "d") == 0) {
        return d_main(rfd, wfd, bytes, one_alloc, quick);
    }

    /* P: start D with a pipe each way. */
    int p2d[2], d2p[2];
    if (pipe(p2d) != 0 || pipe(d2p) != 0) {
        die_rc(3, "pipe: %s", strerror(errno));
    }
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0) {
        die_rc(3, "readlink /proc/self/exe: %s", strerror(errno));
    }
    self[sl] = '\0';
    pid_t pid = fork();
    if (pid == 0) {
        close(p2d[1]);
        close(d2p[0]);
        char rs[16], ws[16], ms[32];
        snprintf(rs, sizeof(rs), "%d", p2d[0]);
        snprintf(ws, sizeof(ws), "%d", d2p[1]);
        snprintf(ms, sizeof(ms), "%zu", mib);
        char *args[] = {self,
                        "--role",
                        "d",
                        rs,
                        ws,
                        "--mib",
                        ms,
                        "--alloc",
                        one_alloc ? "one" : "arena",
                        "--ucx-tls",
                        (char *)g_tls,
                        "--path",
                        (char *)g_path,
                        quick ? "--quick" : NULL,
                        NULL};
        execv(self, args);
        _exit(3);
    }
    close(p2d[0]);
    close(d2p[1]);
    signal(SIGPIPE, SIG_IGN);
    say("P pid %d, D pid %d, %zu MiB of KV arenas each (%s)", (int)getpid(),
        (int)pid, mib,
        one_alloc ? "one allocation"
                  : "one allocation per "
                    "arena");
    int prc = p_main(d2p[0], p2d[1], bytes, one_alloc);
    int status = 0;
    if (prc == 2) {
        kill(pid, SIGTERM);
    }
    waitpid(pid, &status, 0);
    int drc = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    if (prc == 2 || drc == 2) {
        fprintf(stderr, "cuda_ipc_gpu_test: CUDA IPC between processes is "
                        "refused on this machine (sandbox or container "
                        "without a shared IPC namespace / GPU access)\n");
        return 2;
    }
    int rc = prc ? prc : drc;
    printf("cuda_ipc_gpu_test: %s (P exit %d, D exit %d)\n",
           rc == 0 ? "all checks passed" : "FAILED", prc, drc);
    return rc;
}
