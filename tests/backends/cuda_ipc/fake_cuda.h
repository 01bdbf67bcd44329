/* A fake CUDA driver for tests on machines without a GPU: libpdx_fake_cuda.so
 * exports the driver entry points the cuda_ipc backend loads, under the
 * names cuda.h maps them to, with the real prototypes (it includes cuda.h).
 *
 * "Device memory" is host memory backed by memfds, so an IPC handle or an
 * exported VMM fd really maps the same pages at a second address. Copies are
 * queued per stream and run only when an event or stream is waited on, so
 * asynchrony is visible: an event's first query after a record reports
 * CUDA_ERROR_NOT_READY. It checks what the real driver checks and a bit
 * more: a current context for every call that needs one, copies on a stream
 * of the current context, device pointers on the right device.
 *
 * Environment, read at cuInit: FAKE_CUDA_DEVICES (default 2; 0 makes cuInit
 * fail with CUDA_ERROR_NO_DEVICE), FAKE_CUDA_VISIBLE ("2,0": ordinal i is
 * physical device list[i], as CUDA_VISIBLE_DEVICES does). */
#ifndef PDX_FAKE_CUDA_H
#define PDX_FAKE_CUDA_H

#include <stddef.h>

#define FAKE_API __attribute__((visibility("default")))

typedef struct fake_cuda_stats {
    int ctx_retained; /* primary context references held */
    int ctx_depth;    /* this thread's context stack depth */
    int streams;      /* live streams */
    int events;       /* live events */
    int ipc_opens;    /* open legacy IPC mappings */
    int vmm_maps;     /* live VMM mappings */
    int vmm_handles;  /* live VMM allocation handles */
    int host_regs;    /* cuMemHostRegister'd ranges */
    long copies;      /* async copies queued so far */
    long peer_copies; /* of which cuMemcpyPeerAsync */
} fake_cuda_stats_t;

FAKE_API void fake_cuda_stats(fake_cuda_stats_t *s);

/* Strict mode: memory that was opened through IPC (or imported from an
 * exported fd) may no longer be copied through the exporter's address, as
 * if exporter and importer were two processes. For tests where only the
 * importer posts copies. */
FAKE_API void fake_cuda_strict(int on);

/* Physical UUID byte pattern of fake device `phys`. */
FAKE_API void fake_cuda_uuid(int phys, unsigned char uuid[16]);

#endif
