/* Cost classes (core/path.c) on their own: two backends whose costs the
 * test sets (each measured post's start moved back by its cost, hundreds
 * of milliseconds, so that this thread's own time is noise), no agent:
 *   - calibration settles on the cheaper backend, the fixed rules' choice
 *     or the other;
 *   - a run on a plainly dearer backend is cut short on its fourth sample;
 *   - one or two outlier samples (a cold start's) do not lose a backend
 *     the class;
 *   - a backend that lost while its peer was slow is probed again within
 *     PDX_PATH_PROBE_FEW x PDX_PATH_PROBE_EVERY posts and takes the class
 *     once cheaper;
 *   - the chosen backend growing dearer hands the class to the other. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "path_int.h"
#include "peer_int.h"

#define MS 1000000u

typedef struct costs {
    uint32_t ns[2];    /* what a measured post of each backend costs */
    uint32_t first[2]; /* if not 0: its first nfirst measured posts' */
    unsigned nfirst;   /* (1 if 0) */
    unsigned posts[2]; /* posts that each backend took */
    unsigned measured[2];
} costs_t;

/* The class of a 64 KiB READ between backends 0 and 1, as a request
 * of it is made: pick.b is the backend the class gives it. */
static pdx_path_pick_t pick_of(pdx_peer_t *p)
{
    pdx_path_pick_t pk = {.b = 0, .alt = 1, .cls = -1};
    pdx_path_class(p, PDX_XFER_READ, 65536, 1, &pk);
    assert_true(pk.cls >= 0);
    assert_int_equal(pk.b + pk.alt, 1);
    return pk;
}

/* One post and its end, as a request's make and check do. */
static void one(pdx_peer_t *p, const pdx_path_pick_t *pk, costs_t *c)
{
    uint64_t t0;
    uint32_t div;
    int b = pdx_path_post(p, pk->cls, pk->key, &t0, &div);
    assert_true(b == 0 || b == 1);
    assert_int_equal(div, 1);
    c->posts[b]++;
    if (t0 != 0) {
        unsigned nf = c->nfirst ? c->nfirst : 1;
        t0 -= c->measured[b]++ < nf && c->first[b] ? c->first[b] : c->ns[b];
    }
    pdx_path_end(p, pk->cls, pk->key, b, t0, div, true);
}

static pdx_path_class_t *cls_of(pdx_peer_t *p, const pdx_path_pick_t *pk)
{
    return &p->cost->c[pk->cls];
}

/* Posts until the class has chosen (bounded), the posts it took. */
static unsigned calibrate(pdx_peer_t *p, const pdx_path_pick_t *pk,
                          costs_t *c)
{
    unsigned i;
    for (i = 0; i < 64 && cls_of(p, pk)->chosen < 0; i++) {
        one(p, pk, c);
    }
    assert_true(cls_of(p, pk)->chosen >= 0);
    return i;
}

static void test_cheaper_wins(void **state)
{
    (void)state;
    for (int cheap = 0; cheap < 2; cheap++) {
        pdx_peer_t p = {0};
        pdx_path_pick_t pk = pick_of(&p);
        assert_int_equal(pk.b, 0); /* the fixed rules' choice first */
        costs_t c = {.ns = {cheap ? 400 * MS : 100 * MS,
                            cheap ? 100 * MS : 300 * MS}};
        calibrate(&p, &pk, &c);
        assert_int_equal(cls_of(&p, &pk)->chosen, cheap);
        /* Decided: once the run in progress is over, every post takes
         * the cheaper one. */
        for (int i = 0; i < PDX_PATH_RUN; i++) {
            one(&p, &pk, &c);
        }
        unsigned before = c.posts[cheap];
        for (int i = 0; i < 100; i++) {
            one(&p, &pk, &c);
        }
        assert_int_equal(c.posts[cheap], before + 100);
        /* A new request of the class is made on it. */
        assert_int_equal(pick_of(&p).b, cheap);
        pdx_path_cost_free(&p);
    }
}

static void test_loser_cut_short(void **state)
{
    (void)state;
    pdx_peer_t p = {0};
    pdx_path_pick_t pk = pick_of(&p);
    costs_t c = {.ns = {100 * MS, 1000 * MS}};
    calibrate(&p, &pk, &c);
    assert_int_equal(cls_of(&p, &pk)->chosen, 0);
    /* A run on the dearer: its unmeasured posts and four samples. */
    assert_int_equal(c.posts[1], PDX_PATH_RUN_SKIP + 4);
    assert_int_equal(cls_of(&p, &pk)->n[1], 4);
    assert_int_equal(cls_of(&p, &pk)->n[0], PDX_PATH_RUN - PDX_PATH_RUN_SKIP);
    pdx_path_cost_free(&p);
}

static void test_outliers_kept(void **state)
{
    (void)state;
    for (unsigned nfirst = 1; nfirst <= 2; nfirst++) {
        pdx_peer_t p = {0};
        pdx_path_pick_t pk = pick_of(&p);
        /* Backend 1 is the cheaper, but its first samples (a cold start)
         * are 40 times backend 0's cost: its run goes on, and it takes
         * the class. */
        costs_t c = {.ns = {100 * MS, 50 * MS}, .first = {0, 4000 * MS},
                     .nfirst = nfirst};
        calibrate(&p, &pk, &c);
        assert_int_equal(cls_of(&p, &pk)->chosen, 1);
        assert_int_equal(cls_of(&p, &pk)->switches, 0);
        assert_int_equal(pick_of(&p).b, 1);
        pdx_path_cost_free(&p);
    }
}

static void test_dearer_probed_again(void **state)
{
    (void)state;
    pdx_peer_t p = {0};
    pdx_path_pick_t pk = pick_of(&p);
    /* Backend 1 is ten times dearer while calibrating (its peer was
     * slow), then the cheaper. */
    costs_t c = {.ns = {100 * MS, 1000 * MS}};
    calibrate(&p, &pk, &c);
    assert_int_equal(cls_of(&p, &pk)->chosen, 0);
    assert_int_equal(cls_of(&p, &pk)->n[1], 4);
    c.ns[1] = 50 * MS;
    unsigned bound = PDX_PATH_PROBE_EVERY * PDX_PATH_PROBE_FEW + 64, i;
    for (i = 0; i < bound && cls_of(&p, &pk)->chosen == 0; i++) {
        one(&p, &pk, &c);
    }
    print_message("backend 1 took the class after %u posts (bound %u)\n",
                  i, bound);
    assert_int_equal(cls_of(&p, &pk)->chosen, 1);
    assert_int_equal(cls_of(&p, &pk)->switches, 1);
    assert_int_equal(pick_of(&p).b, 1);
    pdx_path_cost_free(&p);
}

static void test_chosen_grows_dearer(void **state)
{
    (void)state;
    pdx_peer_t p = {0};
    pdx_path_pick_t pk = pick_of(&p);
    costs_t c = {.ns = {400 * MS, 100 * MS}};
    calibrate(&p, &pk, &c);
    assert_int_equal(cls_of(&p, &pk)->chosen, 1);
    c.ns[1] = 2000 * MS; /* its peer slowed down */
    unsigned bound = 2 * PDX_PATH_PROBE_EVERY, i;
    for (i = 0; i < bound && cls_of(&p, &pk)->chosen == 1; i++) {
        one(&p, &pk, &c);
    }
    assert_int_equal(cls_of(&p, &pk)->chosen, 0);
    assert_int_equal(cls_of(&p, &pk)->switches, 1);
    pdx_path_cost_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cheaper_wins),
        cmocka_unit_test(test_loser_cut_short),
        cmocka_unit_test(test_outliers_kept),
        cmocka_unit_test(test_dearer_probed_again),
        cmocka_unit_test(test_chosen_grows_dearer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
