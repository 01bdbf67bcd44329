/* Numeric module options: one parser, so "8m" or "-1" means the same to
 * every backend. Messages stay with the callers, which know the option. */
#include "pdx_opts.h"

#include <errno.h>
#include <stdlib.h>

static int parse(const char *value, int suffix, uint64_t lo, uint64_t hi,
                 uint64_t *out_p)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno != 0 || end == value || value[0] == '-') {
        return -1;
    }
    uint64_t mult = 1;
    if (suffix) {
        switch (*end) {
        case '\0': break;
        case 'k': case 'K': mult = 1ull << 10; end++; break;
        case 'm': case 'M': mult = 1ull << 20; end++; break;
        case 'g': case 'G': mult = 1ull << 30; end++; break;
        default: return -1;
        }
    }
    if (*end != '\0' || v > hi / mult || v * mult < lo) {
        return -1;
    }
    *out_p = v * mult;
    return 0;
}

int pdx_opt_uint(const char *value, uint64_t lo, uint64_t hi,
                    uint64_t *out_p)
{
    return parse(value, 0, lo, hi, out_p);
}

int pdx_opt_size(const char *value, uint64_t lo, uint64_t hi,
                    uint64_t *out_p)
{
    return parse(value, 1, lo, hi, out_p);
}
