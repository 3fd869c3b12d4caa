/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: opening a cache file that was
 * closed cleanly (cache-open.c), over a RAM backend.
 *
 * A warm restart; corrupted data and entries and a page-table entry
 * that names a page twice or one past the backend's end; identity,
 * backend size, page count and page size / size mismatches; the
 * one-owner lock; a file that is not a cache; one superblock copy
 * damaged.  Restarts after a crash are in test-crash.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "fixture.h"
#include "layout.h"
#include "log-stderr.h"
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"

#define PS 4096u

/* cache_open, or else cache_attach to a backend of size bytes, refuses
 * cfg, and logs why.
 */
static void
open_refused (const struct cache_config *cfg, uint64_t size)
{
  int errs = log_error_count;
  struct cache *c = cache_open (cfg);

  if (c != NULL) {
    assert_int_equal (cache_attach (c, size), -1);
    cache_close (c);
  }
  assert_true (log_error_count > errs);
}

/* The last error logged says text. */
static void
last_error_says (const char *text)
{
  if (strstr (log_error_last, text) == NULL)
    fail_msg ("unexpected message: %s", log_error_last);
}

/*----------------------------------------------------------------------
 * A warm restart after a clean close.
 */

static void
test_warm_reopen (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  struct layout_sb sb;

  c = fixture_open (&rb, &cfg, 64 * PS, 10);
  read_all_check (c, &rb, 10000);
  write_check (c, &rb, 3 * PS + 5, 1000, 1);
  write_check (c, &rb, 9 * PS, PS, 2);
  cache_close (c);

  testfile_read_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_CLEAN);

  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 64);
  assert_int_equal (ST (c, dropped_entries), 0);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 10000);
  assert_int_equal (rb.reads, 0);
  assert_true (ST (c, read_hits) >= 64);
  assert_int_equal (ST (c, read_misses), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  /* Reopened: the superblock is marked in use again. */
  testfile_read_sb (&sb);
  assert_int_equal (sb.flags & LAYOUT_SB_CLEAN, 0);
  cache_close (c);

  /* Third start, still warm. */
  warm_check (&cfg, &rb, 64 * PS);
  rambackend_free (&rb);
}

/* A clean stop rewrites only the entries whose hint changed, and such
 * an entry keeps its number.
 */
static void
test_stop_saves_changed_hints (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  uint8_t before[64][LAYOUT_ENTRY_SIZE], raw[LAYOUT_ENTRY_SIZE];
  struct layout_entry e, e0;
  uint32_t slot = UINT32_MAX;
  struct cache *c;

  c = fixture_open (&rb, &cfg, 64 * PS, 11);
  read_all_check (c, &rb, PS);
  cache_close (c);
  for (uint32_t s = 0; s < 64; s++)
    file_entry (s, &e, before[s]);

  /* A restart without a request: the stop writes no entry. */
  c = testfile_open_attach (&cfg, rb.size);
  cache_close (c);
  for (uint32_t s = 0; s < 64; s++) {
    file_entry (s, &e, raw);
    assert_memory_equal (raw, before[s], LAYOUT_ENTRY_SIZE);
  }

  /* A page read once more: its hint, and nothing else, changes. */
  for (uint64_t p = 0; p < 64 && slot == UINT32_MAX; p++) {
    newest_entry (p, &e0, &slot);
    if (e0.hint != 0)
      slot = UINT32_MAX;
  }
  assert_true (slot != UINT32_MAX);
  c = testfile_open_attach (&cfg, rb.size);
  read_check (c, &rb, e0.page * PS, PS);
  cache_close (c);
  for (uint32_t s = 0; s < 64; s++) {
    assert_int_equal (file_entry (s, &e, raw), 0);
    if (s != slot)
      assert_memory_equal (raw, before[s], LAYOUT_ENTRY_SIZE);
  }
  file_entry (slot, &e, NULL);
  assert_int_equal (e.page, e0.page);
  assert_int_equal (e.seq, e0.seq);
  assert_int_not_equal (e.hint, 0);

  warm_check (&cfg, &rb, 16 * PS);
  rambackend_free (&rb);
}

/*----------------------------------------------------------------------
 * A damaged cache file.
 */

/* Write e as the entry of slot, in the page table on disk. */
static void
entry_put (uint32_t slot, const struct layout_entry *e)
{
  struct layout_sb sb;
  uint8_t raw[LAYOUT_ENTRY_SIZE];

  testfile_read_sb (&sb);
  layout_entry_encode (e, raw);
  testfile_write (sb.pt_offset + (uint64_t) slot * LAYOUT_ENTRY_SIZE, raw,
                  sizeof raw);
}

/* Returns the pool offset of the cache file. */
static uint64_t
file_pool_offset (void)
{
  struct layout_sb sb;

  testfile_read_sb (&sb);
  return sb.pool_offset;
}

static void
test_corrupt_data (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint64_t pool;
  uint8_t garbage[100];

  rambackend_init (&rb, 16 * PS, 12);
  open_read_all_check (&cfg, &rb, 16 * PS);

  pool = file_pool_offset ();
  memset (garbage, 0xa5, sizeof garbage);
  testfile_write (pool + 0 * PS + 1000, garbage, sizeof garbage); /* slot 0 */
  testfile_xor (pool + 5 * PS + PS - 1, 1, 0x01);                 /* slot 5 */

  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 16);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (ST (c, verify_failures), 2);
  assert_int_equal (rb.bytes_read, 2 * PS);       /* just the two pages */
  /* Refilled: everything hits now. */
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 3000);
  assert_int_equal (rb.reads, 0);
  cache_close (c);

  /* Corruption found with small reads (hit path) too. */
  pool = file_pool_offset ();
  testfile_xor (pool + 7 * PS + 17, 1, 0x80);
  c = testfile_open_attach (&cfg, rb.size);
  for (uint64_t p = 0; p < 16; ++p)
    read_check (c, &rb, p * PS + 17, 1);
  assert_int_equal (ST (c, verify_failures), 1);
  read_all_check (c, &rb, 16 * PS);
  fixture_close (c, &rb);
}

static void
test_corrupt_entry (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  struct layout_sb sb;

  rambackend_init (&rb, 16 * PS, 13);
  open_read_all_check (&cfg, &rb, 16 * PS);

  testfile_read_sb (&sb);
  testfile_xor (sb.pt_offset + 3 * LAYOUT_ENTRY_SIZE + 10, 1, 0x04);
  testfile_xor (sb.pt_offset + 9 * LAYOUT_ENTRY_SIZE + 63, 1, 0x40);

  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, dropped_entries), 2);
  assert_int_equal (ST (c, loaded_slots), 14);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (rb.bytes_read, 2 * PS);
  fixture_close (c, &rb);
}

/* Page-table entry pointing at a page past the end of the backend
 * (valid CRC) must not be served or crash anything.  Also an entry
 * naming a page another entry holds with a higher sequence number:
 * the newer one wins.
 */
static void
test_entry_conflicts (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  struct layout_entry e4, e6, e8;

  rambackend_init (&rb, 16 * PS, 14);
  open_read_all_check (&cfg, &rb, 16 * PS);

  /* Slot 4's entry: make it claim slot 6's page with an older seq;
   * its data is slot 4's data, which is not that page: if it won, a
   * read of that page would be wrong.
   */
  assert_int_equal (file_entry (6, &e6, NULL), 0);
  assert_int_equal (file_entry (4, &e4, NULL), 0);
  e4.page = e6.page;
  e4.seq = e6.seq > 1 ? e6.seq - 1 : 0;
  entry_put (4, &e4);
  /* Slot 8's entry: a page past the end of the backend. */
  assert_int_equal (file_entry (8, &e8, NULL), 0);
  e8.page = 1000;
  entry_put (8, &e8);

  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 14);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (ST (c, verify_failures), 0);
  fixture_close (c, &rb);
}

/*----------------------------------------------------------------------
 * Wrong backend, other geometry, lock, not a cache file.
 */

static void
test_wrong_identity (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  int errs;

  rambackend_init (&rb, 16 * PS, 15);
  open_read_all_check (&cfg, &rb, 16 * PS);

  cfg.id_digest[1] ^= 1;
  cfg.id_text = "another backend";
  errs = log_error_count;
  c = cache_open (&cfg);
  assert_null (c);
  assert_true (log_error_count > errs);
  last_error_says ("built for another backend");

  /* With reset: opens, empty. */
  cfg.reset = true;
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 0);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (rb.bytes_read, 16 * PS);
  cache_close (c);

  /* The file now belongs to the new identity. */
  cfg.reset = false;
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 16);
  cache_close (c);
  cfg.id_digest[1] ^= 1;
  assert_null (cache_open (&cfg));
  rambackend_free (&rb);
}

static void
test_wrong_backend_size (void **state)
{
  struct rambackend rb, rb2;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  int errs;

  rambackend_init (&rb, 16 * PS, 16);
  open_read_all_check (&cfg, &rb, 16 * PS);

  /* Same identity, bigger backend. */
  rambackend_init (&rb2, 16 * PS + 512, 17);
  c = cache_open (&cfg);
  assert_non_null (c);
  errs = log_error_count;
  assert_int_equal (cache_attach (c, rb2.size), -1);
  assert_true (log_error_count > errs);
  last_error_says ("backend size");
  cache_close (c);

  cfg.reset = true;
  c = testfile_open_attach (&cfg, rb2.size);
  assert_int_equal (ST (c, loaded_slots), 0);
  read_all_check (c, &rb2, 16 * PS + 512);
  assert_int_equal (rb2.bytes_read, rb2.size);
  cache_close (c);
  rambackend_free (&rb);
  rambackend_free (&rb2);
}

/* A backend with more pages than the page table can number (2^40) is
 * refused, with a message naming the limit; one page less is not.
 */
static void
test_too_many_pages (void **state)
{
  struct cache_config cfg = fixture_config (16 * PS, PS);
  const uint64_t max = (UINT64_C (1) << 40) * PS;    /* 2^40 pages */
  struct cache *c;
  int errs;

  c = cache_open (&cfg);
  assert_non_null (c);
  errs = log_error_count;
  assert_int_equal (cache_attach (c, max + 1), -1);
  assert_true (log_error_count > errs);
  last_error_says ("at most 1099511627776 pages");
  last_error_says ("ssdcache-page-size");
  cache_close (c);

  c = cache_open (&cfg);
  assert_non_null (c);
  assert_int_equal (cache_attach (c, max), 0);
  cache_close (c);
}

static void
test_page_size_or_size_change (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;

  rambackend_init (&rb, 64 * PS, 18);
  open_read_all_check (&cfg, &rb, 16 * PS);

  /* Another page size. */
  cfg.page_size = 2 * PS;
  open_refused (&cfg, rb.size);

  /* Size 0 (default) takes the existing cache as it is. */
  cfg.page_size = PS;
  cfg.size = 0;
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (cache_nslots (c), 16);
  assert_int_equal (ST (c, loaded_slots), 16);
  cache_close (c);

  /* Reset re-initialises with the new size. */
  cfg.size = 32 * PS;
  cfg.reset = true;
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (cache_nslots (c), 32);
  assert_int_equal (ST (c, loaded_slots), 0);
  read_all_check (c, &rb, 64 * PS);
  fixture_close (c, &rb);
}

/* The cache file of cfg, of was slots, opened, resized to cfg's size
 * (done: whether the resize must succeed) and attached again.
 */
static struct cache *
resized (const struct cache_config *cfg, uint64_t size, uint32_t was,
         bool done)
{
  struct cache *c = testfile_open_attach (cfg, size);
  int fd = -1;

  assert_int_equal (cache_nslots (c), was);
  assert_true (cache_resize_pending (c));
  assert_int_equal (cache_close_resize (c, &fd), done ? 0 : -1);
  assert_true (fd >= 0);
  c = cache_open_fd (cfg, fd);
  assert_non_null (c);
  assert_int_equal (cache_attach (c, size), 0);
  assert_int_equal (cache_resize_pending (c), !done);
  cache_resize_keep (c, "test");
  return c;
}

/* Resize the cache of cfg from was to now slots: kept pages loaded,
 * every page read back right, none failing its checksum.
 */
static void
resized_kept (struct cache_config *cfg, struct rambackend *rb, uint32_t was,
              uint32_t now, uint32_t kept)
{
  struct cache *c;

  cfg->size = (uint64_t) now * PS;
  c = resized (cfg, rb->size, was, true);
  assert_int_equal (cache_nslots (c), now);
  assert_int_equal (ST (c, loaded_slots), kept);
  read_all_check (c, rb, 64 * PS);
  assert_int_equal (ST (c, verify_failures), 0);
  cache_close (c);
}

/* A new size keeps the pages that fit (the page pool does not move
 * here: test-ssdcache-resize.sh moves it), and never dirty data.
 */
static void
test_resize (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint8_t buf[PS], got[PS];
  int err = 0;

  rambackend_init (&rb, 64 * PS, 18);
  open_read_all_check (&cfg, &rb, 16 * PS);

  resized_kept (&cfg, &rb, 16, 32, 16);    /* grow: all 16 kept */
  resized_kept (&cfg, &rb, 32, 8, 8);      /* shrink: slots 0-7 kept */

  /* Dirty data: the engine refuses (exports.c writes it back first). */
  cfg = fixture_writeback_config (8 * PS, PS);
  c = testfile_open_attach (&cfg, rb.size);
  fill_pattern (buf, PS, 5);
  assert_int_equal (cache_write (c, &rb.be, buf, PS, 3 * PS, false, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 1);
  cache_close (c);
  cfg.size = 16 * PS;
  c = resized (&cfg, rb.size, 8, false);
  assert_int_equal (cache_nslots (c), 8);
  assert_int_equal (cache_dirty_pages (c), 1);
  assert_int_equal (cache_read (c, &rb.be, got, PS, 3 * PS, &err), 0);
  assert_memory_equal (buf, got, PS);
  fixture_close (c, &rb);
}

/* A shrink keeps the hottest pages, wherever they sit: pages read
 * twice in slots the smaller cache drops are moved into slots it keeps
 * (over pages read once), as many as ssdcache-resize-move allows (all,
 * 3 or none), in one batch or several (3 pages between two syncs), and
 * read back as hits, with their data.
 */
extern unsigned resize_test_moves;

static void
test_resize_keeps_hot (void **state)
{
  const struct { uint64_t limit, moved; unsigned batch; } t[] = {
    { CACHE_DEFAULT_RESIZE_MOVE, 8, 0 }, { CACHE_DEFAULT_RESIZE_MOVE, 8, 3 },
    { 3 * PS + 100, 3, 0 }, { 0, 0, 0 },
  };

  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    struct rambackend rb;
    struct cache_config cfg = fixture_config (32 * PS, PS);
    struct cache *c;

    rambackend_init (&rb, 64 * PS, 23);
    cfg.reset = true;                        /* (a new cache each time) */
    c = testfile_open_attach (&cfg, rb.size);
    assert_int_equal (cache_nslots (c), 32);
    for (uint64_t p = 0; p < 32; p++)
      read_check (c, &rb, p * PS, PS);       /* in slots 0-31, once */
    read_check (c, &rb, 24 * PS, 8 * PS);    /* 24-31 again: hot */
    cache_close (c);

    cfg.size = 8 * PS;
    cfg.reset = false;
    cfg.resize_move = t[i].limit;
    resize_test_moves = t[i].batch;
    c = resized (&cfg, rb.size, 32, true);
    resize_test_moves = 0;
    assert_int_equal (ST (c, loaded_slots), 8);
    rambackend_reset_counters (&rb);
    for (uint64_t p = 24; p < 32; p++)
      read_check (c, &rb, p * PS, PS);
    assert_int_equal (rb.reads, 8 - t[i].moved);
    assert_int_equal (ST (c, verify_failures), 0);
    fixture_close (c, &rb);
  }
}

static void
test_lock (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c, *c2;
  int errs;

  c = fixture_open (&rb, &cfg, 16 * PS, 19);
  read_check (c, &rb, 0, PS);

  errs = log_error_count;
  c2 = cache_open (&cfg);
  assert_null (c2);
  assert_true (log_error_count > errs);
  last_error_says ("in use by another process");
  /* Not even with reset. */
  cfg.reset = true;
  assert_null (cache_open (&cfg));
  cfg.reset = false;

  /* The failed attempt did not disturb the first owner. */
  read_check (c, &rb, 0, 16 * PS);
  cache_close (c);
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 16);
  fixture_close (c, &rb);
}

/* A file that is not a cache at all. */
static void
test_garbage_file (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  uint8_t junk[3 * PS], back[3 * PS];
  int errs;

  rambackend_init (&rb, 16 * PS, 20);
  fill_pattern (junk, sizeof junk, 1);
  testfile_write (0, junk, sizeof junk);
  open_refused (&cfg, rb.size);
  /* The file was not overwritten. */
  assert_int_equal (testfile_read (0, back, sizeof back), sizeof back);
  assert_memory_equal (junk, back, sizeof junk);
  /* A tiny non-empty file is not a cache either. */
  assert_int_equal (truncate (testfile_path, 100), 0);
  cfg.reset = false;
  open_refused (&cfg, rb.size);
  {
    struct stat st;
    assert_int_equal (stat (testfile_path, &st), 0);
    assert_int_equal (st.st_size, 100);
  }

  /* Not even a reset overwrites a file that is not a cache. */
  cfg.reset = true;
  errs = log_error_count;
  assert_null (cache_open (&cfg));
  assert_true (log_error_count > errs);
  last_error_says ("not an ssdcache cache");
  last_error_says ("delete it");
  assert_int_equal (testfile_read (0, back, 200), 100);
  assert_memory_equal (junk, back, 100);
  /* Emptied, it is a new cache. */
  assert_int_equal (truncate (testfile_path, 0), 0);
  cfg.reset = false;
  open_read_all_check (&cfg, &rb, 16 * PS);
  rambackend_free (&rb);
}

/* One damaged superblock copy: the other one is used. */
static void
test_one_sb_damaged (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);

  rambackend_init (&rb, 16 * PS, 21);
  open_read_all_check (&cfg, &rb, 16 * PS);

  /* Damage the newest copy. */
  testfile_xor (testfile_newest_sb () * LAYOUT_SB_SIZE + 200, 1, 0xff);

  rambackend_reset_counters (&rb);
  warm_check (&cfg, &rb, 16 * PS);
  rambackend_free (&rb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    TESTFILE_TEST (test_warm_reopen),
    TESTFILE_TEST (test_stop_saves_changed_hints),
    TESTFILE_TEST (test_corrupt_data),
    TESTFILE_TEST (test_corrupt_entry),
    TESTFILE_TEST (test_entry_conflicts),
    TESTFILE_TEST (test_wrong_identity),
    TESTFILE_TEST (test_wrong_backend_size),
    TESTFILE_TEST (test_too_many_pages),
    TESTFILE_TEST (test_page_size_or_size_change),
    TESTFILE_TEST (test_resize),
    TESTFILE_TEST (test_resize_keeps_hot),
    TESTFILE_TEST (test_lock),
    TESTFILE_TEST (test_garbage_file),
    TESTFILE_TEST (test_one_sb_damaged),
  };

  testfile_name = "test-open";
  testfile_watchdog_seconds = 300;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
