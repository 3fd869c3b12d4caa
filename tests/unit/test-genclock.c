/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of core/genclock.c: the close times of the flush
 * generations the backend lacks (order_lag_seconds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "genclock.h"

/* Generation g closed at time 10 * g (ms). */
static void
close_upto (struct genclock *gc, uint64_t from, uint64_t to, uint64_t done,
            bool want_kept)
{
  for (uint64_t g = from; g <= to; g++)
    if (genclock_close (gc, g, done, 10 * g) != want_kept)
      fail_msg ("generation %llu: kept %d", (unsigned long long) g,
                !want_kept);
}

static void
test_ages (void **state)
{
  struct genclock gc = { 0 };
  bool exact;

  assert_int_equal (genclock_age (&gc, 1, 500, &exact), 0);
  close_upto (&gc, 1, 10, 0, true);
  assert_int_equal (genclock_age (&gc, 1, 500, &exact), 490);
  assert_true (exact);
  assert_int_equal (genclock_age (&gc, 7, 500, &exact), 430);
  genclock_free (&gc);
}

/* Far more generations behind than the first ring holds: it grows, and
 * the oldest one's age stays exact (a ring of GENCLOCK_MIN read the
 * time of a generation GENCLOCK_MIN newer).
 */
static void
test_grows (void **state)
{
  struct genclock gc = { 0 };
  const uint64_t n = 5 * GENCLOCK_MIN + 3;
  bool exact;

  close_upto (&gc, 1, n, 0, true);
  assert_true (gc.cap > n);
  assert_int_equal (genclock_age (&gc, 1, 10 * n, &exact), 10 * n - 10);
  assert_true (exact);
  /* The backend catches up to 4000: still exact after more closes. */
  close_upto (&gc, n + 1, n + 100, 4000, true);
  assert_int_equal (genclock_age (&gc, 4001, 10 * n + 1000, &exact),
                    10 * n + 1000 - 40010);
  assert_true (exact);
  genclock_free (&gc);
}

/* Beyond GENCLOCK_MAX behind the oldest times go: the age is then a
 * lower bound, said so, never more than the true age.
 */
static void
test_bounded (void **state)
{
  struct genclock gc = { 0 };
  const uint64_t n = GENCLOCK_MAX + 10;
  uint64_t age;
  bool exact;

  close_upto (&gc, 1, GENCLOCK_MAX, 0, true);
  close_upto (&gc, GENCLOCK_MAX + 1, n, 0, false);
  assert_int_equal (gc.cap, GENCLOCK_MAX);
  age = genclock_age (&gc, 1, 10 * n, &exact);
  assert_false (exact);
  assert_true (age < 10 * n - 10);
  assert_int_equal (age, 10 * n - 10 * gc.oldest);
  /* Caught up: exact again. */
  assert_true (genclock_close (&gc, n + 1, n - 5, 10 * (n + 1)));
  assert_int_equal (genclock_age (&gc, n - 4, 10 * n + 20, &exact), 20 + 40);
  assert_true (exact);
  genclock_free (&gc);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_ages),
    cmocka_unit_test (test_grows),
    cmocka_unit_test (test_bounded),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
