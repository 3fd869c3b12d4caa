/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: writing dirty data back to the backend.
 *
 * Owns a cleaning pass: collect the dirty pages, sort them by backend
 * offset, and for each group of adjacent pages (at most
 * CLEAN_GROUP_BYTES / ssdcache-writeback-depth) read the dirty sectors
 * from the cache and write them to the backend in as few requests as
 * possible, up to depth groups at once, taken in offset order.  After
 * all groups, one backend flush; only then are the pages marked clean
 * (a page changed meanwhile keeps its dirty bits: its sequence number
 * tells).  A group the backend fails stays dirty and only its run
 * waits (core/backoff.h) while the rest of the pass goes on.  The
 * writeback thread (bg/writeback.c) decides when and how much; a
 * writer that needs a slot cleans one page itself (clean_page_held),
 * and one that goes around the cache the dirty pages of its range
 * (clean_pages_held: one backend flush for up to CLEAN_GROUP_BYTES).
 *
 * Locking: c->clean_lock makes passes run one at a time (held across
 * the pass's I/O; only passes take it); a pass's workers share its
 * state under ps->lock.  Pages are range locked without
 * waiting (busy pages are retried later) while their dirty data is read
 * and written, and again while their entries are marked clean.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "cache-int.h"
#include "log.h"

#define CLEAN_GROUP_BYTES (4 * 1024 * 1024)

/* A page of a group being written back. */
struct clean_page {
  uint64_t page;
  uint32_t slot;                 /* PT_NONE: nothing to write */
  uint64_t seq;
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
  uint32_t crc;                  /* of the data written back */
};

static int
cmp_u64 (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

/* Slots scanned per hold of c->lock (tests make it small). */
unsigned cache_collect_chunk = 16384;

/* What collect_dirty gathers. */
struct collect {
  uint64_t *pages, n, cap;
  uint64_t hot_after, gen_max, now, nhot, skipped;
  bool all;
};

/* Under c->lock: scan slots [first, first + cache_collect_chunk) into k;
 * returns false once every dirty page is counted or k is full.
 */
static bool
collect_chunk_locked (struct cache *c, struct collect *k, uint32_t first)
{
  uint32_t end = c->nslots - first < cache_collect_chunk ? c->nslots
    : first + cache_collect_chunk;

  for (uint32_t s = first; s < end; s++) {
    uint16_t flags = pt_flags (&c->pt, s);
    if (k->n + k->nhot + k->skipped >= c->ndirty || k->n == k->cap)
      return false;
    if (pt_state (&c->pt, s) != LAYOUT_DIRTY || !(flags & PT_INDEXED) ||
        (flags & PT_BAD))
      continue;
    if (pt_gen (&c->pt, s) > k->gen_max)
      k->skipped++;             /* a later flush generation: not now */
    else if (pt_seq (&c->pt, s) > k->hot_after ||
             (!k->all && c->backoff.n > 0 &&
              backoff_waits (&c->backoff, pt_page (&c->pt, s), k->now)))
      k->nhot++;
    else
      k->pages[k->n++] = pt_page (&c->pt, s);
  }
  return end < c->nslots;
}

/* Sort pages[0, n) and drop repeats (a page that moved to another slot
 * between two chunks is seen twice); returns the new count.
 */
static uint64_t
sort_unique (uint64_t *pages, uint64_t n)
{
  uint64_t m = 0;

  qsort (pages, n, sizeof *pages, cmp_u64);
  for (uint64_t i = 0; i < n; i++)
    if (m == 0 || pages[m - 1] != pages[i])
      pages[m++] = pages[i];
  return m;
}

/* Dirty pages now, sorted, but for "hot" ones: changed after sequence
 * number hot_after (UINT64_MAX: none is hot), and, unless all, those
 * whose writeback failed lately (c->backoff); both are counted in
 * *nhot.  Pages of flush generations after gen_max are left out.  The
 * slots are scanned a chunk per hold of c->lock, so that a scan of a
 * big cache never holds it long; pages that change meanwhile are
 * checked again when written back (under their range lock).
 * Returns the count, or -1.
 */
static int64_t
collect_dirty (struct cache *c, uint64_t **pages_out, uint64_t hot_after,
               bool all, uint64_t gen_max, uint64_t *nhot)
{
  struct collect k = { .hot_after = hot_after, .gen_max = gen_max,
                       .now = cache_now_ms (), .all = all };
  bool more = true;

  pthread_mutex_lock (&c->lock);
  k.cap = c->ndirty ? c->ndirty : 1;
  pthread_mutex_unlock (&c->lock);
  k.pages = malloc (k.cap * sizeof *k.pages);
  if (k.pages == NULL)
    return -1;
  for (uint32_t first = 0; more; first += cache_collect_chunk) {
    pthread_mutex_lock (&c->lock);
    more = collect_chunk_locked (c, &k, first);
    pthread_mutex_unlock (&c->lock);
  }
  *nhot = k.nhot;
  *pages_out = k.pages;
  return sort_unique (k.pages, k.n);
}

/* A group being written: its buffer (page k of the group at
 * k * page_size from base, a backend offset), the bytes written so far
 * and where an error goes.
 */
struct group_out {
  struct cache *c;
  const struct cache_backend *be;
  const uint8_t *buf;
  uint64_t base;
  uint64_t *bytes;
  int *err;
};

/* Write [lo, hi) (clipped to the backend size) from the group buffer. */
static int
emit (const struct group_out *o, uint64_t lo, uint64_t hi)
{
  if (hi > o->c->backend_size)
    hi = o->c->backend_size;
  if (hi <= lo)
    return 0;
  if (o->be->pwrite (o->be->h, o->buf + (lo - o->base), hi - lo, lo, false,
                     o->err) == -1)
    return -1;
  *o->bytes += hi - lo;
  return 0;
}

/* Write the dirty sectors of one group of adjacent pages g[0..ng),
 * whose data is in buf (page k at k * page_size).  Dirty sectors are
 * written in few requests: runs that touch are one request, and so are
 * runs with at most CLEAN_BRIDGE_MAX bytes of valid clean sectors
 * between them (the backend has those bytes already, so writing them
 * again changes nothing, and a slow backend pays per request: 16 KiB
 * take 0.3 ms at 50 MiB/s, less than one 1 ms round trip).  An invalid
 * sector (not cached) ends a request.
 */
#define CLEAN_BRIDGE_MAX (16 * 1024)

static int
write_group (struct cache *c, const struct cache_backend *be,
             const struct clean_page *g, size_t ng, const uint8_t *buf,
             uint64_t *bytes, int *err)
{
  const uint32_t ps = c->page_size, ss = c->sector_size;
  const struct group_out out = { .c = c, .be = be, .buf = buf,
                                 .base = g[0].page * ps, .bytes = bytes,
                                 .err = err };
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
            reach + ss - hi <= CLEAN_BRIDGE_MAX)
          reach = off + ss;     /* clean, cached: may be bridged */
        continue;
      }
      if (in_run && reach == off) {
        hi = reach = off + ss;
        continue;
      }
      if (in_run && emit (&out, lo, hi) == -1)
        return -1;
      in_run = true;
      lo = off;
      hi = reach = off + ss;
    }
  }
  if (in_run && emit (&out, lo, hi) == -1)
    return -1;
  return 0;
}

/* Page page of a group, into g and its data into buf: pinned and read
 * if it is still dirty with data of flush generation gen_max or older
 * (g->slot), else g->slot = PT_NONE.  Returns -1 if it is that dirty
 * but its data cannot be read (bad, or the read failed): lost to the
 * backend.
 */
static int
load_page (struct cache *c, const struct cache_backend *be, uint64_t page,
           uint64_t gen_max, struct clean_page *g, uint8_t *buf)
{
  uint32_t s = cache_lookup_pin (c, page);
  bool dirty, bad;

  g->page = page;
  g->slot = PT_NONE;
  if (s == PT_NONE)
    return 0;
  pthread_mutex_lock (&c->lock);
  dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY &&
    pt_gen (&c->pt, s) <= gen_max;
  bad = pt_flags (&c->pt, s) & PT_BAD;
  pthread_mutex_unlock (&c->lock);
  if (!dirty || bad) {
    cache_unpin (c, s);
    return dirty ? -1 : 0;
  }
  if (cache_read_verified (c, be, s, buf) == -1)     /* pin consumed */
    return cache_slot_dropped (c, page, s) ? 0 : -1;  /* torn, or bad */
  pthread_mutex_lock (&c->lock);
  g->slot = s;
  g->seq = pt_seq (&c->pt, s);
  pt_maps_get (&c->pt, s, g->valid, g->dirty);
  pthread_mutex_unlock (&c->lock);
  /* Marking it clean writes its entry (and seals it): the checksum of
   * this data (RAM keeps none).
   */
  g->crc = cache_page_crc (c, buf, g->valid);
  return 0;
}

/* Lock the range of the group starting at pages[i] (at most max pages,
 * adjacent, up to pages[n-1]) without waiting.  Returns its last index,
 * or -1 if even pages[i] is busy.
 */
static int64_t
lock_group (struct cache *c, const uint64_t *pages, int64_t i, int64_t n,
            size_t max)
{
  int64_t j = i;

  while (j + 1 < n && pages[j + 1] == pages[j] + 1 &&
         (size_t) (j + 1 - i) < max)
    j++;
  if (rangelock_try_acquire (&c->ranges, pages[i], pages[j]) == 0)
    return j;
  /* A client holds some of these pages (it may be waiting for us to
   * make room): go page by page around it.
   */
  if (rangelock_try_acquire (&c->ranges, pages[i], pages[i]) == 0)
    return i;
  return -1;
}

/* Rate limit: stay at or under wbcfg.rate bytes per second. */
static void
keep_rate (struct cache *c, uint64_t bytes, uint64_t start_ms)
{
  uint64_t want_ms = bytes * 1000 / c->wbcfg.rate;
  uint64_t took = cache_now_ms () - start_ms;

  if (want_ms > took)
    cache_sleep_ms (want_ms - took);
}

/* After the backend flush, page p range locked: mark its cleaned
 * sectors clean in the cache (a page changed meanwhile keeps them
 * dirty: its sequence number tells, unless held: range locked since it
 * was read, its data cannot have changed).  Returns 1, 0 if the page
 * changed (nothing done), or -1 if its entry could not be written
 * (clean in RAM, and the backend has it: the cache file could not be
 * told).
 */
static int
clean_commit (struct cache *c, const struct clean_page *p, bool held)
{
  struct pt_slot upd;
  bool same;

  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, p->slot, &upd);
  same = pagetable_lookup (&c->pt, p->page) == p->slot &&
    (held || upd.seq == p->seq);
  pthread_mutex_unlock (&c->lock);
  if (!same)
    return 0;
  for (unsigned b = 0; b < sizeof upd.dirty; b++)
    upd.dirty[b] &= ~p->dirty[b];
  /* The data did not change since load_page read it (same sequence
   * number, or held): its checksum then is the entry's.
   */
  pt_slot_set_crc (&upd, p->crc);
  upd.flags &= ~PT_UNSEALED;
  upd.state = layout_map_empty (upd.dirty) ? LAYOUT_CLEAN : LAYOUT_DIRTY;
  STATS_ADD (&c->stats, pages_written_back, 1);
  if (cache_commit_entry (c, p->slot, &upd) == -1) {
    cache_io_error (c, "writing entry", p->slot);
    cache_stale_add (c, p->slot, p->page, true, &p->crc);
    return -1;
  }
  return 1;
}

/* After the backend flush: mark page p clean (clean_commit), unless a
 * client holds it now.  Consumes p's pin.
 */
static void
mark_clean (struct cache *c, const struct clean_page *p,
            const struct clean_opts *o)
{
  if (rangelock_try_acquire (&c->ranges, p->page, p->page) == -1) {
    /* A client is changing it (maybe waiting for us to make room):
     * leave it dirty, it will be written again.
     */
    cache_unpin (c, p->slot);
    return;
  }
  if (clean_commit (c, p, false) != 0 && o->cleaned)
    o->cleaned (o->opaque, p->page);
  rangelock_release (&c->ranges, p->page, p->page);
  cache_unpin (c, p->slot);
}

/* The state of one pass, shared by its workers (ssdcache-writeback-
 * depth of them, the caller's thread one of them): each takes the next
 * group in offset order under ps->lock, then reads it from the cache
 * and writes it to the backend unlocked, so that up to depth backend
 * writes are in flight.  c->backoff is ps->lock's too during a pass
 * (passes are c->clean_lock's).
 */
struct pass {
  struct cache *c;
  const struct cache_backend *be;
  const struct clean_opts *o;
  size_t max_group;              /* pages */
  uint64_t target, start_ms;
  uint64_t gen_max;              /* flush generations written back */
  bool closed;                   /* ... all closed: writes around wait */
  struct clean_page *kept;       /* retained slots written (order.c) */
  size_t nkept;

  pthread_mutex_t lock;
  uint64_t *pages;               /* dirty pages, sorted */
  int64_t n, next;               /* ... and the next one to take */
  struct clean_page *done;       /* pages written (or taken), pinned */
  size_t ndone;
  uint64_t bytes;
  bool skipped;                  /* some pages were busy */
  bool failed;                   /* some run failed */
  int err;                       /* ... its error */
};

/* Writes going around a full cache share the backend with writeback:
 * while they do, a pass keeps one request in flight, not depth.  Not a
 * pass over closed flush generations: writes around the cache wait for
 * it (order.c), so it has the backend to itself.
 */
#define CLEAN_YIELD_MS 200

/* Under ps->lock: the next group, locked and with room in ps->done for
 * its pages: *first and *ng, or false when the pass is over (for a
 * helper, also while clients write around the cache).
 */
static bool
take_group (struct pass *ps, bool helper, int64_t *first, size_t *ng)
{
  for (;;) {
    int64_t i = ps->next, j;

    if (i >= ps->n ||
        (ps->target > 0 && (uint64_t) (ps->n - i) <= ps->target))
      return false;
    if (helper && !ps->closed &&
        cache_now_ms () - atomic_load (&ps->c->last_around_ms)
        < CLEAN_YIELD_MS)
      return false;
    j = lock_group (ps->c, ps->pages, i, ps->n, ps->max_group);
    if (j == -1) {
      ps->skipped = true;        /* this one later */
      ps->next = i + 1;
      continue;
    }
    ps->next = j + 1;
    *first = i;
    *ng = j - i + 1;
    return true;
  }
}

/* One group failed: its pages stay dirty (unpinned, taken out of
 * ps->done), and only that run waits before its next try.
 */
static void
group_failed (struct pass *ps, struct clean_page *g, size_t ng, int err)
{
  struct cache *c = ps->c;

  for (size_t k = 0; k < ng; k++)
    if (g[k].slot != PT_NONE) {
      cache_unpin (c, g[k].slot);
      g[k].slot = PT_NONE;
    }
  STATS_ADD (&c->stats, writeback_errors, 1);
  log_error ("writeback of pages %llu-%llu failed: %s; they stay "
             "dirty and will be retried",
             (unsigned long long) g[0].page,
             (unsigned long long) g[ng - 1].page, strerror (err));
  pthread_mutex_lock (&ps->lock);
  backoff_failed (&c->backoff, g[0].page, g[ng - 1].page, cache_now_ms ());
  ps->failed = true;
  ps->err = err;
  pthread_mutex_unlock (&ps->lock);
}

/* A worker: write groups back until the pass is over.  buf holds one
 * group's data.
 */
static void
pass_work (struct pass *ps, bool helper, uint8_t *buf)
{
  struct cache *c = ps->c;
  int64_t i;
  size_t ng;

  for (;;) {
    struct clean_page *g;
    uint64_t bytes = 0, total;
    int err = 0, r;

    pthread_mutex_lock (&ps->lock);
    if (!take_group (ps, helper, &i, &ng)) {
      pthread_mutex_unlock (&ps->lock);
      return;
    }
    g = ps->done + ps->ndone;
    ps->ndone += ng;
    pthread_mutex_unlock (&ps->lock);

    for (size_t k = 0; k < ng; k++)
      load_page (c, ps->be, ps->pages[i + k], ps->gen_max, &g[k],
                 buf + k * c->page_size);
    r = write_group (c, ps->be, g, ng, buf, &bytes, &err);
    rangelock_release (&c->ranges, ps->pages[i], ps->pages[i + ng - 1]);
    if (r == -1) {
      group_failed (ps, g, ng, err);
      continue;
    }
    pthread_mutex_lock (&ps->lock);
    if (c->backoff.n > 0)
      backoff_done (&c->backoff, ps->pages[i], ps->pages[i + ng - 1]);
    total = ps->bytes += bytes;
    pthread_mutex_unlock (&ps->lock);
    if (ps->o->limited && c->wbcfg.rate)
      keep_rate (c, total, ps->start_ms);
  }
}

static void *
pass_helper (void *arg)
{
  struct pass *ps = arg;
  uint8_t *buf = malloc (ps->max_group * ps->c->page_size);

  if (buf) {
    pass_work (ps, true, buf);
    free (buf);
  }
  return NULL;
}

/* Are versions kept for the flush order waiting (under c->lock; the
 * answer is a hint: writers may add one at once)?
 */
static bool
retained_any (struct cache *c)
{
  bool any;

  pthread_mutex_lock (&c->lock);
  any = c->nretained > 0;
  pthread_mutex_unlock (&c->lock);
  return any;
}

/* Under c->lock: retained slot s is retained no more (written back, or
 * given up): clean in RAM, valid as before, until it is freed.
 */
static void
retained_end_locked (struct cache *c, uint32_t s, const uint8_t *valid)
{
  static const uint8_t none[LAYOUT_MAX_SECTORS / 8];

  if (cache_retained_locked (c, s))
    c->nretained--;
  pt_set_state (&c->pt, s, LAYOUT_CLEAN);
  pt_maps_set (&c->pt, s, valid, none);
}

/* Under nothing: pinned retained slot p->slot was written back and the
 * backend flushed: its version is on the backend now.  A FREE entry
 * makes sure it never comes back (were its dirty entry found after a
 * crash once later generations reached the backend, writing it again
 * would take its page back in time); it stays on c->sup until its
 * successor is flushed (cache_free_superseded).
 */
static void
retained_done (struct cache *c, const struct clean_page *p)
{
  if (cache_write_free_entry (c, p->slot) == -1)
    cache_io_error (c, "writing free entry", p->slot);
  pthread_mutex_lock (&c->lock);
  retained_end_locked (c, p->slot, p->valid);
  pthread_mutex_unlock (&c->lock);
  STATS_ADD (&c->stats, pages_written_back, 1);
  cache_unpin (c, p->slot);
}

/* Pin retained slot s if its data is of a generation the pass writes
 * back, filling p.  Under nothing.
 */
static bool
retained_take (struct pass *ps, uint32_t s, struct clean_page *p,
               struct pt_slot *v)
{
  struct cache *c = ps->c;
  bool take;

  pthread_mutex_lock (&c->lock);
  take = cache_retained_locked (c, s) && pt_gen (&c->pt, s) <= ps->gen_max;
  if (take) {
    pt_pin (&c->pt, s);
    p->slot = s;
    p->page = pt_page (&c->pt, s);
    p->seq = pt_seq (&c->pt, s);
    pt_maps_get (&c->pt, s, p->valid, p->dirty);
    pagetable_get (&c->pt, s, v);
  }
  pthread_mutex_unlock (&c->lock);
  return take;
}

/* Read retained slot s's data into buf, checked against its entry's
 * checksum if not done since the start (its data and entry never change
 * while it is retained).  Returns 0 or -1.
 */
static int
retained_read (struct cache *c, uint32_t s, const struct pt_slot *v,
               struct clean_page *p, uint8_t *buf)
{
  uint32_t crc;

  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1)
    return -1;
  p->crc = cache_page_crc (c, buf, p->valid);
  if (v->flags & (PT_VERIFIED | PT_UNSEALED))
    return 0;
  if (cache_entry_crc (c, s, v, &crc) == -1)
    return -1;
  return p->crc == crc ? 0 : -1;
}

/* A retained slot whose data cannot be read: its generation can never
 * be complete on the backend.  Said loudly, counted, and given up.
 */
static void
retained_lost (struct cache *c, const struct clean_page *p, bool degraded)
{
  if (!degraded)
    log_error ("cache file %s: the older version of page %llu (slot %u) "
               "kept for the flush order cannot be read: the backend "
               "alone will not match a flush point for that page",
               c->path, (unsigned long long) p->page, p->slot);
  STATS_ADD (&c->stats, order_broken, 1);
  pthread_mutex_lock (&c->lock);
  retained_end_locked (c, p->slot, p->valid);
  pthread_mutex_unlock (&c->lock);
  cache_unpin (c, p->slot);
}

/* The flush order: superseded slots still holding dirty data of the
 * generations the pass writes back (cache_retained_locked), one
 * request per run, before the pages.  Their data never changes, so no
 * range lock is needed; a pin keeps them.  They join ps->kept.  In
 * degraded mode the order is broken (clean_order_enter): writes go
 * around the cache without waiting for older generations, so an older
 * version written now could land over newer data; they are given up
 * instead.  (The caller holds c->clean_lock, which clean_order_enter
 * waits for once degraded: a pass that began before is over by then.)
 */
static void
write_retained (struct pass *ps, uint8_t *buf)
{
  struct cache *c = ps->c;
  size_t cap = 0;

  for (uint32_t s = 0; s < c->nslots; s++) {
    struct clean_page p;
    struct pt_slot v;
    uint64_t bytes = 0;
    int err = 0;

    if (!retained_take (ps, s, &p, &v))
      continue;
    if (cache_degraded (c)) {
      retained_lost (c, &p, true);
      continue;
    }
    if (retained_read (c, s, &v, &p, buf) == -1) {
      retained_lost (c, &p, false);
      continue;
    }
    if (ps->nkept == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      struct clean_page *k = realloc (ps->kept, ncap * sizeof *k);
      if (k == NULL) {
        cache_unpin (c, s);
        return;                  /* the rest next time */
      }
      ps->kept = k;
      cap = ncap;
    }
    if (write_group (c, ps->be, &p, 1, buf, &bytes, &err) == -1) {
      group_failed (ps, &p, 1, err);
      continue;
    }
    ps->kept[ps->nkept++] = p;
    ps->bytes += bytes;
  }
}

/* The pages written (ps->done): flush the backend, then mark them clean;
 * if the flush fails only unpin them.  Returns whether all went well.
 */
static bool
pass_finish (struct cache *c, const struct cache_backend *be, struct pass *ps,
             const struct clean_opts *o, int *err)
{
  bool failed = ps->failed, flushed = true;
  size_t written = 0;

  for (size_t k = 0; k < ps->ndone; k++)
    written += ps->done[k].slot != PT_NONE;
  written += ps->nkept;
  /* The backend must have it durably before the cache forgets it. */
  if (written > 0 && be->flush && be->flush (be->h, err) == -1) {
    STATS_ADD (&c->stats, writeback_errors, 1);
    log_error ("writeback: backend flush failed: %s; pages stay dirty",
               strerror (*err));
    failed = true;
    flushed = false;
  }
  else if (failed)
    *err = ps->err;
  for (size_t k = 0; k < ps->ndone; k++) {
    const struct clean_page *p = &ps->done[k];

    if (p->slot == PT_NONE)
      continue;
    if (!flushed)
      cache_unpin (c, p->slot);
    else
      mark_clean (c, p, o);
  }
  for (size_t k = 0; k < ps->nkept; k++) {
    if (!flushed)
      cache_unpin (c, ps->kept[k].slot);
    else
      retained_done (c, &ps->kept[k]);
  }
  if (written > 0 && flushed) {
    int e;
    STATS_ADD (&c->stats, bytes_written_back, ps->bytes);
    cache_sync_device (c, &e);
  }
  return !failed;
}

/* Run the pass's workers: depth - 1 helper threads (fewer for a short
 * pass) and the caller.
 */
static void
pass_run (struct pass *ps, uint8_t *buf)
{
  pthread_t helpers[CACHE_MAX_WB_DEPTH];
  unsigned want = ps->c->wbcfg.depth > 1 ? ps->c->wbcfg.depth - 1 : 0;
  unsigned nh = 0;

  if ((uint64_t) ps->n < 2)
    want = 0;
  else if (want > (uint64_t) ps->n - 1)
    want = ps->n - 1;
  for (; nh < want; nh++)
    if (pthread_create (&helpers[nh], NULL, pass_helper, ps) != 0)
      break;                     /* fewer in flight, that is all */
  pass_work (ps, false, buf);
  for (unsigned k = 0; k < nh; k++)
    pthread_join (helpers[k], NULL);
}

/* One pass over the dirty data of flush generations gen_max and older
 * (UINT64_MAX: all): clean_pass's answer.
 */
static int
gen_pass (struct cache *c, const struct cache_backend *be,
          const struct clean_opts *o, uint64_t gen_max, int *err)
{
  const unsigned depth = c->wbcfg.depth > 1 ? c->wbcfg.depth : 1;
  struct pass ps = { .c = c, .be = be, .o = o, .target = o->target,
                     .start_ms = cache_now_ms (), .gen_max = gen_max };
  uint8_t *buf = NULL;
  uint64_t nhot;
  int ret = -1;

  /* Groups of at most CLEAN_GROUP_BYTES in all, shared by the
   * requests in flight (coalescing within each).
   */
  ps.max_group = CLEAN_GROUP_BYTES / depth / c->page_size;
  if (ps.max_group == 0)
    ps.max_group = 1;
  pthread_mutex_init (&ps.lock, NULL);
  pthread_mutex_lock (&c->clean_lock);
  pthread_mutex_lock (&c->lock);
  ps.closed = cache_ordered (c) && gen_max < c->gen;
  pthread_mutex_unlock (&c->lock);
  ps.n = collect_dirty (c, &ps.pages,
                        o->skip_hot ? o->hot_after : UINT64_MAX,
                        o->target == 0 && !o->limited, gen_max, &nhot);
  if (ps.n == -1) {
    *err = ENOMEM;
    goto out;
  }
  if (ps.n == 0 && nhot > 0 && !retained_any (c)) {
    ret = 2;
    goto out;
  }
  /* Hot pages stay dirty, so fewer of the others may remain (0: all
   * of them go).
   */
  if (ps.target > 0)
    ps.target = ps.target > nhot ? ps.target - nhot : 0;
  ps.done = malloc ((ps.n ? ps.n : 1) * sizeof *ps.done);
  buf = malloc (ps.max_group * c->page_size);
  if (ps.done == NULL || buf == NULL) {
    *err = ENOMEM;
    goto out;
  }
  if (retained_any (c))
    write_retained (&ps, buf);
  pass_run (&ps, buf);
  ret = !pass_finish (c, be, &ps, o, err) ? -1 : ps.skipped ? 1 : 0;
  if (ps.nkept > 0)
    cache_free_superseded (c);

 out:
  pthread_mutex_unlock (&c->clean_lock);
  pthread_mutex_destroy (&ps.lock);
  free (ps.pages);
  free (ps.done);
  free (ps.kept);
  free (buf);
  return ret;
}

/* The flush order: write back one generation at a time, oldest first,
 * each flushed on the backend before the next begins (order.c); the
 * open generation only in part, as o asks.  A closed generation is
 * written whole (hot pages and the target do not apply).  Returns as
 * clean_pass; 1 also when a generation could not be completed yet (a
 * backend write of it is still in flight).
 */
static int
order_pass (struct cache *c, const struct cache_backend *be,
            const struct clean_opts *o, int *err)
{
  for (;;) {
    struct clean_opts closed = *o;
    uint64_t g;
    bool open;
    int r, a;

    pthread_mutex_lock (&c->lock);
    g = c->gen_done + 1;
    open = g >= c->gen;
    pthread_mutex_unlock (&c->lock);
    if (o->gen_upto && g > o->gen_upto)
      return 0;
    if (open)
      return gen_pass (c, be, o, g, err);
    closed.target = 0;
    closed.skip_hot = false;
    r = gen_pass (c, be, &closed, g, err);
    if (r == -1)
      return -1;
    pthread_mutex_lock (&c->clean_lock);
    a = order_try_advance (c, be, err);
    pthread_mutex_unlock (&c->clean_lock);
    if (a == -1)
      return -1;
    if (a == 0)
      return 1;
  }
}

int
clean_pass (struct cache *c, const struct cache_backend *be,
            const struct clean_opts *o, int *err)
{
  if (cache_ordered (c))
    return order_pass (c, be, o, err);
  return gen_pass (c, be, o, UINT64_MAX, err);
}

/* The dirty pages among n adjacent ones from first (data of flush
 * generation gen_max or older), range locked by the caller: read them
 * (sp: room for n of each), write them to the backend, one backend flush,
 * then mark them clean.  A page that cannot be written back stays
 * dirty.  Returns 0 or -1 (*err).
 */
struct chunk_space {             /* clean_range_now's buffers */
  struct clean_page *g;          /* a chunk's pages ... */
  uint8_t *buf;                  /* ... and their data */
};

static int
clean_chunk_now (struct cache *c, const struct cache_backend *be,
                 uint64_t first, size_t n, uint64_t gen_max,
                 const struct chunk_space *sp, int *err)
{
  struct clean_page *g = sp->g;
  uint8_t *buf = sp->buf;
  uint64_t bytes = 0;
  bool lost = false, failed = false;
  int r = 0;

  for (size_t k = 0; k < n; k++)
    if (load_page (c, be, first + k, gen_max, &g[k],
                   buf + k * c->page_size) == -1)
      lost = true;
  if (lost) {
    *err = EIO;
    failed = true;
  }
  else if (write_group (c, be, g, n, buf, &bytes, err) == -1 ||
           (bytes > 0 && be->flush && be->flush (be->h, err) == -1)) {
    STATS_ADD (&c->stats, writeback_errors, 1);
    failed = true;
  }
  for (size_t k = 0; k < n; k++) {
    if (g[k].slot == PT_NONE)
      continue;
    if (!failed)
      switch (clean_commit (c, &g[k], true)) {
      case -1:                  /* (on a failing device: expected) */
        if (cache_degraded (c))
          break;
        /* fallthrough */
      case 0:                   /* not reached: the page is held */
        *err = EIO;
        r = -1;
      }
    cache_unpin (c, g[k].slot);
  }
  if (!failed)
    STATS_ADD (&c->stats, bytes_written_back, bytes);
  return failed ? -1 : r;
}

/* Without the flush order: the dirty pages of [first, last] (range
 * locked by the caller) are written back in chunks of at most
 * CLEAN_GROUP_BYTES, each chunk with one backend flush, not one per
 * page (a write of 1 MiB around the cache over 16 dirty pages would
 * wait for 16 flushes).
 */
static int
clean_range_now (struct cache *c, const struct cache_backend *be,
                 uint64_t first, uint64_t last, uint64_t gen_max, int *err)
{
  size_t max = CLEAN_GROUP_BYTES / c->page_size;
  struct chunk_space sp = { NULL, NULL };
  int r = 0;

  if (max == 0)
    max = 1;
  if (max > last - first + 1)
    max = last - first + 1;     /* one page, for clean_page_held */
  for (uint64_t page = first; page <= last && r == 0; page++) {
    size_t n;

    if (!cache_page_dirty (c, page))
      continue;
    if (sp.g == NULL) {
      sp.g = malloc (max * sizeof *sp.g);
      sp.buf = malloc (max * c->page_size);
      if (sp.g == NULL || sp.buf == NULL) {
        *err = ENOMEM;
        r = -1;
        break;
      }
    }
    n = last - page + 1 < max ? last - page + 1 : max;
    r = clean_chunk_now (c, be, page, n, gen_max, &sp, err);
    page += n - 1;
  }
  free (sp.g);
  free (sp.buf);
  return r;
}

int
clean_pages_held (struct cache *c, const struct cache_backend *be,
                  uint64_t first, uint64_t last, uint64_t gen_max,
                  int *err)
{
  if (!cache_ordered (c))
    return clean_range_now (c, be, first, last, gen_max, err);
  /* In the flush order each page waits for its own generation's turn. */
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s;
    bool now;
    int r = 0;

    if (!cache_page_dirty (c, page))
      continue;
    s = cache_lookup_pin (c, page);
    if (s == PT_NONE)
      continue;
    pthread_mutex_lock (&c->lock);
    now = pt_state (&c->pt, s) == LAYOUT_DIRTY &&
      pt_gen (&c->pt, s) <= gen_max;
    pthread_mutex_unlock (&c->lock);
    if (now)
      r = clean_page_held (c, be, page, s, err);
    cache_unpin (c, s);
    if (r == -1)
      return -1;
  }
  return 0;
}

int
clean_order_enter (struct cache *c, const struct cache_backend *be,
                   uint64_t gen, int *err)
{
  struct timespec ms = { .tv_sec = 0, .tv_nsec = 1000000 };
  bool waited = false;
  uint64_t first, last, may;
  int r;

  /* (Asked again each time: once the last dirty page of a cache that
   * left writeback is written back, no pass moves c->gen_done on any
   * more, and there is no older data left to wait for.)
   */
  while (cache_ordered (c)) {
    struct clean_opts upto = { .target = 0 };

    if (order_enter (c, gen) == 0)
      return 1;
    if (cache_degraded (c)) {
      /* Nothing can be read back from the cache any more: the order is
       * broken.  A pass that may still write older versions ends first
       * (write_retained gives them up from now on); once one writer saw
       * it end, every pass left began degraded, and no write waits.
       */
      STATS_ADD (&c->stats, order_broken, 1);
      if (!atomic_load (&c->degraded_passed)) {
        pthread_mutex_lock (&c->clean_lock);
        pthread_mutex_unlock (&c->clean_lock);
        atomic_store (&c->degraded_passed, true);
      }
      return 0;
    }
    if (!waited) {
      STATS_ADD (&c->stats, order_writer_waits, 1);
      if (ssdcache_debug_order)
        log_debug ("order: a write to the backend waits for older flush "
                   "generations");
    }
    waited = true;
    pthread_mutex_lock (&c->lock);
    upto.gen_upto = (gen == ORDER_OPEN ? c->gen : gen) - 1;
    may = c->gen_done + 1;      /* its own pages of it may go now */
    pthread_mutex_unlock (&c->lock);
    if (order_owned_range (c, &first, &last) &&
        clean_pages_held (c, be, first, last, may, err) == -1)
      return -1;
    r = clean_pass (c, be, &upto, err);
    if (r == -1)
      return -1;
    if (r == 1)
      nanosleep (&ms, NULL);    /* busy pages: their requests end */
  }
  return 0;
}

/* Write back now, from the caller's thread (which holds no range
 * lock), every page dirty when it is called: a pass for most of them,
 * then, one at a time and waiting for its range lock (served in
 * arrival order), each page the pass found busy.  A page that clients
 * rewrite without pause cannot starve it.  Returns 0 or -1 (*err).
 */
int
clean_all_now (struct cache *c, const struct cache_backend *be, int *err)
{
  const struct clean_opts all = { .target = 0 };
  uint64_t *pages, nhot;
  int64_t n;
  int r = clean_pass (c, be, &all, err);

  if (r != 1)
    return r == -1 ? -1 : 0;
  n = collect_dirty (c, &pages, UINT64_MAX, true, UINT64_MAX, &nhot);
  if (n == -1) {
    *err = ENOMEM;
    return -1;
  }
  r = 0;
  for (int64_t i = 0; i < n && r == 0; i++) {
    if (rangelock_acquire (&c->ranges, pages[i], pages[i]) == -1) {
      *err = errno;
      r = -1;
      break;
    }
    order_owned (c, pages[i], pages[i]);
    r = clean_pages_held (c, be, pages[i], pages[i], UINT64_MAX, err);
    order_owned (NULL, 0, 0);
    rangelock_release (&c->ranges, pages[i], pages[i]);
  }
  free (pages);
  /* (In the flush order, retained versions and generations left go
   * with one more pass, which no longer meets busy pages of them.)
   */
  if (r == 0 && cache_ordered (c) && clean_pass (c, be, &all, err) == -1)
    r = -1;
  return r;
}

int
cache_writeback_all (struct cache *c, const struct cache_backend *be,
                     int *err)
{
  const struct clean_opts all = { .target = 0 };
  int r;

  /* Busy pages (r == 1) cannot happen without clients, but be safe. */
  for (int tries = 0; tries < 100; tries++) {
    r = clean_pass (c, be, &all, err);
    if (r != 1)
      return r;
  }
  *err = EBUSY;
  return -1;
}

int
clean_page_held (struct cache *c, const struct cache_backend *be,
                 uint64_t page, uint32_t s, int *err)
{
  uint64_t gen;
  int r, ordered;

  pthread_mutex_lock (&c->lock);
  gen = pt_gen (&c->pt, s);
  pthread_mutex_unlock (&c->lock);
  ordered = clean_order_enter (c, be, gen, err);
  if (ordered == -1)
    return -1;
  r = clean_range_now (c, be, page, page, UINT64_MAX, err);
  if (ordered)
    order_leave (c);
  return r;
}

