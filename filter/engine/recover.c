/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: crash recovery (loading the page table).
 *
 * Owns recover_load_entries: every entry whose CRC verifies is a candidate for
 * its backend page, and per page the highest sequence number wins.
 * After an unclean shutdown the data CRC of dirty winners is checked at
 * once (a write torn by the crash was never flushed, so the next older
 * candidate, or the backend, is right); the losers get FREE entries so
 * that they can never come back.  Runs single-threaded at start-up,
 * before any request; c->lock is still taken where the slot helpers
 * expect it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

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

  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1)
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
  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1 ||
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
int
recover_load_entries (struct cache *c, uint32_t data_end)
{
  const uint64_t npages = (c->backend_size + c->page_size - 1) / c->page_size;
  const bool ptinit = c->pool.sb.flags & LAYOUT_SB_PTINIT;
  const bool may_dirty = c->pool.sb.flags & LAYOUT_SB_DIRTY;
  uint8_t *raw = malloc ((size_t) CACHE_LOAD_CHUNK * LAYOUT_ENTRY_SIZE);
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
  for (uint64_t base = 0; base < c->nslots; base += CACHE_LOAD_CHUNK) {
    uint64_t n = c->nslots - base < CACHE_LOAD_CHUNK ? c->nslots - base : CACHE_LOAD_CHUNK;

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
