/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: page range locks.
 *
 * Owns mutual exclusion between requests that change what is cached
 * for a backend page (miss fills, writes, invalidations).  A request
 * locks one inclusive range of page numbers at a time, so there is no
 * lock ordering to get wrong.  Cache hits do not take range locks;
 * they pin slots instead (engine/slot.c).
 *
 * Blocking acquires are served in arrival order among those that
 * overlap (an acquire never overtakes an older waiter of an overlapping
 * range), so a page rewritten without pause cannot starve a request
 * that waits for it.  Try-acquires only look at the held ranges: a
 * background pass never waits for a waiter (the waiter may itself wait
 * for a holder that waits for the pass).
 *
 * Locking: rl->lock protects rl->held and rl->waiting; it is held only
 * to scan and update these small arrays, never across I/O.  Waiters
 * sleep on rl->cond.
 */
#ifndef SSDCACHE_RANGELOCK_H
#define SSDCACHE_RANGELOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct rangelock_range {
  uint64_t lo, hi;
  uint64_t ticket;               /* held: when taken; waiting: arrival */
};

struct rangelock {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct rangelock_range *held;
  size_t n, cap;
  struct rangelock_range *waiting;
  size_t nwait, capwait;
  uint64_t next_ticket;
};

extern int rangelock_init (struct rangelock *rl);
extern void rangelock_destroy (struct rangelock *rl);

/* Block until [lo, hi] overlaps no held range and no older waiter's,
 * then hold it.
 */
extern int rangelock_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi);

/* Hold [lo, hi] if no held range overlaps it: 0, or -1 (busy or no
 * memory).  Never waits.
 */
extern int rangelock_try_acquire (struct rangelock *rl, uint64_t lo,
                                  uint64_t hi);

extern void rangelock_release (struct rangelock *rl, uint64_t lo, uint64_t hi);

/* Wait until every range held when it was called has been released.
 * Ranges taken meanwhile neither wait for it nor are waited for: a
 * holder that waits on a background pass, which try-locks other
 * ranges, can still end.  (engine/access.c: cache_set_mode stores the
 * new mode first, so that a request that takes its range later sees
 * it.)  Holds nothing.
 */
extern void rangelock_barrier (struct rangelock *rl);

#endif /* SSDCACHE_RANGELOCK_H */
