/* Store scale test (issue 22): N agents in M processes on one etcd on
 * loopback, each process in its own pid namespace where allowed (so its
 * peers are other hosts: death is seen through the lease, not a pidfd).
 * Each agent publishes, fetches K peers in other processes by name and
 * watches them; a fraction of the processes is SIGKILLed, then started
 * again under the same names. Reports the time to publish all, fetch
 * p50/p99, events and bytes each agent received, idle CPU per agent,
 * etcd's CPU, RSS and connections, when survivors saw each dead peer (vs
 * the TTL) and each restarted one back, spurious dead events, lease
 * re-grants of live agents, crashes. With --check it fails (exit 1) on
 * what must hold at any size: everything published and fetched, no
 * spurious death, no lease lost by a live agent, no crash, every death
 * and every return seen within bounds, and events per agent bounded by
 * what the agent uses (K), not by N. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pdx/pdx.h>
#include <pdx/store.h>

#include "die.h"
#include "etcd_launch.h"
#include "pdx_clock.h"

#define MAX_AGENTS 4096
#define MAX_PROCS 512
#define MAX_K 32

typedef struct cfg {
    int agents, procs, k, members;
    double kill_frac;
    uint32_t ttl_ms, timeout_ms;
    double idle_s;
    bool restart, check, json, ucx, pidns, progress;
    char url[256];
    char ns[64];
    char connect[8]; /* the ucx option connect (lazy, eager), or "" */
} cfg_t;

static cfg_t C = {.members = 1, .agents = 32, .procs = 8, .k = 4, .kill_frac = 0.25,
                  .ttl_ms = 3000, .timeout_ms = 2000, .idle_s = 2.0,
                  .restart = true, .pidns = true, .ucx = true};

static int per_proc(void) { return (C.agents + C.procs - 1) / C.procs; }
static int proc_of(int agent) { return agent / per_proc(); }

/* The j-th peer of agent i: in the (j+1)-th next process, spread inside
 * it, so K <= procs - 1 peers are in K distinct other processes. */
static int peer_of(int i, int j)
{
    int per = per_proc();
    int p = (proc_of(i) + 1 + j) % C.procs;
    int first = p * per;
    int n = C.agents - first < per ? C.agents - first : per;
    if (n <= 0) {
        return -1;
    }
    return first + (i + j) % n;
}

/* ---- worker: one process, its agents ---- */

static void wr(int fd, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(line)) { /* cut, still one line */
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    if (n > 0 && write(fd, line, (size_t)n) != n) {
        _exit(3);
    }
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static char ctl_read(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) <= 0) {
        return 0;
    }
    char c = 0;
    if (read(fd, &c, 1) != 1) {
        _exit(0); /* the orchestrator went */
    }
    return c;
}

static void worker(int proc, int out, int in, bool restarted)
{
    int per = per_proc(), first = proc * per;
    int n = C.agents - first < per ? C.agents - first : per;
    pdx_agent_h ag[MAX_AGENTS / 8 + 64];
    if (n <= 0 || n > (int)(sizeof(ag) / sizeof(ag[0]))) {
        _exit(4);
    }
    uint64_t t0 = pdx_now_ns();
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "a%d", first + i);
        pdx_agent_params_t ap = {
            .field_mask = PDX_AGENT_PARAM_STORE | PDX_AGENT_PARAM_FLAGS,
            .flags = C.progress ? PDX_AGENT_F_PROGRESS_THREAD : 0,
            .store_endpoints = C.url, .store_namespace = C.ns,
            .store_lease_ttl_ms = C.ttl_ms, .store_timeout_ms = C.timeout_ms};
        if (pdx_agent_create(name, &ap, &ag[i]) != PDX_OK) {
            wr(out, "E create %s\n", name);
            _exit(5);
        }
        /* UCX over TCP on loopback reaches a peer in another pid
         * namespace; cma only one of this namespace (--no-pidns). */
        pdx_option_t opt[2] = {{"tls", "tcp"}, {"connect", C.connect}};
        if (pdx_backend_create(ag[i], C.ucx ? "ucx" : "cma",
                               C.ucx ? opt : NULL,
                               C.ucx ? (C.connect[0] ? 2 : 1) : 0,
                               NULL) != PDX_OK) {
            wr(out, "E backend of %s\n", name);
            _exit(5);
        }
        pdx_agent_publish(ag[i]);
    }
    /* Published: leased and put under the lease, every agent. */
    bool all = false;
    while (!all && pdx_now_ns() - t0 < 120000000000ull) {
        all = true;
        for (int i = 0; i < n && all; i++) {
            pdx_store_status_t s;
            memset(&s, 0, sizeof(s));
            pdx_store_status(ag[i], &s);
            all = s.lease != 0 && s.leased_keys == 1 && s.unpublished == 0;
        }
        if (!all) {
            usleep(10000);
        }
    }
    wr(out, "P %d %llu\n", all ? 1 : 0, (unsigned long long)pdx_now_ns());
    int peers[MAX_AGENTS / 8 + 64][MAX_K];
    uint64_t dead_at[MAX_AGENTS / 8 + 64][MAX_K];
    memset(dead_at, 0, sizeof(dead_at));
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < C.k; j++) {
            peers[i][j] = peer_of(first + i, j);
        }
    }
    if (!restarted) {
        if (ctl_read(in, -1) != 'F') {
            _exit(6);
        }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < C.k; j++) {
                char name[32];
                snprintf(name, sizeof(name), "a%d", peers[i][j]);
                uint64_t f0 = pdx_now_ns();
                pdx_status_t st = pdx_peer_fetch(ag[i], name, 20000);
                wr(out, "F %llu %d\n",
                   (unsigned long long)(pdx_now_ns() - f0) / 1000, (int)st);
            }
        }
        wr(out, "R\n");
        if (ctl_read(in, -1) != 'I') {
            _exit(6);
        }
        double c0 = cpu_s();
        uint64_t i0 = pdx_now_ns();
        usleep((useconds_t)(C.idle_s * 1e6));
        double dt = (double)(pdx_now_ns() - i0) / 1e9;
        wr(out, "I %.4f\n", (cpu_s() - c0) * 1000.0 / dt / n);
    } else {
        /* Back after a kill: fetch its peers again, then watch. */
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < C.k; j++) {
                char name[32];
                snprintf(name, sizeof(name), "a%d", peers[i][j]);
                pdx_peer_fetch(ag[i], name, 20000);
            }
        }
        wr(out, "R\n");
    }
    /* Watch phase: poll the state of every loaded peer (test cost only:
     * a survivor notices a death from the watch, whoever looks). */
    for (;;) {
        char c = ctl_read(in, 20);
        if (c == 'S') {
            break;
        }
        uint64_t now = pdx_now_ns();
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < C.k; j++) {
                char name[32];
                snprintf(name, sizeof(name), "a%d", peers[i][j]);
                pdx_status_t st = pdx_peer_state(ag[i], name);
                if (st != PDX_OK && st != PDX_ERR_NOT_FOUND &&
                    dead_at[i][j] == 0) {
                    dead_at[i][j] = now;
                    /* What the agent says of it, for a spurious one. */
                    wr(out, "D %d %d %llu %s: %s\n", first + i, peers[i][j],
                       (unsigned long long)now, pdx_status_string(st),
                       pdx_last_error());
                } else if (st == PDX_OK && dead_at[i][j] != 0) {
                    dead_at[i][j] = 0;
                    wr(out, "V %d %d %llu\n", first + i, peers[i][j],
                       (unsigned long long)now);
                }
            }
        }
    }
    for (int i = 0; i < n; i++) {
        pdx_store_status_t s;
        pdx_store_counters_t k = {.size = sizeof(k)};
        memset(&s, 0, sizeof(s));
        pdx_store_status(ag[i], &s);
        if (pdx_store_counters(ag[i], &k) != PDX_OK) {
            _exit(7);
        }
        wr(out, "S %d %llu %llu %llu %llu %llu %llu\n", first + i,
           (unsigned long long)k.events, (unsigned long long)k.event_bytes,
           (unsigned long long)k.keepalives,
           (unsigned long long)k.lease_late_ms,
           (unsigned long long)s.leases_granted,
           (unsigned long long)s.requests);
    }
    for (int i = 0; i < n; i++) {
        pdx_agent_destroy(ag[i]);
    }
    wr(out, "X\n");
    _exit(0);
}

/* ---- orchestrator ---- */

typedef struct proc {
    pid_t pid; /* the namespace's parent: killing it kills the worker */
    int out, in;
    char buf[65536];
    size_t len;
    bool alive, killed, published, ready, done;
    uint64_t pub_ns;
} proc_t;

static proc_t P[MAX_PROCS];
static bool g_pidns_ok = true;

static void start_proc(int i, bool restarted)
{
    int o[2], in[2];
    if (pipe(o) != 0 || pipe(in) != 0) {
        die("pipe: %s", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        die("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(o[0]);
        close(in[1]);
        for (int j = 0; j < MAX_PROCS; j++) {
            if (P[j].alive) {
                close(P[j].out);
                close(P[j].in);
            }
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (C.pidns && unshare(CLONE_NEWPID) == 0) {
            pid_t inner = fork(); /* pid 1 of a new namespace: a "host" */
            if (inner < 0) {
                _exit(1);
            }
            if (inner > 0) {
                int st;
                while (waitpid(inner, &st, 0) < 0 && errno == EINTR) {
                }
                _exit(WIFEXITED(st) ? WEXITSTATUS(st)
                                    : 128 + WTERMSIG(st));
            }
            prctl(PR_SET_PDEATHSIG, SIGKILL);
        } else if (C.pidns) {
            wr(o[1], "N\n"); /* no namespace: peers are same host */
        }
        worker(i, o[1], in[0], restarted);
    }
    close(o[1]);
    close(in[0]);
    fcntl(o[0], F_SETFL, O_NONBLOCK);
    P[i] = (proc_t){.pid = pid, .out = o[0], .in = in[1], .alive = true};
}

static void send_all(char c)
{
    for (int i = 0; i < C.procs; i++) {
        if (P[i].alive && !P[i].killed && write(P[i].in, &c, 1) != 1) {
            die("control pipe of process %d: %s", i, strerror(errno));
        }
    }
}

/* Results. */
static uint64_t *g_fetch_us;
static size_t g_nfetch, g_fetch_fail;
static double g_idle_sum;
static int g_idle_n;

static uint64_t g_kill_ns;
static int g_spurious;
static uint64_t *g_seen_ns;   /* [agent * K + j]: death seen */
static uint64_t *g_back_ns;   /* return seen */
static uint64_t g_ev_sum, g_evb_sum, g_ev_max, g_ka_sum, g_late_max;
static uint64_t g_req_sum;
static int g_regrants, g_stats_n;
static bool g_killed_agent[MAX_AGENTS];

static int peer_index(int agent, int peer)
{
    for (int j = 0; j < C.k; j++) {
        if (peer_of(agent, j) == peer) {
            return j;
        }
    }
    return -1;
}

static void on_line(int pi, char *l)
{
    proc_t *p = &P[pi];
    unsigned long long a, b, c, d, e, f;
    int x, y;
    if (l[0] == 'P' && sscanf(l, "P %d %llu", &x, &a) == 2) {
        p->published = x == 1;
        p->pub_ns = a;
    } else if (l[0] == 'F' && sscanf(l, "F %llu %d", &a, &x) == 2) {
        g_fetch_us[g_nfetch++] = a;
        g_fetch_fail += x != 0;
    } else if (l[0] == 'R') {
        p->ready = true;
    } else if (l[0] == 'I') {
        g_idle_sum += atof(l + 2);
        g_idle_n++;
    } else if (l[0] == 'D' && sscanf(l, "D %d %d %llu", &x, &y, &a) == 3) {
        int j = peer_index(x, y);
        if (x < 0 || x >= C.agents || j < 0) {
            return;
        }
        if (g_kill_ns == 0 || a < g_kill_ns || !g_killed_agent[y]) {
            g_spurious++;
            /* The agent's word after the timestamp: its status, why. */
            const char *why = strchr(l + 2, ' ');
            why = why != NULL ? strchr(why + 1, ' ') : NULL;
            why = why != NULL ? strchr(why + 1, ' ') : NULL;
            fprintf(stderr, "spurious: a%d saw a%d dead%s (%s)\n", x, y,
                    g_kill_ns == 0 || a < g_kill_ns ? " before the kill"
                                                    : "",
                    why != NULL ? why + 1 : "?");
        } else if (g_seen_ns[x * C.k + j] == 0) {
            g_seen_ns[x * C.k + j] = a;
        }
    } else if (l[0] == 'V' && sscanf(l, "V %d %d %llu", &x, &y, &a) == 3) {
        int j = peer_index(x, y);
        if (x >= 0 && x < C.agents && j >= 0 && g_back_ns[x * C.k + j] == 0) {
            g_back_ns[x * C.k + j] = a;
        }
    } else if (l[0] == 'S' &&
               sscanf(l, "S %d %llu %llu %llu %llu %llu %llu", &x, &a, &b,
                      &c, &d, &e, &f) == 7) {
        g_ev_sum += a;
        g_evb_sum += b;
        g_ev_max = a > g_ev_max ? a : g_ev_max;
        g_ka_sum += c;
        g_late_max = d > g_late_max ? d : g_late_max;
        g_req_sum += f;
        if (x >= 0 && x < C.agents && !g_killed_agent[x] && e > 1) {
            g_regrants++;
            fprintf(stderr, "a%d: lease granted %llu times\n", x, e);
        }
        g_stats_n++;
    } else if (l[0] == 'X') {
        p->done = true;
    } else if (l[0] == 'N') {
        g_pidns_ok = false;
    } else if (l[0] == 'E') {
        fprintf(stderr, "process %d: %s\n", pi, l);
    }
}

/* Read what the workers wrote, until done() or the deadline. */
static bool pump(bool (*done)(void), uint64_t deadline_ns)
{
    struct pollfd fds[MAX_PROCS];
    for (int guard = 0; guard < 10000000; guard++) {
        if (done()) {
            return true;
        }
        uint64_t now = pdx_now_ns();
        if (now >= deadline_ns) {
            return false;
        }
        int nf = 0, map[MAX_PROCS];
        for (int i = 0; i < C.procs; i++) {
            if (P[i].alive) {
                fds[nf] = (struct pollfd){.fd = P[i].out, .events = POLLIN};
                map[nf++] = i;
            }
        }
        int wait = (int)((deadline_ns - now) / 1000000) + 1;
        if (poll(fds, (nfds_t)nf, wait > 100 ? 100 : wait) <= 0) {
            continue;
        }
        for (int f = 0; f < nf; f++) {
            if (!(fds[f].revents & (POLLIN | POLLHUP))) {
                continue;
            }
            proc_t *p = &P[map[f]];
            ssize_t r = read(p->out, p->buf + p->len,
                             sizeof(p->buf) - p->len - 1);
            if (r <= 0) {
                if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                    close(p->out);
                    close(p->in);
                    p->alive = false;
                }
                continue;
            }
            p->len += (size_t)r;
            p->buf[p->len] = '\0';
            char *s = p->buf, *nl;
            while ((nl = strchr(s, '\n')) != NULL) {
                *nl = '\0';
                on_line(map[f], s);
                s = nl + 1;
            }
            p->len = strlen(s);
            memmove(p->buf, s, p->len + 1);
        }
    }
    return false;
}

static bool all_published(void)
{
    for (int i = 0; i < C.procs; i++) {
        if (!P[i].killed && P[i].pub_ns == 0) {
            if (!P[i].alive) {
                return true; /* a worker died: reported as a failure */
            }
            return false;
        }
    }
    return true;
}

static bool all_ready(void)
{
    for (int i = 0; i < C.procs; i++) {
        if (P[i].alive && !P[i].killed && !P[i].ready) {
            return false;
        }
    }
    return true;
}

static bool all_idle(void) { return g_idle_n >= C.procs; }

static int g_expect_dead, g_expect_back;

static int count(uint64_t *v)
{
    int n = 0;
    for (int i = 0; i < C.agents * C.k; i++) {
        n += v[i] != 0;
    }
    return n;
}

static bool all_seen(void) { return count(g_seen_ns) >= g_expect_dead; }
static bool never(void) { return false; }
static bool all_back(void) { return count(g_back_ns) >= g_expect_back; }

static bool all_done(void)
{
    for (int i = 0; i < C.procs; i++) {
        if (P[i].alive && !P[i].killed && !P[i].done) {
            return false;
        }
    }
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* etcd's CPU seconds and RSS (kB) from /proc, and its established client
 * connections from /proc/net/tcp. */
static void etcd_usage1(pid_t pid, int port, double *cpu, long *rss_kb,
                        int *conns);

/* Summed over the members. */
static void etcd_usage(const etcd_proc_t *m, int n, double *cpu,
                       long *rss_kb, int *conns)
{
    double c = 0;
    long r = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        double c1;
        long r1;
        int k1;
        etcd_usage1(m[i].pid, m[i].client_port, &c1, &r1, &k1);
        c += c1;
        r += r1;
        k += k1;
    }
    *cpu = c;
    *rss_kb = r;
    *conns = k;
}

static void etcd_usage1(pid_t pid, int port, double *cpu, long *rss_kb,
                        int *conns)
{
    char path[64], buf[4096];
    *cpu = 0;
    *rss_kb = 0;
    *conns = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fgets(buf, sizeof(buf), f) != NULL) {
            char *s = strrchr(buf, ')');
            unsigned long ut = 0, st = 0;
            if (s != NULL &&
                sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                              "%lu %lu", &ut, &st) == 2) {
                *cpu = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
            }
        }
        fclose(f);
    }
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    while (f != NULL && fgets(buf, sizeof(buf), f) != NULL) {
        if (strncmp(buf, "VmRSS:", 6) == 0) {
            *rss_kb = atol(buf + 6);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    f = fopen("/proc/net/tcp", "r");
    while (f != NULL && fgets(buf, sizeof(buf), f) != NULL) {
        unsigned lport = 0, state = 0;
        if (sscanf(buf, " %*d: %*x:%x %*x:%*x %x", &lport, &state) == 2 &&
            (int)lport == port && state == 1) {
            (*conns)++;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: store_scale [--agents N] [--procs M] [--peers K] "
            "[--kill F] [--ttl-ms T] [--timeout-ms T] [--idle S] "
            "[--members N] [--no-restart] [--no-pidns] [--cma] [--connect lazy|eager] [--progress] [--etcd URL] [--check] "
            "[--json]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--agents") && v) {
            C.agents = atoi(v), i++;
        } else if (!strcmp(a, "--procs") && v) {
            C.procs = atoi(v), i++;
        } else if (!strcmp(a, "--peers") && v) {
            C.k = atoi(v), i++;
        } else if (!strcmp(a, "--kill") && v) {
            C.kill_frac = atof(v), i++;
        } else if (!strcmp(a, "--ttl-ms") && v) {
            C.ttl_ms = (uint32_t)atoi(v), i++;
        } else if (!strcmp(a, "--timeout-ms") && v) {
            C.timeout_ms = (uint32_t)atoi(v), i++;
        } else if (!strcmp(a, "--idle") && v) {
            C.idle_s = atof(v), i++;
        } else if (!strcmp(a, "--members") && v) {
            C.members = atoi(v), i++;
        } else if (!strcmp(a, "--etcd") && v) {
            snprintf(C.url, sizeof(C.url), "%s", v), i++;
        } else if (!strcmp(a, "--no-restart")) {
            C.restart = false;
        } else if (!strcmp(a, "--no-pidns")) {
            C.pidns = false;
        } else if (!strcmp(a, "--cma")) {
            C.ucx = false; /* one pid namespace: deaths seen by pidfd */
            C.pidns = false;
        } else if (!strcmp(a, "--connect") && v) {
            snprintf(C.connect, sizeof(C.connect), "%s", v), i++;
        } else if (!strcmp(a, "--progress")) {
            C.progress = true; /* UCX progressed: its keepalive runs */
        } else if (!strcmp(a, "--check")) {
            C.check = true;
        } else if (!strcmp(a, "--json")) {
            C.json = true;
        } else {
            usage();
        }
    }
    if (C.procs < 2 || C.procs > MAX_PROCS || C.agents < C.procs ||
        C.agents > MAX_AGENTS || C.k < 1 || C.k > MAX_K ||
        C.k > C.procs - 1 || per_proc() > MAX_AGENTS / 8 + 64) {
        die("need 2 <= procs <= %d, procs <= agents <= %d, "
            "1 <= peers < procs, peers <= %d", MAX_PROCS, MAX_AGENTS, MAX_K);
    }
    snprintf(C.ns, sizeof(C.ns), "scale-%d", (int)getpid());
    etcd_proc_t em[7];
    memset(em, 0, sizeof(em));
    etcd_proc_t *ep = &em[0];
    bool own_etcd = C.url[0] == '\0';
    if (C.members < 1 || C.members > 7) {
        die("--members: 1 to 7");
    }
    if (own_etcd) {
        char why[256];
        if (!etcd_available(why, sizeof(why))) {
            printf("SKIP: %s\n", why);
            return 77;
        }
        if (C.members == 1 ? etcd_start(ep, NULL, NULL, why, sizeof(why))
                           : etcd_start_cluster(em, C.members, C.url,
                                                sizeof(C.url), why,
                                                sizeof(why))) {
            for (int i = 0; i < C.members; i++) {
                etcd_cleanup(&em[i]);
            }
            die("etcd: %s", why);
        }
        if (C.members == 1) {
            snprintf(C.url, sizeof(C.url), "%s", ep->url);
        }
    }
    g_fetch_us = calloc((size_t)C.agents * (size_t)C.k * 2, sizeof(uint64_t));
    g_seen_ns = calloc((size_t)C.agents * (size_t)C.k, sizeof(uint64_t));
    g_back_ns = calloc((size_t)C.agents * (size_t)C.k, sizeof(uint64_t));
    if (!g_fetch_us || !g_seen_ns || !g_back_ns) {
        die("out of memory");
    }
    double ecpu0 = 0, ecpu1 = 0, ecpu2 = 0;
    long rss = 0;
    int conns = 0, conns_peak = 0;
    if (own_etcd) {
        etcd_usage(em, C.members, &ecpu0, &rss, &conns);
    }
    uint64_t t_start = pdx_now_ns();
    for (int i = 0; i < C.procs; i++) {
        start_proc(i, false);
    }
    uint64_t t_started = pdx_now_ns();
    bool ok_pub = pump(all_published, t_started + 120000000000ull);
    uint64_t t_pub = 0;
    int unpublished = 0;
    for (int i = 0; i < C.procs; i++) {
        unpublished += !P[i].published;
        t_pub = P[i].pub_ns > t_pub ? P[i].pub_ns : t_pub;
    }
    send_all('F');
    bool ok_fetch = pump(all_ready, pdx_now_ns() + 300000000000ull);
    if (own_etcd) {
        etcd_usage(em, C.members, &ecpu1, &rss, &conns_peak);
    }
    send_all('I');
    bool ok_idle = pump(all_idle, pdx_now_ns() + (uint64_t)(C.idle_s * 1e9) +
                                      60000000000ull);
    if (own_etcd) {
        etcd_usage(em, C.members, &ecpu2, &rss, &conns);
    }
    double etcd_idle = (ecpu2 - ecpu1) / C.idle_s;
    send_all('W');
    /* A quiet second (a spurious death would show), then the kill. */
    pump(never, pdx_now_ns() + 1000000000ull);
    int nkill = (int)(C.procs * C.kill_frac + 0.5);
    if (nkill >= C.procs) {
        nkill = C.procs - 1;
    }
    for (int i = 0; i < nkill; i++) {
        int per = per_proc();
        for (int a = i * per; a < (i + 1) * per && a < C.agents; a++) {
            g_killed_agent[a] = true;
        }
    }
    for (int a = 0; a < C.agents; a++) {
        for (int j = 0; j < C.k && !g_killed_agent[a]; j++) {
            int p = peer_of(a, j);
            g_expect_dead += p >= 0 && g_killed_agent[p];
        }
    }
    g_kill_ns = pdx_now_ns();
    for (int i = 0; i < nkill; i++) {
        kill(P[i].pid, SIGKILL);
        int st;
        waitpid(P[i].pid, &st, 0);
        close(P[i].out);
        close(P[i].in);
        P[i].alive = false;
        P[i].killed = true;
    }
    uint64_t dead_bound_ms = C.ttl_ms + 2000;
    bool ok_seen = pump(all_seen, g_kill_ns + (uint64_t)(C.ttl_ms + 20000) *
                                                   1000000ull);
    for (int a = 0, shown = 0; !ok_seen && a < C.agents && shown < 10; a++) {
        for (int j = 0; j < C.k && !g_killed_agent[a]; j++) {
            int p = peer_of(a, j);
            if (p >= 0 && g_killed_agent[p] && g_seen_ns[a * C.k + j] == 0 &&
                shown++ < 10) {
                fprintf(stderr, "not seen: a%d's peer a%d\n", a, p);
            }
        }
    }
    uint64_t seen_max_ms = 0;
    uint64_t *seen = calloc((size_t)C.agents * C.k + 1, sizeof(uint64_t));
    size_t nseen = 0;
    for (int i = 0; i < C.agents * C.k; i++) {
        if (g_seen_ns[i] != 0) {
            seen[nseen++] = (g_seen_ns[i] - g_kill_ns) / 1000000;
        }
    }
    qsort(seen, nseen, sizeof(*seen), cmp_u64);
    seen_max_ms = nseen ? seen[nseen - 1] : 0;
    /* Restart the killed processes under the same names. */
    uint64_t t_restart = 0, back_max_ms = 0;
    bool ok_back = true;
    if (C.restart && nkill > 0) {
        g_expect_back = g_expect_dead;
        t_restart = pdx_now_ns();
        for (int i = 0; i < nkill; i++) {
            P[i].killed = false;
            start_proc(i, true);
        }
        ok_back = pump(all_back, t_restart + 60000000000ull);
        for (int i = 0; i < C.agents * C.k; i++) {
            if (g_back_ns[i] > t_restart &&
                (g_back_ns[i] - t_restart) / 1000000 > back_max_ms) {
                back_max_ms = (g_back_ns[i] - t_restart) / 1000000;
            }
        }
        pump(all_ready, pdx_now_ns() + 60000000000ull);
    }
    send_all('S');
    bool ok_done = pump(all_done, pdx_now_ns() + 60000000000ull);
    int crashes = 0, survivors = 0;
    for (int i = 0; i < C.procs; i++) {
        if (P[i].pid <= 0 || P[i].killed) {
            continue;
        }
        int st = 0;
        if (!P[i].done) {
            kill(P[i].pid, SIGKILL);
        }
        waitpid(P[i].pid, &st, 0);
        survivors++;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            crashes++;
            fprintf(stderr, "process %d ended with %s %d\n", i,
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
    }
    double etcd_cpu_total = 0;
    if (own_etcd) {
        double c3;
        etcd_usage(em, C.members, &c3, &rss, &conns);
        etcd_cpu_total = c3 - ecpu0;
    }
    qsort(g_fetch_us, g_nfetch, sizeof(*g_fetch_us), cmp_u64);
    double pub_s = t_pub > t_started ? (double)(t_pub - t_start) / 1e9 : 0;
    double ev_avg = g_stats_n ? (double)g_ev_sum / g_stats_n : 0;
    double evb_avg = g_stats_n ? (double)g_evb_sum / g_stats_n : 0;
    double idle = g_idle_n ? g_idle_sum / g_idle_n : 0;
    /* What an agent may receive, whatever N: for each of its K peers a
     * delete and a put (and the resync reads of a reconnect), its own
     * key, and the same again when it was restarted itself. */
    uint64_t ev_bound = (uint64_t)(4 * C.k + 8);
    if (C.json) {
        printf("{\"agents\": %d, \"procs\": %d, \"peers\": %d, "
               "\"killed_procs\": %d, \"ttl_ms\": %u, \"pidns\": %s, "
               "\"publish_s\": %.2f, \"fetch_p50_ms\": %.2f, "
               "\"fetch_p99_ms\": %.2f, \"fetch_failures\": %zu, "
               "\"events_per_agent\": %.1f, \"events_max\": %llu, "
               "\"event_bytes_per_agent\": %.0f, "
               "\"idle_cpu_ms_per_s_per_agent\": %.3f, "
               "\"etcd_cpu_s\": %.2f, \"etcd_idle_cpu\": %.3f, "
               "\"etcd_rss_mb\": %.1f, \"etcd_conns\": %d, "
               "\"dead_seen_p50_ms\": %llu, \"dead_seen_max_ms\": %llu, "
               "\"dead_seen\": %zu, \"dead_expected\": %d, "
               "\"back_max_ms\": %llu, \"spurious\": %d, "
               "\"live_lease_regrants\": %d, \"lease_late_max_ms\": %llu, "
               "\"crashes\": %d}\n",
               C.agents, C.procs, C.k, nkill, C.ttl_ms,
               g_pidns_ok ? "true" : "false", pub_s,
               pct(g_fetch_us, g_nfetch, 0.5) / 1000.0,
               pct(g_fetch_us, g_nfetch, 0.99) / 1000.0, g_fetch_fail,
               ev_avg, (unsigned long long)g_ev_max, evb_avg, idle,
               etcd_cpu_total, etcd_idle, rss / 1024.0, conns_peak,
               (unsigned long long)pct(seen, nseen, 0.5),
               (unsigned long long)seen_max_ms, nseen, g_expect_dead,
               (unsigned long long)back_max_ms, g_spurious, g_regrants,
               (unsigned long long)g_late_max, crashes);
    } else {
        printf("%d agents in %d processes (%s), %d peers each, TTL %u ms, "
               "%d etcd member(s)\n", C.agents, C.procs,
               g_pidns_ok ? "a pid namespace each" : "one pid namespace",
               C.k, C.ttl_ms, C.members);
        printf("  all published        %.2f s after the first start%s\n",
               pub_s, unpublished ? " (NOT ALL)" : "");
        printf("  fetch p50 / p99      %.2f / %.2f ms (%zu, %zu failed)\n",
               pct(g_fetch_us, g_nfetch, 0.5) / 1000.0,
               pct(g_fetch_us, g_nfetch, 0.99) / 1000.0, g_nfetch,
               g_fetch_fail);
        printf("  events per agent     %.1f avg, %llu max (%.0f bytes avg)\n",
               ev_avg, (unsigned long long)g_ev_max, evb_avg);
        printf("  requests per agent   %.1f\n",
               g_stats_n ? (double)g_req_sum / g_stats_n : 0.0);
        printf("  idle CPU per agent   %.3f ms/s\n", idle);
        printf("  etcd                 %.2f CPU s in all, %.3f CPU s/s idle, "
               "RSS %.1f MB, %d connections after the fetches\n",
               etcd_cpu_total, etcd_idle, rss / 1024.0, conns_peak);
        printf("  killed               %d of %d processes (%d deaths to "
               "see)\n", nkill, C.procs, g_expect_dead);
        printf("  dead seen after      p50 %llu ms, max %llu ms (%zu of %d; "
               "bound TTL + 2 s = %llu ms)\n",
               (unsigned long long)pct(seen, nseen, 0.5),
               (unsigned long long)seen_max_ms, nseen, g_expect_dead,
               (unsigned long long)dead_bound_ms);
        if (C.restart && nkill > 0) {
            printf("  back after restart   max %llu ms (%d of %d)\n",
                   (unsigned long long)back_max_ms, count(g_back_ns),
                   g_expect_back);
        }
        printf("  spurious dead        %d\n", g_spurious);
        printf("  live lease re-grants %d (worst renewal delay %llu ms)\n",
               g_regrants, (unsigned long long)g_late_max);
        printf("  crashes              %d of %d processes\n", crashes,
               survivors);
    }
    int fail = 0;
    if (C.check) {
#define REQ(c, ...)                                                            \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "check failed: " __VA_ARGS__);                     \
            fprintf(stderr, "\n");                                             \
            fail = 1;                                                          \
        }                                                                      \
    } while (0)
        REQ(ok_pub && unpublished == 0, "%d processes not all published",
            unpublished);
        REQ(ok_fetch && g_fetch_fail == 0 &&
                g_nfetch == (size_t)C.agents * C.k,
            "fetches: %zu of %d, %zu failed", g_nfetch, C.agents * C.k,
            g_fetch_fail);
        REQ(ok_idle, "idle phase incomplete");
        REQ(g_spurious == 0, "%d spurious dead events", g_spurious);
        REQ(g_regrants == 0, "%d live agents lost their lease", g_regrants);
        REQ(crashes == 0, "%d crashes", crashes);
        REQ(ok_seen && (int)nseen == g_expect_dead,
            "%zu of %d deaths seen", nseen, g_expect_dead);
        /* Generous on a loaded 2-core box: the lease runs out at the
         * TTL, etcd checks expiry every 500 ms. */
        REQ(seen_max_ms <= C.ttl_ms + 6000, "a death seen after %llu ms",
            (unsigned long long)seen_max_ms);
        REQ(ok_back, "%d of %d returns seen", count(g_back_ns),
            g_expect_back);
        int want = C.restart ? C.agents
                             : C.agents - (int)(nkill * per_proc() > C.agents
                                                    ? C.agents
                                                    : nkill * per_proc());
        REQ(ok_done && g_stats_n == want, "stats of %d of %d agents",
            g_stats_n, want);
        REQ(g_ev_max <= ev_bound,
            "an agent received %llu events (bound %llu from K, not N)",
            (unsigned long long)g_ev_max, (unsigned long long)ev_bound);
    }
    for (int i = 0; own_etcd && i < C.members; i++) {
        etcd_cleanup(&em[i]);
    }
    free(seen);
    free(g_fetch_us);
    free(g_seen_ns);
    free(g_back_ns);
    return fail;
}
