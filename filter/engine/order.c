/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: flush generations (ssdcache-writeback-order).
 *
 * Owns the generation bookkeeping.  Generation g is what clients wrote
 * between their (g-1)th and gth flush; every dirty slot records the
 * generation of its data (pt_gen).  With ssdcache-writeback-order=flush
 * the backend gets the generations one after another: a backend write
 * of generation g starts only once every generation before it is on
 * the backend and flushed there (c->gen_done >= g - 1), so the backing
 * store alone always equals the export at client flush c->gen_done
 * plus some of the writes of the next generation.  A superseded slot
 * whose dirty data belongs to an older generation is kept
 * (cache_retained_locked, epoch.c) until that generation is written back.
 *
 * order_enter registers a backend write (or refuses it: older
 * generations first, which clean.c:clean_order_enter then writes back);
 * order_try_advance moves c->gen_done on once a generation is complete.
 * Everything here is under c->lock, waits on c->order_cond (lock table:
 * docs/design.md), and does no I/O but the backend flush of an advance.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "cache-int.h"
#include "log.h"

/* The pages the calling thread holds range locked for a request: a
 * writer told to wait for older generations writes back its own pages
 * of them itself (nobody else can lock them).
 */
static __thread struct {
  const struct cache *c;
  uint64_t first, last;
} owned;

void
order_owned (struct cache *c, uint64_t first, uint64_t last)
{
  owned.c = c;
  owned.first = first;
  owned.last = last;
}

bool
order_owned_range (const struct cache *c, uint64_t *first, uint64_t *last)
{
  if (owned.c != c || c == NULL)
    return false;
  *first = owned.first;
  *last = owned.last;
  return true;
}

/* Under c->lock: a client flush closes the open generation (called
 * once rewrites in place that decided before the flush have ended, so
 * they are in the generation the flush covers).
 */
void
order_close_gen_locked (struct cache *c)
{
  genclock_close (&c->gclock, c->gen, c->gen_done, cache_now_ms ());
  c->gen++;
  c->pt.gen_ref = c->gen;
}

/* Register a backend write of data of generation gen (ORDER_OPEN: a
 * client's write now).  Returns 0 (call order_leave when it is done)
 * or 1: older generations must reach the backend first.
 */
int
order_enter (struct cache *c, uint64_t gen)
{
  pthread_mutex_lock (&c->lock);
  while (c->order_advancing)
    pthread_cond_wait (&c->order_cond, &c->lock);
  if (gen == ORDER_OPEN)
    gen = c->gen;
  if (gen > c->gen_done + 1) {
    pthread_mutex_unlock (&c->lock);
    return 1;
  }
  c->order_inflight++;
  pthread_mutex_unlock (&c->lock);
  return 0;
}

void
order_leave (struct cache *c)
{
  pthread_mutex_lock (&c->lock);
  if (--c->order_inflight == 0)
    pthread_cond_broadcast (&c->order_cond);
  pthread_mutex_unlock (&c->lock);
}

/* Under c->lock: does slot s hold dirty data still to be written back
 * (a page's current version, or an older one kept for the order)?
 */
static bool
behind_locked (const struct cache *c, uint32_t s)
{
  return pt_state (&c->pt, s) == LAYOUT_DIRTY &&
    (pt_flags (&c->pt, s) & (PT_INDEXED | PT_SUPERSEDED));
}

/* Under c->lock: the oldest generation of dirty data still to be
 * written back, or UINT64_MAX if none.  (Bad slots cannot be: they are
 * reported, not waited for.)  Counted per generation by the page table
 * (core/ptgens.c): no scan.
 */
static uint64_t
oldest_pending_locked (struct cache *c)
{
  return pagetable_oldest_pending (&c->pt);
}

/* Under c->lock: generation g seems to wait for pending slots.  Were
 * the counts ever wrong (a bug), the flush order would wait forever:
 * once the oldest pending generation and its count have not moved for
 * ORDER_CHECK_MS, compare them with a scan of every slot, and count
 * again if they differ.  (While they move, writeback is at work and
 * the scan, tens of milliseconds under c->lock at 64 Mi slots, is not
 * made.)  Returns the oldest pending generation.
 */
#define ORDER_CHECK_MS 1000

static uint64_t
order_counts_ok_locked (struct cache *c, uint64_t lo)
{
  uint64_t now = cache_now_ms (), scan;
  uint64_t n = pagetable_oldest_pending_count (&c->pt);

  if (lo != c->order_seen_gen || n != c->order_seen_n) {
    c->order_seen_gen = lo;
    c->order_seen_n = n;
    c->order_checked_ms = now;
    return lo;
  }
  if (now - c->order_checked_ms < ORDER_CHECK_MS)
    return lo;
  c->order_checked_ms = now;
  scan = pagetable_scan_oldest_pending (&c->pt);
  if (scan == lo)
    return lo;
  log_error ("cache file %s: internal error: the flush order counted "
             "generation %llu as the oldest with dirty data, but it is "
             "%llu; counting again", c->path, (unsigned long long) lo,
             (unsigned long long) scan);
  pagetable_count_pending (&c->pt);
  return scan;
}

/* Generation c->gen_done + 1 is complete (closed by a flush, nothing of
 * it dirty, no write of it in flight): flush the backend if anything
 * reached it unflushed, then move c->gen_done on.  Returns 1 if it
 * moved, 0 if the generation is not complete, -1 (*err) if the backend
 * flush failed.
 */
int
order_try_advance (struct cache *c, const struct cache_backend *be, int *err)
{
  uint64_t g;
  int r = 0;

  pthread_mutex_lock (&c->lock);
  g = c->gen_done + 1;
  if (g >= c->gen || c->order_inflight > 0 || c->order_advancing ||
      (oldest_pending_locked (c) <= g &&
       order_counts_ok_locked (c, oldest_pending_locked (c)) <= g)) {
    pthread_mutex_unlock (&c->lock);
    return 0;
  }
  c->order_advancing = true;
  pthread_mutex_unlock (&c->lock);

  if (atomic_exchange (&c->backend_unflushed, false) && be->flush &&
      (r = be->flush (be->h, err)) == -1) {
    atomic_store (&c->backend_unflushed, true);
    STATS_ADD (&c->stats, writeback_errors, 1);
  }

  pthread_mutex_lock (&c->lock);
  if (r == 0) {
    /* Later generations may be complete already (no writes): move
     * over those too, up to the oldest one still pending or the open
     * one.
     */
    uint64_t lo = oldest_pending_locked (c);

    c->gen_done = lo < c->gen ? lo - 1 : c->gen - 1;
    if (c->gen_done < g)
      c->gen_done = g;
  }
  c->order_advancing = false;
  pthread_cond_broadcast (&c->order_cond);
  if (r == 0 && ssdcache_debug_order)
    log_debug ("order: the backend has flush %llu of %llu",
               (unsigned long long) c->gen_done,
               (unsigned long long) c->gen - 1);
  pthread_mutex_unlock (&c->lock);
  if (r == 0)
    order_update_stats (c);
  return r == 0 ? 1 : -1;
}

/* After the page table was loaded: the generations of the dirty data
 * found.  The open one comes after all of them; c->gen_done before the
 * oldest (that one may be on the backend in part or whole already;
 * writing it again is harmless, see docs/design.md).
 */
void
order_loaded (struct cache *c)
{
  uint64_t lo = UINT64_MAX, hi = 0;

  for (uint32_t s = 0; s < c->nslots; s++)
    if (behind_locked (c, s)) {
      uint64_t g = pt_gen (&c->pt, s);
      lo = g < lo ? g : lo;
      hi = g > hi ? g : hi;
    }
  if (hi + 1 > c->gen)
    c->gen = hi + 1;
  c->pt.gen_ref = c->gen;
  c->gen_done = lo == UINT64_MAX ? c->gen - 1 : lo - 1;
  if (c->wbcfg.order == CACHE_ORDER_FLUSH)
    pagetable_count_pending (&c->pt);
  order_update_stats (c);
}

/* The gauges: the flush point the backend matches, how far behind the
 * clients it is, and what it still lacks.
 */
void
order_update_stats (struct cache *c)
{
  uint64_t now = cache_now_ms (), done, lag, age = 0, behind;

  if (c->wbcfg.order != CACHE_ORDER_FLUSH)
    return;                     /* (the gauges stay 0) */
  pthread_mutex_lock (&c->lock);
  done = c->gen_done;
  lag = c->gen - 1 - done;
  if (lag > 0)
    age = genclock_age (&c->gclock, done + 1, now, NULL) / 1000;
  behind = (c->ndirty + c->nretained) * c->page_size;
  atomic_store (&c->stats.order_retained, c->nretained);
  pthread_mutex_unlock (&c->lock);
  atomic_store (&c->stats.order_flush_point, done);
  atomic_store (&c->stats.order_lag_flushes, lag);
  atomic_store (&c->stats.order_lag_seconds, age);
  atomic_store (&c->stats.order_behind_bytes, behind);
}

bool
cache_order_behind (struct cache *c, uint64_t *upto)
{
  bool behind;

  if (!cache_ordered (c))
    return false;
  order_update_stats (c);
  pthread_mutex_lock (&c->lock);
  behind = c->gen_done + 1 < c->gen;
  *upto = c->gen - 1;
  pthread_mutex_unlock (&c->lock);
  return behind;
}
