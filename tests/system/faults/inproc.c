/* Two agents in one process: A has READs of 64 MiB from B in flight when B
 * is destroyed (or, --unload, when A unloads B). A's requests must end with
 * an error within 2 s (not at the 10 s request timeout), B's peer state in
 * A must say it is gone, and A must be destroyed cleanly (no UCX
 * assertion: the process exits 0). --exit: the process calls exit() with
 * both agents and the READs alive; it must exit 0 within 5 s.
 *
 * inproc --path ucx|shm [--unload | --exit] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define LEN (64u << 20)
#define NREQ 4

int main(int argc, char **argv)
{
    const char *path = "ucx";
    int unload = 0, at_exit = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--unload") == 0) {
            unload = 1;
        } else if (strcmp(argv[i], "--exit") == 0) {
            at_exit = 1;
        }
    }
    int shm = strcmp(path, "shm") == 0;
    alarm(60);
    pdx_agent_params_t ap = {
        .field_mask = PDX_AGENT_PARAM_FLAGS | PDX_AGENT_PARAM_XFER_TIMEOUT,
        .flags = PDX_AGENT_F_PROGRESS_THREAD, .xfer_timeout_ms = 10000};
    pdx_agent_h a, b;
    CHECK(pdx_agent_create("inproc-a", &ap, &a));
    CHECK(pdx_agent_create("inproc-b", &ap, &b));
    pdx_option_t tls = {"tls", "sm"};
    CHECK(pdx_backend_create(a, "ucx", &tls, 1, NULL));
    CHECK(pdx_backend_create(b, "ucx", &tls, 1, NULL));
    if (shm) {
        CHECK(pdx_backend_create(a, "cma", NULL, 0, NULL));
        CHECK(pdx_backend_create(b, "cma", NULL, 0, NULL));
    }
    unsigned char *src, *dst;
    if (shm) {
        CHECK(pdx_mem_alloc(LEN, PDX_MEM_F_POPULATE, (void **)&src));
    } else if ((src = aligned_alloc(4096, LEN)) == NULL) {
        die("out of memory");
    }
    if ((dst = aligned_alloc(4096, (size_t)LEN * NREQ)) == NULL) {
        die("out of memory");
    }
    memset(src, 0x3c, LEN);
    pdx_mem_reg_h rs, rd;
    CHECK(pdx_mem_register(b, PDX_MEM_DRAM, (uint64_t)(uintptr_t)src, LEN, 0,
                           0, &rs));
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)dst,
                           (uint64_t)LEN * NREQ, 0, 0, &rd));
    void *blob;
    size_t blen;
    char peer[PDX_NAME_MAX];
    CHECK(pdx_agent_describe(b, &blob, &blen));
    CHECK(pdx_peer_load(a, blob, blen, peer));
    pdx_blob_free(blob);
    pdx_xfer_h x[NREQ];
    pdx_status_t st[NREQ];
    for (int i = 0; i < NREQ; i++) {
        pdx_desc_t l = {(uint64_t)(uintptr_t)(dst + (size_t)i * LEN), LEN, 0,
                        0};
        pdx_desc_t r = {(uint64_t)(uintptr_t)src, LEN, 0, 0};
        pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
        CHECK(pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, peer, NULL, 0,
                              &x[i]));
        st[i] = pdx_xfer_post(x[i]);
        if (st[i] < 0) {
            die("post: %s", pdx_last_error());
        }
    }
    if (at_exit) {
        /* exit() runs pdx's and UCX's destructors with everything alive;
         * SIGALRM (default action: the process dies) bounds it at 5 s. */
        printf("exit with %d READs of %u MiB in flight\n", NREQ, LEN >> 20);
        fflush(stdout);
        alarm(5);
        exit(0);
    }
    uint64_t t0 = pdx_now_ms();
    if (unload) {
        CHECK(pdx_peer_unload(a, peer));
    } else {
        pdx_mem_deregister(b, rs);
        pdx_agent_destroy(b);
    }
    uint64_t t1 = pdx_now_ms();
    int bad = 0, ended_err = 0;
    for (int i = 0; i < NREQ; i++) {
        while (st[i] == PDX_INPROGRESS && pdx_now_ms() - t1 < 15000) {
            st[i] = pdx_xfer_check(x[i]);
        }
        uint64_t at = pdx_now_ms() - t1;
        printf("READ %d ended '%s' %llu ms after the %s%s%s\n", i,
               pdx_status_string(st[i]), (unsigned long long)at,
               unload ? "unload" : "destroy", st[i] < 0 ? ": " : "",
               st[i] < 0 ? pdx_last_error() : "");
        if (st[i] == PDX_INPROGRESS || at > 2000) {
            fprintf(stderr, "FAIL: READ %d not ended within 2 s\n", i);
            bad = 1;
        }
        ended_err += st[i] < 0;
        pdx_xfer_release(x[i]);
    }
    /* Over cma the initiator's own mapping of B's memory stays valid:
     * a READ that was already copying may complete; over UCX none can. */
    if (!shm && ended_err == 0) {
        fprintf(stderr, "FAIL: no READ failed\n");
        bad = 1;
    }
    pdx_status_t ps = pdx_peer_state(a, peer);
    printf("peer state after: %s (%s)\n", pdx_status_string(ps),
           ps < 0 ? pdx_last_error() : "");
    if (ps == PDX_OK) {
        fprintf(stderr, "FAIL: peer still alive in A\n");
        bad = 1;
    }
    if (unload) {
        pdx_mem_deregister(b, rs);
        pdx_agent_destroy(b);
    }
    uint64_t t2 = pdx_now_ms();
    pdx_mem_deregister(a, rd);
    pdx_agent_destroy(a);
    printf("destroy of A took %llu ms (B's %s took %llu ms)\n",
           (unsigned long long)(pdx_now_ms() - t2),
           unload ? "unload" : "destroy", (unsigned long long)(t1 - t0));
    if (shm) {
        pdx_mem_free(src);
    } else {
        free(src);
    }
    free(dst);
    printf("%s\n", bad ? "FAIL" : "PASS");
    return bad;
}
