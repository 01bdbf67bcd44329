/* pdx-bench idle: what an idle agent costs. A child process holds one
 * agent with the progress thread on (UCX backend, the cma backend) and
 * loads K peers (0 and 8): agents of the parent process, a separate
 * process so their CPU is not counted. A third row: 8 peers, and the agent
 * stages GPU memory over UCX (a VRAM region registered: pinned pool and
 * staging service up), where a CUDA driver is found. Nothing is transferred; the child
 * measures its own CPU time (getrusage) and its threads' voluntary
 * context switches (wake-ups) over the measured seconds. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define IDLE_MAX_PEERS 8

typedef struct idle_result {
    double cpu_ms_per_s, wakeups_per_s;
    int ok;
} idle_result_t;

/* With `vram`, ucx stages GPU memory (vram=staged) and a GPU region is
 * registered: the pinned pool and the staging service exist. */
static pdx_agent_h idle_agent(const char *name, int vram)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    pdx_agent_h a;
    pdx_option_t vo = {"vram", "staged"};
    if (pdx_agent_create(name, &ap, &a) != PDX_OK ||
        pdx_backend_create(a, "ucx", vram ? &vo : NULL, vram ? 1 : 0, NULL) !=
            PDX_OK) {
        die("idle: agent %s: %s", name, pdx_last_error());
    }
    pdx_backend_create(a, "cma", NULL, 0, NULL); /* optional here */
    if (vram) {
        pdx_mem_reg_h r;
        uint64_t len = 4u << 20;
        if (pdx_mem_register(a, PDX_MEM_VRAM, bench_vram_alloc(len), len, 0,
                             0, &r) != PDX_OK) {
            die("idle: agent %s: VRAM: %s", name, pdx_last_error());
        }
    }
    return a;
}

/* Voluntary context switches of every thread of the process (Linux sums
 * threads in RUSAGE_SELF): each is a wake-up after a wait. */
static uint64_t task_switches(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_nvcsw;
}

/* The measured child: load `k` blobs read from `in`, sleep, report. */
static void idle_child(int in, int out, int k, int vram, double secs_)
{
    char why[256];
    if (vram && bench_cu_open(why, sizeof(why)) != 0) {
        fprintf(stderr, "idle: %s\n", why);
        _exit(3);
    }
    pdx_agent_h a = idle_agent("idle-me", vram);
    for (int i = 0; i < k; i++) {
        uint32_t len;
        char *blob = ctl_recv(in, &len);
        if (blob == NULL || pdx_peer_load(a, blob, len, NULL) != PDX_OK) {
            fprintf(stderr, "idle: load: %s\n", pdx_last_error());
            _exit(3);
        }
        free(blob);
    }
    /* Settle (connection set-up), then measure. */
    struct timespec settle = {0, 300 * 1000000L};
    nanosleep(&settle, NULL);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    uint64_t w0 = task_switches(), t0 = pdx_now_ns();
    struct timespec ts = {(time_t)secs_,
                          (long)((secs_ - (double)(time_t)secs_) * 1e9)};
    nanosleep(&ts, NULL);
    getrusage(RUSAGE_SELF, &r1);
    uint64_t w1 = task_switches(), t1 = pdx_now_ns();
    double cpu_us = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1e6 +
                    (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                    (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e6 +
                    (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    double wall_s = secs(t1 - t0);
    idle_result_t res = {.cpu_ms_per_s = cpu_us / 1e3 / wall_s,
                         /* minus the main thread's own nanosleep wake-up */
                         .wakeups_per_s = (double)(w1 - w0 - 1) / wall_s,
                         .ok = 1};
    ctl_send(out, &res, (uint32_t)sizeof(res));
    pdx_agent_destroy(a);
    _exit(0);
}

/* The CUDA driver is opened in the child only (a CUDA context does not
 * survive fork). */
static int idle_case(int k, int vram, double secs_, idle_result_t *res)
{
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
        die("idle: pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        die("idle: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        idle_child(down[0], up[1], k, vram, secs_);
    }
    close(down[0]);
    close(up[1]);
    pdx_agent_h peers[IDLE_MAX_PEERS];
    for (int i = 0; i < k; i++) {
        char name[32];
        snprintf(name, sizeof(name), "idle-peer%d", i);
        peers[i] = idle_agent(name, 0);
        void *blob;
        size_t len;
        if (pdx_agent_describe(peers[i], &blob, &len) != PDX_OK) {
            die("idle: describe: %s", pdx_last_error());
        }
        ctl_send(down[1], blob, (uint32_t)len);
        pdx_blob_free(blob);
    }
    uint32_t rlen = 0;
    char *r = ctl_recv(up[0], &rlen);
    int rc = r != NULL && rlen == sizeof(*res) ? 0 : -1;
    if (rc == 0) {
        memcpy(res, r, sizeof(*res));
    }
    free(r);
    int status = 0;
    waitpid(pid, &status, 0);
    for (int i = 0; i < k; i++) {
        pdx_agent_destroy(peers[i]);
    }
    close(down[1]);
    close(up[0]);
    return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int mode_idle(const bench_opts_t *o, cJSON *root)
{
    double secs_ = o->quick ? 0.5 : 5.0;
    say("# idle agent (progress thread on, ucx + cma backends), one process, "
        "peers in another; CPU of the whole process over %.0f s\n", secs_);
    say("%-6s %-12s %14s %14s\n", "peers", "GPU memory", "cpu ms/s",
        "wake-ups/s");
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    int bad = 0;
    /* The last row: the measured agent stages GPU memory over UCX (pinned
     * pool, staging service), where a CUDA driver is found. */
    int ks[] = {0, IDLE_MAX_PEERS, IDLE_MAX_PEERS};
    const char *drv = getenv("PDX_CUDA_DRIVER_LIB");
    int have_cuda = drv != NULL || access("/dev/nvidiactl", F_OK) == 0;
    for (size_t i = 0; i < 3; i++) {
        int vram = i == 2;
        if (vram && !have_cuda) {
            say("%-6d %-12s %14s (no CUDA driver: PDX_CUDA_DRIVER_LIB)\n",
                ks[i], "staged", "skipped");
            continue;
        }
        idle_result_t r = {0};
        if (idle_case(ks[i], vram, secs_, &r) != 0 || !r.ok) {
            say("%-6d %-12s %14s\n", ks[i], vram ? "staged" : "-",
                "FAILED");
            bad = 1;
            continue;
        }
        say("%-6d %-12s %14.2f %14.1f\n", ks[i], vram ? "staged" : "-",
            r.cpu_ms_per_s, r.wakeups_per_s);
        cJSON *row = cJSON_CreateObject();
        jnum(row, "peers", ks[i]);
        cJSON_AddBoolToObject(row, "vram_staged", vram);
        jnum(row, "cpu_ms_per_s", r.cpu_ms_per_s);
        jnum(row, "wakeups_per_s", r.wakeups_per_s);
        cJSON_AddItemToArray(rows, row);
        if (r.cpu_ms_per_s > 2.0) {
            say("#   target: <= 2 ms of CPU per second: NOT MET\n");
        }
        char name[80];
        snprintf(name, sizeof(name), "idle agent, %d peers: CPU ms per s",
                 ks[i]);
        bench_target("idle", name, 1, r.cpu_ms_per_s, 2.0, 1, "");
    }
    return bad;
}
