/* Private to the connector: copies between VRAM arenas and the host
 * offload pool (kv_devcopy.c), for the offload child. */
#ifndef PDX_KV_DEVCOPY_H
#define PDX_KV_DEVCOPY_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/status.h>

typedef struct kv_devcopy kv_devcopy_t;

/* The CUDA driver and device `dev`'s primary context (logged when it
 * cannot be had: PDX_ERR_UNAVAILABLE). */
pdx_status_t kv_devcopy_open(uint32_t dev, kv_devcopy_t **dc_p);
/* Synchronous copies (PDX_ERR_BACKEND, logged, on failure); any thread. */
pdx_status_t kv_devcopy_d2h(kv_devcopy_t *dc, void *dst, uint64_t src,
                            size_t n);
pdx_status_t kv_devcopy_h2d(kv_devcopy_t *dc, uint64_t dst, const void *src,
                            size_t n);
void kv_devcopy_close(kv_devcopy_t *dc);

#endif
