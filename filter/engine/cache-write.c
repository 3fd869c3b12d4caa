/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the write path (all modes), zero, trim,
 * invalidation and client flush.
 *
 * Every function here that changes what is cached for a page holds
 * that page's range lock (c->ranges) across the backend and cache I/O;
 * see cache-int.h for the rest of the locking.
 *
 * Writethrough / writearound: the cached copy is updated in place,
 * unsealed (writethrough), or dropped (writearound) first; then the
 * backend is written (see write_through_first).  Writeback: the data
 * goes to the cache as dirty sectors, in place if the slot holds
 * nothing durable and dirty, otherwise into a new slot (copy on
 * write).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"
#include "writeback.h"


void
cache_invalidate_pages (struct cache *c, uint64_t first, uint64_t last)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s = cache_lookup_pin (c, page);
    if (s != PT_NONE) {
      if (ssdcache_debug_verbose)
        log_debug ("invalidate page %llu (slot %u)",
                   (unsigned long long) page, s);
      cache_drop_slot (c, s);
    }
  }
}

void
cache_invalidate (struct cache *c, uint32_t count, uint64_t offset)
{
  uint64_t first, last;

  if (count == 0)
    return;
  first = offset / c->page_size;
  last = (offset + count - 1) / c->page_size;
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    log_error ("cache file %s: cannot lock range for invalidation", c->path);
    return;
  }
  cache_invalidate_pages (c, first, last);
  rangelock_release (&c->ranges, first, last);
}

/* Write back (from the caller's thread) every dirty page in [first,
 * last], which the caller has range locked, so that the backend alone
 * is current for them.  Returns 0 or -1 (*err): a page that cannot be
 * written back (bad data, backend error) stays dirty.
 */
static int
cache_clean_pages (struct cache *c, const struct cache_backend *be,
                   uint64_t first, uint64_t last, int *err)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s;
    int r = 0;

    if (!cache_page_dirty (c, page))
      continue;
    s = cache_lookup_pin (c, page);
    if (s == PT_NONE)
      continue;
    pthread_mutex_lock (&c->lock);
    bool dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY;
    pthread_mutex_unlock (&c->lock);
    if (dirty)
      r = writeback_page_locked (c, be, page, s, err);
    cache_unpin (c, s);
    if (r == -1)
      return -1;
  }
  return 0;
}

/* The backend does the request, cached copies of its pages are
 * dropped: zero/trim outside writeback mode, and everything in
 * pass-through (the cache device failed), where dirty pages in the
 * range are written back first.  do_op NULL: a write of buf.
 */
static int
through_op (struct cache *c, const struct cache_backend *be,
            cache_backend_op do_op, void *opaque, const void *buf,
            uint32_t count, uint64_t offset, bool fua, int *err)
{
  uint64_t first = offset / c->page_size;
  uint64_t last = (offset + count - 1) / c->page_size;
  int r = -1;

  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }
  if (cache_clean_pages (c, be, first, last, err) == 0 &&
      cache_stale_settle (c, first, last, err) == 0) {
    if (do_op)
      r = do_op (opaque, count, offset, err);
    else
      r = be->pwrite (be->h, buf, count, offset, fua, err);
    cache_invalidate_pages (c, first, last);
    atomic_store (&c->backend_unflushed, true);
  }
  rangelock_release (&c->ranges, first, last);
  return r;
}

/* Merge a write of src, bytes [off, off+n) of page, into span, which
 * holds sectors [sf, sl] of the page as stored (invalid sectors read as
 * zeroes), and update the valid/dirty maps.  A partly written sector
 * that was not valid is completed from the backend for W_DIRTY and
 * left invalid for W_CLEAN.  Returns 0 or -1 (*err) if the backend read
 * failed.
 */
static int
merge_span (struct cache *c, const struct cache_backend *be, uint64_t page,
            uint8_t *span, unsigned sf, unsigned sl, const uint8_t *src,
            uint32_t off, uint32_t n, enum wkind kind,
            uint8_t *valid, uint8_t *dirty, int *err)
{
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  const uint32_t span_off = sf * ss;
  bool skip[2] = { false, false };
  unsigned edge[2] = { sf, sl };

  for (int k = 0; k < 2; k++) {
    unsigned i = edge[k];
    uint32_t s0 = i * ss, s1 = s0 + ss > pbytes ? pbytes : s0 + ss;
    bool covered = off <= s0 && off + n >= s1;

    if (k == 1 && sl == sf) {
      skip[1] = skip[0];
      break;
    }
    if (covered || layout_bit_test (valid, i))
      continue;
    if (kind != W_DIRTY) {
      skip[k] = true;
      continue;
    }
    /* Complete the sector from the backend (zeroes past its end). */
    memset (span + (s0 - span_off), 0, ss);
    if (be->pread (be->h, span + (s0 - span_off), s1 - s0,
                   page * c->page_size + s0, err) == -1)
      return -1;
    STATS_ADD (&c->stats, bytes_from_backend, s1 - s0);
  }

  memcpy (span + (off - span_off), src, n);

  for (unsigned i = sf; i <= sl; i++) {
    uint32_t s0 = i * ss, s1 = s0 + ss > pbytes ? pbytes : s0 + ss;
    bool covered = off <= s0 && off + n >= s1;
    bool is_edge_skip = (i == sf && skip[0]) || (i == sl && skip[1]);

    if (is_edge_skip) {
      /* Not valid and only partly written: stays invalid (zeroes). */
      memset (span + (s0 - span_off), 0, ss);
      continue;
    }
    layout_bit_set (valid, i);
    if (kind == W_DIRTY)
      layout_bit_set (dirty, i);
    else if (kind == W_CLEAN && covered)
      layout_bit_clear (dirty, i);
    /* else: a partly written sector keeps its dirty bit: the backend
     * got only part of it.
     */
  }
  return 0;
}

/* Does a write of [off, off+n) of page cover its first and last
 * sectors wholly (so the old sectors need not be read)?
 */
static bool
covers_sectors (struct cache *c, uint64_t page, uint32_t off, uint32_t n)
{
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  uint32_t end_sector = ((off + n - 1) / ss + 1) * ss;

  if (end_sector > pbytes)
    end_sector = pbytes;
  return off % ss == 0 && off + n >= end_sector;
}

/* Are sectors [sf, sl] all invalid in slot (a value)? */
static bool
span_invalid (const struct pt_slot *slot, unsigned sf, unsigned sl)
{
  for (unsigned i = sf; i <= sl; i++)
    if (layout_bit_test (slot->valid, i))
      return false;
  return true;
}

/* Apply a write in place to slot s (pinned; fresh: newly allocated and
 * empty, not indexed).  Only the sectors touched are read and written;
 * the data CRC is patched, not recomputed.  An unflushed dirty slot
 * rewritten in place a second time is unsealed instead (cache-seal.c):
 * no checksum, no read, no entry write.  Consumes the pin (or, for
 * fresh, indexes the slot).  Returns 0, -1 with *err set, 2 if the
 * new maps need a side-table entry and none is free, or 3 if a W_CLEAN
 * rewrite of a cached slot cannot be made unsealed (in both cases
 * nothing changed; the pin is consumed, a fresh slot freed).
 */
/* Spans up to this size are patched in buffers on the stack. */
#define PATCH_STACK_BYTES 4096

int
cache_patch_slot (struct cache *c, const struct cache_backend *be,
                  uint64_t page, uint32_t s, bool fresh, const uint8_t *src,
                  uint32_t off, uint32_t n, enum wkind kind, int *err)
{
  const uint32_t ss = c->sector_size;
  unsigned sf, sl;
  uint32_t span_off, span_len;
  uint8_t old_small[PATCH_STACK_BYTES], span_small[PATCH_STACK_BYTES];
  uint8_t *old_heap = NULL, *span_heap = NULL, *old, *span;
  struct pt_slot upd, before;
  bool wrote = false, unseal = false, unsealed = false, evicted = false;
  bool dirty_unsealed;
  int ret = -1;

  cache_sector_span (c, off, n, &sf, &sl);
  span_off = sf * ss;
  span_len = (sl - sf + 1) * ss;
  if (span_len <= sizeof old_small) {
    /* Small writes (the common case) need no allocation. */
    old = old_small;
    span = span_small;
  }
  else {
    old = old_heap = malloc (span_len);
    span = span_heap = malloc (span_len);
    if (old == NULL || span == NULL) {
      /* W_CLEAN: the backend has the new data, the slot the old: it
       * goes (below), as after a failed write.
       */
      wrote = true;
      *err = ENOMEM;
      goto out;
    }
  }

  if (fresh) {
    memset (&upd, 0, sizeof upd);
    upd.page = page;
    upd.data_crc = c->zero_page_crc;
    memset (old, 0, span_len);
    pthread_mutex_lock (&c->lock);
    evicted = pt_flags (&c->pt, s) & PT_EVICTED;
    pthread_mutex_unlock (&c->lock);
  }
  else {
    pthread_mutex_lock (&c->lock);
    dirty_unsealed = (pt_flags (&c->pt, s) & PT_UNSEALED) &&
      pt_state (&c->pt, s) == LAYOUT_DIRTY;
    pthread_mutex_unlock (&c->lock);
    if (kind == W_CLEAN && dirty_unsealed &&
        cache_seal_slot (c, s, CACHE_EPOCH_NOW) == -1) {
      /* It could become clean: it needs a checksum again. */
      *err = EIO;
      goto out;
    }
    pthread_mutex_lock (&c->lock);
    pagetable_get (&c->pt, s, &upd);
    unsealed = upd.flags & PT_UNSEALED;
    /* Unflushed dirty data from its second rewrite on; clean data (the
     * backend has it: writethrough) at once, if whole sectors change.
     */
    unseal = !unsealed && (upd.flags & PT_VERIFIED) &&
      !(upd.flags & PT_BAD) &&
      ((kind == W_DIRTY && upd.state == LAYOUT_DIRTY) ||
       (kind == W_CLEAN && upd.state == LAYOUT_CLEAN)) &&
      cache_unseal_reserve_locked (c, s);
    pthread_mutex_unlock (&c->lock);
    if (upd.flags & PT_BAD) {
      *err = EIO;
      goto out;
    }
    if (kind == W_CLEAN && !(unseal || unsealed)) {
      /* A W_CLEAN rewrite comes before the backend write (cache_write)
       * and must be one a crash undoes: unsealed, or nothing.
       */
      ret = 3;
      goto out;
    }
    if (kind == W_FILL && span_invalid (&upd, sf, sl))
      memset (old, 0, span_len);        /* nothing cached there yet */
    else if (!(unseal || unsealed) || !covers_sectors (c, page, off, n)) {
      if (pool_read_data (&c->pool, s, old, span_len, span_off) == -1) {
        cache_io_error (c, "reading data", s);
        *err = EIO;
        goto out;
      }
      for (unsigned i = sf; i <= sl; i++)
        if (!layout_bit_test (upd.valid, i))
          memset (old + (i - sf) * ss, 0, ss);
    }
    else
      memset (old, 0, span_len);        /* all overwritten, but for the
                                           bytes past the backend's end */
  }
  memcpy (span, old, span_len);
  before = upd;
  if (merge_span (c, be, page, span, sf, sl, src, off, n, kind,
                  upd.valid, upd.dirty, err) == -1)
    goto out;
  upd.state = layout_map_empty (upd.dirty) ? LAYOUT_CLEAN : LAYOUT_DIRTY;

  /* Maps that are not runs need a side-table entry (pagetable.c): with
   * none to be had, nothing is written and the caller makes the page
   * simple first.
   */
  pthread_mutex_lock (&c->lock);
  if (!pt_maps_reserve_for (&c->pt, s, upd.valid, upd.dirty) &&
      !(kind == W_CLEAN && before.state == LAYOUT_DIRTY &&
        pt_maps_reserve_force (&c->pt, s))) {
    /* (A W_CLEAN write never meets a dirty page: cache_write writes
     * such pages back first.  Were it to, the limit is passed rather
     * than stale sectors kept.)
     */
    pthread_mutex_unlock (&c->lock);
    STATS_ADD (&c->stats, partial_maps_full, 1);
    ret = 2;
    goto out;
  }
  pthread_mutex_unlock (&c->lock);

  if (unseal || unsealed) {
    /* Entry first, with the maps as they are (it says: do not trust
     * this slot after a crash), then the data; then readers may see the
     * new maps.  Later rewrites only write data.
     */
    /* (Clean data too: counting on the old checksum to fail the new
     * data is not enough, since a later rewrite may put the sealed
     * bytes back, and a crash before the backend gets that write would
     * leave them verifying while the backend holds the write before.)
     */
    if (unseal) {
      struct pt_slot mark = before;

      mark.flags |= PT_UNSEALED;
      unseal = false;           /* the commit uses the reservation */
      if (cache_commit_entry (c, s, &mark) == -1)
        goto io_error;
    }
    wrote = true;
    /* Clean data (writethrough) may reach the file later (defer.h):
     * the slot is unsealed, and every other use of its data waits for
     * the queued write.
     */
    if ((kind == W_CLEAN
         ? pool_write_data_later (&c->pool, s, span, span_len, span_off)
         : pool_write_data (&c->pool, s, span, span_len, span_off)) == -1)
      goto io_error;
    pthread_mutex_lock (&c->lock);
    pt_maps_set (&c->pt, s, upd.valid, upd.dirty);
    if (pt_state (&c->pt, s) != upd.state) {
      if (pt_flags (&c->pt, s) & PT_INDEXED)
        cache_set_state_counts (c, pt_state (&c->pt, s), upd.state);
      pt_set_state (&c->pt, s, upd.state);
    }
    pt_set_seq (&c->pt, s, ++c->seq);   /* tells writeback it changed */
    pthread_mutex_unlock (&c->lock);
  }
  else if (evicted) {
    /* The slot's entry still describes the page evicted from it: were
     * the data written first, a crash could leave that entry with data
     * that still verifies for it (the sectors written need not be
     * among its valid ones), and the evicted page, perhaps older than
     * the backend by now, would come back.  So the entry goes first.
     */
    upd.data_crc = layout_crc32c_patch (upd.data_crc, c->page_size, span_off,
                                        old, span, span_len);
    wrote = true;
    if (cache_commit_entry (c, s, &upd) == -1 ||
        pool_write_data (&c->pool, s, span, span_len, span_off) == -1)
      goto io_error;
  }
  else if (!fresh && kind == W_FILL) {
    /* Backend data in sectors that were not valid: the entry on disk
     * may lag (its valid sectors and checksum still hold for the data),
     * which only means a crash forgets these sectors; RAM is ahead, and
     * the next entry write (at the latest, at close) records them.
     */
    upd.data_crc = layout_crc32c_patch (upd.data_crc, c->page_size, span_off,
                                        old, span, span_len);
    if (pool_write_data (&c->pool, s, span, span_len, span_off) == -1)
      goto io_error;
    pthread_mutex_lock (&c->lock);
    {
      uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
      pt_maps_get (&c->pt, s, NULL, dirty);
      pt_maps_set (&c->pt, s, upd.valid, dirty);
    }
    pt_set_crc (&c->pt, s, upd.data_crc);
    pt_set_seq (&c->pt, s, ++c->seq);
    pthread_mutex_unlock (&c->lock);
  }
  else {
    upd.data_crc = layout_crc32c_patch (upd.data_crc, c->page_size, span_off,
                                        old, span, span_len);
    if (pool_write_data (&c->pool, s, span, span_len, span_off) == -1 ||
        cache_commit_entry (c, s, &upd) == -1) {
      wrote = true;
      goto io_error;
    }
  }
  ret = 0;
  if (fresh) {
    pthread_mutex_lock (&c->lock);
    pt_flags_on (&c->pt, s, PT_VERIFIED);
    pagetable_insert (&c->pt, s, page);
    cache_policy_insert (c, s, page);
    cache_set_state_counts (c, LAYOUT_FREE, upd.state);
    pthread_mutex_unlock (&c->lock);
    STATS_ADD (&c->stats, fills, 1);
  }
  else {
    STATS_ADD (&c->stats, pages_updated, 1);
    cache_unpin (c, s);
  }
  goto out;

 io_error:
  cache_io_error (c, "writing", s);
  *err = EIO;
 out:
  if (unseal) {
    pthread_mutex_lock (&c->lock);
    cache_unseal_unreserve_locked (c, s);
    pthread_mutex_unlock (&c->lock);
  }
  if (ret == -1) {
    if (fresh) {
      pthread_mutex_lock (&c->lock);
      pagetable_put_free (&c->pt, s);
      pthread_mutex_unlock (&c->lock);
    }
    else if (wrote && kind == W_CLEAN)
      cache_drop_slot (c, s);   /* may be torn: the backend has it */
    else
      cache_unpin (c, s);
  }
  else if (ret == 2 || ret == 3) {
    if (fresh) {
      pthread_mutex_lock (&c->lock);
      pagetable_put_free (&c->pt, s);
      pthread_mutex_unlock (&c->lock);
    }
    else
      cache_unpin (c, s);
  }
  free (old_heap);
  free (span_heap);
  return ret;
}

/* Apply a write to a copy of pinned slot s in a new slot, which then
 * replaces it (if no slot can be had, the page is written back first
 * and changed in place).  Returns 0, -1 (*err) or 2 (the maps do not
 * fit: see cache_patch_slot).  Consumes the pin.
 */
static int write_fresh (struct cache *c, const struct cache_backend *be,
                        uint64_t page, const uint8_t *src, uint32_t off,
                        uint32_t n, enum wkind kind, int *err);

static int
cow_slot (struct cache *c, const struct cache_backend *be, uint64_t page,
          uint32_t s, const uint8_t *src, uint32_t off, uint32_t n,
          enum wkind kind, int *err)
{
  uint8_t *buf = malloc (c->page_size);
  struct pt_slot snap;
  unsigned sf, sl;
  int r;
  bool was_clean;

  if (buf == NULL) {
    cache_unpin (c, s);
    *err = ENOMEM;
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  was_clean = pt_state (&c->pt, s) == LAYOUT_CLEAN;
  pthread_mutex_unlock (&c->lock);
  if (cache_read_verified (c, be, s, buf) == -1) {
    /* Pin consumed.  A clean copy that failed its check was dropped:
     * the backend has the page, so the write goes on as for a page not
     * cached.  Bad dirty data fails the write.
     */
    free (buf);
    if (was_clean) {
      uint32_t again = cache_lookup_pin (c, page);
      if (again == PT_NONE)
        return write_fresh (c, be, page, src, off, n, kind, err);
      cache_unpin (c, again);
    }
    *err = EIO;
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  pthread_mutex_unlock (&c->lock);
  for (unsigned i = 0; i < c->nsectors; i++)
    if (!layout_bit_test (snap.valid, i))
      memset (buf + (size_t) i * c->sector_size, 0, c->sector_size);

  cache_sector_span (c, off, n, &sf, &sl);
  if (merge_span (c, be, page, buf + sf * c->sector_size, sf, sl, src,
                  off, n, kind, snap.valid, snap.dirty, err) == -1) {
    cache_unpin (c, s);
    free (buf);
    return -1;
  }
  /* cache_fill_slot wants a whole valid page: complete the invalid
   * sectors only if all are valid; otherwise write it ourselves.
   */
  {
    uint32_t ns = cache_alloc_slot (c, true);
    struct pt_slot upd = snap;

    if (ns == PT_NONE) {
      /* No room for a copy: write this page back ourselves; then it is
       * clean and may be changed in place.
       */
      free (buf);
      if (writeback_page_locked (c, be, page, s, err) == -1) {
        cache_unpin (c, s);
        return -1;
      }
      /* Clean now; but an older version still on disk must go before
       * it may change in place (cache_must_cow).
       */
      if (!cache_settle (c, s)) {
        log_error ("cache file %s: page %llu: its older version could not "
                   "be freed; the write fails", c->path,
                   (unsigned long long) page);
        cache_unpin (c, s);
        *err = EIO;
        return -1;
      }
      pthread_rwlock_rdlock (&c->inplace);
      r = cache_patch_slot (c, be, page, s, false, src, off, n, kind, err);
      pthread_rwlock_unlock (&c->inplace);
      return r;
    }
    upd.state = layout_map_empty (upd.dirty) ? LAYOUT_CLEAN : LAYOUT_DIRTY;
    upd.data_crc = cache_page_crc (c, buf, upd.valid);
    upd.flags &= ~PT_UNSEALED;  /* a fresh checksum */
    pthread_mutex_lock (&c->lock);
    if (!pt_maps_reserve_for (&c->pt, ns, upd.valid, upd.dirty) &&
        !(kind == W_CLEAN && snap.state == LAYOUT_DIRTY &&
          pt_maps_reserve_force (&c->pt, ns))) {
      /* (W_CLEAN on a dirty page, not reached either: see
       * cache_patch_slot.)
       */
      pagetable_put_free (&c->pt, ns);
      pthread_mutex_unlock (&c->lock);
      STATS_ADD (&c->stats, partial_maps_full, 1);
      cache_unpin (c, s);
      free (buf);
      return 2;
    }
    pthread_mutex_unlock (&c->lock);
    if (pool_write_data (&c->pool, ns, buf, c->page_size, 0) == -1 ||
        cache_commit_entry (c, ns, &upd) == -1) {
      cache_io_error (c, "writing", ns);
      pthread_mutex_lock (&c->lock);
      pagetable_put_free (&c->pt, ns);
      pthread_mutex_unlock (&c->lock);
      cache_unpin (c, s);
      free (buf);
      *err = EIO;
      return -1;
    }
    pthread_mutex_lock (&c->lock);
    pt_flags_on (&c->pt, ns, PT_VERIFIED);
    pthread_mutex_unlock (&c->lock);
    cache_supersede (c, s, ns, page);
    r = 0;
  }
  free (buf);
  return r;
}

/* Write straight to the backend because the cache has no room. */
static int
write_around (struct cache *c, const struct cache_backend *be,
              const uint8_t *src, uint32_t n, uint64_t offset, int *err)
{
  STATS_ADD (&c->stats, write_through_full, 1);
  atomic_store (&c->backend_unflushed, true);
  return be->pwrite (be->h, src, n, offset, false, err);
}

/* Put the write [off, off+n) of a page with no cached copy into a new
 * slot, or, when no slot can be had, send it to the backend.
 */
static int
write_fresh (struct cache *c, const struct cache_backend *be,
             uint64_t page, const uint8_t *src, uint32_t off, uint32_t n,
             enum wkind kind, int *err)
{
  uint32_t s = cache_alloc_slot (c, true);
  int r;

  if (s == PT_NONE)
    return write_around (c, be, src, n, page * c->page_size + off, err);
  r = cache_patch_slot (c, be, page, s, true, src, off, n, kind, err);
  if (r == 2)                   /* one run: not reached */
    return write_around (c, be, src, n, page * c->page_size + off, err);
  return r;
}

/* The write [off, off+n) of page would leave maps that need a
 * side-table entry, and the table is full: make the page simple.  Its
 * dirty data (W_DIRTY only: cache_write writes dirty pages back before
 * a W_CLEAN write) is written back, the cached copy is dropped, and the
 * write goes into a fresh slot, where its maps are one run.  W_CLEAN
 * (the backend has the data) just drops the cached copy.
 */
static int
write_page_simple (struct cache *c, const struct cache_backend *be,
                   uint64_t page, const uint8_t *src, uint32_t off,
                   uint32_t n, enum wkind kind, int *err)
{
  uint32_t s = cache_lookup_pin (c, page);

  if (s != PT_NONE) {
    bool dirty;

    pthread_mutex_lock (&c->lock);
    dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY;
    pthread_mutex_unlock (&c->lock);
    if (dirty && kind == W_CLEAN) {
      /* Not reached (see above); keep the slot rather than lose data. */
      log_error ("cache file %s: page %llu: dirty page written through "
                 "without room for its maps", c->path,
                 (unsigned long long) page);
      cache_unpin (c, s);
      *err = EIO;
      return -1;
    }
    if (dirty && writeback_page_locked (c, be, page, s, err) == -1) {
      cache_unpin (c, s);
      return -1;
    }
    cache_drop_slot (c, s);
  }
  if (kind != W_DIRTY)
    return 0;
  return write_fresh (c, be, page, src, off, n, kind, err);
}

/* Put bytes [off, off+n) of page (from src) into the cache as kind.
 * W_CLEAN: the backend already has them; a page not cached is only
 * added when written whole.  The page is range locked by the caller.
 */
static int
write_page (struct cache *c, const struct cache_backend *be, uint64_t page,
            const uint8_t *src, uint32_t off, uint32_t n, enum wkind kind,
            int *err)
{
  const uint32_t pbytes = cache_page_bytes (c, page);
  const bool whole = off == 0 && n >= pbytes;
  uint32_t s = cache_lookup_pin (c, page);
  bool cow = false, bad = false;
  int r;

  if (s != PT_NONE) {
    pthread_mutex_lock (&c->lock);
    bad = pt_flags (&c->pt, s) & PT_BAD;
    pthread_mutex_unlock (&c->lock);
  }

  if (whole) {
    uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
    const uint8_t *data = src;
    uint8_t *tmp = NULL;

    if (n < c->page_size) {
      /* The short last page of the backend, padded with zeroes. */
      tmp = malloc (c->page_size);
      if (tmp == NULL) {
        /* The backend has the new data already (W_CLEAN): the cached
         * copy must go.
         */
        if (s != PT_NONE && kind == W_CLEAN)
          cache_drop_slot (c, s);
        else if (s != PT_NONE)
          cache_unpin (c, s);
        *err = ENOMEM;
        return -1;
      }
      memcpy (tmp, src, n);
      memset (tmp + n, 0, c->page_size - n);
      data = tmp;
    }
    cache_map_fill (c, dirty);
    r = cache_fill_slot (c, page, s, data, kind == W_DIRTY ? dirty : NULL,
                         false);
    free (tmp);
    if (r == 1) {
      /* No slot for the new version: it goes to the backend, and the
       * cached version, now older than the backend's, must go.
       */
      uint32_t old;
      if (kind == W_DIRTY &&
          write_around (c, be, src, n, page * c->page_size, err) == -1)
        return -1;
      old = cache_lookup_pin (c, page);
      if (old != PT_NONE)
        cache_drop_slot (c, old);
      return 0;
    }
    if (r == -1 && kind == W_DIRTY) {
      *err = EIO;
      return -1;
    }
    return 0;
  }

  if (bad) {
    cache_unpin (c, s);
    *err = EIO;
    return -1;
  }
  if (s == PT_NONE) {
    if (kind == W_CLEAN)
      return 0;                 /* partial page not cached: leave it */
    return write_fresh (c, be, page, src, off, n, kind, err);
  }
  /* Decide and rewrite in place under c->inplace (see cache-int.h). */
  pthread_rwlock_rdlock (&c->inplace);
  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (cow) {
    pthread_rwlock_unlock (&c->inplace);
    r = cow_slot (c, be, page, s, src, off, n, kind, err);
  }
  else {
    r = cache_patch_slot (c, be, page, s, false, src, off, n, kind, err);
    pthread_rwlock_unlock (&c->inplace);
  }
  if (r == 2)
    r = write_page_simple (c, be, page, src, off, n, kind, err);
  return r;
}

/* Writethrough, before the backend gets the write: bring the cached
 * copy of page (if any) up to date with bytes [off, off+n), in a way a
 * crash undoes.  The slot is rewritten unsealed (its entry on disk says
 * so before its data changes): if nbdkit dies before or after the
 * backend write, recovery drops the slot and the page is read from the
 * backend, so the cache never holds older data than the backend.
 * (Written after the backend, a crash between the two would leave the
 * old data cached, with a checksum that holds.)
 * When that cannot be done the cached copy is dropped.  Pages not
 * cached are left alone here (whole ones are added after the backend
 * write), and so are sectors not cached: if none of those the write
 * touches is cached, only the backend gets it.  The page is range
 * locked by the caller; errors are not returned (the page is dropped).
 */
static void
write_through_first (struct cache *c, const struct cache_backend *be,
                     uint64_t page, const uint8_t *src, uint32_t off,
                     uint32_t n)
{
  uint32_t s = cache_lookup_pin (c, page);
  unsigned sf, sl;
  bool any;
  int r, err = 0;

  if (s == PT_NONE)
    return;
  cache_sector_span (c, off, n, &sf, &sl);
  pthread_mutex_lock (&c->lock);
  any = pagetable_range_any_valid (&c->pt, s, sf, sl);
  pthread_mutex_unlock (&c->lock);
  if (!any) {
    cache_unpin (c, s);
    STATS_ADD (&c->stats, writes_not_cached, 1);
    return;
  }
  pthread_rwlock_rdlock (&c->inplace);
  r = cache_patch_slot (c, be, page, s, false, src, off, n, W_CLEAN, &err);
  pthread_rwlock_unlock (&c->inplace);
  if (r != 0) {
    /* Not unsealed (not verified since start, bad, or no memory), maps
     * that do not fit, or an error: the cached copy goes.
     */
    s = cache_lookup_pin (c, page);
    if (s != PT_NONE)
      cache_drop_slot (c, s);
  }
}

/* The part [*a, *b) of page that the request [offset, offset+count)
 * covers, as offsets within the page.
 */
static void
page_part (uint32_t ps, uint64_t page, uint64_t offset, uint32_t count,
           uint32_t *a, uint32_t *b)
{
  uint64_t pstart = page * ps;

  *a = offset > pstart ? offset - pstart : 0;
  *b = offset + count < pstart + ps ? offset + count - pstart : ps;
}

int
cache_write (struct cache *c, const struct cache_backend *be,
             const void *buf, uint32_t count, uint64_t offset, bool fua,
             int *err)
{
  const uint32_t ps = c->page_size;
  const bool writeback = c->mode == LAYOUT_MODE_WRITEBACK;
  const bool through = !writeback;
  uint64_t first, last;
  int ret = -1;

  STATS_ADD (&c->stats, write_ops, 1);
  STATS_ADD (&c->stats, bytes_written, count);
  cache_touch_io (c);
  if (count == 0)
    return 0;
  if (cache_degraded (c))
    return through_op (c, be, NULL, NULL, buf, count, offset, fua, err);

  first = offset / ps;
  last = (offset + count - 1) / ps;
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }

  /* Pages still dirty from an earlier writeback run are written back
   * first: once the backend has the new data, writing back their older
   * dirty sectors (to make room for a copy, or to simplify their maps)
   * would bring the old data back, and dropping them (writearound)
   * would lose the rest of their dirty sectors.
   */
  if (through) {
    if (cache_clean_pages (c, be, first, last, err) == -1)
      goto out;
    /* The cached copies change (or go) before the backend gets the
     * data, never after: see write_through_first.
     */
    if (c->mode == LAYOUT_MODE_WRITEAROUND)
      cache_invalidate_pages (c, first, last);
    else
      for (uint64_t page = first; page <= last; page++) {
        uint32_t a, b;

        page_part (ps, page, offset, count, &a, &b);
        write_through_first (c, be, page,
                             (const uint8_t *) buf + (page * ps + a - offset),
                             a, b - a);
      }
    if (be->pwrite (be->h, buf, count, offset, fua, err) == -1) {
      /* The backend may hold some of the new data now, and the cache
       * some the backend never got: the cached copies go.
       */
      cache_invalidate_pages (c, first, last);
      goto out;
    }
    if (c->mode == LAYOUT_MODE_WRITEAROUND) {
      ret = 0;
      goto out;
    }
  }

  for (uint64_t page = first; page <= last; page++) {
    uint32_t a, b;
    int r;

    page_part (ps, page, offset, count, &a, &b);
    if (through) {
      /* Whole pages not cached are added now that the backend has
       * them; the rest was done before.
       */
      uint32_t s;
      if (a != 0 || b - a < cache_page_bytes (c, page))
        continue;
      s = cache_lookup_pin (c, page);
      if (s != PT_NONE) {
        cache_unpin (c, s);
        continue;
      }
    }
    r = write_page (c, be, page,
                    (const uint8_t *) buf + (page * ps + a - offset),
                    a, b - a, through ? W_CLEAN : W_DIRTY, err);
    if (r == -1 && !through)
      goto out;
  }
  ret = 0;

 out:
  rangelock_release (&c->ranges, first, last);
  if (ret == -1 && writeback && cache_degraded (c)) {
    /* The cache device failed under this very write: do it again as
     * pass-through (pages it already dirtied are written back first).
     */
    return through_op (c, be, NULL, NULL, buf, count, offset, fua, err);
  }
  /* A FUA write is durable as the flush mode says.  In writethrough it
   * is durable on the backend already; syncing the cache too keeps an
   * older cached copy from coming back after power loss.
   */
  if (ret == 0 && fua) {
    if (writeback)
      ret = cache_flush (c, be, err);
    else
      cache_sync (c, err);
  }
  return ret;
}

int
cache_zero_trim (struct cache *c, const struct cache_backend *be,
                 bool is_zero, cache_backend_op do_op, void *opaque,
                 uint32_t count, uint64_t offset, bool fua, int *err)
{
  const uint32_t ps = c->page_size;
  const bool writeback = c->mode == LAYOUT_MODE_WRITEBACK;
  uint64_t end = offset + count;
  uint64_t full_lo, full_hi;    /* whole pages: [full_lo, full_hi) bytes */
  uint8_t *zeroes = NULL;
  int ret = -1;

  cache_touch_io (c);
  if (count == 0)
    return do_op (opaque, count, offset, err);
  if (cache_degraded (c))
    return through_op (c, be, do_op, opaque, NULL, count, offset, fua, err);

  if (!writeback) {
    /* The backend is the truth: do it there, drop cached copies. */
    ret = through_op (c, be, do_op, opaque, NULL, count, offset, false, err);
    if (ret == 0 && fua)
      cache_sync (c, err);
    return ret;
  }

  /* Writeback: whole pages go to the backend and leave the cache; the
   * partial pages at the edges keep their dirty data, with zeroes
   * written over the zeroed part.
   */
  full_lo = (offset + ps - 1) / ps * ps;
  full_hi = end / ps * ps;
  if (end == c->backend_size)
    full_hi = end;              /* the short last page counts as whole */
  if (full_hi < full_lo)
    full_hi = full_lo;

  if (full_hi > full_lo) {
    uint64_t flo = full_lo / ps, fhi = (full_hi - 1) / ps;
    if (rangelock_acquire (&c->ranges, flo, fhi) == -1) {
      *err = errno;
      return -1;
    }
    ret = do_op (opaque, full_hi - full_lo, full_lo, err);
    if (ret == 0) {
      atomic_store (&c->backend_unflushed, true);
      cache_invalidate_pages (c, flo, fhi);
    }
    rangelock_release (&c->ranges, flo, fhi);
    if (ret == -1)
      return -1;
  }
  ret = -1;                    /* until the edges are done too */
  if (is_zero) {
    uint64_t parts[2][2] = {
      { offset, full_lo < end ? full_lo : end },
      { full_hi > offset ? full_hi : offset, end },
    };
    zeroes = calloc (1, ps);
    if (zeroes == NULL) {
      *err = ENOMEM;
      return -1;
    }
    for (int k = 0; k < 2; k++) {
      uint64_t lo = parts[k][0], hi = parts[k][1];
      while (lo < hi) {
        uint32_t n = hi - lo < ps - lo % ps ? hi - lo : ps - lo % ps;
        if (cache_write (c, be, zeroes, n, lo, false, err) == -1)
          goto out;
        lo += n;
      }
    }
  }
  ret = 0;
  if (fua && cache_flush (c, be, err) == -1)
    ret = -1;
 out:
  free (zeroes);
  return ret;
}

/* FLUSH with a failed cache device: its own durability cannot be
 * trusted, so the backend must hold everything a flush covers.
 */
static int
degraded_flush (struct cache *c, const struct cache_backend *be, int *err)
{
  int r, tries = 0;
  struct timespec ms = { .tv_sec = 0, .tv_nsec = 1000000 };

  /* Busy pages (r == 1) belong to requests in flight: let them end. */
  while ((r = writeback_pass (c, be, 0, false, err)) == 1 && ++tries < 10000)
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
  if (wb && c->flush_mode == CACHE_FLUSH_BACKEND && c->wb) {
    if (writeback_request_all (c, err) == -1)
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
