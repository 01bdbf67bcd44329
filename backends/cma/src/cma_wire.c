/* cma: little-endian fields of conn info and keys, and the one translator
 * from errno. */
#include "cma_int.h"

void cma_put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

uint64_t cma_get_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

pdx_status_t cma_errno_status(int e)
{
    switch (e) {
    case ESRCH:
        return PDX_ERR_REMOTE_DISCONNECT;
    case ENOMEM:
        return PDX_ERR_NOMEM;
    case EPERM:
        return PDX_ERR_UNAVAILABLE;
    default:
        return PDX_ERR_IO;
    }
}
