/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the cache engine: slot helpers, durability
 * (sync epochs, copy on write), and the read path.
 *
 * See cache-int.h for what c->lock, c->ranges and pins protect.  The
 * rules that keep the cache file consistent across crashes:
 *  - slot data is written before the entry that describes it, so a torn
 *    update shows up as a data CRC mismatch;
 *  - in writethrough/writearound mode the backend is written before the
 *    cache, so clean data in the cache is always data the backend has;
 *  - durable dirty data is never overwritten in place (copy on write);
 *  - the data CRC of each slot is checked on its first use after the
 *    cache is opened; clean slots that fail are dropped, dirty ones are
 *    marked bad and reads of them fail with EIO, never wrong data.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admit.h"
#include "cache-int.h"
#include "log.h"
#include "verify.h"
#include "prefetch.h"
#include "writeback.h"

/* Zeroes standing in for invalid sectors in data CRCs. */
static const uint8_t zero_sector[LAYOUT_MAX_PAGE / LAYOUT_MAX_SECTORS];

#define ALLOC_WAIT_MAX_MS 2000   /* then fall back (write through, or
                                    write the page back ourselves) */

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
cache_sector_span (const struct cache *c, uint32_t off, uint32_t n,
                   unsigned *first, unsigned *last)
{
  *first = off / c->sector_size;
  *last = (off + n - 1) / c->sector_size;
}

/* Under c->lock. */
static void
release_slot_locked (struct cache *c, uint32_t s)
{
  pagetable_put_free (&c->pt, s);
  pthread_cond_broadcast (&c->space);
}

void
cache_unpin (struct cache *c, uint32_t s)
{
  pthread_mutex_lock (&c->lock);
  if (pt_unpin (&c->pt, s) == 0 && (pt_flags (&c->pt, s) & PT_ORPHAN))
    release_slot_locked (c, s);
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
 * failed reads switch the cache to pass-through: from then on the
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
               "pass-through, the backend serves all requests from now on "
               "(pages with dirty data stay and are written back)", c->path);
  }
}

bool
cache_page_dirty (struct cache *c, uint64_t page)
{
  uint32_t s;
  bool r;

  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  r = s != PT_NONE && pt_state (&c->pt, s) == LAYOUT_DIRTY;
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Under c->lock: keep c->ndirty in step with an indexed slot's state. */
void
cache_set_state_counts (struct cache *c, uint8_t old_state,
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

/* Write the entry of pinned (or privately owned) slot s with a new
 * sequence number after copying upd's contents into it (and its
 * PT_UNSEALED flag).  The slot's epoch is set once the write has
 * completed: the current one, or epoch if that is earlier.
 */
int
cache_commit_entry_at (struct cache *c, uint32_t s, const struct pt_slot *upd,
                       uint64_t epoch)
{
  struct layout_entry e;
  struct pt_slot v;
  uint16_t flags;
  int r;

  pthread_mutex_lock (&c->lock);
  flags = pt_flags (&c->pt, s);
  if (flags & PT_INDEXED)
    cache_set_state_counts (c, pt_state (&c->pt, s), upd->state);
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

int
cache_commit_entry (struct cache *c, uint32_t s, const struct pt_slot *upd)
{
  return cache_commit_entry_at (c, s, upd, CACHE_EPOCH_NOW);
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
    return pt_epoch_may_be_at_most (&c->pt, s, c->flushing_epoch);
  /* A clean slot whose older version is still on disk (not yet freed):
   * it was written back, so the backend is newer than that older
   * version's dirty data.  Rewritten in place, then dropped by a crash
   * (torn or unsealed), it would let recovery serve the older version.
   * It stays as it is until a flush frees its predecessor.
   */
  return pt_flags (&c->pt, s) & PT_HASPRED;
}

/* Under c->lock: must the cache file be synced before slot s may stop
 * holding its page?  True while an older version of the page is still
 * on disk (not yet freed): losing s could bring it back after a crash.
 */
static bool
needs_settling (const struct cache *c, uint32_t s)
{
  return pt_flags (&c->pt, s) & PT_HASPRED;
}

static int sync_epoch (struct cache *c, bool client, bool seal_wait,
                       int *err);

/* Does slot s still need settling?  Another client sync may have taken
 * s's predecessors off c->sup and be freeing them now: its end is
 * waited for first.
 */
static bool
still_pending (struct cache *c, uint32_t s)
{
  bool pending;

  pthread_mutex_lock (&c->lock);
  while (needs_settling (c, s) && c->nfreeing > 0)
    pthread_cond_wait (&c->space, &c->lock);
  pending = needs_settling (c, s);
  pthread_mutex_unlock (&c->lock);
  return pending;
}

/* Settle slot s (pinned, its page range locked by the caller) before
 * it is dropped or changed in place: free its older versions still on
 * disk.  An unsealed successor is sealed first: its predecessor is
 * freed only once a sealed successor is flushed.  Returns true once
 * none is left (false: a cache-file error).
 */
bool
cache_settle (struct cache *c, uint32_t s)
{
  for (int i = 0; i < 4; i++) {
    int err;

    if (!still_pending (c, s))
      return true;
    if (cache_seal_slot (c, s, CACHE_EPOCH_NOW) == -1 ||
        sync_epoch (c, true, false, &err) == -1)
      return false;
  }
  return !still_pending (c, s);
}

/* Drop pinned slot s (its page is range locked by the caller): it
 * leaves the index at once and is freed when its last pin goes.
 * Consumes the caller's pin.
 */
int
cache_drop_slot (struct cache *c, uint32_t s)
{
  static const uint8_t none[LAYOUT_MAX_SECTORS / 8];
  struct layout_entry e;
  struct pt_slot v;
  uint64_t page;
  bool was_dirty;
  int r;

  cache_settle (c, s);
  pthread_mutex_lock (&c->lock);
  page = pt_page (&c->pt, s);
  was_dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY;
  if (pt_flags (&c->pt, s) & PT_INDEXED) {
    cache_set_state_counts (c, pt_state (&c->pt, s), LAYOUT_FREE);
    pagetable_remove (&c->pt, s);
    evict_remove (c->ev, s);
  }
  if (pt_flags (&c->pt, s) & PT_PREFETCHED)
    STATS_ADD (&c->stats, prefetch_wasted, 1);   /* never read */
  pt_flags_on (&c->pt, s, PT_ORPHAN);
  pt_flags_off (&c->pt, s, PT_VERIFIED | PT_BAD | PT_HASPRED | PT_UNSEALED |
                PT_PREFETCHED);
  pt_set_state (&c->pt, s, LAYOUT_FREE);
  pt_maps_set (&c->pt, s, none, none);
  pt_set_seq (&c->pt, s, ++c->seq);
  pagetable_get (&c->pt, s, &v);
  pagetable_to_entry (&v, &e);
  pthread_mutex_unlock (&c->lock);

  r = pool_write_entry (&c->pool, s, &e);
  if (r == -1) {
    cache_io_error (c, "writing free entry", s);
    cache_stale_add (c, s, page, was_dirty);
  }
  STATS_ADD (&c->stats, pages_invalidated, 1);
  cache_unpin (c, s);
  return r;
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
    (pt_flags (&c->pt, s) & PT_INDEXED) && !needs_settling (c, s) &&
    rangelock_try_acquire (&c->ranges, pt_page (&c->pt, s),
                           pt_page (&c->pt, s)) == 0;
}

/* Under c->lock.  *evicted: the slot was taken from a page, whose
 * range is now locked (see can_take).  fill: for data read from the
 * backend (evict_victim_fill).
 */
static uint32_t
alloc_locked (struct cache *c, bool fill, bool *evicted)
{
  uint32_t s = pagetable_take_free (&c->pt);

  *evicted = false;
  if (s != PT_NONE)
    return s;
  s = fill ? evict_victim_fill (c->ev, can_take, c) :
    evict_victim (c->ev, can_take, c);
  if (s == EVICT_NONE)
    return PT_NONE;
  *evicted = true;
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
cache_alloc_slot (struct cache *c, bool wait)
{
  uint32_t s;
  uint64_t start = 0;
  bool evicted;
  uint64_t page = 0;

  pthread_mutex_lock (&c->lock);
  while ((s = alloc_locked (c, !wait, &evicted)) == PT_NONE && wait &&
         c->wb && c->ndirty > 0) {
    struct timespec ts;
    uint64_t now = cache_now_ms ();

    if (start == 0)
      start = now;
    else if (now - start > ALLOC_WAIT_MAX_MS)
      break;
    writeback_kick (c);
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait (&c->space, &c->lock, &ts);
  }
  if (evicted)
    page = pt_page (&c->pt, s);
  pthread_mutex_unlock (&c->lock);
  if (evicted)
    forget_evicted (c, s, page);
  if (start)
    STATS_ADD (&c->stats, wait_ms, cache_now_ms () - start);
  return s;
}

/* Under nothing: record that old (pinned by the caller) was replaced by
 * succ for page; old stays on disk until succ is durable.  Consumes the
 * caller's pin on old.
 */
void
cache_supersede (struct cache *c, uint32_t old, uint32_t succ, uint64_t page)
{
  uint8_t hint = 0;

  pthread_mutex_lock (&c->lock);
  if (c->nsup == c->capsup) {
    size_t cap = c->capsup ? c->capsup * 2 : 64;
    struct cache_sup *p = realloc (c->sup, cap * sizeof *p);
    if (p == NULL) {
      /* Cannot remember it: keep it out of use for good, which is safe. */
      log_error ("realloc: %m");
      goto out;
    }
    c->sup = p;
    c->capsup = cap;
  }
  c->sup[c->nsup].slot = old;
  c->sup[c->nsup].succ = succ;
  c->nsup++;
  /* Older versions waiting for old now wait for succ: old may be
   * unsealed, and it goes when succ is flushed anyway.
   */
  for (size_t i = 0; i + 1 < c->nsup; i++)
    if (c->sup[i].succ == old)
      c->sup[i].succ = succ;
 out:
  {
    if (pt_flags (&c->pt, old) & PT_INDEXED) {
      /* The new version inherits the old one's hotness. */
      hint = evict_slot_hint (c->ev, old);
      cache_set_state_counts (c, pt_state (&c->pt, old), LAYOUT_FREE);
      pagetable_remove (&c->pt, old);
      evict_remove (c->ev, old);
    }
    pt_flags_on (&c->pt, old, PT_SUPERSEDED);
    pt_unpin (&c->pt, old);
  }
  pt_flags_on (&c->pt, succ, PT_HASPRED);
  pagetable_insert (&c->pt, succ, page);
  evict_insert_hint (c->ev, succ, hint);
  cache_set_state_counts (c, LAYOUT_FREE, pt_state (&c->pt, succ));
  STATS_ADD (&c->stats, cow_copies, 1);
  pthread_mutex_unlock (&c->lock);
}

/* Free superseded slots whose successors are flushed (called after a
 * client flush): FREE entries for all of them, made durable at once,
 * so that an older version can never come back once its successor may
 * be dropped, evicted or rewritten.
 */
static void
free_superseded (struct cache *c)
{
  struct cache_sup *done = NULL;
  size_t n = 0;
  bool ok = true;

  pthread_mutex_lock (&c->lock);
  if (c->nsup > 0)
    done = malloc (c->nsup * sizeof *done);
  for (size_t i = 0; done && i < c->nsup;) {
    uint32_t succ = c->sup[i].succ;
    if (!pt_epoch_surely_at_most (&c->pt, succ, c->flushed_epoch) ||
        (pt_flags (&c->pt, succ) & PT_UNSEALED)) {
      i++;
      continue;
    }
    done[n++] = c->sup[i];
    memmove (c->sup + i, c->sup + i + 1, (c->nsup - i - 1) * sizeof *c->sup);
    c->nsup--;
  }
  if (n > 0)
    c->nfreeing++;
  pthread_mutex_unlock (&c->lock);
  if (n == 0) {
    free (done);
    return;
  }

  for (size_t i = 0; i < n; i++)
    if (cache_write_free_entry (c, done[i].slot) == -1)
      ok = false;
  if (ok && pool_sync (&c->pool) == -1) {
    cache_io_error (c, "fdatasync", 0);
    ok = false;
  }

  pthread_mutex_lock (&c->lock);
  for (size_t i = 0; i < n; i++) {
    uint32_t old = done[i].slot;
    if (!ok) {
      /* Keep both out of harm's way for good: a failing device. */
      continue;
    }
    pt_flags_off (&c->pt, done[i].succ, PT_HASPRED);
    pt_flags_off (&c->pt, old, PT_SUPERSEDED);
    pt_flags_on (&c->pt, old, PT_ORPHAN);
    pt_set_state (&c->pt, old, LAYOUT_FREE);
    if (pt_pins (&c->pt, old) == 0)
      release_slot_locked (c, old);
  }
  c->nfreeing--;
  pthread_cond_broadcast (&c->space);
  pthread_mutex_unlock (&c->lock);
  free (done);
}

/* A sync of the cache file.  client: a client's FLUSH (or close):
 * what it covers counts as flushed, and unsealed slots it covers are
 * sealed first (seal_wait: waiting for pages other requests hold; the
 * caller holds no range lock).
 */
/* Under c->lock: a client sync (epoch node->e) ends.  Slot epochs are
 * kept relative to a base (pagetable.h), which must stay at or below
 * c->flushed_epoch and the epoch of every client sync still in flight
 * (they compare slot epochs with these); move it up when it lags far.
 */
static void
client_sync_done_locked (struct cache *c, struct cache_sync_node *node)
{
  uint64_t low;

  if (node->prev)
    node->prev->next = node->next;
  else
    c->syncs_head = node->next;
  if (node->next)
    node->next->prev = node->prev;
  else
    c->syncs_tail = node->prev;

  low = c->flushed_epoch;
  if (c->syncs_head && c->syncs_head->e < low)
    low = c->syncs_head->e;    /* in start order: the oldest first */
  if (c->epoch - c->pt.epoch_base >= c->pt.epoch_span / 2 &&
      low > c->pt.epoch_base) {
    pagetable_epoch_rebase (&c->pt, low);
    STATS_ADD (&c->stats, pt_rebases, 1);
  }
}

static int
sync_epoch (struct cache *c, bool client, bool seal_wait, int *err)
{
  struct cache_sync_node node = { 0 };
  uint64_t e;
  int r = 0;

  pthread_mutex_lock (&c->lock);
  e = c->epoch++;
  if (client && e > c->flushing_epoch)
    c->flushing_epoch = e;
  if (client) {
    node.e = e;
    node.prev = c->syncs_tail;
    if (c->syncs_tail)
      c->syncs_tail->next = &node;
    else
      c->syncs_head = &node;
    c->syncs_tail = &node;
  }
  pthread_mutex_unlock (&c->lock);
  if (client) {
    /* Rewrites in place that decided before flushing_epoch moved must
     * end before the fdatasync, or they could tear what it covers.
     */
    pthread_rwlock_wrlock (&c->inplace);
    pthread_rwlock_unlock (&c->inplace);
    /* In writethrough, clean pages rewritten since the last flush are
     * unsealed too (cache-write.c: write_through_first): sealing them
     * keeps them across a crash.
     */
    cache_seal_epoch (c, e, seal_wait, c->mode != LAYOUT_MODE_WRITEBACK);
  }

  if (pool_sync (&c->pool) == -1) {
    *err = errno;
    cache_io_error (c, "fdatasync", 0);
    r = -1;
  }

  pthread_mutex_lock (&c->lock);
  if (r == 0 && e > c->durable_epoch)
    c->durable_epoch = e;
  if (r == 0 && client && e > c->flushed_epoch)
    c->flushed_epoch = e;
  if (client)
    client_sync_done_locked (c, &node);
  pthread_mutex_unlock (&c->lock);
  if (r == -1)
    return -1;
  if (client)
    free_superseded (c);
  STATS_ADD (&c->stats, cache_syncs, 1);
  return 0;
}

int
cache_sync (struct cache *c, int *err)
{
  return sync_epoch (c, true, true, err);
}

int
cache_sync_device (struct cache *c, int *err)
{
  return sync_epoch (c, false, false, err);
}

/* Store a whole page (buf: page_size bytes, zeroes past the end of the
 * backend), all sectors valid, the given ones dirty (NULL: clean), in
 * slot s (pinned by the caller; consumed) or in a new slot if s is
 * PT_NONE.  The page is range locked by the caller.  Returns 0, 1 if
 * no slot could be had (nothing stored), -1 on a cache error.
 * prefetch: readahead's, not a client's: a new slot is marked
 * PT_PREFETCHED and enters the policy as new, without asking the
 * ghost (a prefetch is no use of the page: a page the ghost remembers
 * goes to the main queue only when a client reads it again).
 */
int
cache_fill_slot (struct cache *c, uint64_t page, uint32_t s,
                 const uint8_t *buf, const uint8_t *dirty, bool prefetch)
{
  struct pt_slot upd = { .page = page, .state = LAYOUT_CLEAN };
  uint32_t target = s;
  bool cow = false, inplace = false;

  if (cache_degraded (c) && dirty == NULL) {
    /* Pass-through: nothing new goes into a failing cache. */
    if (s != PT_NONE)
      cache_drop_slot (c, s);
    return 1;
  }
  if (s != PT_NONE) {
    pthread_rwlock_rdlock (&c->inplace);
    pthread_mutex_lock (&c->lock);
    cow = cache_must_cow (c, s);
    pthread_mutex_unlock (&c->lock);
    if (cow)
      pthread_rwlock_unlock (&c->inplace);
    else
      inplace = true;
  }
  if (s == PT_NONE || cow) {
    target = cache_alloc_slot (c, dirty != NULL);
    if (target == PT_NONE) {
      if (s != PT_NONE)
        cache_unpin (c, s);
      STATS_ADD (&c->stats, bypassed, 1);
      return 1;
    }
  }
  cache_map_fill (c, upd.valid);
  if (dirty && !layout_map_empty (dirty)) {
    memcpy (upd.dirty, dirty, sizeof upd.dirty);
    upd.state = LAYOUT_DIRTY;
  }
  upd.data_crc = cache_page_crc (c, buf, upd.valid);

  /* Dirty sectors that are not one run need a side-table entry: with
   * none to be had, nothing is stored (like having no slot).
   */
  pthread_mutex_lock (&c->lock);
  if (!pt_maps_reserve_for (&c->pt, target, upd.valid, upd.dirty)) {
    STATS_ADD (&c->stats, partial_maps_full, 1);
    if (target != s)
      release_slot_locked (c, target);
    pthread_mutex_unlock (&c->lock);
    if (inplace)
      pthread_rwlock_unlock (&c->inplace);
    if (s != PT_NONE)
      cache_unpin (c, s);
    STATS_ADD (&c->stats, bypassed, 1);
    return 1;
  }
  pthread_mutex_unlock (&c->lock);

  if (pool_write_data (&c->pool, target, buf, c->page_size, 0) == -1) {
    cache_io_error (c, "writing data", target);
    goto fail;
  }
  if (cache_commit_entry (c, target, &upd) == -1) {
    cache_io_error (c, "writing entry", target);
    goto fail;
  }
  if (inplace)
    pthread_rwlock_unlock (&c->inplace);
  pthread_mutex_lock (&c->lock);
  pt_flags_on (&c->pt, target, PT_VERIFIED);
  pt_flags_off (&c->pt, target, PT_BAD);    /* wholly rewritten */
  if (target != s && s == PT_NONE) {
    pagetable_insert (&c->pt, target, page);
    if (prefetch) {
      pt_flags_on (&c->pt, target, PT_PREFETCHED);
      evict_insert (c->ev, target);
      STATS_ADD (&c->stats, prefetch_pages, 1);
    }
    else
      cache_policy_insert (c, target, page);
    cache_set_state_counts (c, LAYOUT_FREE, upd.state);
  }
  pthread_mutex_unlock (&c->lock);
  if (s == PT_NONE)
    STATS_ADD (&c->stats, fills, 1);
  else if (cow)
    cache_supersede (c, s, target, page);
  else
    cache_unpin (c, s);
  return 0;

 fail:
  if (inplace)
    pthread_rwlock_unlock (&c->inplace);
  if (target != s) {
    pthread_mutex_lock (&c->lock);
    release_slot_locked (c, target);
    pthread_mutex_unlock (&c->lock);
  }
  if (s != PT_NONE) {
    /* The old contents are still good unless we wrote over them. */
    if (target == s && !dirty)
      cache_drop_slot (c, s);
    else
      cache_unpin (c, s);
  }
  return -1;
}

/* Mark pinned slot s bad: its dirty data cannot be read back.  It stays
 * in the index so that reads of the page fail instead of returning the
 * backend's stale data.  Consumes the pin.
 */
static void
mark_bad (struct cache *c, uint32_t s)
{
  pthread_mutex_lock (&c->lock);
  if (!(pt_flags (&c->pt, s) & PT_BAD)) {
    pt_flags_on (&c->pt, s, PT_BAD);
    STATS_ADD (&c->stats, dirty_lost, 1);
    log_error ("cache file %s: DIRTY DATA LOST: slot %u (page %llu, "
               "bytes %llu-%llu) fails its data checksum; reads of it "
               "will fail with EIO until it is overwritten",
               c->path, s, (unsigned long long) pt_page (&c->pt, s),
               (unsigned long long) pt_page (&c->pt, s) * c->page_size,
               (unsigned long long) (pt_page (&c->pt, s) + 1) *
               c->page_size - 1);
  }
  pthread_mutex_unlock (&c->lock);
  cache_unpin (c, s);
}

/* ssdcache-verify=lazy: compare the clean sectors of pinned slot s
 * (its data, already CRC-checked, in buf; snap its metadata) with the
 * backend.  Returns 0 if they all match (or there are none), 1 if the
 * slot is clean and must be dropped.  A dirty slot keeps its dirty
 * sectors (the cache is authoritative for them); its clean sectors
 * that differ, or all of them if the backend cannot be read, stop
 * being valid, so they are read from the backend again.
 */
static int
check_backend (struct cache *c, const struct cache_backend *be, uint32_t s,
               const struct pt_slot *snap, uint8_t *buf)
{
  const uint32_t pbytes = cache_page_bytes (c, snap->page);
  uint8_t clean[LAYOUT_MAX_SECTORS / 8], stale[LAYOUT_MAX_SECTORS / 8];
  uint8_t *bk;
  unsigned n;
  int err;

  if (verify_clean_sectors (snap->valid, snap->dirty, c->nsectors,
                            clean) == 0 || pbytes == 0)
    return 0;
  bk = malloc (c->page_size);
  if (bk != NULL &&
      be->pread (be->h, bk, pbytes, snap->page * c->page_size, &err) == 0) {
    STATS_ADD (&c->stats, bytes_from_backend, pbytes);
    n = verify_stale_sectors (buf, bk, snap->valid, snap->dirty,
                              c->nsectors, c->sector_size, pbytes, stale);
  }
  else {
    /* Cannot tell: trust none of the clean data. */
    memcpy (stale, clean, sizeof stale);
    n = 1;
  }
  free (bk);
  if (n == 0)
    return 0;

  STATS_ADD (&c->stats, verify_mismatches, 1);
  if (ssdcache_debug_verify)
    log_debug ("ssdcache-verify: page %llu (slot %u, %s) differs from the "
               "backend in %u sectors: %s", (unsigned long long) snap->page,
               s, snap->state == LAYOUT_DIRTY ? "dirty" : "clean", n,
               snap->state == LAYOUT_DIRTY
               ? "its clean sectors are dropped, its dirty ones kept"
               : "dropped, re-read from the backend");
  if (snap->state != LAYOUT_DIRTY)
    return 1;

  /* Dirty: the stale sectors stop being valid.  The entry is rewritten
   * in place, but the data stays as it is and both versions of the
   * entry describe the same dirty data, so the slot keeps its epoch.
   */
  {
    struct layout_entry e;
    struct pt_slot v;

    pthread_mutex_lock (&c->lock);
    pagetable_get (&c->pt, s, &v);
    for (unsigned b = 0; b < sizeof stale; b++)
      v.valid[b] &= ~stale[b];
    if (!pt_maps_set (&c->pt, s, v.valid, v.dirty)) {
      /* No room for the maps: drop all the clean sectors (dirty ones
       * are a run, or the slot would own a side entry already).
       */
      STATS_ADD (&c->stats, partial_maps_full, 1);
      memcpy (v.valid, v.dirty, sizeof v.valid);
      if (!pt_maps_set (&c->pt, s, v.valid, v.dirty))
        abort ();
    }
    v.data_crc = cache_page_crc (c, buf, v.valid);
    pt_set_crc (&c->pt, s, v.data_crc);
    v.seq = ++c->seq;
    pt_set_seq (&c->pt, s, v.seq);
    pagetable_to_entry (&v, &e);
    e.hint = evict_slot_hint (c->ev, s);
    pthread_mutex_unlock (&c->lock);
    if (pool_write_entry (&c->pool, s, &e) == -1)
      cache_io_error (c, "writing entry", s);
  }
  return 0;
}

/* Read the whole of pinned slot s into buf and check its data CRC if
 * this has not been done since start-up (and, with c->verify, its clean
 * data against be).  Returns 0; -1 if the slot was dropped (clean) or
 * marked bad (dirty) - the pin is consumed then.  The page must be
 * range locked by the caller.
 */
int
cache_read_verified (struct cache *c, const struct cache_backend *be,
                     uint32_t s, uint8_t *buf)
{
  return cache_read_verified_span (c, be, s, buf, 0, c->nsectors - 1);
}

/* The same, but once the slot is verified only sectors [sf, sl] are
 * read (into their place in buf), and nothing if none of them is valid:
 * the rest of buf is then undefined.
 */
int
cache_read_verified_span (struct cache *c, const struct cache_backend *be,
                          uint32_t s, uint8_t *buf, unsigned sf, unsigned sl)
{
  struct pt_slot snap;

  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  pthread_mutex_unlock (&c->lock);
  if (snap.flags & PT_BAD) {
    cache_unpin (c, s);
    return -1;
  }

  if (snap.flags & PT_VERIFIED) {
    const uint32_t off = sf * c->sector_size;
    bool any = false;

    for (unsigned i = sf; i <= sl && !any; i++)
      any = layout_bit_test (snap.valid, i);
    if (!any)
      return 0;
    if (pool_read_data (&c->pool, s, buf + off,
                        (sl - sf + 1) * c->sector_size, off) == -1) {
      cache_io_error (c, "reading data", s);
      goto bad;
    }
    return 0;
  }
  if (pool_read_data (&c->pool, s, buf, c->page_size, 0) == -1) {
    cache_io_error (c, "reading data", s);
    goto bad;
  }
  if (snap.flags & PT_VERIFIED)
    return 0;

  if (cache_page_crc (c, buf, snap.valid) != snap.data_crc) {
    STATS_ADD (&c->stats, verify_failures, 1);
    log_debug ("cache file %s: slot %u (page %llu) fails its data "
               "checksum", c->path, s, (unsigned long long) snap.page);
    goto bad;
  }
  if (c->verify && be && check_backend (c, be, s, &snap, buf) == 1) {
    cache_drop_slot (c, s);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  pt_flags_on (&c->pt, s, PT_VERIFIED);
  pthread_mutex_unlock (&c->lock);
  return 0;

 bad:
  if (snap.state == LAYOUT_DIRTY)
    mark_bad (c, s);
  else
    cache_drop_slot (c, s);
  return -1;
}

/*----------------------------------------------------------------------
 * Reads.
 */

/* Serve [off, off+n) of page from the cache without any range lock if
 * the page is cached, verified and has all those sectors.
 */
/* Under c->lock: a client read uses slot s.  The first read of a page
 * that readahead brought in is a prefetch hit (its bytes are added to
 * *used, which may be NULL) and counts for the policy as the page's
 * first access, which its insertion stood for: not as a re-use, or a
 * prefetched scan would look hot to S3-FIFO and flush the hot set.
 * Any other hit is a re-use.
 */
static void
note_use_locked (struct cache *c, uint32_t s, uint32_t n, uint64_t *used)
{
  if (pt_flags (&c->pt, s) & PT_PREFETCHED) {
    pt_flags_off (&c->pt, s, PT_PREFETCHED);
    STATS_ADD (&c->stats, prefetch_hits, 1);
    if (used)
      *used += n;
  }
  else
    evict_touch (c->ev, s);
}

static bool
try_hit (struct cache *c, uint64_t page, uint8_t *dst, uint32_t off,
         uint32_t n, uint64_t *used)
{
  unsigned first, last;
  uint32_t s;
  int r;

  cache_sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s == PT_NONE) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  if ((pt_flags (&c->pt, s) & (PT_VERIFIED | PT_BAD)) != PT_VERIFIED ||
      !pagetable_range_valid (&c->pt, s, first, last)) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  pt_pin (&c->pt, s);
  note_use_locked (c, s, n, used);
  pthread_mutex_unlock (&c->lock);

  r = pool_read_data (&c->pool, s, dst, n, off);
  cache_unpin (c, s);
  if (r == -1) {
    cache_io_error (c, "reading data", s);
    return false;               /* the slow path deals with it */
  }
  return true;
}

/* Would try_hit serve this page?  (A hint only: no pin.) */
static bool
peek_hit (struct cache *c, uint64_t page, uint32_t off, uint32_t n)
{
  unsigned first, last;
  uint32_t s;
  bool r = false;

  cache_sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s != PT_NONE)
    r = (pt_flags (&c->pt, s) & (PT_VERIFIED | PT_BAD)) == PT_VERIFIED &&
      pagetable_range_valid (&c->pt, s, first, last);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Complete a partly valid page: buf holds the slot's data (read and
 * verified); only the span of sectors that are not valid is read from
 * the backend, and the slot's valid sectors (maybe dirty) win.  The
 * whole page is then stored, all valid.  Consumes the pin on s.
 */
static int
complete_partial (struct cache *c, const struct cache_backend *be,
                  uint64_t page, uint32_t s, uint8_t *buf, int *err)
{
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  struct pt_slot snap;
  unsigned lo = c->nsectors, hi = 0;
  uint8_t *tmp;
  uint32_t n;

  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  pthread_mutex_unlock (&c->lock);
  for (unsigned i = 0; i < c->nsectors; i++)
    if (!layout_bit_test (snap.valid, i)) {
      if (i < lo)
        lo = i;
      hi = i;
    }
  if (lo > hi) {                /* all valid after all */
    cache_unpin (c, s);
    return 0;
  }
  tmp = calloc (hi - lo + 1, ss);
  if (tmp == NULL) {
    cache_unpin (c, s);
    *err = ENOMEM;
    return -1;
  }
  n = lo * ss >= pbytes ? 0
    : ((hi + 1) * ss > pbytes ? pbytes : (hi + 1) * ss) - lo * ss;
  if (n > 0 &&
      be->pread (be->h, tmp, n, page * c->page_size + lo * ss, err) == -1) {
    free (tmp);
    cache_unpin (c, s);
    return -1;
  }
  STATS_ADD (&c->stats, bytes_from_backend, n);
  for (unsigned i = lo; i <= hi; i++)
    if (!layout_bit_test (snap.valid, i))
      memcpy (buf + (size_t) i * ss, tmp + (size_t) (i - lo) * ss, ss);
  free (tmp);
  cache_fill_slot (c, page, s, buf,
                   snap.state == LAYOUT_DIRTY ? snap.dirty : NULL, false);
  return 0;
}

/* A read of bytes [a, b) of a partly valid page (slot s, pinned, whose
 * data is in buf): read from the backend just the sectors [a, b) needs,
 * keep the cached ones (maybe dirty), and store the result in place;
 * buf then holds the answer.  A slot with flushed dirty data may not be
 * rewritten in place: it is completed whole into a copy instead.
 * Consumes the pin.
 */
static int
fill_sectors (struct cache *c, const struct cache_backend *be, uint64_t page,
              uint32_t s, uint8_t *buf, uint32_t a, uint32_t b, int *err)
{
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  uint32_t lo = a / ss * ss, hi = (b + ss - 1) / ss * ss, n;
  struct pt_slot snap;
  bool cow;
  int r;

  pthread_rwlock_rdlock (&c->inplace);
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (cow) {
    pthread_rwlock_unlock (&c->inplace);
    /* The copy needs the whole page (the caller read only [a, b)). */
    if (cache_read_verified (c, be, s, buf) == -1) {
      *err = EIO;
      return -1;
    }
    return complete_partial (c, be, page, s, buf, err);
  }

  n = hi > pbytes ? (lo < pbytes ? pbytes - lo : 0) : hi - lo;
  {
    uint8_t *tmp = calloc (1, hi - lo);
    if (tmp == NULL) {
      *err = ENOMEM;
      r = -1;
      goto out;
    }
    if (n > 0 &&
        be->pread (be->h, tmp, n, page * c->page_size + lo, err) == -1) {
      free (tmp);
      r = -1;
      goto out;
    }
    STATS_ADD (&c->stats, bytes_from_backend, n);
    /* The cache's own sectors win. */
    for (uint32_t i = lo / ss; i < hi / ss; i++)
      if (layout_bit_test (snap.valid, i))
        memcpy (tmp + (i * ss - lo), buf + (size_t) i * ss, ss);
    memcpy (buf + lo, tmp, hi - lo);
    free (tmp);
  }
  r = cache_patch_slot (c, be, page, s, false, buf + lo, lo, hi - lo,
                        W_FILL, err);
  pthread_rwlock_unlock (&c->inplace);
  if (r == 2) {
    /* The valid sectors would not be one run and the side table is
     * full: round out to the whole page instead (one more backend read
     * of the sectors still missing), which needs no entry.  The answer
     * in buf stays as it is.
     */
    uint8_t *whole = malloc (c->page_size);
    uint32_t s2 = whole ? cache_lookup_pin (c, page) : PT_NONE;
    int e2;

    if (s2 != PT_NONE && cache_read_verified (c, be, s2, whole) == 0)
      complete_partial (c, be, page, s2, whole, &e2);
    free (whole);
    return 0;
  }
  return r == -1 && *err == EIO ? 0 : r;   /* the answer is in buf */
 out:
  cache_unpin (c, s);
  pthread_rwlock_unlock (&c->inplace);
  return r;
}

/* How read_slow treats the pages it reads from the backend. */
struct read_opts {
  uint64_t nofill_from;   /* pages from here on are not stored (a long
                             sequential stream past its cutoff) */
  bool promote;           /* a client read miss: n-miss promotion applies */
  bool readahead;         /* a readahead prefetch: pages are marked, and
                             the client counters are left alone */
  uint64_t *used;         /* client reads: bytes of prefetched pages
                             read for the first time are added here */
};

/* Under nothing: should a read miss of page be stored (n-miss
 * promotion)?  Counts the miss.
 */
static bool
admit_miss (struct cache *c, uint64_t page)
{
  bool r;

  if (c->nhit == NULL)
    return true;
  pthread_mutex_lock (&c->lock);
  r = admit_nhit_miss (c->nhit, page);
  pthread_mutex_unlock (&c->lock);
  if (!r && ssdcache_debug_verbose)
    log_debug ("read miss page %llu: not cached (promotion after %u misses)",
               (unsigned long long) page, c->promote);
  return r;
}

/* Read [pos, pos+len) (dst may be NULL: prefetch only) with the pages
 * range locked: serve what is cached, read the rest from the backend in
 * as few requests as possible and store it (as o says).
 */
static int
read_slow (struct cache *c, const struct cache_backend *be, uint8_t *dst,
           uint64_t pos, uint32_t len, const struct read_opts *o, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t first = pos / ps, last = (pos + len - 1) / ps;
  const uint64_t np = last - first + 1;
  bool *need = calloc (np, sizeof *need);
  uint8_t *page_buf = malloc (ps);
  int ret = -1;

  if (need == NULL || page_buf == NULL) {
    *err = ENOMEM;
    goto out_free;
  }
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    goto out_free;
  }

  /* Pass 1: serve what the cache has (verifying on first use). */
  for (uint64_t i = 0; i < np; i++) {
    uint64_t page = first + i;
    uint64_t pstart = page * ps;
    uint32_t a = pos > pstart ? pos - pstart : 0;
    uint32_t b = pos + len < pstart + ps ? pos + len - pstart : ps;
    unsigned sf, sl;
    uint32_t s = cache_lookup_pin (c, page);
    bool ok, bad;

    need[i] = true;
    if (s == PT_NONE) {
      if (!o->readahead)
        STATS_ADD (&c->stats, read_misses, 1);
      continue;
    }
    cache_sector_span (c, a, b - a, &sf, &sl);
    if (cache_read_verified_span (c, be, s, page_buf, sf, sl) == -1) {
      pthread_mutex_lock (&c->lock);
      bad = pagetable_lookup (&c->pt, page) == s &&
        (pt_flags (&c->pt, s) & PT_BAD);
      pthread_mutex_unlock (&c->lock);
      if (bad) {
        *err = EIO;
        goto out;
      }
      if (!o->readahead)
        STATS_ADD (&c->stats, read_misses, 1);
      continue;                 /* dropped */
    }
    pthread_mutex_lock (&c->lock);
    ok = pagetable_range_valid (&c->pt, s, sf, sl);
    if (ok && !o->readahead)
      note_use_locked (c, s, b - a, o->used);
    pthread_mutex_unlock (&c->lock);
    if (ok) {
      if (dst)
        memcpy (dst + (pstart + a - pos), page_buf + a, b - a);
      if (!o->readahead) {
        STATS_ADD (&c->stats, read_hits, 1);
        STATS_ADD (&c->stats, bytes_from_cache, b - a);
      }
      need[i] = false;
      cache_unpin (c, s);
    }
    else {
      STATS_ADD (&c->stats, read_partial, 1);
      if (fill_sectors (c, be, page, s, page_buf, a, b, err) == -1)
        goto out;
      if (dst)
        memcpy (dst + (pstart + a - pos), page_buf + a, b - a);
      need[i] = false;
    }
  }

  /* Pass 2: runs of needed pages, one backend read per run. */
  for (uint64_t i = 0; i < np;) {
    uint64_t j, run_start, run_end, read_lo, read_hi;
    uint8_t *bounce;

    if (!need[i]) {
      i++;
      continue;
    }
    for (j = i; j + 1 < np && need[j + 1]; j++)
      ;
    run_start = (first + i) * ps;
    run_end = (first + j + 1) * ps;
    if (run_end > c->backend_size)
      run_end = c->backend_size;
    /* A miss reads only the sectors asked for, not the whole page:
     * never more backend traffic than the client's own request needs.
     * (Pages in the middle of a long request are read whole.)
     */
    read_lo = run_start;
    read_hi = run_end;
    if (pos > run_start)
      read_lo = pos / c->sector_size * c->sector_size;
    if (pos + len < run_end) {
      read_hi = (pos + len + c->sector_size - 1) / c->sector_size *
        c->sector_size;
      if (read_hi > run_end)
        read_hi = run_end;
    }

    bounce = calloc (j - i + 1, ps);
    if (bounce == NULL) {
      *err = ENOMEM;
      goto out;
    }
    if (be->pread (be->h, bounce + (read_lo - run_start), read_hi - read_lo,
                   read_lo, err) == -1) {
      free (bounce);
      goto out;
    }
    STATS_ADD (&c->stats, bytes_from_backend, read_hi - read_lo);

    for (uint64_t k = i; k <= j; k++) {
      uint64_t pstart = (first + k) * ps;
      uint32_t a = pos > pstart ? pos - pstart : 0;
      uint32_t b = pos + len < pstart + ps ? pos + len - pstart : ps;
      uint8_t *data = bounce + (k - i) * ps;
      uint64_t plo = read_lo > pstart ? read_lo : pstart;
      uint64_t phi = read_hi < pstart + ps ? read_hi : pstart + ps;

      if (pstart >= o->nofill_from)
        STATS_ADD (&c->stats, seq_bypassed, 1);   /* a long stream */
      else if (o->promote && !admit_miss (c, first + k))
        STATS_ADD (&c->stats, promote_skipped, 1);
      else if (plo == pstart && phi >= pstart + cache_page_bytes (c, first + k))
        cache_fill_slot (c, first + k, PT_NONE, data, NULL, o->readahead);
      else if (!cache_degraded (c)) {
        uint32_t ns = cache_alloc_slot (c, false);
        int e;
        if (ns == PT_NONE)
          STATS_ADD (&c->stats, bypassed, 1);
        else
          cache_patch_slot (c, be, first + k, ns, true, data + (plo - pstart),
                            plo - pstart, phi - plo, W_CLEAN, &e);
      }
      if (dst)
        memcpy (dst + (pstart + a - pos), data + a, b - a);
      need[k] = false;
    }
    free (bounce);
    i = j + 1;
  }
  ret = 0;

 out:
  rangelock_release (&c->ranges, first, last);
 out_free:
  free (need);
  free (page_buf);
  return ret;
}

int
cache_read (struct cache *c, const struct cache_backend *be,
            void *buf, uint32_t count, uint64_t offset, int *err)
{
  return cache_read_conn (c, be, NULL, buf, count, offset, err);
}

int
cache_read_conn (struct cache *c, const struct cache_backend *be,
                 struct prefetch_conn *pc, void *buf, uint32_t count,
                 uint64_t offset, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t end = offset + count;
  uint8_t *dst = buf;
  uint64_t pos = offset, nofill_from = UINT64_MAX, used = 0;
  uint64_t fill_limit = UINT64_MAX;   /* readahead stops there */
  struct read_opts o = { .promote = true, .used = &used };

  STATS_ADD (&c->stats, read_ops, 1);
  cache_touch_io (c);
  if (c->seqcut) {
    /* Sequential cutoff: past it, a long stream's misses are read from
     * the backend without filling the cache (hits are still served).
     */
    pthread_mutex_lock (&c->lock);
    nofill_from = offset + admit_seq_access (c->seqcut, offset, count);
    fill_limit = admit_seq_left (c->seqcut, end);
    fill_limit = fill_limit > UINT64_MAX - end ? UINT64_MAX : end + fill_limit;
    if (nofill_from < end)
      fill_limit = nofill_from;
    pthread_mutex_unlock (&c->lock);
    /* The page holding the boundary is still admitted. */
    nofill_from = (nofill_from + ps - 1) / ps * ps;
  }
  o.nofill_from = nofill_from;
  while (pos < end) {
    uint64_t page = pos / ps, run_end;
    uint32_t off = pos % ps;
    uint32_t n = end - pos < ps - off ? end - pos : ps - off;

    if (cache_degraded (c) && !cache_page_dirty (c, page)) {
      /* Pass-through, but for pages whose newest data is in the cache. */
      run_end = (page + 1) * ps;
      while (run_end < end && !cache_page_dirty (c, run_end / ps))
        run_end += ps;
      if (run_end > end)
        run_end = end;
      if (be->pread (be->h, dst + (pos - offset), run_end - pos, pos,
                     err) == -1)
        return -1;
      STATS_ADD (&c->stats, bytes_from_backend, run_end - pos);
      pos = run_end;
      continue;
    }

    if (try_hit (c, page, dst + (pos - offset), off, n, &used)) {
      STATS_ADD (&c->stats, read_hits, 1);
      STATS_ADD (&c->stats, bytes_from_cache, n);
      pos += n;
      continue;
    }
    /* Gather the following pages that are not hits either. */
    run_end = (page + 1) * ps;
    while (run_end < end) {
      uint32_t m = end - run_end < ps ? end - run_end : ps;
      if (peek_hit (c, run_end / ps, 0, m))
        break;
      run_end += ps;
    }
    if (run_end > end)
      run_end = end;
    if (read_slow (c, be, dst + (pos - offset), pos, run_end - pos,
                   &o, err) == -1)
      return -1;
    pos = run_end;
  }
  /* Readahead learns from every read (never waits for its prefetch). */
  if (pc)
    prefetch_note_read (c, pc, offset, count, used, fill_limit);
  return 0;
}

int
cache_prefetch (struct cache *c, const struct cache_backend *be,
                uint32_t count, uint64_t offset, int *err)
{
  struct read_opts o = { .nofill_from = UINT64_MAX };

  if (count == 0 || cache_degraded (c))
    return 0;
  cache_touch_io (c);
  return read_slow (c, be, NULL, offset, count, &o, err);
}

int
cache_readahead_fill (struct cache *c, const struct cache_backend *be,
                      uint64_t offset, uint64_t len, int *err)
{
  const uint32_t ps = c->page_size;
  uint64_t page, last;
  struct read_opts o = { .nofill_from = UINT64_MAX, .readahead = true };

  if (len == 0 || offset >= c->backend_size)
    return 0;
  if (len > c->backend_size - offset)
    len = c->backend_size - offset;
  page = offset / ps;
  last = (offset + len - 1) / ps;
  /* Runs of pages not cached (cached pages are never read again). */
  while (page <= last) {
    uint64_t run_end;
    uint64_t lo, hi;

    if (cache_degraded (c))
      return 0;
    pthread_mutex_lock (&c->lock);
    while (page <= last && pagetable_lookup (&c->pt, page) != PT_NONE)
      page++;
    run_end = page;
    while (run_end <= last && run_end - page < (32u << 20) / ps &&
           pagetable_lookup (&c->pt, run_end) == PT_NONE)
      run_end++;
    pthread_mutex_unlock (&c->lock);
    if (page > last)
      break;
    lo = page * ps;
    hi = run_end * ps;
    if (hi > c->backend_size)
      hi = c->backend_size;
    STATS_ADD (&c->stats, prefetch_requests, 1);
    if (ssdcache_debug_readahead)
      log_debug ("readahead: prefetch %llu bytes at %llu (pages %llu-%llu)",
                 (unsigned long long) (hi - lo), (unsigned long long) lo,
                 (unsigned long long) page,
                 (unsigned long long) run_end - 1);
    if (read_slow (c, be, NULL, lo, hi - lo, &o, err) == -1)
      return -1;
    page = run_end;
  }
  return 0;
}

bool
cache_range_dirty (struct cache *c, uint64_t offset, uint64_t count,
                   uint64_t *run_end)
{
  const uint32_t ps = c->page_size;
  uint64_t page = offset / ps, end = offset + count;
  bool first_dirty = false;

  pthread_mutex_lock (&c->lock);
  for (uint64_t pos = offset; pos < end; page++) {
    uint32_t s = c->ndirty ? pagetable_lookup (&c->pt, page) : PT_NONE;
    bool d = s != PT_NONE && pt_state (&c->pt, s) == LAYOUT_DIRTY;

    if (pos == offset)
      first_dirty = d;
    else if (d != first_dirty)
      break;
    pos = (page + 1) * ps;
    *run_end = pos < end ? pos : end;
  }
  pthread_mutex_unlock (&c->lock);
  return first_dirty;
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
