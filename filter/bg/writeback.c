/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the writeback engine.
 *
 * Owns struct writeback and its thread; see writeback.h for what each
 * lock protects.  A pass collects the dirty pages, sorts them by
 * backend offset, and for each group of adjacent pages (at most
 * WB_GROUP_BYTES) reads the dirty sectors from the cache and writes
 * them to the backend in as few requests as possible.  After all
 * groups, one backend flush; only then are the pages marked clean (a
 * page changed meanwhile keeps its dirty bits: its sequence number
 * tells).  Backend errors leave pages dirty, to be retried.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"
#include "writeback.h"

#define WB_GROUP_BYTES (4 * 1024 * 1024)
#define WB_POLL_MS 100
#define WB_RETRY_MS 1000
#define WB_HOT_MS 1000          /* a page changed this recently is hot */
#define WB_HOT_MAX_MS 32000     /* ... at most this (adaptive window) */
#define WB_SAMPLE 256           /* cleaned pages checked per window */
#define WB_SAMPLE_MIN 16        /* fewer tell nothing */

struct writeback {
  struct cache *c;
  struct cache_backend be;
  pthread_t thread;
  bool started;

  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  bool stop;
  uint64_t req_gen, done_gen;
  int done_err;

  atomic_bool kicked;
  pthread_mutex_t pass_lock;
  /* c->seq one to two hot windows ago, and the mark being aged; the
   * window's length (see writeback_hot_next).  Thread only.
   */
  uint64_t seen_seq, mark_seq, mark_ms, hot_ms;
  /* Pages cleaned above the high watermark (not on demand) in the
   * current window [cur] and the one before, up to WB_SAMPLE each.
   * Written by pass () from the thread only.
   */
  uint64_t sample[2][WB_SAMPLE];
  size_t nsample[2];
  int cur;
};

struct wb_page {
  uint64_t page;
  uint32_t slot;
  uint64_t seq;
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
  bool unsealed;
  uint32_t crc;                  /* if unsealed: of the data written back */
};

static int
cmp_u64 (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

static void
sleep_ms (uint64_t ms)
{
  struct timespec ts = { .tv_sec = ms / 1000,
                         .tv_nsec = (ms % 1000) * 1000000 };
  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

/* Dirty pages now, sorted, but for "hot" ones: changed after sequence
 * number hot_after (UINT64_MAX: none is hot), counted in *nhot.
 * Returns the count, or -1.
 */
static int64_t
collect_dirty (struct cache *c, uint64_t **pages_out, uint64_t hot_after,
               uint64_t *nhot)
{
  uint64_t *pages, n = 0;

  pthread_mutex_lock (&c->lock);
  pages = malloc ((c->ndirty ? c->ndirty : 1) * sizeof *pages);
  if (pages == NULL) {
    pthread_mutex_unlock (&c->lock);
    return -1;
  }
  *nhot = 0;
  for (uint32_t s = 0; s < c->nslots && n + *nhot < c->ndirty; s++) {
    uint16_t flags = pt_flags (&c->pt, s);
    if (pt_state (&c->pt, s) == LAYOUT_DIRTY && (flags & PT_INDEXED) &&
        !(flags & PT_BAD)) {
      if (pt_seq (&c->pt, s) > hot_after)
        (*nhot)++;
      else
        pages[n++] = pt_page (&c->pt, s);
    }
  }
  pthread_mutex_unlock (&c->lock);
  qsort (pages, n, sizeof *pages, cmp_u64);
  *pages_out = pages;
  return n;
}

/* Write [lo, hi) (clipped to the backend size) from the group buffer. */
static int
emit (struct cache *c, const struct cache_backend *be, const uint8_t *buf,
      uint64_t base, uint64_t lo, uint64_t hi, uint64_t *bytes, int *err)
{
  if (hi > c->backend_size)
    hi = c->backend_size;
  if (hi <= lo)
    return 0;
  if (be->pwrite (be->h, buf + (lo - base), hi - lo, lo, false, err) == -1)
    return -1;
  *bytes += hi - lo;
  return 0;
}

/* Write the dirty sectors of one group of adjacent pages g[0..ng),
 * whose data is in buf (page k at k * page_size).  Dirty sectors are
 * written in few requests: runs that touch are one request, and so are
 * runs with at most WB_BRIDGE_MAX bytes of valid clean sectors between
 * them (the backend has those bytes already, so writing them again
 * changes nothing, and a slow backend pays per request: 16 KiB take
 * 0.3 ms at 50 MiB/s, less than one 1 ms round trip).  An invalid
 * sector (not cached) ends a request.
 */
#define WB_BRIDGE_MAX (16 * 1024)

static int
write_group (struct cache *c, const struct cache_backend *be,
             const struct wb_page *g, size_t ng, const uint8_t *buf,
             uint64_t *bytes, int *err)
{
  const uint32_t ps = c->page_size, ss = c->sector_size;
  const uint64_t base = g[0].page * ps;
  uint64_t lo = 0, hi = 0;      /* the request: [lo, hi) ends dirty */
  uint64_t reach = 0;           /* it may grow to a dirty sector here */
  bool in_run = false;

  for (size_t k = 0; k < ng; k++) {
    for (unsigned i = 0; i < c->nsectors; i++) {
      bool have = g[k].slot != PT_NONE;
      bool d = have && layout_bit_test (g[k].dirty, i);
      bool v = have && layout_bit_test (g[k].valid, i);
      uint64_t off = g[k].page * ps + (uint64_t) i * ss;

      if (!d) {
        if (in_run && v && reach == off &&
            reach + ss - hi <= WB_BRIDGE_MAX)
          reach = off + ss;     /* clean, cached: may be bridged */
        continue;
      }
      if (in_run && reach == off) {
        hi = reach = off + ss;
        continue;
      }
      if (in_run && emit (c, be, buf, base, lo, hi, bytes, err) == -1)
        return -1;
      in_run = true;
      lo = off;
      hi = reach = off + ss;
    }
  }
  if (in_run && emit (c, be, buf, base, lo, hi, bytes, err) == -1)
    return -1;
  return 0;
}

/* writeback_pass, skipping pages changed after sequence number
 * hot_after: returns 2 if every dirty page was hot (nothing done).
 * Pages cleaned with hot_after set (background cleaning above the high
 * watermark, from the thread) go into the window's sample.
 */
static int
pass (struct cache *c, const struct cache_backend *be, uint64_t target,
      bool limited, uint64_t hot_after, int *err)
{
  const uint32_t ps = c->page_size;
  const size_t max_group = WB_GROUP_BYTES / ps ? WB_GROUP_BYTES / ps : 1;
  struct writeback *wb = c->wb;
  uint64_t *pages = NULL;
  int64_t n;
  uint64_t nhot;
  struct wb_page *done = NULL;
  size_t ndone = 0;
  uint8_t *buf = NULL;
  bool failed = false, skipped = false;
  uint64_t bytes = 0, start_ms = cache_now_ms ();
  int ret = -1;

  if (wb)
    pthread_mutex_lock (&wb->pass_lock);
  n = collect_dirty (c, &pages, hot_after, &nhot);
  if (n == -1) {
    *err = ENOMEM;
    goto out;
  }
  if (n == 0 && nhot > 0) {
    ret = 2;
    goto out;
  }
  /* Hot pages stay dirty, so fewer of the others may remain (0: all
   * of them go).
   */
  if (target > 0)
    target = target > nhot ? target - nhot : 0;
  done = malloc ((n ? n : 1) * sizeof *done);
  buf = malloc (max_group * ps);
  if (done == NULL || buf == NULL) {
    *err = ENOMEM;
    goto out;
  }

  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    size_t ng;
    struct wb_page *g = done + ndone;

    if (target > 0 && (uint64_t) (n - i) <= target)
      break;
    while (j + 1 < n && pages[j + 1] == pages[j] + 1 &&
           (size_t) (j + 1 - i) < max_group)
      j++;
    if (rangelock_try_acquire (&c->ranges, pages[i], pages[j]) == -1) {
      /* A client holds some of these pages (it may be waiting for us
       * to make room): go page by page around it.
       */
      j = i;
      if (rangelock_try_acquire (&c->ranges, pages[i], pages[i]) == -1) {
        skipped = true;         /* this one later */
        i++;
        continue;
      }
    }
    ng = j - i + 1;
    for (size_t k = 0; k < ng; k++) {
      uint32_t s = cache_lookup_pin (c, pages[i + k]);
      g[k].page = pages[i + k];
      g[k].slot = PT_NONE;
      if (s == PT_NONE)
        continue;
      pthread_mutex_lock (&c->lock);
      bool dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY &&
        !(pt_flags (&c->pt, s) & PT_BAD);
      pthread_mutex_unlock (&c->lock);
      if (!dirty) {
        cache_unpin (c, s);
        continue;
      }
      if (cache_read_verified (c, be, s, buf + k * ps) == -1)
        continue;               /* marked bad, pin consumed */
      pthread_mutex_lock (&c->lock);
      g[k].slot = s;
      g[k].seq = pt_seq (&c->pt, s);
      pt_maps_get (&c->pt, s, g[k].valid, g[k].dirty);
      g[k].unsealed = pt_flags (&c->pt, s) & PT_UNSEALED;
      pthread_mutex_unlock (&c->lock);
      /* Marking it clean will seal it: its checksum, from this data. */
      if (g[k].unsealed)
        g[k].crc = cache_page_crc (c, buf + k * ps, g[k].valid);
    }
    if (write_group (c, be, g, ng, buf, &bytes, err) == -1) {
      rangelock_release (&c->ranges, pages[i], pages[j]);
      for (size_t k = 0; k < ng; k++)
        if (g[k].slot != PT_NONE)
          cache_unpin (c, g[k].slot);
      STATS_ADD (&c->stats, writeback_errors, 1);
      log_error ("writeback of pages %llu-%llu failed: %s; they stay "
                 "dirty and will be retried",
                 (unsigned long long) pages[i],
                 (unsigned long long) pages[j], strerror (*err));
      failed = true;
      break;
    }
    rangelock_release (&c->ranges, pages[i], pages[j]);
    ndone += ng;
    i = j + 1;

    /* Rate limit: stay at or under wbcfg.rate bytes per second. */
    if (limited && c->wbcfg.rate) {
      uint64_t want_ms = bytes * 1000 / c->wbcfg.rate;
      uint64_t took = cache_now_ms () - start_ms;
      if (want_ms > took)
        sleep_ms (want_ms - took);
    }
  }

  /* The backend must have it durably before the cache forgets it. */
  if (ndone > 0 && !failed && be->flush && be->flush (be->h, err) == -1) {
    STATS_ADD (&c->stats, writeback_errors, 1);
    log_error ("writeback: backend flush failed: %s; pages stay dirty",
               strerror (*err));
    failed = true;
  }
  for (size_t k = 0; k < ndone; k++) {
    struct wb_page *p = &done[k];
    struct pt_slot upd;
    bool same;

    if (p->slot == PT_NONE)
      continue;
    if (failed) {
      cache_unpin (c, p->slot);
      continue;
    }
    if (rangelock_try_acquire (&c->ranges, p->page, p->page) == -1) {
      /* A client is changing it (maybe waiting for us to make room):
       * leave it dirty, it will be written again.
       */
      cache_unpin (c, p->slot);
      continue;
    }
    pthread_mutex_lock (&c->lock);
    pagetable_get (&c->pt, p->slot, &upd);
    same = pagetable_lookup (&c->pt, p->page) == p->slot &&
      upd.seq == p->seq;
    pthread_mutex_unlock (&c->lock);
    if (same) {
      for (unsigned b = 0; b < sizeof upd.dirty; b++)
        upd.dirty[b] &= ~p->dirty[b];
      if (p->unsealed) {
        upd.data_crc = p->crc;
        upd.flags &= ~PT_UNSEALED;
      }
      upd.state = layout_map_empty (upd.dirty) ? LAYOUT_CLEAN : LAYOUT_DIRTY;
      if (cache_commit_entry (c, p->slot, &upd) == -1) {
        cache_io_error (c, "writing entry", p->slot);
        cache_stale_add (c, p->slot, p->page, true);
      }
      STATS_ADD (&c->stats, pages_written_back, 1);
      if (wb && hot_after != UINT64_MAX &&
          wb->nsample[wb->cur] < WB_SAMPLE)
        wb->sample[wb->cur][wb->nsample[wb->cur]++] = p->page;
    }
    rangelock_release (&c->ranges, p->page, p->page);
    cache_unpin (c, p->slot);
  }
  if (ndone > 0 && !failed) {
    int e;
    STATS_ADD (&c->stats, bytes_written_back, bytes);
    cache_sync_device (c, &e);
  }
  ret = failed ? -1 : skipped ? 1 : 0;

 out:
  if (wb)
    pthread_mutex_unlock (&wb->pass_lock);
  free (pages);
  free (done);
  free (buf);
  return ret;
}

int
writeback_pass (struct cache *c, const struct cache_backend *be,
                uint64_t target, bool limited, int *err)
{
  return pass (c, be, target, limited, UINT64_MAX, err);
}

int
writeback_page_locked (struct cache *c, const struct cache_backend *be,
                       uint64_t page, uint32_t s, int *err)
{
  uint8_t *buf = malloc (c->page_size);
  struct wb_page g = { .page = page, .slot = s };
  struct pt_slot upd;
  uint64_t bytes = 0;

  if (buf == NULL) {
    *err = ENOMEM;
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  pt_pin (&c->pt, s);           /* read_verified consumes one on error */
  pthread_mutex_unlock (&c->lock);
  if (cache_read_verified (c, be, s, buf) == -1) {
    free (buf);
    *err = EIO;
    return -1;
  }
  cache_unpin (c, s);
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &upd);
  pthread_mutex_unlock (&c->lock);
  memcpy (g.valid, upd.valid, sizeof g.valid);
  memcpy (g.dirty, upd.dirty, sizeof g.dirty);
  if (upd.flags & PT_UNSEALED) {
    upd.data_crc = cache_page_crc (c, buf, upd.valid);
    upd.flags &= ~PT_UNSEALED;
  }

  if (write_group (c, be, &g, 1, buf, &bytes, err) == -1 ||
      (be->flush && be->flush (be->h, err) == -1)) {
    STATS_ADD (&c->stats, writeback_errors, 1);
    free (buf);
    return -1;
  }
  free (buf);
  memset (upd.dirty, 0, sizeof upd.dirty);
  upd.state = LAYOUT_CLEAN;
  if (cache_commit_entry (c, s, &upd) == -1) {
    /* The page is clean in RAM and the backend has it; only the cache
     * file could not be told.  On a failing device that is expected.
     */
    cache_io_error (c, "writing entry", s);
    cache_stale_add (c, s, page, true);
    if (!cache_degraded (c)) {
      *err = EIO;
      return -1;
    }
  }
  STATS_ADD (&c->stats, pages_written_back, 1);
  STATS_ADD (&c->stats, bytes_written_back, bytes);
  return 0;
}

/* The hot window: above the high watermark, background cleaning skips
 * pages changed in the last one to two windows.  One second suits a
 * workload with a hot set and cold pages; but where writes spread over
 * every dirty page (random rewrites of a disk that fits in the cache),
 * no page stays cold that long, the pages cleaned are dirty again a
 * moment later, and every clean costs a backend write, a cache read
 * and an entry write that take CPU and bandwidth from the clients for
 * nothing.  So the window follows what cleaning achieves: sampled of
 * the pages cleaned in the window before the last, redirtied were
 * dirty again by the end of the last one.  At least half: cleaning was
 * wasted, the window grows fourfold (at most WB_HOT_MAX_MS); under a
 * quarter: it halves (at least WB_HOT_MS).  A writer waiting for a slot
 * sets it back to WB_HOT_MS (writeback_thread).  Pure.
 */
uint64_t
writeback_hot_next (uint64_t hot_ms, size_t sampled, size_t redirtied)
{
  if (sampled < WB_SAMPLE_MIN)
    return hot_ms;
  if (redirtied * 2 >= sampled)
    return hot_ms * 4 < WB_HOT_MAX_MS ? hot_ms * 4 : WB_HOT_MAX_MS;
  if (redirtied * 4 < sampled)
    return hot_ms / 2 > WB_HOT_MS ? hot_ms / 2 : WB_HOT_MS;
  return hot_ms;
}

/* Set the hot window's length, and the counter that shows it. */
static void
hot_set (struct writeback *wb, uint64_t ms)
{
  wb->hot_ms = ms;
  atomic_store_explicit (&wb->c->stats.writeback_hot_ms, ms,
                         memory_order_relaxed);
}

/* End of a hot window: judge the sample of the window before, start a
 * new one.
 */
static void
hot_window_end (struct writeback *wb)
{
  const int prev = !wb->cur;
  size_t redirtied = 0;
  uint64_t next;

  for (size_t k = 0; k < wb->nsample[prev]; k++)
    redirtied += cache_page_dirty (wb->c, wb->sample[prev][k]);
  next = writeback_hot_next (wb->hot_ms, wb->nsample[prev], redirtied);
  if (next != wb->hot_ms && ssdcache_debug_verbose)
    log_debug ("writeback: %zu of %zu pages cleaned were rewritten: "
               "pages changed in the last %llu ms are hot",
               redirtied, wb->nsample[prev], (unsigned long long) next);
  hot_set (wb, next);
  wb->nsample[prev] = 0;
  wb->cur = prev;
}

static void *
writeback_thread (void *arg)
{
  struct writeback *wb = arg;
  struct cache *c = wb->c;
  const uint64_t high = (uint64_t) c->nslots * c->wbcfg.high_pct / 100;
  const uint64_t low = (uint64_t) c->nslots * c->wbcfg.low_pct / 100;

  for (;;) {
    uint64_t gen, target, ndirty, idle_for, hot_after = UINT64_MAX, seq;
    bool full, run, kicked;
    int r, err = 0;

    /* "Hot" pages, skipped by cleaning above the high watermark: those
     * changed in the last one to two WB_HOT_MS.  Writing them back is
     * wasted (they change again before they can be marked clean) and
     * steals the clients' bandwidth; nobody needs their slots yet (a
     * writer waiting for a slot kicks us, and then every page goes).
     */
    pthread_mutex_lock (&c->lock);
    seq = c->seq;
    pthread_mutex_unlock (&c->lock);
    if (cache_now_ms () - wb->mark_ms >= wb->hot_ms) {
      hot_window_end (wb);
      wb->seen_seq = wb->mark_seq;
      wb->mark_seq = seq;
      wb->mark_ms = cache_now_ms ();
    }

    pthread_mutex_lock (&wb->lock);
    if (wb->stop) {
      pthread_mutex_unlock (&wb->lock);
      break;
    }
    gen = wb->req_gen;
    full = gen > wb->done_gen;
    pthread_mutex_unlock (&wb->lock);

    ndirty = cache_dirty_pages (c);
    kicked = atomic_exchange (&wb->kicked, false);
    if (kicked && wb->hot_ms != WB_HOT_MS) {
      /* Slots are wanted: cleaning is worth it again. */
      hot_set (wb, WB_HOT_MS);
      wb->nsample[0] = wb->nsample[1] = 0;
    }
    idle_for = cache_now_ms () - atomic_load (&c->last_io_ms);
    run = true;
    if (full)
      target = 0;
    else if (ndirty > high && !kicked) {
      target = low;
      hot_after = wb->seen_seq;
    }
    else if (ndirty > high)
      target = low;
    else if (kicked && ndirty > 0)
      target = ndirty / 2 < low ? ndirty / 2 : low;
    else if (c->wbcfg.idle_ms && idle_for >= c->wbcfg.idle_ms && ndirty > 0)
      target = 0;
    else
      run = false;

    if (run) {
      if (ssdcache_debug_verbose)
        log_debug ("writeback: %llu dirty, target %llu%s",
                   (unsigned long long) ndirty, (unsigned long long) target,
                   full ? " (flush)" : "");
      r = pass (c, &wb->be, target, !full, hot_after, &err);
      if (r == 2) {
        if (ssdcache_debug_verbose)
          log_debug ("writeback: every dirty page is being rewritten: "
                     "waiting");
        goto wait;
      }
      pthread_mutex_lock (&wb->lock);
      if (full && r != 1) {
        wb->done_gen = gen;
        wb->done_err = r == -1 ? (err ? err : EIO) : 0;
        pthread_cond_broadcast (&wb->done);
      }
      pthread_mutex_unlock (&wb->lock);
      if (r == 1)
        sleep_ms (1);           /* busy pages: let the clients go on */
      else if (r == -1)
        sleep_ms (WB_RETRY_MS); /* backend trouble: back off */
      continue;
    }

  wait:
    /* Nothing to do: sleep until woken or the next poll. */
    pthread_mutex_lock (&wb->lock);
    if (!wb->stop && wb->req_gen == wb->done_gen) {
      struct timespec ts;
      clock_gettime (CLOCK_REALTIME, &ts);
      ts.tv_nsec += WB_POLL_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait (&wb->wake, &wb->lock, &ts);
    }
    pthread_mutex_unlock (&wb->lock);
  }
  return NULL;
}

int
writeback_start (struct cache *c, const struct cache_backend *be)
{
  struct writeback *wb = calloc (1, sizeof *wb);
  int r;

  if (wb == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  wb->c = c;
  wb->be = *be;
  hot_set (wb, WB_HOT_MS);
  pthread_mutex_init (&wb->lock, NULL);
  pthread_mutex_init (&wb->pass_lock, NULL);
  pthread_cond_init (&wb->wake, NULL);
  pthread_cond_init (&wb->done, NULL);
  atomic_init (&wb->kicked, false);
  c->wb = wb;
  r = pthread_create (&wb->thread, NULL, writeback_thread, wb);
  if (r != 0) {
    errno = r;
    log_error ("cannot start the writeback thread: %m");
    c->wb = NULL;
    hot_set (wb, 0);
    free (wb);
    return -1;
  }
  wb->started = true;
  return 0;
}

void
writeback_stop (struct cache *c)
{
  struct writeback *wb = c->wb;

  if (wb == NULL)
    return;
  pthread_mutex_lock (&wb->lock);
  wb->stop = true;
  pthread_cond_broadcast (&wb->wake);
  pthread_cond_broadcast (&wb->done);
  pthread_mutex_unlock (&wb->lock);
  if (wb->started)
    pthread_join (wb->thread, NULL);
  c->wb = NULL;
  hot_set (wb, 0);
  pthread_mutex_destroy (&wb->lock);
  pthread_mutex_destroy (&wb->pass_lock);
  pthread_cond_destroy (&wb->wake);
  pthread_cond_destroy (&wb->done);
  free (wb);
}

void
writeback_kick (struct cache *c)
{
  struct writeback *wb = c->wb;

  if (wb) {
    atomic_store (&wb->kicked, true);
    pthread_cond_signal (&wb->wake);
  }
}

int
writeback_request_all (struct cache *c, int *err)
{
  struct writeback *wb = c->wb;
  uint64_t mine;
  int r;

  pthread_mutex_lock (&wb->lock);
  mine = ++wb->req_gen;
  pthread_cond_signal (&wb->wake);
  while (wb->done_gen < mine && !wb->stop)
    pthread_cond_wait (&wb->done, &wb->lock);
  r = wb->done_gen >= mine ? wb->done_err : ESHUTDOWN;
  pthread_mutex_unlock (&wb->lock);
  if (r) {
    *err = r;
    return -1;
  }
  return 0;
}
