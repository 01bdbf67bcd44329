/* Network + pid namespace "hosts" for multi-node tests (see netns.h). */
#include "netns.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define HUB_IP "10.77.0.1"

const char *netns_hub_ip(void) { return HUB_IP; }

/* Run `ip` with the given arguments; 0 on success, else -1 with its
 * output in `out`. */
static int ip_cmd(char *out, size_t out_len, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    char *argv[32];
    int n = 0;
    argv[n++] = "ip";
    for (char *t = strtok(line, " "); t != NULL && n < 31;
         t = strtok(NULL, " ")) {
        argv[n++] = t;
    }
    argv[n] = NULL;
    int pfd[2];
    if (pipe(pfd) != 0) {
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execvp("ip", argv);
        fprintf(stderr, "cannot run ip: %s", strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char buf[512];
    size_t got = 0;
    for (int i = 0; i < 64 && got < sizeof(buf) - 1; i++) {
        ssize_t r = read(pfd[0], buf + got, sizeof(buf) - 1 - got);
        if (r <= 0) {
            break;
        }
        got += (size_t)r;
    }
    buf[got] = '\0';
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        return 0;
    }
    if (out != NULL) {
        buf[strcspn(buf, "\n")] = '\0';
        snprintf(out, out_len, "ip %s: %s", argv[1] ? argv[1] : "",
                 got ? buf : "failed");
    }
    return -1;
}

int netns_init(netns_lab_t *lab, int nhosts, char *why, size_t why_len)
{
    memset(lab, 0, sizeof(*lab));
    lab->root_fd = -1;
    if (nhosts < 1 || nhosts > NETNS_MAX_HOSTS) {
        snprintf(why, why_len, "1 to %d hosts", NETNS_MAX_HOSTS);
        return -1;
    }
    if (geteuid() != 0) {
        snprintf(why, why_len, "not root: network namespaces, veth pairs "
                 "and pid namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN");
        return -1;
    }
    lab->root_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (lab->root_fd < 0) {
        snprintf(why, why_len, "/proc/self/ns/net: %s", strerror(errno));
        return -1;
    }
    snprintf(lab->tag, sizeof(lab->tag), "pdxt%d", (int)getpid());
    snprintf(lab->hub, sizeof(lab->hub), "%s-hub", lab->tag);
    char err[512];
    if (ip_cmd(err, sizeof(err), "netns add %s", lab->hub) != 0) {
        snprintf(why, why_len, "cannot create a network namespace: %s", err);
        close(lab->root_fd);
        lab->root_fd = -1;
        return -1;
    }
    lab->nhosts = 0;
    if (ip_cmd(err, sizeof(err), "-n %s link set lo up", lab->hub) ||
        ip_cmd(err, sizeof(err), "-n %s link add br0 type bridge",
               lab->hub) ||
        ip_cmd(err, sizeof(err), "-n %s addr add " HUB_IP "/24 dev br0",
               lab->hub) ||
        ip_cmd(err, sizeof(err), "-n %s link set br0 up", lab->hub)) {
        snprintf(why, why_len, "cannot make the hub's bridge: %s", err);
        netns_cleanup(lab);
        return -1;
    }
    for (int i = 0; i < nhosts; i++) {
        snprintf(lab->host[i], sizeof(lab->host[i]), "%s-h%d", lab->tag, i);
        snprintf(lab->ip[i], sizeof(lab->ip[i]), "10.77.0.%d", 11 + i);
        if (ip_cmd(err, sizeof(err), "netns add %s", lab->host[i])) {
            snprintf(why, why_len, "%s", err);
            netns_cleanup(lab);
            return -1;
        }
        lab->nhosts = i + 1;
        if (ip_cmd(err, sizeof(err),
                   "-n %s link add vb%d type veth peer name eth0 netns %s",
                   lab->hub, i, lab->host[i]) ||
            ip_cmd(err, sizeof(err), "-n %s link set vb%d master br0",
                   lab->hub, i) ||
            ip_cmd(err, sizeof(err), "-n %s link set vb%d up", lab->hub, i) ||
            ip_cmd(err, sizeof(err), "-n %s link set lo up", lab->host[i]) ||
            ip_cmd(err, sizeof(err), "-n %s addr add %s/24 dev eth0",
                   lab->host[i], lab->ip[i]) ||
            ip_cmd(err, sizeof(err), "-n %s link set eth0 up",
                   lab->host[i])) {
            snprintf(why, why_len, "cannot make a veth pair: %s", err);
            netns_cleanup(lab);
            return -1;
        }
    }
    return 0;
}

void netns_cleanup(netns_lab_t *lab)
{
    if (lab->tag[0] == '\0') {
        return;
    }
    if (lab->root_fd >= 0) {
        setns(lab->root_fd, CLONE_NEWNET);
    }
    for (int i = 0; i < lab->nhosts; i++) {
        ip_cmd(NULL, 0, "netns del %s", lab->host[i]);
    }
    ip_cmd(NULL, 0, "netns del %s", lab->hub);
    lab->nhosts = 0;
    lab->tag[0] = '\0';
    if (lab->root_fd >= 0) {
        close(lab->root_fd);
        lab->root_fd = -1;
    }
}

static int open_ns(netns_lab_t *lab, int host)
{
    if (host == -1) {
        return dup(lab->root_fd);
    }
    char path[128];
    snprintf(path, sizeof(path), "/run/netns/%s",
             host == -2 ? lab->hub : lab->host[host]);
    return open(path, O_RDONLY | O_CLOEXEC);
}

int netns_enter(netns_lab_t *lab, int host)
{
    if (host < -2 || host >= lab->nhosts) {
        return -1;
    }
    int fd = open_ns(lab, host);
    if (fd < 0) {
        return -1;
    }
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

int netns_link(netns_lab_t *lab, int host, bool up)
{
    return ip_cmd(NULL, 0, "-n %s link set vb%d %s", lab->hub, host,
                  up ? "up" : "down");
}

typedef struct spawn_arg {
    int netfd;
    char *const *argv;
    char *const *env;
    int keep_fd;
} spawn_arg_t;

static int spawn_main(void *p)
{
    spawn_arg_t *a = p;
    /* pid 1 of its own pid namespace: dies with the caller. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (setns(a->netfd, CLONE_NEWNET) != 0) {
        _exit(126);
    }
    for (char *const *e = a->env; e != NULL && *e != NULL; e++) {
        putenv(*e);
    }
    for (int fd = 3; fd < 1024; fd++) {
        if (fd != a->keep_fd) {
            close(fd);
        }
    }
    execv(a->argv[0], a->argv);
    _exit(127);
}

pid_t netns_spawn(netns_lab_t *lab, int host, char *const argv[],
                  char *const env[], int keep_fd)
{
    if (host < 0 || host >= lab->nhosts) {
        return -1;
    }
    spawn_arg_t a = {.netfd = open_ns(lab, host), .argv = argv, .env = env,
                     .keep_fd = keep_fd};
    if (a.netfd < 0) {
        return -1;
    }
    size_t stack_len = 1 << 20;
    char *stack = malloc(stack_len);
    if (stack == NULL) {
        close(a.netfd);
        return -1;
    }
    pid_t pid = clone(spawn_main, stack + stack_len, CLONE_NEWPID | SIGCHLD,
                      &a);
    free(stack); /* the child has its own copy */
    close(a.netfd);
    return pid;
}
