/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the write path.
 *
 * Owns cache_write in every mode.  Writethrough / writearound: the
 * cached copy is updated in place, unsealed (writethrough), or dropped
 * (writearound) first; then the backend is written (write_through_first).
 * Writeback: the data goes to the cache as dirty sectors, in place if
 * the slot holds nothing durable and dirty, otherwise into a new slot
 * (copy on write, cow_slot).  Every change holds the page's range lock
 * across its backend and cache I/O (lock table: cache-int.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "cache-int.h"
#include "log.h"

/* Apply a write to a copy of pinned slot s in a new slot, which then
 * replaces it (if no slot can be had, the page is written back first
 * and changed in place).  Returns PATCH_OK, PATCH_ERROR (*err) or
 * PATCH_NO_MAPS (see cache_patch_slot).  Consumes the pin.
 */
static int write_fresh (const struct page_write *w);

/* Rewrite pinned slot s in place (its page is range locked, and it
 * need not be copied: see cache_must_cow), holding c->inplace across
 * the writes.  A slot left torn is dropped once c->inplace is given
 * back (PATCH_TORN).  Returns as cache_patch_slot; consumes the pin.
 */
static int
patch_in_place (const struct page_write *w, uint32_t s)
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
  return patch_in_place (w, s);
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
  upd.data_crc = cache_page_crc (c, buf, upd.valid);
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
  bool was_clean;

  if (buf == NULL) {
    cache_unpin (c, s);
    *err = ENOMEM;
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  was_clean = pt_state (&c->pt, s) == LAYOUT_CLEAN;
  pthread_mutex_unlock (&c->lock);
  if (cow_read (c, be, s, buf, &snap) == -1) {
    /* Pin consumed.  A clean copy that failed its check was dropped:
     * the backend has the page, so the write goes on as for a page not
     * cached.  Bad dirty data fails the write.
     */
    free (buf);
    if (was_clean) {
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

/* Drop page's cached copy if it is clean (the page is range locked). */
static void
write_drop_clean (struct cache *c, uint64_t page)
{
  uint32_t s = cache_lookup_pin (c, page);
  bool clean;

  if (s == PT_NONE)
    return;
  pthread_mutex_lock (&c->lock);
  clean = pt_state (&c->pt, s) == LAYOUT_CLEAN;
  pthread_mutex_unlock (&c->lock);
  if (clean)
    cache_drop_slot (c, s);
  else
    cache_unpin (c, s);
}

/* write_page of a whole page (pinned slot s or PT_NONE): a new version
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
    write_drop_clean (c, page);
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
static int
write_page (const struct page_write *w)
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
  /* Decide and rewrite in place under c->inplace (see cache-int.h). */
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

/* May pinned slot s (its page range locked) be rewritten in place
 * now?  If it must be copied only because an older version of its page
 * is still on disk, that version is freed first (cache_settle).  False:
 * it must not (the caller drops it).
 */
static bool
write_settled (struct cache *c, uint32_t s)
{
  bool cow;

  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (!cow)
    return true;
  if (!cache_settle (c, s))
    return false;
  pthread_mutex_lock (&c->lock);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  return !cow;
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
  /* A slot whose older version is still on disk is not rewritten in
   * place (cache_must_cow): were it dropped by a crash as unsealed,
   * recovery would serve that older version, and write its dirty data
   * back over the backend's newer data.  Its predecessor goes first.
   */
  if (!write_settled (c, s)) {
    cache_drop_slot (c, s);
    return;
  }
  r = patch_in_place (&(struct page_write) {
                        .c = c, .be = be, .page = page, .src = src,
                        .off = off, .n = n, .kind = W_CLEAN, .err = &err },
                      s);
  if (r != PATCH_OK) {
    /* Not unsealed (not verified since start, bad, or no memory), maps
     * that do not fit, or an error: the cached copy goes.
     */
    s = cache_lookup_pin (c, page);
    if (s != PT_NONE)
      cache_drop_slot (c, s);
  }
}

/* One client write, its pages [first, last] range locked: what
 * write_backend_first, write_backend_now and write_pages take.
 */
struct write_req {
  struct cache *c;
  const struct cache_backend *be;
  enum layout_mode mode;         /* this write's (see cache_write) */
  const uint8_t *buf;
  uint32_t count;
  uint64_t offset;
  bool fua;
  uint64_t first, last;
  int *err;
};

/* write_backend_first once the flush order allows it. */
static int
write_backend_now (const struct write_req *r)
{
  struct cache *c = r->c;
  const struct cache_backend *be = r->be;
  const uint8_t *buf = r->buf;
  const uint32_t count = r->count;
  const uint64_t offset = r->offset, first = r->first, last = r->last;
  int *err = r->err;
  /* The cached copies change (or go) before the backend gets the data,
   * never after: see write_through_first.
   */
  if (r->mode == LAYOUT_MODE_WRITEAROUND)
    cache_invalidate_pages (c, first, last);
  else
    for (uint64_t page = first; page <= last; page++) {
      uint32_t a, b;

      cache_page_part (c, page, offset, count, &a, &b);
      write_through_first (c, be, page,
                           buf + (page * c->page_size + a - offset),
                           a, b - a);
    }
  if (be->pwrite (be->h, buf, count, offset, r->fua, err) == -1) {
    /* The backend may hold some of the new data now, and the cache some
     * the backend never got: the cached copies go.
     */
    cache_invalidate_pages (c, first, last);
    return -1;
  }
  return 0;
}

/* Writethrough / writearound, with [first, last] range locked: the
 * cached copies change (or go) first, then the backend gets the write.
 * Pages still dirty from an earlier writeback run are written back
 * first: once the backend has the new data, writing back their older
 * dirty sectors (to make room for a copy, or to simplify their maps)
 * would bring the old data back, and dropping them (writearound) would
 * lose the rest of their dirty sectors.
 */
static int
write_backend_first (const struct write_req *req)
{
  struct cache *c = req->c;
  int ordered = clean_order_enter (c, req->be, ORDER_OPEN, req->err), r = 0;

  if (ordered == -1)
    return -1;
  /* (Again: writing older generations back may have flushed the
   * backend and cleared it.)
   */
  atomic_store (&c->backend_unflushed, true);
  if (cache_clean_pages (c, req->be, req->first, req->last, req->err) == -1)
    r = -1;
  else
    r = write_backend_now (req);
  if (ordered)
    order_leave (c);
  return r;
}

/* After write_backend_first (writethrough): whole pages not cached are
 * added now that the backend has them; the rest was done before.
 */
static bool
write_adds_page (struct cache *c, uint64_t page, uint32_t a, uint32_t b)
{
  uint32_t s;

  if (a != 0 || b - a < cache_page_bytes (c, page))
    return false;
  s = cache_lookup_pin (c, page);
  if (s != PT_NONE) {
    cache_unpin (c, s);
    return false;
  }
  return true;
}

/* The pages of the write into the cache: dirty (writeback), or whole
 * uncached pages the backend has now (writethrough).
 */
static int
write_pages (const struct write_req *req)
{
  struct cache *c = req->c;
  const bool through = req->mode != LAYOUT_MODE_WRITEBACK;

  for (uint64_t page = req->first; page <= req->last; page++) {
    uint32_t a, b;
    int r;

    cache_page_part (c, page, req->offset, req->count, &a, &b);
    if (through && !write_adds_page (c, page, a, b))
      continue;
    r = write_page (&(struct page_write) {
                      .c = c, .be = req->be, .page = page,
                      .src = req->buf + (page * c->page_size + a -
                                         req->offset),
                      .off = a, .n = b - a,
                      .kind = through ? W_CLEAN : W_DIRTY, .err = req->err });
    if (r == -1 && !through)
      return -1;
  }
  return 0;
}

/* Under c->lock: does a page of [first, first + n) hold dirty data? */
static bool
write_any_dirty_locked (struct cache *c, uint64_t first, uint64_t n)
{
  for (uint64_t p = first; p < first + n; p++)
    if (cache_page_dirty_locked (c, p))
      return true;
  return false;
}

/* Under c->lock: does this write of a sequential stream go around the
 * cache?  Past the cutoff, while writeback is behind: caching it would
 * only write it twice more (cache, then backend).  Once one did, the
 * streams past their cutoff keep going around until none has come for
 * CACHE_SEQ_HOLD_MS, even if writeback catches up meanwhile: otherwise
 * a stream longer than the cache is cached again at every drain and
 * costs three copies instead of one.  A burst that ends is absorbed
 * again by the next one (as long as there is room).  A write over
 * dirty pages stays in the cache all the same: around it, their dirty
 * data would have to be written back (and the backend flushed) first,
 * page by page, while in the cache it is simply rewritten.
 */
static bool
write_seq_around_locked (struct cache *c, uint64_t first, uint64_t n)
{
  uint64_t now;

  if (c->wseq == NULL ||
      admit_seq_access (c->wseq, first * c->page_size,
                        n * c->page_size) == n * c->page_size)
    return false;
  now = cache_now_ms ();
  if (!cache_dirty_pressure_locked (c) &&
      (c->seq_around_ms == 0 || now - c->seq_around_ms > CACHE_SEQ_HOLD_MS))
    return false;
  c->seq_around_ms = now;
  return !write_any_dirty_locked (c, first, n);
}

/* Under c->lock: how many dirty pages may the write of n pages from
 * first add?  In offset order a page already dirty adds none (changed
 * in its slot, or copied and the old slot freed), so that rewriting
 * dirty data at ssdcache-writeback-max-dirty stays in the cache; in the
 * flush order a rewrite may keep the older version too: every page.
 */
static uint64_t
write_dirty_adds_locked (struct cache *c, uint64_t first, uint64_t n)
{
  uint64_t adds = 0;

  if (c->max_dirty == 0 || c->wbcfg.order == CACHE_ORDER_FLUSH)
    return n;
  for (uint64_t p = first; p < first + n; p++)
    adds += !cache_page_dirty_locked (c, p);
  return adds;
}

/* Writeback, but the cache cannot take this write: with
 * ssdcache-writeback-max-dirty reached, or fewer slots not dirty than
 * the write has pages not cached (a cache full of dirty data; cached
 * pages change in their slots or are copied, page by page), or part of
 * a sequential stream that goes around (write_seq_around_locked).  The write
 * then goes around the cache as in writearound, in one backend request
 * at the client's own parallelism, instead of page by page: the dirty
 * pages it touches are written back first and every cached copy of its
 * pages is dropped (write_backend_first), so nothing older can come
 * back over it, not even after a crash (a copy updated in place, as
 * writethrough does, could: its older flushed dirty version may still
 * be on disk).  Writeback is woken.  *promised: the pages the write
 * may dirty, added to c->dirty_promised (the caller takes them off).
 */
static bool
write_goes_around (struct cache *c, uint64_t first, uint64_t last,
                    uint64_t *promised)
{
  const uint64_t n = last - first + 1;
  uint64_t uncached = 0, adds, busy;
  bool cap, full, seq, pressure;

  /* Writes in flight have promised to dirty at most c->dirty_promised
   * more pages: counting them keeps the cap exact.
   */
  pthread_mutex_lock (&c->lock);
  seq = write_seq_around_locked (c, first, n);
  adds = write_dirty_adds_locked (c, first, n);
  /* (Older versions kept for the flush order are dirty data the
   * backend lacks too: the cap bounds them with the rest.)
   */
  cap = c->max_dirty > 0 &&
    c->ndirty + c->nretained + c->dirty_promised + adds > c->max_dirty;
  /* (Slots that hold dirty data or older versions kept for the flush
   * order cannot be evicted: were they not counted, each page of the
   * write would find no slot and go around by itself, waiting for the
   * flush order page after page.)
   */
  busy = c->ndirty + c->nretained;
  if (c->nslots - busy < n)
    for (uint64_t p = first; p <= last; p++)
      uncached += pagetable_lookup (&c->pt, p) == PT_NONE;
  full = c->nslots - busy < uncached;
  pressure = cache_dirty_pressure_locked (c);
  *promised = !cap && !full && !seq ? adds : 0;
  c->dirty_promised += *promised;
  pthread_mutex_unlock (&c->lock);
  if (!cap && !full && !seq)
    return false;
  if (cap)
    STATS_ADD (&c->stats, dirty_cap_writes, 1);
  else if (full)
    STATS_ADD (&c->stats, write_through_full, 1);
  else
    STATS_ADD (&c->stats, seq_write_bypassed, 1);
  atomic_store (&c->backend_unflushed, true);
  atomic_store (&c->last_around_ms, cache_now_ms ());
  if (c->hooks.wb_kick && (cap || full || pressure))
    c->hooks.wb_kick (c);
  return true;
}

/* A client's write as a cache_backend_op (write_degraded). */
struct write_op {
  const struct cache_backend *be;
  const void *buf;
  bool fua;
};

static int
write_op_do (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  const struct write_op *w = opaque;

  return w->be->pwrite (w->be->h, w->buf, count, offset, w->fua, err);
}

/* The cache device failed: the write goes around the cache. */
static int
write_degraded (struct cache *c, const struct cache_backend *be,
                const void *buf, uint32_t count, uint64_t offset, bool fua,
                int *err)
{
  struct write_op w = { .be = be, .buf = buf, .fua = fua };

  return cache_around (c, be, write_op_do, &w, count, offset, err);
}

int
cache_write (struct cache *c, const struct cache_backend *be,
             const void *buf, uint32_t count, uint64_t offset, bool fua,
             int *err)
{
  const uint32_t ps = c->page_size;
  enum layout_mode mode;
  bool writeback;
  uint64_t first, last, promised;
  struct write_req req;
  int ret = -1;

  STATS_ADD (&c->stats, write_ops, 1);
  STATS_ADD (&c->stats, bytes_written, count);
  cache_touch_io (c);
  if (count == 0)
    return 0;
  if (cache_degraded (c))
    return write_degraded (c, be, buf, count, offset, fua, err);

  first = offset / ps;
  last = (offset + count - 1) / ps;
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    return -1;
  }
  order_owned (c, first, last);
  /* The mode, read under the range lock: cache_set_mode waits for the
   * writes that saw the old one.
   */
  mode = c->mode;
  promised = 0;
  if (mode == LAYOUT_MODE_WRITEBACK &&
      write_goes_around (c, first, last, &promised))
    mode = LAYOUT_MODE_WRITEAROUND;       /* this write only */
  writeback = mode == LAYOUT_MODE_WRITEBACK;
  req = (struct write_req) { .c = c, .be = be, .mode = mode, .buf = buf,
                             .count = count, .offset = offset, .fua = fua,
                             .first = first, .last = last, .err = err };
  if (!writeback && write_backend_first (&req) == -1)
    goto out;
  if (mode != LAYOUT_MODE_WRITEAROUND && write_pages (&req) == -1)
    goto out;
  ret = 0;

 out:
  if (promised) {
    pthread_mutex_lock (&c->lock);
    c->dirty_promised -= promised;
    pthread_mutex_unlock (&c->lock);
  }
  order_owned (NULL, 0, 0);
  rangelock_release (&c->ranges, first, last);
  if (ret == -1 && writeback && cache_degraded (c)) {
    /* The cache device failed under this very write: do it again
     * around the cache (pages it already dirtied are written back
     * first).
     */
    return write_degraded (c, be, buf, count, offset, fua, err);
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
