/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: slot bookkeeping.
 *
 * Owns what every path does to one slot: pins, the state counters,
 * committing a slot's entry to the cache file, reading its data
 * checksum back from there (RAM keeps none; c->crc_memo holds those of
 * entries whose write failed), whether it must be copied before a
 * rewrite (cache_must_cow), and cache-device errors (degraded mode).
 * Geometry is geom.c's, allocation alloc.c's.
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

#define CRC_MEMO_MAX 4096        /* c->crc_memo entries at most */

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

/* Under c->lock: slot s's checksum if its entry on disk is behind
 * (crc_memo), else false.
 */
bool
cache_crc_memo_find_locked (const struct cache *c, uint32_t s, uint32_t *crc)
{
  for (size_t i = 0; i < c->ncrc_memo; i++)
    if (c->crc_memo[i].slot == s) {
      if (crc)
        *crc = c->crc_memo[i].crc;
      return true;
    }
  return false;
}

/* Under c->lock: the entry write of s with checksum crc failed (ok
 * false), or one succeeded (ok true: its entry is current again).
 * Without room in the memo (CRC_MEMO_MAX: a device that fails every
 * entry write while writeback marks pages clean would add one for each
 * page, and the memo is searched linearly), the slot's later check
 * fails safe: a clean page is dropped, a dirty one reported.  The
 * writes that matter come first: dirty data rewritten in place at the
 * failure that degraded the cache.
 */
static void
crc_memo_note_locked (struct cache *c, uint32_t s, bool ok, uint32_t crc)
{
  for (size_t i = 0; i < c->ncrc_memo; i++)
    if (c->crc_memo[i].slot == s) {
      if (ok)
        c->crc_memo[i] = c->crc_memo[--c->ncrc_memo];
      else
        c->crc_memo[i].crc = crc;
      return;
    }
  if (ok)
    return;
  if (c->ncrc_memo == CRC_MEMO_MAX)
    return;
  if (c->ncrc_memo == c->capcrc_memo) {
    size_t cap = c->capcrc_memo ? c->capcrc_memo * 2 : 8;
    struct cache_crc_memo *m = realloc (c->crc_memo, cap * sizeof *m);
    if (m == NULL)
      return;
    c->crc_memo = m;
    c->capcrc_memo = cap;
  }
  c->crc_memo[c->ncrc_memo++] = (struct cache_crc_memo) { s, crc };
}

/* Under c->lock: the write of slot s's entry e returned r. */
static void
entry_written_locked (struct cache *c, uint32_t s,
                      const struct layout_entry *e, int r)
{
  if (r == 0 ? c->ncrc_memo > 0
      : e->state != LAYOUT_FREE && !(e->flags & LAYOUT_ENT_UNSEALED))
    crc_memo_note_locked (c, s, r == 0, e->data_crc);
}

/* Under c->lock: v is slot s as RAM now has it (maps stored, checksum
 * set); give it a fresh sequence number and build e, its entry, for
 * cache_write_entry once c->lock is released.  An entry rewritten this
 * way keeps the slot's epoch and generation: its dirty data did not
 * change.
 */
void
cache_entry_renumber_locked (struct cache *c, uint32_t s, struct pt_slot *v,
                             struct layout_entry *e)
{
  v->seq = ++c->seq;
  pt_set_seq (&c->pt, s, v->seq);
  pagetable_to_entry (v, e);
  e->hint = evict_slot_hint (c->ev, s);
}

/* Write e, the entry RAM now has for pinned slot s (its page range
 * locked by the caller), remembering its checksum if the write fails.
 * Returns 0 or -1.
 */
int
cache_write_entry (struct cache *c, uint32_t s, const struct layout_entry *e)
{
  int r = pool_write_entry (&c->pool, s, e);

  pthread_mutex_lock (&c->lock);
  entry_written_locked (c, s, e, r);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Write the entry of pinned (or privately owned) slot s with a new
 * sequence number after copying upd's contents into it (and its
 * PT_UNSEALED flag); the entry takes upd's checksum (PT_CRC_KNOWN, or
 * PT_UNSEALED: pagetable_to_entry).  The slot's epoch is set once the
 * write has completed: the current one, or epoch if that is earlier.
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
  v.data_crc = upd->data_crc;
  v.flags |= upd->flags & PT_CRC_KNOWN;
  pagetable_to_entry (&v, &e);
  if (flags & PT_INDEXED)
    e.hint = evict_slot_hint (c->ev, s);
  pthread_mutex_unlock (&c->lock);

  r = pool_write_entry (&c->pool, s, &e);

  pthread_mutex_lock (&c->lock);
  pt_set_epoch (&c->pt, s, c->epoch < epoch ? c->epoch : epoch);
  entry_written_locked (c, s, &e, r);
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

/* The checksum of slot s's data, from its entry on disk (RAM keeps
 * none): for a sealed slot the entry is current whenever its page is
 * range locked (every entry write holds that lock, and a change to a
 * sealed slot's data or maps writes its entry), unless that write
 * failed (then crc_memo has it).  expect is the slot as RAM has it: an
 * entry that does not describe the same page, state and maps, or is
 * unsealed, is not used.  Returns 0, or -1 with a message logged (as a
 * cache read error).
 */
int
cache_entry_crc (struct cache *c, uint32_t s, const struct pt_slot *expect,
                 uint32_t *crc)
{
  uint8_t raw[LAYOUT_ENTRY_SIZE];
  struct layout_entry e;
  bool memo;

  pthread_mutex_lock (&c->lock);
  memo = c->ncrc_memo > 0 && cache_crc_memo_find_locked (c, s, crc);
  pthread_mutex_unlock (&c->lock);
  if (memo)
    return 0;
  if (pool_read_entries (&c->pool, s, 1, raw) == -1) {
    cache_io_error (c, "reading entry", s);
    return -1;
  }
  if (layout_entry_decode (raw, c->nsectors, &e) == -1 ||
      e.state != expect->state || e.page != expect->page ||
      (e.flags & LAYOUT_ENT_UNSEALED) ||
      memcmp (e.valid, expect->valid, sizeof e.valid) != 0 ||
      memcmp (e.dirty, expect->dirty, sizeof e.dirty) != 0) {
    errno = EIO;
    cache_io_error (c, "reading entry: it does not match the slot", s);
    return -1;
  }
  *crc = e.data_crc;
  return 0;
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
