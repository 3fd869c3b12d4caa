/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: filling slots and reading them back verified.
 *
 * Owns storing a whole page read from the backend (or written by a
 * client) into a slot, and reading a slot's data back with its data
 * CRC checked on first use after start (and, with ssdcache-verify=lazy,
 * its clean sectors compared with the backend).  A slot that fails is
 * dropped (clean) or marked bad (dirty: reads fail with EIO).  Callers
 * hold the page's range lock; c->lock only around page-table updates.
 * Also runs the jobs of a fill behind (cache_fill_job_run), which take
 * the range lock themselves.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"
#include "verify.h"

/* Store a whole page (buf: page_size bytes, zeroes past the end of the
 * backend), all sectors valid, the given ones dirty (NULL: clean), in
 * slot s (pinned by the caller; consumed) or in a new slot if s is
 * PT_NONE.  The page is range locked by the caller.  Returns 0, 1 if
 * no slot could be had (nothing stored), -1 on a cache error.
 * kind FILL_PREFETCH: readahead's, not a client's: a new slot is marked
 * PT_PREFETCHED and enters the policy as new, without asking the
 * ghost (a prefetch is no use of the page: a page the ghost remembers
 * goes to the main queue only when a client reads it again).
 * FILL_WARM: warm-up's: only a free slot is taken.
 */
/* The slot the page goes to: s itself (rewritten in place, holding
 * c->inplace shared: *inplace), or a new one (s is PT_NONE, or must be
 * copied on write: *cow).  PT_NONE if no slot can be had (s unpinned).
 */
static uint32_t
fill_target (struct cache *c, uint32_t s, bool dirty, enum fill_kind kind,
             bool *cow, bool *inplace)
{
  uint32_t target;

  *cow = *inplace = false;
  if (s != PT_NONE) {
    cache_inplace_enter (c);
    pthread_mutex_lock (&c->lock);
    *cow = cache_must_cow (c, s);
    pthread_mutex_unlock (&c->lock);
    if (*cow)
      cache_inplace_leave (c);
    else {
      *inplace = true;
      return s;
    }
  }
  target = cache_alloc_slot (c, dirty ? ALLOC_DIRTY
                            : kind == FILL_WARM ? ALLOC_FREE : ALLOC_FILL);
  if (target == PT_NONE && s != PT_NONE)
    cache_unpin (c, s);
  return target;
}

/* The page is stored in target: it becomes the page's slot (a new one
 * enters the index and the policy; a copy supersedes s).
 */
static void
fill_done (struct cache *c, uint64_t page, uint32_t s, uint32_t target,
           const struct pt_slot *upd, bool cow, enum fill_kind kind)
{
  pthread_mutex_lock (&c->lock);
  pt_flags_on (&c->pt, target, PT_VERIFIED);
  pt_flags_off (&c->pt, target, PT_BAD);    /* wholly rewritten */
  if (target != s && s == PT_NONE) {
    pagetable_insert (&c->pt, target, page);
    if (kind == FILL_PREFETCH) {
      pt_flags_on (&c->pt, target, PT_PREFETCHED);
      evict_insert (c->ev, target);
      STATS_ADD (&c->stats, prefetch_pages, 1);
    }
    else
      cache_policy_insert (c, target, page);
    cache_set_state_counts_locked (c, LAYOUT_FREE, upd->state);
  }
  pthread_mutex_unlock (&c->lock);
  if (s == PT_NONE)
    STATS_ADD (&c->stats, fills, 1);
  else if (cow)
    cache_supersede (c, s, target, page);
  else
    cache_unpin (c, s);
}

/* Storing in target failed (wrote: its data may have been written). */
static void
fill_fail (struct cache *c, uint32_t s, uint32_t target, bool dirty,
           bool wrote)
{
  if (target != s) {
    pthread_mutex_lock (&c->lock);
    cache_release_slot_locked (c, target);
    pthread_mutex_unlock (&c->lock);
  }
  if (s != PT_NONE) {
    /* The old contents are still good unless we wrote over them. */
    if (wrote && target == s && !dirty)
      cache_drop_slot (c, s);
    else
      cache_unpin (c, s);
  }
}

int
cache_fill_slot (struct cache *c, uint64_t page, uint32_t s,
                 const uint8_t *buf, const uint8_t *dirty,
                 enum fill_kind kind)
{
  struct pt_slot upd = { .page = page, .state = LAYOUT_CLEAN };
  uint32_t target;
  bool cow, inplace, reserved;

  if (cache_degraded (c) && dirty == NULL) {
    /* Pass-through: nothing new goes into a failing cache. */
    if (s != PT_NONE)
      cache_drop_slot (c, s);
    return 1;
  }
  target = fill_target (c, s, dirty != NULL, kind, &cow, &inplace);
  if (target == PT_NONE) {
    STATS_ADD (&c->stats, bypassed, 1);
    return 1;
  }
  cache_map_fill (c, upd.valid);
  if (dirty && !layout_map_empty (dirty)) {
    memcpy (upd.dirty, dirty, sizeof upd.dirty);
    upd.state = LAYOUT_DIRTY;
  }
  pt_slot_set_crc (&upd, cache_page_crc (c, buf, upd.valid));

  /* Dirty sectors that are not one run need a side-table entry: with
   * none to be had, nothing is stored (like having no slot).
   */
  pthread_mutex_lock (&c->lock);
  reserved = pt_maps_reserve_for (&c->pt, target, upd.valid, upd.dirty);
  pthread_mutex_unlock (&c->lock);
  if (!reserved) {
    STATS_ADD (&c->stats, partial_maps_full, 1);
    if (inplace)
      cache_inplace_leave (c);
    fill_fail (c, s, target, dirty != NULL, false);
    STATS_ADD (&c->stats, bypassed, 1);
    return 1;
  }

  if (defer_write_data (&c->defer, &c->pool, target, buf, c->page_size,
                        0) == -1) {
    cache_io_error (c, "writing data", target);
    goto fail;
  }
  if (kind == FILL_COMPLETE && upd.state == LAYOUT_DIRTY) {
    /* Its dirty data keeps its flush generation (order.c): a copy of
     * it needs no older version kept.
     */
    pthread_mutex_lock (&c->lock);
    upd.gen = pt_gen (&c->pt, s);
    pthread_mutex_unlock (&c->lock);
  }
  if ((kind == FILL_COMPLETE && upd.state == LAYOUT_DIRTY
       ? cache_commit_entry_at (c, target, &upd, CACHE_EPOCH_NOW)
       : cache_commit_entry (c, target, &upd)) == -1) {
    cache_io_error (c, "writing entry", target);
    goto fail;
  }
  if (inplace)
    cache_inplace_leave (c);
  fill_done (c, page, s, target, &upd, cow, kind);
  return 0;

 fail:
  if (inplace)
    cache_inplace_leave (c);
  fill_fail (c, s, target, dirty != NULL, true);
  return -1;
}

void
cache_fill_job_free (struct cache_fill_job *job)
{
  if (job) {
    free (job->data);
    free (job);
  }
}

uint64_t
cache_fill_job_bytes (const struct cache *c, const struct cache_fill_job *job)
{
  return (uint64_t) job->n * c->page_size;
}

/* Store page i of job unless it is locked now, changed since the job
 * read it, or cached already.  Takes its range lock (never waits).
 */
static void
job_store_page (struct cache *c, const struct cache_fill_job *job,
                uint32_t i)
{
  const uint64_t page = job->first + i;
  bool cached, stored = false;

  if (cache_degraded (c) ||
      rangelock_try_acquire (&c->ranges, page, page) == -1) {
    STATS_ADD (&c->stats, fills_behind_dropped, 1);
    return;
  }
  if (rangelock_changed_since (&c->ranges, page, page, job->stamp)) {
    rangelock_release_unchanged (&c->ranges, page, page);
    STATS_ADD (&c->stats, fills_behind_dropped, 1);
    return;
  }
  pthread_mutex_lock (&c->lock);
  cached = pagetable_lookup (&c->pt, page) != PT_NONE;
  pthread_mutex_unlock (&c->lock);
  if (!cached)
    stored = cache_fill_slot (c, page, PT_NONE, job->data + (uint64_t) i *
                              c->page_size, NULL, FILL_CLIENT) == 0;
  rangelock_release_unchanged (&c->ranges, page, page);
  if (stored)
    STATS_ADD (&c->stats, fills_behind, 1);
  else if (!cached)
    STATS_ADD (&c->stats, fills_behind_dropped, 1);
}

void
cache_fill_job_run (struct cache *c, struct cache_fill_job *job)
{
  for (uint32_t i = 0; i < job->n; i++)
    if (job->store[i])
      job_store_page (c, job, i);
}

void
cache_fill_job_drop (struct cache *c, struct cache_fill_job *job)
{
  for (uint32_t i = 0; i < job->n; i++)
    STATS_ADD (&c->stats, fills_behind_dropped, job->store[i]);
  cache_fill_job_free (job);
}

void
cache_log_dirty_lost (struct cache *c, uint32_t s, uint64_t page,
                      const char *why)
{
  log_error ("cache file %s: DIRTY DATA LOST: dirty page %llu (slot %u, "
             "bytes %llu-%llu) %s; reads of it now return the previous "
             "version (an older cached copy, or the backend's data)",
             c->path, (unsigned long long) page, s,
             (unsigned long long) page * c->page_size,
             (unsigned long long) (page + 1) * c->page_size - 1, why);
}

bool
cache_slot_dropped (struct cache *c, uint64_t page, uint32_t s)
{
  bool dropped;

  pthread_mutex_lock (&c->lock);
  dropped = pagetable_lookup (&c->pt, page) != s ||
    !(pt_flags (&c->pt, s) & PT_BAD);
  pthread_mutex_unlock (&c->lock);
  return dropped;
}

/* Pinned slot s, loaded dirty after an unclean shutdown, fails its
 * checksum on first use (recovery leaves it to then): a write torn by
 * the crash, never flushed, so the backend's older data is right.  It
 * is dropped, as recovery would have done.  Consumes the pin.  Returns
 * false if s is not such a slot.
 */
static bool
drop_torn (struct cache *c, uint32_t s, uint64_t page)
{
  bool torn;

  pthread_mutex_lock (&c->lock);
  torn = cache_suspect_take_locked (c, s);
  pthread_mutex_unlock (&c->lock);
  if (!torn)
    return false;
  cache_log_dirty_lost (c, s, page, CACHE_TORN_WHY);
  STATS_ADD (&c->stats, dirty_dropped, 1);
  cache_drop_slot (c, s);
  return true;
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
    const struct verify_geom g = { .nsectors = c->nsectors,
                                   .ss = c->sector_size, .pbytes = pbytes };
    n = verify_stale_sectors (buf, bk, snap->valid, snap->dirty, &g, stale);
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
    pt_slot_set_crc (&v, cache_page_crc (c, buf, v.valid));
    cache_entry_renumber_locked (c, s, &v, &e);
    pthread_mutex_unlock (&c->lock);
    if (cache_write_entry (c, s, &e) == -1)
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
    if (defer_read_data (&c->defer, &c->pool, s, buf + off,
                        (sl - sf + 1) * c->sector_size, off) == -1) {
      cache_io_error (c, "reading data", s);
      goto bad;
    }
    return 0;
  }
  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1) {
    cache_io_error (c, "reading data", s);
    goto bad;
  }
  if (snap.flags & PT_VERIFIED)
    return 0;
  /* Not verified since the start: its entry holds the checksum (it
   * was loaded from it, and every change since wrote the entry, or
   * left the checksum in crc_memo).
   */
  if (cache_entry_crc (c, s, &snap, &snap.data_crc) == -1)
    goto bad;

  if (cache_page_crc (c, buf, snap.valid) != snap.data_crc) {
    STATS_ADD (&c->stats, verify_failures, 1);
    log_debug ("cache file %s: slot %u (page %llu) fails its data "
               "checksum", c->path, s, (unsigned long long) snap.page);
    if (snap.state == LAYOUT_DIRTY && drop_torn (c, s, snap.page))
      return -1;
    goto bad;
  }
  if (c->verify && be && check_backend (c, be, s, &snap, buf) == 1) {
    cache_drop_slot (c, s);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  pt_flags_on (&c->pt, s, PT_VERIFIED);
  cache_suspect_take_locked (c, s);
  pthread_mutex_unlock (&c->lock);
  return 0;

 bad:
  if (snap.state == LAYOUT_DIRTY)
    mark_bad (c, s);
  else
    cache_drop_slot (c, s);
  return -1;
}
