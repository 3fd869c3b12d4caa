/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: kill and reopen.  Every test here
 * runs the engine in a forked child that exits without closing the
 * cache (a crash: nothing more reaches the cache file), then opens the
 * file again in the parent and checks what recovery (cache-open.c)
 * serves, over a RAM backend and a real temporary cache file.
 *
 *  1. Writethrough: writes cached, queued by deferral (defer.h) or half
 *     done when the process dies; a slot taken by eviction; fills that
 *     the page-table entry does not record yet; unsealed clean pages.
 *  2. Writeback: flushed and unflushed dirty data, a restart in
 *     writethrough mode, two on-disk versions of one page, a page
 *     written back before the crash, unsealed slots.
 *  3. A crashed writeback cache damaged afterwards (superblocks, page
 *     table, data, truncation, a newer format): refused with a clear
 *     message, or served with the lost dirty data counted and logged.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "fixture.h"
#include "layout.h"
#include "log-stderr.h"
#include "pagetable.h"
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"
#include "writeback.h"

#define PS 4096u

/* Kept reachable on purpose: the child "crashes" with them open. */
static struct cache *crash_cache;
static struct rambackend crash_rb;
static struct tbe crash_tbe;

/* In a child: crash_rb over size bytes from seed, crash_tbe over it,
 * and crash_cache (cfg) attached; the child exits (1) if it cannot.
 */
static void
crash_start (const struct cache_config *cfg, uint64_t size, unsigned seed)
{
  rambackend_init (&crash_rb, size, seed);
  tbe_init (&crash_tbe, &crash_rb);
  crash_cache = cache_open (cfg);
  if (crash_cache == NULL || cache_attach (crash_cache, size) != 0)
    _exit (1);
}

/*----------------------------------------------------------------------
 * 1. Writethrough: a crash with writes cached, queued (defer.h) or
 * half done.
 */

/* The writes the crashing child does, applied to the parent's copy of
 * the backend too.  Six writes over 17 pages, or (small) twenty 1 KiB
 * writes to pages 40-49, which writethrough queues (defer.h): the child
 * dies with some of them still queued.
 */
static bool crash_small;

static void
wt_crash_writes (struct cache *c, struct rambackend *rb)
{
  uint8_t buf[3 * PS];

  for (int i = 0; i < (crash_small ? 20 : 6); ++i) {
    uint64_t off = (uint64_t) i * 7 * PS + i * 333;
    uint32_t len = i % 2 ? PS : 3 * PS - i * 100;

    if (crash_small) {
      off = (40 + i % 10) * (uint64_t) PS + 1024 * (i % 4);
      len = 1024;
    }
    fill_pattern (buf, len, 500 + i);
    if (c) {
      int err;
      if (cache_write (c, &rb->be, buf, len, off, false, &err) != 0)
        _exit (3);
    }
    else
      rambackend_poke (rb, buf, len, off);
  }
}

/* In a child: cache the whole 64-page backend, make wt_crash_writes (then a
 * client flush if flush), and die without closing the cache.
 */
static void
crash_reopen_child (const struct cache_config *cfg, bool flush)
{
  pid_t pid = fixture_fork ();

  if (pid == 0) {
    uint8_t *buf = malloc (64 * PS);
    int err;

    crash_start (cfg, 64 * PS, 11);
    if (cache_read (crash_cache, &crash_rb.be, buf, 64 * PS, 0, &err) != 0)
      _exit (4);
    wt_crash_writes (crash_cache, &crash_rb);
    if (crash_small && ST (crash_cache, writes_deferred) != 20)
      _exit (6);                /* the test would not test deferral */
    if (flush && cache_flush (crash_cache, &crash_rb.be, &err) != 0)
      _exit (5);
    free (buf);
    _exit (0);                  /* no cache_close: a crash */
  }
  fixture_wait (pid);
}

static void
test_crash_reopen (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;
  struct layout_sb sb;

  rambackend_init (&rb, 64 * PS, 11);
  crash_reopen_child (&cfg, false);
  wt_crash_writes (NULL, &rb);

  testfile_read_sb (&sb);
  assert_int_equal (sb.flags & LAYOUT_SB_CLEAN, 0);   /* not closed */

  c = testfile_open_attach (&cfg, rb.size);
  /* Warm, but for the pages the writes changed: those were rewritten
   * unsealed (before the backend write: a crash must undo them), so
   * recovery drops them and they are read again.  The six writes touch
   * 17 pages.
   */
  assert_int_equal (ST (c, loaded_slots), 64 - 17);
  assert_int_equal (ST (c, unsealed_dropped), 17);
  read_all_check (c, &rb, 64 * PS);
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (rb.bytes_read, 17 * PS);
  cache_close (c);

  /* All cached again, and sealed by the clean close. */
  rambackend_reset_counters (&rb);
  warm_check (&cfg, &rb, 64 * PS);
  rambackend_free (&rb);
}

/* The same writes, then a client flush, then the crash: the flush
 * sealed the rewritten pages, so all of the cache is warm.
 */
static void
test_crash_reopen_flushed (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);

  unlink (testfile_path);
  rambackend_init (&rb, 64 * PS, 11);
  crash_reopen_child (&cfg, true);
  wt_crash_writes (NULL, &rb);
  warm_check (&cfg, &rb, 64 * PS);
  rambackend_free (&rb);
}

/* Small writethrough writes, queued (defer.h) when the child dies: the
 * ten pages they touch were unsealed before the backend got them, so
 * recovery drops them, whether their queued writes reached the file or
 * not; the rest is warm.
 */
static void
test_crash_reopen_deferred (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);
  struct cache *c;

  unlink (testfile_path);
  crash_small = true;
  rambackend_init (&rb, 64 * PS, 11);
  crash_reopen_child (&cfg, false);
  wt_crash_writes (NULL, &rb);
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 64 - 10);
  assert_int_equal (ST (c, unsealed_dropped), 10);
  read_all_check (c, &rb, 64 * PS);
  assert_int_equal (rb.bytes_read, 10 * PS);
  cache_close (c);
  crash_small = false;
  rambackend_free (&rb);
}

/* The same, with a client flush before the crash: the flush waits for
 * the queued writes and seals the pages over them, so all is warm and
 * verifies.
 */
static void
test_crash_reopen_deferred_flushed (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (64 * PS, PS);

  unlink (testfile_path);
  crash_small = true;
  rambackend_init (&rb, 64 * PS, 11);
  crash_reopen_child (&cfg, true);
  wt_crash_writes (NULL, &rb);
  warm_check (&cfg, &rb, 64 * PS);
  crash_small = false;
  rambackend_free (&rb);
}

/* (Internal, cache-int.h: a slot for the caller, taken by eviction if
 * none is free; 0 is ALLOC_FILL.)
 */
extern uint32_t cache_alloc_slot (struct cache *c, int why);

/* A slot taken by eviction must not keep naming its old page on disk:
 * if the page is then written elsewhere (here: a writethrough write of
 * part of it, now uncached, goes to the backend only) and the process
 * dies before the slot's new contents are written, the old entry must
 * not bring back the page's old data.  The child stops right after
 * cache_alloc_slot, as a thread descheduled there would.
 */
static void
test_evicted_entry_gone (void **state)
{
  struct cache_config cfg = fixture_config (2 * PS, PS);
  struct rambackend rb;
  uint8_t buf[PS];
  pid_t pid;
  int err = 0;

  pid = fixture_fork ();
  if (pid == 0) {
    crash_start (&cfg, 4 * PS, 31);
    for (int p = 0; p < 2; p++)     /* pages 0 and 1 fill both slots */
      if (cache_read (crash_cache, &crash_rb.be, buf, PS, p * PS, &err) != 0)
        _exit (2);
    if (cache_alloc_slot (crash_cache, 0) == UINT32_MAX)
      _exit (3);
    /* One of pages 0 and 1 is no longer cached: its write goes to the
     * backend only; the other's updates its cached copy.
     */
    for (int p = 0; p < 2; p++) {
      fill_pattern (buf, 1024, 70 + p);
      if (cache_write (crash_cache, &crash_rb.be, buf, 1024, p * PS + 512,
                       false, &err) != 0)
        _exit (4);
    }
    if (cache_flush (crash_cache, &crash_rb.be, &err) != 0)
      _exit (5);
    _exit (0);                  /* no cache_close: a crash */
  }
  fixture_wait (pid);

  rambackend_init (&rb, 4 * PS, 31);
  for (int p = 0; p < 2; p++) {     /* what the child's backend got */
    fill_pattern (buf, 1024, 70 + p);
    rambackend_poke (&rb, buf, 1024, p * PS + 512);
  }
  open_read_all_check (&cfg, &rb, PS);
  rambackend_free (&rb);
}

/* Writethrough crash cases on a 4-page backend (seed) whose pages 0 and
 * 1 are cached: a write of pattern pat to [off, off+len), with nbdkit
 * dying right after the backend got it; or, with revert, that write
 * done, then one putting the old bytes back, with nbdkit dying just
 * before the backend gets it.  Either way the backend ends up with the
 * pattern, and after the restart every read must agree with it.
 */
static void
wt_crash_check (uint32_t off, uint32_t len, unsigned seed, unsigned pat,
                bool revert)
{
  struct cache_config cfg = fixture_config (4 * PS, PS);
  struct rambackend rb;
  uint8_t buf[2 * PS], orig[2 * PS];
  pid_t pid;
  int err = 0;

  unlink (testfile_path);
  pid = fixture_fork ();
  if (pid == 0) {
    crash_start (&cfg, 4 * PS, seed);
    if (cache_read (crash_cache, &crash_rb.be, orig, 2 * PS, 0, &err) != 0)
      _exit (2);
    fill_pattern (buf, len, pat);
    if (revert) {
      if (cache_write (crash_cache, &crash_rb.be, buf, len, off, false,
                       &err) != 0)
        _exit (3);
      crash_rb.exit_before_write = true;
      cache_write (crash_cache, &crash_rb.be, orig + off, len, off, false,
                   &err);
    }
    else {
      crash_rb.exit_after_write = true;
      cache_write (crash_cache, &crash_rb.be, buf, len, off, false, &err);
    }
    _exit (4);                  /* not reached: exits in the write */
  }
  fixture_wait (pid);

  rambackend_init (&rb, 4 * PS, seed);
  fill_pattern (buf, len, pat);
  rambackend_poke (&rb, buf, len, off);
  open_read_all_check (&cfg, &rb, 512);
  rambackend_free (&rb);
}

/* Writethrough: a crash right after a write reached the backend, before
 * nbdkit could answer it.  The cached copy of the page must not then
 * hold older data than the backend (it would be served after the
 * restart, and the backend's data would come back once the page is
 * evicted): the cache is written first, in a way a crash undoes.  Each
 * case: a write of part of a sector, of whole sectors, of a whole page,
 * into a cached (clean, verified) page.
 */
static void
test_wt_crash_after_backend_write (void **state)
{
  static const struct { uint32_t off, len; } cases[] = {
    { PS + 100, 100 }, { PS + 1024, 1024 }, { PS, PS },
    { PS - 512, 2048 },         /* two pages, both cached */
  };

  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    wt_crash_check (cases[k].off, cases[k].len, 41, 80 + k, false);
}

/* Writethrough: a write that puts back the bytes a cached page held
 * when it was last sealed (a flag set and cleared again), with a crash
 * after the cache got it and before the backend did.  The page's data
 * then matches its checksum on disk again, but the backend holds the
 * write before: the cache must not serve the page after the restart
 * (once evicted, the backend's data would come back).  Each case: part
 * of a sector, whole sectors, a whole page.
 */
static void
test_wt_crash_revert (void **state)
{
  static const struct { uint32_t off, len; } cases[] = {
    { PS + 100, 100 }, { PS + 1024, 1024 }, { PS, PS },
  };

  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    wt_crash_check (cases[k].off, cases[k].len, 43, 90 + k, true);
}

/* Backend sectors filled into a cached page are recorded in its entry
 * at once (RAM keeps no checksum for a later entry write to take): a
 * crash keeps them, and the page still verifies.
 */
static void
test_fill_entry_written (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint8_t buf[1024];
  pid_t pid;
  int err;

  rambackend_init (&rb, 16 * PS, 13);
  pid = fixture_fork ();
  if (pid == 0) {
    crash_start (&cfg, 16 * PS, 13);
    /* A new slot for page 3 (its entry is written), then more sectors
     * of it (its entry again).
     */
    if (cache_read (crash_cache, &crash_rb.be, buf, 512, 3 * PS, &err) != 0 ||
        cache_read (crash_cache, &crash_rb.be, buf, 1024, 3 * PS + 2048,
                    &err) != 0)
      _exit (2);
    if (ST (crash_cache, read_partial) != 1)
      _exit (3);
    _exit (0);                  /* no cache_close: a crash */
  }
  fixture_wait (pid);

  /* After the crash: the page is there, with both parts. */
  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 1);
  read_check (c, &rb, 3 * PS, 512);
  read_check (c, &rb, 3 * PS + 2048, 1024);
  assert_int_equal (rb.reads, 0);
  assert_int_equal (ST (c, verify_failures), 0);
  fixture_close (c, &rb);
}

/* Writethrough: a write of whole sectors into a cached clean page
 * unseals it (its entry says so, once; no read of the old sectors).
 * After a crash recovery drops the page and it is read again from the
 * backend (never served stale); a clean close seals it (warm).
 */
static void
test_wt_unsealed_clean (void **state)
{
  struct rambackend rb;
  struct cache_config cfg = fixture_config (16 * PS, PS);
  struct cache *c;
  uint8_t buf[PS];
  pid_t pid;
  int err;

  rambackend_init (&rb, 16 * PS, 14);
  pid = fixture_fork ();
  if (pid == 0) {
    crash_start (&cfg, 16 * PS, 14);
    if (cache_read (crash_cache, &crash_rb.be, buf, PS, 5 * PS, &err) != 0)
      _exit (2);
    fill_pattern (buf, 1024, 77);
    if (cache_write (crash_cache, &crash_rb.be, buf, 1024, 5 * PS + 1024,
                     false, &err) != 0 ||
        cache_write (crash_cache, &crash_rb.be, buf, 512, 5 * PS + 3072,
                     false, &err) != 0)
      _exit (3);
    /* Both writes went to the cache in place. */
    if (ST (crash_cache, pages_updated) != 2)
      _exit (4);
    _exit (0);                  /* no cache_close: a crash */
  }
  fixture_wait (pid);
  /* The backend got the writes (writethrough). */
  fill_pattern (buf, 1024, 77);
  rambackend_poke (&rb, buf, 1024, 5 * PS + 1024);
  rambackend_poke (&rb, buf, 512, 5 * PS + 3072);

  c = testfile_open_attach (&cfg, rb.size);
  assert_int_equal (ST (c, loaded_slots), 0);
  assert_int_equal (ST (c, unsealed_dropped), 1);
  read_check (c, &rb, 5 * PS, PS);             /* right data */
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (rb.reads, 1);              /* read again */
  /* Unsealed again, then closed cleanly: sealed, warm. */
  fill_pattern (buf, 512, 78);
  assert_int_equal (cache_write (c, &rb.be, buf, 512, 5 * PS, false, &err),
                    0);
  cache_close (c);
  c = testfile_open_attach (&cfg, rb.size);
  read_check (c, &rb, 5 * PS, PS);
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (rb.reads, 1);
  fixture_close (c, &rb);
}

/*----------------------------------------------------------------------
 * 2. Writeback: a crash with dirty data, flushed or not; two on-disk
 * versions of one page; unsealed slots (cache-seal.c).
 */

/* Writes of the crash scenario, applied to the model (and to the cache
 * if c).  Phase 0 is flushed (durable on the cache), phase 1 is not.
 */
static void
wb_crash_writes (struct cache *c, const struct cache_backend *be,
                 uint8_t *model, int phase)
{
  static const struct { uint64_t off; uint32_t len; } w[2][6] = {
    { { 0, PS }, { 3 * PS + 100, 2000 }, { 5 * PS, 3 * PS },
      { 12 * PS + 512, 1024 }, { 20 * PS + 4000, 200 }, { 30 * PS, PS } },
    { { 3 * PS + 50, 100 }, { 6 * PS, PS }, { 14 * PS + 7, 9 },
      { 12 * PS, PS }, { 25 * PS + 1000, 2 * PS }, { 0, 300 } },
  };
  uint8_t buf[3 * PS];

  for (int i = 0; i < 6; ++i) {
    fill_pattern (buf, w[phase][i].len, 300 + phase * 10 + i);
    if (c) {
      int err;
      if (cache_write (c, be, buf, w[phase][i].len, w[phase][i].off, false,
                       &err) != 0)
        _exit (10 + phase);
    }
    memcpy (model + w[phase][i].off, buf, w[phase][i].len);
  }
}

/* Pages touched by wb_crash_writes (both phases). */
static const uint64_t crash_pages[] = {
  0, 3, 5, 6, 7, 12, 14, 20, 21, 25, 26, 27, 30
};
#define CRASH_NPAGES (sizeof crash_pages / sizeof crash_pages[0])

/* A crash scenario: in a forked child, open the cache (cfg) over a RAM
 * backend of size bytes made from seed, run body, and exit without
 * closing anything (a crash).  body returns 0 or the child's exit
 * status, which must be 0.  Returns once the child has exited.
 */
static void
crash_in_child (const struct cache_config *cfg, uint64_t size, unsigned seed,
                int (*body) (struct cache *c, const struct cache_backend *be))
{
  pid_t pid = fixture_fork ();

  if (pid == 0) {
    alarm (60);                 /* a hung child must not hang us */
    crash_start (cfg, size, seed);
    _exit (body (crash_cache, &crash_tbe.be));
  }
  fixture_wait (pid);
}

static bool crash_second_phase;  /* crash_body: also the unflushed writes */

static int
crash_body (struct cache *c, const struct cache_backend *be)
{
  uint8_t *m = malloc (crash_rb.size);
  int err;

  int r = 0;

  if (m == NULL)
    return 2;
  wb_crash_writes (c, be, m, 0);
  if (cache_flush (c, be, &err) != 0)
    r = 3;
  else {
    if (crash_second_phase)
      wb_crash_writes (c, be, m, 1);
    if (atomic_load (&crash_rb.writes) != 0)
      r = 4;                    /* writeback mode wrote the backend */
  }
  free (m);
  return r;
}

/* Run the crash scenario in a child; returns after it exited. */
static void
crash_child (const struct cache_config *cfg, uint64_t size, unsigned seed,
             bool second_phase)
{
  crash_second_phase = second_phase;
  crash_in_child (cfg, size, seed, crash_body);
}

/* The crash scenario with both phases, in a child over a backend like
 * env's (seed); env's model then has the writes of both.
 */
static void
crash_child_both (struct tenv *env, const struct cache_config *cfg,
                  unsigned seed)
{
  crash_child (cfg, env->rb.size, seed, true);
  wb_crash_writes (NULL, NULL, env->model, 0);
  wb_crash_writes (NULL, NULL, env->model, 1);
}

static void
test_wb_crash_recovery (void **state)
{
  const uint64_t size = 40 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache *c;
  struct layout_sb sb;
  uint8_t *orig, *synced;
  int err = 0;

  tenv_init (&env, size, 8);
  orig = model_new (&env.rb);
  synced = model_new (&env.rb);

  /* Flushed writes only, then the crash. */
  crash_child (&cfg, size, 8, false);
  wb_crash_writes (NULL, NULL, synced, 0);
  testfile_read_sb (&sb);
  assert_false (sb.flags & LAYOUT_SB_CLEAN);
  assert_true (sb.flags & LAYOUT_SB_DIRTY);
  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_dirty_pages (c), 9);      /* phase 0 pages */
  mread_all_check (c, env.be, synced, size, 3 * PS + 1);
  assert_int_equal (env.rb.writes, 0);
  backend_check (&env.rb, orig, PS);                    /* never got it */
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (ST (c, dirty_lost), 0);
  cache_close (c);

  /* Clean close kept it dirty; a new crash on top with unflushed
   * writes too (a process crash keeps what reached the cache file).
   */
  testfile_read_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_CLEAN);
  assert_true (sb.flags & LAYOUT_SB_DIRTY);
  crash_child_both (&env, &cfg, 8);
  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_dirty_pages (c), CRASH_NPAGES);
  tenv_read_all_check (&env, c, 5 * PS - 3);
  assert_int_equal (env.rb.writes, 0);
  assert_int_equal (ST (c, dirty_lost), 0);

  /* Written back: the backend alone is complete. */
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  assert_true (env.t.flushes >= 1);
  cache_close (c);
  testfile_read_sb (&sb);
  assert_false (sb.flags & LAYOUT_SB_DIRTY);
  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_dirty_pages (c), 0);
  tenv_read_all_check (&env, c, 4 * PS);
  tenv_close (&env, c);
  free (orig);
  free (synced);
}

/* After a restart RAM has no checksum for a clean cached page: a
 * partial write patches the one its entry holds (cache_entry_crc).
 * After a crash the page must verify, with the write in it.
 */
static int
patch_restart_body (struct cache *c, const struct cache_backend *be)
{
  uint8_t buf[300];
  int err;

  fill_pattern (buf, sizeof buf, 77);
  if (cache_write (c, be, buf, sizeof buf, 2 * PS + 1000, false, &err) != 0 ||
      cache_write (c, be, buf, 100, 9 * PS + 5, false, &err) != 0)
    return 2;
  if (ST (c, pages_updated) != 2)
    return 3;                   /* not patched in place: not the test */
  if (cache_flush (c, be, &err) != 0)
    return 4;
  return 0;
}

static void
test_wb_patch_after_restart (void **state)
{
  const uint64_t size = 16 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  uint8_t buf[300];

  tenv_init_cached (&env, &cfg, size, 21);
  crash_in_child (&cfg, size, 21, patch_restart_body);
  fill_pattern (buf, sizeof buf, 77);
  memcpy (env.model + 2 * PS + 1000, buf, 300);
  memcpy (env.model + 9 * PS + 5, buf, 100);

  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_dirty_pages (c), 2);
  tenv_read_all_check (&env, c, PS);
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (ST (c, dirty_lost), 0);
  tenv_close (&env, c);
}

/* Crash in writeback mode, restart in writethrough mode: the dirty
 * data is there after attach, served, and can be written back before
 * serving writes.
 */
static void
test_wb_crash_reopen_writethrough (void **state)
{
  const uint64_t size = 40 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache_config wt = cfg;
  struct cache *c;
  struct layout_sb sb;
  uint8_t *orig;
  int err = 0;

  tenv_init (&env, size, 9);
  orig = model_new (&env.rb);
  crash_child_both (&env, &cfg, 9);

  wt.mode = LAYOUT_MODE_WRITETHROUGH;
  c = testfile_open_attach (&wt, size);
  assert_int_equal (cache_mode (c), LAYOUT_MODE_WRITETHROUGH);
  assert_int_equal (cache_dirty_pages (c), CRASH_NPAGES);
  testfile_read_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_DIRTY);   /* until written back */
  backend_check (&env.rb, orig, PS);

  /* Written back before serving. */
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  tenv_read_all_check (&env, c, 3 * PS);

  /* Now a writethrough cache: writes reach the backend at once. */
  rambackend_reset_counters (&env.rb);
  tenv_write (&env, c, 3 * PS + 10, 5000, 77);
  assert_int_equal (env.rb.writes, 1);
  backend_check (&env.rb, env.model, PS);
  assert_int_equal (cache_dirty_pages (c), 0);
  cache_close (c);
  testfile_read_sb (&sb);
  assert_false (sb.flags & LAYOUT_SB_DIRTY);
  assert_int_equal (sb.mode, LAYOUT_MODE_WRITETHROUGH);
  c = testfile_open_attach (&wt, size);
  tenv_read_all_check (&env, c, 7 * PS);
  tenv_close (&env, c);
  free (orig);
}

/* Dirty data left by writeback mode is served right in writethrough
 * mode even before it is written back, and writethrough writes to such
 * pages do not lose it.
 */
static void
test_wb_crash_writethrough_serves_dirty (void **state)
{
  const uint64_t size = 40 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache_config wt = cfg;
  struct cache *c;

  tenv_init (&env, size, 10);
  crash_child_both (&env, &cfg, 10);

  wt.mode = LAYOUT_MODE_WRITETHROUGH;
  c = testfile_open_attach (&wt, size);
  tenv_read_all_check (&env, c, 3 * PS + 100);
  /* A writethrough write into part of a dirty page. */
  tenv_write (&env, c, 3 * PS + 10, 30, 88);
  tenv_write (&env, c, 12 * PS + 4000, 200, 89);
  tenv_read_all_check (&env, c, 3 * PS + 100);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* Child: page 9 v1 (whole), sync, v2 (partial, copied), crash. */
static int
two_versions_body (struct cache *c, const struct cache_backend *be)
{
  uint8_t buf[PS];
  int err;

  fill_pattern (buf, PS, 901);
  if (cache_write (c, be, buf, PS, 9 * PS, false, &err) != 0)
    return 3;
  if (cache_sync (c, &err) != 0)
    return 4;
  fill_pattern (buf, 700, 902);
  if (cache_write (c, be, buf, 700, 9 * PS + 1500, false, &err) != 0)
    return 5;
  return 0;
}

/* Page 9 in two versions on disk, after two_versions_body crashed in a
 * child over a backend of 16 pages from seed: env's model has the newer
 * one (v2), v1 the older; old and new are their slots, seqs their
 * sequence numbers.
 */
struct two_versions {
  struct tenv env;
  uint8_t *v1;
  uint32_t old, new;
  uint64_t seqs[4];
};

static void
two_versions_crash (struct two_versions *tv, const struct cache_config *cfg,
                    unsigned seed)
{
  uint32_t slots[4];

  tenv_init (&tv->env, 16 * PS, seed);
  tv->v1 = model_new (&tv->env.rb);
  fill_pattern (tv->v1 + 9 * PS, PS, 901);
  fill_pattern (tv->env.model + 9 * PS, PS, 901);
  fill_pattern (tv->env.model + 9 * PS + 1500, 700, 902);
  crash_in_child (cfg, 16 * PS, seed, two_versions_body);
  assert_int_equal (file_slots_for (9, slots, tv->seqs, NULL, 4), 2);
  tv->old = slots[0];
  tv->new = slots[1];
}

static void
two_versions_free (struct two_versions *tv)
{
  tenv_free (&tv->env);
  free (tv->v1);
}

/* The entry of slot on disk is free. */
static void
assert_slot_free (uint32_t slot)
{
  struct layout_entry e;

  assert_int_equal (file_entry (slot, &e, NULL), 0);
  assert_int_equal (e.state, LAYOUT_FREE);
}

/* After a clean close: slot gone no longer holds page 9 (it may hold
 * another page since), and kept is the page's only slot.
 */
static void
two_versions_left (uint32_t gone, uint32_t kept)
{
  struct layout_entry e;
  uint32_t slots[4];
  uint64_t seqs[4];

  assert_int_equal (file_entry (gone, &e, NULL), 0);
  assert_true (e.state == LAYOUT_FREE || e.page != 9);
  assert_int_equal (file_slots_for (9, slots, seqs, NULL, 4), 1);
  assert_int_equal (slots[0], kept);
}

static void
test_wb_two_versions (void **state)
{
  struct two_versions tv;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;

  /* Both versions are on disk, the newer one with the higher seq. */
  two_versions_crash (&tv, &cfg, 11);
  assert_true (tv.seqs[1] > tv.seqs[0]);

  c = testfile_open_attach (&cfg, tv.env.rb.size);
  /* The older one is freed by recovery, on disk. */
  assert_slot_free (tv.old);
  assert_true (ST (c, dropped_entries) >= 1);
  assert_int_equal (cache_dirty_pages (c), 1);
  tenv_read_all_check (&tv.env, c, 3 * PS);
  cache_close (c);
  two_versions_left (tv.old, tv.new);

  /* And it stays that way across another restart. */
  c = testfile_open_attach (&cfg, tv.env.rb.size);
  tenv_read_all_check (&tv.env, c, 5 * PS);
  tenv_writeback_check (&tv.env, c);
  cache_close (c);
  two_versions_free (&tv);
}

/* Versions are told apart by all 64 bits of their numbers: the two
 * versions' numbers here differ only above bit 31, and the one with
 * the lower half lower wins, whichever of the two it is (whichever of
 * the two slots recovery meets first).
 */
static void
test_wb_two_versions_far_seqs (void **state)
{
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);

  for (int older_wins = 0; older_wins < 2; older_wins++) {
    struct two_versions tv;
    struct layout_entry e;
    struct cache *c;

    two_versions_crash (&tv, &cfg, 12 + older_wins);
    assert_int_equal (file_entry (tv.old, &e, NULL), 0);
    e.seq = older_wins ? (UINT64_C (1) << 32) + 3 : 7;
    file_set_entry (tv.old, &e);
    assert_int_equal (file_entry (tv.new, &e, NULL), 0);
    e.seq = older_wins ? 7 : (UINT64_C (1) << 32) + 3;
    file_set_entry (tv.new, &e);
    if (older_wins)
      memcpy (tv.env.model, tv.v1, tv.env.rb.size);

    c = testfile_open_attach (&cfg, tv.env.rb.size);
    assert_slot_free (older_wins ? tv.new : tv.old);
    tenv_read_all_check (&tv.env, c, 3 * PS);
    cache_close (c);
    two_versions_free (&tv);
  }
}

/* The newer copy was torn by the crash (its data does not verify): it
 * was never flushed, so the older, durable version wins.
 */
static void
test_wb_two_versions_torn_newer (void **state)
{
  struct two_versions tv;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  struct layout_sb sb;
  int err = 0;

  two_versions_crash (&tv, &cfg, 12);
  testfile_read_sb (&sb);
  testfile_xor (sb.pool_offset + (uint64_t) tv.new * PS + 1600, 1, 0x10);

  c = testfile_open_attach (&cfg, tv.env.rb.size);
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_int_equal (cache_dirty_pages (c), 1);
  assert_slot_free (tv.new);
  mread_all_check (c, tv.env.be, tv.v1, tv.env.rb.size, 3 * PS);
  cache_close (c);
  two_versions_left (tv.new, tv.old);
  c = testfile_open_attach (&cfg, tv.env.rb.size);
  assert_int_equal (cache_writeback_all (c, tv.env.be, &err), 0);
  backend_check (&tv.env.rb, tv.v1, PS);
  cache_close (c);
  two_versions_free (&tv);
}

/* A page with two versions on disk (a flushed one, and a copy made by
 * a later write) whose newer version is then written back: the backend
 * now has data newer than the older version.  Writes after that must
 * not put the newer version at risk (rewrite it in place, then unseal
 * it) while the older one is still on disk: a crash would drop the
 * newer one and recovery would serve the older one's dirty data, older
 * than the backend's.
 */
static int
written_back_succ_body (struct cache *c, const struct cache_backend *be)
{
  uint8_t buf[PS];
  int err;

  fill_pattern (buf, PS, 911);
  if (cache_write (c, be, buf, PS, 9 * PS, false, &err) != 0)
    return 3;
  if (cache_sync (c, &err) != 0)          /* version 1 flushed */
    return 4;
  fill_pattern (buf, 700, 912);           /* version 2: a copy */
  if (cache_write (c, be, buf, 700, 9 * PS + 1500, false, &err) != 0)
    return 5;
  if (cache_writeback_all (c, be, &err) != 0)
    return 6;                             /* the backend has version 2 */
  for (unsigned k = 0; k < 2; k++) {      /* unflushed rewrites */
    fill_pattern (buf, 200, 913 + k);
    if (cache_write (c, be, buf, 200, 9 * PS + 100, false, &err) != 0)
      return 7;
  }
  return 0;                               /* crash */
}

static void
test_wb_written_back_successor (void **state)
{
  const uint64_t size = 16 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  uint8_t v2[PS], got[PS], w[700];
  int err = 0;

  crash_in_child (&cfg, size, 13, written_back_succ_body);

  tenv_init (&env, size, 13);
  fill_pattern (v2, PS, 911);
  fill_pattern (w, 700, 912);
  memcpy (v2 + 1500, w, 700);
  rambackend_poke (&env.rb, v2, PS, 9 * PS);  /* what the child wrote back */

  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_read (c, env.be, got, PS, 9 * PS, &err), 0);
  /* Version 2, but for [100, 300): version 2 or one of the unflushed
   * rewrites.  Never version 1 (1500-2199 tell).
   */
  assert_memory_equal (got, v2, 100);
  assert_memory_equal (got + 300, v2 + 300, PS - 300);
  if (memcmp (got + 100, v2 + 100, 200) != 0) {
    bool ok = false;
    for (unsigned k = 0; k < 2; k++) {
      fill_pattern (w, 200, 913 + k);
      ok |= memcmp (got + 100, w, 200) == 0;
    }
    assert_true (ok);
  }
  tenv_close (&env, c);
}

static uint8_t *unseal_child_model;

/* The parent's buffers, kept reachable for valgrind in the children
 * (which exit without freeing anything, like a crash).
 */
static void *volatile child_keep[4];

static void
crash_keep (struct tenv *env)
{
  child_keep[0] = env->model;
  child_keep[1] = env->rb.data;
}

/* Child: page 2 flushed (v1), then rewritten twice (copy, then
 * unsealed); page 5 unsealed; crash.
 */
static int
unseal_crash_body (struct cache *c, const struct cache_backend *be)
{
  int err;

  mwrite (c, be, NULL, 2 * PS, PS, 21);
  if (cache_flush (c, be, &err) != 0)
    return 2;
  mwrite (c, be, NULL, 2 * PS, PS, 22);
  mwrite (c, be, NULL, 2 * PS + 512, 1024, 23);
  mwrite (c, be, NULL, 2 * PS + 2048, 512, 24);
  unseal_q (c, be, unseal_child_model);
  if (ST (c, cow_copies) != 1)
    return 3;
  return 0;
}

/* unseal_crash_body crashed in a child over a backend of 16 pages like
 * env's (seed 9); free with unseal_crash_free.
 */
static void
unseal_crash (struct tenv *env, const struct cache_config *cfg)
{
  tenv_init (env, 16 * PS, 9);
  unseal_child_model = malloc (env->rb.size);
  assert_non_null (unseal_child_model);
  crash_keep (env);
  crash_in_child (cfg, env->rb.size, 9, unseal_crash_body);
}

static void
unseal_crash_free (struct tenv *env)
{
  tenv_free (env);
  free (unseal_child_model);
}

static void
test_wb_unsealed_crash (void **state)
{
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  struct layout_entry e;
  uint32_t slots[4];
  uint64_t seqs[4];

  unseal_crash (&env, &cfg);

  /* On disk: page 2 has its flushed version and an unsealed newer one;
   * page 5 only an unsealed one.
   */
  assert_int_equal (file_slots_for (2, slots, seqs, NULL, 4), 2);
  assert_int_equal (file_entry (slots[0], &e, NULL), 0);
  assert_int_equal (e.flags, 0);
  assert_int_equal (file_entry (slots[1], &e, NULL), 0);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);
  newest_entry (5, &e, NULL);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);

  /* After the crash: page 2 as flushed, page 5 as the backend has it;
   * nothing reported as damaged.
   */
  fill_pattern (env.model + 2 * PS, PS, 21);
  c = testfile_open_attach (&cfg, env.rb.size);
  tenv_read_all_check (&env, c, PS);
  assert_int_equal (ST (c, unsealed_dropped), 2);
  assert_int_equal (ST (c, dirty_dropped), 0);
  assert_int_equal (ST (c, dirty_lost), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (cache_dirty_pages (c), 1);
  cache_close (c);
  unseal_crash_free (&env);
}

/* A gate in this process's writes: armed, the next write of one page-
 * table entry (LAYOUT_ENTRY_SIZE bytes: the engine's own pwrite calls
 * resolve to this one) waits until the gate opens.
 */
static atomic_int gate_armed, gate_held, gate_open;

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t off)
{
  if (count == LAYOUT_ENTRY_SIZE && atomic_exchange (&gate_armed, 0)) {
    atomic_store (&gate_held, 1);
    while (!atomic_load (&gate_open))
      usleep (1000);
  }
  return syscall (SYS_pwrite64, fd, buf, count, off);
}

struct gate_op {
  struct cache *c;
  const struct cache_backend *be;
  int r;
};

static void *
gate_rewrite (void *arg)
{
  struct gate_op *op = arg;

  mwrite (op->c, op->be, NULL, 3 * PS + 512, 1024, 42);
  return NULL;
}

static void *
gate_flush (void *arg)
{
  struct gate_op *op = arg;
  int err;

  op->r = cache_flush (op->c, op->be, &err);
  return NULL;
}

/* Child: page 3 written whole (W1, sealed), then a rewrite of part of
 * it (W2) that unseals the slot in place is held in its entry write
 * while a client flush begins; the flush (which covers W1) waits for
 * it, and ends; crash.
 */
static int
flush_race_body (struct cache *c, const struct cache_backend *be)
{
  struct gate_op rw = { .c = c, .be = be }, fl = { .c = c, .be = be };
  pthread_t a, b;

  mwrite (c, be, NULL, 3 * PS, PS, 41);
  atomic_store (&gate_armed, 1);
  if (pthread_create (&a, NULL, gate_rewrite, &rw) != 0)
    return 2;
  for (int i = 0; !atomic_load (&gate_held); i++) {
    if (i == 5000)
      return 3;                 /* the rewrite never wrote an entry */
    usleep (1000);
  }
  if (pthread_create (&b, NULL, gate_flush, &fl) != 0)
    return 4;
  usleep (300 * 1000);          /* the flush waits for the rewrite */
  atomic_store (&gate_open, 1);
  pthread_join (a, NULL);
  pthread_join (b, NULL);
  return fl.r == 0 ? 0 : 5;
}

/* A flush that begins while a rewrite in place that unseals a slot is
 * under way covers the slot's older data (W1): it must seal the slot
 * (and so W2 with it), never leave it unsealed for a crash to drop
 * with W1 in it (the flushed write would be lost: the page would read
 * as the backend had it).
 */
static void
test_wb_flush_during_unseal (void **state)
{
  const uint64_t size = 8 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;

  cfg.direct = false;           /* the gate counts on one entry write */
  tenv_init (&env, size, 12);
  crash_keep (&env);
  crash_in_child (&cfg, size, 12, flush_race_body);

  fill_pattern (env.model + 3 * PS, PS, 41);
  fill_pattern (env.model + 3 * PS + 512, 1024, 42);
  c = testfile_open_attach (&cfg, size);
  assert_int_equal (ST (c, unsealed_dropped), 0);
  tenv_read_all_check (&env, c, PS);
  tenv_close (&env, c);
}

/* (Internal, cache-int.h.) */
extern void cache_inplace_enter (struct cache *c);
extern void cache_inplace_leave (struct cache *c);

/* A client sync takes c->inplace exclusively: asked for by a thread
 * that holds it shared (a rewrite in place that drops its slot, which
 * settles it), it would wait for itself forever (issue 27, item 1).
 * It must fail at once instead, and work again once the hold ends.
 */
static void
test_sync_under_inplace (void **state)
{
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct rambackend rb;
  struct cache *c;
  int err = 0;

  c = fixture_open (&rb, &cfg, 8 * PS, 13);
  cache_inplace_enter (c);
  assert_int_equal (cache_sync (c, &err), -1);
  assert_int_equal (err, EDEADLK);
  cache_inplace_leave (c);
  assert_int_equal (cache_sync (c, &err), 0);
  fixture_close (c, &rb);
}

/* A backend that dies (the whole process: a crash) right after one
 * write at die_at has reached it.
 */
static struct cache_backend die_inner;
static _Atomic int64_t die_at = -1;

static int
die_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
            bool fua, int *err)
{
  int r = die_inner.pwrite (h, buf, count, offset, fua, err);

  if (r == 0 && (int64_t) offset == atomic_load (&die_at))
    _exit (0);
  return r;
}

/* Child: page 3 flushed (v1, slot S1), copied (v2, S2: S1 stays on
 * disk) and written back: S2 is clean and must be copied to change.
 * Pages 5 and 6 dirty take the other slots, so a whole-page write of
 * page 3 (v3) finds no slot for its copy and goes to the backend; the
 * process dies as soon as the backend has it.
 */
static int
around_crash_body (struct cache *c, const struct cache_backend *be)
{
  struct cache_backend dying = *be;
  int err;

  die_inner = *be;
  dying.pwrite = die_pwrite;
  mwrite (c, be, NULL, 3 * PS, PS, 51);
  if (cache_flush (c, be, &err) != 0)
    return 2;
  mwrite (c, be, NULL, 3 * PS, PS, 52);
  if (cache_writeback_all (c, be, &err) != 0)
    return 3;
  mwrite (c, be, NULL, 5 * PS, PS, 53);
  mwrite (c, be, NULL, 6 * PS, PS, 54);
  if (ST (c, cow_copies) != 1 || cache_dirty_pages (c) != 2)
    return 4;
  atomic_store (&die_at, 3 * PS);
  mwrite (c, &dying, NULL, 3 * PS, PS, 55);
  return 5;                     /* not reached: the write went around */
}

/* The page's cached copy (S2, clean) is older than the backend once
 * the write reached it: it must be gone from the cache file before,
 * or recovery would serve v2 where the backend has v3.
 */
static void
test_wb_crash_after_write_around (void **state)
{
  const uint64_t size = 8 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (4 * PS, PS);
  struct cache *c;

  tenv_init (&env, size, 13);
  crash_keep (&env);
  crash_in_child (&cfg, size, 13, around_crash_body);

  /* The backend as the child left it: v3 at page 3. */
  fill_pattern (env.model + 3 * PS, PS, 55);
  rambackend_poke (&env.rb, env.model + 3 * PS, PS, 3 * PS);
  fill_pattern (env.model + 5 * PS, PS, 53);
  fill_pattern (env.model + 6 * PS, PS, 54);
  c = testfile_open_attach (&cfg, size);
  /* Page 3 first: reading the others would evict a stale copy. */
  tenv_read_check (&env, c, 3 * PS, PS);
  tenv_read_all_check (&env, c, PS);
  assert_int_equal (cache_dirty_pages (c), 2);
  tenv_close (&env, c);
}

/* The same crash, but the flushed version that recovery falls back to
 * (page 2's sealed slot) has damaged data: its dirty data is lost, and
 * said so (DIRTY DATA LOST, dirty_dropped), not taken for a failing
 * device (cache_errors, degraded); page 2 reads as the backend has it.
 */
static void
test_wb_unsealed_crash_older_damaged (void **state)
{
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  struct layout_sb sb;
  uint32_t slots[4];
  uint64_t seqs[4];
  int errs;

  unseal_crash (&env, &cfg);
  assert_int_equal (file_slots_for (2, slots, seqs, NULL, 4), 2);
  testfile_read_sb (&sb);
  testfile_xor (sb.pool_offset + (uint64_t) slots[0] * PS + 100, 1, 0x01);

  errs = log_error_count;
  c = testfile_open_attach (&cfg, env.rb.size);
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_int_equal (ST (c, cache_errors), 0);
  assert_int_equal (ST (c, degraded), 0);
  assert_true (log_error_count > errs);
  assert_non_null (strstr (log_error_last, "DIRTY DATA LOST"));
  tenv_read_all_check (&env, c, PS);   /* page 2: the backend's */
  assert_int_equal (cache_dirty_pages (c), 0);
  cache_close (c);
  unseal_crash_free (&env);
}

/* Child: page 3 flushed with 2 dirty sectors (S1, the rest clean), then
 * copied (S2), written back (the backend gets S2's sectors), rewritten
 * twice; crash.  While S1 is on disk, the rewrites may not touch S2
 * (cache_must_cow): they go to a third slot (S3), so there are two
 * copies.  (Before, S2 was rewritten in place and unsealed, and the
 * crash dropped it: recovery then fell back to S1.)
 */
static int backend_newer_fd;    /* the child sends its backend page here */

static int
backend_newer_body (struct cache *c, const struct cache_backend *be)
{
  uint8_t buf[PS];
  int err;

  if (cache_read (c, be, buf, PS, 3 * PS, &err) != 0)
    return 2;
  mwrite (c, be, NULL, 3 * PS, 1024, 31);
  if (cache_flush (c, be, &err) != 0)
    return 3;
  mwrite (c, be, NULL, 3 * PS + 2048, 512, 32);
  if (cache_writeback_all (c, be, &err) != 0)
    return 4;
  mwrite (c, be, NULL, 3 * PS + 3072, 512, 33);
  mwrite (c, be, NULL, 3 * PS + 3584, 512, 34);
  if (ST (c, cow_copies) != 2)
    return 5;
  /* What the backend got is what the parent's backend must get. */
  rambackend_peek (&crash_rb, buf, PS, 3 * PS);
  if (write (backend_newer_fd, buf, PS) != PS)
    return 6;
  return 0;
}

/* S3 is unsealed and dropped; the older versions must not be served
 * instead where the backend is newer (S2 was written back; S2 is clean
 * and goes, and S1 with it): the export and, after writeback, the
 * backend agree.
 */
static void
test_wb_unsealed_crash_backend_newer (void **state)
{
  const uint64_t size = 8 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (4 * PS, PS);
  struct cache *c;
  uint8_t *got, child_backend[PS];
  int pipefd[2], err = 0;

  tenv_init (&env, size, 11);
  assert_int_equal (pipe (pipefd), 0);
  backend_newer_fd = pipefd[1];
  crash_keep (&env);
  crash_in_child (&cfg, size, 11, backend_newer_body);
  assert_int_equal (read (pipefd[0], child_backend, PS), PS);
  close (pipefd[0]);
  close (pipefd[1]);
  /* The parent's RAM backend stands for the backing store after the
   * crash: it has what the child wrote back.
   */
  rambackend_poke (&env.rb, child_backend, PS, 3 * PS);
  rambackend_peek (&env.rb, env.model, size, 0);
  fill_pattern (env.model + 3 * PS, 1024, 31);     /* the flushed sectors */

  c = testfile_open_attach (&cfg, size);
  assert_int_equal (ST (c, unsealed_dropped), 1);
  got = malloc (size);
  assert_non_null (got);
  assert_int_equal (cache_read (c, env.be, got, size, 0, &err), 0);
  compare (got, env.model, 0, size, PS, "export after the crash");
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
  free (got);
}

/*----------------------------------------------------------------------
 * 3. Recovery of a cache file that was left by a crash in writeback
 * mode (clean and dirty pages, superblock not marked clean) and then
 * damaged.
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

#define NPAGES 64u
#define SIZE ((uint64_t) NPAGES * PS)
#define PT 8192u
#define POOL (1024u * 1024)
#define DIRTY_LO 10u            /* pages 10..15 are dirty */
#define DIRTY_HI 15u
#define CLEAN_HI 47u            /* pages 0..47 are cached */
#define SEED 77u

static void
dirty_pattern (uint8_t *buf, uint64_t page)
{
  for (uint32_t i = 0; i < PS; i++)
    buf[i] = (uint8_t) (page * 31 + i * 7 + 1);
}

/* Build the crashed cache described at the top. */
static void
make_crashed_cache (void)
{
  struct cache_config cfg = fixture_writeback_config (SIZE, PS);
  struct rambackend rb;
  struct cache *c;
  uint8_t *buf = malloc (SIZE);
  pid_t pid;
  int err;

  assert_non_null (buf);
  rambackend_init (&rb, SIZE, SEED);
  c = cache_open (&cfg);
  assert_non_null (c);
  assert_int_equal (cache_attach (c, SIZE), 0);
  assert_int_equal (cache_read (c, &rb.be, buf, (CLEAN_HI + 1) * PS, 0, &err),
                    0);
  cache_close (c);
  rambackend_free (&rb);

  pid = fixture_fork ();
  if (pid == 0) {
    alarm (60);
    crash_start (&cfg, SIZE, SEED);
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
  fixture_wait (pid);
  free (buf);
}

/* Slot of each page, from the page table on disk (-1: none). */
static int
slot_of (uint64_t page)
{
  uint8_t raw[NPAGES * LAYOUT_ENTRY_SIZE];
  int r = -1;

  assert_int_equal (testfile_read (PT, raw, sizeof raw), sizeof raw);
  for (unsigned s = 0; s < NPAGES; s++) {
    struct layout_entry e;
    if (layout_entry_decode (raw + s * LAYOUT_ENTRY_SIZE, PS / 512, &e) == 0 &&
        e.state != LAYOUT_FREE && e.page == page)
      r = s;
  }
  return r;
}

/* XOR one byte of page's slot, at off, with x. */
static void
flip_slot_byte (uint64_t page, uint32_t off, uint8_t x)
{
  int s = slot_of (page);

  assert_true (s >= 0);
  testfile_xor (POOL + (uint64_t) s * PS + off, 1, x);
}

static void
zero_range (uint64_t off, size_t len)
{
  uint8_t *z = calloc (1, len);

  assert_non_null (z);
  testfile_write (off, z, len);
  free (z);
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

/* The errors logged before forgotten, try_open must succeed. */
static struct cache *
rec_open (void)
{
  struct cache *c;

  log_errors_forget ();
  c = try_open ();
  assert_non_null (c);
  return c;
}

/* The errors logged before forgotten, try_open must refuse. */
static void
rec_refused (void)
{
  log_errors_forget ();
  assert_null (try_open ());
}

static off_t
file_size (void)
{
  struct stat st;

  assert_int_equal (stat (testfile_path, &st), 0);
  return st.st_size;
}

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

  make_crashed_cache ();
  flip_slot_byte (12, 100, 0x10);
  /* nslots, in the newest superblock copy */
  testfile_xor (testfile_newest_sb () * LAYOUT_SB_SIZE + 40, 1, 0x01);
  c = rec_open ();
  assert_true (log_errors_contain ("superblock copy"));
  check_data (c, BIT (12));
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_true (log_errors_contain ("DIRTY DATA LOST"));
  cache_close (c);
}

/* Both superblocks zeroed (whole sectors): never formatted over. */
static void
test_rec_both_sb_zeroed (void **state)
{
  uint8_t before[PS], after[PS];

  make_crashed_cache ();
  assert_int_equal (testfile_read (PT, before, PS), PS);
  zero_range (0, 2 * LAYOUT_SB_SIZE);
  rec_refused ();
  assert_true (log_errors_contain (testfile_path));
  assert_true (log_errors_contain ("zeroed"));
  assert_int_equal (testfile_read (PT, after, PS), PS);
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
  c = rec_open ();
  assert_int_equal (ST (c, dropped_entries), NPAGES);
  assert_true (log_errors_contain ("DIRTY DATA MAY BE LOST"));
  assert_int_equal (cache_dirty_pages (c), 0);
  check_data (c, ALL_DIRTY);
  cache_close (c);
  /* Reported once: the damaged entries were rewritten as FREE. */
  c = rec_open ();
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
  c = rec_open ();
  assert_int_equal (ST (c, dropped_entries), 1);
  assert_true (log_errors_contain ("DIRTY DATA MAY BE LOST"));
  assert_int_equal (cache_dirty_pages (c), DIRTY_HI - DIRTY_LO);
  check_data (c, BIT (13));
  cache_close (c);
}

/* Give page's entry the sequence number seq (its checksum made anew). */
static void
set_entry_seq (uint64_t page, uint64_t seq)
{
  uint8_t raw[LAYOUT_ENTRY_SIZE];
  struct layout_entry e;
  int s = slot_of (page);

  assert_true (s >= 0);
  assert_int_equal (testfile_read (PT + (uint64_t) s * LAYOUT_ENTRY_SIZE,
                                   raw, sizeof raw), sizeof raw);
  assert_int_equal (layout_entry_decode (raw, PS / 512, &e), 0);
  e.seq = seq;
  layout_entry_encode (&e, raw);
  testfile_write (PT + (uint64_t) s * LAYOUT_ENTRY_SIZE, raw, sizeof raw);
}

/* The loader keeps an entry's number in 48 bits (pt_loaded_seq): the
 * largest loads, and a dirty page whose entry is past it is dropped as
 * damaged, not ordered wrongly.
 */
static void
test_rec_seq_48_bits (void **state)
{
  struct cache *c;

  make_crashed_cache ();
  set_entry_seq (12, PT_LOADED_SEQ_MAX);
  set_entry_seq (13, PT_LOADED_SEQ_MAX + 1);
  c = rec_open ();
  assert_int_equal (ST (c, dropped_entries), 1);
  assert_true (log_errors_contain ("DIRTY DATA MAY BE LOST"));
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
  c = rec_open ();
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
  rec_refused ();
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
  int n;
  struct cache *c;

  make_crashed_cache ();
  n = testfile_newest_sb ();
  assert_int_equal (testfile_read (n * LAYOUT_SB_SIZE, buf, sizeof buf),
                    sizeof buf);
  buf[8] = LAYOUT_VERSION + 1;
  {
    uint32_t crc = layout_crc32c (buf, LAYOUT_SB_SIZE - 4);
    for (int i = 0; i < 4; i++)
      buf[LAYOUT_SB_SIZE - 4 + i] = crc >> (8 * i);
  }
  testfile_write (n * LAYOUT_SB_SIZE, buf, sizeof buf);
  rec_refused ();
  assert_true (log_errors_contain ("newer"));
  assert_int_equal (testfile_read (n * LAYOUT_SB_SIZE, back, sizeof back),
                    sizeof back);
  assert_memory_equal (buf, back, sizeof buf);

  /* Now with a wrong checksum: a damaged copy, recovered from. */
  testfile_xor (n * LAYOUT_SB_SIZE + 200, 1, 0x01);
  c = rec_open ();
  check_data (c, 0);
  cache_close (c);
}

/* A bit of a clean page's data, and one of a dirty page's data. */
static void
test_rec_data_bits (void **state)
{
  struct cache *c;

  make_crashed_cache ();
  flip_slot_byte (30, 4095, 0x80);
  flip_slot_byte (14, 0, 0x01);
  c = rec_open ();
  /* Checked on first use, not at start-up: nothing read yet. */
  assert_int_equal (ST (c, dirty_dropped), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  check_data (c, BIT (14));
  assert_int_equal (ST (c, dirty_dropped), 1);
  assert_true (log_errors_contain ("DIRTY DATA LOST"));
  assert_int_equal (ST (c, verify_failures), 2);    /* clean and dirty */
  cache_close (c);
}

/* Dirty pages torn by the crash, first used by a write into part of
 * one (its copy reads the slot) and by writeback of the other: each is
 * dropped as torn (the backend's data is right), and neither the write
 * nor the writeback fails.
 */
static void
test_rec_torn_first_use (void **state)
{
  struct rambackend rb;
  struct cache *c;
  uint8_t buf[PS], exp[PS];
  int err = 0;

  make_crashed_cache ();
  flip_slot_byte (11, 10, 0x01);
  flip_slot_byte (12, 20, 0x02);
  c = rec_open ();
  assert_int_equal (ST (c, dirty_dropped), 0);
  rambackend_init (&rb, SIZE, SEED);
  memset (buf, 0xab, 100);
  if (cache_write (c, &rb.be, buf, 100, 11 * PS + 50, false, &err) != 0)
    fail_msg ("write into a torn page failed: err %d", err);
  assert_int_equal (ST (c, dirty_dropped), 1);
  if (cache_writeback_all (c, &rb.be, &err) != 0)
    fail_msg ("writeback failed: err %d", err);
  assert_int_equal (ST (c, dirty_dropped), 2);
  assert_int_equal (cache_dirty_pages (c), 0);

  /* The backend: the dirty pages that survived, page 11 as before the
   * crash but for the write, page 12 as before the crash.
   */
  for (uint64_t p = DIRTY_LO; p <= DIRTY_HI; p++) {
    rambackend_peek (&rb, buf, PS, p * PS);
    if (p == 11 || p == 12) {
      struct rambackend orig;

      rambackend_init (&orig, SIZE, SEED);
      rambackend_peek (&orig, exp, PS, p * PS);
      rambackend_free (&orig);
      if (p == 11)
        memset (exp + 50, 0xab, 100);
    }
    else
      dirty_pattern (exp, p);
    if (memcmp (buf, exp, PS) != 0)
      fail_msg ("page %llu: wrong data on the backend",
                (unsigned long long) p);
  }
  cache_close (c);
  rambackend_free (&rb);
}

/* A dirty page torn by the crash, first used by a write that goes
 * around the cache (at the dirty cap) and so writes back the dirty pages
 * it covers first: the torn one is dropped, not lost, and the write
 * does not fail.
 */
static void
test_rec_torn_around (void **state)
{
  struct cache_config cfg = fixture_writeback_config (SIZE, PS);
  const uint32_t len = 5 * PS;
  uint8_t *buf = malloc (len), got[PS];
  struct rambackend rb;
  struct cache *c;
  int err = 0;

  assert_non_null (buf);
  make_crashed_cache ();
  flip_slot_byte (12, 30, 0x04);
  cfg.wb.max_dirty_bytes = (DIRTY_HI - DIRTY_LO + 1) * PS;
  log_errors_forget ();
  c = cache_open (&cfg);
  assert_non_null (c);
  assert_int_equal (cache_attach (c, SIZE), 0);
  rambackend_init (&rb, SIZE, SEED);
  memset (buf, 0xcd, len);
  if (cache_write (c, &rb.be, buf, len, 12 * PS, false, &err) != 0)
    fail_msg ("write around a torn page failed: err %d", err);
  assert_true (ST (c, dirty_cap_writes) >= 1);
  assert_int_equal (ST (c, dirty_dropped), 1);
  for (uint64_t p = 12; p < 17; p++) {
    if (cache_read (c, &rb.be, got, PS, p * PS, &err) != 0)
      fail_msg ("page %llu: read failed", (unsigned long long) p);
    assert_memory_equal (got, buf, PS);
  }
  cache_close (c);
  rambackend_free (&rb);
  free (buf);
}

/* A test that failed half-way must not leave the next one with its
 * scenario (crash_small).
 */
static int
setup_crash (void **state)
{
  crash_small = false;
  return testfile_setup (state);
}

#define T(f) cmocka_unit_test_setup_teardown (f, setup_crash, \
                                              testfile_teardown)

/* A write sent around the cache at the dirty cap (write-back.c:
 * cache_write_goes_around) to a page whose flushed dirty version was copied
 * on write: the copy is written back and the write reaches the backend,
 * a flush covers it, nbdkit dies.  The older flushed version may still
 * be on disk, so the cached copy must not be updated in place (a crash
 * drops such a copy and brings the older version back over the newer
 * write): after the restart the page reads as the last write.
 */
static void
test_wb_cap_through_crash (void **state)
{
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct rambackend rb;
  struct cache *c;
  uint8_t buf[PS];
  pid_t pid;
  int err = 0;

  cfg.wb.max_dirty_bytes = 3 * PS;
  unlink (testfile_path);
  pid = fixture_fork ();
  if (pid == 0) {
    crash_start (&cfg, 8 * PS, 61);
    fill_pattern (buf, PS, 1);                        /* V1, flushed */
    if (cache_write (crash_cache, &crash_rb.be, buf, PS, 0, false, &err) ||
        cache_flush (crash_cache, &crash_rb.be, &err))
      _exit (2);
    fill_pattern (buf, PS, 2);                        /* V2: a copy */
    if (cache_write (crash_cache, &crash_rb.be, buf, PS, 0, false, &err))
      _exit (3);
    for (int p = 1; p < 3; p++) {                     /* at the cap */
      fill_pattern (buf, PS, 10 + p);
      if (cache_write (crash_cache, &crash_rb.be, buf, PS, p * PS, false,
                       &err))
        _exit (4);
    }
    fill_pattern (buf, PS, 3);                        /* V3: around */
    if (cache_write (crash_cache, &crash_rb.be, buf, PS, 0, false, &err) ||
        cache_flush (crash_cache, &crash_rb.be, &err))
      _exit (5);
    _exit (0);
  }
  fixture_wait (pid);

  rambackend_init (&rb, 8 * PS, 61);
  fill_pattern (buf, PS, 3);                          /* what it got */
  rambackend_poke (&rb, buf, PS, 0);
  c = testfile_open_attach (&cfg, rb.size);
  {
    uint8_t got[PS];
    assert_int_equal (cache_read (c, &rb.be, got, PS, 0, &err), 0);
    assert_memory_equal (got, buf, PS);
    for (int p = 1; p < 3; p++) {                     /* flushed dirty */
      fill_pattern (buf, PS, 10 + p);
      assert_int_equal (cache_read (c, &rb.be, got, PS, p * PS, &err), 0);
      assert_memory_equal (got, buf, PS);
    }
  }
  fixture_close (c, &rb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    T (test_crash_reopen_flushed),
    T (test_crash_reopen_deferred),
    T (test_crash_reopen_deferred_flushed),
    T (test_evicted_entry_gone),
    T (test_wt_crash_after_backend_write),
    T (test_wt_crash_revert),
    T (test_crash_reopen),
    T (test_fill_entry_written),
    T (test_wb_patch_after_restart),
    T (test_wt_unsealed_clean),
    T (test_wb_crash_recovery),
    T (test_wb_crash_reopen_writethrough),
    T (test_wb_crash_writethrough_serves_dirty),
    T (test_wb_two_versions),
    T (test_wb_two_versions_far_seqs),
    T (test_wb_two_versions_torn_newer),
    T (test_wb_written_back_successor),
    T (test_wb_unsealed_crash),
    T (test_wb_flush_during_unseal),
    T (test_sync_under_inplace),
    T (test_wb_crash_after_write_around),
    T (test_wb_unsealed_crash_older_damaged),
    T (test_wb_unsealed_crash_backend_newer),
    T (test_rec_intact),
    T (test_rec_newest_sb_damaged),
    T (test_rec_both_sb_zeroed),
    T (test_rec_pt_block_zeroed),
    T (test_rec_dirty_entry_bit),
    T (test_rec_seq_48_bits),
    T (test_rec_truncated_pool),
    T (test_rec_truncated_pt),
    T (test_wb_cap_through_crash),
    T (test_rec_future_version),
    T (test_rec_data_bits),
    T (test_rec_torn_first_use),
    T (test_rec_torn_around),
  };

  testfile_name = "test-crash";
  testfile_watchdog_seconds = 300;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
