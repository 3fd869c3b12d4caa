/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: may the cache take a writeback write?
 *
 * Owns cache_write_goes_around: with ssdcache-writeback-max-dirty
 * reached, a cache full of dirty data, or a sequential stream past its
 * cutoff while writeback is behind, a writeback write goes around the
 * cache (write-through.c) instead of into it.  Decided under c->lock
 * from the counts of dirty, retained and promised pages; the caller
 * holds the write's range lock.
 */
#include <stdlib.h>

#include "admit.h"
#include "cache-int.h"

/* Under c->lock: does a page of [first, first + n) hold dirty data? */
static bool
write_any_dirty_locked (struct cache *c, uint64_t first, uint64_t n)
{
  for (uint64_t p = first; p < first + n; p++)
    if (cache_page_dirty_locked (c, p))
      return true;
  return false;
}

/* Under c->lock: does this write of a sequential stream go around the
 * cache?  Past the cutoff, while writeback is behind: caching it would
 * only write it twice more (cache, then backend).  Once one did, the
 * streams past their cutoff keep going around until none has come for
 * CACHE_SEQ_HOLD_MS, even if writeback catches up meanwhile: otherwise
 * a stream longer than the cache is cached again at every drain and
 * costs three copies instead of one.  A burst that ends is absorbed
 * again by the next one (as long as there is room).  A write over
 * dirty pages stays in the cache all the same: around it, their dirty
 * data would have to be written back (and the backend flushed) first,
 * page by page, while in the cache it is simply rewritten.
 */
static bool
write_seq_around_locked (struct cache *c, uint64_t first, uint64_t n)
{
  uint64_t now;

  if (c->wseq == NULL ||
      admit_seq_access (c->wseq, first * c->page_size,
                        n * c->page_size) == n * c->page_size)
    return false;
  now = cache_now_ms ();
  if (!cache_dirty_pressure_locked (c) &&
      (c->seq_around_ms == 0 || now - c->seq_around_ms > CACHE_SEQ_HOLD_MS))
    return false;
  c->seq_around_ms = now;
  return !write_any_dirty_locked (c, first, n);
}

/* Under c->lock: how many dirty pages may the write of n pages from
 * first add?  In offset order a page already dirty adds none (changed
 * in its slot, or copied and the old slot freed), so that rewriting
 * dirty data at ssdcache-writeback-max-dirty stays in the cache; in the
 * flush order a rewrite may keep the older version too: every page.
 */
static uint64_t
write_dirty_adds_locked (struct cache *c, uint64_t first, uint64_t n)
{
  uint64_t adds = 0;

  if (c->max_dirty == 0 || c->wbcfg.order == CACHE_ORDER_FLUSH)
    return n;
  for (uint64_t p = first; p < first + n; p++)
    adds += !cache_page_dirty_locked (c, p);
  return adds;
}

/* Writeback, but the cache cannot take this write: with
 * ssdcache-writeback-max-dirty reached, or fewer slots not dirty than
 * the write has pages not cached (a cache full of dirty data; cached
 * pages change in their slots or are copied, page by page), or part of
 * a sequential stream that goes around (write_seq_around_locked).  The write
 * then goes around the cache as in writearound, in one backend request
 * at the client's own parallelism, instead of page by page: the dirty
 * pages it touches are written back first and every cached copy of its
 * pages is dropped (cache_write_backend_first), so nothing older can come
 * back over it, not even after a crash (a copy updated in place, as
 * writethrough does, could: its older flushed dirty version may still
 * be on disk).  Writeback is woken.  *promised: the pages the write
 * may dirty, added to c->dirty_promised (the caller takes them off).
 */
bool
cache_write_goes_around (struct cache *c, uint64_t first, uint64_t last,
                         uint64_t *promised)
{
  const uint64_t n = last - first + 1;
  uint64_t uncached = 0, adds, busy;
  bool cap, full, seq, pressure;

  /* Writes in flight have promised to dirty at most c->dirty_promised
   * more pages: counting them keeps the cap exact.
   */
  pthread_mutex_lock (&c->lock);
  seq = write_seq_around_locked (c, first, n);
  adds = write_dirty_adds_locked (c, first, n);
  /* (Older versions kept for the flush order are dirty data the
   * backend lacks too: the cap bounds them with the rest.)
   */
  cap = c->max_dirty > 0 &&
    c->ndirty + c->nretained + c->dirty_promised + adds > c->max_dirty;
  /* (Slots that hold dirty data or older versions kept for the flush
   * order cannot be evicted: were they not counted, each page of the
   * write would find no slot and go around by itself, waiting for the
   * flush order page after page.)
   */
  busy = c->ndirty + c->nretained;
  if (c->nslots - busy < n)
    for (uint64_t p = first; p <= last; p++)
      uncached += pagetable_lookup (&c->pt, p) == PT_NONE;
  full = c->nslots - busy < uncached;
  pressure = cache_dirty_pressure_locked (c);
  *promised = !cap && !full && !seq ? adds : 0;
  c->dirty_promised += *promised;
  pthread_mutex_unlock (&c->lock);
  if (!cap && !full && !seq)
    return false;
  if (cap)
    STATS_ADD (&c->stats, dirty_cap_writes, 1);
  else if (full)
    STATS_ADD (&c->stats, write_through_full, 1);
  else
    STATS_ADD (&c->stats, seq_write_bypassed, 1);
  atomic_store (&c->backend_unflushed, true);
  atomic_store (&c->last_around_ms, cache_now_ms ());
  if (c->hooks.wb_kick && (cap || full || pressure))
    c->hooks.wb_kick (c);
  return true;
}
