/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: a client FLUSH.
 *
 * Owns cache_flush: a sync of the cache file (epoch.c) and, with
 * ssdcache-flush=backend or a failed cache device, a full writeback and
 * a backend flush first.  No lock of its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* FLUSH with a failed cache device: its own durability cannot be
 * trusted, so the backend must hold everything a flush covers.
 */
static int
degraded_flush (struct cache *c, const struct cache_backend *be, int *err)
{
  const struct clean_opts all = { .target = 0 };
  int r, tries = 0;
  struct timespec ms = { .tv_sec = 0, .tv_nsec = 1000000 };

  /* Busy pages (r == 1) belong to requests in flight: let them end. */
  while ((r = clean_pass (c, be, &all, err)) == 1 && ++tries < 10000)
    nanosleep (&ms, NULL);
  if (r != 0) {
    if (r == 1)
      *err = EIO;
    return -1;
  }
  atomic_store (&c->backend_unflushed, false);
  return be->flush ? be->flush (be->h, err) : 0;
}

int
cache_flush (struct cache *c, const struct cache_backend *be, int *err)
{
  bool wb = c->mode == LAYOUT_MODE_WRITEBACK;

  cache_touch_io (c);
  if (wb && cache_degraded (c))
    return degraded_flush (c, be, err);
  if (wb && c->flush_mode == CACHE_FLUSH_BACKEND && c->hooks.wb_request_all) {
    if (c->hooks.wb_request_all (c, err) == -1)
      return -1;
  }
  /* Anything sent straight to the backend (writethrough writes, or
   * writeback zeroes/trims, pass-through, and writes that found the
   * cache full).
   */
  if (!wb || atomic_exchange (&c->backend_unflushed, false) ||
      c->flush_mode == CACHE_FLUSH_BACKEND) {
    if (be->flush && be->flush (be->h, err) == -1) {
      atomic_store (&c->backend_unflushed, true);
      return -1;
    }
  }
  /* Only dirty data makes the cache file's own durability matter. */
  if (cache_sync (c, err) == -1) {
    if (!wb || cache_dirty_pages (c) == 0)
      return 0;
    if (cache_degraded (c))
      return degraded_flush (c, be, err);
    return -1;
  }
  return 0;
}
