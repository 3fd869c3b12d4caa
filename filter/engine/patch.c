/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: changing a cached page in place.
 *
 * Owns cache_patch_slot: applying bytes of a page to a slot that holds
 * it (or to a fresh one), touching only the sectors written, patching
 * the data CRC instead of recomputing it, and unsealing an unflushed
 * slot rewritten again (seal.c).  The caller holds the page's range
 * lock; c->inplace is held shared across a rewrite in place, c->lock
 * only around page-table updates (lock table: cache-int.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* Merge a write of src, bytes [off, off+n) of page, into span, which
 * holds sectors [sf, sl] of the page as stored (invalid sectors read as
 * zeroes), and update the valid/dirty maps.  A partly written sector
 * that was not valid is completed from the backend for W_DIRTY and
 * left invalid for W_CLEAN.  Returns 0 or -1 (*err) if the backend read
 * failed.
 */
int
patch_merge_span (struct cache *c, const struct cache_backend *be, uint64_t page,
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
      if (defer_read_data (&c->defer, &c->pool, s, old, span_len, span_off) == -1) {
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
  if (patch_merge_span (c, be, page, span, sf, sl, src, off, n, kind,
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
         ? defer_write_data_later (&c->defer, &c->pool, s, span, span_len, span_off)
         : defer_write_data (&c->defer, &c->pool, s, span, span_len, span_off)) == -1)
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
        defer_write_data (&c->defer, &c->pool, s, span, span_len, span_off) == -1)
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
    if (defer_write_data (&c->defer, &c->pool, s, span, span_len, span_off) == -1)
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
    if (defer_write_data (&c->defer, &c->pool, s, span, span_len, span_off) == -1 ||
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
