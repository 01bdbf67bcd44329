/* A program built against an installed pdx (pkg-config or find_package):
 * two agents in this process, UCX and cma backends loaded from the
 * installed module directory, a 1 MiB READ checked byte for byte. Prints
 * where libpdx.so and the modules were mapped from; exits 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/pdx.h>

#define LEN (1u << 20)

static int fail(const char *what, pdx_status_t st)
{
    fprintf(stderr, "consumer: %s: %s (%s)\n", what, pdx_status_string(st),
            pdx_last_error());
    return 1;
}

/* Paths of mapped objects whose name contains `needle`, one per line. */
static int print_maps(const char *needle, const char *prefix)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], last[4096] = "";
    int found = 0, outside = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        char *path = strchr(line, '/');
        if (path == NULL || strstr(path, needle) == NULL) {
            continue;
        }
        path[strcspn(path, "\n")] = '\0';
        if (strcmp(path, last) == 0) {
            continue;
        }
        snprintf(last, sizeof(last), "%s", path);
        printf("mapped: %s\n", path);
        found++;
        outside += strncmp(path, prefix, strlen(prefix)) != 0;
    }
    if (f != NULL) {
        fclose(f);
    }
    return found > 0 && outside == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *prefix = argc > 1 ? argv[1] : "/";
    pdx_agent_h a, b;
    pdx_status_t st;
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    if ((st = pdx_agent_create("consumer-a", &ap, &a)) != PDX_OK ||
        (st = pdx_agent_create("consumer-b", &ap, &b)) != PDX_OK) {
        return fail("pdx_agent_create", st);
    }
    pdx_agent_h ags[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if ((st = pdx_backend_create(ags[i], "ucx", NULL, 0, NULL)) != PDX_OK)
            return fail("pdx_backend_create(ucx)", st);
        if ((st = pdx_backend_create(ags[i], "cma", NULL, 0, NULL)) != PDX_OK)
            return fail("pdx_backend_create(cma)", st);
    }
    unsigned char *src, *dst;
    if ((st = pdx_mem_alloc(LEN, 0, (void **)&src)) != PDX_OK ||
        (dst = aligned_alloc(4096, LEN)) == NULL) {
        return fail("allocation", st);
    }
    for (unsigned i = 0; i < LEN; i++) {
        src[i] = (unsigned char)(i * 31u + 7u);
    }
    memset(dst, 0, LEN);
    pdx_mem_reg_h rs, rd;
    if ((st = pdx_mem_register(b, PDX_MEM_DRAM, (uint64_t)(uintptr_t)src, LEN,
                               0, 0, &rs)) != PDX_OK ||
        (st = pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)dst, LEN,
                               0, 0, &rd)) != PDX_OK) {
        return fail("pdx_mem_register", st);
    }
    void *blob;
    size_t blen;
    char peer[PDX_NAME_MAX];
    if ((st = pdx_agent_describe(b, &blob, &blen)) != PDX_OK ||
        (st = pdx_peer_load(a, blob, blen, peer)) != PDX_OK) {
        return fail("describe/load", st);
    }
    pdx_blob_free(blob);
    pdx_desc_t l = {(uint64_t)(uintptr_t)dst, LEN, 0, 0};
    pdx_desc_t r = {(uint64_t)(uintptr_t)src, LEN, 0, 0};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    if ((st = pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, peer, NULL, 0,
                              &x)) != PDX_OK) {
        return fail("pdx_xfer_create", st);
    }
    st = pdx_xfer_post(x);
    for (long i = 0; st == PDX_INPROGRESS && i < 100000000L; i++) {
        st = pdx_xfer_check(x);
    }
    if (st != PDX_OK) {
        return fail("READ", st);
    }
    if (memcmp(src, dst, LEN) != 0) {
        fprintf(stderr, "consumer: READ: bytes differ\n");
        return 1;
    }
    pdx_xfer_release(x);
    printf("consumer: READ of %u bytes byte-exact (pdx %s)\n", LEN,
           pdx_version());
    int maps = print_maps("libpdx", prefix);
    pdx_mem_deregister(a, rd);
    pdx_mem_deregister(b, rs);
    pdx_agent_destroy(a);
    pdx_agent_destroy(b);
    pdx_mem_free(src);
    free(dst);
    if (maps != 0) {
        fprintf(stderr, "consumer: libpdx or a module was not mapped from "
                        "%s\n", prefix);
        return 1;
    }
    return 0;
}
