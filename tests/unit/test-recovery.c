/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: recovery of a cache file that was
 * left by a crash in writeback mode (clean and dirty pages, superblock
 * not marked clean) and then damaged.
 *
 * Each test builds the same cache: a clean close after reading pages
 * 0..47 (so one superblock copy says "clean"), then a forked child
 * opens it in writeback mode, overwrites pages 10..15 (dirty), flushes
 * and exits without closing (the crash).  The test damages one part of
 * the file and checks what the next start does: refuse with a clear
 * message, or start and serve only the backend's data or the dirty
 * data written, with lost dirty data counted and logged.
 *
 * Layout used (filter/core/layout.h): 4 KiB pages, 64 slots, so the page
 * table is exactly one 4 KiB block at 8192 and the pool starts at 1 MiB.
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
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "layout.h"
#include "rambackend.h"
#include "stats.h"
#include "fixture.h"
#include "testfile.h"

extern int log_error_count;
extern char log_error_last[512];
extern void log_errors_forget (void);
extern int log_errors_contain (const char *text);

#define PS 4096u
#define NPAGES 64u
#define SIZE ((uint64_t) NPAGES * PS)
#define PT 8192u
#define POOL (1024u * 1024)
#define DIRTY_LO 10u            /* pages 10..15 are dirty */
#define DIRTY_HI 15u
#define CLEAN_HI 47u            /* pages 0..47 are cached */
#define SEED 77u
#define ST(c, f) STATS_GET (cache_stats (c), f)


static void
dirty_pattern (uint8_t *buf, uint64_t page)
{
  for (uint32_t i = 0; i < PS; i++)
    buf[i] = (uint8_t) (page * 31 + i * 7 + 1);
}

/* Kept reachable: the child "crashes" with them open. */
static struct cache *crash_cache;
static struct rambackend crash_rb;

/* Build the crashed cache described at the top. */
static void
make_crashed_cache (void)
{
  struct cache_config cfg = fixture_writeback_config (SIZE, PS);
  struct rambackend rb;
  struct cache *c;
  uint8_t *buf = malloc (SIZE);
  pid_t pid;
  int status, err;

  assert_non_null (buf);
  rambackend_init (&rb, SIZE, SEED);
  c = cache_open (&cfg);
  assert_non_null (c);
  assert_int_equal (cache_attach (c, SIZE), 0);
  assert_int_equal (cache_read (c, &rb.be, buf, (CLEAN_HI + 1) * PS, 0, &err),
                    0);
  cache_close (c);
  rambackend_free (&rb);

  fflush (stdout);
  fflush (stderr);
  pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    alarm (60);
    rambackend_init (&crash_rb, SIZE, SEED);
    crash_cache = cache_open (&cfg);
    if (crash_cache == NULL || cache_attach (crash_cache, SIZE) != 0)
      _exit (1);
    for (uint64_t p = DIRTY_LO; p <= DIRTY_HI; p++) {
      dirty_pattern (buf, p);
      if (cache_write (crash_cache, &crash_rb.be, buf, PS, p * PS, false,
                       &err) != 0)
        _exit (2);
    }
    if (cache_flush (crash_cache, &crash_rb.be, &err) != 0)
      _exit (3);
    if (atomic_load (&crash_rb.writes) != 0)
      _exit (4);
    _exit (0);                  /* no cache_close: a crash */
  }
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status));
  assert_int_equal (WEXITSTATUS (status), 0);
  free (buf);
}

/* Slot of each page, from the page table on disk (-1: none). */
static int
slot_of (uint64_t page)
{
  uint8_t raw[NPAGES * LAYOUT_ENTRY_SIZE];
  int fd = open (testfile_path, O_RDONLY), r = -1;

  assert_true (fd >= 0);
  assert_int_equal (pread (fd, raw, sizeof raw, PT), sizeof raw);
  close (fd);
  for (unsigned s = 0; s < NPAGES; s++) {
    struct layout_entry e;
    if (layout_entry_decode (raw + s * LAYOUT_ENTRY_SIZE, PS / 512, &e) == 0 &&
        e.state != LAYOUT_FREE && e.page == page)
      r = s;
  }
  return r;
}

static void
zero_range (uint64_t off, size_t len)
{
  uint8_t *z = calloc (1, len);
  int fd = open (testfile_path, O_RDWR);

  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, z, len, off), (ssize_t) len);
  close (fd);
  free (z);
}

/* Index (0/1) of the valid superblock copy with the highest generation. */
static int
newest_sb (void)
{
  uint8_t buf[LAYOUT_SB_SIZE];
  struct layout_sb sb;
  uint64_t gen = 0;
  int fd = open (testfile_path, O_RDONLY), best = -1;

  assert_true (fd >= 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal (pread (fd, buf, sizeof buf, i * LAYOUT_SB_SIZE),
                      sizeof buf);
    if (layout_sb_decode (buf, &sb, NULL) == 0 &&
        (best == -1 || sb.generation > gen)) {
      best = i;
      gen = sb.generation;
    }
  }
  close (fd);
  assert_true (best >= 0);
  return best;
}

#define BIT(p) (UINT64_C (1) << (p))
#define ALL_DIRTY (BIT (DIRTY_HI + 1) - BIT (DIRTY_LO))

/* Every page reads as the backend's data, except the dirty pages that
 * survived (dirty pages not in lost, a mask of page bits), which read
 * as written.
 */
static void
check_data (struct cache *c, uint64_t lost)
{
  struct rambackend rb;
  uint8_t got[PS], exp[PS];

  rambackend_init (&rb, SIZE, SEED);
  for (uint64_t p = 0; p < NPAGES; p++) {
    int err = 0;
    if (cache_read (c, &rb.be, got, PS, p * PS, &err) != 0)
      fail_msg ("page %llu: read failed, err %d", (unsigned long long) p,
                err);
    if (p >= DIRTY_LO && p <= DIRTY_HI && !(lost & BIT (p)))
      dirty_pattern (exp, p);
    else
      rambackend_peek (&rb, exp, PS, p * PS);
    if (memcmp (got, exp, PS) != 0)
      fail_msg ("page %llu: wrong data", (unsigned long long) p);
  }
  rambackend_free (&rb);
}

/* cache_open + cache_attach; NULL if either refused (closed then). */
static struct cache *
try_open (void)
{
  struct cache_config cfg = fixture_writeback_config (SIZE, PS);
  struct cache *c = cache_open (&cfg);

  if (c && cache_attach (c, SIZE) != 0) {
    cache_close (c);
    c = NULL;
  }
  return c;
}

static off_t
file_size (void)
{
  struct stat st;

  assert_int_equal (stat (testfile_path, &st), 0);
  return st.st_size;
}

/*----------------------------------------------------------------------*/

/* Undamaged: everything comes back. */
static void
test_rec_intact (void **state)
{
  struct cache *c;

  make_crashed_cache ();
  c = try_open ();
  assert_non_null (c);
  assert_int_equal (cache_dirty_pages (c), DIRTY_HI - DIRTY_LO + 1);
  assert_int_equal (ST (c, dropped_entries), 0);
  check_data (c, 0);
  cache_close (c);
}

/* The newest superblock copy (the one saying "unclean") is damaged; the
 * older one says "clean".  Recovery must still run as after a crash: a
 * dirty page whose data does not verify is dropped (its previous
 * version, the backend's, is served), not served nor turned into EIO.
 */
static void
test_rec_newest_sb_damaged (void **state)
{
  struct cache *c;
  int s12;

  make_crashed_cache ();
  s12 = slot_of (12);
  assert_true (s12 >= 0);
  testfile_xor (POOL + (uint64_t) s12 * PS + 100, 1, 0x10);
  testfile_xor (newest_sb () * LAYOUT_SB_SIZE + 40, 1, 0x01);   /* nslots */
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_true (log_errors_contain ("superblock copy"));
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_true (log_errors_contain ("DIRTY DATA LOST"));
  check_data (c, BIT (12));
  cache_close (c);
}

/* Both superblocks zeroed (whole sectors): never formatted over. */
static void
test_rec_both_sb_zeroed (void **state)
{
  uint8_t before[PS], after[PS];
  int fd;

  make_crashed_cache ();
  fd = open (testfile_path, O_RDONLY);
  assert_int_equal (pread (fd, before, PS, PT), PS);
  close (fd);
  zero_range (0, 2 * LAYOUT_SB_SIZE);
  log_errors_forget ();
  assert_null (try_open ());
  assert_true (log_errors_contain (testfile_path));
  assert_true (log_errors_contain ("zeroed"));
  fd = open (testfile_path, O_RDONLY);
  assert_int_equal (pread (fd, after, PS, PT), PS);
  close (fd);
  assert_memory_equal (before, after, PS);   /* page table untouched */
}

/* A whole 4 KiB page-table block zeroed: every entry in it is damage
 * (the cache wrote all of them when it was made); the dirty pages they
 * described are reported lost, loudly, and read as the backend's data.
 */
static void
test_rec_pt_block_zeroed (void **state)
{
  struct cache *c;

  make_crashed_cache ();
  zero_range (PT, 4096);
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_int_equal (ST (c, dropped_entries), NPAGES);
  assert_true (log_errors_contain ("DIRTY DATA MAY BE LOST"));
  assert_int_equal (cache_dirty_pages (c), 0);
  check_data (c, ALL_DIRTY);
  cache_close (c);
  /* Reported once: the damaged entries were rewritten as FREE. */
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_int_equal (ST (c, dropped_entries), 0);
  assert_false (log_errors_contain ("damaged"));
  cache_close (c);
}

/* One bit of a dirty page's entry: that entry is dropped and the loss
 * is logged as possible dirty-data loss; the others survive.
 */
static void
test_rec_dirty_entry_bit (void **state)
{
  struct cache *c;
  int s13;

  make_crashed_cache ();
  s13 = slot_of (13);
  assert_true (s13 >= 0);
  testfile_xor (PT + (uint64_t) s13 * LAYOUT_ENTRY_SIZE + 20, 1, 0x08);
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_int_equal (ST (c, dropped_entries), 1);
  assert_true (log_errors_contain ("DIRTY DATA MAY BE LOST"));
  assert_int_equal (cache_dirty_pages (c), DIRTY_HI - DIRTY_LO);
  check_data (c, BIT (13));
  cache_close (c);
}

/* The file cut inside the page pool (in the middle of page 12's slot):
 * the slots past the cut are dropped (dirty ones counted and logged),
 * the file is extended back, and no cache-file error follows.
 */
static void
test_rec_truncated_pool (void **state)
{
  struct cache *c;
  off_t full;
  int s12;

  make_crashed_cache ();
  full = file_size ();
  s12 = slot_of (12);
  assert_int_equal (s12, 12);          /* slots follow pages here */
  assert_int_equal (truncate (testfile_path, POOL + 12 * PS + 100), 0);
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_true (log_errors_contain ("truncated"));
  assert_true (log_errors_contain ("DIRTY DATA LOST"));
  assert_int_equal (ST (c, dirty_dropped), DIRTY_HI - 12 + 1);
  assert_int_equal (file_size (), full);
  check_data (c, ALL_DIRTY & ~(BIT (10) | BIT (11)));
  assert_int_equal (ST (c, cache_errors), 0);
  assert_int_equal (ST (c, degraded), 0);
  cache_close (c);
}

/* The file cut inside the page table: refused, saying so. */
static void
test_rec_truncated_pt (void **state)
{
  make_crashed_cache ();
  assert_int_equal (truncate (testfile_path, PT + 30 * LAYOUT_ENTRY_SIZE), 0);
  log_errors_forget ();
  assert_null (try_open ());
  assert_true (log_errors_contain (testfile_path));
  assert_true (log_errors_contain ("truncated"));
  assert_int_equal (file_size (), PT + 30 * LAYOUT_ENTRY_SIZE);
}

/* A superblock copy from a newer format version (checksum right): the
 * cache is refused and left alone, even though the other copy is fine.
 * A version field changed by a flipped bit (checksum wrong) is mere
 * damage: the other copy is used.
 */
static void
test_rec_future_version (void **state)
{
  uint8_t buf[LAYOUT_SB_SIZE], back[LAYOUT_SB_SIZE];
  int fd, n;
  struct cache *c;

  make_crashed_cache ();
  n = newest_sb ();
  fd = open (testfile_path, O_RDWR);
  assert_int_equal (pread (fd, buf, sizeof buf, n * LAYOUT_SB_SIZE),
                    sizeof buf);
  buf[8] = LAYOUT_VERSION + 1;
  {
    uint32_t crc = layout_crc32c (buf, LAYOUT_SB_SIZE - 4);
    for (int i = 0; i < 4; i++)
      buf[LAYOUT_SB_SIZE - 4 + i] = crc >> (8 * i);
  }
  assert_int_equal (pwrite (fd, buf, sizeof buf, n * LAYOUT_SB_SIZE),
                    sizeof buf);
  close (fd);
  log_errors_forget ();
  assert_null (try_open ());
  assert_true (log_errors_contain ("newer"));
  fd = open (testfile_path, O_RDONLY);
  assert_int_equal (pread (fd, back, sizeof back, n * LAYOUT_SB_SIZE),
                    sizeof back);
  close (fd);
  assert_memory_equal (buf, back, sizeof buf);

  /* Now with a wrong checksum: a damaged copy, recovered from. */
  testfile_xor (n * LAYOUT_SB_SIZE + 200, 1, 0x01);
  c = try_open ();
  assert_non_null (c);
  check_data (c, 0);
  cache_close (c);
}

/* A bit of a clean page's data, and one of a dirty page's data. */
static void
test_rec_data_bits (void **state)
{
  struct cache *c;
  int s30, s14;

  make_crashed_cache ();
  s30 = slot_of (30);
  s14 = slot_of (14);
  assert_true (s30 >= 0 && s14 >= 0);
  testfile_xor (POOL + (uint64_t) s30 * PS + 4095, 1, 0x80);
  testfile_xor (POOL + (uint64_t) s14 * PS, 1, 0x01);
  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_true (log_errors_contain ("DIRTY DATA LOST"));
  check_data (c, BIT (14));
  assert_int_equal (ST (c, verify_failures), 1);
  cache_close (c);
}

int
main (void)
{
#define T(f) cmocka_unit_test_setup_teardown (f, testfile_setup, \
                                              testfile_teardown)
  const struct CMUnitTest tests[] = {
    T (test_rec_intact),
    T (test_rec_newest_sb_damaged),
    T (test_rec_both_sb_zeroed),
    T (test_rec_pt_block_zeroed),
    T (test_rec_dirty_entry_bit),
    T (test_rec_truncated_pool),
    T (test_rec_truncated_pt),
    T (test_rec_future_version),
    T (test_rec_data_bits),
  };

  testfile_name = "test-recovery";
  testfile_watchdog_seconds = 120;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
