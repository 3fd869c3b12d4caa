/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: per-run backoff (core/backoff.c):
 * only the failed run waits, each new failure doubles its wait up to
 * the maximum, overlapping failures merge, success forgets the run,
 * and the table keeps the newest runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backoff.h"

static void
test_only_failed_run_waits (void **state)
{
  struct backoff b = { .n = 0 };

  backoff_failed (&b, 10, 19, 1000);
  assert_true (backoff_waits (&b, 10, 1000));
  assert_true (backoff_waits (&b, 19, 1099));
  assert_false (backoff_waits (&b, 9, 1000));
  assert_false (backoff_waits (&b, 20, 1000));
  assert_false (backoff_waits (&b, 15, 1000 + BACKOFF_MIN_MS));
}

static void
test_doubling_and_cap (void **state)
{
  struct backoff b = { .n = 0 };
  uint64_t now = 0;
  uint32_t want = BACKOFF_MIN_MS;

  for (int i = 0; i < 10; i++) {
    backoff_failed (&b, 5, 5, now);
    assert_int_equal (b.n, 1);
    assert_int_equal (b.run[0].delay_ms, want);
    assert_true (backoff_waits (&b, 5, now + want - 1));
    assert_false (backoff_waits (&b, 5, now + want));
    now += want;
    want = want * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : want * 2;
  }
}

static void
test_merge_and_done (void **state)
{
  struct backoff b = { .n = 0 };

  backoff_failed (&b, 0, 9, 0);
  backoff_failed (&b, 5, 14, 0);         /* overlaps: one run 0-14 */
  assert_int_equal (b.n, 1);
  assert_int_equal (b.run[0].first, 0);
  assert_int_equal (b.run[0].last, 14);
  assert_int_equal (b.run[0].delay_ms, 2 * BACKOFF_MIN_MS);
  backoff_failed (&b, 100, 100, 0);
  assert_int_equal (b.n, 2);
  backoff_done (&b, 0, 7);               /* only part of 0-14: stays */
  assert_int_equal (b.n, 2);
  backoff_done (&b, 0, 20);
  assert_int_equal (b.n, 1);
  assert_false (backoff_waits (&b, 3, 0));
  assert_true (backoff_waits (&b, 100, 0));
}

static void
test_table_full (void **state)
{
  struct backoff b = { .n = 0 };

  for (uint64_t i = 0; i < BACKOFF_RUNS + 5; i++)
    backoff_failed (&b, i * 10, i * 10, 0);
  assert_int_equal (b.n, BACKOFF_RUNS);
  assert_false (backoff_waits (&b, 0, 0));           /* the oldest went */
  assert_true (backoff_waits (&b, (BACKOFF_RUNS + 4) * 10, 0));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_only_failed_run_waits),
    cmocka_unit_test (test_doubling_and_cap),
    cmocka_unit_test (test_merge_and_done),
    cmocka_unit_test (test_table_full),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
