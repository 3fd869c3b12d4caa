/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: writes whose backend write comes first.
 *
 * Owns cache_write_backend_first: writethrough and writearound, and the
 * writeback writes that go around a cache that cannot take them
 * (write-back.c).  Pages still dirty are written back first, then the
 * cached copies change, unsealed (writethrough: write_through_first),
 * or go (writearound), and only then does the backend get the write: a
 * crash at any point never leaves a copy that verifies but is older
 * than the backend.  The caller holds the range lock of the write's
 * pages (lock table: docs/design.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* May pinned slot s (its page range locked) be rewritten in place
 * now?  If it must be copied only because an older version of its page
 * is still on disk, that version is freed first (cache_settle).  False:
 * it must not (the caller drops it).
 */
static bool
write_settled (struct cache *c, uint32_t s)
{
  bool cow;

  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (!cow)
    return true;
  if (!cache_settle (c, s))
    return false;
  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  return !cow;
}

/* Writethrough, before the backend gets the write: bring the cached
 * copy of page (if any) up to date with bytes [off, off+n), in a way a
 * crash undoes.  The slot is rewritten unsealed (its entry on disk says
 * so before its data changes): if nbdkit dies before or after the
 * backend write, recovery drops the slot and the page is read from the
 * backend, so the cache never holds older data than the backend.
 * (Written after the backend, a crash between the two would leave the
 * old data cached, with a checksum that holds.)
 * When that cannot be done the cached copy is dropped.  Pages not
 * cached are left alone here (whole ones are added after the backend
 * write), and so are sectors not cached: if none of those the write
 * touches is cached, only the backend gets it.  The page is range
 * locked by the caller; errors are not returned (the page is dropped).
 */
static void
write_through_first (struct cache *c, const struct cache_backend *be,
                     uint64_t page, const uint8_t *src, uint32_t off,
                     uint32_t n)
{
  uint32_t s = cache_lookup_pin (c, page);
  unsigned sf, sl;
  bool any;
  int r, err = 0;

  if (s == PT_NONE)
    return;
  cache_sector_span (c, off, n, &sf, &sl);
  pthread_mutex_lock (&c->lock);
  any = pagetable_range_any_valid (&c->pt, s, sf, sl);
  pthread_mutex_unlock (&c->lock);
  if (!any) {
    cache_unpin (c, s);
    STATS_ADD (&c->stats, writes_not_cached, 1);
    return;
  }
  /* A slot whose older version is still on disk is not rewritten in
   * place (cache_must_cow): were it dropped by a crash as unsealed,
   * recovery would serve that older version, and write its dirty data
   * back over the backend's newer data.  Its predecessor goes first.
   */
  if (!write_settled (c, s)) {
    cache_drop_slot (c, s);
    return;
  }
  r = cache_patch_in_place (&(struct page_write) {
                        .c = c, .be = be, .page = page, .src = src,
                        .off = off, .n = n, .kind = W_CLEAN, .err = &err },
                      s);
  if (r != PATCH_OK) {
    /* Not unsealed (not verified since start, bad, or no memory), maps
     * that do not fit, or an error: the cached copy goes.
     */
    s = cache_lookup_pin (c, page);
    if (s != PT_NONE)
      cache_drop_slot (c, s);
  }
}

/* cache_write_backend_first once the flush order allows it. */
static int
write_backend_now (const struct write_req *r)
{
  struct cache *c = r->c;
  const struct cache_backend *be = r->be;
  const uint8_t *buf = r->buf;
  const uint32_t count = r->count;
  const uint64_t offset = r->offset, first = r->first, last = r->last;
  int *err = r->err;
  /* The cached copies change (or go) before the backend gets the data,
   * never after: see write_through_first.
   */
  if (r->mode == LAYOUT_MODE_WRITEAROUND)
    cache_invalidate_pages (c, first, last);
  else
    for (uint64_t page = first; page <= last; page++) {
      uint32_t a, b;

      cache_page_part (c, page, offset, count, &a, &b);
      write_through_first (c, be, page,
                           buf + (page * c->page_size + a - offset),
                           a, b - a);
    }
  if (be->pwrite (be->h, buf, count, offset, r->fua, err) == -1) {
    /* The backend may hold some of the new data now, and the cache some
     * the backend never got: the cached copies go.
     */
    cache_invalidate_pages (c, first, last);
    return -1;
  }
  return 0;
}

/* Writethrough / writearound, with [first, last] range locked: the
 * cached copies change (or go) first, then the backend gets the write.
 * Pages still dirty from an earlier writeback run are written back
 * first: once the backend has the new data, writing back their older
 * dirty sectors (to make room for a copy, or to simplify their maps)
 * would bring the old data back, and dropping them (writearound) would
 * lose the rest of their dirty sectors.
 */
int
cache_write_backend_first (const struct write_req *req)
{
  struct cache *c = req->c;
  int ordered = clean_order_enter (c, req->be, ORDER_OPEN, req->err), r = 0;

  if (ordered == -1)
    return -1;
  /* (Again: writing older generations back may have flushed the
   * backend and cleared it.)
   */
  atomic_store (&c->backend_unflushed, true);
  if (cache_clean_pages (c, req->be, req->first, req->last, req->err) == -1)
    r = -1;
  else
    r = write_backend_now (req);
  if (ordered)
    order_leave (c);
  return r;
}
