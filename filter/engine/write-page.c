/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: one page of a write, into the cache.
 *
 * Owns cache_write_page: the part of a client write that falls in one
 * page, stored in the cache, dirty (writeback) or clean (writethrough,
 * once the backend has it).  In place when the slot holds nothing a
 * flush covers (cache_patch_in_place), otherwise into a new slot that
 * replaces it (copy on write, cow_slot); a whole page as a new version
 * (cache_fill_slot); a page the cache has no room for goes to the
 * backend (write_around).  The caller holds the page's range lock
 * across its backend and cache I/O (lock table: docs/design.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

static int write_fresh (const struct page_write *w);

/* Rewrite pinned slot s in place (its page is range locked, and it
 * need not be copied: see cache_must_cow), holding c->inplace across
 * the writes.  A slot left torn is dropped once c->inplace is given
 * back (PATCH_TORN).  Returns as cache_patch_slot; consumes the pin.
 */
int
cache_patch_in_place (const struct page_write *w, uint32_t s)
{
  struct cache *c = w->c;
  int r;

  cache_inplace_enter (c);
  r = cache_patch_slot (w, s, false);
  cache_inplace_leave (c);
  if (r == PATCH_TORN) {
    cache_drop_slot (c, s);
    r = PATCH_ERROR;
  }
  return r;
}

/* No room for a copy: write page back ourselves (pinned slot s); then
 * it is clean and may be changed in place.  Consumes the pin.
 */
static int
cow_in_place (const struct page_write *w, uint32_t s)
{
  struct cache *c = w->c;
  const struct cache_backend *be = w->be;
  const uint64_t page = w->page;
  int *err = w->err;
  if (clean_page_held (c, be, page, s, err) == -1) {
    cache_unpin (c, s);
    return -1;
  }
  /* Clean now; but an older version still on disk must go before it
   * may change in place (cache_must_cow).
   */
  if (!cache_settle (c, s)) {
    log_error ("cache file %s: page %llu: its older version could not "
               "be freed; the write fails", c->path,
               (unsigned long long) page);
    cache_unpin (c, s);
    *err = EIO;
    return -1;
  }
  return cache_patch_in_place (w, s);
}

/* Store the new version of the page (buf, whole, with the maps of upd)
 * in fresh slot ns, which then replaces pinned slot s (consumed).
 * snap: s's record.
 */
static int
cow_store (const struct page_write *w, uint32_t s, uint32_t ns,
           const uint8_t *buf, const struct pt_slot *snap)
{
  struct cache *c = w->c;
  const uint64_t page = w->page;
  const enum wkind kind = w->kind;
  int *err = w->err;
  struct pt_slot upd = *snap;

  upd.state = layout_map_empty (upd.dirty) ? LAYOUT_CLEAN : LAYOUT_DIRTY;
  pt_slot_set_crc (&upd, cache_page_crc (c, buf, upd.valid));
  upd.flags &= ~PT_UNSEALED;    /* a fresh checksum */
  pthread_mutex_lock (&c->lock);
  if (!pt_maps_reserve_for (&c->pt, ns, upd.valid, upd.dirty) &&
      !(kind == W_CLEAN && snap->state == LAYOUT_DIRTY &&
        pt_maps_reserve_force (&c->pt, ns))) {
    /* (W_CLEAN on a dirty page, not reached either: see
     * cache_patch_slot.)
     */
    pagetable_put_free (&c->pt, ns);
    pthread_mutex_unlock (&c->lock);
    STATS_ADD (&c->stats, partial_maps_full, 1);
    cache_unpin (c, s);
    return PATCH_NO_MAPS;
  }
  pthread_mutex_unlock (&c->lock);
  if (defer_write_data (&c->defer, &c->pool, ns, buf, c->page_size,
                        0) == -1 ||
      cache_commit_entry (c, ns, &upd) == -1) {
    cache_io_error (c, "writing", ns);
    pthread_mutex_lock (&c->lock);
    pagetable_put_free (&c->pt, ns);
    pthread_mutex_unlock (&c->lock);
    cache_unpin (c, s);
    *err = EIO;
    return PATCH_ERROR;
  }
  pthread_mutex_lock (&c->lock);
  pt_flags_on (&c->pt, ns, PT_VERIFIED);
  pthread_mutex_unlock (&c->lock);
  cache_supersede (c, s, ns, page);
  return PATCH_OK;
}

/* The copy: pinned slot s's data read into buf (invalid sectors as
 * zeroes), its record into snap.  Returns 0, or -1 with the pin
 * consumed (the data failed its check).
 */
static int
cow_read (struct cache *c, const struct cache_backend *be, uint32_t s,
          uint8_t *buf, struct pt_slot *snap)
{
  if (cache_read_verified (c, be, s, buf) == -1)
    return -1;
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, snap);
  pthread_mutex_unlock (&c->lock);
  for (unsigned i = 0; i < c->nsectors; i++)
    if (!layout_bit_test (snap->valid, i))
      memset (buf + (size_t) i * c->sector_size, 0, c->sector_size);
  return 0;
}

/* Apply a write to a copy of pinned slot s in a new slot, which then
 * replaces it (if no slot can be had, the page is written back first
 * and changed in place).  Returns PATCH_OK, PATCH_ERROR (*err) or
 * PATCH_NO_MAPS (see cache_patch_slot).  Consumes the pin.
 */
static int
cow_slot (const struct page_write *w, uint32_t s)
{
  struct cache *c = w->c;
  const struct cache_backend *be = w->be;
  const uint64_t page = w->page;
  const uint32_t off = w->off, n = w->n;
  int *err = w->err;
  uint8_t *buf = malloc (c->page_size);
  struct pt_slot snap;
  unsigned sf, sl;
  uint32_t ns;
  int r;

  if (buf == NULL) {
    cache_unpin (c, s);
    *err = ENOMEM;
    return -1;
  }
  if (cow_read (c, be, s, buf, &snap) == -1) {
    /* Pin consumed.  A clean copy that failed its check was dropped,
     * and so was dirty data torn by a crash: the backend has the page,
     * so the write goes on as for a page not cached.  Bad dirty data
     * fails the write.
     */
    free (buf);
    {
      uint32_t again = cache_lookup_pin (c, page);
      if (again == PT_NONE)
        return write_fresh (w);
      cache_unpin (c, again);
    }
    *err = EIO;
    return -1;
  }
  cache_sector_span (c, off, n, &sf, &sl);
  if (patch_merge_span (w, buf + sf * c->sector_size, sf, sl, snap.valid,
                        snap.dirty) == -1) {
    cache_unpin (c, s);
    free (buf);
    return -1;
  }
  ns = cache_alloc_slot (c, ALLOC_DIRTY);
  if (ns == PT_NONE) {
    free (buf);
    return cow_in_place (w, s);
  }
  r = cow_store (w, s, ns, buf, &snap);
  free (buf);
  return r;
}

/* Write straight to the backend because the cache has no room. */
static int
write_around (struct cache *c, const struct cache_backend *be,
              const uint8_t *src, uint32_t n, uint64_t offset, int *err)
{
  int ordered = clean_order_enter (c, be, ORDER_OPEN, err), r;

  if (ordered == -1)
    return -1;
  STATS_ADD (&c->stats, write_through_full, 1);
  atomic_store (&c->last_around_ms, cache_now_ms ());
  atomic_store (&c->backend_unflushed, true);
  r = be->pwrite (be->h, src, n, offset, false, err);
  if (ordered)
    order_leave (c);
  return r;
}

/* Put the write [off, off+n) of a page with no cached copy into a new
 * slot, or, when no slot can be had, send it to the backend.  A write
 * of part of the page does not evict a clean page while writeback is
 * behind (dirty pages above the high watermark): it would add a page to
 * write back for a few sectors, and such writes then go to the backend
 * at the client's own parallelism instead.
 */
static int
write_fresh (const struct page_write *w)
{
  struct cache *c = w->c;
  const struct cache_backend *be = w->be;
  const uint64_t page = w->page;
  const uint8_t *src = w->src;
  const uint32_t off = w->off, n = w->n;
  int *err = w->err;
  const bool part = off > 0 || n < cache_page_bytes (c, page);
  uint32_t s = cache_alloc_slot (c, part ? ALLOC_DIRTY_PART : ALLOC_DIRTY);
  int r;

  if (s == PT_NONE && part) {
    /* Admission under pressure prefers the backend; but a write the
     * backend fails goes to the cache after all, if a clean page can
     * be evicted for it (the backend may hold part of it now: the
     * dirty copy covers it).
     */
    r = write_around (c, be, src, n, page * c->page_size + off, err);
    if (r == 0 || (s = cache_alloc_slot (c, ALLOC_DIRTY)) == PT_NONE)
      return r;
  }
  else if (s == PT_NONE)
    return write_around (c, be, src, n, page * c->page_size + off, err);
  r = cache_patch_slot (w, s, true);
  if (r == PATCH_NO_MAPS)                 /* one run: not reached */
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
write_page_simple (const struct page_write *w)
{
  struct cache *c = w->c;
  const struct cache_backend *be = w->be;
  const uint64_t page = w->page;
  const enum wkind kind = w->kind;
  int *err = w->err;
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
    if (dirty && clean_page_held (c, be, page, s, err) == -1) {
      cache_unpin (c, s);
      return -1;
    }
    cache_drop_slot (c, s);
  }
  if (kind != W_DIRTY)
    return 0;
  return write_fresh (w);
}

/* cache_write_page of a whole page (pinned slot s or PT_NONE): a new version
 * of the page replaces the cached one (cache_fill_slot).
 */
static int
write_page_whole (const struct page_write *w, uint32_t s)
{
  struct cache *c = w->c;
  const uint64_t page = w->page;
  const uint32_t n = w->n;
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
  const uint8_t *data = w->src;
  uint8_t *tmp = NULL;
  int r;

  if (n < c->page_size) {
    /* The short last page of the backend, padded with zeroes. */
    tmp = malloc (c->page_size);
    if (tmp == NULL) {
      /* The backend has the new data already (W_CLEAN): the cached
       * copy must go.
       */
      if (s != PT_NONE && w->kind == W_CLEAN)
        cache_drop_slot (c, s);
      else if (s != PT_NONE)
        cache_unpin (c, s);
      *w->err = ENOMEM;
      return -1;
    }
    memcpy (tmp, w->src, n);
    memset (tmp + n, 0, c->page_size - n);
    data = tmp;
  }
  cache_map_fill (c, dirty);
  r = cache_fill_slot (c, page, s, data, w->kind == W_DIRTY ? dirty : NULL,
                       FILL_CLIENT);
  free (tmp);
  if (r == 1) {
    /* No slot for the new version: it goes to the backend, and the
     * cached version, older then, must go: a clean one before the
     * backend gets the write (if the process died in between, it would
     * come back older than the backend), a dirty one after (it may hold
     * flushed data the backend lacks until then).
     */
    uint32_t old;
    cache_invalidate_clean_pages (c, page, page);
    if (w->kind == W_DIRTY &&
        write_around (c, w->be, w->src, n, page * c->page_size,
                      w->err) == -1)
      return -1;
    old = cache_lookup_pin (c, page);
    if (old != PT_NONE)
      cache_drop_slot (c, old);
    return 0;
  }
  if (r == -1 && w->kind == W_DIRTY) {
    *w->err = EIO;
    return -1;
  }
  return 0;
}

/* Put the write w into the cache (W_CLEAN: the backend already has
 * the bytes; a page not cached is only added when written whole).  The
 * page is range locked by the caller.
 */
int
cache_write_page (const struct page_write *w)
{
  struct cache *c = w->c;
  const uint32_t pbytes = cache_page_bytes (c, w->page);
  uint32_t s = cache_lookup_pin (c, w->page);
  bool cow = false, bad = false;
  int r;

  if (w->off == 0 && w->n >= pbytes)
    return write_page_whole (w, s);
  if (s != PT_NONE) {
    pthread_mutex_lock (&c->lock);
    bad = pt_flags (&c->pt, s) & PT_BAD;
    pthread_mutex_unlock (&c->lock);
  }
  if (bad) {
    cache_unpin (c, s);
    *w->err = EIO;
    return -1;
  }
  if (s == PT_NONE) {
    if (w->kind == W_CLEAN)
      return 0;                 /* partial page not cached: leave it */
    return write_fresh (w);
  }
  /* Decide and rewrite in place under c->inplace (docs/design.md). */
  cache_inplace_enter (c);
  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (cow) {
    cache_inplace_leave (c);
    r = cow_slot (w, s);
  }
  else {
    r = cache_patch_slot (w, s, false);
    cache_inplace_leave (c);
    if (r == PATCH_TORN) {
      cache_drop_slot (c, s);
      r = PATCH_ERROR;
    }
  }
  if (r == PATCH_NO_MAPS)
    r = write_page_simple (w);
  return r;
}

