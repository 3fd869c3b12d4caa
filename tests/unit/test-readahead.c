/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: readahead.
 *
 * The pure decisions (readahead.c): stream detection per connection,
 * the trigger, the ranges asked for (page aligned, never overlapping,
 * never past the end), fixed windows, the adaptive window growing while
 * prefetched pages are used and shrinking when they are wasted, within
 * its bounds, and random reads asking for (almost) nothing.
 *
 * The engine (prefetch.c with cache.c) over a RAM backend and a real
 * cache file: data stays right, a sequential read needs far fewer
 * backend requests, no page is ever read from the backend twice
 * (cached pages and ranges in flight are skipped), a long range is read
 * by several backend requests at once, and dirty data is never evicted
 * to make room for a prefetch.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "cache.h"
#include "fixture.h"
#include "prefetch.h"
#include "rambackend.h"
#include "readahead.h"
#include "stats.h"
#include "testfile.h"

#define K 1024u
#define M (1024u * 1024u)

static struct readahead *
ra_new (enum readahead_mode mode, uint64_t window, uint64_t max,
        uint64_t size)
{
  struct readahead_config cfg = {
    .mode = mode, .window = window, .min = 128 * K, .max = max,
    .page_size = 64 * K, .size = size,
  };
  struct readahead *ra = readahead_new (&cfg);
  assert_non_null (ra);
  return ra;
}

/*----------------------------------------------------------------------
 * Pure decisions.
 */

static void
test_off (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_OFF, 0, 8 * M, 1ull << 30);
  struct readahead_io io;

  for (uint64_t off = 0; off < 64 * M; off += 64 * K)
    assert_false (readahead_access (ra, off, 64 * K, 0, &io));
  readahead_free (ra);
}

/* Two reads that advance a stream are not enough; the third asks for
 * the first window, from the frontier on.
 */
static void
test_trigger (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_FIXED, 1 * M, 8 * M, 1ull << 30);
  struct readahead_io io;

  assert_false (readahead_access (ra, 0, 64 * K, 0, &io));      /* new */
  assert_false (readahead_access (ra, 64 * K, 64 * K, 0, &io)); /* seq 1 */
  assert_true (readahead_access (ra, 128 * K, 64 * K, 0, &io)); /* seq 2 */
  assert_int_equal (io.offset, 192 * K);
  assert_int_equal (io.len, 1 * M);
  assert_int_equal (io.window, 1 * M);
  readahead_free (ra);
}

/* A fixed window: the ranges tile the file without gaps or overlaps, are
 * page aligned, each at least half a window long (but the last), keep
 * the prefetched end within a window of the client, and stop at the end
 * of the backend.
 */
static void
test_fixed_tiling (void **state)
{
  const uint64_t size = 32 * M + 100 * K;   /* not a multiple of a page */
  struct readahead *ra = ra_new (READAHEAD_FIXED, 1 * M, 8 * M, size);
  struct readahead_io io;
  uint64_t expect_next = 0, nio = 0;

  for (uint64_t off = 0; off < size; off += 64 * K) {
    uint64_t len = size - off < 64 * K ? size - off : 64 * K;
    if (!readahead_access (ra, off, len, 0, &io))
      continue;
    nio++;
    if (expect_next == 0)
      expect_next = io.offset;
    assert_int_equal (io.offset, expect_next);        /* no gap/overlap */
    assert_int_equal (io.offset % (64 * K), 0);
    assert_true (io.offset + io.len <= size);
    assert_true ((io.offset + io.len) % (64 * K) == 0 ||
                 io.offset + io.len == size);
    assert_true (io.offset + io.len <= off + len + 1 * M + 64 * K);
    if (io.offset + io.len < size)
      assert_true (io.len >= 512 * K);
    expect_next = io.offset + io.len;
  }
  assert_int_equal (expect_next, size);               /* up to the end */
  /* About 2 ranges per MiB (each a bit more than half a window). */
  assert_in_range (nio, 32, 66);
  readahead_free (ra);
}

/* Simulate the engine: every page of an issued range becomes a
 * prefetched page; a read's "used" bytes are those of its pages that
 * were prefetched and not read before.
 */
struct sim {
  uint8_t *pf;                   /* per 64K page: 1 prefetched, unread */
  uint64_t npages;
};

static uint64_t
sim_read (struct sim *s, struct readahead *ra, uint64_t off, uint64_t len,
          uint64_t *issued_bytes)
{
  struct readahead_io io;
  uint64_t used = 0;

  for (uint64_t p = off / (64 * K); p < (off + len + 64 * K - 1) / (64 * K);
       p++)
    if (s->pf[p]) {
      s->pf[p] = 0;
      used += 64 * K;
    }
  if (readahead_access (ra, off, len, used, &io)) {
    for (uint64_t p = io.offset / (64 * K);
         p < (io.offset + io.len) / (64 * K); p++)
      s->pf[p] = 1;
    if (issued_bytes)
      *issued_bytes += io.len;
  }
  return used;
}

/* Adaptive: starts at the minimum, grows (times 4 while at most an
 * eighth of the maximum, then times 2) each time half a window's worth
 * of prefetched data was used, never above the maximum.
 */
static void
test_auto_grows (void **state)
{
  const uint64_t size = 256 * M;
  struct readahead *ra = ra_new (READAHEAD_AUTO, 0, 4 * M, size);
  struct sim s = { calloc (size / (64 * K), 1), size / (64 * K) };
  uint64_t w, prev = 0, seen_max = 0;
  struct readahead_stats st;

  assert_non_null (s.pf);
  assert_int_equal (readahead_start_window (ra), 128 * K);
  for (uint64_t off = 0; off < size; off += 64 * K) {
    sim_read (&s, ra, off, 64 * K, NULL);
    w = readahead_stream_window (ra, off + 64 * K);
    assert_true (w >= 128 * K && w <= 4 * M);
    assert_true (w >= prev);           /* nothing wasted: never shrinks */
    if (w > seen_max)
      seen_max = w;
    prev = w;
  }
  assert_int_equal (seen_max, 4 * M);
  readahead_get_stats (ra, &st);
  assert_int_equal (st.grows, 3);      /* 128K x4 512K x4 2M x2 4M */
  assert_int_equal (st.shrinks, 0);
  /* New streams of this connection now start bigger than the minimum. */
  assert_true (readahead_start_window (ra) > 128 * K);
  free (s.pf);
  readahead_free (ra);
}

/* Without use (the engine never reports prefetched pages read, e.g.
 * they were evicted first), the window does not grow.
 */
static void
test_auto_no_use_no_growth (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_AUTO, 0, 4 * M, 1ull << 30);
  struct readahead_io io;

  for (uint64_t off = 0; off < 64 * M; off += 64 * K)
    readahead_access (ra, off, 64 * K, 0, &io);
  assert_int_equal (readahead_stream_window (ra, 64 * M), 128 * K);
  readahead_free (ra);
}

/* Waste halves the windows of streams with data ahead, down to the
 * minimum, and the start window too; use then grows it again.
 */
static void
test_auto_shrinks (void **state)
{
  const uint64_t size = 256 * M;
  struct readahead *ra = ra_new (READAHEAD_AUTO, 0, 4 * M, size);
  struct sim s = { calloc (size / (64 * K), 1), size / (64 * K) };
  uint64_t off = 0, w;
  struct readahead_stats st;

  assert_non_null (s.pf);
  for (; off < 64 * M; off += 64 * K)
    sim_read (&s, ra, off, 64 * K, NULL);
  assert_int_equal (readahead_stream_window (ra, off), 4 * M);

  readahead_wasted (ra, 3);
  assert_int_equal (readahead_stream_window (ra, off), 2 * M);
  readahead_wasted (ra, 1);
  assert_int_equal (readahead_stream_window (ra, off), 1 * M);
  for (int i = 0; i < 10; i++)
    readahead_wasted (ra, 1);
  assert_int_equal (readahead_stream_window (ra, off), 128 * K);
  assert_int_equal (readahead_start_window (ra), 128 * K);
  readahead_get_stats (ra, &st);
  assert_int_equal (st.shrinks, 5);    /* 4M 2M 1M 512K 256K 128K */
  readahead_wasted (ra, 0);            /* nothing: no change */
  assert_int_equal (readahead_stream_window (ra, off), 128 * K);

  /* Used again: grows back. */
  for (; off < 128 * M; off += 64 * K)
    sim_read (&s, ra, off, 64 * K, NULL);
  w = readahead_stream_window (ra, off);
  assert_int_equal (w, 4 * M);
  free (s.pf);
  readahead_free (ra);
}

/* A fixed window ignores waste and use. */
static void
test_fixed_ignores_feedback (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_FIXED, 512 * K, 8 * M, 1ull << 30);
  struct readahead_io io;
  uint64_t off;

  for (off = 0; off < 8 * M; off += 64 * K)
    readahead_access (ra, off, 64 * K, 64 * K, &io);
  readahead_wasted (ra, 100);
  assert_int_equal (readahead_stream_window (ra, off), 512 * K);
  readahead_free (ra);
}

/* Several streams of one connection are told apart, each gets its own
 * ranges; two connections (objects) do not see each other's streams.
 */
static void
test_streams (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_FIXED, 1 * M, 8 * M, 1ull << 40);
  struct readahead *other = ra_new (READAHEAD_FIXED, 1 * M, 8 * M,
                                    1ull << 40);
  const uint64_t base[4] = { 0, 1ull << 30, 5ull << 30, 3ull << 30 };
  uint64_t got[4] = { 0 }, end[4] = { 0 };
  struct readahead_io io;

  for (uint64_t i = 0; i < 64; i++)
    for (unsigned k = 0; k < 4; k++) {
      uint64_t off = base[k] + i * 64 * K;
      if (readahead_access (ra, off, 64 * K, 0, &io)) {
        /* The range belongs to stream k and follows its previous one. */
        assert_true (io.offset >= base[k] && io.offset < base[k] + 64 * M);
        if (end[k])
          assert_int_equal (io.offset, end[k]);
        end[k] = io.offset + io.len;
        got[k]++;
      }
    }
  for (unsigned k = 0; k < 4; k++)
    assert_true (got[k] >= 4);

  /* The other connection has seen none of it: its first reads there are
   * the start of new streams.
   */
  assert_false (readahead_access (other, 64 * 64 * K, 64 * K, 0, &io));
  assert_false (readahead_access (other, 65 * 64 * K, 64 * K, 0, &io));
  assert_int_equal (readahead_stream_window (other, 66 * 64 * K), 1 * M);
  readahead_free (ra);
  readahead_free (other);
}

/* Re-reading the same block does not make a stream sequential. */
static void
test_reread (void **state)
{
  struct readahead *ra = ra_new (READAHEAD_FIXED, 1 * M, 8 * M, 1ull << 30);
  struct readahead_io io;

  for (int i = 0; i < 100; i++)
    assert_false (readahead_access (ra, 10 * M, 64 * K, 0, &io));
  readahead_free (ra);
}

/* Random reads over a large backend ask for (almost) nothing. */
static void
test_random (void **state)
{
  const uint64_t size = 4ull << 30;
  struct readahead *ra = ra_new (READAHEAD_AUTO, 0, 8 * M, size);
  struct readahead_io io;
  struct readahead_stats st;
  uint64_t x = 12345;

  for (int i = 0; i < 100000; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    readahead_access (ra, (x >> 20) % (size / 4096) * 4096, 4096, 0, &io);
  }
  readahead_get_stats (ra, &st);
  assert_true (st.issued <= 10);
  readahead_free (ra);
}

/* A stream that ends with prefetched data unread makes the next stream
 * start smaller (adaptive); a cancelled range is asked for again.
 */
static void
test_unread_and_cancel (void **state)
{
  const uint64_t size = 1ull << 34;
  struct readahead *ra = ra_new (READAHEAD_AUTO, 0, 4 * M, size);
  struct sim s = { calloc (64 * M / (64 * K), 1), 64 * M / (64 * K) };
  struct readahead_io io, again;
  struct readahead_stats st;
  uint64_t off, sw;

  assert_non_null (s.pf);
  for (off = 0; off < 32 * M; off += 64 * K)
    sim_read (&s, ra, off, 64 * K, NULL);
  sw = readahead_start_window (ra);
  assert_true (sw > 128 * K);
  /* 8 other streams push the first one out (LRU). */
  for (unsigned k = 1; k <= READAHEAD_STREAMS; k++)
    readahead_access (ra, (uint64_t) k << 30, 64 * K, 0, &io);
  readahead_get_stats (ra, &st);
  assert_true (st.unread_bytes > 0);
  assert_true (readahead_start_window (ra) < sw);

  /* Cancel: asked for again at the next read (from the new frontier:
   * the client has read the first block of it meanwhile).
   */
  off = 8ull << 30;
  readahead_access (ra, off, 64 * K, 0, &io);
  readahead_access (ra, off + 64 * K, 64 * K, 0, &io);
  assert_true (readahead_access (ra, off + 128 * K, 64 * K, 0, &io));
  assert_int_equal (io.offset, off + 192 * K);
  readahead_cancel (ra, &io);
  assert_true (readahead_access (ra, off + 192 * K, 64 * K, 0, &again));
  assert_int_equal (again.offset, off + 256 * K);
  /* Not cancelled: nothing more until half a window is used. */
  assert_false (readahead_access (ra, off + 256 * K, 64 * K, 0, &io));
  free (s.pf);
  readahead_free (ra);
}

/*----------------------------------------------------------------------
 * The engine: prefetch.c over cache.c, a RAM backend, a cache file.
 */

#define EPS 4096u                /* engine tests: 4K pages */

static struct cache *
engine_open (uint64_t cache_size, uint64_t backend_size,
             enum layout_mode mode, unsigned readahead_mode, uint64_t window,
             uint64_t max)
{
  struct cache_config cfg = mode == LAYOUT_MODE_WRITEBACK
    ? fixture_writeback_config (cache_size, EPS)
    : fixture_config (cache_size, EPS);

  /* What these tests are about: each chooses its readahead. */
  cfg.readahead_mode = readahead_mode;
  cfg.readahead_window = window;
  cfg.readahead_max = max;
  return testfile_open_attach (&cfg, backend_size);
}

static void
engine_read (struct cache *c, struct rambackend *rb, struct prefetch_conn *pc,
             uint64_t off, uint32_t len)
{
  uint8_t *buf = malloc (len), *exp = malloc (len);
  int err = 0;

  assert_non_null (buf);
  assert_non_null (exp);
  if (cache_read_conn (c, &rb->be, pc, buf, len, off, &err) != 0)
    fail_msg ("read at %llu failed: %d", (unsigned long long) off, err);
  rambackend_peek (rb, exp, len, off);
  assert_memory_equal (buf, exp, len);
  free (buf);
  free (exp);
}

/* The engine of an engine test with its prefetch thread running: c,
 * rb for the client and prb (the same data) for the prefetch thread,
 * and a client connection.
 */
struct ra_engine {
  struct rambackend rb, prb;
  struct cache *c;
  struct prefetch_conn *pc;
};

/* e over c (from engine_open), with backends of size bytes from seed. */
static void
ra_engine_start (struct ra_engine *e, struct cache *c, uint64_t size,
                 unsigned seed)
{
  rambackend_init (&e->rb, size, seed);
  rambackend_init (&e->prb, size, seed);
  e->c = c;
  assert_int_equal (prefetch_start (c, &e->prb.be), 0);
  e->pc = prefetch_conn_new (c);
  assert_non_null (e->pc);
}

static void
ra_engine_stop (struct ra_engine *e)
{
  prefetch_conn_free (e->pc);
  prefetch_stop (e->c);
  cache_close (e->c);
  rambackend_free (&e->rb);
  rambackend_free (&e->prb);
}

/* The client reads [start, end) sequentially, len bytes at a time, and
 * waits for each read's prefetch.
 */
static void
ra_engine_scan (struct ra_engine *e, uint64_t start, uint64_t end,
                uint32_t len)
{
  for (uint64_t off = start; off < end; off += len) {
    engine_read (e->c, &e->rb, e->pc, off, len);
    prefetch_drain (e->c);
  }
}

/* A sequential read with readahead on: right data, far fewer backend
 * requests than reads, each byte read from the backend once, and the
 * prefetched pages are the ones the client then reads.
 */
static void
test_engine_sequential (void **state)
{
  const uint64_t size = 8 * M;
  struct ra_engine e;

  /* The prefetch thread reads through its own backend: same data. */
  ra_engine_start (&e, engine_open (16 * M, size, LAYOUT_MODE_WRITETHROUGH,
                                    READAHEAD_AUTO, 0, 1 * M), size, 7);
  ra_engine_scan (&e, 0, size, 16 * K);
  /* The client itself read only the first few blocks. */
  assert_true (atomic_load (&e.rb.reads) <= 4);
  assert_true (atomic_load (&e.prb.reads) <= 40);
  assert_int_equal (atomic_load (&e.rb.bytes_read) +
                    atomic_load (&e.prb.bytes_read), size);
  assert_true (ST (e.c, prefetch_pages) >= size / EPS - 16);
  assert_int_equal (ST (e.c, prefetch_hits), ST (e.c, prefetch_pages));
  assert_int_equal (ST (e.c, prefetch_wasted), 0);
  ra_engine_stop (&e);
}

/* Pages already cached are never prefetched: half the file cached in
 * stripes first, then a sequential pass reads every byte from the
 * backend exactly once overall.
 */
static void
test_engine_skips_cached (void **state)
{
  const uint64_t size = 4 * M;
  struct ra_engine e;
  int err;

  ra_engine_start (&e, engine_open (16 * M, size, LAYOUT_MODE_WRITETHROUGH,
                                    READAHEAD_FIXED, 256 * K, 0), size, 9);
  for (uint64_t off = 0; off < size; off += 64 * K)
    assert_int_equal (cache_preload (e.c, &e.rb.be, 32 * K, off, &err), 0);
  rambackend_reset_counters (&e.rb);

  ra_engine_scan (&e, 0, size, 8 * K);
  assert_int_equal (atomic_load (&e.rb.bytes_read) +
                    atomic_load (&e.prb.bytes_read), size / 2);
  /* About one backend request per uncached stripe (a prefetch range
   * may cut a stripe in two).
   */
  assert_true (atomic_load (&e.prb.reads) <= 2 * size / (64 * K));
  ra_engine_stop (&e);
}

/* A cache full of dirty data (writeback): readahead stores nothing,
 * evicts nothing, the dirty data stays, reads are right.
 */
static void
test_engine_never_evicts_dirty (void **state)
{
  const uint64_t size = 8 * M, csize = 1 * M;
  struct ra_engine e;
  uint8_t *buf = malloc (csize), *got = malloc (csize);
  int err = 0;

  assert_non_null (buf);
  assert_non_null (got);
  ra_engine_start (&e, engine_open (csize, size, LAYOUT_MODE_WRITEBACK,
                                    READAHEAD_AUTO, 0, 256 * K), size, 11);
  memset (buf, 0x5a, csize);
  assert_int_equal (cache_write (e.c, &e.rb.be, buf, csize, 0, false, &err),
                    0);
  assert_int_equal (cache_dirty_pages (e.c), csize / EPS);

  ra_engine_scan (&e, csize, size, 16 * K);
  assert_int_equal (cache_dirty_pages (e.c), csize / EPS);
  assert_int_equal (ST (e.c, evictions), 0);
  assert_int_equal (ST (e.c, prefetch_pages), 0);
  /* The dirty data reads back. */
  assert_int_equal (cache_read (e.c, &e.rb.be, got, csize, 0, &err), 0);
  assert_memory_equal (got, buf, csize);
  cache_writeback_all (e.c, &e.rb.be, &err);
  ra_engine_stop (&e);
  free (buf);
  free (got);
}

/* A backend whose reads wait, each, until another is in flight too (or
 * until a 10 s guard, so that a serial prefetch fails instead of
 * hanging); once two were in flight together, reads no longer wait.
 */
struct gated {
  struct rambackend *rb;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  unsigned inflight, max_inflight;
  bool open;
};

static int
gated_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct gated *g = h;
  struct timespec until;

  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock (&g->lock);
  g->inflight++;
  if (g->inflight > g->max_inflight)
    g->max_inflight = g->inflight;
  if (g->inflight >= 2)
    g->open = true;
  pthread_cond_broadcast (&g->cond);
  while (!g->open &&
         pthread_cond_timedwait (&g->cond, &g->lock, &until) != ETIMEDOUT)
    ;
  g->open = true;               /* (after the guard: do not wait again) */
  pthread_mutex_unlock (&g->lock);
  int r = g->rb->be.pread (g->rb->be.h, buf, count, offset, err);
  pthread_mutex_lock (&g->lock);
  g->inflight--;
  pthread_mutex_unlock (&g->lock);
  return r;
}

/* A prefetch of several pieces has more than one backend read in
 * flight: the workers read a stream's range side by side.
 */
static void
test_engine_parallel (void **state)
{
  const uint64_t size = 16 * M;
  struct ra_engine e;
  struct gated g = { .lock = PTHREAD_MUTEX_INITIALIZER,
                     .cond = PTHREAD_COND_INITIALIZER };
  struct cache *c = engine_open (32 * M, size, LAYOUT_MODE_WRITETHROUGH,
                                 READAHEAD_FIXED, 8 * M, 0);

  rambackend_init (&e.rb, size, 5);
  rambackend_init (&e.prb, size, 5);
  g.rb = &e.prb;
  e.c = c;
  assert_int_equal (prefetch_start (c, &(struct cache_backend) {
                                      .h = &g, .pread = gated_pread,
                                      .pwrite = e.prb.be.pwrite }), 0);
  e.pc = prefetch_conn_new (c);
  assert_non_null (e.pc);
  ra_engine_scan (&e, 0, size, 64 * K);
  assert_true (g.max_inflight >= 2);
  assert_true (ST (c, prefetch_pages) > 0);
  ra_engine_stop (&e);
}

/* Readahead off: no state, nothing prefetched. */
static void
test_engine_off (void **state)
{
  struct rambackend rb;
  struct cache *c;

  rambackend_init (&rb, 1 * M, 3);
  c = engine_open (1 * M, 1 * M, LAYOUT_MODE_WRITETHROUGH, READAHEAD_OFF, 0,
                   0);
  assert_int_equal (prefetch_start (c, &rb.be), 0);
  assert_null (prefetch_conn_new (c));
  prefetch_stop (c);
  cache_close (c);
  rambackend_free (&rb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_off),
    cmocka_unit_test (test_trigger),
    cmocka_unit_test (test_fixed_tiling),
    cmocka_unit_test (test_auto_grows),
    cmocka_unit_test (test_auto_no_use_no_growth),
    cmocka_unit_test (test_auto_shrinks),
    cmocka_unit_test (test_fixed_ignores_feedback),
    cmocka_unit_test (test_streams),
    cmocka_unit_test (test_reread),
    cmocka_unit_test (test_random),
    cmocka_unit_test (test_unread_and_cancel),
    TESTFILE_TEST (test_engine_sequential),
    TESTFILE_TEST (test_engine_skips_cached),
    TESTFILE_TEST (test_engine_never_evicts_dirty),
    TESTFILE_TEST (test_engine_parallel),
    TESTFILE_TEST (test_engine_off),
  };

  testfile_name = "test-readahead";
  testfile_watchdog_seconds = 120;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
