/* KV layout: arenas sharing block ids, fingerprint, and descriptor lists
 * (per block, merged, paired with a peer) for sets of block ids. */
#include <pdx/kv_layout.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include <pdx/log.h>

#include "kv_call_int.h"

typedef struct arena_rec {
    char name[PDX_ARENA_NAME_MAX + 1];
    uint32_t layer;
    pdx_kv_kind_t kind;
    int is_mtp;
    uint32_t bytes_per_token;
    uint32_t block_tokens;
    uint64_t num_blocks;
    uint64_t base;
    uint64_t stride;
    uint64_t block_bytes;
    pdx_mem_type_t mem_type;
    uint32_t dev_id;
} arena_rec_t;

struct pdx_layout {
    uint32_t magic; /* PDX_MAGIC_LAYOUT; first, as pdx_call.h requires */
    uint32_t block_tokens;
    arena_rec_t *arenas;
    size_t narenas;
    size_t cap;
};

/* Format tag hashed first, so a change in what the fingerprint covers
 * changes every fingerprint. */
static const char layout_fp_tag[] = "pdx-layout-fp/1";

static const char *kind_name(pdx_kv_kind_t kind) {
    switch (kind) {
    case PDX_KV_KIND_MLA:
        return "mla";
    case PDX_KV_KIND_INDEX_K:
        return "index_k";
    case PDX_KV_KIND_KV:
        return "kv";
    }
    return NULL;
}

const char *pdx_kv_kind_to_string(pdx_kv_kind_t kind) {
    PDX_ENTER();
    const char *s = kind_name(kind);
    if (s == NULL) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: kind %d is not a pdx_kv_kind_t",
                      __func__, (int)kind);
        PDX_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    PDX_LEAVE_VAL(PDX_OK, s);
}

static pdx_status_t layout_create(uint32_t block_tokens,
                                  pdx_layout_h *layout_p) {
    if (block_tokens == 0) {
        pdx_error("layout: block_tokens is 0 (must be > 0)");
        return PDX_ERR_INVALID;
    }
    struct pdx_layout *l = pdx_handle_alloc(sizeof(*l), PDX_MAGIC_LAYOUT);
    if (l == NULL) {
        pdx_error("layout: out of memory for a layout");
        return PDX_ERR_NOMEM;
    }
    l->block_tokens = block_tokens;
    *layout_p = l;
    return PDX_OK;
}

pdx_status_t pdx_layout_create(uint32_t block_tokens, pdx_layout_h *layout_p) {
    PDX_ENTER();
    if (!PDX_ARG_OK(layout_p, "layout_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(layout_create(block_tokens, layout_p));
}

static void layout_destroy(pdx_layout_h layout) {
    free(layout->arenas);
    pdx_handle_release(layout);
}

void pdx_layout_destroy(pdx_layout_h layout) {
    PDX_ENTER();
    if (layout == NULL) /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    if (!KV_LAYOUT_OK(layout, "layout"))
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    layout_destroy(layout);
    PDX_LEAVE_VOID(PDX_OK);
}

/* 1 if [base, base + num_blocks * stride) fits in 64 bits. */
static int span_ok(uint64_t base, uint64_t num_blocks, uint64_t stride) {
    if (stride != 0 && num_blocks > UINT64_MAX / stride)
        return 0;
    return num_blocks * stride <= UINT64_MAX - base;
}

static pdx_status_t layout_add_arena(pdx_layout_h l, const pdx_arena_t *a,
                                     size_t *index_p) {
    uint64_t m = a->field_mask;
    size_t name_len = strlen(a->name);
    if (name_len == 0 || name_len > PDX_ARENA_NAME_MAX) {
        pdx_error("layout: arena name '%.*s' must have 1..%d chars",
                  PDX_ARENA_NAME_MAX, a->name, PDX_ARENA_NAME_MAX);
        return PDX_ERR_INVALID;
    }
    arena_rec_t r;
    memset(&r, 0, sizeof(r));
    memcpy(r.name, a->name, name_len);
    r.layer = a->layer;
    r.kind = a->kind;
    r.is_mtp = (m & PDX_ARENA_FIELD_IS_MTP) ? (a->is_mtp != 0) : 0;
    r.bytes_per_token = a->bytes_per_token;
    r.block_tokens =
        (m & PDX_ARENA_FIELD_BLOCK_TOKENS) ? a->block_tokens : l->block_tokens;
    r.num_blocks = a->num_blocks;
    r.block_bytes = (uint64_t)r.bytes_per_token * r.block_tokens;
    r.stride = (m & PDX_ARENA_FIELD_STRIDE) ? a->stride : r.block_bytes;
    r.base = (m & PDX_ARENA_FIELD_BASE) ? a->base : 0;
    r.mem_type = (m & PDX_ARENA_FIELD_MEM_TYPE) ? a->mem_type : PDX_MEM_DRAM;
    r.dev_id = (m & PDX_ARENA_FIELD_DEV_ID) ? a->dev_id : 0;

    if (kind_name(r.kind) == NULL || r.bytes_per_token == 0 ||
        r.num_blocks == 0 || r.block_tokens != l->block_tokens ||
        r.stride < r.block_bytes || !span_ok(r.base, r.num_blocks, r.stride) ||
        (r.mem_type != PDX_MEM_DRAM && r.mem_type != PDX_MEM_VRAM)) {
        pdx_error("layout: arena %s: bad shape (kind %d, %" PRIu32
                  " B/token, %" PRIu32 " tokens/block, layout %" PRIu32
                  ", %" PRIu64 " blocks, stride %" PRIu64 ", base 0x%" PRIx64
                  ")",
                  r.name, (int)r.kind, r.bytes_per_token, r.block_tokens,
                  l->block_tokens, r.num_blocks, r.stride, r.base);
        return PDX_ERR_INVALID;
    }
    if (l->narenas > 0 && r.mem_type != l->arenas[0].mem_type) {
        pdx_error("layout: arena %s: memory type %d differs from the "
                  "layout's %d",
                  r.name, (int)r.mem_type, (int)l->arenas[0].mem_type);
        return PDX_ERR_INVALID;
    }
    for (size_t i = 0; i < l->narenas; i++) {
        if (strcmp(l->arenas[i].name, r.name) == 0) {
            pdx_error("layout: arena %s already exists", r.name);
            return PDX_ERR_EXISTS;
        }
    }
    if (l->narenas == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        arena_rec_t *na = realloc(l->arenas, cap * sizeof(*na));
        if (na == NULL) {
            pdx_error("layout: arena %s: out of memory for %zu arenas",
                      r.name, cap);
            return PDX_ERR_NOMEM;
        }
        l->arenas = na;
        l->cap = cap;
    }
    l->arenas[l->narenas] = r;
    if (index_p != NULL)
        *index_p = l->narenas;
    l->narenas++;
    return PDX_OK;
}

pdx_status_t pdx_layout_add_arena(pdx_layout_h l, const pdx_arena_t *a,
                                  size_t *index_p) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !PDX_ARG_OK(a, "arena") ||
        !PDX_ARG_OK(a->name, "arena->name"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(layout_add_arena(l, a, index_p));
}

size_t pdx_layout_num_arenas(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, l->narenas);
}

pdx_status_t pdx_layout_get_arena(pdx_layout_h l, size_t index,
                                  pdx_arena_t *arena_p) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !PDX_ARG_OK(arena_p, "arena_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    if (index >= l->narenas) {
        pdx_error("layout: arena index %zu out of range (%zu arenas)", index,
                  l->narenas);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    const arena_rec_t *r = &l->arenas[index];
    pdx_arena_t a;
    memset(&a, 0, sizeof(a));
    a.field_mask = PDX_ARENA_FIELD_ALL;
    a.name = r->name;
    a.layer = r->layer;
    a.kind = r->kind;
    a.is_mtp = r->is_mtp;
    a.bytes_per_token = r->bytes_per_token;
    a.block_tokens = r->block_tokens;
    a.num_blocks = r->num_blocks;
    a.base = r->base;
    a.stride = r->stride;
    a.mem_type = r->mem_type;
    a.dev_id = r->dev_id;
    *arena_p = a;
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_layout_find_arena(pdx_layout_h l, const char *name,
                                   size_t *index_p) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !PDX_ARG_OK(name, "name") ||
        !PDX_ARG_OK(index_p, "index_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    for (size_t i = 0; i < l->narenas; i++) {
        if (strcmp(l->arenas[i].name, name) == 0) {
            *index_p = i;
            PDX_LEAVE(PDX_OK);
        }
    }
    pdx_error("layout: no arena named '%.*s' (%zu arenas)",
              PDX_ARENA_NAME_MAX, name, l->narenas);
    PDX_LEAVE(PDX_ERR_NOT_FOUND);
}

pdx_status_t pdx_layout_set_base(pdx_layout_h l, size_t index, uint64_t base,
                                 uint32_t dev_id) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE(PDX_ERR_INVALID);
    if (index >= l->narenas) {
        pdx_error("layout: set_base: arena index %zu out of range (%zu "
                  "arenas)",
                  index, l->narenas);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    arena_rec_t *r = &l->arenas[index];
    if (!span_ok(base, r->num_blocks, r->stride)) {
        pdx_error("layout: arena %s: base 0x%" PRIx64 " + %" PRIu64
                  " blocks of stride %" PRIu64 " wraps the address space",
                  r->name, base, r->num_blocks, r->stride);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    r->base = base;
    r->dev_id = dev_id;
    PDX_LEAVE(PDX_OK);
}

uint32_t pdx_layout_block_tokens(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, l->block_tokens);
}

pdx_mem_type_t pdx_layout_mem_type(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, (pdx_mem_type_t)-1);
    PDX_LEAVE_VAL(PDX_OK,
                 l->narenas ? l->arenas[0].mem_type : PDX_MEM_DRAM);
}

static uint64_t layout_num_blocks(pdx_layout_h l) {
    uint64_t n = l->narenas ? UINT64_MAX : 0;
    for (size_t i = 0; i < l->narenas; i++)
        if (l->arenas[i].num_blocks < n)
            n = l->arenas[i].num_blocks;
    return n;
}

uint64_t pdx_layout_num_blocks(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, layout_num_blocks(l));
}

uint64_t pdx_layout_bytes_per_block(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < l->narenas; i++)
        sum += l->arenas[i].block_bytes;
    PDX_LEAVE_VAL(PDX_OK, sum);
}

static size_t put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return 4;
}

static uint64_t layout_fingerprint(pdx_layout_h l) {
    XXH3_state_t st;
    uint8_t buf[64];
    size_t n;

    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, layout_fp_tag, sizeof(layout_fp_tag));
    n = put_le32(buf, l->block_tokens);
    n += put_le32(buf + n, (uint32_t)l->narenas);
    XXH3_64bits_update(&st, buf, n);
    for (size_t i = 0; i < l->narenas; i++) {
        const arena_rec_t *r = &l->arenas[i];
        uint32_t name_len = (uint32_t)strlen(r->name);
        n = put_le32(buf, name_len);
        XXH3_64bits_update(&st, buf, n);
        XXH3_64bits_update(&st, r->name, name_len);
        n = put_le32(buf, r->layer);
        n += put_le32(buf + n, (uint32_t)r->kind);
        n += put_le32(buf + n, (uint32_t)r->is_mtp);
        n += put_le32(buf + n, r->bytes_per_token);
        n += put_le32(buf + n, r->block_tokens);
        XXH3_64bits_update(&st, buf, n);
    }
    return XXH3_64bits_digest(&st);
}

uint64_t pdx_layout_fingerprint(pdx_layout_h l) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, layout_fingerprint(l));
}

static int arena_packed(const arena_rec_t *r) {
    return r->stride == r->block_bytes;
}

static pdx_desc_t arena_desc(const arena_rec_t *r, uint64_t id,
                             uint64_t nblocks) {
    pdx_desc_t d;
    d.addr = r->base + id * r->stride;
    d.len = nblocks * r->block_bytes;
    d.dev_id = r->dev_id;
    d.reserved = 0;
    return d;
}

/* Checks ids against the layout's block count and that narenas * n fits
 * (the callers have refused NULL ids with n > 0). */
static pdx_status_t check_ids(pdx_layout_h l, const uint64_t *ids, size_t n,
                              const char *side) {
    if (l->narenas > 0 && n > SIZE_MAX / l->narenas / sizeof(pdx_desc_t)) {
        pdx_error("layout: %zu %s block ids x %zu arenas: too many "
                  "descriptors",
                  n, side, l->narenas);
        return PDX_ERR_TOO_LARGE;
    }
    uint64_t nb = layout_num_blocks(l);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= nb) {
            pdx_error("layout: %s block id %" PRIu64 " out of range (%" PRIu64
                      " blocks)",
                      side, ids[i], nb);
            return PDX_ERR_INVALID;
        }
    }
    return PDX_OK;
}

/* The arguments every descriptor function refuses alike. */
static bool descs_args_ok(const char *fn, pdx_layout_h l, const uint64_t *ids,
                          size_t n, const size_t *count_p) {
    if (!pdx_handle_check(l, PDX_MAGIC_LAYOUT, fn, "layout") ||
        !pdx_arg_ok(count_p, fn, "count_p"))
        return false;
    if (n > 0 && ids == NULL) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: ids is NULL (n %zu)", fn, n);
        return false;
    }
    return true;
}

static pdx_status_t out_room(size_t max_out, size_t count) {
    if (max_out < count) {
        pdx_error("layout: %zu descriptors do not fit in max_out %zu", count,
                  max_out);
        return PDX_ERR_TOO_LARGE;
    }
    return PDX_OK;
}

pdx_status_t pdx_layout_block_descs(pdx_layout_h l, const uint64_t *ids,
                                    size_t n, pdx_desc_t *out, size_t max_out,
                                    size_t *count_p) {
    PDX_ENTER();
    if (!descs_args_ok(__func__, l, ids, n, count_p))
        PDX_LEAVE(PDX_ERR_INVALID);
    pdx_status_t st = check_ids(l, ids, n, "local");
    if (st != PDX_OK)
        PDX_LEAVE(st);
    size_t count = l->narenas * n;
    if (out != NULL) {
        if ((st = out_room(max_out, count)) != PDX_OK)
            PDX_LEAVE(st);
        for (size_t a = 0; a < l->narenas; a++)
            for (size_t i = 0; i < n; i++)
                out[a * n + i] = arena_desc(&l->arenas[a], ids[i], 1);
    }
    *count_p = count;
    PDX_LEAVE(PDX_OK);
}

/* Number of runs of ids continuing each other (ids[i] == ids[i-1] + 1). */
static size_t count_runs(const uint64_t *ids, size_t n) {
    size_t runs = n ? 1 : 0;
    for (size_t i = 1; i < n; i++)
        runs += ids[i] != ids[i - 1] + 1;
    return runs;
}

pdx_status_t pdx_layout_merged_descs(pdx_layout_h l, const uint64_t *ids,
                                     size_t n, pdx_desc_t *out, size_t max_out,
                                     size_t *count_p) {
    PDX_ENTER();
    if (!descs_args_ok(__func__, l, ids, n, count_p))
        PDX_LEAVE(PDX_ERR_INVALID);
    pdx_status_t st = check_ids(l, ids, n, "local");
    if (st != PDX_OK)
        PDX_LEAVE(st);
    size_t runs = count_runs(ids, n), count = 0;
    for (size_t a = 0; a < l->narenas; a++)
        count += arena_packed(&l->arenas[a]) ? runs : n;
    if (out != NULL) {
        if ((st = out_room(max_out, count)) != PDX_OK)
            PDX_LEAVE(st);
        size_t j = 0;
        for (size_t a = 0; a < l->narenas; a++) {
            const arena_rec_t *r = &l->arenas[a];
            int packed = arena_packed(r);
            for (size_t i = 0; i < n;) {
                size_t k = i + 1;
                while (packed && k < n && ids[k] == ids[k - 1] + 1)
                    k++;
                out[j++] = arena_desc(r, ids[i], k - i);
                i = k;
            }
        }
    }
    *count_p = count;
    PDX_LEAVE(PDX_OK);
}

static int pair_continues(const uint64_t *lids, const uint64_t *rids,
                          size_t i) {
    return lids[i] == lids[i - 1] + 1 && rids[i] == rids[i - 1] + 1;
}

pdx_status_t
pdx_layout_paired_descs(pdx_layout_h local, const uint64_t *local_ids,
                        pdx_layout_h remote, const uint64_t *remote_ids,
                        size_t n, pdx_desc_t *local_out, pdx_desc_t *remote_out,
                        size_t max_out, size_t *count_p) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(local, "local") || !KV_LAYOUT_OK(remote, "remote") ||
        !PDX_ARG_OK(count_p, "count_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    if (n > 0 && (!PDX_ARG_OK(local_ids, "local_ids") ||
                  !PDX_ARG_OK(remote_ids, "remote_ids")))
        PDX_LEAVE(PDX_ERR_INVALID);
    if ((local_out == NULL) != (remote_out == NULL)) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: %s is NULL but %s is not (both or neither)",
                      __func__, local_out == NULL ? "local_out" : "remote_out",
                      local_out == NULL ? "remote_out" : "local_out");
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    uint64_t lfp = layout_fingerprint(local);
    uint64_t rfp = layout_fingerprint(remote);
    if (lfp != rfp) {
        pdx_error("layout: fingerprint mismatch: local %016" PRIx64
                  ", remote %016" PRIx64,
                  lfp, rfp);
        PDX_LEAVE(PDX_ERR_MISMATCH);
    }
    pdx_status_t st = check_ids(local, local_ids, n, "local");
    if (st == PDX_OK)
        st = check_ids(remote, remote_ids, n, "remote");
    if (st != PDX_OK)
        PDX_LEAVE(st);

    /* Same fingerprint: same arena count and block bytes, arena by arena. */
    size_t runs = n ? 1 : 0, count = 0;
    for (size_t i = 1; i < n; i++)
        runs += !pair_continues(local_ids, remote_ids, i);
    for (size_t a = 0; a < local->narenas; a++) {
        int packed =
            arena_packed(&local->arenas[a]) && arena_packed(&remote->arenas[a]);
        count += packed ? runs : n;
    }
    if (local_out != NULL) {
        if ((st = out_room(max_out, count)) != PDX_OK)
            PDX_LEAVE(st);
        size_t j = 0;
        for (size_t a = 0; a < local->narenas; a++) {
            const arena_rec_t *lr = &local->arenas[a];
            const arena_rec_t *rr = &remote->arenas[a];
            int packed = arena_packed(lr) && arena_packed(rr);
            for (size_t i = 0; i < n;) {
                size_t k = i + 1;
                while (packed && k < n &&
                       pair_continues(local_ids, remote_ids, k))
                    k++;
                local_out[j] = arena_desc(lr, local_ids[i], k - i);
                remote_out[j] = arena_desc(rr, remote_ids[i], k - i);
                j++;
                i = k;
            }
        }
    }
    *count_p = count;
    PDX_LEAVE(PDX_OK);
}

static int align_ok(uint64_t align) {
    return align == 0 || (align & (align - 1)) == 0;
}

/* Carve offsets: arena i at off[i] (if off != NULL); returns the total or
 * UINT64_MAX on overflow. */
static uint64_t carve_plan(pdx_layout_h l, uint64_t align, uint64_t *off) {
    uint64_t mask = align > 1 ? align - 1 : 0, pos = 0;
    for (size_t i = 0; i < l->narenas; i++) {
        const arena_rec_t *r = &l->arenas[i];
        if (pos > UINT64_MAX - mask)
            return UINT64_MAX;
        pos = (pos + mask) & ~mask;
        if (!span_ok(pos, r->num_blocks, r->stride))
            return UINT64_MAX;
        if (off != NULL)
            off[i] = pos;
        pos += r->num_blocks * r->stride;
    }
    return pos;
}

/* Logs why `align` is refused, for the carve functions. */
static bool carve_align_ok(uint64_t align) {
    if (align_ok(align))
        return true;
    pdx_error("layout: carve align %" PRIu64 " is not a power of two", align);
    return false;
}

uint64_t pdx_layout_carve_size(pdx_layout_h l, uint64_t align) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !carve_align_ok(align))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, UINT64_MAX);
    uint64_t need = carve_plan(l, align, NULL);
    if (need == UINT64_MAX) {
        pdx_error("layout: carving %zu arenas (align %" PRIu64
                  ") overflows 64 bits",
                  l->narenas, align);
        PDX_LEAVE_VAL(PDX_ERR_INVALID, UINT64_MAX);
    }
    PDX_LEAVE_VAL(PDX_OK, need);
}

pdx_status_t pdx_layout_carve(pdx_layout_h l, uint64_t base, uint64_t size,
                              uint64_t align, uint32_t dev_id) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !carve_align_ok(align))
        PDX_LEAVE(PDX_ERR_INVALID);
    uint64_t need = carve_plan(l, align, NULL);
    if (need == UINT64_MAX || need > UINT64_MAX - base) {
        pdx_error("layout: carving %zu arenas (align %" PRIu64
                  ") from base 0x%" PRIx64 " wraps the address space",
                  l->narenas, align, base);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (size < need) {
        pdx_error("layout: carve needs %" PRIu64 " bytes, buffer has %" PRIu64,
                  need, size);
        PDX_LEAVE(PDX_ERR_NO_SPACE);
    }
    /* Second pass assigns; the plan above proved every span fits. */
    uint64_t mask = align > 1 ? align - 1 : 0, pos = 0;
    for (size_t i = 0; i < l->narenas; i++) {
        arena_rec_t *r = &l->arenas[i];
        pos = (pos + mask) & ~mask;
        r->base = base + pos;
        r->dev_id = dev_id;
        pos += r->num_blocks * r->stride;
    }
    PDX_LEAVE(PDX_OK);
}

static int glm52_has_index_k(uint32_t layer) {
    /* IndexShare: layers 0, 1, 2 keep their own indexer, then every 4th
     * from 6 to 74; the others reuse a neighbour's top-k. */
    if (layer <= 2)
        return 1;
    return layer >= 6 && layer <= 74 && (layer - 6) % 4 == 0;
}

int pdx_glm52_has_index_k(uint32_t layer) {
    PDX_ENTER();
    PDX_LEAVE_VAL(PDX_OK, glm52_has_index_k(layer));
}

/* `kind` has been checked. */
static pdx_status_t add_layer_arena(pdx_layout_h l, const char *prefix,
                                    uint32_t layer, pdx_kv_kind_t kind,
                                    int is_mtp, uint32_t bpt,
                                    uint64_t num_blocks,
                                    pdx_mem_type_t mem_type, uint32_t dev_id) {
    char name[PDX_ARENA_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s%" PRIu32 ".%s", prefix, layer,
             kind_name(kind));
    pdx_arena_t a = {
        .field_mask = PDX_ARENA_FIELD_IS_MTP | PDX_ARENA_FIELD_MEM_TYPE |
                      PDX_ARENA_FIELD_DEV_ID,
        .name = name,
        .layer = layer,
        .kind = kind,
        .is_mtp = is_mtp,
        .bytes_per_token = bpt,
        .num_blocks = num_blocks,
        .mem_type = mem_type,
        .dev_id = dev_id,
    };
    return layout_add_arena(l, &a, NULL);
}

pdx_status_t pdx_layout_add_layer_arena(pdx_layout_h l, const char *prefix,
                                        uint32_t layer, pdx_kv_kind_t kind,
                                        int is_mtp, uint32_t bpt,
                                        uint64_t num_blocks,
                                        pdx_mem_type_t mem_type,
                                        uint32_t dev_id) {
    PDX_ENTER();
    if (!KV_LAYOUT_OK(l, "layout") || !PDX_ARG_OK(prefix, "prefix"))
        PDX_LEAVE(PDX_ERR_INVALID);
    if (kind_name(kind) == NULL) {
        pdx_error("layout: layer %" PRIu32 ": kind %d is not a "
                  "pdx_kv_kind_t",
                  layer, (int)kind);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(add_layer_arena(l, prefix, layer, kind, is_mtp, bpt, num_blocks,
                             mem_type, dev_id));
}

static pdx_status_t layout_glm52(uint64_t num_blocks, pdx_mem_type_t mem_type,
                                 uint32_t dev_id, pdx_layout_h *layout_p) {
    if (num_blocks == 0) {
        pdx_error("layout: glm52: num_blocks is 0 (must be > 0)");
        return PDX_ERR_INVALID;
    }
    pdx_layout_h l;
    pdx_status_t st = layout_create(PDX_GLM52_BLOCK_TOKENS, &l);
    if (st != PDX_OK)
        return st;
    for (uint32_t layer = 0; layer < PDX_GLM52_NUM_LAYERS && st == PDX_OK;
         layer++) {
        st = add_layer_arena(l, "layer", layer, PDX_KV_KIND_MLA, 0,
                             PDX_GLM52_MLA_BYTES_PER_TOKEN, num_blocks,
                             mem_type, dev_id);
        if (st == PDX_OK && glm52_has_index_k(layer))
            st = add_layer_arena(l, "layer", layer, PDX_KV_KIND_INDEX_K, 0,
                                 PDX_GLM52_INDEX_K_BYTES_PER_TOKEN,
                                 num_blocks, mem_type, dev_id);
    }
    if (st == PDX_OK)
        st = add_layer_arena(l, "mtp", PDX_GLM52_MTP_LAYER, PDX_KV_KIND_MLA,
                             1, PDX_GLM52_MLA_BYTES_PER_TOKEN, num_blocks,
                             mem_type, dev_id);
    if (st == PDX_OK)
        st = add_layer_arena(l, "mtp", PDX_GLM52_MTP_LAYER,
                             PDX_KV_KIND_INDEX_K, 1,
                             PDX_GLM52_INDEX_K_BYTES_PER_TOKEN, num_blocks,
                             mem_type, dev_id);
    if (st != PDX_OK) {
        layout_destroy(l);
        return st;
    }
    *layout_p = l;
    return PDX_OK;
}

pdx_status_t pdx_layout_glm52(uint64_t num_blocks, pdx_mem_type_t mem_type,
                              uint32_t dev_id, pdx_layout_h *layout_p) {
    PDX_ENTER();
    if (!PDX_ARG_OK(layout_p, "layout_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(layout_glm52(num_blocks, mem_type, dev_id, layout_p));
}
