/* libFuzzer harness for the etcd store's WatchResponse decoder (the
 * key-watch stream, stores/etcd/src/etcd_pb.c), its RangeResponse and
 * LeaseKeepAliveResponse decoders and gRPC's framing (reads and renewals
 * over gRPC, etcd_h2.c): bytes from etcd are untrusted.
 * Every event's key and value are read in full, so a pointer or length
 * past the input shows under ASan. */
#include <stdint.h>
#include <string.h>

#include "etcd_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void on_event(void *arg, const etcd_pb_event_t *ev)
{
    uint64_t *sum = arg;
    for (size_t i = 0; i < ev->key_len; i++) {
        *sum += ev->key[i];
    }
    for (size_t i = 0; i < ev->value_len; i++) {
        *sum += ev->value[i];
    }
    *sum += (uint64_t)ev->mod_revision + (uint64_t)ev->lease + ev->is_delete;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    etcd_pb_watch_t w;
    uint64_t sum = 0;
    int n = etcd_pb_watch_resp(data, size, &w, on_event, &sum);
    /* The flags-only pass agrees with the full one on malformed input. */
    int m = etcd_pb_watch_resp(data, size, &w, NULL, NULL);
    if ((n < 0) != (m < 0)) {
        __builtin_trap();
    }
    /* The same bytes as a RangeResponse. */
    int64_t rev = 0;
    etcd_pb_event_t kv;
    if (etcd_pb_range_resp(data, size, &rev, &kv) == 1) {
        on_event(&sum, &kv);
    }
    sum += (uint64_t)rev;
    /* As a LeaseKeepAliveResponse, and as a run of gRPC frames. */
    int64_t id = 0, ttl = 0;
    if (etcd_pb_lease_ka_resp(data, size, &rev, &id, &ttl) == 0) {
        sum += (uint64_t)(rev + id + ttl);
    }
    const uint8_t *p = data, *msg;
    size_t left = size, len;
    while (etcd_grpc_next_frame(&p, &left, &msg, &len)) {
        for (size_t i = 0; i < len; i++) {
            sum += msg[i];
        }
    }
    return (int)(sum & 0);
}
