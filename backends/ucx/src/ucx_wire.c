/* UCX 1.13 worker address and packed rkey validation (see ucx_wire.h).
 * Hand-written: UCX has no API that checks a peer's address or key (its
 * unpackers assume a well-formed buffer, and ucp_ep_rkey_unpack is not even
 * told the key's length). */
#include "ucx_wire_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ucs/algorithm/crc.h>
#include <uct/api/uct.h>

/* address.c */
#define V1 0u
#define V2 1u
#define HDR_VERSION_MASK 0x0fu
#define HDR_FLAG_DEBUG_INFO 0x01u
#define HDR_FLAG_WORKER_UUID 0x02u
#define HDR_FLAG_CLIENT_ID 0x04u
#define HDR_FLAG_AM_ONLY 0x08u
#define HDR_FLAGS_ALL 0x0fu
#define NULL_RESOURCE 0xffu
#define MD_EMPTY_DEV 0x80u
#define MD_MASK_V1 0x1fu
#define MD_MASK_V2 0x7fu
#define FLAG_LAST 0x80u
#define FLAG_HAS_EP_ADDR 0x40u
#define FLAG_NUM_PATHS 0x40u
#define FLAG_SYS_DEVICE 0x20u
#define IFACE_LEN_MASK 0x3fu
#define DEVICE_LEN_MASK 0x1fu
#define IFACE_ATTR_V1 16u /* float overhead, bandwidth, lat_ovh; u32 */
#define IFACE_ATTR_V2 8u  /* fp8 x3, prio, u16 seg_size, u16 flags */

typedef struct vr {
    const uint8_t *p;
    size_t len, off;
    char *why;
    size_t why_len;
    int bad;
} vr_t;

static int vfail(vr_t *r, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int vfail(vr_t *r, const char *field, const char *fmt, ...)
{
    if (!r->bad) {
        char what[128];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        snprintf(r->why, r->why_len, "%s at byte %zu of %zu: %s", field,
                 r->off, r->len, what);
        r->bad = 1;
    }
    return 0;
}

static int vneed(vr_t *r, size_t n, const char *field)
{
    if (r->bad) {
        return 0;
    }
    if (n > r->len - r->off) {
        return vfail(r, field, "truncated (%zu more bytes needed)",
                     n - (r->len - r->off));
    }
    return 1;
}

static unsigned vu8(vr_t *r, const char *field)
{
    if (!vneed(r, 1, field)) {
        return 0;
    }
    return r->p[r->off++];
}

static void vskip(vr_t *r, size_t n, const char *field)
{
    if (vneed(r, n, field)) {
        r->off += n;
    }
}

/* A value packed in the low bits of a byte; in v2 all ones there means
 * the value is in the next byte. */
static unsigned vext(vr_t *r, unsigned byte, unsigned mask, unsigned version,
                     const char *field)
{
    unsigned v = byte & mask;
    if (version != V1 && v == mask) {
        v = vu8(r, field);
    }
    return v;
}

static float vfloat(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static int vlocal_tl(const ucx_vlocal_t *local, uint16_t csum)
{
    for (size_t i = 0; local != NULL && i < local->ntl; i++) {
        if (local->tl[i].csum == csum) {
            return (int)i;
        }
    }
    return -1;
}

static int truthy(const char *v)
{
    return v != NULL && (strcasecmp(v, "y") == 0 ||
                         strcasecmp(v, "yes") == 0 ||
                         strcasecmp(v, "on") == 0 || strcmp(v, "1") == 0 ||
                         strcasecmp(v, "true") == 0);
}

pdx_status_t ucx_vlocal_init(ucx_vlocal_t *local, char *why, size_t why_len)
{
    memset(local, 0, sizeof(*local));
    if (truthy(getenv("UCX_UNIFIED_MODE"))) {
        snprintf(why, why_len, "UCX_UNIFIED_MODE is set: pdx cannot validate "
                 "peer addresses in unified mode (their layout depends on "
                 "the local resources); unset it");
        return PDX_ERR_UNSUPPORTED;
    }
    uct_component_h *cmpts = NULL;
    unsigned ncmpts = 0;
    ucs_status_t s = uct_query_components(&cmpts, &ncmpts);
    if (s != UCS_OK) {
        snprintf(why, why_len, "uct_query_components: %s",
                 ucs_status_string(s));
        return PDX_ERR_UNAVAILABLE;
    }
    for (unsigned c = 0; c < ncmpts; c++) {
        uct_component_attr_t ca = {
            .field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                          UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        if (uct_component_query(cmpts[c], &ca) != UCS_OK ||
            ca.md_resource_count == 0) {
            continue;
        }
        uct_md_resource_desc_t *mds =
            calloc(ca.md_resource_count, sizeof(*mds));
        if (mds == NULL) {
            continue;
        }
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds;
        if (uct_component_query(cmpts[c], &ca) != UCS_OK) {
            free(mds);
            continue;
        }
        for (unsigned m = 0; m < ca.md_resource_count; m++) {
            uct_md_config_t *cfg = NULL;
            uct_md_h md = NULL;
            if (uct_md_config_read(cmpts[c], NULL, NULL, &cfg) != UCS_OK) {
                continue;
            }
            s = uct_md_open(cmpts[c], mds[m].md_name, cfg, &md);
            uct_config_release(cfg);
            if (s != UCS_OK) {
                continue;
            }
            uct_md_attr_t attr;
            uct_tl_resource_desc_t *tls = NULL;
            unsigned ntls = 0;
            if (uct_md_query(md, &attr) == UCS_OK &&
                uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
                for (unsigned t = 0; t < ntls; t++) {
                    uint16_t csum = ucs_crc16_string(tls[t].tl_name);
                    if (vlocal_tl(local, csum) >= 0 ||
                        local->ntl == UCX_V_MAX_TLS) {
                        continue;
                    }
                    ucx_vtl_t *v = &local->tl[local->ntl++];
                    v->csum = csum;
                    snprintf(v->tl, sizeof(v->tl), "%s", tls[t].tl_name);
                    snprintf(v->component, sizeof(v->component), "%s",
                             ca.name);
                    v->rkey_size = attr.rkey_packed_size;
                    v->can_reg = (attr.cap.flags & UCT_MD_FLAG_REG) != 0;
                }
                uct_release_tl_resource_list(tls);
            }
            uct_md_close(md);
        }
        free(mds);
    }
    uct_release_component_list(cmpts);
    return PDX_OK;
}

/* Shared-memory transports attach the peer's FIFO segment at ep create
 * from what their iface address says, and assert on an inconsistent one
 * (UCX 1.13.1 src/uct/sm/mm): {u64 segment id with flags in its top bits,
 * then the mapper's part}. sysv: nothing more; posix: the pid namespace
 * (8 bytes) with PID_NS in procfs mode, else nothing with SHM_OPEN, else
 * the backing directory as a NUL-terminated absolute path. */
#define POSIX_F_PROCFS (1ull << 63)
#define POSIX_F_SHM_OPEN (1ull << 62)
#define POSIX_F_PID_NS (1ull << 60)

static void check_iface_addr(vr_t *r, const ucx_vtl_t *tl, const uint8_t *p,
                             unsigned len)
{
    int posix = strcmp(tl->tl, "posix") == 0;
    if (!posix && strcmp(tl->tl, "sysv") != 0) {
        return;
    }
    if (len < 8) {
        vfail(r, "iface address", "%u bytes for %s (a segment id is 8)", len,
              tl->tl);
        return;
    }
    if (!posix) {
        if (len != 8) {
            vfail(r, "iface address", "%u bytes for sysv (8 expected)", len);
        }
        return;
    }
    uint64_t id = 0;
    for (int i = 0; i < 8; i++) {
        id |= (uint64_t)p[i] << (8 * i);
    }
    unsigned extra = len - 8;
    if (id & POSIX_F_PROCFS) {
        unsigned want = (id & POSIX_F_PID_NS) ? 8 : 0;
        if (extra != want) {
            vfail(r, "iface address", "posix procfs segment with %u bytes "
                  "after its id (%u expected)", extra, want);
        }
        return;
    }
    if (id & POSIX_F_PID_NS) {
        vfail(r, "iface address", "posix segment flags 0x%llx",
              (unsigned long long)(id >> 60));
        return;
    }
    if (id & POSIX_F_SHM_OPEN) {
        if (extra != 0) {
            vfail(r, "iface address", "posix shm_open segment with %u bytes "
                  "after its id", extra);
        }
        return;
    }
    /* The directory of a file-backed segment. */
    if (extra < 2 || p[8] != '/' || p[len - 1] != '\0') {
        vfail(r, "iface address", "posix segment directory is not a "
              "NUL-terminated absolute path (%u bytes)", extra);
        return;
    }
    for (unsigned i = 8; i + 1 < len; i++) {
        if (p[i] < 0x20 || p[i] > 0x7e) {
            vfail(r, "iface address", "posix segment directory has byte "
                  "0x%02x", p[i]);
            return;
        }
    }
}

/* Is `v` one of UCX's mm transports (a receive FIFO in shared memory that
 * every same-host sender writes into)? */
static int vtl_is_mm(const ucx_vtl_t *v)
{
    return strcmp(v->component, "posix") == 0 ||
           strcmp(v->component, "sysv") == 0 ||
           strcmp(v->component, "xpmem") == 0;
}

static void parse_ifaces(vr_t *r, const ucx_vlocal_t *local, ucx_vaddr_t *a,
                         unsigned version, unsigned md_index,
                         const uint8_t *dev, size_t dev_len)
{
    int last_tl = 0;
    while (!last_tl && !r->bad) {
        if (++a->nifaces > UCX_V_MAX_RSC) {
            vfail(r, "iface count", "more than %d transports",
                  UCX_V_MAX_RSC);
            return;
        }
        if (!vneed(r, 2, "transport name checksum")) {
            return;
        }
        uint16_t csum = (uint16_t)(r->p[r->off] | r->p[r->off + 1] << 8);
        r->off += 2;
        int tl = vlocal_tl(local, csum);
        if (tl >= 0 && !a->has_mm && vtl_is_mm(&local->tl[tl])) {
            a->has_mm = 1;
            a->mm_dev_len = (uint8_t)(dev_len < sizeof(a->mm_dev)
                                          ? dev_len : sizeof(a->mm_dev));
            memcpy(a->mm_dev, dev, a->mm_dev_len);
        }
        if (tl >= 0 && a->md_tl[md_index] < 0) {
            a->md_tl[md_index] = (int16_t)tl;
        } else if (tl >= 0 &&
                   strcmp(local->tl[a->md_tl[md_index]].component,
                          local->tl[tl].component) != 0) {
            /* UCX would pick the md's component from one of them and this
             * check from another: keys could reach an unchecked one. */
            r->off -= 2;
            vfail(r, "transport name checksum", "md %u has transports of "
                  "two components (%s, %s)", md_index,
                  local->tl[a->md_tl[md_index]].component,
                  local->tl[tl].component);
            return;
        }
        size_t alen = version == V1 ? IFACE_ATTR_V1 : IFACE_ATTR_V2;
        if (!vneed(r, alen, "iface attributes")) {
            return;
        }
        const uint8_t *at = r->p + r->off;
        if (version == V1) {
            float ovh = vfloat(at), bw = vfloat(at + 4), lat = vfloat(at + 8);
            if (!isfinite(ovh) || !isfinite(bw) || !isfinite(lat) ||
                ovh < 0 || lat < 0 || bw == 0) {
                vfail(r, "iface attributes",
                      "overhead, bandwidth or latency not a sane number");
                return;
            }
        } else if (at[1] == 0) {
            vfail(r, "iface attributes", "zero bandwidth");
            return;
        }
        r->off += alen;
        unsigned fl = vu8(r, "iface address length");
        last_tl = (fl & FLAG_LAST) != 0;
        int has_ep = (fl & FLAG_HAS_EP_ADDR) != 0;
        unsigned ilen =
            vext(r, fl, IFACE_LEN_MASK, version, "iface address length");
        if (vneed(r, ilen, "iface address") && tl >= 0) {
            check_iface_addr(r, &local->tl[tl], r->p + r->off, ilen);
        }
        vskip(r, ilen, "iface address");
        unsigned nep = 0;
        int last_ep = !has_ep;
        while (!last_ep && !r->bad) {
            if (++nep > UCX_V_MAX_LANES) {
                vfail(r, "ep address count", "more than %d",
                      UCX_V_MAX_LANES);
                return;
            }
            unsigned elen = vu8(r, "ep address length");
            vskip(r, elen, "ep address");
            unsigned lane = vu8(r, "ep lane index");
            if (!r->bad && (lane & IFACE_LEN_MASK) >= UCX_V_MAX_LANES) {
                vfail(r, "ep lane index", "lane %u out of range",
                      lane & IFACE_LEN_MASK);
                return;
            }
            last_ep = (lane & FLAG_LAST) != 0;
        }
    }
}

pdx_status_t ucx_validate_address(const ucx_vlocal_t *local, const void *buf,
                                  size_t len, ucx_vaddr_t *out, char *why,
                                  size_t why_len)
{
    char scratch[8];
    if (why == NULL || why_len == 0) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    vr_t r = {.p = buf, .len = buf != NULL ? len : 0, .why = why,
              .why_len = why_len};
    ucx_vaddr_t a;
    memset(&a, 0, sizeof(a));
    for (unsigned i = 0; i < UCX_V_MAX_MDS; i++) {
        a.md_tl[i] = -1;
    }
    unsigned h = vu8(&r, "header");
    if (r.bad) {
        return PDX_ERR_CORRUPT;
    }
    unsigned version = h & HDR_VERSION_MASK, flags;
    if (version == V1) {
        flags = h >> 4;
    } else if (version == V2) {
        if (h >> 4 != 0) {
            r.off--;
            vfail(&r, "header", "v2 header with high bits 0x%x", h >> 4);
            return PDX_ERR_CORRUPT;
        }
        flags = vu8(&r, "header flags");
        if (!r.bad && (flags & ~HDR_FLAGS_ALL) != 0) {
            vfail(&r, "header flags", "unknown flags 0x%x", flags);
        }
    } else {
        r.off--;
        vfail(&r, "address version", "version %u (UCX 1.13 knows 0 and 1)",
              version);
        return PDX_ERR_VERSION;
    }
    a.version = version;
    /* v1: the uuid is always there (UCX unpacks it for pre-1.12 peers). */
    if (version == V1 || (flags & HDR_FLAG_WORKER_UUID)) {
        vskip(&r, 8, "worker uuid");
    }
    if (flags & HDR_FLAG_CLIENT_ID) {
        vskip(&r, 8, "client id");
    }
    if (flags & HDR_FLAG_DEBUG_INFO) {
        unsigned n = vu8(&r, "worker name length");
        vskip(&r, n, "worker name");
    }
    if (r.bad) {
        return PDX_ERR_CORRUPT;
    }
    if (!vneed(&r, 1, "md index")) {
        return PDX_ERR_CORRUPT;
    }
    if (r.p[r.off] == NULL_RESOURCE) {
        r.off++;
    } else {
        int last_dev = 0;
        while (!last_dev && !r.bad) {
            if (++a.ndevices > UCX_V_MAX_RSC) {
                vfail(&r, "device count", "more than %d devices",
                      UCX_V_MAX_RSC);
                break;
            }
            unsigned mb = vu8(&r, "md index");
            int empty = (mb & MD_EMPTY_DEV) != 0;
            unsigned md = vext(&r, mb,
                               version == V1 ? MD_MASK_V1 : MD_MASK_V2,
                               version, "md index");
            if (!r.bad && md >= UCX_V_MAX_MDS) {
                vfail(&r, "md index", "md %u out of range", md);
                break;
            }
            a.md_map |= 1ull << md;
            unsigned db = vu8(&r, "device address length");
            last_dev = (db & FLAG_LAST) != 0;
            unsigned dlen =
                vext(&r, db, DEVICE_LEN_MASK, version, "device address length");
            if (db & FLAG_NUM_PATHS) {
                unsigned np = vu8(&r, "device path count");
                if (!r.bad && np == 0) {
                    vfail(&r, "device path count", "%u paths", np);
                }
            }
            if (db & FLAG_SYS_DEVICE) {
                unsigned sd = vu8(&r, "system device");
                if (!r.bad && sd >= UCX_V_MAX_SYS_DEV) {
                    vfail(&r, "system device", "device id %u out of range",
                          sd);
                }
            }
            const uint8_t *dev = r.p + r.off;
            vskip(&r, dlen, "device address");
            if (!empty && !r.bad) {
                parse_ifaces(&r, local, &a, version, md, dev, dlen);
            }
        }
    }
    if (!r.bad && r.off != r.len) {
        vfail(&r, "end", "%zu trailing bytes", r.len - r.off);
    }
    if (r.bad) {
        return PDX_ERR_CORRUPT;
    }
    if (out != NULL) {
        *out = a;
    }
    return PDX_OK;
}

pdx_status_t ucx_validate_rkey(const ucx_vlocal_t *local,
                               const ucx_vaddr_t *peer, const void *buf,
                               size_t len, unsigned mem_type, char *why,
                               size_t why_len)
{
    char scratch[8];
    if (why == NULL || why_len == 0) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    vr_t r = {.p = buf, .len = buf != NULL ? len : 0, .why = why,
              .why_len = why_len};
    if (!vneed(&r, 9, "md map")) {
        return PDX_ERR_CORRUPT;
    }
    uint64_t map = 0;
    for (int i = 0; i < 8; i++) {
        map |= (uint64_t)r.p[i] << (8 * i);
    }
    r.off = 8;
    if (map == 0) {
        r.off = 0;
        vfail(&r, "md map", "no memory domain");
        return PDX_ERR_CORRUPT;
    }
    unsigned mt = vu8(&r, "memory type");
    if (mt != mem_type) {
        r.off--;
        vfail(&r, "memory type", "type %u, the region's is %u", mt, mem_type);
        return PDX_ERR_CORRUPT;
    }
    for (unsigned md = 0; md < UCX_V_MAX_MDS && !r.bad; md++) {
        if (!(map & (1ull << md))) {
            continue;
        }
        if (peer != NULL && !(peer->md_map & (1ull << md))) {
            vfail(&r, "md map", "md %u is not in the peer's address", md);
            break;
        }
        unsigned ksz = vu8(&r, "md key size");
        if (r.bad) {
            break;
        }
        int tl = peer != NULL ? peer->md_tl[md] : -1;
        if (tl >= 0 && local != NULL) {
            const ucx_vtl_t *v = &local->tl[tl];
            if (!v->can_reg) {
                r.off--;
                char f[64];
                snprintf(f, sizeof(f), "md %u (%s) key", md, v->component);
                vfail(&r, f, "%u bytes for an md that cannot register "
                      "memory", ksz);
                break;
            }
            if (ksz != v->rkey_size) {
                r.off--;
                char f[64];
                snprintf(f, sizeof(f), "md %u (%s) key size", md,
                         v->component);
                vfail(&r, f, "%u bytes, this UCX packs %zu", ksz,
                      v->rkey_size);
                break;
            }
        }
        vskip(&r, ksz, "md key");
    }
    if (!r.bad && r.off != r.len) {
        vfail(&r, "end", "%zu trailing bytes", r.len - r.off);
    }
    return r.bad ? PDX_ERR_CORRUPT : PDX_OK;
}
