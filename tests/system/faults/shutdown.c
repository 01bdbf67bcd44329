/* Shutdown with a faulty peer: D has READs and WRITEs in flight to P when
 * P is killed (SIGKILL) or hung (SIGSTOP). Then D
 *   --end wait     waits for every request to end (each with its status),
 *                  unloads P, destroys its agent and exits;
 *   --end destroy  unloads P and destroys its agent at once, requests still
 *                  in flight (released first, or not at all: --no-release);
 *   --end exit     calls exit() with the agent and its requests alive.
 * A supervisor process runs P and D and checks that D exits with status 0
 * within 5 s of the moment its requests ended (or of the fault, for destroy
 * and exit), and that D's output has no UCX assertion or fatal line.
 *
 * shutdown --path ucx|ucx-tcp|shm --mode kill|stop [--end wait|destroy|exit]
 *          [--no-release] */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define XFER (64u << 20)   /* one request */
#define REGION (4 * XFER) /* P's region: one piece per request */
#define NREAD 2
#define NWRITE 2
#define EXIT_BOUND_MS 5000

static const char *g_path = "ucx";
static const char *g_end = "wait";
static int g_stop, g_no_release;

static void *region_alloc(size_t len)
{
    void *p = ctl_path_alloc(g_path, len);
    memset(p, 0x5a, len);
    return p;
}

/* P: its region, its blob to D, D's blob back, then progress until the
 * socket closes (or the supervisor kills it). */
static int p_main(int fd)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    pdx_agent_h a;
    CHECK(pdx_agent_create("shutdown-p", &ap, &a));
    ctl_path_backends(a, g_path, NULL, NULL);
    void *mem = region_alloc(REGION);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)mem, REGION,
                           0, 0, &reg));
    char dname[PDX_NAME_MAX];
    ctl_handshake_target(a, fd, dname);
    struct pollfd pf = {fd, POLLIN, 0};
    while (poll(&pf, 1, 1000) == 0) {
    }
    pdx_mem_deregister(a, reg);
    pdx_agent_destroy(a);
    return 0;
}

static void say(int fd, const char *what)
{
    send_msg(fd, what, (uint32_t)strlen(what));
}

/* D: requests to P in flight, the fault, then the chosen end. Tells the
 * supervisor "ended" when it starts to shut down. */
static int d_main(int pfd, int sfd, pid_t p_pid)
{
    pdx_agent_params_t ap = {
        .field_mask = PDX_AGENT_PARAM_FLAGS | PDX_AGENT_PARAM_XFER_TIMEOUT,
        .flags = PDX_AGENT_F_PROGRESS_THREAD,
        .xfer_timeout_ms = 1500};
    pdx_agent_h d;
    CHECK(pdx_agent_create("shutdown-d", &ap, &d));
    ctl_path_backends(d, g_path, NULL, NULL);
    size_t local_len = (size_t)(NREAD + NWRITE) * XFER;
    unsigned char *local = region_alloc(local_len);
    pdx_mem_reg_h reg;
    CHECK(pdx_mem_register(d, PDX_MEM_DRAM, (uint64_t)(uintptr_t)local,
                           local_len, 0, 0, &reg));
    char pname[PDX_NAME_MAX];
    pdx_peer_info_t info;
    pdx_region_info_t r;
    ctl_handshake_initiator(d, pfd, "P", pname, &info, &r, 1);

    pdx_xfer_h x[NREAD + NWRITE];
    for (int i = 0; i < NREAD + NWRITE; i++) {
        pdx_desc_t l = {(uint64_t)(uintptr_t)(local + (size_t)i * XFER), XFER,
                        0, 0};
        pdx_desc_t rd = {r.addr + (uint64_t)i * XFER, XFER, 0, 0};
        pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &rd, 1};
        CHECK(pdx_xfer_create(d, i < NREAD ? PDX_XFER_READ : PDX_XFER_WRITE,
                              &ll, &rl, pname, "done", 4, &x[i]));
        CHECK(pdx_xfer_post(x[i]));
    }
    if (kill(p_pid, g_stop ? SIGSTOP : SIGKILL) != 0) {
        die("kill: %s", strerror(errno));
    }
    uint64_t fault = pdx_now_ms();
    printf("D: %s sent to P with %d READs and %d WRITEs of %u MiB posted\n",
           g_stop ? "SIGSTOP" : "SIGKILL", NREAD, NWRITE, XFER >> 20);
    fflush(stdout);

    if (strcmp(g_end, "exit") == 0) {
        say(sfd, "ended");
        exit(0); /* agent, registration and requests alive */
    }
    if (strcmp(g_end, "wait") == 0) {
        pdx_status_t st[NREAD + NWRITE];
        int left = NREAD + NWRITE;
        for (int i = 0; i < NREAD + NWRITE; i++) {
            st[i] = PDX_INPROGRESS;
        }
        while (left > 0) {
            if (pdx_now_ms() - fault > 20000) {
                die("D: %d requests still in flight 20 s after the fault",
                    left);
            }
            for (int i = 0; i < NREAD + NWRITE; i++) {
                if (st[i] == PDX_INPROGRESS &&
                    (st[i] = pdx_xfer_check(x[i])) != PDX_INPROGRESS) {
                    left--;
                    printf("D: %s %d ended '%s' after %llu ms%s%s\n",
                           i < NREAD ? "READ" : "WRITE", i,
                           pdx_status_string(st[i]),
                           (unsigned long long)(pdx_now_ms() - fault),
                           st[i] < 0 ? ": " : "",
                           st[i] < 0 ? pdx_last_error() : "");
                }
            }
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < NREAD + NWRITE; i++) {
            /* A killed or hung peer: an error, except over shared memory,
             * where the initiator's memcpy needs nothing of the target. */
            if (st[i] != PDX_OK && st[i] != PDX_ERR_REMOTE_DISCONNECT &&
                st[i] != PDX_ERR_TIMEOUT && st[i] != PDX_ERR_CANCELED) {
                die("D: request %d ended with unexpected '%s'", i,
                    pdx_status_string(st[i]));
            }
            if (st[i] == PDX_OK && strcmp(g_path, "shm") != 0) {
                die("D: request %d to a %s peer over UCX succeeded", i,
                    g_stop ? "stopped" : "killed");
            }
        }
    }
    say(sfd, "ended");
    uint64_t t0 = pdx_now_ms();
    if (!g_no_release) {
        for (int i = 0; i < NREAD + NWRITE; i++) {
            pdx_xfer_release(x[i]);
        }
    }
    uint64_t t1 = pdx_now_ms();
    pdx_status_t ust = pdx_peer_unload(d, pname);
    uint64_t t2 = pdx_now_ms();
    pdx_mem_deregister(d, reg);
    pdx_agent_destroy(d);
    uint64_t t3 = pdx_now_ms();
    printf("D: release %llu ms, unload '%s' %llu ms, destroy %llu ms\n",
           (unsigned long long)(t1 - t0), pdx_status_string(ust),
           (unsigned long long)(t2 - t1), (unsigned long long)(t3 - t2));
    fflush(stdout);
    ctl_path_free(g_path, local);
    return 0;
}

static pid_t spawn(const char *self, char *const extra[], int keep1,
                   int keep2, int out_fd)
{
    pid_t pid = fork();
    if (pid < 0) {
        die("fork: %s", strerror(errno));
    }
    if (pid != 0) {
        return pid;
    }
    int keep[2] = {keep1, keep2};
    for (int k = 0; k < 2; k++) {
        if (keep[k] >= 0) {
            fcntl(keep[k], F_SETFD, 0);
        }
    }
    if (out_fd >= 0) {
        dup2(out_fd, 1);
        dup2(out_fd, 2);
    }
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)self;
    for (int i = 0; extra[i] != NULL && n < 15; i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    execv(self, argv);
    _exit(127);
}

/* Reads what D prints (stdout and stderr) until EOF or the deadline; fails
 * on lines that mean UCX or pdx gave up on the process. */
static int drain_output(int fd, uint64_t deadline, int *bad)
{
    static char acc[1 << 16];
    static size_t used;
    for (;;) {
        uint64_t now = pdx_now_ms();
        if (now >= deadline) {
            return 0;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(deadline - now)) <= 0) {
            continue;
        }
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        fwrite(buf, 1, (size_t)n, stdout);
        if (used + (size_t)n < sizeof(acc) - 1) {
            memcpy(acc + used, buf, (size_t)n);
            used += (size_t)n;
            acc[used] = '\0';
        }
    }
    fflush(stdout);
    static const char *const fatal[] = {"Assertion", "Caught signal",
                                        "AddressSanitizer", "runtime error",
                                        "Fatal:"};
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++) {
        if (strstr(acc, fatal[i]) != NULL) {
            fprintf(stderr, "FAIL: D's output has '%s'\n", fatal[i]);
            *bad = 1;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    const char *role = NULL;
    int fd1 = -1, fd2 = -1;
    pid_t p_pid = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            g_path = argv[++i];
        } else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            g_stop = strcmp(argv[++i], "stop") == 0;
        } else if (strcmp(argv[i], "--end") == 0 && i + 1 < argc) {
            g_end = argv[++i];
        } else if (strcmp(argv[i], "--no-release") == 0) {
            g_no_release = 1;
        } else if (strcmp(argv[i], "--role") == 0 && i + 4 < argc) {
            role = argv[++i];
            fd1 = atoi(argv[++i]);
            fd2 = atoi(argv[++i]);
            p_pid = (pid_t)atoi(argv[++i]);
        }
    }
    if (!ctl_path_valid(g_path)) {
        die("--path ucx|ucx-tcp|shm");
    }
    if (strcmp(g_end, "wait") != 0 && strcmp(g_end, "destroy") != 0 &&
        strcmp(g_end, "exit") != 0) {
        die("--end wait|destroy|exit");
    }
    if (role != NULL && strcmp(role, "p") == 0) {
        alarm(120);
        return p_main(fd1);
    }
    if (role != NULL && strcmp(role, "d") == 0) {
        alarm(60);
        setvbuf(stdout, NULL, _IOLBF, 0);
        return d_main(fd1, fd2, p_pid);
    }

    /* Supervisor. */
    alarm(90);
    int pd[2], sd[2], out[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pd) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sd) != 0 ||
        pipe2(out, O_CLOEXEC) != 0) {
        die("socketpair: %s", strerror(errno));
    }
    char a1[16], a2[16], a3[16];
    snprintf(a1, sizeof(a1), "%d", pd[1]);
    char *pargs[] = {"--path", (char *)g_path, "--role", "p", a1, "-1", "0",
                     NULL};
    pid_t p = spawn(argv[0], pargs, pd[1], -1, -1);
    close(pd[1]);
    snprintf(a1, sizeof(a1), "%d", pd[0]);
    snprintf(a2, sizeof(a2), "%d", sd[1]);
    snprintf(a3, sizeof(a3), "%d", (int)p);
    char *dargs[] = {"--path", (char *)g_path, "--mode",
                     g_stop ? "stop" : "kill", "--end", (char *)g_end,
                     g_no_release ? "--no-release" : "--path",
                     (char *)g_path, "--role", "d", a1, a2, a3, NULL};
    pid_t d = spawn(argv[0], dargs, pd[0], sd[1], out[1]);
    close(pd[0]);
    close(sd[1]);
    close(out[1]);

    int bad = 0;
    /* Until D says "ended" (bounded by D's own 20 s wait and alarm). */
    struct pollfd pf = {sd[0], POLLIN, 0};
    uint64_t limit = pdx_now_ms() + 40000;
    char *msg = NULL;
    while (msg == NULL && pdx_now_ms() < limit) {
        if (poll(&pf, 1, 100) > 0) {
            msg = recv_msg(sd[0], NULL);
            break;
        }
    }
    uint64_t ended = pdx_now_ms();
    if (msg == NULL) {
        fprintf(stderr, "FAIL: D never reached its shutdown\n");
        bad = 1;
    }
    free(msg);
    drain_output(out[0], ended + EXIT_BOUND_MS, &bad);
    int status = 0;
    pid_t w = 0;
    while ((w = waitpid(d, &status, WNOHANG)) == 0 &&
           pdx_now_ms() < ended + EXIT_BOUND_MS) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    uint64_t exited = pdx_now_ms();
    if (w == 0) {
        fprintf(stderr, "FAIL: D did not exit within %d ms of its shutdown\n",
                EXIT_BOUND_MS);
        kill(d, SIGKILL);
        waitpid(d, &status, 0);
        bad = 1;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: D ended with %s %d\n",
                WIFSIGNALED(status) ? "signal" : "status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        bad = 1;
    }
    kill(p, SIGCONT);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    printf("path %s, P %s, end %s%s: D exited %llu ms after its shutdown "
           "began\n%s\n", g_path, g_stop ? "stopped" : "killed", g_end,
           g_no_release ? " (requests not released)" : "",
           (unsigned long long)(exited - ended), bad ? "FAIL" : "PASS");
    return bad;
}
