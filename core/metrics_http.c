/* The metrics HTTP endpoint of an agent, its whole life: started by
 * pdx_metrics_start (or PDX_METRICS_LISTEN at agent create), serving
 * GET /metrics with pdx_metrics_text's text from libmicrohttpd's own
 * thread, stopped by pdx_metrics_stop or the agent's destroy. HTTP is
 * libmicrohttpd's; pdx only answers.
 *
 * libmicrohttpd is loaded with dlopen at the first start, not linked:
 * linked, it brought gnutls, p11-kit and their constructors into every
 * program that loads libpdx.so, metrics or not. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "agent_int.h"
#include "metrics_int.h"

#ifdef PDX_HAVE_MHD
#include <microhttpd.h>

#if MHD_VERSION < 0x00097002
typedef int pdx_mhd_result_t;
#else
typedef enum MHD_Result pdx_mhd_result_t;
#endif

#ifndef PDX_MHD_SONAME
#define PDX_MHD_SONAME "libmicrohttpd.so.12"
#endif

/* libmicrohttpd's functions pdx calls, loaded once (mhd_load). */
static struct {
    __typeof__(&MHD_start_daemon) start_daemon;
    __typeof__(&MHD_stop_daemon) stop_daemon;
    __typeof__(&MHD_get_daemon_info) get_daemon_info;
    __typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
    __typeof__(&MHD_add_response_header) add_response_header;
    __typeof__(&MHD_queue_response) queue_response;
    __typeof__(&MHD_destroy_response) destroy_response;
} g_mhd;
static pthread_once_t g_mhd_once = PTHREAD_ONCE_INIT;
static char g_mhd_err[256]; /* why it did not load; "" when it did */

static void mhd_load_once(void)
{
    void *h = dlopen(PDX_MHD_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(g_mhd_err, sizeof(g_mhd_err), "%s", e != NULL ? e : "?");
        return;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"MHD_start_daemon", (void **)&g_mhd.start_daemon},
        {"MHD_stop_daemon", (void **)&g_mhd.stop_daemon},
        {"MHD_get_daemon_info", (void **)&g_mhd.get_daemon_info},
        {"MHD_create_response_from_buffer",
         (void **)&g_mhd.create_response_from_buffer},
        {"MHD_add_response_header", (void **)&g_mhd.add_response_header},
        {"MHD_queue_response", (void **)&g_mhd.queue_response},
        {"MHD_destroy_response", (void **)&g_mhd.destroy_response},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (*syms[i].slot == NULL) {
            snprintf(g_mhd_err, sizeof(g_mhd_err), "%s has no %s",
                     PDX_MHD_SONAME, syms[i].name);
            memset(&g_mhd, 0, sizeof(g_mhd));
            dlclose(h);
            return;
        }
    }
    /* Kept loaded for the process's life: daemons may run until exit. */
}

/* libmicrohttpd, loaded at the first call (thread-safe): true when its
 * functions are in g_mhd. */
static bool mhd_load(void)
{
    pthread_once(&g_mhd_once, mhd_load_once);
    return g_mhd.start_daemon != NULL;
}

struct pdx_metrics_http {
    struct MHD_Daemon *daemon;
    pdx_agent_h agent;
    uint16_t port;
    char addr[INET6_ADDRSTRLEN];
};

static pdx_mhd_result_t reply(struct MHD_Connection *c, unsigned code,
                              char *body, size_t len, bool owned)
{
    struct MHD_Response *r = g_mhd.create_response_from_buffer(
        len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (owned) {
            free(body);
        }
        return MHD_NO;
    }
    g_mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            code == MHD_HTTP_OK
                                ? "text/plain; version=0.0.4; charset=utf-8"
                                : "text/plain; charset=utf-8");
    pdx_mhd_result_t ret = g_mhd.queue_response(c, code, r);
    g_mhd.destroy_response(r);
    return ret;
}

static pdx_mhd_result_t answer(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **req_cls)
{
    static char not_found[] = "pdx: metrics are at /metrics\n";
    static char bad_method[] = "pdx: GET /metrics\n";
    struct pdx_metrics_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, bad_method,
                     strlen(bad_method), false);
    }
    if (strcmp(url, "/metrics") != 0) {
        return reply(c, MHD_HTTP_NOT_FOUND, not_found, strlen(not_found),
                     false);
    }
    char *text = NULL;
    if (pdxi_metrics_text(h->agent, &text) != PDX_OK) {
        return MHD_NO; /* out of memory: the connection is closed */
    }
    return reply(c, MHD_HTTP_OK, text, strlen(text), true);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct pdx_metrics_http *h = cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n') {
        line[--n] = '\0';
    }
    pdx_debug("agent %s: metrics endpoint %s:%u: %s", h->agent->name, h->addr,
              h->port, line);
}

/* A numeric address and a port as a sockaddr; false when not numeric. */
static bool sock_addr(const char *addr, uint16_t port,
                      struct sockaddr_storage *ss, bool *v6_p)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0 || res == NULL) {
        return false;
    }
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6_p = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    if (*v6_p) {
        ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
    } else {
        ((struct sockaddr_in *)ss)->sin_port = htons(port);
    }
    return true;
}

pdx_status_t pdxi_metrics_start(pdx_agent_h agent,
                                const pdx_metrics_params_t *params,
                                uint16_t *port_p)
{
    const char *addr = "127.0.0.1";
    uint16_t port = 0;
    if (params != NULL && (params->field_mask & PDX_METRICS_PARAM_ADDR) &&
        params->addr != NULL) {
        addr = params->addr;
    }
    if (params != NULL && (params->field_mask & PDX_METRICS_PARAM_PORT)) {
        port = params->port;
    }
    struct sockaddr_storage ss;
    bool v6 = false;
    if (!mhd_load()) {
        pdx_error("agent %s: metrics: libmicrohttpd cannot be loaded (%s; "
                  "Debian: libmicrohttpd12): no HTTP endpoint; "
                  "pdx_metrics_text gives the same text",
                  agent->name, g_mhd_err);
        return PDX_ERR_UNSUPPORTED;
    }
    if (!sock_addr(addr, port, &ss, &v6)) {
        pdx_error("agent %s: metrics: listen address '%s' is not a numeric "
                  "IPv4 or IPv6 address",
                  agent->name, addr);
        return PDX_ERR_INVALID;
    }
    struct pdx_metrics_http *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return PDX_ERR_NOMEM;
    }
    h->agent = agent;
    h->port = port;
    snprintf(h->addr, sizeof(h->addr), "%s", addr);
    pthread_mutex_lock(&agent->lock);
    if (agent->metrics_http != NULL) {
        pthread_mutex_unlock(&agent->lock);
        free(h);
        pdx_error("agent %s: metrics: already served on port %u", agent->name,
                  agent->metrics_http->port);
        return PDX_ERR_EXISTS;
    }
    agent->metrics_http = h; /* taken: a concurrent start sees EXISTS */
    agent->metrics_timed = true;
    pthread_mutex_unlock(&agent->lock);
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
                     (v6 ? MHD_USE_IPv6 : 0);
    errno = 0;
    h->daemon = g_mhd.start_daemon(
        flags, port, NULL, NULL, answer, h, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, 16u,
        MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        int e = errno;
        pdx_error("agent %s: metrics: cannot listen on %s port %u: %s",
                  agent->name, addr, port,
                  e != 0 ? strerror(e) : "libmicrohttpd refused");
        pthread_mutex_lock(&agent->lock);
        agent->metrics_http = NULL;
        pthread_mutex_unlock(&agent->lock);
        free(h);
        return PDX_ERR_IO;
    }
    const union MHD_DaemonInfo *di =
        g_mhd.get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (di != NULL && di->port != 0) {
        h->port = di->port;
    }
    pdx_info("agent %s: metrics at http://%s%s%s:%u/metrics", agent->name,
             v6 ? "[" : "", addr, v6 ? "]" : "", h->port);
    if (port_p != NULL) {
        *port_p = h->port;
    }
    return PDX_OK;
}

pdx_status_t pdxi_metrics_stop(pdx_agent_h agent)
{
    pthread_mutex_lock(&agent->lock);
    struct pdx_metrics_http *h = agent->metrics_http;
    agent->metrics_http = NULL;
    pthread_mutex_unlock(&agent->lock);
    if (h == NULL) {
        return PDX_ERR_NOT_FOUND;
    }
    /* Without the agent lock: a scrape in progress takes it to finish. */
    g_mhd.stop_daemon(h->daemon);
    free(h);
    return PDX_OK;
}

#else /* !PDX_HAVE_MHD */

pdx_status_t pdxi_metrics_start(pdx_agent_h agent,
                                const pdx_metrics_params_t *params,
                                uint16_t *port_p)
{
    pdx_error("agent %s: metrics: this libpdx.so was built without "
              "libmicrohttpd (libmicrohttpd-dev): no HTTP endpoint; "
              "pdx_metrics_text gives the same text",
              agent->name);
    return PDX_ERR_UNSUPPORTED;
}

pdx_status_t pdxi_metrics_stop(pdx_agent_h agent)
{
    return PDX_ERR_NOT_FOUND;
}

#endif

void pdx_metrics_from_env(pdx_agent_h agent)
{
    const char *env = getenv("PDX_METRICS_LISTEN");
    if (env == NULL || *env == '\0') {
        return;
    }
    /* [ADDR:]PORT; an IPv6 address in brackets: [::1]:9464. */
    char addr[INET6_ADDRSTRLEN + 2] = "127.0.0.1";
    const char *colon = strrchr(env, ':');
    const char *port_s = env;
    if (colon != NULL) {
        size_t n = (size_t)(colon - env);
        const char *a = env;
        if (n >= 2 && a[0] == '[' && a[n - 1] == ']') {
            a++;
            n -= 2;
        }
        if (n == 0 || n >= sizeof(addr)) {
            n = 0;
        }
        memcpy(addr, a, n);
        addr[n] = '\0';
        port_s = colon + 1;
    }
    char *end = NULL;
    unsigned long port = strtoul(port_s, &end, 10);
    if (addr[0] == '\0' || end == port_s || *end != '\0' || port > 65535) {
        pdx_warn("agent %s: PDX_METRICS_LISTEN=%s: expected [ADDR:]PORT "
                 "(127.0.0.1:9464, [::1]:9464, 9464); no metrics endpoint",
                 agent->name, env);
        return;
    }
    pdx_metrics_params_t p = {.field_mask = PDX_METRICS_PARAM_ADDR |
                                            PDX_METRICS_PARAM_PORT,
                              .addr = addr,
                              .port = (uint16_t)port};
    if (pdxi_metrics_start(agent, &p, NULL) != PDX_OK) {
        pdx_warn("agent %s: PDX_METRICS_LISTEN=%s: no metrics endpoint "
                 "(the line before says why)",
                 agent->name, env);
    }
}
