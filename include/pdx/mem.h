/* pdx memory: registrations of an agent's memory with its backends, and the
 * process-wide shared host memory (pdx_mem_alloc, pdx_mem_share) that
 * same-host peers can map. */
#ifndef PDX_MEM_H
#define PDX_MEM_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_mem_reg *pdx_mem_reg_h;

/* Register a region with every backend that supports its memory type.
 * `flags` are PDX_REGION_F_* of pdx/types.h (0 normally). A backend that
 * cannot take this region declines and the others carry it; at least one
 * must take it (PDX_ERR_UNSUPPORTED otherwise). Register whole
 * arenas, not blocks. Regions of one agent must not overlap. Writes *reg_p
 * only on success. Blocking. */
PDX_API pdx_status_t pdx_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                                      uint64_t addr, uint64_t len,
                                      uint32_t dev_id, uint64_t flags,
                                      pdx_mem_reg_h *reg_p);

/* Deregister. PDX_ERR_BUSY (nothing done) while a request uses it;
 * PDX_ERR_INVALID if `reg` is not a live registration of this agent.
 * Loaded peers are told at once (an internal message on the notification
 * channel, never seen by the application): a peer takes the region out of
 * its view, its prepared lists and requests on it are refused
 * PDX_ERR_STALE from then on, and it acknowledges once none of its
 * requests on the region is in flight. This call waits for those
 * acknowledgements, so that no loaded peer reads or writes the memory
 * after it returns and the caller may free it: blocking, at most the
 * agent's xfer timeout capped at 5 s (a peer that did not answer by then,
 * e.g. a paused one, is named in a warning; a dead peer counts as
 * answered). Agents of this same process are told but not waited for
 * (they may progress only on the calling thread). Peers this agent did not
 * load (it cannot reach them) are not waited for either: they learn it
 * from its next description (the store's republish, or the application's
 * reload), so keep memory such peers may still read mapped until then.
 * Progresses the agent while it waits (no progress thread needed); a peer
 * acknowledges from its own progress (its progress thread or its caller's
 * polling). Does not hold the agent lock while it waits. Thread-safe. */
PDX_API pdx_status_t pdx_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg);

/* Shared host memory: the fast path between processes on one host.
 *
 * Host memory from pdx_mem_alloc, or a caller's own MAP_SHARED mapping of a
 * file declared with pdx_mem_share, can be mapped by a peer on this host.
 * Register it with pdx_mem_register as usual (after allocating or sharing;
 * a region must lie inside one such range to count). The cma backend then
 * packs the memory's fd and offset in the region's key, the peer maps it
 * (pidfd_getfd, or /proc/<pid>/fd where that is refused) and a transfer
 * into or out of it is one memcpy by the initiator: no system call per
 * request, no CPU of the target. Where the peer cannot map it (another
 * user, a seccomp filter) it falls back to process_vm_readv/writev, and
 * over UCX nothing changes. Only the target side of a transfer needs to
 * be shared; the initiator's side may be any registered memory.
 *
 * A peer that maps the memory can read and write all of it until it
 * unloads this agent (as with process_vm_writev, only processes allowed to
 * ptrace this one can); the pages live until both sides unmap them.
 *
 * Thread-safe (one process-wide registry with its own lock); blocking
 * (system calls). None of these needs an agent. */

/* Allocate `len` bytes of zeroed shared memory (memfd_create, MAP_SHARED),
 * page aligned. `flags`: PDX_MEM_F_POPULATE faults every page in now.
 * The mapping is MADV_DONTFORK: a child made by fork() does not have it
 * (shared memory would otherwise be the parent's live bytes, not a copy).
 * The caller owns it: free with pdx_mem_free. PDX_ERR_NOMEM or
 * PDX_ERR_IO (with a log line) on failure; *ptr_p is written on success
 * only. */
PDX_API pdx_status_t pdx_mem_alloc(size_t len, uint64_t flags, void **ptr_p);
/* Free memory from pdx_mem_alloc (NULL is a no-op). PDX_ERR_BUSY (nothing
 * done) while any agent has a region registered inside it;
 * PDX_ERR_NOT_FOUND if `ptr` is not what pdx_mem_alloc returned. */
PDX_API pdx_status_t pdx_mem_free(void *ptr);
/* Declare that [addr, +len) is a MAP_SHARED mapping of `fd` whose byte at
 * `offset` is `addr` (so addr and offset agree modulo the page size). pdx
 * keeps its own dup of `fd`; the caller keeps the mapping alive until
 * pdx_mem_unshare. PDX_ERR_INVALID if fd is not a regular file that large,
 * PDX_ERR_EXISTS if the range overlaps one already known. */
PDX_API pdx_status_t pdx_mem_share(void *addr, size_t len, int fd,
                                   uint64_t offset);
/* Forget a range from pdx_mem_share (by its start). PDX_ERR_BUSY while a
 * region inside it is registered. */
PDX_API pdx_status_t pdx_mem_unshare(void *addr);

/* The file behind shared memory: the fd pdx keeps for [ptr, +len) (memory
 * from pdx_mem_alloc or declared with pdx_mem_share) and the file offset of
 * `ptr`, e.g. to hand the memory to a worker process (send the fd over a
 * unix socket, or /proc/<pid>/fd/<fd>) that maps it. The fd stays owned by
 * pdx (dup it to keep it past pdx_mem_free). PDX_ERR_NOT_FOUND if the range
 * is not such memory. Thread-safe; non-blocking. */
PDX_API pdx_status_t pdx_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                                uint64_t *offset_p);

#ifdef __cplusplus
}
#endif

#endif
