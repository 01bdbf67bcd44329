/* etcd store: the ops table, the module's one exported symbol. */
#include "etcd_int.h"

PDX_API const pdx_store_ops_t pdx_store_v1 = {
    .abi_version = PDX_STORE_ABI_VERSION,
    .size = sizeof(pdx_store_ops_t),
    .name = "etcd",
    .query = etcd_query,
    .create = etcd_create,
    .destroy = etcd_destroy,
    .status = etcd_status,
    .put = etcd_put,
    .get = etcd_get,
    .del = etcd_del,
    .watch = etcd_watch,
    .unwatch = etcd_unwatch,
    .owners_add = etcd_owners_add,
    .owners_del = etcd_owners_del,
    .owners_get = etcd_owners_get,
    .counters = etcd_counters,
};
