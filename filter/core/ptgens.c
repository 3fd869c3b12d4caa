/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: pending slots counted per flush generation
 * (pure: no I/O, no nbdkit).
 *
 * Owns pt->pend: for each flush generation that has pending slots
 * (dirty data the backend lacks, see pagetable.h), how many.  The flush
 * order asks for the oldest one at every step of writeback; a scan of
 * every slot under c->lock each time would cost a terabyte cache tens
 * of milliseconds per client flush.  The accessors of pagetable.h call
 * pagetable_pend_mark before and pagetable_pend_note after every change
 * to a slot's state, flags or generation, so the counts cannot miss
 * one.  New dirty data takes the open generation, the newest: a count
 * is nearly always added at the end and taken from the front, so the
 * array is kept sorted with a moving start (pend_lo).  If it cannot
 * grow, the counts are given up and the oldest generation is found by
 * a scan, as before.
 *
 * Locking: as the page table (the caller holds c->lock).
 */
#include <stdlib.h>
#include <string.h>

#include "pagetable.h"

static bool
pending_rec (const struct pagetable *pt, uint32_t s)
{
  const struct pt_rec *r = &pt->recs[s];

  return r->state == LAYOUT_DIRTY &&
    (r->flags & (PT_INDEXED | PT_SUPERSEDED)) && !(r->flags & PT_BAD);
}

/* Index of the first entry from pend_lo with gen >= g (binary search). */
static uint32_t
pend_find (const struct pagetable *pt, uint64_t g)
{
  uint32_t lo = pt->pend_lo, hi = pt->pend_lo + pt->pend_len;

  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (pt->pend[mid].gen < g)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Room for one more entry at the end: move the live ones to the front
 * or grow.  False (counts given up) if memory runs out.
 */
static bool
pend_room (struct pagetable *pt)
{
  uint32_t end = pt->pend_lo + pt->pend_len;

  if (end < pt->pend_cap)
    return true;
  if (pt->pend_lo > 0) {
    memmove (pt->pend, pt->pend + pt->pend_lo,
             pt->pend_len * sizeof *pt->pend);
    pt->pend_lo = 0;
    return true;
  }
  {
    uint32_t ncap = pt->pend_cap ? pt->pend_cap * 2 : 64;
    struct pt_gcount *n = realloc (pt->pend, ncap * sizeof *n);
    if (n == NULL)
      return false;
    pt->pend = n;
    pt->pend_cap = ncap;
  }
  return true;
}

static void
pend_add (struct pagetable *pt, uint64_t g)
{
  uint32_t end = pt->pend_lo + pt->pend_len, i;

  if (pt->pend_lost)
    return;
  if (pt->pend_len > 0 && pt->pend[end - 1].gen == g) {
    pt->pend[end - 1].n++;      /* the usual case: the open generation */
    return;
  }
  i = pend_find (pt, g);
  if (i < end && pt->pend[i].gen == g) {
    pt->pend[i].n++;
    return;
  }
  if (!pend_room (pt)) {
    pt->pend_lost = true;
    return;
  }
  i = pend_find (pt, g);        /* (pend_room may have moved them) */
  end = pt->pend_lo + pt->pend_len;
  memmove (pt->pend + i + 1, pt->pend + i, (end - i) * sizeof *pt->pend);
  pt->pend[i].gen = g;
  pt->pend[i].n = 1;
  pt->pend_len++;
}

static void
pend_sub (struct pagetable *pt, uint64_t g)
{
  uint32_t end = pt->pend_lo + pt->pend_len;
  uint32_t i = pend_find (pt, g);

  if (pt->pend_lost)
    return;
  if (i == end || pt->pend[i].gen != g || pt->pend[i].n == 0) {
    pt->pend_lost = true;       /* not reached: a count went wrong */
    return;
  }
  if (--pt->pend[i].n > 0)
    return;
  /* Empty entries leave at once, from the front without moving any. */
  if (i == pt->pend_lo)
    pt->pend_lo++;
  else
    memmove (pt->pend + i, pt->pend + i + 1,
             (end - i - 1) * sizeof *pt->pend);
  pt->pend_len--;
  if (pt->pend_len == 0)
    pt->pend_lo = 0;
}

struct pt_pend_mark
pagetable_pend_mark (const struct pagetable *pt, uint32_t s)
{
  struct pt_pend_mark m = { .was = pending_rec (pt, s) };

  if (m.was)
    m.gen = pt_gen (pt, s);
  return m;
}

void
pagetable_pend_note (struct pagetable *pt, uint32_t s, struct pt_pend_mark m)
{
  bool now = pending_rec (pt, s);
  uint64_t g = now ? pt_gen (pt, s) : 0;

  if (m.was && now && m.gen == g)
    return;
  if (m.was)
    pend_sub (pt, m.gen);
  if (now)
    pend_add (pt, g);
}

void
pagetable_count_pending (struct pagetable *pt)
{
  free (pt->pend);
  pt->pend = NULL;
  pt->pend_lo = pt->pend_len = pt->pend_cap = 0;
  pt->pend_lost = false;
  pt->pend_on = true;
  for (uint32_t s = 0; s < pt->nslots; s++)
    if (pending_rec (pt, s))
      pend_add (pt, pt_gen (pt, s));
}

uint64_t
pagetable_scan_oldest_pending (const struct pagetable *pt)
{
  uint64_t lo = UINT64_MAX;

  for (uint32_t s = 0; s < pt->nslots; s++)
    if (pending_rec (pt, s) && pt_gen (pt, s) < lo)
      lo = pt_gen (pt, s);
  return lo;
}

uint64_t
pagetable_oldest_pending (struct pagetable *pt)
{
  if (!pt->pend_on || pt->pend_lost)
    return pagetable_scan_oldest_pending (pt);
  return pt->pend_len ? pt->pend[pt->pend_lo].gen : UINT64_MAX;
}

uint32_t
pagetable_oldest_pending_count (const struct pagetable *pt)
{
  if (!pt->pend_on || pt->pend_lost || pt->pend_len == 0)
    return 0;
  return pt->pend[pt->pend_lo].n;
}

bool
pagetable_pending_consistent (const struct pagetable *pt)
{
  uint64_t total = 0, counted = 0;

  if (!pt->pend_on)
    return true;
  if (pt->pend_lost)
    return false;               /* (out of memory, or a count went wrong) */
  for (uint32_t s = 0; s < pt->nslots; s++)
    total += pending_rec (pt, s);
  for (uint32_t i = pt->pend_lo; i < pt->pend_lo + pt->pend_len; i++) {
    uint32_t n = 0;

    if (i > pt->pend_lo && pt->pend[i - 1].gen >= pt->pend[i].gen)
      return false;
    for (uint32_t s = 0; s < pt->nslots; s++)
      n += pending_rec (pt, s) && pt_gen (pt, s) == pt->pend[i].gen;
    if (n == 0 || n != pt->pend[i].n)
      return false;
    counted += n;
  }
  return total == counted;
}
