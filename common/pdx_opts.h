/* Numeric module options, one parser for every backend and store, so "8m"
 * or "-1" means the same to each. Private to the modules (a static library,
 * hidden); never part of an exported table. Any thread. */
#ifndef PDX_OPTS_H
#define PDX_OPTS_H

#include <stdint.h>

/* A decimal option value from `lo` to `hi`: digits only (no sign, nothing
 * after them). 0 and *out_p written, or -1 and nothing written; the caller
 * logs, in its own words, with the option's name. */
int pdx_opt_uint(const char *value, uint64_t lo, uint64_t hi,
                 uint64_t *out_p);

/* The same with an optional binary suffix k, m or g (KiB, MiB, GiB); the
 * bounds apply to the value in bytes. */
int pdx_opt_size(const char *value, uint64_t lo, uint64_t hi,
                 uint64_t *out_p);

#endif
