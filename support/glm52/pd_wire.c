/* Length-framed JSON messages over a non-blocking socket. */
#include "pd_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int pd_chan_init(pd_chan_t *c, int fd)
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        c->error = errno;
        return -1;
    }
    return 0;
}

void pd_chan_close(pd_chan_t *c)
{
    if (c->fd >= 0) {
        close(c->fd);
    }
    c->fd = -1;
    free(c->in);
    free(c->out);
    c->in = c->out = NULL;
    c->in_len = c->in_cap = c->out_len = c->out_cap = c->out_off = 0;
}

static int reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) {
        return 0;
    }
    size_t n = *cap ? *cap : 4096;
    while (n < need) {
        n *= 2;
    }
    uint8_t *p = realloc(*buf, n);
    if (p == NULL) {
        return -1;
    }
    *buf = p;
    *cap = n;
    return 0;
}

int pd_chan_flush(pd_chan_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return 0;
            }
            c->error = errno;
            return -1;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

int pd_chan_pending(const pd_chan_t *c)
{
    return c->out_off < c->out_len;
}

int pd_chan_send(pd_chan_t *c, const cJSON *msg)
{
    char *text = cJSON_PrintUnformatted(msg);
    if (text == NULL) {
        c->error = ENOMEM;
        return -1;
    }
    size_t len = strlen(text);
    if (len > PD_FRAME_MAX) {
        free(text);
        c->error = EMSGSIZE;
        return -1;
    }
    if (c->out_off > 0 && c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
    }
    if (reserve(&c->out, &c->out_cap, c->out_len + 4 + len) != 0) {
        free(text);
        c->error = ENOMEM;
        return -1;
    }
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    memcpy(c->out + c->out_len, hdr, 4);
    memcpy(c->out + c->out_len + 4, text, len);
    c->out_len += 4 + len;
    free(text);
    return pd_chan_flush(c);
}

int pd_chan_fill(pd_chan_t *c)
{
    for (;;) {
        if (reserve(&c->in, &c->in_cap, c->in_len + 65536) != 0) {
            c->error = ENOMEM;
            return -1;
        }
        ssize_t n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return 0;
            }
            c->error = errno;
            return -1;
        }
        if (n == 0) {
            c->eof = 1;
            return 0;
        }
        c->in_len += (size_t)n;
    }
}

cJSON *pd_chan_next(pd_chan_t *c)
{
    if (c->in_len < 4) {
        return NULL;
    }
    size_t len = (size_t)c->in[0] | (size_t)c->in[1] << 8 |
                 (size_t)c->in[2] << 16 | (size_t)c->in[3] << 24;
    if (len > PD_FRAME_MAX) {
        c->error = EPROTO;
        return NULL;
    }
    if (c->in_len < 4 + len) {
        return NULL;
    }
    cJSON *msg = cJSON_ParseWithLength((const char *)c->in + 4, len);
    memmove(c->in, c->in + 4 + len, c->in_len - 4 - len);
    c->in_len -= 4 + len;
    if (msg == NULL || !cJSON_IsObject(msg)) {
        cJSON_Delete(msg);
        c->error = EPROTO;
        return NULL;
    }
    return msg;
}

char *pd_hex_encode(const void *buf, size_t len)
{
    static const char dig[] = "0123456789abcdef";
    char *s = malloc(2 * len + 1);
    if (s == NULL) {
        return NULL;
    }
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        s[2 * i] = dig[p[i] >> 4];
        s[2 * i + 1] = dig[p[i] & 15];
    }
    s[2 * len] = '\0';
    return s;
}

static int nibble(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

void *pd_hex_decode(const char *hex, size_t *len_p)
{
    size_t n = strlen(hex);
    if (n % 2 != 0) {
        return NULL;
    }
    uint8_t *p = malloc(n / 2 ? n / 2 : 1);
    if (p == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n / 2; i++) {
        int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(p);
            return NULL;
        }
        p[i] = (uint8_t)(hi << 4 | lo);
    }
    *len_p = n / 2;
    return p;
}

double pd_json_num(const cJSON *obj, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

const char *pd_json_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

cJSON *pd_chan_recv(pd_chan_t *c, double deadline)
{
    for (;;) {
        cJSON *m = pd_chan_next(c);
        if (m != NULL) {
            return m;
        }
        if (c->error || c->eof) {
            return NULL;
        }
        double left = deadline - pdx_now_ms_f();
        if (left <= 0) {
            return NULL;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (pd_chan_pending(c)) {
            pfd.events |= POLLOUT;
        }
        int rc = poll(&pfd, 1, left > 100 ? 100 : (int)left + 1);
        if (rc > 0 && (pfd.revents & POLLOUT)) {
            pd_chan_flush(c);
        }
        if (rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
            pd_chan_fill(c);
        }
    }
}

int pd_chan_drain(pd_chan_t *c, double deadline)
{
    while (pd_chan_pending(c) && pdx_now_ms_f() < deadline) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        if (poll(&pfd, 1, 10) < 0 && errno != EINTR) {
            return -1;
        }
        if (pd_chan_flush(c) != 0) {
            return -1;
        }
    }
    return pd_chan_pending(c) ? -1 : 0;
}
