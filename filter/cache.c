/* nbdkit-ssdcache-filter: the cache engine.
 *
 * Owns the running cache (pool, page table, policy, range locks,
 * counters) and the read/write/invalidate/prefetch paths.  See cache.h
 * for the locking rules; in short:
 *
 *   c->lock      page table + policy + pins + c->seq; never held over I/O
 *   c->ranges    one request at a time changes a given page's contents
 *   pins         a slot being read or written is never reused
 *
 * Ordering rules that keep the cache file consistent across crashes:
 *  - slot data is written before the entry that describes it, so a torn
 *    update shows up as a data CRC mismatch and the slot is dropped;
 *  - in writethrough mode the backend is written before the cache, so
 *    the cache never holds clean data the backend does not have;
 *  - the data CRC of each slot is checked on its first use after the
 *    cache is opened; a slot that fails is dropped, never served.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cache.h"
#include "evict.h"
#include "log.h"
#include "pagetable.h"
#include "pool.h"
#include "rangelock.h"

#define LOAD_CHUNK 4096          /* entries read at a time at start-up */

struct cache {
  pthread_mutex_t lock;
  struct pool pool;
  struct pagetable pt;
  struct evict *ev;
  struct rangelock ranges;
  struct stats stats;

  char *path;
  char *id_text;
  uint64_t cfg_size;
  uint32_t cfg_page_size;
  uint64_t id_digest[2];
  enum layout_mode mode;
  bool reset;

  uint32_t page_size, sector_size, nsectors;
  uint32_t nslots;
  uint64_t backend_size;
  uint64_t seq;                  /* last sequence number used */
  bool have_sb;                  /* an accepted superblock was read */
};

/* Zeroes standing in for invalid sectors in data CRCs. */
static const uint8_t zero_sector[LAYOUT_MAX_PAGE / LAYOUT_MAX_SECTORS];

/*----------------------------------------------------------------------
 * Small helpers.
 */

/* Bytes of backend page that exist (the last page may be short). */
static uint32_t
page_bytes (const struct cache *c, uint64_t page)
{
  uint64_t start = page * c->page_size;

  if (start >= c->backend_size)
    return 0;
  if (c->backend_size - start < c->page_size)
    return c->backend_size - start;
  return c->page_size;
}

static void
map_fill (const struct cache *c, uint8_t *map)
{
  memset (map, 0, LAYOUT_MAX_SECTORS / 8);
  for (unsigned i = 0; i < c->nsectors; i++)
    layout_bit_set (map, i);
}

/* CRC32C of a page as stored: invalid sectors count as zeroes. */
static uint32_t
page_crc (const struct cache *c, const uint8_t *buf, const uint8_t *valid)
{
  uint32_t crc = 0;

  for (unsigned i = 0; i < c->nsectors; i++) {
    const uint8_t *p = layout_bit_test (valid, i)
      ? buf + (size_t) i * c->sector_size : zero_sector;
    crc = layout_crc32c_update (crc, p, c->sector_size);
  }
  return crc;
}

static void
unpin (struct cache *c, uint32_t s)
{
  struct pt_slot *slot;

  pthread_mutex_lock (&c->lock);
  slot = &c->pt.slots[s];
  slot->pins--;
  if (slot->pins == 0 && (slot->flags & PT_ORPHAN))
    pagetable_put_free (&c->pt, s);
  pthread_mutex_unlock (&c->lock);
}

/* Look page up and pin its slot.  PT_NONE if not cached. */
static uint32_t
lookup_pin (struct cache *c, uint64_t page)
{
  uint32_t s;

  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s != PT_NONE)
    c->pt.slots[s].pins++;
  pthread_mutex_unlock (&c->lock);
  return s;
}

static void
cache_error (struct cache *c, const char *what, uint32_t s)
{
  STATS_ADD (&c->stats, cache_errors, 1);
  log_error ("cache file %s: %s (slot %u): %m; serving from the backend",
             c->path, what, s);
}

/* Write the entry of pinned or privately owned slot s, with a new
 * sequence number, after updating its metadata with upd (under lock).
 */
static int
commit_entry (struct cache *c, uint32_t s, const struct pt_slot *upd)
{
  struct layout_entry e;
  struct pt_slot *slot;

  pthread_mutex_lock (&c->lock);
  slot = &c->pt.slots[s];
  slot->page = upd->page;
  slot->state = upd->state;
  slot->data_crc = upd->data_crc;
  memcpy (slot->valid, upd->valid, sizeof slot->valid);
  memcpy (slot->dirty, upd->dirty, sizeof slot->dirty);
  slot->seq = ++c->seq;
  pagetable_to_entry (slot, &e);
  pthread_mutex_unlock (&c->lock);

  return pool_write_entry (&c->pool, s, &e);
}

/* Drop pinned slot s (its page is range locked by the caller): it
 * leaves the index at once and is freed when its last pin goes.
 * Consumes the caller's pin.
 */
static void
drop_slot (struct cache *c, uint32_t s)
{
  struct layout_entry e;
  struct pt_slot *slot;

  pthread_mutex_lock (&c->lock);
  slot = &c->pt.slots[s];
  if (slot->flags & PT_INDEXED) {
    pagetable_remove (&c->pt, s);
    evict_remove (c->ev, s);
  }
  slot->flags |= PT_ORPHAN;
  slot->flags &= ~PT_VERIFIED;
  slot->state = LAYOUT_FREE;
  memset (slot->valid, 0, sizeof slot->valid);
  memset (slot->dirty, 0, sizeof slot->dirty);
  slot->seq = ++c->seq;
  pagetable_to_entry (slot, &e);
  pthread_mutex_unlock (&c->lock);

  if (pool_write_entry (&c->pool, s, &e) == -1)
    cache_error (c, "writing free entry", s);
  STATS_ADD (&c->stats, pages_invalidated, 1);
  unpin (c, s);
}

static bool
can_take (void *opaque, uint32_t s)
{
  const struct cache *c = opaque;
  const struct pt_slot *slot = &c->pt.slots[s];

  return slot->pins == 0 && slot->state == LAYOUT_CLEAN &&
    (slot->flags & PT_INDEXED);
}

/* A slot nobody else can reach, or PT_NONE when every slot is busy
 * or dirty.  Only clean slots are ever evicted.
 */
static uint32_t
alloc_slot (struct cache *c)
{
  uint32_t s;

  pthread_mutex_lock (&c->lock);
  s = pagetable_take_free (&c->pt);
  if (s == PT_NONE) {
    s = evict_victim (c->ev, can_take, c);
    if (s != EVICT_NONE) {
      pagetable_remove (&c->pt, s);
      c->pt.slots[s].flags = 0;
      STATS_ADD (&c->stats, evictions, 1);
      if (ssdcache_debug_verbose)
        log_debug ("evict slot %u (page %llu)", s,
                   (unsigned long long) c->pt.slots[s].page);
    }
    else
      s = PT_NONE;
  }
  pthread_mutex_unlock (&c->lock);
  return s;
}

/* Store a whole page (buf holds page_size bytes, zeroes past the end of
 * the backend) in slot s (pinned by the caller, consumed), or in a new
 * slot if s is PT_NONE.  The page is range locked by the caller.
 */
static void
store_page (struct cache *c, uint64_t page, uint32_t s, const void *buf)
{
  struct pt_slot upd = { .page = page, .state = LAYOUT_CLEAN };
  bool fresh = s == PT_NONE;

  if (fresh) {
    s = alloc_slot (c);
    if (s == PT_NONE) {
      STATS_ADD (&c->stats, bypassed, 1);
      return;
    }
  }
  map_fill (c, upd.valid);
  upd.data_crc = page_crc (c, buf, upd.valid);

  if (pool_write_data (&c->pool, s, buf, c->page_size, 0) == -1) {
    cache_error (c, "writing data", s);
    goto fail;
  }
  if (commit_entry (c, s, &upd) == -1) {
    cache_error (c, "writing entry", s);
    goto fail;
  }
  pthread_mutex_lock (&c->lock);
  c->pt.slots[s].flags |= PT_VERIFIED;
  if (fresh) {
    pagetable_insert (&c->pt, s, page);
    evict_insert (c->ev, s);
  }
  pthread_mutex_unlock (&c->lock);
  if (fresh)
    STATS_ADD (&c->stats, fills, 1);
  else
    unpin (c, s);
  return;

 fail:
  if (fresh) {
    pthread_mutex_lock (&c->lock);
    pagetable_put_free (&c->pt, s);
    pthread_mutex_unlock (&c->lock);
  }
  else
    drop_slot (c, s);
}

/* Read the whole of pinned slot s into buf and check its data CRC if
 * this has not been done since start-up.  Returns 0, or -1 after
 * dropping the slot (consumes the pin) on mismatch or I/O error.
 * The page must be range locked by the caller.
 */
static int
read_verified (struct cache *c, uint32_t s, uint8_t *buf)
{
  struct pt_slot snap;

  if (pool_read_data (&c->pool, s, buf, c->page_size, 0) == -1) {
    cache_error (c, "reading data", s);
    drop_slot (c, s);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  snap = c->pt.slots[s];
  pthread_mutex_unlock (&c->lock);
  if (snap.flags & PT_VERIFIED)
    return 0;

  if (page_crc (c, buf, snap.valid) != snap.data_crc) {
    STATS_ADD (&c->stats, verify_failures, 1);
    log_debug ("cache file %s: slot %u (page %llu) fails its data "
               "checksum: dropped", c->path, s,
               (unsigned long long) snap.page);
    drop_slot (c, s);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  c->pt.slots[s].flags |= PT_VERIFIED;
  pthread_mutex_unlock (&c->lock);
  return 0;
}

/* Sectors [*first, *last] of a page touched by bytes [off, off+n). */
static void
sector_span (const struct cache *c, uint32_t off, uint32_t n,
             unsigned *first, unsigned *last)
{
  *first = off / c->sector_size;
  *last = (off + n - 1) / c->sector_size;
}

/*----------------------------------------------------------------------
 * Reads.
 */

/* Serve [off, off+n) of page from the cache without any range lock if
 * the page is cached, verified and has all those sectors.  Returns
 * true if served.
 */
static bool
try_hit (struct cache *c, uint64_t page, uint8_t *dst, uint32_t off,
         uint32_t n)
{
  unsigned first, last;
  uint32_t s;
  struct pt_slot *slot;
  int r;

  sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s == PT_NONE) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  slot = &c->pt.slots[s];
  if (!(slot->flags & PT_VERIFIED) ||
      !pagetable_range_valid (slot, first, last)) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  slot->pins++;
  evict_touch (c->ev, s);
  pthread_mutex_unlock (&c->lock);

  r = pool_read_data (&c->pool, s, dst, n, off);
  unpin (c, s);
  if (r == -1) {
    cache_error (c, "reading data", s);
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

  sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s != PT_NONE)
    r = (c->pt.slots[s].flags & PT_VERIFIED) &&
      pagetable_range_valid (&c->pt.slots[s], first, last);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Read [pos, pos+len) (dst may be NULL: prefetch only) with the pages
 * range locked: serve what is cached, read the rest from the backend in
 * as few requests as possible and store it.
 */
static int
read_slow (struct cache *c, const struct cache_backend *be, uint8_t *dst,
           uint64_t pos, uint32_t len, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t first = pos / ps, last = (pos + len - 1) / ps;
  const uint64_t np = last - first + 1;
  uint32_t *slots = malloc (np * sizeof *slots);
  bool *need = calloc (np, sizeof *need);
  uint8_t *page_buf = malloc (ps);
  int ret = -1;

  if (slots == NULL || need == NULL || page_buf == NULL) {
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
    uint32_t s = lookup_pin (c, page);

    slots[i] = PT_NONE;
    need[i] = true;
    if (s == PT_NONE) {
      STATS_ADD (&c->stats, read_misses, 1);
      continue;
    }
    if (read_verified (c, s, page_buf) == -1) {
      STATS_ADD (&c->stats, read_misses, 1);
      continue;                 /* dropped */
    }
    sector_span (c, a, b - a, &sf, &sl);
    pthread_mutex_lock (&c->lock);
    bool ok = pagetable_range_valid (&c->pt.slots[s], sf, sl);
    if (ok)
      evict_touch (c->ev, s);
    pthread_mutex_unlock (&c->lock);
    if (ok) {
      if (dst)
        memcpy (dst + (pstart + a - pos), page_buf + a, b - a);
      STATS_ADD (&c->stats, read_hits, 1);
      STATS_ADD (&c->stats, bytes_from_cache, b - a);
      need[i] = false;
      unpin (c, s);
    }
    else {
      STATS_ADD (&c->stats, read_partial, 1);
      slots[i] = s;             /* keep the pin: refilled below */
    }
  }

  /* Pass 2: runs of needed pages, one backend read per run. */
  for (uint64_t i = 0; i < np;) {
    uint64_t j, run_start, run_bytes;
    uint8_t *bounce;

    if (!need[i]) {
      i++;
      continue;
    }
    for (j = i; j + 1 < np && need[j + 1]; j++)
      ;
    run_start = (first + i) * ps;
    run_bytes = (first + j + 1) * ps;
    if (run_bytes > c->backend_size)
      run_bytes = c->backend_size;
    run_bytes -= run_start;

    bounce = calloc (j - i + 1, ps);
    if (bounce == NULL) {
      *err = ENOMEM;
      goto out_unpin;
    }
    if (be->pread (be->h, bounce, run_bytes, run_start, err) == -1) {
      free (bounce);
      goto out_unpin;
    }
    STATS_ADD (&c->stats, bytes_from_backend, run_bytes);

    for (uint64_t k = i; k <= j; k++) {
      uint64_t pstart = (first + k) * ps;
      uint32_t a = pos > pstart ? pos - pstart : 0;
      uint32_t b = pos + len < pstart + ps ? pos + len - pstart : ps;
      const uint8_t *data = bounce + (k - i) * ps;

      if (dst)
        memcpy (dst + (pstart + a - pos), data + a, b - a);
      store_page (c, first + k, slots[k], data);
      slots[k] = PT_NONE;
      need[k] = false;
    }
    free (bounce);
    i = j + 1;
  }
  ret = 0;

 out_unpin:
  for (uint64_t i = 0; i < np; i++)
    if (slots[i] != PT_NONE)
      unpin (c, slots[i]);
  rangelock_release (&c->ranges, first, last);
 out_free:
  free (slots);
  free (need);
  free (page_buf);
  return ret;
}

int
cache_read (struct cache *c, const struct cache_backend *be,
            void *buf, uint32_t count, uint64_t offset, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t end = offset + count;
  uint8_t *dst = buf;
  uint64_t pos = offset;

  STATS_ADD (&c->stats, read_ops, 1);
  while (pos < end) {
    uint64_t page = pos / ps, run_end;
    uint32_t off = pos % ps;
    uint32_t n = end - pos < ps - off ? end - pos : ps - off;

    if (try_hit (c, page, dst + (pos - offset), off, n)) {
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
                   err) == -1)
      return -1;
    pos = run_end;
  }
  return 0;
}

int
cache_prefetch (struct cache *c, const struct cache_backend *be,
                uint32_t count, uint64_t offset, int *err)
{
  if (count == 0)
    return 0;
  return read_slow (c, be, NULL, offset, count, err);
}

/*----------------------------------------------------------------------
 * Writes and invalidation.
 */

static void
invalidate_pages (struct cache *c, uint64_t first, uint64_t last)
{
  for (uint64_t page = first; page <= last; page++) {
    uint32_t s = lookup_pin (c, page);
    if (s != PT_NONE) {
      if (ssdcache_debug_verbose)
        log_debug ("invalidate page %llu (slot %u)",
                   (unsigned long long) page, s);
      drop_slot (c, s);
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
    /* Cannot lock: the only safe answer is to empty the cache. */
    log_error ("cache file %s: cannot lock range for invalidation", c->path);
    return;
  }
  invalidate_pages (c, first, last);
  rangelock_release (&c->ranges, first, last);
}

/* After the backend took bytes [off, off+n) of page from src, bring the
 * cached copy (if any) up to date.  Whole pages not cached are added.
 * The page is range locked by the caller.
 */
static void
update_page (struct cache *c, uint64_t page, const uint8_t *src,
             uint32_t off, uint32_t n, uint8_t *tmp)
{
  const uint32_t pbytes = page_bytes (c, page);
  const bool whole = off == 0 && n >= pbytes;
  struct pt_slot upd;
  unsigned sf, sl;
  uint32_t s = lookup_pin (c, page);

  if (whole) {
    /* No need for the old contents: store the page as a whole. */
    const uint8_t *data = src;
    if (n < c->page_size) {
      memcpy (tmp, src, n);
      memset (tmp + n, 0, c->page_size - n);
      data = tmp;
    }
    store_page (c, page, s, data);
    if (s != PT_NONE)
      STATS_ADD (&c->stats, pages_updated, 1);
    return;
  }
  if (s == PT_NONE)
    return;                     /* partial page not cached: leave it */

  if (read_verified (c, s, tmp) == -1)
    return;                     /* dropped */
  memcpy (tmp + off, src, n);

  pthread_mutex_lock (&c->lock);
  upd = c->pt.slots[s];
  pthread_mutex_unlock (&c->lock);

  /* Sectors the write covers completely become valid; a partly
   * covered sector keeps its old validity (merged data if valid).
   */
  sector_span (c, off, n, &sf, &sl);
  for (unsigned i = sf; i <= sl; i++) {
    uint32_t ss = i * c->sector_size;
    uint32_t se = ss + c->sector_size;
    if (se > pbytes)
      se = pbytes;
    if (ss >= se)
      continue;
    if (off <= ss && off + n >= se)
      layout_bit_set (upd.valid, i);
  }
  upd.data_crc = page_crc (c, tmp, upd.valid);

  if (pool_write_data (&c->pool, s, tmp + sf * c->sector_size,
                       (sl - sf + 1) * c->sector_size,
                       sf * c->sector_size) == -1) {
    cache_error (c, "writing data", s);
    drop_slot (c, s);
    return;
  }
  if (commit_entry (c, s, &upd) == -1) {
    cache_error (c, "writing entry", s);
    drop_slot (c, s);
    return;
  }
  STATS_ADD (&c->stats, pages_updated, 1);
  unpin (c, s);
}

int
cache_write (struct cache *c, const struct cache_backend *be,
             const void *buf, uint32_t count, uint64_t offset, bool fua,
             int *err)
{
  const uint32_t ps = c->page_size;
  uint64_t first, last;
  uint8_t *tmp = NULL;
  int ret = -1;

  STATS_ADD (&c->stats, write_ops, 1);
  STATS_ADD (&c->stats, bytes_written, count);
  if (count == 0)
    return be->pwrite (be->h, buf, count, offset, fua, err);

  first = offset / ps;
  last = (offset + count - 1) / ps;
  tmp = malloc (ps);
  if (tmp == NULL) {
    *err = ENOMEM;
    return -1;
  }
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    free (tmp);
    return -1;
  }

  if (be->pwrite (be->h, buf, count, offset, fua, err) == -1) {
    /* The backend may hold some of the new data now: forget ours. */
    invalidate_pages (c, first, last);
    goto out;
  }

  if (c->mode == LAYOUT_MODE_WRITEAROUND)
    invalidate_pages (c, first, last);
  else {
    for (uint64_t page = first; page <= last; page++) {
      uint64_t pstart = page * ps;
      uint32_t a = offset > pstart ? offset - pstart : 0;
      uint32_t b = offset + count < pstart + ps ? offset + count - pstart : ps;
      update_page (c, page, (const uint8_t *) buf + (pstart + a - offset),
                   a, b - a, tmp);
    }
  }
  /* A FUA write is durable on the backend; make the cache agree even
   * across power loss, or an older cached copy could come back.
   */
  if (fua && pool_sync (&c->pool) == -1)
    cache_error (c, "fdatasync", 0);
  ret = 0;

 out:
  rangelock_release (&c->ranges, first, last);
  free (tmp);
  return ret;
}

int
cache_sync (struct cache *c, int *err)
{
  if (pool_sync (&c->pool) == -1) {
    /* The cache only holds clean data in these modes: it is the
     * backend flush that matters.  Log, do not fail the client.
     */
    cache_error (c, "fdatasync", 0);
  }
  return 0;
}

/*----------------------------------------------------------------------
 * Open, attach (load or format), close.
 */

struct cache *
cache_open (const struct cache_config *cfg)
{
  struct cache *c = calloc (1, sizeof *c);
  int r;

  if (c == NULL) {
    log_error ("calloc: %m");
    return NULL;
  }
  c->pool.fd = -1;
  pthread_mutex_init (&c->lock, NULL);
  if (rangelock_init (&c->ranges) == -1) {
    log_error ("rangelock_init: %m");
    pthread_mutex_destroy (&c->lock);
    free (c);
    return NULL;
  }
  c->path = strdup (cfg->path);
  c->id_text = strdup (cfg->id_text ? cfg->id_text : "");
  if (c->path == NULL || c->id_text == NULL) {
    log_error ("strdup: %m");
    goto err;
  }
  c->cfg_size = cfg->size;
  c->cfg_page_size = cfg->page_size;
  c->id_digest[0] = cfg->id_digest[0];
  c->id_digest[1] = cfg->id_digest[1];
  c->mode = cfg->mode;
  c->reset = cfg->reset;

  if (pool_open (&c->pool, c->path) == -1)
    goto err;
  r = pool_load_sb (&c->pool);
  if (r == -1) {
    if (!c->reset) {
      log_error ("cache file %s cannot be used; to discard it and start "
                 "an empty cache, add ssdcache-reset=true", c->path);
      goto err;
    }
    log_debug ("cache file %s: unusable, re-initialising (reset)", c->path);
    r = 0;
  }
  if (r == 1) {
    const struct layout_sb *sb = &c->pool.sb;
    const char *mismatch = NULL;

    if (sb->id_digest[0] != c->id_digest[0] ||
        sb->id_digest[1] != c->id_digest[1])
      mismatch = "identity";
    else if (c->cfg_page_size && sb->page_size != c->cfg_page_size)
      mismatch = "page size";

    if (mismatch && !c->reset) {
      if (strcmp (mismatch, "identity") == 0)
        log_error ("cache file %s was built for another backend (%s), "
                   "not this one (%s); use another ssdcache-file, or "
                   "ssdcache-reset=true to discard it",
                   c->path, sb->id_text, c->id_text);
      else
        log_error ("cache file %s was built with another %s "
                   "(page size %u, %llu slots); use ssdcache-reset=true "
                   "to re-initialise it", c->path, mismatch,
                   sb->page_size, (unsigned long long) sb->nslots);
      goto err;
    }
    if (sb->mode == LAYOUT_MODE_WRITEBACK && mismatch) {
      /* Never discard what might be dirty data silently. */
      log_error ("cache file %s was used in writeback mode and may hold "
                 "dirty data; refusing to reset it", c->path);
      goto err;
    }
    if (mismatch)
      log_debug ("cache file %s: %s differs, re-initialising (reset)",
                 c->path, mismatch);
    else
      c->have_sb = true;
  }
  return c;

 err:
  cache_close (c);
  return NULL;
}

/* Slots wanted for the configured size: never more than the backend
 * has pages (they would never be used), at least one.
 */
static uint64_t
wanted_slots (const struct cache *c, uint64_t size, uint32_t ps)
{
  uint64_t npages = (c->backend_size + ps - 1) / ps;
  uint64_t nslots = size / ps;

  if (nslots > npages)
    nslots = npages;
  return nslots ? nslots : 1;
}

static int
format_new (struct cache *c)
{
  struct layout_sb sb;
  uint64_t nslots;
  uint32_t ps = c->cfg_page_size ? c->cfg_page_size : CACHE_DEFAULT_PAGE;

  memset (&sb, 0, sizeof sb);
  nslots = wanted_slots (c, c->cfg_size ? c->cfg_size : CACHE_DEFAULT_SIZE,
                         ps);
  if (nslots > UINT32_MAX - 1) {
    log_error ("ssdcache-size: too many pages (%llu); use a larger "
               "ssdcache-page-size", (unsigned long long) nslots);
    return -1;
  }
  sb.version = LAYOUT_VERSION;
  if (getrandom (sb.uuid, sizeof sb.uuid, 0) != sizeof sb.uuid)
    memset (sb.uuid, 0x5a, sizeof sb.uuid);
  sb.page_size = ps;
  sb.sector_size = layout_sector_size (ps);
  sb.nslots = nslots;
  sb.backend_size = c->backend_size;
  sb.id_digest[0] = c->id_digest[0];
  sb.id_digest[1] = c->id_digest[1];
  snprintf (sb.id_text, sizeof sb.id_text, "%s", c->id_text);
  sb.mode = c->mode;
  if (pool_format (&c->pool, &sb) == -1)
    return -1;
  log_debug ("cache file %s: new cache, %llu slots of %u bytes",
             c->path, (unsigned long long) nslots, ps);
  return 0;
}

/* Load every verifiable entry.  Per backend page the highest sequence
 * number wins; anything that does not verify is dropped.
 */
static int
load_entries (struct cache *c, bool was_clean)
{
  const uint64_t npages = (c->backend_size + c->page_size - 1) / c->page_size;
  uint8_t *buf = malloc ((size_t) LOAD_CHUNK * LAYOUT_ENTRY_SIZE);
  uint64_t max_seq = 0, loaded = 0, dropped = 0;

  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  pagetable_clear_free (&c->pt);
  for (uint64_t base = 0; base < c->nslots; base += LOAD_CHUNK) {
    uint64_t n = c->nslots - base < LOAD_CHUNK ? c->nslots - base : LOAD_CHUNK;

    if (pool_read_entries (&c->pool, base, n, buf) == -1) {
      log_error ("cache file %s: reading page table: %m", c->path);
      free (buf);
      return -1;
    }
    for (uint64_t k = 0; k < n; k++) {
      const uint8_t *raw = buf + k * LAYOUT_ENTRY_SIZE;
      uint32_t s = base + k, other;
      struct layout_entry e;
      bool zero = true;

      if (layout_entry_decode (raw, c->nsectors, &e) == -1) {
        for (int b = 0; b < LAYOUT_ENTRY_SIZE; b++)
          zero &= raw[b] == 0;
        if (!zero) {
          dropped++;
          if (ssdcache_debug_recovery)
            log_debug ("slot %u: entry fails its checks: dropped", s);
        }
        continue;
      }
      if (e.seq > max_seq)
        max_seq = e.seq;
      if (e.state == LAYOUT_FREE)
        continue;
      if (e.state == LAYOUT_DIRTY) {
        log_error ("cache file %s holds dirty data (slot %u) from "
                   "writeback mode, which this version cannot write "
                   "back; refusing to start", c->path, s);
        free (buf);
        return -1;
      }
      if (e.page >= npages) {
        dropped++;
        continue;
      }
      other = pagetable_lookup (&c->pt, e.page);
      if (other != PT_NONE) {
        /* Two slots for one page: keep the newer. */
        if (c->pt.slots[other].seq > e.seq) {
          dropped++;
          continue;
        }
        pagetable_remove (&c->pt, other);
        evict_remove (c->ev, other);
        c->pt.slots[other].state = LAYOUT_FREE;
        dropped++;
        loaded--;
      }
      pagetable_from_entry (&c->pt.slots[s], &e);
      c->pt.slots[s].flags = 0;          /* data not verified yet */
      pagetable_insert (&c->pt, s, e.page);
      evict_insert (c->ev, s);
      loaded++;
      if (ssdcache_debug_recovery)
        log_debug ("slot %u: page %llu seq %llu", s,
                   (unsigned long long) e.page, (unsigned long long) e.seq);
    }
  }
  free (buf);

  for (uint32_t s = c->nslots; s-- > 0;)
    if (c->pt.slots[s].state == LAYOUT_FREE)
      pagetable_put_free (&c->pt, s);
  c->seq = max_seq;
  STATS_ADD (&c->stats, loaded_slots, loaded);
  STATS_ADD (&c->stats, dropped_entries, dropped);
  if (dropped && was_clean)
    log_error ("cache file %s: %llu page-table entries were damaged and "
               "have been dropped", c->path, (unsigned long long) dropped);
  log_debug ("cache file %s: %s start, %llu pages loaded, %llu dropped",
             c->path, was_clean ? "clean" : "unclean (recovering)",
             (unsigned long long) loaded, (unsigned long long) dropped);
  return 0;
}

int
cache_attach (struct cache *c, uint64_t backend_size)
{
  bool was_clean = false;

  c->backend_size = backend_size;
  if (c->have_sb && c->pool.sb.backend_size != backend_size) {
    if (!c->reset) {
      log_error ("cache file %s was built for a backend size of %llu "
                 "bytes, but the backend size is now %llu; use "
                 "ssdcache-reset=true to re-initialise it", c->path,
                 (unsigned long long) c->pool.sb.backend_size,
                 (unsigned long long) backend_size);
      return -1;
    }
    log_debug ("cache file %s: backend size changed, re-initialising",
               c->path);
    c->have_sb = false;
  }
  if (c->have_sb && c->cfg_size &&
      wanted_slots (c, c->cfg_size, c->pool.sb.page_size) !=
      c->pool.sb.nslots) {
    if (!c->reset) {
      log_error ("cache file %s was built with %llu slots of %u bytes, "
                 "not the size asked for now; use ssdcache-reset=true to "
                 "re-initialise it", c->path,
                 (unsigned long long) c->pool.sb.nslots,
                 c->pool.sb.page_size);
      return -1;
    }
    log_debug ("cache file %s: size changed, re-initialising", c->path);
    c->have_sb = false;
  }
  if (!c->have_sb) {
    if (format_new (c) == -1)
      return -1;
    was_clean = true;
  }
  else
    was_clean = c->pool.sb.flags & LAYOUT_SB_CLEAN;

  c->page_size = c->pool.sb.page_size;
  c->sector_size = c->pool.sb.sector_size;
  c->nsectors = c->page_size / c->sector_size;
  c->nslots = c->pool.sb.nslots;

  if (pagetable_init (&c->pt, c->nslots) == -1 ||
      (c->ev = evict_new (c->nslots)) == NULL) {
    log_error ("cannot allocate the page table for %u slots", c->nslots);
    return -1;
  }
  if (c->have_sb && load_entries (c, was_clean) == -1)
    return -1;

  /* From now on a crash must be noticed at the next start. */
  {
    struct layout_sb sb = c->pool.sb;
    sb.flags &= ~LAYOUT_SB_CLEAN;
    sb.mode = c->mode;
    if (pool_write_sb (&c->pool, &sb) == -1)
      return -1;
  }
  return 0;
}

void
cache_close (struct cache *c)
{
  if (c == NULL)
    return;
  if (c->pool.fd >= 0 && c->ev != NULL) {
    struct layout_sb sb = c->pool.sb;
    if (pool_sync (&c->pool) == 0) {
      sb.flags |= LAYOUT_SB_CLEAN;
      pool_write_sb (&c->pool, &sb);
    }
    else
      log_error ("cache file %s: fdatasync at close: %m", c->path);
  }
  if (c->pool.fd >= 0)
    pool_close (&c->pool);
  if (c->ev)
    evict_free (c->ev);
  if (c->pt.slots)
    pagetable_free (&c->pt);
  rangelock_destroy (&c->ranges);
  pthread_mutex_destroy (&c->lock);
  free (c->path);
  free (c->id_text);
  free (c);
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
