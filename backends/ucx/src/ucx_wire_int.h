/* Structural validation of a peer's UCX 1.13 worker address and packed
 * remote keys, before any byte of them reaches ucp_ep_create or
 * ucp_ep_rkey_unpack (which trust their input: a malformed address aborts
 * on an assertion, a malformed key reads out of bounds or crashes in
 * ucp_rkey_destroy). The layouts follow UCX 1.13.1's
 * src/ucp/wireup/address.c and src/ucp/core/ucp_rkey.c (non-unified mode,
 * address versions v1 and v2). No UCP call is made here; the local table
 * comes from UCT queries (ucx_vlocal_init). */
#ifndef PDX_UCX_VALIDATE_H
#define PDX_UCX_VALIDATE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <pdx/types.h>

#define UCX_V_MAX_MDS 64    /* UCP_MAX_MDS: bits of ucp_md_map_t */
#define UCX_V_MAX_TLS 64    /* local transports we remember */
#define UCX_V_MAX_RSC 128   /* UCP_MAX_RESOURCES */
#define UCX_V_MAX_LANES 6   /* UCP_MAX_LANES */
#define UCX_V_MAX_SYS_DEV 64 /* ucp_sys_dev_map_t bits */

/* A transport this process's UCX has, by the checksum a peer's address
 * names it with (ucs_crc16_string of the transport name). */
typedef struct ucx_vtl {
    uint16_t csum;
    char tl[32];
    char component[32];
    size_t rkey_size; /* the md's packed rkey size */
    int can_reg;      /* the md registers user memory */
} ucx_vtl_t;

typedef struct ucx_vlocal {
    size_t ntl;
    ucx_vtl_t tl[UCX_V_MAX_TLS];
} ucx_vlocal_t;

/* What a validated peer address says, for checking its keys. */
typedef struct ucx_vaddr {
    unsigned version;        /* 0: v1, 1: v2 */
    unsigned ndevices, nifaces;
    uint64_t md_map;         /* md indexes that appear */
    int16_t md_tl[UCX_V_MAX_MDS]; /* local tl index for the md, or -1 */
    /* A shared-memory FIFO transport (posix, sysv, xpmem: UCX's mm) in the
     * address, and the device address of the first one (for UCX: the
     * host's system id, so equal bytes mean the same host). */
    int has_mm;
    uint8_t mm_dev_len;
    uint8_t mm_dev[16];
} ucx_vaddr_t;

/* Are two validated addresses of one host over UCX shared memory (both
 * have an mm transport, with the same device address)? */
static inline int ucx_vaddr_same_host(const ucx_vaddr_t *a,
                                      const ucx_vaddr_t *b)
{
    return a->has_mm && b->has_mm && a->mm_dev_len == b->mm_dev_len &&
           a->mm_dev_len > 0 &&
           memcmp(a->mm_dev, b->mm_dev, a->mm_dev_len) == 0;
}

/* Fill `local` from UCT (components, their mds and transports).
 * PDX_ERR_UNSUPPORTED with `why` when UCX runs in unified mode (addresses
 * then depend on the local resources and cannot be checked). Blocking
 * (opens and closes every md once). */
pdx_status_t ucx_vlocal_init(ucx_vlocal_t *local, char *why, size_t why_len);

/* Validate a worker address of `len` bytes; on PDX_OK fill *out. Else
 * PDX_ERR_CORRUPT (or PDX_ERR_VERSION) with the field and offset in `why`.
 * Never reads outside [buf, buf+len). */
pdx_status_t ucx_validate_address(const ucx_vlocal_t *local, const void *buf,
                                  size_t len, ucx_vaddr_t *out, char *why,
                                  size_t why_len);

/* Validate a packed rkey of `len` bytes against the peer's address (every
 * md it names appears there; for an md whose transport we know, its key
 * has that md's size and the md registers memory) and the memory type it
 * must carry (`mem_type`, a ucs_memory_type_t: UCS_MEMORY_TYPE_HOST for
 * DRAM, UCS_MEMORY_TYPE_CUDA for VRAM registered natively).
 * PDX_ERR_CORRUPT with `why` otherwise. */
pdx_status_t ucx_validate_rkey(const ucx_vlocal_t *local,
                               const ucx_vaddr_t *peer, const void *buf,
                               size_t len, unsigned mem_type, char *why,
                               size_t why_len);

#endif
