/* The process-wide shared memory registry (shm.c), behind pdx_mem_alloc
 * and pdx_mem_share. Own lock; calls nothing of the agent. */
#ifndef PDX_SHM_H
#define PDX_SHM_H

#include <stdbool.h>
#include <stdint.h>

/* acquire: if
 * [addr, +len) lies in memory from pdx_mem_alloc/pdx_mem_share, count one
 * more user (pdx_mem_free refuses while any) and give its fd and the file
 * offset of `addr`. release undoes one acquire of the same range. */
bool pdx_shm_acquire(uint64_t addr, uint64_t len, int *fd_p, uint64_t *off_p);
void pdx_shm_release(uint64_t addr, uint64_t len);

#endif
