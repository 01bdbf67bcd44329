/* Running ucx_perftest (server and client, two processes on loopback) as
 * the peer pdx is compared with, and parsing its final bandwidth. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perftest.h"

/* A port nothing listens on now (the kernel's pick for an ephemeral bind);
 * another process could take it before perftest does, which shows up as a
 * perftest failure, never as a wrong number. */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
        return 0;
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    close(s);
    return port;
}

/* Is a TCP socket listening on `port` (IPv4 or IPv6)? Probing by
 * connecting would be taken by perftest as its client. */
static int port_listening(int port)
{
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (size_t f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (fp == NULL) {
            continue;
        }
        char line[512];
        while (fgets(line, sizeof(line), fp) != NULL) {
            char local[128];
            unsigned st;
            if (sscanf(line, " %*d: %127s %*s %x", local, &st) != 2) {
                continue;
            }
            char *colon = strrchr(local, ':');
            if (colon != NULL && st == 0x0A &&
                (int)strtol(colon + 1, NULL, 16) == port) {
                fclose(fp);
                return 1;
            }
        }
        fclose(fp);
    }
    return 0;
}

static pid_t run_perftest(const char *bin, const char *tls, int user_mem,
                          const char *host, int port, const char *test,
                          uint64_t size, uint64_t iters, uint64_t warmup,
                          int out_fd)
{
    char sport[16], ssize[32], siters[32], swarm[32], stls[96];
    snprintf(sport, sizeof(sport), "%d", port);
    snprintf(ssize, sizeof(ssize), "%llu", (unsigned long long)size);
    snprintf(siters, sizeof(siters), "%llu", (unsigned long long)iters);
    snprintf(swarm, sizeof(swarm), "%llu", (unsigned long long)warmup);
    snprintf(stls, sizeof(stls), "UCX_TLS=%s", tls);
    const char *env[4] = {stls, NULL, NULL, NULL};
    size_t ne = 1;
    if (user_mem) {
        env[ne++] = "UCX_ALLOC_PRIO=thp,mmap,heap";
    }
    const char *argv[20];
    size_t n = 0;
    argv[n++] = bin;
    if (host != NULL) {
        argv[n++] = host;
    }
    argv[n++] = "-p";
    argv[n++] = sport;
    argv[n++] = "-t";
    argv[n++] = test;
    argv[n++] = "-s";
    argv[n++] = ssize;
    argv[n++] = "-n";
    argv[n++] = siters;
    argv[n++] = "-w";
    argv[n++] = swarm;
    argv[n] = NULL;
    return spawn_cmd(argv, env, out_fd, -1);
}

/* waitpid with a deadline; kills on expiry. Returns the exit status, or
 * -1 for a signal or a kill. */
static int wait_deadline(pid_t pid, uint64_t deadline)
{
    int status;
    if (!wait_child(pid, deadline, &status)) {
        return -2;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void last_line(const char *text, const char *needle, char *out,
                      size_t len)
{
    out[0] = '\0';
    const char *p = text;
    while (p != NULL && *p != '\0') {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && (needle == NULL || memmem(p, n, needle, strlen(needle)))) {
            snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), p);
        }
        p = e ? e + 1 : NULL;
    }
}

static char *slurp_fd(int fd)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    lseek(fd, 0, SEEK_SET);
    ssize_t n;
    while (buf != NULL && (n = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf != NULL) {
        buf[len] = '\0';
    }
    return buf;
}

int perftest_run(const char *tls, pdx_xfer_op_t op, uint64_t size, int user_mem,
                 double seconds, double assumed_gbps, perftest_result_t *res)
{
    memset(res, 0, sizeof(*res));
    const char *bin = getenv("PDX_BENCH_PERFTEST");
    if (bin == NULL) {
        bin = "ucx_perftest";
    }
    const char *test = op == PDX_XFER_READ ? "ucp_get" : "ucp_put_bw";
    snprintf(res->test, sizeof(res->test), "%s", test);
    uint64_t iters = (uint64_t)(seconds * assumed_gbps * 1e9 / (double)size);
    uint64_t min_iters = assumed_gbps < 1.0 ? 100 : 1000;
    if (iters < min_iters) {
        iters = min_iters;
    }
    if (iters > 5000000) {
        iters = 5000000;
    }
    uint64_t warmup = iters / 10 < 10 ? 10 : iters / 10;
    res->iters = iters;
    res->warmup = warmup;

    char path_s[] = "/tmp/pdx-bench-pts-XXXXXX";
    char path_c[] = "/tmp/pdx-bench-ptc-XXXXXX";
    int fd_s = mkstemp(path_s), fd_c = mkstemp(path_c);
    if (fd_s < 0 || fd_c < 0) {
        snprintf(res->why, sizeof(res->why), "mkstemp: %s", strerror(errno));
        return -1;
    }
    unlink(path_s);
    unlink(path_c);

    int port = free_port();
    pid_t srv = run_perftest(bin, tls, user_mem, NULL, port, test, size, iters,
                             warmup, fd_s);
    if (srv < 0) {
        snprintf(res->why, sizeof(res->why), "cannot run %s: %s", bin,
                 strerror(errno));
        close(fd_s);
        close(fd_c);
        return -1;
    }
    uint64_t t0 = pdx_now_ns();
    int up = 0;
    while (pdx_now_ns() - t0 < 10000000000ull) {
        if (port_listening(port)) {
            up = 1;
            break;
        }
        int status;
        if (waitpid(srv, &status, WNOHANG) == srv) {
            srv = -1;
            break;
        }
        usleep(2000);
    }
    int rc = -1;
    char *out = NULL;
    if (!up) {
        char *s = slurp_fd(fd_s);
        char line[160];
        last_line(s ? s : "", NULL, line, sizeof(line));
        snprintf(res->why, sizeof(res->why), "server did not listen: %s",
                 line[0] ? line : "(no output)");
        free(s);
        goto out;
    }
    pid_t cli = run_perftest(bin, tls, user_mem, "127.0.0.1", port, test, size,
                             iters, warmup, fd_c);
    if (cli < 0) {
        snprintf(res->why, sizeof(res->why), "cannot run %s: %s", bin,
                 strerror(errno));
        goto out;
    }
    /* At a fifth of the assumed rate it still finishes; slower than
     * that, its last progress line (printed every second) is taken. */
    uint64_t limit = (uint64_t)((seconds * 5 + 5) * 1e9);
    int crc = wait_deadline(cli, pdx_now_ns() + limit);
    out = slurp_fd(fd_c);
    char line[256];
    last_line(out ? out : "", "Final:", line, sizeof(line));
    double f[8];
    int ok = crc == 0 &&
             sscanf(line, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &f[0],
                    &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7]) == 8;
    if (!ok && crc == -2) {
        last_line(out ? out : "", "[thread 0]", line, sizeof(line));
        ok = sscanf(line, "[thread 0] %lf %lf %lf %lf %lf %lf %lf %lf", &f[0],
                    &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7]) == 8;
        res->partial = ok;
    }
    if (ok) {
        /* ucx_perftest's MB/s is 2^20 bytes per second. */
        res->mbps = f[5];
        res->gbps = f[5] * 1048576.0 / 1e9;
        res->lat_us = f[3];
        res->ok = 1;
        rc = 0;
    } else {
        char l2[160];
        last_line(out ? out : "", "ERROR", l2, sizeof(l2));
        if (l2[0] == '\0') {
            last_line(out ? out : "", NULL, l2, sizeof(l2));
        }
        snprintf(res->why, sizeof(res->why), "%s (exit %d): %s",
                 crc == -2 ? "timed out" : "client failed", crc,
                 l2[0] ? l2 : "(no output)");
    }
out:
    if (srv > 0) {
        wait_deadline(srv, pdx_now_ns() + 3000000000ull);
    }
    free(out);
    close(fd_s);
    close(fd_c);
    return rc;
}
