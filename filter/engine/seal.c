/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: unsealed slots (cheap rewrites of unflushed
 * dirty data, and of clean data in writethrough).
 *
 * A dirty slot whose data no client flush has covered yet may be
 * rewritten in place (docs/design.md).  Keeping its data checksum right
 * costs a read of the old sectors and an entry write per client write.
 * Instead, the second rewrite in place "unseals" the slot: its entry is
 * written once with LAYOUT_ENT_UNSEALED, and from then on each rewrite
 * is a single data write (the RAM slot still follows every change).
 * An unsealed entry is never used by recovery after a crash: its data
 * was never flushed, so the previous version of the page (kept until a
 * flushed, sealed successor exists) or the backend is right.
 *
 * Writethrough unseals a clean slot at its first rewrite
 * (write-through.c: write_through_first): the cached copy changes
 * before the backend gets the write, and a crash between the two must
 * not leave it verifying.  Recovery drops it, and the page is read
 * again.
 *
 * Sealing = read the slot's data, compute its checksum, write a normal
 * entry.  It happens in a client flush (for every unsealed slot the
 * flush covers, before its fdatasync), when writeback marks the page
 * clean (clean.c, from the data it read anyway), before an
 * unsealed slot is dropped, and at close (a client flush too).
 *
 * Locking: the list of unsealed slots (c->unsealed, c->nunsealed,
 * c->unseal_reserved) and the PT_UNSEALED / PT_LISTED flags are under
 * c->lock.  A slot's data and maps change only under its page's range
 * lock, which sealing holds.  The list may hold stale entries (slots
 * sealed or freed since); compaction drops them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* Under c->lock: keep only listed slots that are still unsealed and
 * indexed, once each.
 */
static void
compact_locked (struct cache *c)
{
  size_t k = 0;

  for (size_t i = 0; i < c->nunsealed; i++)
    pt_flags_off (&c->pt, c->unsealed[i], PT_LISTED);
  for (size_t i = 0; i < c->nunsealed; i++) {
    uint32_t s = c->unsealed[i];

    if ((pt_flags (&c->pt, s) & (PT_UNSEALED | PT_INDEXED | PT_LISTED)) ==
        (PT_UNSEALED | PT_INDEXED)) {
      pt_flags_on (&c->pt, s, PT_LISTED);
      c->unsealed[k++] = s;
    }
  }
  c->nunsealed = k;
}

/* Under c->lock: promise room on the list for slot s, about to be
 * unsealed by the caller (cache_commit_entry then lists it).  False
 * (ENOMEM): the caller keeps the slot sealed.
 */
bool
cache_unseal_reserve_locked (struct cache *c, uint32_t s)
{
  size_t want = c->nunsealed + c->unseal_reserved + 1;

  (void) s;
  if (want > c->capunsealed) {
    compact_locked (c);
    want = c->nunsealed + c->unseal_reserved + 1;
  }
  if (want > c->capunsealed) {
    size_t cap = c->capunsealed ? c->capunsealed * 2 : 64;
    uint32_t *p;

    while (cap < want)
      cap *= 2;
    p = realloc (c->unsealed, cap * sizeof *p);
    if (p == NULL)
      return false;
    c->unsealed = p;
    c->capunsealed = cap;
  }
  c->unseal_reserved++;
  return true;
}

/* Under c->lock: give back a reservation that was not used. */
void
cache_unseal_unreserve_locked (struct cache *c, uint32_t s)
{
  (void) s;
  c->unseal_reserved--;
}

/* Seal slot s if it is unsealed: its page is range locked by the
 * caller, so its data cannot change.  The entry is written as part of
 * sync epoch epoch (CACHE_EPOCH_NOW: the current one).  Returns 0 or -1
 * (cache-file error: the slot stays unsealed).
 */
int
cache_seal_slot (struct cache *c, uint32_t s, uint64_t epoch)
{
  struct pt_slot upd;
  uint8_t *buf;
  int r;

  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &upd);
  pthread_mutex_unlock (&c->lock);
  if (!(upd.flags & PT_UNSEALED))
    return 0;

  buf = malloc (c->page_size);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1) {
    cache_io_error (c, "reading data to seal", s);
    free (buf);
    return -1;
  }
  pt_slot_set_crc (&upd, cache_page_crc (c, buf, upd.valid));
  upd.flags &= ~PT_UNSEALED;
  free (buf);
  r = cache_commit_entry_at (c, s, &upd, epoch);
  if (r == -1)
    cache_io_error (c, "writing entry to seal", s);
  else if (ssdcache_debug_verbose)
    log_debug ("sealed slot %u (page %llu)", s,
               (unsigned long long) upd.page);
  return r;
}

/* Seal every unsealed slot whose unsealing belongs to sync epoch
 * <= epoch (a flush that covers epoch is about to fdatasync); clean
 * ones only with clean_too (at close: a flush promises nothing about
 * the cache's copy of clean data).  With
 * wait, wait for pages other requests hold; without (the caller holds
 * range locks itself), skip them: they stay unsealed, which only means
 * a crash loses them, and a later client flush seals them.
 */
void
cache_seal_epoch (struct cache *c, uint64_t epoch, bool wait, bool clean_too)
{
  uint32_t *todo = NULL;
  size_t n = 0;

  pthread_mutex_lock (&c->lock);
  compact_locked (c);
  if (c->nunsealed > 0) {
    todo = malloc (c->nunsealed * sizeof *todo);
    if (todo != NULL) {
      n = c->nunsealed;
      memcpy (todo, c->unsealed, n * sizeof *todo);
    }
    else
      log_error ("malloc: %m");
  }
  pthread_mutex_unlock (&c->lock);

  for (size_t i = 0; i < n; i++) {
    uint32_t s = todo[i];
    uint64_t page;
    bool want;

    pthread_mutex_lock (&c->lock);
    page = pt_page (&c->pt, s);
    want = (pt_flags (&c->pt, s) & PT_UNSEALED) &&
      pt_epoch_may_be_at_most (&c->pt, s, epoch) &&
      (clean_too || pt_state (&c->pt, s) == LAYOUT_DIRTY);
    pthread_mutex_unlock (&c->lock);
    if (!want)
      continue;
    if (wait ? rangelock_acquire (&c->ranges, page, page)
        : rangelock_try_acquire (&c->ranges, page, page)) {
      if (wait)
        log_error ("cache file %s: cannot lock page %llu to seal it",
                   c->path, (unsigned long long) page);
      continue;
    }
    pthread_mutex_lock (&c->lock);
    want = pagetable_lookup (&c->pt, page) == s &&
      (pt_flags (&c->pt, s) & PT_UNSEALED) &&
      pt_epoch_may_be_at_most (&c->pt, s, epoch);
    pthread_mutex_unlock (&c->lock);
    if (want)
      cache_seal_slot (c, s, epoch);
    rangelock_release (&c->ranges, page, page);
  }
  free (todo);

  pthread_mutex_lock (&c->lock);
  compact_locked (c);
  pthread_mutex_unlock (&c->lock);
}

/* How many slots are unsealed now (after compaction). */
size_t
cache_unsealed_count (struct cache *c)
{
  size_t n;

  pthread_mutex_lock (&c->lock);
  compact_locked (c);
  n = c->nunsealed;
  pthread_mutex_unlock (&c->lock);
  return n;
}
