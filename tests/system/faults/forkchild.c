/* fork() with pdx live in the parent: agents with progress threads, the
 * cma worker, a large READ in flight, a prepared list, shared memory.
 *   use     the child calls pdx on what it inherited: every call is refused
 *           with an error naming fork(); releases and destroys are quiet
 *           no-ops; the child makes its own agents and READs byte-exact;
 *           then it exits normally (destructors run).
 *   exit    the child touches nothing and exits (exit(), destructors run).
 *   storm   a parent thread makes and releases lists and requests without
 *           pause while the main thread forks 32 children that exit at once:
 *           none may hang on a lock the fork caught held.
 * Each child must exit 0 within 10 s; the parent's READs stay byte-exact
 * and its agents are destroyed cleanly afterwards.
 *
 * forkchild use|exit|storm */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include <pdx/pdx.h>

#define LEN (32u << 20) /* > cma's inline size: chunked by its worker */
/* A child that only exits has 10 s; one that makes agents of its own and
 * READs 32 MiB has 30 s (a loaded 2-core machine). */
#define CHILD_BOUND_MS 10000
#define CHILD_WORK_BOUND_MS 30000

typedef struct pair {
    pdx_agent_h a, b; /* a READs from b */
    unsigned char *src, *dst;
    pdx_mem_reg_h rs, rd;
    char peer[PDX_NAME_MAX];
} pair_t;

static void pair_make(pair_t *p, const char *tag, bool shm)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    char na[32], nb[32];
    snprintf(na, sizeof(na), "fork-%s-a", tag);
    snprintf(nb, sizeof(nb), "fork-%s-b", tag);
    CHECK(pdx_agent_create(na, &ap, &p->a));
    CHECK(pdx_agent_create(nb, &ap, &p->b));
    pdx_agent_h ags[2] = {p->a, p->b};
    for (int i = 0; i < 2; i++) {
        CHECK(pdx_backend_create(ags[i], "ucx", NULL, 0, NULL));
        if (shm) {
            CHECK(pdx_backend_create(ags[i], "cma", NULL, 0, NULL));
        }
    }
    if (shm) {
        CHECK(pdx_mem_alloc(LEN, PDX_MEM_F_POPULATE, (void **)&p->src));
    } else if ((p->src = aligned_alloc(4096, LEN)) == NULL) {
        die("out of memory");
    }
    if ((p->dst = aligned_alloc(4096, LEN)) == NULL) {
        die("out of memory");
    }
    for (size_t i = 0; i < LEN; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)p;
        memcpy(p->src + i, &v, 8);
    }
    CHECK(pdx_mem_register(p->b, PDX_MEM_DRAM, (uint64_t)(uintptr_t)p->src,
                           LEN, 0, 0, &p->rs));
    CHECK(pdx_mem_register(p->a, PDX_MEM_DRAM, (uint64_t)(uintptr_t)p->dst,
                           LEN, 0, 0, &p->rd));
    void *blob;
    size_t blen;
    CHECK(pdx_agent_describe(p->b, &blob, &blen));
    CHECK(pdx_peer_load(p->a, blob, blen, p->peer));
    pdx_blob_free(blob);
}

static pdx_status_t read_post(pair_t *p, pdx_xfer_h *x_p)
{
    memset(p->dst, 0, LEN);
    pdx_desc_t l = {(uint64_t)(uintptr_t)p->dst, LEN, 0, 0};
    pdx_desc_t r = {(uint64_t)(uintptr_t)p->src, LEN, 0, 0};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_status_t st = pdx_xfer_create(p->a, PDX_XFER_READ, &ll, &rl, p->peer,
                                      NULL, 0, x_p);
    return st == PDX_OK ? pdx_xfer_post(*x_p) : st;
}

static void read_finish(pair_t *p, pdx_xfer_h x, pdx_status_t st)
{
    uint64_t t0 = pdx_now_ms();
    while (st == PDX_INPROGRESS && pdx_now_ms() - t0 < 20000) {
        st = pdx_xfer_check(x);
    }
    if (st != PDX_OK) {
        die("READ ended '%s' (%s)", pdx_status_string(st), pdx_last_error());
    }
    if (memcmp(p->src, p->dst, LEN) != 0) {
        die("READ: bytes differ");
    }
    pdx_xfer_release(x);
}

static void pair_free(pair_t *p, bool shm)
{
    CHECK(pdx_mem_deregister(p->a, p->rd));
    CHECK(pdx_mem_deregister(p->b, p->rs));
    pdx_agent_destroy(p->a);
    pdx_agent_destroy(p->b);
    if (shm) {
        CHECK(pdx_mem_free(p->src));
    } else {
        free(p->src);
    }
    free(p->dst);
}

/* A refused call: PDX_ERR_INVALID and an error naming fork(). */
static void expect_refused(const char *what, pdx_status_t st)
{
    if (st != PDX_ERR_INVALID || strstr(pdx_last_error(), "fork()") == NULL) {
        fprintf(stderr, "child: %s on an inherited handle: '%s' (%s)\n", what,
                pdx_status_string(st), pdx_last_error());
        _exit(3);
    }
}

static int child_use(pair_t *p, pdx_xfer_h x, pdx_dlist_h dl)
{
    expect_refused("pdx_xfer_post", pdx_xfer_post(x));
    expect_refused("pdx_xfer_check", pdx_xfer_check(x));
    expect_refused("pdx_peer_state", pdx_peer_state(p->a, p->peer));
    expect_refused("pdx_notif_send", pdx_notif_send(p->a, p->peer, "x", 1));
    pdx_mem_reg_h r;
    expect_refused("pdx_mem_register",
                   pdx_mem_register(p->a, PDX_MEM_DRAM,
                                    (uint64_t)(uintptr_t)p->dst, 4096, 0, 0,
                                    &r));
    void *blob;
    size_t blen;
    expect_refused("pdx_agent_describe", pdx_agent_describe(p->a, &blob,
                                                            &blen));
    pdx_xfer_h x2;
    uint32_t idx = 0;
    expect_refused("pdx_xfer_make", pdx_xfer_make(p->a, PDX_XFER_READ, dl,
                                                  &idx, dl, &idx, 1, NULL, 0,
                                                  &x2));
    printf("child: every call on inherited handles refused: %s\n",
           pdx_last_error());
    /* A mapping of the child's own may take the place of inherited
     * memory (not mapped here: MADV_DONTFORK); freeing the inherited
     * pointer afterwards is still the documented no-op. */
    void *q = NULL;
    if (pdx_mem_alloc(LEN, 0, &q) != PDX_OK) {
        fprintf(stderr, "child: pdx_mem_alloc: %s\n", pdx_last_error());
        _exit(5);
    }
    printf("child: own allocation %s the inherited address\n",
           q == (void *)p->src ? "took" : "did not take");
    if (pdx_mem_free(q) != PDX_OK) {
        fprintf(stderr, "child: pdx_mem_free of its own memory: %s\n",
                pdx_last_error());
        _exit(5);
    }
    /* The child's own pdx works. */
    pair_t c;
    pair_make(&c, "child", true);
    pdx_xfer_h cx = NULL;
    pdx_status_t cst = read_post(&c, &cx);
    read_finish(&c, cx, cst);
    pair_free(&c, true);
    printf("child: its own agents READ %u MiB byte-exact\n", LEN >> 20);
    /* Releases and destroys of inherited handles: quiet no-ops. */
    pdx_xfer_release(x);
    pdx_dlist_release(dl);
    pdx_mem_deregister(p->a, p->rd);
    pdx_agent_destroy(p->a);
    pdx_agent_destroy(p->b);
    if (pdx_mem_free(p->src) != PDX_OK) {
        fprintf(stderr, "child: pdx_mem_free of inherited memory: %s\n",
                pdx_last_error());
        _exit(4);
    }
    return 0;
}

static int wait_child(pid_t pid, uint64_t bound_ms)
{
    uint64_t t0 = pdx_now_ms();
    int status;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0) {
        if (pdx_now_ms() - t0 > bound_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "FAIL: child %d did not exit within %llu ms\n",
                    (int)pid, (unsigned long long)bound_ms);
            return 1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (w < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: child %d ended with %s %d\n", (int)pid,
                WIFSIGNALED(status) ? "signal" : "status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    return 0;
}

typedef struct churn {
    pair_t *p;
    atomic_int stop;
    unsigned rounds;
} churn_t;

/* Lists and requests made and released without pause: the agent lock,
 * the handle quarantine's lock and the cma worker all busy across forks. */
static void *churn_main(void *arg)
{
    churn_t *c = arg;
    pdx_desc_t d = {(uint64_t)(uintptr_t)c->p->src, 4096, 0, 0};
    pdx_desc_list_t dl = {PDX_MEM_DRAM, &d, 1};
    pdx_desc_t l = {(uint64_t)(uintptr_t)c->p->dst, 4096, 0, 0};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1};
    while (!atomic_load(&c->stop)) {
        pdx_dlist_h rl, lo;
        CHECK(pdx_dlist_prepare(c->p->a, c->p->peer, &dl, &rl));
        CHECK(pdx_dlist_prepare(c->p->a, NULL, &ll, &lo));
        uint32_t idx = 0;
        pdx_xfer_h x;
        CHECK(pdx_xfer_make(c->p->a, PDX_XFER_READ, lo, &idx, rl, &idx, 1,
                            NULL, 0, &x));
        pdx_status_t st = pdx_xfer_post(x);
        while (st == PDX_INPROGRESS) {
            st = pdx_xfer_check(x);
        }
        CHECK(st);
        pdx_xfer_release(x);
        pdx_dlist_release(rl);
        pdx_dlist_release(lo);
        c->rounds++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "use";
    if (strcmp(mode, "use") != 0 && strcmp(mode, "exit") != 0 &&
        strcmp(mode, "storm") != 0) {
        die("usage: forkchild use|exit|storm");
    }
    alarm(120);
    setvbuf(stdout, NULL, _IOLBF, 0);
    pair_t p;
    pair_make(&p, "parent", true);
    pdx_desc_t d = {(uint64_t)(uintptr_t)p.src, 4096, 0, 0};
    pdx_desc_list_t dlist = {PDX_MEM_DRAM, &d, 1};
    pdx_dlist_h dl;
    CHECK(pdx_dlist_prepare(p.a, p.peer, &dlist, &dl));
    int bad = 0;

    if (strcmp(mode, "storm") == 0) {
        churn_t c = {.p = &p};
        pthread_t th;
        if (pthread_create(&th, NULL, churn_main, &c) != 0) {
            die("pthread_create");
        }
        for (int i = 0; i < 32 && !bad; i++) {
            struct timespec ts = {0, 3000000};
            nanosleep(&ts, NULL);
            pid_t pid = fork();
            if (pid < 0) {
                die("fork: %s", strerror(errno));
            }
            if (pid == 0) {
                exit(0); /* destructors run: the quarantine drains */
            }
            bad |= wait_child(pid, CHILD_BOUND_MS);
        }
        atomic_store(&c.stop, 1);
        pthread_join(th, NULL);
        printf("storm: 32 children exited while the parent made and "
               "released %u lists and requests\n", c.rounds);
    } else {
        pdx_xfer_h x;
        pdx_status_t st = read_post(&p, &x);
        pid_t pid = fork();
        if (pid < 0) {
            die("fork: %s", strerror(errno));
        }
        if (pid == 0) {
            if (strcmp(mode, "use") == 0) {
                child_use(&p, x, dl);
            }
            exit(0);
        }
        bad |= wait_child(pid, strcmp(mode, "use") == 0 ? CHILD_WORK_BOUND_MS
                                                        : CHILD_BOUND_MS);
        read_finish(&p, x, st); /* the parent's READ was undisturbed */
        printf("parent: the READ in flight across the fork completed "
               "byte-exact\n");
    }
    /* The parent still works after its children. */
    pdx_xfer_h x = NULL;
    pdx_status_t st = read_post(&p, &x);
    read_finish(&p, x, st);
    pdx_dlist_release(dl);
    pair_free(&p, true);
    printf("%s: %s\n", mode, bad ? "FAIL" : "PASS");
    return bad;
}
