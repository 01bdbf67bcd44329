/* pdx_metrics_text and the HTTP endpoint over the mock backend: per-path
 * counters, errors by class (a failed post: backend), histograms counting
 * timed requests only (cumulative buckets, +Inf = count), peers by state;
 * the endpoint answers GET /metrics on loopback (a raw HTTP/1.0 request,
 * bounded), 404 elsewhere, refuses a second start (EXISTS), a port in use
 * (IO) and a non-numeric address (INVALID), stops (NOT_FOUND after), and
 * PDX_METRICS_LISTEN starts it at agent create. Log lines of the default
 * sink name the time, the pid and the agent (stderr captured to a file). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/pdx.h>

#include "ctl.h"
#include "mock_backend.h"
#include "poll_until.h"

#define MB (1u << 20)

typedef struct side {
    pdx_agent_h agent;
    unsigned char *mem;
    pdx_mem_reg_h reg;
    char peer[PDX_NAME_MAX];
} side_t;

static void side_init(side_t *s, const char *name)
{
    assert_int_equal(pdx_agent_create(name, NULL, &s->agent), PDX_OK);
    assert_int_equal(
        pdx_backend_create_with_ops(s->agent, &mock_backend_ops, NULL, 0, NULL),
        PDX_OK);
    s->mem = calloc(1, MB);
    assert_non_null(s->mem);
    assert_int_equal(pdx_mem_register(s->agent, PDX_MEM_DRAM, (uintptr_t)s->mem,
                                      MB, 0, 0, &s->reg),
                     PDX_OK);
}

static void side_fini(side_t *s)
{
    pdx_agent_destroy(s->agent);
    free(s->mem);
}

/* The value of the sample line starting with `prefix` ("name{labels}"),
 * or -1 when there is none. */
static double value_of(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n')) {
        p += *p == '\n';
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
    }
    return -1;
}

static pdx_status_t write_one(side_t *a, size_t len)
{
    pdx_desc_t l = {(uintptr_t)a->mem, len, 0, 0};
    pdx_desc_t r = {0, len, 0, 0};
    pdx_peer_info_t info;
    pdx_region_info_t reg;
    assert_int_equal(pdx_peer_info(a->agent, a->peer, &info, &reg, 1), PDX_OK);
    r.addr = reg.addr;
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(a->agent, PDX_XFER_WRITE, &ll, &rl,
                                     a->peer, NULL, 0, &x),
                     PDX_OK);
    pdx_status_t st = pdx_xfer_post(x);
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000)
    {
        st = pdx_xfer_check(x);
    }
    pdx_xfer_release(x);
    return st;
}

static void test_text(void **state)
{
    (void)state;
    side_t a, b;
    side_init(&a, "met-a");
    side_init(&b, "met-b");
    assert_int_equal(ctl_load_agent(a.agent, b.agent, a.peer), PDX_OK);
    assert_int_equal(ctl_load_agent(b.agent, a.agent, b.peer), PDX_OK);
    /* Not timed yet: counted, not in the histograms. */
    assert_int_equal(write_one(&a, 4096), PDX_OK);
    char *t = NULL;
    assert_int_equal(pdx_metrics_text(a.agent, &t), PDX_OK);
    assert_true(value_of(t, "pdx_requests_total{agent=\"met-a\",path=\"mock\""
                            "}") == 1);
    assert_true(value_of(t, "pdx_post_duration_seconds_count{agent=\"met-a\","
                            "path=\"mock\"}") == 0);
    /* Every error class is there before its first error, at 0. */
    assert_true(value_of(t, "pdx_errors_total{agent=\"met-a\",path=\"mock\","
                            "class=\"backend\"}") == 0);
    assert_true(value_of(t, "pdx_errors_total{agent=\"met-a\",path=\"mock\","
                            "class=\"remote_disconnect\"}") == 0);
    pdx_blob_free(t);
    /* Timed from the first text on. */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(write_one(&a, 8192), PDX_OK);
    }
    mock_fail_next_post = 1;
    assert_int_equal(write_one(&a, 64), PDX_ERR_BACKEND);
    assert_int_equal(pdx_metrics_text(a.agent, &t), PDX_OK);
    assert_true(value_of(t, "pdx_requests_total{agent=\"met-a\",path=\"mock\""
                            "}") == 7);
    assert_true(value_of(t, "pdx_completed_total{agent=\"met-a\","
                            "path=\"mock\"}") == 6);
    assert_true(value_of(t, "pdx_bytes_total{agent=\"met-a\",path=\"mock\"}") ==
                4096 + 5 * 8192);
    assert_true(value_of(t, "pdx_errors_total{agent=\"met-a\",path=\"mock\","
                            "class=\"backend\"}") == 1);
    assert_true(value_of(t, "pdx_errors_total{agent=\"met-a\",path=\"mock\","
                            "class=\"timeout\"}") == 0);
    assert_true(value_of(t, "pdx_post_duration_seconds_count{agent=\"met-a\","
                            "path=\"mock\"}") == 6);
    assert_true(value_of(t, "pdx_post_duration_seconds_bucket{agent=\"met-a\","
                            "path=\"mock\",le=\"+Inf\"}") == 6);
    assert_true(value_of(t, "pdx_completion_duration_seconds_count{agent="
                            "\"met-a\",path=\"mock\"}") == 5);
    assert_true(value_of(t, "pdx_completion_duration_seconds_bucket{agent="
                            "\"met-a\",path=\"mock\",le=\"10\"}") == 5);
    assert_true(value_of(t, "pdx_peers{agent=\"met-a\",state=\"alive\"}") == 1);
    assert_true(value_of(t, "pdx_registered_regions{agent=\"met-a\"}") == 1);
    assert_non_null(strstr(t, "# TYPE pdx_completion_duration_seconds "
                              "histogram\n"));
    pdx_blob_free(t);
    /* An unloaded peer is counted as such. */
    assert_int_equal(pdx_peer_unload(a.agent, a.peer), PDX_OK);
    assert_int_equal(pdx_metrics_text(a.agent, &t), PDX_OK);
    assert_true(value_of(t, "pdx_peers{agent=\"met-a\",state=\"unloaded\"}") ==
                1);
    assert_true(value_of(t, "pdx_peers{agent=\"met-a\",state=\"alive\"}") == 0);
    pdx_blob_free(t);
    side_fini(&a);
    side_fini(&b);
}

/* A bounded HTTP/1.0 GET on loopback: the status code, the body in buf. */
static int http_get(uint16_t port, const char *path, char *buf, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n =
        snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0) {
        got += (size_t)r;
    }
    buf[got] = '\0';
    close(fd);
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1) {
        return -1;
    }
    return code;
}

static void test_endpoint(void **state)
{
    (void)state;
    side_t a;
    side_init(&a, "met-http");
    uint16_t port = 0;
    pdx_status_t st0 = pdx_metrics_start(a.agent, NULL, &port);
    if (st0 == PDX_ERR_UNSUPPORTED) {
        side_fini(&a);
        skip(); /* libpdx.so without libmicrohttpd */
    }
    assert_int_equal(st0, PDX_OK);
    assert_true(port > 0);
    static char buf[1 << 16];
    assert_int_equal(http_get(port, "/metrics", buf, sizeof(buf)), 200);
    assert_non_null(strstr(buf, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(buf, "pdx_agent_info{agent=\"met-http\""));
    assert_int_equal(http_get(port, "/", buf, sizeof(buf)), 404);
    uint16_t p2 = 0;
    assert_int_equal(pdx_metrics_start(a.agent, NULL, &p2), PDX_ERR_EXISTS);
    assert_non_null(strstr(pdx_last_error(), "already served"));
    assert_int_equal(pdx_metrics_stop(a.agent), PDX_OK);
    assert_int_equal(http_get(port, "/metrics", buf, sizeof(buf)), -1);
    assert_int_equal(pdx_metrics_stop(a.agent), PDX_ERR_NOT_FOUND);
    /* A port in use: refused with the reason; a name is no address. */
    pdx_metrics_params_t p = {.field_mask = PDX_METRICS_PARAM_ADDR |
                                            PDX_METRICS_PARAM_PORT,
                              .addr = "127.0.0.1",
                              .port = 0};
    assert_int_equal(pdx_metrics_start(a.agent, &p, &port), PDX_OK);
    side_t b;
    side_init(&b, "met-http2");
    p.port = port;
    assert_int_equal(pdx_metrics_start(b.agent, &p, NULL), PDX_ERR_IO);
    assert_non_null(strstr(pdx_last_error(), "cannot listen"));
    p.addr = "localhost";
    assert_int_equal(pdx_metrics_start(b.agent, &p, NULL), PDX_ERR_INVALID);
    p.addr = "::1";
    p.port = 0;
    pdx_status_t st6 = pdx_metrics_start(b.agent, &p, NULL);
    assert_true(st6 == PDX_OK || st6 == PDX_ERR_IO); /* no IPv6 here */
    side_fini(&b);
    /* Destroy stops it. */
    side_fini(&a);
    assert_int_equal(http_get(port, "/metrics", buf, sizeof(buf)), -1);
}

static void test_env_and_log_lines(void **state)
{
    (void)state;
    /* A free port from the kernel, then the environment names it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    uint16_t port = ntohs(sa.sin_port);
    close(fd);
    char env[64];
    snprintf(env, sizeof(env), "127.0.0.1:%u", port);
    setenv("PDX_METRICS_LISTEN", env, 1);
    side_t a;
    side_init(&a, "met-env");
    unsetenv("PDX_METRICS_LISTEN");
    static char buf[1 << 16];
    pdx_status_t have = pdx_metrics_stop(a.agent);
    if (have == PDX_OK) { /* started from the environment: again */
        pdx_metrics_params_t p = {.field_mask = PDX_METRICS_PARAM_PORT,
                                  .port = port};
        assert_int_equal(pdx_metrics_start(a.agent, &p, NULL), PDX_OK);
        assert_int_equal(http_get(port, "/metrics", buf, sizeof(buf)), 200);
        assert_non_null(strstr(buf, "agent=\"met-env\""));
    }
    /* The default sink's line: time, pid, agent. */
    char path[] = "/tmp/pdx-test-metrics-XXXXXX";
    int lf = mkstemp(path);
    assert_true(lf >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(lf, 2);
    pdx_log_set_handler(NULL, NULL);
    char peer[PDX_NAME_MAX];
    pdx_status_t st = pdx_peer_load(a.agent, "garbage", 7, peer);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_true(st < 0);
    char line[1024] = "";
    FILE *f = fdopen(lf, "r");
    rewind(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    unlink(path);
    char want[64];
    snprintf(want, sizeof(want),
             " pdx error pid=%d agent=met-env: ", (int)getpid());
    int y, mo, d, h, mi, s, ms;
    assert_int_equal(sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &y, &mo, &d,
                            &h, &mi, &s, &ms),
                     7);
    if (strstr(line, want) == NULL) {
        fail_msg("log line '%s' lacks '%s'", line, want);
    }
    side_fini(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_env_and_log_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
