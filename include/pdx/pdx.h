/* pdx umbrella header: the whole public API of libpdx.so, one header per
 * object (include/pdx/README.md lists them). The module ABIs, pdx/backend.h
 * and the ops table of pdx/store.h, are for modules and tests. */
#ifndef PDX_PDX_H
#define PDX_PDX_H

#include <pdx/agent.h>
#include <pdx/backend_instance.h>
#include <pdx/blob.h>
#include <pdx/kv_config.h>
#include <pdx/kv_connector.h>
#include <pdx/kv_hash.h>
#include <pdx/kv_layout.h>
#include <pdx/kv_offload.h>
#include <pdx/log.h>
#include <pdx/mem.h>
#include <pdx/metrics.h>
#include <pdx/notif.h>
#include <pdx/peer.h>
#include <pdx/plugin.h>
#include <pdx/stats.h>
#include <pdx/status.h>
#include <pdx/store.h>
#include <pdx/types.h>
#include <pdx/xfer.h>

#endif
