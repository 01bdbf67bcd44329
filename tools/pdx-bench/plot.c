/* --plot: bandwidth curves drawn by gnuplot (Debian gnuplot-nox) into an
 * SVG, the data inlined in the script as datablocks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

void plot_add(plot_panel_t *p, const char *title, double x, double y,
              int dashed)
{
    plot_series_t *s = NULL;
    for (size_t i = 0; i < p->n; i++) {
        if (strcmp(p->s[i].title, title) == 0) {
            s = &p->s[i];
            break;
        }
    }
    if (s == NULL) {
        if (p->n == PLOT_MAX_SERIES) {
            return;
        }
        s = &p->s[p->n++];
        memset(s, 0, sizeof(*s));
        snprintf(s->title, sizeof(s->title), "%s", title);
        s->dashed = dashed;
    }
    if (s->n < PLOT_MAX_POINTS && y > 0) {
        s->x[s->n] = x;
        s->y[s->n] = y;
        s->n++;
    }
}

/* Titles go inside double quotes in the script. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fputc('\\', f);
        }
        fputc(*s, f);
    }
    fputc('"', f);
}

int plot_svg(const char *path, const char *title, const char *xlabel,
             const char *ylabel, int logx, const plot_panel_t *panels,
             size_t npanels)
{
    /* The script (data inlined) stays next to the SVG: it re-renders the
     * plot and holds the numbers. */
    char script[4096];
    snprintf(script, sizeof(script), "%s.gp", path);
    FILE *f = fopen(script, "w");
    if (f == NULL) {
        say("# plot: %s: %s\n", script, strerror(errno));
        return -1;
    }
    for (size_t p = 0; p < npanels; p++) {
        for (size_t i = 0; i < panels[p].n; i++) {
            fprintf(f, "# %s: %s\n$d%zu_%zu << EOD\n", panels[p].title,
                    panels[p].s[i].title, p, i);
            for (size_t k = 0; k < panels[p].s[i].n; k++) {
                fprintf(f, "%.6g %.6g\n", panels[p].s[i].x[k],
                        panels[p].s[i].y[k]);
            }
            fprintf(f, "EOD\n");
        }
    }
    fprintf(f,
            "set terminal svg size %zu,720 dynamic noenhanced font "
            "'Helvetica,12'\n",
            (size_t)660 * (npanels ? npanels : 1));
    fprintf(f, "set output ");
    put_quoted(f, path);
    fprintf(f, "\nset grid\nset key below font ',10'\n");
    if (logx) {
        fprintf(f, "set logscale x 2\nset format x '%%.0b%%BB'\n");
    }
    fprintf(f, "set logscale y 10\n");
    fprintf(f, "set xlabel ");
    put_quoted(f, xlabel);
    fprintf(f, "\nset ylabel ");
    put_quoted(f, ylabel);
    fprintf(f, "\nset multiplot layout 1,%zu title ", npanels);
    put_quoted(f, title);
    fprintf(f, "\n");
    for (size_t p = 0; p < npanels; p++) {
        fprintf(f, "set title ");
        put_quoted(f, panels[p].title);
        fprintf(f, "\nplot ");
        for (size_t i = 0; i < panels[p].n; i++) {
            fprintf(f,
                    "%s$d%zu_%zu using 1:2 with linespoints dt %d lw 2 "
                    "title ",
                    i ? ", " : "", p, i, panels[p].s[i].dashed ? 2 : 1);
            put_quoted(f, panels[p].s[i].title);
        }
        if (panels[p].n == 0) {
            fprintf(f, "NaN notitle");
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    fclose(f);
    const char *argv[] = {"gnuplot", script, NULL};
    int pid = spawn_cmd(argv, NULL, 2, -1);
    int status = 0;
    if (pid > 0) {
        waitpid(pid, &status, 0);
    }
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        say("# plot: gnuplot %s (install it with apt-get install -y "
            "gnuplot-nox)\n",
            pid < 0 ? "not found" : "failed");
        return -1;
    }
    return 0;
}

/* ---- pdx-bench plot RESULT.json ---------------------------------------- */

static const cJSON *jget(const cJSON *o, const char *k)
{
    return o != NULL ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static double jd(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *js(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Transfer: GB/s by message size, READ and WRITE panels: pdx at each
 * batch (hot), ucx_perftest and memcpy (one message at a time). */
static int plot_transfer(const cJSON *t, const char *dir)
{
    plot_panel_t pn[2];
    memset(pn, 0, sizeof(pn));
    snprintf(pn[0].title, sizeof(pn[0].title), "READ");
    snprintf(pn[1].title, sizeof(pn[1].title), "WRITE");
    const cJSON *r;
    cJSON_ArrayForEach(r, jget(t, "rows"))
    {
        plot_panel_t *p = &pn[strcmp(js(r, "op"), "WRITE") == 0];
        if (strcmp(js(r, "working_set"), "hot") != 0 ||
            jd(r, "request_reused") != 0) {
            continue;
        }
        double size = jd(r, "size");
        char series[48];
        snprintf(series, sizeof(series), "pdx, batch %.0f", jd(r, "batch"));
        plot_add(p, series, size, jd(r, "pdx_gbps"), 0);
        if (jd(r, "batch") == 1) {
            plot_add(p, "ucx_perftest", size, jd(r, "perftest_gbps"), 1);
            plot_add(p, "memcpy (one thread)", size, jd(r, "memcpy_gbps"), 1);
        }
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/bench-transfer.svg", dir);
    return plot_svg(path, "pdx-bench transfer: two processes, one host",
                    "message size", "GB/s", 1, pn, 2);
}

/* Latency: p50 of one request at batch 1, pdx against raw UCP with the
 * same peer error handling. */
static int plot_latency(const cJSON *l, const char *dir)
{
    plot_panel_t pn[2];
    memset(pn, 0, sizeof(pn));
    snprintf(pn[0].title, sizeof(pn[0].title), "READ, batch 1");
    snprintf(pn[1].title, sizeof(pn[1].title), "WRITE, batch 1");
    const cJSON *r;
    cJSON_ArrayForEach(r, jget(l, "rows"))
    {
        if (jd(r, "batch") != 1) {
            continue;
        }
        plot_panel_t *p = &pn[strcmp(js(r, "op"), "WRITE") == 0];
        plot_add(p, "pdx (ucx backend)", jd(r, "size"), jd(r, "pdx_p50_us"),
                 0);
        plot_add(p, "raw UCP, peer error handling", jd(r, "size"),
                 jd(r, "ucp_p50_us"), 1);
        plot_add(p, "raw UCP, bare", jd(r, "size"), jd(r, "bare_p50_us"), 1);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/bench-latency.svg", dir);
    return plot_svg(path, "pdx-bench latency: one request at a time over UCX",
                    "message size", "p50 us", 1, pn, 2);
}

/* Handoff: GB/s of a GLM-5.2 request P -> D against memcpy. */
static int plot_handoff(const cJSON *h, const char *dir)
{
    plot_panel_t pn[1];
    memset(pn, 0, sizeof(pn));
    snprintf(pn[0].title, sizeof(pn[0].title), "contiguous block ids");
    const cJSON *r;
    cJSON_ArrayForEach(r, jget(h, "rows"))
    {
        if (strcmp(js(r, "ids"), "contiguous") != 0) {
            continue;
        }
        double tok = jd(r, "tokens");
        plot_add(pn, "pdx (KV connector)", tok, jd(r, "pdx_gbps"), 0);
        plot_add(pn, "memcpy of the same bytes", tok, jd(r, "memcpy_gbps"), 1);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/bench-handoff.svg", dir);
    return plot_svg(path, "pdx-bench handoff: GLM-5.2 request P -> D",
                    "prompt tokens", "GB/s", 0, pn, 1);
}

/* One target's row of the targets plot: its score (value / goal, or
 * goal / value where lower is better: >= 1 is met) and its name. */
static void target_row(FILE *f, int *n, const char *mode, const char *name,
                       double v, double g, int lower)
{
    if (v <= 0 || g <= 0) {
        return;
    }
    fprintf(f, "%d %.4g ", (*n)++, lower ? g / v : v / g);
    char label[160];
    snprintf(label, sizeof(label), "%s: %s", mode, name);
    put_quoted(f, label);
    fprintf(f, "\n");
}

/* Targets: each one's value against its goal, from the run's "summary"
 * (pdx-bench now) or, for older JSON, each mode's "targets". 0 drawn, 1
 * none in this run, -1 failed. */
static int plot_targets(const cJSON *root, const char *dir)
{
    char script[4096], path[4096];
    snprintf(path, sizeof(path), "%s/bench-targets.svg", dir);
    snprintf(script, sizeof(script), "%s.gp", path);
    /* The rows first (a run without targets touches no file). */
    char *rows = NULL;
    size_t rows_len = 0;
    FILE *f = open_memstream(&rows, &rows_len);
    if (f == NULL) {
        return -1;
    }
    int n = 0;
    const cJSON *t, *sum = jget(root, "summary");
    if (sum != NULL) {
        cJSON_ArrayForEach(t, sum)
        {
            if (cJSON_IsTrue(jget(t, "have"))) {
                target_row(f, &n, js(t, "mode"), js(t, "name"),
                           jd(t, "value"), jd(t, "goal"),
                           cJSON_IsTrue(jget(t, "lower_is_better")));
            }
        }
    } else {
        const cJSON *mode;
        cJSON_ArrayForEach(mode, root)
        {
            cJSON_ArrayForEach(t, jget(mode, "targets"))
            {
                const char *name = js(t, "target");
                target_row(f, &n, mode->string, name, jd(t, "value"),
                           jd(t, "goal"), strstr(name, "<=") != NULL);
            }
        }
    }
    fclose(f);
    if (n == 0) { /* a run without targets (one mode's JSON of old) */
        free(rows);
        return 1;
    }
    f = fopen(script, "w");
    if (f == NULL) {
        say("# plot: %s: %s\n", script, strerror(errno));
        free(rows);
        return -1;
    }
    fprintf(f, "$d << EOD\n");
    fwrite(rows, 1, rows_len, f);
    free(rows);
    fprintf(f, "EOD\n");
    fprintf(f,
            "set terminal svg size 1250,%d dynamic noenhanced font "
            "'Helvetica,11'\nset output ",
            150 + 28 * (n > 0 ? n : 1));
    put_quoted(f, path);
    fprintf(f,
            "\nset title 'pdx-bench targets: value / goal (green: met; "
            "lower-is-better goals inverted)'\n"
            "set lmargin 78\nset style fill solid 0.7\nset grid x\n"
            "set logscale x 10\nset xrange [0.01:100]\nset yrange [-1:%d]\n"
            "set ytics scale 0\nset arrow from 1,-1 to 1,%d nohead lw 2 "
            "front\nclip(x) = x < 100 ? x : 100\n"
            "plot $d using (1):1:(0.01):(clip($2)):($1-0.3):($1+0.3):"
            "($2 >= 1 ? 0x33aa33 : 0xcc4444):ytic(3) with boxxyerror "
            "lc rgb variable notitle, $d using (clip($2)):1:"
            "(sprintf('%%.2f', $2)) with labels left offset 0.5,0 "
            "notitle\n",
            n, n);
    fclose(f);
    const char *argv[] = {"gnuplot", script, NULL};
    int pid = spawn_cmd(argv, NULL, 2, -1);
    int status = 0;
    if (pid > 0) {
        waitpid(pid, &status, 0);
    }
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        say("# plot: gnuplot %s (apt-get install -y gnuplot-nox)\n",
            pid < 0 ? "not found" : "failed");
        return -1;
    }
    return 0;
}

int bench_plot(const char *json_path, const char *dir)
{
    if (json_path == NULL) {
        die("plot: give the JSON of a run (pdx-bench ... --json=FILE)");
    }
    FILE *f = fopen(json_path, "r");
    if (f == NULL) {
        die("plot: %s: %s", json_path, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    char buf[65536];
    size_t n;
    while (m != NULL && (n = fread(buf, 1, sizeof(buf), f)) > 0) {
        fwrite(buf, 1, n, m);
    }
    fclose(f);
    if (m == NULL || fclose(m) != 0) {
        die("plot: out of memory");
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (root == NULL) {
        die("plot: %s is not pdx-bench's JSON", json_path);
    }
    int made = 0, failed = 0;
    struct {
        const char *key;
        int (*fn)(const cJSON *, const char *);
    } kinds[] = {{"transfer", plot_transfer},
                 {"latency", plot_latency},
                 {"handoff", plot_handoff},
                 {"targets", plot_targets}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        const cJSON *part = i == 3 ? root : jget(root, kinds[i].key);
        if (part == NULL) {
            continue;
        }
        int r = kinds[i].fn(part, dir);
        if (r == 1) {
            continue; /* nothing of that kind in this run */
        }
        if (r == 0) {
            made++;
            say("plot: %s/bench-%s.svg\n", dir, kinds[i].key);
        } else {
            failed++;
        }
    }
    cJSON_Delete(root);
    if (made == 0) {
        die("plot: nothing to plot in %s (no transfer, latency, handoff or "
            "targets)",
            json_path);
    }
    return failed ? 2 : 0;
}
