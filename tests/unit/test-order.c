/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: ssdcache-writeback-order=flush.
 *
 * A random client (writes of any size and alignment, zeroes, flushes,
 * checked reads) runs against a writeback cache much smaller than the
 * disk, with the writeback thread running and a backend that sleeps a
 * little in every call.  The backend is watched by a checker: after
 * every backend write and flush it asks whether the backing store
 * alone, after a power cut at that moment (any unflushed backend
 * write kept or lost, sector by sector), would equal the export at
 * some client flush k, each sector possibly changed by a write the
 * client made between flush k and flush k + 1.  The flush order must
 * never fail that; the offset order (the check that the checker can
 * fail) does.  A third test kills the engine (fork, no close) in the
 * middle and checks the writeback that recovery resumes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
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
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "fixture.h"
#include "layout.h"
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"
#include "writeback.h"
#include "cache-int.h"             /* test_order_cap looks inside */
#include "log-stderr.h"

#define PS 4096u
#define SS 512u
#define NP 64u                          /* pages of the disk */
#define SIZE (NP * PS)
#define NSEC (SIZE / SS)
#define MAXF 4096                       /* client flushes a test makes */

/* A small set of sector hashes. */
struct vset {
  uint32_t *v;
  uint32_t n, cap;
};

static void
vset_add (struct vset *s, uint32_t h)
{
  for (uint32_t i = 0; i < s->n; i++)
    if (s->v[i] == h)
      return;
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 4;
    s->v = realloc (s->v, s->cap * sizeof *s->v);
    assert_non_null (s->v);
  }
  s->v[s->n++] = h;
}

static bool
vset_has (const struct vset *s, uint32_t h)
{
  for (uint32_t i = 0; i < s->n; i++)
    if (s->v[i] == h)
      return true;
  return false;
}

/* What the client did: the export at every flush (img[k], sector
 * hashes; img[0] the disk at the start) and the sector values written
 * between flush k - 1 and flush k (vals[k]; vals[nflush + 1] is open).
 */
struct history {
  pthread_mutex_t lock;
  uint8_t *model;                        /* the export now, bytes */
  uint32_t nflush;
  uint32_t (*img)[NSEC];
  struct vset (*vals)[NSEC];
};

/* The backend as the engine sees it: tbe plus the check. */
struct checker {
  struct tbe t;
  struct history *h;
  pthread_mutex_t lock;                  /* one backend call at a time */
  uint32_t durable[NSEC];                /* hashes at the last flush */
  struct vset pend[NSEC];                /* written since */
  uint64_t checks, violations;
  char first[256];                       /* the first violation */
  uint64_t writes, die_at;               /* the crash test: save the
                                            backend to die_path and die
                                            at backend write die_at */
  const char *die_path;
  struct cache_backend be;
};

static uint32_t
sector_hash (const uint8_t *p)
{
  return layout_crc32c (p, SS) ^ 0x9e3779b9u;
}

static void
history_init (struct history *h, struct rambackend *rb)
{
  memset (h, 0, sizeof *h);
  pthread_mutex_init (&h->lock, NULL);
  h->model = model_new (rb);
  h->img = calloc (MAXF + 2, sizeof *h->img);
  h->vals = calloc (MAXF + 2, sizeof *h->vals);
  assert_non_null (h->img);
  assert_non_null (h->vals);
  for (uint32_t x = 0; x < NSEC; x++)
    h->img[0][x] = sector_hash (h->model + (uint64_t) x * SS);
}

static void
history_free (struct history *h)
{
  for (uint32_t k = 0; k < MAXF + 2; k++)
    for (uint32_t x = 0; x < NSEC; x++)
      free (h->vals[k][x].v);
  free (h->vals);
  free (h->img);
  free (h->model);
}

/* The client changes [off, off+len) of the export to buf (before the
 * engine is asked: a backend write of it may come at once).
 */
static void
history_write (struct history *h, const uint8_t *buf, uint64_t off,
               uint32_t len)
{
  pthread_mutex_lock (&h->lock);
  memcpy (h->model + off, buf, len);
  for (uint64_t x = off / SS; x <= (off + len - 1) / SS; x++)
    vset_add (&h->vals[h->nflush + 1][x],
              sector_hash (h->model + x * SS));
  pthread_mutex_unlock (&h->lock);
}

/* The client flushes: what it wrote so far is flush point nflush + 1. */
static void
history_flush (struct history *h)
{
  pthread_mutex_lock (&h->lock);
  assert_true (h->nflush < MAXF);
  h->nflush++;
  for (uint32_t x = 0; x < NSEC; x++)
    h->img[h->nflush][x] = sector_hash (h->model + (uint64_t) x * SS);
  pthread_mutex_unlock (&h->lock);
}

/* Under both locks: may sector x hold hash v after a power cut, if the
 * backend matches flush point k?
 */
static bool
allowed (const struct history *h, uint32_t k, uint32_t x, uint32_t v)
{
  return h->img[k][x] == v || vset_has (&h->vals[k + 1][x], v);
}

/* Under ck->lock: is there a flush point the backend may be at? */
static void
check_now (struct checker *ck, const char *when)
{
  struct history *h = ck->h;

  if (ck->violations)
    return;                     /* one is enough */
  pthread_mutex_lock (&h->lock);
  ck->checks++;
  for (int64_t k = h->nflush; k >= 0; k--) {
    bool ok = true;
    for (uint32_t x = 0; ok && x < NSEC; x++) {
      ok = allowed (h, k, x, ck->durable[x]);
      for (uint32_t i = 0; ok && i < ck->pend[x].n; i++)
        ok = allowed (h, k, x, ck->pend[x].v[i]);
    }
    if (ok) {
      pthread_mutex_unlock (&h->lock);
      return;
    }
  }
  if (ck->violations++ == 0)
    snprintf (ck->first, sizeof ck->first,
              "after %s (check %llu, %u client flushes): the backend "
              "matches no flush point", when,
              (unsigned long long) ck->checks, h->nflush);
  pthread_mutex_unlock (&h->lock);
}

static int
ck_pread (void *hd, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct checker *ck = hd;

  return ck->t.be.pread (ck->t.be.h, buf, count, offset, err);
}

/* Under ck->lock: the backend as it is now is durable. */
static void
checker_durable (struct checker *ck)
{
  uint8_t sec[SS];

  for (uint32_t x = 0; x < NSEC; x++) {
    rambackend_peek (ck->t.rb, sec, SS, (uint64_t) x * SS);
    ck->durable[x] = sector_hash (sec);
    ck->pend[x].n = 0;
  }
}

/* A crash at this backend write (which never happens): the backend
 * as it is goes to ck->die_path, and the process ends without closing
 * the cache.  Holding ck->lock, so no other backend call gets in (and
 * so no page can be marked clean after a backend flush).
 */
static void
checker_die (struct checker *ck)
{
  uint8_t *img = malloc (SIZE);
  FILE *fp = fopen (ck->die_path, "w");

  if (img == NULL || fp == NULL)
    _exit (3);
  rambackend_peek (ck->t.rb, img, SIZE, 0);
  if (fwrite (img, 1, SIZE, fp) != SIZE || fclose (fp) != 0)
    _exit (3);
  _exit (ck->violations ? 4 : 0);
}

static int
ck_pwrite (void *hd, const void *buf, uint32_t count, uint64_t offset,
           bool fua, int *err)
{
  struct checker *ck = hd;
  uint8_t sec[SS];
  int r;

  pthread_mutex_lock (&ck->lock);
  r = ck->t.be.pwrite (ck->t.be.h, buf, count, offset, false, err);
  if (r == 0) {
    for (uint64_t x = offset / SS; x <= (offset + count - 1) / SS; x++) {
      rambackend_peek (ck->t.rb, sec, SS, x * SS);
      vset_add (&ck->pend[x], sector_hash (sec));
    }
    check_now (ck, "a backend write");
    if (fua)
      checker_durable (ck);
  }
  pthread_mutex_unlock (&ck->lock);
  return r;
}

static int
ck_flush (void *hd, int *err)
{
  struct checker *ck = hd;
  int r;

  pthread_mutex_lock (&ck->lock);
  r = ck->t.be.flush (ck->t.be.h, err);
  if (r == 0)
    checker_durable (ck);
  pthread_mutex_unlock (&ck->lock);
  return r;
}

static void
checker_init (struct checker *ck, struct rambackend *rb, struct history *h)
{
  memset (ck, 0, sizeof *ck);
  tbe_init (&ck->t, rb);
  ck->h = h;
  pthread_mutex_init (&ck->lock, NULL);
  checker_durable (ck);
  ck->be.h = ck;
  ck->be.pread = ck_pread;
  ck->be.pwrite = ck_pwrite;
  ck->be.flush = ck_flush;
}

static void
checker_free (struct checker *ck)
{
  for (uint32_t x = 0; x < NSEC; x++)
    free (ck->pend[x].v);
}

/* cache_zero_trim's backend operation: zeroes through the checker. */
static int
zero_op (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  struct checker *ck = opaque;
  uint8_t *z = calloc (1, count);
  int r;

  assert_non_null (z);
  r = ck_pwrite (ck, z, count, offset, false, err);
  free (z);
  return r;
}

/* Client operations touch [0, op_span) of the disk. */
static uint64_t op_span = SIZE;

/* One random client operation number i (from *rng): the history
 * learns of it first; with c NULL only the history (a replay).
 */
static void
client_op (struct cache *c, struct checker *ck, struct history *h,
           uint64_t *rng, unsigned i)
{
  uint64_t r = rnd64 (rng), off;
  uint32_t len;
  uint8_t *buf;
  int err = 0;

  off = rnd64 (rng) % op_span;
  len = 1 + rnd64 (rng) % (3 * PS);
  if (rnd64 (rng) % 2)
    off = off / SS * SS, len = (len + SS - 1) / SS * SS;
  if (off + len > op_span)
    len = op_span - off;
  switch (r % 20) {
  case 0: case 1: case 2:                 /* a flush */
    history_flush (h);
    if (c)
      assert_int_equal (cache_flush (c, &ck->be, &err), 0);
    break;
  case 3:                                 /* zeroes */
    buf = calloc (1, len);
    assert_non_null (buf);
    history_write (h, buf, off, len);
    if (c) {
      const struct cache_zero_op zop = { true, zero_op, ck };
      assert_int_equal (cache_zero_trim (c, &ck->be, &zop, len, off, false,
                                         &err), 0);
    }
    free (buf);
    break;
  case 4: case 5: case 6:                 /* a checked read */
    if (c)
      mread_check (c, &ck->be, h->model, off, len);
    break;
  default:                                /* a write */
    buf = malloc (len);
    assert_non_null (buf);
    fill_pattern (buf, len, i * 7919 + 13);
    history_write (h, buf, off, len);
    if (c)
      assert_int_equal (cache_write (c, &ck->be, buf, len, off, false,
                                     &err), 0);
    free (buf);
    break;
  }
}

/* The page table's counts of pending slots per generation (what the
 * flush order asks for the oldest of) match a scan of the slots.
 */
static void
pend_check (struct cache *c)
{
  bool ok;

  pthread_mutex_lock (&c->lock);
  ok = pagetable_pending_consistent (&c->pt) &&
    pagetable_oldest_pending (&c->pt) ==
    pagetable_scan_oldest_pending (&c->pt);
  pthread_mutex_unlock (&c->lock);
  assert_true (ok);
}

/* A writeback cache of slots pages over the 64-page disk, the thread
 * cleaning from 25% dirty, writes in flight four at a time.
 */
static struct cache_config
order_config (enum cache_wb_order order, uint32_t slots)
{
  struct cache_config cfg = fixture_writeback_config (slots * PS, PS);

  cfg.wb.order = order;
  cfg.wb.high_pct = 25;
  cfg.wb.low_pct = 10;
  cfg.wb.idle_ms = 20;
  cfg.wb.depth = 4;
  return cfg;
}

/* Run nops random operations (switching to writethrough before
 * operation switch_at, if not 0); returns the checker's violations.
 */
static uint64_t
run_model (enum cache_wb_order order, uint32_t slots, unsigned nops,
           uint64_t seed, bool expect_clean, unsigned switch_at)
{
  struct cache_config cfg = order_config (order, slots);
  struct rambackend rb;
  struct history h;
  struct checker *ck = malloc (sizeof *ck);
  struct cache *c;
  uint64_t rng = seed, v;
  int err = 0;

  assert_non_null (ck);
  rambackend_init (&rb, SIZE, 61);
  atomic_store (&rb.delay_max_us, 300);
  history_init (&h, &rb);
  checker_init (ck, &rb, &h);
  assert_int_equal (truncate (testfile_path, 0), 0);   /* a new cache */
  c = testfile_open_attach (&cfg, SIZE);
  assert_int_equal (writeback_start (c, &ck->be), 0);
  for (unsigned i = 0; i < nops; i++) {
    if (switch_at && i == switch_at) {
      /* A switch to writethrough (ssdcache ctl mode): the writes from
       * here on go to the backend while the dirty data drains.
       */
      cache_set_mode (c, LAYOUT_MODE_WRITETHROUGH);
      writeback_request_all (c, &err);
    }
    client_op (c, ck, &h, &rng, i);
    pend_check (c);
  }
  writeback_stop (c);
  assert_int_equal (cache_writeback_all (c, &ck->be, &err), 0);
  pend_check (c);
  backend_check (&rb, h.model, PS);
  if (order == CACHE_ORDER_FLUSH) {
    assert_true (ST (c, order_flush_point) > 0);
    assert_int_equal (ST (c, order_retained), 0);
  }
  if (expect_clean && ck->violations)
    fail_msg ("%llu of %llu checks failed; the first %s",
              (unsigned long long) ck->violations,
              (unsigned long long) ck->checks, ck->first);
  v = ck->violations;
  print_message ("%s order: %llu checks, %llu violations; cow %llu, "
                 "writer waits %llu, write-arounds %llu, flush point %llu, "
                 "%u slots\n",
                 order == CACHE_ORDER_FLUSH ? "flush" : "offset",
                 (unsigned long long) ck->checks, (unsigned long long) v,
                 (unsigned long long) ST (c, cow_copies),
                 (unsigned long long) ST (c, order_writer_waits),
                 (unsigned long long) ST (c, write_through_full),
                 (unsigned long long) ST (c, order_flush_point), slots);
  cache_close (c);
  checker_free (ck);
  free (ck);
  history_free (&h);
  rambackend_free (&rb);
  return v;
}

/* The flush order: the backend alone matches a flush point at every
 * moment, and the writes that had to wait for older generations are
 * counted.
 */
static void
test_order_flush_model (void **state)
{
  for (uint64_t seed = 1; seed <= 3; seed++) {
    run_model (CACHE_ORDER_FLUSH, 12, 1500, seed * 0x9e3779b97f4a7c15ULL,
               true, 0);
    run_model (CACHE_ORDER_FLUSH, 48, 1500, seed * 0x9e3779b97f4a7c15ULL,
               true, seed == 2 ? 750 : 0);
  }
}

/* The offset order breaks that rule (so the checker can fail). */
static void
test_order_offset_breaks (void **state)
{
  uint64_t v = 0;

  for (uint64_t seed = 1; seed <= 3 && v == 0; seed++)
    v += run_model (CACHE_ORDER_OFFSET, 48, 1500,
                    seed * 0x9e3779b97f4a7c15ULL, false, 0);
  assert_true (v > 0);
}

/* Kill and reopen: a child runs part of the random sequence and dies
 * without closing the cache (its backend saved to a file, as the
 * backend would be after a crash); the parent replays the sequence on
 * the history alone, reopens the cache (recovery keeps the older
 * versions the order needs) and writes everything back under the
 * checker.
 */
static void
crash_resume (uint64_t seed, uint64_t die_at)
{
  const unsigned nops = 700;
  struct cache_config cfg = order_config (CACHE_ORDER_FLUSH, 48);
  char bpath[4200];
  struct rambackend rb;
  struct history h;
  struct checker *ck = malloc (sizeof *ck);
  struct cache *c;
  uint64_t rng = seed;
  uint8_t *saved = malloc (SIZE), *got = malloc (SIZE);
  FILE *fp;
  pid_t pid;
  int err = 0;

  assert_non_null (ck);
  assert_non_null (saved);
  assert_non_null (got);
  snprintf (bpath, sizeof bpath, "%s.backend", testfile_path);
  assert_int_equal (truncate (testfile_path, 0), 0);   /* a new cache */
  pid = fixture_fork ();
  if (pid == 0) {
    rambackend_init (&rb, SIZE, 61);
    history_init (&h, &rb);
    checker_init (ck, &rb, &h);
    ck->die_at = die_at;
    ck->die_path = bpath;
    c = cache_open (&cfg);
    if (c == NULL || cache_attach (c, SIZE) != 0)
      _exit (1);
    if (writeback_start (c, &ck->be) != 0)
      _exit (2);
    for (unsigned i = 0; i < nops; i++)
      client_op (c, ck, &h, &rng, i);
    writeback_stop (c);          /* (die_at not reached) */
    pthread_mutex_lock (&ck->lock);
    checker_die (ck);
  }
  fixture_wait (pid);

  /* The parent: the backend as the child left it, the history replayed. */
  rambackend_init (&rb, SIZE, 61);
  history_init (&h, &rb);
  for (unsigned i = 0; i < nops; i++)
    client_op (NULL, NULL, &h, &rng, i);
  /* (The child died at a backend write; the ops after it were never
   * made, but the history may know them: a superset is harmless.)
   */
  fp = fopen (bpath, "r");
  assert_non_null (fp);
  assert_int_equal (fread (saved, 1, SIZE, fp), SIZE);
  fclose (fp);
  unlink (bpath);
  rambackend_poke (&rb, saved, SIZE, 0);
  checker_init (ck, &rb, &h);
  c = testfile_open_attach (&cfg, SIZE);
  pend_check (c);
  print_message ("recovered: %llu dirty pages, %llu older versions kept, "
                 "flush lag %llu\n",
                 (unsigned long long) ST (c, dirty_pages),
                 (unsigned long long) ST (c, order_retained),
                 (unsigned long long) ST (c, order_lag_flushes));
  /* What the restarted export serves must reach the backend, in order. */
  assert_int_equal (cache_read (c, &ck->be, got, SIZE, 0, &err), 0);
  assert_int_equal (cache_writeback_all (c, &ck->be, &err), 0);
  pend_check (c);
  backend_check (&rb, got, PS);
  if (ck->violations)
    fail_msg ("after recovery: %llu of %llu checks failed; the first %s",
              (unsigned long long) ck->violations,
              (unsigned long long) ck->checks, ck->first);
  cache_close (c);
  checker_free (ck);
  free (ck);
  free (saved);
  free (got);
  history_free (&h);
  rambackend_free (&rb);
}

static void
test_order_crash_resume (void **state)
{
  for (uint64_t k = 1; k <= 12; k++)
    crash_resume (0x1234567ULL * k, 20 + 37 * k);
}

/* ssdcache-writeback-max-dirty bounds what the backend lacks in the
 * flush order: dirty pages and the older versions kept for it, after
 * every operation (no writeback thread: only the writes that go around
 * the cache at the cap write generations back).
 */
static void
test_order_cap (void **state)
{
  struct cache_config cfg = order_config (CACHE_ORDER_FLUSH, 48);
  struct rambackend rb;
  struct history h;
  struct checker *ck = malloc (sizeof *ck);
  struct cache *c;
  uint64_t rng = 77, most = 0;
  int err = 0;

  assert_non_null (ck);
  op_span = 10 * PS;            /* rewrites of dirty pages: copies */
  cfg.wb.max_dirty_bytes = 6 * PS;
  cfg.wb.idle_ms = 0;
  rambackend_init (&rb, SIZE, 62);
  history_init (&h, &rb);
  checker_init (ck, &rb, &h);
  assert_int_equal (truncate (testfile_path, 0), 0);
  c = testfile_open_attach (&cfg, SIZE);
  for (unsigned i = 0; i < 1500; i++) {
    uint64_t behind;

    client_op (c, ck, &h, &rng, i);
    pthread_mutex_lock (&c->lock);
    behind = c->ndirty + c->nretained;
    pthread_mutex_unlock (&c->lock);
    if (behind > 6)
      fail_msg ("op %u: %llu pages behind the flush point, cap 6", i,
                (unsigned long long) behind);
    most = behind > most ? behind : most;
  }
  op_span = SIZE;
  assert_true (ST (c, dirty_cap_writes) > 0);
  assert_true (ST (c, cow_copies) > 0);
  assert_true (most == 6);
  assert_int_equal (cache_writeback_all (c, &ck->be, &err), 0);
  backend_check (&rb, h.model, PS);
  if (ck->violations)
    fail_msg ("%s", ck->first);
  cache_close (c);
  checker_free (ck);
  free (ck);
  history_free (&h);
  rambackend_free (&rb);
}

/* A writeback cache of 16 pages in the flush order, cleaned only when
 * asked, over env (a backend of SIZE bytes from seed).
 */
static struct cache *
order_open_quiet (struct tenv *env, unsigned seed)
{
  struct cache_config cfg = order_config (CACHE_ORDER_FLUSH, 16);

  cfg.wb.idle_ms = 0;
  cfg.wb.high_pct = 100;
  tenv_init (env, SIZE, seed);
  return testfile_open_attach (&cfg, SIZE);
}

/* A write that goes to the backend in the flush order after a switch
 * out of writeback.  It waits for generation 1, cleans its own page of
 * it, which was the last dirty one: the cache then no longer keeps the
 * order (cache_ordered), its passes no longer move c->gen_done on, and
 * the write waited for it for good (found by chaos.py).  It must end,
 * and the backend must have both writes.
 */
struct mode_write {
  struct cache *c;
  struct tbe *t;
  uint8_t *buf;
  int r, err;
  _Atomic bool done;
};

static void *
mode_write_run (void *arg)
{
  struct mode_write *w = arg;

  w->r = cache_write (w->c, &w->t->be, w->buf, PS, 0, false, &w->err);
  atomic_store (&w->done, true);
  return NULL;
}

static void
test_order_leave_writeback (void **state)
{
  struct tenv env;
  struct cache *c = order_open_quiet (&env, 63);
  uint8_t a[PS], b[PS], got[PS];
  struct mode_write w = { .buf = b };
  pthread_t th;
  int err = 0, i;

  fill_pattern (a, PS, 1);
  fill_pattern (b, PS, 2);
  assert_int_equal (cache_write (c, env.be, a, PS, 0, false, &err), 0);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  cache_set_mode (c, LAYOUT_MODE_WRITEAROUND);
  w.c = c;
  w.t = &env.t;
  assert_int_equal (pthread_create (&th, NULL, mode_write_run, &w), 0);
  for (i = 0; i < 30000 && !atomic_load (&w.done); i++)
    usleep (1000);
  if (!atomic_load (&w.done))
    fail_msg ("the write did not end in 30 s");
  pthread_join (th, NULL);
  assert_int_equal (w.r, 0);
  rambackend_peek (&env.rb, got, PS, 0);
  assert_memory_equal (got, b, PS);
  tenv_close (&env, c);
}

/* Counts of pending slots gone wrong (a phantom slot of generation 2):
 * writeback cannot move the flush point past it, until the flush
 * order's check finds that the oldest generation's count has stood
 * still for a second, scans, and counts again.
 */
static void
test_order_counts_repaired (void **state)
{
  struct tenv env;
  struct cache *c = order_open_quiet (&env, 65);
  uint8_t a[PS];
  int err = 0, i;

  fill_pattern (a, PS, 3);
  for (i = 0; i < 2; i++) {             /* generations 1 and 2 */
    assert_int_equal (cache_write (c, env.be, a, PS, i * PS, false, &err), 0);
    assert_int_equal (cache_flush (c, env.be, &err), 0);
  }
  pthread_mutex_lock (&c->lock);
  assert_true (c->pt.pend_on && c->pt.pend_len == 2);
  c->pt.pend[c->pt.pend_lo + 1].n++;    /* the phantom */
  pthread_mutex_unlock (&c->lock);
  log_errors_forget ();
  for (i = 0; i < 30000 && cache_writeback_all (c, env.be, &err) != 0; i++)
    usleep (1000);
  if (i == 30000)
    fail_msg ("writeback did not end in 30 s");
  assert_true (log_errors_contain ("counting again"));
  assert_int_equal (cache_dirty_pages (c), 0);
  pend_check (c);
  tenv_close (&env, c);
}

/* The flush order on a cache that turned degraded (found by chaos.py):
 * a write goes around the cache without waiting for older generations;
 * the older version of its page kept for generation 1 must not reach
 * the backend after it.
 */
static void
test_order_degraded_retained (void **state)
{
  struct tenv env;
  struct cache *c = order_open_quiet (&env, 64);
  struct clean_opts o = { .target = 0 };
  uint8_t v3[PS], got[PS];
  uint64_t kept;
  int err = 0;

  mwrite (c, env.be, NULL, 0, PS, 1);
  assert_int_equal (cache_flush (c, env.be, &err), 0);     /* generation 1 */
  mwrite (c, env.be, NULL, 0, PS, 2);
  assert_int_equal (cache_flush (c, env.be, &err), 0);
  pthread_mutex_lock (&c->lock);
  kept = c->nretained;                  /* v1, for generation 1 */
  pthread_mutex_unlock (&c->lock);
  assert_int_equal (kept, 1);
  cache_io_error (c, "test: the device fails", 0);
  assert_true (cache_degraded (c));
  fill_pattern (v3, PS, 3);
  assert_int_equal (cache_write (c, env.be, v3, PS, 0, false, &err), 0);
  clean_pass (c, env.be, &o, &err);      /* writeback goes on */
  rambackend_peek (&env.rb, got, PS, 0);
  assert_memory_equal (got, v3, PS);
  tenv_close (&env, c);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    TESTFILE_TEST (test_order_flush_model),
    TESTFILE_TEST (test_order_offset_breaks),
    TESTFILE_TEST (test_order_crash_resume),
    TESTFILE_TEST (test_order_cap),
    TESTFILE_TEST (test_order_leave_writeback),
    TESTFILE_TEST (test_order_degraded_retained),
    TESTFILE_TEST (test_order_counts_repaired),
  };

  if (getenv ("TEST_FILTER"))
    cmocka_set_test_filter (getenv ("TEST_FILTER"));
  testfile_name = "test-order";
  testfile_watchdog_seconds = 300;
  return cmocka_run_group_tests (tests, NULL, NULL);
}
