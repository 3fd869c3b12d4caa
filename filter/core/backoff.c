/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: per-run backoff of failed writeback
 * (backoff.h).
 */
#include <string.h>

#include "backoff.h"

static bool
overlaps (const struct backoff_run *r, uint64_t first, uint64_t last)
{
  return r->first <= last && first <= r->last;
}

static void
drop (struct backoff *b, unsigned i)
{
  memmove (&b->run[i], &b->run[i + 1], (b->n - i - 1) * sizeof b->run[0]);
  b->n--;
}

void
backoff_failed (struct backoff *b, uint64_t first, uint64_t last,
                uint64_t now_ms)
{
  uint32_t delay = BACKOFF_MIN_MS;

  /* Runs it overlaps merge into it, and it waits twice their longest. */
  for (unsigned i = 0; i < b->n;) {
    struct backoff_run *r = &b->run[i];
    if (overlaps (r, first, last)) {
      uint32_t twice = r->delay_ms * 2;
      if (twice > delay)
        delay = twice;
      if (r->first < first)
        first = r->first;
      if (r->last > last)
        last = r->last;
      drop (b, i);
    }
    else
      i++;
  }
  if (delay > BACKOFF_MAX_MS)
    delay = BACKOFF_MAX_MS;
  if (b->n == BACKOFF_RUNS)
    drop (b, 0);                 /* the oldest */
  b->run[b->n++] = (struct backoff_run) {
    .first = first, .last = last, .until_ms = now_ms + delay,
    .delay_ms = delay,
  };
}

void
backoff_done (struct backoff *b, uint64_t first, uint64_t last)
{
  for (unsigned i = 0; i < b->n;) {
    if (b->run[i].first >= first && b->run[i].last <= last)
      drop (b, i);
    else
      i++;
  }
}

bool
backoff_waits (const struct backoff *b, uint64_t page, uint64_t now_ms)
{
  for (unsigned i = 0; i < b->n; i++)
    if (b->run[i].first <= page && page <= b->run[i].last &&
        now_ms < b->run[i].until_ms)
      return true;
  return false;
}
