/* ucx_perftest as a comparison peer. */
#ifndef PDX_BENCH_PERFTEST_H
#define PDX_BENCH_PERFTEST_H

#include "bench.h"

typedef struct perftest_result {
    int ok;
    int partial;   /* stopped at the time limit: its last progress */
    char test[16]; /* ucp_put_bw or ucp_get */
    uint64_t iters, warmup;
    double mbps;   /* as printed: 2^20 B/s */
    double gbps;   /* 1e9 B/s */
    double lat_us; /* average overhead per message */
    char why[256]; /* reason when !ok */
} perftest_result_t;

/* Runs one ucx_perftest server and client pair with UCX_TLS=tls for about
 * `seconds` at `assumed_gbps`. By default ucx_perftest lets UCX allocate
 * its buffers (shared memory the peer maps, on sm); with `user_mem` it is
 * made to use ordinary memory (UCX_ALLOC_PRIO=thp,mmap,heap), as a serving
 * stack's KV arenas are. 0 and res->ok on success; -1 with res->why on
 * failure (never exits). ucx_perftest is found in PATH, or
 * PDX_BENCH_PERFTEST. */
int perftest_run(const char *tls, pdx_xfer_op_t op, uint64_t size, int user_mem,
                 double seconds, double assumed_gbps, perftest_result_t *res);

#endif
