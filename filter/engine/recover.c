/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: crash recovery (loading the page table).
 *
 * Owns recover_load_entries: every entry whose CRC verifies is a
 * candidate for its backend page, and per page the highest sequence
 * number wins.  After an unclean shutdown the data CRC of a dirty
 * winner must hold (a write torn by the crash was never flushed, so the
 * next older candidate, or the backend, is right): checked at once for
 * a page of several candidates, and on first use for a page of one
 * (c->suspect, fill.c), so that no data is read at start-up; the losers
 * get FREE entries so that they can never come back.  Each step is a
 * function, and they share a struct recovery: parse_entries (1), given
 * the entries read and decoded ahead by another thread (ptread.c), in
 * slot order, indexes the first candidate of each page at once and
 * keeps the others (and unsealed ones) aside in r->cand, so that
 * start-up takes O(n) time and no array the size of the cache;
 * pick_extras (2) sorts the few pages of several and picks their
 * winners, with torn_by_crash and free_loser for each candidate;
 * settle_slots (3), one walk over the slots, settles the pages of one
 * candidate and frees the rest; then trim_side and report.  With
 * ssdcache-writeback-order=flush, the older dirty versions of a dirty
 * winner from earlier flush generations are kept (retain_older) so that
 * writeback can go on in order.  Runs at start-up, before any request,
 * on one thread (the reader of ptread.c only reads the file and
 * decodes); c->lock is still taken where the slot helpers expect it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"
#include "ptread.h"

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
  struct pt_slot v;
  uint32_t crc;

  pagetable_get (&c->pt, s, &v);
  if (defer_read_data (&c->defer, &c->pool, s, buf, c->page_size, 0) == -1 ||
      cache_entry_crc (c, s, &v, &crc) == -1)
    return false;
  return cache_page_crc (c, buf, v.valid) == crc;
}

/* Slot s is the newest usable version of its page, but a newer one was
 * dropped (unsealed or torn).  That newer version may have been written
 * back before the crash, so the backend may be newer than s's clean
 * sectors: they are no longer valid (they will be read from the
 * backend), and a clean s goes altogether.  s's dirty sectors stay: they
 * are the flushed data.  Returns true if s is still to be used.
 */
static bool
older_after_drop (struct cache *c, uint32_t s, uint8_t hint, uint8_t *buf)
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
      cache_entry_crc (c, s, &v, &v.data_crc) == -1 ||
      cache_page_crc (c, buf, v.valid) != v.data_crc) {
    cache_io_error (c, "reading data at recovery", s);
    pt_set_state (&c->pt, s, LAYOUT_FREE);
    cache_write_free_entry (c, s);
    return false;
  }
  memcpy (v.valid, v.dirty, sizeof v.valid);
  pt_maps_set (&c->pt, s, v.valid, v.dirty);
  pt_slot_set_crc (&v, cache_page_crc (c, buf, v.valid));
  v.seq = ++c->seq;
  pt_set_seq (&c->pt, s, v.seq);
  pagetable_to_entry (&v, &e);
  e.hint = hint;
  if (pool_write_entry (&c->pool, s, &e) == -1) {
    cache_io_error (c, "writing entry at recovery", s);
    return false;
  }
  return true;
}

/* What the steps of recover_load_entries share. */
struct recovery {
  struct cache *c;
  uint32_t data_end;             /* slots from here on have no data */
  uint64_t npages;               /* the backend's */
  bool ptinit;                   /* every entry was written at format */
  bool may_dirty;                /* the cache may have held dirty data */
  uint8_t *page_buf;             /* one page */
  struct cand *cand;             /* the extra candidates (add_cand) */
  uint64_t ncand, cand_cap;
  /* Counted for the statistics and the log. */
  uint64_t loaded, dropped, lost, ndirty, unsealed, damaged, cut, retained;
  uint64_t gen_max;              /* newest flush generation of dirty data */
  uint32_t first_damaged;
  uint64_t t[4];                 /* times of the steps, ms (report) */
};

/* Keep a candidate aside in r->cand.  Returns -1 (logged) on ENOMEM. */
static int
push_cand (struct recovery *r, uint64_t page, uint64_t seq, uint32_t s,
           uint8_t hint, bool unsealed)
{
  struct cand *x;

  if (r->ncand == r->cand_cap) {
    uint64_t cap = r->cand_cap ? 2 * r->cand_cap : 1024;

    x = realloc (r->cand, cap * sizeof *x);
    if (x == NULL) {
      log_error ("cache file %s: loading the page table: %m", r->c->path);
      return -1;
    }
    r->cand = x;
    r->cand_cap = cap;
  }
  x = &r->cand[r->ncand++];
  x->page = page;
  x->seq = seq;
  x->slot = s;
  x->hint = hint;
  x->unsealed = unsealed;
  return 0;
}

/* A candidate for a page that has none yet goes into the index (and
 * the policy, with its hint) at once: settle_slots settles it if it
 * stays its page's only one.  Others go aside for pick_extras.
 * Returns -1 (logged) on ENOMEM.
 */
static int
add_cand (struct recovery *r, const struct layout_entry *e, uint32_t s,
          uint8_t hint, bool unsealed)
{
  struct cache *c = r->c;

  if (unsealed || pagetable_lookup (&c->pt, e->page) != PT_NONE)
    return push_cand (r, e->page, e->seq, s, hint, unsealed);
  pagetable_insert (&c->pt, s, e->page);
  evict_insert_hint (c->ev, s, hint);
  return 0;
}

/* The entry raw of slot s fails its checks.  All zeroes is an unused
 * slot, unless every entry was written when the cache was made;
 * anything else is damaged and dropped.
 */
static void
parse_damaged (struct recovery *r, uint32_t s, const uint8_t *raw)
{
  bool zero = true;

  for (int b = 0; b < LAYOUT_ENTRY_SIZE; b++)
    zero &= raw[b] == 0;
  if (zero && !r->ptinit)
    return;
  if (r->damaged++ == 0)
    r->first_damaged = s;
  r->dropped++;
  if (ssdcache_debug_recovery)
    log_debug ("slot %u: entry fails its checks: dropped", s);
  /* (Freed, so that it is reported once, not at every start.) */
  cache_write_free_entry (r->c, s);
}

/* Slot s's metadata from its entry e (generation gen), in the stored
 * form img the reader made if there is one.  Returns false if its maps
 * cannot be stored (the slot is then left FREE).
 */
static bool
load_slot (struct pagetable *pt, uint32_t s, const struct layout_entry *e,
           uint64_t gen, const struct pt_rec *img)
{
  struct layout_entry copy;

  if (img) {
    pagetable_load_rec (pt, s, img, gen);
    return true;
  }
  copy = *e;
  copy.gen = gen;
  return pagetable_from_entry (pt, s, &copy);
}

/* Entry e of slot s is past what the cache can hold now: dropped.
 * Returns true if it was (the caller is done with it).
 */
static bool
drop_outside (struct recovery *r, uint32_t s, const struct layout_entry *e)
{
  struct cache *c = r->c;

  if (e->page >= r->npages) {
    r->dropped++;
    return true;
  }
  if (s < r->data_end)
    return false;
  /* Its data was cut off with the end of the file. */
  r->cut++;
  r->dropped++;
  if (e->state == LAYOUT_DIRTY) {
    r->lost++;
    cache_log_dirty_lost (c, s, e->page, "lay past the end of the "
                          "truncated cache file");
  }
  cache_write_free_entry (c, s);
  return true;
}

/* The entry raw of slot s, decoded (ptread.c) as *e, or NULL if it
 * failed its checks, with its stored form img (or NULL): it becomes a
 * candidate (its metadata parked in the slot, not indexed yet), or is
 * dropped.  Returns -1 (logged) if the cache cannot be opened.
 */
static int
parse_entry (struct recovery *r, uint32_t s, const uint8_t *raw,
             const struct layout_entry *e, const struct pt_rec *img)
{
  struct cache *c = r->c;
  uint64_t gen;

  if (e == NULL || e->seq > PT_LOADED_SEQ_MAX) {
    /* (A number past 2^48, nine years of a million entry writes a
     * second, does not fit where the loader keeps it: pt_loaded_seq.)
     */
    parse_damaged (r, s, raw);
    return 0;
  }
  gen = e->gen;
  if (e->state == LAYOUT_DIRTY) {
    if (gen == 0)
      gen = 1;                  /* made before generations were kept */
    if (gen > r->gen_max)
      r->gen_max = gen;
  }
  if (e->seq > c->seq)
    c->seq = e->seq;
  if (e->state == LAYOUT_FREE)
    return 0;
  if (e->flags & LAYOUT_ENT_UNSEALED) {
    /* Dirty data rewritten in place after the last flush: it cannot be
     * verified, and need not survive a crash.  It stays a candidate
     * only to tell that a newer version existed.
     */
    r->unsealed++;
    if (ssdcache_debug_recovery)
      log_debug ("slot %u: page %llu unsealed (not flushed): dropped",
                 s, (unsigned long long) e->page);
    return e->page < r->npages ? add_cand (r, e, s, 0, true) : 0;
  }
  if (drop_outside (r, s, e))
    return 0;
  if (!load_slot (&c->pt, s, e, gen, img)) {
    /* Maps beyond the side table, and no memory to grow it. */
    if (e->state == LAYOUT_DIRTY) {
      log_error ("cache file %s: slot %u: no memory for the sector "
                 "maps of dirty page %llu: not opening the cache",
                 c->path, s, (unsigned long long) e->page);
      return -1;
    }
    r->dropped++;
    cache_write_free_entry (c, s);
    return 0;
  }
  return add_cand (r, e, s, e->hint, false);
}

/* Lookups (add_cand) go to random places of an index far larger than
 * the CPU's caches: the bucket of the entry RECOVER_AHEAD2 ahead and
 * the first slot of the chain of the one RECOVER_AHEAD ahead are
 * prefetched, so that several misses are in flight at once.
 */
#define RECOVER_AHEAD 16
#define RECOVER_AHEAD2 32

static inline void
prefetch_ahead (struct recovery *r, const struct ptread_chunk *k,
                uint64_t j)
{
  struct pagetable *pt = &r->c->pt;

  if (j + RECOVER_AHEAD2 < k->n && !k->bad[j + RECOVER_AHEAD2])
    pagetable_prefetch_bucket (pt, k->ents[j + RECOVER_AHEAD2].page);
  if (j + RECOVER_AHEAD < k->n && !k->bad[j + RECOVER_AHEAD])
    pagetable_prefetch_chain (pt, k->ents[j + RECOVER_AHEAD].page);
}

/* The entries of chunk k, decoded, in slot order.  Returns -1 (logged)
 * if the cache cannot be opened.
 */
static int
parse_chunk (struct recovery *r, const struct ptread_chunk *k)
{
  for (uint64_t j = 0; j < k->n; j++) {
    prefetch_ahead (r, k, j);
    if (parse_entry (r, k->base + j, k->raw + j * LAYOUT_ENTRY_SIZE,
                     k->bad[j] ? NULL : &k->ents[j],
                     k->has_img[j] ? &k->imgs[j] : NULL) == -1)
      return -1;
  }
  return 0;
}

/* Step 1, parse: the entries a chunk at a time, read and decoded
 * ahead on another thread (ptread.c), collecting the candidates.
 * Returns -1 (logged) on failure.
 */
static int
parse_entries (struct recovery *r)
{
  struct ptread *t = ptread_start (r->c);
  const struct ptread_chunk *k;
  int err = 0;

  if (t == NULL)
    return -1;
  while (err == 0 && (k = ptread_next (t, &err)) != NULL)
    err = parse_chunk (r, k);
  ptread_stop (t);
  return err;
}

/* Dirty data checked: after an unclean shutdown, a dirty
 * candidate about to win must have data that matches its checksum.
 * Returns true if slot s was torn by the crash and is now freed.
 */
static bool
torn_by_crash (struct recovery *r, uint32_t s)
{
  struct cache *c = r->c;

  if (pt_state (&c->pt, s) != LAYOUT_DIRTY || c->was_clean ||
      data_verifies (c, s, r->page_buf))
    return false;
  /* It was never flushed (flushed dirty data is never rewritten in
   * place).
   */
  r->lost++;
  cache_log_dirty_lost (c, s, pt_page (&c->pt, s), CACHE_TORN_WHY);
  pt_set_state (&c->pt, s, LAYOUT_FREE);
  cache_write_free_entry (c, s);
  return true;
}

/* A loser: slot s holds an older version than its page's
 * winner; a FREE entry makes sure it can never come back.
 */
static void
free_loser (struct recovery *r, uint32_t s)
{
  struct cache *c = r->c;

  pt_set_state (&c->pt, s, LAYOUT_FREE);
  cache_write_free_entry (c, s);
  r->dropped++;
}

/* Indexed slot s has won its page; its data was checked if verified
 * (then, with c->verify, it is still checked on first use: its clean
 * sectors against the backend).
 */
static void
finish_winner (struct recovery *r, uint32_t s, bool verified)
{
  struct cache *c = r->c;

  pt_set_flags (&c->pt, s, PT_INDEXED |
                (verified && !c->verify ? PT_VERIFIED : 0));
  pt_set_epoch (&c->pt, s, 0);
  if (pt_state (&c->pt, s) == LAYOUT_DIRTY)
    r->ndirty++;
  r->loaded++;
  if (ssdcache_debug_recovery)
    log_debug ("slot %u: page %llu seq %llu %s", s,
               (unsigned long long) pt_page (&c->pt, s),
               (unsigned long long) pt_seq (&c->pt, s),
               pt_state (&c->pt, s) == LAYOUT_DIRTY ? "dirty" : "clean");
}

/* Candidate k has won its page: index it. */
static void
take_winner (struct recovery *r, uint64_t k)
{
  struct cache *c = r->c;
  uint32_t s = r->cand[k].slot;

  pagetable_insert (&c->pt, s, pt_page (&c->pt, s));
  evict_insert_hint (c->ev, s, r->cand[k].hint);   /* hot stays hot */
  finish_winner (r, s, pt_state (&c->pt, s) == LAYOUT_DIRTY &&
                 !c->was_clean);
}

/* The flush order: slot s, an older version of a page whose newer
 * version succ is dirty, holds dirty data of an earlier flush
 * generation that may not be on the backend yet.  Keep it, superseded
 * and retained, so that writeback writes it first (order.c).  Returns
 * false if it cannot be kept (then it and every older one go).
 */
static bool
retain_older (struct recovery *r, uint32_t s, uint32_t succ)
{
  struct cache *c = r->c;

  if (c->wbcfg.order != CACHE_ORDER_FLUSH ||
      pt_state (&c->pt, s) != LAYOUT_DIRTY ||
      pt_state (&c->pt, succ) != LAYOUT_DIRTY ||
      pt_gen (&c->pt, s) >= pt_gen (&c->pt, succ))
    return false;
  if (!data_verifies (c, s, r->page_buf)) {
    log_error ("cache file %s: an older version of page %llu (slot %u) "
               "fails its checksum: the backend alone will not match a "
               "flush point for that page", c->path,
               (unsigned long long) pt_page (&c->pt, s), s);
    STATS_ADD (&c->stats, order_broken, 1);
    return false;
  }
  pthread_mutex_lock (&c->lock);
  if (!cache_sup_add_locked (c, s, succ)) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  pthread_mutex_unlock (&c->lock);
  pt_set_flags (&c->pt, s, PT_SUPERSEDED | PT_VERIFIED);
  pt_set_epoch (&c->pt, s, 0);
  pt_flags_on (&c->pt, succ, PT_HASPRED);
  c->nretained++;
  r->retained++;
  if (ssdcache_debug_order || ssdcache_debug_recovery)
    log_debug ("slot %u: page %llu: older version of flush generation %llu "
               "kept for the flush order", s,
               (unsigned long long) pt_page (&c->pt, s),
               (unsigned long long) pt_gen (&c->pt, s));
  return true;
}

/* Pick the winner of one page of several candidates (cand[i, j),
 * newest first): the newest whose data holds up (torn_by_crash) wins,
 * and the older ones get FREE entries (free_loser), one candidate at a
 * time.
 */
static void
pick_page (struct recovery *r, uint64_t i, uint64_t j)
{
  bool won = false, newer_dropped = false, keep = true;
  uint32_t newer = PT_NONE;     /* the last version kept */

  for (uint64_t k = i; k < j; k++) {
    uint32_t s = r->cand[k].slot;

    if (r->cand[k].unsealed) {
      newer_dropped |= !won;
      continue;
    }
    if (!won && torn_by_crash (r, s)) {
      newer_dropped = true;
      continue;
    }
    if (won) {
      if (keep && newer != PT_NONE && retain_older (r, s, newer))
        newer = s;
      else {
        keep = false;           /* older ones are older still */
        free_loser (r, s);
      }
      continue;
    }
    won = true;
    if (newer_dropped &&
        !older_after_drop (r->c, s, r->cand[k].hint, r->page_buf)) {
      r->dropped++;
      keep = false;
      continue;
    }
    take_winner (r, k);
    newer = s;
  }
}

/* Sort the candidates set aside by page, newest first.  (Not when
 * there are none: r->cand may be NULL, which qsort must not be given.)
 */
static void
sort_cands (struct recovery *r)
{
  if (r->ncand > 1)
    qsort (r->cand, r->ncand, sizeof *r->cand, cmp_cand);
}

/* Is page one of those with several candidates (r->cand sorted)? */
static bool
has_extras (const struct recovery *r, uint64_t page)
{
  uint64_t lo = 0, hi = r->ncand;

  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;

    if (r->cand[mid].page < page)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < r->ncand && r->cand[lo].page == page;
}

/* Slot s's dirty data is checked on first use (fill.c), not now: a
 * restart after a crash reads no data.  Returns -1 (logged) on ENOMEM.
 */
static int
suspect (struct recovery *r, uint32_t s)
{
  struct cache *c = r->c;

  if (c->suspect == NULL) {
    c->suspect = calloc ((c->nslots + 63) / 64, sizeof *c->suspect);
    if (c->suspect == NULL) {
      log_error ("cache file %s: loading the page table: %m", c->path);
      return -1;
    }
  }
  c->suspect[s / 64] |= UINT64_C (1) << (s % 64);
  return 0;
}

/* Step 2: the pages with several candidates (r->cand sorted).  The
 * one parse_entries indexed joins the others, then each page's
 * candidates, newest first, go to pick_page.  Returns -1 (logged) on
 * ENOMEM.
 */
static int
pick_extras (struct recovery *r)
{
  struct cache *c = r->c;
  uint64_t n = r->ncand;

  for (uint64_t i = 0; i < n; i++) {
    uint32_t s;

    if (i > 0 && r->cand[i].page == r->cand[i - 1].page)
      continue;
    s = pagetable_lookup (&c->pt, r->cand[i].page);
    if (s == PT_NONE)
      continue;
    if (push_cand (r, r->cand[i].page, pt_loaded_seq (&c->pt, s), s,
                   evict_slot_hint (c->ev, s), false) == -1)
      return -1;
    evict_remove (c->ev, s);
    pagetable_remove (&c->pt, s);
  }
  sort_cands (r);
  for (uint64_t i = 0; i < r->ncand;) {
    uint64_t j = i;

    while (j < r->ncand && r->cand[j].page == r->cand[i].page)
      j++;
    pick_page (r, i, j);
    i = j;
  }
  return 0;
}

/* Step 3, one walk over the slots.  A page whose only candidate
 * parse_entries indexed wins with it (pick_extras settled the others).
 * After an unclean shutdown its dirty data may have been torn by the
 * crash: that is checked on first use (suspect), as torn_by_crash does
 * for the pages of several candidates.  Every slot not indexed (nor
 * retained) is free.  Returns -1 (logged) on ENOMEM.
 */
static int
settle_slots (struct recovery *r)
{
  struct cache *c = r->c;

  for (uint32_t s = c->nslots; s-- > 0;) {
    pt_set_seq (&c->pt, s, 0);  /* the base (no pt_loaded_seq any more) */
    if (pt_flags (&c->pt, s) & PT_INDEXED) {
      if (r->ncand && has_extras (r, pt_page (&c->pt, s)))
        continue;
      if (pt_state (&c->pt, s) == LAYOUT_DIRTY && !c->was_clean &&
          suspect (r, s) == -1)
        return -1;
      finish_winner (r, s, false);
    }
    else if (!cache_retained_locked (c, s)) {
      pt_set_state (&c->pt, s, LAYOUT_FREE);
      pagetable_put_free (&c->pt, s);
    }
  }
  return 0;
}

/* Loading may take more side-table entries than its limit (a smaller
 * ssdcache-partial-pages than before, or entries behind RAM): clean
 * pages holding them go until it is back under it.  Dirty ones stay;
 * they leave the table as writeback cleans them.
 */
static void
trim_side (struct recovery *r)
{
  struct cache *c = r->c;

  for (uint32_t s = 0;
       s < c->nslots && c->pt.side_used > c->pt.side_limit; s++)
    if ((pt_flags (&c->pt, s) & PT_INDEXED) &&
        pt_state (&c->pt, s) == LAYOUT_CLEAN && pt_maps_side (&c->pt, s)) {
      pagetable_remove (&c->pt, s);
      evict_remove (c->ev, s);
      cache_write_free_entry (c, s);
      pagetable_put_free (&c->pt, s);
      r->loaded--;
      r->dropped++;
    }
  if (c->pt.side_used > c->pt.side_limit)
    log_error ("cache file %s: %u dirty pages with partial sector maps, "
               "more than ssdcache-partial-pages=%u: kept (writeback "
               "cleans them)", c->path, c->pt.side_used, c->pt.side_limit);
}

/* The counters, and what recovery dropped, in the log. */
static void
report (struct recovery *r)
{
  struct cache *c = r->c;

  atomic_store (&c->stats.partial_maps, c->pt.side_used);
  c->ndirty = r->ndirty;
  atomic_store (&c->stats.dirty_pages, r->ndirty);
  STATS_ADD (&c->stats, loaded_slots, r->loaded);
  STATS_ADD (&c->stats, dropped_entries, r->dropped);
  STATS_ADD (&c->stats, dirty_dropped, r->lost);
  STATS_ADD (&c->stats, unsealed_dropped, r->unsealed);
  if (r->unsealed && c->was_clean)
    log_error ("cache file %s: %llu unsealed entries in a cache closed "
               "cleanly: dropped", c->path, (unsigned long long) r->unsealed);
  STATS_ADD (&c->stats, damaged_entries, r->damaged);
  if (r->damaged && r->may_dirty)
    log_error ("cache file %s: DIRTY DATA MAY BE LOST: %llu page-table "
               "entries are damaged (the first: slot %u) and have been "
               "dropped; the cache may have held dirty data, and any that "
               "those entries described is gone: those pages now read as "
               "an older cached copy or the backend's data", c->path,
               (unsigned long long) r->damaged, r->first_damaged);
  else if (r->damaged)
    log_error ("cache file %s: %llu page-table entries are damaged (the "
               "first: slot %u) and have been dropped (the cache held no "
               "dirty data: nothing is lost)", c->path,
               (unsigned long long) r->damaged, r->first_damaged);
  if (r->cut)
    log_error ("cache file %s: %llu cached pages lay past the end of the "
               "truncated file and have been dropped", c->path,
               (unsigned long long) r->cut);
  log_debug ("cache file %s: %s start, %llu pages loaded (%llu dirty), "
             "%llu dropped, %llu unflushed rewrites dropped, %llu older "
             "versions kept for the flush order; in %llu ms (read and "
             "index %llu, several versions %llu, the rest %llu)", c->path,
             c->was_clean ? "clean" : "unclean (recovered)",
             (unsigned long long) r->loaded, (unsigned long long) r->ndirty,
             (unsigned long long) r->dropped,
             (unsigned long long) r->unsealed,
             (unsigned long long) r->retained,
             (unsigned long long) (r->t[3] - r->t[0]),
             (unsigned long long) (r->t[1] - r->t[0]),
             (unsigned long long) (r->t[2] - r->t[1]),
             (unsigned long long) (r->t[3] - r->t[2]));
}

/* Load the page table.  Slots at or past data_end have no data any
 * more (the file was cut short): their entries are dropped.
 */
int
recover_load_entries (struct cache *c, uint32_t data_end)
{
  struct recovery r = {
    .c = c,
    .data_end = data_end,
    .npages = (c->backend_size + c->page_size - 1) / c->page_size,
    .ptinit = c->pool.sb.flags & LAYOUT_SB_PTINIT,
    .may_dirty = c->pool.sb.flags & LAYOUT_SB_DIRTY,
  };
  int ret = -1;

  r.page_buf = malloc (c->page_size);
  if (r.page_buf == NULL) {
    log_error ("malloc: %m");
    goto out;
  }
  r.t[0] = cache_now_ms ();
  pagetable_clear_free (&c->pt);
  if (parse_entries (&r) == -1)
    goto out;
  r.t[1] = cache_now_ms ();
  /* Generations read back relative to the newest (pagetable.h). */
  if (r.gen_max + 1 > c->gen)
    c->gen = r.gen_max + 1;
  c->pt.gen_ref = c->gen;
  sort_cands (&r);
  if (pick_extras (&r) == -1)
    goto out;
  r.t[2] = cache_now_ms ();
  /* RAM keeps sequence numbers as change stamps from here on: every
   * slot's becomes c->seq (settle_slots sets each).
   */
  pagetable_seq_restart (&c->pt, c->seq);
  if (settle_slots (&r) == -1)
    goto out;
  trim_side (&r);
  /* Every indexed slot's hint is its entry's (save_hints). */
  evict_hints_saved (c->ev, 0, c->nslots);
  r.t[3] = cache_now_ms ();
  report (&r);
  ret = 0;
 out:
  free (r.page_buf);
  free (r.cand);
  return ret;
}
