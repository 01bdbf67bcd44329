/* ucx: the instance: options, UCP context and main worker, conn info,
 * destroy (with workers UCX cannot destroy kept reachable), progress, the
 * event fd and describe. */
#include "ucx_int.h"

#include <sys/epoll.h>
#include <unistd.h>

static void ucx_reap_zombies(ucx_be_t *be);

static pdx_status_t ucx_parse_size(const char *key, const char *value,
                                   uint64_t lo, uint64_t hi, uint64_t *out_p)
{
    if (pdx_opt_size(value, lo, hi, out_p) == 0) {
        return PDX_OK;
    }
    pdx_error("ucx: option %s=%s: expected a size from %" PRIu64
              " to %" PRIu64 " bytes (suffix k, m or g allowed)",
              key, value, lo, hi);
    return PDX_ERR_CONFIG;
}

static pdx_status_t ucx_parse_opts(ucx_be_t *be, const pdx_option_t *opts,
                                   size_t nopts)
{
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key;
        const char *v = opts[i].value;
        if (k == NULL || v == NULL) {
            pdx_error("ucx: option %zu has a NULL key or value", i);
            return PDX_ERR_CONFIG;
        }
        if (strcmp(k, "tls") == 0) {
            size_t n = strlen(v);
            if (n == 0 || n >= sizeof(be->tls)) {
                pdx_error("ucx: option tls='%s': expected a non-empty UCX "
                          "transport list under %zu chars", v,
                          sizeof(be->tls));
                return PDX_ERR_CONFIG;
            }
            memcpy(be->tls, v, n + 1);
        } else if (strcmp(k, "max_chunk") == 0) {
            pdx_status_t st = ucx_parse_size(k, v, UCX_MIN_MAX_CHUNK,
                                             UCX_MAX_MAX_CHUNK,
                                             &be->max_chunk);
            if (st != PDX_OK) {
                return st;
            }
        } else if (strcmp(k, "keepalive_ms") == 0) {
            if (pdx_opt_uint(v, 0, 3600000, &be->keepalive_ms) != 0) {
                pdx_error("ucx: option keepalive_ms='%s': expected 0 (UCX's "
                          "own setting) or 1 to 3600000 ms", v);
                return PDX_ERR_CONFIG;
            }
        } else if (strcmp(k, "connect") == 0) {
            if (strcmp(v, "lazy") == 0) {
                be->lazy = 1;
            } else if (strcmp(v, "eager") == 0) {
                be->lazy = 0;
            } else {
                pdx_error("ucx: option connect='%s': expected lazy (an "
                          "endpoint at a peer's first use) or eager (at "
                          "its load)", v);
                return PDX_ERR_CONFIG;
            }
        } else if (strcmp(k, "peer_workers") == 0) {
            if (strcmp(v, "auto") == 0) {
                be->peer_workers = 1;
            } else if (strcmp(v, "off") == 0) {
                be->peer_workers = 0;
            } else {
                pdx_error("ucx: option peer_workers='%s': expected auto (a "
                          "worker of its own for each same-host peer over "
                          "shared memory) or off (one worker for all)", v);
                return PDX_ERR_CONFIG;
            }
        } else if (strcmp(k, "vram") == 0) {
            if (ucx_vram_parse_opt(v, &be->vram_opt) != PDX_OK) {
                pdx_error("ucx: option vram='%s': expected auto (natively "
                          "where UCX carries CUDA memory, else staged "
                          "through pinned host memory), native, staged or "
                          "off", v);
                return PDX_ERR_CONFIG;
            }
        } else if (strcmp(k, "stage_pool") == 0 ||
                   strcmp(k, "stage_chunk") == 0) {
            pdx_status_t st = ucx_parse_size(
                k, v, 64ull << 10, 16ull << 30,
                k[6] == 'p' ? &be->stage_pool : &be->stage_chunk);
            if (st != PDX_OK) {
                return st;
            }
        } else if (strcmp(k, "rma") == 0) {
            if (strcmp(v, "auto") == 0) {
                be->rma_mode = UCX_RMA_AUTO;
            } else if (strcmp(v, "served") == 0) {
                be->rma_mode = UCX_RMA_SERVED;
            } else if (strcmp(v, "native") == 0) {
                be->rma_mode = UCX_RMA_NATIVE;
            } else {
                pdx_error("ucx: option rma='%s': expected auto (host memory "
                          "served by its owner where UCX would emulate RMA "
                          "on the target's CPU, else UCX's RMA), served or "
                          "native", v);
                return PDX_ERR_CONFIG;
            }
        } else if (strcmp(k, "stage_window") == 0) {
            uint64_t w = 0;
            if (pdx_opt_uint(v, 1, 1024, &w) != 0) {
                pdx_error("ucx: option stage_window='%s': expected 1 to 1024 "
                          "staged chunks in flight per request", v);
                return PDX_ERR_CONFIG;
            }
            be->stage_window = (uint32_t)w;
        } else {
            pdx_error("ucx: unknown option '%s' (known: tls, max_chunk, "
                      "keepalive_ms, connect, peer_workers, vram, "
                      "stage_pool, stage_chunk, stage_window, rma)", k);
            return PDX_ERR_CONFIG;
        }
    }
    return PDX_OK;
}

static int ucx_has_pending_events(ucx_be_t *be)
{
    if (!ucx_list_empty(&be->inbox) &&
        UCX_CONTAINER(be->inbox.next, ucx_inmsg_t, link)->ready) {
        return 1;
    }
    for (ucx_link_t *l = be->peers.next;
         be->errors_hint && l != &be->peers; l = l->next) {
        if (UCX_CONTAINER(l, ucx_peer_t, link)->error_pending) {
            return 1;
        }
    }
    return 0;
}

/* Does the own worker of `peer` still have work to watch? Not once its
 * endpoint is gone and closed (a failed peer's): nothing of it is awaited
 * there. It stays until the peer is unloaded, progressed (late replies of
 * a peer that resumes land there and are dropped, rather than queue at the
 * peer for a FIFO nobody reads) and armed, but its being busy wakes
 * nobody (a receive FIFO its stopped sender left half-written would keep
 * it from ever arming). */
static int ucx_wpeer_live(const ucx_peer_t *peer)
{
    return peer->ep != NULL || peer->close_req != NULL ||
           peer->flush_req != NULL;
}

static unsigned ucx_progress_one(ucx_be_t *be, ucp_worker_h w,
                                 uint64_t done0, uint64_t *start_p);

/* A worker's receive queue moves (or armed): not blocked (any more).
 * `peer`: whose own worker it is, NULL for the main one. */
static void ucx_wstate_clear(ucx_wstate_t *ws, const char *peer)
{
    if (ws->stuck_since_ns == 0) {
        return;
    }
    if (ws->stuck_warned) {
        pdx_warn("ucx: %s%s%s: moves again after %.0f ms",
                 peer != NULL ? "peer " : "the main worker",
                 peer != NULL ? peer : "", peer != NULL ? "'s worker" : "",
                 (double)(pdx_now_ns() - ws->stuck_since_ns) / 1e6);
    }
    ws->stuck_since_ns = 0;
    ws->stuck_warned = 0;
}

/* What a progress of a worker found. */
static void ucx_wstate_note(ucx_wstate_t *ws, unsigned n, const char *peer)
{
    ws->last_events = n;
    if (n > 0) {
        ucx_wstate_clear(ws, peer);
    }
}

/* Arm one worker. UCX says busy when events wait, and progress takes them;
 * but a worker whose progress just found nothing and that still cannot be
 * armed waits on a peer: over shared memory, either a slot of its receive
 * FIFO that a sender took and has not filled (one in the middle of its
 * copy, microseconds; preempted; or stopped or killed there), or sends
 * queued for a peer whose own FIFO is full (a stopped peer takes none).
 * No event comes for either. Busy for UCX_STUCK_NS (polled again at
 * once), then left unarmed (UCS_OK): the agent's sleep ends at its timeout
 * (1 ms with requests in flight, else its idle bound), instead of a
 * progress thread spinning as long as the peer is stopped (the stall test
 * saw it at every SIGSTOP of a peer with READs in flight). Reported once
 * past UCX_STUCK_WARN_NS. */
static ucs_status_t ucx_arm_one(ucp_worker_h w, ucx_wstate_t *ws,
                                const char *peer)
{
    ucs_status_t s = ucp_worker_arm(w);
    if (s == UCS_OK) {
        ucx_wstate_clear(ws, peer);
    }
    if (s != UCS_ERR_BUSY || ws->last_events > 0) {
        return s;
    }
    uint64_t now = pdx_now_ns();
    if (ws->stuck_since_ns == 0) {
        ws->stuck_since_ns = now;
        return UCS_ERR_BUSY;
    }
    if (now - ws->stuck_since_ns < UCX_STUCK_NS) {
        return UCS_ERR_BUSY;
    }
    if (!ws->stuck_warned && now - ws->stuck_since_ns >= UCX_STUCK_WARN_NS) {
        ws->stuck_warned = 1;
        pdx_warn("ucx: %s%s%s: nothing moved for %.0f ms and it cannot sleep "
                 "on events (a same-host %s stopped or killed in the middle "
                 "of a message to it, or its sends wait for a peer that "
                 "takes none): polled at the agent's timeouts until it "
                 "moves; %s",
                 peer != NULL ? "peer " : "the main worker",
                 peer != NULL ? peer : "", peer != NULL ? "'s worker" : "",
                 (double)(now - ws->stuck_since_ns) / 1e6,
                 peer != NULL ? "peer" : "sender",
                 peer != NULL ? "only this peer's replies can wait behind it"
                              : "every same-host peer's requests and "
                                "notifications over UCX shared memory can "
                                "wait behind it");
    }
    return UCS_OK;
}

/* Progress every worker: peers' own first (a polling caller's replies),
 * then the main one, unless a request ended (the caller sees it at once;
 * the main worker's turn comes at the next pass). */
static unsigned ucx_worker_progress_bounded(ucx_be_t *be)
{
    uint64_t start = 0, done0 = be->reqs_done;
    unsigned total = 0;
    for (ucx_link_t *l = be->wpeers.next; l != &be->wpeers; l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, wlink);
        unsigned n = ucx_progress_one(be, peer->worker, done0, &start);
        ucx_wstate_note(&peer->ws, n, peer->name);
        total += n;
        if (be->reqs_done != done0) {
            return total;
        }
    }
    unsigned n = ucx_progress_one(be, be->worker, done0, &start);
    ucx_wstate_note(&be->main_ws, n, NULL);
    return total + n;
}

/* One pass over every worker, unbounded (destroy's drains). */
static unsigned ucx_progress_all_once(ucx_be_t *be)
{
    unsigned n = ucp_worker_progress(be->worker);
    for (ucx_link_t *l = be->wpeers.next; l != &be->wpeers; l = l->next) {
        n += ucp_worker_progress(UCX_CONTAINER(l, ucx_peer_t,
                                               wlink)->worker);
    }
    return n;
}

static unsigned ucx_progress_one(ucx_be_t *be, ucp_worker_h w,
                                 uint64_t done0, uint64_t *start_p)
{
    unsigned total = 0;
    /* Over tcp or sm one call can copy megabytes (emulated RMA) while the
     * agent lock is held: stop once UCX_PROGRESS_MAX_NS have passed,
     * counted from the end of call number UCX_PROGRESS_CLOCK_EVERY (all of
     * them busy), checked after every UCX_PROGRESS_CLOCK_EVERY calls after
     * it: a clock read is ~25 ns on the VM, a call that takes in one 8 KiB
     * fragment of a large READ ~300. (One call alone can still take longer:
     * UCX drains a whole receive FIFO, or purges every fragment queued for
     * a peer it just forced closed.) Not from the first call: a clock read
     * there sat on every small request's path (a get's reply, then the
     * caller's check): 8448-byte sm READs waited 2,511-2,571 ns without it
     * against 2,663-2,758 with it, five alternated runs. */
    /* *start_p: 0 in an idle pass, or one with a few messages (a reply a
     * caller polls for): it reads no clock. A request that ended ends the
     * call too: the caller polling it sees it at once, without one more
     * worker progress (~40-60 ns between the flush's callback and the
     * caller's return, 8448-byte sm READs). */
    for (int i = 0; i < UCX_PROGRESS_ROUNDS; i++) {
        unsigned n = ucp_worker_progress(w);
        total += n;
        if (n == 0 || be->reqs_done != done0) {
            break;
        }
        if (((i + 1) & (UCX_PROGRESS_CLOCK_EVERY - 1)) != 0) {
            continue;
        }
        uint64_t now = pdx_now_ns();
        if (*start_p == 0) {
            *start_p = now;
        } else if (now - *start_p > UCX_PROGRESS_MAX_NS) {
            break;
        }
    }
    return total;
}

pdx_status_t ucx_query(char *why, size_t why_len)
{
    unsigned major = 0, minor = 0, rel = 0;
    ucp_get_version(&major, &minor, &rel);
    if (major != UCP_API_MAJOR || minor < UCP_API_MINOR) {
        if (why != NULL && why_len > 0) {
            snprintf(why, why_len, "libucp %u.%u is older than the %u.%u "
                     "this module was built with", major, minor,
                     UCP_API_MAJOR, UCP_API_MINOR);
        }
        return PDX_ERR_UNAVAILABLE;
    }
    return PDX_OK;
}

/* May UCX use tcp with this transport list (NULL: UCX_TLS unset, all)? */
static int ucx_tls_has_tcp(const char *tls)
{
    if (tls == NULL || tls[0] == '^') {
        return 1;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "all") == 0 || strncmp(t, "tcp", 3) == 0) {
            return 1;
        }
    }
    return 0;
}

/* May this instance's UCX use tcp (its `tls` option, else UCX_TLS)? */
static int ucx_be_has_tcp(const ucx_be_t *be)
{
    return ucx_tls_has_tcp(be->tls[0] ? be->tls : getenv("UCX_TLS"));
}

/* Does a UCX_TLS value select a shared-memory (mm) transport? Unset, "all"
 * and exclusion lists ("^tcp") may. */
static int ucx_tls_has_mm(const char *tls)
{
    if (tls == NULL || tls[0] == '^') {
        return 1;
    }
    static const char *const mm[] = {"all", "sm", "shm", "posix", "sysv", "mm"};
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
            if (strcmp(t, mm[i]) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

static pdx_status_t ucx_config_set(ucp_config_t *cfg, const char *name,
                                   const char *value)
{
    ucs_status_t s = ucp_config_modify(cfg, name, value);
    if (s != UCS_OK) {
        pdx_error("ucx: setting UCX config %s=%s failed: %s", name, value,
                  ucs_status_string(s));
        return PDX_ERR_CONFIG;
    }
    return PDX_OK;
}

/* A new instance with the defaults, before its options. */
static ucx_be_t *ucx_be_new(const pdx_backend_host_t *host, size_t name_len)
{
    ucx_be_t *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return NULL;
    }
    be->host = *host;
    be->name_len = name_len;
    be->efd = -1;
    be->max_chunk = UCX_DEFAULT_MAX_CHUNK;
    be->keepalive_ms = UCX_DEFAULT_KEEPALIVE_MS;
    be->lazy = -1;
    be->peer_workers = 1;
    be->vram_opt = UCX_VRAM_OPT_AUTO;
    be->stage_pool = UCX_DEFAULT_STAGE_POOL;
    be->stage_chunk = UCX_DEFAULT_STAGE_CHUNK;
    be->stage_window = UCX_DEFAULT_STAGE_WINDOW;
    ucx_list_init(&be->vregs);
    ucx_list_init(&be->dregs);
    ucx_list_init(&be->wpeers);
    ucx_list_init(&be->peers);
    ucx_list_init(&be->zombies);
    ucx_list_init(&be->orphan_reqs);
    ucx_list_init(&be->req_cache);
    ucx_list_init(&be->orphan_sends);
    ucx_list_init(&be->inbox);
    return be;
}

/* UCX's configuration for this instance (its options over the
 * environment's): the transports, shared memory's error handling and
 * receive pool, keepalive. */
static pdx_status_t ucx_config_make(ucx_be_t *be, ucp_config_t *cfg)
{
    pdx_status_t st;
    if (be->tls[0] != '\0') {
        st = ucx_config_set(cfg, "TLS", be->tls);
        if (st != PDX_OK) {
            return st;
        }
    }
    /* Peer error mode drops transports that cannot report a dead peer;
     * shared memory (posix, sysv) can once its error handling is on. The
     * key is the mm transports' shared table (UCX_{POSIX,SYSV}_ERROR_HANDLING
     * in the environment); UCX warns if no mm transport is in the list. */
    if (ucx_tls_has_mm(be->tls[0] ? be->tls : getenv("UCX_TLS"))) {
        st = ucx_config_set(cfg, "MM_ERROR_HANDLING", "y");
        if (st != PDX_OK) {
            return st;
        }
        /* Each worker's shared-memory receive descriptors are allocated
         * (and touched) RX_BUFS_GROW at a time, 8 KiB each: UCX's 512 cost
         * every worker 4.3 MiB of resident memory, and a same-host peer
         * over shared memory has a worker of its own (ucx_peer_ep). 128
         * (1.3 MiB a worker, 16 peers measured) still covers the 64-slot
         * FIFO twice; the pool grows past it when descriptors are held. */
        if (getenv("UCX_MM_RX_BUFS_GROW") == NULL &&
            getenv("UCX_POSIX_RX_BUFS_GROW") == NULL &&
            getenv("UCX_SYSV_RX_BUFS_GROW") == NULL) {
            st = ucx_config_set(cfg, "MM_RX_BUFS_GROW", "128");
            if (st != PDX_OK) {
                return st;
            }
        }
    }
    /* UCX's tcp copies what it sends from a generic datatype (served host
     * memory's, ucx_dsvc_dt) in fragments of TX_SEG_SIZE, one send each:
     * at UCX's 8 KiB, served host memory moved 0.75-0.8 GB/s over a veth
     * pair against 1.8-2.8 at 64 KiB (pdx-bench vram, 1 and 16 MiB
     * pieces). An explicit UCX_TCP_TX_SEG_SIZE is left as it is. */
    if (ucx_be_has_tcp(be) && getenv("UCX_TCP_TX_SEG_SIZE") == NULL) {
        st = ucx_config_set(cfg, "TX_SEG_SIZE", "65536");
        if (st != PDX_OK) {
            return st;
        }
    }
    /* UCX 1.13's tcp handles the events of one epoll_wait (up to MAX_POLL,
     * 16) one after the other, and one may end an endpoint whose event is
     * still in the batch: the process aborts (tcp_iface.c:307, "Assertion
     * ep->conn_state != UCT_TCP_EP_CONN_STATE_CLOSED"; a freed endpoint's
     * memory without assertions). Seen in a served owner when a requester
     * was killed: the requester's "ready" (a rendezvous READ answer's) and
     * the reset of the owner's own connection to it came in one batch, and
     * UCX sent the answer's data on that connection from the first event
     * (oneway tcp READ, 1,000 kills beside two busy loops: 2 of 6 runs
     * aborted; 0 of 8 with UCX_TCP_MAX_POLL=1, 0 of 6 with this). One
     * event a wait leaves no stale one; pdx calls progress again while it
     * finds events. The key is MAX_POLL (no transport prefix): a UCX built
     * with CUDA has it for cuda_copy and cuda_ipc too, completions handled
     * per progress call, which pdx's loop repeats the same way. An
     * explicit UCX_TCP_MAX_POLL is left as it is. */
    if (ucx_be_has_tcp(be) && getenv("UCX_TCP_MAX_POLL") == NULL) {
        st = ucx_config_set(cfg, "MAX_POLL", "1");
        if (st != PDX_OK) {
            return st;
        }
    }
    /* UCX 1.13's tcp connects with a blocking connect() unless CONN_NB is
     * set, from the thread that makes the endpoint, pdx's progress thread
     * included: a peer host that does not answer holds it there for the
     * kernel's SYN retries. And a refused connect() leaks: uct_tcp_ep_create
     * returns the error with the endpoint and its socket left on the
     * interface until the worker goes (still so in UCX 1.22). UCX makes
     * such an endpoint itself when a peer's wireup message comes after the
     * peer died: test_vram --cycles (1,000 peers killed in the middle of
     * a staged READ, beside two busy loops) kept one such socket (TCP
     * CLOSE, blocking, an ephemeral port; "connect(...) failed: Connection
     * refused") in 5 of 5 runs. With a non-blocking connect the refusal
     * comes as an event and ends the endpoint through UCX's error path (0
     * of 7 runs kept one; UCX prints "connection establishment ... was
     * unsuccessful" for it). An explicit UCX_TCP_CONN_NB is left as it
     * is. */
    if (ucx_be_has_tcp(be) && getenv("UCX_TCP_CONN_NB") == NULL) {
        st = ucx_config_set(cfg, "CONN_NB", "y");
        if (st != PDX_OK) {
            return st;
        }
    }
    /* Keepalive is how UCX notices a dead peer with no traffic in flight
     * where nothing else tells it: over RDMA, a remote host that vanished.
     * On one host pdx has the peer's pidfd, and over TCP the kernel's RST
     * ends the endpoint at once (a host gone without one is found by the
     * store's lease, not by keepalive, which TCP only queues). Each probe
     * is activity that wakes the progress thread: at 1 s, 8 loaded peers
     * cost an idle agent 2.3-3.2 ms of CPU a second, at 5 s 1.2 (0 peers:
     * 0.8-1.1). UCX's default, 20 s, is slow for P/D handoffs over RDMA.
     * keepalive_ms=0 or an explicit UCX_KEEPALIVE_INTERVAL leaves UCX's. */
    if (be->keepalive_ms > 0 && getenv("UCX_KEEPALIVE_INTERVAL") == NULL) {
        char ka[32];
        snprintf(ka, sizeof(ka), "%" PRIu64 "ms", be->keepalive_ms);
        st = ucx_config_set(cfg, "KEEPALIVE_INTERVAL", ka);
        if (st != PDX_OK) {
            return st;
        }
    }
    return PDX_OK;
}

/* The UCP context: RMA, active messages (notifications) and wake-ups. */
static pdx_status_t ucx_context_open(ucx_be_t *be,
                                     const pdx_backend_host_t *host)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        pdx_error("ucx: reading UCX config failed: %s", ucs_status_string(s));
        return ucx_status(s);
    }
    pdx_status_t st = ucx_config_make(be, cfg);
    if (st == PDX_OK) {
        ucp_params_t params = {
            .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
            .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
            .name = host->agent_name,
        };
        s = ucp_init(&params, cfg, &be->ctx);
        if (s != UCS_OK) {
            pdx_error("ucx: ucp_init with tls=%s failed: %s",
                      be->tls[0] ? be->tls : "(default)",
                      ucs_status_string(s));
            st = be->tls[0] ? PDX_ERR_CONFIG : ucx_status(s);
        }
    }
    ucp_config_release(cfg);
    return st;
}

/* The instance's main worker, ready for peers: the AM header fits the
 * agent's name, the notification handler is set, and its own address is
 * parsed as a peer's would be (whether UCX may reach same-host peers over
 * shared memory: ucx_peer_wants_worker). Destroys the worker it made on
 * failure. */
static pdx_status_t ucx_main_worker(ucx_be_t *be,
                                    const pdx_backend_host_t *host)
{
    pdx_status_t st = ucx_worker_open(be, host->agent_name, &be->main_wctx,
                                      &be->worker);
    if (st != PDX_OK) {
        return st;
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    ucs_status_t s = ucp_worker_query(be->worker, &wa);
    if (s != UCS_OK) {
        pdx_error("ucx: worker query failed: %s", ucs_status_string(s));
        st = ucx_status(s);
        goto err_worker;
    }
    be->max_am_header = wa.max_am_header;
    if (wa.max_am_header < be->name_len) {
        pdx_error("ucx: agent name of %zu bytes exceeds the %zu-byte AM "
                  "header limit", be->name_len, wa.max_am_header);
        st = PDX_ERR_TOO_LARGE;
        goto err_worker;
    }
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = UCX_AM_ID_NOTIF,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = ucx_am_recv_cb,
        .arg = be,
    };
    s = ucp_worker_set_am_recv_handler(be->worker, &ap);
    if (s != UCS_OK) {
        pdx_error("ucx: setting the notification handler failed: %s",
                  ucs_status_string(s));
        st = ucx_status(s);
        goto err_worker;
    }
    ucp_address_t *self = NULL;
    size_t self_len = 0;
    s = ucp_worker_get_address(be->worker, &self, &self_len);
    if (s != UCS_OK) {
        pdx_error("ucx: getting the worker address failed: %s",
                  ucs_status_string(s));
        st = ucx_status(s);
        goto err_worker;
    }
    char vwhy[256] = "";
    if (ucx_validate_address(&be->vlocal, self, self_len, &be->self, vwhy,
                             sizeof(vwhy)) != PDX_OK) {
        /* Never seen; without it no peer gets a worker of its own. */
        pdx_debug("ucx: own worker address not understood: %s", vwhy);
        memset(&be->self, 0, sizeof(be->self));
    }
    ucp_worker_release_address(be->worker, self);
    return PDX_OK;

err_worker:
    ucp_worker_destroy(be->worker);
    be->worker = NULL;
    free(be->main_wctx.addr);
    be->main_wctx.addr = NULL;
    return st;
}

pdx_status_t ucx_create(const pdx_backend_host_t *host,
                        const pdx_option_t *opts, size_t nopts, void **be_p)
{
    if (host == NULL || host->agent_name == NULL || be_p == NULL ||
        (nopts > 0 && opts == NULL)) {
        pdx_error("ucx: create: missing host, agent name or output");
        return PDX_ERR_INVALID;
    }
    size_t name_len = strlen(host->agent_name);
    if (name_len == 0 || name_len > UCX_MAX_NAME) {
        pdx_error("ucx: agent name of %zu bytes (1..%u allowed)", name_len,
                  UCX_MAX_NAME);
        return PDX_ERR_INVALID;
    }
    ucx_be_t *be = ucx_be_new(host, name_len);
    if (be == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = ucx_parse_opts(be, opts, nopts);
    if (st != PDX_OK) {
        goto err_free;
    }
    if (be->lazy < 0) {
        /* With tcp UCX reaches every peer, so an endpoint made at load
         * could never decline one: make it at first use (loading a peer
         * is then a copy of its address; UCX's endpoint creation queries
         * every interface and wires up a reply endpoint at the peer).
         * Without tcp (shared memory or RDMA alone) whether UCX reaches a
         * peer decides at load whether the agent uses another backend. */
        be->lazy = ucx_be_has_tcp(be);
    }
    /* Out of fds, UCX fails (or aborts) naming another cause. */
    st = ucx_fd_room(UCX_FDS_INSTANCE, "create");
    if (st != PDX_OK) {
        goto err_free;
    }
    char vwhy[256] = "";
    st = ucx_vlocal_init(&be->vlocal, vwhy, sizeof(vwhy));
    if (st != PDX_OK) {
        pdx_error("ucx: %s", vwhy);
        goto err_free;
    }
    st = ucx_context_open(be, host);
    if (st != PDX_OK) {
        goto err_free;
    }
    st = ucx_vram_init(be);
    if (st != PDX_OK) {
        goto err_ctx;
    }
    /* Every worker's wake-up fds go into this one set, the fd the agent
     * sleeps on (UCX's external event fd). */
    be->efd = epoll_create1(EPOLL_CLOEXEC);
    if (be->efd < 0) {
        pdx_error("ucx: epoll_create1: %s", strerror(errno));
        st = PDX_ERR_NOMEM;
        goto err_ctx;
    }
    st = ucx_main_worker(be, host);
    if (st != PDX_OK) {
        goto err_efd;
    }
    pdx_debug("ucx: created instance for %s (tls=%s max_chunk=%" PRIu64 ")",
              host->agent_name, be->tls[0] ? be->tls : "(default)",
              be->max_chunk);
    *be_p = be;
    return PDX_OK;

err_efd:
    close(be->efd);
err_ctx:
    ucp_cleanup(be->ctx);
err_free:
    free(be);
    return st;
}

/* Instances whose worker is left to the process's exit (see ucx_destroy),
 * kept reachable so leak checkers report them as held, not lost. */
static pthread_mutex_t g_leaked_lock = PTHREAD_MUTEX_INITIALIZER;
static ucx_be_t *g_leaked;

/* Free every request record on a list (destroy, worker gone). */
static void ucx_req_list_free(ucx_link_t *head)
{
    while (!ucx_list_empty(head)) {
        ucx_link_t *l = head->next;
        ucx_list_del(l);
        free(UCX_CONTAINER(l, ucx_req_t, link));
    }
}

static void ucx_keep_leaked(ucx_be_t *be)
{
    pthread_mutex_lock(&g_leaked_lock);
    be->leaked_next = g_leaked;
    g_leaked = be;
    pthread_mutex_unlock(&g_leaked_lock);
}

void ucx_destroy(void *bev)
{
    ucx_be_t *be = bev;
    if (be == NULL) {
        return;
    }
    /* The agent disconnects every peer first; this is the safety net. */
    while (!ucx_list_empty(&be->peers)) {
        ucx_peer_t *peer = UCX_CONTAINER(be->peers.next, ucx_peer_t, link);
        pdx_warn("ucx: destroy: peer %s still connected", peer->name);
        ucx_peer_disconnect(be, peer);
    }
    /* Let closes finish (queued notifications flush) for a bounded time:
     * destroy is the one op allowed to wait. A flush still pending at the
     * deadline is forced (a hung peer), so UCX holds no request for any
     * endpoint when the worker goes. */
    uint64_t deadline = pdx_after_ns(UCX_CLOSE_TIMEOUT_NS);
    for (ucx_link_t *l = be->zombies.next; l != &be->zombies; l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
        if (peer->close_deadline > deadline) {
            peer->close_deadline = deadline;
        }
    }
    while (!ucx_list_empty(&be->zombies) && pdx_before(deadline)) {
        ucx_progress_all_once(be);
        ucx_reap_zombies(be);
    }
    /* Flushes that did not finish: forced now, and a short bounded
     * progress lets the forced closes discard their lanes. */
    int forced = 0;
    for (ucx_link_t *l = be->zombies.next; l != &be->zombies; l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
        if (peer->flush_req != NULL) {
            pdx_warn("ucx: peer %s: endpoint flush did not finish within "
                     "%llu ms; forcing the endpoint closed", peer->name,
                     UCX_CLOSE_TIMEOUT_NS / 1000000ull);
            ucx_ep_close_step(be, peer, 1);
            forced = 1;
        }
    }
    deadline = pdx_after_ns(UCX_FORCE_REAP_NS);
    while (forced && !ucx_list_empty(&be->zombies) &&
           pdx_before(deadline)) {
        ucx_progress_all_once(be);
        ucx_reap_zombies(be);
    }
    for (ucx_link_t *l = be->zombies.next; l != &be->zombies; l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
        if (peer->close_req != NULL) {
            /* Freeing an unfinished request lets UCX release it when it
             * completes (or when the worker goes). */
            pdx_warn("ucx: peer %s: endpoint close did not finish within "
                     "%llu ms", peer->name,
                     UCX_CLOSE_TIMEOUT_NS / 1000000ull);
            ucp_request_free(peer->close_req);
            peer->close_req = NULL;
        }
    }
    /* Served and staged answers in flight: forced out (ucx_dsvc_quiesce,
     * ucx_svc_quiesce), bounded. */
    deadline = pdx_after_ns(UCX_FORCE_REAP_NS);
    while ((ucx_dsvc_quiesce(be) | ucx_svc_quiesce(be)) &&
           pdx_before(deadline)) {
        ucx_progress_all_once(be);
    }
    /* Wireup messages still queued (a reply to a peer's connection request)
     * must go before the worker: UCX 1.13 asserts purging a queued wireup
     * reply ("got REP message"). A bounded drain: until progress has
     * been idle for 1024 calls, at most UCX_CLOSE_TIMEOUT_NS. */
    deadline = pdx_after_ns(UCX_CLOSE_TIMEOUT_NS);
    for (int idle = 0; idle < 1024 && pdx_before(deadline);) {
        idle = ucx_progress_all_once(be) == 0 ? idle + 1 : 0;
    }
    /* A rendezvous receive still in flight (a peer stopped between its
     * "ready to send" and its data) sits on one of UCX's endpoints, and
     * UCX 1.13 asserts destroying a worker that holds one (ucp_ep.c:437).
     * The endpoints we know are closed by now (forced closes purge their
     * receives): what remains came over one UCX made for the peer's own
     * connection, which we cannot close. The worker is left, as for a
     * wireup reply below. */
    if (be->rx_rndv > 0) {
        pdx_warn("ucx: destroy: %u rendezvous receives still wait for their "
                 "data (a peer stopped in the middle of a transfer?): the UCX "
                 "worker is left to the process's exit (UCX 1.13 asserts "
                 "destroying it)", be->rx_rndv);
        ucx_keep_leaked(be);
        return;
    }
    /* UCX 1.13 over tcp: a wireup reply queued to a peer that died cannot
     * go, and ucp_worker_destroy asserts purging it ("got REP message" in
     * uct_tcp_ep_pending_purge; fixed upstream by openucx/ucx#8175, not in
     * 1.13). The reply can sit on an endpoint UCX made for the peer's own
     * connection request, one we never see, so a clean close of ours does
     * not rule it out: seen after the drain above in 1 of 24 shutdown
     * cases under load (a forced close) and in CI with a same-process peer
     * destroyed first (no forced close). When tcp may be in use and a peer
     * failed, timed out or died, or an endpoint was forced, the worker and
     * everything UCX may still reach are left in place: a bounded leak of
     * one instance per such destroy (it is mostly the process's exit),
     * never an abort. Still open: a remote that connected to us, was never
     * loaded here, and died in wireup (UCX can then abort on destroy). */
    if ((be->forced > 0 || be->lost > 0) && ucx_be_has_tcp(be)) {
        ucx_keep_leaked(be);
        pdx_debug("ucx: destroy: a peer failed and tcp may hold a wireup "
                  "reply to it: the UCX worker is left to the process's "
                  "exit (UCX 1.13 asserts destroying it)");
        return;
    }
    /* Destroying the workers completes (or drops) every UCX request, so
     * the lists below are ours alone afterwards. */
    for (ucx_link_t *l = be->zombies.next; l != &be->zombies; l = l->next) {
        ucx_peer_worker_destroy(be, UCX_CONTAINER(l, ucx_peer_t, link));
    }
    ucp_worker_destroy(be->worker);
    ucx_stage_worker_gone(be, be->worker);
    ucx_dram_worker_gone(be, be->worker);
    free(be->main_wctx.addr);
    close(be->efd);
    while (!ucx_list_empty(&be->zombies)) {
        ucx_link_t *l = be->zombies.next;
        ucx_list_del(l);
        ucx_peer_free(UCX_CONTAINER(l, ucx_peer_t, link));
    }
    /* Served requests still point at their request records (released in
     * flight: orphans): they go first. */
    ucx_dram_fini(be);
    ucx_req_list_free(&be->orphan_reqs);
    ucx_req_list_free(&be->req_cache);
    ucx_send_list_free(&be->orphan_sends);
    while (!ucx_list_empty(&be->inbox)) {
        ucx_link_t *l = be->inbox.next;
        ucx_list_del(l);
        free(UCX_CONTAINER(l, ucx_inmsg_t, link));
    }
    ucx_stage_fini(be);
    ucx_vram_fini(be);
    ucp_cleanup(be->ctx);
    free(be);
}

pdx_status_t ucx_conn_info(void *bev, void **buf_p, size_t *len_p)
{
    ucx_be_t *be = bev;
    ucp_address_t *addr = NULL;
    size_t len = 0;
    if (be == NULL || buf_p == NULL || len_p == NULL) {
        return PDX_ERR_INVALID;
    }
    ucs_status_t s = ucp_worker_get_address(be->worker, &addr, &len);
    if (s != UCS_OK) {
        pdx_error("ucx: getting the worker address failed: %s",
                  ucs_status_string(s));
        return ucx_status(s);
    }
    void *buf = malloc(len);
    if (buf == NULL) {
        ucp_worker_release_address(be->worker, addr);
        return PDX_ERR_NOMEM;
    }
    memcpy(buf, addr, len);
    ucp_worker_release_address(be->worker, addr);
    *buf_p = buf;
    *len_p = len;
    return PDX_OK;
}

/* Free disconnected peers whose endpoint close has finished. */
static void ucx_reap_zombies(ucx_be_t *be)
{
    ucx_link_t *l = be->zombies.next;
    while (l != &be->zombies) {
        ucx_link_t *next = l->next;
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
        ucx_ep_close_step(be, peer, 0);
        if (ucx_close_done(peer)) {
            ucx_list_del(l);
            ucx_peer_release(be, peer);
        }
        l = next;
    }
}

int ucx_progress(void *bev)
{
    ucx_be_t *be = bev;
    if (be == NULL) {
        return 0;
    }
    unsigned n = ucx_worker_progress_bounded(be);
    int events = n > (unsigned)(INT32_MAX / 2) ? INT32_MAX / 2 : (int)n;
    events += ucx_deliver_errors(be);
    events += ucx_deliver_inbox(be);
    events += ucx_stage_progress(be);
    events += ucx_dsvc_progress(be);
    for (ucx_link_t *l = be->peers.next; be->stalled_hint && l != &be->peers;
         l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
        if (peer->stage_stalled) {
            peer->stage_stalled = 0;
            ucx_peer_give_up(be, peer, "an aborted staged transfer got no "
                                       "answer from it for a second");
            events++;
        }
    }
    be->stalled_hint = 0;
    ucx_reap_zombies(be);
    /* A failed peer's forced close: its request is freed once done (the
     * worker then stops counting as live; see ucx_wpeer_live). */
    for (ucx_link_t *l = be->wpeers.next; l != &be->wpeers; l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, wlink);
        if (peer->ep == NULL && peer->close_req != NULL) {
            (void)ucx_close_done(peer);
        }
    }
    return events;
}

int ucx_event_fd(void *bev)
{
    ucx_be_t *be = bev;
    return be != NULL ? be->efd : -1;
}

pdx_status_t ucx_arm(void *bev)
{
    ucx_be_t *be = bev;
    if (be == NULL) {
        return PDX_ERR_INVALID;
    }
    /* Queued notifications and errors do not wake the fd, nor does the
     * end of a staged transfer's device copy (polled while one runs). */
    if (ucx_has_pending_events(be) || ucx_stage_copying(be) ||
        ucx_dsvc_pending(be)) {
        return PDX_ERR_BUSY;
    }
    ucs_status_t s = ucx_arm_one(be->worker, &be->main_ws, NULL);
    for (ucx_link_t *l = be->wpeers.next; s == UCS_OK && l != &be->wpeers;
         l = l->next) {
        ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, wlink);
        if (ucx_wpeer_live(peer)) {
            s = ucx_arm_one(peer->worker, &peer->ws, peer->name);
        } else {
            (void)ucp_worker_arm(peer->worker); /* drains its fds */
        }
    }
    if (s == UCS_ERR_BUSY) {
        return PDX_ERR_BUSY;
    }
    if (s != UCS_OK) {
        pdx_error("ucx: arming the worker failed: %s", ucs_status_string(s));
        return ucx_status(s);
    }
    return PDX_OK;
}

void ucx_describe(void *bev, char *buf, size_t len)
{
    ucx_be_t *be = bev;
    if (buf == NULL || len == 0) {
        return;
    }
    if (be == NULL) {
        snprintf(buf, len, "ucx %s", ucp_get_version_string());
        return;
    }
    char tls[256] = "";
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *f = open_memstream(&dump, &dump_len);
    int lanes = 0;
    if (f != NULL) {
        if (!ucx_list_empty(&be->peers) &&
            UCX_CONTAINER(be->peers.next, ucx_peer_t, link)->ep != NULL) {
            ucp_ep_print_info(UCX_CONTAINER(be->peers.next, ucx_peer_t,
                                            link)->ep, f);
            lanes = 1;
        } else {
            ucp_context_print_info(be->ctx, f);
        }
        fclose(f);
        FILE *in = fmemopen(dump, dump_len, "r");
        if (in != NULL && dump_len > 0) {
            ucx_describe_tls(in, lanes, tls, sizeof(tls));
        }
        if (in != NULL) {
            fclose(in);
        }
        free(dump);
    }
    size_t npeers = 0, neps = 0;
    for (ucx_link_t *l = be->peers.next; l != &be->peers && npeers < 1000000;
         l = l->next) {
        npeers++;
        neps += UCX_CONTAINER(l, ucx_peer_t, link)->ep != NULL;
    }
    unsigned npw = 0; /* peers' own workers, closing ones included */
    for (ucx_link_t *l = be->wpeers.next; l != &be->wpeers && npw < 1000000;
         l = l->next) {
        npw++;
    }
    snprintf(buf, len,
             "ucx %s tls=%s %s=%s max_chunk=%" PRIu64 " keepalive_ms=%"
             PRIu64 "%s connect=%s peers=%zu endpoints=%zu "
             "peer_workers=%s(%u) rma=%s",
             ucp_get_version_string(), be->tls[0] ? be->tls : "(default)",
             lanes ? "lanes" : "resources", tls[0] ? tls : "?",
             be->max_chunk, be->keepalive_ms,
             be->keepalive_ms > 0 && getenv("UCX_KEEPALIVE_INTERVAL") != NULL
                 ? " (UCX_KEEPALIVE_INTERVAL wins)" : "",
             be->lazy ? "lazy" : "eager", npeers, neps,
             be->peer_workers ? "auto" : "off", npw,
             be->rma_mode == UCX_RMA_SERVED   ? "served"
             : be->rma_mode == UCX_RMA_NATIVE ? "native"
                                              : "auto");
    size_t used = strlen(buf);
    if (used + 3 < len) {
        buf[used++] = ';';
        buf[used++] = ' ';
        ucx_vram_describe(be, buf + used, len - used);
    }
    used = strlen(buf);
    if (used + 3 < len && be->dram != NULL) {
        buf[used++] = ';';
        buf[used++] = ' ';
        ucx_dsvc_describe(be, buf + used, len - used);
    }
}
