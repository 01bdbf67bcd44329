/* cuda_ipc: the ops the table wires (cuda_ipc_ops.c), also called by the
 * unit tests through the static library. */
#ifndef PDX_CUDA_IPC_OPS_H
#define PDX_CUDA_IPC_OPS_H

#include <stdint.h>
#include <sys/types.h>

#include <pdx/backend.h>

#include "cu_api_int.h"
#include "cuda_ipc_wire_int.h"

/* The ops table. The module exports it as `pdx_backend_v1`; the static
 * library names it `pdx_cuda_ipc_ops`, so static backends can be linked
 * side by side (cuda_ipc_ops.c is compiled once per target). */
extern const pdx_backend_ops_t pdx_cuda_ipc_ops;

/* The ops, wired by cuda_ipc_ops.c. */
pdx_status_t cipc_op_query(char *why, size_t why_len);
pdx_status_t cipc_op_create(const pdx_backend_host_t *host,
                            const pdx_option_t *opts, size_t nopts,
                            void **be_p);
void cipc_op_destroy(void *be);
pdx_status_t cipc_op_conn_info(void *be, void **buf_p, size_t *len_p);
pdx_status_t cipc_op_mem_register(void *be, const pdx_region_t *region,
                                  void **md_p);
void cipc_op_mem_deregister(void *be, void *md);
pdx_status_t cipc_op_mem_pack(void *be, void *md, void **buf_p, size_t *len_p);
pdx_status_t cipc_op_peer_connect(void *be, const char *peer_name,
                                  const void *conn, size_t conn_len,
                                  void **peer_p);
void cipc_op_peer_disconnect(void *be, void *peer);
pdx_status_t cipc_op_rmem_load(void *be, void *peer, const pdx_region_t *region,
                               const void *key, size_t key_len, void **rmd_p);
void cipc_op_rmem_unload(void *be, void *rmd);
pdx_status_t cipc_op_xfer_post(void *be, void *peer, pdx_xfer_op_t op,
                               const pdx_backend_iov_t *iov, size_t n,
                               const void *notif, size_t notif_len,
                               void **req_p);
pdx_status_t cipc_op_xfer_check(void *be, void *req);
void cipc_op_xfer_release(void *be, void *req);
pdx_status_t cipc_op_xfer_abort(void *be, void *req);
pdx_status_t cipc_op_notif_send(void *be, void *peer, const void *msg,
                                size_t len);
int cipc_op_progress(void *be);
int cipc_op_event_fd(void *be);
pdx_status_t cipc_op_arm(void *be);
void cipc_op_describe(void *be, char *buf, size_t len);

#define CIPC_CAPS                                                              \
    (PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_VRAM | PDX_BACKEND_CAP_READ |      \
     PDX_BACKEND_CAP_WRITE | PDX_BACKEND_CAP_SAME_HOST)

/* Who this process is to its peers. Tests give two instances of one process
 * different identities so they talk through the IPC path. */
typedef struct cipc_ident {
    pid_t pid;
    uint64_t token;
} cipc_ident_t;

/* create() with a driver table the caller filled (a fake driver in tests)
 * and an optional identity (NULL: this process). `api` is copied. */
pdx_status_t cipc_create_with_api(const pdx_backend_host_t *host,
                                  const pdx_option_t *opts, size_t nopts,
                                  const cu_api_t *api,
                                  const cipc_ident_t *ident, void **be_p);

/* This process's identity (pid and a random token made once). */
void cipc_self_ident(cipc_ident_t *ident);

#endif
