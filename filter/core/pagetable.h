/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the in-RAM page table (pure: no I/O, no nbdkit).
 *
 * Owns the per-slot metadata mirrored from the on-SSD entries and the
 * index from backend page number to slot (a chained hash table sized by
 * the cache, never by the backend), plus the free-slot list and the
 * side table of sector maps that are not runs.
 *
 * Slots are stored compactly (struct pt_rec, 20 bytes, plus a 4-byte
 * bucket per two slots: 22 bytes a slot, and 4 more with generations;
 * pagetable.c says how).  The
 * rest of the filter reads and changes them only through the accessors
 * below, and reads a whole slot as a value (struct pt_slot) with
 * pagetable_get.  Limits that come with the compact form: backend page
 * numbers up to PT_MAX_PAGES (40 bits); sequence numbers are change
 * stamps (an old one may read higher than it was, never lower); epochs
 * are exact above a base, and compare exactly with the epochs the cache
 * uses (pt_set_epoch); sector maps that are not runs need one of a
 * bounded number of side entries.
 *
 * Locking: none inside.  Every function must be called with the owning
 * cache's metadata lock held (c->lock: the lock table in
 * docs/design.md).  Critical sections are short: no function here
 * does I/O.  A rebase walks the 4,096 slots of one group, once per
 * about 2^31 sequence numbers or 2^15 sync epochs of that group.
 */
#ifndef SSDCACHE_PAGETABLE_H
#define SSDCACHE_PAGETABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "budget.h"
#include "layout.h"

#define PT_NONE UINT32_MAX
#define PT_EPOCH_PENDING UINT64_MAX

/* Slot flags (RAM only). */
#define PT_INDEXED   0x01   /* reachable through the index */
#define PT_VERIFIED  0x02   /* data CRC checked since the cache was opened */
#define PT_ORPHAN    0x04   /* removed from the index while pinned */
#define PT_UNSEALED  0x08   /* no checksum holds: data rewritten in place
                               since the last flush (the entry says
                               LAYOUT_ENT_UNSEALED) */
#define PT_PREFETCHED 0x100 /* filled by readahead, not read by a client
                               since */
#define PT_EVICTED   0x200  /* taken by eviction: its on-disk entry still
                               describes the page evicted */
#define PT_BAD       0x10   /* dirty data failed its CRC: reads get EIO */
#define PT_SUPERSEDED 0x20  /* a newer slot holds this page; freed once
                               the newer one is durable */
#define PT_HASPRED   0x40   /* an older, superseded slot for this page is
                               still on disk (not yet freed) */
#define PT_LISTED    0x80   /* on the cache's list of unsealed slots */
/* In a struct pt_slot only (never stored): data_crc holds the page's
 * checksum.  The table keeps no checksums (its entry on disk does):
 * pagetable_get leaves it clear, and whoever builds an entry to write
 * sets it (pt_slot_set_crc) from data or from the entry on disk.
 */
#define PT_CRC_KNOWN 0x8000

/* A slot's metadata as one value: what callers read with
 * pagetable_get and hand to cache_commit_entry.  The table itself
 * stores it in another form; only the accessors below touch that.
 */
struct pt_slot {
  uint64_t page;                      /* backend page number */
  uint64_t seq;                       /* sequence number of the entry */
  uint64_t epoch;                     /* cache sync epoch of the last write
                                         (PT_EPOCH_PENDING: in flight) */
  uint64_t gen;                       /* flush generation of its dirty data:
                                         client flushes begun before its
                                         last write, plus one */
  uint32_t data_crc;                  /* if flags has PT_CRC_KNOWN */
  uint32_t pins;                      /* users currently doing I/O on it */
  uint16_t flags;                     /* PT_* */
  uint8_t state;                      /* enum layout_state */
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
};

/* The stored form of a slot: 20 bytes, see pagetable.c. */
struct __attribute__ ((__packed__)) pt_rec {
  uint32_t page;                      /* backend page number, low 32 bits */
  uint8_t page_hi;                    /* ... and the 8 above them */
  uint32_t next;                      /* hash chain, or free list link */
  uint32_t seq;                       /* seq - its group's seq base (0: at
                                         or before) */
  uint16_t epoch;                     /* epoch - its group's epoch base,
                                         or PT_REL_* */
  uint64_t flags : 10;                /* PT_* */
  uint64_t state : 2;                 /* enum layout_state */
  uint64_t map : 28;                  /* valid and dirty runs, or a
                                         side-table index (pagetable.c) */
};

#define PT_MAX_PAGES   ((UINT64_C (1) << 40) - 1) /* backend pages the
                                                     table can number */
#define PT_REL_PENDING UINT16_MAX       /* stored epoch: write in flight */
#define PT_REL_UNKNOWN (UINT16_MAX - 1) /* stored epoch: not known (see
                                           pt_epoch_may_be_at_most) */
#define PT_REL_MID     (UINT16_MAX - 2) /* stored epoch: above the group's
                                           split, at most its base */
#define PT_LOADED_SEQ_MAX ((UINT64_C (1) << 48) - 1) /* pt_loaded_seq */
#define PT_SIDE_MAX    (8001u * 16384u) /* side-table indexes a map can name */

/* Exact valid and dirty maps of a slot whose maps are not two runs. */
struct pt_side {
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
};

struct pagetable {
  uint32_t nslots;
  struct pt_rec *recs;
  uint32_t *buckets;
  uint32_t nbuckets;                  /* about nslots / 2 */
  uint32_t free_head;
  uint32_t nfree;
  uint32_t nindexed;
  /* Sequence numbers and epochs are kept relative to the bases of the
   * slot's group of 1 << base_shift slots, which move up one group at a
   * time (a walk of 4,096 slots by default, so that no rebase holds the
   * caller's lock for long): see pt_set_seq and pt_set_epoch.
   */
  struct pt_base { uint64_t seq, epoch, split; } *bases;
  unsigned base_shift;
  uint64_t epoch_floor;               /* a group's epoch base may move up
                                         to this (pagetable_epoch_floor) */
  uint64_t epoch_ceiling;             /* no epoch compared with is above
                                         it, but newer ones
                                         (pagetable_epoch_ceiling) */
  uint32_t seq_span, epoch_span;      /* relative values kept below these */
  _Atomic uint64_t *rebases;          /* counts group rebases, or NULL */
  /* Side table: maps that are not a run each (a bounded number). */
  struct pt_side *side;
  uint32_t side_cap;                  /* entries allocated */
  uint32_t side_limit;                /* entries that may be taken (the
                                         bound; only loading may exceed it) */
  uint32_t side_used;
  uint32_t side_free;                 /* free list (through valid[0..3]) */
  uint64_t side_full;                 /* times a map did not fit */
  /* Pin counts, for the few slots that have any: a hash of slot
   * numbers (open addressing, linear probing, at most half full).
   */
  struct pt_pin { uint32_t slot, n; } *pinv;
  uint32_t pin_mask;                  /* capacity - 1, a power of 2 */
  uint32_t pin_used;
  /* A space budget shared with other page tables (NULL: none): slots
   * off the free list are charged unit bytes each.
   */
  struct budget *budget;
  uint32_t budget_unit;
  /* Flush generations, if kept (pagetable_keep_gens; else NULL and
   * every slot's reads as 0): the low 32 bits of each slot's, read back
   * as the nearest value at or below gen_ref (the cache's current one).
   */
  uint32_t *gens;
  uint64_t gen_ref;
  /* Slots whose dirty data the backend still lacks, counted per
   * generation (ptgens.c; pagetable_count_pending turns it on): the
   * flush order asks for the oldest such generation at every step, and
   * must not scan the slots for it.
   */
  struct pt_gcount *pend;             /* sorted by gen, from pend_lo */
  uint32_t pend_lo, pend_len, pend_cap;
  bool pend_on;                       /* counting */
  bool pend_lost;                     /* an allocation failed: scan */
};

/* A slot is pending (its dirty data not yet on the backend, counted in
 * pt->pend) if it is dirty, indexed or superseded (kept for the flush
 * order), and not bad.
 */
struct pt_gcount {
  uint64_t gen;
  uint32_t n;
};
struct pt_pend_mark {
  bool was;
  uint64_t gen;
};
extern struct pt_pend_mark pagetable_pend_mark (const struct pagetable *pt,
                                                uint32_t s);
extern void pagetable_pend_note (struct pagetable *pt, uint32_t s,
                                 struct pt_pend_mark m);
/* Count from now on (after loading, once gen_ref is final; one scan). */
extern void pagetable_count_pending (struct pagetable *pt);
/* The oldest generation of a pending slot, or UINT64_MAX. */
extern uint64_t pagetable_oldest_pending (struct pagetable *pt);
/* How many slots of it are counted (0 when not counting). */
extern uint32_t pagetable_oldest_pending_count (const struct pagetable *pt);
/* The same by a scan of every slot (what the counts must equal). */
extern uint64_t pagetable_scan_oldest_pending (const struct pagetable *pt);
/* Do the counts match a scan?  (For tests.) */
extern bool pagetable_pending_consistent (const struct pagetable *pt);

/* Test hooks: when non-zero, pagetable_init uses these spans and this
 * group size (log2) instead of the defaults (so that tests can force
 * many rebases, in many groups).
 */
extern uint32_t pagetable_test_seq_span, pagetable_test_epoch_span;
extern unsigned pagetable_test_base_shift;

/* Accessors: the only code that knows how a slot is stored. */
static inline uint64_t
pt_page (const struct pagetable *pt, uint32_t s)
{
  return (uint64_t) pt->recs[s].page_hi << 32 | pt->recs[s].page;
}
/* Set the page of a slot that is not indexed. */
static inline void
pt_set_page (struct pagetable *pt, uint32_t s, uint64_t page)
{
  pt->recs[s].page = (uint32_t) page;
  pt->recs[s].page_hi = (uint8_t) (page >> 32);
}
static inline uint8_t
pt_state (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].state;
}
/* (Changes to state, flags and generation keep pt->pend in step.) */
static inline void
pt_set_state (struct pagetable *pt, uint32_t s, uint8_t state)
{
  struct pt_pend_mark m;

  if (!pt->pend_on) {
    pt->recs[s].state = state;
    return;
  }
  m = pagetable_pend_mark (pt, s);
  pt->recs[s].state = state;
  pagetable_pend_note (pt, s, m);
}
static inline uint16_t
pt_flags (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].flags;
}
static inline void
pt_set_flags (struct pagetable *pt, uint32_t s, uint16_t flags)
{
  struct pt_pend_mark m;

  if (!pt->pend_on) {
    pt->recs[s].flags = flags;
    return;
  }
  m = pagetable_pend_mark (pt, s);
  pt->recs[s].flags = flags;
  pagetable_pend_note (pt, s, m);
}
static inline void
pt_flags_on (struct pagetable *pt, uint32_t s, uint16_t f)
{
  pt_set_flags (pt, s, pt->recs[s].flags | f);
}
static inline void
pt_flags_off (struct pagetable *pt, uint32_t s, uint16_t f)
{
  pt_set_flags (pt, s, pt->recs[s].flags & ~f);
}
/* Users doing I/O on slot s (pt->pinv). */
extern unsigned pt_pins_find (const struct pagetable *pt, uint32_t s);
static inline unsigned
pt_pins (const struct pagetable *pt, uint32_t s)
{
  return pt->pin_used == 0 ? 0 : pt_pins_find (pt, s);
}
extern void pt_pin (struct pagetable *pt, uint32_t s);
/* Returns the pins left. */
extern unsigned pt_unpin (struct pagetable *pt, uint32_t s);
/* The slot's sequence number as a change stamp: it grows with every
 * change (pt_set_seq), but one older than the last rebase reads as the
 * base.  (Entries on disk always get a fresh c->seq, never this.)
 */
static inline struct pt_base *
pt_base_of (const struct pagetable *pt, uint32_t s)
{
  return &pt->bases[s >> pt->base_shift];
}
static inline uint64_t
pt_seq (const struct pagetable *pt, uint32_t s)
{
  return pt_base_of (pt, s)->seq + pt->recs[s].seq;
}
/* For a loader about to set every slot's sequence number (pt_set_seq)
 * to base or below: move every group's base to base, in O(groups),
 * without a walk over the slots; a slot reads as base once it is set,
 * and is meaningless until then.
 */
extern void pagetable_seq_restart (struct pagetable *pt, uint64_t base);
extern void pagetable_group_seq_rebase (struct pagetable *pt, uint32_t g,
                                        uint64_t base);
/* seq must be >= every earlier value stored (c->seq grows). */
static inline void
pt_set_seq (struct pagetable *pt, uint32_t s, uint64_t seq)
{
  struct pt_base *b = pt_base_of (pt, s);

  if (seq < b->seq)
    seq = b->seq;
  if (seq - b->seq >= pt->seq_span)
    pagetable_group_seq_rebase (pt, s >> pt->base_shift,
                                seq - pt->seq_span / 2);
  pt->recs[s].seq = (uint32_t) (seq - b->seq);
}
/* Epochs.  A stored epoch is exact when it lies above its group's
 * base.  At or below the base only its side of the group's split is
 * kept (0: at most the split; PT_REL_MID: above it).  The base moves
 * up to the floor when it can (pagetable_epoch_floor: the cache
 * compares with no epoch below it), and then the split is the base:
 * every comparison is exact.  When the floor stays behind (no client
 * flush while writeback syncs the cache), the base moves past it and
 * the split is the ceiling then (pagetable_epoch_ceiling: the newest
 * epoch the cache compares with, c->flushing_epoch), so comparisons
 * with the ceiling stay exact (the copy on write of a dirty page asks
 * "may it be <= c->flushing_epoch"), and those with older epochs may
 * answer "maybe" (may: true, surely: false), never wrong.
 * PT_EPOCH_UNKNOWN is kept as "unknown".
 */
extern void pt_set_epoch (struct pagetable *pt, uint32_t s, uint64_t epoch);
/* The epoch if it lies above the base, else an upper bound (the split
 * or the base); or PT_EPOCH_PENDING, or PT_EPOCH_UNKNOWN.
 */
#define PT_EPOCH_UNKNOWN (UINT64_MAX - 1)
extern uint64_t pt_epoch (const struct pagetable *pt, uint32_t s);
/* Might the slot's epoch be <= t?  (True when unknown.) */
extern bool pt_epoch_may_be_at_most (const struct pagetable *pt, uint32_t s,
                                     uint64_t t);
/* Is it certainly <= t?  (False when unknown.) */
extern bool pt_epoch_surely_at_most (const struct pagetable *pt, uint32_t s,
                                     uint64_t t);
/* The cache compares slot epochs with none below floor from now on: a
 * group's base may move up to it, which pt_set_epoch does for the
 * slot's group when the epoch it stores is far above the base.  O(1).
 */
extern void pagetable_epoch_floor (struct pagetable *pt, uint64_t floor);
/* The cache compares slot epochs with none above ceiling, but epochs
 * newer than any stored yet (c->flushing_epoch).  O(1).
 */
extern void pagetable_epoch_ceiling (struct pagetable *pt, uint64_t ceiling);
/* While the page table is loaded (pagetable_from_entry until the
 * loader's first pt_set_seq on the slot), a
 * slot keeps its entry's exact sequence number in its seq and epoch
 * fields, so that the loader can order two versions of a page without
 * an array of its own.
 */
static inline uint64_t
pt_loaded_seq (const struct pagetable *pt, uint32_t s)
{
  return (uint64_t) pt->recs[s].epoch << 32 | pt->recs[s].seq;
}

/* Generations (see struct pt_slot). */
static inline uint64_t
pt_gen (const struct pagetable *pt, uint32_t s)
{
  if (pt->gens == NULL)
    return 0;
  return pt->gen_ref - (uint32_t) ((uint32_t) pt->gen_ref - pt->gens[s]);
}
static inline void
pt_set_gen (struct pagetable *pt, uint32_t s, uint64_t gen)
{
  struct pt_pend_mark m;

  if (pt->gens == NULL)
    return;
  if (!pt->pend_on) {
    pt->gens[s] = (uint32_t) gen;
    return;
  }
  m = pagetable_pend_mark (pt, s);
  pt->gens[s] = (uint32_t) gen;
  pagetable_pend_note (pt, s, m);
}
/* Keep generations from now on (4 bytes a slot).  Returns 0 or -1. */
extern int pagetable_keep_gens (struct pagetable *pt);

static inline void
pt_slot_set_crc (struct pt_slot *v, uint32_t crc)
{
  v->data_crc = crc;
  v->flags |= PT_CRC_KNOWN;
}
extern bool pt_valid_test (const struct pagetable *pt, uint32_t s,
                           unsigned i);

/* Copy slot s's valid and dirty maps out (either may be NULL). */
extern void pt_maps_get (const struct pagetable *pt, uint32_t s,
                         uint8_t *valid, uint8_t *dirty);
/* Store new maps for slot s (dirty a subset of valid).  Returns false,
 * changing nothing, if they need a side-table entry and the table is
 * full (pt->side_limit).  A slot that owns an entry keeps it until its
 * maps are runs again or it is freed, so maps set after a successful
 * pt_maps_reserve (the slot now owns an entry) or pt_maps_reserve_for
 * (those maps, or the slot owns an entry) always fit, as long as no one
 * else changes the slot's maps in between (the page's range lock).
 * _force: take an entry beyond the limit (loading at open); false then
 * only on ENOMEM.
 */
extern bool pt_maps_set (struct pagetable *pt, uint32_t s,
                         const uint8_t *valid, const uint8_t *dirty);
extern bool pt_maps_reserve (struct pagetable *pt, uint32_t s);
extern bool pt_maps_reserve_force (struct pagetable *pt, uint32_t s);
extern bool pt_maps_reserve_for (struct pagetable *pt, uint32_t s,
                                 const uint8_t *valid, const uint8_t *dirty);
extern bool pt_maps_set_force (struct pagetable *pt, uint32_t s,
                               const uint8_t *valid, const uint8_t *dirty);
/* Does slot s keep its maps in the side table? */
extern bool pt_maps_side (const struct pagetable *pt, uint32_t s);
/* Bound the side table to limit entries (at most PT_SIDE_MAX). */
extern int pagetable_set_side_limit (struct pagetable *pt, uint32_t limit);
/* Heap bytes the table holds: slots, index, side table. */
extern uint64_t pagetable_heap_bytes (const struct pagetable *pt);
/* Everything about slot s as one value. */
extern void pagetable_get (const struct pagetable *pt, uint32_t s,
                           struct pt_slot *v);

/* Allocate for nslots slots, all free (side table limit: the smaller of
 * PT_SIDE_DEFAULT and nslots).  Returns 0 or -1 (ENOMEM).
 */
extern int pagetable_init (struct pagetable *pt, uint32_t nslots);
#define PT_SIDE_DEFAULT 65536   /* default side_limit (at most nslots) */
extern void pagetable_free (struct pagetable *pt);

/* Slot holding backend page, or PT_NONE. */
extern uint32_t pagetable_lookup (const struct pagetable *pt, uint64_t page);

/* Make slot reachable as page.  The slot must not be indexed and no
 * other slot may hold page.  The slot must have been taken from the
 * free list (pagetable_take_free) or reclaimed (pagetable_remove).
 */
extern void pagetable_insert (struct pagetable *pt, uint32_t slot,
                              uint64_t page);

/* Remove slot from the index (it keeps its metadata). */
extern void pagetable_remove (struct pagetable *pt, uint32_t slot);

/* Share budget b (NULL: none) with other page tables, at unit bytes a
 * slot; the slots now off the free list are charged at once.
 */
extern void pagetable_set_budget (struct pagetable *pt, struct budget *b,
                                  uint32_t unit);

/* Take a slot from the free list, or PT_NONE when it is empty or the
 * budget has no room (then pt->nfree is not 0).
 */
extern uint32_t pagetable_take_free (struct pagetable *pt);

/* Empty the free list (used while loading entries from the cache
 * file: the loader then puts back every slot it did not fill).
 */
extern void pagetable_clear_free (struct pagetable *pt);

/* Reset slot to FREE and put it on the free list.  It must not be
 * indexed and must have no pins.
 */
extern void pagetable_put_free (struct pagetable *pt, uint32_t slot);

/* Fill an entry from a slot and back. */
extern void pagetable_to_entry (const struct pt_slot *s,
                                struct layout_entry *e);
/* Load slot s (not indexed) from an entry read at open.  Returns
 * false if its maps cannot be stored (the slot is then left FREE).
 */
extern bool pagetable_from_entry (struct pagetable *pt, uint32_t s,
                                  const struct layout_entry *e);
/* pagetable_from_entry in two halves, so that a loader can do the
 * first on another thread: pagetable_rec_encode makes the stored form
 * of entry e in *img (touching no table), or returns false if it needs
 * more than a record (maps that are not runs, a page past
 * PT_MAX_PAGES: pagetable_from_entry then); pagetable_load_rec puts
 * such an image in slot s with generation gen, as pagetable_from_entry
 * would have.  The image's next and flags are not used.
 */
extern bool pagetable_rec_encode (const struct layout_entry *e,
                                  struct pt_rec *img);
extern void pagetable_load_rec (struct pagetable *pt, uint32_t s,
                                const struct pt_rec *img, uint64_t gen);

/* True if every sector of [first, last] is valid in slot s. */
extern bool pagetable_range_valid (const struct pagetable *pt, uint32_t s,
                                   unsigned first, unsigned last);
/* True if some sector of [first, last] is valid in slot s. */
extern bool pagetable_range_any_valid (const struct pagetable *pt,
                                       uint32_t s, unsigned first,
                                       unsigned last);
/* The same for a value. */
extern bool pt_view_range_valid (const struct pt_slot *v,
                                 unsigned first, unsigned last);

/* Prefetch hints for a lookup of page soon (the loader's): its hash
 * bucket, and (once the bucket is in cache) the first slot of its
 * chain.  They change nothing.
 */
extern void pagetable_prefetch_bucket (const struct pagetable *pt,
                                       uint64_t page);
extern void pagetable_prefetch_chain (const struct pagetable *pt,
                                      uint64_t page);

#endif /* SSDCACHE_PAGETABLE_H */
