/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: opening, loading (recovery), formatting and
 * closing the cache.
 *
 * Runs single-threaded: cache_open and cache_attach at start-up, before
 * any request; cache_close after the last one.  c->lock is still taken
 * where helpers shared with the request paths expect it.
 *
 * Recovery: every entry whose CRC verifies is a candidate for its
 * backend page; per page the highest sequence number wins.  After an
 * unclean shutdown the data CRC of dirty winners is checked at once (a
 * write that was torn by the crash was never flushed, so the next
 * older candidate, or the backend, is right); the losers get FREE
 * entries so that they can never come back.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/random.h>

#include "admit.h"
#include "cache-int.h"
#include "log.h"
#include "prefetch.h"
#include "readahead.h"
#include "writeback.h"

#define LOAD_CHUNK 4096          /* entries read at a time */

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
            .idle_ms = CACHE_DEFAULT_WB_IDLE_MS },
    .policy = EVICT_DEFAULT,
    .seq_streams = CACHE_DEFAULT_SEQ_STREAMS,
    .promote = ADMIT_NHIT_DEFAULT_N,
    .readahead_mode = READAHEAD_AUTO,
    .readahead_max = READAHEAD_DEFAULT_MAX,
    .defer_writes = CACHE_DEFAULT_DEFER_WRITES,
  };
}

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
  {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init (&a);
    /* A flush must not starve behind a stream of writers. */
    pthread_rwlockattr_setkind_np (&a,
                                   PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init (&c->inplace, &a);
    pthread_rwlockattr_destroy (&a);
  }
  pthread_cond_init (&c->space, NULL);
  if (rangelock_init (&c->ranges) == -1) {
    log_error ("rangelock_init: %m");
    pthread_cond_destroy (&c->space);
    pthread_rwlock_destroy (&c->inplace);
    pthread_mutex_destroy (&c->lock);
    free (c);
    return NULL;
  }
  c->epoch = 1;
  atomic_init (&c->backend_unflushed, false);
  atomic_init (&c->last_io_ms, cache_now_ms ());
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
  c->flush_mode = cfg->flush_mode;
  c->wbcfg = cfg->wb;
  c->policy = cfg->policy;
  c->verify = cfg->verify;
  c->defer_writes = cfg->defer_writes;
  c->promote = cfg->promote;
  c->partial_pages = cfg->partial_pages == 0 ? PT_SIDE_DEFAULT
    : cfg->partial_pages == CACHE_PARTIAL_NONE ? 0 : cfg->partial_pages;
  c->ra_mode = cfg->readahead_mode;
  c->ra_window = cfg->readahead_window;
  c->ra_max = cfg->readahead_max;
  if (cfg->seq_cutoff) {
    c->seqcut = admit_seq_new (cfg->seq_cutoff, cfg->seq_streams);
    if (c->seqcut == NULL) {
      log_error ("calloc: %m");
      goto err;
    }
  }

  if ((cfg->private_file ? pool_open_private (&c->pool, c->path, cfg->direct)
       : pool_open (&c->pool, c->path, cfg->direct)) == -1)
    goto err;
  r = pool_load_sb (&c->pool);
  if (r == -1 && c->pool.foreign)
    goto err;                   /* not a cache: never reset it (logged) */
  if (r == -1) {
    if (!c->reset) {
      log_error ("cache file %s cannot be used; to discard it and start "
                 "an empty cache, add ssdcache-reset=true", c->path);
      goto err;
    }
    log_error ("cache file %s: unusable, re-initialising it "
               "(ssdcache-reset=true)", c->path);
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
    else if (c->cfg_size &&
             wanted_slots (sb->backend_size, c->cfg_size, sb->page_size) !=
             sb->nslots)
      mismatch = "size";   /* (a backend size change is found later) */

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
    if (mismatch && (sb->flags & LAYOUT_SB_DIRTY)) {
      /* Never discard dirty data silently. */
      log_error ("cache file %s may hold dirty data not yet written back "
                 "to its backend (%s); refusing to reset it: start it "
                 "with its own backend first so it can be written back",
                 c->path, sb->id_text);
      goto err;
    }
    if (mismatch)
      log_error ("cache file %s: %s differs, re-initialising it "
                 "(ssdcache-reset=true)", c->path, mismatch);
    else
      c->have_sb = true;
  }
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

/* At a clean shutdown, record every cached page's hotness (the policy
 * hint) in its entry, so that the next start knows its hot set.  The
 * entries are otherwise rewritten unchanged, a chunk at a time.
 */
static void
save_hints (struct cache *c)
{
  uint8_t *raw = malloc ((size_t) LOAD_CHUNK * LAYOUT_ENTRY_SIZE);

  if (raw == NULL)
    return;
  for (uint64_t base = 0; base < c->nslots; base += LOAD_CHUNK) {
    uint64_t n = c->nslots - base < LOAD_CHUNK ? c->nslots - base : LOAD_CHUNK;
    bool changed = false;

    if (pool_read_entries (&c->pool, base, n, raw) == -1)
      break;
    pthread_mutex_lock (&c->lock);
    for (uint64_t k = 0; k < n; k++) {
      uint32_t s = base + k;
      struct layout_entry e;

      struct pt_slot v;

      if (!(pt_flags (&c->pt, s) & PT_INDEXED))
        continue;
      pagetable_get (&c->pt, s, &v);
      /* A fresh number: RAM keeps only a change stamp (pagetable.h),
       * and an indexed slot is its page's newest version.
       */
      v.seq = ++c->seq;
      pagetable_to_entry (&v, &e);
      e.hint = evict_slot_hint (c->ev, s);
      layout_entry_encode (&e, raw + k * LAYOUT_ENTRY_SIZE);
      changed = true;
    }
    pthread_mutex_unlock (&c->lock);
    if (changed && pool_write_entries (&c->pool, base, n, raw) == -1) {
      log_error ("cache file %s: saving policy hints: %m", c->path);
      break;
    }
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

struct cand {
  uint64_t page, seq;
  uint32_t slot;
  uint8_t hint;
  bool unsealed;                 /* never used: only tells it was there */
};

static int
cmp_cand (const void *a, const void *b)
{
  const struct cand *x = a, *y = b;

  if (x->page != y->page)
    return x->page < y->page ? -1 : 1;
  return x->seq > y->seq ? -1 : x->seq < y->seq;   /* newest first */
}

/* Does the data of slot s (metadata already in the slot) verify? */
static bool
data_verifies (struct cache *c, uint32_t s, uint8_t *buf)
{
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];

  if (pool_read_data (&c->pool, s, buf, c->page_size, 0) == -1)
    return false;
  pt_maps_get (&c->pt, s, valid, NULL);
  return cache_page_crc (c, buf, valid) == pt_crc (&c->pt, s);
}

/* Slot s is the newest usable version of its page, but a newer one was
 * dropped (unsealed or torn).  That newer version may have been written
 * back before the crash, so the backend may be newer than s's clean
 * sectors: they are no longer valid (they will be read from the
 * backend), and a clean s goes altogether.  s's dirty sectors stay: they
 * are the flushed data.  Returns true if s is still to be used.
 */
static bool
older_after_drop (struct cache *c, uint32_t s, uint8_t *buf)
{
  struct pt_slot v;
  struct layout_entry e;

  pagetable_get (&c->pt, s, &v);
  if (ssdcache_debug_recovery)
    log_debug ("slot %u: page %llu: a newer version was dropped; its clean "
               "sectors are not trusted", s, (unsigned long long) v.page);
  if (v.state != LAYOUT_DIRTY) {
    pt_set_state (&c->pt, s, LAYOUT_FREE);
    cache_write_free_entry (c, s);
    return false;
  }
  if (pool_read_data (&c->pool, s, buf, c->page_size, 0) == -1 ||
      cache_page_crc (c, buf, v.valid) != v.data_crc) {
    cache_io_error (c, "reading data at recovery", s);
    pt_set_state (&c->pt, s, LAYOUT_FREE);
    cache_write_free_entry (c, s);
    return false;
  }
  memcpy (v.valid, v.dirty, sizeof v.valid);
  pt_maps_set (&c->pt, s, v.valid, v.dirty);
  v.data_crc = cache_page_crc (c, buf, v.valid);
  pt_set_crc (&c->pt, s, v.data_crc);
  v.seq = ++c->seq;
  pt_set_seq (&c->pt, s, v.seq);
  pagetable_to_entry (&v, &e);
  if (pool_write_entry (&c->pool, s, &e) == -1) {
    cache_io_error (c, "writing entry at recovery", s);
    return false;
  }
  return true;
}

/* Log a dirty page whose data is gone (loudly: a client's write). */
static void
log_dirty_lost (struct cache *c, uint32_t s, uint64_t page, const char *why)
{
  log_error ("cache file %s: DIRTY DATA LOST: dirty page %llu (slot %u, "
             "bytes %llu-%llu) %s; reads of it now return the previous "
             "version (an older cached copy, or the backend's data)",
             c->path, (unsigned long long) page, s,
             (unsigned long long) page * c->page_size,
             (unsigned long long) (page + 1) * c->page_size - 1, why);
}

/* Load the page table.  Slots at or past data_end have no data any
 * more (the file was cut short): their entries are dropped.
 */
static int
load_entries (struct cache *c, uint32_t data_end)
{
  const uint64_t npages = (c->backend_size + c->page_size - 1) / c->page_size;
  const bool ptinit = c->pool.sb.flags & LAYOUT_SB_PTINIT;
  const bool may_dirty = c->pool.sb.flags & LAYOUT_SB_DIRTY;
  uint8_t *raw = malloc ((size_t) LOAD_CHUNK * LAYOUT_ENTRY_SIZE);
  uint8_t *page_buf = malloc (c->page_size);
  struct cand *cand = malloc ((size_t) c->nslots * sizeof *cand);
  uint64_t ncand = 0, loaded = 0, dropped = 0, lost = 0, ndirty = 0;
  uint64_t unsealed = 0;
  uint64_t damaged = 0, cut = 0;
  uint32_t first_damaged = 0;
  int ret = -1;

  if (raw == NULL || page_buf == NULL || cand == NULL) {
    log_error ("malloc: %m");
    goto out;
  }
  pagetable_clear_free (&c->pt);

  /* Every entry that verifies becomes a candidate (metadata parked in
   * its slot, not indexed yet).
   */
  for (uint64_t base = 0; base < c->nslots; base += LOAD_CHUNK) {
    uint64_t n = c->nslots - base < LOAD_CHUNK ? c->nslots - base : LOAD_CHUNK;

    if (pool_read_entries (&c->pool, base, n, raw) == -1) {
      log_error ("cache file %s: reading page table: %m", c->path);
      goto out;
    }
    for (uint64_t k = 0; k < n; k++) {
      const uint8_t *r = raw + k * LAYOUT_ENTRY_SIZE;
      uint32_t s = base + k;
      struct layout_entry e;

      if (layout_entry_decode (r, c->nsectors, &e) == -1) {
        bool zero = true;
        for (int b = 0; b < LAYOUT_ENTRY_SIZE; b++)
          zero &= r[b] == 0;
        /* All zeroes is an unused slot, unless every entry was written
         * when the cache was made.
         */
        if (!zero || ptinit) {
          if (damaged++ == 0)
            first_damaged = s;
          dropped++;
          if (ssdcache_debug_recovery)
            log_debug ("slot %u: entry fails its checks: dropped", s);
          /* (Freed, so that it is reported once, not at every start.) */
          cache_write_free_entry (c, s);
        }
        continue;
      }
      if (e.seq > c->seq)
        c->seq = e.seq;
      if (e.state == LAYOUT_FREE)
        continue;
      if (e.flags & LAYOUT_ENT_UNSEALED) {
        /* Dirty data rewritten in place after the last flush: it
         * cannot be verified, and need not survive a crash.  It stays a
         * candidate only to tell that a newer version existed.
         */
        unsealed++;
        if (ssdcache_debug_recovery)
          log_debug ("slot %u: page %llu unsealed (not flushed): dropped",
                     s, (unsigned long long) e.page);
        if (e.page < npages) {
          cand[ncand].page = e.page;
          cand[ncand].seq = e.seq;
          cand[ncand].slot = s;
          cand[ncand].hint = 0;
          cand[ncand].unsealed = true;
          ncand++;
        }
        continue;
      }
      if (e.page >= npages) {
        dropped++;
        continue;
      }
      if (s >= data_end) {
        /* Its data was cut off with the end of the file. */
        cut++;
        dropped++;
        if (e.state == LAYOUT_DIRTY) {
          lost++;
          log_dirty_lost (c, s, e.page, "lay past the end of the "
                          "truncated cache file");
        }
        cache_write_free_entry (c, s);
        continue;
      }
      if (!pagetable_from_entry (&c->pt, s, &e)) {
        /* Maps beyond the side table, and no memory to grow it. */
        if (e.state == LAYOUT_DIRTY) {
          log_error ("cache file %s: slot %u: no memory for the sector "
                     "maps of dirty page %llu: not opening the cache",
                     c->path, s, (unsigned long long) e.page);
          goto out;
        }
        dropped++;
        cache_write_free_entry (c, s);
        continue;
      }
      cand[ncand].page = e.page;
      cand[ncand].seq = e.seq;
      cand[ncand].slot = s;
      cand[ncand].hint = e.hint;
      cand[ncand].unsealed = false;
      ncand++;
    }
  }

  /* Per page, the newest candidate that holds up wins. */
  qsort (cand, ncand, sizeof *cand, cmp_cand);
  for (uint64_t i = 0; i < ncand;) {
    uint64_t j = i;
    bool won = false, newer_dropped = false;

    while (j < ncand && cand[j].page == cand[i].page)
      j++;
    for (uint64_t k = i; k < j; k++) {
      uint32_t s = cand[k].slot;

      if (cand[k].unsealed) {
        newer_dropped |= !won;
        continue;
      }
      if (!won && pt_state (&c->pt, s) == LAYOUT_DIRTY && !c->was_clean &&
          !data_verifies (c, s, page_buf)) {
        /* Torn by the crash: it was never flushed (flushed dirty data
         * is never rewritten in place).
         */
        lost++;
        newer_dropped = true;
        log_dirty_lost (c, s, pt_page (&c->pt, s),
                        "fails its data checksum after an unclean "
                        "shutdown: a write torn by the crash (never "
                        "flushed), or damaged data");
        pt_set_state (&c->pt, s, LAYOUT_FREE);
        cache_write_free_entry (c, s);
        continue;
      }
      if (won) {
        /* An older version: make sure it can never come back. */
        pt_set_state (&c->pt, s, LAYOUT_FREE);
        cache_write_free_entry (c, s);
        dropped++;
        continue;
      }
      won = true;
      if (newer_dropped && !older_after_drop (c, s, page_buf)) {
        dropped++;
        continue;
      }
      /* (With c->verify every slot is checked again on first use: its
       * clean sectors against the backend.)
       */
      pt_set_flags (&c->pt, s,
                    pt_state (&c->pt, s) == LAYOUT_DIRTY && !c->was_clean &&
                    !c->verify ? PT_VERIFIED : 0);
      pt_set_epoch (&c->pt, s, 0);
      pagetable_insert (&c->pt, s, pt_page (&c->pt, s));
      evict_insert_hint (c->ev, s, cand[k].hint);   /* hot stays hot */
      if (pt_state (&c->pt, s) == LAYOUT_DIRTY)
        ndirty++;
      loaded++;
      if (ssdcache_debug_recovery)
        log_debug ("slot %u: page %llu seq %llu %s", s,
                   (unsigned long long) pt_page (&c->pt, s),
                   (unsigned long long) pt_seq (&c->pt, s),
                   pt_state (&c->pt, s) == LAYOUT_DIRTY ? "dirty" : "clean");
    }
    i = j;
  }

  for (uint32_t s = c->nslots; s-- > 0;)
    if (!(pt_flags (&c->pt, s) & PT_INDEXED)) {
      pt_set_state (&c->pt, s, LAYOUT_FREE);
      pagetable_put_free (&c->pt, s);
    }
  /* Loading may take more side-table entries than its limit (a smaller
   * ssdcache-partial-pages than before, or entries behind RAM): clean
   * pages holding them go until it is back under it.  Dirty ones stay;
   * they leave the table as writeback cleans them.
   */
  for (uint32_t s = 0;
       s < c->nslots && c->pt.side_used > c->pt.side_limit; s++)
    if ((pt_flags (&c->pt, s) & PT_INDEXED) &&
        pt_state (&c->pt, s) == LAYOUT_CLEAN && pt_maps_side (&c->pt, s)) {
      pagetable_remove (&c->pt, s);
      evict_remove (c->ev, s);
      cache_write_free_entry (c, s);
      pagetable_put_free (&c->pt, s);
      loaded--;
      dropped++;
    }
  if (c->pt.side_used > c->pt.side_limit)
    log_error ("cache file %s: %u dirty pages with partial sector maps, "
               "more than ssdcache-partial-pages=%u: kept (writeback "
               "cleans them)", c->path, c->pt.side_used, c->pt.side_limit);
  /* RAM keeps sequence numbers as change stamps from here on. */
  pagetable_seq_rebase (&c->pt, c->seq);
  atomic_store (&c->stats.partial_maps, c->pt.side_used);
  c->ndirty = ndirty;
  atomic_store (&c->stats.dirty_pages, ndirty);
  STATS_ADD (&c->stats, loaded_slots, loaded);
  STATS_ADD (&c->stats, dropped_entries, dropped);
  STATS_ADD (&c->stats, dirty_dropped, lost);
  STATS_ADD (&c->stats, unsealed_dropped, unsealed);
  if (unsealed && c->was_clean)
    log_error ("cache file %s: %llu unsealed entries in a cache closed "
               "cleanly: dropped", c->path, (unsigned long long) unsealed);
  STATS_ADD (&c->stats, damaged_entries, damaged);
  if (damaged && may_dirty)
    log_error ("cache file %s: DIRTY DATA MAY BE LOST: %llu page-table "
               "entries are damaged (the first: slot %u) and have been "
               "dropped; the cache may have held dirty data, and any that "
               "those entries described is gone: those pages now read as "
               "an older cached copy or the backend's data", c->path,
               (unsigned long long) damaged, first_damaged);
  else if (damaged)
    log_error ("cache file %s: %llu page-table entries are damaged (the "
               "first: slot %u) and have been dropped (the cache held no "
               "dirty data: nothing is lost)", c->path,
               (unsigned long long) damaged, first_damaged);
  if (cut)
    log_error ("cache file %s: %llu cached pages lay past the end of the "
               "truncated file and have been dropped", c->path,
               (unsigned long long) cut);
  log_debug ("cache file %s: %s start, %llu pages loaded (%llu dirty), "
             "%llu dropped, %llu unflushed rewrites dropped", c->path,
             c->was_clean ? "clean" : "unclean (recovered)",
             (unsigned long long) loaded, (unsigned long long) ndirty,
             (unsigned long long) dropped, (unsigned long long) unsealed);
  ret = 0;
 out:
  free (raw);
  free (page_buf);
  free (cand);
  return ret;
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

int
cache_attach (struct cache *c, uint64_t backend_size)
{
  struct layout_sb sb;
  uint32_t data_end = 0;

  c->backend_size = backend_size;
  {
    /* The page table numbers pages with 32 bits (pagetable.h). */
    uint32_t ps = c->have_sb ? c->pool.sb.page_size
      : c->cfg_page_size ? c->cfg_page_size : CACHE_DEFAULT_PAGE;
    uint64_t npages = backend_size / ps + (backend_size % ps != 0);

    if (npages > (uint64_t) PT_MAX_PAGES + 1) {
      log_error ("the backend has %llu pages of %u bytes; the cache handles "
                 "at most %llu pages (16 TiB with 4 KiB pages, 256 TiB with "
                 "64 KiB pages): use a larger ssdcache-page-size",
                 (unsigned long long) npages, ps,
                 (unsigned long long) PT_MAX_PAGES + 1);
      return -1;
    }
  }
  if (c->have_sb && c->pool.sb.backend_size != backend_size) {
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
  }
  if (!c->have_sb) {
    if (format_new (c) == -1)
      return -1;
    c->was_clean = true;
  }
  else {
    /* A damaged superblock copy may have been the newest one: then the
     * survivor's clean flag may be stale.
     */
    c->was_clean = (c->pool.sb.flags & LAYOUT_SB_CLEAN) &&
      !c->pool.sb_damaged;
    if (check_size (c, &data_end) == -1)
      return -1;
  }

  c->page_size = c->pool.sb.page_size;
  c->sector_size = c->pool.sb.sector_size;
  c->nsectors = c->page_size / c->sector_size;
  c->nslots = c->pool.sb.nslots;
  {
    uint8_t none[LAYOUT_MAX_SECTORS / 8] = { 0 };
    uint8_t *zero = calloc (1, c->page_size);
    if (zero == NULL) {
      log_error ("calloc: %m");
      return -1;
    }
    c->zero_page_crc = cache_page_crc (c, zero, none);
    free (zero);
  }

  if (pagetable_init (&c->pt, c->nslots) == -1 ||
      (c->ev = evict_new_policy (c->policy, c->nslots)) == NULL) {
    log_error ("cannot allocate the page table for %u slots", c->nslots);
    return -1;
  }
  pagetable_set_side_limit (&c->pt, c->partial_pages < c->nslots
                            ? c->partial_pages : c->nslots);
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
  if (c->have_sb && load_entries (c, data_end) == -1)
    return -1;

  /* From now on a crash must be noticed at the next start; this also
   * makes the FREE entries written by recovery durable.
   */
  sb = c->pool.sb;
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
cache_writeback_start (struct cache *c, const struct cache_backend *be)
{
  return writeback_start (c, be);
}

int
cache_writeback_all (struct cache *c, const struct cache_backend *be,
                     int *err)
{
  int r;

  /* Busy pages (r == 1) cannot happen without clients, but be safe. */
  for (int tries = 0; tries < 100; tries++) {
    r = writeback_pass (c, be, 0, false, err);
    if (r != 1)
      return r;
  }
  *err = EBUSY;
  return -1;
}

void
cache_writeback_stop (struct cache *c)
{
  writeback_stop (c);
}

void
cache_close (struct cache *c)
{
  if (c == NULL)
    return;
  prefetch_stop (c);
  writeback_stop (c);
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
    if (!cache_stale_settle_all (c))
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
      pool_write_sb (&c->pool, &sb);
    }
  }
  if (c->pool.fd >= 0)
    pool_close (&c->pool);
  if (c->ev)
    evict_free (c->ev);
  if (c->pt.recs)
    pagetable_free (&c->pt);
  rangelock_destroy (&c->ranges);
  pthread_cond_destroy (&c->space);
  pthread_rwlock_destroy (&c->inplace);
  pthread_mutex_destroy (&c->lock);
  free (c->sup);
  free (c->unsealed);
  free (c->stale);
  admit_seq_free (c->seqcut);
  admit_nhit_free (c->nhit);
  free (c->path);
  free (c->id_text);
  free (c);
}
