/* Module loader: finds libpdx_backend_<name>.so (and the store modules,
 * libpdx_store_<name>.so) in PDX_PLUGIN_PATH, then next to libpdx.so,
 * checks the ABI before any other call and dlcloses what it rejects,
 * saying why. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pdx/store.h>

#include "loader_int.h"

/* Directory holding libpdx.so (found through one of its own symbols). */
static void self_dir(char *buf, size_t len)
{
    Dl_info info;
    buf[0] = '\0';
    if (dladdr((void *)&pdx_loader_open, &info) == 0 ||
        info.dli_fname == NULL) {
        return;
    }
    snprintf(buf, len, "%s", info.dli_fname);
    char *slash = strrchr(buf, '/');
    if (slash != NULL) {
        *slash = '\0';
    } else {
        snprintf(buf, len, ".");
    }
}

static int valid_name(const char *name)
{
    if (name == NULL || name[0] == '\0' || strlen(name) >= 32) {
        return 0;
    }
    for (const char *c = name; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '_')) {
            return 0;
        }
    }
    return 1;
}

/* What kind of module is searched: backends and stores share the search
 * path and the dlopen rules, and differ in their file prefix, symbol and
 * table checks. */
typedef struct module_kind {
    const char *what;   /* "backend", "store" (log lines) */
    const char *prefix; /* file name prefix */
    const char *symbol;
    /* The table's ABI version, size and name are acceptable: NULL, else
     * the reason (in `detail` or static). */
    const char *(*check)(const void *table, const char *name, char *detail,
                         size_t len);
} module_kind_t;

/* The checks every module table takes: its ABI version, its size and the
 * name it gives itself. NULL if they hold, else `detail` with the reason. */
static const char *check_table(uint32_t abi, uint32_t need_abi, uint32_t size,
                               size_t min_size, const char *self,
                               const char *name, char *detail, size_t len)
{
    if (abi != need_abi) {
        snprintf(detail, len, "abi version %u, need %u", abi, need_abi);
    } else if (size < min_size) {
        snprintf(detail, len, "ops table of %u bytes, need %zu", size,
                 min_size);
    } else if (self == NULL || strcmp(self, name) != 0) {
        snprintf(detail, len, "module names itself '%s'",
                 self ? self : "(null)");
    } else {
        return NULL;
    }
    return detail;
}

static const char *check_backend(const void *table, const char *name,
                                 char *detail, size_t len)
{
    const pdx_backend_ops_t *ops = table;
    return check_table(ops->abi_version, PDX_BACKEND_ABI_VERSION, ops->size,
                       PDX_BACKEND_OPS_MIN_SIZE, ops->name, name, detail,
                       len);
}

static const char *check_store(const void *table, const char *name,
                               char *detail, size_t len)
{
    const pdx_store_ops_t *ops = table;
    return check_table(ops->abi_version, PDX_STORE_ABI_VERSION, ops->size,
                       PDX_STORE_OPS_MIN_SIZE, ops->name, name, detail, len);
}

static const module_kind_t g_backend_kind = {
    "backend", "libpdx_backend_", PDX_BACKEND_SYMBOL, check_backend};
static const module_kind_t g_store_kind = {"store", "libpdx_store_",
                                           PDX_STORE_SYMBOL, check_store};

/* Try one path; 1 = accepted, 0 = absent, -1 = rejected (reason logged). */
static int try_path(const module_kind_t *kind, const char *path,
                    const char *name, const void **table_p, void **dl_p,
                    char *why, size_t why_len)
{
    if (access(path, F_OK) != 0) {
        return 0;
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *err = dlerror();
        snprintf(why, why_len, "%s: dlopen failed: %s", path,
                 err ? err : "?");
        pdx_warn("%s %s: rejected %s", kind->what, name, why);
        return -1;
    }
    const void *table = dlsym(dl, kind->symbol);
    const char *reason = NULL;
    char detail[128];
    if (table == NULL) {
        snprintf(detail, sizeof(detail), "no %s symbol", kind->symbol);
        reason = detail;
    } else {
        reason = kind->check(table, name, detail, sizeof(detail));
    }
    if (reason != NULL) {
        snprintf(why, why_len, "%s: %s", path, reason);
        pdx_warn("%s %s: rejected %s", kind->what, name, why);
        dlclose(dl);
        return -1;
    }
    /* Accepted modules stay mapped for the life of the process: transport
     * libraries (UCX's memory hooks in particular) do not survive being
     * unmapped while the process runs. */
    void *pin = dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    if (pin != NULL) {
        dlclose(pin);
    }
    *table_p = table;
    *dl_p = dl;
    return 1;
}

static pdx_status_t module_open(const module_kind_t *kind, const char *name,
                                const void **table_p, void **dl_p, char *why,
                                size_t why_len)
{
    char file[64], path[PATH_MAX], dir[PATH_MAX];
    int rejected = 0;
    why[0] = '\0';
    if (!valid_name(name)) {
        snprintf(why, why_len, "invalid %s name", kind->what);
        return PDX_ERR_INVALID;
    }
    snprintf(file, sizeof(file), "%s%s.so", kind->prefix, name);

    const char *env = getenv("PDX_PLUGIN_PATH");
    if (env != NULL) {
        const char *p = env;
        for (int guard = 0; guard < 64 && *p; guard++) {
            const char *end = strchr(p, ':');
            size_t n = end ? (size_t)(end - p) : strlen(p);
            if (n > 0 && n < sizeof(dir)) {
                memcpy(dir, p, n);
                dir[n] = '\0';
                snprintf(path, sizeof(path), "%s/%s", dir, file);
                int r = try_path(kind, path, name, table_p, dl_p, why,
                                 why_len);
                if (r > 0) {
                    return PDX_OK;
                }
                rejected |= r < 0;
            }
            if (end == NULL) {
                break;
            }
            p = end + 1;
        }
    }
    self_dir(dir, sizeof(dir));
    if (dir[0] != '\0') {
        const char *subs[] = {"/pdx/", "/"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof(path), "%s%s%s", dir, subs[i], file);
            int r = try_path(kind, path, name, table_p, dl_p, why, why_len);
            if (r > 0) {
                return PDX_OK;
            }
            rejected |= r < 0;
        }
    }
    if (rejected) {
        return PDX_ERR_VERSION;
    }
    snprintf(why, why_len, "%s not found in PDX_PLUGIN_PATH (%s) or %s/pdx",
             file, env ? env : "unset", dir[0] ? dir : "?");
    return PDX_ERR_NOT_FOUND;
}

pdx_status_t pdx_loader_open(const char *name, const pdx_backend_ops_t **ops_p,
                             void **dl_p, char *why, size_t why_len)
{
    const void *t = NULL;
    pdx_status_t st = module_open(&g_backend_kind, name, &t, dl_p, why,
                                  why_len);
    if (st == PDX_OK) {
        *ops_p = t;
    }
    return st;
}

pdx_status_t pdx_loader_open_store(const char *name,
                                   const pdx_store_ops_t **ops_p, void **dl_p,
                                   char *why, size_t why_len)
{
    const void *t = NULL;
    pdx_status_t st = module_open(&g_store_kind, name, &t, dl_p, why,
                                  why_len);
    if (st == PDX_OK) {
        *ops_p = t;
    }
    return st;
}

void pdx_loader_close(void *dl)
{
    if (dl != NULL) {
        dlclose(dl);
    }
}
