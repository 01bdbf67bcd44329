/* pdx-bench nixl: pdx and NIXL side by side through their Python APIs
 * (python/bench/nixl_side.py, run here with pdx's package on PYTHONPATH):
 * the same cycle (make_prepped_xfer, transfer, check_xfer_state until
 * done, release_xfer_handle) for NIXL and three pdx configurations, both
 * libraries alternately, per stage. Without --nixl, pdx's own NIXL shim
 * stands in for NIXL's column (the mode's plumbing only). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef PDX_BENCH_NIXL_SCRIPT
#define PDX_BENCH_NIXL_SCRIPT ""
#endif
#ifndef PDX_BENCH_PYTHONPATH
#define PDX_BENCH_PYTHONPATH ""
#endif

/* The script: $PDX_BENCH_NIXL_SCRIPT, else the source tree's. */
static const char *side_script(void)
{
    const char *s = getenv("PDX_BENCH_NIXL_SCRIPT");
    if (s == NULL || s[0] == '\0') {
        s = PDX_BENCH_NIXL_SCRIPT;
    }
    if (s[0] == '\0' || access(s, R_OK) != 0) {
        die("nixl: python/bench/nixl_side.py not found (%s); set "
            "PDX_BENCH_NIXL_SCRIPT", s[0] ? s : "no source tree");
    }
    return s;
}

/* The JSON the script wrote, into `root` ("side_by_side"). */
static void side_json(const char *path, cJSON *root)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) {
            break;
        }
    }
    fclose(f);
    if (buf != NULL) {
        buf[len] = '\0';
        cJSON *j = cJSON_Parse(buf);
        if (j != NULL) {
            cJSON_AddItemToObject(root, "side_by_side", j);
        }
    }
    free(buf);
}

int mode_nixl(const bench_opts_t *o, cJSON *root)
{
    const char *script = side_script();
    const char *prefix = o->nixl != NULL ? o->nixl : "shim";
    say("# nixl: pdx and NIXL side by side in Python (%s), two processes "
        "on this host; NIXL: %s\n", script,
        o->nixl != NULL ? o->nixl
                        : "none given (--nixl PREFIX): pdx's own shim "
                          "stands in, so its column is NOT NIXL");
    jstr(root, "nixl", o->nixl != NULL ? o->nixl : "shim (not NIXL)");
    char json[64];
    snprintf(json, sizeof(json), "/tmp/pdx-bench-nixl-%d.json",
             (int)getpid());
    unlink(json);
    char pypath[4096];
    const char *old = getenv("PYTHONPATH");
    snprintf(pypath, sizeof(pypath), "PYTHONPATH=%s%s%s",
             PDX_BENCH_PYTHONPATH, old && old[0] ? ":" : "", old ? old : "");
    const char *env[] = {pypath, NULL};
    const char *argv[10];
    int k = 0;
    argv[k++] = o->python;
    argv[k++] = script;
    argv[k++] = "--nixl";
    argv[k++] = prefix;
    argv[k++] = "--json";
    argv[k++] = json;
    if (o->quick) {
        argv[k++] = "--quick";
    }
    argv[k] = NULL;
    fflush(out_txt);
    /* The text goes where ours goes; --quick holds ours in memory (no
     * fd): the child's then goes through a file, copied in after. */
    int tfd = fileno(out_txt);
    char tpath[64] = "";
    if (tfd < 0) {
        snprintf(tpath, sizeof(tpath), "/tmp/pdx-bench-nixl-%d.txt",
                 (int)getpid());
        tfd = open(tpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (tfd < 0) {
            die("nixl: %s: %s", tpath, strerror(errno));
        }
    }
    int pid = spawn_cmd(argv, env, tfd, -1);
    if (pid < 0) {
        die("nixl: cannot start %s: %s", o->python, strerror(errno));
    }
    int status;
    uint64_t limit_s = o->quick ? 600 : 7200;
    int done = wait_child(pid, pdx_now_ns() + limit_s * 1000000000ull,
                          &status);
    if (tpath[0] != '\0') {
        char buf[4096];
        ssize_t got;
        lseek(tfd, 0, SEEK_SET);
        while ((got = read(tfd, buf, sizeof(buf))) > 0) {
            fwrite(buf, 1, (size_t)got, out_txt);
        }
        fflush(out_txt);
        close(tfd);
        unlink(tpath);
    }
    if (!done) {
        say("# nixl: the side-by-side run took over %llu s: killed\n",
            (unsigned long long)limit_s);
        return 1;
    }
    side_json(json, root);
    unlink(json);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        say("# nixl: the side-by-side run failed (status %d)\n", status);
        return 1;
    }
    return 0;
}
