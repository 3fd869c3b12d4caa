/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: opening, formatting and closing the cache.
 *
 * Owns the life of struct cache: cache_open (lock the file, read the
 * superblock, check the identity; a file of another size is accepted,
 * to be resized), cache_attach (check the backend size, format a new
 * cache or recover the page table: recover.c), cache_close (seal, save
 * the policy hints, mark the superblock clean) and cache_close_resize
 * (the same, then resize.c).  Runs single-threaded, before the first request and after
 * the last; c->lock is still taken where the slot helpers expect it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/random.h>

#include "admit.h"
#include "cache-int.h"
#include "log.h"
#include "readahead.h"

/* Slots wanted for size bytes, at least one, and never much more than
 * the backend has pages: one slot per page, plus a quarter (at least
 * CACHE_SPARE_MIN) for the older versions of rewritten pages, which
 * stay until a flush makes their successors durable.  Without that
 * room a cache as large as the backend fills up with them and makes
 * writers wait for writeback.
 */
#define CACHE_SPARE_MIN 16
static uint64_t
wanted_slots (uint64_t backend_size, uint64_t size, uint32_t ps)
{
  uint64_t npages = (backend_size + ps - 1) / ps;
  uint64_t spare = npages / 4 > CACHE_SPARE_MIN ? npages / 4 : CACHE_SPARE_MIN;
  uint64_t nslots = size / ps;

  if (nslots > npages + spare)
    nslots = npages + spare;
  return nslots ? nslots : 1;
}

void
cache_config_defaults (struct cache_config *cfg)
{
  *cfg = (struct cache_config) {
    .mode = CACHE_DEFAULT_MODE,
    .flush_mode = CACHE_DEFAULT_FLUSH,
    .wb = { .high_pct = CACHE_DEFAULT_WB_HIGH,
            .low_pct = CACHE_DEFAULT_WB_LOW,
            .idle_ms = CACHE_DEFAULT_WB_IDLE_MS,
            .depth = CACHE_DEFAULT_WB_DEPTH,
            .seq_cutoff = CACHE_DEFAULT_WB_SEQ_CUTOFF },
    .policy = EVICT_DEFAULT,
    .seq_streams = CACHE_DEFAULT_SEQ_STREAMS,
    .promote = ADMIT_NHIT_DEFAULT_N,
    .readahead_mode = READAHEAD_AUTO,
    .readahead_max = READAHEAD_DEFAULT_MAX,
    .defer_writes = CACHE_DEFAULT_DEFER_WRITES,
    .resize_move = CACHE_DEFAULT_RESIZE_MOVE,
  };
}

/* A struct cache with its locks made and nothing else: the first step
 * of cache_open.  NULL (logged) on failure.
 */
static struct cache *
cache_new (void)
{
  struct cache *c = calloc (1, sizeof *c);
  pthread_rwlockattr_t a;

  if (c == NULL) {
    log_error ("calloc: %m");
    return NULL;
  }
  c->pool.fd = -1;
  pthread_mutex_init (&c->lock, NULL);
  pthread_rwlockattr_init (&a);
  /* A flush must not starve behind a stream of writers. */
  pthread_rwlockattr_setkind_np (&a,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init (&c->inplace, &a);
  pthread_rwlockattr_destroy (&a);
  pthread_cond_init (&c->space, NULL);
  pthread_cond_init (&c->order_cond, NULL);
  if (rangelock_init (&c->ranges) == -1) {
    log_error ("rangelock_init: %m");
    pthread_cond_destroy (&c->order_cond);
    pthread_cond_destroy (&c->space);
    pthread_rwlock_destroy (&c->inplace);
    pthread_mutex_destroy (&c->lock);
    free (c);
    return NULL;
  }
  c->epoch = 1;
  c->gen = 1;
  atomic_init (&c->backend_unflushed, false);
  atomic_init (&c->last_io_ms, cache_now_ms ());
  return c;
}

/* Copy the configuration into c (read-only from here on).  Returns -1
 * (logged) on failure.
 */
static int
copy_config (struct cache *c, const struct cache_config *cfg)
{
  c->path = strdup (cfg->path);
  c->id_text = strdup (cfg->id_text ? cfg->id_text : "");
  if (c->path == NULL || c->id_text == NULL) {
    log_error ("strdup: %m");
    return -1;
  }
  c->cfg_size = cfg->size;
  c->cfg_page_size = cfg->page_size;
  c->id_digest[0] = cfg->id_digest[0];
  c->id_digest[1] = cfg->id_digest[1];
  c->mode = cfg->mode;
  c->reset = cfg->reset;
  c->flush_mode = cfg->flush_mode;
  c->wbcfg = cfg->wb;
  c->policy = cfg->policy;
  c->verify = cfg->verify;
  c->defer_writes = cfg->defer_writes;
  c->promote = cfg->promote;
  c->resize_move = cfg->resize_move;
  c->partial_pages = cfg->partial_pages == 0 ? PT_SIDE_DEFAULT
    : cfg->partial_pages == CACHE_PARTIAL_NONE ? 0 : cfg->partial_pages;
  c->readahead_mode = cfg->readahead_mode;
  c->readahead_window = cfg->readahead_window;
  c->readahead_max = cfg->readahead_max;
  if (cfg->export_name &&
      (c->export_name = strdup (cfg->export_name)) == NULL) {
    log_error ("strdup: %m");
    return -1;
  }
  c->budget = cfg->budget;
  c->reclaim = cfg->reclaim;
  c->reclaim_opaque = cfg->reclaim_opaque;
  /* Sequential writes past the cutoff go around a writeback cache that
   * is behind (write-back.c): as bcache's sequential_cutoff.
   */
  if (cfg->wb.seq_cutoff &&
      (c->wseq = admit_seq_new (cfg->wb.seq_cutoff,
                                ADMIT_SEQ_DEFAULT_STREAMS)) == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  if (cfg->seq_cutoff) {
    c->seqcut = admit_seq_new (cfg->seq_cutoff, cfg->seq_streams);
    if (c->seqcut == NULL) {
      log_error ("calloc: %m");
      return -1;
    }
  }
  return 0;
}

/* What in the superblock read from the file differs from the
 * configuration: "identity", "page size", "size", or NULL.
 */
static const char *
sb_mismatch (const struct cache *c)
{
  const struct layout_sb *sb = &c->pool.sb;

  if (sb->id_digest[0] != c->id_digest[0] ||
      sb->id_digest[1] != c->id_digest[1])
    return "identity";
  if (c->cfg_page_size && sb->page_size != c->cfg_page_size)
    return "page size";
  if (c->cfg_size &&
      wanted_slots (sb->backend_size, c->cfg_size, sb->page_size) !=
      sb->nslots)
    return "size";   /* (a backend size change is found later) */
  return NULL;
}

/* A superblock of another size: accepted, to be resized once
 * attached (cache_close_resize).  Returns -1 (logged) if the size is
 * too large.
 */
static int
accept_resize (struct cache *c)
{
  const struct layout_sb *sb = &c->pool.sb;
  uint64_t n = wanted_slots (sb->backend_size, c->cfg_size, sb->page_size);

  if (n > UINT32_MAX - 1) {
    log_error ("ssdcache-size: too many pages (%llu); use a larger "
               "ssdcache-page-size", (unsigned long long) n);
    return -1;
  }
  log_debug ("cache file %s: %llu slots, %llu wanted: it is resized once "
             "attached", c->path, (unsigned long long) sb->nslots,
             (unsigned long long) n);
  c->have_sb = true;
  c->resize_slots = n;
  return 0;
}

/* The reset decision, given r, what pool_load_sb returned (-1: the
 * file is unusable, 0: it holds no cache yet, 1: a superblock was
 * read): accept the superblock (c->have_sb), leave the file to be
 * re-initialised by cache_attach (ssdcache-reset=true), or refuse it.
 * A file that is no cache but holds data (c->pool.foreign) is never
 * re-initialised.
 * Returns -1 (logged) if refused.
 */
static int
accept_or_reset (struct cache *c, int r)
{
  const struct layout_sb *sb = &c->pool.sb;
  const char *mismatch;

  if (r == -1) {
    if (c->pool.foreign)
      return -1;                /* not a cache: never reset it (logged) */
    if (!c->reset) {
      log_error ("cache file %s cannot be used; to discard it and start "
                 "an empty cache, add ssdcache-reset=true", c->path);
      return -1;
    }
    log_error ("cache file %s: unusable, re-initialising it "
               "(ssdcache-reset=true)", c->path);
    return 0;
  }
  if (r != 1)
    return 0;
  if (sb->flags & LAYOUT_SB_RESIZING) {
    /* Set only while the cache held no dirty data (resize.c). */
    log_error ("cache file %s: a change of its size was interrupted; "
               "it held no dirty data, and starts empty", c->path);
    return 0;
  }
  mismatch = sb_mismatch (c);
  if (mismatch == NULL) {
    c->have_sb = true;
    return 0;
  }
  if (strcmp (mismatch, "size") == 0 && !c->reset)
    return accept_resize (c);
  if (!c->reset) {
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
    return -1;
  }
  if (sb->flags & LAYOUT_SB_DIRTY) {
    /* Never discard dirty data silently. */
    log_error ("cache file %s may hold dirty data not yet written back "
               "to its backend (%s); refusing to reset it: start it "
               "with its own backend first so it can be written back",
               c->path, sb->id_text);
    return -1;
  }
  log_error ("cache file %s: %s differs, re-initialising it "
             "(ssdcache-reset=true)", c->path, mismatch);
  return 0;
}

struct cache *
cache_open (const struct cache_config *cfg)
{
  return cache_open_fd (cfg, -1);
}

struct cache *
cache_open_fd (const struct cache_config *cfg, int fd)
{
  struct cache *c = cache_new ();
  int r;

  if (c == NULL) {
    if (fd >= 0)
      close (fd);
    return NULL;
  }
  if (copy_config (c, cfg) == -1) {
    if (fd >= 0)
      close (fd);
    goto err;
  }
  r = fd >= 0 ? pool_open_fd (&c->pool, c->path, fd, cfg->direct)
    : cfg->private_file ? pool_open_private (&c->pool, c->path, cfg->direct)
    : pool_open (&c->pool, c->path, cfg->direct);
  if (r == -1)
    goto err;
  c->pool.sparse = cfg->sparse;
  if (accept_or_reset (c, pool_load_sb (&c->pool)) == -1)
    goto err;
  return c;

 err:
  cache_close (c);
  return NULL;
}

/* For the policy's ghost list: the page a resident slot holds, unless
 * no client has read it since readahead brought it in (under c->lock:
 * called from evict_victim).
 */
static uint64_t
slot_page (void *opaque, uint32_t s)
{
  const struct cache *c = opaque;

  if (pt_flags (&c->pt, s) & PT_PREFETCHED)
    return EVICT_NO_PAGE;
  return pt_page (&c->pt, s);
}

/* Slot s is indexed, and raw its entry as stored: bring its hint up
 * to date.  An entry that only changes its hint keeps its number; one
 * that differs otherwise (it should not at a clean stop) is written
 * from RAM with a fresh number, as the newest version of its page, if
 * it can be: a sealed entry takes its checksum from the stored one,
 * which must then describe the same data (page, state and maps); if it
 * does not, the entry is left as it is (RAM keeps no checksums).
 * Returns true if raw changed.  Called with c->lock held.
 */
static bool
save_hint_locked (struct cache *c, uint32_t s, uint8_t *raw)
{
  struct layout_entry e, old;
  struct pt_slot v;
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  bool decoded;

  pagetable_get (&c->pt, s, &v);
  decoded = layout_entry_decode (raw, c->nsectors, &old) == 0;
  if (decoded && old.page == v.page && old.state == v.state &&
      memcmp (old.valid, v.valid, sizeof v.valid) == 0 &&
      memcmp (old.dirty, v.dirty, sizeof v.dirty) == 0 &&
      (!(old.flags & LAYOUT_ENT_UNSEALED) || (v.flags & PT_UNSEALED)))
    pt_slot_set_crc (&v, old.data_crc);
  else if (!(v.flags & PT_UNSEALED)) {
    log_debug ("cache file %s: slot %u: its entry does not describe the "
               "data RAM has; left as it is", c->path, s);
    return false;
  }
  if (decoded) {
    v.seq = old.seq;
    pagetable_to_entry (&v, &e);
    e.hint = old.hint;
    layout_entry_encode (&e, buf);
    if (memcmp (buf, raw, LAYOUT_ENTRY_SIZE) == 0) {
      if (old.hint == evict_slot_hint (c->ev, s))
        return false;
      e.hint = evict_slot_hint (c->ev, s);
      layout_entry_encode (&e, raw);
      return true;
    }
  }
  /* A fresh number: RAM keeps only a change stamp (pagetable.h). */
  v.seq = ++c->seq;
  pagetable_to_entry (&v, &e);
  e.hint = evict_slot_hint (c->ev, s);
  layout_entry_encode (&e, raw);
  return true;
}

/* At a clean shutdown, record every cached page's hotness (the policy
 * hint) in its entry, so that the next start knows its hot set.  Only
 * grains of slots whose hints may have changed since they were loaded
 * are read (evict_hints_changed), and only chunks with an entry whose
 * hint did change are written back.
 */
static void
save_hints (struct cache *c)
{
  uint8_t *raw = malloc ((size_t) CACHE_LOAD_CHUNK * LAYOUT_ENTRY_SIZE);

  if (raw == NULL)
    return;
  for (uint64_t base = 0; base < c->nslots; base += CACHE_LOAD_CHUNK) {
    uint64_t n = c->nslots - base < CACHE_LOAD_CHUNK
      ? c->nslots - base : CACHE_LOAD_CHUNK;
    bool changed = false, marked;

    pthread_mutex_lock (&c->lock);
    marked = evict_hints_changed (c->ev, base, n);
    pthread_mutex_unlock (&c->lock);
    if (!marked)
      continue;
    if (pool_read_entries (&c->pool, base, n, raw) == -1)
      break;
    pthread_mutex_lock (&c->lock);
    for (uint64_t k = 0; k < n; k++)
      if (pt_flags (&c->pt, base + k) & PT_INDEXED)
        changed |= save_hint_locked (c, base + k,
                                     raw + k * LAYOUT_ENTRY_SIZE);
    pthread_mutex_unlock (&c->lock);
    if (changed && pool_write_entries (&c->pool, base, n, raw) == -1) {
      log_error ("cache file %s: saving policy hints: %m", c->path);
      break;
    }
    pthread_mutex_lock (&c->lock);
    evict_hints_saved (c->ev, base, n);
    pthread_mutex_unlock (&c->lock);
  }
  free (raw);
}

static int
format_new (struct cache *c)
{
  struct layout_sb sb;
  uint64_t nslots;
  uint32_t ps = c->cfg_page_size ? c->cfg_page_size : CACHE_DEFAULT_PAGE;

  memset (&sb, 0, sizeof sb);
  nslots = wanted_slots (c->backend_size,
                         c->cfg_size ? c->cfg_size : CACHE_DEFAULT_SIZE, ps);
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

/* Is the cache file as long as its superblock says?  A file cut short
 * inside the page table is refused; one cut inside the page pool is
 * extended back to its size, and *data_end is set to the first slot
 * whose data was cut off (their entries are dropped by the loader).
 */
static int
check_size (struct cache *c, uint32_t *data_end)
{
  const struct layout_sb *sb = &c->pool.sb;
  uint64_t pt, pool, total;
  int fd = c->pool.fd;

  *data_end = sb->nslots;
  if (!layout_geometry (sb->page_size, sb->nslots, &pt, &pool, &total))
    return -1;                  /* cannot happen: checked at decode */
  if (c->pool.dev_size >= total)
    return 0;
  if (c->pool.is_blockdev) {
    log_error ("cache file %s: the device has %llu bytes, but the cache "
               "on it needs %llu", c->path,
               (unsigned long long) c->pool.dev_size,
               (unsigned long long) total);
    return -1;
  }
  if (c->pool.dev_size < pool) {
    log_error ("cache file %s is truncated: %llu bytes, but its page table "
               "alone ends at byte %llu (of %llu): its entries are lost; "
               "%s", c->path, (unsigned long long) c->pool.dev_size,
               (unsigned long long) (pt + sb->nslots * LAYOUT_ENTRY_SIZE),
               (unsigned long long) total,
               (sb->flags & LAYOUT_SB_DIRTY)
               ? "it may have held dirty data, so it is not reset "
                 "automatically: remove the file to start afresh "
                 "(that dirty data is gone)"
               : "use ssdcache-reset=true or remove the file");
    return -1;
  }
  *data_end = (c->pool.dev_size - pool) / sb->page_size;
  log_error ("cache file %s is truncated: %llu of %llu bytes; the data of "
             "slots %u and up is gone, those entries are dropped and the "
             "file is extended back", c->path,
             (unsigned long long) c->pool.dev_size,
             (unsigned long long) total, *data_end);
  if (ftruncate (fd, total) == -1) {
    log_error ("cache file %s: cannot extend it to %llu bytes: %m",
               c->path, (unsigned long long) total);
    return -1;
  }
  c->pool.dev_size = total;
  return 0;
}

/* A deferred write failed (defer.c): the cache device is failing.
 * The queue fails every later slot read, so the stale cached copy is
 * never served; the backend has the data.
 */
static void
defer_error (void *opaque, uint64_t slot, int err)
{
  struct cache *c = opaque;

  errno = err;
  cache_io_error (c, "writing deferred data", (uint32_t) slot);
}

/* The page table numbers pages with 40 bits (pagetable.h): refuse a
 * backend with more pages.  Returns -1 (logged) if refused.
 */
static int
check_npages (const struct cache *c, uint64_t backend_size)
{
  uint32_t ps = c->have_sb ? c->pool.sb.page_size
    : c->cfg_page_size ? c->cfg_page_size : CACHE_DEFAULT_PAGE;
  uint64_t npages = backend_size / ps + (backend_size % ps != 0);

  if (npages > PT_MAX_PAGES + 1) {
    log_error ("the backend has %llu pages of %u bytes; the cache handles "
               "at most %llu pages (4 PiB with 4 KiB pages, 64 PiB with "
               "64 KiB pages): use a larger ssdcache-page-size",
               (unsigned long long) npages, ps,
               (unsigned long long) PT_MAX_PAGES + 1);
    return -1;
  }
  return 0;
}

/* An accepted superblock built for another backend size: refused, or
 * (ssdcache-reset=true, and no dirty data) dropped so that the file is
 * re-initialised.  Returns -1 (logged) if refused.
 */
static int
check_backend_size (struct cache *c, uint64_t backend_size)
{
  if (!c->have_sb || c->pool.sb.backend_size == backend_size)
    return 0;
  if (!c->reset || (c->pool.sb.flags & LAYOUT_SB_DIRTY)) {
    log_error ("cache file %s was built for a backend size of %llu "
               "bytes, but the backend size is now %llu; %s", c->path,
               (unsigned long long) c->pool.sb.backend_size,
               (unsigned long long) backend_size,
               (c->pool.sb.flags & LAYOUT_SB_DIRTY)
               ? "it may hold dirty data, refusing to reset it"
               : "use ssdcache-reset=true to re-initialise it");
    return -1;
  }
  log_error ("cache file %s: backend size changed, re-initialising it "
             "(ssdcache-reset=true)", c->path);
  c->have_sb = false;
  return 0;
}

/* Format a new cache, or check the length of the accepted one (setting
 * *data_end, see check_size) and whether it was closed cleanly.
 * Returns -1 (logged) on failure.
 */
static int
format_or_check (struct cache *c, uint32_t *data_end)
{
  if (!c->have_sb) {
    if (format_new (c) == -1)
      return -1;
    c->was_clean = true;
    return 0;
  }
  /* A damaged superblock copy may have been the newest one: then the
   * survivor's clean flag may be stale.
   */
  c->was_clean = (c->pool.sb.flags & LAYOUT_SB_CLEAN) &&
    !c->pool.sb_damaged;
  return check_size (c, data_end);
}

/* The geometry from the superblock, and the in-RAM structures sized by
 * it: the page table, the policy, the n-miss counters.  Returns -1
 * (logged) on failure.
 */
static int
set_geometry (struct cache *c)
{
  uint8_t none[LAYOUT_MAX_SECTORS / 8] = { 0 };
  uint8_t *zero;

  c->page_size = c->pool.sb.page_size;
  c->sector_size = c->pool.sb.sector_size;
  c->nsectors = c->page_size / c->sector_size;
  c->nslots = c->pool.sb.nslots;
  c->max_dirty = c->wbcfg.max_dirty_pct
    ? (uint64_t) c->nslots * c->wbcfg.max_dirty_pct / 100
    : (c->wbcfg.max_dirty_bytes + c->page_size - 1) / c->page_size;
  if (c->max_dirty == 0 && (c->wbcfg.max_dirty_pct ||
                            c->wbcfg.max_dirty_bytes))
    c->max_dirty = 1;
  zero = calloc (1, c->page_size);
  if (zero == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  c->zero_page_crc = cache_page_crc (c, zero, none);
  free (zero);

  if (ssdcache_debug_epoch_span > 0)
    pagetable_test_epoch_span = (uint32_t) ssdcache_debug_epoch_span;
  if (pagetable_init (&c->pt, c->nslots) == -1 ||
      (c->wbcfg.order == CACHE_ORDER_FLUSH &&
       pagetable_keep_gens (&c->pt) == -1) ||
      (c->ev = evict_new_policy (c->policy, c->nslots)) == NULL) {
    log_error ("cannot allocate the page table for %u slots", c->nslots);
    return -1;
  }
  c->pt.rebases = &c->stats.pt_rebases;
  evict_set_step_limit (c->ev, ssdcache_debug_evict_steps > 0
                        ? ssdcache_debug_evict_steps : CACHE_EVICT_STEPS);
  pagetable_set_side_limit (&c->pt, c->partial_pages < c->nslots
                            ? c->partial_pages : c->nslots);
  pagetable_set_budget (&c->pt, c->budget, c->page_size);
  evict_set_page_fn (c->ev, slot_page, c);
  if (c->promote > 1) {
    /* Two 8-bit counters per slot: a page must miss promote times
     * within about 2 * nslots read misses to be cached.
     */
    c->nhit = admit_nhit_new (c->promote, 2 * c->nslots);
    if (c->nhit == NULL) {
      log_error ("calloc: %m");
      return -1;
    }
  }
  return 0;
}

/* From now on a crash must be noticed at the next start; this also
 * makes the FREE entries written by recovery durable.  Then start the
 * deferral of writethrough's slot writes.  Returns -1 (logged) on
 * failure.
 */
static int
start_running (struct cache *c)
{
  struct layout_sb sb = c->pool.sb;

  sb.flags &= ~LAYOUT_SB_CLEAN;
  if (c->mode == LAYOUT_MODE_WRITEBACK || c->ndirty > 0)
    sb.flags |= LAYOUT_SB_DIRTY;
  sb.mode = c->mode;
  if (pool_write_sb (&c->pool, &sb) == -1)
    return -1;

  if (c->mode == LAYOUT_MODE_WRITETHROUGH && c->defer_writes &&
      defer_start (&c->defer, &c->pool, &c->stats, defer_error, c) == -1) {
    log_error ("cannot start the deferred-write thread: %m");
    return -1;
  }
  return 0;
}

int
cache_attach (struct cache *c, uint64_t backend_size)
{
  uint32_t data_end = 0;

  c->backend_size = backend_size;
  if (check_npages (c, backend_size) == -1 ||
      check_backend_size (c, backend_size) == -1 ||
      format_or_check (c, &data_end) == -1 ||
      set_geometry (c) == -1)
    return -1;
  if (c->have_sb && recover_load_entries (c, data_end) == -1)
    return -1;
  order_loaded (c);
  return start_running (c);
}

bool
cache_file_untouched (const struct cache *c)
{
  struct stat st;

  return c->ev == NULL && !c->have_sb && c->pool.fd >= 0 &&
    fstat (c->pool.fd, &st) == 0 && S_ISREG (st.st_mode) && st.st_size == 0;
}

/* The on-disk part of cache_close: stop the threads, seal, save the
 * hints, sync and mark the superblock clean.  Returns true if it is.
 */
static bool
close_file (struct cache *c)
{
  bool clean = false;

  if (c->hooks.warm_stop)
    c->hooks.warm_stop (c);
  if (c->hooks.readahead_stop)
    c->hooks.readahead_stop (c);
  if (c->hooks.fill_behind_stop)
    c->hooks.fill_behind_stop (c);
  if (c->hooks.wb_stop)
    c->hooks.wb_stop (c);
  defer_stop (&c->defer);       /* writes its queue out */
  if (c->pool.fd >= 0 && c->ev != NULL) {
    struct layout_sb sb = c->pool.sb;
    int err;

    /* Every unsealed slot gets its checksum back first (save_hints
     * writes entries from RAM).
     */
    if (!cache_degraded (c)) {
      cache_seal_epoch (c, CACHE_EPOCH_NOW - 1, true, true);
      save_hints (c);
    }
    if (!cache_stale_record_all (c))
      log_error ("cache file %s: the failing device refused to record some "
                 "page-table changes (pages written back or dropped); the "
                 "backend was never given newer data for the pages still "
                 "marked dirty, but pages still marked clean may be older "
                 "than the backend: start the next time with "
                 "ssdcache-verify=lazy, or use a new cache file", c->path);

    /* Superseded slots can all go once everything is durable; the
     * first sync also seals every unsealed slot.
     */
    if (cache_sync (c, &err) == -1 || cache_sync (c, &err) == -1)
      log_error ("cache file %s: fdatasync at close: %m", c->path);
    else if (cache_unsealed_count (c) > 0)
      log_error ("cache file %s: %zu pages could not be sealed at "
                 "close; the cache stays marked as not closed cleanly, "
                 "so the next start drops them (they were not flushed)",
                 c->path, cache_unsealed_count (c));
    else {
      sb.flags |= LAYOUT_SB_CLEAN;
      if (c->ndirty == 0)
        sb.flags &= ~LAYOUT_SB_DIRTY;
      else {
        sb.flags |= LAYOUT_SB_DIRTY;
        log_debug ("cache file %s: %llu dirty pages stay in the cache",
                   c->path, (unsigned long long) c->ndirty);
      }
      clean = pool_write_sb (&c->pool, &sb) == 0;
    }
  }
  return clean;
}

/* The rest of cache_close: unlock the file (unless cache_close_resize
 * took it), free c.
 */
static void
free_cache (struct cache *c)
{
  pool_close (&c->pool);
  if (c->ev)
    evict_free (c->ev);
  if (c->pt.recs)
    pagetable_free (&c->pt);
  rangelock_destroy (&c->ranges);
  pthread_cond_destroy (&c->space);
  pthread_cond_destroy (&c->order_cond);
  pthread_rwlock_destroy (&c->inplace);
  pthread_mutex_destroy (&c->lock);
  free (c->sup);
  free (c->unsealed);
  free (c->suspect);
  genclock_free (&c->gclock);
  free (c->stale);
  free (c->crc_memo);
  admit_seq_free (c->seqcut);
  admit_seq_free (c->wseq);
  admit_nhit_free (c->nhit);
  free (c->path);
  free (c->id_text);
  free (c->export_name);
  free (c);
}

void
cache_close (struct cache *c)
{
  if (c == NULL)
    return;
  close_file (c);
  free_cache (c);
}

bool
cache_resize_pending (const struct cache *c)
{
  return c->resize_slots != 0 && c->ev != NULL;
}

void
cache_resize_keep (struct cache *c, const char *why)
{
  if (c->resize_slots == 0)
    return;
  log_error ("cache file %s keeps its size of %u slots (%llu wanted): %s",
             c->path, c->nslots, (unsigned long long) c->resize_slots, why);
  c->resize_slots = 0;
}

int
cache_close_resize (struct cache *c, int *fd)
{
  bool degraded = cache_degraded (c);
  int r = -1;

  if (!close_file (c) || degraded)
    log_error ("cache file %s was not closed cleanly: it keeps its size",
               c->path);
  else if (c->ndirty > 0 || c->nretained > 0)
    log_error ("cache file %s holds %llu dirty pages: it keeps its size",
               c->path, (unsigned long long) c->ndirty);
  else
    r = resize_file (c);
  *fd = pool_take_fd (&c->pool);
  free_cache (c);
  return r;
}
