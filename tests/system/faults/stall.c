/* No stall while a peer dies or hangs: D holds READs in flight to two
 * target processes P1 and P2; P1 is killed (SIGKILL) or stopped (SIGSTOP)
 * mid-run. A second thread of D calls pdx_peer_state, pdx_xfer_check (on
 * its own requests) and pdx_notif_poll in a loop the whole time, timing
 * every call. Passes when
 *   - P1's requests end with PDX_ERR_REMOTE_DISCONNECT or PDX_ERR_TIMEOUT
 *     (or, over shared memory, complete byte-exact: a stopped peer's
 *     mapped memory needs no CPU of its own; over UCX sm READs did too
 *     once in 25 runs),
 *   - P2's transfers complete byte-exact during the fault,
 *   - the other thread's longest single call is under 50 ms (a call
 *     during which the kernel preempted a thread of this process, or one
 *     that a thread of this process spent waiting for a CPU long enough
 *     to explain (the lock holder, or the caller: its run-queue wait in
 *     /proc/self/task/N/schedstat), is reported apart: it measures the
 *     machine's load, not pdx; it must still end within 1 s),
 *   - every wait is bounded (the whole run is under a minute).
 * Prints p50, p99 and max of the other thread's calls.
 *
 * stall --mode kill|stop [--path ucx|ucx-tcp|shm] [--p1-write]
 *       [--peer-workers auto|off] [--piece-kib N]
 * (--p1-write: P1's requests are WRITEs, whose flush a stopped peer never
 * acknowledges: they must end too, and the peer be given up on.
 * --peer-workers: the ucx backend's option. With off, every reply comes
 * back to D's one worker: over UCX sm, a P1 stopped or killed between
 * taking a slot of D's receive FIFO and filling it (a get's reply, 8 KiB
 * copied in between) blocks P2's replies behind it, and P2's READs time
 * out: 2 of 40 stop runs and 1 of 30 kill runs did, before the option.) */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define REGION (16u << 20)
/* A piece (--piece-kib; 64 KiB by default): each goes as one chunk; over
 * tcp one above 64 KiB goes by rendezvous. */
static uint32_t g_piece = 64u << 10;
#define PIECE g_piece
/* One READ: 16 x 64 KiB = 1 MiB. With 4 MiB READs (64 pieces) and a
 * 1.5 s request timeout, the healthy peer's longest READ took up to 546
 * ms beside ctest -j2 and pdx-bench on 2 cores, and once passed the
 * timeout: a test of the machine's load, not of pdx. 1 MiB READs still
 * took up to 342 ms there (the run-queue waits of D and P2 dominate, not
 * the bytes), so the timeout is XFER_TIMEOUT_MS, and the run long enough
 * for it and the drain of P1's aborted requests (1 s) after the fault. */
#define PIECES 16
#define XFER_TIMEOUT_MS 2500
#define INFLIGHT 4 /* READs in flight per peer from the main thread */
#define SAMPLES (4u << 20)
/* The bound the issue sets for the other thread's longest call. Under a
 * sanitizer every instruction costs several times more and the bound is
 * not meaningful: it is relaxed there (and printed). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MAX_CALL_MS 250.0
#define MAX_CALL_NOTE " (relaxed: sanitizer build)"
#else
#define MAX_CALL_MS 50.0
#define MAX_CALL_NOTE ""
#endif

static const char *g_self;
static const char *g_path = "ucx"; /* ucx (sm), ucx-tcp, shm (cma) */
static int g_stop;                 /* SIGSTOP instead of SIGKILL */
static int g_p1_write;             /* P1's requests are WRITEs */
static const char *g_peer_workers = "auto"; /* the ucx option */

static unsigned char pattern(uint64_t off, unsigned salt)
{
    uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + salt * 0x1234567ull;
    return (unsigned char)((x >> 31) ^ (off & 7) ^ salt);
}

static pdx_backend_h g_ucx; /* this process's last ucx backend */

static void backends(pdx_agent_h a)
{
    pdx_option_t workers = {"peer_workers", g_peer_workers};
    ctl_path_backends(a, g_path, &workers, &g_ucx);
}

/* ---- target ------------------------------------------------------------ */

static void on_any_note(void *arg, const char *peer, const void *m, size_t n)
{
    (void)arg, (void)peer, (void)m, (void)n;
}

/* A target: one region of pattern(salt), its blob to the parent, then D's
 * blob back; sends D a heartbeat notification every 10 ms until killed or
 * the control socket closes. */
static int target_main(int fd, const char *name, unsigned salt)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    pdx_agent_h a;
    CHECK(pdx_agent_create(name, &ap, &a));
    backends(a);
    unsigned char *mem = ctl_path_alloc(g_path, REGION);
    for (uint64_t o = 0; o < REGION; o++) {
        mem[o] = pattern(o, salt);
    }
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)mem, REGION,
                           0, 0, &reg));
    char dname[PDX_NAME_MAX];
    ctl_handshake_target(a, fd, dname);
    for (unsigned i = 0;; i++) {
        char hb[32];
        int n = snprintf(hb, sizeof(hb), "hb %u", i);
        pdx_notif_send(a, dname, hb, (size_t)n);
        pdx_notif_poll(a, on_any_note, NULL);
        struct timeval tv = {0, 10000};
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(fd, &rd);
        if (select(fd + 1, &rd, NULL, NULL, &tv) > 0) {
            break; /* the parent closed the socket or said stop */
        }
    }
    pdx_mem_deregister(a, reg);
    pdx_agent_destroy(a);
    return 0;
}

typedef struct target {
    pid_t pid;
    int fd;
    char name[PDX_NAME_MAX];
    unsigned salt;
    uint64_t base; /* its region, from its blob */
} target_t;

static void target_start(target_t *t, const char *name, unsigned salt)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        die("socketpair: %s", strerror(errno));
    }
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->salt = salt;
    pid_t parent = getpid();
    t->pid = fork();
    if (t->pid < 0) {
        die("fork: %s", strerror(errno));
    }
    if (t->pid == 0) {
        /* Whatever way D ends (die, alarm), a target it leaves, stopped or
         * not, is killed with it: a stopped child holding D's output would
         * keep ctest waiting until its own timeout. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127); /* D was already gone */
        }
        close(sv[0]);
        char fdarg[16], saltarg[16];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        snprintf(saltarg, sizeof(saltarg), "%u", salt);
        int fl = fcntl(sv[1], F_GETFD);
        fcntl(sv[1], F_SETFD, fl & ~FD_CLOEXEC);
        execl(g_self, g_self, "--target", fdarg, name, saltarg, "--path",
              g_path, "--peer-workers", g_peer_workers, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    t->fd = sv[0];
}

static void target_connect(target_t *t, pdx_agent_h d)
{
    char name[PDX_NAME_MAX];
    pdx_peer_info_t info;
    pdx_region_info_t r;
    ctl_handshake_initiator(d, t->fd, t->name, name, &info, &r, 1);
    if (info.nregions != 1 || r.len != REGION) {
        die("%s: %zu regions", name, info.nregions);
    }
    t->base = r.addr;
}

/* ---- D ----------------------------------------------------------------- */

/* Run-queue waits of this process's threads: schedstat's run_delay (ns a
 * thread was runnable but not running), per thread id. */
#define WAIT_TASKS 64
typedef struct waits {
    int n;
    int tid[WAIT_TASKS];
    uint64_t ns[WAIT_TASKS];  /* run-queue wait */
    uint64_t run[WAIT_TASKS]; /* time on a CPU */
} waits_t;

/* false where the kernel has no schedstat (then only preemptions count). */
static bool waits_take(waits_t *w)
{
    w->n = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL) {
        return false;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && w->n < WAIT_TASKS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') {
            continue;
        }
        char path[64], buf[128];
        snprintf(path, sizeof(path), "/proc/self/task/%s/schedstat",
                 e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        ssize_t k = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        unsigned long long run, wait;
        if (k <= 0) {
            continue;
        }
        buf[k] = '\0';
        if (sscanf(buf, "%llu %llu", &run, &wait) == 2) {
            w->tid[w->n] = atoi(e->d_name);
            w->run[w->n] = run;
            w->ns[w->n++] = wait;
        }
    }
    closedir(d);
    return w->n > 0;
}

/* The longest run-queue wait one thread had between two snapshots. */
static uint64_t waits_max(const waits_t *a, const waits_t *b)
{
    uint64_t mx = 0;
    for (int i = 0; i < b->n; i++) {
        uint64_t was = 0;
        for (int j = 0; j < a->n; j++) {
            if (a->tid[j] == b->tid[i]) {
                was = a->ns[j];
                break;
            }
        }
        uint64_t dw = b->ns[i] > was ? b->ns[i] - was : 0;
        mx = dw > mx ? dw : mx;
    }
    return mx;
}

typedef struct monitor {
    pdx_agent_h d;
    target_t *t[2];
    unsigned char *buf; /* two 64 KiB pieces, one per peer */
    atomic_int stop;
    uint64_t *samples;
    size_t nsamples;
    uint64_t max_ns; /* longest call no thread of this process was
                      * preempted during */
    char max_what[32];
    uint64_t max_preempted_ns; /* longest call during which one was */
    unsigned preempted_long;   /* calls over 5 ms with a preemption */
    waits_t waits;             /* run-queue waits, taken before calls */
    uint64_t waits_ns;         /* when (0: never or no schedstat) */
    unsigned waited_long;      /* calls over 5 ms a thread's wait explains */
    unsigned notifs, reads_ok[2], reads_err[2];
    /* The watchdog (watch_main): when the timed call began (0: none) and
     * what it is; what every thread of D was doing once a call passed
     * WATCH_MS (the first such call only). */
    _Atomic uint64_t call_t0;
    const char *_Atomic call_what;
    char dump[8192];
    atomic_int dumped;
    atomic_int mon_tid; /* the timed thread's */
} monitor_t;

#define WATCH_MS 30

/* The first line of /proc/self/task/TID/FILE, without its newline ("?"
 * if it cannot be read). */
static void task_line(const char *tid, const char *file, char *buf,
                      size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "/proc/self/task/%s/%s", tid, file);
    FILE *f = fopen(path, "r");
    if (f == NULL || fgets(buf, (int)len, f) == NULL) {
        snprintf(buf, len, "?");
    }
    if (f != NULL) {
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = '\0';
}

/* What every thread of this process is doing now: name, state, kernel
 * wait channel and current system call (number and first argument: a
 * futex's address, an fd), one line each. */
static void threads_dump(char *out, size_t len)
{
    size_t used = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL) {
        snprintf(out, len, "(no /proc/self/task)");
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && used + 256 < len) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char comm[64], stat[512], wchan[64], sc[256];
        task_line(e->d_name, "comm", comm, sizeof(comm));
        task_line(e->d_name, "stat", stat, sizeof(stat));
        task_line(e->d_name, "wchan", wchan, sizeof(wchan));
        task_line(e->d_name, "syscall", sc, sizeof(sc));
        const char *rp = strrchr(stat, ')');
        char state = rp != NULL && rp[1] == ' ' ? rp[2] : '?';
        char *third = sc; /* keep "nr arg1" */
        for (int k = 0; k < 2 && third != NULL; k++) {
            third = strchr(third + 1, ' ');
        }
        if (third != NULL) {
            *third = '\0';
        }
        int w = snprintf(out + used, len - used,
                         "  tid %s %-15s state %c wchan %s syscall %s\n",
                         e->d_name, comm, state, wchan, sc);
        if (w > 0) {
            used += (size_t)w;
        }
    }
    closedir(d);
}

/* Looks every 2 ms whether the monitor's timed call has run past
 * WATCH_MS, and if so (once) what every thread of D is doing. */
static void *watch_main(void *arg)
{
    monitor_t *m = arg;
    while (!atomic_load(&m->stop) && !atomic_load(&m->dumped)) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        uint64_t t0 = atomic_load(&m->call_t0);
        if (t0 != 0 && pdx_now_ns() - t0 > WATCH_MS * 1000000ull) {
            char head[192];
            snprintf(head, sizeof(head), "%s running for %.1f ms (in tid "
                     "%d; D's main thread is tid %d):\n",
                     atomic_load(&m->call_what),
                     (double)(pdx_now_ns() - t0) / 1e6,
                     atomic_load(&m->mon_tid), (int)getpid());
            size_t hl = strlen(head);
            memcpy(m->dump, head, hl + 1);
            threads_dump(m->dump + hl, sizeof(m->dump) - hl);
            /* Then, until the call ends (at most 2 s): how long each
             * thread was on a CPU and how long it waited for one. A call
             * that long with neither, for the caller, was not the guest's
             * doing (the VM itself did not run). */
            waits_t a, b;
            bool have = waits_take(&a);
            uint64_t ta = pdx_now_ns();
            while (atomic_load(&m->call_t0) == t0 &&
                   pdx_now_ns() - ta < 2000000000ull) {
                struct timespec ms1 = {0, 1000000};
                nanosleep(&ms1, NULL);
            }
            uint64_t tb = pdx_now_ns();
            if (have && waits_take(&b)) {
                size_t used = strlen(m->dump);
                int w = snprintf(m->dump + used, sizeof(m->dump) - used,
                                 "  over the next %.1f ms (to the call's "
                                 "end):\n", (double)(tb - ta) / 1e6);
                used += w > 0 ? (size_t)w : 0;
                for (int i = 0; i < b.n && used + 128 < sizeof(m->dump);
                     i++) {
                    for (int j = 0; j < a.n; j++) {
                        if (a.tid[j] != b.tid[i]) {
                            continue;
                        }
                        w = snprintf(m->dump + used, sizeof(m->dump) - used,
                                     "  tid %d on a CPU %.1f ms, waiting "
                                     "for one %.1f ms\n", b.tid[i],
                                     (double)(b.run[i] - a.run[j]) / 1e6,
                                     (double)(b.ns[i] - a.ns[j]) / 1e6);
                        used += w > 0 ? (size_t)w : 0;
                    }
                }
            }
            atomic_store(&m->dumped, 1);
        }
    }
    return NULL;
}

/* The monitor starts a timed call. */
static uint64_t call_begin(monitor_t *m, const char *what)
{
    uint64_t t0 = pdx_now_ns();
    atomic_store(&m->call_what, what);
    atomic_store(&m->call_t0, t0);
    return t0;
}

/* Where the monitor reads in peer i: in P1, the top piece, which the main
 * thread's requests (offsets below REGION / 2 + 63 * 2 * PIECE + PIECE)
 * never write when they are WRITEs. */
static uint64_t mon_off(int i)
{
    return i == 0 ? REGION - PIECE : 12345;
}

static void on_note(void *arg, const char *peer, const void *m, size_t n)
{
    (void)peer, (void)m, (void)n;
    ((monitor_t *)arg)->notifs++;
}

/* Involuntary context switches of every thread of this process. */
static long preemptions(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nivcsw;
}

/* Before a timed call: the threads' run-queue waits, at most once a
 * millisecond (a snapshot reads a file per thread). */
static void waits_mark(monitor_t *m)
{
    uint64_t now = pdx_now_ns();
    if (now - m->waits_ns >= 1000000ull && waits_take(&m->waits)) {
        m->waits_ns = now;
    }
}

/* Time one call. A long one during which the kernel preempted a thread of
 * this process (the lock holder, or this thread), or one that a thread of
 * this process spent long enough waiting for a CPU to leave less than the
 * bound (a holder preempted just before the call began and runnable
 * through it: no preemption is counted during the call), says how loaded
 * the machine is, not how long pdx holds its lock: counted apart (and
 * still bounded, 1 s, to catch a hang). */
static void sample(monitor_t *m, uint64_t t0, long pre0, const char *what)
{
    uint64_t dt = pdx_now_ns() - t0;
    atomic_store(&m->call_t0, 0);
    if (m->nsamples < SAMPLES) {
        m->samples[m->nsamples++] = dt;
    }
    bool kernel = false;
    if (dt >= 5000000ull && preemptions() != pre0) {
        kernel = true;
    } else if (dt >= 5000000ull && m->waits_ns != 0) {
        waits_t after;
        if (waits_take(&after)) {
            uint64_t w = waits_max(&m->waits, &after);
            if (dt < w + (uint64_t)(MAX_CALL_MS * 1e6)) {
                kernel = true;
                m->waited_long++;
            }
            m->waits = after;
            m->waits_ns = pdx_now_ns();
        }
    }
    if (kernel) {
        m->preempted_long++;
        if (dt > m->max_preempted_ns) {
            m->max_preempted_ns = dt;
        }
        return;
    }
    if (dt > m->max_ns) {
        m->max_ns = dt;
        snprintf(m->max_what, sizeof(m->max_what), "%s", what);
    }
}

/* The other thread: its own READ (64 KiB) to each peer, reposted when
 * done, plus peer_state and notif_poll, every call timed. */
static void *monitor_main(void *arg)
{
    monitor_t *m = arg;
    atomic_store(&m->mon_tid, (int)gettid());
    pdx_xfer_h x[2] = {NULL, NULL};
    bool live[2] = {true, true};
    for (int i = 0; i < 2; i++) {
        pdx_desc_t l = {(uint64_t)(uintptr_t)(m->buf + (size_t)i * PIECE),
                        PIECE, 0, 0};
        pdx_desc_t r = {m->t[i]->base + mon_off(i), PIECE, 0, 0};
        pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
        CHECK(pdx_xfer_create(m->d, PDX_XFER_READ, &ll, &rl, m->t[i]->name,
                              NULL, 0, &x[i]));
        CHECK(pdx_xfer_post(x[i]));
    }
    while (!atomic_load(&m->stop)) {
        for (int i = 0; i < 2; i++) {
            waits_mark(m);
            long pre = preemptions();
            uint64_t t0 = call_begin(m, "pdx_peer_state");
            pdx_peer_state(m->d, m->t[i]->name);
            sample(m, t0, pre, "pdx_peer_state");
            if (!live[i]) {
                continue;
            }
            waits_mark(m);
            pre = preemptions();
            t0 = call_begin(m, "pdx_xfer_check");
            pdx_status_t st = pdx_xfer_check(x[i]);
            sample(m, t0, pre, "pdx_xfer_check");
            if (st == PDX_INPROGRESS) {
                continue;
            }
            if (st == PDX_OK) {
                m->reads_ok[i]++;
                const unsigned char *got = m->buf + (size_t)i * PIECE;
                for (uint64_t o = 0; o < PIECE; o++) {
                    if (got[o] != pattern(o + mon_off(i), m->t[i]->salt)) {
                        die("monitor: read from %s differs at %llu",
                            m->t[i]->name, (unsigned long long)o);
                    }
                }
                memset(m->buf + (size_t)i * PIECE, 0, PIECE);
                waits_mark(m);
                pre = preemptions();
                t0 = call_begin(m, "pdx_xfer_post");
                st = pdx_xfer_post(x[i]);
                sample(m, t0, pre, "pdx_xfer_post");
                if (st >= 0) {
                    continue;
                }
            }
            m->reads_err[i]++;
            live[i] = false; /* that peer failed: stop using it */
        }
        waits_mark(m);
        long pre = preemptions();
        uint64_t t0 = call_begin(m, "pdx_notif_poll");
        pdx_notif_poll(m->d, on_note, m);
        sample(m, t0, pre, "pdx_notif_poll");
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < 2; i++) {
        pdx_xfer_release(x[i]);
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct slot {
    pdx_xfer_h x;
    uint64_t roff; /* remote offset of its first piece */
    uint64_t post_ns;
    bool busy;
} slot_t;

/* Post a READ of PIECES scattered 64 KiB pieces of target `t` into slot
 * `s`'s part of `buf`. */
static pdx_status_t read_post(pdx_agent_h d, target_t *t, unsigned char *buf,
                              slot_t *s, unsigned round, pdx_xfer_op_t op)
{
    pdx_desc_t l[PIECES], r[PIECES];
    s->roff = ((uint64_t)round * 7919u * 4096u) % (REGION / 2);
    for (unsigned i = 0; i < PIECES; i++) {
        l[i] = (pdx_desc_t){(uint64_t)(uintptr_t)(buf + (size_t)i * PIECE),
                            PIECE, 0, 0};
        /* Every other piece skipped: no merging into one. */
        r[i] = (pdx_desc_t){t->base + s->roff + (uint64_t)i * 2 * PIECE,
                            PIECE, 0, 0};
    }
    pdx_desc_list_t ll = {PDX_MEM_DRAM, l, PIECES}, rl = {PDX_MEM_DRAM, r,
                                                           PIECES};
    pdx_status_t st = pdx_xfer_create(d, op, &ll, &rl, t->name, NULL, 0,
                                      &s->x);
    if (st != PDX_OK) {
        return st;
    }
    if (op == PDX_XFER_READ) {
        memset(buf, 0, (size_t)PIECES * PIECE);
    }
    s->post_ns = pdx_now_ns();
    st = pdx_xfer_post(s->x);
    s->busy = st == PDX_INPROGRESS || st == PDX_OK;
    return st;
}

static void read_verify(const target_t *t, const unsigned char *buf,
                        const slot_t *s)
{
    for (unsigned i = 0; i < PIECES; i++) {
        uint64_t ro = s->roff + (uint64_t)i * 2 * PIECE;
        const unsigned char *g = buf + (size_t)i * PIECE;
        for (uint64_t o = 0; o < PIECE; o++) {
            if (g[o] != pattern(ro + o, t->salt)) {
                die("read from %s differs at remote offset %llu", t->name,
                    (unsigned long long)(ro + o));
            }
        }
    }
}

static int d_main(void)
{
    pdx_agent_params_t ap = {
        .field_mask = PDX_AGENT_PARAM_FLAGS | PDX_AGENT_PARAM_XFER_TIMEOUT,
        .flags = PDX_AGENT_F_PROGRESS_THREAD,
        .xfer_timeout_ms = XFER_TIMEOUT_MS};
    pdx_agent_h d;
    CHECK(pdx_agent_create("stall-d", &ap, &d));
    backends(d);
    size_t slot_bytes = (size_t)PIECES * PIECE;
    size_t local_len = 2 * PIECE + 2 * INFLIGHT * slot_bytes;
    unsigned char *local = ctl_path_alloc(g_path, local_len);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(d, PDX_MEM_DRAM, (uint64_t)(uintptr_t)local,
                           local_len, 0, 0, &reg));
    target_t t[2];
    target_start(&t[0], "stall-p1", 11);
    target_start(&t[1], "stall-p2", 22);
    target_connect(&t[0], d);
    target_connect(&t[1], d);

    monitor_t m = {.d = d, .t = {&t[0], &t[1]}, .buf = local};
    m.samples = malloc(SAMPLES * sizeof(*m.samples));
    if (m.samples == NULL) {
        die("out of memory");
    }
    pthread_t mon, watch;
    if (pthread_create(&mon, NULL, monitor_main, &m) != 0 ||
        pthread_create(&watch, NULL, watch_main, &m) != 0) {
        die("pthread_create");
    }

    slot_t slots[2][INFLIGHT];
    memset(slots, 0, sizeof(slots));
    unsigned round = 0, done_ok[2] = {0, 0}, done_during[2] = {0, 0};
    pdx_status_t p1_end = PDX_OK;
    unsigned p1_failed = 0;
    uint64_t start = pdx_now_ns(), fault_at = start + 400000000ull,
             end_at = fault_at + (XFER_TIMEOUT_MS + 3000) * 1000000ull,
             fault_ns = 0,
             p1_first_fail_ns = 0;
    bool faulted = false, p1_dead = false;
    char fault_desc[512] = "";
    uint64_t main_max = 0, p2_longest = 0;
    while (pdx_now_ns() < end_at) {
        if (!faulted && pdx_now_ns() >= fault_at) {
            if (kill(t[0].pid, g_stop ? SIGSTOP : SIGKILL) != 0) {
                die("kill: %s", strerror(errno));
            }
            fault_ns = pdx_now_ns();
            faulted = true;
            pdx_backend_describe(g_ucx, fault_desc, sizeof(fault_desc));
            printf("fault: %s sent to %s with %u + %u READs in flight\n",
                   g_stop ? "SIGSTOP" : "SIGKILL", t[0].name, INFLIGHT,
                   INFLIGHT);
        }
        for (int p = 0; p < 2; p++) {
            if (p == 0 && p1_dead) {
                continue;
            }
            for (int k = 0; k < INFLIGHT; k++) {
                slot_t *s = &slots[p][k];
                unsigned char *buf =
                    local + 2 * PIECE + ((size_t)p * INFLIGHT + k) * slot_bytes;
                uint64_t t0 = pdx_now_ns();
                if (!s->busy) {
                    pdx_xfer_op_t op = p == 0 && g_p1_write ? PDX_XFER_WRITE
                                                            : PDX_XFER_READ;
                    pdx_status_t st = read_post(d, &t[p], buf, s, round++, op);
                    if (st < 0 && s->x != NULL) {
                        pdx_xfer_release(s->x);
                        s->x = NULL;
                    }
                    if (st < 0 && p == 0 && faulted) {
                        p1_dead = true;
                        p1_end = p1_end == PDX_OK ? st : p1_end;
                        continue;
                    }
                    if (st < 0) {
                        die("post to %s: %s (%s)", t[p].name,
                            pdx_status_string(st), pdx_last_error());
                    }
                    continue;
                }
                pdx_status_t st = pdx_xfer_check(s->x);
                uint64_t dt = pdx_now_ns() - t0;
                main_max = dt > main_max ? dt : main_max;
                if (st == PDX_INPROGRESS) {
                    continue;
                }
                if (st == PDX_OK) {
                    uint64_t took = pdx_now_ns() - s->post_ns;
                    if (p == 1 && took > p2_longest) {
                        p2_longest = took;
                    }
                    if (!(p == 0 && g_p1_write)) {
                        read_verify(&t[p], buf, s);
                    }
                    done_ok[p]++;
                    done_during[p] += faulted;
                } else if (p == 0 && faulted) {
                    if (p1_failed++ == 0) {
                        p1_first_fail_ns = pdx_now_ns();
                        p1_end = st;
                        printf("%s: first request ended '%s' %.1f ms after "
                               "the fault: %s\n", t[0].name,
                               pdx_status_string(st),
                               (double)(p1_first_fail_ns - fault_ns) / 1e6,
                               pdx_last_error());
                    }
                } else {
                    die("READ from %s failed: %s (%s)", t[p].name,
                        pdx_status_string(st), pdx_last_error());
                }
                t0 = pdx_now_ns();
                pdx_xfer_release(s->x);
                dt = pdx_now_ns() - t0;
                main_max = dt > main_max ? dt : main_max;
                s->x = NULL;
                s->busy = false;
            }
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&m.stop, 1);
    pthread_join(mon, NULL);
    pthread_join(watch, NULL);
    for (int p = 0; p < 2; p++) {
        for (int k = 0; k < INFLIGHT; k++) {
            if (slots[p][k].x != NULL) {
                pdx_xfer_release(slots[p][k].x);
            }
        }
    }

    qsort(m.samples, m.nsamples, sizeof(*m.samples), cmp_u64);
    double p50 = (double)m.samples[m.nsamples / 2] / 1e6;
    double p99 = (double)m.samples[m.nsamples * 99 / 100] / 1e6;
    double mx = (double)m.max_ns / 1e6;
    pdx_stats_t s1;
    pdx_stats_peer(d, t[0].name, &s1);
    printf("path %s, %s: other thread %zu calls: p50 %.3f ms, p99 %.3f ms, "
           "max %.3f ms (%s); main thread longest check/release %.3f ms\n",
           g_path, g_stop ? "stop" : "kill", m.nsamples, p50, p99, mx,
           m.max_what, (double)main_max / 1e6);
    printf("%s: %u READs byte-exact (%u during the fault); %s: %u "
           "byte-exact before, %u failed (%s), dead events %llu; monitor "
           "reads ok %u/%u, notifications %u\n", t[1].name, done_ok[1],
           done_during[1], t[0].name, done_ok[0] - done_during[0], p1_failed,
           pdx_status_string(p1_end), (unsigned long long)s1.dead_events,
           m.reads_ok[0], m.reads_ok[1], m.notifs);
    printf("%s: longest READ %.1f ms (request timeout %u ms)\n", t[1].name,
           (double)p2_longest / 1e6, (unsigned)ap.xfer_timeout_ms);

    printf("D's ucx backend at the fault: %s\n", fault_desc);
    int bad = 0;
    /* Over UCX shared memory each target has a worker of its own at D (its
     * replies queue only behind its own messages); over tcp none does, nor
     * over shm (cma moves the data; ucx makes the worker at first use). */
    if (strcmp(g_peer_workers, "auto") == 0) {
        const char *want = strcmp(g_path, "ucx") != 0
                               ? "peer_workers=auto(0)"
                               : "peer_workers=auto(2)";
        if (strstr(fault_desc, want) == NULL) {
            fprintf(stderr, "FAIL: D's ucx backend does not say %s\n", want);
            bad = 1;
        }
    }
    printf("bound on one call: %.0f ms%s; calls over 5 ms during which the "
           "kernel preempted a thread of this process or kept one waiting "
           "for a CPU: %u (%u by the wait), longest %.1f ms (bound 1000 "
           "ms)\n", MAX_CALL_MS, MAX_CALL_NOTE, m.preempted_long,
           m.waited_long, (double)m.max_preempted_ns / 1e6);
    if (atomic_load(&m.dumped)) {
        printf("the other thread's call passed %d ms; D's threads then "
               "(syscall: number and first argument):\n%s", WATCH_MS,
               m.dump);
    }
    if (mx >= MAX_CALL_MS) {
        fprintf(stderr, "FAIL: a call of the other thread took %.1f ms\n", mx);
        bad = 1;
    }
    if (m.max_preempted_ns >= 1000000000ull) {
        fprintf(stderr, "FAIL: a call of the other thread took %.1f ms (a "
                "thread was preempted during it)\n",
                (double)m.max_preempted_ns / 1e6);
        bad = 1;
    }
    if (done_during[1] < 3) {
        fprintf(stderr, "FAIL: %s completed %u READs during the fault\n",
                t[1].name, done_during[1]);
        bad = 1;
    }
    bool shm_stop = g_stop && strcmp(g_path, "shm") == 0;
    /* Over UCX sm, a stopped peer's READs kept completing byte-exact in 1
     * of 25 runs (the monitor's 64 KiB reads to the stopped P1 too, none
     * failed): UCX moved them without P1's CPU. Not explained: pdx's sm
     * endpoints, with peer error handling, normally have no cma lane
     * (ucx_info -e -u rmwe -P intra; the lanes at the fault are printed).
     * Byte-exact data is a correct outcome, as over shm. */
    bool sm_read_stop = g_stop && !g_p1_write && strcmp(g_path, "ucx") == 0 &&
                        p1_failed == 0 && done_during[0] > 0;
    if (sm_read_stop) {
        printf("%s stopped, UCX sm: its READs kept completing byte-exact "
               "(%u during the fault: UCX moved them without its CPU)\n",
               t[0].name, done_during[0]);
    }
    if (!shm_stop && !sm_read_stop && p1_failed == 0 && !p1_dead) {
        fprintf(stderr, "FAIL: no request to %s failed\n", t[0].name);
        bad = 1;
    }
    if (p1_failed > 0 && p1_end != PDX_ERR_REMOTE_DISCONNECT &&
        p1_end != PDX_ERR_TIMEOUT) {
        fprintf(stderr, "FAIL: %s's requests ended '%s'\n", t[0].name,
                pdx_status_string(p1_end));
        bad = 1;
    }
    if (shm_stop) {
        printf("%s stopped, shared memory: its READs %s (memcpy needs no "
               "CPU of the target)\n", t[0].name,
               done_during[0] > 0 ? "kept completing byte-exact"
                                  : "did not complete");
    }

    if (g_stop) {
        kill(t[0].pid, SIGCONT);
    }
    kill(t[0].pid, SIGKILL);
    close(t[0].fd);
    close(t[1].fd); /* P2 exits on EOF */
    for (int p = 0; p < 2; p++) {
        int status;
        waitpid(t[p].pid, &status, 0);
    }
    free(m.samples);
    pdx_mem_deregister(d, reg);
    pdx_agent_destroy(d);
    ctl_path_free(g_path, local);
    printf("%s\n", bad ? "FAIL" : "PASS");
    return bad;
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            g_path = argv[++i];
        } else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            g_stop = strcmp(argv[++i], "stop") == 0;
        } else if (strcmp(argv[i], "--p1-write") == 0) {
            g_p1_write = 1;
        } else if (strcmp(argv[i], "--piece-kib") == 0 && i + 1 < argc) {
            long kib = atol(argv[++i]);
            if (kib < 4 || kib > 256) {
                die("--piece-kib 4..256");
            }
            g_piece = (uint32_t)kib << 10;
        } else if (strcmp(argv[i], "--peer-workers") == 0 && i + 1 < argc) {
            g_peer_workers = argv[++i];
        }
    }
    if (!ctl_path_valid(g_path)) {
        die("--path ucx|ucx-tcp|shm");
    }
    if (argc >= 5 && strcmp(argv[1], "--target") == 0) {
        return target_main(atoi(argv[2]), argv[3], (unsigned)atoi(argv[4]));
    }
    alarm(120); /* bounded whatever happens */
    return d_main();
}
