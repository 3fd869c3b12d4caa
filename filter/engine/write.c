/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the write path, by mode.
 *
 * Owns cache_write: takes the range lock of the write's pages, reads
 * the mode under it, and sends the write its mode's way.  Writeback:
 * into the cache as dirty data (write-page.c), unless the cache cannot
 * take it (write-back.c), when it goes around as in writearound.
 * Writethrough and writearound: the backend first (write-through.c),
 * then, in writethrough, whole pages not cached are added.  Degraded
 * (a failed cache device): around the cache (around.c).  Lock table:
 * docs/design.md.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* After cache_write_backend_first (writethrough): whole pages not
 * cached are added now that the backend has them; the rest was done
 * before.
 */
static bool
write_adds_page (struct cache *c, uint64_t page, uint32_t a, uint32_t b)
{
  uint32_t s;

  if (a != 0 || b - a < cache_page_bytes (c, page))
    return false;
  s = cache_lookup_pin (c, page);
  if (s != PT_NONE) {
    cache_unpin (c, s);
    return false;
  }
  return true;
}

/* The pages of the write into the cache: dirty (writeback), or whole
 * uncached pages the backend has now (writethrough).
 */
static int
write_pages (const struct write_req *req)
{
  struct cache *c = req->c;
  const bool through = req->mode != LAYOUT_MODE_WRITEBACK;

  for (uint64_t page = req->first; page <= req->last; page++) {
    uint32_t a, b;
    int r;

    cache_page_part (c, page, req->offset, req->count, &a, &b);
    if (through && !write_adds_page (c, page, a, b))
      continue;
    r = cache_write_page (&(struct page_write) {
                      .c = c, .be = req->be, .page = page,
                      .src = req->buf + (page * c->page_size + a -
                                         req->offset),
                      .off = a, .n = b - a,
                      .kind = through ? W_CLEAN : W_DIRTY, .err = req->err });
    if (r == -1 && !through)
      return -1;
  }
  return 0;
}

/* A client's write as a cache_backend_op (write_degraded). */
struct write_op {
  const struct cache_backend *be;
  const void *buf;
  bool fua;
};

static int
write_op_do (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  const struct write_op *w = opaque;

  return w->be->pwrite (w->be->h, w->buf, count, offset, w->fua, err);
}

/* The cache device failed: the write goes around the cache. */
static int
write_degraded (struct cache *c, const struct cache_backend *be,
                const void *buf, uint32_t count, uint64_t offset, bool fua,
                int *err)
{
  struct write_op w = { .be = be, .buf = buf, .fua = fua };

  return cache_around (c, be, write_op_do, &w, count, offset, err);
}

int
cache_write (struct cache *c, const struct cache_backend *be,
             const void *buf, uint32_t count, uint64_t offset, bool fua,
             int *err)
{
  const uint32_t ps = c->page_size;
  enum layout_mode mode;
  bool writeback;
  uint64_t first, last, promised;
  struct write_req req;
  int ret = -1;

  STATS_ADD (&c->stats, write_ops, 1);
  STATS_ADD (&c->stats, bytes_written, count);
  cache_touch_io (c);
  if (count == 0)
    return 0;
  if (cache_degraded (c))
    return write_degraded (c, be, buf, count, offset, fua, err);

  first = offset / ps;
  last = (offset + count - 1) / ps;
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }
  order_owned (c, first, last);
  /* The mode, read under the range lock: cache_set_mode waits for the
   * writes that saw the old one.
   */
  mode = c->mode;
  promised = 0;
  if (mode == LAYOUT_MODE_WRITEBACK &&
      cache_write_goes_around (c, first, last, &promised))
    mode = LAYOUT_MODE_WRITEAROUND;       /* this write only */
  writeback = mode == LAYOUT_MODE_WRITEBACK;
  req = (struct write_req) { .c = c, .be = be, .mode = mode, .buf = buf,
                             .count = count, .offset = offset, .fua = fua,
                             .first = first, .last = last, .err = err };
  if (!writeback && cache_write_backend_first (&req) == -1)
    goto out;
  if (mode != LAYOUT_MODE_WRITEAROUND && write_pages (&req) == -1)
    goto out;
  ret = 0;

 out:
  if (promised) {
    pthread_mutex_lock (&c->lock);
    c->dirty_promised -= promised;
    pthread_mutex_unlock (&c->lock);
  }
  order_owned (NULL, 0, 0);
  rangelock_release (&c->ranges, first, last);
  if (ret == -1 && writeback && cache_degraded (c)) {
    /* The cache device failed under this very write: do it again
     * around the cache (pages it already dirtied are written back
     * first).
     */
    return write_degraded (c, be, buf, count, offset, fua, err);
  }
  /* A FUA write is durable as the flush mode says.  In writethrough it
   * is durable on the backend already; syncing the cache too keeps an
   * older cached copy from coming back after power loss.
   */
  if (ret == 0 && fua) {
    if (writeback)
      ret = cache_flush (c, be, err);
    else
      cache_sync (c, err);
  }
  return ret;
}
