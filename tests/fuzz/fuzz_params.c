/* libFuzzer harness for the handoff (transfer) parameters parser. */
#include <stdint.h>

#include <pdx/kv_connector.h>
#include <pdx/log.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void drop(void *arg, pdx_log_level_t level, const char *msg) {}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        /* Rejections are the common case; their log lines are noise. */
        pdx_log_set_handler(drop, NULL);
        quiet = 1;
    }
    size_t narenas = size > 0 ? (data[0] % 4) : 0;
    pdx_kv_params_check((const char *)data, size, narenas);
    return 0;
}
