/* Connector version string, part of the invariants peers compare. */
#include <pdx/export.h>

#include "kv_call_int.h"

PDX_API const char *pdx_connector_version(void);

const char *pdx_connector_version(void)
{
    /* Cannot fail; inside the call capture like every entry point. */
    PDX_ENTER();
    PDX_LEAVE_VAL(PDX_OK, "pdx-kv/1");
}
