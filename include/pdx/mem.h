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

/* Register a region with every backend that supports its memory type. A
 * backend that cannot take this region declines and the others carry it;
 * at least one must take it. Register whole arenas, not blocks. Regions of
 * one agent must not overlap. A DRAM region inside memory from
 * pdx_mem_alloc or pdx_mem_share is marked PDX_REGION_F_SHARED, so a
 * same-host peer may map it (below). The registration bumps the agent's
 * generation: describe it again (or let the store publish it) for peers to
 * see the region.
 *
 * @param [in]  agent   The agent.
 * @param [in]  type    PDX_MEM_DRAM or PDX_MEM_VRAM.
 * @param [in]  addr    Start of the region in this process.
 * @param [in]  len     Bytes (> 0; addr + len must not wrap).
 * @param [in]  dev_id  CUDA device ordinal for VRAM; 0 for DRAM.
 * @param [in]  flags   PDX_REGION_F_USER bits of pdx/types.h (0 normally;
 *                      PDX_REGION_F_SHARED is pdx's to set).
 * @param [out] reg_p   The registration; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID (empty or wrapping region, unknown type
 *         or flags), PDX_ERR_EXISTS (overlaps a registered region),
 *         PDX_ERR_UNSUPPORTED (no backend takes it), PDX_ERR_NOMEM, or the
 *         error of a backend that failed it (logged).
 * Owns: the memory stays the caller's and must stay mapped while it is
 *       registered (see pdx_mem_deregister for when peers let go of it);
 *       *reg_p is the agent's, freed by pdx_mem_deregister or
 *       pdx_agent_destroy.
 * Blocks: on the agent lock; each backend registers the region under it
 *       (UCX: memory registration, pinning pages where the transport
 *       needs it).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                                      uint64_t addr, uint64_t len,
                                      uint32_t dev_id, uint64_t flags,
                                      pdx_mem_reg_h *reg_p);

/* Deregister a region, telling the peers that may read or write it.
 *
 * Loaded peers are told at once (an internal message on the notification
 * channel, never seen by the application): a peer takes the region out of
 * its view, its prepared lists and requests on it are refused
 * PDX_ERR_STALE from then on, and it acknowledges once none of its
 * requests on the region is in flight. This call waits for those
 * acknowledgements, so that no loaded peer reads or writes the memory
 * after it returns and the caller may free it (a peer that did not answer
 * by the bound below, e.g. a paused one, is named in a warning; a dead
 * peer counts as answered). Agents of this same process are told but not
 * waited for (they may progress only on the calling thread). Peers this
 * agent did not load (it cannot reach them) are not waited for either:
 * they learn it from its next description (the store's republish, or the
 * application's reload), so keep memory such peers may still read mapped
 * until then. It progresses the agent while it waits (no progress thread
 * needed); a peer acknowledges from its own progress (its progress thread
 * or its caller's polling).
 *
 * @param [in] agent  The agent.
 * @param [in] reg    A registration of this agent; only compared with the
 *                    agent's registrations, never read, so a stale one is
 *                    refused safely.
 * @return PDX_OK; PDX_ERR_BUSY (nothing done) while a request or a
 *         prepared list uses it; PDX_ERR_INVALID if `reg` is not a live
 *         registration of this agent.
 * Owns: on PDX_OK `reg` is freed, and the memory is wholly the caller's
 *       again (for the peers this agent loaded).
 * Blocks: yes: for the loaded peers' acknowledgements, at most the agent's
 *       xfer timeout capped at 5 s (none when no loaded peer is alive),
 *       running a progress pass every 0.2 ms and releasing the agent lock
 *       between passes.
 * Threads: any thread.
 */
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
 * The calls below need no agent: they keep one process-wide registry with
 * its own lock. */

/* Allocate `len` bytes of zeroed shared memory (memfd_create, MAP_SHARED),
 * page aligned. The mapping is MADV_DONTFORK: a child made by fork() does
 * not have it (shared memory would otherwise be the parent's live bytes,
 * not a copy).
 *
 * @param [in]  len    Bytes (> 0).
 * @param [in]  flags  0, or PDX_MEM_F_POPULATE: fault every page in now.
 * @param [out] ptr_p  The memory; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID (len 0, unknown flags), PDX_ERR_NOMEM or
 *         PDX_ERR_IO (with a log line).
 * Owns: *ptr_p is the caller's, freed with pdx_mem_free (not munmap).
 * Blocks: yes: system calls (memfd_create, ftruncate, mmap); with
 *       PDX_MEM_F_POPULATE, faulting in every page.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_alloc(size_t len, uint64_t flags, void **ptr_p);

/* Free memory from pdx_mem_alloc. In a child made by fork(), memory the
 * parent allocated (not mapped there) is only forgotten.
 *
 * @param [in] ptr  What pdx_mem_alloc returned; NULL does nothing.
 * @return PDX_OK; PDX_ERR_BUSY (nothing done) while any agent has a region
 *         registered inside it; PDX_ERR_NOT_FOUND if `ptr` is not what
 *         pdx_mem_alloc returned.
 * Owns: on PDX_OK the memory is unmapped and pdx's fd of it closed; fds
 *       from pdx_mem_fd are invalid from then on.
 * Blocks: yes: system calls (munmap, close).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_free(void *ptr);

/* Declare that [addr, +len) is a MAP_SHARED mapping of `fd` whose byte at
 * `offset` is `addr` (so addr and offset agree modulo the page size).
 *
 * @param [in] addr    Start of the caller's mapping.
 * @param [in] len     Bytes (> 0).
 * @param [in] fd      A regular file at least offset + len bytes long.
 * @param [in] offset  File offset of `addr`.
 * @return PDX_OK; PDX_ERR_INVALID (bad arguments, offset and addr not
 *         agreeing modulo the page size, fd not a regular file that large),
 *         PDX_ERR_EXISTS (the range overlaps one already known),
 *         PDX_ERR_IO (the fd could not be duplicated), PDX_ERR_NOMEM.
 * Owns: pdx keeps its own dup of `fd` (the caller may close its own); the
 *       mapping stays the caller's, kept mapped until pdx_mem_unshare.
 * Blocks: yes: system calls (fstat, fcntl).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_share(void *addr, size_t len, int fd,
                                   uint64_t offset);

/* Forget a range declared with pdx_mem_share.
 *
 * @param [in] addr  The start given to pdx_mem_share.
 * @return PDX_OK; PDX_ERR_BUSY (nothing done) while a region inside it is
 *         registered; PDX_ERR_NOT_FOUND if no shared range starts there.
 * Owns: pdx's dup of the fd is closed; the mapping stays the caller's.
 * Blocks: yes: one system call (close).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_unshare(void *addr);

/* The file behind shared memory: the fd pdx keeps for [ptr, +len) (memory
 * from pdx_mem_alloc or declared with pdx_mem_share) and the file offset of
 * `ptr`, e.g. to hand the memory to a worker process (send the fd over a
 * unix socket, or /proc/<pid>/fd/<fd>) that maps it.
 *
 * @param [in]  ptr       Start of the range.
 * @param [in]  len       Bytes of the range (0 counts as 1).
 * @param [out] fd_p      pdx's fd of the file; written only on success.
 * @param [out] offset_p  The file offset of `ptr`; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if the range is not such memory.
 * Owns: the fd stays pdx's, open until pdx_mem_free or pdx_mem_unshare
 *       (dup it to keep it past them; never close it).
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                                uint64_t *offset_p);

#ifdef __cplusplus
}
#endif

#endif
