/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: requests that go straight to the backend.
 *
 * Owns dropping cached pages (invalidation) and the pass-through of a
 * request around the cache (degraded mode, writearound, sequential
 * cutoff, zero and trim): dirty pages in the way are written back
 * first, stale entries settled, and the cached copies dropped.  Callers
 * hold the range lock of the pages; c->lock is taken by the slot
 * helpers only (lock table: cache-int.h).
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
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s;
    int r = 0;

    if (!cache_page_dirty (c, page))
      continue;
    s = cache_lookup_pin (c, page);
    if (s == PT_NONE)
      continue;
    pthread_mutex_lock (&c->lock);
    bool dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY;
    pthread_mutex_unlock (&c->lock);
    if (dirty)
      r = clean_page_locked (c, be, page, s, err);
    cache_unpin (c, s);
    if (r == -1)
      return -1;
  }
  return 0;
}

/* The backend does the request, cached copies of its pages are
 * dropped: zero/trim outside writeback mode, and everything in
 * pass-through (the cache device failed), where dirty pages in the
 * range are written back first.  do_op NULL: a write of buf.
 */
int
through_op (struct cache *c, const struct cache_backend *be,
            cache_backend_op do_op, void *opaque, const void *buf,
            uint32_t count, uint64_t offset, bool fua, int *err)
{
  uint64_t first = offset / c->page_size;
  uint64_t last = (offset + count - 1) / c->page_size;
  int r = -1;

  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }
  if (cache_clean_pages (c, be, first, last, err) == 0 &&
      cache_stale_settle (c, first, last, err) == 0) {
    if (do_op)
      r = do_op (opaque, count, offset, err);
    else
      r = be->pwrite (be->h, buf, count, offset, fua, err);
    cache_invalidate_pages (c, first, last);
    atomic_store (&c->backend_unflushed, true);
  }
  rangelock_release (&c->ranges, first, last);
  return r;
}
