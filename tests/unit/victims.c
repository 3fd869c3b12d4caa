/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: see victims.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "evict.h"
#include "victims.h"

bool
victims_take_all (void *opaque, uint32_t slot)
{
  return true;
}

bool
victims_take_none (void *opaque, uint32_t slot)
{
  return false;
}

struct evict *
victims_new_full (enum evict_policy policy, uint32_t n)
{
  struct evict *ev = evict_new_policy (policy, n);

  assert_non_null (ev);
  for (uint32_t s = 0; s < n; ++s)
    evict_insert (ev, s);
  return ev;
}

void
victims_expect (struct evict *ev, const uint32_t *expect, size_t n)
{
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = evict_victim (ev, victims_take_all, NULL);

    if (v != expect[i])
      fail_msg ("victim %zu: slot %u, expected %u", i, v, expect[i]);
  }
}

void
victims_expect_run (struct evict *ev, uint32_t first, uint32_t n)
{
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t v = evict_victim (ev, victims_take_all, NULL);

    if (v != first + i)
      fail_msg ("victim %u: slot %u, expected %u", i, v, first + i);
  }
}
