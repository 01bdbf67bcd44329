/* Private to glm52-pd-node: the state of a node and its jobs, and the
 * layers its files form, each calling only those below it:
 *   node.c    the command line, setup, the hello, teardown
 *   msg.c     the event loop and the driver's messages
 *   job.c     a job's state machine (lookup, load, verify, compute,
 *             decode, save, handoff; cancellations)
 *   reply.c   replies and stats to the driver
 *   blocks.c  the arena block allocator, held blocks, quarantine
 *   gpu.c     GPU arenas (kv.memory "vram"): the driver, the host mirror
 *   log.c     pdx's log lines and the node's own (the bottom) */
#ifndef GLM52_NODE_H
#define GLM52_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include <pdx/kv_config.h>
#include <pdx/kv_connector.h>
#include <pdx/log.h>

#include "pd_model.h"
#include "pd_wire.h"

#define QUANTUM_TOKENS 512 /* tokens computed or verified per job per turn */
#define ARENA_ALIGN 4096
/* Blocks of an aborted load are filled with this byte and kept out of use
 * for a while; a byte that changed meanwhile landed after the abort. */
#define CANARY_BYTE 0xa5
#define QUARANTINE_MS 50.0
#define QUARANTINE_PASSES 3
/* How long a job waits, after pdx_kv_load_abort, for pdx_kv_load_check to
 * report the final state; past it the blocks are never reused (leaked) and
 * the job fails. */
#define ABORT_DEADLINE_MS 10000.0

/* ---- node state ---- */

typedef enum job_kind { JOB_PREFILL = 0, JOB_DECODE = 1 } job_kind_t;

/* Where the driver asked a job to be cancelled (soak runs). */
typedef enum job_abort {
    ABORT_NONE = 0,
    ABORT_REJECT, /* after the lookup, before reading: reject the handoff */
    ABORT_LOAD,   /* while the load is in flight: pdx_kv_load_abort */
} job_abort_t;

/* What an aborted job actually did; also the stats' index. */
typedef enum abort_done {
    ABORTED_LOAD = 0,   /* load aborted in flight */
    ABORTED_REJECT = 1, /* handoff rejected unread */
    ABORTED_AFTER = 2,  /* the load had finished: cancelled after it */
    ABORTED_KINDS = 3,
} abort_done_t;

/* The names of abort_done_t (reply.c). */
extern const char *const g_abort_names[ABORTED_KINDS];

typedef enum job_state {
    J_ALLOC,    /* waiting for free blocks */
    J_LOOKUP,   /* asking the connector (may be pending) */
    J_LOAD,     /* load in flight */
    J_ABORTING, /* load_abort asked; load_check not final yet: blocks busy */
    J_VERIFY,   /* comparing loaded blocks with recomputation */
    J_COMPUTE,  /* the stand-in writes the prompt tokens not loaded */
    J_DECODE,   /* generating tokens (decode only) */
    J_SAVE_START,
    J_SAVE, /* saving to the offload child */
    J_END,
} job_state_t;

typedef struct job {
    struct job *next;
    job_kind_t kind;
    job_state_t state;
    char req[PDX_KV_REQ_ID_MAX];
    int sid, turn;
    uint64_t *tok, *ph; /* tokens and their prefix hashes */
    size_t n, cap;      /* tokens with KV written or given; capacity */
    size_t prompt;
    uint32_t gen;
    char *params; /* the peer's handoff, or NULL */
    uint64_t *blocks;
    size_t nblocks;
    pdx_block_hash_t *hashes;
    size_t nfull;
    int has_tail;
    pdx_block_hash_t tail;
    uint32_t tail_tokens;
    pdx_kv_match_t match;
    size_t loaded, cursor, vend;
    bool load_failed;
    bool blocks_busy; /* a load or save still uses them */
    job_abort_t abort_at;
    uint32_t abort_polls; /* load checks still in progress before aborting */
    uint32_t polls;
    /* J_ABORTING: the abort call's time, when it was asked, the deadline,
     * and whether the job had already failed (reply sent, only the blocks
     * left to release) rather than been cancelled by the driver. */
    double abort_call_ms, abort_t0, abort_deadline;
    bool abort_after_fail;
    bool abort_completed; /* the load had completed before the abort */
    uint64_t verified_blocks, verified_bytes, diff_bytes;
    double t0, t_phase, deadline;
    double ms_alloc, ms_lookup, ms_load, ms_verify, ms_compute, ms_decode,
        ms_save;
} job_t;

typedef struct held_blocks {
    struct held_blocks *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t *blocks;
    size_t n;
} held_blocks_t;

/* Blocks of an aborted load, canary-filled, waiting to be checked and
 * returned to the free list. */
typedef struct quarantine {
    struct quarantine *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t *blocks; /* all the job's blocks */
    size_t n;
    size_t ncanary; /* the first ncanary were targets of the load */
    double release_at;
    int passes;
} quarantine_t;

typedef struct gpu_api gpu_api_t;

typedef struct node {
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    void *mem; /* DRAM arenas */
    size_t mem_len;
    /* GPU arenas (gpu.c): the driver, the arenas' device address, the host
     * mirror the model stand-in writes and checks, copies made */
    gpu_api_t *gpu;
    uint64_t gpu_base;
    uint8_t *mirror;
    uint64_t gpu_copies;
    pd_model_t model;
    pdx_kv_connector_h conn;
    pdx_hasher_h hasher;
    uint32_t B;
    pd_chan_t chan;
    uint64_t *free_ids;
    size_t nfree;
    job_t *jobs, *jobs_tail;
    held_blocks_t *held;
    quarantine_t *quarantine;
    double job_timeout_ms;
    bool quit;
    bool refused; /* the peer's connect was refused */
    /* drain request in progress */
    bool draining;
    double drain_deadline;
    /* counters */
    uint64_t freed[3];
    uint64_t jobs_ok, jobs_failed;
    uint64_t peak_used;
    uint64_t aborted[ABORTED_KINDS];
    uint64_t rejects_sent;     /* handoffs this node rejected itself */
    uint64_t late_bytes;       /* canary bytes changed after a load abort */
    uint64_t canary_blocks;    /* blocks checked after a load abort */
    double abort_call_ms_max;  /* longest pdx_kv_load_abort call */
    double abort_final_ms_max; /* longest abort -> final load_check state */
    uint64_t abort_completed;  /* aborted loads that had completed first */
    uint64_t abort_stuck;      /* aborts with no final state by the deadline */
} node_t;

/* ---- gpu.c: GPU arenas through the CUDA driver (kv.memory "vram") */

/* The driver loaded (PDX_CUDA_DRIVER_LIB, else libcuda.so.1), the config's
 * device's primary context current, `size` bytes of its memory for the
 * arenas (*base_p) and a host mirror of them. 0, or -1 with `why`. */
int gpu_arenas(node_t *nd, size_t size, uint64_t *base_p, char *why,
               size_t len);
/* Point the model stand-in's arena views at the mirror (after
 * pd_model_init on the carved layout). Nothing without GPU arenas. */
void gpu_rebase(node_t *nd);
/* Blocks `ids` of every arena, mirror to GPU (push: before pdx may read
 * them) or GPU to mirror (pull: after pdx wrote them). 0, or -1 (said).
 * Nothing to do (0) without GPU arenas. */
int gpu_push(node_t *nd, const uint64_t *ids, size_t n);
int gpu_pull(node_t *nd, const uint64_t *ids, size_t n);
/* The GPU memory and the mirror freed (after the connector is gone). */
void gpu_close(node_t *nd);

/* ---- log.c: pdx lines to stderr, error lines kept for the driver */

/* The pdx log handler (pdx_log_set_handler). */
void log_sink(void *arg, pdx_log_level_t level, const char *msg);
/* The tag of this node's lines ("P", "D"). */
void log_set_tag(const char *tag);
/* How many pdx error lines so far: a mark for log_since. */
uint64_t log_mark(void);
/* The pdx error lines logged since `mark`, joined by "; ". */
void log_since(uint64_t mark, char *buf, size_t len);
/* A line of the node's own to stderr. */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- blocks.c: the arena's free block ids, held and quarantined blocks */

/* Take n free ids into out; -1 (nothing taken) when fewer are free. */
int blocks_take(node_t *nd, size_t n, uint64_t *out);
void blocks_put(node_t *nd, const uint64_t *ids, size_t n);
/* Fill block `id` (all arenas) with CANARY_BYTE. */
void canary_fill(node_t *nd, uint64_t id);
/* Check and free quarantined blocks whose time is up. */
void quarantine_step(node_t *nd);
/* pdx_kv_poll_freed's callback: a held request's blocks are free. */
void on_freed(void *arg, const char *req_id, pdx_kv_free_reason_t why);

/* ---- reply.c: messages to the driver */

const char *role_name(pdx_kv_role_t r);
const char *source_name(pdx_kv_source_t s);
/* Send and free `msg`; a failed channel ends the node. */
void send_msg(node_t *nd, cJSON *msg);
/* A reply {op, ok}. */
cJSON *reply_head(const char *op, bool ok);
/* The node's counters, its pool's, its agent's and its store's. */
cJSON *stats_json(node_t *nd);

/* ---- job.c: one request's state machine */

void job_free(node_t *nd, job_t *j);
const char *job_op(const job_t *j);
/* Fail the job: the reply with `fmt` and the pdx lines since `mark`. */
void job_fail(node_t *nd, job_t *j, uint64_t mark, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* One bounded slice of a job's work (see job.c). */
bool job_step(node_t *nd, job_t *j, bool *alloc_blocked);

/* ---- msg.c: the event loop */

/* Serve the driver and the jobs until quit or the channel fails. */
void run(node_t *nd);

#endif
