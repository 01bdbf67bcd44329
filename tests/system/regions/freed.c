/* A region the target frees while an initiator reads it (issue 21, item
 * 4; issue 38, item 1 with --oneway), two processes over loopback (UCX
 * shm or TCP, or cma):
 *
 * D reads P's region F over and over (one request made once from
 * prepared lists and reposted) when P deregisters F and at once unmaps
 * it. pdx_mem_deregister tells D and waits for D's acknowledgement, so:
 * P stays alive (over UCX shm a get is P's own memcpy: before, P died of
 * SIGSEGV); every READ of F that D posts after P's deregister returned
 * ends PDX_ERR_STALE (over cma it returned OK with whatever was there);
 * every READ that ended OK is byte-exact; a request made afterwards from
 * the prepared lists is refused STALE; P's stable region still reads
 * byte-exact; neither application sees a notification; P exits 0.
 *
 * --oneway: P never loads D's blob (vLLM's pull shape), so no notice
 * reaches D: P refuses D's requests for the region it no longer has
 * before touching memory (UCX: its service checks the region's token;
 * cma: the region's revocation word), and every READ D posts after P's
 * deregister returned ends STALE, reposts and new requests from the
 * prepared lists included; P lives.
 *
 * Bounded: every wait has a deadline; the test has a ctest timeout. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define FREED (8u << 20)
#define NCHUNK 8
#define STABLE (1u << 20)

static ctl_pair_t g_pair = CTL_PAIR_INIT;
static int g_oneway;

static unsigned char pattern(uint64_t off, unsigned salt)
{
    return (unsigned char)(off * 131 + (off >> 12) + salt);
}

static pdx_agent_h make_agent(const char *name)
{
    return ctl_pair_agent(&g_pair, name, 10000, NULL);
}

static void load_blob(pdx_agent_h a, int ctl)
{
    ctl_load_peer(a, ctl, NULL, "the other side (control socket closed)");
}

static char *expect(int ctl, const char *what)
{
    char *m = recv_msg(ctl, NULL);
    if (m == NULL || strncmp(m, what, strlen(what)) != 0) {
        die("expected '%s' on the control socket, got '%s'", what,
            m ? m : "EOF");
    }
    return m;
}

static void on_notif(void *arg, const char *peer, const void *msg,
                     size_t len)
{
    (void)arg;
    fprintf(stderr, "unexpected notification of %zu bytes from %s\n", len,
            peer);
    (void)msg;
}

/* P: F (shared memory under cma, so D maps it; a private mapping over
 * UCX) and a stable region; on "go" deregister F and unmap it at once. */
static int target_main(int ctl)
{
    pdx_agent_h a = make_agent("P");
    unsigned char *f;
    if (g_pair.cma) {
        CHECK(pdx_mem_alloc(FREED, PDX_MEM_F_POPULATE, (void **)&f));
    } else {
        f = mmap(NULL, FREED, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (f == MAP_FAILED) {
            die("mmap: %s", strerror(errno));
        }
    }
    unsigned char *stable = NULL;
    if (posix_memalign((void **)&stable, 4096, STABLE) != 0) {
        die("out of memory");
    }
    for (uint64_t o = 0; o < FREED; o++) {
        f[o] = pattern(o, 0);
    }
    for (uint64_t o = 0; o < STABLE; o++) {
        stable[o] = pattern(o, 7);
    }
    pdx_mem_reg_h freg, sreg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)f, FREED, 0, 0,
                           &freg));
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)stable, STABLE, 0, 0,
                           &sreg));
    ctl_send_addrs(ctl, (uintptr_t)f, (uintptr_t)stable);
    ctl_send_blob(a, ctl);
    if (g_oneway) {
        free(expect(ctl, "blob")); /* D's, never loaded */
    } else {
        load_blob(a, ctl); /* D: so a deregistration can reach it */
    }
    free(expect(ctl, "go"));
    uint64_t t0 = pdx_now_ms();
    CHECK(pdx_mem_deregister(a, freg));
    uint64_t took = pdx_now_ms() - t0;
    /* The caller may free the memory now: do it before anything else. */
    if (g_pair.cma) {
        CHECK(pdx_mem_free(f));
    } else if (munmap(f, FREED) != 0) {
        die("munmap: %s", strerror(errno));
    }
    char msg[64];
    snprintf(msg, sizeof(msg), "freed %llu", (unsigned long long)took);
    send_msg(ctl, msg, (uint32_t)strlen(msg));
    free(expect(ctl, "quit"));
    /* The removal notice and its acknowledgement are pdx's own messages:
     * the application's queue never sees them. */
    int nq = pdx_notif_poll(a, on_notif, NULL);
    if (nq != 0) {
        fprintf(stderr, "FAIL: P's application got %d notifications\n", nq);
        return 3;
    }
    CHECK(pdx_mem_deregister(a, sreg));
    pdx_agent_destroy(a);
    free(stable);
    return 0;
}

typedef struct reader {
    pdx_xfer_h x;
    unsigned char *mem;
    int freed;            /* atomic: P's deregister returned */
    int stop;             /* atomic */
    unsigned long ok, stale, ok_after, bad_bytes, other;
    char other_what[200];
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    uint64_t end = pdx_now_ms() + 20000;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE) && pdx_now_ms() < end) {
        int after = __atomic_load_n(&r->freed, __ATOMIC_ACQUIRE);
        memset(r->mem, 0, FREED);
        pdx_status_t st = ctl_xfer_run(r->x, 5000);
        if (st == PDX_OK) {
            r->ok++;
            r->ok_after += after;
            for (uint64_t o = 0; o < FREED; o += 4093) {
                if (r->mem[o] != pattern(o, 0)) {
                    r->bad_bytes++;
                    break;
                }
            }
        } else if (st == PDX_ERR_STALE) {
            r->stale++;
            if (after) {
                break; /* refused as it must be from now on */
            }
        } else {
            if (r->other++ == 0) {
                snprintf(r->other_what, sizeof(r->other_what), "%s (%s)",
                         pdx_status_string(st), pdx_last_error());
            }
            break;
        }
    }
    return NULL;
}

static int initiator_main(void)
{
    int ctl;
    pid_t pid = ctl_pair_spawn(&g_pair, g_oneway ? "--oneway" : NULL, &ctl);
    pdx_agent_h a = make_agent("D");
    uint64_t rf, rs;
    ctl_recv_addrs(ctl, "P", &rf, &rs);
    load_blob(a, ctl);
    if (g_oneway) {
        send_msg(ctl, "blob", 4);
    } else {
        ctl_send_blob(a, ctl);
    }

    unsigned char *mem = NULL;
    if (posix_memalign((void **)&mem, 4096, FREED) != 0) {
        die("out of memory");
    }
    pdx_mem_reg_h lreg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)mem, FREED, 0, 0,
                           &lreg));
    /* NCHUNK pieces of F, then the stable region, on both sides. */
    pdx_desc_t ld[NCHUNK + 1], rd[NCHUNK + 1];
    uint64_t piece = FREED / NCHUNK;
    for (int i = 0; i < NCHUNK; i++) {
        ld[i] = (pdx_desc_t){.addr = (uintptr_t)mem + i * piece, .len = piece};
        rd[i] = (pdx_desc_t){.addr = rf + i * piece, .len = piece};
    }
    ld[NCHUNK] = (pdx_desc_t){.addr = (uintptr_t)mem, .len = STABLE};
    rd[NCHUNK] = (pdx_desc_t){.addr = rs, .len = STABLE};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, ld, NCHUNK + 1};
    pdx_desc_list_t rl = {PDX_MEM_DRAM, rd, NCHUNK + 1};
    pdx_dlist_h lh, rh;
    CHECK(pdx_dlist_prepare(a, NULL, &ll, &lh));
    CHECK(pdx_dlist_prepare(a, "P", &rl, &rh));
    uint32_t idx[NCHUNK];
    for (uint32_t i = 0; i < NCHUNK; i++) {
        idx[i] = i;
    }
    pdx_xfer_h x;
    CHECK(pdx_xfer_make(a, PDX_XFER_READ, lh, idx, rh, idx, NCHUNK, NULL, 0,
                        &x));

    reader_t r = {.x = x, .mem = mem};
    pthread_t th;
    if (pthread_create(&th, NULL, reader_main, &r) != 0) {
        die("pthread_create failed");
    }
    /* Let some READs go through first, then race the deregistration. */
    uint64_t end = pdx_now_ms() + 10000;
    while (__atomic_load_n(&r.ok, __ATOMIC_RELAXED) < 20 &&
           pdx_now_ms() < end && r.other == 0) {
        usleep(1000);
    }
    send_msg(ctl, "go", 2);
    char *freed = expect(ctl, "freed");
    unsigned long long took = 0;
    sscanf(freed, "freed %llu", &took);
    free(freed);
    __atomic_store_n(&r.freed, 1, __ATOMIC_RELEASE);
    /* The next READ the reader posts must be refused. */
    end = pdx_now_ms() + 10000;
    while (r.stale == 0 && r.other == 0 && pdx_now_ms() < end) {
        usleep(1000);
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);

    int fails = 0;
    printf("regions_freed (%s%s%s): %lu READs of F ok before, %lu STALE, "
           "deregister took %llu ms\n", g_pair.tls,
           g_pair.cma ? "+cma" : "", g_oneway ? ", one-way" : "", r.ok,
           r.stale, took);
    if (r.other > 0) {
        fprintf(stderr, "FAIL: a READ of F ended %s\n", r.other_what);
        fails++;
    }
    if (r.ok_after > 0) {
        fprintf(stderr, "FAIL: %lu READs of F posted after the deregister "
                "returned ended OK (stale memory read)\n", r.ok_after);
        fails++;
    }
    if (r.stale == 0) {
        fprintf(stderr, "FAIL: no READ of F ended STALE\n");
        fails++;
    }
    if (r.bad_bytes > 0) {
        fprintf(stderr, "FAIL: %lu READs of F that ended OK were not "
                "byte-exact\n", r.bad_bytes);
        fails++;
    }
    if (r.ok < 20) {
        fprintf(stderr, "FAIL: only %lu READs of F before the race\n", r.ok);
        fails++;
    }
    /* Reposting, and a new request from the prepared lists, are refused
     * (one-way: D still lists the region, so P refuses them). */
    pdx_status_t st = g_oneway ? ctl_xfer_run(x, 5000) : pdx_xfer_post(x);
    if (st != PDX_ERR_STALE) {
        fprintf(stderr, "FAIL: repost after the removal: %s, want STALE\n",
                pdx_status_string(st));
        fails++;
    }
    pdx_xfer_h x2 = NULL;
    st = pdx_xfer_make(a, PDX_XFER_READ, lh, idx, rh, idx, 1, NULL, 0, &x2);
    if (g_oneway && st == PDX_OK) {
        st = ctl_xfer_run(x2, 5000);
        pdx_xfer_release(x2);
        x2 = NULL;
    }
    if (st != PDX_ERR_STALE) {
        fprintf(stderr, "FAIL: make on the removed region: %s, want STALE\n",
                pdx_status_string(st));
        fails++;
        if (st == PDX_OK && x2 != NULL) {
            pdx_xfer_release(x2);
        }
    }
    /* P is alive and its stable region reads byte-exact through the same
     * prepared lists. */
    uint32_t si = NCHUNK;
    memset(mem, 0, STABLE);
    CHECK(pdx_xfer_make(a, PDX_XFER_READ, lh, &si, rh, &si, 1, NULL, 0, &x2));
    st = ctl_xfer_run(x2, 5000);
    if (st != PDX_OK) {
        fprintf(stderr, "FAIL: READ of P's stable region: %s (%s)\n",
                pdx_status_string(st), pdx_last_error());
        fails++;
    } else {
        for (uint64_t o = 0; o < STABLE; o++) {
            if (mem[o] != pattern(o, 7)) {
                fprintf(stderr, "FAIL: stable byte %llu differs\n",
                        (unsigned long long)o);
                fails++;
                break;
            }
        }
    }
    pdx_xfer_release(x2);
    int nq = pdx_notif_poll(a, on_notif, NULL);
    if (nq != 0) {
        fprintf(stderr, "FAIL: D's application got %d notifications\n", nq);
        fails++;
    }
    pdx_xfer_release(x);
    pdx_dlist_release(lh);
    pdx_dlist_release(rh);
    send_msg(ctl, "quit", 4);
    int status = 0;
    end = pdx_now_ms() + 10000;
    pid_t w = 0;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && pdx_now_ms() < end) {
        usleep(10000);
    }
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fprintf(stderr, "FAIL: P did not exit within 10 s\n");
        fails++;
    } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "FAIL: P died of signal %d\n", WTERMSIG(status));
        fails++;
    } else if (WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: P exited %d\n", WEXITSTATUS(status));
        fails++;
    }
    CHECK(pdx_mem_deregister(a, lreg));
    pdx_agent_destroy(a);
    free(mem);
    close(ctl);
    if (fails == 0) {
        printf("regions_freed: ok\n");
    }
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    g_pair.self = argv[0];
    for (int i = 1; i < argc; i++) {
        if (ctl_pair_option(&g_pair, argc, argv, &i)) {
            continue;
        } else if (strcmp(argv[i], "--oneway") == 0) {
            g_oneway = 1;
        } else {
            die("usage: %s [--tls sm|tcp] [--cma] [--oneway]", argv[0]);
        }
    }
    signal(SIGPIPE, SIG_IGN);
    if (g_pair.target_fd >= 0) {
        return target_main(g_pair.target_fd);
    }
    return initiator_main();
}
