/* cma: the ops table, the module's one exported symbol. */
#include "cma_int.h"

__attribute__((visibility("default"))) const pdx_backend_ops_t
    pdx_backend_v1 = {
        .abi_version = PDX_BACKEND_ABI_VERSION,
        .size = sizeof(pdx_backend_ops_t),
        .name = "cma",
        .caps = PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_READ |
                PDX_BACKEND_CAP_WRITE | PDX_BACKEND_CAP_SAME_HOST,
        .query = cma_query,
        .create = cma_create,
        .destroy = cma_destroy,
        .conn_info = cma_conn_info,
        .mem_register = cma_mem_register,
        .mem_deregister = cma_mem_deregister,
        .mem_pack = cma_mem_pack,
        .peer_connect = cma_peer_connect,
        .peer_disconnect = cma_peer_disconnect,
        .rmem_load = cma_rmem_load,
        .rmem_unload = cma_rmem_unload,
        .xfer_post = cma_xfer_post,
        .xfer_check = cma_xfer_check,
        .xfer_release = cma_xfer_release,
        .notif_send = cma_notif_send,
        .progress = cma_progress,
        .event_fd = cma_event_fd,
        .arm = cma_arm,
        .describe = cma_describe,
        .xfer_abort = cma_xfer_abort,
        .path = cma_path,
};
