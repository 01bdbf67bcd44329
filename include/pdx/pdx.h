/* pdx umbrella header: the whole public API of libpdx.so. */
#ifndef PDX_PDX_H
#define PDX_PDX_H

#include <pdx/agent.h>
#include <pdx/log.h>
#include <pdx/notif.h>
#include <pdx/plugin.h>
#include <pdx/status.h>
#include <pdx/types.h>
#include <pdx/xfer.h>

#endif
