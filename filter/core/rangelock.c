/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: page range locks.
 *
 * Owns the arrays of held and waiting ranges and the pages' change
 * stamps; rl->lock protects them and is held only while scanning or
 * updating them.  See rangelock.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rangelock.h"

int
rangelock_init (struct rangelock *rl)
{
  rl->held = rl->waiting = NULL;
  rl->n = rl->cap = rl->nwait = rl->capwait = 0;
  rl->next_ticket = 1;
  rl->clock = 0;
  memset (rl->stamp, 0, sizeof rl->stamp);
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
  free (rl->waiting);
  rl->held = rl->waiting = NULL;
  pthread_cond_destroy (&rl->cond);
  pthread_mutex_destroy (&rl->lock);
}

/* Does an entry of a[0..n) overlap [lo, hi] (with a ticket below
 * before)?
 */
static bool
overlaps (const struct rangelock_range *a, size_t n, uint64_t lo,
          uint64_t hi, uint64_t before)
{
  for (size_t i = 0; i < n; i++)
    if (a[i].lo <= hi && lo <= a[i].hi && a[i].ticket < before)
      return true;
  return false;
}

/* Under rl->lock: append [lo, hi] to *a (of *n, room for *cap). */
static int
push (struct rangelock_range **a, size_t *n, size_t *cap, uint64_t lo,
      uint64_t hi, uint64_t ticket)
{
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    struct rangelock_range *p = realloc (*a, c * sizeof *p);
    if (p == NULL) {
      errno = ENOMEM;
      return -1;
    }
    *a = p;
    *cap = c;
  }
  (*a)[*n] = (struct rangelock_range) { .lo = lo, .hi = hi,
                                        .ticket = ticket };
  (*n)++;
  return 0;
}

/* Under rl->lock: remove the entry of a[0..*n) that matches. */
static void
drop (struct rangelock_range *a, size_t *n, uint64_t lo, uint64_t hi,
      uint64_t ticket, bool any_ticket)
{
  for (size_t i = 0; i < *n; i++)
    if (a[i].lo == lo && a[i].hi == hi &&
        (any_ticket || a[i].ticket == ticket)) {
      a[i] = a[*n - 1];
      (*n)--;
      return;
    }
}

static int
hold (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  return push (&rl->held, &rl->n, &rl->cap, lo, hi, rl->next_ticket++);
}

int
rangelock_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  uint64_t me;
  int r;

  pthread_mutex_lock (&rl->lock);
  me = rl->next_ticket++;
  if (push (&rl->waiting, &rl->nwait, &rl->capwait, lo, hi, me) == -1) {
    pthread_mutex_unlock (&rl->lock);
    return -1;
  }
  while (overlaps (rl->held, rl->n, lo, hi, UINT64_MAX) ||
         overlaps (rl->waiting, rl->nwait, lo, hi, me))
    pthread_cond_wait (&rl->cond, &rl->lock);
  drop (rl->waiting, &rl->nwait, lo, hi, me, false);
  r = hold (rl, lo, hi);
  if (r == -1)                   /* younger waiters may go now */
    pthread_cond_broadcast (&rl->cond);
  pthread_mutex_unlock (&rl->lock);
  return r;
}

int
rangelock_try_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  int r = -1;

  pthread_mutex_lock (&rl->lock);
  if (!overlaps (rl->held, rl->n, lo, hi, UINT64_MAX))
    r = hold (rl, lo, hi);
  else
    errno = EBUSY;
  pthread_mutex_unlock (&rl->lock);
  return r;
}

/* Under rl->lock: remove [lo, hi] from the held ranges, wake waiters. */
static void
unhold_locked (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  drop (rl->held, &rl->n, lo, hi, 0, true);
  pthread_cond_broadcast (&rl->cond);
}

void
rangelock_release (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  pthread_mutex_lock (&rl->lock);
  rl->clock++;
  for (uint64_t p = lo; p <= hi && p - lo < RANGELOCK_STAMPS; p++)
    rl->stamp[p % RANGELOCK_STAMPS] = rl->clock;
  unhold_locked (rl, lo, hi);
  pthread_mutex_unlock (&rl->lock);
}

uint64_t
rangelock_release_unchanged (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  uint64_t t;

  pthread_mutex_lock (&rl->lock);
  t = rl->clock;
  unhold_locked (rl, lo, hi);
  pthread_mutex_unlock (&rl->lock);
  return t;
}

bool
rangelock_changed_since (struct rangelock *rl, uint64_t lo, uint64_t hi,
                         uint64_t t)
{
  bool changed = false;

  pthread_mutex_lock (&rl->lock);
  for (uint64_t p = lo; p <= hi && p - lo < RANGELOCK_STAMPS && !changed;
       p++)
    changed = rl->stamp[p % RANGELOCK_STAMPS] > t;
  pthread_mutex_unlock (&rl->lock);
  return changed;
}

void
rangelock_barrier (struct rangelock *rl)
{
  uint64_t mark;

  pthread_mutex_lock (&rl->lock);
  mark = rl->next_ticket++;
  while (overlaps (rl->held, rl->n, 0, UINT64_MAX, mark))
    pthread_cond_wait (&rl->cond, &rl->lock);
  pthread_mutex_unlock (&rl->lock);
}
