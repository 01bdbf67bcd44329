/* Unary gRPC calls to etcd over persistent h2c connections (libnghttp2).
 *
 * Why not libcurl: curl 7.88 cannot reuse a prior-knowledge h2c
 * connection (the second request on it fails with "Error in the HTTP2
 * framing layer" before anything is sent), so every gRPC call through it
 * costs a new connection, and the JSON gateway costs etcd about as much:
 * ~0.5 ms of etcd CPU per point read either way on this project's VM.
 * Here a connection carries one call at a time and stays open for the
 * next; a process keeps a few (the client's pool). Only plain http
 * endpoints without etcd auth use it; TLS and auth keep the gateway.
 *
 * Everything read from the socket is untrusted: nghttp2 checks the HTTP/2
 * framing, the gRPC length prefix is checked here, the message is decoded
 * by the bounded decoders of etcd_pb.c. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "etcd_int.h"

struct etcd_h2 {
    int fd;
    nghttp2_session *ss;
    char endpoint[256]; /* "http://host:port" it is connected to */
    char authority[256];
    /* The call in progress. */
    int32_t stream;
    bool done;
    uint32_t rst_code;
    int http_status;
    int grpc_status; /* -1 until the trailers say */
    char grpc_message[128];
    etcd_buf_t in;
    bool too_big;
    const uint8_t *tx;
    size_t tx_len, tx_off;
};

void etcd_h2_close(etcd_h2_t *c)
{
    if (c == NULL) {
        return;
    }
    if (c->ss != NULL) {
        nghttp2_session_del(c->ss);
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    etcd_buf_free(&c->in);
    free(c);
}

/* "http://host:port[/]" into host and port; IPv6 in brackets. */
static bool parse_endpoint(const char *ep, char *host, size_t hlen,
                           char *port, size_t plen)
{
    if (strncmp(ep, "http://", 7) != 0) {
        return false;
    }
    const char *h = ep + 7, *end = h + strcspn(h, "/");
    const char *colon;
    if (*h == '[') {
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (rb == NULL || rb[1] != ':') {
            return false;
        }
        if ((size_t)(rb - h - 1) >= hlen) {
            return false;
        }
        memcpy(host, h + 1, (size_t)(rb - h - 1));
        host[rb - h - 1] = '\0';
        colon = rb + 1;
    } else {
        colon = NULL;
        for (const char *q = h; q < end; q++) {
            if (*q == ':') {
                colon = q;
            }
        }
        if (colon == NULL || (size_t)(colon - h) >= hlen || colon == h) {
            return false;
        }
        memcpy(host, h, (size_t)(colon - h));
        host[colon - h] = '\0';
    }
    size_t pl = (size_t)(end - colon - 1);
    if (pl == 0 || pl >= plen) {
        return false;
    }
    memcpy(port, colon + 1, pl);
    port[pl] = '\0';
    return true;
}

bool etcd_h2_usable(const char *endpoint)
{
    char host[128], port[16];
    return parse_endpoint(endpoint, host, sizeof(host), port, sizeof(port));
}

static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = pdx_now_ns();
    if (now >= deadline_ns) {
        return 0;
    }
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

static int connect_to(const char *host, const char *port, uint64_t deadline,
                      char *err, size_t elen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, elen, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 &&
            errno != EINPROGRESS) {
            snprintf(err, elen, "connect: %s", strerror(errno));
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        int pr = poll(&p, 1, ms_left(deadline));
        if (pr <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 ||
            soerr != 0) {
            snprintf(err, elen, "connect: %s",
                     pr == 0 ? "timed out" : strerror(soerr ? soerr : errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

static int on_header(nghttp2_session *ss, const nghttp2_frame *f,
                     const uint8_t *name, size_t nlen, const uint8_t *value,
                     size_t vlen, uint8_t flags, void *arg)
{
    (void)ss;
    (void)flags;
    etcd_h2_t *c = arg;
    if (f->hd.stream_id != c->stream) {
        return 0;
    }
    char v[128];
    size_t n = vlen < sizeof(v) - 1 ? vlen : sizeof(v) - 1;
    memcpy(v, value, n);
    v[n] = '\0';
    if (nlen == 7 && memcmp(name, ":status", 7) == 0) {
        c->http_status = atoi(v);
    } else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        c->grpc_status = atoi(v);
    } else if (nlen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        snprintf(c->grpc_message, sizeof(c->grpc_message), "%s", v);
    }
    return 0;
}

static int on_data(nghttp2_session *ss, uint8_t flags, int32_t stream,
                   const uint8_t *data, size_t len, void *arg)
{
    (void)ss;
    (void)flags;
    etcd_h2_t *c = arg;
    if (stream != c->stream) {
        return 0;
    }
    if (c->in.len + len > MUX_MSG_MAX + 5) {
        c->too_big = true;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    etcd_buf_add(&c->in, data, len);
    return 0;
}

static int on_close(nghttp2_session *ss, int32_t stream, uint32_t code,
                    void *arg)
{
    (void)ss;
    etcd_h2_t *c = arg;
    if (stream == c->stream) {
        c->done = true;
        c->rst_code = code;
    }
    return 0;
}

static ssize_t tx_read(nghttp2_session *ss, int32_t stream, uint8_t *buf,
                       size_t len, uint32_t *flags, nghttp2_data_source *src,
                       void *arg)
{
    (void)ss;
    (void)stream;
    (void)src;
    etcd_h2_t *c = arg;
    size_t left = c->tx_len - c->tx_off;
    size_t n = left < len ? left : len;
    memcpy(buf, c->tx + c->tx_off, n);
    c->tx_off += n;
    if (c->tx_off == c->tx_len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return (ssize_t)n;
}

static etcd_h2_t *h2_open(const char *endpoint, uint64_t deadline, char *err,
                          size_t elen)
{
    char host[128], port[16];
    if (!parse_endpoint(endpoint, host, sizeof(host), port, sizeof(port))) {
        snprintf(err, elen, "not an http://host:port endpoint");
        return NULL;
    }
    etcd_h2_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, elen, "out of memory");
        return NULL;
    }
    c->fd = connect_to(host, port, deadline, err, elen);
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
    snprintf(c->authority, sizeof(c->authority), "%s",
             endpoint + 7); /* host:port */
    c->authority[strcspn(c->authority, "/")] = '\0';
    nghttp2_session_callbacks *cb = NULL;
    if (c->fd < 0 || nghttp2_session_callbacks_new(&cb) != 0) {
        etcd_h2_close(c);
        return NULL;
    }
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    int rc = nghttp2_session_client_new(&c->ss, cb, c);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry st[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20}};
    if (rc != 0 ||
        nghttp2_submit_settings(c->ss, NGHTTP2_FLAG_NONE, st, 2) != 0) {
        snprintf(err, elen, "nghttp2 session: %s", nghttp2_strerror(rc));
        etcd_h2_close(c);
        return NULL;
    }
    return c;
}

/* Write what the session has to send (bounded by the deadline). */
static bool h2_flush(etcd_h2_t *c, uint64_t deadline, char *err, size_t elen)
{
    for (int guard = 0; guard < 100000; guard++) {
        const uint8_t *d = NULL;
        ssize_t n = nghttp2_session_mem_send(c->ss, &d);
        if (n < 0) {
            snprintf(err, elen, "http2: %s", nghttp2_strerror((int)n));
            return false;
        }
        if (n == 0) {
            return true;
        }
        size_t off = 0;
        while (off < (size_t)n) {
            ssize_t w = send(c->fd, d + off, (size_t)n - off, MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
                continue;
            }
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != EINTR) {
                snprintf(err, elen, "send: %s", strerror(errno));
                return false;
            }
            struct pollfd p = {.fd = c->fd, .events = POLLOUT};
            if (errno != EINTR && poll(&p, 1, ms_left(deadline)) <= 0) {
                snprintf(err, elen, "send: timed out");
                return false;
            }
        }
    }
    snprintf(err, elen, "http2: sending did not end");
    return false;
}

/* One call on an open connection. PDX_OK: the stream ended, status in c;
 * else the connection is not to be used again. */
static pdx_status_t h2_call(etcd_h2_t *c, const char *path,
                            const uint8_t *frame, size_t flen,
                            uint64_t deadline, char *err, size_t elen)
{
    c->done = false;
    c->rst_code = 0;
    c->http_status = 0;
    c->grpc_status = -1;
    c->grpc_message[0] = '\0';
    c->in.len = 0;
    c->too_big = false;
    c->tx = frame;
    c->tx_len = flen;
    c->tx_off = 0;
#define NV(n, v)                                                               \
    {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),                 \
     NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv hdrs[] = {NV(":method", "POST"), NV(":scheme", "http"),
                         NV(":authority", c->authority), NV(":path", path),
                         NV("content-type", "application/grpc"),
                         NV("te", "trailers")};
#undef NV
    nghttp2_data_provider dp = {.read_callback = tx_read};
    c->stream = nghttp2_submit_request(c->ss, NULL, hdrs,
                                       sizeof(hdrs) / sizeof(hdrs[0]), &dp,
                                       NULL);
    if (c->stream < 0) {
        snprintf(err, elen, "http2: %s", nghttp2_strerror(c->stream));
        return PDX_ERR_IO;
    }
    uint8_t buf[16384];
    for (int guard = 0; guard < 1000000 && !c->done; guard++) {
        if (!h2_flush(c, deadline, err, elen)) {
            return PDX_ERR_IO;
        }
        if (c->done) {
            break;
        }
        if (!nghttp2_session_want_read(c->ss)) {
            snprintf(err, elen, "http2: the server ended the connection");
            return PDX_ERR_IO;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&p, 1, ms_left(deadline));
        if (pr == 0) {
            snprintf(err, elen, "no answer within the timeout");
            return PDX_ERR_TIMEOUT;
        }
        if (pr < 0) {
            if (errno == EINTR) {
                continue;
            }
            snprintf(err, elen, "poll: %s", strerror(errno));
            return PDX_ERR_IO;
        }
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n == 0) {
            snprintf(err, elen, "connection closed by the server");
            return PDX_ERR_IO;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                continue;
            }
            snprintf(err, elen, "recv: %s", strerror(errno));
            return PDX_ERR_IO;
        }
        ssize_t r = nghttp2_session_mem_recv(c->ss, buf, (size_t)n);
        if (r < 0) {
            snprintf(err, elen, "%s",
                     c->too_big ? "response larger than 64 MiB"
                                : nghttp2_strerror((int)r));
            return PDX_ERR_IO;
        }
    }
    if (!c->done) {
        snprintf(err, elen, "http2: the call did not end");
        return PDX_ERR_IO;
    }
    /* Anything left to send (WINDOW_UPDATE, acks) goes before the next
     * call; a failure here only costs the connection. */
    return PDX_OK;
}

/* The client's pool: connections kept between calls, one call each. */
static etcd_h2_t *pool_take(etcd_client_t *cl, const char *endpoint)
{
    etcd_h2_t *c = NULL, *stale = NULL;
    pthread_mutex_lock(&cl->lock);
    for (uint32_t i = cl->nh2; i-- > 0;) {
        if (strcmp(cl->h2[i]->endpoint, endpoint) == 0) {
            c = cl->h2[i];
        } else if (stale == NULL) {
            stale = cl->h2[i]; /* another endpoint: make room */
        } else {
            continue;
        }
        cl->h2[i] = cl->h2[--cl->nh2];
        if (c != NULL) {
            break;
        }
    }
    pthread_mutex_unlock(&cl->lock);
    etcd_h2_close(stale);
    return c;
}

static void pool_give(etcd_client_t *cl, etcd_h2_t *c)
{
    pthread_mutex_lock(&cl->lock);
    if (cl->nh2 < ETCD_HANDLE_POOL) {
        cl->h2[cl->nh2++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&cl->lock);
    etcd_h2_close(c);
}

void etcd_h2_pool_free(etcd_client_t *cl)
{
    for (uint32_t i = 0; i < cl->nh2; i++) {
        etcd_h2_close(cl->h2[i]);
    }
    cl->nh2 = 0;
}

/* Send gRPC frames `frames` (one request message, or several on a
 * client-streaming call, then end of stream) and collect the response's
 * frames, raw, in `raw`. */
pdx_status_t etcd_h2_stream(etcd_client_t *cl, const char *endpoint,
                            const char *path, const etcd_buf_t *frames,
                            uint64_t deadline, etcd_buf_t *raw, int *grpc_p,
                            char *err, size_t elen)
{
    *grpc_p = -1;
    pdx_status_t st = PDX_ERR_IO;
    /* A pooled connection may have been closed by the server while idle:
     * then once more on a new one. */
    for (int attempt = 0; attempt < 2; attempt++) {
        etcd_h2_t *c = attempt == 0 ? pool_take(cl, endpoint) : NULL;
        bool fresh = c == NULL;
        if (c == NULL) {
            c = h2_open(endpoint, deadline, err, elen);
            if (c == NULL) {
                st = PDX_ERR_IO;
                break;
            }
        }
        st = h2_call(c, path, (const uint8_t *)frames->data, frames->len,
                     deadline, err, elen);
        if (st != PDX_OK) {
            etcd_h2_close(c);
            if (fresh || st == PDX_ERR_TIMEOUT) {
                break;
            }
            continue;
        }
        if (!fresh && c->rst_code == NGHTTP2_REFUSED_STREAM) {
            /* A kept connection the server is closing (GOAWAY): the call
             * was not processed; once more on a new one. */
            etcd_h2_close(c);
            continue;
        }
        *grpc_p = c->grpc_status;
        if (c->http_status == 200 && c->grpc_status > 0) {
            /* Refused by etcd: the connection is fine, the caller maps. */
            snprintf(err, elen, "grpc-status %d%s%s", c->grpc_status,
                     c->grpc_message[0] ? ": " : "", c->grpc_message);
        } else if (c->grpc_status != 0 || c->rst_code != 0 ||
                   c->http_status != 200) {
            snprintf(err, elen, "HTTP %d, grpc-status %d, stream reset %u",
                     c->http_status, c->grpc_status, c->rst_code);
            st = PDX_ERR_IO;
        } else {
            etcd_buf_add(raw, c->in.data ? c->in.data : "", c->in.len);
            if (raw->data == NULL) {
                st = PDX_ERR_NOMEM;
            }
        }
        if (st == PDX_OK) {
            pool_give(cl, c); /* the connection is fine */
        } else {
            etcd_h2_close(c);
        }
        break;
    }
    return st;
}

pdx_status_t etcd_h2_unary(etcd_client_t *cl, const char *endpoint,
                           const char *path, const etcd_buf_t *msg,
                           uint64_t deadline, etcd_buf_t *out, int *grpc_p,
                           char *err, size_t elen)
{
    etcd_buf_t frame = {0}, raw = {0};
    etcd_grpc_frame(&frame, msg);
    if (frame.data == NULL) {
        snprintf(err, elen, "out of memory");
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = etcd_h2_stream(cl, endpoint, path, &frame, deadline,
                                     &raw, grpc_p, err, elen);
    if (st == PDX_OK && *grpc_p == 0) {
        /* Exactly one message. */
        const uint8_t *p = (const uint8_t *)raw.data, *m = NULL;
        size_t left = raw.len, len = 0;
        if (!etcd_grpc_next_frame(&p, &left, &m, &len) || left != 0) {
            snprintf(err, elen, "malformed gRPC response (%zu bytes)",
                     raw.len);
            st = PDX_ERR_CORRUPT;
        } else {
            etcd_buf_add(out, m, len);
            if (len > 0 && out->data == NULL) {
                st = PDX_ERR_NOMEM;
            }
        }
    }
    etcd_buf_free(&frame);
    etcd_buf_free(&raw);
    return st;
}
