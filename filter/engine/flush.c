/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: a client FLUSH.
 *
 * Owns cache_flush: a sync of the cache file (epoch.c) and, with
 * ssdcache-flush=backend or a failed cache device, a full writeback
 * from the client's own thread (clean.c: clean_all_now) and a backend
 * flush first.  No lock of its own.
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
  if (clean_all_now (c, be, err) == -1)
    return -1;
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
  /* ssdcache-flush=backend: everything written back, by this request
   * itself (not by the writeback thread, which may not run, and whose
   * passes skip the pages other clients hold).
   */
  if (wb && c->flush_mode == CACHE_FLUSH_BACKEND &&
      clean_all_now (c, be, err) == -1)
    return -1;
  /* Anything sent straight to the backend (writethrough writes, or
   * writeback zeroes/trims, degraded mode, and writes that found the
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
