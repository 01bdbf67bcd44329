/* cuda_ipc: the ops table, compiled once per target: as `pdx_backend_v1`
 * (the one exported symbol) into the module, as `pdx_cuda_ipc_ops` into the
 * static library. */
#include "cuda_ipc_ops_int.h"

#include <pdx/export.h>

#ifdef CIPC_MODULE
#define CIPC_OPS_NAME pdx_backend_v1
PDX_API extern const pdx_backend_ops_t pdx_backend_v1;
#else
#define CIPC_OPS_NAME pdx_cuda_ipc_ops
#endif

const pdx_backend_ops_t CIPC_OPS_NAME = {
    .abi_version = PDX_BACKEND_ABI_VERSION,
    .size = sizeof(pdx_backend_ops_t),
    .name = "cuda_ipc",
    .caps = CIPC_CAPS,
    .query = cipc_op_query,
    .create = cipc_op_create,
    .destroy = cipc_op_destroy,
    .conn_info = cipc_op_conn_info,
    .mem_register = cipc_op_mem_register,
    .mem_deregister = cipc_op_mem_deregister,
    .mem_pack = cipc_op_mem_pack,
    .peer_connect = cipc_op_peer_connect,
    .peer_disconnect = cipc_op_peer_disconnect,
    .rmem_load = cipc_op_rmem_load,
    .rmem_unload = cipc_op_rmem_unload,
    .xfer_post = cipc_op_xfer_post,
    .xfer_check = cipc_op_xfer_check,
    .xfer_release = cipc_op_xfer_release,
    .xfer_abort = cipc_op_xfer_abort,
    .notif_send = cipc_op_notif_send,
    .progress = cipc_op_progress,
    .event_fd = cipc_op_event_fd,
    .arm = cipc_op_arm,
    .describe = cipc_op_describe,
};
