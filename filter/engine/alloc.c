/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: slot allocation and eviction.
 *
 * Owns cache_alloc_slot: a free slot, or a clean one the replacement
 * policy evicts (its page's range try-locked, and a FREE entry written
 * before that page may change elsewhere: forget_evicted), waiting for
 * writeback when every slot is dirty or busy; and cache_give_slot,
 * which hands a slot back to a shared budget.  The page table and the
 * policy under c->lock (lock table: docs/design.md); entry I/O without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"

/* Under c->lock: may clean slot s be evicted?  Its page's range is
 * locked here too (if nobody holds it): cache_alloc_slot keeps that
 * page from changing until the slot's entry on disk no longer names it.
 */
static bool
can_take (void *opaque, uint32_t s)
{
  struct cache *c = opaque;

  return pt_pins (&c->pt, s) == 0 && pt_state (&c->pt, s) == LAYOUT_CLEAN &&
    (pt_flags (&c->pt, s) & PT_INDEXED) &&
    !cache_needs_settling_locked (c, s) &&
    rangelock_try_acquire (&c->ranges, pt_page (&c->pt, s),
                           pt_page (&c->pt, s)) == 0;
}

/* Under c->lock: are dirty pages above the high watermark (writeback
 * is behind)?
 */
bool
cache_dirty_pressure_locked (const struct cache *c)
{
  return c->ndirty * 100 >= (uint64_t) c->nslots * c->wbcfg.high_pct;
}

/* Under c->lock: evict a clean slot from its page (whose range is then
 * locked, see can_take), or PT_NONE.  fill: as evict_victim_fill.
 * *again: the policy's search stopped at its step limit: let go of
 * c->lock (for others) and call again.
 */
static uint32_t
evict_locked (struct cache *c, bool fill, bool *again)
{
  uint32_t s = fill ? evict_victim_fill (c->ev, can_take, c) :
    evict_victim (c->ev, can_take, c);

  *again = s == EVICT_AGAIN;
  if (s == EVICT_NONE || s == EVICT_AGAIN)
    return PT_NONE;
  pagetable_remove (&c->pt, s);
  if (pt_flags (&c->pt, s) & PT_PREFETCHED)
    STATS_ADD (&c->stats, prefetch_wasted, 1);   /* never read */
  pt_set_flags (&c->pt, s, PT_EVICTED);
  STATS_ADD (&c->stats, evictions, 1);
  if (ssdcache_debug_verbose)
    log_debug ("evict slot %u (page %llu)", s,
               (unsigned long long) pt_page (&c->pt, s));
  return s;
}

/* Under c->lock: let go of it for a moment, so that the requests
 * waiting for it go first (an eviction spread over several calls).
 * A sleep, not sched_yield: a mutex is not fair, and a yielding thread
 * on a CPU of its own takes it back before the woken waiter runs
 * (measured: a hit then still waited 0.3 s behind the first eviction
 * of a hot cache of 64 Mi slots; with the sleep, under 0.1 s).
 */
static void
cache_lock_yield (struct cache *c)
{
  const struct timespec pause = { 0, 1000 };    /* (the timer's slack
                                                   makes it ~50 us) */

  STATS_ADD (&c->stats, eviction_pauses, 1);
  pthread_mutex_unlock (&c->lock);
  nanosleep (&pause, NULL);
  pthread_mutex_lock (&c->lock);
}

/* Under c->lock.  *evicted: the slot was taken from a page, whose
 * range is now locked (see can_take).  why: cache_alloc_slot's.
 * *over_budget: the free list has slots
 * but the shared budget has no room (and reclaim, when true, asks for
 * PT_NONE then instead of an eviction, so that the caller may first
 * have another cache give space back).  An eviction that takes long
 * lets go of c->lock now and then (cache_lock_yield).
 */
static uint32_t
alloc_locked (struct cache *c, enum alloc_for why, bool reclaim,
              bool *evicted, bool *over_budget)
{
  uint32_t s;
  bool again;

  for (;;) {
    s = pagetable_take_free (&c->pt);
    *evicted = false;
    *over_budget = s == PT_NONE && c->pt.nfree > 0;
    if (s != PT_NONE || (*over_budget && reclaim) || why == ALLOC_FREE ||
        (why == ALLOC_DIRTY_PART && cache_dirty_pressure_locked (c)))
      break;
    s = evict_locked (c, why == ALLOC_FILL, &again);
    if (!again) {
      *evicted = s != PT_NONE;
      break;
    }
    cache_lock_yield (c);
  }
  if (s != PT_NONE)
    cache_suspect_take_locked (c, s);   /* new data: not torn */
  return s;
}

/* Under nothing: write a FREE entry (with a new sequence number) for
 * slot s.  Returns 0, or -1 after reporting the error.
 */
int
cache_write_free_entry (struct cache *c, uint32_t s)
{
  struct layout_entry e;

  memset (&e, 0, sizeof e);
  e.state = LAYOUT_FREE;
  pthread_mutex_lock (&c->lock);
  e.seq = ++c->seq;
  pthread_mutex_unlock (&c->lock);
  if (pool_write_entry (&c->pool, s, &e) == -1) {
    cache_io_error (c, "writing free entry", s);
    return -1;
  }
  return 0;
}

/* Slot s was just evicted from page (whose range can_take locked): its
 * entry on disk still names that page, with data that verifies.  Were
 * the page changed elsewhere now (a write to the backend, a flush) and
 * the process to die before s is written again, that entry would bring
 * the old data back at the next start.  So a FREE entry goes first,
 * then the page may change.  (If it cannot be written, PT_EVICTED stays
 * set: the slot's next user writes its entry before its data.)
 */
static void
forget_evicted (struct cache *c, uint32_t s, uint64_t page)
{
  if (cache_write_free_entry (c, s) == 0) {
    pthread_mutex_lock (&c->lock);
    pt_flags_off (&c->pt, s, PT_EVICTED);
    pthread_mutex_unlock (&c->lock);
  }
  rangelock_release (&c->ranges, page, page);
}

/* A slot nobody else can reach, or PT_NONE.  Only clean slots are ever
 * evicted.  With wait (for written data), when every slot is dirty or
 * busy, wake the writeback thread and wait for it to clean some.
 * Without (for data read from the backend, which need not be cached),
 * a page the replacement policy holds as used more than once is not
 * evicted while newer pages are only busy (evict_victim_fill): the
 * caller serves the read without caching it.
 */
uint32_t
cache_alloc_slot (struct cache *c, enum alloc_for why)
{
  uint32_t s;
  bool evicted, over;
  bool may_reclaim = c->reclaim != NULL && why != ALLOC_FREE;
  uint64_t page = 0, ndirty;

  pthread_mutex_lock (&c->lock);
  for (;;) {
    s = alloc_locked (c, why, may_reclaim, &evicted, &over);
    if (s != PT_NONE || !over || !may_reclaim)
      break;
    /* Another export may give space back: ask once, unlocked (its
     * locks never nest with ours).
     */
    pthread_mutex_unlock (&c->lock);
    may_reclaim = c->reclaim (c, c->reclaim_opaque);
    pthread_mutex_lock (&c->lock);
  }
  if (evicted)
    page = pt_page (&c->pt, s);
  ndirty = c->ndirty;
  pthread_mutex_unlock (&c->lock);
  if (evicted)
    forget_evicted (c, s, page);
  /* No waiting: the writer goes around the cache (or writes its page
   * back itself), and writeback is told that slots are wanted.
   */
  if (s == PT_NONE && (why == ALLOC_DIRTY || why == ALLOC_DIRTY_PART) &&
      ndirty > 0 && c->hooks.wb_kick)
    c->hooks.wb_kick (c);
  return s;
}

bool
cache_give_slot (struct cache *c)
{
  uint32_t s;
  uint64_t page;
  bool again;

  if (cache_degraded (c))
    return false;
  pthread_mutex_lock (&c->lock);
  while ((s = evict_locked (c, false, &again)) == PT_NONE && again)
    cache_lock_yield (c);
  page = s != PT_NONE ? pt_page (&c->pt, s) : 0;
  pthread_mutex_unlock (&c->lock);
  if (s == PT_NONE)
    return false;
  forget_evicted (c, s, page);
  pool_punch_slot (&c->pool, s);
  pthread_mutex_lock (&c->lock);
  /* A FREE entry that could not be written leaves PT_EVICTED: the slot
   * is then kept (its next user writes the entry first) but still
   * counts as given, as the caller's retry finds out.
   */
  if (!(pt_flags (&c->pt, s) & PT_EVICTED))
    cache_release_slot_locked (c, s);
  pthread_mutex_unlock (&c->lock);
  STATS_ADD (&c->stats, slots_given, 1);
  return true;
}
