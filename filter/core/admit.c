/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: admission helpers (pure).
 *
 * Owns the stream table of the sequential cutoff and the counters of the
 * n-miss promotion filter (see admit.h).  O(nstreams) per request for
 * the former (a handful of streams), O(1) per miss for the latter.
 *
 * RAM: admit_seq 48 bytes per stream; admit_nhit 1 byte per counter.
 *
 * Locking: none inside; the caller serialises all calls on one object.
 */
#include <stdlib.h>

#include "admit.h"
#include "mix.h"

struct stream {
  uint64_t start, end;           /* the span of its requests */
  uint64_t run;                  /* bytes of the span it has written */
  uint64_t holes;                /* bytes of the span skipped by requests
                                    that overtook others, not yet filled */
  uint64_t last_use;             /* for LRU replacement */
  uint64_t len;                  /* length of its last request */
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

/* How a request [offset, offset + len) relates to stream t: 0 none,
 * 1 it starts at the stream's end, 2 a little ahead of it (requests
 * that overtook each other between the socket and here), 3 a little
 * behind it (an overtaken one, or a rewrite of what the stream just
 * wrote).  Behind a stream that has had no request for a while it is
 * neither: an overtaken request comes within a few of its stream's
 * latest, and the stream of a last pass over the same blocks must not
 * take in (as rewrites, admitted) the requests of the pass now
 * reaching its end.
 */
static int
stream_near (const struct admit_seq *as, const struct stream *t,
             uint64_t offset, uint64_t len)
{
  const uint64_t slack = ADMIT_SEQ_REORDER * len;

  if (t->last_use == 0)
    return 0;
  if (offset == t->end)
    return 1;
  if (offset > t->end)
    return offset - t->end <= slack ? 2 : 0;
  if (as->clock - t->last_use > ADMIT_SEQ_REORDER * as->nstreams)
    return 0;
  return t->end - offset <= slack + len ? 3 : 0;
}

/* Add [offset, offset + len) to stream st (how: stream_near); the
 * bytes it adds to the run.  A request ahead leaves a hole for the
 * ones it overtook; one behind counts only as far as it fills a hole
 * (else it rewrites what the stream wrote already, and adds nothing).
 */
static uint64_t
stream_add (struct stream *st, int how, uint64_t offset, uint64_t len)
{
  const uint64_t end = offset + len;
  uint64_t past = end > st->end ? end - st->end : 0, inside = len - past;

  if (how == 0) {
    *st = (struct stream) { .start = offset, .end = end, .run = len };
    return len;
  }
  if (how == 2) {
    st->holes += offset - st->end;
    past = len;
    inside = 0;
  }
  if (inside > st->holes)
    inside = st->holes;
  st->holes -= inside;
  st->run += past + inside;
  if (end > st->end)
    st->end = end;
  return past + inside;
}

/* A stream is sequential while at most a quarter of its span is holes:
 * requests that merely land near each other (random ones in a small
 * region) leave more.
 */
static bool
stream_dense (const struct stream *st)
{
  return st->holes * 4 <= st->end - st->start;
}

uint64_t
admit_seq_access (struct admit_seq *as, uint64_t offset, uint64_t len)
{
  struct stream *st = NULL, *lru = &as->s[0];
  uint64_t before = 0, admitted, added;
  int how = 0;

  as->stats.requests++;
  as->clock++;
  /* The stream the request continues; if it is only near some, the
   * longest of them (a short one may have been started by a request
   * that came late).
   */
  for (unsigned i = 0; i < as->nstreams && how != 1; ++i) {
    struct stream *t = &as->s[i];
    int h = stream_near (as, t, offset, len);
    if (h && (how == 0 || h == 1 || t->run > st->run)) {
      st = t;
      how = h;
    }
    if (t->last_use < lru->last_use)
      lru = t;
  }
  if (st) {
    as->stats.sequential++;
    before = st->run;
  }
  else
    st = lru;
  added = stream_add (st, how, offset, len);
  st->len = len;
  st->last_use = as->clock;

  /* (A rewrite is no part of the stream: admitted.) */
  if (as->cutoff == 0 || before + len <= as->cutoff || added == 0 ||
      !stream_dense (st))
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
    if (t->last_use && t->end >= end &&
        t->end - end <= ADMIT_SEQ_REORDER * t->len)
      return !stream_dense (t) ? UINT64_MAX :
        t->run >= as->cutoff ? 0 : as->cutoff - t->run;
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
