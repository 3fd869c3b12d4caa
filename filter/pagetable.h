/* nbdkit-ssdcache-filter: the in-RAM page table (pure: no I/O, no nbdkit).
 *
 * Owns the per-slot metadata mirrored from the on-SSD entries and the
 * index from backend page number to slot (a chained hash table sized by
 * the cache, never by the backend), plus the free-slot list.
 *
 * Locking: none inside.  Every function must be called with the owning
 * cache's metadata lock held (cache.c: cache->lock).  Critical sections
 * are short: no function here does I/O.
 */
#ifndef SSDCACHE_PAGETABLE_H
#define SSDCACHE_PAGETABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"

#define PT_NONE UINT32_MAX
#define PT_EPOCH_PENDING UINT64_MAX

/* Slot flags (RAM only). */
#define PT_INDEXED   0x01   /* reachable through the index */
#define PT_VERIFIED  0x02   /* data CRC checked since the cache was opened */
#define PT_ORPHAN    0x04   /* removed from the index while pinned */
#define PT_UNSEALED  0x08   /* data_crc is stale: dirty data rewritten in
                               place since the last flush (the entry says
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

/* A slot's metadata as one value: what callers read with
 * pagetable_get and hand to cache_commit_entry.  The table itself
 * stores it in another form; only the accessors below touch that.
 */
struct pt_slot {
  uint64_t page;                      /* backend page number */
  uint64_t seq;                       /* sequence number of the entry */
  uint64_t epoch;                     /* cache sync epoch of the last write
                                         (PT_EPOCH_PENDING: in flight) */
  uint32_t data_crc;
  uint16_t pins;                      /* users currently doing I/O on it */
  uint16_t flags;                     /* PT_* */
  uint8_t state;                      /* enum layout_state */
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
};

/* The stored form of a slot (private to the accessors). */
struct pt_rec {
  uint64_t page;
  uint64_t seq;
  uint64_t epoch;
  uint32_t data_crc;
  uint32_t next;                      /* hash chain, or free list link */
  uint16_t pins;
  uint16_t flags;
  uint8_t state;
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
};

struct pagetable {
  uint32_t nslots;
  struct pt_rec *recs;
  uint32_t *buckets;
  uint32_t bucket_mask;               /* nbuckets - 1, nbuckets a power of 2 */
  uint32_t free_head;
  uint32_t nfree;
  uint32_t nindexed;
};

/* Accessors: the only code that knows how a slot is stored. */
static inline uint64_t
pt_page (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].page;
}
/* Set the page of a slot that is not indexed. */
static inline void
pt_set_page (struct pagetable *pt, uint32_t s, uint64_t page)
{
  pt->recs[s].page = page;
}
static inline uint8_t
pt_state (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].state;
}
static inline void
pt_set_state (struct pagetable *pt, uint32_t s, uint8_t state)
{
  pt->recs[s].state = state;
}
static inline uint16_t
pt_flags (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].flags;
}
static inline void
pt_set_flags (struct pagetable *pt, uint32_t s, uint16_t flags)
{
  pt->recs[s].flags = flags;
}
static inline void
pt_flags_on (struct pagetable *pt, uint32_t s, uint16_t f)
{
  pt->recs[s].flags |= f;
}
static inline void
pt_flags_off (struct pagetable *pt, uint32_t s, uint16_t f)
{
  pt->recs[s].flags &= ~f;
}
static inline unsigned
pt_pins (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].pins;
}
static inline void
pt_pin (struct pagetable *pt, uint32_t s)
{
  pt->recs[s].pins++;
}
/* Returns the pins left. */
static inline unsigned
pt_unpin (struct pagetable *pt, uint32_t s)
{
  return --pt->recs[s].pins;
}
static inline uint64_t
pt_seq (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].seq;
}
static inline void
pt_set_seq (struct pagetable *pt, uint32_t s, uint64_t seq)
{
  pt->recs[s].seq = seq;
}
static inline uint64_t
pt_epoch (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].epoch;
}
static inline void
pt_set_epoch (struct pagetable *pt, uint32_t s, uint64_t epoch)
{
  pt->recs[s].epoch = epoch;
}
static inline uint32_t
pt_crc (const struct pagetable *pt, uint32_t s)
{
  return pt->recs[s].data_crc;
}
static inline void
pt_set_crc (struct pagetable *pt, uint32_t s, uint32_t crc)
{
  pt->recs[s].data_crc = crc;
}
static inline bool
pt_valid_test (const struct pagetable *pt, uint32_t s, unsigned i)
{
  return layout_bit_test (pt->recs[s].valid, i);
}

/* Copy slot s's valid and dirty maps out (either may be NULL). */
extern void pt_maps_get (const struct pagetable *pt, uint32_t s,
                         uint8_t *valid, uint8_t *dirty);
/* Store new maps for slot s (dirty a subset of valid).  Returns false,
 * changing nothing, if they cannot be stored (see pagetable.c).
 */
extern bool pt_maps_set (struct pagetable *pt, uint32_t s,
                         const uint8_t *valid, const uint8_t *dirty);
/* Everything about slot s as one value. */
extern void pagetable_get (const struct pagetable *pt, uint32_t s,
                           struct pt_slot *v);

/* Allocate for nslots slots, all free.  Returns 0 or -1 (ENOMEM). */
extern int pagetable_init (struct pagetable *pt, uint32_t nslots);
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

/* Take a slot from the free list, or PT_NONE when it is empty. */
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

/* True if every sector of [first, last] is valid in slot s. */
extern bool pagetable_range_valid (const struct pagetable *pt, uint32_t s,
                                   unsigned first, unsigned last);
/* The same for a value. */
extern bool pt_view_range_valid (const struct pt_slot *v,
                                 unsigned first, unsigned last);

#endif /* SSDCACHE_PAGETABLE_H */
