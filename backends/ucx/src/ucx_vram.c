/* ucx: GPU memory. Which path this instance gives VRAM: native (the UCX
 * in use carries CUDA memory: ucp_context_query lists
 * UCS_MEMORY_TYPE_CUDA), staged (pdx moves it through a pool of pinned
 * host buffers with the CUDA driver: ucx_stage.c), or off; the driver,
 * the devices' contexts, streams and events of the staged path, the pool,
 * VRAM regions checked against the driver, and their keys. The driver is
 * loaded at the first VRAM registration (or by describe), never for an
 * instance that only sees host memory. */
#include "ucx_int.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

/* A VRAM region's key (little-endian): magic, version, kind, reserved,
 * device ordinal on the owner, region address and length, token, the
 * largest staged chunk (table and data) the owner's service takes, and
 * the length of the packed rkey that follows (native regions; 0 for
 * staged ones). Every field is checked at load. */
#define UCX_VKEY_MAGIC 0x56584450u /* "PDXV" */
#define UCX_VKEY_VERSION 1u
#define UCX_VKEY_STAGED 1u
#define UCX_VKEY_NATIVE 2u
#define UCX_VKEY_HDR 44u
#define UCX_VKEY_MAX_RKEY 4096u
#define UCX_VRAM_MAX_DEV 64
/* Bounds of the options (bytes). */
#define UCX_STAGE_CHUNK_MIN (64ull << 10)
#define UCX_STAGE_CHUNK_MAX (64ull << 20)
#define UCX_STAGE_POOL_MAX (16ull << 30)

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

pdx_status_t ucx_vram_parse_opt(const char *value, ucx_vram_opt_t *opt_p)
{
    static const char *const names[] = {"auto", "native", "staged", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(value, names[i]) == 0) {
            *opt_p = (ucx_vram_opt_t)i;
            return PDX_OK;
        }
    }
    return PDX_ERR_CONFIG;
}

const char *ucx_vram_mode_name(ucx_vram_mode_t m)
{
    return m == UCX_VRAM_NATIVE ? "native" : m == UCX_VRAM_STAGED ? "staged"
                                                                   : "off";
}

pdx_status_t ucx_vram_choose(ucx_vram_opt_t opt, uint64_t mem_types,
                             const char *driver_why, ucx_vram_mode_t *mode_p,
                             char *why, size_t why_len)
{
    int cuda = (mem_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;
    switch (opt) {
    case UCX_VRAM_OPT_OFF:
        *mode_p = UCX_VRAM_OFF;
        snprintf(why, why_len, "vram=off");
        return PDX_OK;
    case UCX_VRAM_OPT_NATIVE:
        if (!cuda) {
            snprintf(why, why_len, "vram=native, but this UCX does not carry "
                     "CUDA memory (ucp_context_query lists no "
                     "UCS_MEMORY_TYPE_CUDA)");
            return PDX_ERR_CONFIG;
        }
        *mode_p = UCX_VRAM_NATIVE;
        snprintf(why, why_len, "UCX carries CUDA memory");
        return PDX_OK;
    case UCX_VRAM_OPT_STAGED:
        if (driver_why != NULL) {
            snprintf(why, why_len, "vram=staged, but %s", driver_why);
            return PDX_ERR_CONFIG;
        }
        *mode_p = UCX_VRAM_STAGED;
        snprintf(why, why_len, "staged through pinned host memory (vram="
                 "staged)");
        return PDX_OK;
    case UCX_VRAM_OPT_AUTO:
    default:
        if (cuda) {
            *mode_p = UCX_VRAM_NATIVE;
            snprintf(why, why_len, "UCX carries CUDA memory");
        } else if (driver_why == NULL) {
            *mode_p = UCX_VRAM_STAGED;
            snprintf(why, why_len, "staged through pinned host memory: this "
                     "UCX does not carry CUDA memory (no "
                     "UCS_MEMORY_TYPE_CUDA; a UCX built with CUDA moves it "
                     "natively)");
        } else {
            *mode_p = UCX_VRAM_OFF;
            snprintf(why, why_len, "no VRAM: this UCX does not carry CUDA "
                     "memory and %s", driver_why);
        }
        return PDX_OK;
    }
}

/* ---- the driver, the devices and the pool -------------------------- */

#ifdef PDX_UCX_CUDA

typedef struct ucx_vdev {
    CUdevice cudev;
    CUcontext ctx;    /* primary, retained at first use */
    CUstream stream;  /* the staging stream */
    CUevent *events;  /* idle events of this context */
    uint32_t nevents, cap_events;
} ucx_vdev_t;

struct ucx_vram {
    int tried;            /* the driver was asked (once) */
    pdx_status_t st;      /* PDX_OK: driver, devices and pool ready */
    char why[128];        /* why not */
    cu_api_t api;
    int ndev;
    ucx_vdev_t dev[UCX_VRAM_MAX_DEV];
    /* The pinned pool: nslots slots of stage_chunk bytes, registered with
     * UCX (RMA to and from slots). The first half serves this instance's
     * requests, the second half peers' (a service slot never waits for an
     * initiator's, so two agents staging to each other cannot deadlock). */
    unsigned char *base;
    size_t size;
    ucp_mem_h memh;
    int host_registered;
    uint32_t nslots, ninit;
    uint32_t *free_init, nfree_init;
    uint32_t *free_svc, nfree_svc;
};

static pdx_status_t vfail(ucx_be_t *be, CUresult r, const char *what)
{
    pdx_error("ucx: %s failed: %s", what, cu_err_name(&be->vram->api, r));
    pdx_status_t st = cu_status(r);
    return st < 0 ? st : PDX_ERR_BACKEND;
}

static pdx_status_t dev_enter(ucx_be_t *be, int d)
{
    struct ucx_vram *v = be->vram;
    ucx_vdev_t *dv = &v->dev[d];
    CUresult r;
    if (dv->ctx == NULL) {
        r = v->api.DevicePrimaryCtxRetain(&dv->ctx, dv->cudev);
        if (r != CUDA_SUCCESS) {
            dv->ctx = NULL;
            return vfail(be, r, "cuDevicePrimaryCtxRetain");
        }
    }
    r = v->api.CtxPushCurrent(dv->ctx);
    if (r != CUDA_SUCCESS) {
        return vfail(be, r, "cuCtxPushCurrent");
    }
    if (dv->stream == NULL) {
        r = v->api.StreamCreate(&dv->stream, CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            CUcontext old;
            v->api.CtxPopCurrent(&old);
            dv->stream = NULL;
            return vfail(be, r, "cuStreamCreate");
        }
    }
    return PDX_OK;
}

static void dev_leave(ucx_be_t *be)
{
    CUcontext old;
    be->vram->api.CtxPopCurrent(&old);
}

static pdx_status_t pool_make(ucx_be_t *be)
{
    struct ucx_vram *v = be->vram;
    v->nslots = (uint32_t)(be->stage_pool / be->stage_chunk);
    if (v->nslots < 2) {
        v->nslots = 2;
    }
    v->ninit = v->nslots / 2;
    v->size = (size_t)v->nslots * be->stage_chunk;
    void *p = mmap(NULL, v->size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        pdx_error("ucx: staging pool of %zu bytes: %s", v->size,
                  strerror(errno));
        return PDX_ERR_NOMEM;
    }
    v->base = p;
    /* Page-locked so the device copies run at the copy engines' speed
     * (pageable memory is staged again by the driver). */
    pdx_status_t st = dev_enter(be, 0);
    if (st != PDX_OK) {
        return st;
    }
    CUresult r = v->api.MemHostRegister(v->base, v->size,
                                        CU_MEMHOSTREGISTER_PORTABLE);
    dev_leave(be);
    if (r != CUDA_SUCCESS) {
        return vfail(be, r, "cuMemHostRegister of the staging pool");
    }
    v->host_registered = 1;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = v->base,
        .length = v->size,
        .memory_type = UCS_MEMORY_TYPE_HOST,
    };
    ucs_status_t s = ucp_mem_map(be->ctx, &mp, &v->memh);
    if (s != UCS_OK) {
        v->memh = NULL;
        pdx_error("ucx: registering the staging pool failed: %s",
                  ucs_status_string(s));
        return ucx_status(s);
    }
    v->free_init = malloc(v->ninit * sizeof(uint32_t));
    v->free_svc = malloc((v->nslots - v->ninit) * sizeof(uint32_t));
    if (v->free_init == NULL || v->free_svc == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (uint32_t i = v->ninit; i > 0; i--) {
        v->free_init[v->nfree_init++] = i - 1;
    }
    for (uint32_t i = v->nslots; i > v->ninit; i--) {
        v->free_svc[v->nfree_svc++] = i - 1;
    }
    pdx_debug("ucx: staging pool: %u slots of %" PRIu64 " bytes (%u for "
              "this agent's requests, %u for peers')", v->nslots,
              be->stage_chunk, v->ninit, v->nslots - v->ninit);
    return PDX_OK;
}

/* Load the driver and count the devices (once). */
static pdx_status_t driver_load(ucx_be_t *be)
{
    if (be->vram == NULL) {
        be->vram = calloc(1, sizeof(*be->vram));
        if (be->vram == NULL) {
            return PDX_ERR_NOMEM;
        }
    }
    struct ucx_vram *v = be->vram;
    if (v->tried) {
        return v->api.Init != NULL && v->ndev > 0 ? PDX_OK
                                                  : PDX_ERR_UNAVAILABLE;
    }
    v->tried = 1;
    v->st = PDX_ERR_UNAVAILABLE;
    pdx_status_t st = cu_api_load(&v->api, v->why, sizeof(v->why));
    if (st == PDX_OK) {
        st = cu_api_init(&v->api, &v->ndev, v->why, sizeof(v->why));
    }
    if (st != PDX_OK) {
        v->ndev = 0;
        return st;
    }
    if (v->ndev > UCX_VRAM_MAX_DEV) {
        v->ndev = UCX_VRAM_MAX_DEV;
    }
    for (int d = 0; d < v->ndev; d++) {
        CUresult r = v->api.DeviceGet(&v->dev[d].cudev, d);
        if (r != CUDA_SUCCESS) {
            snprintf(v->why, sizeof(v->why), "cuDeviceGet(%d): %s", d,
                     cu_err_name(&v->api, r));
            v->ndev = 0;
            return PDX_ERR_UNAVAILABLE;
        }
    }
    return PDX_OK;
}

pdx_status_t ucx_vram_ready(ucx_be_t *be)
{
    if (be->vram != NULL && be->vram->st == PDX_OK) {
        return PDX_OK;
    }
    pdx_status_t st = driver_load(be);
    if (st != PDX_OK) {
        pdx_error("ucx: GPU memory: %s", be->vram ? be->vram->why : "?");
        return be->vram ? PDX_ERR_UNSUPPORTED : st;
    }
    if (be->vram_mode == UCX_VRAM_STAGED || be->vram_mode == UCX_VRAM_NATIVE) {
        if (be->vram->base == NULL) {
            /* The native mode serves peers without it through staging. */
            st = pool_make(be);
            if (st != PDX_OK) {
                return st;
            }
        }
    }
    be->vram->st = PDX_OK;
    return PDX_OK;
}

uint32_t ucx_vram_slot_get(ucx_be_t *be, int svc)
{
    struct ucx_vram *v = be->vram;
    if (v == NULL || v->base == NULL) {
        return UINT32_MAX;
    }
    if (svc) {
        return v->nfree_svc > 0 ? v->free_svc[--v->nfree_svc] : UINT32_MAX;
    }
    return v->nfree_init > 0 ? v->free_init[--v->nfree_init] : UINT32_MAX;
}

void ucx_vram_slot_put(ucx_be_t *be, uint32_t slot)
{
    struct ucx_vram *v = be->vram;
    if (slot == UINT32_MAX || v == NULL || slot >= v->nslots) {
        return;
    }
    if (slot < v->ninit) {
        v->free_init[v->nfree_init++] = slot;
    } else {
        v->free_svc[v->nfree_svc++] = slot;
    }
}

void *ucx_vram_slot_ptr(ucx_be_t *be, uint32_t slot)
{
    return be->vram->base + (size_t)slot * be->stage_chunk;
}

ucp_mem_h ucx_vram_pool_memh(ucx_be_t *be)
{
    return be->vram != NULL ? be->vram->memh : NULL;
}

uint32_t ucx_vram_slot_size(const ucx_be_t *be)
{
    return (uint32_t)be->stage_chunk;
}

uint32_t ucx_vram_slots_used(const ucx_be_t *be)
{
    const struct ucx_vram *v = be->vram;
    if (v == NULL || v->base == NULL) {
        return 0;
    }
    return v->nslots - v->nfree_init - v->nfree_svc;
}

static CUevent event_get(ucx_be_t *be, int d)
{
    ucx_vdev_t *dv = &be->vram->dev[d];
    if (dv->nevents > 0) {
        return dv->events[--dv->nevents];
    }
    CUevent ev = NULL;
    CUresult r = be->vram->api.EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
        vfail(be, r, "cuEventCreate");
        return NULL;
    }
    return ev;
}

static void event_put(ucx_be_t *be, int d, CUevent ev)
{
    ucx_vdev_t *dv = &be->vram->dev[d];
    if (dv->nevents == dv->cap_events) {
        uint32_t cap = dv->cap_events ? dv->cap_events * 2 : 16;
        CUevent *e = realloc(dv->events, cap * sizeof(*e));
        if (e == NULL) {
            be->vram->api.EventDestroy(ev);
            return;
        }
        dv->events = e;
        dv->cap_events = cap;
    }
    dv->events[dv->nevents++] = ev;
}

pdx_status_t ucx_vram_copy(ucx_be_t *be, int dev, int to_host,
                           const ucx_vseg_t *segs, size_t n, void **ev_p)
{
    struct ucx_vram *v = be->vram;
    if (v == NULL || dev < 0 || dev >= v->ndev) {
        return PDX_ERR_INVALID;
    }
    pdx_status_t st = dev_enter(be, dev);
    if (st != PDX_OK) {
        return st;
    }
    CUstream s = v->dev[dev].stream;
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        r = to_host ? v->api.MemcpyDtoHAsync(segs[i].host, segs[i].dptr,
                                             segs[i].len, s)
                    : v->api.MemcpyHtoDAsync(segs[i].dptr, segs[i].host,
                                             segs[i].len, s);
    }
    CUevent ev = NULL;
    if (r == CUDA_SUCCESS) {
        ev = event_get(be, dev);
        r = ev == NULL ? CUDA_ERROR_OUT_OF_MEMORY : v->api.EventRecord(ev, s);
    }
    if (r != CUDA_SUCCESS) {
        /* Copies queued before the failure still run: wait for them, so
         * nothing writes a slot or a region after this returns. */
        v->api.StreamSynchronize(s);
        if (ev != NULL) {
            event_put(be, dev, ev);
        }
        dev_leave(be);
        return vfail(be, r, to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync");
    }
    dev_leave(be);
    *ev_p = ev;
    return PDX_OK;
}

int ucx_vram_copy_done(ucx_be_t *be, int dev, void *ev)
{
    struct ucx_vram *v = be->vram;
    CUresult r = v->api.EventQuery((CUevent)ev);
    if (r == CUDA_ERROR_NOT_READY) {
        return 0;
    }
    event_put(be, dev, (CUevent)ev);
    if (r != CUDA_SUCCESS) {
        vfail(be, r, "a staging copy");
        return -1;
    }
    return 1;
}

void ucx_vram_copy_wait(ucx_be_t *be, int dev, void *ev)
{
    struct ucx_vram *v = be->vram;
    v->api.EventSynchronize((CUevent)ev);
    event_put(be, dev, (CUevent)ev);
}

static void vram_free(ucx_be_t *be)
{
    struct ucx_vram *v = be->vram;
    if (v == NULL) {
        return;
    }
    if (v->memh != NULL) {
        ucp_mem_unmap(be->ctx, v->memh);
    }
    if (v->host_registered && dev_enter(be, 0) == PDX_OK) {
        v->api.MemHostUnregister(v->base);
        dev_leave(be);
    }
    if (v->base != NULL) {
        munmap(v->base, v->size);
    }
    for (int d = 0; d < v->ndev; d++) {
        ucx_vdev_t *dv = &v->dev[d];
        if (dv->ctx == NULL) {
            continue;
        }
        if (v->api.CtxPushCurrent(dv->ctx) == CUDA_SUCCESS) {
            for (uint32_t i = 0; i < dv->nevents; i++) {
                v->api.EventDestroy(dv->events[i]);
            }
            if (dv->stream != NULL) {
                v->api.StreamSynchronize(dv->stream);
                v->api.StreamDestroy(dv->stream);
            }
            dev_leave(be);
        }
        free(dv->events);
        v->api.DevicePrimaryCtxRelease(dv->cudev);
    }
    free(v->free_init);
    free(v->free_svc);
    /* The driver library stays loaded (cu_api_load). */
    free(v);
    be->vram = NULL;
}

static const char *driver_why(ucx_be_t *be)
{
    if (driver_load(be) == PDX_OK) {
        return NULL;
    }
    return be->vram != NULL ? be->vram->why : "out of memory";
}

#else /* !PDX_UCX_CUDA: built without cuda.h */

struct ucx_vram {
    int tried;
};

pdx_status_t ucx_vram_ready(ucx_be_t *be)
{
    pdx_error("ucx: GPU memory: this build has no CUDA support (cuda.h "
              "was not found when pdx was built)");
    return PDX_ERR_UNSUPPORTED;
}
uint32_t ucx_vram_slot_get(ucx_be_t *be, int svc) { return UINT32_MAX; }
void ucx_vram_slot_put(ucx_be_t *be, uint32_t slot) {}
void *ucx_vram_slot_ptr(ucx_be_t *be, uint32_t slot) { return NULL; }
ucp_mem_h ucx_vram_pool_memh(ucx_be_t *be) { return NULL; }
uint32_t ucx_vram_slot_size(const ucx_be_t *be) { return 0; }
uint32_t ucx_vram_slots_used(const ucx_be_t *be) { return 0; }
pdx_status_t ucx_vram_copy(ucx_be_t *be, int dev, int to_host,
                           const ucx_vseg_t *segs, size_t n, void **ev_p)
{
    return PDX_ERR_UNSUPPORTED;
}
int ucx_vram_copy_done(ucx_be_t *be, int dev, void *ev) { return -1; }
void ucx_vram_copy_wait(ucx_be_t *be, int dev, void *ev) {}
static void vram_free(ucx_be_t *be) {}
static const char *driver_why(ucx_be_t *be)
{
    return "this build has no CUDA support (no cuda.h when pdx was built)";
}

#endif

/* ---- the mode --------------------------------------------------------- */

pdx_status_t ucx_vram_init(ucx_be_t *be)
{
    ucx_list_init(&be->vregs);
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(be->ctx, &ca) == UCS_OK) {
        be->ucx_mem_types = ca.memory_types;
    }
    if (be->stage_chunk < UCX_STAGE_CHUNK_MIN ||
        be->stage_chunk > UCX_STAGE_CHUNK_MAX ||
        be->stage_pool < 2 * be->stage_chunk ||
        be->stage_pool > UCX_STAGE_POOL_MAX) {
        pdx_error("ucx: stage_chunk must be %llu..%llu bytes and stage_pool "
                  "2 chunks..%llu bytes (have %" PRIu64 " and %" PRIu64 ")",
                  UCX_STAGE_CHUNK_MIN, UCX_STAGE_CHUNK_MAX,
                  UCX_STAGE_POOL_MAX, be->stage_chunk, be->stage_pool);
        return PDX_ERR_CONFIG;
    }
    /* Without CUDA memory in UCX, whether staging can run is the driver's
     * to say: asked now when vram=staged is explicit, else at the first
     * VRAM registration (an instance that sees host memory only never
     * loads the driver); until then auto reads as staged. */
    const char *dwhy = NULL;
    if (be->vram_opt == UCX_VRAM_OPT_STAGED) {
        dwhy = driver_why(be);
    }
    pdx_status_t st = ucx_vram_choose(be->vram_opt, be->ucx_mem_types, dwhy,
                                      &be->vram_mode, be->vram_why,
                                      sizeof(be->vram_why));
    if (st != PDX_OK) {
        pdx_error("ucx: %s", be->vram_why);
    }
    return st;
}

void ucx_vram_fini(ucx_be_t *be)
{
    vram_free(be);
}

void ucx_vram_describe(ucx_be_t *be, char *buf, size_t len)
{
    /* The driver is not loaded to say: an instance that never saw VRAM
     * has not asked it (vram=staged asks at create). */
    int asked = be->vram != NULL && be->vram->tried;
    int n = snprintf(buf, len, "vram %s%s (%s)",
                     ucx_vram_mode_name(be->vram_mode),
                     be->vram_mode == UCX_VRAM_STAGED && !asked
                         ? " if the CUDA driver has a device"
                         : "",
                     be->vram_why);
    if (n > 0 && (size_t)n < len && ucx_vram_pool_memh(be) != NULL) {
        snprintf(buf + n, len - (size_t)n,
                 "; staging pool %" PRIu64 " MiB, slots in use %u",
                 be->stage_pool >> 20, ucx_vram_slots_used(be));
    }
}

/* ---- regions and keys ------------------------------------------------ */

#ifdef PDX_UCX_CUDA
/* Is [addr, +len) device memory of device `dev` here, in one allocation? */
static pdx_status_t vram_check(ucx_be_t *be, const pdx_region_t *rg)
{
    struct ucx_vram *v = be->vram;
    if ((int)rg->dev_id >= v->ndev) {
        pdx_error("ucx: VRAM region 0x%" PRIx64 " +%" PRIu64 ": device %u, "
                  "but %d visible here", rg->addr, rg->len, rg->dev_id,
                  v->ndev);
        return PDX_ERR_INVALID;
    }
    pdx_status_t st = dev_enter(be, (int)rg->dev_id);
    if (st != PDX_OK) {
        return st;
    }
    unsigned int mt = 0;
    int ord = -1;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = v->api.PointerGetAttribute(
        &mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)rg->addr);
    if (r == CUDA_SUCCESS) {
        r = v->api.PointerGetAttribute(
            &ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)rg->addr);
    }
    if (r == CUDA_SUCCESS) {
        r = v->api.MemGetAddressRange(&base, &size, (CUdeviceptr)rg->addr);
    }
    dev_leave(be);
    if (r != CUDA_SUCCESS || mt != CU_MEMORYTYPE_DEVICE) {
        pdx_error("ucx: VRAM region 0x%" PRIx64 " +%" PRIu64 " is not device "
                  "memory the driver knows (%s)", rg->addr, rg->len,
                  r != CUDA_SUCCESS ? cu_err_name(&v->api, r)
                                    : "another memory type");
        return PDX_ERR_INVALID;
    }
    if (ord != (int)rg->dev_id) {
        pdx_error("ucx: VRAM region 0x%" PRIx64 " is on device %d, "
                  "registered as device %u", rg->addr, ord, rg->dev_id);
        return PDX_ERR_INVALID;
    }
    if (rg->addr < (uint64_t)base || rg->len > size ||
        rg->addr - (uint64_t)base > size - rg->len) {
        pdx_error("ucx: VRAM region 0x%" PRIx64 " +%" PRIu64 " spans past "
                  "its allocation 0x%llx +%zu", rg->addr, rg->len,
                  (unsigned long long)base, size);
        return PDX_ERR_INVALID;
    }
    return PDX_OK;
}
#endif

pdx_status_t ucx_vram_register(ucx_be_t *be, const pdx_region_t *rg,
                               ucx_md_t *md)
{
    if (be->vram_mode == UCX_VRAM_OFF) {
        pdx_debug("ucx: VRAM 0x%" PRIx64 " not registered: %s", rg->addr,
                  be->vram_why);
        return PDX_ERR_UNSUPPORTED;
    }
#ifdef PDX_UCX_CUDA
    pdx_status_t st = ucx_vram_ready(be);
    if (st != PDX_OK) {
        if (be->vram_opt == UCX_VRAM_OPT_AUTO && be->vram != NULL &&
            be->vram->base == NULL) {
            /* No driver or device after all: VRAM is not this
             * instance's (the agent leaves it to other backends). */
            ucx_vram_choose(be->vram_opt, be->ucx_mem_types,
                            be->vram->why[0] ? be->vram->why : "no pool",
                            &be->vram_mode, be->vram_why,
                            sizeof(be->vram_why));
        }
        return PDX_ERR_UNSUPPORTED;
    }
    st = vram_check(be, rg);
    if (st != PDX_OK) {
        return st;
    }
    md->type = PDX_MEM_VRAM;
    md->dev = (int)rg->dev_id;
    md->memh = NULL;
    do {
        if (getrandom(&md->token, sizeof(md->token), 0) !=
            (ssize_t)sizeof(md->token)) {
            md->token = pdx_now_ns() ^ ((uint64_t)getpid() << 32) ^
                        (uint64_t)(uintptr_t)md;
        }
    } while (md->token == 0);
    if (be->vram_mode == UCX_VRAM_NATIVE) {
        /* UCX maps it with the region's device current. */
        st = dev_enter(be, md->dev);
        if (st != PDX_OK) {
            return st;
        }
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                          UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                          UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
            .address = (void *)(uintptr_t)rg->addr,
            .length = rg->len,
            .memory_type = UCS_MEMORY_TYPE_CUDA,
        };
        ucs_status_t s = ucp_mem_map(be->ctx, &mp, &md->memh);
        dev_leave(be);
        if (s != UCS_OK) {
            md->memh = NULL;
            pdx_error("ucx: registering VRAM 0x%" PRIx64 " +%" PRIu64
                      " with UCX failed: %s", rg->addr, rg->len,
                      ucs_status_string(s));
            return ucx_status(s);
        }
    }
    ucx_list_push(&be->vregs, &md->vlink);
    return PDX_OK;
#else
    return ucx_vram_ready(be);
#endif
}

void ucx_vram_deregister(ucx_be_t *be, ucx_md_t *md)
{
    ucx_list_del(&md->vlink);
    if (md->memh != NULL) {
        ucp_mem_unmap(be->ctx, md->memh);
        md->memh = NULL;
    }
}

pdx_status_t ucx_vram_pack(ucx_be_t *be, ucx_md_t *md, void **buf_p,
                           size_t *len_p)
{
    void *rbuf = NULL;
    size_t rlen = 0;
    if (md->memh != NULL) {
        ucs_status_t s = ucp_rkey_pack(be->ctx, md->memh, &rbuf, &rlen);
        if (s != UCS_OK) {
            pdx_error("ucx: packing the key of VRAM 0x%" PRIx64 " failed: "
                      "%s", md->addr, ucs_status_string(s));
            return ucx_status(s);
        }
    }
    unsigned char *k = malloc(UCX_VKEY_HDR + rlen);
    if (k == NULL) {
        if (rbuf != NULL) {
            ucp_rkey_buffer_release(rbuf);
        }
        return PDX_ERR_NOMEM;
    }
    put_le(k, UCX_VKEY_MAGIC, 4);
    k[4] = UCX_VKEY_VERSION;
    k[5] = md->memh != NULL ? UCX_VKEY_NATIVE : UCX_VKEY_STAGED;
    put_le(k + 6, 0, 2);
    put_le(k + 8, (uint64_t)md->dev, 4);
    put_le(k + 12, md->addr, 8);
    put_le(k + 20, md->len, 8);
    put_le(k + 28, md->token, 8);
    put_le(k + 36, ucx_vram_slot_size(be), 4);
    put_le(k + 40, rlen, 4);
    if (rlen > 0) {
        memcpy(k + UCX_VKEY_HDR, rbuf, rlen);
        ucp_rkey_buffer_release(rbuf);
    }
    *buf_p = k;
    *len_p = UCX_VKEY_HDR + rlen;
    return PDX_OK;
}

pdx_status_t ucx_vram_load_key(ucx_be_t *be, ucx_peer_t *peer,
                               const pdx_region_t *rg, const void *key,
                               size_t key_len, ucx_rmd_t *rmd)
{
    const unsigned char *k = key;
    const char *bad = NULL;
    uint64_t rlen = 0;
    if (key_len < UCX_VKEY_HDR) {
        bad = "shorter than its header";
    } else if (get_le(k, 4) != UCX_VKEY_MAGIC) {
        bad = "not a pdx VRAM key (magic)";
    } else if (k[4] != UCX_VKEY_VERSION) {
        bad = "another version";
    } else if (k[5] != UCX_VKEY_STAGED && k[5] != UCX_VKEY_NATIVE) {
        bad = "unknown kind";
    } else if (get_le(k + 12, 8) != rg->addr || get_le(k + 20, 8) != rg->len) {
        bad = "names another region than the blob's";
    } else if (get_le(k + 28, 8) == 0) {
        bad = "no token";
    } else if (get_le(k + 36, 4) < UCX_STAGE_CHUNK_MIN ||
               get_le(k + 36, 4) > UCX_STAGE_CHUNK_MAX) {
        bad = "staging chunk out of bounds";
    } else if ((rlen = get_le(k + 40, 4)) != key_len - UCX_VKEY_HDR ||
               (k[5] == UCX_VKEY_NATIVE) != (rlen > 0) ||
               rlen > UCX_VKEY_MAX_RKEY) {
        bad = "packed key length does not match";
    }
    if (bad != NULL) {
        pdx_error("ucx: peer %s: VRAM key of region 0x%" PRIx64 " +%" PRIu64
                  " (%zu bytes): %s", peer->name, rg->addr, rg->len, key_len,
                  bad);
        return PDX_ERR_INVALID;
    }
    rmd->type = PDX_MEM_VRAM;
    rmd->dev = (uint32_t)get_le(k + 8, 4);
    rmd->token = get_le(k + 28, 8);
    rmd->slot = (uint32_t)get_le(k + 36, 4);
    /* A native region is reached with RMA when this instance carries CUDA
     * memory too; else through the owner's staging, which serves it as
     * well. */
    rmd->staged = !(k[5] == UCX_VKEY_NATIVE &&
                    be->vram_mode == UCX_VRAM_NATIVE);
    if (!rmd->staged) {
        char vwhy[256];
        pdx_status_t vst = ucx_validate_rkey(&be->vlocal, &peer->vaddr,
                                             k + UCX_VKEY_HDR, rlen,
                                             UCS_MEMORY_TYPE_CUDA, vwhy,
                                             sizeof(vwhy));
        if (vst != PDX_OK) {
            pdx_error("ucx: peer %s: malformed key of VRAM region 0x%" PRIx64
                      ": %s", peer->name, rg->addr, vwhy);
            return vst;
        }
        rmd->key = malloc(rlen);
        if (rmd->key == NULL) {
            return PDX_ERR_NOMEM;
        }
        memcpy(rmd->key, k + UCX_VKEY_HDR, rlen);
        rmd->key_len = rlen;
    }
    return PDX_OK;
}

ucx_md_t *ucx_vram_find(ucx_be_t *be, uint64_t token, uint64_t addr,
                        uint64_t len)
{
    for (ucx_link_t *l = be->vregs.next; l != &be->vregs; l = l->next) {
        ucx_md_t *md = UCX_CONTAINER(l, ucx_md_t, vlink);
        if (md->token == token && len > 0 && addr >= md->addr &&
            len <= md->len && addr - md->addr <= md->len - len) {
            return md;
        }
    }
    return NULL;
}
