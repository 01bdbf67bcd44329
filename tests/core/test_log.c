/* Log rate limit (issue 21 item 8): identical error and warning lines
 * reach the sink at most N times per window (PDX_LOG_REPEAT="N/MS", here
 * 3 per 300 ms), the first one after the window says how many were left
 * out, other lines and info lines are not limited. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <pdx/log.h>

typedef struct seen {
    int n;
    char last[1100];
} seen_t;

static void sink(void *arg, pdx_log_level_t level, const char *msg)
{
    seen_t *s = arg;
    (void)level;
    s->n++;
    snprintf(s->last, sizeof(s->last), "%s", msg);
}

static void test_repeats_limited(void **state)
{
    (void)state;
    seen_t s = {0};
    pdx_log_set_handler(sink, &s);
    pdx_log_set_level(PDX_LOG_INFO);
    for (int i = 0; i < 100; i++) {
        pdx_log(PDX_LOG_ERROR, "peer p-%d is gone", 7);
    }
    assert_int_equal(s.n, 3);
    /* Another line is its own: shown. */
    pdx_log(PDX_LOG_WARN, "peer p-%d is gone", 8);
    assert_int_equal(s.n, 4);
    assert_string_equal(s.last, "peer p-8 is gone");
    /* Info lines are not limited. */
    for (int i = 0; i < 10; i++) {
        pdx_log(PDX_LOG_INFO, "loaded peer q");
    }
    assert_int_equal(s.n, 14);
    /* After the window: shown again, saying how many were left out. */
    struct timespec ts = {0, 350 * 1000000L};
    nanosleep(&ts, NULL);
    pdx_log(PDX_LOG_ERROR, "peer p-%d is gone", 7);
    assert_int_equal(s.n, 15);
    if (strstr(s.last, "peer p-7 is gone (97 identical lines left out") ==
        NULL) {
        fail_msg("last line '%s'", s.last);
    }
    /* And the count starts over. */
    pdx_log(PDX_LOG_ERROR, "peer p-%d is gone", 7);
    assert_int_equal(s.n, 16);
    assert_string_equal(s.last, "peer p-7 is gone");
    pdx_log_set_handler(NULL, NULL);
}

int main(void)
{
    /* Read at the first line logged. */
    setenv("PDX_LOG_REPEAT", "3/300", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeats_limited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
