/* test_backend_ucx --suite misc: how the ucx backend picks its VRAM path
 * (ucx_vram_choose, pure) from the `vram` option, the memory types UCX
 * reports (ucp_context_query's UCP_ATTR_FIELD_MEMORY_TYPES) and whether the
 * CUDA driver can stage; both of UCX's answers, since Debian's UCX gives
 * only one. And what an instance of this UCX says and refuses. */
#include "ucx_test.h"

#include "ucx_int.h"

static const uint64_t HOST_ONLY = 1ull << UCS_MEMORY_TYPE_HOST;
static const uint64_t WITH_CUDA =
    (1ull << UCS_MEMORY_TYPE_HOST) | (1ull << UCS_MEMORY_TYPE_CUDA);
static const char *const NO_DRIVER = "no CUDA driver (libcuda.so.1)";

static ucx_vram_mode_t pick(ucx_vram_opt_t opt, uint64_t types,
                            const char *driver_why, pdx_status_t want_st,
                            char *why, size_t len)
{
    ucx_vram_mode_t m = (ucx_vram_mode_t)-1;
    why[0] = '\0';
    assert_int_equal(ucx_vram_choose(opt, types, driver_why, &m, why, len),
                     want_st);
    assert_true(why[0] != '\0'); /* always says why */
    return m;
}

void test_vram_choose(void **state)
{
    (void)state;
    char why[256];
    /* auto: a UCX that carries CUDA memory registers VRAM natively, with
     * or without a driver for staging. */
    assert_int_equal(pick(UCX_VRAM_OPT_AUTO, WITH_CUDA, NULL, PDX_OK, why,
                          sizeof(why)),
                     UCX_VRAM_NATIVE);
    assert_non_null(strstr(why, "UCX carries CUDA memory"));
    assert_int_equal(pick(UCX_VRAM_OPT_AUTO, WITH_CUDA, NO_DRIVER, PDX_OK,
                          why, sizeof(why)),
                     UCX_VRAM_NATIVE);
    /* auto: a UCX without CUDA stages, and says so and why. */
    assert_int_equal(pick(UCX_VRAM_OPT_AUTO, HOST_ONLY, NULL, PDX_OK, why,
                          sizeof(why)),
                     UCX_VRAM_STAGED);
    assert_non_null(strstr(why, "staged through pinned host memory"));
    assert_non_null(strstr(why, "does not carry CUDA memory"));
    /* ... and without a driver either, no VRAM, naming both reasons. */
    assert_int_equal(pick(UCX_VRAM_OPT_AUTO, HOST_ONLY, NO_DRIVER, PDX_OK,
                          why, sizeof(why)),
                     UCX_VRAM_OFF);
    assert_non_null(strstr(why, "does not carry CUDA memory"));
    assert_non_null(strstr(why, NO_DRIVER));
    /* native asked for: only where UCX carries CUDA memory. */
    assert_int_equal(pick(UCX_VRAM_OPT_NATIVE, WITH_CUDA, NO_DRIVER, PDX_OK,
                          why, sizeof(why)),
                     UCX_VRAM_NATIVE);
    pick(UCX_VRAM_OPT_NATIVE, HOST_ONLY, NULL, PDX_ERR_CONFIG, why,
         sizeof(why));
    assert_non_null(strstr(why, "UCS_MEMORY_TYPE_CUDA"));
    /* staged asked for: even where UCX could go natively (a site that
     * prefers its own pipeline), never without a driver. */
    assert_int_equal(pick(UCX_VRAM_OPT_STAGED, WITH_CUDA, NULL, PDX_OK, why,
                          sizeof(why)),
                     UCX_VRAM_STAGED);
    assert_int_equal(pick(UCX_VRAM_OPT_STAGED, HOST_ONLY, NULL, PDX_OK, why,
                          sizeof(why)),
                     UCX_VRAM_STAGED);
    pick(UCX_VRAM_OPT_STAGED, HOST_ONLY, NO_DRIVER, PDX_ERR_CONFIG, why,
         sizeof(why));
    assert_non_null(strstr(why, NO_DRIVER));
    /* off: whatever UCX says. */
    assert_int_equal(pick(UCX_VRAM_OPT_OFF, WITH_CUDA, NULL, PDX_OK, why,
                          sizeof(why)),
                     UCX_VRAM_OFF);
    /* The option's spelling. */
    ucx_vram_opt_t o;
    assert_int_equal(ucx_vram_parse_opt("auto", &o), PDX_OK);
    assert_int_equal(o, UCX_VRAM_OPT_AUTO);
    assert_int_equal(ucx_vram_parse_opt("native", &o), PDX_OK);
    assert_int_equal(o, UCX_VRAM_OPT_NATIVE);
    assert_int_equal(ucx_vram_parse_opt("staged", &o), PDX_OK);
    assert_int_equal(o, UCX_VRAM_OPT_STAGED);
    assert_int_equal(ucx_vram_parse_opt("off", &o), PDX_OK);
    assert_int_equal(o, UCX_VRAM_OPT_OFF);
    assert_int_equal(ucx_vram_parse_opt("Native", &o), PDX_ERR_CONFIG);
    assert_int_equal(ucx_vram_parse_opt("", &o), PDX_ERR_CONFIG);
}

/* This UCX (Debian's 1.13 has no CUDA): vram=native is refused at create
 * with the reason, and the instance's description names its VRAM mode. */
void test_vram_this_ucx(void **state)
{
    (void)state;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA};
    ucp_context_h ctx;
    assert_int_equal(ucp_init(&p, NULL, &ctx), UCS_OK);
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    assert_int_equal(ucp_context_query(ctx, &ca), UCS_OK);
    ucp_cleanup(ctx);
    int cuda = (ca.memory_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;

    fake_host_t h;
    fake_host_init(&h, "test-vram");
    pdx_option_t native[] = {{"tls", "tcp"}, {"vram", "native"}};
    void *be = NULL;
    pdx_status_t st = ops->create(&h.host, native, 2, &be);
    if (cuda) {
        assert_int_equal(st, PDX_OK);
        ops->destroy(be);
    } else {
        assert_int_equal(st, PDX_ERR_CONFIG);
        assert_null(be);
    }
    pdx_option_t off[] = {{"tls", "tcp"}, {"vram", "off"}};
    assert_int_equal(ops->create(&h.host, off, 2, &be), PDX_OK);
    char desc[1024];
    ops->describe(be, desc, sizeof(desc));
    assert_non_null(strstr(desc, "vram off (vram=off)"));
    ops->destroy(be);
    pdx_option_t bad[] = {{"tls", "tcp"}, {"vram", "gpu"}};
    be = NULL;
    assert_int_equal(ops->create(&h.host, bad, 2, &be), PDX_ERR_CONFIG);
    assert_null(be);
}
