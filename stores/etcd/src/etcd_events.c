/* etcd store: watch events: queued by the client thread, delivered to the
 * agent's callback outside the locks, in order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

void etcd_queue_event(etcd_store_t *s, uint64_t watch_id,
                      pdx_store_event_type_t type, uint32_t flags,
                      const char *key, const void *value, size_t vlen,
                      int64_t rev, int64_t lease)
{
    size_t klen = strlen(key);
    etcd_event_t *e = malloc(sizeof(*e) + klen + 1 + vlen + 1);
    if (e == NULL) {
        pdx_error("store etcd: out of memory: dropped an event of %s", key);
        return;
    }
    e->next = NULL;
    e->watch_id = watch_id;
    memcpy(e->mem, key, klen + 1);
    if (vlen > 0) {
        memcpy(e->mem + klen + 1, value, vlen);
    }
    e->mem[klen + 1 + vlen] = '\0';
    e->ev = (pdx_store_event_t){
        .type = type, .flags = flags, .key = e->mem,
        .value = type == PDX_STORE_EV_PUT ? e->mem + klen + 1 : NULL,
        .value_len = type == PDX_STORE_EV_PUT ? vlen : 0, .revision = rev,
        .lease = lease};
    pthread_mutex_lock(&s->lock);
    s->events++;
    s->event_bytes += klen + vlen;
    pthread_mutex_unlock(&s->lock);
    if (s->evq_tail != NULL) {
        s->evq_tail->next = e;
    } else {
        s->evq = e;
    }
    s->evq_tail = e;
}

etcd_watch_t *etcd_find_watch_locked(etcd_store_t *s, uint64_t id)
{
    for (etcd_watch_t *w = s->watches; w != NULL; w = w->next) {
        if (w->id == id && !w->removed) {
            return w;
        }
    }
    return NULL;
}


/* Hand queued events and state changes to the host, no lock but
 * `deliver` held (unwatch waits on it). */
void etcd_deliver(etcd_store_t *s)
{
    pthread_mutex_lock(&s->lock);
    etcd_event_t *list = s->evq;
    s->evq = s->evq_tail = NULL;
    bool dirty = s->state_dirty;
    s->state_dirty = false;
    pdx_store_status_t status;
    if (dirty) {
        etcd_fill_status_locked(s, &status);
    }
    pthread_mutex_unlock(&s->lock);
    if (list == NULL && !dirty) {
        return;
    }
    pthread_mutex_lock(&s->deliver);
    if (dirty && s->host.state_change != NULL) {
        s->host.state_change(s->host.ctx, &status);
    }
    while (list != NULL) {
        etcd_event_t *e = list;
        list = e->next;
        pthread_mutex_lock(&s->lock);
        bool live = etcd_find_watch_locked(s, e->watch_id) != NULL;
        pthread_mutex_unlock(&s->lock);
        if (live && s->host.watch_event != NULL) {
            s->host.watch_event(s->host.ctx, e->watch_id, &e->ev);
        }
        free(e);
    }
    pthread_mutex_unlock(&s->deliver);
}
