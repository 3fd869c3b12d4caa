/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: ssdcache-verify=lazy, a backend
 * changed while the cache was offline.
 *
 * The pure comparison (filter/core/verify.c), then the engine: a cache
 * filled and closed, the RAM backend edited behind its back, reopened
 * with and without verification.  Clean pages that differ are dropped
 * and re-read; a dirty page keeps its dirty sectors and loses only its
 * stale clean ones.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cache.h"
#include "layout.h"
#include "rambackend.h"
#include "stats.h"
#include "fixture.h"
#include "testfile.h"
#include "verify.h"

#define PS 4096u
#define SS 512u
#define NPAGES 16u

static void
test_stale_sectors (void **state)
{
  uint8_t a[PS], b[PS], valid[16] = { 0 }, dirty[16] = { 0 }, stale[16];
  const struct verify_geom whole = { 8, SS, PS };
  const struct verify_geom short1000 = { 8, SS, 1000 };
  const struct verify_geom short1001 = { 8, SS, 1001 };

  memset (a, 1, PS);
  memcpy (b, a, PS);
  for (unsigned i = 0; i < 8; i++)
    layout_bit_set (valid, i);
  assert_int_equal (verify_stale_sectors (a, b, valid, dirty, &whole,
                                          stale), 0);
  b[SS * 2 + 7] = 9;            /* sector 2 */
  b[SS * 5] = 9;                /* sector 5, dirty: not compared */
  b[SS * 7 + 511] = 9;          /* sector 7, not valid: not compared */
  layout_bit_set (dirty, 5);
  layout_bit_clear (valid, 7);
  assert_int_equal (verify_stale_sectors (a, b, valid, dirty, &whole,
                                          stale), 1);
  assert_true (layout_bit_test (stale, 2));
  assert_false (layout_bit_test (stale, 5));
  assert_false (layout_bit_test (stale, 7));
  /* Past the end of the backend (a short last page): not compared. */
  memcpy (b, a, PS);
  b[1000] = 7;
  assert_int_equal (verify_stale_sectors (a, b, valid, dirty, &short1000,
                                          stale), 0);
  assert_int_equal (verify_stale_sectors (a, b, valid, dirty, &short1001,
                                          stale), 1);
  assert_true (layout_bit_test (stale, 1));
}

/* ssdcache-verify=lazy (not the default) when verify; mode is
 * writethrough or writeback (without background cleaning: the test
 * decides when dirty data is written back).
 */
static struct cache_config
verify_config (enum layout_mode mode, bool verify)
{
  struct cache_config cfg = mode == LAYOUT_MODE_WRITEBACK
    ? fixture_writeback_config (NPAGES * PS, PS)
    : fixture_config (NPAGES * PS, PS);

  cfg.verify = verify;
  return cfg;
}

/* The cache, opened with verify_config (mode, verify). */
static struct cache *
verify_open (enum layout_mode mode, bool verify)
{
  struct cache_config cfg = verify_config (mode, verify);

  return testfile_open_attach (&cfg, NPAGES * PS);
}

static void
read_all (struct cache *c, struct rambackend *rb, uint8_t *out)
{
  int err;

  for (uint32_t p = 0; p < NPAGES; p++)
    if (cache_read (c, &rb->be, out + p * PS, PS, p * PS, &err) != 0)
      fail_msg ("read of page %u failed: %d", p, err);
}

/* Edit pages 3 (whole) and 7 (one byte) of the backend. */
static void
edit_backend (struct rambackend *rb)
{
  uint8_t buf[PS], x = 0x5a;

  memset (buf, 0xee, PS);
  rambackend_poke (rb, buf, PS, 3 * PS);
  rambackend_poke (rb, &x, 1, 7 * PS + 1234);
}

static void
test_clean_pages (void **state)
{
  struct rambackend rb;
  struct cache *c;
  uint8_t *old = malloc (NPAGES * PS), *now = malloc (NPAGES * PS);
  uint8_t *got = malloc (NPAGES * PS);

  rambackend_init (&rb, NPAGES * PS, 5);
  rambackend_peek (&rb, old, NPAGES * PS, 0);
  c = verify_open (LAYOUT_MODE_WRITETHROUGH, false);
  read_all (c, &rb, got);
  cache_close (c);
  edit_backend (&rb);
  rambackend_peek (&rb, now, NPAGES * PS, 0);

  /* Off: the old copies are served (the documented behaviour). */
  c = verify_open (LAYOUT_MODE_WRITETHROUGH, false);
  rambackend_reset_counters (&rb);
  read_all (c, &rb, got);
  assert_memory_equal (got, old, NPAGES * PS);
  assert_int_equal (rb.reads, 0);
  cache_close (c);

  /* Lazy: every page checked once, the two edited ones replaced. */
  c = verify_open (LAYOUT_MODE_WRITETHROUGH, true);
  rambackend_reset_counters (&rb);
  read_all (c, &rb, got);
  assert_memory_equal (got, now, NPAGES * PS);
  assert_int_equal (ST (c, verify_mismatches), 2);
  assert_int_equal (rb.bytes_read, (NPAGES + 2) * PS);
  /* Checked once: now plain hits. */
  rambackend_reset_counters (&rb);
  read_all (c, &rb, got);
  assert_memory_equal (got, now, NPAGES * PS);
  assert_int_equal (rb.reads, 0);
  cache_close (c);
  rambackend_free (&rb);
  free (old);
  free (now);
  free (got);
}

/* A dirty page keeps its dirty sectors whatever the backend says; its
 * clean sectors that the backend changed are re-read.
 */
static void
test_dirty_page (void **state)
{
  struct rambackend rb;
  struct cache *c;
  uint8_t *got = malloc (NPAGES * PS), *exp = malloc (NPAGES * PS);
  uint8_t mine[SS], edit[PS];
  int err;

  rambackend_init (&rb, NPAGES * PS, 6);
  c = verify_open (LAYOUT_MODE_WRITEBACK, false);
  read_all (c, &rb, got);
  memset (mine, 0xd1, SS);
  assert_int_equal (cache_write (c, &rb.be, mine, SS, 3 * PS + SS, false,
                                 &err), 0);      /* sector 1 of page 3 */
  assert_int_equal (cache_flush (c, &rb.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 1);
  cache_close (c);                 /* the engine keeps dirty data */

  /* The whole page 3 is changed in the backend meanwhile. */
  memset (edit, 0xab, PS);
  rambackend_poke (&rb, edit, PS, 3 * PS);
  rambackend_peek (&rb, exp, NPAGES * PS, 0);
  memcpy (exp + 3 * PS + SS, mine, SS);

  c = verify_open (LAYOUT_MODE_WRITEBACK, true);
  read_all (c, &rb, got);
  assert_memory_equal (got, exp, NPAGES * PS);
  assert_int_equal (ST (c, verify_mismatches), 1);
  assert_int_equal (cache_dirty_pages (c), 1);
  /* Written back: only the dirty sector reaches the backend. */
  assert_int_equal (cache_writeback_all (c, &rb.be, &err), 0);
  rambackend_peek (&rb, got, NPAGES * PS, 0);
  assert_memory_equal (got, exp, NPAGES * PS);
  cache_close (c);

  /* And the entry was rewritten: a start without verification serves
   * the backend's new data for those sectors, not the stale copy.
   */
  c = verify_open (LAYOUT_MODE_WRITEBACK, false);
  read_all (c, &rb, got);
  assert_memory_equal (got, exp, NPAGES * PS);
  cache_close (c);
  rambackend_free (&rb);
  free (got);
  free (exp);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_stale_sectors),
    TESTFILE_TEST (test_clean_pages),
    TESTFILE_TEST (test_dirty_page),
  };

  testfile_name = "test-verify";
  testfile_watchdog_seconds = 120;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
