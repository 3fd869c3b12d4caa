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
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"

extern int log_error_count;
extern char log_error_last[512];

#define PS 4096u
#define ST(c, f) STATS_GET (cache_stats (c), f)

/* The temporary cache file and the watchdog: tests/unit/testfile.h. */
#define cache_path testfile_path
#define setup_file testfile_setup
#define teardown_file testfile_teardown
#define read_file_sb testfile_read_sb
#define open_attach testfile_open_attach

static void
patch_file (uint64_t off, const void *buf, size_t len)
{
  int fd = open (cache_path, O_WRONLY);

  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, buf, len, off), (ssize_t) len);
  close (fd);
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

  rambackend_init (&rb, 64 * PS, 10);
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 10000);
  write_check (c, &rb, 3 * PS + 5, 1000, 1);
  write_check (c, &rb, 9 * PS, PS, 2);
  cache_close (c);

  read_file_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_CLEAN);

  c = open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 64);
  assert_int_equal (ST (c, dropped_entries), 0);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 10000);
  assert_int_equal (rb.reads, 0);
  assert_true (ST (c, read_hits) >= 64);
  assert_int_equal (ST (c, read_misses), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  /* Reopened: the superblock is marked in use again. */
  read_file_sb (&sb);
  assert_int_equal (sb.flags & LAYOUT_SB_CLEAN, 0);
  cache_close (c);

  /* Third start, still warm. */
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 64 * PS);
  assert_int_equal (rb.reads, 0);
  cache_close (c);
  rambackend_free (&rb);
}

/*----------------------------------------------------------------------
 * A damaged cache file.
 */

/* Returns the pool offset of the cache file. */
static uint64_t
file_pool_offset (void)
{
  struct layout_sb sb;

  read_file_sb (&sb);
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
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  pool = file_pool_offset ();
  memset (garbage, 0xa5, sizeof garbage);
  patch_file (pool + 0 * PS + 1000, garbage, sizeof garbage);   /* slot 0 */
  testfile_xor (pool + 5 * PS + PS - 1, 1, 0x01);                   /* slot 5 */

  c = open_attach (&cfg, rb.size);
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
  c = open_attach (&cfg, rb.size);
  for (uint64_t p = 0; p < 16; ++p)
    read_check (c, &rb, p * PS + 17, 1);
  assert_int_equal (ST (c, verify_failures), 1);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);
  rambackend_free (&rb);
}

static void
test_corrupt_entry (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  struct layout_sb sb;

  rambackend_init (&rb, 16 * PS, 13);
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  read_file_sb (&sb);
  testfile_xor (sb.pt_offset + 3 * LAYOUT_ENTRY_SIZE + 10, 1, 0x04);
  testfile_xor (sb.pt_offset + 9 * LAYOUT_ENTRY_SIZE + 63, 1, 0x40);

  c = open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, dropped_entries), 2);
  assert_int_equal (ST (c, loaded_slots), 14);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (rb.bytes_read, 2 * PS);
  cache_close (c);
  rambackend_free (&rb);
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
  struct layout_sb sb;
  uint8_t raw[LAYOUT_ENTRY_SIZE];
  struct layout_entry e4, e6;
  int fd;

  rambackend_init (&rb, 16 * PS, 14);
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  read_file_sb (&sb);
  fd = open (cache_path, O_RDWR);
  assert_true (fd >= 0);
  /* Slot 4's entry: make it claim slot 6's page with an older seq;
   * its data is slot 4's data, which is not that page: if it won, a
   * read of that page would be wrong.
   */
  assert_int_equal (pread (fd, raw, sizeof raw,
                           sb.pt_offset + 6 * LAYOUT_ENTRY_SIZE),
                    sizeof raw);
  assert_int_equal (layout_entry_decode (raw, PS / 512, &e6), 0);
  assert_int_equal (pread (fd, raw, sizeof raw,
                           sb.pt_offset + 4 * LAYOUT_ENTRY_SIZE),
                    sizeof raw);
  assert_int_equal (layout_entry_decode (raw, PS / 512, &e4), 0);
  e4.page = e6.page;
  e4.seq = e6.seq > 1 ? e6.seq - 1 : 0;
  layout_entry_encode (&e4, raw);
  assert_int_equal (pwrite (fd, raw, sizeof raw,
                            sb.pt_offset + 4 * LAYOUT_ENTRY_SIZE),
                    sizeof raw);
  /* Slot 8's entry: a page past the end of the backend. */
  assert_int_equal (pread (fd, raw, sizeof raw,
                           sb.pt_offset + 8 * LAYOUT_ENTRY_SIZE),
                    sizeof raw);
  {
    struct layout_entry e8;
    assert_int_equal (layout_entry_decode (raw, PS / 512, &e8), 0);
    e8.page = 1000;
    layout_entry_encode (&e8, raw);
  }
  assert_int_equal (pwrite (fd, raw, sizeof raw,
                            sb.pt_offset + 8 * LAYOUT_ENTRY_SIZE),
                    sizeof raw);
  close (fd);

  c = open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 14);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (ST (c, verify_failures), 0);
  cache_close (c);
  rambackend_free (&rb);
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
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  cfg.id_digest[1] ^= 1;
  cfg.id_text = "another backend";
  errs = log_error_count;
  c = cache_open (&cfg);
  assert_null (c);
  assert_true (log_error_count > errs);
  if (strstr (log_error_last, "built for another backend") == NULL)
    fail_msg ("unexpected message: %s", log_error_last);

  /* With reset: opens, empty. */
  cfg.reset = true;
  c = open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 0);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (rb.bytes_read, 16 * PS);
  cache_close (c);

  /* The file now belongs to the new identity. */
  cfg.reset = false;
  c = open_attach (&cfg, rb.size);
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
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  /* Same identity, bigger backend. */
  rambackend_init (&rb2, 16 * PS + 512, 17);
  c = cache_open (&cfg);
  assert_non_null (c);
  errs = log_error_count;
  assert_int_equal (cache_attach (c, rb2.size), -1);
  assert_true (log_error_count > errs);
  if (strstr (log_error_last, "backend size") == NULL)
    fail_msg ("unexpected message: %s", log_error_last);
  cache_close (c);

  cfg.reset = true;
  c = open_attach (&cfg, rb2.size);
  assert_int_equal (ST (c, loaded_slots), 0);
  read_all_check (c, &rb2, 16 * PS + 512);
  assert_int_equal (rb2.bytes_read, rb2.size);
  cache_close (c);
  rambackend_free (&rb);
  rambackend_free (&rb2);
}

/* A backend with more pages than the page table can number (2^32 - 1)
 * is refused, with a message naming the limit; one page less is not.
 */
static void
test_too_many_pages (void **state)
{
  struct cache_config cfg = fixture_config (16 * PS, PS);
  const uint64_t max = (uint64_t) UINT32_MAX * PS;   /* 2^32 - 1 pages */
  struct cache *c;
  int errs;

  c = cache_open (&cfg);
  assert_non_null (c);
  errs = log_error_count;
  assert_int_equal (cache_attach (c, max + 1), -1);
  assert_true (log_error_count > errs);
  if (strstr (log_error_last, "at most 4294967295 pages") == NULL ||
      strstr (log_error_last, "ssdcache-page-size") == NULL)
    fail_msg ("unexpected message: %s", log_error_last);
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
  int errs;

  rambackend_init (&rb, 64 * PS, 18);
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  /* Another page size. */
  cfg.page_size = 2 * PS;
  errs = log_error_count;
  c = cache_open (&cfg);
  if (c != NULL) {
    assert_int_equal (cache_attach (c, rb.size), -1);
    cache_close (c);
  }
  assert_true (log_error_count > errs);

  /* Another explicit size. */
  cfg.page_size = PS;
  cfg.size = 32 * PS;
  errs = log_error_count;
  c = cache_open (&cfg);
  if (c != NULL) {
    assert_int_equal (cache_attach (c, rb.size), -1);
    cache_close (c);
  }
  assert_true (log_error_count > errs);

  /* Size 0 (default) takes the existing cache as it is. */
  cfg.size = 0;
  c = open_attach (&cfg, rb.size);
  assert_int_equal (cache_nslots (c), 16);
  assert_int_equal (ST (c, loaded_slots), 16);
  cache_close (c);

  /* Reset re-initialises with the new size. */
  cfg.size = 32 * PS;
  cfg.reset = true;
  c = open_attach (&cfg, rb.size);
  assert_int_equal (cache_nslots (c), 32);
  assert_int_equal (ST (c, loaded_slots), 0);
  read_all_check (c, &rb, 64 * PS);
  cache_close (c);
  rambackend_free (&rb);
}

static void
test_lock (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c, *c2;
  int errs;

  rambackend_init (&rb, 16 * PS, 19);
  c = open_attach (&cfg, rb.size);
  read_check (c, &rb, 0, PS);

  errs = log_error_count;
  c2 = cache_open (&cfg);
  assert_null (c2);
  assert_true (log_error_count > errs);
  if (strstr (log_error_last, "in use by another process") == NULL)
    fail_msg ("unexpected message: %s", log_error_last);
  /* Not even with reset. */
  cfg.reset = true;
  assert_null (cache_open (&cfg));
  cfg.reset = false;

  /* The failed attempt did not disturb the first owner. */
  read_check (c, &rb, 0, 16 * PS);
  cache_close (c);
  c = open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 16);
  cache_close (c);
  rambackend_free (&rb);
}

/* A file that is not a cache at all. */
static void
test_garbage_file (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint8_t junk[3 * PS];
  int errs;

  rambackend_init (&rb, 16 * PS, 20);
  fill_pattern (junk, sizeof junk, 1);
  patch_file (0, junk, sizeof junk);
  errs = log_error_count;
  c = cache_open (&cfg);
  if (c != NULL) {
    assert_int_equal (cache_attach (c, rb.size), -1);
    cache_close (c);
  }
  assert_true (log_error_count > errs);
  /* The file was not overwritten. */
  {
    uint8_t back[sizeof junk];
    int fd = open (cache_path, O_RDONLY);
    assert_int_equal (pread (fd, back, sizeof back, 0), sizeof back);
    close (fd);
    assert_memory_equal (junk, back, sizeof junk);
  }
  /* A tiny non-empty file is not a cache either. */
  assert_int_equal (truncate (cache_path, 100), 0);
  cfg.reset = false;
  errs = log_error_count;
  c = cache_open (&cfg);
  if (c != NULL) {
    assert_int_equal (cache_attach (c, rb.size), -1);
    cache_close (c);
  }
  assert_true (log_error_count > errs);
  {
    struct stat st;
    assert_int_equal (stat (cache_path, &st), 0);
    assert_int_equal (st.st_size, 100);
  }

  /* Not even a reset overwrites a file that is not a cache. */
  cfg.reset = true;
  errs = log_error_count;
  assert_null (cache_open (&cfg));
  assert_true (log_error_count > errs);
  if (strstr (log_error_last, "not an ssdcache cache") == NULL ||
      strstr (log_error_last, "delete it") == NULL)
    fail_msg ("unexpected message: %s", log_error_last);
  {
    uint8_t back[200];
    int fd = open (cache_path, O_RDONLY);
    assert_int_equal (pread (fd, back, sizeof back, 0), 100);
    close (fd);
    assert_memory_equal (junk, back, 100);
  }
  /* Emptied, it is a new cache. */
  assert_int_equal (truncate (cache_path, 0), 0);
  cfg.reset = false;
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);
  rambackend_free (&rb);
}

/* One damaged superblock copy: the other one is used. */
static void
test_one_sb_damaged (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint8_t buf[LAYOUT_SB_SIZE];
  struct layout_sb sb;
  int fd, newest = -1;
  uint64_t gen = 0;

  rambackend_init (&rb, 16 * PS, 21);
  c = open_attach (&cfg, rb.size);
  read_all_check (c, &rb, 16 * PS);
  cache_close (c);

  /* Damage the newest copy. */
  fd = open (cache_path, O_RDWR);
  assert_true (fd >= 0);
  for (int i = 0; i < 2; ++i) {
    assert_int_equal (pread (fd, buf, sizeof buf, i * LAYOUT_SB_SIZE),
                      sizeof buf);
    if (layout_sb_decode (buf, &sb, NULL) == 0 &&
        (newest == -1 || sb.generation > gen)) {
      newest = i;
      gen = sb.generation;
    }
  }
  assert_true (newest >= 0);
  assert_int_equal (pread (fd, buf, sizeof buf, newest * LAYOUT_SB_SIZE),
                    sizeof buf);
  buf[200] ^= 0xff;
  assert_int_equal (pwrite (fd, buf, sizeof buf, newest * LAYOUT_SB_SIZE),
                    sizeof buf);
  close (fd);

  c = open_attach (&cfg, rb.size);
  rambackend_reset_counters (&rb);
  read_all_check (c, &rb, 16 * PS);
  assert_int_equal (rb.reads, 0);
  cache_close (c);
  rambackend_free (&rb);
}

#define T(f) cmocka_unit_test_setup_teardown (f, setup_file, teardown_file)

int
main (void)
{
  const struct CMUnitTest tests[] = {
    T (test_warm_reopen),
    T (test_corrupt_data),
    T (test_corrupt_entry),
    T (test_entry_conflicts),
    T (test_wrong_identity),
    T (test_wrong_backend_size),
    T (test_too_many_pages),
    T (test_page_size_or_size_change),
    T (test_lock),
    T (test_garbage_file),
    T (test_one_sb_damaged),
  };

  testfile_name = "test-open";
  testfile_watchdog_seconds = 300;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
