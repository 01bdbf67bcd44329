/* pdx-info --stats answers whole for any number of agents and peers
 * (issue 38, item 13): 80 agents of this process (more than the 64 it
 * used to list), one of them with 500 peers loaded (an answer larger than
 * a socket buffer, which it used to cut mid-object at 64 KiB, exit 0).
 * Every agent's JSON is printed once, whole (balanced, with each of the
 * 500 peers), and pdx-info exits 0. Over the in-process mock backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pdx/pdx.h>

#include "ctl.h"
#include "mock_backend.h"

#define NAGENTS 80
#define NPEERS 500

static pdx_agent_h make(const char *name, int thread)
{
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                            .flags = thread ? PDX_AGENT_F_PROGRESS_THREAD : 0};
    pdx_agent_h a;
    CHECK(pdx_agent_create(name, &p, &a));
    CHECK(pdx_backend_create_with_ops(a, &mock_backend_ops, NULL, 0, NULL));
    return a;
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what)) {
        n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        die("usage: %s PDX-INFO", argv[0]);
    }
    pdx_log_set_level(PDX_LOG_ERROR);
    static pdx_agent_h agents[NAGENTS], peers[NPEERS];
    char name[32];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(name, sizeof(name), "st-%03d", i);
        agents[i] = make(name, 1);
    }
    /* The peers' own agents have no progress thread to answer: no
     * stats socket for them. */
    setenv("PDX_STATS_SOCKET", "0", 1);
    for (int i = 0; i < NPEERS; i++) {
        snprintf(name, sizeof(name), "peer-with-a-long-name-%04d", i);
        peers[i] = make(name, 0);
        CHECK(ctl_load_agent(agents[0], peers[i], NULL));
    }
    unsetenv("PDX_STATS_SOCKET");
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "%s --stats %d", argv[1], (int)getpid());
    FILE *f = popen(cmd, "r");
    if (f == NULL) {
        die("popen %s", cmd);
    }
    size_t cap = 1 << 20, got = 0;
    char *out = malloc(cap);
    size_t r;
    while (out != NULL && (r = fread(out + got, 1, cap - got - 1, f)) > 0) {
        got += r;
        if (got + 1 == cap) {
            out = realloc(out, cap *= 2);
        }
    }
    int status = pclose(f);
    if (out == NULL) {
        die("out of memory");
    }
    out[got] = '\0';
    int fails = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: pdx-info exited %d\n", WEXITSTATUS(status));
        fails++;
    }
    size_t objs = count(out, "{\"agent\": \"st-");
    if (objs != NAGENTS) {
        fprintf(stderr, "FAIL: %zu of %d agents' answers printed\n", objs,
                NAGENTS);
        fails++;
    }
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(name, sizeof(name), "\"agent\": \"st-%03d\"", i);
        if (count(out, name) != 1) {
            fprintf(stderr, "FAIL: agent st-%03d printed %zu times\n", i,
                    count(out, name));
            fails++;
        }
    }
    size_t npeer = count(out, "\"name\": \"peer-with-a-long-name-");
    if (npeer != NPEERS) {
        fprintf(stderr, "FAIL: %zu of %d peers in st-000's answer (cut?)\n",
                npeer, NPEERS);
        fails++;
    }
    long depth = 0;
    for (size_t i = 0; i < got; i++) {
        depth += out[i] == '{' ? 1 : out[i] == '}' ? -1 : 0;
        if (depth < 0) {
            break;
        }
    }
    if (depth != 0) {
        fprintf(stderr, "FAIL: braces do not balance (%ld): an answer was "
                "cut mid-object\n", depth);
        fails++;
    }
    printf("pdx-info --stats: %zu bytes, %zu agents, %zu peers of st-000\n",
           got, objs, npeer);
    free(out);
    for (int i = 0; i < NPEERS; i++) {
        pdx_agent_destroy(peers[i]);
    }
    for (int i = 0; i < NAGENTS; i++) {
        pdx_agent_destroy(agents[i]);
    }
    printf(fails ? "FAILED\n" : "ok\n");
    return fails ? 1 : 0;
}
