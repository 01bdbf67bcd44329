/* In-process memcpy backend for agent tests (see mock_backend.c). */
#ifndef PDX_TEST_MOCK_BACKEND_H
#define PDX_TEST_MOCK_BACKEND_H

#include <stdio.h>

#include <pdx/backend.h>

extern const pdx_backend_ops_t mock_backend_ops;
extern int mock_fail_next_post;
extern int mock_hold_completion;
/* The region of the last mem_register call, as the agent passed it. */
extern pdx_region_t mock_last_region;

#endif
