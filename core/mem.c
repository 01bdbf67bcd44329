/* Memory registrations, their whole life: checked (host memory must be
 * mapped, readable, and writable unless registered read-only: a peer's
 * request is served by this process touching it), registered once per
 * arena with every backend that takes their memory type, kept sorted for
 * O(log n) lookups, held by requests, and deregistered once every loaded
 * peer that may read them acknowledged the notice (ctl.c), driving
 * progress while it waits. Above the progress pass. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "mem_int.h"
#include "progress_int.h"
#include "shm_int.h"

static int region_cmp(const pdx_region_t *a, pdx_mem_type_t t, uint64_t addr)
{
    if (a->mem_type != t) {
        return a->mem_type < t ? -1 : 1;
    }
    if (a->addr == addr) {
        return 0;
    }
    return a->addr < addr ? -1 : 1;
}

/* Index of the first region not before (t, addr). */
static size_t reg_lower_bound(pdx_agent_h agent, pdx_mem_type_t t,
                              uint64_t addr)
{
    size_t lo = 0, hi = agent->nregs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (region_cmp(&agent->regs[mid]->region, t, addr) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

struct pdx_mem_reg *pdx_reg_find(pdx_agent_h agent, pdx_mem_type_t t,
                                 uint64_t addr, uint64_t len)
{
    size_t i = reg_lower_bound(agent, t, addr);
    /* The holder starts at addr (index i) or before it (index i-1). */
    if (i < agent->nregs && agent->regs[i]->region.mem_type == t &&
        agent->regs[i]->region.addr == addr) {
        /* exact start */
    } else if (i > 0) {
        i--;
    } else {
        return NULL;
    }
    const pdx_region_t *r = &agent->regs[i]->region;
    if (r->mem_type != t || !pdx_region_holds(r, addr, len)) {
        return NULL;
    }
    return agent->regs[i];
}

/* Is host memory [addr, +len) mapped, readable and (`write`) writable in
 * this process? PDX_OK, or PDX_ERR_INVALID with the first page that is
 * not and why in `why`. From /proc/self/maps: a peer's READ or WRITE of a
 * registered region is served by this process's own copy (UCX emulates
 * RMA on the target's CPU; pdx's served path copies too), so a page that
 * cannot be touched would kill this process at a peer's request. Where
 * /proc cannot say, nothing is refused. */
static pdx_status_t mem_check_range(uint64_t addr, uint64_t len, bool write,
                                    char *why, size_t why_len)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (f == NULL) {
        pdx_debug("register: /proc/self/maps: %s: region not checked",
                  strerror(errno));
        return PDX_OK;
    }
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t at = addr & ~(pg - 1); /* the first byte not yet covered */
    uint64_t end = addr + len;
    const char *bad = "not mapped";
    char line[512];
    /* Mappings are listed in address order. */
    while (at < end && fgets(line, sizeof(line), f) != NULL) {
        unsigned long long lo, hi;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3) {
            continue;
        }
        if (hi <= at) {
            continue;
        }
        if (lo > at) {
            bad = "not mapped";
            break;
        }
        if (perms[0] != 'r') {
            bad = "not readable";
            break;
        }
        if (write && perms[1] != 'w') {
            bad = "not writable (register it PDX_REGION_F_READONLY)";
            break;
        }
        at = hi;
    }
    if (at < end && ferror(f)) {
        fclose(f);
        return PDX_OK;
    }
    fclose(f);
    if (at >= end) {
        return PDX_OK;
    }
    snprintf(why, why_len, "page 0x%" PRIx64 " is %s", at, bad);
    return PDX_ERR_INVALID;
}

static uint64_t caps_for(pdx_mem_type_t t)
{
    return t == PDX_MEM_VRAM ? PDX_BACKEND_CAP_VRAM : PDX_BACKEND_CAP_DRAM;
}

void pdx_mem_reg_free_locked(pdx_agent_h agent, struct pdx_mem_reg *r)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (r->md[b] != NULL) {
            agent->backends[b]->ops->mem_deregister(agent->backends[b]->be,
                                                    r->md[b]);
        }
    }
    if (r->region.flags & PDX_REGION_F_SHARED) {
        pdx_shm_release(r->region.addr, r->region.len);
    }
    free(r);
}

pdx_status_t pdxi_mem_register(pdx_agent_h agent, pdx_mem_type_t type,
                              uint64_t addr, uint64_t len, uint32_t dev_id,
                              uint64_t flags, pdx_mem_reg_h *reg_p)
{
    if (len == 0 || addr + len < addr ||
        (type != PDX_MEM_DRAM && type != PDX_MEM_VRAM)) {
        pdx_error("agent %s: register: invalid region 0x%llx+%llu",
                  agent->name, (unsigned long long)addr,
                  (unsigned long long)len);
        return PDX_ERR_INVALID;
    }
    if (flags & PDX_REGION_F_SHARED) {
        pdx_error("agent %s: register: PDX_REGION_F_SHARED is set by pdx "
                  "(use pdx_mem_alloc or pdx_mem_share), not by the caller",
                  agent->name);
        return PDX_ERR_INVALID;
    }
    if (flags & ~PDX_REGION_F_USER) {
        pdx_error("agent %s: register: unknown flags 0x%llx", agent->name,
                  (unsigned long long)(flags & ~PDX_REGION_F_USER));
        return PDX_ERR_INVALID;
    }
    char why[96];
    if (type == PDX_MEM_DRAM &&
        mem_check_range(addr, len, !(flags & PDX_REGION_F_READONLY), why,
                        sizeof(why)) != PDX_OK) {
        pdx_error("agent %s: register: host memory 0x%llx+%llu refused: %s",
                  agent->name, (unsigned long long)addr,
                  (unsigned long long)len, why);
        return PDX_ERR_INVALID;
    }
    pdx_status_t st;
    pdx_agent_lock(agent);
    size_t pos = reg_lower_bound(agent, type, addr);
    /* Refuse overlaps: a lookup must have exactly one answer. */
    if ((pos < agent->nregs &&
         agent->regs[pos]->region.mem_type == type &&
         agent->regs[pos]->region.addr < addr + len) ||
        (pos > 0 && agent->regs[pos - 1]->region.mem_type == type &&
         agent->regs[pos - 1]->region.addr +
                 agent->regs[pos - 1]->region.len > addr)) {
        pdx_error("agent %s: register: region 0x%llx+%llu overlaps a "
                  "registered one", agent->name, (unsigned long long)addr,
                  (unsigned long long)len);
        st = PDX_ERR_EXISTS;
        goto out;
    }
    struct pdx_mem_reg *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    r->region = (pdx_region_t){.addr = addr, .len = len, .dev_id = dev_id,
                               .mem_type = type, .flags = flags,
                               .shm_fd = -1};
    if (type == PDX_MEM_DRAM &&
        pdx_shm_acquire(addr, len, &r->region.shm_fd,
                        &r->region.shm_offset)) {
        r->region.flags |= PDX_REGION_F_SHARED;
    }
    uint32_t taken = 0;
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        struct pdx_backend *be = agent->backends[b];
        if (!(be->ops->caps & caps_for(type))) {
            continue;
        }
        st = be->ops->mem_register(be->be, &r->region, &r->md[b]);
        if (st == PDX_ERR_UNSUPPORTED) {
            /* This backend cannot take this memory (e.g. cuda_ipc and a
             * stream-ordered pool): the others still carry it. */
            pdx_info("agent %s: backend %s skips region 0x%llx+%llu",
                     agent->name, be->name, (unsigned long long)addr,
                     (unsigned long long)len);
            r->md[b] = NULL;
            continue;
        }
        if (st != PDX_OK) {
            pdx_error("agent %s: backend %s could not register 0x%llx+%llu: "
                      "%s", agent->name, be->name, (unsigned long long)addr,
                      (unsigned long long)len, pdx_status_string(st));
            goto err_dereg;
        }
        taken++;
    }
    if (taken == 0) {
        pdx_error("agent %s: register: no backend takes %s memory",
                  agent->name, type == PDX_MEM_VRAM ? "VRAM" : "DRAM");
        st = PDX_ERR_UNSUPPORTED;
        goto err_dereg;
    }
    if (agent->nregs == agent->regs_cap) {
        size_t cap = agent->regs_cap ? agent->regs_cap * 2 : 16;
        void *p = realloc(agent->regs, cap * sizeof(*agent->regs));
        if (p == NULL) {
            st = PDX_ERR_NOMEM;
            goto err_dereg;
        }
        agent->regs = p;
        agent->regs_cap = cap;
    }
    memmove(&agent->regs[pos + 1], &agent->regs[pos],
            (agent->nregs - pos) * sizeof(*agent->regs));
    agent->regs[pos] = r;
    agent->nregs++;
    agent->generation++;
    pdx_disc_changed_locked(agent);
    *reg_p = r;
    st = PDX_OK;
    goto out;

err_dereg:
    pdx_mem_reg_free_locked(agent, r);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}

pdx_status_t pdx_mem_unlink_locked(pdx_agent_h agent,
                                   struct pdx_mem_reg *reg)
{
    pdx_status_t st = PDX_ERR_INVALID;
    for (size_t i = 0; i < agent->nregs; i++) {
        if (agent->regs[i] != reg) {
            continue;
        }
        if (reg->users > 0) {
            pdx_error("agent %s: deregister 0x%llx: %u requests or lists "
                      "still use it", agent->name,
                      (unsigned long long)reg->region.addr, reg->users);
            st = PDX_ERR_BUSY;
            break;
        }
        memmove(&agent->regs[i], &agent->regs[i + 1],
                (agent->nregs - i - 1) * sizeof(*agent->regs));
        agent->nregs--;
        agent->generation++;
        pdx_disc_changed_locked(agent);
        st = PDX_OK;
        break;
    }
    if (st == PDX_ERR_INVALID) {
        pdx_error("agent %s: deregister: reg %p is not a registration of "
                  "this agent (deregistered already?)", agent->name,
                  (void *)reg);
    }
    return st;
}

/* pdx_mem_deregister's notice (ctl.c): tell every live loaded peer that
 * carries notifications that `r` goes away and wait, dropping and
 * retaking the lock, until each acknowledged, died, or the bound passed.
 * `r` is out of agent->regs already and not freed. */
static void region_gone_wait_locked(pdx_agent_h agent,
                                    const struct pdx_mem_reg *r)
{
    pdx_ctl_wait_t w;
    if (!pdx_ctl_gone_begin_locked(agent, r, &w)) {
        return;
    }
    uint64_t start = pdx_now_ns();
    uint64_t deadline = start + pdx_ctl_wait_bound_ms(agent) * 1000000ull;
    while (w.left > 0) {
        pdx_progress_locked(agent);
        pdx_ctl_gone_check_locked(agent, &w);
        if (w.left == 0 || pdx_now_ns() >= deadline) {
            break;
        }
        pthread_mutex_unlock(&agent->lock);
        struct timespec ts = {0, 200000}; /* 0.2 ms between passes */
        nanosleep(&ts, NULL);
        pdx_agent_lock(agent);
    }
    pdx_ctl_gone_end_locked(agent, r, &w, start);
}

pdx_status_t pdxi_mem_deregister(pdx_agent_h agent, pdx_mem_reg_h reg)
{
    pdx_agent_lock(agent);
    pdx_status_t st = pdx_mem_unlink_locked(agent, reg);
    if (st == PDX_OK) {
        /* Loaded peers are told and acknowledge (bounded) before the keys
         * go, so none reads the memory once this returns. */
        region_gone_wait_locked(agent, reg);
        pdx_mem_reg_free_locked(agent, reg);
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}
