/* cuda_ipc: the private header of the backend's files: the instance,
 * devices, registrations, peers and their mapped allocations, requests,
 * and the device helpers (cuda_ipc_dev.c) the others share. Calls point
 * down: cuda_ipc_ops (the table) above cuda_ipc_backend (the instance),
 * cuda_ipc_mem, cuda_ipc_peer and cuda_ipc_xfer, above cuda_ipc_dev,
 * cuda_ipc_wire and cu_api. */
#ifndef PDX_CUDA_IPC_INT_H
#define PDX_CUDA_IPC_INT_H

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

#include "cuda_ipc_ops_int.h"
#include "pdx_clock.h"
#include "pdx_opts.h"

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

/* ---- cuda_ipc_dev.c: device contexts, streams, events ---- */

pdx_status_t cipc_cu_fail(cipc_be_t *be, CUresult r, const char *what);
pdx_status_t cipc_dev_ctx(cipc_be_t *be, int d);
pdx_status_t cipc_dev_enter(cipc_be_t *be, int d);
void cipc_dev_leave(cipc_be_t *be);
pdx_status_t cipc_dev_stream(cipc_be_t *be, int d, unsigned *idx_p,
                             CUstream *s_p);
pdx_status_t cipc_dev_event_get(cipc_be_t *be, int d, CUevent *ev_p);
void cipc_dev_event_put(cipc_be_t *be, int d, CUevent ev);
int cipc_in_range(uint64_t a, uint64_t len, uint64_t base, uint64_t blen);

/* ---- cuda_ipc_peer.c ---- */

/* The peer's allocation behind key `k`, opened on device `dev` once and
 * cached on the peer until it disconnects. */
pdx_status_t cipc_peer_map(cipc_be_t *be, cipc_peer_t *p, const cipc_key_t *k,
                           int dev, cipc_map_t **m_p);

#endif
