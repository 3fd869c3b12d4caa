/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: what the rest of the filter may read of a
 * cache, and the mode switch.
 *
 * Owns the accessors of engine/cache.h that bg/ and the nbdkit layer
 * use instead of struct cache's fields (counts, sizes, configuration,
 * the background threads' state and hooks), and cache_set_mode.
 * Counts that change are read under c->lock; fields fixed at open are
 * read without it (lock table: docs/design.md).
 */
#include <pthread.h>
#include <stdlib.h>

#include "cache-int.h"

uint64_t
cache_held_bytes (struct cache *c)
{
  uint64_t n;

  pthread_mutex_lock (&c->lock);
  n = (uint64_t) (c->pt.nslots - c->pt.nfree) * c->page_size;
  pthread_mutex_unlock (&c->lock);
  return n;
}

int
cache_remove_file (const char *path)
{
  return pool_remove_file (path);
}

uint64_t
cache_free_slots (struct cache *c)
{
  uint64_t n;

  pthread_mutex_lock (&c->lock);
  n = c->pt.nfree;
  if (c->budget) {
    uint64_t used = budget_used (c->budget);
    uint64_t room = used < c->budget->limit
      ? (c->budget->limit - used) / c->page_size : 0;
    if (room < n)
      n = room;
  }
  pthread_mutex_unlock (&c->lock);
  return n;
}

void *
cache_bg_get (const struct cache *c, enum cache_bg which)
{
  return c->bg[which];
}

void
cache_bg_set (struct cache *c, enum cache_bg which, void *state)
{
  c->bg[which] = state;
}

struct cache_hooks *
cache_hooks (struct cache *c)
{
  return &c->hooks;
}

const struct cache_writeback_config *
cache_writeback_config (const struct cache *c)
{
  return &c->wbcfg;
}

uint64_t
cache_change_seq (struct cache *c)
{
  uint64_t s;

  pthread_mutex_lock (&c->lock);
  s = c->seq;
  pthread_mutex_unlock (&c->lock);
  return s;
}

uint64_t
cache_last_io_ms (const struct cache *c)
{
  return atomic_load_explicit (&((struct cache *) c)->last_io_ms,
                               memory_order_relaxed);
}

const char *
cache_export_name (const struct cache *c)
{
  return c->export_name;
}

struct stats *
cache_stats (struct cache *c)
{
  return &c->stats;
}

uint32_t
cache_page_size (const struct cache *c)
{
  return c->page_size;
}

int
cache_rotational (const struct cache *c)
{
  if (cache_degraded (c))
    return -1;
  return pool_rotational (&c->pool);
}

uint64_t
cache_nslots (const struct cache *c)
{
  return c->nslots;
}

uint64_t
cache_backend_size (const struct cache *c)
{
  return c->backend_size;
}

uint64_t
cache_dirty_pages (struct cache *c)
{
  uint64_t n;

  pthread_mutex_lock (&c->lock);
  n = c->ndirty;
  pthread_mutex_unlock (&c->lock);
  return n;
}

enum layout_mode
cache_mode (const struct cache *c)
{
  return c->mode;
}

void
cache_set_mode (struct cache *c, enum layout_mode mode)
{
  c->mode = mode;
  /* Every write reads the mode under its pages' range lock: a barrier
   * waits for those that took theirs before the new mode was stored
   * (and only for them: see rangelock.h).
   */
  rangelock_barrier (&c->ranges);
}
