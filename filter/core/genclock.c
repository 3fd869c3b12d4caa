/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: when each flush generation was closed (see
 * genclock.h).  No locking of its own.
 */
#include <stdlib.h>

#include "genclock.h"

/* Move the ring to one of cap entries, keeping generations [from, to). */
static bool
regrow (struct genclock *gc, uint32_t cap, uint64_t from, uint64_t to)
{
  uint64_t *ms = calloc (cap, sizeof *ms);

  if (ms == NULL)
    return false;
  for (uint64_t g = from; g < to && gc->cap; g++)
    ms[g & (cap - 1)] = gc->ms[g & (gc->cap - 1)];
  free (gc->ms);
  gc->ms = ms;
  gc->cap = cap;
  return true;
}

bool
genclock_close (struct genclock *gc, uint64_t gen, uint64_t done,
                uint64_t ms)
{
  bool kept = true;

  if (gc->oldest <= done || gc->cap == 0)
    gc->oldest = done + 1;      /* (times up to done are no longer needed) */
  if (gc->oldest > gen)
    gc->oldest = gen;
  if (gc->cap == 0 && !regrow (gc, GENCLOCK_MIN, gen, gen))
    return false;
  while (gen - gc->oldest >= gc->cap) {
    if (gc->cap >= GENCLOCK_MAX || !regrow (gc, gc->cap * 2, gc->oldest, gen)) {
      gc->oldest = gen - gc->cap + 1;   /* the oldest ones go */
      kept = false;
      break;
    }
  }
  gc->ms[gen & (gc->cap - 1)] = ms;
  return kept;
}

uint64_t
genclock_age (const struct genclock *gc, uint64_t gen, uint64_t now,
              bool *exact)
{
  uint64_t t;

  if (exact)
    *exact = gen >= gc->oldest;
  if (gc->cap == 0)
    return 0;
  if (gen < gc->oldest)
    gen = gc->oldest;
  t = gc->ms[gen & (gc->cap - 1)];
  return now > t ? now - t : 0;
}

void
genclock_free (struct genclock *gc)
{
  free (gc->ms);
  gc->ms = NULL;
  gc->cap = 0;
  gc->oldest = 0;
}
