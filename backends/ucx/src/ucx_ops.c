/* ucx: the ops table, the module's one exported symbol (also linked into
 * the static library under the same name). */
#include "ucx_int.h"

__attribute__((visibility("default"))) const pdx_backend_ops_t pdx_backend_v1 = {
    .abi_version = PDX_BACKEND_ABI_VERSION,
    .size = sizeof(pdx_backend_ops_t),
    .name = "ucx",
    .caps = PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_READ |
            PDX_BACKEND_CAP_WRITE | PDX_BACKEND_CAP_NOTIF |
            PDX_BACKEND_CAP_EVENT_FD
#ifdef PDX_UCX_CUDA
            | PDX_BACKEND_CAP_VRAM
#endif
    ,
    .query = ucx_query,
    .create = ucx_create,
    .destroy = ucx_destroy,
    .conn_info = ucx_conn_info,
    .mem_register = ucx_mem_register,
    .mem_deregister = ucx_mem_deregister,
    .mem_pack = ucx_mem_pack,
    .peer_connect = ucx_peer_connect,
    .peer_disconnect = ucx_peer_disconnect,
    .rmem_load = ucx_rmem_load,
    .rmem_unload = ucx_rmem_unload,
    .xfer_post = ucx_xfer_post,
    .xfer_check = ucx_xfer_check,
    .xfer_release = ucx_xfer_release,
    .notif_send = ucx_notif_send,
    .progress = ucx_progress,
    .event_fd = ucx_event_fd,
    .arm = ucx_arm,
    .describe = ucx_describe,
    .xfer_abort = ucx_xfer_abort,
    .path = ucx_path,
    .peer_failed = ucx_peer_failed,
};
