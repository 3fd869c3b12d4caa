/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: fill behind.
 *
 * A client's read misses are answered first and stored after
 * (bg/behind.c, engine/fill.c: cache_fill_job_run): the pages end up
 * cached, a clean close stores what is queued, and a page changed
 * between the read and the store is never stored with the data read
 * before the change (the range lock's stamps).  Jobs are caught by a
 * hook of the test where the order of events matters.
 */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "behind.h"
#include "cache.h"
#include "fixture.h"
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"

#define PS 65536u               /* 4 pages: the smallest miss stored behind */
#define NP 64u                  /* pages of the backend */

/* The test's hook: keeps the jobs (LIFO) instead of running them, or
 * refuses them when refuse is set.
 */
static struct cache_fill_job *caught;
static bool refuse;

static bool
catch_job (struct cache *c, struct cache_fill_job *job)
{
  if (refuse)
    return false;
  job->next = caught;
  caught = job;
  return true;
}

static bool
catch_room (struct cache *c, uint64_t bytes)
{
  return !refuse;
}

static struct cache *
open_caught (struct rambackend *rb, unsigned seed)
{
  struct cache_config cfg = fixture_config (NP * PS, PS);
  struct cache *c = fixture_open (rb, &cfg, NP * PS, seed);

  caught = NULL;
  refuse = false;
  cache_hooks (c)->fill_behind = catch_job;
  cache_hooks (c)->fill_behind_room = catch_room;
  return c;
}

/* Run the caught jobs, oldest first. */
static void
run_caught (struct cache *c)
{
  struct cache_fill_job *rev = NULL;

  while (caught) {
    struct cache_fill_job *j = caught;
    caught = j->next;
    j->next = rev;
    rev = j;
  }
  while (rev) {
    struct cache_fill_job *j = rev;
    rev = j->next;
    cache_fill_job_run (c, j);
    cache_fill_job_free (j);
  }
}

/* Close a cache of open_caught, with its jobs run first. */
static void
close_caught (struct cache *c, struct rambackend *rb)
{
  run_caught (c);
  fixture_close (c, rb);
}

/* With the thread: the misses of whole pages are stored after, and
 * read again they are hits, not backend reads.
 */
static void
test_stores (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (NP * PS, PS);
  struct cache *c = fixture_open (&rb, &cfg, NP * PS, 1);

  assert_int_equal (behind_start (c), 0);
  read_check (c, &rb, 0, 16 * PS);
  behind_drain (c);
  assert_int_equal (ST (c, fills_behind), 16);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, 16 * PS);
  assert_int_equal (atomic_load (&rb.reads), 0);
  assert_int_equal (ST (c, read_hits), 16);
  /* Part of a page: stored before the answer (no job; ASan checks that
   * its buffer is freed all the same).  A whole page, less than 256 KiB:
   * stored before the answer too.
   */
  read_check (c, &rb, 20 * PS + 512, 1024);
  read_check (c, &rb, 30 * PS, 3 * PS);
  assert_int_equal (ST (c, fills), 16 + 1 + 3);
  behind_drain (c);
  assert_int_equal (ST (c, fills_behind), 16);
  behind_stop (c);
  fixture_close (c, &rb);
}

/* A job run after a write to one of its pages does not store that
 * page (the others it does): a read then returns the written data,
 * never the data read before.
 */
static void
test_changed_page_not_stored (void **state)
{
  struct rambackend rb;
  struct cache *c = open_caught (&rb, 2);

  read_check (c, &rb, 4 * PS, 8 * PS);      /* caught: pages 4-11 */
  assert_non_null (caught);
  write_check (c, &rb, 6 * PS + 512, 1024, 77);
  run_caught (c);
  read_check (c, &rb, 0, NP * PS);
  assert_int_equal (ST (c, fills_behind), 7);
  assert_int_equal (ST (c, fills_behind_dropped), 1);
  close_caught (c, &rb);
}

/* Without a change in between, a caught job stores its pages; one run
 * when the page is cached already stores nothing twice.
 */
static void
test_unchanged_stored_once (void **state)
{
  struct rambackend rb;
  struct cache *c = open_caught (&rb, 3);

  read_check (c, &rb, 0, 4 * PS);
  read_check (c, &rb, 0, 4 * PS);           /* two jobs, same pages */
  run_caught (c);
  assert_int_equal (ST (c, fills_behind), 4);
  assert_int_equal (ST (c, fills), 4);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, 4 * PS);
  assert_int_equal (atomic_load (&rb.reads), 0);
  close_caught (c, &rb);
}

/* A full queue: the pages go around the cache, counted. */
static void
test_refused (void **state)
{
  struct rambackend rb;
  struct cache *c = open_caught (&rb, 4);

  refuse = true;
  read_check (c, &rb, 0, 8 * PS);
  assert_null (caught);
  assert_int_equal (ST (c, fills_behind_dropped), 8);
  assert_int_equal (ST (c, fills), 0);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (atomic_load (&rb.reads), 1);
  close_caught (c, &rb);
}

/* A drain stores what was queued before it (a clean stop drains, then
 * closes): the restart is warm.
 */
static void
test_drain_stores_queue (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (NP * PS, PS);
  struct cache *c = fixture_open (&rb, &cfg, NP * PS, 5);

  assert_int_equal (behind_start (c), 0);
  read_check (c, &rb, 0, NP * PS);
  behind_drain (c);
  assert_int_equal (ST (c, fills_behind), NP);
  cache_close (c);              /* stops the thread through its hook */
  warm_check (&cfg, &rb, 16 * PS);
  rambackend_free (&rb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    TESTFILE_TEST (test_stores),
    TESTFILE_TEST (test_changed_page_not_stored),
    TESTFILE_TEST (test_unchanged_stored_once),
    TESTFILE_TEST (test_refused),
    TESTFILE_TEST (test_drain_stores_queue),
  };

  testfile_name = "test-behind";
  testfile_watchdog_seconds = 60;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
