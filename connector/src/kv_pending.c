/* Lookups pending on a save in flight: a per-request deadline, set the
 * first time a lookup of the request has to wait, forgotten when one
 * answers. */
#include <stdio.h>
#include <stdlib.h>

#include "kv_connector_int.h"

static kv_pending_t **find(kv_pending_t **list, const char *req)
{
    kv_pending_t **w = list;
    while (*w != NULL && strcmp((*w)->req, req) != 0) {
        w = &(*w)->next;
    }
    return w;
}

bool kv_pending_wait(kv_pending_t **list, const char *req,
                     uint32_t timeout_ms)
{
    kv_pending_t **w = find(list, req);
    uint64_t now = pdx_now_ns();
    if (*w == NULL) {
        kv_pending_t *n = calloc(1, sizeof(*n));
        if (n != NULL) {
            snprintf(n->req, sizeof(n->req), "%s", req);
            n->deadline_ns = now + (uint64_t)timeout_ms * 1000000ull;
            *w = n;
        }
    }
    return *w != NULL && now < (*w)->deadline_ns;
}

void kv_pending_forget(kv_pending_t **list, const char *req)
{
    kv_pending_t **w = find(list, req);
    if (*w != NULL) {
        kv_pending_t *dead = *w;
        *w = dead->next;
        free(dead);
    }
}

void kv_pending_free(kv_pending_t **list)
{
    while (*list) {
        kv_pending_t *w = *list;
        *list = w->next;
        free(w);
    }
}
