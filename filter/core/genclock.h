/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: when each flush generation was closed.
 *
 * Owns struct genclock: the close times of the generations the backend
 * still lacks, for the flush order's order_lag_seconds.  A ring indexed
 * by generation that grows (doubling, from GENCLOCK_MIN to GENCLOCK_MAX
 * entries) when the clients get further ahead of the backend than it
 * holds, so the age of the oldest generation not yet on the backend is
 * exact up to GENCLOCK_MAX generations behind (8 MiB), a lower bound
 * beyond.  No locking of its own (the engine holds c->lock); no nbdkit,
 * no I/O.
 */
#ifndef SSDCACHE_GENCLOCK_H
#define SSDCACHE_GENCLOCK_H

#include <stdbool.h>
#include <stdint.h>

#define GENCLOCK_MIN 1024
#define GENCLOCK_MAX (1u << 20)

struct genclock {
  uint64_t *ms;                  /* close time of generation g at g % cap */
  uint32_t cap;                  /* a power of two, or 0 before the first */
  uint64_t oldest;               /* the oldest generation still held */
};

/* Generation gen was closed at time ms; generations up to done are on
 * the backend (their times may go).  Returns false if the time of a
 * generation after done had to be dropped for it (no memory, or
 * GENCLOCK_MAX behind): genclock_age is then a lower bound.
 */
extern bool genclock_close (struct genclock *gc, uint64_t gen, uint64_t done,
                            uint64_t ms);
/* How long before now generation gen was closed (0 if never recorded);
 * *exact (may be NULL) is false if its time was dropped and the
 * answer is that of the oldest generation held after it.
 */
extern uint64_t genclock_age (const struct genclock *gc, uint64_t gen,
                              uint64_t now, bool *exact);
extern void genclock_free (struct genclock *gc);

#endif /* SSDCACHE_GENCLOCK_H */
