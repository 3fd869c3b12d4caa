/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: admission helpers (pure).
 *
 * Owns the stream table of the sequential cutoff and the counters of the
 * n-miss promotion filter (see admit.h).  O(nstreams) per request for
 * the former (a handful of streams), O(1) per miss for the latter.
 *
 * RAM: admit_seq 24 bytes per stream; admit_nhit 1 byte per counter.
 *
 * Locking: none inside; the caller serialises all calls on one object.
 */
#include <stdlib.h>

#include "admit.h"
#include "mix.h"

struct stream {
  uint64_t end;                  /* end offset of its last request */
  uint64_t run;                  /* bytes it has run sequentially */
  uint64_t last_use;             /* for LRU replacement */
};

struct admit_seq {
  uint64_t cutoff;
  unsigned nstreams;
  uint64_t clock;
  struct admit_seq_stats stats;
  struct stream s[];
};

struct admit_seq *
admit_seq_new (uint64_t cutoff, unsigned nstreams)
{
  struct admit_seq *as;

  if (nstreams == 0)
    nstreams = 1;
  as = calloc (1, sizeof *as + nstreams * sizeof (struct stream));
  if (as == NULL)
    return NULL;
  as->cutoff = cutoff;
  as->nstreams = nstreams;
  /* Empty streams: end 0 and last_use 0 (replaced first).  A request at
   * offset 0 may "continue" one; harmless: its run starts at 0.
   */
  return as;
}

void
admit_seq_free (struct admit_seq *as)
{
  free (as);
}

uint64_t
admit_seq_access (struct admit_seq *as, uint64_t offset, uint64_t len)
{
  struct stream *st = NULL, *lru = &as->s[0];
  uint64_t before, admitted;

  as->stats.requests++;
  as->clock++;
  for (unsigned i = 0; i < as->nstreams; ++i) {
    struct stream *t = &as->s[i];
    if (t->last_use && t->end == offset) {
      st = t;
      break;
    }
    if (t->last_use < lru->last_use)
      lru = t;
  }
  if (st) {
    as->stats.sequential++;
    before = st->run;
  }
  else {
    st = lru;
    before = 0;
    st->run = 0;
  }
  st->run = before + len;
  st->end = offset + len;
  st->last_use = as->clock;

  if (as->cutoff == 0 || before + len <= as->cutoff)
    admitted = len;
  else if (before >= as->cutoff)
    admitted = 0;
  else
    admitted = as->cutoff - before;
  as->stats.bypassed_bytes += len - admitted;
  return admitted;
}

uint64_t
admit_seq_left (const struct admit_seq *as, uint64_t end)
{
  if (as->cutoff == 0)
    return UINT64_MAX;
  for (unsigned i = 0; i < as->nstreams; ++i) {
    const struct stream *t = &as->s[i];
    if (t->last_use && t->end == end)
      return t->run >= as->cutoff ? 0 : as->cutoff - t->run;
  }
  return UINT64_MAX;
}

void
admit_seq_get_stats (const struct admit_seq *as, struct admit_seq_stats *st)
{
  *st = as->stats;
}

/*----------------------------------------------------------------------
 * n-miss promotion.
 */

struct admit_nhit {
  unsigned n;
  uint32_t mask;                 /* nentries - 1 */
  uint32_t age;                  /* next counter to halve */
  uint8_t *c;
};

struct admit_nhit *
admit_nhit_new (unsigned n, uint32_t nentries)
{
  struct admit_nhit *an = calloc (1, sizeof *an);
  uint32_t size = 64;

  if (an == NULL)
    return NULL;
  an->n = n > 255 ? 255 : n;
  if (an->n <= 1)
    return an;
  while (size < nentries && size < (UINT32_C (1) << 31))
    size <<= 1;
  an->mask = size - 1;
  an->c = calloc (size, 1);
  if (an->c == NULL) {
    free (an);
    return NULL;
  }
  return an;
}

void
admit_nhit_free (struct admit_nhit *an)
{
  if (an) {
    free (an->c);
    free (an);
  }
}

static void
idx (const struct admit_nhit *an, uint64_t page, uint32_t *a, uint32_t *b)
{
  uint64_t h = mix64 (page);

  *a = (uint32_t) h & an->mask;
  *b = (uint32_t) (h >> 32) & an->mask;
  if (*b == *a)
    *b = (*a + 1) & an->mask;
}

unsigned
admit_nhit_count (const struct admit_nhit *an, uint64_t page)
{
  uint32_t a, b;

  if (an->c == NULL)
    return 0;
  idx (an, page, &a, &b);
  return an->c[a] < an->c[b] ? an->c[a] : an->c[b];
}

bool
admit_nhit_miss (struct admit_nhit *an, uint64_t page)
{
  uint32_t a, b;
  unsigned m;

  if (an->c == NULL)
    return true;
  idx (an, page, &a, &b);
  m = an->c[a] < an->c[b] ? an->c[a] : an->c[b];
  if (m < 255) {
    /* Conservative update: raise only the counters at the minimum. */
    if (an->c[a] == m)
      an->c[a]++;
    if (an->c[b] == m)
      an->c[b]++;
    m++;
  }
  /* Aging: halve one counter per call, round robin. */
  an->c[an->age] >>= 1;
  an->age = (an->age + 1) & an->mask;
  return m >= an->n;
}
