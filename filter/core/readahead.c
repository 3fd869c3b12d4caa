/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: readahead decisions (pure).
 *
 * Owns the stream table and windows of one connection (see
 * readahead.h for the rules).  O(READAHEAD_STREAMS) per read.
 *
 * Locking: none inside; the caller serialises all calls on one object.
 */
#include <stdlib.h>

#include "readahead.h"

struct readahead_stream {
  uint64_t next;                 /* frontier: end of the furthest read */
  uint64_t prefetched_end;               /* prefetched (issued) up to here */
  uint64_t window;               /* adaptive: current window */
  uint64_t used;                 /* prefetched bytes used at this window */
  uint64_t last_use;             /* LRU clock; 0: empty */
  unsigned seq;                  /* reads in a row that advanced it */
};

struct readahead {
  struct readahead_config cfg;
  uint64_t clock;
  uint64_t start_window;         /* adaptive: window of a new stream */
  struct readahead_stats stats;
  struct readahead_stream s[READAHEAD_STREAMS];
};

static uint64_t
max64 (uint64_t a, uint64_t b)
{
  return a > b ? a : b;
}

static uint64_t
min64 (uint64_t a, uint64_t b)
{
  return a < b ? a : b;
}

struct readahead *
readahead_new (const struct readahead_config *cfg)
{
  struct readahead *ra = calloc (1, sizeof *ra);
  uint32_t ps;

  if (ra == NULL)
    return NULL;
  ra->cfg = *cfg;
  ps = ra->cfg.page_size ? ra->cfg.page_size : 4096;
  ra->cfg.page_size = ps;
  if (ra->cfg.min < 2 * (uint64_t) ps)
    ra->cfg.min = 2 * (uint64_t) ps;
  if (ra->cfg.max < ra->cfg.min)
    ra->cfg.max = ra->cfg.min;
  if (ra->cfg.window < ps)
    ra->cfg.window = ps;
  ra->start_window = ra->cfg.min;
  return ra;
}

void
readahead_free (struct readahead *ra)
{
  free (ra);
}

static uint64_t
window_of (const struct readahead *ra, const struct readahead_stream *st)
{
  return ra->cfg.mode == READAHEAD_FIXED ? ra->cfg.window : st->window;
}

static void
shrink (struct readahead *ra, struct readahead_stream *st)
{
  uint64_t w = max64 (st->window / 2, ra->cfg.min);

  if (w < st->window)
    ra->stats.shrinks++;
  st->window = w;
  st->used = 0;
}

/* The stream st ends (replaced by another): what it prefetched beyond
 * its frontier was never read.
 */
static void
end_stream (struct readahead *ra, struct readahead_stream *st)
{
  if (st->last_use && st->prefetched_end > st->next) {
    ra->stats.unread_bytes += st->prefetched_end - st->next;
    if (ra->cfg.mode == READAHEAD_AUTO)
      ra->start_window = max64 (ra->start_window / 2, ra->cfg.min);
  }
}

bool
readahead_access (struct readahead *ra, uint64_t offset, uint64_t len,
                  uint64_t used, struct readahead_io *io)
{
  const uint64_t ps = ra->cfg.page_size;
  const uint64_t slack = min64 (4 * max64 (len, 1), 4u << 20);
  struct readahead_stream *st = NULL, *lru = &ra->s[0];
  uint64_t w, ahead, lo, hi;

  ra->stats.reads++;
  ra->clock++;
  if (ra->cfg.mode == READAHEAD_OFF || len == 0)
    return false;

  for (unsigned i = 0; i < READAHEAD_STREAMS; i++) {
    struct readahead_stream *t = &ra->s[i];
    if (t->last_use && offset <= t->next + slack &&
        offset + len + slack >= t->next) {
      st = t;
      break;
    }
    if (t->last_use < lru->last_use)
      lru = t;
  }

  if (st == NULL) {
    end_stream (ra, lru);
    st = lru;
    st->next = offset + len;
    st->prefetched_end = 0;
    st->window = ra->start_window;
    st->used = 0;
    st->seq = 0;
    st->last_use = ra->clock;
    return false;
  }
  st->last_use = ra->clock;
  if (offset + len > st->next) {
    st->next = offset + len;
    st->seq++;
  }

  /* Adaptive: half a window of prefetched pages used (as much as each
   * prefetch brings in): grow.
   */
  if (ra->cfg.mode == READAHEAD_AUTO && used > 0) {
    st->used += used;
    if (2 * st->used >= st->window && st->window < ra->cfg.max) {
      /* Quadruple while far below the maximum, then double: the ramp
       * (at small, slow windows) stays short.
       */
      unsigned f = 8 * st->window <= ra->cfg.max ? 4 : 2;
      st->window = min64 (st->window * f, ra->cfg.max);
      st->used = 0;
      ra->stats.grows++;
      /* New streams of this connection start from what worked. */
      ra->start_window = max64 (ra->start_window,
                                max64 (st->window / 4, ra->cfg.min));
    }
  }

  if (st->seq < READAHEAD_TRIGGER)
    return false;
  ra->stats.sequential++;

  w = window_of (ra, st);
  if (st->prefetched_end >= ra->cfg.size)
    return false;               /* prefetched up to the end */
  if (st->prefetched_end < st->next)
    st->prefetched_end = st->next;      /* the client overtook the prefetch */
  ahead = st->prefetched_end - st->next;
  if (2 * ahead >= w)
    return false;               /* enough ahead: wait */

  lo = st->prefetched_end / ps * ps;
  hi = (st->next + w + ps - 1) / ps * ps;
  if (hi > ra->cfg.size)
    hi = ra->cfg.size;
  if (hi <= lo)
    return false;
  st->prefetched_end = hi;
  io->offset = lo;
  io->len = hi - lo;
  io->window = w;
  ra->stats.issued++;
  ra->stats.issued_bytes += hi - lo;
  return true;
}

void
readahead_cancel (struct readahead *ra, const struct readahead_io *io)
{
  for (unsigned i = 0; i < READAHEAD_STREAMS; i++) {
    struct readahead_stream *t = &ra->s[i];
    if (t->last_use && t->prefetched_end == io->offset + io->len) {
      t->prefetched_end = io->offset;
      ra->stats.issued--;
      ra->stats.issued_bytes -= io->len;
      return;
    }
  }
}

void
readahead_wasted (struct readahead *ra, uint64_t pages)
{
  if (pages == 0 || ra->cfg.mode != READAHEAD_AUTO)
    return;
  for (unsigned i = 0; i < READAHEAD_STREAMS; i++) {
    struct readahead_stream *t = &ra->s[i];
    if (t->last_use && t->prefetched_end > t->next)
      shrink (ra, t);
  }
  ra->start_window = max64 (ra->start_window / 2, ra->cfg.min);
}

uint64_t
readahead_stream_window (const struct readahead *ra, uint64_t next)
{
  for (unsigned i = 0; i < READAHEAD_STREAMS; i++) {
    const struct readahead_stream *t = &ra->s[i];
    if (t->last_use && t->next == next)
      return window_of (ra, t);
  }
  return 0;
}

uint64_t
readahead_start_window (const struct readahead *ra)
{
  return ra->cfg.mode == READAHEAD_FIXED ? ra->cfg.window : ra->start_window;
}

void
readahead_get_stats (const struct readahead *ra, struct readahead_stats *st)
{
  *st = ra->stats;
}
