/* nbdkit-ssdcache-filter: the in-RAM page table (pure: no I/O, no nbdkit).
 *
 * Owns the slot array, the chained hash index (page -> slot) and the
 * free list.  The caller holds the cache metadata lock for every call.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pagetable.h"

static uint32_t
hash_page (const struct pagetable *pt, uint64_t page)
{
  /* Fibonacci hashing: spreads sequential page numbers. */
  uint64_t h = page * UINT64_C (0x9E3779B97F4A7C15);
  return (uint32_t) (h >> 32) & pt->bucket_mask;
}

int
pagetable_init (struct pagetable *pt, uint32_t nslots)
{
  uint32_t nbuckets = 1;

  memset (pt, 0, sizeof *pt);
  if (nslots == 0 || nslots == PT_NONE) {
    errno = EINVAL;
    return -1;
  }
  while (nbuckets < nslots && nbuckets < (UINT32_C (1) << 31))
    nbuckets <<= 1;

  pt->recs = calloc (nslots, sizeof *pt->recs);
  pt->buckets = malloc ((size_t) nbuckets * sizeof *pt->buckets);
  if (pt->recs == NULL || pt->buckets == NULL) {
    free (pt->recs);
    free (pt->buckets);
    memset (pt, 0, sizeof *pt);
    errno = ENOMEM;
    return -1;
  }
  pt->nslots = nslots;
  pt->bucket_mask = nbuckets - 1;
  for (uint32_t i = 0; i < nbuckets; i++)
    pt->buckets[i] = PT_NONE;

  /* Free list in slot order, so a new cache fills the file front to back. */
  pt->free_head = PT_NONE;
  for (uint32_t i = nslots; i-- > 0;) {
    pt->recs[i].next = pt->free_head;
    pt->free_head = i;
  }
  pt->nfree = nslots;
  return 0;
}

void
pagetable_free (struct pagetable *pt)
{
  free (pt->recs);
  free (pt->buckets);
  memset (pt, 0, sizeof *pt);
}

uint32_t
pagetable_lookup (const struct pagetable *pt, uint64_t page)
{
  uint32_t i = pt->buckets[hash_page (pt, page)];

  while (i != PT_NONE) {
    if (pt->recs[i].page == page)
      return i;
    i = pt->recs[i].next;
  }
  return PT_NONE;
}

void
pagetable_insert (struct pagetable *pt, uint32_t slot, uint64_t page)
{
  struct pt_rec *s = &pt->recs[slot];
  uint32_t b = hash_page (pt, page);

  s->page = page;
  s->next = pt->buckets[b];
  s->flags |= PT_INDEXED;
  s->flags &= ~PT_ORPHAN;
  pt->buckets[b] = slot;
  pt->nindexed++;
}

void
pagetable_remove (struct pagetable *pt, uint32_t slot)
{
  struct pt_rec *s = &pt->recs[slot];
  uint32_t *link = &pt->buckets[hash_page (pt, s->page)];

  if (!(s->flags & PT_INDEXED))
    return;
  while (*link != PT_NONE) {
    if (*link == slot) {
      *link = s->next;
      break;
    }
    link = &pt->recs[*link].next;
  }
  s->next = PT_NONE;
  s->flags &= ~PT_INDEXED;
  pt->nindexed--;
}

uint32_t
pagetable_take_free (struct pagetable *pt)
{
  uint32_t slot = pt->free_head;

  if (slot == PT_NONE)
    return PT_NONE;
  pt->free_head = pt->recs[slot].next;
  pt->recs[slot].next = PT_NONE;
  pt->nfree--;
  return slot;
}

void
pagetable_clear_free (struct pagetable *pt)
{
  pt->free_head = PT_NONE;
  pt->nfree = 0;
}

void
pagetable_put_free (struct pagetable *pt, uint32_t slot)
{
  struct pt_rec *s = &pt->recs[slot];
  uint64_t seq = s->seq;

  memset (s, 0, sizeof *s);
  s->seq = seq;
  s->state = LAYOUT_FREE;
  s->next = pt->free_head;
  pt->free_head = slot;
  pt->nfree++;
}

void
pt_maps_get (const struct pagetable *pt, uint32_t s, uint8_t *valid,
             uint8_t *dirty)
{
  if (valid)
    memcpy (valid, pt->recs[s].valid, sizeof pt->recs[s].valid);
  if (dirty)
    memcpy (dirty, pt->recs[s].dirty, sizeof pt->recs[s].dirty);
}

bool
pt_maps_set (struct pagetable *pt, uint32_t s, const uint8_t *valid,
             const uint8_t *dirty)
{
  memcpy (pt->recs[s].valid, valid, sizeof pt->recs[s].valid);
  memcpy (pt->recs[s].dirty, dirty, sizeof pt->recs[s].dirty);
  return true;
}

void
pagetable_get (const struct pagetable *pt, uint32_t s, struct pt_slot *v)
{
  const struct pt_rec *r = &pt->recs[s];

  v->page = r->page;
  v->seq = r->seq;
  v->epoch = r->epoch;
  v->data_crc = r->data_crc;
  v->pins = r->pins;
  v->flags = r->flags;
  v->state = r->state;
  pt_maps_get (pt, s, v->valid, v->dirty);
}

void
pagetable_to_entry (const struct pt_slot *s, struct layout_entry *e)
{
  memset (e, 0, sizeof *e);
  e->state = s->state;
  e->seq = s->seq;
  if (s->state != LAYOUT_FREE) {
    e->page = s->page;
    e->data_crc = s->data_crc;
    memcpy (e->valid, s->valid, sizeof e->valid);
    memcpy (e->dirty, s->dirty, sizeof e->dirty);
    /* (An unsealed clean slot keeps its old checksum on disk, which
     * its data fails: that is what keeps it out after a crash.)
     */
    if ((s->flags & PT_UNSEALED) && s->state == LAYOUT_DIRTY)
      e->flags |= LAYOUT_ENT_UNSEALED;
  }
}

bool
pagetable_from_entry (struct pagetable *pt, uint32_t s,
                      const struct layout_entry *e)
{
  struct pt_rec *r = &pt->recs[s];

  r->page = e->page;
  r->seq = e->seq;
  r->data_crc = e->data_crc;
  r->state = e->state;
  return pt_maps_set (pt, s, e->valid, e->dirty);
}

bool
pt_view_range_valid (const struct pt_slot *v, unsigned first, unsigned last)
{
  for (unsigned i = first; i <= last; i++)
    if (!layout_bit_test (v->valid, i))
      return false;
  return true;
}

bool
pagetable_range_valid (const struct pagetable *pt, uint32_t s,
                       unsigned first, unsigned last)
{
  for (unsigned i = first; i <= last; i++)
    if (!pt_valid_test (pt, s, i))
      return false;
  return true;
}
