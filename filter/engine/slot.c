/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: slot bookkeeping.
 *
 * Owns what every path does to one slot: page geometry and data CRCs,
 * pins, the state counters, committing a slot's entry to the cache
 * file, allocation (a free slot, or a clean one evicted by the policy)
 * and cache-device errors.  Everything named *_locked, and the page
 * table and policy calls, run under c->lock (see the lock table in
 * cache-int.h); entry and data I/O run without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"

/* Zeroes standing in for invalid sectors in data CRCs. */
static const uint8_t zero_sector[LAYOUT_MAX_PAGE / LAYOUT_MAX_SECTORS];

void
cache_policy_insert (struct cache *c, uint32_t s, uint64_t page)
{
  evict_insert_page (c->ev, s, page);
}

uint64_t
cache_now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
cache_sleep_ms (uint64_t ms)
{
  struct timespec ts = { .tv_sec = ms / 1000,
                         .tv_nsec = (ms % 1000) * 1000000 };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

void
cache_touch_io (struct cache *c)
{
  atomic_store_explicit (&c->last_io_ms, cache_now_ms (),
                         memory_order_relaxed);
}

uint32_t
cache_page_bytes (const struct cache *c, uint64_t page)
{
  uint64_t start = page * c->page_size;

  if (start >= c->backend_size)
    return 0;
  if (c->backend_size - start < c->page_size)
    return c->backend_size - start;
  return c->page_size;
}

void
cache_map_fill (const struct cache *c, uint8_t *map)
{
  memset (map, 0, LAYOUT_MAX_SECTORS / 8);
  for (unsigned i = 0; i < c->nsectors; i++)
    layout_bit_set (map, i);
}

uint32_t
cache_page_crc (const struct cache *c, const uint8_t *buf,
                const uint8_t *valid)
{
  uint32_t crc = 0;

  for (unsigned i = 0; i < c->nsectors; i++) {
    const uint8_t *p = layout_bit_test (valid, i)
      ? buf + (size_t) i * c->sector_size : zero_sector;
    crc = layout_crc32c_update (crc, p, c->sector_size);
  }
  return crc;
}

void
cache_page_part (const struct cache *c, uint64_t page, uint64_t offset,
                 uint32_t count, uint32_t *a, uint32_t *b)
{
  const uint64_t pstart = page * c->page_size;

  *a = offset > pstart ? offset - pstart : 0;
  *b = offset + count < pstart + c->page_size ? offset + count - pstart
    : c->page_size;
}

void
cache_sector_span (const struct cache *c, uint32_t off, uint32_t n,
                   unsigned *first, unsigned *last)
{
  *first = off / c->sector_size;
  *last = (off + n - 1) / c->sector_size;
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
 */
static uint32_t
evict_locked (struct cache *c, bool fill)
{
  uint32_t s = fill ? evict_victim_fill (c->ev, can_take, c) :
    evict_victim (c->ev, can_take, c);

  if (s == EVICT_NONE)
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

/* Under c->lock.  *evicted: the slot was taken from a page, whose
 * range is now locked (see can_take).  why: cache_alloc_slot's.
 * *over_budget: the free list has slots
 * but the shared budget has no room (and reclaim, when true, asks for
 * PT_NONE then instead of an eviction, so that the caller may first
 * have another cache give space back).
 */
static uint32_t
alloc_locked (struct cache *c, enum alloc_for why, bool reclaim,
              bool *evicted, bool *over_budget)
{
  uint32_t s = pagetable_take_free (&c->pt);

  *evicted = false;
  *over_budget = s == PT_NONE && c->pt.nfree > 0;
  if (s != PT_NONE || (*over_budget && reclaim) || why == ALLOC_FREE ||
      (why == ALLOC_DIRTY_PART && cache_dirty_pressure_locked (c)))
    return s;
  s = evict_locked (c, why == ALLOC_FILL);
  *evicted = s != PT_NONE;
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

  if (cache_degraded (c))
    return false;
  pthread_mutex_lock (&c->lock);
  s = evict_locked (c, false);
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
