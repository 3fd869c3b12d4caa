/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: requests that go straight to the backend.
 *
 * Owns dropping cached pages (invalidation) and sending a request
 * around the cache (degraded mode, zero and trim outside writeback):
 * dirty pages in the way are written back first, stale entries
 * recorded, and the cached copies dropped.  Callers hold the range lock
 * of the pages; c->lock is taken by the slot helpers only (lock table:
 * docs/design.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

void
cache_invalidate_pages (struct cache *c, uint64_t first, uint64_t last)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s = cache_lookup_pin (c, page);
    if (s != PT_NONE) {
      if (ssdcache_debug_verbose)
        log_debug ("invalidate page %llu (slot %u)",
                   (unsigned long long) page, s);
      cache_drop_slot (c, s);
    }
  }
}

void
cache_invalidate_clean_pages (struct cache *c, uint64_t first, uint64_t last)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s = cache_lookup_pin (c, page);
    bool clean;

    if (s == PT_NONE)
      continue;
    pthread_mutex_lock (&c->lock);
    clean = pt_state (&c->pt, s) == LAYOUT_CLEAN;
    pthread_mutex_unlock (&c->lock);
    if (clean)
      cache_drop_slot (c, s);
    else
      cache_unpin (c, s);
  }
}

void
cache_invalidate (struct cache *c, uint32_t count, uint64_t offset)
{
  uint64_t first, last;

  if (count == 0)
    return;
  first = offset / c->page_size;
  last = (offset + count - 1) / c->page_size;
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    log_error ("cache file %s: cannot lock range for invalidation", c->path);
    return;
  }
  cache_invalidate_pages (c, first, last);
  rangelock_release (&c->ranges, first, last);
}

/* Write back (from the caller's thread) every dirty page in [first,
 * last], which the caller has range locked, so that the backend alone
 * is current for them.  Returns 0 or -1 (*err): a page that cannot be
 * written back (bad data, backend error) stays dirty.
 */
int
cache_clean_pages (struct cache *c, const struct cache_backend *be,
                   uint64_t first, uint64_t last, int *err)
{
  return clean_pages_held (c, be, first, last, UINT64_MAX, err);
}

/* The backend does the request (do_op), cached copies of its pages
 * are dropped first: zero/trim outside writeback mode, and everything
 * in degraded mode (the cache device failed).  Dirty pages in the range
 * are written back before that.
 */
int
cache_around (struct cache *c, const struct cache_backend *be,
              cache_backend_op do_op, void *opaque, uint32_t count,
              uint64_t offset, int *err)
{
  uint64_t first = offset / c->page_size;
  uint64_t last = (offset + count - 1) / c->page_size;
  int r = -1, ordered;

  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }
  order_owned (c, first, last);
  ordered = clean_order_enter (c, be, ORDER_OPEN, err);
  if (ordered != -1 && cache_clean_pages (c, be, first, last, err) == 0 &&
      cache_stale_record (c, first, last, err) == 0) {
    /* The copies go first: dropped after the backend call, a crash
     * between the two would leave copies older than the backend.
     */
    cache_invalidate_pages (c, first, last);
    r = do_op (opaque, count, offset, err);
    atomic_store (&c->backend_unflushed, true);
  }
  if (ordered == 1)
    order_leave (c);
  order_owned (NULL, 0, 0);
  rangelock_release (&c->ranges, first, last);
  return r;
}

/* Slot s's page, if s holds a clean page that overlaps [first, last]
 * (under c->lock); else UINT64_MAX.
 */
static uint64_t
clean_page_in_locked (struct cache *c, uint32_t s, uint64_t first,
                      uint64_t last)
{
  uint64_t page;

  if (!(pt_flags (&c->pt, s) & PT_INDEXED) ||
      pt_state (&c->pt, s) != LAYOUT_CLEAN)
    return UINT64_MAX;
  page = pt_page (&c->pt, s);
  return page >= first && page <= last ? page : UINT64_MAX;
}

uint64_t
cache_drop_clean (struct cache *c, uint64_t offset, uint64_t count)
{
  uint64_t first = offset / c->page_size, last = UINT64_MAX - 1, n = 0;

  if (count)
    last = (offset + count - 1) / c->page_size;
  for (uint32_t s = 0; s < c->nslots; s++) {
    uint64_t page;
    uint32_t t;

    pthread_mutex_lock (&c->lock);
    page = clean_page_in_locked (c, s, first, last);
    pthread_mutex_unlock (&c->lock);
    if (page == UINT64_MAX ||
        rangelock_acquire (&c->ranges, page, page) == -1)
      continue;
    /* Under the page's range lock it cannot change: look again. */
    t = cache_lookup_pin (c, page);
    if (t != PT_NONE) {
      bool clean;
      pthread_mutex_lock (&c->lock);
      clean = pt_state (&c->pt, t) == LAYOUT_CLEAN;
      pthread_mutex_unlock (&c->lock);
      if (clean && cache_drop_slot (c, t) == 0)
        n++;
      else if (!clean)
        cache_unpin (c, t);
    }
    rangelock_release (&c->ranges, page, page);
  }
  return n;
}
