/* Bounded polling by time, not by a count of calls: how many calls a
 * completion takes depends on the machine's load and on whether another
 * thread (the progress thread) or the caller drives progress; a deadline
 * does not. PDX_POLL_UNTIL(cond, ms) { body } runs body while cond holds,
 * at most ms milliseconds, yielding the CPU between rounds. */
#ifndef PDX_TEST_POLL_UNTIL_H
#define PDX_TEST_POLL_UNTIL_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "pdx_clock.h"

#define PDX_POLL_UNTIL(cond, ms)                                               \
    for (uint64_t pdx_dl_ = pdx_now_ms() + (ms);                         \
         (cond) && pdx_now_ms() < pdx_dl_; sched_yield())

#endif
