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
 * Each release of a range stamps its pages (in RANGELOCK_STAMPS buckets,
 * page number modulo their count) with a clock that only grows, unless
 * the holder changed no page's data (rangelock_release_unchanged: a
 * read, a fill): a fill behind (bg/behind.c) that read a page at clock t
 * stores it only if no bucket of its pages is stamped after t.
 *
 * Locking: rl->lock protects rl->held, rl->waiting, the stamps and the
 * clock; it is held only
 * to scan and update these small arrays, never across I/O.  Waiters
 * sleep on rl->cond.
 */
#ifndef SSDCACHE_RANGELOCK_H
#define SSDCACHE_RANGELOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rangelock_range {
  uint64_t lo, hi;
  uint64_t ticket;               /* held: when taken; waiting: arrival */
};

#define RANGELOCK_STAMPS 4096

struct rangelock {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct rangelock_range *held;
  size_t n, cap;
  struct rangelock_range *waiting;
  size_t nwait, capwait;
  uint64_t next_ticket;
  uint64_t clock;                /* the latest stamp */
  uint64_t stamp[RANGELOCK_STAMPS];
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

/* Release [lo, hi], stamping its pages: their data may have changed. */
extern void rangelock_release (struct rangelock *rl, uint64_t lo, uint64_t hi);

/* Release [lo, hi], whose pages' data the holder did not change (it
 * only read them, or stored in the cache what the backend has).
 * Returns the clock: a later change of any of them is stamped after it.
 */
extern uint64_t rangelock_release_unchanged (struct rangelock *rl,
                                             uint64_t lo, uint64_t hi);

/* With [lo, hi] held: was any page of it (or one sharing its bucket)
 * changed after clock t?
 */
extern bool rangelock_changed_since (struct rangelock *rl, uint64_t lo,
                                     uint64_t hi, uint64_t t);

/* Wait until every range held when it was called has been released.
 * Ranges taken meanwhile neither wait for it nor are waited for: a
 * holder that waits on a background pass, which try-locks other
 * ranges, can still end.  (engine/access.c: cache_set_mode stores the
 * new mode first, so that a request that takes its range later sees
 * it.)  Holds nothing.
 */
extern void rangelock_barrier (struct rangelock *rl);

#endif /* SSDCACHE_RANGELOCK_H */
