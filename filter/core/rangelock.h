/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: page range locks.
 *
 * Owns mutual exclusion between requests that change what is cached
 * for a backend page (miss fills, writes, invalidations).  A request
 * locks one inclusive range of page numbers at a time, so there is no
 * lock ordering to get wrong.  Cache hits do not take range locks;
 * they pin slots instead (engine/slot.c).
 *
 * Locking: rl->lock protects rl->held; it is held only to scan and
 * update the small array of held ranges, never across I/O.  Waiters
 * sleep on rl->cond.
 */
#ifndef SSDCACHE_RANGELOCK_H
#define SSDCACHE_RANGELOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct rangelock_range {
  uint64_t lo, hi;
};

struct rangelock {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct rangelock_range *held;
  size_t n, cap;
  unsigned barriers;             /* rangelock_barrier calls waiting */
};

extern int rangelock_init (struct rangelock *rl);
extern void rangelock_destroy (struct rangelock *rl);
/* Block until [lo, hi] overlaps no held range, then hold it. */
extern int rangelock_acquire (struct rangelock *rl, uint64_t lo, uint64_t hi);
/* Hold [lo, hi] if that can be done without waiting: 0, or -1 (busy
 * or no memory).
 */
extern int rangelock_try_acquire (struct rangelock *rl, uint64_t lo,
                                  uint64_t hi);
extern void rangelock_release (struct rangelock *rl, uint64_t lo, uint64_t hi);
/* Wait until no range is held, holding back new ones meanwhile (they
 * wait, and try_acquire fails): every holder that came before has
 * released.  Holds nothing when it returns.
 */
extern void rangelock_barrier (struct rangelock *rl);

#endif /* SSDCACHE_RANGELOCK_H */
