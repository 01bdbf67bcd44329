/* Connector version string, part of the invariants peers compare. */
#include <pdx/export.h>

PDX_API const char *pdx_connector_version(void);

const char *pdx_connector_version(void) { return "pdx-kv/1"; }
