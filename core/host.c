/* The host identity: which peers share this kernel and pid namespace. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base_int.h"

pdx_status_t pdx_host_id(char *buf, size_t len)
{
    char host[64] = "unknown", boot[64] = "";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL) {
            boot[0] = '\0';
        }
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    /* Same host means same kernel and same pid namespace: the boot id
     * separates hosts that share a hostname, and the pid namespace
     * separates containers on one kernel that cannot open each other's
     * pidfds (nor use CUDA IPC of each other's processes): those are other
     * hosts to pdx, reached over UCX. The hostname keeps it readable. */
    char pidns[64] = "";
    ssize_t n = readlink("/proc/self/ns/pid", pidns, sizeof(pidns) - 1);
    pidns[n > 0 ? n : 0] = '\0';
    snprintf(buf, len, "%s/%s/%s", host, boot, pidns);
    return PDX_OK;
}

bool pdx_host_same_kernel(const char *a, const char *b)
{
    /* "<host>/<boot>/<pidns>": equal up to the last '/'. */
    const char *ea = strrchr(a, '/'), *eb = strrchr(b, '/');
    return ea != NULL && eb != NULL && ea - a == eb - b &&
           strncmp(a, b, (size_t)(ea - a)) == 0;
}
