/* Module loader (loader.c): backend and store modules by name, ABI
 * checked before any other call. Calls nothing of the agent. */
#ifndef PDX_LOADER_H
#define PDX_LOADER_H

#include <stddef.h>

#include <pdx/backend.h>
#include <pdx/status.h>

struct pdx_store_ops;

pdx_status_t pdx_loader_open(const char *name, const pdx_backend_ops_t **ops_p,
                             void **dl_p, char *why, size_t why_len);
pdx_status_t pdx_loader_open_store(const char *name,
                                   const struct pdx_store_ops **ops_p,
                                   void **dl_p, char *why, size_t why_len);
/* dlclose a module handle from either open; NULL (linked in) is fine. */
void pdx_loader_close(void *dl);

#endif
