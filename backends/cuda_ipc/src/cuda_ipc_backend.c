/* cuda_ipc: moves bytes between GPU memory of processes on one host through
 * CUDA IPC (legacy handles for cudaMalloc-style memory, POSIX fds for VMM
 * allocations), and between GPU memory and local pinned DRAM. Transfers are
 * async copies on a per-device stream pool; completion is tracked by
 * events. This file: the instance (query, create, destroy, conn info,
 * process identity) and the ops with nothing to do (notifications,
 * progress, event fd). */
#include "cuda_ipc_int.h"

/* The one piece of process-wide state: a random token drawn once, so two
 * processes that share a pid number (pid namespaces) are told apart. It is
 * written once under pthread_once and read-only after. */
static pthread_once_t g_token_once = PTHREAD_ONCE_INIT;
static uint64_t g_token;

static void token_init(void)
{
    uint64_t t = 0;
    if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
        t = pdx_now_ns() ^ ((uint64_t)getpid() << 16);
    }
    g_token = t ? t : 1;
}

void cipc_self_ident(cipc_ident_t *ident)
{
    pthread_once(&g_token_once, token_init);
    ident->pid = getpid();
    ident->token = g_token;
}

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
                            const pdx_option_t *opts, size_t nopts, void **be_p)
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

static pdx_status_t parse_opts(cipc_be_t *be, const pdx_option_t *opts,
                               size_t nopts)
{
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key, *v = opts[i].value;
        if (k == NULL || v == NULL) {
            pdx_error("cuda_ipc: option %zu has no key or value", i);
            return PDX_ERR_CONFIG;
        }
        if (strcmp(k, "streams") == 0) {
            uint64_t n;
            if (pdx_opt_uint(v, 1, CIPC_STREAMS_MAX, &n) != 0) {
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
                                  const pdx_option_t *opts, size_t nopts,
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
            st = cipc_cu_fail(be, r, "cuDeviceGet/cuDeviceGetUuid");
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
            cipc_dev_leave(be);
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
