/* Test helper: start, kill, restart and remove a private etcd. */
#include "etcd_launch.h"
#include "pdx_clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *etcd_bin(void)
{
    const char *env = getenv("PDX_ETCD");
    return env && *env ? env : "/usr/bin/etcd";
}

bool etcd_available(char *why, size_t len)
{
    if (access(etcd_bin(), X_OK) != 0) {
        snprintf(why, len, "%s not installed (Debian package etcd-server; "
                 "scripts/deps.sh installs it)", etcd_bin());
        return false;
    }
    return true;
}

static int free_port(const char *ip)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, ip, &a.sin_addr);
    socklen_t al = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

/* GET /health over a plain socket: no client library needed here. */
static int health_ok(const etcd_proc_t *e)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return 0;
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)e->client_port)};
    inet_pton(AF_INET, e->ip, &a.sin_addr);
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int ok = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        char req[256];
        int n = snprintf(req, sizeof(req),
                         "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n", e->ip);
        if (write(fd, req, (size_t)n) == n) {
            char buf[1024];
            size_t got = 0;
            for (int i = 0; i < 16 && got < sizeof(buf) - 1; i++) {
                ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
                if (r <= 0) {
                    break;
                }
                got += (size_t)r;
            }
            buf[got] = '\0';
            ok = strstr(buf, "\"health\":\"true\"") != NULL;
        }
    }
    close(fd);
    return ok;
}

int etcd_post(const etcd_proc_t *e, const char *path, const char *body,
              char *out, size_t out_len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)e->client_port)};
    inet_pton(AF_INET, e->ip, &a.sin_addr);
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc = -1;
    char req[2048];
    int n = snprintf(req, sizeof(req),
                     "POST %s HTTP/1.0\r\nHost: %s\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     path, e->ip, strlen(body), body);
    if (n > 0 && (size_t)n < sizeof(req) &&
        connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        write(fd, req, (size_t)n) == n) {
        char buf[4096];
        size_t got = 0;
        for (int i = 0; i < 64 && got < sizeof(buf) - 1; i++) {
            ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
            if (r <= 0) {
                break; /* HTTP/1.0: the server closes at the end */
            }
            got += (size_t)r;
        }
        buf[got] = '\0';
        const char *sp = strchr(buf, ' ');
        const char *bodyp = strstr(buf, "\r\n\r\n");
        if (sp != NULL && strncmp(sp + 1, "200", 3) == 0) {
            rc = 0;
        }
        if (out != NULL && out_len > 0) {
            snprintf(out, out_len, "%s", bodyp ? bodyp + 4 : buf);
        }
    }
    close(fd);
    return rc;
}

int etcd_wait_ready(const etcd_proc_t *e, int timeout_ms)
{
    uint64_t end = pdx_now_ms() + (uint64_t)timeout_ms;
    while (pdx_now_ms() < end) {
        if (e->pid > 0 && waitpid(e->pid, NULL, WNOHANG) == e->pid) {
            return -1; /* exited (port taken?) */
        }
        if (health_ok(e)) {
            return 0;
        }
        usleep(50000);
    }
    return -1;
}

static int spawn(etcd_proc_t *e)
{
    char data[300], log[300], curl_[160], purl[160], cluster[200];
    snprintf(data, sizeof(data), "%s/data", e->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
    snprintf(curl_, sizeof(curl_), "http://%s:%d", e->ip, e->client_port);
    snprintf(purl, sizeof(purl), "http://%s:%d", e->ip, e->peer_port);
    snprintf(cluster, sizeof(cluster), "default=%s", purl);
    snprintf(e->url, sizeof(e->url), "%s", curl_);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        char *argv[64];
        int n = 0;
        argv[n++] = (char *)etcd_bin();
        argv[n++] = "--name=default";
        char a1[400], a2[200], a3[200], a4[200], a5[200], a6[240];
        snprintf(a1, sizeof(a1), "--data-dir=%s", data);
        snprintf(a2, sizeof(a2), "--listen-client-urls=%s", curl_);
        snprintf(a3, sizeof(a3), "--advertise-client-urls=%s", curl_);
        snprintf(a4, sizeof(a4), "--listen-peer-urls=%s", purl);
        snprintf(a5, sizeof(a5), "--initial-advertise-peer-urls=%s", purl);
        snprintf(a6, sizeof(a6), "--initial-cluster=%s", cluster);
        argv[n++] = a1;
        argv[n++] = a2;
        argv[n++] = a3;
        argv[n++] = a4;
        argv[n++] = a5;
        argv[n++] = a6;
        argv[n++] = "--logger=zap";
        argv[n++] = "--log-level=warn";
        char extra[256];
        snprintf(extra, sizeof(extra), "%s", e->extra);
        for (char *t = strtok(extra, " "); t != NULL && n < 62;
             t = strtok(NULL, " ")) {
            argv[n++] = t;
        }
        argv[n] = NULL;
        execv(argv[0], argv);
        _exit(127);
    }
    e->pid = pid;
    return 0;
}

int etcd_start(etcd_proc_t *e, const char *ip, const char *extra, char *err,
               size_t err_len)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->ip, sizeof(e->ip), "%s", ip ? ip : "127.0.0.1");
    snprintf(e->extra, sizeof(e->extra), "%s", extra ? extra : "");
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof(e->dir), "%s/pdx-etcd-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(e->dir) == NULL) {
        snprintf(err, err_len, "mkdtemp: %s", strerror(errno));
        return -1;
    }
    /* A port found free can be taken before etcd binds it: try again. */
    for (int attempt = 0; attempt < 4; attempt++) {
        e->client_port = free_port(e->ip);
        e->peer_port = free_port(e->ip);
        if (e->client_port <= 0 || e->peer_port <= 0 ||
            e->client_port == e->peer_port) {
            continue;
        }
        if (spawn(e) != 0) {
            snprintf(err, err_len, "fork: %s", strerror(errno));
            return -1;
        }
        if (etcd_wait_ready(e, 15000) == 0) {
            return 0;
        }
        etcd_kill(e, SIGKILL);
    }
    snprintf(err, err_len, "etcd did not start on %s (log: %s/etcd.log)",
             e->ip, e->dir);
    return -1;
}

int etcd_restart(etcd_proc_t *e, char *err, size_t err_len)
{
    if (e->pid > 0) {
        etcd_kill(e, SIGKILL);
    }
    /* The old process's ports may linger briefly: a few tries. */
    for (int attempt = 0; attempt < 4; attempt++) {
        if (spawn(e) != 0) {
            snprintf(err, err_len, "fork: %s", strerror(errno));
            return -1;
        }
        if (etcd_wait_ready(e, 15000) == 0) {
            return 0;
        }
        etcd_kill(e, SIGKILL);
        usleep(200000);
    }
    snprintf(err, err_len, "etcd did not restart (log: %s/etcd.log)", e->dir);
    return -1;
}

void etcd_kill(etcd_proc_t *e, int sig)
{
    if (e->pid <= 0) {
        return;
    }
    kill(e->pid, sig);
    for (int i = 0; i < 100; i++) { /* 10 s for a clean stop */
        if (waitpid(e->pid, NULL, WNOHANG) == e->pid) {
            e->pid = -1;
            return;
        }
        usleep(100000);
    }
    kill(e->pid, SIGKILL);
    waitpid(e->pid, NULL, 0);
    e->pid = -1;
}

static void rm_tree(const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) {
        waitpid(pid, NULL, 0);
    }
}

void etcd_cleanup(etcd_proc_t *e)
{
    etcd_kill(e, SIGKILL);
    if (e->dir[0] != '\0' && getenv("PDX_KEEP_ETCD") == NULL) {
        rm_tree(e->dir);
        e->dir[0] = '\0';
    }
}

int etcd_start_cluster(etcd_proc_t *m, int n, char *endpoints,
                       size_t endpoints_len, char *err, size_t err_len)
{
    if (n < 1 || n > 7) {
        snprintf(err, err_len, "1 to 7 members");
        return -1;
    }
    char cluster[512] = "";
    const char *tmp = getenv("TMPDIR");
    for (int i = 0; i < n; i++) {
        etcd_proc_t *e = &m[i];
        memset(e, 0, sizeof(*e));
        snprintf(e->ip, sizeof(e->ip), "127.0.0.1");
        snprintf(e->dir, sizeof(e->dir), "%s/pdx-etcd-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (mkdtemp(e->dir) == NULL) {
            snprintf(err, err_len, "mkdtemp: %s", strerror(errno));
            return -1;
        }
        /* Ports of every member first: each names all in its flags. */
        for (int guard = 0; guard < 16; guard++) {
            e->client_port = free_port(e->ip);
            e->peer_port = free_port(e->ip);
            bool clash = e->client_port <= 0 || e->peer_port <= 0 ||
                         e->client_port == e->peer_port;
            for (int j = 0; j < i && !clash; j++) {
                clash = m[j].client_port == e->client_port ||
                        m[j].peer_port == e->peer_port ||
                        m[j].client_port == e->peer_port ||
                        m[j].peer_port == e->client_port;
            }
            if (!clash) {
                break;
            }
        }
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof(cluster) - l, "%sm%d=http://%s:%d",
                 i ? "," : "", i, e->ip, e->peer_port);
    }
    endpoints[0] = '\0';
    for (int i = 0; i < n; i++) {
        etcd_proc_t *e = &m[i];
        /* Later flags win over spawn's single-member defaults. */
        snprintf(e->extra, sizeof(e->extra),
                 "--name=m%d --initial-cluster=%s "
                 "--initial-cluster-state=new --initial-cluster-token=pdx-%d",
                 i, cluster, (int)getpid());
        if (spawn(e) != 0) {
            snprintf(err, err_len, "fork: %s", strerror(errno));
            return -1;
        }
        size_t l = strlen(endpoints);
        snprintf(endpoints + l, endpoints_len - l, "%s%s", i ? "," : "",
                 e->url);
    }
    for (int i = 0; i < n; i++) {
        if (etcd_wait_ready(&m[i], 30000) != 0) {
            snprintf(err, err_len, "etcd member %d did not become healthy "
                     "(log: %s/etcd.log)", i, m[i].dir);
            return -1;
        }
    }
    return 0;
}
