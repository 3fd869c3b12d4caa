/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: zero and trim.
 *
 * Owns cache_zero_trim: whole pages go to the backend (around.c) and
 * their cached copies are dropped (clean ones before the backend
 * call); in writeback mode the partial pages at the edges of a zero
 * become dirty zeroes in the cache (write.c).  The pages are range
 * locked across the backend call.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* Under c->lock: does dirty slot s cache clean sectors too? */
static bool
zero_mixed_locked (struct cache *c, uint32_t s)
{
  uint8_t valid[LAYOUT_MAX_SECTORS / 8], dirty[LAYOUT_MAX_SECTORS / 8];

  if (pt_state (&c->pt, s) != LAYOUT_DIRTY)
    return false;
  pt_maps_get (&c->pt, s, valid, dirty);
  return memcmp (valid, dirty, sizeof valid) != 0;
}

/* Writeback, whole pages [first, last] (range locked) about to be
 * zeroed or trimmed on the backend: a dirty page that also caches clean
 * sectors is written back first, so that it is clean and goes before
 * the backend call.  Kept, a crash after the call would recover it and
 * serve its clean sectors, older than the backend.  (A page all dirty
 * may stay: recovered, all of it is written back over the zeroes.)
 * Returns 0, or -1 (*err) if one could not be written back.
 */
static int
zero_clean_mixed (struct cache *c, const struct cache_backend *be,
                  uint64_t first, uint64_t last, int *err)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s = cache_lookup_pin (c, page);
    bool mixed;
    int r = 0;

    if (s == PT_NONE)
      continue;
    pthread_mutex_lock (&c->lock);
    mixed = zero_mixed_locked (c, s);
    pthread_mutex_unlock (&c->lock);
    if (mixed)
      r = clean_page_held (c, be, page, s, err);
    cache_unpin (c, s);
    if (r == -1)
      return -1;
  }
  return 0;
}

int
cache_zero_trim (struct cache *c, const struct cache_backend *be,
                 const struct cache_zero_op *op, uint32_t count,
                 uint64_t offset, bool fua, int *err)
{
  const bool is_zero = op->is_zero;
  const cache_backend_op do_op = op->do_op;
  void *opaque = op->opaque;
  const uint32_t ps = c->page_size;
  const bool writeback = c->mode == LAYOUT_MODE_WRITEBACK;
  uint64_t end = offset + count;
  uint64_t full_lo, full_hi;    /* whole pages: [full_lo, full_hi) bytes */
  uint8_t *zeroes = NULL;
  int ret = -1;

  cache_touch_io (c);
  if (count == 0)
    return do_op (opaque, count, offset, err);
  if (cache_degraded (c))
    return cache_around (c, be, do_op, opaque, count, offset, err);

  if (!writeback) {
    /* The backend is the truth: do it there, drop cached copies. */
    ret = cache_around (c, be, do_op, opaque, count, offset, err);
    if (ret == 0 && fua)
      cache_sync (c, err);
    return ret;
  }

  /* Writeback: whole pages go to the backend and leave the cache; the
   * partial pages at the edges keep their dirty data, with zeroes
   * written over the zeroed part.
   */
  full_lo = (offset + ps - 1) / ps * ps;
  full_hi = end / ps * ps;
  if (end == c->backend_size)
    full_hi = end;              /* the short last page counts as whole */
  if (full_hi < full_lo)
    full_hi = full_lo;

  if (full_hi > full_lo) {
    uint64_t flo = full_lo / ps, fhi = (full_hi - 1) / ps;
    int ordered;

    if (rangelock_acquire (&c->ranges, flo, fhi) == -1) {
      *err = errno;
      return -1;
    }
    /* (The flush order: older generations reach the backend first.) */
    order_owned (c, flo, fhi);
    ordered = clean_order_enter (c, be, ORDER_OPEN, err);
    /* Clean copies go before the backend call (a crash after it would
     * leave them older than the backend); dirty ones only once it
     * worked (if it fails, their data is still to be written back).
     */
    if (ordered != -1 && zero_clean_mixed (c, be, flo, fhi, err) == 0) {
      cache_invalidate_clean_pages (c, flo, fhi);
      ret = do_op (opaque, full_hi - full_lo, full_lo, err);
    }
    if (ret == 0) {
      atomic_store (&c->backend_unflushed, true);
      cache_invalidate_pages (c, flo, fhi);
    }
    if (ordered == 1)
      order_leave (c);
    order_owned (NULL, 0, 0);
    rangelock_release (&c->ranges, flo, fhi);
    if (ret == -1)
      return -1;
  }
  ret = -1;                    /* until the edges are done too */
  if (is_zero) {
    uint64_t parts[2][2] = {
      { offset, full_lo < end ? full_lo : end },
      { full_hi > offset ? full_hi : offset, end },
    };
    zeroes = calloc (1, ps);
    if (zeroes == NULL) {
      *err = ENOMEM;
      return -1;
    }
    for (int k = 0; k < 2; k++) {
      uint64_t lo = parts[k][0], hi = parts[k][1];
      while (lo < hi) {
        uint32_t n = hi - lo < ps - lo % ps ? hi - lo : ps - lo % ps;
        if (cache_write (c, be, zeroes, n, lo, false, err) == -1)
          goto out;
        lo += n;
      }
    }
  }
  ret = 0;
  if (fua && cache_flush (c, be, err) == -1)
    ret = -1;
 out:
  free (zeroes);
  return ret;
}
