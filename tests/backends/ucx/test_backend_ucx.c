/* Tests of the UCX backend through its ops table: two instances in one
 * process moving pattern-filled memory both ways (ucx_transfer.c), options
 * and errors (ucx_misc.c), and child processes that die or stall under a
 * connection (ucx_procs.c); the fake agent is ucx_host.c.
 *
 * Usage: test_backend_ucx --suite transfer|misc [--tls LIST] [--quick]
 *        test_backend_ucx --peer-child WFD RFD   (internal, for misc)
 *        test_backend_ucx --stuck-sender WFD RFD (internal, for misc) */
#include "ucx_test.h"

int main(int argc, char **argv)
{
    const char *suite = "transfer";
    if (realpath(argv[0], g_self) == NULL) {
        snprintf(g_self, sizeof(g_self), "%s", argv[0]);
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--peer-child") == 0 && i + 3 < argc) {
            return peer_child_main(atoi(argv[i + 1]), atoi(argv[i + 2]),
                                   argv[i + 3]);
        } else if (strcmp(argv[i], "--stuck-sender") == 0 && i + 2 < argc) {
            return stuck_sender_main(atoi(argv[i + 1]), atoi(argv[i + 2]));
        } else if (strcmp(argv[i], "--suite") == 0 && i + 1 < argc) {
            suite = argv[++i];
        } else if (strcmp(argv[i], "--tls") == 0 && i + 1 < argc) {
            g_tls = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            g_quick = 1;
        } else {
            fprintf(stderr,
                    "usage: %s --suite transfer|misc [--tls LIST] "
                    "[--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    /* A dead child's socket must not kill us on write. */
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (strcmp(suite, "transfer") == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(test_describe, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_small, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_100k, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_large, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_threaded, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_no_notif, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_xfer_release_inflight,
                                            pair_setup, pair_teardown),
            cmocka_unit_test_setup_teardown(test_notif_order, pair_setup,
                                            pair_teardown),
            cmocka_unit_test_setup_teardown(test_event_fd, pair_setup,
                                            pair_teardown),
        };
        return cmocka_run_group_tests_name("backend_ucx_transfer", tests, NULL,
                                           NULL);
    }
    if (strcmp(suite, "misc") == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_query_and_table),
            cmocka_unit_test(test_bad_options),
            cmocka_unit_test(test_connect_modes),
            cmocka_unit_test(test_bad_args),
            cmocka_unit_test(test_vram_choose),
            cmocka_unit_test(test_vram_this_ucx),
            cmocka_unit_test_teardown(test_peer_death_tcp, child_teardown),
            cmocka_unit_test_teardown(test_peer_death_shm, child_teardown),
            cmocka_unit_test_teardown(test_release_stalled_read,
                                      child_teardown),
            cmocka_unit_test_teardown(test_release_stalled_read_served,
                                      child_teardown),
            cmocka_unit_test_teardown(test_stuck_fifo_own_worker,
                                      child_teardown),
            cmocka_unit_test_teardown(test_stuck_fifo_one_worker,
                                      child_teardown),
            cmocka_unit_test_teardown(test_hostile_served, child_teardown),
            cmocka_unit_test_teardown(test_hostile_pieces, child_teardown),
            cmocka_unit_test_teardown(test_served_pieces_shm,
                                      child_teardown),
        };
        return cmocka_run_group_tests_name("backend_ucx_misc", tests, NULL,
                                           NULL);
    }
    fprintf(stderr, "unknown suite %s\n", suite);
    return 2;
}
