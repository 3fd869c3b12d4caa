/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: page range locks.
 *
 * Owns the array of held ranges; rl->lock protects it and is held only
 * while scanning/updating it.  See rangelock.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "rangelock.h"

int
rangelock_init (struct rangelock *rl)
{
  rl->held = NULL;
  rl->n = rl->cap = 0;
  rl->barriers = 0;
  if (pthread_mutex_init (&rl->lock, NULL) != 0)
    return -1;
  if (pthread_cond_init (&rl->cond, NULL) != 0) {
    pthread_mutex_destroy (&rl->lock);
    return -1;
  }
  return 0;
}

void
rangelock_destroy (struct rangelock *rl)
{
  free (rl->held);
  rl->held = NULL;
  pthread_cond_destroy (&rl->cond);
  pthread_mutex_destroy (&rl->lock);
}

static bool
overlaps (const struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  for (size_t i = 0; i < rl->n; i++)
    if (rl->held[i].lo <= hi && lo <= rl->held[i].hi)
      return true;
  return false;
}

/* Under rl->lock. */
static int
hold (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  if (rl->n == rl->cap) {
    size_t cap = rl->cap ? rl->cap * 2 : 16;
    struct rangelock_range *h = realloc (rl->held, cap * sizeof *h);
    if (h == NULL) {
      errno = ENOMEM;
      return -1;
    }
    rl->held = h;
    rl->cap = cap;
  }
  rl->held[rl->n].lo = lo;
  rl->held[rl->n].hi = hi;
  rl->n++;
  return 0;
}

int
rangelock_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  int r;

  pthread_mutex_lock (&rl->lock);
  while (rl->barriers > 0 || overlaps (rl, lo, hi))
    pthread_cond_wait (&rl->cond, &rl->lock);
  r = hold (rl, lo, hi);
  pthread_mutex_unlock (&rl->lock);
  return r;
}

int
rangelock_try_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  int r = -1;

  pthread_mutex_lock (&rl->lock);
  if (rl->barriers == 0 && !overlaps (rl, lo, hi))
    r = hold (rl, lo, hi);
  else
    errno = EBUSY;
  pthread_mutex_unlock (&rl->lock);
  return r;
}

void
rangelock_release (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  pthread_mutex_lock (&rl->lock);
  for (size_t i = 0; i < rl->n; i++) {
    if (rl->held[i].lo == lo && rl->held[i].hi == hi) {
      rl->held[i] = rl->held[rl->n - 1];
      rl->n--;
      break;
    }
  }
  pthread_cond_broadcast (&rl->cond);
  pthread_mutex_unlock (&rl->lock);
}

void
rangelock_barrier (struct rangelock *rl)
{
  pthread_mutex_lock (&rl->lock);
  rl->barriers++;
  while (rl->n > 0)
    pthread_cond_wait (&rl->cond, &rl->lock);
  rl->barriers--;
  pthread_cond_broadcast (&rl->cond);
  pthread_mutex_unlock (&rl->lock);
}
