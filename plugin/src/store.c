/* Store glue: discovery, liveness and the block-owner registry through a
 * store module (pdx/store.h). Being written: stubs keep the build whole. */
#include <pdx/store.h>

#include "agent_int.h"

pdx_status_t pdx_store_agent_init(pdx_agent_h agent,
                                  const pdx_agent_params_t *params)
{
    (void)params;
    pdx_error("agent %s: stores are not available yet", agent->name);
    return PDX_ERR_UNSUPPORTED;
}

void pdx_store_agent_fini(pdx_agent_h agent) { (void)agent; }
