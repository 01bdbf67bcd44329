/* Shared by the multi-process tests: fatal errors, monotonic clocks, a
 * checked pdx call, an agent with a ucx backend, and length-framed
 * messages over a control socket (blobs, commands). */
#ifndef PDX_TEST_CTL_H
#define PDX_TEST_CTL_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pdx/pdx.h>

#include "pdx_clock.h"

/* Each test names itself in its fatal messages. */
extern const char *ctl_name;

static inline void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static inline void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s[%d]: ", ctl_name, (int)getpid());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* Die naming the call, its status and pdx_last_error() when a pdx call
 * fails. */
#define CHECK(call)                                                            \
    do {                                                                       \
        pdx_status_t st_ = (call);                                             \
        if (st_ < 0)                                                           \
            die("%s: %s (%s)", #call, pdx_status_string(st_),                  \
                pdx_last_error());                                             \
    } while (0)

/* An agent with its progress thread and a request timeout of
 * xfer_timeout_ms, and a ucx backend over transports `tls` (UCX_TLS
 * style: "sm", "tcp"); dies on failure. */
static inline pdx_agent_h ctl_ucx_agent(const char *name, const char *tls,
                                        uint32_t xfer_timeout_ms)
{
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_FLAGS |
                                          PDX_AGENT_PARAM_XFER_TIMEOUT,
                            .flags = PDX_AGENT_F_PROGRESS_THREAD,
                            .xfer_timeout_ms = xfer_timeout_ms};
    pdx_agent_h a;
    CHECK(pdx_agent_create(name, &p, &a));
    pdx_option_t opt = {"tls", tls};
    CHECK(pdx_backend_create(a, "ucx", &opt, 1, NULL));
    return a;
}

static inline void send_msg(int fd, const void *p, uint32_t len)
{
    if (write(fd, &len, 4) != 4 ||
        (len > 0 && write(fd, p, len) != (ssize_t)len)) {
        die("control write: %s", strerror(errno));
    }
}

/* A NUL-terminated copy of the next message (free it), or NULL at EOF. */
static inline char *recv_msg(int fd, uint32_t *len_p)
{
    uint32_t len;
    if (read(fd, &len, 4) != 4) {
        return NULL;
    }
    char *b = malloc((size_t)len + 1);
    if (b == NULL) {
        die("out of memory for a %u-byte message", len);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, b + got, len - got);
        if (n <= 0) {
            free(b);
            return NULL;
        }
        got += (size_t)n;
    }
    b[len] = '\0';
    if (len_p != NULL) {
        *len_p = len;
    }
    return b;
}

/* Receive a peer's blob on `fd` and load it into agent a (its name into
 * name_p when not NULL); dies naming `who` when none comes. */
static inline void ctl_load_peer(pdx_agent_h a, int fd, char *name_p,
                                 const char *who)
{
    uint32_t len;
    char *blob = recv_msg(fd, &len);
    if (blob == NULL) {
        die("no blob from %s", who);
    }
    CHECK(pdx_peer_load(a, blob, len, name_p));
    free(blob);
}

#endif
