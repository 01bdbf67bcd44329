/* Two-process transfer test over UCX on loopback: a target process and an
 * initiator exchange blobs over a socketpair, then the initiator WRITEs and
 * READs 1, 1000 and 100000 descriptors of 8448 B, 41984 B and 1 MiB with a
 * notification that the target checks arrives after the data. Also: the
 * target is killed mid-transfer and a new one takes its place.
 *
 * Descriptors may overlap (100000 x 1 MiB cannot fit in 64 MiB): the data
 * at every offset is a function of the offset alone, so overlapping copies
 * write identical bytes and the result is still exactly checkable. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define REGION (64u << 20)

static ctl_pair_t g_pair = CTL_PAIR_INIT;
static uint64_t g_remote_base; /* the target's one region, from its blob */
/* 100000 x 1 MiB moves 100 GiB each way: only with --full (many minutes on
 * two cores); the default run caps that one case at 1000 descriptors. */
static int g_full;
/* Both sides' regions come from pdx_mem_alloc: cma maps the peer's memory
 * and copies with memcpy (checked through the backend's byte counts). */
static int g_shm;
static pdx_backend_h g_cma_be;
/* Cap every case's count so its descriptors are disjoint (for TSan: the
 * overlapping cases write identical bytes from two threads, by design). */
static int g_fit;

static unsigned char pattern(uint64_t off, unsigned salt)
{
    uint64_t x = (off >> 2) * 0x9e3779b97f4a7c15ull + salt;
    return (unsigned char)((x >> 29) ^ (off & 3) ^ salt);
}

static void fill(unsigned char *m, unsigned salt)
{
    for (uint64_t o = 0; o < REGION; o++) {
        m[o] = pattern(o, salt);
    }
}

/* Offset of descriptor i: spread, not aligned, inside the region. */
static uint64_t desc_off(size_t i, uint64_t size, size_t count)
{
    uint64_t span = REGION - size;
    if (count * size <= REGION) {
        /* They fit: disjoint, with a gap after every third to stop merging
         * everything into one piece. */
        uint64_t gap = (count * (size + 64) <= REGION) ? 64 : 0;
        return (i * size + (i / 3) * gap) % (span + 1);
    }
    return (i * 40961ull * 7 + (i & 7) * 8) % (span + 1);
}

/* Which bytes a case touches. */
static unsigned char *coverage(uint64_t size, size_t count)
{
    unsigned char *c = calloc(1, REGION);
    for (size_t i = 0; i < count; i++) {
        memset(c + desc_off(i, size, count), 1, size);
    }
    return c;
}

/* 0 if m holds pattern(salt) exactly where covered and 0 elsewhere. */
static int64_t verify(const unsigned char *m, uint64_t size, size_t count,
                      unsigned salt)
{
    unsigned char *c = coverage(size, count);
    int64_t bad = -1;
    for (uint64_t o = 0; o < REGION && bad < 0; o++) {
        unsigned char want = c[o] ? pattern(o, salt) : 0;
        if (m[o] != want) {
            bad = (int64_t)o;
        }
    }
    free(c);
    return bad;
}

typedef struct target_state {
    unsigned char *mem;
    int ctl;
    int notes;
} target_state_t;

static void on_target_note(void *arg, const char *peer, const void *msg,
                           size_t len)
{
    target_state_t *t = arg;
    unsigned long long size, count;
    unsigned salt;
    char reply[128];
    /* "w <size> <count> <salt>": the WRITE's data must be complete now.
     * READ requests notify too ("r"); those are only counted elsewhere. */
    if (sscanf(msg, "w %llu %llu %u", &size, &count, &salt) == 3) {
        t->notes++;
        int64_t bad = verify(t->mem, size, count, salt);
        snprintf(reply, sizeof(reply), bad < 0 ? "ok" : "bad %lld",
                 (long long)bad);
        send_msg(t->ctl, reply, (uint32_t)strlen(reply));
    }
}

static pdx_agent_h make_agent(const char *name, unsigned char **mem_p)
{
    pdx_agent_h a = ctl_pair_agent(&g_pair, name, 120000, &g_cma_be);
    unsigned char *mem = NULL;
    if (g_shm) {
        CHECK(pdx_mem_alloc(REGION, 0, (void **)&mem));
    } else if (posix_memalign((void **)&mem, 4096, REGION) != 0) {
        die("alloc");
    }
    memset(mem, 0, REGION);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)mem, REGION, 0, 0,
                           &reg));
    *mem_p = mem;
    return a;
}

static void free_mem(unsigned char *mem)
{
    if (g_shm) {
        CHECK(pdx_mem_free(mem));
    } else {
        free(mem);
    }
}

/* cma's count of bytes it moved by memcpy through a mapping, and through
 * process_vm_*: shared memory must go the first way, other memory the
 * second. */
static void check_cma_paths(void)
{
    if (!g_pair.cma) {
        return;
    }
    char d[256];
    unsigned long long by_map = 0, by_vm = 0;
    pdx_backend_describe(g_cma_be, d, sizeof(d));
    if (sscanf(d, "cma: same host: %llu bytes by memcpy into/out of peers' "
                  "shared memory, %llu by process_vm_readv/writev",
               &by_map, &by_vm) != 2) {
        die("cma describe: unexpected '%s'", d);
    }
    if (g_shm ? (by_map == 0 || by_vm != 0) : (by_map != 0 || by_vm == 0)) {
        die("cma moved %llu bytes by memcpy and %llu by process_vm_*: wrong "
            "path for %s memory", by_map, by_vm, g_shm ? "shared" : "private");
    }
    printf("  cma: %llu bytes by memcpy of mapped peer memory, %llu by "
           "process_vm_*\n", by_map, by_vm);
}

static void exchange(pdx_agent_h a, int ctl, char *peer)
{
    ctl_send_blob(a, ctl);
    ctl_load_peer(a, ctl, peer, "the initiator (control socket closed)");
}

static int target_main(int ctl)
{
    target_state_t t = {.ctl = ctl};
    char peer[PDX_NAME_MAX];
    pdx_agent_h a = make_agent("target", &t.mem);
    exchange(a, ctl, peer);
    for (;;) {
        uint32_t len;
        char *cmd = recv_msg(ctl, &len);
        if (cmd == NULL || strcmp(cmd, "quit") == 0) {
            free(cmd);
            break;
        }
        unsigned salt;
        if (strcmp(cmd, "zero") == 0) {
            memset(t.mem, 0, REGION);
        } else if (sscanf(cmd, "fill %u", &salt) == 1) {
            fill(t.mem, salt);
        } else if (strcmp(cmd, "wait-note") == 0) {
            /* As long as the initiator waits for its request. */
            uint64_t end = pdx_now_ms() + 150000;
            int before = t.notes;
            while (t.notes == before && pdx_now_ms() < end) {
                pdx_notif_poll(a, on_target_note, &t);
            }
            if (t.notes == before) {
                send_msg(ctl, "no notification", 15);
            }
            free(cmd);
            continue;
        }
        send_msg(ctl, "done", 4);
        free(cmd);
    }
    pdx_agent_destroy(a);
    free_mem(t.mem);
    return 0;
}

static pid_t spawn_target(int *ctl_p)
{
    return ctl_pair_spawn(&g_pair, g_shm ? "--shm" : NULL, ctl_p);
}

static void command(int ctl, const char *cmd, const char *expect)
{
    uint32_t len;
    send_msg(ctl, cmd, (uint32_t)strlen(cmd));
    char *r = recv_msg(ctl, &len);
    if (r == NULL || strcmp(r, expect) != 0) {
        die("command '%s': got '%s', want '%s'", cmd, r ? r : "(eof)", expect);
    }
    free(r);
}

static void run_case(pdx_agent_h a, unsigned char *mem, const char *peer,
                     int ctl, pdx_xfer_op_t op, uint64_t size, size_t count)
{
    static unsigned salt = 1;
    salt++;
    pdx_desc_t *l = malloc(count * sizeof(*l)), *r = malloc(count * sizeof(*r));
    void *rbase = (void *)(uintptr_t)g_remote_base;
    for (size_t i = 0; i < count; i++) {
        uint64_t o = desc_off(i, size, count);
        l[i] = (pdx_desc_t){.addr = (uintptr_t)mem + o, .len = size};
        r[i] = (pdx_desc_t){.addr = (uintptr_t)rbase + o, .len = size};
    }
    char note[96];
    if (op == PDX_XFER_WRITE) {
        fill(mem, salt);
        command(ctl, "zero", "done");
        snprintf(note, sizeof(note), "w %llu %zu %u",
                 (unsigned long long)size, count, salt);
    } else {
        memset(mem, 0, REGION);
        char cmd[32];
        snprintf(cmd, sizeof(cmd), "fill %u", salt);
        command(ctl, cmd, "done");
        snprintf(note, sizeof(note), "r");
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, l, count}, rl = {PDX_MEM_DRAM, r, count};
    pdx_xfer_h x;
    uint64_t t0 = pdx_now_ms();
    CHECK(pdx_xfer_create(a, op, &ll, &rl, peer, note, strlen(note) + 1, &x));
    if (op == PDX_XFER_WRITE) {
        /* The target waits for the note, then checks its memory. */
        send_msg(ctl, "wait-note", 9);
    }
    CHECK(pdx_xfer_post(x));
    pdx_status_t st = ctl_xfer_wait(x, 150000);
    uint64_t dt = pdx_now_ms() - t0;
    if (st != PDX_OK) {
        die("%s %llu x %zu: %s", op == PDX_XFER_WRITE ? "write" : "read",
            (unsigned long long)size, count, pdx_status_string(st));
    }
    size_t segs = pdx_xfer_segments(x);
    pdx_xfer_release(x);
    if (op == PDX_XFER_WRITE) {
        uint32_t len;
        char *r2 = recv_msg(ctl, &len);
        if (r2 == NULL || strcmp(r2, "ok") != 0) {
            die("write %llu x %zu: target says '%s' at its notification",
                (unsigned long long)size, count, r2 ? r2 : "(eof)");
        }
        free(r2);
    } else {
        int64_t bad = verify(mem, size, count, salt);
        if (bad >= 0) {
            die("read %llu x %zu: byte %lld differs", (unsigned long long)size,
                count, (long long)bad);
        }
    }
    printf("  %-5s %8llu B x %6zu (%zu segments): ok, %llu ms\n",
           op == PDX_XFER_WRITE ? "WRITE" : "READ", (unsigned long long)size,
           count, segs, (unsigned long long)dt);
    fflush(stdout);
    free(l);
    free(r);
}

/* Exchange blobs with a target by hand, to read the base of its one region
 * out of its blob. */
static void connect_target(pdx_agent_h a, int ctl, char *peer,
                           const char *who)
{
    ctl_send_blob(a, ctl);
    uint32_t plen;
    void *pb = recv_msg(ctl, &plen);
    if (pb == NULL) {
        die("%s did not start (tls %s)", who, g_pair.tls);
    }
    char *text = NULL, why[256];
    CHECK(pdx_blob_describe(pb, plen, &text, why, sizeof(why)));
    char *line = strstr(text, "DRAM 0x");
    if (line == NULL || sscanf(line, "DRAM 0x%lx", &g_remote_base) != 1) {
        die("no DRAM region in the %s's blob", who);
    }
    pdx_blob_free(text);
    CHECK(pdx_peer_load(a, pb, plen, peer));
    free(pb);
}

static int initiator_main(int kill_test)
{
    int ctl;
    pid_t pid = spawn_target(&ctl);
    unsigned char *mem;
    char peer[PDX_NAME_MAX];
    pdx_agent_h a = make_agent("initiator", &mem);
    connect_target(a, ctl, peer, "target");

    if (!kill_test) {
        const uint64_t sizes[] = {8448, 41984, 1u << 20};
        const size_t counts[] = {1, 1000, 100000};
        for (int s = 0; s < 3; s++) {
            for (int c = 0; c < 3; c++) {
                size_t n = counts[c];
                if (!g_full && sizes[s] == (1u << 20) && n > 1000u) {
                    n = 1000u;
                }
                if (g_fit && n * (sizes[s] + 64) > REGION) {
                    n = REGION / (sizes[s] + 64);
                }
                run_case(a, mem, peer, ctl, PDX_XFER_WRITE, sizes[s], n);
                run_case(a, mem, peer, ctl, PDX_XFER_READ, sizes[s], n);
            }
        }
        send_msg(ctl, "quit", 4);
        int status;
        waitpid(pid, &status, 0);
        close(ctl);
        check_cma_paths();
        pdx_agent_destroy(a);
        free_mem(mem);
        printf("twoproc (%s%s): all cases byte-exact\n", g_pair.tls,
               g_shm ? ", shared memory" : "");
        return 0;
    }

    /* Kill the target while WRITEs of the whole region are in flight. */
    pdx_desc_t l = {.addr = (uintptr_t)mem, .len = REGION};
    pdx_desc_t r = {.addr = g_remote_base, .len = REGION};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    CHECK(pdx_xfer_create(a, PDX_XFER_WRITE, &ll, &rl, peer, NULL, 0, &x));
    pdx_status_t st = PDX_OK;
    uint64_t killed_at = 0, end = pdx_now_ms() + 30000;
    int posts = 0;
    while (pdx_now_ms() < end) {
        if (st != PDX_INPROGRESS) {
            st = pdx_xfer_post(x);
            posts++;
        }
        if (posts == 3 && killed_at == 0) {
            kill(pid, SIGKILL);
            killed_at = pdx_now_ms();
        }
        if (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(x);
        }
        if (st < 0) {
            break;
        }
    }
    if (st != PDX_ERR_REMOTE_DISCONNECT) {
        die("after kill: got %s, want remote disconnected",
            pdx_status_string(st));
    }
    printf("  killed target: request failed with '%s' %llu ms after the "
           "kill\n", pdx_status_string(st),
           (unsigned long long)(pdx_now_ms() - killed_at));
    if (pdx_xfer_post(x) != PDX_ERR_REMOTE_DISCONNECT) {
        die("post to a dead peer did not fail");
    }
    pdx_xfer_release(x);
    int status;
    waitpid(pid, &status, 0);
    close(ctl);

    /* A new target (same name, new instance): memory still registered. */
    pid = spawn_target(&ctl);
    connect_target(a, ctl, peer, "second target");
    run_case(a, mem, peer, ctl, PDX_XFER_WRITE, 41984, 1000);
    run_case(a, mem, peer, ctl, PDX_XFER_READ, 41984, 1000);
    send_msg(ctl, "quit", 4);
    waitpid(pid, &status, 0);
    close(ctl);
    check_cma_paths();
    pdx_agent_destroy(a);
    free_mem(mem);
    printf("twoproc kill (%s): disconnect seen, new peer byte-exact\n",
           g_pair.tls);
    return 0;
}

int main(int argc, char **argv)
{
    g_pair.self = argv[0];
    int kill_test = 0;
    for (int i = 1; i < argc; i++) {
        if (ctl_pair_option(&g_pair, argc, argv, &i)) {
            continue;
        } else if (strcmp(argv[i], "--shm") == 0) {
            g_shm = 1;
        } else if (strcmp(argv[i], "--fit") == 0) {
            g_fit = 1;
        } else if (strcmp(argv[i], "--full") == 0) {
            g_full = 1;
        } else if (strcmp(argv[i], "--kill") == 0) {
            kill_test = 1;
        } else {
            die("usage: %s [--tls TLS] [--cma [--shm]] [--kill] [--full] [--fit]", argv[0]);
        }
    }
    signal(SIGPIPE, SIG_IGN);
    alarm(g_full ? 1800 : 600); /* never hang a test run */
    if (g_pair.target_fd >= 0) {
        return target_main(g_pair.target_fd);
    }
    return initiator_main(kill_test);
}
