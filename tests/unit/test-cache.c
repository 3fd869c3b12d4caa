/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the read and write paths of the
 * cache engine in writethrough and writearound mode, over a RAM backend
 * and a real temporary cache file (tests/unit/fixture.h).
 *
 * Reads, hits, writes, unaligned I/O, an odd backend size, eviction,
 * invalidation, prefetch, backend errors and concurrent readers and
 * writers.  Restarts are in test-open.c (after a clean close) and
 * test-crash.c (after a crash); writeback mode in test-writeback.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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

#define PS 4096u

/*----------------------------------------------------------------------
 * Basic reads and hits.
 */

static void
test_new_file_reads_and_hits (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  struct layout_sb sb;
  uint64_t reads;

  c = fixture_open (&rb, &cfg, 64 * PS, 1);
  assert_int_equal (cache_page_size (c), PS);
  assert_int_equal (cache_nslots (c), 64);

  /* The file carries a valid superblock for this cache, not clean
   * while open.
   */
  testfile_read_sb (&sb);
  assert_int_equal (sb.page_size, PS);
  assert_int_equal (sb.nslots, 64);
  assert_int_equal (sb.backend_size, rb.size);
  assert_int_equal (sb.id_digest[0], cfg.id_digest[0]);
  assert_int_equal (sb.id_digest[1], cfg.id_digest[1]);
  assert_string_equal (sb.id_text, cfg.id_text);
  assert_int_equal (sb.flags & LAYOUT_SB_CLEAN, 0);
  {
    struct stat st;
    assert_int_equal (stat (testfile_path, &st), 0);
    assert_true ((uint64_t) st.st_size >= sb.pool_offset + 64 * PS);
    assert_int_equal (sb.pool_offset % LAYOUT_POOL_ALIGN, 0);
  }

  /* First read: a miss, from the backend. */
  read_check (c, &rb, 0, PS);
  assert_int_equal (rb.reads, 1);
  assert_int_equal (ST (c, read_misses), 1);
  assert_int_equal (ST (c, fills), 1);
  /* Second read: a hit. */
  read_check (c, &rb, 0, PS);
  assert_int_equal (rb.reads, 1);
  assert_int_equal (ST (c, read_hits), 1);
  assert_int_equal (ST (c, bytes_from_cache), PS);
  /* Pieces of the same page are hits too. */
  read_check (c, &rb, 1, 1);
  read_check (c, &rb, 100, 3000);
  read_check (c, &rb, PS - 1, 1);
  assert_int_equal (rb.reads, 1);

  /* Everything, in odd chunks; then again: no backend reads. */
  read_all_check (c, &rb, 7 * 1024 + 3);
  reads = rb.reads;
  assert_true (reads >= 2);
  assert_int_equal (ST (c, fills), 64);
  /* Misses read only the sectors asked for: each byte once, except
   * that a chunk boundary inside a 512-byte sector reads that sector
   * twice (a partly read sector cannot be cached).
   */
  {
    uint64_t chunks = (64 * PS + 7 * 1024 + 2) / (7 * 1024 + 3);
    assert_true (rb.bytes_read >= 64 * PS);
    assert_true (rb.bytes_read <= 64 * PS + chunks * 512);
  }
  read_all_check (c, &rb, 5000);
  read_all_check (c, &rb, 64 * PS);
  assert_int_equal (rb.reads, reads);
  assert_int_equal (ST (c, evictions), 0);
  assert_int_equal (rb.out_of_range, 0);

  cache_close (c);
  /* Closed cleanly. */
  testfile_read_sb (&sb);
  assert_int_equal (sb.flags & LAYOUT_SB_CLEAN, LAYOUT_SB_CLEAN);
  rambackend_free (&rb);
}

static void
test_unaligned (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (256 * PS, PS);
  struct cache *c;
  uint64_t s = 12345;

  c = fixture_open (&rb, &cfg, 256 * PS, 2);
  for (int i = 0; i < 600; ++i) {
    struct extent x = rnd_extent (&s, rb.size, 20000);
    if (i % 3 == 0)
      write_check (c, &rb, x.off, x.len, i);
    else
      read_check (c, &rb, x.off, x.len);
  }
  /* Reads spanning many pages, starting/ending mid-page. */
  read_check (c, &rb, 1, rb.size - 2);
  read_check (c, &rb, PS - 1, 2);
  read_check (c, &rb, 3 * PS + 17, 40 * PS + 1000);
  read_all_check (c, &rb, 65536);
  /* Zero-length requests are harmless. */
  {
    int err = 0;
    uint8_t b;
    assert_int_equal (cache_read (c, &rb.be, &b, 0, 100, &err), 0);
  }
  assert_int_equal (rb.out_of_range, 0);
  fixture_close (c, &rb);
}

static void
test_odd_size (void **state)
{
  const uint64_t size = 130000;       /* 31 pages + 3024 bytes */
  struct rambackend rb;
  struct cache_config cfg = fixture_config (1024 * 1024, PS);
  struct cache *c;
  uint64_t s = 777, reads;

  c = fixture_open (&rb, &cfg, size, 3);
  /* Never more slots than backend pages plus the spare ones for older
   * versions (a quarter, at least 16).
   */
  assert_int_equal (cache_nslots (c), (size + PS - 1) / PS + 16);

  read_check (c, &rb, size - 1, 1);
  read_check (c, &rb, 31 * PS, size - 31 * PS);
  read_check (c, &rb, 31 * PS - 10, 20);
  read_check (c, &rb, 0, size);
  reads = rb.reads;
  read_check (c, &rb, 0, size);
  read_check (c, &rb, size - 1, 1);
  assert_int_equal (rb.reads, reads);       /* the short page is a hit */

  /* Writes at the tail: partial, and the whole short page. */
  write_check (c, &rb, size - 100, 100, 1);
  read_check (c, &rb, size - 200, 200);
  write_check (c, &rb, 31 * PS, size - 31 * PS, 2);
  read_check (c, &rb, 31 * PS, size - 31 * PS);
  write_check (c, &rb, size - 5000, 5000, 3);
  read_check (c, &rb, 0, size);
  assert_int_equal (rb.reads, reads);

  for (int i = 0; i < 300; ++i) {
    struct extent x = rnd_extent (&s, size, 9000);
    if (i % 2)
      write_check (c, &rb, x.off, x.len, 100 + i);
    else
      read_check (c, &rb, x.off, x.len);
  }
  read_check (c, &rb, 0, size);
  assert_int_equal (rb.out_of_range, 0);
  cache_close (c);

  /* Warm restart over the odd size: all hits, right data. */
  c = testfile_open_attach (&cfg, size);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, size);
  read_check (c, &rb, size - 1, 1);
  assert_int_equal (rb.reads, 0);
  fixture_close (c, &rb);
}

/*----------------------------------------------------------------------
 * Writes.
 */

static void
test_writethrough_updates_cache (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  uint64_t s = 99;

  c = fixture_open (&rb, &cfg, 64 * PS, 4);
  read_all_check (c, &rb, 64 * PS);          /* everything cached */
  rambackend_reset_counters (&rb);

  for (int i = 0; i < 300; ++i) {
    struct extent x = rnd_extent (&s, rb.size, 10000);
    uint64_t lo = x.off > 100 ? x.off - 100 : 0;   /* 100 bytes around */
    write_check (c, &rb, x.off, x.len, i);
    read_check (c, &rb, lo, x.len + 200 > rb.size - x.off
                ? rb.size - lo : x.len + 200);
  }
  read_all_check (c, &rb, 64 * PS);
  /* The cache was updated, not dropped: not one backend read. */
  assert_int_equal (rb.reads, 0);
  assert_int_equal (rb.writes, 300);
  assert_true (ST (c, pages_updated) >= 300);
  assert_int_equal (ST (c, write_ops), 300);
  cache_close (c);

  /* And the updates persisted. */
  warm_check (&cfg, &rb, 64 * PS);
  rambackend_free (&rb);
}

static void
test_write_uncached (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;

  c = fixture_open (&rb, &cfg, 64 * PS, 5);

  /* A partial page that is not cached is not added... */
  write_check (c, &rb, 10, 100, 1);
  assert_int_equal (rb.reads, 0);
  read_check (c, &rb, 0, PS);
  assert_int_equal (rb.reads, 1);

  /* ...a whole page is (no backend read needed later). */
  write_check (c, &rb, 2 * PS, PS, 2);
  read_check (c, &rb, 2 * PS, PS);
  assert_int_equal (rb.reads, 1);

  /* A write covering 3 whole pages and two partial ones. */
  write_check (c, &rb, 10 * PS + 500, 4 * PS, 3);
  read_check (c, &rb, 11 * PS, 3 * PS);
  assert_int_equal (rb.reads, 1);
  read_check (c, &rb, 10 * PS, PS);
  read_check (c, &rb, 14 * PS, PS);
  assert_int_equal (rb.reads, 3);

  /* FUA reaches the backend with the write. */
  assert_int_equal (rb.fua_writes, 0);
  {
    uint8_t b[100];
    int err = 0;
    fill_pattern (b, sizeof b, 9);
    assert_int_equal (cache_write (c, &rb.be, b, sizeof b, 11 * PS + 7,
                                   true, &err), 0);
    assert_int_equal (rb.fua_writes, 1);
    read_check (c, &rb, 11 * PS, PS);
    assert_int_equal (rb.reads, 3);
  }
  fixture_close (c, &rb);
}

static void
test_writearound (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;

  cfg.mode = LAYOUT_MODE_WRITEAROUND;
  c = fixture_open (&rb, &cfg, 64 * PS, 6);
  read_check (c, &rb, 0, 8 * PS);
  rambackend_reset_counters (&rb);

  /* A write drops the cached copies it touches. */
  write_check (c, &rb, PS + 10, 2 * PS, 1);     /* pages 1..3 */
  assert_true (ST (c, pages_invalidated) >= 3);
  read_check (c, &rb, 0, PS);                   /* page 0: still a hit */
  assert_int_equal (rb.reads, 0);
  read_check (c, &rb, PS, 3 * PS);              /* 1..3 from the backend */
  assert_true (rb.reads >= 1);
  assert_int_equal (rb.bytes_read, 3 * PS);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, 3 * PS);

  /* Whole-page writes are not added in writearound mode. */
  write_check (c, &rb, 20 * PS, PS, 2);
  read_check (c, &rb, 20 * PS, PS);
  assert_int_equal (rb.bytes_read, 4 * PS);
  fixture_close (c, &rb);
}

/*----------------------------------------------------------------------
 * Eviction and invalidation.
 */

static void
test_eviction_small_cache (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (4 * PS, PS);
  struct cache *c;
  uint64_t s = 4242;

  c = fixture_open (&rb, &cfg, 256 * PS, 7);
  assert_int_equal (cache_nslots (c), 4);

  for (int i = 0; i < 1500; ++i) {
    struct extent x = rnd_extent (&s, rb.size, 6 * PS);
    switch (rnd64 (&s) % 4) {
    case 0:
      write_check (c, &rb, x.off, x.len, i);
      break;
    case 1:   /* a small working set that should mostly hit */
      read_check (c, &rb, (rnd64 (&s) % 3) * PS, PS);
      break;
    default:
      read_check (c, &rb, x.off, x.len);
    }
  }
  read_all_check (c, &rb, 3 * PS + 1);
  assert_true (ST (c, evictions) > 0);
  assert_true (ST (c, read_hits) > 0);
  assert_int_equal (rb.out_of_range, 0);
  cache_close (c);

  /* After the churn, a restart still serves right data. */
  c = testfile_open_attach (&cfg, rb.size);
  assert_true (ST (c, loaded_slots) <= 4);
  read_all_check (c, &rb, 5 * PS);
  fixture_close (c, &rb);
}

static void
test_invalidate (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  uint8_t newdata[2 * PS];
  uint64_t reads;

  c = fixture_open (&rb, &cfg, 64 * PS, 8);
  read_check (c, &rb, 0, 8 * PS);
  reads = rb.reads;

  /* The backend changes behind the cache (as a zero or trim would),
   * then the range is invalidated.
   */
  fill_pattern (newdata, sizeof newdata, 77);
  rambackend_poke (&rb, newdata, sizeof newdata, PS);   /* pages 1, 2 */
  cache_invalidate (c, PS + 1, PS + PS / 2);          /* touches 1 and 2 */
  assert_true (ST (c, pages_invalidated) >= 2);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, 8 * PS + 2 * PS);
  assert_true (rb.reads > reads);

  /* One byte at the very end of a page drops only that page. */
  rambackend_poke (&rb, newdata, 1, 5 * PS + PS - 1);
  cache_invalidate (c, 1, 5 * PS + PS - 1);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, 8 * PS + 3 * PS);

  /* Invalidating pages that are not cached, or nothing, is harmless. */
  cache_invalidate (c, 10 * PS, 30 * PS);
  cache_invalidate (c, 0, 0);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, 8 * PS + 3 * PS);

  /* Invalidated pages stay gone after a restart. */
  cache_invalidate (c, PS, 0);
  cache_close (c);
  rambackend_poke (&rb, newdata + 7, PS, 0);
  c = testfile_open_attach (&cfg, rb.size);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, PS);
  fixture_close (c, &rb);
}

static void
test_prefetch (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  int err = 0;

  c = fixture_open (&rb, &cfg, 64 * PS, 9);
  assert_int_equal (cache_preload (c, &rb.be, 10 * PS - 1, 5 * PS + 1,
                                    &err), 0);
  assert_int_equal (rb.bytes_read, 10 * PS);     /* pages 5..14 */
  read_check (c, &rb, 5 * PS, 10 * PS);
  assert_int_equal (rb.bytes_read, 10 * PS);
  assert_int_equal (cache_sync (c, &err), 0);
  fixture_close (c, &rb);
}

/* Writethrough: a partial write to a cached page whose sectors it
 * touches are not cached goes to the backend only (the cache file is
 * not written); one that touches a cached sector updates the page.
 */
static void
test_write_uncached_sectors (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint64_t upd;

  c = fixture_open (&rb, &cfg, 16 * PS, 21);
  read_check (c, &rb, 3 * PS, 512);           /* page 3: sector 0 only */
  assert_int_equal (rb.reads, 1);
  assert_int_equal (ST (c, fills), 1);

  write_check (c, &rb, 3 * PS + 2048, 1024, 1);   /* sectors 4-5 */
  assert_int_equal (ST (c, writes_not_cached), 1);
  assert_int_equal (ST (c, pages_updated), 0);
  write_check (c, &rb, 3 * PS + 1000, 100, 2);    /* inside sector 1 */
  assert_int_equal (ST (c, writes_not_cached), 2);
  read_check (c, &rb, 3 * PS, 512);           /* still a hit */
  assert_int_equal (rb.reads, 1);
  read_check (c, &rb, 3 * PS + 2048, 1024);   /* from the backend */
  assert_int_equal (rb.reads, 2);

  /* Sector 0 is cached: this write updates the page (sectors 0-1). */
  upd = ST (c, pages_updated);    /* (the read above filled 4-5) */
  write_check (c, &rb, 3 * PS + 100, 800, 3);
  assert_int_equal (ST (c, writes_not_cached), 2);
  assert_int_equal (ST (c, pages_updated), upd + 1);
  read_check (c, &rb, 3 * PS, 512);
  assert_int_equal (rb.reads, 2);

  /* A partial write to a page not cached at all: as before. */
  write_check (c, &rb, 5 * PS + 512, 512, 4);
  assert_int_equal (ST (c, writes_not_cached), 2);
  cache_close (c);

  /* The cache file agrees after a restart. */
  open_read_all_check (&cfg, &rb, PS);
  rambackend_free (&rb);
}

/*----------------------------------------------------------------------
 * Backend errors.
 */

static void
test_backend_read_error (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  uint8_t buf[8 * PS];
  int err;
  uint64_t fills;

  c = fixture_open (&rb, &cfg, 64 * PS, 22);

  rambackend_fail_next_read (&rb, EIO);
  err = 0;
  assert_int_equal (cache_read (c, &rb.be, buf, PS, 0, &err), -1);
  assert_int_equal (err, EIO);
  assert_int_equal (ST (c, fills), 0);
  /* Nothing was cached: the next read goes to the backend, right data. */
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, PS);
  assert_int_equal (rb.reads, 1);

  /* A multi-page read whose first pages are hits. */
  read_check (c, &rb, PS, PS);
  fills = ST (c, fills);
  rambackend_fail_next_read (&rb, ENOSPC);
  err = 0;
  assert_int_equal (cache_read (c, &rb.be, buf, 8 * PS, 0, &err), -1);
  assert_int_equal (err, ENOSPC);
  assert_int_equal (ST (c, fills), fills);
  rambackend_reset_counters (&rb);
  read_check (c, &rb, 0, 8 * PS);
  assert_int_equal (rb.bytes_read, 6 * PS);

  /* Prefetch errors propagate too. */
  rambackend_fail_next_read (&rb, EIO);
  err = 0;
  assert_int_equal (cache_preload (c, &rb.be, PS, 20 * PS, &err), -1);
  assert_int_equal (err, EIO);
  read_check (c, &rb, 20 * PS, PS);
  fixture_close (c, &rb);
}

static void
test_backend_write_error (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  uint8_t buf[3 * PS];
  int err;

  c = fixture_open (&rb, &cfg, 64 * PS, 23);
  read_check (c, &rb, 0, 8 * PS);

  fill_pattern (buf, sizeof buf, 5);
  /* Partial and whole pages, cached. */
  rambackend_fail_next_write (&rb, EIO);
  err = 0;
  assert_int_equal (cache_write (c, &rb.be, buf, sizeof buf, PS + 100,
                                 false, &err), -1);
  assert_int_equal (err, EIO);
  read_check (c, &rb, 0, 8 * PS);       /* old data, never the new */

  /* Not cached, whole pages. */
  rambackend_fail_next_write (&rb, EROFS);
  err = 0;
  assert_int_equal (cache_write (c, &rb.be, buf, 2 * PS, 20 * PS,
                                 true, &err), -1);
  assert_int_equal (err, EROFS);
  read_check (c, &rb, 20 * PS, 2 * PS);

  /* Then it works again. */
  write_check (c, &rb, PS + 100, 3 * PS, 6);
  read_check (c, &rb, 0, 8 * PS);
  fixture_close (c, &rb);
}

/*----------------------------------------------------------------------
 * Threads.
 */

#define NTHREADS 4
#define OWN_BYTES (16 * PS)
#define SHARED_OFF (NTHREADS * OWN_BYTES)
#define SHARED_MAX (32 * PS)

/* Size of the region all threads read and write (<= SHARED_MAX), and
 * operations per thread; set by run_threads.
 */
static uint64_t shared_bytes;

static int thread_ops;

/* The threads stop every OPS_PER_ROUND operations; while they wait, the
 * main thread compares the whole cache view with the backend, so a
 * stale page is caught before later writes can hide it.
 */
#define OPS_PER_ROUND 10
static pthread_barrier_t round_barrier;

struct thr {
  int id;
  struct cache *c;
  struct rambackend *rb;
  uint8_t model[OWN_BYTES];
  int failures;
  char msg[256];
};

static void *
thread_main (void *arg)
{
  struct thr *t = arg;
  uint64_t s = 1000 + t->id;
  uint8_t *buf = malloc (3 * PS), *wbuf = malloc (3 * PS);
  const uint64_t own = (uint64_t) t->id * OWN_BYTES;

  for (int i = 0; i < thread_ops; ++i) {
    if (i > 0 && i % OPS_PER_ROUND == 0) {
      pthread_barrier_wait (&round_barrier);    /* round done */
      pthread_barrier_wait (&round_barrier);    /* check done */
    }
    if (t->failures)
      continue;
    int op = rnd64 (&s) % 4;
    bool shared = op >= 2;
    uint64_t base = shared ? SHARED_OFF : own;
    uint64_t span = shared ? shared_bytes : OWN_BYTES;
    struct extent x = rnd_extent (&s, span, 3 * PS);
    uint64_t off = x.off;
    uint32_t len = x.len;
    int err = 0;

    if (op % 2 == 0) {
      if (cache_read (t->c, &t->rb->be, buf, len, base + off, &err) != 0) {
        t->failures++;
        snprintf (t->msg, sizeof t->msg, "read failed err=%d", err);
      }
      else if (!shared && memcmp (buf, t->model + off, len) != 0) {
        uint32_t k = 0;
        while (buf[k] == t->model[off + k])
          k++;
        t->failures++;
        snprintf (t->msg, sizeof t->msg,
                  "thread %d op %d: read off=%llu len=%u wrong at %llu",
                  t->id, i, (unsigned long long) (base + off), len,
                  (unsigned long long) (base + off + k));
      }
    }
    else {
      fill_pattern (wbuf, len, t->id * 100000 + i);
      if (cache_write (t->c, &t->rb->be, wbuf, len, base + off,
                       rnd64 (&s) % 8 == 0, &err) != 0) {
        t->failures++;
        snprintf (t->msg, sizeof t->msg, "write failed err=%d", err);
      }
      else if (!shared)
        memcpy (t->model + off, wbuf, len);
    }
    if (rnd64 (&s) % 50 == 0)
      cache_invalidate (t->c, 1 + rnd64 (&s) % (2 * PS),
                        SHARED_OFF + rnd64 (&s) % (shared_bytes - PS));
  }
  pthread_barrier_wait (&round_barrier);
  pthread_barrier_wait (&round_barrier);
  free (buf);
  free (wbuf);
  return NULL;
}

/* Compare the cache view of the whole backend with the backend, without
 * cmocka asserts (threads are waiting on the barrier).  Returns false
 * and fills msg on the first difference.
 */
static bool
compare_all (struct cache *c, struct rambackend *rb, char *msg, size_t len)
{
  uint8_t *got = malloc (rb->size), *exp = malloc (rb->size);
  int err = 0;
  bool ok = true;

  if (cache_read (c, &rb->be, got, rb->size, 0, &err) != 0) {
    snprintf (msg, len, "cache_read of everything failed, err=%d", err);
    ok = false;
  }
  else {
    rambackend_peek (rb, exp, rb->size, 0);
    for (uint64_t i = 0; i < rb->size; ++i)
      if (got[i] != exp[i]) {
        snprintf (msg, len, "stale data at offset %llu (page %llu): "
                  "cache 0x%02x, backend 0x%02x",
                  (unsigned long long) i, (unsigned long long) (i / PS),
                  got[i], exp[i]);
        ok = false;
        break;
      }
  }
  free (got);
  free (exp);
  return ok;
}

static void
run_threads (uint64_t cache_bytes, enum layout_mode mode,
             uint64_t shared, int ops, unsigned delay_us)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (cache_bytes, PS);
  struct cache *c;
  struct thr *t = calloc (NTHREADS, sizeof *t);
  pthread_t th[NTHREADS];

  assert_non_null (t);
  cfg.mode = mode;
  cfg.reset = true;
  shared_bytes = shared;
  thread_ops = ops;
  c = fixture_open (&rb, &cfg, SHARED_OFF + SHARED_MAX, 24);
  /* Warm part of it so there are hits to race with. */
  read_check (c, &rb, 0, rb.size / 2);
  atomic_store (&rb.delay_max_us, delay_us);
  assert_int_equal (ops % OPS_PER_ROUND, 0);
  assert_int_equal (pthread_barrier_init (&round_barrier, NULL,
                                          NTHREADS + 1), 0);
  for (int i = 0; i < NTHREADS; ++i) {
    t[i].id = i;
    t[i].c = c;
    t[i].rb = &rb;
    rambackend_peek (&rb, t[i].model, OWN_BYTES, (uint64_t) i * OWN_BYTES);
    assert_int_equal (pthread_create (&th[i], NULL, thread_main, &t[i]), 0);
  }
  {
    char msg[256] = "";
    int bad_round = -1;
    for (int r = 0; r < ops / OPS_PER_ROUND; ++r) {
      pthread_barrier_wait (&round_barrier);
      if (bad_round == -1 && !compare_all (c, &rb, msg, sizeof msg))
        bad_round = r;
      pthread_barrier_wait (&round_barrier);
    }
    for (int i = 0; i < NTHREADS; ++i)
      assert_int_equal (pthread_join (th[i], NULL), 0);
    pthread_barrier_destroy (&round_barrier);
    if (bad_round >= 0)
      fail_msg ("after round %d of %d ops per thread: %s",
                bad_round, OPS_PER_ROUND, msg);
  }
  atomic_store (&rb.delay_max_us, 0);
  for (int i = 0; i < NTHREADS; ++i)
    if (t[i].failures)
      fail_msg ("%s", t[i].msg);

  /* Final contents: cache view == backend, own regions == models. */
  read_all_check (c, &rb, 5 * PS + 7);
  for (int i = 0; i < NTHREADS; ++i) {
    uint8_t got[OWN_BYTES];
    rambackend_peek (&rb, got, OWN_BYTES, (uint64_t) i * OWN_BYTES);
    assert_memory_equal (got, t[i].model, OWN_BYTES);
  }
  assert_int_equal (rb.out_of_range, 0);
  cache_close (c);

  /* And after a restart. */
  cfg.reset = false;
  open_read_all_check (&cfg, &rb, 3 * PS);
  rambackend_free (&rb);
  free (t);
}

static void
test_threads_small_cache (void **state)
{
  run_threads (8 * PS, LAYOUT_MODE_WRITETHROUGH, SHARED_MAX, 800, 0);
}

static void
test_threads_big_cache (void **state)
{
  run_threads (128 * PS, LAYOUT_MODE_WRITETHROUGH, SHARED_MAX, 800, 0);
}

static void
test_threads_writearound (void **state)
{
  run_threads (16 * PS, LAYOUT_MODE_WRITEAROUND, SHARED_MAX, 800, 0);
}

/* A slow backend (random delays after each call) and a small shared
 * region: requests on the same pages overlap in time, so a missing
 * range lock (a miss fill racing a write, two writes updating the
 * cache in the opposite order to the backend) leaves stale data.
 */
static void
test_threads_slow_backend (void **state)
{
  run_threads (128 * PS, LAYOUT_MODE_WRITETHROUGH, 3 * PS, 300, 300);
}

static void
test_threads_slow_backend_evicting (void **state)
{
  run_threads (6 * PS, LAYOUT_MODE_WRITETHROUGH, 3 * PS, 300, 300);
}

/* Read-only stress with big pages and a tiny cache: the backend never
 * changes, so every read by every thread can be checked.  Slot data I/O
 * is long (1 MiB pages), so evicting a slot that a hit is still reading
 * (a pin not honoured) or serving a slot being refilled shows up.
 */
#define RO_PAGE (1024 * 1024)
#define RO_PAGES 12

struct ro_thr {
  int id;
  struct cache *c;
  struct rambackend *rb;
  int ops;
  int failures;
  char msg[256];
};

static void *
ro_thread (void *arg)
{
  struct ro_thr *t = arg;
  uint64_t s = 77 + t->id;
  const uint32_t maxlen = RO_PAGE + RO_PAGE / 2;
  uint8_t *buf = malloc (maxlen), *exp = malloc (maxlen);

  for (int i = 0; i < t->ops && t->failures == 0; ++i) {
    uint64_t off, len;
    int err = 0;

    /* Mostly 3 hot pages (hits), sometimes anywhere (evictions). */
    if (rnd64 (&s) % 3)
      off = (rnd64 (&s) % 3) * RO_PAGE + rnd64 (&s) % RO_PAGE;
    else
      off = rnd64 (&s) % t->rb->size;
    len = 1 + rnd64 (&s) % maxlen;
    if (len > t->rb->size - off)
      len = t->rb->size - off;
    if (cache_read (t->c, &t->rb->be, buf, len, off, &err) != 0) {
      t->failures++;
      snprintf (t->msg, sizeof t->msg, "read failed, err=%d", err);
      break;
    }
    rambackend_peek (t->rb, exp, len, off);
    if (memcmp (buf, exp, len) != 0) {
      uint64_t k = 0;
      while (buf[k] == exp[k])
        k++;
      t->failures++;
      snprintf (t->msg, sizeof t->msg,
                "thread %d: read off=%llu len=%llu wrong at offset %llu "
                "(page %llu)", t->id, (unsigned long long) off,
                (unsigned long long) len, (unsigned long long) (off + k),
                (unsigned long long) ((off + k) / RO_PAGE));
    }
  }
  free (buf);
  free (exp);
  return NULL;
}

static void
test_threads_readonly_big_pages (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (3 * RO_PAGE, PS);
  struct cache *c;
  struct ro_thr t[NTHREADS];
  pthread_t th[NTHREADS];

  cfg.page_size = RO_PAGE;
  c = fixture_open (&rb, &cfg, RO_PAGES * RO_PAGE - 12345, 31);
  assert_int_equal (cache_nslots (c), 3);
  for (int i = 0; i < NTHREADS; ++i) {
    t[i] = (struct ro_thr) { .id = i, .c = c, .rb = &rb, .ops = 120 };
    assert_int_equal (pthread_create (&th[i], NULL, ro_thread, &t[i]), 0);
  }
  for (int i = 0; i < NTHREADS; ++i)
    assert_int_equal (pthread_join (th[i], NULL), 0);
  for (int i = 0; i < NTHREADS; ++i)
    if (t[i].failures)
      fail_msg ("%s", t[i].msg);
  assert_true (ST (c, evictions) > 0);
  assert_true (ST (c, read_hits) > 0);
  assert_int_equal (rb.out_of_range, 0);
  cache_close (c);

  /* Warm restart with big pages, short last page. */
  c = testfile_open_attach (&cfg, rb.size);
  read_check (c, &rb, 0, rb.size);
  fixture_close (c, &rb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    TESTFILE_TEST (test_new_file_reads_and_hits),
    TESTFILE_TEST (test_unaligned),
    TESTFILE_TEST (test_odd_size),
    TESTFILE_TEST (test_writethrough_updates_cache),
    TESTFILE_TEST (test_write_uncached_sectors),
    TESTFILE_TEST (test_write_uncached),
    TESTFILE_TEST (test_writearound),
    TESTFILE_TEST (test_eviction_small_cache),
    TESTFILE_TEST (test_invalidate),
    TESTFILE_TEST (test_prefetch),
    TESTFILE_TEST (test_backend_read_error),
    TESTFILE_TEST (test_backend_write_error),
    TESTFILE_TEST (test_threads_small_cache),
    TESTFILE_TEST (test_threads_big_cache),
    TESTFILE_TEST (test_threads_writearound),
    TESTFILE_TEST (test_threads_slow_backend),
    TESTFILE_TEST (test_threads_slow_backend_evicting),
    TESTFILE_TEST (test_threads_readonly_big_pages),
  };

  testfile_name = "test-cache";
  testfile_watchdog_seconds = 300;
  return cmocka_run_group_tests (tests, NULL, NULL);
}

