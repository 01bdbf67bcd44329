/* pdx basic types shared by the API and the backend ABI. */
#ifndef PDX_TYPES_H
#define PDX_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_NAME_MAX 64 /* agent and peer names, bytes incl. NUL */

typedef enum pdx_mem_type {
    PDX_MEM_DRAM = 0, /* host memory */
    PDX_MEM_VRAM = 1, /* GPU memory; dev_id is the CUDA device ordinal */
} pdx_mem_type_t;

typedef enum pdx_xfer_op {
    PDX_XFER_READ = 0,  /* remote -> local */
    PDX_XFER_WRITE = 1, /* local -> remote */
} pdx_xfer_op_t;

/* One contiguous piece of memory. For a remote list, addr is in the peer's
 * address space. */
typedef struct pdx_desc {
    uint64_t addr;
    uint64_t len;
    uint32_t dev_id; /* 0 for DRAM */
    uint32_t reserved;
} pdx_desc_t;

/* A list of descriptors of one memory type. The caller owns `descs`; pdx
 * copies what it keeps. */
typedef struct pdx_desc_list {
    pdx_mem_type_t mem_type;
    const pdx_desc_t *descs;
    size_t count;
} pdx_desc_list_t;

/* Registration flags (pdx_mem_register). */
/* Page-lock a DRAM region for GPU copies (cuda_ipc honours it). */
#define PDX_REGION_F_PIN (1ull << 0)
/* Set by pdx, never by the caller: the region lies in shared memory from
 * pdx_mem_alloc or pdx_mem_share, so a same-host peer may map it
 * (pdx_region_t's shm_fd and shm_offset are valid). */
#define PDX_REGION_F_SHARED (1ull << 1)
/* Read-only to transfers: peers may READ it, but no transfer lands in it.
 * The flag travels in the agent's description, so a peer's WRITE into it
 * and a local READ into it are refused at pdx_xfer_create /
 * pdx_xfer_make (PDX_ERR_INVALID, naming the region). UCX registers it
 * without remote write access (enforced by RDMA NICs; over shared memory
 * and cma the initiator's refusal is the guard). For memory the caller
 * must not see changed (Python's bytes). */
#define PDX_REGION_F_READONLY (1ull << 2)
/* Every flag a caller may pass to pdx_mem_register. */
#define PDX_REGION_F_USER (PDX_REGION_F_PIN | PDX_REGION_F_READONLY)

/* pdx_mem_alloc flags. */
/* Fault every page in at allocation (MAP_POPULATE). */
#define PDX_MEM_F_POPULATE (1ull << 0)

/* A region of memory to register, or a peer's region to load: what a
 * backend module is given (pdx/backend.h) and what the core keeps of every
 * registration and every peer region. */
typedef struct pdx_region {
    uint64_t addr;
    uint64_t len;
    uint32_t dev_id;
    pdx_mem_type_t mem_type;
    uint64_t flags; /* PDX_REGION_F_* */
    /* Valid only with PDX_REGION_F_SHARED in `flags` (set by the agent
     * for local regions in pdx_mem_alloc/pdx_mem_share memory): an fd of
     * this process for a file whose bytes at `shm_offset` are `addr`
     * (MAP_SHARED). The fd stays open while the region is registered.
     * In a peer's region (rmem_load) shm_fd is -1: the key says more. */
    int32_t shm_fd;
    uint32_t reserved;
    uint64_t shm_offset;
} pdx_region_t;

/* A key/value option (backend, store and connector options). Both strings
 * are owned by the caller and only read during the call. */
typedef struct pdx_option {
    const char *key;
    const char *value;
} pdx_option_t;

#ifdef __cplusplus
}
#endif
#endif
