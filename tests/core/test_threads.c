/* The agent's thread contract: several threads post, check and release
 * requests and poll notifications on one agent while its progress thread
 * runs (run under TSan by scripts/test.sh --tsan). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pdx/pdx.h>

#include "ctl.h"
#include "mock_backend.h"
#include "poll_until.h"

#define THREADS 4
#define ROUNDS 300
#define SLICE 4096

typedef struct ctx {
    pdx_agent_h a, b;
    unsigned char *ma, *mb;
    int id;
    int errors;
} ctx_t;

static _Atomic int g_notes;

static void on_note(void *arg, const char *peer, const void *msg, size_t len)
{
    g_notes++;
}

static void *poster(void *arg)
{
    ctx_t *c = arg;
    for (int r = 0; r < ROUNDS; r++) {
        size_t off = ((size_t)c->id * ROUNDS + (size_t)r) * SLICE;
        memset(c->ma + off, (unsigned char)(r + c->id), SLICE);
        pdx_desc_t l = {.addr = (uintptr_t)c->ma + off, .len = SLICE};
        pdx_desc_t rr = {.addr = (uintptr_t)c->mb + off, .len = SLICE};
        pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &rr, 1};
        pdx_xfer_h x;
        if (pdx_xfer_create(c->a, PDX_XFER_WRITE, &ll, &rl, "tb", "n", 1,
                            &x) != PDX_OK) {
            c->errors++;
            continue;
        }
        pdx_status_t st = pdx_xfer_post(x);
        PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
            st = pdx_xfer_check(x);
        }
        c->errors += st != PDX_OK;
        pdx_xfer_release(x);
        pdx_notif_poll(c->b, on_note, NULL);
        pdx_progress(c->b);
    }
    return NULL;
}

static void test_threads_one_agent(void **state)
{
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                            .flags = PDX_AGENT_F_PROGRESS_THREAD};
    pdx_agent_h a, b;
    assert_int_equal(pdx_agent_create("ta", &p, &a), PDX_OK);
    assert_int_equal(pdx_agent_create("tb", &p, &b), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(a, &mock_backend_ops, NULL, 0,
                                                 NULL), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(b, &mock_backend_ops, NULL, 0,
                                                 NULL), PDX_OK);
    size_t len = (size_t)THREADS * ROUNDS * SLICE;
    unsigned char *ma = calloc(1, len), *mb = calloc(1, len);
    pdx_mem_reg_h ra, rb;
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, (uintptr_t)ma, len, 0,
                                      0, &ra), PDX_OK);
    assert_int_equal(pdx_mem_register(b, PDX_MEM_DRAM, (uintptr_t)mb, len, 0,
                                      0, &rb), PDX_OK);
    assert_int_equal(ctl_load_agent(a, b, NULL), PDX_OK);
    assert_int_equal(ctl_load_agent(b, a, NULL), PDX_OK);

    pthread_t th[THREADS];
    ctx_t c[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i] = (ctx_t){.a = a, .b = b, .ma = ma, .mb = mb, .id = i};
        pthread_create(&th[i], NULL, poster, &c[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].errors, 0);
    }
    for (int i = 0; i < 100000 && g_notes < THREADS * ROUNDS; i++) {
        pdx_notif_poll(b, on_note, NULL);
    }
    assert_int_equal(g_notes, THREADS * ROUNDS);
    assert_memory_equal(ma, mb, len);
    pdx_agent_destroy(a);
    pdx_agent_destroy(b);
    free(ma);
    free(mb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_one_agent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
