/* Private to the connector objects: shorthands for the connector's handle
 * checks. The entry gate itself (PDX_ENTER, PDX_LEAVE*, PDX_ARG_OK) is the
 * core's, spelled once in core/call.h for every exported function. */
#ifndef PDX_KV_CALL_H
#define PDX_KV_CALL_H

#include "call_int.h"

#define KV_LAYOUT_OK(l, what) PDX_HANDLE_OK((l), PDX_MAGIC_LAYOUT, (what))
#define KV_HASHER_OK(h) PDX_HANDLE_OK((h), PDX_MAGIC_HASHER, "hasher")
#define KV_POOL_OK(p) PDX_HANDLE_OK((p), PDX_MAGIC_POOL, "pool")
#define KV_CONN_OK(c) PDX_HANDLE_OK((c), PDX_MAGIC_CONN, "conn")
/* Destroy: a handle inherited across fork() is left alone quietly. */
#define KV_POOL_REL_OK(p) PDX_HANDLE_REL_OK((p), PDX_MAGIC_POOL, "pool")
#define KV_CONN_REL_OK(c) PDX_HANDLE_REL_OK((c), PDX_MAGIC_CONN, "conn")

#endif
