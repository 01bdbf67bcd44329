/* cuda_ipc: the pure parts, testable without a driver: the connection-info
 * and region-key blobs, device mapping by UUID, the same-host check and
 * merging of contiguous pieces.
 *
 * Both blobs are little-endian with fixed-width integers and start with a
 * magic and their own version, independent of the agent's blob version.
 *
 * conn_info v1:
 *   u32 magic "PDCI"   u16 version   u16 ndev
 *   u32 pid            u64 process token
 *   u16 host_id_len    host_id bytes (1..255, no NUL)
 *   ndev x 16 B device UUIDs, in this process's ordinal order
 *
 * region key v1 (mem_pack), 130 B + host id:
 *   0   u32 magic "PDCK"    4  u16 version    6  u16 kind (cipc_kind_t)
 *   8   16 B device UUID    24 u32 owner pid  28 i32 exported fd (VMM) or -1
 *   32  u64 allocation base (owner's VA)      40 u64 allocation size
 *   48  u64 region offset from the base       56 u64 region length
 *   64  64 B legacy IPC handle (zeros for other kinds)
 *   128 u16 host_id_len   130 host_id bytes
 */
#ifndef PDX_CUDA_IPC_WIRE_H
#define PDX_CUDA_IPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/backend.h>

#define CIPC_UUID_LEN 16
#define CIPC_HANDLE_LEN 64 /* CU_IPC_HANDLE_SIZE */
#define CIPC_HOST_ID_MAX 255
#define CIPC_MAX_DEVICES 64

#define CIPC_CONN_MAGIC 0x49434450u /* "PDCI" little-endian */
#define CIPC_CONN_VERSION 1u
#define CIPC_KEY_MAGIC 0x4b434450u /* "PDCK" little-endian */
#define CIPC_KEY_VERSION 1u
#define CIPC_KEY_FIXED_LEN 130u

typedef enum cipc_kind {
    CIPC_KIND_HOST = 0,   /* DRAM: not reachable by the peer */
    CIPC_KIND_LEGACY = 1, /* cudaMalloc-style, cuIpcGetMemHandle */
    CIPC_KIND_VMM_FD = 2, /* cuMemCreate'd, exported as a POSIX fd */
} cipc_kind_t;

typedef struct cipc_conn {
    char host_id[CIPC_HOST_ID_MAX + 1];
    uint32_t pid;
    uint64_t token; /* tells two processes with one pid apart (pid ns) */
    uint16_t ndev;
    uint8_t uuid[CIPC_MAX_DEVICES][CIPC_UUID_LEN];
} cipc_conn_t;

typedef struct cipc_key {
    uint16_t kind; /* cipc_kind_t */
    uint8_t uuid[CIPC_UUID_LEN];
    uint32_t pid;
    int32_t fd;
    uint64_t base;
    uint64_t alloc_size;
    uint64_t offset;
    uint64_t len;
    uint8_t handle[CIPC_HANDLE_LEN];
    char host_id[CIPC_HOST_ID_MAX + 1];
} cipc_key_t;

/* Encode into a malloc'd buffer. PDX_ERR_INVALID for a host id that is empty
 * or too long, or too many devices. */
pdx_status_t cipc_conn_encode(const cipc_conn_t *conn, void **buf_p,
                              size_t *len_p);
/* Decode: PDX_ERR_CORRUPT (framing, bounds, magic) or PDX_ERR_VERSION, with
 * a reason in `why`; never reads outside [buf, buf+len). */
pdx_status_t cipc_conn_decode(const void *buf, size_t len, cipc_conn_t *out,
                              char *why, size_t why_len);

pdx_status_t cipc_key_encode(const cipc_key_t *key, void **buf_p,
                             size_t *len_p);
pdx_status_t cipc_key_decode(const void *buf, size_t len, cipc_key_t *out,
                             char *why, size_t why_len);

/* Local ordinal of the device with `uuid` among this process's devices
 * (`local[i]` is the UUID of ordinal i), or -1 when it is not visible here.
 * Ordinals differ between processes (CUDA_VISIBLE_DEVICES); UUIDs do not. */
int cipc_uuid_to_ordinal(const uint8_t (*local)[CIPC_UUID_LEN], size_t n,
                         const uint8_t uuid[CIPC_UUID_LEN]);

/* 1 when both host ids are non-empty and equal (an unknown id never matches:
 * CUDA IPC to another host fails late and obscurely). */
int cipc_same_host(const char *a, const char *b);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it. */
void cipc_uuid_format(const uint8_t uuid[CIPC_UUID_LEN], char *buf, size_t len);

/* The merged run starting at iov[*pos]: zero-length pieces are skipped, and
 * following pieces are merged while contiguous on both sides and in the same
 * local and remote regions. Advances *pos past the run. Returns 0 when no
 * piece is left. */
int cipc_iov_next(const pdx_backend_iov_t *iov, size_t n, size_t *pos,
                  pdx_backend_iov_t *run);

/* Merge in place (out may equal in); returns the number of runs. */
size_t cipc_iov_merge(const pdx_backend_iov_t *in, size_t n,
                      pdx_backend_iov_t *out);

#endif
