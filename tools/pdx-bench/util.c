/* pdx-bench helpers: timing, statistics, memory, the control socket to the
 * target process, formatting and JSON. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "netns.h"

struct netns_lab *bench_lab;

static netns_lab_t g_bench_lab;

void bench_lab_leave(void)
{
    if (bench_lab != NULL) {
        netns_enter(bench_lab, -1);
        netns_cleanup(bench_lab);
        bench_lab = NULL;
    }
}

int bench_lab_enter(char *why, size_t why_len)
{
    if (netns_init(&g_bench_lab, 2, why, why_len) != 0) {
        return -1;
    }
    if (netns_enter(&g_bench_lab, 0) != 0) {
        netns_cleanup(&g_bench_lab);
        snprintf(why, why_len, "cannot enter host 0");
        return -1;
    }
    static int registered;
    if (!registered) {
        atexit(bench_lab_leave); /* die() too */
        registered = 1;
    }
    bench_lab = &g_bench_lab;
    return 0;
}

FILE *out_txt;

void log_quiet(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg;
}

void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out_txt, fmt, ap);
    va_end(ap);
    fflush(out_txt);
}

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pdx-bench[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}


double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double quantile(double *v, size_t n, double q)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    size_t k = (size_t)(q * (double)n);
    if (k >= n) {
        k = n - 1;
    }
    return v[k];
}

double median_of(double *v, size_t n)
{
    return quantile(v, n, 0.5);
}

void dvec_push(dvec_t *d, double x)
{
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 1024;
        double *p = realloc(d->v, c * sizeof(*p));
        if (p == NULL) {
            die("out of memory");
        }
        d->v = p;
        d->cap = c;
    }
    d->v[d->n++] = x;
}

void dvec_free(dvec_t *d)
{
    free(d->v);
    memset(d, 0, sizeof(*d));
}

void *big_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        die("mmap of %zu bytes: %s", len, strerror(errno));
    }
    /* One page size for every run: THP would make some cases fast by
     * luck of alignment. Never shared with a child, so nothing we start
     * write-protects it (each page would fault on the next write). */
    (void)madvise(p, len, MADV_NOHUGEPAGE);
    (void)madvise(p, len, MADV_DONTFORK);
    memset(p, 0x5a, len);
    return p;
}

void *bench_mem_alloc(size_t len)
{
    if (!bench_use_shm()) {
        return big_alloc(len);
    }
    void *p = NULL;
    pdx_status_t st = pdx_mem_alloc(len, PDX_MEM_F_POPULATE, &p);
    if (st != PDX_OK) {
        die("pdx_mem_alloc of %zu bytes: %s", len, pdx_status_string(st));
    }
    /* pdx_mem_alloc already made it MADV_DONTFORK. */
    (void)madvise(p, len, MADV_NOHUGEPAGE);
    memset(p, 0x5a, len);
    return p;
}

void bench_mem_free(void *p, size_t len)
{
    if (bench_use_shm()) {
        pdx_status_t st = pdx_mem_free(p);
        if (st != PDX_OK) {
            die("pdx_mem_free: %s", pdx_status_string(st));
        }
    } else {
        big_free(p, len);
    }
}

void *big_alloc_thp(size_t len)
{
    /* 2 MiB aligned, advised before the first touch so THP can back it. */
    size_t al = 2u << 20;
    uint8_t *m = mmap(NULL, len + al, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        die("mmap of %zu bytes: %s", len + al, strerror(errno));
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)m + al - 1) & ~(uintptr_t)(al - 1));
    if (p > m) {
        munmap(m, (size_t)(p - m));
    }
    munmap(p + len, (size_t)(m + al - p));
    (void)madvise(p, len, MADV_HUGEPAGE);
    (void)madvise(p, len, MADV_DONTFORK);
    memset(p, 0x5a, len);
    return p;
}

void big_free(void *p, size_t len)
{
    if (p != NULL) {
        munmap(p, len);
    }
}

void sink(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

static void write_all(int fd, const void *p, size_t len)
{
    const char *c = p;
    while (len > 0) {
        ssize_t n = write(fd, c, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            die("control write: %s", strerror(errno));
        }
        c += n;
        len -= (size_t)n;
    }
}

void ctl_send(int fd, const void *p, uint32_t len)
{
    write_all(fd, &len, 4);
    if (len > 0) {
        write_all(fd, p, len);
    }
}

void ctl_sendf(int fd, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(buf)) {
        die("control message too long");
    }
    ctl_send(fd, buf, (uint32_t)n);
}

static int read_all(int fd, void *p, size_t len)
{
    char *c = p;
    while (len > 0) {
        ssize_t n = read(fd, c, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

char *ctl_recv(int fd, uint32_t *len_p)
{
    uint32_t len;
    if (read_all(fd, &len, 4) != 0) {
        return NULL;
    }
    char *buf = malloc((size_t)len + 1);
    if (buf == NULL || read_all(fd, buf, len) != 0) {
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    if (len_p != NULL) {
        *len_p = len;
    }
    return buf;
}

char *ctl_recv_timeout(int fd, int timeout_ms, uint32_t *len_p,
                       int *timed_out_p)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    *timed_out_p = 0;
    int r = poll(&pfd, 1, timeout_ms);
    if (r == 0) {
        *timed_out_p = 1;
        return NULL;
    }
    return ctl_recv(fd, len_p);
}

extern char **environ;

int spawn_cmd(const char *const *argv, const char *const *env_add, int out_fd,
              int fd3)
{
    /* The environment: ours, with env_add's "KEY=VALUE" replacing. */
    size_t ne = 0, na = 0;
    while (environ[ne] != NULL) {
        ne++;
    }
    while (env_add != NULL && env_add[na] != NULL) {
        na++;
    }
    char **envp = calloc(ne + na + 1, sizeof(*envp));
    if (envp == NULL) {
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        int replaced = 0;
        for (size_t j = 0; j < na; j++) {
            size_t kl = strcspn(env_add[j], "=");
            if (strncmp(environ[i], env_add[j], kl + 1) == 0) {
                replaced = 1;
            }
        }
        if (!replaced) {
            envp[k++] = environ[i];
        }
    }
    for (size_t j = 0; j < na; j++) {
        envp[k++] = (char *)env_add[j];
    }
    envp[k] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
        posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    } else {
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
    int tmp3 = -1;
    if (fd3 >= 0) {
        /* dup2 onto an fd equal to its source would keep CLOEXEC. */
        tmp3 = fcntl(fd3, F_DUPFD_CLOEXEC, 10);
        posix_spawn_file_actions_adddup2(&fa, tmp3, 3);
    }
    /* posix_spawn starts the child without copying our page tables (vfork
     * semantics): a fork would write-protect every private page, and on a
     * virtual machine the faults that follow cost tens of microseconds
     * each, inside the next measurement. */
    pid_t pid;
    fflush(NULL);
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (tmp3 >= 0) {
        close(tmp3);
    }
    free(envp);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return (int)pid;
}

int spawn_target(const bench_opts_t *o, const char *kind,
                 const char *const *extra, int *fd_p)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        die("socketpair: %s", strerror(errno));
    }
    /* Another host (latency --netns): the target keeps the socket at its
     * own number; here spawn_cmd puts it at 3. */
    char fdnum[16];
    snprintf(fdnum, sizeof(fdnum), "%d", bench_lab != NULL ? sv[1] : 3);
    const char *argv[48];
    size_t n = 0;
    argv[n++] = o->self_path;
    argv[n++] = "--target";
    argv[n++] = kind;
    argv[n++] = "--fd";
    argv[n++] = fdnum;
    argv[n++] = "--tls";
    argv[n++] = o->tls;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 46; i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    int pid;
    if (bench_lab != NULL) {
        int fl = fcntl(sv[1], F_GETFD);
        fcntl(sv[1], F_SETFD, fl & ~FD_CLOEXEC);
        static char *const env[] = {"UCX_NET_DEVICES=eth0", NULL};
        pid = netns_spawn(bench_lab, 1, (char *const *)argv, env, sv[1]);
    } else {
        /* The target's diagnostics go to our stderr. */
        pid = spawn_cmd(argv, NULL, 2, sv[1]);
    }
    close(sv[1]);
    if (pid < 0) {
        die("starting %s: %s", o->self_path, strerror(errno));
    }
    *fd_p = sv[0];
    return pid;
}

int wait_child(pid_t pid, uint64_t deadline, int *status_p)
{
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            *status_p = status;
            return 1;
        }
        if (pdx_now_ns() >= deadline) {
            break;
        }
        usleep(1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    *status_p = status;
    return 0;
}

int reap_target(int pid, int timeout_ms)
{
    int status;
    if (!wait_child(pid, pdx_now_ns() + (uint64_t)timeout_ms * 1000000u,
                    &status)) {
        return 128;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

void exchange_blobs(pdx_agent_h agent, int fd, char *peer_out)
{
    void *blob;
    size_t len;
    uint32_t plen;
    CHECK(pdx_agent_describe(agent, &blob, &len));
    ctl_send(fd, blob, (uint32_t)len);
    pdx_blob_free(blob);
    char *pb = ctl_recv(fd, &plen);
    if (pb == NULL) {
        die("the peer closed the control socket during the blob exchange");
    }
    CHECK(pdx_peer_load(agent, pb, plen, peer_out));
    free(pb);
}

const char *fmt_bytes(uint64_t b, char *buf, size_t len)
{
    if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
        snprintf(buf, len, "%lluG", (unsigned long long)(b >> 30));
    } else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
        snprintf(buf, len, "%lluM", (unsigned long long)(b >> 20));
    } else if (b >= (1ull << 10) && b % (1ull << 10) == 0) {
        snprintf(buf, len, "%lluK", (unsigned long long)(b >> 10));
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)b);
    }
    return buf;
}

double gbps(uint64_t bytes, uint64_t ns)
{
    return ns == 0 ? 0.0 : (double)bytes / (double)ns;
}

cJSON *jnum(cJSON *obj, const char *key, double v)
{
    return cJSON_AddNumberToObject(obj, key, v);
}

cJSON *jstr(cJSON *obj, const char *key, const char *v)
{
    return cJSON_AddStringToObject(obj, key, v);
}

void print_machine_header(cJSON *root)
{
    struct utsname u;
    uname(&u);
    char cpu[128] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[256];
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c != NULL) {
                    snprintf(cpu, sizeof(cpu), "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3] = {0, 0, 0};
    f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) {
            load[0] = 0;
        }
        fclose(f);
    }
    say("# machine: %s, %ld cpus, kernel %s, 1-min load %.2f; pdx %s\n", cpu,
        ncpu, u.release, load[0], pdx_version());
    cJSON *m = cJSON_AddObjectToObject(root, "machine");
    jstr(m, "cpu", cpu);
    jnum(m, "cpus", (double)ncpu);
    jstr(m, "kernel", u.release);
    jnum(m, "loadavg_1m", load[0]);
    jstr(m, "pdx_version", pdx_version());
}

/* ---- the summary: targets, load, warnings ------------------------------ */

typedef struct bench_target_row {
    char mode[16];
    char name[96];
    char where[48];
    double v, goal;
    int lower, have;
} bench_target_row_t;

#define BENCH_MAX_TARGETS 24
static bench_target_row_t g_targets[BENCH_MAX_TARGETS];
static int g_ntargets;

void bench_target(const char *mode, const char *name, int have, double v,
                  double goal, int lower, const char *where)
{
    if (g_ntargets == BENCH_MAX_TARGETS) {
        return;
    }
    bench_target_row_t *t = &g_targets[g_ntargets++];
    snprintf(t->mode, sizeof(t->mode), "%s", mode);
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->where, sizeof(t->where), "%s", where ? where : "");
    t->have = have;
    t->v = v;
    t->goal = goal;
    t->lower = lower;
}

/* One thread's share of a core over `ms`: its CPU time over wall time. */
static void *probe_thread(void *arg)
{
    double *share = arg;
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    uint64_t t0 = pdx_now_ns(), t1;
    volatile uint64_t x = 0;
    do {
        for (int i = 0; i < 100000; i++) {
            x += (uint64_t)i * 2654435761u;
        }
        t1 = pdx_now_ns();
    } while (t1 - t0 < 150000000ull);
    (void)x; /* the work is the point: volatile keeps it */
    getrusage(RUSAGE_THREAD, &r1);
    double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) +
                 (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                 ((double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                  (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec)) /
                     1e6;
    *share = cpu / secs(t1 - t0);
    return NULL;
}

/* Busy CPU seconds of all cpus since boot: the "cpu" line of /proc/stat
 * less idle and iowait (steal counts: the hypervisor gave the time to
 * someone else). -1 if it cannot be read. */
static double stat_busy_s(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) {
        return -1;
    }
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (n < 5 || hz <= 0) {
        return -1;
    }
    /* user nice system idle iowait irq softirq steal */
    unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return (double)busy / (double)hz;
}

static double rusage_s(int who)
{
    struct rusage r;
    if (getrusage(who, &r) != 0) {
        return 0;
    }
    return (double)r.ru_utime.tv_sec + (double)r.ru_stime.tv_sec +
           ((double)r.ru_utime.tv_usec + (double)r.ru_stime.tv_usec) / 1e6;
}

double bench_load_others(const bench_load_t *before,
                         const bench_load_t *after, double wall_s)
{
    if (before->busy_s < 0 || after->busy_s < 0 || wall_s <= 0) {
        return -1;
    }
    double others = (after->busy_s - before->busy_s) -
                    (after->own_s - before->own_s);
    /* Ticks against microseconds: a little either way is rounding. */
    return others > 0 ? others / wall_s : 0;
}

void bench_load_probe(bench_load_t *l)
{
    memset(l, 0, sizeof(*l));
    /* Where the probe starts, for the other work while it runs. */
    bench_load_t start = {.busy_s = stat_busy_s(),
                          .own_s = rusage_s(RUSAGE_SELF) +
                                   rusage_s(RUSAGE_CHILDREN)};
    uint64_t t0 = pdx_now_ns();
    l->ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &l->load1) != 1) {
            l->load1 = 0;
        }
        fclose(f);
    }
    /* Two busy threads (what a run needs: initiator and target), 150 ms:
     * how much of two cores this process gets now. */
    pthread_t th[2];
    double share[2] = {0, 0};
    int n = l->ncpu >= 2 ? 2 : 1;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&th[i], NULL, probe_thread, &share[i]) != 0) {
            share[i] = 1;
            n = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
    }
    l->share = n == 2 ? (share[0] + share[1]) / 2 : share[0];
    /* Other work while the probe ran: all cpus' busy time less this
     * process's and its children's (the probe's own two threads too). */
    l->own_s = rusage_s(RUSAGE_SELF) + rusage_s(RUSAGE_CHILDREN);
    l->busy_s = stat_busy_s();
    l->others = bench_load_others(&start, l, secs(pdx_now_ns() - t0));
    /* Too loaded: the probe's threads got under 80% of their cores, or
     * other work kept more than a quarter of the cpus busy meanwhile.
     * Not the 1-minute load: it counts what ran up to a minute ago (a
     * pdx-bench run just before this one). */
    l->loaded = l->share < 0.80 || l->others > 0.25 * (double)l->ncpu;
}

/* pdx's warnings, each once: the first of a kind (its text with numbers
 * and addresses made '#') is kept, the rest counted. */
#define BENCH_MAX_WARNINGS 16
static char g_warn[BENCH_MAX_WARNINGS][320];
static uint64_t g_warn_key[BENCH_MAX_WARNINGS];
static int g_nwarn;
static uint64_t g_warn_repeats;
static int g_warn_hold;
static const char *g_warn_mode = "";
static pthread_mutex_t g_warn_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t warn_key(const char *msg)
{
    uint64_t h = 1469598103934665603ull;
    int in_num = 0;
    for (const char *p = msg; *p; p++) {
        int digit = (*p >= '0' && *p <= '9') ||
                    (in_num && ((*p >= 'a' && *p <= 'f') || *p == 'x'));
        if (digit && in_num) {
            continue;
        }
        in_num = digit;
        h = (h ^ (unsigned char)(digit ? '#' : *p)) * 1099511628211ull;
    }
    return h;
}

/* Warnings a mode causes on purpose, and why: said as expected, so a
 * reader of the summary does not take them for a fault of the machine. */
static const struct {
    const char *mode, *text, *why;
} g_expected[] = {
    {"latency", "the cma backend is not created",
     "expected: latency measures UCX alone, against a raw UCP loop"},
};

static const char *expected_why(const char *msg)
{
    for (size_t i = 0; i < sizeof(g_expected) / sizeof(g_expected[0]); i++) {
        if (strcmp(g_warn_mode, g_expected[i].mode) == 0 &&
            strstr(msg, g_expected[i].text) != NULL) {
            return g_expected[i].why;
        }
    }
    return NULL;
}

static void bench_log(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg;
    if (level > PDX_LOG_WARN) {
        fprintf(stderr, "pdx: %s\n", msg);
        return;
    }
    uint64_t k = warn_key(msg);
    pthread_mutex_lock(&g_warn_lock);
    for (int i = 0; i < g_nwarn; i++) {
        if (g_warn_key[i] == k) {
            g_warn_repeats++;
            pthread_mutex_unlock(&g_warn_lock);
            return;
        }
    }
    int hold = g_warn_hold;
    const char *why = expected_why(msg);
    if (g_nwarn < BENCH_MAX_WARNINGS) {
        g_warn_key[g_nwarn] = k;
        snprintf(g_warn[g_nwarn++], sizeof(g_warn[0]),
                 "%s (%s, pid %d): %s%s%s%s",
                 level == PDX_LOG_ERROR ? "error" : "warning", g_warn_mode,
                 (int)getpid(), msg, why ? " [" : "", why ? why : "",
                 why ? "]" : "");
    }
    pthread_mutex_unlock(&g_warn_lock);
    if (!hold) {
        fprintf(stderr, "pdx-bench: pdx %s: %s (said once)%s%s%s\n",
                level == PDX_LOG_ERROR ? "error" : "warning", msg,
                why ? " [" : "", why ? why : "", why ? "]" : "");
    }
}

void bench_log_install(int hold, const char *mode)
{
    g_warn_hold = hold;
    g_warn_mode = mode;
    pdx_log_set_handler(bench_log, NULL);
}

static const char *verdict(const bench_target_row_t *t, int loaded)
{
    if (!t->have) {
        return "n/a";
    }
    int met = t->lower ? t->v <= t->goal : t->v >= t->goal;
    if (met) {
        return "MET";
    }
    return loaded ? "NOT MET (machine loaded: not a finding)" : "NOT MET";
}

void bench_summary_json(cJSON *root)
{
    cJSON *a = cJSON_AddArrayToObject(root, "summary");
    for (int i = 0; i < g_ntargets; i++) {
        const bench_target_row_t *t = &g_targets[i];
        cJSON *j = cJSON_CreateObject();
        jstr(j, "mode", t->mode);
        jstr(j, "name", t->name);
        cJSON_AddBoolToObject(j, "have", t->have);
        jnum(j, "value", t->v);
        jnum(j, "goal", t->goal);
        cJSON_AddBoolToObject(j, "lower_is_better", t->lower);
        jstr(j, "where", t->where);
        cJSON_AddItemToArray(a, j);
    }
}

int bench_too_loaded(const bench_load_t *before, const bench_load_t *after,
                     double wall_s)
{
    double others = bench_load_others(before, after, wall_s);
    return before->loaded || after->loaded ||
           others > 0.25 * (double)before->ncpu;
}

void bench_summary(FILE *f, const char *mode, int quick,
                   const bench_load_t *before, const bench_load_t *after,
                   double wall_s)
{
    int loaded = bench_too_loaded(before, after, wall_s);
    double others = bench_load_others(before, after, wall_s);
    double share = before->share < after->share ? before->share
                                                 : after->share;
    fprintf(f,
            "pdx-bench %s%s: %.1f s; %ld cpus, 1-min load %.1f before, "
            "%.1f after (pdx-bench's own included); other work during "
            "the run: %s%.2f cpus; two busy threads got %.0f%% of their "
            "cores (worst probe)\n",
            mode, quick ? " --quick" : "", wall_s, before->ncpu,
            before->load1, after->load1, others < 0 ? "unknown " : "",
            others < 0 ? 0.0 : others, 100 * share);
    if (loaded) {
        fprintf(f,
                "MACHINE TOO LOADED: other work took the cores pdx-bench "
                "needs (a probe under 80%%, or other work over a quarter "
                "of the cpus while a probe or the run ran), so the "
                "figures below are noise, not pdx; "
                "rerun on an idle machine before reading them\n");
    } else {
        fprintf(f, "machine quiet enough: the ratios below are this run's "
                   "(pdx / what it is compared with, same run)%s\n",
                quick ? "; --quick measures little of each: confirm a "
                        "figure with the mode alone"
                      : "");
    }
    fprintf(f, "\n%-9s %-62s %9s %9s  %s\n", "mode", "target", "value",
            "goal", "verdict");
    for (int i = 0; i < g_ntargets; i++) {
        const bench_target_row_t *t = &g_targets[i];
        char v[16] = "-", g[16];
        if (t->have) {
            snprintf(v, sizeof(v), "%.2f", t->v);
        }
        snprintf(g, sizeof(g), "%s%.2f", t->lower ? "<=" : ">=", t->goal);
        fprintf(f, "%-9s %-62s %9s %9s  %s%s%s%s\n", t->mode, t->name, v, g,
                verdict(t, loaded), t->where[0] ? " (" : "", t->where,
                t->where[0] ? ")" : "");
    }
    pthread_mutex_lock(&g_warn_lock);
    if (g_nwarn > 0) {
        fprintf(f, "\npdx's warnings, each once (%llu repeats left out):\n",
                (unsigned long long)g_warn_repeats);
        for (int i = 0; i < g_nwarn; i++) {
            fprintf(f, "  %s\n", g_warn[i]);
        }
    }
    pthread_mutex_unlock(&g_warn_lock);
}
