/* cuda_ipc: moves bytes between GPU memory of processes on one host through
 * CUDA IPC (legacy handles for cudaMalloc-style memory, POSIX fds for VMM
 * allocations), and between GPU memory and local pinned DRAM. Transfers are
 * async copies on a per-device stream pool; completion is tracked by
 * events. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <pdx/log.h>

#include "cuda_ipc_int.h"

#define CIPC_STREAMS_DEFAULT 4u
#define CIPC_STREAMS_MAX 64u /* one bit each in a uint64_t */
#define CIPC_PEER_NAME_MAX 64

typedef struct cipc_dev {
    CUdevice dev;
    uint8_t uuid[CIPC_UUID_LEN];
    char name[96];
    CUcontext ctx; /* retained primary context, NULL until first use */
    CUstream *streams;
    unsigned nstreams; /* created so far */
    unsigned next;     /* round-robin cursor */
    CUevent *pool;     /* idle events */
    size_t npool, cappool;
} cipc_dev_t;

typedef struct cipc_be {
    cu_api_t api;
    char host_id[CIPC_HOST_ID_MAX + 1];
    cipc_ident_t ident;
    unsigned streams_per_dev;
    int vmm; /* the driver has the VMM entry points */
    int ndev;
    cipc_dev_t *devs;
    uint8_t (*uuids)[CIPC_UUID_LEN]; /* uuids[i] of ordinal i */
    uint64_t *used;                  /* per-device stream bits, per post */
} cipc_be_t;

typedef struct cipc_md {
    pdx_mem_type_t type;
    uint64_t addr, len;
    int dev;    /* VRAM: ordinal; DRAM: -1 */
    int pinned; /* we cuMemHostRegister'd it */
    cipc_kind_t kind;
    uint64_t base, alloc_size;
    uint8_t handle[CIPC_HANDLE_LEN];
    int fd; /* exported VMM fd, or -1 */
} cipc_md_t;

/* One of a peer's allocations, opened here; cached until disconnect. */
typedef struct cipc_map {
    struct cipc_map *next;
    cipc_kind_t kind;
    int dev; /* local ordinal of its device */
    uint64_t remote_base, size;
    CUdeviceptr local_base;
    CUmemGenericAllocationHandle vmm_handle;
} cipc_map_t;

typedef struct cipc_peer {
    char name[CIPC_PEER_NAME_MAX];
    char host_id[CIPC_HOST_ID_MAX + 1];
    uint32_t pid;
    int self; /* this very process: its addresses are ours */
    cipc_map_t *maps;
    size_t nrmd;
} cipc_peer_t;

typedef struct cipc_rmd {
    cipc_peer_t *peer;
    uint64_t addr, len; /* in the peer's address space */
    int dev;            /* local ordinal whose context maps it */
    int host;           /* the peer's DRAM: loaded, but not reachable */
    CUdeviceptr ptr;    /* where `addr` is mapped here */
} cipc_rmd_t;

typedef struct cipc_evt {
    int dev;
    CUevent ev;
} cipc_evt_t;

typedef struct cipc_req {
    size_t nev; /* pending events, at the front of ev[] */
    pdx_status_t err;
    int aborted; /* complete as PDX_ERR_CANCELED */
    cipc_evt_t ev[];
} cipc_req_t;

/* ---- helpers ---------------------------------------------------------- */

static pdx_status_t cu_fail(cipc_be_t *be, CUresult r, const char *what)
{
    pdx_error("cuda_ipc: %s failed: %s", what, cu_err_name(&be->api, r));
    pdx_status_t st = cu_status(r);
    return st < 0 ? st : PDX_ERR_BACKEND;
}

static pdx_status_t dev_ctx(cipc_be_t *be, int d)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->ctx == NULL) {
        CUresult r = be->api.DevicePrimaryCtxRetain(&dv->ctx, dv->dev);
        if (r != CUDA_SUCCESS) {
            dv->ctx = NULL;
            return cu_fail(be, r, "cuDevicePrimaryCtxRetain");
        }
    }
    return PDX_OK;
}

/* Make device d's primary context current on this thread, keeping whatever
 * the caller had current underneath (push/pop). */
static pdx_status_t dev_enter(cipc_be_t *be, int d)
{
    pdx_status_t st = dev_ctx(be, d);
    if (st != PDX_OK) {
        return st;
    }
    CUresult r = be->api.CtxPushCurrent(be->devs[d].ctx);
    return r == CUDA_SUCCESS ? PDX_OK : cu_fail(be, r, "cuCtxPushCurrent");
}

static void dev_leave(cipc_be_t *be)
{
    CUcontext old;
    be->api.CtxPopCurrent(&old);
}

/* Next stream of the pool, round-robin; created lazily. Context of d must
 * be current. */
static pdx_status_t dev_stream(cipc_be_t *be, int d, unsigned *idx_p,
                               CUstream *s_p)
{
    cipc_dev_t *dv = &be->devs[d];
    unsigned i = dv->next;
    dv->next = (dv->next + 1) % be->streams_per_dev;
    if (i >= dv->nstreams) {
        i = dv->nstreams; /* fill the pool in order */
        CUresult r =
            be->api.StreamCreate(&dv->streams[i], CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            return cu_fail(be, r, "cuStreamCreate");
        }
        dv->nstreams++;
    }
    *idx_p = i;
    *s_p = dv->streams[i];
    return PDX_OK;
}

static pdx_status_t dev_event_get(cipc_be_t *be, int d, CUevent *ev_p)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->npool > 0) {
        *ev_p = dv->pool[--dv->npool];
        return PDX_OK;
    }
    CUresult r = be->api.EventCreate(ev_p, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? PDX_OK : cu_fail(be, r, "cuEventCreate");
}

/* Return an idle event to the pool (context of d current). */
static void dev_event_put(cipc_be_t *be, int d, CUevent ev)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->npool == dv->cappool) {
        size_t cap = dv->cappool ? dv->cappool * 2 : 16;
        CUevent *p = realloc(dv->pool, cap * sizeof(*p));
        if (p == NULL) {
            be->api.EventDestroy(ev);
            return;
        }
        dv->pool = p;
        dv->cappool = cap;
    }
    dv->pool[dv->npool++] = ev;
}

static int in_range(uint64_t a, uint64_t len, uint64_t base, uint64_t blen)
{
    return a >= base && len <= blen && a - base <= blen - len;
}

/* ---- process identity ------------------------------------------------- */

/* The one piece of process-wide state: a random token drawn once, so two
 * processes that share a pid number (pid namespaces) are told apart. It is
 * written once under pthread_once and read-only after. */
static pthread_once_t g_token_once = PTHREAD_ONCE_INIT;
static uint64_t g_token;

static void token_init(void)
{
    uint64_t t = 0;
    if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
            ((uint64_t)getpid() << 16);
    }
    g_token = t ? t : 1;
}

void cipc_self_ident(cipc_ident_t *ident)
{
    pthread_once(&g_token_once, token_init);
    ident->pid = getpid();
    ident->token = g_token;
}

/* ---- query / create / destroy ----------------------------------------- */

pdx_status_t cipc_op_query(char *why, size_t why_len)
{
    char local[128];
    if (why == NULL || why_len == 0) {
        why = local;
        why_len = sizeof(local);
    }
    why[0] = '\0';
    cu_api_t api;
    pdx_status_t st = cu_api_load(&api, why, why_len);
    if (st != PDX_OK) {
        return st;
    }
    /* The library stays loaded: cuInit may have started driver threads. */
    st = cu_api_init(&api, NULL, why, why_len);
    if (st == PDX_OK) {
        why[0] = '\0';
    }
    return st;
}

pdx_status_t cipc_op_create(const pdx_backend_host_t *host,
                            const pdx_kv_t *opts, size_t nopts, void **be_p)
{
    char why[128];
    cu_api_t api;
    pdx_status_t st = cu_api_load(&api, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_info("cuda_ipc: unavailable: %s", why);
        return st;
    }
    return cipc_create_with_api(host, opts, nopts, &api, NULL, be_p);
}

static pdx_status_t parse_opts(cipc_be_t *be, const pdx_kv_t *opts,
                               size_t nopts)
{
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key, *v = opts[i].value;
        if (k == NULL || v == NULL) {
            pdx_error("cuda_ipc: option %zu has no key or value", i);
            return PDX_ERR_CONFIG;
        }
        if (strcmp(k, "streams") == 0) {
            char *end;
            errno = 0;
            unsigned long n = strtoul(v, &end, 10);
            if (errno != 0 || end == v || *end != '\0' || n < 1 ||
                n > CIPC_STREAMS_MAX) {
                pdx_error("cuda_ipc: option streams=%s: want 1..%u", v,
                          CIPC_STREAMS_MAX);
                return PDX_ERR_CONFIG;
            }
            be->streams_per_dev = (unsigned)n;
        } else {
            pdx_error("cuda_ipc: unknown option '%s' (known: streams)", k);
            return PDX_ERR_CONFIG;
        }
    }
    return PDX_OK;
}

pdx_status_t cipc_create_with_api(const pdx_backend_host_t *host,
                                  const pdx_kv_t *opts, size_t nopts,
                                  const cu_api_t *api,
                                  const cipc_ident_t *ident, void **be_p)
{
    pdx_status_t st;
    char why[128];
    const char *hid = host != NULL ? host->host_id : NULL;
    if (hid == NULL || hid[0] == '\0' || strlen(hid) > CIPC_HOST_ID_MAX) {
        pdx_error("cuda_ipc: the agent gave no usable host id (need 1..%d "
                  "bytes); cannot tell which peers share this host",
                  CIPC_HOST_ID_MAX);
        return PDX_ERR_INVALID;
    }
    cipc_be_t *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return PDX_ERR_NOMEM;
    }
    be->api = *api;
    snprintf(be->host_id, sizeof(be->host_id), "%s", hid);
    if (ident != NULL) {
        be->ident = *ident;
    } else {
        cipc_self_ident(&be->ident);
    }
    be->streams_per_dev = CIPC_STREAMS_DEFAULT;
    be->vmm = cu_api_has_vmm(&be->api);
    st = parse_opts(be, opts, nopts);
    if (st != PDX_OK) {
        goto err_free;
    }
    int count = 0;
    st = cu_api_init(&be->api, &count, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_info("cuda_ipc: unavailable: %s", why);
        goto err_free;
    }
    if (count > CIPC_MAX_DEVICES) {
        pdx_warn("cuda_ipc: %d devices visible; using the first %d", count,
                 CIPC_MAX_DEVICES);
        count = CIPC_MAX_DEVICES;
    }
    be->ndev = count;
    be->devs = calloc((size_t)count, sizeof(*be->devs));
    be->uuids = calloc((size_t)count, sizeof(*be->uuids));
    be->used = calloc((size_t)count, sizeof(*be->used));
    if (be->devs == NULL || be->uuids == NULL || be->used == NULL) {
        st = PDX_ERR_NOMEM;
        goto err_arrays;
    }
    for (int i = 0; i < count; i++) {
        cipc_dev_t *dv = &be->devs[i];
        CUuuid u;
        CUresult r = be->api.DeviceGet(&dv->dev, i);
        if (r == CUDA_SUCCESS) {
            r = be->api.DeviceGetUuid(&u, dv->dev);
        }
        if (r != CUDA_SUCCESS) {
            st = cu_fail(be, r, "cuDeviceGet/cuDeviceGetUuid");
            goto err_arrays;
        }
        memcpy(dv->uuid, u.bytes, CIPC_UUID_LEN);
        memcpy(be->uuids[i], u.bytes, CIPC_UUID_LEN);
        if (be->api.DeviceGetName(dv->name, (int)sizeof(dv->name), dv->dev) !=
            CUDA_SUCCESS) {
            snprintf(dv->name, sizeof(dv->name), "?");
        }
        dv->streams = calloc(be->streams_per_dev, sizeof(CUstream));
        if (dv->streams == NULL) {
            st = PDX_ERR_NOMEM;
            goto err_arrays;
        }
    }
    pdx_debug("cuda_ipc: %d device(s), %u streams each, vmm %s", count,
              be->streams_per_dev, be->vmm ? "yes" : "no");
    *be_p = be;
    return PDX_OK;

err_arrays:
    if (be->devs != NULL) {
        for (int i = 0; i < count; i++) {
            free(be->devs[i].streams);
        }
    }
    free(be->used);
    free(be->uuids);
    free(be->devs);
err_free:
    free(be);
    return st;
}

void cipc_op_destroy(void *be_)
{
    cipc_be_t *be = be_;
    if (be == NULL) {
        return;
    }
    for (int d = 0; d < be->ndev; d++) {
        cipc_dev_t *dv = &be->devs[d];
        if (dv->ctx != NULL &&
            be->api.CtxPushCurrent(dv->ctx) == CUDA_SUCCESS) {
            for (size_t i = 0; i < dv->npool; i++) {
                be->api.EventDestroy(dv->pool[i]);
            }
            for (unsigned i = 0; i < dv->nstreams; i++) {
                be->api.StreamDestroy(dv->streams[i]);
            }
            dev_leave(be);
            be->api.DevicePrimaryCtxRelease(dv->dev);
        }
        free(dv->pool);
        free(dv->streams);
    }
    /* libcuda stays loaded on purpose (see cu_api_load). */
    free(be->used);
    free(be->uuids);
    free(be->devs);
    free(be);
}

pdx_status_t cipc_op_conn_info(void *be_, void **buf_p, size_t *len_p)
{
    cipc_be_t *be = be_;
    cipc_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    snprintf(c->host_id, sizeof(c->host_id), "%s", be->host_id);
    c->pid = (uint32_t)be->ident.pid;
    c->token = be->ident.token;
    c->ndev = (uint16_t)be->ndev;
    memcpy(c->uuid, be->uuids, (size_t)be->ndev * CIPC_UUID_LEN);
    pdx_status_t st = cipc_conn_encode(c, buf_p, len_p);
    free(c);
    return st;
}

/* ---- registration ----------------------------------------------------- */

static pdx_status_t reg_dram(cipc_be_t *be, const pdx_region_t *rg,
                             cipc_md_t *md)
{
    if (!(rg->flags & PDX_REGION_F_PIN)) {
        return PDX_OK;
    }
    /* Page-locked so copies to and from GPUs are DMA at PCIe speed;
     * portable so every context sees it as pinned. */
    pdx_status_t st = dev_enter(be, 0);
    if (st != PDX_OK) {
        return st;
    }
    CUresult r =
        be->api.MemHostRegister((void *)(uintptr_t)rg->addr, (size_t)rg->len,
                                CU_MEMHOSTREGISTER_PORTABLE);
    dev_leave(be);
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        pdx_debug("cuda_ipc: DRAM 0x%" PRIx64 " already pinned by its owner",
                  rg->addr);
        return PDX_OK;
    }
    if (r != CUDA_SUCCESS) {
        pdx_error("cuda_ipc: pinning DRAM 0x%" PRIx64 "+%" PRIu64
                  " failed: %s (RLIMIT_MEMLOCK?)",
                  rg->addr, rg->len, cu_err_name(&be->api, r));
        st = cu_status(r);
        return st < 0 ? st : PDX_ERR_BACKEND;
    }
    md->pinned = 1;
    return PDX_OK;
}

/* Export a VMM allocation as a POSIX fd the peer fetches with pidfd_getfd. */
static pdx_status_t export_vmm(cipc_be_t *be, cipc_md_t *md)
{
    CUmemGenericAllocationHandle h;
    CUresult r =
        be->api.MemRetainAllocationHandle(&h, (void *)(uintptr_t)md->base);
    if (r != CUDA_SUCCESS) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " is neither cudaMalloc-style "
                  "nor a VMM allocation (%s); cannot share it",
                  md->addr, cu_err_name(&be->api, r));
        return PDX_ERR_UNSUPPORTED;
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    r = be->api.MemGetAllocationPropertiesFromHandle(&prop, h);
    if (r == CUDA_SUCCESS && !(prop.requestedHandleTypes &
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        be->api.MemRelease(h);
        pdx_error("cuda_ipc: VMM allocation at 0x%" PRIx64 " was not created "
                  "shareable as a POSIX fd (requestedHandleTypes 0x%x)",
                  md->base, (unsigned)prop.requestedHandleTypes);
        return PDX_ERR_UNSUPPORTED;
    }
    int fd = -1;
    if (r == CUDA_SUCCESS) {
        r = be->api.MemExportToShareableHandle(
            &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    }
    /* The exported fd keeps its own reference to the allocation. */
    be->api.MemRelease(h);
    if (r != CUDA_SUCCESS) {
        return cu_fail(be, r, "cuMemExportToShareableHandle");
    }
    md->fd = fd;
    md->kind = CIPC_KIND_VMM_FD;
    return PDX_OK;
}

static pdx_status_t reg_vram(cipc_be_t *be, const pdx_region_t *rg,
                             cipc_md_t *md)
{
    if (rg->dev_id >= (uint32_t)be->ndev) {
        pdx_error("cuda_ipc: VRAM region on device %u, only %d visible",
                  rg->dev_id, be->ndev);
        return PDX_ERR_INVALID;
    }
    int d = (int)rg->dev_id;
    pdx_status_t st = dev_enter(be, d);
    if (st != PDX_OK) {
        return st;
    }
    CUdeviceptr p = (CUdeviceptr)rg->addr;
    unsigned int mtype = 0;
    int ordinal = -1, legacy = 1;
    CUresult r = be->api.PointerGetAttribute(
        &mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r != CUDA_SUCCESS || mtype != CU_MEMORYTYPE_DEVICE) {
        pdx_error("cuda_ipc: 0x%" PRIx64 " is not device memory (%s)", rg->addr,
                  r ? cu_err_name(&be->api, r) : "host memory");
        st = PDX_ERR_INVALID;
        goto out;
    }
    r = be->api.PointerGetAttribute(&ordinal,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    if (r != CUDA_SUCCESS) {
        st = cu_fail(be, r, "cuPointerGetAttribute(DEVICE_ORDINAL)");
        goto out;
    }
    if (ordinal != d) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " registered as device %d "
                  "lives on device %d",
                  rg->addr, d, ordinal);
        st = PDX_ERR_INVALID;
        goto out;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    r = be->api.MemGetAddressRange(&base, &size, p);
    if (r != CUDA_SUCCESS) {
        st = cu_fail(be, r, "cuMemGetAddressRange");
        goto out;
    }
    if (be->api.PointerGetAttribute(
            &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) !=
        CUDA_SUCCESS) {
        legacy = 1; /* old driver: try and let cuIpcGetMemHandle say */
    }
    if (!legacy) {
        /* A VMM mapping: its start is offset 0 of the physical allocation
         * (cuMemMap takes offset 0 only). */
        CUdeviceptr mbase = 0;
        size_t msize = 0;
        if (be->api.PointerGetAttribute(&mbase,
                                        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                        p) == CUDA_SUCCESS &&
            be->api.PointerGetAttribute(
                &msize, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p) == CUDA_SUCCESS &&
            msize != 0) {
            base = mbase;
            size = msize;
        }
    }
    if (!in_range(rg->addr, rg->len, base, size)) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 "+%" PRIu64 " spans more than "
                  "one allocation (0x%llx+%zu); register per allocation",
                  rg->addr, rg->len, (unsigned long long)base, size);
        st = PDX_ERR_UNSUPPORTED;
        goto out;
    }
    md->base = base;
    md->alloc_size = size;
    if (legacy) {
        CUipcMemHandle h;
        r = be->api.IpcGetMemHandle(&h, base);
        if (r != CUDA_SUCCESS) {
            st = cu_fail(be, r, "cuIpcGetMemHandle");
            goto out;
        }
        memcpy(md->handle, h.reserved, CIPC_HANDLE_LEN);
        md->kind = CIPC_KIND_LEGACY;
    } else if (be->vmm) {
        st = export_vmm(be, md);
    } else {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " is not legacy-IPC capable "
                  "and the driver lacks the VMM API",
                  rg->addr);
        st = PDX_ERR_UNSUPPORTED;
    }
out:
    dev_leave(be);
    return st;
}

pdx_status_t cipc_op_mem_register(void *be_, const pdx_region_t *rg,
                                  void **md_p)
{
    cipc_be_t *be = be_;
    if (rg == NULL || rg->len == 0 || rg->addr == 0 ||
        rg->addr + rg->len < rg->addr) {
        return PDX_ERR_INVALID;
    }
    if (rg->mem_type != PDX_MEM_DRAM && rg->mem_type != PDX_MEM_VRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    cipc_md_t *md = calloc(1, sizeof(*md));
    if (md == NULL) {
        return PDX_ERR_NOMEM;
    }
    md->type = rg->mem_type;
    md->addr = rg->addr;
    md->len = rg->len;
    md->fd = -1;
    md->dev = -1;
    md->kind = CIPC_KIND_HOST;
    md->base = rg->addr;
    md->alloc_size = rg->len;
    pdx_status_t st;
    if (rg->mem_type == PDX_MEM_DRAM) {
        st = reg_dram(be, rg, md);
    } else {
        md->dev = (int)rg->dev_id;
        st = reg_vram(be, rg, md);
    }
    if (st != PDX_OK) {
        free(md);
        return st;
    }
    *md_p = md;
    return PDX_OK;
}

void cipc_op_mem_deregister(void *be_, void *md_)
{
    cipc_be_t *be = be_;
    cipc_md_t *md = md_;
    if (md == NULL) {
        return;
    }
    if (md->pinned && dev_enter(be, 0) == PDX_OK) {
        CUresult r = be->api.MemHostUnregister((void *)(uintptr_t)md->addr);
        if (r != CUDA_SUCCESS) {
            pdx_warn("cuda_ipc: cuMemHostUnregister 0x%" PRIx64 ": %s",
                     md->addr, cu_err_name(&be->api, r));
        }
        dev_leave(be);
    }
    if (md->fd >= 0) {
        close(md->fd);
    }
    free(md);
}

pdx_status_t cipc_op_mem_pack(void *be_, void *md_, void **buf_p, size_t *len_p)
{
    cipc_be_t *be = be_;
    cipc_md_t *md = md_;
    cipc_key_t k;
    memset(&k, 0, sizeof(k));
    k.kind = (uint16_t)md->kind;
    if (md->dev >= 0) {
        memcpy(k.uuid, be->uuids[md->dev], CIPC_UUID_LEN);
    }
    k.pid = (uint32_t)be->ident.pid;
    k.fd = md->fd;
    k.base = md->base;
    k.alloc_size = md->alloc_size;
    k.offset = md->addr - md->base;
    k.len = md->len;
    memcpy(k.handle, md->handle, CIPC_HANDLE_LEN);
    snprintf(k.host_id, sizeof(k.host_id), "%s", be->host_id);
    return cipc_key_encode(&k, buf_p, len_p);
}

/* ---- peers ------------------------------------------------------------ */

pdx_status_t cipc_op_peer_connect(void *be_, const char *peer_name,
                                  const void *conn, size_t conn_len,
                                  void **peer_p)
{
    cipc_be_t *be = be_;
    const char *pname = peer_name != NULL ? peer_name : "?";
    char why[96];
    cipc_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = cipc_conn_decode(conn, conn_len, c, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("cuda_ipc: peer %s: bad conn info: %s", pname, why);
        goto out;
    }
    if (!cipc_same_host(be->host_id, c->host_id)) {
        pdx_debug("cuda_ipc: peer %s is on host %s, not %s: declined", pname,
                  c->host_id, be->host_id);
        st = PDX_ERR_UNSUPPORTED;
        goto out;
    }
    /* Devices of the peer that this process sees too. None is fine: with
     * one GPU per DP rank, P's and D's GPUs differ, and their memory is
     * reached through peer access (see rmem_load). */
    int visible = 0;
    for (uint16_t i = 0; i < c->ndev; i++) {
        visible +=
            cipc_uuid_to_ordinal((const uint8_t(*)[CIPC_UUID_LEN])be->uuids,
                                 (size_t)be->ndev, c->uuid[i]) >= 0;
    }
    cipc_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    snprintf(p->name, sizeof(p->name), "%s", pname);
    snprintf(p->host_id, sizeof(p->host_id), "%s", c->host_id);
    p->pid = c->pid;
    p->self = c->pid == (uint32_t)be->ident.pid && c->token == be->ident.token;
    pdx_debug("cuda_ipc: peer %s: pid %u%s, %d of %u device(s) visible", pname,
              c->pid, p->self ? " (this process)" : "", visible, c->ndev);
    *peer_p = p;
out:
    free(c);
    return st;
}

static void map_close(cipc_be_t *be, cipc_map_t *m)
{
    if (dev_enter(be, m->dev) != PDX_OK) {
        return;
    }
    CUresult r;
    if (m->kind == CIPC_KIND_LEGACY) {
        r = be->api.IpcCloseMemHandle(m->local_base);
        if (r != CUDA_SUCCESS) {
            pdx_warn("cuda_ipc: cuIpcCloseMemHandle: %s",
                     cu_err_name(&be->api, r));
        }
    } else {
        be->api.MemUnmap(m->local_base, (size_t)m->size);
        be->api.MemAddressFree(m->local_base, (size_t)m->size);
        be->api.MemRelease(m->vmm_handle);
    }
    dev_leave(be);
}

void cipc_op_peer_disconnect(void *be_, void *peer_)
{
    cipc_be_t *be = be_;
    cipc_peer_t *p = peer_;
    if (p == NULL) {
        return;
    }
    if (p->nrmd != 0) {
        pdx_warn("cuda_ipc: peer %s disconnected with %zu region(s) loaded",
                 p->name, p->nrmd);
    }
    while (p->maps != NULL) {
        cipc_map_t *m = p->maps;
        p->maps = m->next;
        map_close(be, m);
        free(m);
    }
    free(p);
}

/* Open a peer's VMM allocation: fetch its fd, import, map, grant access. */
static pdx_status_t open_vmm(cipc_be_t *be, cipc_peer_t *p, const cipc_key_t *k,
                             cipc_map_t *m)
{
    if (!be->vmm) {
        pdx_error("cuda_ipc: peer %s shares VMM memory; this driver lacks "
                  "the VMM API",
                  p->name);
        return PDX_ERR_UNSUPPORTED;
    }
    int fd = be->api.peer_fd((pid_t)k->pid, k->fd);
    if (fd < 0) {
        int e = errno;
        pdx_error("cuda_ipc: peer %s: pidfd_getfd(pid %u, fd %d): %s%s",
                  p->name, k->pid, k->fd, strerror(e),
                  e == EPERM   ? " (needs ptrace permission over the peer: "
                                 "same user and kernel.yama.ptrace_scope 0, "
                                 "or the peer calling prctl(PR_SET_PTRACER))"
                  : e == ESRCH ? " (peer in another pid namespace?)"
                               : "");
        return e == EPERM ? PDX_ERR_UNSUPPORTED : PDX_ERR_IO;
    }
    CUmemGenericAllocationHandle h;
    CUresult r = be->api.MemImportFromShareableHandle(
        &h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS) {
        return cu_fail(be, r, "cuMemImportFromShareableHandle");
    }
    CUdeviceptr va = 0;
    size_t size = (size_t)k->alloc_size;
    r = be->api.MemAddressReserve(&va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        be->api.MemRelease(h);
        return cu_fail(be, r, "cuMemAddressReserve");
    }
    r = be->api.MemMap(va, size, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        be->api.MemAddressFree(va, size);
        be->api.MemRelease(h);
        return cu_fail(be, r, "cuMemMap");
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = m->dev; /* an ordinal, as CUmemLocation wants */
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = be->api.MemSetAccess(va, size, &acc, 1);
    if (r != CUDA_SUCCESS) {
        be->api.MemUnmap(va, size);
        be->api.MemAddressFree(va, size);
        be->api.MemRelease(h);
        return cu_fail(be, r, "cuMemSetAccess");
    }
    m->local_base = va;
    m->vmm_handle = h;
    return PDX_OK;
}

/* The peer's allocation behind `k`, opened once and cached. */
static pdx_status_t peer_map(cipc_be_t *be, cipc_peer_t *p, const cipc_key_t *k,
                             int dev, cipc_map_t **m_p)
{
    for (cipc_map_t *m = p->maps; m != NULL; m = m->next) {
        if (m->kind == (cipc_kind_t)k->kind && m->dev == dev &&
            m->remote_base == k->base) {
            if (m->size != k->alloc_size) {
                pdx_error("cuda_ipc: peer %s: allocation 0x%" PRIx64
                          " changed size (%" PRIu64 " -> %" PRIu64
                          "); reload the peer",
                          p->name, k->base, m->size, k->alloc_size);
                return PDX_ERR_STALE;
            }
            *m_p = m;
            return PDX_OK;
        }
    }
    cipc_map_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->kind = (cipc_kind_t)k->kind;
    m->dev = dev;
    m->remote_base = k->base;
    m->size = k->alloc_size;
    pdx_status_t st = dev_enter(be, dev);
    if (st != PDX_OK) {
        free(m);
        return st;
    }
    if (m->kind == CIPC_KIND_LEGACY) {
        CUipcMemHandle h;
        memcpy(h.reserved, k->handle, CIPC_HANDLE_LEN);
        CUresult r = be->api.IpcOpenMemHandle(
            &m->local_base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != CUDA_SUCCESS) {
            pdx_error("cuda_ipc: peer %s: cuIpcOpenMemHandle failed: %s "
                      "(CUDA IPC refused between these processes?)",
                      p->name, cu_err_name(&be->api, r));
            st = cu_status(r);
            st = st < 0 ? st : PDX_ERR_BACKEND;
        }
    } else {
        st = open_vmm(be, p, k, m);
    }
    dev_leave(be);
    if (st != PDX_OK) {
        free(m);
        return st;
    }
    m->next = p->maps;
    p->maps = m;
    *m_p = m;
    return PDX_OK;
}

pdx_status_t cipc_op_rmem_load(void *be_, void *peer_, const pdx_region_t *rg,
                               const void *key, size_t key_len, void **rmd_p)
{
    cipc_be_t *be = be_;
    cipc_peer_t *p = peer_;
    char why[96];
    cipc_key_t k;
    pdx_status_t st = cipc_key_decode(key, key_len, &k, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("cuda_ipc: peer %s: bad region key: %s", p->name, why);
        return st;
    }
    if (k.pid != p->pid || strcmp(k.host_id, p->host_id) != 0) {
        pdx_error("cuda_ipc: peer %s: region key from pid %u on %s, but the "
                  "peer is pid %u on %s",
                  p->name, k.pid, k.host_id, p->pid, p->host_id);
        return PDX_ERR_INVALID;
    }
    pdx_mem_type_t want =
        k.kind == CIPC_KIND_HOST ? PDX_MEM_DRAM : PDX_MEM_VRAM;
    if (rg != NULL && (rg->mem_type != want || rg->addr != k.base + k.offset ||
                       rg->len != k.len)) {
        pdx_error("cuda_ipc: peer %s: region 0x%" PRIx64 "+%" PRIu64
                  " does not match its key 0x%" PRIx64 "+%" PRIu64,
                  p->name, rg->addr, rg->len, k.base + k.offset, k.len);
        return PDX_ERR_INVALID;
    }
    cipc_rmd_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return PDX_ERR_NOMEM;
    }
    r->peer = p;
    r->addr = k.base + k.offset;
    r->len = k.len;
    if (k.kind == CIPC_KIND_HOST) {
        /* The peer's DRAM is not reachable through CUDA IPC. Loading it
         * still succeeds: the agent loads every key of a peer and fails the
         * whole peer on an error, though UCX reaches this region fine.
         * A transfer that uses it here fails with PDX_ERR_UNSUPPORTED. */
        r->host = 1;
        r->dev = -1;
        p->nrmd++;
        *rmd_p = r;
        return PDX_OK;
    }
    int dev = cipc_uuid_to_ordinal((const uint8_t(*)[CIPC_UUID_LEN])be->uuids,
                                   (size_t)be->ndev, k.uuid);
    if (dev < 0) {
        /* Not visible here (CUDA_VISIBLE_DEVICES differs, e.g. one GPU per
         * DP rank): open it from device 0, through peer access (NVLink or
         * PCIe P2P); cuIpcOpenMemHandle enables it lazily. */
        char u[48];
        cipc_uuid_format(k.uuid, u, sizeof(u));
        pdx_info("cuda_ipc: peer %s: region on %s, not visible here; "
                 "reaching it from device 0 through peer access",
                 p->name, u);
        dev = 0;
    }
    r->dev = dev;
    if (p->self) {
        /* Same process: the peer's addresses are ours. Its ordinals are
         * ours too, and dev_ctx makes sure the context exists. */
        st = dev_ctx(be, dev);
        r->ptr = (CUdeviceptr)r->addr;
    } else {
        cipc_map_t *m;
        st = peer_map(be, p, &k, dev, &m);
        if (st == PDX_OK) {
            r->ptr = m->local_base + (CUdeviceptr)k.offset;
        }
    }
    if (st != PDX_OK) {
        free(r);
        return st;
    }
    p->nrmd++;
    *rmd_p = r;
    return PDX_OK;
}

void cipc_op_rmem_unload(void *be_, void *rmd_)
{
    cipc_rmd_t *r = rmd_;
    if (r == NULL) {
        return;
    }
    /* The mapping stays cached on the peer until it disconnects. */
    r->peer->nrmd--;
    free(r);
}

/* ---- transfers -------------------------------------------------------- */

static CUresult copy_one(cipc_be_t *be, pdx_xfer_op_t op, const cipc_md_t *l,
                         const cipc_rmd_t *r, uint64_t laddr, CUdeviceptr rptr,
                         size_t len, CUstream s)
{
    const cu_api_t *a = &be->api;
    if (l->type == PDX_MEM_DRAM) {
        void *h = (void *)(uintptr_t)laddr;
        return op == PDX_XFER_READ ? a->MemcpyDtoHAsync(h, rptr, len, s)
                                   : a->MemcpyHtoDAsync(rptr, h, len, s);
    }
    CUdeviceptr lp = (CUdeviceptr)laddr;
    if (l->dev == r->dev) {
        return op == PDX_XFER_READ ? a->MemcpyDtoDAsync(lp, rptr, len, s)
                                   : a->MemcpyDtoDAsync(rptr, lp, len, s);
    }
    CUcontext lc = be->devs[l->dev].ctx, rc = be->devs[r->dev].ctx;
    return op == PDX_XFER_READ ? a->MemcpyPeerAsync(lp, lc, rptr, rc, len, s)
                               : a->MemcpyPeerAsync(rptr, rc, lp, lc, len, s);
}

/* Wait for every stream marked in be->used (error path of post: nothing
 * may stay in flight). */
static void sync_used(cipc_be_t *be)
{
    for (int d = 0; d < be->ndev; d++) {
        if (be->used[d] == 0 || dev_enter(be, d) != PDX_OK) {
            continue;
        }
        for (unsigned i = 0; i < be->devs[d].nstreams; i++) {
            if (be->used[d] & (1ull << i)) {
                be->api.StreamSynchronize(be->devs[d].streams[i]);
            }
        }
        dev_leave(be);
    }
}

pdx_status_t cipc_op_xfer_post(void *be_, void *peer_, pdx_xfer_op_t op,
                               const pdx_backend_iov_t *iov, size_t n,
                               const void *notif, size_t notif_len,
                               void **req_p)
{
    cipc_be_t *be = be_;
    cipc_peer_t *peer = peer_;
    (void)notif; /* no CAP_NOTIF: the agent sends it after completion */
    (void)notif_len;
    if (op != PDX_XFER_READ && op != PDX_XFER_WRITE) {
        return PDX_ERR_INVALID;
    }
    memset(be->used, 0, (size_t)be->ndev * sizeof(*be->used));
    pdx_status_t st = PDX_OK;
    int cur = -1;
    size_t pos = 0, nruns = 0;
    pdx_backend_iov_t run;
    while (cipc_iov_next(iov, n, &pos, &run)) {
        const cipc_md_t *l = run.local_md;
        const cipc_rmd_t *r = run.remote_md;
        if (l == NULL || r == NULL || r->peer != peer) {
            pdx_error("cuda_ipc: piece %zu has no region of this peer", nruns);
            st = PDX_ERR_INVALID;
            break;
        }
        if (r->host) {
            pdx_error("cuda_ipc: peer %s: its DRAM at 0x%" PRIx64
                      " is not reachable through CUDA IPC",
                      peer->name, run.remote_addr);
            st = PDX_ERR_UNSUPPORTED;
            break;
        }
        if (!in_range(run.local_addr, run.len, l->addr, l->len) ||
            !in_range(run.remote_addr, run.len, r->addr, r->len)) {
            pdx_error("cuda_ipc: piece 0x%" PRIx64 "/0x%" PRIx64 "+%" PRIu64
                      " lies outside its regions",
                      run.local_addr, run.remote_addr, run.len);
            st = PDX_ERR_INVALID;
            break;
        }
        /* The copy runs on the local GPU's streams, or on the peer GPU's
         * when the local side is DRAM. */
        int d = l->type == PDX_MEM_VRAM ? l->dev : r->dev;
        if (d != cur) {
            if (cur >= 0) {
                dev_leave(be);
            }
            cur = -1;
            st = dev_enter(be, d);
            if (st != PDX_OK) {
                break;
            }
            cur = d;
        }
        if (l->type == PDX_MEM_VRAM && l->dev != r->dev) {
            st = dev_ctx(be, r->dev); /* cuMemcpyPeerAsync names both */
            if (st != PDX_OK) {
                break;
            }
        }
        unsigned si;
        CUstream s;
        st = dev_stream(be, d, &si, &s);
        if (st != PDX_OK) {
            break;
        }
        CUdeviceptr rptr = r->ptr + (CUdeviceptr)(run.remote_addr - r->addr);
        CUresult cr =
            copy_one(be, op, l, r, run.local_addr, rptr, (size_t)run.len, s);
        if (cr != CUDA_SUCCESS) {
            st = cu_fail(be, cr, "async copy");
            break;
        }
        be->used[d] |= 1ull << si;
        nruns++;
    }
    if (cur >= 0) {
        dev_leave(be);
    }
    if (st != PDX_OK) {
        sync_used(be);
        return st;
    }
    if (nruns == 0) {
        return PDX_OK;
    }
    size_t nev = 0;
    for (int d = 0; d < be->ndev; d++) {
        nev += (size_t)__builtin_popcountll(be->used[d]);
    }
    cipc_req_t *req = malloc(sizeof(*req) + nev * sizeof(req->ev[0]));
    if (req == NULL) {
        sync_used(be);
        return PDX_ERR_NOMEM;
    }
    req->nev = 0;
    req->err = PDX_OK;
    req->aborted = 0;
    for (int d = 0; d < be->ndev && st == PDX_OK; d++) {
        if (be->used[d] == 0) {
            continue;
        }
        st = dev_enter(be, d);
        if (st != PDX_OK) {
            break;
        }
        for (unsigned i = 0; i < be->devs[d].nstreams && st == PDX_OK; i++) {
            if (!(be->used[d] & (1ull << i))) {
                continue;
            }
            CUevent ev;
            st = dev_event_get(be, d, &ev);
            if (st != PDX_OK) {
                break;
            }
            CUresult cr = be->api.EventRecord(ev, be->devs[d].streams[i]);
            if (cr != CUDA_SUCCESS) {
                dev_event_put(be, d, ev);
                st = cu_fail(be, cr, "cuEventRecord");
                break;
            }
            req->ev[req->nev].dev = d;
            req->ev[req->nev].ev = ev;
            req->nev++;
        }
        dev_leave(be);
    }
    if (st != PDX_OK) {
        sync_used(be);
        cipc_op_xfer_release(be, req);
        return st;
    }
    *req_p = req;
    return PDX_INPROGRESS;
}

pdx_status_t cipc_op_xfer_check(void *be_, void *req_)
{
    cipc_be_t *be = be_;
    cipc_req_t *req = req_;
    size_t i = 0;
    int cur = -1;
    while (i < req->nev && req->err == PDX_OK) {
        cipc_evt_t *e = &req->ev[i];
        if (e->dev != cur) {
            if (cur >= 0) {
                dev_leave(be);
            }
            cur = -1;
            if (dev_enter(be, e->dev) != PDX_OK) {
                req->err = PDX_ERR_BACKEND;
                break;
            }
            cur = e->dev;
        }
        CUresult r = be->api.EventQuery(e->ev);
        if (r == CUDA_ERROR_NOT_READY) {
            i++;
            continue;
        }
        if (r != CUDA_SUCCESS) {
            /* A failed copy (bad mapping, peer gone); the event is not
             * trusted again. */
            req->err = cu_fail(be, r, "copy (cuEventQuery)");
            be->api.EventDestroy(e->ev);
        } else {
            dev_event_put(be, e->dev, e->ev);
        }
        req->ev[i] = req->ev[--req->nev];
    }
    if (cur >= 0) {
        dev_leave(be);
    }
    if (req->err != PDX_OK) {
        return req->err;
    }
    if (req->nev > 0) {
        return PDX_INPROGRESS;
    }
    return req->aborted ? PDX_ERR_CANCELED : PDX_OK;
}

/* Copies cannot be cancelled: an aborted request completes as its copies
 * do and then reports PDX_ERR_CANCELED (cuda_ipc sends no notes itself). */
pdx_status_t cipc_op_xfer_abort(void *be_, void *req_)
{
    cipc_req_t *req = req_;
    if (req == NULL) {
        return PDX_ERR_INVALID;
    }
    req->aborted = 1;
    return PDX_OK;
}

void cipc_op_xfer_release(void *be_, void *req_)
{
    cipc_be_t *be = be_;
    cipc_req_t *req = req_;
    if (req == NULL) {
        return;
    }
    /* Copies cannot be cancelled; waiting for them is what keeps the
     * promise that no byte lands after release returns. */
    for (size_t i = 0; i < req->nev; i++) {
        cipc_evt_t *e = &req->ev[i];
        if (dev_enter(be, e->dev) != PDX_OK) {
            continue;
        }
        if (be->api.EventSynchronize(e->ev) == CUDA_SUCCESS) {
            dev_event_put(be, e->dev, e->ev);
        } else {
            be->api.EventDestroy(e->ev);
        }
        dev_leave(be);
    }
    free(req);
}

/* ---- the rest --------------------------------------------------------- */

pdx_status_t cipc_op_notif_send(void *be, void *peer, const void *msg,
                                size_t len)
{
    return PDX_ERR_UNSUPPORTED;
}

int cipc_op_progress(void *be)
{
    return 0; /* completions are found by xfer_check */
}

int cipc_op_event_fd(void *be)
{
    return -1;
}

pdx_status_t cipc_op_arm(void *be)
{
    return PDX_ERR_UNSUPPORTED;
}

void cipc_op_describe(void *be_, char *buf, size_t len)
{
    cipc_be_t *be = be_;
    if (buf == NULL || len == 0) {
        return;
    }
    size_t off = 0;
    int w = snprintf(buf, len,
                     "%d device(s), %u streams each, "
                     "vmm %s",
                     be->ndev, be->streams_per_dev, be->vmm ? "yes" : "no");
    for (int d = 0; d < be->ndev && w >= 0; d++) {
        off += (size_t)w;
        if (off >= len) {
            break;
        }
        char u[48];
        cipc_uuid_format(be->uuids[d], u, sizeof(u));
        w = snprintf(buf + off, len - off, "; %d %s %s", d, be->devs[d].name,
                     u);
    }
}
