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
