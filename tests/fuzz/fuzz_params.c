/* libFuzzer harness for the handoff (transfer) parameters parser. */
#include <stdint.h>

#include <pdx/kv_connector.h>
#include <pdx/log.h>

#include "log_quiet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_quiet(); /* rejections are the common case */
    size_t narenas = size > 0 ? (data[0] % 4) : 0;
    pdx_kv_params_check((const char *)data, size, narenas);
    return 0;
}
