/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: changing a cached page in place.
 *
 * Owns cache_patch_slot: applying bytes of a page to a slot that holds
 * it (or to a fresh one), touching only the sectors written, patching
 * the data CRC instead of recomputing it, and unsealing an unflushed
 * slot rewritten again (seal.c).  The caller holds the page's range
 * lock; c->inplace is held shared across a rewrite in place, c->lock
 * only around page-table updates (lock table: docs/design.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* Merge the write w (bytes [off, off+n) of page, from src) into span,
 * which holds sectors [sf, sl] of the page as stored (invalid sectors
 * read as zeroes), and update the valid/dirty maps.  A partly written sector
 * that was not valid is completed from the backend for W_DIRTY and
 * left invalid for W_CLEAN.  Returns 0 or -1 (*err) if the backend read
 * failed.
 */
int
patch_merge_span (const struct page_write *w, uint8_t *span, unsigned sf,
                  unsigned sl, uint8_t *valid, uint8_t *dirty)
{
  struct cache *c = w->c;
  const uint32_t off = w->off, n = w->n;
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, w->page);
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
    if (w->kind != W_DIRTY) {
      skip[k] = true;
      continue;
    }
    /* Complete the sector from the backend (zeroes past its end). */
    memset (span + (s0 - span_off), 0, ss);
    if (w->be->pread (w->be->h, span + (s0 - span_off), s1 - s0,
                      w->page * c->page_size + s0, w->err) == -1)
      return -1;
    STATS_ADD (&c->stats, bytes_from_backend, s1 - s0);
  }

  memcpy (span + (off - span_off), w->src, n);

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
    if (w->kind == W_DIRTY)
      layout_bit_set (dirty, i);
    else if (w->kind == W_CLEAN && covered)
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

/* Spans up to this size are patched in buffers on the stack. */
#define PATCH_STACK_BYTES 4096

/* One patch in progress: the request, the span of sectors it touches
 * (old: as stored, span: as it will be), the slot's record before and
 * after, and how far it got.
 */
struct patch {
  struct cache *c;
  const struct cache_backend *be;
  uint64_t page;
  uint32_t s;
  bool fresh;
  const uint8_t *src;
  uint32_t off, n;
  enum wkind kind;

  unsigned sf, sl;               /* sectors [sf, sl] */
  uint32_t span_off, span_len;
  uint8_t *old, *span;
  uint8_t *old_heap, *span_heap;
  uint8_t old_small[PATCH_STACK_BYTES], span_small[PATCH_STACK_BYTES];

  struct pt_slot upd, before;
  bool wrote;                    /* the slot's data may have changed */
  bool unseal;                   /* to be unsealed (a list reservation) */
  bool unsealed;                 /* already unsealed */
  bool evicted;                  /* fresh, its entry names another page */
};

/* The span's buffers.  Returns 0, or -1 (*err) without memory. */
static int
patch_buffers (struct patch *p, int *err)
{
  const uint32_t ss = p->c->sector_size;

  cache_sector_span (p->c, p->off, p->n, &p->sf, &p->sl);
  p->span_off = p->sf * ss;
  p->span_len = (p->sl - p->sf + 1) * ss;
  if (p->span_len <= sizeof p->old_small) {
    /* Small writes (the common case) need no allocation. */
    p->old = p->old_small;
    p->span = p->span_small;
    return 0;
  }
  p->old = p->old_heap = malloc (p->span_len);
  p->span = p->span_heap = malloc (p->span_len);
  if (p->old == NULL || p->span == NULL) {
    /* W_CLEAN: the backend has the new data, the slot the old: it goes
     * (patch_release), as after a failed write.
     */
    p->wrote = true;
    *err = ENOMEM;
    return -1;
  }
  return 0;
}

/* A fresh slot: nothing stored yet. */
static void
patch_load_fresh (struct patch *p)
{
  struct cache *c = p->c;

  memset (&p->upd, 0, sizeof p->upd);
  p->upd.page = p->page;
  pt_slot_set_crc (&p->upd, c->zero_page_crc);
  memset (p->old, 0, p->span_len);
  pthread_mutex_lock (&c->lock);
  p->evicted = pt_flags (&c->pt, p->s) & PT_EVICTED;
  pthread_mutex_unlock (&c->lock);
}

/* Under c->lock: read slot s's record into p->upd and decide whether
 * this rewrite unseals it: unflushed dirty data from its second rewrite
 * on; clean data (the backend has it: writethrough) at once.
 */
static void
patch_decide_locked (struct patch *p)
{
  struct cache *c = p->c;
  struct pt_slot *u = &p->upd;

  pagetable_get (&c->pt, p->s, u);
  p->unsealed = u->flags & PT_UNSEALED;
  p->unseal = !p->unsealed && (u->flags & PT_VERIFIED) &&
    !(u->flags & PT_BAD) &&
    ((p->kind == W_DIRTY && u->state == LAYOUT_DIRTY) ||
     (p->kind == W_CLEAN && u->state == LAYOUT_CLEAN)) &&
    cache_unseal_reserve_locked (c, p->s);
}

/* A cached slot: its record, and the sectors of the span as stored
 * (invalid ones as zeroes).
 */
static enum patch_result
patch_load_cached (struct patch *p, int *err)
{
  struct cache *c = p->c;
  const uint32_t ss = c->sector_size;
  bool dirty_unsealed;

  pthread_mutex_lock (&c->lock);
  dirty_unsealed = (pt_flags (&c->pt, p->s) & PT_UNSEALED) &&
    pt_state (&c->pt, p->s) == LAYOUT_DIRTY;
  pthread_mutex_unlock (&c->lock);
  if (p->kind == W_CLEAN && dirty_unsealed &&
      cache_seal_slot (c, p->s, CACHE_EPOCH_NOW) == -1) {
    /* It could become clean: it needs a checksum again. */
    *err = EIO;
    return PATCH_ERROR;
  }
  pthread_mutex_lock (&c->lock);
  patch_decide_locked (p);
  pthread_mutex_unlock (&c->lock);
  if (p->upd.flags & PT_BAD) {
    *err = EIO;
    return PATCH_ERROR;
  }
  if (p->kind == W_CLEAN && !(p->unseal || p->unsealed))
    /* A W_CLEAN rewrite comes before the backend write (cache_write)
     * and must be one a crash undoes: unsealed, or nothing.
     */
    return PATCH_NOT_UNSEALED;
  if (!(p->unseal || p->unsealed)) {
    /* Sealed: its checksum, to patch (patch_sealed, patch_fill). */
    uint32_t crc;

    if (cache_entry_crc (c, p->s, &p->upd, &crc) == -1) {
      *err = EIO;
      return PATCH_ERROR;
    }
    pt_slot_set_crc (&p->upd, crc);
  }
  if (p->kind == W_FILL && span_invalid (&p->upd, p->sf, p->sl))
    memset (p->old, 0, p->span_len);    /* nothing cached there yet */
  else if (!(p->unseal || p->unsealed) ||
           !covers_sectors (c, p->page, p->off, p->n)) {
    if (defer_read_data (&c->defer, &c->pool, p->s, p->old, p->span_len,
                         p->span_off) == -1) {
      cache_io_error (c, "reading data", p->s);
      *err = EIO;
      return PATCH_ERROR;
    }
    for (unsigned i = p->sf; i <= p->sl; i++)
      if (!layout_bit_test (p->upd.valid, i))
        memset (p->old + (i - p->sf) * ss, 0, ss);
  }
  else
    memset (p->old, 0, p->span_len);    /* all overwritten, but for the
                                           bytes past the backend's end */
  return PATCH_OK;
}

/* Maps that are not runs need a side-table entry (pagetable.c): with
 * none to be had, nothing is written and the caller makes the page
 * simple first.
 */
static enum patch_result
patch_reserve_maps (struct patch *p)
{
  struct cache *c = p->c;
  bool ok;

  pthread_mutex_lock (&c->lock);
  /* (A W_CLEAN write never meets a dirty page: cache_write writes such
   * pages back first.  Were it to, the limit is passed rather than
   * stale sectors kept.)
   */
  ok = pt_maps_reserve_for (&c->pt, p->s, p->upd.valid, p->upd.dirty) ||
    (p->kind == W_CLEAN && p->before.state == LAYOUT_DIRTY &&
     pt_maps_reserve_force (&c->pt, p->s));
  pthread_mutex_unlock (&c->lock);
  if (ok)
    return PATCH_OK;
  STATS_ADD (&c->stats, partial_maps_full, 1);
  return PATCH_NO_MAPS;
}

static int
patch_write_span (struct patch *p)
{
  return defer_write_data (&p->c->defer, &p->c->pool, p->s, p->span,
                           p->span_len, p->span_off);
}

static void
patch_crc (struct patch *p)
{
  p->upd.data_crc = layout_crc32c_patch (p->upd.data_crc, p->c->page_size,
                                         p->span_off, p->old, p->span,
                                         p->span_len);
}

/* Strategy 1, an unsealed slot (or one this rewrite unseals): entry
 * first, with the maps as they are (it says: do not trust this slot
 * after a crash), then the data; then readers may see the new maps.
 * Later rewrites only write data.  (Clean data too: counting on the old
 * checksum to fail the new data is not enough, since a later rewrite
 * may put the sealed bytes back, and a crash before the backend gets
 * that write would leave them verifying while the backend holds the
 * write before.)  Returns 0 or -1 (an I/O error).
 */
static int
patch_unsealed (struct patch *p)
{
  struct cache *c = p->c;
  int r;

  if (p->unseal) {
    struct pt_slot mark = p->before;

    mark.flags |= PT_UNSEALED;
    p->unseal = false;          /* the commit uses the reservation */
    if (cache_commit_entry (c, p->s, &mark) == -1)
      return -1;
  }
  p->wrote = true;
  /* Clean data (writethrough) may reach the file later (defer.h): the
   * slot is unsealed, and every other use of its data waits for the
   * queued write.
   */
  r = p->kind == W_CLEAN
    ? defer_write_data_later (&c->defer, &c->pool, p->s, p->span,
                              p->span_len, p->span_off)
    : patch_write_span (p);
  if (r == -1)
    return -1;
  pthread_mutex_lock (&c->lock);
  pt_maps_set (&c->pt, p->s, p->upd.valid, p->upd.dirty);
  if (pt_state (&c->pt, p->s) != p->upd.state) {
    if (pt_flags (&c->pt, p->s) & PT_INDEXED)
      cache_set_state_counts_locked (c, pt_state (&c->pt, p->s), p->upd.state);
    pt_set_state (&c->pt, p->s, p->upd.state);
  }
  pt_set_seq (&c->pt, p->s, ++c->seq);  /* tells writeback it changed */
  if (p->upd.state == LAYOUT_DIRTY)
    pt_set_gen (&c->pt, p->s, c->gen);
  pthread_mutex_unlock (&c->lock);
  return 0;
}

/* Strategy 2, a fresh slot taken from an evicted page: the slot's entry
 * still describes that page.  Were the data written first, a crash
 * could leave that entry with data that still verifies for it (the
 * sectors written need not be among its valid ones), and the evicted
 * page, perhaps older than the backend by now, would come back.  So the
 * entry goes first.
 */
static int
patch_evicted (struct patch *p)
{
  patch_crc (p);
  p->wrote = true;
  if (cache_commit_entry (p->c, p->s, &p->upd) == -1 ||
      patch_write_span (p) == -1)
    return -1;
  return 0;
}

/* Strategy 3, backend data in sectors of a cached slot that were not
 * valid: data first (the entry on disk still holds for the data: its
 * checksum counts invalid sectors as zeroes, so a crash only forgets
 * these sectors), then the entry with the new valid sectors and the
 * patched checksum (the next patch starts from it: cache_entry_crc).
 * The dirty data does not change, so the slot keeps its sync epoch and
 * generation.
 */
static int
patch_fill (struct patch *p)
{
  struct cache *c = p->c;
  struct layout_entry e;
  struct pt_slot v;

  patch_crc (p);
  if (patch_write_span (p) == -1)
    return -1;
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, p->s, &v);
  memcpy (v.valid, p->upd.valid, sizeof v.valid);
  pt_maps_set (&c->pt, p->s, v.valid, v.dirty);
  pt_slot_set_crc (&v, p->upd.data_crc);
  cache_entry_renumber_locked (c, p->s, &v, &e);
  pthread_mutex_unlock (&c->lock);
  return cache_write_entry (c, p->s, &e);
}

/* Strategy 4, the rest (a sealed slot, or a fresh one): data, then the
 * entry with the patched checksum.
 */
static int
patch_sealed (struct patch *p)
{
  patch_crc (p);
  if (patch_write_span (p) == -1 ||
      cache_commit_entry (p->c, p->s, &p->upd) == -1) {
    p->wrote = true;
    return -1;
  }
  return 0;
}

/* Done: a fresh slot enters the index, a cached one is unpinned. */
static void
patch_done (struct patch *p)
{
  struct cache *c = p->c;

  if (p->fresh) {
    pthread_mutex_lock (&c->lock);
    pt_flags_on (&c->pt, p->s, PT_VERIFIED);
    pagetable_insert (&c->pt, p->s, p->page);
    cache_policy_insert (c, p->s, p->page);
    cache_set_state_counts_locked (c, LAYOUT_FREE, p->upd.state);
    pthread_mutex_unlock (&c->lock);
    STATS_ADD (&c->stats, fills, 1);
  }
  else {
    STATS_ADD (&c->stats, pages_updated, 1);
    cache_unpin (c, p->s);
  }
}

/* Not done (r): give back the reservation, the pin or the fresh slot.
 * A W_CLEAN slot whose data may be torn must go (the backend has it),
 * but dropping it settles, which a thread holding c->inplace may not
 * do: its pin stays for the caller (PATCH_TORN).  Returns r, or
 * PATCH_TORN.
 */
static enum patch_result
patch_release (struct patch *p, enum patch_result r)
{
  struct cache *c = p->c;

  if (p->unseal) {
    pthread_mutex_lock (&c->lock);
    cache_unseal_unreserve_locked (c, p->s);
    pthread_mutex_unlock (&c->lock);
  }
  if (r == PATCH_OK)
    return r;
  if (p->fresh) {
    pthread_mutex_lock (&c->lock);
    pagetable_put_free (&c->pt, p->s);
    pthread_mutex_unlock (&c->lock);
  }
  else if (r == PATCH_ERROR && p->wrote && p->kind == W_CLEAN)
    return PATCH_TORN;
  else
    cache_unpin (c, p->s);
  return r;
}

/* Write the span to the slot by the strategy that fits. */
static int
patch_store (struct patch *p)
{
  if (p->unseal || p->unsealed)
    return patch_unsealed (p);
  if (p->evicted)
    return patch_evicted (p);
  if (!p->fresh && p->kind == W_FILL)
    return patch_fill (p);
  return patch_sealed (p);
}

enum patch_result
cache_patch_slot (const struct page_write *w, uint32_t s, bool fresh)
{
  struct cache *c = w->c;
  int *err = w->err;
  struct patch patch = { .c = c, .be = w->be, .page = w->page, .s = s,
                         .fresh = fresh, .src = w->src, .off = w->off,
                         .n = w->n, .kind = w->kind };
  struct patch *p = &patch;
  enum patch_result r = PATCH_ERROR;

  if (patch_buffers (p, err) == -1)
    goto out;
  if (fresh)
    patch_load_fresh (p);
  else if ((r = patch_load_cached (p, err)) != PATCH_OK)
    goto out;
  r = PATCH_ERROR;
  memcpy (p->span, p->old, p->span_len);
  p->before = p->upd;
  if (patch_merge_span (w, p->span, p->sf, p->sl, p->upd.valid,
                        p->upd.dirty) == -1)
    goto out;
  p->upd.state = layout_map_empty (p->upd.dirty) ? LAYOUT_CLEAN
    : LAYOUT_DIRTY;
  if ((r = patch_reserve_maps (p)) != PATCH_OK)
    goto out;
  if (patch_store (p) == -1) {
    cache_io_error (c, "writing", s);
    *err = EIO;
    r = PATCH_ERROR;
    goto out;
  }
  patch_done (p);
 out:
  r = patch_release (p, r);
  free (p->old_heap);
  free (p->span_heap);
  return r;
}
