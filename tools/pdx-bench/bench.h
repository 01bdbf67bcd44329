/* pdx-bench: shared declarations of the benchmark modes (transfer, handoff,
 * hash, offload), the report (text, JSON, plot) and the helpers they use. */
#ifndef PDX_BENCH_H
#define PDX_BENCH_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include <pdx/pdx.h>

#include "pdx_clock.h"

#define BENCH_MAX_LIST 16

/* Command line, shared by every mode; each mode reads what applies. */
typedef struct bench_opts {
    const char *mode;
    int quick;
    const char *json_path; /* NULL: none; "-": JSON on stdout, text off */
    const char *plot_path;
    const char *self_path; /* this executable, for the target process */
    /* transfer */
    char tls[32]; /* "sm" (default) or "tcp" */
    int tls_given; /* --tls was on the command line (vram: that one only) */
    /* latency: the target in another network + pid namespace (UCX TCP
     * over a veth pair, another host as pdx sees it) */
    int netns;
    uint64_t sizes[BENCH_MAX_LIST];
    size_t nsizes;
    uint32_t batches[BENCH_MAX_LIST];
    size_t nbatches;
    int ops; /* bit 0 READ, bit 1 WRITE */
    uint32_t inflight;
    uint64_t ws_bytes;  /* cold working set per side */
    double case_s;      /* measured seconds per case */
    uint32_t big_descs; /* descriptors of the big prepared request */
    int no_perftest;
    int no_hot; /* skip the perftest-matched (hot) cases */
    int no_cold;
    int pdx_only; /* no memcpy/cma references (for profiling) */
    int reps;     /* repetitions of interleaved peer comparisons */
    /* transfer: local descriptors this far (0..63) into a slot */
    uint32_t misalign;
    /* handoff */
    uint64_t tokens[BENCH_MAX_LIST];
    size_t ntokens;
    uint64_t side_mem;  /* physical bytes per side before aliasing */
    uint64_t ho_blocks; /* target: blocks per arena */
    uint32_t ho_alias;  /* target: mappings per physical block */
    uint64_t ho_period; /* target: block b holds pattern b % period (0: per
                         * physical block) */
    /* hash, nixl */
    const char *python;
    /* nixl: a NIXL install prefix (NULL: pdx's shim stands in) */
    const char *nixl;
    /* offload */
    uint64_t index_blocks;
    uint64_t pool_blocks;
    /* target process */
    int target_fd;
    const char *target_kind;
    /* plot */
    const char *plot_in;
    const char *out_dir;
} bench_opts_t;

/* Set by latency --netns: targets start in host 1 of this lab. */
struct netns_lab;
extern struct netns_lab *bench_lab;
/* Two namespace hosts joined by veth pairs; this thread enters host 0
 * (before any UCX context, so UCX's threads live there too) and targets
 * start in host 1. 0, or -1 with the reason (not root, no `ip`). Left
 * (and the namespaces removed) by bench_lab_leave, and at exit. */
int bench_lab_enter(char *why, size_t why_len);
void bench_lab_leave(void);

/* Output: text goes to out_txt (stdout, or stderr with --json -). */
extern FILE *out_txt;

__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...);
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...);

#define CHECK(call)                                                            \
    do {                                                                       \
        pdx_status_t st_ = (call);                                             \
        if (st_ < 0)                                                           \
            die("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                pdx_status_string(st_));                                       \
    } while (0)

/* A pdx log sink that drops everything (teardown, when the peer's exit
 * is expected). */
void log_quiet(void *arg, pdx_log_level_t level, const char *msg);

double secs(uint64_t ns);

/* Sorts `v` in place and returns the q-quantile (0..1), nearest rank. */
double quantile(double *v, size_t n, double q);
double median_of(double *v, size_t n);

/* Growable array of doubles. */
typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec_t;
void dvec_push(dvec_t *d, double x);
void dvec_free(dvec_t *d);

/* Page-aligned, prefaulted allocation (mmap), with transparent huge pages
 * off so every run sees the same page size. */
void *big_alloc(size_t len);
/* The same with transparent huge pages advised (as the offload slab). */
void *big_alloc_thp(size_t len);
void big_free(void *p, size_t len);

/* Defeat dead-store elimination of benchmark loops. */
void sink(const void *p);

/* Control channel between the bench and its target process: framed
 * messages over a socketpair. */
void ctl_send(int fd, const void *p, uint32_t len);
void ctl_sendf(int fd, const char *fmt, ...);
/* Malloc'd, NUL-terminated; NULL when the peer closed. */
char *ctl_recv(int fd, uint32_t *len_p);
/* As ctl_recv, but gives up after timeout_ms (NULL, *timed_out_p = 1). */
char *ctl_recv_timeout(int fd, int timeout_ms, uint32_t *len_p,
                       int *timed_out_p);

/* Start `argv` (PATH searched) with posix_spawn: stdin from /dev/null,
 * stdout and stderr to out_fd (-1: /dev/null), fd 3 = fd3 (-1: none), our
 * environment with env_add's "KEY=VALUE" entries (NULL-terminated, may be
 * NULL) replacing. Returns the pid, or -1 with errno. */
int spawn_cmd(const char *const *argv, const char *const *env_add, int out_fd,
              int fd3);

/* Start this program as a target (`--target kind`) with `extra`
 * arguments; returns the pid and our end of the control socket. */
int spawn_target(const bench_opts_t *o, const char *kind,
                 const char *const *extra, int *fd_p);
int reap_target(int pid, int timeout_ms);
/* Wait for child `pid` until `deadline` (pdx_now_ns), then SIGKILL and reap
 * it: 1 when it ended by itself, 0 when killed; its wait status in
 * *status_p either way. */
int wait_child(pid_t pid, uint64_t deadline, int *status_p);

/* Blob exchange: send ours, load theirs. */
void exchange_blobs(pdx_agent_h agent, int fd, char *peer_out);

/* Formatting. */
const char *fmt_bytes(uint64_t b, char *buf, size_t len);
double gbps(uint64_t bytes, uint64_t ns); /* 1e9 bytes per second */

/* JSON helpers (cJSON). */
cJSON *jnum(cJSON *obj, const char *key, double v);
cJSON *jstr(cJSON *obj, const char *key, const char *v);

/* The summary (printed first with --quick, last otherwise): every mode's
 * targets, registered as it prints them; the machine's load before and
 * after; pdx's warnings, each once. */
void bench_target(const char *mode, const char *name, int have, double v,
                  double goal, int lower, const char *where);
typedef struct bench_load {
    long ncpu;
    double load1; /* /proc/loadavg */
    double share; /* of two cores, what two busy threads got (0..1) */
    int loaded;   /* too loaded for the figures to mean anything */
    double busy_s; /* CPU seconds all cpus spent busy since boot (/proc/stat,
                      steal included: a hypervisor's neighbours), -1 unknown */
    double own_s;  /* CPU seconds of pdx-bench and its reaped children */
    double others; /* cpus other work kept busy during the probe, or -1 */
} bench_load_t;
/* Cores other work kept busy between two probes, on average (pdx-bench's
 * own processes not counted); -1 when /proc/stat cannot tell. */
double bench_load_others(const bench_load_t *before,
                         const bench_load_t *after, double wall_s);
void bench_load_probe(bench_load_t *l);
/* Too loaded for the figures to mean anything: a probe (before or after
 * the run) got under 80% of two cores, or other work kept more than a
 * quarter of the cpus busy during a probe or the run (pdx-bench's own
 * processes are not other work; the load average, which counts them and
 * whatever ran in the last minute, is printed, not judged). */
int bench_too_loaded(const bench_load_t *before, const bench_load_t *after,
                     double wall_s);
/* pdx's log lines through pdx-bench: each warning once (hold: kept for
 * the summary, else also written at once). */
void bench_log_install(int hold, const char *mode);
void bench_summary_json(cJSON *root);
void bench_summary(FILE *f, const char *mode, int quick,
                   const bench_load_t *before, const bench_load_t *after,
                   double wall_s);

/* The method line every mode prints in its header. */
void print_machine_header(cJSON *root);

/* Modes. Each fills `root` (its JSON object) and returns 0 on success,
 * 1 on a failed check (e.g. hash mismatch). */
int mode_transfer(const bench_opts_t *o, cJSON *root);
int mode_handoff(const bench_opts_t *o, cJSON *root);
int mode_hash(const bench_opts_t *o, cJSON *root);
int mode_offload(const bench_opts_t *o, cJSON *root);
int mode_idle(const bench_opts_t *o, cJSON *root);
int mode_latency(const bench_opts_t *o, cJSON *root);
int mode_vram(const bench_opts_t *o, cJSON *root);
/* GPU memory for the modes (vram.c): the CUDA driver (PDX_CUDA_DRIVER_LIB,
 * else libcuda.so.1) opened with device 0's context current (0, or -1
 * with the reason), and an allocation there (dies on failure). */
int bench_cu_open(char *why, size_t len);
uint64_t bench_vram_alloc(uint64_t len);
/* pdx-bench plot RESULT.json: SVGs into `dir` (plot.c); exit code. */
int bench_plot(const char *json_path, const char *dir);
int mode_nixl(const bench_opts_t *o, cJSON *root);

/* Targets (the other process). */
int target_transfer(const bench_opts_t *o);
int target_ucp(const bench_opts_t *o, int errmode);
int target_handoff(const bench_opts_t *o);
int target_vram(const bench_opts_t *o);

/* Plotting with gnuplot: panels of series of (x, y) points. */
#define PLOT_MAX_SERIES 16
#define PLOT_MAX_POINTS 32
typedef struct plot_series {
    char title[96];
    double x[PLOT_MAX_POINTS], y[PLOT_MAX_POINTS];
    size_t n;
    int dashed;
} plot_series_t;
typedef struct plot_panel {
    char title[96];
    plot_series_t s[PLOT_MAX_SERIES];
    size_t n;
} plot_panel_t;
/* Appends (x, y) to the series called `title` (created on first use). */
void plot_add(plot_panel_t *p, const char *title, double x, double y,
              int dashed);
/* Writes an SVG with gnuplot; 0 on success, -1 (reason printed) if
 * gnuplot is missing or fails. */
int plot_svg(const char *path, const char *title, const char *xlabel,
             const char *ylabel, int logx, const plot_panel_t *panels,
             size_t npanels);

/* How pdx moves same-host data (--path, kept in PDX_BENCH_PATH so the
 * targets inherit it): "shm" (default) = the cma backend and shared memory
 * (pdx_mem_alloc / pdx_mem_share: memcpy into the peer's mapping); "cma" =
 * the cma backend on private memory (process_vm_readv/writev); "ucx" = UCX
 * alone. UCX carries the notifications in every case. */
static inline const char *bench_path(void)
{
    const char *v = getenv("PDX_BENCH_PATH");
    return v != NULL && *v != '\0' ? v : "shm";
}
static inline int bench_use_cma(void)
{
    return strcmp(bench_path(), "ucx") != 0;
}
static inline int bench_use_shm(void)
{
    return strcmp(bench_path(), "shm") == 0;
}
/* The cma backend, with PDX_BENCH_CMA_INLINE (bytes) as its inline_max
 * option when set (--cma-inline). */
static inline pdx_status_t bench_cma_create(pdx_agent_h a)
{
    const char *v = getenv("PDX_BENCH_CMA_INLINE");
    pdx_option_t opt = {"inline_max", v};
    return pdx_backend_create(a, "cma", v ? &opt : NULL, v ? 1 : 0, NULL);
}
/* A registered transfer buffer: shared memory with --path shm (prefaulted,
 * filled with 0x5a), else big_alloc. Free with bench_mem_free. */
void *bench_mem_alloc(size_t len);
void bench_mem_free(void *p, size_t len);

#endif
