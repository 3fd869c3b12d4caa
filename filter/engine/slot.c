/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: slot bookkeeping.
 *
 * Owns what every path does to one slot: pins, the state counters,
 * committing a slot's entry to the cache file, whether it must be
 * copied before a rewrite (cache_must_cow), and cache-device errors
 * (degraded mode).  Geometry is geom.c's, allocation alloc.c's.
 * Everything named *_locked, and the page table and policy calls, run
 * under c->lock (see the lock table in docs/design.md); entry and data I/O
 * run without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"

void
cache_policy_insert (struct cache *c, uint32_t s, uint64_t page)
{
  evict_insert_page (c->ev, s, page);
}

/* Under c->lock. */
void
cache_release_slot_locked (struct cache *c, uint32_t s)
{
  pagetable_put_free (&c->pt, s);
  pthread_cond_broadcast (&c->space);
}

void
cache_unpin (struct cache *c, uint32_t s)
{
  pthread_mutex_lock (&c->lock);
  if (pt_unpin (&c->pt, s) == 0 && (pt_flags (&c->pt, s) & PT_ORPHAN))
    cache_release_slot_locked (c, s);
  atomic_store_explicit (&c->stats.partial_maps, c->pt.side_used,
                         memory_order_relaxed);
  pthread_mutex_unlock (&c->lock);
}

uint32_t
cache_lookup_pin (struct cache *c, uint64_t page)
{
  uint32_t s;

  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s != PT_NONE)
    pt_pin (&c->pt, s);
  pthread_mutex_unlock (&c->lock);
  return s;
}

#define READ_ERRORS_MAX 16      /* then the device is taken as failed */

bool
cache_degraded (const struct cache *c)
{
  return atomic_load_explicit (&c->degraded, memory_order_relaxed);
}

/* A cache-file I/O error.  A failed write (EIO, ENOSPC...) or too many
 * failed reads switch the cache to degraded mode: from then on the
 * backend serves everything, and the dirty pages still in the cache
 * are written back (or reported, if they cannot be read).
 */
void
cache_io_error (struct cache *c, const char *what, uint32_t s)
{
  bool is_read = strncmp (what, "reading", 7) == 0;

  STATS_ADD (&c->stats, cache_errors, 1);
  log_error ("cache file %s: %s (slot %u): %m", c->path, what, s);
  if (is_read && atomic_fetch_add (&c->read_errors, 1) + 1 < READ_ERRORS_MAX)
    return;
  if (!atomic_exchange (&c->degraded, true)) {
    atomic_store (&c->stats.degraded, 1);
    log_error ("cache file %s: the cache device is failing: switching to "
               "degraded mode, every request goes to the backend from now on "
               "(pages with dirty data stay and are written back)", c->path);
  }
}

bool
cache_page_dirty_locked (const struct cache *c, uint64_t page)
{
  uint32_t s = pagetable_lookup (&c->pt, page);

  return s != PT_NONE && pt_state (&c->pt, s) == LAYOUT_DIRTY;
}

bool
cache_page_dirty (struct cache *c, uint64_t page)
{
  bool r;

  pthread_mutex_lock (&c->lock);
  r = cache_page_dirty_locked (c, page);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Under c->lock: keep c->ndirty in step with an indexed slot's state. */
void
cache_set_state_counts_locked (struct cache *c, uint8_t old_state,
                        uint8_t new_state)
{
  if (old_state == LAYOUT_DIRTY && new_state != LAYOUT_DIRTY) {
    c->ndirty--;
    pthread_cond_broadcast (&c->space);
  }
  else if (old_state != LAYOUT_DIRTY && new_state == LAYOUT_DIRTY)
    c->ndirty++;
  atomic_store_explicit (&c->stats.dirty_pages, c->ndirty,
                         memory_order_relaxed);
}

/* Under c->lock, from cache_commit_entry: slot s has just become
 * unsealed; list it (using the caller's reservation; the list is
 * seal.c's).
 */
void
cache_unseal_listed_locked (struct cache *c, uint32_t s)
{
  if (c->unseal_reserved > 0)
    c->unseal_reserved--;
  if (pt_flags (&c->pt, s) & PT_LISTED)
    return;
  pt_flags_on (&c->pt, s, PT_LISTED);
  c->unsealed[c->nunsealed++] = s;
}

/* Write the entry of pinned (or privately owned) slot s with a new
 * sequence number after copying upd's contents into it (and its
 * PT_UNSEALED flag).  The slot's epoch is set once the write has
 * completed: the current one, or epoch if that is earlier.
 */
static int
commit_entry (struct cache *c, uint32_t s, const struct pt_slot *upd,
              uint64_t epoch, bool new_data)
{
  struct layout_entry e;
  struct pt_slot v;
  uint16_t flags;
  int r;

  pthread_mutex_lock (&c->lock);
  flags = pt_flags (&c->pt, s);
  if (flags & PT_INDEXED)
    cache_set_state_counts_locked (c, pt_state (&c->pt, s), upd->state);
  if ((upd->flags & PT_UNSEALED) && !(flags & PT_UNSEALED))
    cache_unseal_listed_locked (c, s);
  pt_set_flags (&c->pt, s, (flags & ~(PT_UNSEALED | PT_EVICTED)) |
                (upd->flags & PT_UNSEALED));
  if (!(flags & PT_INDEXED))
    pt_set_page (&c->pt, s, upd->page);
  pt_set_state (&c->pt, s, upd->state);
  pt_set_crc (&c->pt, s, upd->data_crc);
  if (!pt_maps_set (&c->pt, s, upd->valid, upd->dirty)) {
    /* Callers reserve room for maps that need it before they write
     * (pt_maps_reserve_for): not reached.  Never lose the maps.
     */
    log_error ("cache file %s: slot %u: partial-map table full at an "
               "entry write; going past its limit", c->path, s);
    if (!pt_maps_set_force (&c->pt, s, upd->valid, upd->dirty))
      abort ();
  }
  pt_set_seq (&c->pt, s, ++c->seq);
  pt_set_epoch (&c->pt, s, PT_EPOCH_PENDING);
  /* New dirty data is of the open flush generation (order.c). */
  pt_set_gen (&c->pt, s, new_data && upd->state == LAYOUT_DIRTY
              ? c->gen : upd->gen);
  pagetable_get (&c->pt, s, &v);
  pagetable_to_entry (&v, &e);
  if (flags & PT_INDEXED)
    e.hint = evict_slot_hint (c->ev, s);
  pthread_mutex_unlock (&c->lock);

  r = pool_write_entry (&c->pool, s, &e);

  pthread_mutex_lock (&c->lock);
  pt_set_epoch (&c->pt, s, c->epoch < epoch ? c->epoch : epoch);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Sealing: the data is not new, its generation stays. */
int
cache_commit_entry_at (struct cache *c, uint32_t s, const struct pt_slot *upd,
                       uint64_t epoch)
{
  return commit_entry (c, s, upd, epoch, false);
}

int
cache_commit_entry (struct cache *c, uint32_t s, const struct pt_slot *upd)
{
  return commit_entry (c, s, upd, CACHE_EPOCH_NOW, true);
}

/* May slot s not be rewritten in place (under c->lock)?  True if it
 * holds dirty data a client flushed: a torn rewrite would lose it.
 */
bool
cache_must_cow (const struct cache *c, uint32_t s)
{
  /* flushing_epoch, not flushed_epoch: data a flush in progress covers
   * is already off limits.
   */
  if (pt_state (&c->pt, s) == LAYOUT_DIRTY)
    /* (The flush order: dirty data of a closed generation must stay as
     * it is for that generation's writeback, even in a copy made since
     * that a flush does not cover yet, read.c: complete_partial.)
     */
    return pt_epoch_may_be_at_most (&c->pt, s, c->flushing_epoch) ||
      (c->wbcfg.order == CACHE_ORDER_FLUSH && pt_gen (&c->pt, s) < c->gen);
  /* A clean slot whose older version is still on disk (not yet freed):
   * it was written back, so the backend is newer than that older
   * version's dirty data.  Rewritten in place, then dropped by a crash
   * (torn or unsealed), it would let recovery serve the older version.
   * It stays as it is until a flush frees its predecessor.
   */
  return pt_flags (&c->pt, s) & PT_HASPRED;
}
