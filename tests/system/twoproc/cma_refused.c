/* Two processes on one host where this one may not read the other's
 * memory with process_vm_readv/writev: the agent must carry what cma
 * cannot reach by another backend, not fail every request.
 *
 *   --mode seccomp  this process refuses process_vm_readv/writev and
 *                   pidfd_getfd with EPERM (a container runtime's default
 *                   seccomp profile without CAP_SYS_PTRACE): the target's
 *                   shared region is still mapped (through /proc/<pid>/fd)
 *                   and copied by cma's memcpy, its private region goes
 *                   over UCX shared memory.
 *   --mode nodump   the target is not dumpable and this process has no
 *                   CAP_SYS_PTRACE (as between two users): nothing of
 *                   the target can be mapped or read, so both regions go
 *                   over UCX (tcp on both sides: UCX's shared memory needs
 *                   the same access).
 *
 * The target (a child) registers a private and a shared region of 1 MiB
 * with known bytes; this process READs both (1 MiB and 8448 B at an odd
 * offset), checks the bytes and which backend moved them, WRITEs both and
 * has the target check what landed. Before the fix every request to the
 * private region failed ("process_vm_readv ... Operation not permitted").
 * Exit 77 (skipped) where the restriction cannot be set up. */

#include <errno.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"

#define REGION (1u << 20)
#define LIMIT_MS 20000

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static unsigned char pattern(uint64_t off, unsigned salt)
{
    uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + salt * 0x51ull;
    return (unsigned char)((x >> 31) ^ (off & 7) ^ salt);
}

static void fill(unsigned char *m, unsigned salt)
{
    for (uint64_t o = 0; o < REGION; o++) {
        m[o] = pattern(o, salt);
    }
}

/* Offset of the first byte of m (at `off` of its region) that is not
 * pattern(salt), or -1. */
static long long first_bad(const unsigned char *m, uint64_t off,
                           uint64_t len, unsigned salt)
{
    for (uint64_t i = 0; i < len; i++) {
        if (m[i] != pattern(off + i, salt)) {
            return (long long)(off + i);
        }
    }
    return -1;
}

static pdx_agent_h agent(const char *name, const char *tls)
{
    pdx_agent_h a = ctl_ucx_agent(name, tls, LIMIT_MS);
    CHECK(pdx_backend_create(a, "cma", NULL, 0, NULL));
    return a;
}

static int run_target(int fd, int nodump, const char *tls)
{
    pdx_agent_h a = agent("refused-target", tls);
    unsigned char *priv = aligned_alloc(4096, REGION);
    void *shm = NULL;
    if (priv == NULL) {
        die("target: no memory");
    }
    CHECK(pdx_mem_alloc(REGION, 0, &shm));
    fill(priv, 1);
    fill(shm, 2);
    pdx_mem_reg_h r1, r2;
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)priv,
                           REGION, 0, 0, &r1));
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)shm,
                           REGION, 0, 0, &r2));
    if (nodump && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
        die("target: PR_SET_DUMPABLE: %s", strerror(errno));
    }
    ctl_send_addrs(fd, (uint64_t)(uintptr_t)priv, (uint64_t)(uintptr_t)shm);
    ctl_send_blob(a, fd);
    char *m = recv_msg(fd, NULL);
    if (m == NULL || strcmp(m, "check") != 0) {
        die("target: expected \"check\"");
    }
    free(m);
    long long b1 = first_bad(priv, 0, REGION, 3);
    long long b2 = first_bad(shm, 0, REGION, 4);
    char ans[128];
    snprintf(ans, sizeof(ans), "%lld %lld", b1, b2);
    send_msg(fd, ans, (uint32_t)strlen(ans) + 1);
    m = recv_msg(fd, NULL); /* EOF: the initiator is done */
    free(m);
    pdx_mem_deregister(a, r1);
    pdx_mem_deregister(a, r2);
    pdx_agent_destroy(a);
    pdx_mem_free(shm);
    free(priv);
    return 0;
}

/* This process refuses process_vm_readv/writev and pidfd_getfd: 0, or -1
 * where seccomp filters cannot be set (then the test is skipped). */
static int refuse_cross_memory(void)
{
#if defined(__x86_64__)
    const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const unsigned arch = AUDIT_ARCH_AARCH64;
#else
    return -1;
#endif
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                 offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_getfd, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K,
                 SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        fprintf(stderr, "cma_refused: seccomp: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* This process gives up CAP_SYS_PTRACE (effective and permitted). */
static int drop_ptrace_cap(void)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0) {
        return -1;
    }
    d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    d[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
    d[CAP_SYS_PTRACE / 32].inheritable &= ~(1u << (CAP_SYS_PTRACE % 32));
    return syscall(SYS_capset, &h, d) == 0 ? 0 : -1;
}

/* One request of `len` bytes between local `laddr` and the peer's
 * `raddr`; dies unless it ends PDX_OK; the backend that moved it into
 * be (16 bytes). */
static void xfer(pdx_agent_h a, pdx_xfer_op_t op, const char *peer,
                 uint64_t laddr, uint64_t raddr, uint64_t len, char *be)
{
    pdx_desc_t l = {.addr = laddr, .len = len};
    pdx_desc_t r = {.addr = raddr, .len = len};
    pdx_desc_list_t ll = {.mem_type = PDX_MEM_DRAM, .descs = &l, .count = 1};
    pdx_desc_list_t rl = {.mem_type = PDX_MEM_DRAM, .descs = &r, .count = 1};
    pdx_xfer_h x;
    CHECK(pdx_xfer_create(a, op, &ll, &rl, peer, NULL, 0, &x));
    pdx_status_t st = ctl_xfer_run(x, LIMIT_MS);
    if (st != PDX_OK) {
        die("%s of %llu bytes at 0x%llx: %s (%s)",
            op == PDX_XFER_READ ? "READ" : "WRITE", (unsigned long long)len,
            (unsigned long long)raddr, pdx_status_string(st),
            pdx_last_error());
    }
    pdx_xfer_telemetry_t t;
    CHECK(pdx_xfer_telemetry(x, &t));
    snprintf(be, 16, "%s", t.backend);
    printf("  %s %8llu B at 0x%llx: %s %s%s%s\n",
           op == PDX_XFER_READ ? "READ " : "WRITE", (unsigned long long)len,
           (unsigned long long)raddr, t.backend,
           t.transport, t.fallback_why[0] ? ": " : "", t.fallback_why);
    pdx_xfer_release(x);
}

int main(int argc, char **argv)
{
    const char *mode = "seccomp";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            mode = argv[++i];
        } else {
            die("usage: cma_refused [--mode seccomp|nodump]");
        }
    }
    int nodump = strcmp(mode, "nodump") == 0;
    if (!nodump && strcmp(mode, "seccomp") != 0) {
        die("unknown mode %s", mode);
    }
    /* UCX's shared memory needs what cma needs between two users. */
    const char *tls = nodump ? "tcp" : "sm";
    int fd;
    pid_t tp = ctl_fork(&fd);
    if (tp == 0) {
        _exit(run_target(fd, nodump, tls));
    }
    if ((nodump ? drop_ptrace_cap() : refuse_cross_memory()) != 0) {
        close(fd);
        waitpid(tp, NULL, 0);
        printf("cma_refused: cannot restrict this process here: skipped\n");
        return 77;
    }
    pdx_agent_h a = agent("refused-initiator", tls);
    unsigned char *local = aligned_alloc(4096, 2 * REGION);
    if (local == NULL) {
        die("no memory");
    }
    memset(local, 0, 2 * REGION);
    pdx_mem_reg_h lr; /* released by the agent's destroy */
    CHECK(pdx_mem_register(a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)local,
                           2 * REGION, 0, 0, &lr));
    uint64_t priv, shm;
    ctl_recv_addrs(fd, "target", &priv, &shm);
    char peer[PDX_NAME_MAX];
    ctl_load_peer(a, fd, peer, "target");

    /* Private memory: never cma's here (process_vm_* refused). */
    char be[16];
    uint64_t lp = (uint64_t)(uintptr_t)local;
    uint64_t ls = lp + REGION;
    printf("cma_refused --mode %s:\n", mode);
    xfer(a, PDX_XFER_READ, peer, lp, priv, REGION, be);
    if (strcmp(be, "ucx") != 0) {
        die("private region READ over %s, not ucx", be);
    }
    long long bad = first_bad(local, 0, REGION, 1);
    if (bad >= 0) {
        die("private region READ: byte %lld differs", bad);
    }
    memset(local, 0, REGION);
    xfer(a, PDX_XFER_READ, peer, lp + 4099, priv + 12345, 8448, be);
    if ((bad = first_bad(local + 4099, 12345, 8448, 1)) >= 0) {
        die("private region small READ: byte %lld differs", bad);
    }
    /* Shared memory: mapped by cma where /proc/<pid>/fd lets it. */
    const char *want = nodump ? "ucx" : "cma";
    xfer(a, PDX_XFER_READ, peer, ls, shm, REGION, be);
    if (strcmp(be, want) != 0) {
        die("shared region READ over %s, not %s", be, want);
    }
    if ((bad = first_bad(local + REGION, 0, REGION, 2)) >= 0) {
        die("shared region READ: byte %lld differs", bad);
    }
    xfer(a, PDX_XFER_READ, peer, ls + 64, shm + 8192 + 64, 8448, be);
    if ((bad = first_bad(local + REGION + 64, 8192 + 64, 8448, 2)) >= 0) {
        die("shared region small READ: byte %lld differs", bad);
    }
    /* WRITEs, checked by the target. */
    fill(local, 3);
    fill(local + REGION, 4);
    xfer(a, PDX_XFER_WRITE, peer, lp, priv, REGION, be);
    if (strcmp(be, "ucx") != 0) {
        die("private region WRITE over %s, not ucx", be);
    }
    xfer(a, PDX_XFER_WRITE, peer, ls, shm, REGION, be);
    if (strcmp(be, want) != 0) {
        die("shared region WRITE over %s, not %s", be, want);
    }
    send_msg(fd, "check", 6);
    char *ans = recv_msg(fd, NULL);
    if (ans == NULL || strcmp(ans, "-1 -1") != 0) {
        die("the target found other bytes than written (first bad offset "
            "private, shared: %s)", ans ? ans : "no answer");
    }
    free(ans);
    /* The target goes first: it never loaded this agent, so a
     * deregistration here would wait for an acknowledgement it never
     * sends; the agent's destroy releases the region. */
    close(fd);
    int status = 0;
    if (waitpid(tp, &status, 0) != tp || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        die("the target failed (status 0x%x)", status);
    }
    pdx_agent_destroy(a);
    free(local);
    printf("cma_refused --mode %s: ok\n", mode);
    return 0;
}
