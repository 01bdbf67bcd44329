/* What the files of test_backend_ucx share: the module's table, the run's
 * options, the pattern its regions hold, the fake agent (host) an instance
 * reports to, and the cases main() runs (ucx_transfer.c, ucx_misc.c,
 * ucx_procs.c). */
#ifndef PDX_TEST_UCX_TEST_H
#define PDX_TEST_UCX_TEST_H

#include <pdx/backend.h>
#include <ucp/api/ucp.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdx_clock.h"

/* The module's table (linked in: pdx_backend_ucx_static). */
extern const pdx_backend_ops_t pdx_backend_v1;
extern const pdx_backend_ops_t *ops;

#define REGION_LEN (64ull << 20)
#define DEADLINE_NS (30ull * 1000000000ull)

/* --tls LIST (the transfer suite's UCX transports), --quick. */
extern const char *g_tls;
extern int g_quick;
/* This executable, for the child processes (not /proc/self/exe, which is
 * valgrind's tool when run under it). */
extern char g_self[4096];

/* ---- patterns (ucx_host.c) -------------------------------------------- */

void fill_pattern(uint8_t *base, uint64_t len, uint64_t seed);
/* Does [dst, +len) hold the source pattern starting at src_off? */
int check_pattern(const uint8_t *dst, uint64_t len, uint64_t seed,
                  uint64_t src_off);

/* ---- the fake agent (ucx_host.c) -------------------------------------- */

/* What the notification of the transfer under test must find in memory. */
typedef struct expect {
    int active;
    unsigned id;
    const pdx_backend_iov_t *iov;
    size_t n;
    size_t ncheck;    /* distinct pieces to verify */
    pdx_xfer_op_t op; /* the landing side: remote for WRITE, local for READ */
    uint64_t src_seed;
    uint8_t *src_base_local;  /* the initiator's region */
    uint8_t *src_base_remote; /* the target's region */
    int arrived;
    int data_ok;
    uint64_t arrived_ns;
} expect_t;

typedef struct fake_host {
    pdx_backend_host_t host;
    char name[64];
    expect_t *expect;
    unsigned notifs;
    char last_peer[64];
    /* Standalone notifications, for order checks. */
    unsigned nrecv;
    size_t recv_len[256];
    unsigned recv_tag[256];
    int recv_ok[256];
    unsigned peer_errors;
    pdx_status_t last_error;
    char error_peer[64];
} fake_host_t;

int verify_expect(const expect_t *e);
void fake_host_init(fake_host_t *h, const char *name);
/* An instance reporting to h, over `tls` when not NULL. */
pdx_status_t create_instance(fake_host_t *h, const char *tls, void **be_p);

/* A thread that progresses one instance, as the agent's progress thread
 * would, while the test thread blocks inside a call on the other. */
typedef struct bg {
    pthread_t tid;
    void *be;
    volatile int stop;
} bg_t;

void bg_start(bg_t *bg, void *be);
void bg_stop(bg_t *bg);

/* What describe says after `key`= (a count), or -1; whether it says
 * `what`. */
long describe_count(void *be, const char *key);
int describe_has(void *be, const char *what);

/* ---- the transfer suite: a connected pair (ucx_transfer.c) ------------ */

int pair_setup(void **state);
int pair_teardown(void **state);
void test_describe(void **state);
void test_xfer_small(void **state);
void test_xfer_100k(void **state);
void test_xfer_large(void **state);
void test_xfer_threaded(void **state);
void test_xfer_no_notif(void **state);
void test_xfer_release_inflight(void **state);
void test_notif_order(void **state);
void test_event_fd(void **state);

/* ---- the misc suite: options and errors (ucx_misc.c) ------------------ */

void test_query_and_table(void **state);
void test_bad_options(void **state);
void test_connect_modes(void **state);
void test_bad_args(void **state);
/* ucx_vram_sel.c */
void test_vram_choose(void **state);
void test_vram_this_ucx(void **state);

/* ---- the misc suite: peers in other processes (ucx_procs.c) ----------- */

/* The helper processes' mains (test_backend_ucx --peer-child WFD RFD TLS,
 * --stuck-sender WFD RFD). */
int peer_child_main(int wfd, int rfd, const char *tls);
int stuck_sender_main(int wfd, int rfd);
/* Kills a helper process a failed case left behind. */
int child_teardown(void **state);
void test_peer_death_tcp(void **state);
void test_peer_death_shm(void **state);
void test_release_stalled_read(void **state);
void test_release_stalled_read_served(void **state);
void test_stuck_fifo_own_worker(void **state);
void test_stuck_fifo_one_worker(void **state);
void test_hostile_served(void **state);
void test_hostile_pieces(void **state);
void test_served_pieces_shm(void **state);

#endif
