/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: writeback mode of the cache engine
 * (cache.c, cache-write.c, cache-open.c, writeback.c) over a RAM
 * backend and a real temporary cache file.
 *
 * Writes that stay in the cache, sub-page writes without backend reads,
 * copy on write of durable dirty pages (invariant 4) checked on the
 * cache file itself, a cache full of dirty data (invariant 3), flush
 * semantics, zero/trim, dirty extents, backend errors during writeback,
 * concurrent clients with the writeback thread running, unsealed slots
 * and sector maps that are not runs.  Crashes in writeback mode are in
 * test-crash.c.
 *
 * The backend seen by the engine is a thin wrapper over the RAM backend
 * (struct tbe, tests/unit/fixture.h) that adds a counted flush and
 * persistent write / flush failures; most tests hold it with the RAM
 * backend and a model of the export (struct tenv).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "layout.h"
#include "pagetable.h"
#include "rambackend.h"
#include "stats.h"
#include "fixture.h"
#include "log-stderr.h"
#include "testfile.h"
#include "writeback.h"
#include "cache-int.h"             /* test_wb_flush_backend_hot */
#include "pool.h"                  /* pool_test_fail_entry_writes */

#define PS 4096u                  /* page size of most tests */
#define SS 512u                   /* its sector size */

static uint64_t
cache_now_ms_for_tests (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*----------------------------------------------------------------------
 * 1. Basics: writes stay in the cache until written back.
 */

static void
test_wb_basics (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  struct layout_sb sb;
  uint8_t *orig;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 1);
  orig = model_new (&env.rb);
  assert_int_equal (cache_mode (c), LAYOUT_MODE_WRITEBACK);
  testfile_read_sb (&sb);
  assert_int_equal (sb.mode, LAYOUT_MODE_WRITEBACK);
  assert_true (sb.flags & LAYOUT_SB_DIRTY);

  tenv_write (&env, c, 0, PS, 1);                   /* page 0 whole */
  tenv_write (&env, c, 5 * PS + 100, 3000, 2);      /* page 5 sectors 0-6 */
  tenv_write (&env, c, 10 * PS + 512, 3 * PS, 3);   /* pages 10-13 */
  assert_int_equal (env.rb.writes, 0);
  assert_int_equal (env.t.flushes, 0);
  backend_check (&env.rb, orig, PS);
  assert_int_equal (cache_dirty_pages (c), 6);
  assert_int_equal (ST (c, write_through_full), 0);

  /* Reads see the new data; reading everything (64 pages through 16
   * slots) evicts clean pages but never the dirty ones.
   */
  tenv_read_check (&env, c, 5 * PS, PS);
  tenv_read_all_check (&env, c, 3 * PS + 11);
  tenv_read_all_check (&env, c, 5000);
  assert_true (ST (c, evictions) > 0);
  assert_int_equal (cache_dirty_pages (c), 6);
  assert_int_equal (env.rb.writes, 0);
  backend_check (&env.rb, orig, PS);

  /* Write back: the backend gets exactly the dirty sectors, adjacent
   * pages coalesced into one request, then a flush.
   */
  tenv_writeback_check (&env, c);
  assert_int_equal (cache_dirty_pages (c), 0);
  assert_true (env.t.flushes >= 1);
  assert_true (env.t.last_flush_ev > env.t.last_write_ev);
  assert_int_equal (ST (c, pages_written_back), 6);
  /* 4096 + 7*512 (page 5) + 7*512 + 2*4096 + 512 (pages 10-13) */
  assert_int_equal (ST (c, bytes_written_back), 4096 + 3584 + 3584 + 8192 + 512);
  assert_int_equal (env.rb.bytes_written, 4096 + 3584 + 3584 + 8192 + 512);
  assert_int_equal (env.rb.writes, 3);
  assert_int_equal (env.rb.out_of_range, 0);

  /* Nothing left: another pass writes nothing. */
  rambackend_reset_counters (&env.rb);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (env.rb.writes, 0);
  tenv_read_all_check (&env, c, 4 * PS);

  /* Cached copies are clean now, still served from the cache. */
  rambackend_reset_counters (&env.rb);
  tenv_read_check (&env, c, 10 * PS, 4 * PS);
  cache_close (c);
  testfile_read_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_CLEAN);
  assert_false (sb.flags & LAYOUT_SB_DIRTY);

  /* Reopened: nothing dirty. */
  c = testfile_open_attach (&cfg, size);
  assert_int_equal (cache_dirty_pages (c), 0);
  tenv_read_all_check (&env, c, 8 * PS);
  tenv_close (&env, c);
  free (orig);
}

/*----------------------------------------------------------------------
 * 2. Sub-page writes do not read the backend (or only their edge
 * sectors), and reads merge dirty sectors with backend data.
 */

static void
test_wb_subpage (void **state)
{
  const uint32_t ps = 65536, ss = 512;
  const uint64_t size = 16ULL * ps;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8ULL * ps, ps);
  struct cache *c;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 2);
  assert_int_equal (cache_page_size (c), ps);

  /* 1 KiB, sector aligned, into an uncached page: no backend read. */
  tenv_write (&env, c, 3 * ps + 5 * ss, 1024, 1);
  assert_int_equal (env.rb.reads, 0);
  /* Several sectors, aligned. */
  tenv_write (&env, c, 6 * ps + 64 * ss, 8 * ss, 2);
  assert_int_equal (env.rb.reads, 0);
  /* Sub-page write into a page with those sectors valid: no read. */
  tenv_write (&env, c, 3 * ps + 5 * ss + 50, 100, 3);
  assert_int_equal (env.rb.reads, 0);
  assert_int_equal (env.rb.bytes_read, 0);

  /* Unaligned at both ends: only the two edge sectors are read. */
  tenv_write (&env, c, 4 * ps + 2 * ss + 100, 1000, 4);
  assert_int_equal (env.rb.bytes_read, 2 * ss);
  assert_int_equal (env.rb.reads, 2);
  /* Inside one sector: that sector only. */
  tenv_write (&env, c, 5 * ps + 7000, 10, 5);
  assert_int_equal (env.rb.bytes_read, 3 * ss);
  assert_int_equal (env.rb.reads, 3);
  /* The last sector of a page, partly. */
  tenv_write (&env, c, 7 * ps + ps - 300, 200, 6);
  assert_int_equal (env.rb.bytes_read, 4 * ss);
  assert_int_equal (env.rb.writes, 0);
  assert_int_equal (cache_dirty_pages (c), 5);

  /* Served right: pieces inside the written sectors are hits. */
  rambackend_reset_counters (&env.rb);
  tenv_read_check (&env, c, 3 * ps + 5 * ss, 1024);
  tenv_read_check (&env, c, 4 * ps + 2 * ss, 3 * ss);
  tenv_read_check (&env, c, 5 * ps + 13 * ss, ss);
  assert_int_equal (env.rb.reads, 0);

  /* Write back partly valid pages: only dirty sectors reach the
   * backend, never the zeroes standing for invalid sectors.
   */
  tenv_writeback_check (&env, c);
  assert_int_equal (ST (c, bytes_written_back),
                    1024 + 8 * ss + 3 * ss + ss + ss);
  assert_int_equal (cache_dirty_pages (c), 0);

  /* More sub-page writes into the (now clean, partly valid) pages and
   * fresh ones, then whole-page reads: backend data merged with the
   * cached dirty sectors.
   */
  rambackend_poke (&env.rb, "BACKEND-ONLY", 12, 3 * ps + 40000); /* uncached */
  memcpy (env.model + 3 * ps + 40000, "BACKEND-ONLY", 12);
  tenv_write (&env, c, 3 * ps + 20 * ss, 2 * ss, 7);
  tenv_write (&env, c, 9 * ps + 100 * ss, ss, 8);
  tenv_write (&env, c, 10 * ps + 3, 5, 9);
  rambackend_reset_counters (&env.rb);
  tenv_read_check (&env, c, 3 * ps, ps);
  tenv_read_check (&env, c, 9 * ps, ps);
  tenv_read_check (&env, c, 9 * ps + 100 * ss - 7, 20);
  tenv_read_check (&env, c, 2 * ps, 10 * ps);
  assert_int_equal (env.rb.writes, 0);
  /* Completed pages are kept whole: no backend read now. */
  rambackend_reset_counters (&env.rb);
  tenv_read_check (&env, c, 3 * ps, ps);
  tenv_read_check (&env, c, 9 * ps, ps);
  assert_int_equal (env.rb.reads, 0);
  assert_int_equal (cache_dirty_pages (c), 3);

  /* Write back after completion: the dirty sectors, and the clean ones
   * between page 9's dirty sector and page 10's (27 sectors, under
   * WB_BRIDGE_MAX): two requests.
   */
  rambackend_reset_counters (&env.rb);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (env.rb.bytes_written, 2 * ss + (27 + 2) * ss);
  assert_int_equal (env.rb.writes, 2);
  backend_check (&env.rb, env.model, ps);
  tenv_read_all_check (&env, c, ps);
  assert_int_equal (env.rb.out_of_range, 0);
  tenv_close (&env, c);
}

/* Writeback joins dirty runs across valid clean sectors (the backend
 * has those bytes) up to WB_BRIDGE_MAX (16 KiB) of them, never across an
 * invalid sector (the cache does not have it).
 */
static void
test_wb_bridge (void **state)
{
  const uint32_t ps = 65536, ss = 512;
  const uint64_t size = 16ULL * ps;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8ULL * ps, ps);
  struct cache *c;

  c = tenv_open (&env, &cfg, size, 3);
  tenv_read_check (&env, c, 0, 2 * ps);    /* pages 0, 1 whole */
  tenv_write (&env, c, 0, ss, 1);          /* page 0, sector 0 */
  tenv_write (&env, c, 20 * ss, ss, 2);    /* 19 clean between */
  tenv_write (&env, c, ps, ss, 3);         /* page 1, 107 between */
  tenv_write (&env, c, 4 * ps, ss, 4);     /* page 4, not cached */
  tenv_write (&env, c, 4 * ps + 2 * ss, ss, 5);
  rambackend_reset_counters (&env.rb);
  tenv_writeback_check (&env, c);
  /* Page 0's sectors 0-20, page 1's sector 0, page 4's two sectors. */
  assert_int_equal (env.rb.writes, 4);
  assert_int_equal (env.rb.bytes_written, (21 + 1 + 2) * ss);
  assert_int_equal (cache_dirty_pages (c), 0);
  tenv_read_all_check (&env, c, ps);
  tenv_close (&env, c);
}

/*----------------------------------------------------------------------
 * 3. Invariant 4: a durable dirty page is never overwritten in place.
 */

static void
test_wb_cow_durable (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (4 * PS, PS);
  struct cache *c;
  uint8_t data_a[PS], data_now[PS], raw_a[LAYOUT_ENTRY_SIZE],
    raw_now[LAYOUT_ENTRY_SIZE];
  uint32_t slots[4], a, b, c10, a2;
  uint64_t seqs[4];
  uint8_t states[4];
  struct layout_entry e;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 3);
  assert_int_equal (cache_nslots (c), 4);

  /* Page 3, dirty, made durable. */
  tenv_write (&env, c, 3 * PS, PS, 1);
  assert_int_equal (file_slots_for (3, slots, seqs, states, 4), 1);
  a = slots[0];
  assert_int_equal (states[0], LAYOUT_DIRTY);
  assert_int_equal (cache_sync (c, &err), 0);
  file_slot_data (a, data_a);
  assert_memory_equal (data_a, env.model + 3 * PS, PS);
  assert_int_equal (file_entry (a, &e, raw_a), 0);

  /* A partial write: the new version goes to another slot, with a
   * higher sequence number; the durable one is untouched.
   */
  tenv_write (&env, c, 3 * PS + 1000, 100, 2);
  assert_int_equal (ST (c, cow_copies), 1);
  assert_int_equal (file_slots_for (3, slots, seqs, states, 4), 2);
  assert_int_equal (slots[0], a);
  b = slots[1];
  assert_true (seqs[1] > seqs[0]);
  assert_int_equal (states[1], LAYOUT_DIRTY);
  file_slot_data (a, data_now);
  assert_memory_equal (data_now, data_a, PS);
  assert_int_equal (file_entry (a, &e, raw_now), 0);
  assert_memory_equal (raw_now, raw_a, LAYOUT_ENTRY_SIZE);
  file_slot_data (b, data_now);
  assert_memory_equal (data_now, env.model + 3 * PS, PS);
  tenv_read_check (&env, c, 3 * PS, PS);
  tenv_read_check (&env, c, 3 * PS + 990, 200);
  assert_int_equal (cache_dirty_pages (c), 1);

  /* Fill the other slots with dirty pages; one more write finds no
   * slot: the superseded slot must not be handed out before its
   * successor is durable.
   */
  tenv_write (&env, c, 10 * PS, PS, 3);
  tenv_write (&env, c, 11 * PS, PS, 4);
  assert_int_equal (ST (c, write_through_full), 0);
  tenv_write (&env, c, 12 * PS, PS, 5);
  assert_int_equal (ST (c, write_through_full), 1);
  file_slot_data (a, data_now);
  assert_memory_equal (data_now, data_a, PS);
  assert_int_equal (file_entry (a, &e, raw_now), 0);
  assert_memory_equal (raw_now, raw_a, LAYOUT_ENTRY_SIZE);
  tenv_read_check (&env, c, 3 * PS, PS);
  tenv_read_check (&env, c, 10 * PS, 3 * PS);

  /* Once the new version is durable the old slot is freed on disk. */
  assert_int_equal (cache_sync (c, &err), 0);
  assert_int_equal (file_entry (a, &e, NULL), 0);
  assert_int_equal (e.state, LAYOUT_FREE);
  assert_int_equal (file_slots_for (3, slots, seqs, states, 4), 1);
  assert_int_equal (slots[0], b);
  tenv_read_check (&env, c, 3 * PS, PS);

  /* Page 10 is durable now: a partial write copies it (into the slot
   * just freed)...
   */
  assert_int_equal (file_slots_for (10, slots, seqs, states, 4), 1);
  c10 = slots[0];
  tenv_write (&env, c, 10 * PS + 2000, 10, 6);
  assert_int_equal (ST (c, cow_copies), 2);
  assert_int_equal (file_slots_for (10, slots, seqs, states, 4), 2);
  assert_int_equal (slots[0], c10);
  a2 = slots[1];
  /* ...and a second write to that copy, not synced since it was
   * written, happens in place: no new slot, a higher sequence number.
   */
  {
    uint64_t seq_before = seqs[1];
    tenv_write (&env, c, 10 * PS + 3000, 10, 7);
    assert_int_equal (ST (c, cow_copies), 2);
    assert_int_equal (file_slots_for (10, slots, seqs, states, 4), 2);
    assert_int_equal (slots[1], a2);
    assert_true (seqs[1] > seq_before);
    file_slot_data (a2, data_now);
    assert_memory_equal (data_now, env.model + 10 * PS, PS);
  }
  tenv_read_check (&env, c, 0, size);

  /* Everything written back ends up right. */
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* (Internal, cache-int.h: a sync of the cache file that is not a
 * client's, as a writeback pass makes.)
 */
extern int cache_sync_device (struct cache *c, int *err);

/* A client that never flushes while writeback passes sync the cache
 * file, with the epoch bases moving every few syncs (span 8): its dirty
 * pages, rewritten long after they were written, are rewritten in
 * place, as when no base moves (no client flush covers them: nothing
 * to copy for); once a client flush covers them, they are copied.
 */
static void
test_wb_no_flush_in_place (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  int err = 0;

  pagetable_test_epoch_span = 8;
  c = tenv_open (&env, &cfg, size, 5);
  pagetable_test_epoch_span = 0;
  for (unsigned p = 0; p < 4; p++)
    tenv_write (&env, c, p * PS, PS, 10 + p);
  /* Read misses store clean pages (their entries of ever newer
   * epochs) in the other slots, between syncs.
   */
  for (unsigned i = 0; i < 40; i++) {
    tenv_read_check (&env, c, (8 + i % 20) * PS, PS);
    assert_int_equal (cache_sync_device (c, &err), 0);
  }
  assert_true (ST (c, pt_rebases) > 0);
  for (unsigned p = 0; p < 4; p++)
    tenv_write (&env, c, p * PS + 100, 50, 70 + p);
  assert_int_equal (ST (c, cow_copies), 0);
  tenv_read_check (&env, c, 0, size);

  assert_int_equal (cache_sync (c, &err), 0);
  tenv_write (&env, c, 100, 50, 80);
  assert_int_equal (ST (c, cow_copies), 1);
  tenv_read_check (&env, c, 0, size);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* Dirty page written twice between syncs: both writes in place. */
static void
test_wb_inplace_not_durable (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  uint32_t slots[4], s0;
  uint64_t seqs[4];
  int err = 0;

  c = tenv_open (&env, &cfg, size, 4);

  /* A partial write and a whole-page write, then more of each. */
  tenv_write (&env, c, 7 * PS + 100, 50, 1);
  tenv_write (&env, c, 8 * PS, PS, 2);
  assert_int_equal (file_slots_for (7, slots, seqs, NULL, 4), 1);
  s0 = slots[0];
  tenv_write (&env, c, 7 * PS + 3000, 500, 3);
  tenv_write (&env, c, 7 * PS, PS, 4);
  tenv_write (&env, c, 8 * PS + 5, 5, 5);
  tenv_write (&env, c, 8 * PS, PS, 6);
  assert_int_equal (ST (c, cow_copies), 0);
  assert_int_equal (file_slots_for (7, slots, seqs, NULL, 4), 1);
  assert_int_equal (slots[0], s0);
  assert_int_equal (file_slots_for (8, slots, seqs, NULL, 4), 1);
  tenv_read_check (&env, c, 7 * PS, 2 * PS);

  /* After a sync the same writes copy; after the copy, in place again. */
  assert_int_equal (cache_sync (c, &err), 0);
  tenv_write (&env, c, 8 * PS, PS, 7);
  assert_int_equal (ST (c, cow_copies), 1);
  tenv_write (&env, c, 8 * PS + 77, 7, 8);
  assert_int_equal (ST (c, cow_copies), 1);
  tenv_write (&env, c, 7 * PS + 10, 7, 9);
  assert_int_equal (ST (c, cow_copies), 2);
  tenv_read_check (&env, c, 0, size);

  /* Written back (clean now) and durable: a write in place is fine
   * (the backend has the old version).
   */
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_sync (c, &err), 0);
  tenv_write (&env, c, 7 * PS + 10, 7, 10);
  tenv_read_check (&env, c, 0, size);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/*----------------------------------------------------------------------
 * 4. Invariant 3: a cache full of dirty data never evicts it.
 */

static void
test_wb_full_no_thread (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;

  c = tenv_open (&env, &cfg, size, 5);
  assert_int_equal (cache_nslots (c), 8);

  for (int p = 0; p < 8; ++p)
    tenv_write (&env, c, (uint64_t) p * 3 * PS + (p % 2 ? 700 : 0),
            p % 2 ? 1500 : PS, 10 + p);
  assert_int_equal (cache_dirty_pages (c), 8);
  assert_int_equal (env.rb.writes, 0);

  /* No slot and no writeback thread: the writes go to the backend. */
  tenv_write (&env, c, 40 * PS, PS, 20);
  tenv_write (&env, c, 41 * PS + 10, 100, 21);
  tenv_write (&env, c, 42 * PS + 10, 3 * PS, 22);
  /* Dirty pages not yet durable are rewritten in place. */
  tenv_write (&env, c, 3 * PS + 800, 200, 23);
  tenv_write (&env, c, 6 * PS, PS, 24);
  assert_true (ST (c, write_through_full) >= 3);
  assert_int_equal (ST (c, evictions), 0);
  assert_int_equal (cache_dirty_pages (c), 8);

  /* Reads of other pages do not get a slot either, and are right. */
  tenv_read_all_check (&env, c, 5 * PS + 3);
  assert_int_equal (cache_dirty_pages (c), 8);
  assert_int_equal (ST (c, evictions), 0);

  /* Nothing dirty was lost. */
  tenv_writeback_check (&env, c);
  /* Clean now: the slots can be reused. */
  tenv_read_all_check (&env, c, 2 * PS);
  assert_true (ST (c, evictions) > 0);
  tenv_close (&env, c);
}

/* Whole-page write over a durable dirty page while every slot holds
 * durable dirty data (no writeback thread): the copy on write finds no
 * slot.  Whatever the engine does (write through, wait, fail), it must
 * never serve or write back the old version afterwards.
 */
static void
test_wb_full_overwrite_durable_dirty (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (4 * PS, PS);
  struct cache *c;
  uint8_t buf[PS], old[PS], got[PS];
  int err = 0, r;

  c = tenv_open (&env, &cfg, size, 6);
  for (int p = 0; p < 4; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 30 + p);
  assert_int_equal (cache_sync (c, &err), 0);      /* all durable */

  memcpy (old, env.model + 2 * PS, PS);
  fill_pattern (buf, PS, 40);
  r = cache_write (c, env.be, buf, PS, 2 * PS, false, &err);
  if (r == 0)
    memcpy (env.model + 2 * PS, buf, PS);
  /* If the write failed, the old data must still be what is served. */
  assert_int_equal (cache_read (c, env.be, got, PS, 2 * PS, &err), 0);
  if (memcmp (got, env.model + 2 * PS, PS) != 0) {
    bool served_old = memcmp (got, old, PS) == 0;
    uint8_t be_now[PS];
    bool backend_new, backend_old_after_wb;

    rambackend_peek (&env.rb, be_now, PS, 2 * PS);
    backend_new = memcmp (be_now, buf, PS) == 0;
    assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
    rambackend_peek (&env.rb, be_now, PS, 2 * PS);
    backend_old_after_wb = memcmp (be_now, old, PS) == 0;
    fail_msg ("whole-page write over a durable dirty page, cache full of "
              "durable dirty pages: cache_write returned %d "
              "(write_through_full=%llu); the backend %s the new data; a "
              "read then returned %s; after cache_writeback_all the "
              "backend holds %s", r,
              (unsigned long long) ST (c, write_through_full),
              backend_new ? "got" : "did not get",
              served_old ? "the OLD (superseded) dirty version"
              : "wrong data",
              backend_old_after_wb ? "the OLD version again (new write lost)"
              : "something else");
  }
  tenv_read_check (&env, c, 0, size);

  /* A partial write over another durable dirty page, still no slot:
   * it must succeed (or fail) without losing either version's bytes.
   */
  assert_int_equal (cache_sync (c, &err), 0);
  fill_pattern (buf, 100, 41);
  r = cache_write (c, env.be, buf, 100, 1 * PS + 1000, false, &err);
  if (r == 0)
    memcpy (env.model + 1 * PS + 1000, buf, 100);
  else
    fail_msg ("partial write over a durable dirty page in a cache full "
              "of durable dirty pages failed: %s", strerror (err));
  tenv_read_check (&env, c, 0, size);
  fill_pattern (buf, 100, 42);
  assert_int_equal (cache_write (c, env.be, buf, 100, 3 * PS + 3000, false,
                                 &err), 0);
  memcpy (env.model + 3 * PS + 3000, buf, 100);
  tenv_read_check (&env, c, 0, size);

  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* The same with the writeback thread: writes wait for it instead. */
static void
test_wb_full_thread (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  uint64_t s = 4242;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 7);
  for (int p = 0; p < 8; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 50 + p);
  assert_int_equal (cache_sync (c, &err), 0);      /* all durable dirty */
  assert_int_equal (cache_dirty_pages (c), 8);

  atomic_store (&env.rb.delay_max_us, 300);
  assert_int_equal (writeback_start (c, env.be), 0);

  /* Copies of durable dirty pages (partial and whole), new pages,
   * sub-page writes into new pages: all need slots.
   */
  tenv_write (&env, c, 2 * PS + 100, 100, 60);
  tenv_write (&env, c, 5 * PS, PS, 61);
  for (int i = 0; i < 120; ++i) {
    uint64_t off = rnd64 (&s) % size;
    uint32_t len = i % 3 == 0 ? PS : 1 + rnd64 (&s) % (2 * PS);
    if (i % 3 == 0)
      off -= off % PS;
    if (len > size - off)
      len = size - off;
    tenv_write (&env, c, off, len, 100 + i);
    assert_true (cache_dirty_pages (c) <= 8);
    if (i % 10 == 0)
      assert_int_equal (cache_sync (c, &err), 0);
    if (i % 7 == 0)
      tenv_read_check (&env, c, off, len);
  }
  /* Writers never wait for writeback: those that found no slot went
   * around the cache (write_through_full), and the data is right.
   */
  assert_true (ST (c, pages_written_back) > 0);
  tenv_read_all_check (&env, c, 3 * PS + 5);

  writeback_stop (c);
  atomic_store (&env.rb.delay_max_us, 0);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  assert_int_equal (env.rb.out_of_range, 0);
  tenv_close (&env, c);
}

/*----------------------------------------------------------------------
 * 5. Flush semantics.
 */

static void
test_wb_flush_backend (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache *c;
  uint64_t flushes;
  int err = 0;

  cfg.flush_mode = CACHE_FLUSH_BACKEND;
  c = tenv_open (&env, &cfg, size, 13);
  assert_int_equal (writeback_start (c, env.be), 0);

  tenv_write (&env, c, 0, 3 * PS, 1);
  tenv_write (&env, c, 10 * PS + 100, 100, 2);
  tenv_write (&env, c, 20 * PS + 4000, 5000, 3);
  assert_int_equal (env.rb.writes, 0);           /* no cleaning by itself */
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  /* On return: all written back, then the backend flushed. */
  backend_check (&env.rb, env.model, PS);
  assert_int_equal (cache_dirty_pages (c), 0);
  assert_true (env.t.flushes >= 1);
  assert_true (env.t.last_flush_ev > env.t.last_write_ev);

  /* A FUA write is a write plus a flush. */
  {
    uint8_t buf[300];
    fill_pattern (buf, sizeof buf, 4);
    memcpy (env.model + 30 * PS + 9, buf, sizeof buf);
    assert_int_equal (cache_write (c, env.be, buf, sizeof buf, 30 * PS + 9,
                                   true, &err), 0);
    backend_check (&env.rb, env.model, PS);
    assert_int_equal (cache_dirty_pages (c), 0);
    assert_true (env.t.last_flush_ev > env.t.last_write_ev);
  }

  /* Backend write errors: FLUSH fails, the data stays dirty and is
   * still served from the cache.
   */
  tenv_write (&env, c, 5 * PS, PS, 5);
  tenv_write (&env, c, 40 * PS + 7, 9, 6);
  atomic_store (&env.t.fail_write, EIO);
  err = 0;
  assert_int_equal (cache_flush (c, env.be, &err), -1);
  assert_int_equal (err, EIO);
  assert_true (env.t.failed_writes >= 1);
  assert_int_equal (cache_dirty_pages (c), 2);
  assert_true (ST (c, writeback_errors) >= 1);
  tenv_read_check (&env, c, 0, size);
  /* Errors gone: the next FLUSH succeeds. */
  atomic_store (&env.t.fail_write, 0);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);

  /* Backend flush errors: FLUSH fails too, pages stay dirty. */
  tenv_write (&env, c, 50 * PS + 1, 2, 7);
  atomic_store (&env.t.fail_flush, EIO);
  err = 0;
  assert_int_equal (cache_flush (c, env.be, &err), -1);
  assert_int_equal (err, EIO);
  assert_int_equal (cache_dirty_pages (c), 1);
  tenv_read_check (&env, c, 50 * PS, PS);
  atomic_store (&env.t.fail_flush, 0);
  flushes = env.t.flushes;
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  assert_true (env.t.flushes > flushes);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);

  writeback_stop (c);
  tenv_close (&env, c);
}

static void
test_wb_flush_cache (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache *c;
  uint8_t *orig;
  uint64_t syncs, writes;
  int err = 0;

  cfg.flush_mode = CACHE_FLUSH_CACHE;
  c = tenv_open (&env, &cfg, size, 14);
  orig = model_new (&env.rb);
  assert_int_equal (writeback_start (c, env.be), 0);

  tenv_write (&env, c, 0, 3 * PS, 1);
  tenv_write (&env, c, 10 * PS + 100, 100, 2);
  writes = env.rb.writes;
  syncs = ST (c, cache_syncs);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  assert_int_equal (env.rb.writes, writes);
  assert_int_equal (writes, 0);
  assert_true (ST (c, cache_syncs) > syncs);
  assert_int_equal (cache_dirty_pages (c), 4);
  backend_check (&env.rb, orig, PS);
  /* FUA: durable on the cache only, too. */
  {
    uint8_t buf[100];
    fill_pattern (buf, sizeof buf, 3);
    memcpy (env.model + 11 * PS, buf, sizeof buf);
    syncs = ST (c, cache_syncs);
    assert_int_equal (cache_write (c, env.be, buf, sizeof buf, 11 * PS,
                                   true, &err), 0);
    assert_true (ST (c, cache_syncs) > syncs);
    assert_int_equal (env.rb.writes, 0);
  }
  /* Backend write errors do not matter to such a FLUSH. */
  atomic_store (&env.t.fail_write, EIO);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  atomic_store (&env.t.fail_write, 0);
  tenv_read_check (&env, c, 0, size);

  writeback_stop (c);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
  free (orig);
}

/*----------------------------------------------------------------------
 * 6. Zero / trim and dirty extents.
 */

struct zt_ctx {
  struct rambackend *rb;
  int calls;
  uint64_t last_off, last_count, bytes;
};

static int
zt_op (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  struct zt_ctx *z = opaque;
  uint8_t *zero = calloc (1, count ? count : 1);

  assert_non_null (zero);
  if (offset > z->rb->size || count > z->rb->size - offset) {
    free (zero);
    *err = EINVAL;
    return -1;
  }
  rambackend_poke (z->rb, zero, count, offset);
  free (zero);
  z->calls++;
  z->last_off = offset;
  z->last_count = count;
  z->bytes += count;
  return 0;
}

/* Check cache_range_dirty over [off, off+count) against the set of
 * pages expected dirty.
 */
static void
check_dirty_runs (struct cache *c, uint64_t off, uint64_t count,
                  const bool *dirty_page, uint32_t ps)
{
  uint64_t pos = off, end = off + count;

  while (pos < end) {
    uint64_t run_end = 0;
    bool d = cache_range_dirty (c, pos, end - pos, &run_end);

    if (run_end <= pos || run_end > end)
      fail_msg ("cache_range_dirty (%llu, %llu): run end %llu out of range",
                (unsigned long long) pos, (unsigned long long) (end - pos),
                (unsigned long long) run_end);
    for (uint64_t p = pos / ps; p * ps < run_end; ++p)
      if (dirty_page[p] != d)
        fail_msg ("cache_range_dirty (%llu, %llu) = %d up to %llu, but "
                  "page %llu is %s", (unsigned long long) pos,
                  (unsigned long long) (end - pos), d,
                  (unsigned long long) run_end, (unsigned long long) p,
                  dirty_page[p] ? "dirty" : "not dirty");
    /* Runs are maximal. */
    if (run_end < end && dirty_page[run_end / ps] == d)
      fail_msg ("cache_range_dirty (%llu, %llu) = %d stops at %llu, but "
                "page %llu is the same", (unsigned long long) pos,
                (unsigned long long) (end - pos), d,
                (unsigned long long) run_end,
                (unsigned long long) (run_end / ps));
    pos = run_end;
  }
}

static void
test_wb_zero_trim (void **state)
{
  const uint64_t size = 32 * PS - 1000;        /* short last page */
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache *c;
  struct zt_ctx z = { 0 };
  const struct cache_zero_op zero_op = { true, zt_op, &z };
  const struct cache_zero_op trim_op = { false, zt_op, &z };
  bool dirty[32] = { false };
  uint64_t ndirty;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 15);
  z.rb = &env.rb;

  for (int p = 2; p <= 13; ++p) {
    tenv_write (&env, c, (uint64_t) p * PS, PS, 200 + p);
    dirty[p] = true;
  }
  assert_int_equal (cache_sync (c, &err), 0);
  /* A clean cached page too. */
  tenv_read_check (&env, c, 15 * PS, PS);
  assert_int_equal (cache_dirty_pages (c), 12);
  check_dirty_runs (c, 0, size, dirty, PS);

  /* Zero [2*PS+1000, 7*PS+1000): pages 3-6 whole, edges 2 and 7. */
  rambackend_reset_counters (&env.rb);
  assert_int_equal (cache_zero_trim (c, env.be, &zero_op, 5 * PS,
                                     2 * PS + 1000, false, &err), 0);
  memset (env.model + 2 * PS + 1000, 0, 5 * PS);
  assert_int_equal (z.calls, 1);
  assert_int_equal (z.last_off, 3 * PS);
  assert_int_equal (z.last_count, 4 * PS);
  assert_int_equal (env.rb.writes, 0);
  assert_int_equal (env.rb.reads, 0);
  for (int p = 3; p <= 6; ++p)
    dirty[p] = false;
  assert_int_equal (cache_dirty_pages (c), 8);
  tenv_read_all_check (&env, c, 3 * PS);
  check_dirty_runs (c, 0, size, dirty, PS);

  /* Zero with unaligned edges in uncached pages: edges become dirty
   * zeroes (sector-aligned: no backend read), one whole page to the
   * backend.
   */
  rambackend_reset_counters (&env.rb);
  assert_int_equal (cache_zero_trim (c, env.be, &zero_op,
                                     2 * PS + 512, 20 * PS + 512, false,
                                     &err), 0);
  memset (env.model + 20 * PS + 512, 0, 2 * PS + 512);
  assert_int_equal (z.calls, 2);
  assert_int_equal (z.last_off, 21 * PS);
  assert_int_equal (z.last_count, PS);
  assert_int_equal (env.rb.reads, 0);
  assert_int_equal (env.rb.writes, 0);
  dirty[20] = dirty[22] = true;
  assert_int_equal (cache_dirty_pages (c), 10);
  tenv_read_all_check (&env, c, 5 * PS);
  check_dirty_runs (c, 0, size, dirty, PS);

  /* Inside one page: no backend op at all. */
  assert_int_equal (cache_zero_trim (c, env.be, &zero_op, 100,
                                     9 * PS + 50, false, &err), 0);
  memset (env.model + 9 * PS + 50, 0, 100);
  assert_int_equal (z.calls, 2);

  /* Trim [10*PS+100, 13*PS+50): pages 11, 12 whole go to the backend
   * (their dirty copies dropped), the edges keep their data.
   */
  assert_int_equal (cache_zero_trim (c, env.be, &trim_op,
                                     3 * PS - 50, 10 * PS + 100, false,
                                     &err), 0);
  memset (env.model + 11 * PS, 0, 2 * PS);        /* zt_op zeroes */
  assert_int_equal (z.calls, 3);
  assert_int_equal (z.last_off, 11 * PS);
  assert_int_equal (z.last_count, 2 * PS);
  dirty[11] = dirty[12] = false;
  assert_int_equal (cache_dirty_pages (c), 8);
  tenv_read_all_check (&env, c, 2 * PS + 7);
  check_dirty_runs (c, 0, size, dirty, PS);

  /* The short last page, from its start: a whole page. */
  tenv_write (&env, c, 31 * PS + 10, 20, 250);
  assert_int_equal (cache_zero_trim (c, env.be, &zero_op,
                                     size - 31 * PS, 31 * PS, false,
                                     &err), 0);
  memset (env.model + 31 * PS, 0, size - 31 * PS);
  assert_int_equal (z.calls, 4);
  assert_int_equal (z.last_count, size - 31 * PS);
  tenv_read_all_check (&env, c, 4 * PS);
  check_dirty_runs (c, 0, size, dirty, PS);

  /* Extents in odd windows. */
  check_dirty_runs (c, 2 * PS + 100, 10, dirty, PS);
  check_dirty_runs (c, 2 * PS + 100, 5 * PS, dirty, PS);
  check_dirty_runs (c, 6 * PS + 4095, 2, dirty, PS);
  check_dirty_runs (c, 13 * PS - 1, 9 * PS + 3, dirty, PS);
  {
    uint64_t re;
    assert_true (cache_range_dirty (c, 7 * PS + 5, 20, &re));
    assert_int_equal (re, 7 * PS + 25);
    assert_false (cache_range_dirty (c, 3 * PS, 10 * PS, &re));
    assert_int_equal (re, 7 * PS);
    assert_true (cache_range_dirty (c, 7 * PS, 10 * PS, &re));
    assert_int_equal (re, 11 * PS);
  }

  ndirty = cache_dirty_pages (c);
  assert_int_equal (ndirty, 8);
  tenv_writeback_check (&env, c);
  memset (dirty, 0, sizeof dirty);
  check_dirty_runs (c, 0, size, dirty, PS);
  assert_int_equal (env.rb.out_of_range, 0);
  tenv_close (&env, c);
}

/*----------------------------------------------------------------------
 * 7. Backend write errors during writeback.
 */

static void
test_wb_backend_errors (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (32 * PS, PS);
  struct cache *c;
  uint8_t *orig;
  int err = 0, errors;

  /* One request at a time: "the next write fails" is then the first
   * group's (test_wb_parallel_depth covers several in flight).
   */
  cfg.wb.depth = 1;
  c = tenv_open (&env, &cfg, size, 16);
  orig = model_new (&env.rb);
  for (int p = 0; p < 6; ++p)
    tenv_write (&env, c, (uint64_t) p * PS + 10, PS - 20, 400 + p);
  tenv_write (&env, c, 30 * PS, PS, 410);
  tenv_write (&env, c, 50 * PS + 1, 1, 411);
  assert_int_equal (cache_dirty_pages (c), 8);

  /* Every backend write fails. */
  errors = log_error_count;
  atomic_store (&env.t.fail_write, EIO);
  err = 0;
  assert_int_equal (cache_writeback_all (c, env.be, &err), -1);
  assert_int_equal (err, EIO);
  assert_true (log_error_count > errors);        /* logged */
  assert_true (ST (c, writeback_errors) >= 1);
  assert_int_equal (cache_dirty_pages (c), 8);
  backend_check (&env.rb, orig, PS);
  tenv_read_all_check (&env, c, 3 * PS + 3);
  atomic_store (&env.t.fail_write, 0);

  /* A single failure (the first group, pages 0-5): only that run stays
   * dirty; the rest of the pass goes on and is marked clean.
   */
  rambackend_fail_next_write (&env.rb, ENOSPC);
  err = 0;
  assert_int_equal (cache_writeback_all (c, env.be, &err), -1);
  assert_int_equal (err, ENOSPC);
  assert_int_equal (cache_dirty_pages (c), 6);
  for (int p = 0; p < 6; ++p)
    assert_true (cache_range_dirty (c, (uint64_t) p * PS, PS, &(uint64_t){0}));
  tenv_read_all_check (&env, c, 5 * PS);

  /* Flush failure: written but not flushed: still dirty. */
  atomic_store (&env.t.fail_flush, EIO);
  assert_int_equal (cache_writeback_all (c, env.be, &err), -1);
  assert_int_equal (cache_dirty_pages (c), 6);
  atomic_store (&env.t.fail_flush, 0);

  /* Rewrites of pages that failed, then errors gone: all good. */
  tenv_write (&env, c, 2 * PS + 100, 100, 420);
  tenv_write (&env, c, 30 * PS, 2 * PS, 421);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  tenv_read_all_check (&env, c, 4 * PS);

  /* A failure with the thread: it retries by itself later. */
  cfg.wb.idle_ms = 20;
  cache_close (c);
  c = testfile_open_attach (&cfg, size);
  tenv_write (&env, c, 7 * PS, 3 * PS, 430);
  atomic_store (&env.t.failed_writes, 0);
  atomic_store (&env.t.fail_write, EIO);
  assert_int_equal (writeback_start (c, env.be), 0);
  while (atomic_load (&env.t.failed_writes) < 2)
    usleep (10000);
  assert_int_equal (cache_dirty_pages (c), 3);
  tenv_read_check (&env, c, 0, size);
  atomic_store (&env.t.fail_write, 0);
  for (int i = 0; i < 1000 && cache_dirty_pages (c) > 0; ++i)
    usleep (10000);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  writeback_stop (c);
  tenv_close (&env, c);
  free (orig);
}

/*----------------------------------------------------------------------
 * 8. Concurrent clients with the writeback thread running.
 */

#define MT_THREADS 3
#define MT_PAGES 96                   /* whole pages, owned by p % 3 */
#define MT_STRIPED 32                 /* pages shared in stripes */
#define MT_STRIPE 1500                /* bytes, owned by stripe % 3 */
#define MT_SIZE ((uint64_t) (MT_PAGES + MT_STRIPED) * PS)

struct mt {
  int id;
  int ops;
  struct cache *c;
  const struct cache_backend *be;
  uint8_t *model;                     /* shared; each writes its bytes */
  int failures;
  char msg[256];
};

static bool
mt_owner (uint64_t pos, int id)
{
  if (pos < (uint64_t) MT_PAGES * PS)
    return (pos / PS) % MT_THREADS == (uint64_t) id;
  return ((pos - (uint64_t) MT_PAGES * PS) / MT_STRIPE) % MT_THREADS ==
    (uint64_t) id;
}

static void *
mt_main (void *arg)
{
  struct mt *m = arg;
  uint64_t s = 1000003 * (m->id + 1);
  uint8_t *buf = malloc (4 * PS);

  for (int i = 0; i < m->ops && m->failures == 0; ++i) {
    uint64_t off, len;
    int op = rnd64 (&s) % 10, err = 0;

    /* Where: one of my pages, or one of my stripes. */
    if (rnd64 (&s) % 2) {
      uint64_t p = (rnd64 (&s) % (MT_PAGES / MT_THREADS)) * MT_THREADS +
        m->id;
      if (rnd64 (&s) % 3 == 0) {
        off = p * PS;
        len = PS;
      }
      else {
        off = p * PS + rnd64 (&s) % PS;
        len = 1 + rnd64 (&s) % (PS - off % PS);
      }
    }
    else {
      uint64_t nstripes = (uint64_t) MT_STRIPED * PS / MT_STRIPE;
      uint64_t k = (rnd64 (&s) % (nstripes / MT_THREADS)) * MT_THREADS +
        m->id;
      uint64_t base = (uint64_t) MT_PAGES * PS + k * MT_STRIPE;
      off = base + rnd64 (&s) % MT_STRIPE;
      len = 1 + rnd64 (&s) % (base + MT_STRIPE - off);
    }

    if (op < 5) {
      fill_pattern (buf, len, m->id * 100000 + i);
      if (cache_write (m->c, m->be, buf, len, off, false, &err) != 0) {
        m->failures++;
        snprintf (m->msg, sizeof m->msg, "thread %d: write off=%llu "
                  "len=%llu failed: %s", m->id, (unsigned long long) off,
                  (unsigned long long) len, strerror (err));
        break;
      }
      memcpy (m->model + off, buf, len);
    }
    else if (op < 9) {
      /* Read a wider window; check only my bytes. */
      uint64_t lo = off > PS ? off - PS : 0;
      uint64_t hi = off + len + PS < MT_SIZE ? off + len + PS : MT_SIZE;
      uint8_t *rbuf = malloc (hi - lo);
      if (cache_read (m->c, m->be, rbuf, hi - lo, lo, &err) != 0) {
        m->failures++;
        snprintf (m->msg, sizeof m->msg, "thread %d: read off=%llu "
                  "len=%llu failed: %s", m->id, (unsigned long long) lo,
                  (unsigned long long) (hi - lo), strerror (err));
        free (rbuf);
        break;
      }
      for (uint64_t k = lo; k < hi; ++k)
        if (mt_owner (k, m->id) && rbuf[k - lo] != m->model[k]) {
          m->failures++;
          snprintf (m->msg, sizeof m->msg, "thread %d, op %d: read "
                    "off=%llu len=%llu wrong at offset %llu (page %llu): "
                    "got 0x%02x expected 0x%02x", m->id, i,
                    (unsigned long long) lo, (unsigned long long) (hi - lo),
                    (unsigned long long) k, (unsigned long long) (k / PS),
                    rbuf[k - lo], m->model[k]);
          break;
        }
      free (rbuf);
    }
    else if (cache_flush (m->c, m->be, &err) != 0) {
      m->failures++;
      snprintf (m->msg, sizeof m->msg, "thread %d: flush failed: %s",
                m->id, strerror (err));
      break;
    }
  }
  free (buf);
  return NULL;
}

static void
run_mt (enum cache_flush_mode fm, uint32_t slots, int ops, unsigned delay)
{
  struct tenv env;
  struct cache_config cfg =
    fixture_writeback_config ((uint64_t) slots * PS, PS);
  struct cache *c;
  struct mt m[MT_THREADS];
  pthread_t th[MT_THREADS];
  int err = 0;

  cfg.flush_mode = fm;
  cfg.wb.high_pct = 50;
  cfg.wb.low_pct = 20;
  cfg.wb.idle_ms = 30;
  c = tenv_open (&env, &cfg, MT_SIZE, 17);
  assert_int_equal (writeback_start (c, env.be), 0);
  atomic_store (&env.rb.delay_max_us, delay);

  for (int i = 0; i < MT_THREADS; ++i) {
    m[i] = (struct mt) { .id = i, .ops = ops, .c = c, .be = env.be,
                         .model = env.model };
    assert_int_equal (pthread_create (&th[i], NULL, mt_main, &m[i]), 0);
  }
  for (int i = 0; i < MT_THREADS; ++i)
    assert_int_equal (pthread_join (th[i], NULL), 0);
  for (int i = 0; i < MT_THREADS; ++i)
    if (m[i].failures)
      fail_msg ("%s", m[i].msg);
  assert_true (ST (c, pages_written_back) > 0);
  assert_true (cache_dirty_pages (c) <= slots);

  tenv_read_all_check (&env, c, 3 * PS + 17);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  writeback_stop (c);
  atomic_store (&env.rb.delay_max_us, 0);
  assert_int_equal (env.rb.out_of_range, 0);
  cache_close (c);

  c = testfile_open_attach (&cfg, MT_SIZE);
  tenv_read_all_check (&env, c, 8 * PS);
  tenv_close (&env, c);
}

static void
test_wb_threads_flush_cache (void **state)
{
  run_mt (CACHE_FLUSH_CACHE, 16, 600, 200);
}

static void
test_wb_threads_flush_backend (void **state)
{
  run_mt (CACHE_FLUSH_BACKEND, 16, 600, 200);
}

/* A page held by requests nearly all the time (a hot page rewritten
 * without pause), dirty: a FLUSH with ssdcache-flush=backend must still
 * write it back and end.  Passes only try-lock pages and skip busy ones:
 * the flush writes such pages back itself, waiting for their range
 * locks (issue 27, item 8).  It does so from the client's own thread:
 * it asked the writeback thread before, and wrote nothing back where
 * none ran (none is started here).
 */
struct holder {
  struct cache *c;
  uint64_t page;
  _Atomic bool stop;
  _Atomic unsigned rounds;
};

static void *
hold_page (void *arg)
{
  struct holder *h = arg;

  while (!atomic_load (&h->stop)) {
    rangelock_acquire (&h->c->ranges, h->page, h->page);
    usleep (2000);
    rangelock_release (&h->c->ranges, h->page, h->page);
    atomic_fetch_add (&h->rounds, 1);
  }
  return NULL;
}

struct flusher {
  struct cache *c;
  struct tbe *t;
  int r, err;
  _Atomic bool done;
};

static void *
flush_run (void *arg)
{
  struct flusher *f = arg;

  f->r = cache_flush (f->c, &f->t->be, &f->err);
  atomic_store (&f->done, true);
  return NULL;
}

static void
test_wb_flush_backend_hot (void **state)
{
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct tenv env;
  struct cache *c;
  struct holder h = { .page = 3 };
  struct flusher f = { .t = &env.t };
  pthread_t ht, ft;
  uint8_t buf[PS], got[PS];
  int err = 0, i;

  cfg.flush_mode = CACHE_FLUSH_BACKEND;
  c = tenv_open (&env, &cfg, 16 * PS, 21);
  fill_pattern (buf, PS, 5);
  assert_int_equal (cache_write (c, env.be, buf, PS, 3 * PS, false, &err), 0);
  h.c = f.c = c;
  assert_int_equal (pthread_create (&ht, NULL, hold_page, &h), 0);
  while (atomic_load (&h.rounds) < 3)
    usleep (1000);
  assert_int_equal (pthread_create (&ft, NULL, flush_run, &f), 0);
  for (i = 0; i < 30000 && !atomic_load (&f.done); i++)
    usleep (1000);
  atomic_store (&h.stop, true);
  pthread_join (ht, NULL);
  if (!atomic_load (&f.done))
    fail_msg ("the flush did not end in 30 s");
  pthread_join (ft, NULL);
  assert_int_equal (f.r, 0);
  rambackend_peek (&env.rb, got, PS, 3 * PS);
  assert_memory_equal (got, buf, PS);
  tenv_close (&env, c);
}

static void
test_wb_threads_tiny_cache (void **state)
{
  run_mt (CACHE_FLUSH_CACHE, 4, 400, 100);
}

/*----------------------------------------------------------------------
 * 9. Unsealed slots (cache-seal.c): unflushed dirty data rewritten in
 * place without a checksum; never trusted after a crash; sealed again
 * by a flush, by writeback and by a clean close.
 */

/* The on-disk entry of page is sealed and its checksum matches the
 * data on disk.
 */
static void
assert_sealed_on_disk (uint64_t page)
{
  struct layout_entry e;
  uint32_t s;
  uint8_t buf[PS];

  newest_entry (page, &e, &s);
  assert_int_equal (e.flags & LAYOUT_ENT_UNSEALED, 0);
  file_slot_data (s, buf);
  for (unsigned i = 0; i < PS / SS; i++)
    if (!layout_bit_test (e.valid, i))
      memset (buf + i * SS, 0, SS);
  assert_int_equal (layout_crc32c (buf, PS), e.data_crc);
}

/* RAM keeps no checksums: when the entry write of a partial write to a
 * page not read since the start fails, the checksum the entry should
 * have had is remembered (crc_memo).  The write is then retried around
 * the now degraded cache, which writes the dirty page back first and
 * must be able to check it: no EIO, no lost data.
 */
static void
test_wb_entry_write_fails (void **state)
{
  const uint64_t size = 16 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;

  tenv_init_cached (&env, &cfg, size, 23);
  c = testfile_open_attach (&cfg, size);        /* none verified */
  atomic_store (&pool_test_fail_entry_writes, 1);
  tenv_write (&env, c, 2 * PS + 1000, 300, 5);
  assert_int_equal (atomic_load (&pool_test_fail_entry_writes), 0);
  assert_int_equal (ST (c, degraded), 1);
  tenv_read_all_check (&env, c, PS);
  tenv_write (&env, c, 2 * PS + 10, 100, 6);
  tenv_read_all_check (&env, c, PS);
  assert_int_equal (ST (c, dirty_lost), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* A client flush seals what it covers; so do writeback and close. */
static void
test_wb_unsealed_sealed (void **state)
{
  const uint64_t size = 16 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (8 * PS, PS);
  struct cache *c;
  struct layout_entry e;
  struct layout_sb sb;
  int err = 0;

  c = tenv_open (&env, &cfg, size, 10);

  /* Flush. */
  unseal_q (c, env.be, env.model);
  newest_entry (5, &e, NULL);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);
  tenv_read_check (&env, c, 0, size);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  assert_sealed_on_disk (5);

  /* Writeback (it marks the page clean from the data it read). */
  tenv_write (&env, c, 7 * PS, 512, 71);
  tenv_write (&env, c, 7 * PS + 512, 512, 72);
  tenv_write (&env, c, 7 * PS + 512, 1024, 73);
  newest_entry (7, &e, NULL);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  newest_entry (7, &e, NULL);
  assert_int_equal (e.state, LAYOUT_CLEAN);
  assert_sealed_on_disk (7);
  backend_check (&env.rb, env.model, PS);

  /* Close. */
  tenv_write (&env, c, 9 * PS + 1000, 100, 91);
  tenv_write (&env, c, 9 * PS + 2000, 100, 92);
  tenv_write (&env, c, 9 * PS + 3000, 100, 93);
  newest_entry (9, &e, NULL);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);
  cache_close (c);
  assert_sealed_on_disk (9);
  testfile_read_sb (&sb);
  assert_true (sb.flags & LAYOUT_SB_CLEAN);
  c = testfile_open_attach (&cfg, size);
  tenv_read_all_check (&env, c, 3 * PS);
  assert_int_equal (ST (c, unsealed_dropped), 0);
  assert_int_equal (ST (c, verify_failures), 0);
  assert_int_equal (cache_dirty_pages (c), 1);    /* page 9 */
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* Above the high watermark, background writeback cleans the pages
 * nobody writes any more, and leaves alone those being rewritten (they
 * would be dirty again at once), unless a writer needs a slot.
 */
static void
test_wb_hot_pages_left_alone (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  uint64_t written_back, deadline;
  int round = 0;

  cfg.wb.high_pct = 50;           /* 8 dirty pages */
  cfg.wb.low_pct = 0;
  /* 16 pages a second: the burst at the end outruns writeback even on
   * a busy host, so that a writer does need a slot.
   */
  cfg.wb.rate = 16 * PS;
  c = tenv_open (&env, &cfg, size, 12);
  for (int p = 0; p < 12; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 120 + p);
  assert_int_equal (writeback_start (c, env.be), 0);

  /* Pages 0-1 are rewritten all the time; 2-11 are cold.  Within 20 s
   * (about two seconds are needed) the cold ones are clean.
   */
  deadline = cache_now_ms_for_tests () + 20000;
  while (cache_dirty_pages (c) > 2) {
    assert_true (cache_now_ms_for_tests () < deadline);
    tenv_write (&env, c, (round & 1) * PS + 512, 1024, 200 + round);
    round++;
    usleep (2000);
  }
  /* Keep rewriting for a while: no write-back of the hot pages. */
  written_back = ST (c, pages_written_back);
  assert_int_equal (written_back, 10);
  for (int i = 0; i < 500; ++i, ++round) {
    tenv_write (&env, c, (round & 1) * PS + 512, 1024, 200 + round);
    usleep (2000);
  }
  assert_int_equal (ST (c, pages_written_back), written_back);
  assert_int_equal (cache_dirty_pages (c), 2);

  /* A writer that needs a slot (it does not wait: some of these go
   * around the cache) tells writeback: everything may go now.
   */
  for (int p = 12; p < 32; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 300 + p);
  deadline = cache_now_ms_for_tests () + 20000;
  while (cache_dirty_pages (c) > 0) {
    assert_true (cache_now_ms_for_tests () < deadline);
    usleep (10000);
  }
  assert_true (ST (c, pages_written_back) > written_back);
  tenv_read_all_check (&env, c, 3 * PS);

  writeback_stop (c);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* The hot window's rule (writeback_hot_next): grows fourfold when at
 * least half the sampled cleaned pages were dirty again, halves when
 * under a quarter were, keeps within 1-32 s, and needs 16 samples.
 */
static void
test_wb_hot_window_rule (void **state)
{
  assert_int_equal (writeback_hot_next (1000, 15, 15), 1000);
  assert_int_equal (writeback_hot_next (4000, 15, 0), 4000);
  assert_int_equal (writeback_hot_next (1000, 100, 50), 4000);
  assert_int_equal (writeback_hot_next (1000, 16, 16), 4000);
  assert_int_equal (writeback_hot_next (16000, 100, 100), 32000);
  assert_int_equal (writeback_hot_next (32000, 256, 256), 32000);
  assert_int_equal (writeback_hot_next (4000, 100, 49), 4000);
  assert_int_equal (writeback_hot_next (4000, 100, 25), 4000);
  assert_int_equal (writeback_hot_next (4000, 100, 24), 2000);
  assert_int_equal (writeback_hot_next (32000, 100, 0), 16000);
  assert_int_equal (writeback_hot_next (1000, 100, 0), 1000);
  assert_int_equal (writeback_hot_next (1500, 100, 0), 1000);
}

/* Writes spread over every dirty page, each rewritten every 2.5 s:
 * what background cleaning writes back is dirty again at once, so
 * cleaning is wasted.  The hot window grows past the rewrite cycle and
 * then nothing more is written back (with the fixed one-second window,
 * pages were cleaned and redirtied every cycle).  A writer that needs
 * a slot sets it back.
 */
static void
test_wb_hot_window_grows (void **state)
{
  const uint32_t npages = 200;
  const uint64_t size = 300 * (uint64_t) PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (256 * PS, PS);
  struct cache *c;
  uint64_t written_back, deadline, end;
  unsigned round = 0;

  cfg.wb.high_pct = 50;           /* 128 dirty pages */
  cfg.wb.low_pct = 0;
  c = tenv_open (&env, &cfg, size, 31);
  for (uint32_t p = 0; p < npages; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 500 + p);
  assert_int_equal (ST (c, writeback_hot_ms), 0);
  assert_int_equal (writeback_start (c, env.be), 0);
  assert_int_equal (ST (c, writeback_hot_ms), 1000);

  /* Round robin, one page every 12.5 ms.  About 8 s are needed (two
   * windows of one second, then one of four).
   */
  deadline = cache_now_ms_for_tests () + 40000;
  while (ST (c, writeback_hot_ms) < 16000) {
    if (cache_now_ms_for_tests () >= deadline)
      fail_msg ("the hot window stayed at %llu ms; %llu pages written "
                "back", (unsigned long long) ST (c, writeback_hot_ms),
                (unsigned long long) ST (c, pages_written_back));
    tenv_write (&env, c, (uint64_t) (round % npages) * PS + 512, 1024,
            1000 + round);
    round++;
    usleep (12500);
  }
  assert_true (ST (c, pages_written_back) > 0);

  /* Five more seconds of the same: no write-back at all. */
  written_back = ST (c, pages_written_back);
  end = cache_now_ms_for_tests () + 5000;
  while (cache_now_ms_for_tests () < end) {
    tenv_write (&env, c, (uint64_t) (round % npages) * PS + 512, 1024,
            1000 + round);
    round++;
    usleep (12500);
  }
  assert_int_equal (ST (c, pages_written_back), written_back);
  assert_int_equal (cache_dirty_pages (c), npages);

  /* New pages: once the free slots are gone a writer needs a slot,
   * everything may be cleaned, and the window is one second again.
   */
  for (uint32_t p = npages; p < 300; ++p)
    tenv_write (&env, c, (uint64_t) p * PS, PS, 3000 + p);
  end = cache_now_ms_for_tests () + 20000;
  while (ST (c, pages_written_back) <= written_back ||
         ST (c, writeback_hot_ms) != 1000) {
    assert_true (cache_now_ms_for_tests () < end);
    usleep (10000);
  }
  tenv_read_all_check (&env, c, 7 * PS);

  writeback_stop (c);
  assert_int_equal (ST (c, writeback_hot_ms), 0);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/*----------------------------------------------------------------------
 * 10. Sector maps that are not runs, with the page table's side table
 * (pagetable.c) tiny or absent, so that every fallback runs (a write
 * makes its page simple first, a read rounds out to the whole page, a
 * write-through of a dirty page writes it back first), and with sync
 * epochs and sequence numbers rebased every few steps: random sub-page
 * writes, reads, flushes, writebacks and reopenings (switching between
 * writeback and writethrough) against a model.
 */

static void
partial_run (uint32_t partial_pages, uint64_t seed, bool want_full)
{
  const uint32_t ps = 65536;              /* 128 sectors of 512 bytes */
  const uint32_t npages = 24;
  const uint64_t size = (uint64_t) npages * ps;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * (uint64_t) ps, ps);
  struct cache *c;
  uint64_t rs = seed, full = 0, rebases = 0;
  unsigned pat = 1000;
  int err = 0;

  pagetable_test_epoch_span = 8;
  pagetable_test_seq_span = 16;
  cfg.partial_pages = partial_pages;
  c = tenv_open (&env, &cfg, size, 23);

  for (int op = 0; op < 2500; op++) {
    uint64_t r = rnd64 (&rs) % 100;
    uint64_t page = rnd64 (&rs) % npages;
    uint64_t off = page * ps + (rnd64 (&rs) % 128) * 512 +
      (rnd64 (&rs) % 4 == 0 ? rnd64 (&rs) % 512 : 0);
    uint32_t len = 1 + rnd64 (&rs) % (rnd64 (&rs) % 8 ? 3000 : 2 * ps);

    if (off + len > size)
      len = size - off;
    if (r < 45)
      tenv_write (&env, c, off, len, pat++);
    else if (r < 85)
      tenv_read_check (&env, c, off, len);
    else if (r < 92)
      assert_int_equal (cache_flush (c, env.be, &err), 0);
    else if (r < 96)
      assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
    else {
      full += ST (c, partial_maps_full);
      rebases += ST (c, pt_rebases);
      cache_close (c);
      cfg.mode = rnd64 (&rs) % 2 ? LAYOUT_MODE_WRITEBACK
        : LAYOUT_MODE_WRITETHROUGH;
      c = testfile_open_attach (&cfg, size);
    }
  }
  tenv_read_all_check (&env, c, ps / 2);
  tenv_writeback_check (&env, c);
  full += ST (c, partial_maps_full);
  rebases += ST (c, pt_rebases);
  cache_close (c);
  if (want_full)
    assert_true (full > 0);
  assert_true (rebases > 0);
  pagetable_test_epoch_span = pagetable_test_seq_span = 0;
  tenv_free (&env);
}

static void
test_wb_partial_maps_none (void **state)
{
  partial_run (CACHE_PARTIAL_NONE, 0x5eed1234, true);
}

static void
test_wb_partial_maps_tiny (void **state)
{
  partial_run (2, 0xabcdef99, true);
}

static void
test_wb_partial_maps_default (void **state)
{
  partial_run (0, 0x77665544, false);
}

/* ssdcache-writeback-depth: a pass keeps up to depth backend writes
 * in flight (one with depth 1), in offset order, and the backend ends
 * with exactly the data.
 */
static void
test_wb_parallel_depth (void **state)
{
  const uint64_t size = 128 * PS;
  unsigned depths[] = { 1, 4 };

  for (unsigned d = 0; d < 2; d++) {
    struct tenv env;
    struct cache_config cfg = fixture_writeback_config (80 * PS, PS);
    struct cache *c;
    int err = 0;

    cfg.wb.depth = depths[d];
    unlink (testfile_path);               /* a new cache each time */
    c = tenv_open (&env, &cfg, size, 40 + d);
    for (int p = 0; p < 128; p += 2)    /* not adjacent: 64 groups */
      tenv_write (&env, c, (uint64_t) p * PS + 7, 1000, 500 + p);
    atomic_store (&env.rb.delay_max_us, 3000);
    assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
    atomic_store (&env.rb.delay_max_us, 0);
    if (depths[d] == 1)
      assert_int_equal (atomic_load (&env.t.max_inflight), 1);
    else {
      assert_true (atomic_load (&env.t.max_inflight) >= 2);
      assert_true (atomic_load (&env.t.max_inflight) <= depths[d]);
    }
    assert_int_equal (cache_dirty_pages (c), 0);
    backend_check (&env.rb, env.model, PS);
    tenv_close (&env, c);
  }
}

/* In the flush order a pass over closed generations keeps depth
 * requests in flight even while writes go around the cache: those
 * writes wait for the pass (the backend is its own), where without the
 * order a pass yields the backend to them with one request in flight.
 */
static void
test_order_closed_pass_depth (void **state)
{
  const uint64_t size = 128 * PS;
  enum cache_wb_order orders[] = { CACHE_ORDER_OFFSET, CACHE_ORDER_FLUSH };

  for (unsigned o = 0; o < 2; o++) {
    struct tenv env;
    struct cache_config cfg = fixture_writeback_config (80 * PS, PS);
    struct cache *c;
    int err = 0;

    cfg.wb.depth = 4;
    cfg.wb.order = orders[o];
    unlink (testfile_path);               /* a new cache each time */
    c = tenv_open (&env, &cfg, size, 46 + o);
    for (int p = 0; p < 128; p += 2)    /* not adjacent: 64 groups */
      tenv_write (&env, c, (uint64_t) p * PS + 7, 1000, 600 + p);
    assert_int_equal (cache_sync (c, &err), 0);  /* closes generation 1 */
    atomic_store (&c->last_around_ms, cache_now_ms ()); /* a write around */
    atomic_store (&env.rb.delay_max_us, 3000);
    assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
    atomic_store (&env.rb.delay_max_us, 0);
    if (orders[o] == CACHE_ORDER_OFFSET)
      assert_int_equal (atomic_load (&env.t.max_inflight), 1);
    else
      assert_true (atomic_load (&env.t.max_inflight) >= 2);
    assert_int_equal (cache_dirty_pages (c), 0);
    backend_check (&env.rb, env.model, PS);
    tenv_close (&env, c);
  }
}

/* ssdcache-writeback-max-dirty: at the cap a write that would add
 * dirty pages goes through as in writethrough and makes no new dirty
 * data; a page it touches that is dirty is written back first, so its
 * older dirty data can never be written back over the newer write.  A
 * write that only changes dirty pages adds none and stays in the cache.
 */
static void
test_wb_dirty_cap (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;

  cfg.wb.max_dirty_bytes = 2 * PS;
  c = tenv_open (&env, &cfg, size, 45);
  tenv_write (&env, c, 0, PS, 1);              /* dirty: A */
  tenv_write (&env, c, 4 * PS, PS, 2);
  assert_int_equal (cache_dirty_pages (c), 2);
  assert_int_equal (ST (c, dirty_cap_writes), 0);
  tenv_write (&env, c, 8 * PS + 100, 200, 3);  /* at the cap */
  assert_int_equal (ST (c, dirty_cap_writes), 1);
  {
    const uint64_t writes = env.rb.writes, flushes = env.t.flushes;

    tenv_write (&env, c, 4 * PS + 512, 1024, 8); /* dirty only */
    assert_int_equal (ST (c, dirty_cap_writes), 1);
    assert_int_equal (env.rb.writes, writes);
    assert_int_equal (env.t.flushes, flushes);
  }
  tenv_write (&env, c, 100, PS + 300, 4);      /* B over A, and more */
  assert_int_equal (ST (c, dirty_cap_writes), 2);
  assert_true (cache_dirty_pages (c) <= 2);
  tenv_read_all_check (&env, c, 3 * PS);
  /* Page 0 was written back before B went to the backend. */
  tenv_writeback_check (&env, c);
  tenv_read_all_check (&env, c, 5 * PS);
  /* A write at the cap over several dirty pages: they are written back
   * together, with one backend flush before the write, not one each.
   */
  tenv_write (&env, c, 10 * PS + 512, 1024, 5);
  tenv_write (&env, c, 12 * PS, PS, 6);
  assert_int_equal (cache_dirty_pages (c), 2);
  {
    const uint64_t flushes = env.t.flushes, back = ST (c, pages_written_back);

    tenv_write (&env, c, 10 * PS + 100, 4 * PS - 200, 7);
    assert_int_equal (env.t.flushes, flushes + 1);
    assert_int_equal (ST (c, pages_written_back), back + 2);
    assert_int_equal (ST (c, dirty_cap_writes), 3);
  }
  assert_int_equal (cache_dirty_pages (c), 0);
  backend_check (&env.rb, env.model, PS);
  tenv_read_all_check (&env, c, 5 * PS);
  tenv_close (&env, c);
}

/* ssdcache-writeback-max-age: with no watermark reached and no idle
 * cleaning, pages last written more than max_age ago are written back.
 */
static void
test_wb_max_age (void **state)
{
  const uint64_t size = 32 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  uint64_t start, deadline;

  cfg.wb.high_pct = 100;
  cfg.wb.low_pct = 100;
  cfg.wb.idle_ms = 0;
  cfg.wb.max_age_s = 1;
  c = tenv_open (&env, &cfg, size, 46);
  assert_int_equal (writeback_start (c, env.be), 0);
  start = cache_now_ms_for_tests ();
  for (int p = 0; p < 4; ++p)
    tenv_write (&env, c, (uint64_t) p * 3 * PS, PS, 600 + p);
  assert_int_equal (cache_dirty_pages (c), 4);
  deadline = start + 10000;
  while (cache_dirty_pages (c) > 0) {
    assert_true (cache_now_ms_for_tests () < deadline);
    usleep (20000);
  }
  /* Not before they were a second old. */
  assert_true (cache_now_ms_for_tests () - start >= 1000);
  backend_check (&env.rb, env.model, PS);
  writeback_stop (c);
  tenv_close (&env, c);
}

/* ssdcache-writeback-seq-cutoff: a sequential stream is cached up to
 * the cutoff and beyond it while writeback keeps up; past the cutoff
 * with dirty pages at the high watermark it goes around the cache, and
 * keeps going around after writeback caught up, until no write of a
 * stream has gone around for CACHE_SEQ_HOLD_MS.
 */
static void
test_wb_seq_around (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  uint64_t p = 0;
  int err = 0;

  cfg.wb.high_pct = 50;
  cfg.wb.seq_cutoff = 4 * PS;
  c = tenv_open (&env, &cfg, size, 47);
  /* Past the cutoff but writeback is not behind: cached. */
  for (; p < 8; ++p)
    tenv_write (&env, c, p * PS, PS, 700 + p);
  assert_int_equal (cache_dirty_pages (c), 8);
  assert_int_equal (ST (c, seq_write_bypassed), 0);
  /* 8 of 16 dirty: at the high watermark, the stream goes around. */
  for (; p < 10; ++p)
    tenv_write (&env, c, p * PS, PS, 700 + p);
  assert_int_equal (cache_dirty_pages (c), 8);
  assert_int_equal (ST (c, seq_write_bypassed), 2);
  /* Writeback caught up: the stream still goes around. */
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  assert_int_equal (cache_dirty_pages (c), 0);
  tenv_write (&env, c, p * PS, PS, 700 + p);
  ++p;
  assert_int_equal (cache_dirty_pages (c), 0);
  assert_int_equal (ST (c, seq_write_bypassed), 3);
  backend_check (&env.rb, env.model, PS);
  /* Page 20 is dirty (a write of no stream); when the stream gets
   * there it writes page 20 in the cache, not around it: around, the
   * dirty data would be written back and the backend flushed first.
   */
  tenv_write (&env, c, 20 * PS + 512, 1024, 650);
  assert_int_equal (cache_dirty_pages (c), 1);
  {
    const uint64_t flushes = env.t.flushes;
    const uint64_t around = ST (c, seq_write_bypassed);

    for (; p <= 21; ++p)
      tenv_write (&env, c, p * PS, PS, 700 + p);
    assert_int_equal (ST (c, seq_write_bypassed), around + (21 - 11));
    assert_int_equal (cache_dirty_pages (c), 1);
    assert_int_equal (ST (c, pages_written_back), 8);
    assert_int_equal (env.t.flushes, flushes);
  }
  tenv_read_all_check (&env, c, 8 * PS);
  tenv_writeback_check (&env, c);
  /* A pause longer than the hold: cached again. */
  usleep ((CACHE_SEQ_HOLD_MS + 200) * 1000);
  tenv_write (&env, c, p * PS, PS, 700 + p);
  ++p;
  assert_int_equal (cache_dirty_pages (c), 1);
  assert_int_equal (ST (c, seq_write_bypassed), 13);
  tenv_read_all_check (&env, c, 8 * PS);
  /* Cutoff 0: never around, even at the watermark. */
  cache_close (c);
  cfg.wb.seq_cutoff = 0;
  c = testfile_open_attach (&cfg, size);
  for (p = 0; p < 16; ++p)
    tenv_write (&env, c, p * PS, PS, 800 + p);
  assert_int_equal (ST (c, seq_write_bypassed), 0);
  tenv_read_all_check (&env, c, 8 * PS);
  tenv_close (&env, c);
}

/* A stream that goes around because of the hold (writeback is not
 * behind) does not wake writeback: nobody needs a slot, and every pass
 * costs a backend flush.  Dirty data below the watermarks stays.
 */
static void
test_wb_seq_around_quiet (void **state)
{
  const uint64_t size = 64 * PS;
  struct tenv env;
  struct cache_config cfg = fixture_writeback_config (16 * PS, PS);
  struct cache *c;
  uint64_t p = 0, back, flushes, around;
  int err = 0;

  cfg.wb.high_pct = 50;
  cfg.wb.seq_cutoff = 4 * PS;
  c = tenv_open (&env, &cfg, size, 48);
  assert_int_equal (writeback_start (c, env.be), 0);
  /* The stream reaches the watermark and goes around; drained. */
  for (; p < 10; ++p)
    tenv_write (&env, c, p * PS, PS, 900 + p);
  assert_true (ST (c, seq_write_bypassed) > 0);
  assert_int_equal (cache_writeback_all (c, env.be, &err), 0);
  /* (Those writes did wake it: let it see that and go back to sleep,
   * within the second the stream keeps going around.)
   */
  usleep (250 * 1000);
  /* One dirty page of no stream, then the stream goes on around. */
  tenv_write (&env, c, 40 * PS, 512, 950);
  back = ST (c, pages_written_back);
  flushes = env.t.flushes;
  around = ST (c, seq_write_bypassed);
  for (; p < 16; ++p)
    tenv_write (&env, c, p * PS, PS, 900 + p);
  assert_int_equal (ST (c, seq_write_bypassed), around + 6);
  usleep (400 * 1000);          /* four polls of the thread */
  assert_int_equal (cache_dirty_pages (c), 1);
  assert_int_equal (ST (c, pages_written_back), back);
  assert_int_equal (env.t.flushes, flushes);
  tenv_read_all_check (&env, c, 8 * PS);
  writeback_stop (c);
  tenv_writeback_check (&env, c);
  tenv_close (&env, c);
}

/* A pass looks for dirty pages a few slots per hold of c->lock (the
 * default is 16384: only a big cache has several chunks), while
 * writers move pages between slots.
 */
static void
test_wb_collect_chunks_tiny (void **state)
{
  cache_collect_chunk = 3;
  test_wb_threads_tiny_cache (state);
  cache_collect_chunk = 16384;
}

static void
test_wb_collect_chunks_backend (void **state)
{
  cache_collect_chunk = 3;
  test_wb_threads_flush_backend (state);
  cache_collect_chunk = 16384;
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    TESTFILE_TEST (test_wb_basics),
    TESTFILE_TEST (test_wb_subpage),
    TESTFILE_TEST (test_wb_bridge),
    TESTFILE_TEST (test_wb_cow_durable),
    TESTFILE_TEST (test_wb_inplace_not_durable),
    TESTFILE_TEST (test_wb_no_flush_in_place),
    TESTFILE_TEST (test_wb_full_no_thread),
    TESTFILE_TEST (test_wb_full_overwrite_durable_dirty),
    TESTFILE_TEST (test_wb_full_thread),
    TESTFILE_TEST (test_wb_flush_backend),
    TESTFILE_TEST (test_wb_flush_cache),
    TESTFILE_TEST (test_wb_zero_trim),
    TESTFILE_TEST (test_wb_backend_errors),
    TESTFILE_TEST (test_wb_parallel_depth),
    TESTFILE_TEST (test_order_closed_pass_depth),
    TESTFILE_TEST (test_wb_dirty_cap),
    TESTFILE_TEST (test_wb_max_age),
    TESTFILE_TEST (test_wb_seq_around),
    TESTFILE_TEST (test_wb_seq_around_quiet),
    TESTFILE_TEST (test_wb_threads_flush_cache),
    TESTFILE_TEST (test_wb_threads_flush_backend),
    TESTFILE_TEST (test_wb_flush_backend_hot),
    TESTFILE_TEST (test_wb_threads_tiny_cache),
    TESTFILE_TEST (test_wb_unsealed_sealed),
    TESTFILE_TEST (test_wb_entry_write_fails),
    TESTFILE_TEST (test_wb_hot_pages_left_alone),
    TESTFILE_TEST (test_wb_hot_window_rule),
    TESTFILE_TEST (test_wb_hot_window_grows),
    TESTFILE_TEST (test_wb_partial_maps_none),
    TESTFILE_TEST (test_wb_partial_maps_tiny),
    TESTFILE_TEST (test_wb_partial_maps_default),
    TESTFILE_TEST (test_wb_collect_chunks_tiny),
    TESTFILE_TEST (test_wb_collect_chunks_backend),
  };

  testfile_name = "test-writeback";
  testfile_watchdog_seconds = 400;
  return cmocka_run_group_tests (tests, NULL, NULL);
}

