/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: checks shared by the policy tests.
 *
 * test-evict.c and test-policy.c (evict.c's replacement policies):
 * can_take callbacks, a policy with every slot inserted, and checks of
 * the victims it chooses.
 */
#ifndef SSDCACHE_TEST_VICTIMS_H
#define SSDCACHE_TEST_VICTIMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "evict.h"

/* can_take callbacks: every slot may be taken; none may. */
extern bool victims_take_all (void *opaque, uint32_t slot);
extern bool victims_take_none (void *opaque, uint32_t slot);

/* A new policy of n slots with 0 .. n - 1 inserted, in that order. */
extern struct evict *victims_new_full (enum evict_policy policy, uint32_t n);

/* evict_victim (ev, victims_take_all) returns expect[0] .. expect[n - 1]
 * in turn (a cmocka failure naming the first that differs).
 */
extern void victims_expect (struct evict *ev, const uint32_t *expect,
                            size_t n);

/* The same for the slots first, first + 1, ... first + n - 1. */
extern void victims_expect_run (struct evict *ev, uint32_t first, uint32_t n);

/* The same for the slots listed: VICTIMS (ev, 1, 3, EVICT_NONE). */
#define VICTIMS(ev, ...)                                                \
  victims_expect ((ev), (const uint32_t[]) { __VA_ARGS__ },             \
                  sizeof ((const uint32_t[]) { __VA_ARGS__ }) /         \
                  sizeof (uint32_t))

#endif /* SSDCACHE_TEST_VICTIMS_H */
