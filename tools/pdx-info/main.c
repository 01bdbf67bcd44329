/* pdx-info: version and ABI, backends and store modules found (caps, or
 * why unavailable), the paths GPU memory can take (cuda_ipc on this host,
 * UCX natively or staged across hosts), the metrics endpoint, with --blob
 * FILE a metadata blob decoded or its defect named, and with --stats [PID]
 * the counters of running agents (each agent answers on an abstract unix
 * socket "pdx-stats.<pid>.<agent>" of its network namespace). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <pdx/backend.h>
#include <pdx/pdx.h>
#include <pdx/store.h>

#include "tool_version.h"

static const char *known[] = {"ucx", "cuda_ipc", "cma"};

/* Can a peer on this host map our shared memory? The cma backend takes
 * the fd with pidfd_getfd (a seccomp filter may refuse it), else opens
 * /proc/<pid>/fd/<n>. Try both on ourselves. */
static void shm_line(void)
{
    void *m = NULL;
    pdx_status_t st = pdx_mem_alloc(4096, 0, &m);
    if (st != PDX_OK) {
        printf("shared memory: pdx_mem_alloc failed: %s\n",
               pdx_status_string(st));
        return;
    }
    pdx_mem_free(m);
    int fd = memfd_create("pdx-info", MFD_CLOEXEC);
    int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    int got = pfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pfd, fd, 0) : -1;
    int e = errno;
    if (got >= 0) {
        printf("shared memory: peers on this host map pdx_mem_alloc memory "
               "(pidfd_getfd works): same-host transfers are a memcpy\n");
    } else {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)getpid(), fd);
        got = open(path, O_RDWR | O_CLOEXEC);
        printf("shared memory: pidfd_getfd refused (%s); %s\n", strerror(e),
               got >= 0 ? "peers map it through /proc/<pid>/fd instead"
                        : "peers cannot map it: process_vm_readv/writev, "
                          "else UCX");
    }
    /* Other host memory of a same-host peer: process_vm_readv/writev,
     * where this process may call them at all (cma declines a peer's
     * regions it may not read, and UCX carries them). */
    char src[8] = "pdx-pvm", dst[8] = {0};
    struct iovec lv = {dst, sizeof(dst)}, rv = {src, sizeof(src)};
    ssize_t n = process_vm_readv(getpid(), &lv, 1, &rv, 1, 0);
    if (n == (ssize_t)sizeof(dst)) {
        printf("process_vm_readv: works here (same-host peers' other host "
               "memory, where the peer lets this process read it)\n");
    } else {
        printf("process_vm_readv: refused here (%s): same-host peers' host "
               "memory outside shared memory goes over UCX\n",
               strerror(errno));
    }
    if (got >= 0) {
        close(got);
    }
    if (pfd >= 0) {
        close(pfd);
    }
    if (fd >= 0) {
        close(fd);
    }
}

/* The description's "vram <mode> (<why>)" part, or the whole. */
static const char *vram_part(const char *desc)
{
    const char *v = strstr(desc, "; vram ");
    return v != NULL ? v + 2 : desc;
}

/* Which paths GPU memory can take from here: cuda_ipc to peers on this
 * host; across hosts UCX natively (a UCX built with CUDA) or staged
 * through pinned host memory (the CUDA driver). Each is asked for in turn:
 * an instance that refuses says why. */
static void quiet(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg, (void)level, (void)msg; /* the reason is printed instead */
}

static void vram_lines(void)
{
    printf("GPU memory (VRAM) paths:\n");
    char why[512] = "";
    uint64_t caps = 0;
    if (pdx_backend_probe("cuda_ipc", &caps, why, sizeof(why)) == PDX_OK) {
        printf("  same host: cuda_ipc\n");
    } else {
        printf("  same host: no cuda_ipc (%s)\n", why);
    }
    static const char *const modes[] = {"native", "staged"};
    for (int i = 0; i < 2; i++) {
        pdx_option_t o = {"vram", modes[i]};
        pdx_agent_h a;
        pdx_backend_h be;
        if (pdx_agent_create("pdx-info-vram", NULL, &a) != PDX_OK) {
            return;
        }
        pdx_last_error_clear();
        pdx_log_set_handler(quiet, NULL);
        pdx_status_t st = pdx_backend_create(a, "ucx", &o, 1, &be);
        pdx_log_set_handler(NULL, NULL);
        if (st == PDX_OK) {
            char d[1024];
            pdx_backend_describe(be, d, sizeof(d));
            printf("  across hosts, %s: yes: %s\n", modes[i], vram_part(d));
        } else {
            printf("  across hosts, %s: no: %s\n", modes[i],
                   pdx_last_error()[0] ? pdx_last_error()
                                       : "the ucx backend is unavailable");
        }
        pdx_agent_destroy(a);
    }
}

static void caps_string(uint64_t c, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s%s%s%s%s%s", c & PDX_BACKEND_CAP_DRAM ? "DRAM " : "",
             c & PDX_BACKEND_CAP_VRAM ? "VRAM " : "",
             c & PDX_BACKEND_CAP_READ ? "read " : "",
             c & PDX_BACKEND_CAP_WRITE ? "write " : "",
             c & PDX_BACKEND_CAP_NOTIF ? "notif " : "",
             c & PDX_BACKEND_CAP_SAME_HOST ? "same-host " : "",
             c & PDX_BACKEND_CAP_EVENT_FD ? "event-fd" : "");
}

static int show_blob(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "pdx-info: cannot open %s\n", path);
        return 2;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (len == cap) {
            if (cap >= (128u << 20)) {
                fprintf(stderr, "pdx-info: %s: larger than 128 MiB\n", path);
                fclose(f);
                free(buf);
                return 1;
            }
            cap *= 2;
            buf = realloc(buf, cap);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        if (n == 0) {
            break;
        }
        len += n;
    }
    fclose(f);
    char *text = NULL, why[256] = "";
    pdx_status_t st = pdx_blob_describe(buf, len, &text, why, sizeof(why));
    free(buf);
    if (st != PDX_OK) {
        fprintf(stderr, "pdx-info: %s: %s: %s\n", path, pdx_status_string(st),
                why);
        return 1;
    }
    fputs(text, stdout);
    pdx_blob_free(text);
    return 0;
}

/* Print the stats JSON of one agent socket (abstract name `name`): 1
 * printed whole, 0 no agent there (gone meanwhile), -1 an answer cut
 * short (said on stderr). The answer is "pdx-stats <bytes>\n" and that
 * many bytes (core/stats_sock.c). */
static int show_one_stats(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return 0;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    if (n + 1 >= sizeof(sa.sun_path)) {
        close(fd);
        return 0;
    }
    memcpy(sa.sun_path + 1, name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    struct timeval tv = {2, 0}; /* an agent answers within ~10 ms */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, len) != 0) {
        close(fd);
        return 0;
    }
    char head[48];
    size_t hn = 0;
    ssize_t r;
    while (hn < sizeof(head) - 1 && (r = read(fd, head + hn, 1)) == 1 &&
           head[hn] != '\n') {
        hn++;
    }
    head[hn] = '\0';
    unsigned long long want = 0;
    if (hn == 0 || sscanf(head, "pdx-stats %llu", &want) != 1 ||
        want > (1ull << 30)) {
        close(fd);
        fprintf(stderr, "pdx-info: %s: no answer within 2 s%s\n", name,
                hn > 0 ? " (not a pdx-stats header)" : " (agent without "
                                                         "progress?)");
        return -1;
    }
    char *buf = malloc((size_t)want + 1);
    size_t got = 0;
    while (buf != NULL && got < want &&
           (r = read(fd, buf + got, (size_t)want - got)) > 0) {
        got += (size_t)r;
    }
    close(fd);
    if (buf == NULL || got < want) {
        fprintf(stderr, "pdx-info: %s: answer cut after %zu of %llu bytes\n",
                name, got, want);
        free(buf);
        return -1;
    }
    buf[got] = '\0';
    fputs(buf, stdout);
    fputc('\n', stdout);
    free(buf);
    return 1;
}

/* Every agent socket of process `pid` (0: all) listed in /proc/net/unix,
 * each printed once (listening and accepted sockets share the name): 0
 * when every one answered whole, 1 none found, 2 an answer was cut. */
static int show_stats(int pid)
{
    FILE *f = fopen("/proc/net/unix", "r");
    if (f == NULL) {
        fprintf(stderr, "pdx-info: /proc/net/unix: %s\n", strerror(errno));
        return 2;
    }
    char line[512], prefix[64];
    snprintf(prefix, sizeof(prefix), pid > 0 ? "@pdx-stats.%d." : "@pdx-stats.",
             pid);
    int found = 0, cut = 0;
    char **seen = NULL;
    size_t nseen = 0, cap = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = strstr(line, prefix);
        if (p == NULL) {
            continue;
        }
        p[strcspn(p, " \n")] = '\0';
        int dup = 0;
        for (size_t i = 0; i < nseen && !dup; i++) {
            dup = strcmp(seen[i], p + 1) == 0;
        }
        if (dup) {
            continue;
        }
        if (nseen == cap) {
            size_t nc = cap ? cap * 2 : 64;
            char **ns = realloc(seen, nc * sizeof(*ns));
            if (ns == NULL) {
                fprintf(stderr, "pdx-info: out of memory after %zu agents\n",
                        nseen);
                cut = 1;
                break;
            }
            seen = ns;
            cap = nc;
        }
        if ((seen[nseen] = strdup(p + 1)) == NULL) {
            cut = 1;
            break;
        }
        nseen++;
        int r = show_one_stats(p + 1);
        found += r > 0;
        cut |= r < 0;
    }
    fclose(f);
    for (size_t i = 0; i < nseen; i++) {
        free(seen[i]);
    }
    free(seen);
    if (cut) {
        return 2;
    }
    if (found == 0) {
        fprintf(stderr, "pdx-info: no running pdx agent%s in this network "
                "namespace\n", pid > 0 ? " of that process" : "");
        return 1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pdx-info [--blob FILE | --stats [PID] | --version | "
            "--help]\n"
            "Without options: libpdx.so's version and ABI, the backends "
            "(ucx, cma,\n"
            "cuda_ipc: capabilities, or why one cannot run here) and store "
            "modules\n"
            "(etcd) found, the UCX transports in use, whether same-host "
            "peers can\n"
            "map pdx_mem_alloc memory, and whether agents can serve "
            "metrics over HTTP.\n"
            "  --blob FILE    decode a metadata blob (pdx_agent_describe's "
            "bytes), or\n"
            "                 name what is wrong with it (exit 1)\n"
            "  --stats [PID]  counters, peers and paths of the running agents "
            "(of that\n"
            "                 process) in this network namespace (same uid "
            "or root;\n"
            "                 PDX_STATS_SOCKET=0 turns an agent's answer "
            "off)\n"
            "  --version      pdx-info's and libpdx.so's versions\n"
            "  -h, --help     this text\n"
            "Modules are found in PDX_PLUGIN_PATH (colon-separated), then in "
            "<dir of\n"
            "libpdx.so>/pdx/; PDX_LOG_LEVEL=error|warn|info|debug|trace.\n");
}

/* The directories libpdx.so loads modules from, in its order. */
static int module_dirs(char dirs[][4096], int max)
{
    int n = 0;
    const char *env = getenv("PDX_PLUGIN_PATH");
    while (env != NULL && *env != '\0' && n < max - 1) {
        const char *end = strchr(env, ':');
        size_t len = end != NULL ? (size_t)(end - env) : strlen(env);
        if (len > 0 && len < 4096) {
            memcpy(dirs[n], env, len);
            dirs[n++][len] = '\0';
        }
        env = end != NULL ? end + 1 : "";
    }
    Dl_info info;
    if (dladdr((void *)&pdx_version, &info) != 0 && info.dli_fname != NULL) {
        snprintf(dirs[n], 4096, "%s", info.dli_fname);
        char *slash = strrchr(dirs[n], '/');
        if (slash != NULL) {
            snprintf(slash, 4096 - (size_t)(slash - dirs[n]), "/pdx");
            n++;
        }
    }
    return n;
}

/* Store modules (libpdx_store_<name>.so) where libpdx.so looks, each
 * loaded and its table checked as the loader does. */
static void store_lines(void)
{
    char dirs[8][4096];
    int nd = module_dirs(dirs, 8);
    char seen[16][64];
    int nseen = 0;
    printf("stores:\n");
    for (int d = 0; d < nd; d++) {
        DIR *dir = opendir(dirs[d]);
        struct dirent *e;
        while (dir != NULL && (e = readdir(dir)) != NULL) {
            char name[64];
            if (sscanf(e->d_name, "libpdx_store_%63[a-z0-9_].so", name) != 1 ||
                strlen(e->d_name) != strlen(name) + strlen("libpdx_store_.so")) {
                continue;
            }
            int dup = 0;
            for (int i = 0; i < nseen; i++) {
                dup |= strcmp(seen[i], name) == 0;
            }
            if (dup || nseen == 16) {
                continue;
            }
            snprintf(seen[nseen++], sizeof(seen[0]), "%s", name);
            char path[4200];
            snprintf(path, sizeof(path), "%s/%s", dirs[d], e->d_name);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            const pdx_store_ops_t *ops =
                h != NULL ? dlsym(h, PDX_STORE_SYMBOL) : NULL;
            if (h == NULL) {
                printf("  %s: unavailable: %s\n", name, dlerror());
            } else if (ops == NULL ||
                       ops->abi_version != PDX_STORE_ABI_VERSION) {
                printf("  %s: unavailable: %s (store ABI %u expected)\n",
                       name, ops == NULL ? "no " PDX_STORE_SYMBOL " table"
                                         : "another store ABI",
                       PDX_STORE_ABI_VERSION);
            } else {
                printf("  %s: available (%s; agents use it with a store "
                       "section or PDX_AGENT_PARAM_STORE)\n",
                       name, path);
            }
            if (h != NULL) {
                dlclose(h);
            }
        }
        if (dir != NULL) {
            closedir(dir);
        }
    }
    if (nseen == 0) {
        printf("  none found (libpdx_store_<name>.so in PDX_PLUGIN_PATH or "
               "<dir of libpdx.so>/pdx)\n");
    }
}

int main(int argc, char **argv)
{
    if (pdx_tool_version(argc, argv, "pdx-info")) {
        return 0;
    }
    if (argc == 2 &&
        (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--blob") == 0) {
        return show_blob(argv[2]);
    }
    if ((argc == 2 || argc == 3) && strcmp(argv[1], "--stats") == 0) {
        return show_stats(argc == 3 ? atoi(argv[2]) : 0);
    }
    if (argc != 1) {
        usage(stderr);
        return 2;
    }
    printf("pdx %s, plugin ABI %u (table %u bytes), backend ABI %u\n",
           pdx_version(), pdx_plugin_v1.abi_version, pdx_plugin_v1.size,
           PDX_BACKEND_ABI_VERSION);
    printf("PDX_PLUGIN_PATH=%s\n", getenv("PDX_PLUGIN_PATH")
                                       ? getenv("PDX_PLUGIN_PATH") : "(unset)");
    printf("backends:\n");
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        uint64_t caps = 0;
        char why[512] = "", cs[128];
        pdx_status_t st = pdx_backend_probe(known[i], &caps, why, sizeof(why));
        if (st == PDX_OK) {
            caps_string(caps, cs, sizeof(cs));
            printf("  %s: available (%s)\n", known[i], cs);
        } else {
            printf("  %s: unavailable: %s\n", known[i], why);
        }
    }
    /* The transports UCX picks with pdx's defaults. */
    pdx_log_set_level(PDX_LOG_ERROR);
    pdx_agent_h a;
    const char *metrics = "unknown (no agent could be made)";
    if (pdx_agent_create("pdx-info", NULL, &a) == PDX_OK) {
        pdx_backend_h be;
        if (pdx_backend_create(a, "ucx", NULL, 0, &be) == PDX_OK) {
            char d[512];
            pdx_backend_describe(be, d, sizeof(d));
            printf("  in use: %s\n", d);
        }
        pdx_status_t ms = pdx_metrics_start(a, NULL, NULL);
        /* EXISTS: PDX_METRICS_LISTEN started it at create already. */
        metrics = ms == PDX_OK || ms == PDX_ERR_EXISTS
                      ? "agents serve Prometheus metrics over HTTP "
                                 "on request (pdx_metrics_start, "
                                 "PDX_METRICS_LISTEN=[ADDR:]PORT)"
                  : ms == PDX_ERR_UNSUPPORTED
                      ? "no HTTP endpoint (libpdx.so built without "
                        "libmicrohttpd); pdx_metrics_text works"
                      : "the HTTP endpoint could not listen on loopback "
                        "here";
        pdx_agent_destroy(a);
    }
    vram_lines();
    store_lines();
    printf("metrics: %s\n", metrics);
    shm_line();
    return 0;
}
