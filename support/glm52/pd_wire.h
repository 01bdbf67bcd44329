/* Driver <-> node channel of the GLM-5.2 P/D example: JSON messages framed
 * by a 4-byte little-endian length over a non-blocking socket, with an
 * outgoing queue on each side so neither ever blocks writing while the
 * other is busy (large token lists travel both ways).
 *
 * Messages (all JSON objects with "op"):
 *   node -> driver  hello {agent, role, blob (hex), num_blocks, ...}
 *                   or {op: hello, ok: false, error}
 *   driver -> node  connect {blob}          -> connect {ok, peer | error}
 *                   prefill {sid, turn, req, tokens, params?, abort?}
 *                   decode  {sid, turn, req, tokens, params, gen, abort?}
 *                                            -> same op {ok, params, stats..}
 *                      abort: "reject" (reject the handoff after the lookup,
 *                      unread) or "load" (pdx_kv_load_abort after
 *                      abort_polls load checks still in progress); the
 *                      reply is then {ok, aborted: "reject" | "load" |
 *                      "after_load", verification stats} and no handoff
 *                   reject {params}         -> reject {ok}
 *                   drain {timeout_ms}      -> drain {ok, held, stats}
 *                   quit                    (node exits 0) */
#ifndef PD_WIRE_H
#define PD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "pdx_clock.h"

#define PD_FRAME_MAX (64u << 20)

typedef struct pd_chan {
    int fd;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_off, out_len, out_cap;
    int eof;   /* the peer closed */
    int error; /* errno of a failed read/write, or EPROTO for bad framing */
} pd_chan_t;

/* Takes ownership of `fd` and makes it non-blocking. */
int pd_chan_init(pd_chan_t *c, int fd);
void pd_chan_close(pd_chan_t *c);

/* Queue `msg` (printed unformatted); then flush what the socket takes.
 * -1 on failure (c->error set). */
int pd_chan_send(pd_chan_t *c, const cJSON *msg);

/* Write queued bytes until the socket would block. -1 on failure. */
int pd_chan_flush(pd_chan_t *c);

/* 1 when bytes are queued for writing. */
int pd_chan_pending(const pd_chan_t *c);

/* Read what is available (sets eof on end of stream). -1 on failure. */
int pd_chan_fill(pd_chan_t *c);

/* The next complete message, parsed (caller cJSON_Deletes it), or NULL
 * when none is complete yet. A frame that is too long or not a JSON object
 * sets c->error (EPROTO) and returns NULL. */
cJSON *pd_chan_next(pd_chan_t *c);

/* Wait until `deadline` (pdx_now_ms_f) for the next message, sending what
 * is queued meanwhile. NULL when the channel failed or closed (c->error or
 * c->eof set) or the deadline passed (neither set). */
cJSON *pd_chan_recv(pd_chan_t *c, double deadline);

/* Send what is queued, waiting until `deadline` (pdx_now_ms_f) at most: 0
 * when all went out, -1 on failure or with bytes left. */
int pd_chan_drain(pd_chan_t *c, double deadline);

/* Hex of `len` bytes, malloc'd and NUL-terminated (NULL on ENOMEM). */
char *pd_hex_encode(const void *buf, size_t len);

/* Bytes of a hex string, malloc'd; NULL on bad input or ENOMEM. */
void *pd_hex_decode(const char *hex, size_t *len_p);

/* Number fields of a message, with a default when absent or not numbers. */
double pd_json_num(const cJSON *obj, const char *key, double dflt);
const char *pd_json_str(const cJSON *obj, const char *key);

#endif
