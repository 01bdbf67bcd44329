/* Registration checks host memory (issue 38, item 2): a region is mapped,
 * readable, and writable unless registered read-only, or refused with
 * PDX_ERR_INVALID naming the first page that is not; memory a peer's
 * request would make this process touch is never accepted unchecked
 * (before: a PROT_NONE page, a whole PROT_NONE mapping or 0x1000+2^63 were
 * registered, and a peer's READ over UCX killed the target). */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/pdx.h>

#include "mock_backend.h"

static size_t g_pg;

static pdx_agent_h agent(void)
{
    pdx_agent_h a;
    assert_int_equal(pdx_agent_create("mem", NULL, &a), PDX_OK);
    assert_int_equal(pdx_backend_create_with_ops(a, &mock_backend_ops, NULL,
                                                 0, NULL),
                     PDX_OK);
    return a;
}

static unsigned char *map(size_t pages, int prot)
{
    void *p = mmap(NULL, pages * g_pg, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                   0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* Refused with PDX_ERR_INVALID, the error naming `page` and `what`. */
static void refused(pdx_agent_h a, uint64_t addr, uint64_t len,
                    uint64_t flags, uint64_t page, const char *what)
{
    pdx_mem_reg_h r = NULL;
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, addr, len, 0, flags,
                                      &r),
                     PDX_ERR_INVALID);
    assert_null(r);
    char want[64];
    snprintf(want, sizeof(want), "page 0x%" PRIx64 " is %s", page, what);
    if (strstr(pdx_last_error(), want) == NULL) {
        fail_msg("error '%s' does not say '%s'", pdx_last_error(), want);
    }
}

static void accepted(pdx_agent_h a, uint64_t addr, uint64_t len,
                     uint64_t flags)
{
    pdx_mem_reg_h r = NULL;
    assert_int_equal(pdx_mem_register(a, PDX_MEM_DRAM, addr, len, 0, flags,
                                      &r),
                     PDX_OK);
    assert_int_equal(pdx_mem_deregister(a, r), PDX_OK);
}

/* 1 MiB with a PROT_NONE page inside: the page is named. */
static void test_prot_none_page(void **state)
{
    (void)state;
    pdx_agent_h a = agent();
    size_t n = (1u << 20) / g_pg;
    unsigned char *p = map(n, PROT_READ | PROT_WRITE);
    assert_int_equal(mprotect(p + 7 * g_pg, g_pg, PROT_NONE), 0);
    refused(a, (uintptr_t)p, n * g_pg, 0, (uintptr_t)p + 7 * g_pg,
            "not readable");
    refused(a, (uintptr_t)p + 100, n * g_pg - 200, PDX_REGION_F_READONLY,
            (uintptr_t)p + 7 * g_pg, "not readable");
    /* Around it, both halves are fine. */
    accepted(a, (uintptr_t)p, 7 * g_pg, 0);
    accepted(a, (uintptr_t)p + 8 * g_pg, (n - 8) * g_pg, 0);
    munmap(p, n * g_pg);
    pdx_agent_destroy(a);
}

static void test_prot_none_mapping(void **state)
{
    (void)state;
    pdx_agent_h a = agent();
    unsigned char *p = map(16, PROT_NONE);
    refused(a, (uintptr_t)p, 16 * g_pg, 0, (uintptr_t)p, "not readable");
    refused(a, (uintptr_t)p + 5, 1, PDX_REGION_F_READONLY, (uintptr_t)p,
            "not readable");
    munmap(p, 16 * g_pg);
    pdx_agent_destroy(a);
}

/* Nothing mapped at 0x1000, and 2^63 bytes reach far past any mapping;
 * a hole in the middle of a range is named too. */
static void test_unmapped(void **state)
{
    (void)state;
    pdx_agent_h a = agent();
    refused(a, 0x1000, 1ull << 63, 0, 0x1000, "not mapped");
    unsigned char *p = map(16, PROT_READ | PROT_WRITE);
    assert_int_equal(munmap(p + 3 * g_pg, g_pg), 0);
    assert_int_equal(munmap(p + 8 * g_pg, 8 * g_pg), 0);
    refused(a, (uintptr_t)p, 8 * g_pg, 0, (uintptr_t)p + 3 * g_pg,
            "not mapped");
    /* A range running off the end of a mapping (into the hole). */
    refused(a, (uintptr_t)p + 4 * g_pg, 8 * g_pg, 0,
            (uintptr_t)p + 8 * g_pg, "not mapped");
    munmap(p, 3 * g_pg);
    munmap(p + 4 * g_pg, 4 * g_pg);
    pdx_agent_destroy(a);
}

/* Read-only memory: refused for read-write registration (a peer's WRITE
 * would fault), accepted read-only. */
static void test_readonly(void **state)
{
    (void)state;
    pdx_agent_h a = agent();
    unsigned char *p = map(4, PROT_READ);
    refused(a, (uintptr_t)p, 4 * g_pg, 0, (uintptr_t)p, "not writable");
    accepted(a, (uintptr_t)p, 4 * g_pg, PDX_REGION_F_READONLY);
    munmap(p, 4 * g_pg);
    pdx_agent_destroy(a);
}

/* Ordinary memory across several mappings (adjacent ones of different
 * protections are listed apart), heap and stack: accepted. */
static void test_ordinary(void **state)
{
    (void)state;
    pdx_agent_h a = agent();
    unsigned char *p = map(8, PROT_READ | PROT_WRITE);
    assert_int_equal(mprotect(p + 4 * g_pg, 4 * g_pg,
                              PROT_READ | PROT_WRITE | PROT_EXEC),
                     0);
    accepted(a, (uintptr_t)p, 8 * g_pg, 0);
    void *h = malloc(3 << 20);
    assert_non_null(h);
    accepted(a, (uintptr_t)h, 3 << 20, 0);
    free(h);
    char stack[256];
    accepted(a, (uintptr_t)stack, sizeof(stack), 0);
    munmap(p, 8 * g_pg);
    pdx_agent_destroy(a);
}

int main(void)
{
    g_pg = (size_t)sysconf(_SC_PAGESIZE);
    pdx_log_set_level(PDX_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prot_none_page),
        cmocka_unit_test(test_prot_none_mapping),
        cmocka_unit_test(test_unmapped),
        cmocka_unit_test(test_readonly),
        cmocka_unit_test(test_ordinary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
